"""Riemannian attention: identities in float64, fast paths against the reference, gradients."""

from __future__ import annotations

import math

import pytest
import torch

from attention_atlas import linalg
from attention_atlas.attention import build_attention
from attention_atlas.attention import riemannian as R
from attention_atlas.attention.euclidean import euclidean_attention_explicit

DT = torch.float64
TOL = 1e-10


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def inputs(shape=(2, 3), L=13, d=5, r=2, dv=4, seed=0, scale=0.5, grad=False):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(*shape, L, d, generator=g, dtype=DT)
    k = torch.randn(*shape, L, d, generator=g, dtype=DT)
    v = torch.randn(*shape, L, dv, generator=g, dtype=DT)
    U = scale * torch.randn(*shape, L, d, r, generator=g, dtype=DT)
    if grad:
        for t in (q, k, v, U):
            t.requires_grad_(True)
    return q, k, v, U


# ---- scores: definition, reference, decomposition, augmented factorisation ------------------


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
def test_hybrid_blending_endpoints_and_augmented_form(baseline):
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
    for alpha in (0.0, 0.35, 1.0):
        aug = R.geodesic_scores_augmented(q, k, U, tau, alpha=alpha, baseline=baseline)
        assert rel(aug, R.hybrid_scores(q, k, U, tau, alpha, baseline=baseline)) < TOL


def test_distance_baseline_blending_is_a_rescaled_metric():
    q, k, _, U = inputs(seed=6)
    alpha = 0.3
    blended = R.hybrid_scores(q, k, U, 1.1, alpha, baseline="distance")
    assert rel(blended, R.geodesic_scores(q, k, math.sqrt(alpha) * U, 1.1)) < TOL


def test_curvature_enters_as_row_and_column_penalties():
    q, k, _, U = inputs(seed=7)
    omega = torch.rand(q.shape[:-1], dtype=DT)
    s0 = R.geodesic_scores(q, k, U, 1.0)
    s1 = R.geodesic_scores(q, k, U, 1.0, curvature=omega)
    assert rel(s1, s0 - omega.unsqueeze(-1) - omega.unsqueeze(-2)) < TOL
    assert rel(R.geodesic_scores_augmented(q, k, U, 1.0, curvature=omega), s1) < TOL


# ---- attention: fast paths against the reference -----------------------------------------


@pytest.mark.parametrize("method", ["augmented", "sdpa", "lowrank"])
@pytest.mark.parametrize("causal", [False, True])
def test_fast_geodesic_attention_equals_reference(method, causal):
    q, k, v, U = inputs(L=37, d=4, r=2, dv=3, seed=8)  # 37: not a multiple of any block
    ref = R.geodesic_attention_reference(q, k, v, U, 1.2, causal)[0]
    out = R.geodesic_attention(q, k, v, U, 1.2, causal, method=method, block_q=8, block_k=16)
    assert rel(out, ref) < TOL


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


def test_blocked_attention_with_value_width_different_from_feature_width():
    g = torch.Generator().manual_seed(15)
    qh = torch.randn(2, 19, 11, generator=g, dtype=DT)
    kh = torch.randn(2, 23, 11, generator=g, dtype=DT)
    v = torch.randn(2, 23, 3, generator=g, dtype=DT)
    for causal in (False, True):
        s = qh @ kh.mT
        if causal:  # aligned at the end: query i sees keys j <= i + 4
            keep = torch.ones(19, 23, dtype=torch.bool).tril(diagonal=4)
            s = s.masked_fill(~keep, float("-inf"))
        ref = torch.softmax(s, -1) @ v
        out = R.blocked_attention(qh, kh, v, causal=causal, block_q=4, block_k=5)
        assert rel(out, ref) < TOL
    qh.requires_grad_(True)
    kh.requires_grad_(True)
    v.requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda a, b, c: R.blocked_attention(a, b, c, causal=True, block_q=6, block_k=7),
        (qh[:1, :8], kh[:1, :9], v[:1, :9]),
    )


