"""Principal cofactors of L = I - A: identities, the three methods, gradients, errors, shapes."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attention_atlas.cofactor import (
    FAMILIES,
    cofactor_diagnostics,
    cofactor_penalty,
    cofactor_regularizer_from_probs,
    coupled_blocks,
    exact_cofactors,
    head_probs,
    laplacian,
    left_perron_vector,
    lu_cofactors,
    nonzero_eigen_product,
    power_stationary,
    principal_cofactors,
    softmax_family,
    softmax_matrices,
    spectral_gap,
    stability_margin,
    stationary_distribution,
    toward_reducible,
    validate_stochastic,
)
from attention_atlas.cofactor.penalty import FastPenalty, regularizer

F64 = torch.float64


CASES = {
    "random": lambda: softmax_matrices(3, 7, 7, scale=2.0),
    "banded": lambda: softmax_matrices(9, 9, mask="banded"),
    "causal": lambda: softmax_matrices(2, 6, 6, mask="causal"),
    "nearly_reducible": lambda: coupled_blocks(4, 3, 1e-3),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("method", ["minors", "lu"])
def test_cofactor_vector_is_a_left_null_vector_of_the_laplacian(case, method):
    A = CASES[case]()
    c = principal_cofactors(A, method)
    L = torch.eye(A.shape[-1], dtype=F64) - A
    residual = (c.unsqueeze(-2) @ L).squeeze(-2)  # c^T L
    assert residual.abs().max() <= 1e-13 * max(1.0, float(c.abs().max()))


@pytest.mark.parametrize("case", sorted(CASES))
def test_cofactor_sum_equals_product_of_nonzero_eigenvalues(case):
    A = CASES[case]()
    m_eig = nonzero_eigen_product(A)
    for method in ("minors", "lu"):
        m = principal_cofactors(A, method).sum(-1)
        torch.testing.assert_close(m, m_eig, rtol=1e-9, atol=1e-14)
    torch.testing.assert_close(stability_margin(A), m_eig, rtol=1e-9, atol=1e-14)


@pytest.mark.parametrize("case", ["random", "banded", "nearly_reducible"])
def test_cofactors_are_proportional_to_the_stationary_distribution(case):
    """Markov chain tree theorem: c / sum c is the left Perron vector of an irreducible A."""
    A = CASES[case]()
    c = principal_cofactors(A, "minors")
    assert (c > 0).all()
    pi = left_perron_vector(A)  # numpy's eigenvectors of A^T, an independent route
    torch.testing.assert_close(c / c.sum(-1, keepdim=True), pi, rtol=1e-8, atol=1e-12)
    torch.testing.assert_close(stationary_distribution(A), pi, rtol=1e-8, atol=1e-12)


def test_references_agree_with_their_definitions_on_a_two_state_chain():
    """A = [[1-p, p], [q, 1-q]]: L has eigenvalues 0 and p + q, c = (q, p), pi = (q, p) / (p + q)."""
    p, q = 0.3, 0.05
    A = torch.tensor([[1 - p, p], [q, 1 - q]], dtype=F64)
    torch.testing.assert_close(nonzero_eigen_product(A), torch.tensor(p + q, dtype=F64))
    torch.testing.assert_close(left_perron_vector(A), torch.tensor([q, p], dtype=F64) / (p + q))
    torch.testing.assert_close(exact_cofactors(A), torch.tensor([q, p], dtype=F64))


def test_matrix_families_are_row_stochastic_with_the_stated_support():
    n = 7
    causal = softmax_matrices(3, n, n, mask="causal")
    banded = softmax_matrices(n, n, mask="banded", width=2)
    i = torch.arange(n)
    assert (causal[..., i[None, :] > i[:, None]] == 0).all() and (causal.tril() > 0).sum() == 3 * 28
    assert (banded[(i[:, None] - i[None, :]).abs() > 2] == 0).all()
    assert (banded[(i[:, None] - i[None, :]).abs() <= 2] > 0).all()
    for eps in (0.0, 1e-3):
        A = coupled_blocks(4, 3, eps, count=2)
        torch.testing.assert_close(A.sum(-1), torch.ones(2, n, dtype=F64))
        torch.testing.assert_close(A[:, :4, 4:].sum(-1), torch.full((2, 4), eps, dtype=F64))
        torch.testing.assert_close(A[:, 4:, :4].sum(-1), torch.full((2, 3), eps, dtype=F64))
    for kind in FAMILIES:
        A = softmax_family(kind, 8, 5, seed=1)
        assert A.shape == (5, 8, 8)
        torch.testing.assert_close(A.sum(-1), torch.ones(5, 8, dtype=F64))
        torch.testing.assert_close(A, softmax_family(kind, 8, 5, seed=1), rtol=0, atol=0)
    with pytest.raises(ValueError, match="kind must be one of"):
        softmax_family("circulant", 4, 1)


def test_causal_cofactors_concentrate_on_the_first_token():
    """Causal A: L has a zero first row; c = prod_{j>=1} (1 - A_jj) e_0 and pi = e_0."""
    A = softmax_matrices(4, 8, 8, mask="causal", seed=3)
    c = principal_cofactors(A, "lu")
    expected = torch.zeros_like(c)
    expected[..., 0] = (1 - A.diagonal(dim1=-2, dim2=-1)[..., 1:]).prod(-1)
    torch.testing.assert_close(c, expected, rtol=1e-12, atol=1e-15)
    eig = torch.linalg.eigvals(A).abs().sort(-1, descending=True).values
    torch.testing.assert_close(spectral_gap(A), 1 - eig[..., 1])
    torch.testing.assert_close(
        spectral_gap(A), 1 - A.diagonal(dim1=-2, dim2=-1)[..., 1:].amax(-1), rtol=0, atol=1e-12
    )


def test_lu_cofactors_match_minors_to_1e10_relative_in_float64():
    for n in (2, 3, 8, 16, 33):
        A = softmax_matrices(5, n, n, scale=1.5, seed=n)
        ref = principal_cofactors(A, "minors")
        lu = principal_cofactors(A, "lu")
        rel = (lu - ref).abs().amax(-1) / ref.abs().amax(-1)
        assert rel.max() < 1e-10, (n, float(rel.max()))


def test_lu_normalised_cofactors_sum_to_one_and_margin_is_the_shifted_determinant():
    A = softmax_matrices(3, 10, 10, seed=1)
    res = lu_cofactors(A)
    torch.testing.assert_close(res.x.sum(-1), torch.ones(3, dtype=F64))
    M = torch.eye(10, dtype=F64) - A + 1.0 / 10
    torch.testing.assert_close(res.margin, torch.linalg.det(M))


def test_lu_in_float32_agrees_with_float64():
    A = softmax_matrices(4, 24, 24, seed=2)
    c64 = principal_cofactors(A, "lu")
    c32 = principal_cofactors(A.float(), "lu")
    assert c32.dtype == torch.float32
    rel = (c32.double() - c64).abs().max() / c64.abs().max()
    assert rel < 1e-4


def test_power_iteration_error_is_within_its_stated_bound():
    A = softmax_matrices(6, 20, 20, scale=2.0, seed=4)
    pi_ref = stationary_distribution(A, "minors")
    for tol in (1e-4, 1e-8):
        pi, bound, iters = power_stationary(A, tol=tol)
        err = (pi - pi_ref).abs().sum(-1)
        assert torch.isfinite(bound).all()
        assert (err <= bound + 1e-15).all(), (err, bound)
        assert iters >= 1
    c = principal_cofactors(A, "power", power_tol=1e-13)
    ref = principal_cofactors(A, "minors")
    assert ((c - ref).abs().sum(-1) / ref.sum(-1)).max() < 1e-10


def test_power_bound_is_infinite_when_no_column_is_reached_by_every_row():
    """delta = 1 - sum_j min_i A_ij is 1 when every column has a zero: the bound is infinite."""
    for A in (torch.eye(8, dtype=F64), softmax_matrices(8, 8, mask="banded", width=2)):
        assert float(A.amin(-2).sum()) == 0.0
        _, bound, _ = power_stationary(A)
        assert torch.isinf(bound)
    # causal attention: every row reaches token 0, so delta < 1 and the bound is finite
    _, bound, _ = power_stationary(softmax_matrices(8, 8, mask="causal"))
    assert torch.isfinite(bound)


def test_two_closed_classes_give_zero_cofactors_and_margin():
    a = softmax_matrices(3, 3, seed=5)
    b = softmax_matrices(4, 4, seed=6)
    A = torch.block_diag(a, b)
    for method in ("minors", "lu"):
        c = principal_cofactors(A, method)
        assert c.abs().max() < 1e-14
    assert float(stability_margin(A)) == 0.0
    assert bool(lu_cofactors(A).singular)


def test_nearly_reducible_margin_vanishes_linearly_with_the_coupling():
    m = [float(stability_margin(coupled_blocks(4, 3, eps))) for eps in (1e-2, 1e-3, 1e-4)]
    assert 9 < m[0] / m[1] < 11 and 9 < m[1] / m[2] < 11


def test_lu_gradient_passes_gradcheck_in_float64():
    z = torch.randn(2, 5, 5, dtype=F64, requires_grad=True)
    w = torch.randn(2, 5, dtype=F64)

    def f(z):
        return (principal_cofactors(torch.softmax(z, -1), "lu", check=False) * w).sum(-1)

    assert torch.autograd.gradcheck(f, (z,))


def test_lu_gradient_matches_autograd_of_minors():
    z = torch.randn(3, 7, 7, dtype=F64, requires_grad=True)
    w = torch.randn(3, 7, dtype=F64)
    g = []
    for method in ("lu", "minors"):
        (gz,) = torch.autograd.grad(
            (principal_cofactors(torch.softmax(z, -1), method) * w).sum(), z
        )
        g.append(gz)
    torch.testing.assert_close(g[0], g[1], rtol=1e-9, atol=1e-12)


def test_gradient_wrt_logits_is_the_same_for_i_minus_a_and_the_offdiagonal_laplacian():
    z = torch.randn(6, 6, dtype=F64, requires_grad=True)
    eye = torch.eye(6, dtype=F64)
    (g1,) = torch.autograd.grad(torch.linalg.det((eye - torch.softmax(z, -1))[1:, 1:]), z)
    (g2,) = torch.autograd.grad(torch.linalg.det(laplacian(torch.softmax(z, -1))[1:, 1:]), z)
    torch.testing.assert_close(g1, g2)


def test_penalty_passes_gradcheck_and_matches_the_minors_reference():
    z = torch.randn(2, 3, 6, 6, dtype=F64, requires_grad=True)

    def pen(z, method="lu"):
        return cofactor_penalty(torch.softmax(z, -1), beta=0.5, method=method)

    assert torch.autograd.gradcheck(pen, (z,))
    (g_lu,) = torch.autograd.grad(pen(z), z)
    (g_mi,) = torch.autograd.grad(pen(z, "minors"), z)
    torch.testing.assert_close(pen(z), pen(z, "minors"))
    torch.testing.assert_close(g_lu, g_mi, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("beta", [0.0, 0.3])
def test_fast_penalty_equals_both_references_in_value_and_gradient(case, beta):
    """The hand-written backward (method "lu") against torch's autograd through the LU and
    through the n minors, on every family (causal and nearly reducible included)."""
    A = CASES[case]().clone().requires_grad_(True)
    out = {}
    for method in ("lu", "lu-autograd", "minors"):
        p = cofactor_penalty(A, beta=beta, method=method, reduce="none")
        (g,) = torch.autograd.grad(p.sum(), A)
        out[method] = (p, g)
    # the minors' autograd is wrong where a minor is singular (a causal head's row 0: torch's
    # det backward gives 0 there); the finite-difference test below covers that row. With
    # beta > 0 a causal head's KL gradient with respect to the zeros above the diagonal comes
    # from the signs of round-off in its vanishing cofactors, which no two methods share (the
    # softmax passes none of it to the logits: see the next-but-one test): values only
    refs = ("lu-autograd",) if case == "causal" else ("lu-autograd", "minors")
    for ref in ("lu-autograd", "minors"):
        torch.testing.assert_close(out["lu"][0], out[ref][0], rtol=1e-9, atol=1e-12)
    for ref in refs if not (case == "causal" and beta) else ():
        scale = float(out[ref][1].abs().max())
        torch.testing.assert_close(out["lu"][1], out[ref][1], rtol=1e-7, atol=1e-9 * scale)


def test_fast_penalty_gradient_of_a_causal_head_matches_finite_differences_of_the_minors():
    A = softmax_matrices(6, 6, mask="causal", seed=3)
    A.requires_grad_(True)
    (g,) = torch.autograd.grad(cofactor_penalty(A, beta=0.0), A)
    A = A.detach()
    h = 1e-6
    for i, j in [(0, 2), (0, 5), (3, 1), (4, 5)]:
        up, down = A.clone(), A.clone()
        up[i, j] += h
        down[i, j] -= h
        fd = (cofactor_penalty(up, method="minors") - cofactor_penalty(down, method="minors")) / (
            2 * h
        )
        assert abs(float(g[i, j]) - float(fd)) < 1e-6 * max(1.0, abs(float(fd))), (i, j)


def test_kl_term_of_a_causal_head_is_minus_beta_n_minus_1_over_n_times_the_margin_term():
    """pi = e_0: KL(u || pi) = (1 - 1/n) log c_0 + const, so with respect to the logits its
    gradient is -beta (n - 1) / n times that of -log m = -log c_0 (up to terms of order
    n eps / c_0)."""
    n, beta = 10, 0.3
    A = softmax_matrices(5, n, n, mask="causal", seed=4)
    z = torch.log(A).requires_grad_(True)  # -inf above the diagonal
    (g_m,) = torch.autograd.grad(cofactor_penalty(torch.softmax(z, -1), beta=0.0), z)
    (g_b,) = torch.autograd.grad(cofactor_penalty(torch.softmax(z, -1), beta=beta), z)
    torch.testing.assert_close(g_b - g_m, -beta * (n - 1) / n * g_m, rtol=1e-4, atol=1e-12)


def test_fast_penalty_passes_gradcheck_with_the_kl_term():
    A = softmax_matrices(2, 5, 5, seed=8).requires_grad_(True)
    for beta, eps in [(0.0, 1e-8), (0.7, 1e-8), (0.7, 1e-2)]:
        assert torch.autograd.gradcheck(
            lambda a, b=beta, e=eps: FastPenalty.apply(a, b, e)[0], (A,)
        )


def test_fast_penalty_takes_the_reference_path_for_singular_matrices():
    """Two closed classes: m = 0 and every cofactor 0; the penalty is -log(eps) + beta KL(u||u)."""
    a, b = softmax_matrices(3, 3, seed=5), softmax_matrices(4, 4, seed=6)
    A = torch.stack([torch.block_diag(a, b), softmax_matrices(7, 7, seed=1)]).requires_grad_(True)
    loss, singular = FastPenalty.apply(A, 0.2, 1e-8)
    assert singular.tolist() == [True, False]
    p = cofactor_penalty(A, beta=0.2, reduce="none")
    assert abs(float(p[0].detach()) + math.log(1e-8)) < 1e-6
    torch.testing.assert_close(p, cofactor_penalty(A, beta=0.2, method="minors", reduce="none"))
    (g,) = torch.autograd.grad(p.sum(), A)
    assert torch.isfinite(g).all()


def test_margin_of_a_row_stochastic_matrix_is_positive_so_the_fast_path_takes_log_m():
    """Matrix-tree theorem: every c_i is a sum of products of nonnegative weights, so m >= 0."""
    for kind in FAMILIES:
        A = softmax_family(kind, 9, 6, seed=4)
        res = lu_cofactors(A)
        assert (res.sign > 0).all() and (res.cofactors >= -1e-15).all(), kind


def test_fast_penalty_of_float32_probabilities_matches_float64_and_returns_float32_gradients():
    A64 = softmax_matrices(3, 8, 8, seed=2)
    A32 = A64.float().requires_grad_(True)
    p32 = cofactor_penalty(A32, beta=0.1)
    (g32,) = torch.autograd.grad(p32, A32)
    A = A32.detach().double().requires_grad_(True)
    (g64,) = torch.autograd.grad(cofactor_penalty(A, beta=0.1, method="minors"), A)
    assert p32.dtype == F64 and g32.dtype == torch.float32
    torch.testing.assert_close(g32.double(), g64, rtol=1e-5, atol=1e-6)


def test_penalty_value_is_the_seed_formula():
    A = softmax_matrices(4, 5, 5, seed=7)
    c = principal_cofactors(A, "minors")
    eps, beta = 1e-8, 0.3
    pi = (c.clamp_min(0) + eps) / (c.clamp_min(0) + eps).sum(-1, keepdim=True)
    u = torch.full_like(pi, 1 / 5)
    kl = (u * (u / pi).log()).sum(-1)
    expected = -(c.sum(-1).abs() + eps).log() + beta * kl
    torch.testing.assert_close(cofactor_penalty(A, beta=beta, eps=eps, reduce="none"), expected)


def test_penalty_of_float32_probabilities_is_computed_in_float64():
    A = softmax_matrices(2, 6, 6).float().requires_grad_(True)
    p = cofactor_penalty(A, beta=1.0)
    assert p.dtype == F64
    p.backward()
    assert A.grad is not None and A.grad.dtype == torch.float32


def test_penalty_is_finite_with_gradient_for_saturated_causal_attention():
    z = torch.randn(8, 8, dtype=F64)
    z.diagonal()[3] = 60.0  # token 3 attends only to itself: A_33 = 1, rank L = n - 2
    z = z.masked_fill(torch.ones(8, 8, dtype=torch.bool).triu(1), -math.inf).requires_grad_(True)
    p = cofactor_penalty(torch.softmax(z, -1), beta=1.0)
    assert torch.isfinite(p)
    assert abs(float(p.detach()) + math.log(1e-8)) < 1e-6  # m = 0: the penalty is -log(eps)
    (g,) = torch.autograd.grad(p, z)
    assert torch.isfinite(g).all()


def test_regularizer_selects_layers_and_heads():
    probs = [softmax_matrices(2, 4, 5, 5, seed=s) for s in range(3)]
    full = cofactor_penalty(probs[1][:, :2], beta=0.1)
    sel = cofactor_regularizer_from_probs(probs, layers=[1], heads=2, beta=0.1)
    torch.testing.assert_close(sel, full)
    sel2 = cofactor_regularizer_from_probs(probs, layers=[0, 2], heads=[3], max_items=1)
    expected = (cofactor_penalty(probs[0][:1, 3]) + cofactor_penalty(probs[2][:1, 3])) / 2
    torch.testing.assert_close(sel2, expected)
    with pytest.raises(ValueError, match="need_weights"):
        cofactor_regularizer_from_probs([None])
    with pytest.raises(ValueError, match="out of range"):
        cofactor_regularizer_from_probs(probs, layers=[5])


def test_spectral_gap_of_a_lazy_uniform_chain_is_its_laziness():
    n, t = 6, 0.3
    A = (1 - t) * torch.eye(n, dtype=F64) + t / n
    assert abs(float(spectral_gap(A)) - t) < 1e-12


def test_diagnostics_of_doubly_stochastic_and_reducible_heads():
    n = 6
    uniform = torch.full((1, 1, n, n), 1 / n, dtype=F64)
    d = cofactor_diagnostics([uniform])
    assert abs(d["cofactor_min_prob_n"] - 1) < 1e-12 and d["cofactor_near_zero"] == 0
    assert abs(d["spectral_gap"] - 1) < 1e-12 and d["frac_disconnected"] == 0
    sink = torch.zeros(1, 1, n, n, dtype=F64)
    sink[..., 0] = 1.0  # every token attends to token 0: pi = e_0
    d = cofactor_diagnostics([sink])
    assert d["cofactor_near_zero"] == n - 1 and d["frac_with_near_zero"] == 1
    assert abs(d["cofactor_log_margin"]) < 1e-12  # m = 1: the margin does not see a sink
    blocks = coupled_blocks(3, 3, 1e-4).view(1, 1, n, n)
    assert cofactor_diagnostics([blocks])["frac_disconnected"] == 1


@pytest.mark.parametrize("method", ["minors", "lu", "power"])
def test_batched_shapes_and_single_matrices(method):
    A = softmax_matrices(2, 3, 5, 5)
    assert principal_cofactors(A, method).shape == (2, 3, 5)
    assert stability_margin(A).shape == (2, 3)
    assert stationary_distribution(A, method).shape == (2, 3, 5)
    assert principal_cofactors(A[0, 0], method).shape == (5,)
    one = torch.ones(4, 1, 1, dtype=F64)
    torch.testing.assert_close(principal_cofactors(one, method), torch.ones(4, 1, dtype=F64))


def test_clear_errors_on_bad_input():
    A = softmax_matrices(4, 4)
    with pytest.raises(ValueError, match="square"):
        principal_cofactors(A[:, :3])
    with pytest.raises(ValueError, match="square"):
        principal_cofactors(A[0])
    with pytest.raises(ValueError, match="floating-point"):
        principal_cofactors(torch.ones(3, 3, dtype=torch.int64))
    with pytest.raises(TypeError, match="torch.Tensor"):
        principal_cofactors(np.eye(3))
    with pytest.raises(ValueError, match="rows summing to 1"):
        principal_cofactors(torch.randn(4, 4, dtype=F64).abs())
    with pytest.raises(ValueError, match="entries >= 0"):
        principal_cofactors(torch.tensor([[1.5, -0.5], [0.5, 0.5]], dtype=F64))
    with pytest.raises(ValueError, match="non-finite"):
        principal_cofactors(torch.full((3, 3), math.nan))
    with pytest.raises(ValueError, match="method"):
        principal_cofactors(A, "qr")
    with pytest.raises(ValueError, match="method"):
        cofactor_penalty(A, method="power")
    # the tolerance is a parameter: a row sum off by 1e-3 passes with atol=1e-2
    B = A.clone()
    B[0, 0] += 1e-3
    validate_stochastic(B, atol=1e-2)
    with pytest.raises(ValueError, match="tolerance 1e-05"):
        validate_stochastic(B, atol=1e-5)


def test_harness_registers_and_runs_the_cofactor_regularizer_and_diagnostic():
    from attention_atlas.data import ArrayTask
    from attention_atlas.models import ModelConfig
    from attention_atlas.models.hooks import available_diagnostics, available_regularizers
    from attention_atlas.train import TrainConfig, train

    assert "cofactor" in available_regularizers() and "cofactor" in available_diagnostics()
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(16, 6, 4, generator=g), torch.randint(0, 3, (16,), generator=g)
    task = ArrayTask("toy", "classify", x, y, x[:8], y[:8], n_classes=3, patch_dim=4)
    res = train(
        ModelConfig(dim=8, n_layers=2, n_heads=2),
        TrainConfig(
            steps=2,
            batch_size=4,
            log_every=2,
            progress=False,
            measure_flops=False,
            effective_rank=False,
            device="cpu",
            regularizers=[{"name": "cofactor", "weight": 1e-3, "heads": 1, "beta": 0.1}],
            diagnostics=[{"name": "cofactor", "heads": [0, 1]}],
        ),  # fmt: skip
        task,
    )
    row = res.history.iloc[-1]
    assert math.isfinite(row["reg/cofactor"])
    assert 0 < row["cofactor/spectral_gap"] <= 1 + 1e-12
    assert 0 < row["cofactor/cofactor_min_prob_n"] <= 1 + 1e-12


def test_exact_reference_agrees_with_both_methods_on_well_conditioned_input():
    A = softmax_matrices(7, 7, seed=11)
    ex = exact_cofactors(A)
    for method in ("minors", "lu"):
        c = principal_cofactors(A, method)
        assert (c - ex).abs().max() / ex.abs().max() < 1e-13
    torch.testing.assert_close(
        exact_cofactors(torch.ones(1, 1, dtype=F64)), torch.ones(1, dtype=F64)
    )


# -- the regulariser's probabilities: recomputed for the chosen heads only ---------------------


def _model(task: str, attention: str = "dot"):
    from attention_atlas.models import ModelConfig, Transformer

    torch.manual_seed(0)
    if task == "lm":
        cfg = ModelConfig(task="lm", vocab_size=11, dim=16, n_layers=3, n_heads=4, max_len=9,
                          attention=attention)  # fmt: skip
        x = torch.randint(0, 11, (3, 9))
    else:
        cfg = ModelConfig(task="classify", patch_dim=4, n_classes=3, dim=16, n_layers=3,
                          n_heads=4, max_len=7, attention=attention)  # fmt: skip
        x = torch.randn(3, 7, 4, dtype=F64)
    return Transformer(cfg).double(), x


@pytest.mark.parametrize(("task", "attention"), [("lm", "dot"), ("classify", "dot"),
                                                 ("classify", "euclidean")])  # fmt: skip
def test_head_probs_equal_the_explicit_paths_probabilities(task, attention):
    model, x = _model(task, attention)
    explicit = [a.probs for a in model(x, need_weights=True).attentions]
    out = model(x)  # the fast forward: no probabilities
    assert all(a.probs is None for a in out.attentions)
    for heads, idx in [(1, [0]), (2, [0, 1]), ([1, 3], [1, 3]), ([2], [2])]:
        for layers in (None, [0, 2]):
            got = head_probs(model, out, layers=layers, heads=heads, max_items=2)
            ls = [0, 1, 2] if layers is None else layers
            ref = torch.stack([explicit[li][:2, idx] for li in ls])
            torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("task", ["lm", "classify"])
def test_regularizer_from_recomputed_heads_equals_the_one_from_explicit_probabilities(task):
    """Same value and the same gradient for every parameter, whichever way the probabilities
    come (float64 model)."""
    model, x = _model(task)
    params = list(model.parameters())
    vals, grads = [], []
    for weights in (True, False):
        out = model(x, need_weights=weights)
        r = regularizer(model, out, None, heads=2, beta=0.1)
        vals.append(r)
        grads.append(torch.autograd.grad(r, params, allow_unused=True))
    torch.testing.assert_close(vals[0], vals[1], rtol=1e-12, atol=0)
    for a, b in zip(*grads):
        if a is None:
            assert b is None
            continue
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-9 * float(a.abs().max()) + 1e-15)


def test_head_probs_name_what_they_need():
    model, x = _model("classify")
    with pytest.raises(ValueError, match="hidden states"):
        head_probs(model, object())
    with pytest.raises(ValueError, match="head indices"):
        head_probs(model, model(x), heads=[7])
    with pytest.raises(ValueError, match="out of range"):
        head_probs(model, model(x), layers=[5])


def test_toward_reducible_reaches_its_three_targets():
    blocks = toward_reducible("two closed blocks", 0.0, 8)
    assert float(stability_margin(blocks)) == 0.0
    absorbing = toward_reducible("an absorbing token", 1e-12, 8)
    pi = stationary_distribution(absorbing)
    assert float(pi[0]) > 1 - 1e-9 and float(stability_margin(absorbing)) > 1e-2
    cycle = toward_reducible("a cycle", 0.0, 8)
    assert (
        abs(float(stability_margin(cycle)) - 8) < 1e-9 and abs(float(spectral_gap(cycle))) < 1e-12
    )
    for t in ("two closed blocks", "an absorbing token", "a cycle"):
        A = toward_reducible(t, 0.3, 8)
        torch.testing.assert_close(A.sum(-1), torch.ones(8, dtype=F64))
    with pytest.raises(ValueError, match="target"):
        toward_reducible("a star", 0.1)
