"""The geodesic score in every form (eqs. (6), (15), (16), the augmented features of Theorem
3.2) against the definition in float64, and blending (eq. (27)) against the formula as printed."""

from __future__ import annotations

import math

import pytest
import torch
from riemannian_inputs import DT, TOL, eq27_reference, inputs, rel

from attention_atlas.attention import riemannian as R
from attention_atlas.attention.riemannian.scores import blend_coefficients

BLENDS = [(1.0, "distance"), (0.35, "distance"), (0.0, "distance"), (0.35, "dot"), (1.0, "dot")]


def test_pairwise_metric_is_the_mean_of_the_token_metrics():
    *_, U = inputs(L=4)
    g = R.token_metric(U)
    gij = R.pairwise_metric(U)
    assert rel(gij[..., 1, 3, :, :], (g[..., 1, :, :] + g[..., 3, :, :]) / 2) < TOL
    # every g_ij >= I: eigenvalues at least 1
    assert float(torch.linalg.eigvalsh(gij).min()) > 1 - 1e-12


def test_eq15_distance_decomposition_equals_the_definition():
    q, k, _, U = inputs()
    dense = R.geodesic_scores_dense(q, k, U, 1.7)
    assert rel(R.geodesic_scores(q, k, U, 1.7), dense) < TOL


def test_eq16_per_token_decomposition_equals_the_definition():
    q, k, _, U = inputs(seed=1)
    assert (
        rel(R.geodesic_scores_decomposed(q, k, U, 0.9), R.geodesic_scores_dense(q, k, U, 0.9)) < TOL
    )


@pytest.mark.parametrize(("alpha", "baseline"), BLENDS)
def test_every_form_with_curvature_and_blending_equals_eq27_on_the_definition(alpha, baseline):
    q, k, _, U = inputs(seed=30, d=4, r=3)
    omega = torch.rand(q.shape[:-1], generator=torch.Generator().manual_seed(2), dtype=DT)
    ref = eq27_reference(q, k, U, 1.3, alpha, baseline, omega)
    kw = dict(curvature=omega, alpha=alpha, baseline=baseline)
    assert rel(R.geodesic_scores(q, k, U, 1.3, **kw), ref) < TOL
    assert rel(R.geodesic_scores_decomposed(q, k, U, 1.3, **kw), ref) < TOL
    assert rel(R.geodesic_scores_augmented(q, k, U, 1.3, **kw), ref) < TOL
    assert rel(R.hybrid_scores(q, k, U, 1.3, alpha, baseline=baseline, curvature=omega), ref) < TOL


@pytest.mark.parametrize(("alpha", "baseline"), [(1.0, "distance"), (0.4, "dot")])
def test_eq16_scores_pass_gradcheck(alpha, baseline):
    q, k, _, U = inputs(shape=(1, 2), L=5, d=3, r=2, seed=31, grad=True)
    omega = torch.rand(1, 2, 5, dtype=DT, requires_grad=True)

    def f(q, k, U, omega):
        return R.geodesic_scores_decomposed(
            q, k, U, 1.1, curvature=omega, alpha=alpha, baseline=baseline
        )

    assert torch.autograd.gradcheck(f, (q, k, U, omega))


def test_augmented_features_give_the_scores_as_one_matrix_product():
    q, k, _, U = inputs(seed=2, d=6, r=3)
    qh, kh = R.geodesic_features(q, k, U, 2.0)
    assert qh.shape[-1] == kh.shape[-1] == R.augmented_dim(6) == 6 * 6 + 3 * 6 + 1
    aug = R.geodesic_scores_augmented(q, k, U, 2.0)
    assert rel(aug, R.geodesic_scores_dense(q, k, U, 2.0)) < TOL
    # without the row constant the product differs from S by a constant along each row
    diff = R.geodesic_scores(q, k, U, 2.0) - qh @ kh.mT
    assert float((diff - diff[..., :1]).abs().max()) < 1e-10 * float(diff.abs().max())