def test_float32_fast_path_is_close_to_float64_reference():
    q, k, v, U = inputs(L=64, d=16, r=4, seed=16, scale=0.3)
    ref = R.geodesic_attention_reference(q, k, v, U, math.sqrt(32), True)[0]
    out = R.geodesic_attention(*(t.float() for t in (q, k, v, U)), math.sqrt(32), True)
    assert rel(out.double(), ref) < 1e-4


# ---- clear errors -------------------------------------------------------------------------


def test_errors_name_expected_and_received_shapes():
    q, k, v, U = inputs()
    with pytest.raises(ValueError, match=r"U must have shape \(\.\.\., L, d, r\)"):
        R.geodesic_scores(q, k, U[..., 0], 1.0)
    with pytest.raises(ValueError, match="tau must be a positive"):
        R.geodesic_scores(q, k, U, 0.0)
    with pytest.raises(ValueError, match="q and k must have the same shape"):
        R.geodesic_scores(q, k[..., :-1, :], U, 1.0)
    with pytest.raises(ValueError, match="share a dtype"):
        R.geodesic_scores(q, k, U.float(), 1.0)
    with pytest.raises(ValueError, match="curvature must have shape"):
        R.geodesic_attention(q, k, v, U, 1.0, curvature=torch.zeros(3, dtype=DT))
    with pytest.raises(ValueError, match="method must be"):
        R.geodesic_attention(q, k, v, U, 1.0, method="fast")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="baseline must be"):
        R.hybrid_scores(q, k, U, 1.0, 0.5, baseline="cosine")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="mask must be boolean"):
        R.blocked_attention(q, k, v, mask=torch.ones(13, 13))


# ---- phases A++ to E ----------------------------------------------------------------------


def test_metric_aware_projection_matches_dense_formula():
    q, _, _, U = inputs(seed=17)
    out = R.metric_aware_projection(q, U, 0.2)
    dense = q + 0.2 / math.sqrt(5) * (U @ U.mT @ q.unsqueeze(-1)).squeeze(-1)
    assert rel(out, dense) < TOL


def test_torsion_is_antisymmetric_and_applied_without_dense_matrices():
    q, _, _, U = inputs(seed=18)
    left, right = U, U.flip(-3)
    T = R.torsion_dense(left, right)
    assert float((T + T.mT).abs().max()) < 1e-14  # T^T = -T
    assert rel(R.torsion_apply(left, right, q), (T @ q.unsqueeze(-1)).squeeze(-1)) < TOL


def test_linear_transport_matches_dense_and_its_isometry_defect():
    q, _, _, U = inputs(seed=19, r=3)
    a, b = 0.3 * U, 0.3 * U.flip(-3)
    P = R.transport_dense(a, b)
    assert rel(R.transport_apply(a, b, q), (P @ q.unsqueeze(-1)).squeeze(-1)) < TOL
    eye = torch.eye(5, dtype=DT)
    dense_defect = torch.linalg.matrix_norm(P.mT @ P - eye)
    assert rel(R.isometry_defect(a, b), dense_defect) < 1e-9
    # eq. (25) says ||Delta^T Delta||_F = ||Delta||_F^2; for antisymmetric Delta it is at most
    # ||Delta||_F^2 / sqrt(2) (singular values come in pairs)
    delta_sq = (R.torsion_dense(a, b) ** 2).sum((-1, -2))
    assert bool((dense_defect <= delta_sq / math.sqrt(2) + 1e-12).all())
    nonzero = delta_sq > 1e-12
    assert bool(nonzero.any()) and bool((dense_defect[nonzero] < delta_sq[nonzero]).all())


def test_cayley_transport_is_orthogonal_and_matches_dense():
    q, _, _, U = inputs(seed=20, r=2)
    a, b = U, U.roll(1, dims=-3)
    P = R.transport_dense(a, b, "cayley")
    eye = torch.eye(5, dtype=DT)
    assert float((P.mT @ P - eye).abs().max()) < 1e-10
    assert rel(R.cayley_transport_apply(a, b, q), (P @ q.unsqueeze(-1)).squeeze(-1)) < TOL


