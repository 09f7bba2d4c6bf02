"""Geodesic attention: every fast path against the materialised reference (eq. (15)), gradients."""

from __future__ import annotations

import math

import pytest
import torch
from riemannian_inputs import DT, TOL, inputs, rel

from attention_atlas.attention import riemannian as R
from attention_atlas.attention.riemannian.fast import _auto_method


@pytest.mark.parametrize("method", ["augmented", "sdpa", "lowrank"])
@pytest.mark.parametrize("causal", [False, True])
def test_fast_geodesic_attention_equals_reference(method, causal):
    q, k, v, U = inputs(L=37, d=4, r=2, dv=3, seed=8)  # 37: not a multiple of any block
    ref = R.geodesic_attention_reference(q, k, v, U, 1.2, causal)[0]
    out = R.geodesic_attention(q, k, v, U, 1.2, causal, method=method, block_q=8, block_k=16)
    assert rel(out, ref) < TOL


def test_reference_attention_is_the_softmax_of_the_eq15_scores():
    q, k, v, U = inputs(L=9, seed=40)
    out, probs, logits = R.geodesic_attention_reference(q, k, v, U, 1.4, causal=True)
    assert rel(logits, R.geodesic_scores_dense(q, k, U, 1.4)) < TOL
    keep = torch.ones(9, 9, dtype=torch.bool).tril()
    expected = torch.softmax(logits.masked_fill(~keep, float("-inf")), -1)
    assert rel(probs, expected) < TOL and rel(out, expected @ v) < TOL


def test_default_blocking_single_key_block_equals_reference():
    q, k, v, U = inputs(L=50, d=4, r=2, seed=9)
    for causal in (False, True):
        ref = R.geodesic_attention_reference(q, k, v, U, 2.0, causal)[0]
        assert rel(R.geodesic_attention(q, k, v, U, 2.0, causal), ref) < TOL


@pytest.mark.parametrize("method", ["augmented", "sdpa", "lowrank"])
def test_fast_paths_respect_masks_curvature_and_blending(method):
    q, k, v, U = inputs(L=21, d=3, r=2, seed=10)
    g = torch.Generator().manual_seed(1)
    mask = torch.rand(21, 21, generator=g) > 0.3
    mask[:, 0] = True  # every row sees at least one key
    omega = torch.rand(q.shape[:-1], dtype=DT)
    kw = dict(mask=mask, curvature=omega, alpha=0.6, baseline="dot")
    ref = R.geodesic_attention_reference(q, k, v, U, 0.8, True, **kw)[0]
    out = R.geodesic_attention(q, k, v, U, 0.8, True, method=method, block_q=5, block_k=4, **kw)
    assert rel(out, ref) < TOL


def test_rows_with_no_visible_key_give_zero_output():
    q, k, v, U = inputs(L=9, seed=11)
    mask = torch.ones(9, 9, dtype=torch.bool)
    mask[2] = False
    out = R.geodesic_attention(q, k, v, U, 1.0, mask=mask, method="augmented", block_k=4)
    assert float(out[..., 2, :].abs().max()) == 0.0
    ref = R.geodesic_attention_reference(q, k, v, U, 1.0, mask=mask)[0]
    assert rel(out, ref) < TOL


def test_attention_matrix_is_row_stochastic():
    # Corollary 3.3: non-Gram scores, but softmax still gives a row-stochastic matrix
    q, k, v, U = inputs(scale=2.0, seed=12)
    _, probs, _ = R.geodesic_attention_reference(q, k, v, U, 0.5, False)
    assert float((probs.sum(-1) - 1).abs().max()) < 1e-12
    assert float(probs.min()) >= 0


@pytest.mark.parametrize("method", ["augmented", "lowrank"])
@pytest.mark.parametrize("causal", [False, True])
def test_geodesic_attention_gradcheck(method, causal):
    q, k, v, U = inputs(shape=(1, 1), L=7, d=3, r=2, dv=2, seed=13, grad=True)
    omega = torch.rand(1, 1, 7, dtype=DT, requires_grad=True)

    def f(q, k, v, U, omega):
        return R.geodesic_attention(
            q, k, v, U, 1.3, causal, curvature=omega, method=method, block_q=3, block_k=2
        )

    # the checkpointed low-rank path re-runs every block: check it in gradcheck's fast mode
    assert torch.autograd.gradcheck(f, (q, k, v, U, omega), fast_mode=method == "lowrank")


def test_fast_gradients_equal_reference_gradients():
    q, k, v, U = inputs(L=29, d=4, r=2, seed=14, grad=True)
    w = torch.randn(2, 3, 29, 4, dtype=DT)
    gref = torch.autograd.grad(
        (R.geodesic_attention_reference(q, k, v, U, 1.0, True)[0] * w).sum(), (q, k, v, U)
    )
    out = R.geodesic_attention(q, k, v, U, 1.0, True, method="augmented", block_q=8, block_k=8)
    gfast = torch.autograd.grad((out * w).sum(), (q, k, v, U))
    for a, b in zip(gfast, gref):
        assert rel(a, b) < 1e-9


def test_float32_fast_path_is_close_to_float64_reference():
    q, k, v, U = inputs(L=64, d=16, r=4, seed=16, scale=0.3)
    ref = R.geodesic_attention_reference(q, k, v, U, math.sqrt(32), True)[0]
    out = R.geodesic_attention(*(t.float() for t in (q, k, v, U)), math.sqrt(32), True)
    assert rel(out.double(), ref) < 1e-4


def test_auto_method_picks_the_measured_winner():
    q = torch.zeros(1, 4, 16)
    assert _auto_method(q, torch.zeros(1, 4, 16, 4)) == "augmented"
    q64 = torch.zeros(1, 4, 64)
    assert _auto_method(q64, torch.zeros(1, 4, 64, 4)) == "lowrank"


def test_errors_name_the_expected_method_and_shapes():
    q, k, v, U = inputs()
    with pytest.raises(ValueError, match="curvature must have shape"):
        R.geodesic_attention(q, k, v, U, 1.0, curvature=torch.zeros(3, dtype=DT))
    with pytest.raises(ValueError, match="method must be"):
        R.geodesic_attention(q, k, v, U, 1.0, method="fast")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="k and v must have the same length"):
        R.geodesic_attention(q, k, v[..., :-1, :], U, 1.0)