def test_identical_metrics_collapse_to_a_global_mahalanobis_distance():
    q, k, _, U = inputs(seed=3)
    U = U[..., :1, :, :].expand_as(U)  # the same U_t at every position
    G = R.token_metric(U[..., 0, :, :])  # (..., d, d)
    diff = q.unsqueeze(-2) - k.unsqueeze(-3)
    expected = -torch.einsum("...ija,...ab,...ijb->...ij", diff, G, diff) / 1.3
    assert rel(R.geodesic_scores(q, k, U, 1.3), expected) < TOL


def test_zero_metric_gives_euclidean_distance_scores():
    q, k, _, U = inputs(seed=4)
    expected = -((q.unsqueeze(-2) - k.unsqueeze(-3)) ** 2).sum(-1) / 2.0
    assert rel(R.geodesic_scores(q, k, torch.zeros_like(U), 2.0), expected) < TOL


@pytest.mark.parametrize("baseline", ["distance", "dot"])
def test_hybrid_blending_endpoints_are_the_baseline_and_the_geodesic_score(baseline):
    q, k, _, U = inputs(seed=5)
    tau = 1.5
    riem = R.geodesic_scores(q, k, U, tau)
    euc = (
        q @ k.mT / math.sqrt(q.shape[-1])
        if baseline == "dot"
        else R.geodesic_scores(q, k, torch.zeros_like(U), tau)
    )
    assert rel(R.hybrid_scores(q, k, U, tau, 1.0, baseline=baseline), riem) < TOL
    assert rel(R.hybrid_scores(q, k, U, tau, 0.0, baseline=baseline), euc) < TOL


def test_distance_baseline_blending_is_a_rescaled_metric():
    q, k, _, U = inputs(seed=6)
    alpha = 0.3
    blended = R.hybrid_scores(q, k, U, 1.1, alpha, baseline="distance")
    assert rel(blended, R.geodesic_scores(q, k, math.sqrt(alpha) * U, 1.1)) < TOL


def test_blend_coefficients_are_the_weights_with_tau_and_sqrt_d_folded_in():
    assert blend_coefficients(16, 2.0, 1.0, "distance") == (0.0, 0.5, 0.5)
    assert blend_coefficients(16, 2.0, 0.25, "distance") == (0.0, 0.5, 0.125)
    assert blend_coefficients(16, 2.0, 0.25, "dot") == pytest.approx((0.75 / 4, 0.125, 0.125))


def test_curvature_enters_as_row_and_column_penalties():
    q, k, _, U = inputs(seed=7)
    omega = torch.rand(q.shape[:-1], dtype=DT)
    s0 = R.geodesic_scores(q, k, U, 1.0)
    s1 = R.geodesic_scores(q, k, U, 1.0, curvature=omega)
    assert rel(s1, s0 - omega.unsqueeze(-1) - omega.unsqueeze(-2)) < TOL
    assert rel(R.geodesic_scores_augmented(q, k, U, 1.0, curvature=omega), s1) < TOL


def test_errors_name_expected_and_received_shapes():
    q, k, _, U = inputs()
    with pytest.raises(ValueError, match=r"U must have shape \(\.\.\., L, d, r\)"):
        R.geodesic_scores(q, k, U[..., 0], 1.0)
    with pytest.raises(ValueError, match="tau must be a positive"):
        R.geodesic_scores(q, k, U, 0.0)
    with pytest.raises(ValueError, match="q and k must have the same shape"):
        R.geodesic_scores(q, k[..., :-1, :], U, 1.0)
    with pytest.raises(ValueError, match="share a dtype"):
        R.geodesic_scores_decomposed(q, k, U.float(), 1.0)
    with pytest.raises(ValueError, match="curvature must have shape"):
        R.geodesic_scores_decomposed(q, k, U, 1.0, curvature=torch.zeros(3, dtype=DT))
    with pytest.raises(ValueError, match="baseline must be"):
        R.hybrid_scores(q, k, U, 1.0, 0.5, baseline="cosine")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="alpha must be a finite number"):
        R.blend_weights(math.nan)