def test_metric_preconditioned_update_uses_the_inverse_metric():
    h, upd, _, U = inputs(seed=21)
    out = R.metric_preconditioned_update(h, U, upd)
    dense = h + torch.linalg.solve(linalg.metric_dense(U), upd.unsqueeze(-1)).squeeze(-1)
    assert rel(out, dense) < TOL


def test_curvature_proxy_is_softplus_scaled_frobenius_norm():
    *_, U = inputs(seed=22)
    out = R.curvature_proxy(U, 0.5)
    assert rel(out, math.log1p(math.exp(0.5)) * (U**2).sum((-1, -2))) < TOL


# ---- regularisers against dense d x d formulas ---------------------------------------------


def dense_gram(U):
    return U @ U.mT


def test_anti_flatness_and_cap_match_their_definitions():
    *_, U = inputs(seed=23)
    kappa = (U**2).sum((-1, -2))
    assert rel(R.anti_flatness_loss(U, 2.0), torch.relu(2.0 - kappa).mean()) < TOL
    assert rel(R.metric_cap_loss(U, 1.0), torch.relu(kappa - 1.0).mean()) < TOL


def test_metric_diversity_all_pairs_matches_dense_pairwise_distances():
    *_, U = inputs(L=6, seed=24)
    A = dense_gram(U)  # (..., L, d, d)
    diff = A.unsqueeze(-3) - A.unsqueeze(-4)  # (..., L, L, d, d)
    dist = (diff**2).sum((-1, -2))
    expected = -(dist.sum((-1, -2)) / (6 * 5)).mean()
    assert rel(R.metric_diversity_loss(U), expected) < TOL


def test_metric_diversity_on_given_pairs_matches_dense():
    *_, U = inputs(L=6, seed=25)
    pairs = torch.tensor([[0, 1], [2, 5], [4, 3]])
    A = dense_gram(U)
    expected = -torch.stack(
        [((A[..., i, :, :] - A[..., j, :, :]) ** 2).sum((-1, -2)) for i, j in pairs.tolist()]
    ).mean()
    assert rel(R.metric_diversity_loss(U, pairs=pairs), expected) < TOL
    g = torch.Generator().manual_seed(0)
    sampled = R.metric_diversity_loss(U, n_pairs=50, generator=g)
    assert float(sampled) < 0


def test_curvature_smoothness_matches_dense_adjacent_differences():
    *_, U = inputs(L=6, seed=26)
    A = dense_gram(U)
    expected = ((A[..., 1:, :, :] - A[..., :-1, :, :]) ** 2).sum((-1, -2)).mean()
    assert rel(R.curvature_smoothness_loss(U), expected) < TOL


def test_regularisers_reject_too_short_sequences():
    U = torch.zeros(2, 1, 4, 2)
    with pytest.raises(ValueError, match="at least 2 positions"):
        R.metric_diversity_loss(U)
    with pytest.raises(ValueError, match="at least 2 positions"):
        R.curvature_smoothness_loss(U)


# ---- the module -------------------------------------------------------------------------


def test_metric_net_starts_near_the_euclidean_metric():
    net = R.MetricNet(dim=32, n_heads=4, head_dim=8, rank=4)
    U = net(torch.randn(2, 10, 32))
    assert U.shape == (2, 4, 10, 8, 4)
    assert float((U.detach() ** 2).sum((-1, -2)).mean()) < 0.05  # ||U_t||_F^2 small: g ~ I


def test_riemannian_attention_is_registered_and_equals_euclidean_at_zero_metric():
    torch.manual_seed(0)
    attn = build_attention("riemannian", dim=24, n_heads=3, rank=2).double()
    torch.nn.init.zeros_(attn.metric_net.fc2.weight)
    x = torch.randn(2, 11, 24, dtype=DT)
    res = attn(x, causal=True)
    q, k, v = attn.split_heads(x)
    euc, _, _ = euclidean_attention_explicit(q, k, v, attn.tau, causal=True)
    expected = attn.proj(euc.transpose(1, 2).reshape(2, 11, 24))
    assert rel(res.out, expected) < TOL
    assert res.extras["metric_factor"].shape == (2, 3, 11, 8, 2)


