"""State-space models as structured matrices (attention/sma/ssm.py): the seed's checks 2 to 4
and their extensions, in float64 against dense inverses and solves."""

from __future__ import annotations

import torch
from sma_inputs import F64, close, gen, rand, randn

from attention_atlas.attention.sma import (
    bidiagonal,
    bidiagonal_inverse_generators,
    decay_mask,
    per_state_ssm_matrices,
    scalar_ssm_matrices,
    ssm_as_masked_attention,
    ssm_as_sum_of_masked_attentions,
    ssm_block_matrices,
    ssm_masked_attention_product,
    ssm_recurrence,
    ssm_semiseparable,
)


def test_block_bidiagonal_inverse_is_the_semiseparable_generator_matrix() -> None:
    g = gen(4)
    T, n = 9, 3
    A_blocks = randn(T - 1, n, n, g=g) / 2 + torch.eye(n, dtype=F64)
    A = ssm_block_matrices(A_blocks, randn(T, n, 1, g=g), randn(T, n, 1, g=g))[0]
    S = bidiagonal_inverse_generators(A_blocks)
    assert S.U.shape == (T * n, n) and S.rank == n
    assert close(S.dense(), torch.linalg.inv(A))
    assert close(S.dense() @ A, torch.eye(T * n, dtype=F64))


def test_decay_mask_is_the_inverse_of_the_unit_bidiagonal_and_is_one_semiseparable() -> None:
    g = gen(5)
    a = rand(11, g=g) * 2 - 1  # signs allowed
    L = decay_mask(a)
    assert close(L, torch.linalg.inv(bidiagonal(a)))
    S = bidiagonal_inverse_generators(a)  # u_t = a_0...a_{t-1}, v_t = 1/u_t
    assert close(S.dense(), L)
    a[3] = 0.0  # a zero transition: the mask is still the inverse (no division is used)
    assert close(decay_mask(a), torch.linalg.inv(bidiagonal(a)))


def test_ssm_hidden_states_by_iteration_equal_the_semiseparable_inverse_form() -> None:
    """Seed check 2 (scalar-times-identity dynamics, scalar inputs and outputs as in the seed)."""
    g = gen(42)
    T, n, m = 10, 6, 1
    A_blocks = rand(T - 1, g=g)[:, None, None] * torch.eye(n, dtype=F64)
    B_blocks, C_blocks, x = rand(T, n, m, g=g), rand(T, n, 1, g=g), randn(T, m, g=g)
    h, y = ssm_recurrence(A_blocks, B_blocks, C_blocks, x)
    h_ss, y_ss = ssm_semiseparable(A_blocks, B_blocks, C_blocks, x)
    assert close(h_ss, h) and close(y_ss, y)
    A, B, C = ssm_block_matrices(A_blocks, B_blocks, C_blocks)
    assert close(torch.linalg.solve(A, B @ x.reshape(-1)), h.reshape(-1))
    assert close(C.T @ torch.linalg.solve(A, B @ x.reshape(-1)), y.reshape(-1))


def test_ssm_with_general_dynamics_three_ways_agree() -> None:
    g = gen(6)
    T, n, m, k = 12, 4, 2, 3
    A_blocks = randn(T - 1, n, n, g=g) / 3 + 0.8 * torch.eye(n, dtype=F64)
    B_blocks, C_blocks, x = randn(T, n, m, g=g), randn(T, n, k, g=g), randn(T, m, g=g)
    h, y = ssm_recurrence(A_blocks, B_blocks, C_blocks, x)
    h_ss, y_ss = ssm_semiseparable(A_blocks, B_blocks, C_blocks, x)
    A, B, C = ssm_block_matrices(A_blocks, B_blocks, C_blocks)
    y_dense = C.T @ torch.linalg.solve(A, B @ x.reshape(-1))
    assert close(h_ss, h) and close(y_ss, y) and close(y_dense, y.reshape(-1))


def test_scalar_ssm_is_structured_masked_attention() -> None:
    """Seed check 3: C^T A^{-1} B = sum_k D(c^k) a^{-1} D(b^k) = (C_n B_n^T) o a^{-1}."""
    g = gen(42)
    T, n = 10, 6
    a = rand(T - 1, g=g)
    Bn, Cn = rand(T, n, g=g), rand(T, n, g=g)
    A, B, C = scalar_ssm_matrices(a, Bn, Cn)
    assert A.shape == (n * T, n * T) and B.shape == (n * T, T)
    assert close(A, torch.kron(torch.eye(n, dtype=F64), bidiagonal(a)))
    M_dense = C.T @ torch.linalg.solve(A, B)
    ai = torch.linalg.inv(bidiagonal(a))
    assert close(M_dense, sum(torch.diag(Cn[:, k]) @ ai @ torch.diag(Bn[:, k]) for k in range(n)))
    assert close(M_dense, sum(torch.outer(Cn[:, k], Bn[:, k]) * ai for k in range(n)))
    assert close(M_dense, (Cn @ Bn.T) * ai)
    assert close(ssm_as_masked_attention(a, Bn, Cn), M_dense)


def test_per_state_dynamics_give_a_sum_of_masked_attentions() -> None:
    g = gen(7)
    T, n = 9, 4
    a = rand(n, T - 1, g=g)
    Bn, Cn = randn(T, n, g=g), randn(T, n, g=g)
    A, B, C = per_state_ssm_matrices(a, Bn, Cn)
    M_dense = C.T @ torch.linalg.solve(A, B)
    M = ssm_as_sum_of_masked_attentions(a, Bn, Cn)
    assert close(M, M_dense)
    # with equal dynamics it collapses to one masked attention
    same = a[:1].expand(n, -1)
    assert close(
        ssm_as_sum_of_masked_attentions(same, Bn, Cn), ssm_as_masked_attention(a[0], Bn, Cn)
    )


def test_masked_attention_product_with_the_semiseparable_inverse() -> None:
    """Seed check 4: C^T A^{-1} B x = sum_k c^k o (tril(u v^T) (b^k o x)), in O(T n)."""
    g = gen(42)
    T, n = 10, 6
    a = rand(T - 1, g=g) + 0.1
    Bn, Cn, x = rand(T, n, g=g), rand(T, n, g=g), randn(T, g=g)
    A, B, C = scalar_ssm_matrices(a, Bn, Cn)
    assert close(ssm_masked_attention_product(a, Bn, Cn, x), C.T @ torch.linalg.solve(A, B @ x))