def test_pairwise_metric_terms_are_both_metric_terms_of_every_pair():
    q, k, _, U = inputs(seed=32, L=7, d=5, r=3)
    diff = q.unsqueeze(-2) - k.unsqueeze(-3)  # q_i - k_j                  (..., Li, Lj, d)
    ref = (torch.einsum("...idr,...ijd->...ijr", U, diff).pow(2).sum(-1)
           + torch.einsum("...jdr,...ijd->...ijr", U, diff).pow(2).sum(-1))  # fmt: skip
    assert rel(R.pairwise_metric_terms(U, q, k), ref) < TOL
    assert rel(R.pairwise_metric_terms(U, q, k, scale=-0.7), -0.7 * ref) < TOL


def test_pairwise_metric_terms_custom_backward_passes_gradcheck():
    q, k, _, U = inputs(shape=(2,), L=4, d=3, r=2, seed=33, grad=True)
    assert torch.autograd.gradcheck(
        lambda U, q, k: R.pairwise_metric_terms(U, q, k, scale=-0.3), (U, q, k)
    )


def test_eq16_scores_on_an_r_major_factor_equal_the_definition():
    # the layout the factor networks produce: (..., d, r) viewed from contiguous (..., r, d)
    q, k, _, U = inputs(seed=34, L=9, d=4, r=3)
    U_r_major = U.transpose(-1, -2).contiguous().transpose(-1, -2)
    assert not U_r_major.is_contiguous()
    ref = R.geodesic_scores_dense(q, k, U, 0.8)
    assert rel(R.geodesic_scores_decomposed(q, k, U_r_major, 0.8), ref) < TOL


def test_pairwise_metric_terms_reject_mismatched_shapes():
    q, k, _, U = inputs(L=4, d=3, r=2)
    with pytest.raises(ValueError, match="U must have shape"):
        R.pairwise_metric_terms(U[..., :3, :, :], q, k)


def test_pairwise_metric_terms_in_batch_slices_are_the_same_terms_and_gradients(monkeypatch):
    from attention_atlas.attention.riemannian import pairwise

    q, k, _, U = inputs(shape=(5,), L=4, d=3, r=2, seed=35, grad=True)
    whole = R.pairwise_metric_terms(U, q, k, scale=0.6)
    w = torch.randn_like(whole)
    g_whole = torch.autograd.grad((whole * w).sum(), (U, q, k))
    monkeypatch.setattr(pairwise, "PAIRWISE_CHUNK", 4 * 2 * 2 * 4)  # one item per slice
    assert len(pairwise._chunks(5, 4 * 2 * 2 * 4, pairwise._budget(U.device))) == 5
    sliced = R.pairwise_metric_terms(U, q, k, scale=0.6)
    assert rel(sliced, whole) < TOL
    for a, b in zip(torch.autograd.grad((sliced * w).sum(), (U, q, k)), g_whole):
        assert rel(a, b) < TOL
    assert torch.autograd.gradcheck(lambda U, q, k: R.pairwise_metric_terms(U, q, k), (U, q, k))


CAUSAL_CASES = [  # (batch, L, d, r, block, chunk): one tile; blocks; blocks and batch slices
    ((2, 3), 13, 5, 2, 32, None),
    ((2, 3), 13, 5, 2, 4, None),
    ((5,), 11, 3, 3, 3, 1),
]


@pytest.mark.parametrize("shape, L, d, r, block, chunk", CAUSAL_CASES)
def test_causal_pairwise_terms_are_the_terms_below_the_diagonal_and_minus_inf_above(
    monkeypatch, shape, L, d, r, block, chunk
):
    from attention_atlas.attention.riemannian import pairwise

    monkeypatch.setattr(pairwise, "CAUSAL_BLOCK", block)
    if chunk is not None:  # tiles of one batch item
        monkeypatch.setattr(pairwise, "PAIRWISE_CHUNK", chunk)
    q, k, _, U = inputs(shape=shape, L=L, d=d, r=r, seed=36)
    diff = q.unsqueeze(-2) - k.unsqueeze(-3)  # q_i - k_j, the definition's terms
    ref = (torch.einsum("...idr,...ijd->...ijr", U, diff).pow(2).sum(-1)
           + torch.einsum("...jdr,...ijd->...ijr", U, diff).pow(2).sum(-1))  # fmt: skip
    got = R.pairwise_metric_terms(U, q, k, scale=-0.4, causal=True)
    below = torch.ones(L, L, dtype=torch.bool).tril()
    assert rel(got[..., below], -0.4 * ref[..., below]) < TOL
    assert torch.isneginf(got[..., ~below]).all()
    base = torch.randn(math.prod(shape), L, L, dtype=DT)
    with_base = R.pairwise_metric_terms(U, q, k, scale=-0.4, causal=True, base=base.clone())
    assert rel(with_base[..., below], (base.view_as(ref) - 0.4 * ref)[..., below]) < TOL


