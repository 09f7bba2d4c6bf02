"""Shared linear algebra: Woodbury, symmetric packing, ranks, collapse measures (float64)."""

from __future__ import annotations

import math

import pytest
import torch

from attention_atlas import linalg

DT = torch.float64


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def test_woodbury_inverse_equals_dense_inverse(gen):
    U = torch.randn(5, 12, 3, generator=gen, dtype=DT)
    assert rel(linalg.woodbury_inverse(U), linalg.metric_inverse_dense(U)) < 1e-10


def test_metric_inverse_apply_equals_dense_solve(gen):
    U = torch.randn(4, 7, 20, 5, generator=gen, dtype=DT)
    x = torch.randn(4, 7, 20, generator=gen, dtype=DT)
    dense = torch.linalg.solve(linalg.metric_dense(U), x.unsqueeze(-1)).squeeze(-1)
    assert rel(linalg.metric_inverse_apply(U, x), dense) < 1e-10


def test_metric_inverse_apply_inverts_metric_apply(gen):
    U = torch.randn(3, 16, 4, generator=gen, dtype=DT)
    x = torch.randn(3, 16, generator=gen, dtype=DT)
    assert rel(linalg.metric_inverse_apply(U, linalg.metric_apply(U, x)), x) < 1e-10


def test_metric_inverse_apply_broadcasts_one_metric_over_many_vectors(gen):
    U = torch.randn(10, 2, generator=gen, dtype=DT)
    x = torch.randn(6, 10, generator=gen, dtype=DT)
    out = linalg.metric_inverse_apply(U, x)
    assert out.shape == (6, 10)
    assert rel(out, (linalg.metric_inverse_dense(U) @ x.T).T) < 1e-10


def test_metric_inverse_apply_gradcheck(gen):
    U = torch.randn(2, 5, 2, generator=gen, dtype=DT, requires_grad=True)
    x = torch.randn(2, 5, generator=gen, dtype=DT, requires_grad=True)
    assert torch.autograd.gradcheck(linalg.metric_inverse_apply, (U, x))


def test_metric_inverse_shrinks_only_the_stretched_directions(gen):
    # g^{-1} has eigenvalue 1/(1 + s^2) on range(U) and 1 on its complement
    U = torch.randn(8, 2, generator=gen, dtype=DT)
    eig = torch.linalg.eigvalsh(linalg.woodbury_inverse(U))
    s2 = torch.linalg.svdvals(U) ** 2
    expected = torch.cat([1 / (1 + s2), torch.ones(6, dtype=DT)]).sort().values
    assert rel(eig, expected) < 1e-10


def test_metric_logdet_matches_dense_logdet(gen):
    U = torch.randn(3, 9, 4, generator=gen, dtype=DT)
    assert rel(linalg.metric_logdet(U), torch.logdet(linalg.metric_dense(U))) < 1e-10


def test_woodbury_rejects_mismatched_shapes():
    with pytest.raises(
        ValueError, match=r"x must have shape \(\.\.\., d\) with d = U.shape\[-2\] = 5"
    ):
        linalg.metric_inverse_apply(torch.zeros(5, 2), torch.zeros(4))
    with pytest.raises(ValueError, match="share a dtype"):
        linalg.metric_inverse_apply(torch.zeros(5, 2), torch.zeros(5, dtype=DT))
    with pytest.raises(ValueError, match=r"\(\.\.\., d, r\)"):
        linalg.metric_inverse_apply(torch.zeros(5), torch.zeros(5))


def test_sym_pack_preserves_the_frobenius_inner_product(gen):
    a = torch.randn(4, 6, 6, generator=gen, dtype=DT)
    b = torch.randn(4, 6, 6, generator=gen, dtype=DT)
    a, b = a + a.mT, b + b.mT
    lhs = (linalg.sym_pack(a) * linalg.sym_pack(b)).sum(-1)
    assert rel(lhs, (a * b).sum((-1, -2))) < 1e-10
    assert linalg.sym_pack(a).shape[-1] == 6 * 7 // 2


