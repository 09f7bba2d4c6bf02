"""The phase operators (eqs. (20) to (26)) against their dense d x d formulas in float64."""

from __future__ import annotations

import math

import torch
from riemannian_inputs import DT, TOL, inputs, rel

from attention_atlas import linalg
from attention_atlas.attention import riemannian as R


def test_metric_strength_is_the_squared_frobenius_norm_of_each_factor():
    *_, U = inputs(seed=21)
    assert rel(R.metric_strength(U), torch.linalg.matrix_norm(U) ** 2) < TOL


def test_curvature_proxy_is_softplus_scaled_frobenius_norm():
    *_, U = inputs(seed=22)
    out = R.curvature_proxy(U, 0.5)
    assert rel(out, math.log1p(math.exp(0.5)) * (U**2).sum((-1, -2))) < TOL


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


def test_factor_products_are_the_per_token_matrix_products():
    q, _, _, U = inputs(seed=23)
    c = R.factor_t_apply(U, q)
    assert rel(c, (U.mT @ q.unsqueeze(-1)).squeeze(-1)) < TOL
    assert rel(R.factor_apply(U, c), (U @ c.unsqueeze(-1)).squeeze(-1)) < TOL


def test_preconditioned_update_fast_path_equals_the_woodbury_reference_and_its_gradients():
    h, upd, _, U = inputs(seed=24, scale=1.5)
    for t in (h, upd, U):
        t.requires_grad_(True)
    fast = R.metric_preconditioned_update(h, U, upd)
    ref = h + linalg.metric_inverse_apply(U, upd)
    assert rel(fast, ref) < TOL
    w = torch.randn_like(ref)
    g_fast = torch.autograd.grad((fast * w).sum(), (h, upd, U))
    g_ref = torch.autograd.grad((ref * w).sum(), (h, upd, U))
    for a, b in zip(g_fast, g_ref):
        assert rel(a, b) < TOL


def test_preconditioned_update_custom_backward_passes_gradcheck():
    h, upd, _, U = inputs(shape=(2,), L=3, d=4, r=2, seed=25, grad=True)
    assert torch.autograd.gradcheck(R.metric_preconditioned_update, (h, U, upd))


def test_preconditioned_update_broadcasts_one_metric_through_the_reference():
    h, upd, _, U = inputs(seed=26)
    one = U[:1, :1]  # (1, 1, L, d, r) against (2, 3, L, d)
    ref = h + linalg.metric_inverse_apply(one, upd)
    assert rel(R.metric_preconditioned_update(h, one, upd), ref) < TOL


def test_metric_aware_projection_custom_backward_passes_gradcheck():
    q, _, _, U = inputs(shape=(2,), L=3, d=4, r=2, seed=40, grad=True)
    gamma = torch.tensor(0.7, dtype=DT, requires_grad=True)
    dense = q + gamma / 2.0 * (U @ U.mT @ q.unsqueeze(-1)).squeeze(-1)  # eq. (20), d = 4
    assert rel(R.metric_aware_projection(q, U, gamma), dense) < TOL
    assert torch.autograd.gradcheck(R.metric_aware_projection, (q, U, gamma))


def test_transport_and_torsion_in_one_pass_equal_the_dense_operators():
    g = torch.Generator().manual_seed(41)
    wt = torch.randn(2, 3, 4, 2, 5, generator=g, dtype=DT)  # per token A^T, B^T, L^T, R^T
    x = torch.randn(2, 3, 5, generator=g, dtype=DT)
    w = torch.tensor([1.0, 0.3], dtype=DT)
    a, b, lt, rt = wt.transpose(-1, -2).unbind(-3)
    dense = R.transport_dense(a, b) + 0.3 * R.torsion_dense(lt, rt)  # P + gamma_T T
    expect = (dense @ x.unsqueeze(-1)).squeeze(-1)
    assert rel(R.skew_factors_apply(wt, x, w), expect) < TOL
    expect_t = (R.torsion_dense(a, b) @ x.unsqueeze(-1)).squeeze(-1)  # one pair, w = -2
    assert rel(R.skew_factors_apply(wt[..., :2, :, :], x, -2 * w[:1]), x - 2 * expect_t) < TOL
    for t in (wt, x, w):
        t.requires_grad_(True)
    assert torch.autograd.gradcheck(R.skew_factors_apply, (wt, x, w))


def test_metric_aware_projections_of_q_and_k_are_eq20_of_each_and_pass_gradcheck():
    q, k, _, U = inputs(shape=(2,), L=3, d=4, r=2, seed=42, grad=True)
    gamma = torch.tensor(0.4, dtype=DT, requires_grad=True)
    pq, pk = R.metric_aware_projections(U, gamma, q, k)
    for x, p in ((q, pq), (k, pk)):
        assert rel(p, x + gamma / 2.0 * (U @ U.mT @ x.unsqueeze(-1)).squeeze(-1)) < TOL
    assert torch.autograd.gradcheck(lambda U, g, q, k: R.metric_aware_projections(U, g, q, k),
                                    (U, gamma, q, k))  # fmt: skip