@pytest.mark.parametrize("shape, L, d, r, block, chunk", CAUSAL_CASES)
def test_causal_pairwise_terms_custom_backward_passes_gradcheck(
    monkeypatch, shape, L, d, r, block, chunk
):
    from attention_atlas.attention.riemannian import pairwise

    monkeypatch.setattr(pairwise, "CAUSAL_BLOCK", block)
    if chunk is not None:
        monkeypatch.setattr(pairwise, "PAIRWISE_CHUNK", chunk)
    q, k, _, U = inputs(shape=shape[:1], L=min(L, 7), d=d, r=r, seed=37, grad=True)
    seq = q.shape[-2]
    above = torch.ones(seq, seq, dtype=torch.bool).triu(1)
    base = torch.randn(q.shape[0], seq, seq, dtype=DT, requires_grad=True)

    def terms(base, U, q, k):  # the base is overwritten in place: give the Function a copy
        out = R.pairwise_metric_terms(U, q, k, scale=0.3, causal=True, base=base.clone())
        return out.masked_fill(above, 0.0)

    assert torch.autograd.gradcheck(terms, (base, U, q, k))


@pytest.mark.parametrize("alpha, baseline", [(1.0, "distance"), (0.3, "dot"), (0.6, "distance")])
def test_causal_eq16_attention_equals_eq15_attention_and_its_gradients(alpha, baseline):
    from attention_atlas.attention.riemannian import pairwise

    q, k, v, U = inputs(seed=38, L=40, d=4, r=2, grad=True)
    omega = torch.rand(q.shape[:-1], dtype=DT, requires_grad=True)
    assert q.shape[-2] > pairwise.CAUSAL_BLOCK  # more than one block of tokens
    below = torch.ones(40, 40, dtype=torch.bool).tril()
    ref = R.geodesic_scores(q, k, U, 1.7, curvature=omega, alpha=alpha, baseline=baseline)
    got = R.geodesic_scores_decomposed(q, k, U, 1.7, curvature=omega, alpha=alpha,
                                       baseline=baseline, causal=True)  # fmt: skip
    assert rel(got[..., below], ref[..., below]) < TOL and torch.isneginf(got[..., ~below]).all()
    out_ref = torch.softmax(ref.masked_fill(~below, float("-inf")), -1) @ v
    fused = R.geodesic_scores_decomposed(q, k, U, 1.7, curvature=omega, alpha=alpha,
                                         baseline=baseline, causal=True, softmax=True)  # fmt: skip
    w = torch.randn_like(out_ref)
    g_ref = torch.autograd.grad((out_ref * w).sum(), (q, k, v, U, omega))
    for out in (torch.softmax(got, -1) @ v, fused @ v):  # the scores, then the probabilities
        assert rel(out, out_ref) < TOL
        for a, b in zip(torch.autograd.grad((out * w).sum(), (q, k, v, U, omega)), g_ref):
            assert rel(a, b) < TOL


def test_causal_eq16_probabilities_pass_gradcheck_and_need_a_causal_mask(monkeypatch):
    from attention_atlas.attention.riemannian import pairwise

    monkeypatch.setattr(pairwise, "CAUSAL_BLOCK", 3)  # three blocks of tokens
    q, k, _, U = inputs(shape=(2,), L=7, d=3, r=2, seed=39, grad=True)
    omega = torch.rand(q.shape[:-1], dtype=DT, requires_grad=True)

    def probs(q, k, U, omega):
        return R.geodesic_scores_decomposed(q, k, U, 1.3, curvature=omega, alpha=0.6,
                                            baseline="dot", causal=True, softmax=True)  # fmt: skip

    assert torch.autograd.gradcheck(probs, (q, k, U, omega))
    with pytest.raises(ValueError, match="softmax=True needs causal=True"):
        R.geodesic_scores_decomposed(q, k, U, 1.3, softmax=True)