def test_sym_pack_outer_and_gram_match_dense_packing(gen):
    x = torch.randn(3, 7, generator=gen, dtype=DT)
    U = torch.randn(3, 7, 2, generator=gen, dtype=DT)
    assert rel(linalg.sym_pack_outer(x), linalg.sym_pack(x.unsqueeze(-1) * x.unsqueeze(-2))) < 1e-12
    assert rel(linalg.sym_pack_gram(U), linalg.sym_pack(U @ U.mT)) < 1e-12


def test_quadratic_form_separates_through_sym_pack(gen):
    # k^T A k = <pack(A), pack(k k^T)>: the separable form behind Theorem 3.2
    U = torch.randn(5, 2, generator=gen, dtype=DT)
    k = torch.randn(5, generator=gen, dtype=DT)
    quad = k @ (U @ U.T) @ k
    sep = linalg.sym_pack_gram(U) @ linalg.sym_pack_outer(k)
    assert abs(float(quad - sep)) < 1e-12 * abs(float(quad))


def test_lowrank_gram_distance_identity_matches_dense(gen):
    Ui = torch.randn(10, 12, 3, generator=gen, dtype=DT)
    Uj = torch.randn(10, 12, 3, generator=gen, dtype=DT)
    assert (
        rel(linalg.lowrank_gram_distance_sq(Ui, Uj), linalg.lowrank_gram_distance_sq_dense(Ui, Uj))
        < 1e-10
    )


def test_lowrank_gram_distance_is_zero_for_rotated_factors(gen):
    # U and U Q (Q orthogonal) give the same metric
    U = torch.randn(9, 3, generator=gen, dtype=DT)
    Q = torch.linalg.qr(torch.randn(3, 3, generator=gen, dtype=DT))[0]
    assert float(linalg.lowrank_gram_distance_sq(U, U @ Q)) < 1e-10 * float((U * U).sum()) ** 2


def test_effective_rank_of_known_spectra():
    eye = torch.eye(5, dtype=DT)
    assert abs(float(linalg.effective_rank(eye)) - 5) < 1e-12
    one = torch.outer(torch.arange(1.0, 5, dtype=DT), torch.arange(1.0, 4, dtype=DT))
    assert abs(float(linalg.effective_rank(one)) - 1) < 1e-6
    s = torch.tensor([3.0, 1.0], dtype=DT)
    p = s / s.sum()
    expected = math.exp(-float((p * p.log()).sum()))
    assert abs(float(linalg.effective_rank_from_singular_values(s)) - expected) < 1e-12


def test_effective_rank_is_batched_and_zero_for_zero_matrix():
    x = torch.zeros(2, 3, 4, dtype=DT)
    x[0] = torch.eye(3, 4, dtype=DT)
    er = linalg.effective_rank(x)
    assert er.shape == (2,)
    assert abs(float(er[0]) - 3) < 1e-12 and float(er[1]) == 0.0


def test_effective_rank_rejects_negative_singular_values():
    with pytest.raises(ValueError, match="non-negative"):
        linalg.effective_rank_from_singular_values(torch.tensor([1.0, -1.0]))


def test_numerical_rank_counts_independent_directions(gen):
    a = torch.randn(30, 4, generator=gen, dtype=DT) @ torch.randn(4, 20, generator=gen, dtype=DT)
    assert int(linalg.numerical_rank(a)) == 4
    assert int(linalg.numerical_rank(torch.eye(6, dtype=DT))) == 6


def test_spectral_gap_of_a_two_state_chain():
    p, q = 0.2, 0.3
    a = torch.tensor([[1 - p, p], [q, 1 - q]], dtype=DT)
    # eigenvalues 1 and 1 - p - q
    assert abs(float(linalg.spectral_gap(a, "eigen")) - (p + q)) < 1e-12
    s = torch.linalg.svdvals(a)
    assert abs(float(linalg.spectral_gap(a, "singular")) - float(s[0] - s[1])) < 1e-12
    with pytest.raises(ValueError, match="kind must be"):
        linalg.spectral_gap(a, "nope")


def test_composite_norm_is_geometric_mean_of_induced_one_and_inf_norms(gen):
    x = torch.randn(6, 4, generator=gen, dtype=DT)
    n1 = torch.linalg.matrix_norm(x, ord=1)
    ninf = torch.linalg.matrix_norm(x, ord=float("inf"))
    assert rel(linalg.composite_norm(x), torch.sqrt(n1 * ninf)) < 1e-12