def test_riemannian_attention_weights_path_equals_fast_path_and_reports_diagnostics():
    torch.manual_seed(1)
    attn = build_attention(
        "riemannian",
        dim=16,
        n_heads=2,
        rank=3,
        metric_init_std=1.0,
        curvature=True,
        metric_projection=True,
        transport_rank=2,
        torsion_rank=1,
    ).double()
    x = torch.randn(2, 9, 16, dtype=DT)
    fast = attn(x, causal=True)
    slow = attn(x, causal=True, need_weights=True)
    assert rel(fast.out, slow.out) < TOL
    assert slow.probs is not None and slow.probs.shape == (2, 2, 9, 9)
    assert int(slow.diagnostics["nonfinite_logits"]) == 0
    assert float(fast.diagnostics["metric_kappa_mean"]) > 0


def test_riemannian_attention_metric_parameters_get_gradients():
    torch.manual_seed(2)
    attn = build_attention("riemannian", dim=16, n_heads=2, rank=2, metric_init_std=0.5)
    mp = attn.metric_parameters()
    assert mp and {id(p) for p in mp}.isdisjoint({id(p) for p in attn.qkv.parameters()})
    attn(torch.randn(2, 7, 16)).out.pow(2).sum().backward()
    assert all(
        p.grad is not None and float(p.grad.abs().sum()) > 0 for p in attn.metric_net.parameters()
    )


def test_riemannian_attention_rejects_bad_options():
    with pytest.raises(ValueError, match="torsion_rank > 0 needs transport_rank"):
        build_attention("riemannian", dim=8, n_heads=2, torsion_rank=1)
    with pytest.raises(ValueError, match="baseline must be"):
        build_attention("riemannian", dim=8, n_heads=2, baseline="nope")
    with pytest.raises(ValueError, match="rank must be positive"):
        build_attention("riemannian", dim=8, n_heads=2, rank=0)


# ---- pure attention stacks (chapter 2) ------------------------------------------------------


def test_pure_attention_stack_shapes_and_row_stochastic_mixing():
    g = torch.Generator().manual_seed(0)
    h0 = torch.randn(2, 10, 6, generator=g, dtype=DT)
    for score in ("dot", "euclidean", "homogeneous", "heterogeneous"):
        H = R.pure_attention_stack(h0, 3, score=score, strength=5.0, generator=g)  # type: ignore[arg-type]
        assert H.shape == (4, 2, 10, 6)
        assert torch.equal(H[0], h0)
    # identical tokens stay identical: a row-stochastic A maps 1 x^T to 1 (x W)^T
    same = torch.randn(1, 6, generator=g, dtype=DT).expand(10, 6)
    H = R.pure_attention_stack(same, 2, score="heterogeneous", generator=g)
    assert float(linalg.relative_residual(H[-1])) < 1e-12


def test_pure_attention_stack_metric_strength_is_the_mean_squared_factor_norm():
    # with strength 0 the homogeneous and heterogeneous stacks are Euclidean-distance stacks
    h0 = torch.randn(8, 5, generator=torch.Generator().manual_seed(1), dtype=DT)
    runs = [
        R.pure_attention_stack(
            h0, 2, score=s, strength=0.0, generator=torch.Generator().manual_seed(2)
        )  # type: ignore[arg-type]
        for s in ("euclidean", "homogeneous", "heterogeneous")
    ]
    # the metric draws consume the generator differently, so compare layer 1 only (same W_Q, W_K, W_V)
    assert rel(runs[1][1], runs[0][1]) < TOL and rel(runs[2][1], runs[0][1]) < TOL
    with pytest.raises(ValueError, match="score must be"):
        R.pure_attention_stack(h0, 1, score="cosine")  # type: ignore[arg-type]


def test_auto_method_picks_the_measured_winner():
    q = torch.zeros(1, 4, 16)
    assert R._auto_method(q, torch.zeros(1, 4, 16, 4)) == "augmented"
    q64 = torch.zeros(1, 4, 64)
    assert R._auto_method(q64, torch.zeros(1, 4, 64, 4)) == "lowrank"