def test_causal_tiles_on_a_gpu_take_the_whole_batch_in_large_blocks():
    """Chapter 4's long shape (batch 32 x 8 heads, L = 128, r = 8 rank bound): on a CPU the
    products go in cache-sized slices of the batch and blocks of 32 tokens, on a GPU in one
    tile, every product kept for the backward, so the host issues a few launches, not
    thousands."""
    from attention_atlas.attention.riemannian import pairwise

    n, seq, r = 32 * 8, 128, 8
    cpu_dev, gpu_dev = torch.device("cpu"), torch.device("cuda")
    block = pairwise._block(cpu_dev)
    assert block == pairwise.CAUSAL_BLOCK and pairwise._block(gpu_dev) == seq
    cpu = pairwise._causal_tiles(n, seq, r, block, cpu_dev)
    gpu = pairwise._causal_tiles(n, seq, r, seq, gpu_dev)
    assert gpu == [(slice(0, n), 0, seq)]  # one tile: the whole batch, every token
    assert len(cpu) > 40
    assert not pairwise._keeps_products(torch.empty(n, seq, r, 16), block)  # recomputed
    assert pairwise._keeps_products(torch.empty(n, seq, r, 16, device="meta"), seq)  # kept


@pytest.mark.parametrize("softmax", [False, True])
def test_causal_pairwise_terms_under_the_gpu_budget_equal_the_cpu_tiling(monkeypatch, softmax):
    """The GPU's tiling (whole batch per block, products kept) gives the CPU tiling's scores and
    gradients, in float64, where the CPU's slices the batch into single items."""
    from attention_atlas.attention.riemannian import pairwise

    monkeypatch.setattr(pairwise, "CAUSAL_BLOCK", 4)
    q, k, _, U = inputs(shape=(3, 2), L=11, d=4, r=2, seed=40, grad=True)
    w = torch.randn(3, 2, 11, 11, dtype=DT)
    below = torch.ones(11, 11, dtype=torch.bool).tril()

    def run():
        out = R.pairwise_metric_terms(U, q, k, scale=-0.7, causal=True, softmax=softmax)
        loss = (out.masked_fill(~below, 0.0) * w).sum()
        return out, torch.autograd.grad(loss, (U, q, k))

    monkeypatch.setattr(pairwise, "PAIRWISE_CHUNK", 4 * 4 * 2 * 15)  # one item per tile
    assert len(pairwise._causal_tiles(6, 11, 2, 4, torch.device("cpu"))) == 3 * 6
    assert not pairwise._keeps_products(U.detach().reshape(6, 11, 4, 2).transpose(-1, -2), 4)
    sliced = run()
    monkeypatch.setattr(pairwise, "_budget", lambda device: pairwise.DEVICE_CHUNK)
    assert len(pairwise._causal_tiles(6, 11, 2, 4, torch.device("cpu"))) == 3
    assert pairwise._keeps_products(U.detach().reshape(6, 11, 4, 2).transpose(-1, -2), 4)
    whole = run()
    monkeypatch.setattr(pairwise, "_block", lambda device: pairwise.DEVICE_BLOCK)
    assert len(pairwise._causal_tiles(6, 11, 2, 128, torch.device("cpu"))) == 1
    one_tile = run()  # the GPU's block: one tile, the full 2L columns
    assert rel(one_tile[0][..., below], sliced[0][..., below]) < TOL
    for a, b in zip(one_tile[1], sliced[1]):
        assert rel(a, b) < TOL
    assert rel(whole[0][..., below], sliced[0][..., below]) < TOL
    for a, b in zip(whole[1], sliced[1]):
        assert rel(a, b) < TOL
