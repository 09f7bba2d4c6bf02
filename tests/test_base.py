"""The attention interface, the registry, and the two baselines (dot product, Euclidean)."""

from __future__ import annotations

import math

import pytest
import torch

from attention_atlas.attention import (
    Attention,
    AttentionResult,
    available_attention,
    build_attention,
    register_attention,
)
from attention_atlas.attention.base import check_qkv, combine_masks, count_nonfinite
from attention_atlas.attention.dot import explicit_attention, masked_softmax, sdpa
from attention_atlas.attention.euclidean import (
    euclidean_attention_explicit,
    euclidean_logits,
    squared_distance_attention,
)

torch.set_num_threads(1)  # tiny ops on a shared 2-core machine: threads only contend

F64 = torch.float64


def qkv(b=2, h=3, lq=7, lk=7, d=5, dv=None, dtype=F64, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, lq, d, generator=g, dtype=dtype)
    k = torch.randn(b, h, lk, d, generator=g, dtype=dtype)
    v = torch.randn(b, h, lk, dv or d, generator=g, dtype=dtype)
    return tuple(t.requires_grad_(requires_grad) for t in (q, k, v))


def random_mask(b, h, lq, lk, seed=1, p=0.3):
    g = torch.Generator().manual_seed(seed)
    m = torch.rand(b, h, lq, lk, generator=g) > p
    m[..., 0] = True  # no fully masked row (causal keeps key 0 for every query too)
    return m


# -- registry --------------------------------------------------------------------------------


def test_baselines_are_registered():
    names = available_attention()
    assert {"dot", "euclidean", "mixed"} <= set(names)


def test_unknown_variant_error_lists_the_registered_ones():
    with pytest.raises(ValueError, match="unknown attention variant 'nope'") as err:
        build_attention("nope", dim=8, n_heads=2)
    for name in ("dot", "euclidean"):
        assert name in str(err.value)


def test_bad_option_error_lists_the_options_the_variant_takes():
    with pytest.raises(ValueError, match=r"does not take option\(s\) \['temperature'\]") as err:
        build_attention("euclidean", dim=8, n_heads=2, temperature=1.0)
    for opt in ("tau", "dim", "n_heads", "head_dim", "bias", "dropout"):
        assert opt in str(err.value)


def test_missing_required_option_is_named():
    with pytest.raises(ValueError, match=r"needs option\(s\) \['n_heads'\]"):
        build_attention("dot", dim=8)


def test_registering_a_second_class_under_a_taken_name_fails():
    with pytest.raises(ValueError, match="already registered"):

        @register_attention("dot")
        class Other(Attention):  # noqa: F841
            pass


def test_dim_not_divisible_by_heads_is_a_clear_error():
    with pytest.raises(ValueError, match="not divisible"):
        build_attention("dot", dim=10, n_heads=3)
    assert build_attention("dot", dim=10, n_heads=3, head_dim=4).head_dim == 4


# -- interface -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["dot", "euclidean"])
@pytest.mark.parametrize("need_weights", [False, True])
def test_module_call_returns_the_interface_shapes(name, need_weights):
    torch.manual_seed(0)
    attn = build_attention(name, dim=12, n_heads=3)
    x = torch.randn(2, 5, 12)
    res = attn(x, causal=True, need_weights=need_weights)
    assert isinstance(res, AttentionResult)
    assert res.out.shape == (2, 5, 12)
    assert int(res.diagnostics["nonfinite_out"]) == 0
    if need_weights:
        assert res.probs is not None and res.probs.shape == (2, 3, 5, 5)
        assert int(res.diagnostics["nonfinite_logits"]) == 0
    else:
        assert res.probs is None


@pytest.mark.parametrize("name", ["dot", "euclidean"])
def test_fast_and_explicit_module_paths_agree(name):
    torch.manual_seed(0)
    attn = build_attention(name, dim=12, n_heads=3).double()
    x = torch.randn(2, 6, 12, dtype=F64)
    a = attn(x, causal=True).out
    b = attn(x, causal=True, need_weights=True).out
    torch.testing.assert_close(a, b, atol=1e-12, rtol=0)


def test_module_rejects_a_wrong_width():
    attn = build_attention("dot", dim=12, n_heads=3)
    with pytest.raises(ValueError, match=r"expected x of shape \(B, L, 12\)"):
        attn(torch.randn(2, 5, 10))