def test_relative_residual_vanishes_exactly_for_identical_tokens(gen):
    row = torch.randn(1, 5, generator=gen, dtype=DT)
    same = row.expand(7, 5)
    assert float(linalg.relative_residual(same)) < 1e-14
    assert float(linalg.relative_residual(torch.randn(7, 5, generator=gen, dtype=DT))) > 0.1
    rank1 = torch.outer(torch.randn(7, generator=gen, dtype=DT), row[0])
    assert float(linalg.relative_residual(rank1, "rank1")) < 1e-12
    with pytest.raises(ValueError, match="kind must be"):
        linalg.rank_collapse_residual(same, "svd")


# ---- batched CPU LU after an explicit thread count (serial_lu) ------------------------------

_LU_AFTER_SET_THREADS = r"""
import torch
from attention_atlas import linalg
from attention_atlas.attention.riemannian.geometry import transport_dense
from attention_atlas.cofactor.cofactors import lu_cofactors
from attention_atlas.experiments.low_rank.cost import dense_solve

torch.set_num_threads(1)
torch.set_num_threads(2)  # an explicit count above one, as the harness's thread restore makes
g = torch.Generator().manual_seed(0)
n, b = 192, 4
U = torch.randn(b, n, 4, generator=g, dtype=torch.float64) / n**0.5
x = torch.randn(b, n, generator=g, dtype=torch.float64)
A = torch.softmax(torch.randn(b, n, n, generator=g, dtype=torch.float64), -1)
a, c = (torch.randn(b, n, 2, generator=g, dtype=torch.float64) / n for _ in range(2))
got = {
    "inv": linalg.metric_inverse_dense(U),
    "solve": dense_solve(U, x),
    "cofactors": lu_cofactors(A).x,
    "cayley": transport_dense(a, c, "cayley"),
}
assert torch.get_num_threads() == 2
torch.set_num_threads(1)  # the reference: one matrix at a time, on one thread
want = {
    "inv": torch.stack([linalg.metric_inverse_dense(u) for u in U]),
    "solve": torch.stack([dense_solve(u, v) for u, v in zip(U, x)]),
    "cofactors": torch.stack([lu_cofactors(m).x for m in A]),
    "cayley": torch.stack([transport_dense(p, q, "cayley") for p, q in zip(a, c)]),
}
for k in got:
    assert torch.equal(got[k], want[k]), (k, (got[k] - want[k]).abs().max().item())
print("ok")
"""


def test_batched_lu_after_explicit_thread_count_finishes_and_matches_one_matrix_at_a_time():
    """torch 2.13's MKL hangs in a batched ``getrf`` of ``n >= ~150`` after
    ``torch.set_num_threads(2)`` (see :func:`linalg.serial_lu`): the library's batched LU
    call sites, run in a fresh process after such a call, finish and give the numbers of one
    matrix at a time on one thread, bit for bit."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _LU_AFTER_SET_THREADS], capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
    assert "MKL ERROR" not in proc.stderr, proc.stderr[-2000:]


def test_serial_lu_takes_one_thread_only_where_torch_would_run_getrf_concurrently():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        seen = {}
        cases = {
            "batched": torch.zeros(3, 15, 15),
            "one matrix": torch.zeros(15, 15),
            "batch of one": torch.zeros(1, 1, 64, 64),
            "small": torch.zeros(8, 14, 14),
        }
        for name, A in cases.items():
            with linalg.serial_lu(A):
                seen[name] = torch.get_num_threads()
            assert torch.get_num_threads() == 2, name  # restored
        assert seen == {"batched": 1, "one matrix": 2, "batch of one": 2, "small": 2}
        with pytest.raises(RuntimeError, match="inside"), linalg.serial_lu(torch.zeros(2, 20, 20)):
            raise RuntimeError("inside")
        assert torch.get_num_threads() == 2  # restored on an error too
        torch.set_num_threads(1)
        with linalg.serial_lu(torch.zeros(3, 20, 20)):
            assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