def test_check_qkv_names_shapes_and_dtypes():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="share their last dimension"):
        check_qkv(q, k[..., :3], v)
    with pytest.raises(ValueError, match="same length"):
        check_qkv(q, k, v[..., :4, :])
    with pytest.raises(ValueError, match="floating-point"):
        check_qkv(q.long(), k, v)
    with pytest.raises(ValueError, match="share a dtype"):
        check_qkv(q.float(), k, v)


def test_masks_must_be_boolean_and_of_the_right_shape():
    with pytest.raises(ValueError, match="boolean"):
        combine_masks(3, 3, causal=False, mask=torch.ones(3, 3), device=torch.device("cpu"))
    with pytest.raises(ValueError, match=r"\(Lq, Lk\) = \(3, 3\)"):
        combine_masks(3, 3, causal=False, mask=torch.ones(3, 4, dtype=torch.bool), device=None)  # type: ignore[arg-type]


def test_causal_mask_is_lower_triangular_aligned_at_the_end():
    keep = combine_masks(2, 4, causal=True, mask=None, device=torch.device("cpu"))
    assert keep is not None
    assert keep.tolist() == [[True, True, True, False], [True, True, True, True]]


# -- dot product: SDPA == explicit ---------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("lq", [7, 4])
def test_sdpa_equals_explicit_softmax_qk_v_in_float64(causal, masked, lq):
    q, k, v = qkv(lq=lq, lk=7, dv=4)
    mask = random_mask(2, 3, lq, 7) if masked else None
    fast = sdpa(q, k, v, causal=causal, mask=mask)
    ref, probs, logits = explicit_attention(q, k, v, causal=causal, mask=mask)
    torch.testing.assert_close(fast, ref, atol=1e-12, rtol=0)
    # the reference really is softmax(q k^T / sqrt(d)) v
    torch.testing.assert_close(logits, q @ k.transpose(-2, -1) / math.sqrt(5), atol=1e-14, rtol=0)


def test_sdpa_with_key_padding_mask_broadcasts():
    q, k, v = qkv()
    pad = torch.ones(2, 1, 1, 7, dtype=torch.bool)
    pad[0, ..., 5:] = False
    fast = sdpa(q, k, v, causal=True, mask=pad)
    ref = explicit_attention(q, k, v, causal=True, mask=pad)[0]
    torch.testing.assert_close(fast, ref, atol=1e-12, rtol=0)


def test_fully_masked_rows_give_zero_output_in_both_paths():
    q, k, v = qkv(lq=3, lk=3)
    mask = torch.ones(3, 3, dtype=torch.bool)
    mask[1] = False
    ref, probs, _ = explicit_attention(q, k, v, mask=mask)
    assert torch.all(probs[..., 1, :] == 0) and torch.all(ref[..., 1, :] == 0)
    torch.testing.assert_close(sdpa(q, k, v, mask=mask), ref, atol=1e-12, rtol=0)


def test_masked_softmax_keeps_nans_of_unmasked_logits_visible():
    logits = torch.tensor([[0.0, float("nan"), 1.0]])
    keep = torch.tensor([[True, True, False]])
    assert torch.isnan(masked_softmax(logits, keep)).all()


# -- Euclidean: fast (augmented SDPA) == explicit ------------------------------------------


def test_euclidean_reference_logits_are_negative_squared_distances():
    q, k, _ = qkv()
    tau = 1.7
    ref = -(torch.cdist(q, k) ** 2) / tau
    torch.testing.assert_close(euclidean_logits(q, k, tau), ref, atol=1e-12, rtol=0)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("shape", [(7, 7, 5, 5), (4, 7, 5, 3), (7, 7, 6, 9)])
def test_euclidean_fast_path_equals_explicit_in_float64(causal, masked, shape):
    lq, lk, d, dv = shape
    q, k, v = qkv(lq=lq, lk=lk, d=d, dv=dv)
    q, k = 2 * q, 2 * k  # spread-out logits, not a near-uniform softmax
    mask = random_mask(2, 3, lq, lk) if masked else None
    fast = squared_distance_attention(q, k, v, 1.3, causal=causal, mask=mask)
    ref = euclidean_attention_explicit(q, k, v, 1.3, causal=causal, mask=mask)[0]
    assert fast.shape == ref.shape == (2, 3, lq, dv)
    torch.testing.assert_close(fast, ref, atol=1e-12, rtol=0)


def test_euclidean_fast_path_float32_is_close_to_float64():
    q, k, v = qkv(b=2, h=2, lq=64, lk=64, d=16)
    fast32 = squared_distance_attention(q.float(), k.float(), v.float(), 4.0, causal=True)
    ref = euclidean_attention_explicit(q, k, v, 4.0, causal=True)[0]
    assert (fast32.double() - ref).abs().max() < 1e-5


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_euclidean_fast_path_passes_gradcheck(causal, masked):
    q, k, v = qkv(b=1, h=2, lq=5, lk=5, d=3, requires_grad=True)
    mask = random_mask(1, 2, 5, 5) if masked else None
    assert torch.autograd.gradcheck(
        lambda q, k, v: squared_distance_attention(q, k, v, 0.9, causal=causal, mask=mask),
        (q, k, v),
        eps=1e-6,
        atol=1e-8,
    )


def test_euclidean_fast_gradients_equal_explicit_gradients():
    q, k, v = qkv(b=2, h=2, lq=6, lk=6, d=4, requires_grad=True)
    g = torch.randn(2, 2, 6, 4, dtype=F64)
    fast = torch.autograd.grad(
        (squared_distance_attention(q, k, v, 1.1, causal=True) * g).sum(), (q, k, v)
    )
    ref = torch.autograd.grad(
        (euclidean_attention_explicit(q, k, v, 1.1, causal=True)[0] * g).sum(), (q, k, v)
    )
    for a, b in zip(fast, ref):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)


def test_euclidean_tau_must_be_positive():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="tau must be positive"):
        squared_distance_attention(q, k, v, 0.0)


# -- probabilities and diagnostics ---------------------------------------------------------


@pytest.mark.parametrize("name", ["dot", "euclidean"])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_probabilities_are_row_stochastic(name, causal):
    torch.manual_seed(0)
    attn = build_attention(name, dim=12, n_heads=3).double()
    x = torch.randn(2, 6, 12, dtype=F64)
    pad = torch.ones(2, 1, 1, 6, dtype=torch.bool)
    pad[1, ..., 4:] = False
    probs = attn(x, causal=causal, mask=pad, need_weights=True).probs
    assert probs is not None
    assert torch.all(probs >= 0)
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, 3, 6, dtype=F64), atol=1e-12, rtol=0)
    assert torch.all(probs[1, ..., 4:] == 0)  # padded keys get no weight
    if causal:
        assert torch.all(probs.triu(diagonal=1) == 0)


def test_nonfinite_logits_are_counted_only_where_unmasked():
    t = torch.tensor([[0.0, float("inf")], [float("nan"), float("-inf")]])
    assert int(count_nonfinite(t)) == 3
    assert int(count_nonfinite(t, torch.tensor([[True, False], [True, False]]))) == 1


def test_need_weights_reports_nonfinite_logits():
    attn = build_attention("dot", dim=8, n_heads=2)
    with torch.no_grad():
        attn.qkv.weight[0, 0] = float("inf")  # query channel 0 of head 0 becomes +-inf / nan
    x = torch.randn(1, 4, 8)
    res = attn(x, causal=True, need_weights=True)
    assert int(res.diagnostics["nonfinite_logits"]) > 0
    assert int(res.diagnostics["nonfinite_out"]) > 0


# -- mixed heads -------------------------------------------------------------------------------


def test_mixed_heads_equal_each_variant_on_its_own_heads():
    torch.manual_seed(0)
    mixed = build_attention(
        "mixed", dim=16, n_heads=4,
        groups=[{"name": "dot", "heads": 3}, {"name": "euclidean", "heads": 1, "tau": 2.0}],
    ).double()  # fmt: skip
    q, k, v = qkv(b=2, h=4, lq=6, lk=6, d=4)
    x = torch.randn(2, 6, 16, dtype=F64)
    res = mixed.attend(q, k, v, x=x, causal=True, mask=None, need_weights=True)
    dot = explicit_attention(q[:, :3], k[:, :3], v[:, :3], causal=True)[0]
    euc = euclidean_attention_explicit(q[:, 3:], k[:, 3:], v[:, 3:], 2.0, causal=True)[0]
    torch.testing.assert_close(res.out, torch.cat([dot, euc], dim=1), atol=1e-12, rtol=0)
    assert res.probs is not None and res.probs.shape == (2, 4, 6, 6)
    # the groups use the layer's projections: no parameters of their own
    assert sum(p.numel() for p in mixed.groups.parameters()) == 0


def test_mixed_head_counts_must_sum_to_n_heads():
    with pytest.raises(ValueError, match="sum to 3, not n_heads=4"):
        build_attention("mixed", dim=16, n_heads=4, groups=[{"name": "dot", "heads": 3}])
    with pytest.raises(ValueError, match="unknown attention variant"):
        build_attention("mixed", dim=16, n_heads=4, groups=[{"name": "nope", "heads": 4}])
