"""State-space models as structured matrices (seed sections 1 and 2).

The SSM ``h_0 = B_0 x_0``, ``h_t = A_{t-1} h_{t-1} + B_t x_t``, ``y_t = C_t^T h_t`` three ways:
the recurrence, the block matrices ``y = C^T A^{-1} B x`` with ``A^{-1}`` applied through its
semiseparable generators, and, for scalar dynamics, the structured masked attention
``M = (C B^T) o a^{-1}`` (a sum of such when each state has its own dynamics).

Conventions: sequences are indexed ``t = 0 .. T-1`` in code (``1 .. T`` in the seed). A dense
matrix named for the seed's block matrices (``A``, ``B``, ``C``) is ``(T n, T m)``; its block
``(i, j)`` is rows ``i n : (i+1) n``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attention_atlas.linalg import serial_lu

from ._checks import check_arg, check_same, shape_of
from .masked import Semiseparable, low_rank_masked_product

__all__ = [
    "bidiagonal",
    "bidiagonal_inverse_generators",
    "block_bidiagonal",
    "decay_mask",
    "per_state_ssm_matrices",
    "scalar_ssm_matrices",
    "ssm_as_masked_attention",
    "ssm_as_sum_of_masked_attentions",
    "ssm_block_matrices",
    "ssm_masked_attention_product",
    "ssm_recurrence",
    "ssm_semiseparable",
]


def bidiagonal(a: Tensor) -> Tensor:
    """The ``(T, T)`` unit lower-bidiagonal matrix with ``-a`` below the diagonal; ``a (T-1,)``."""
    check_arg("bidiagonal", "a", a, "(T-1,)", ndim=1)
    return torch.eye(a.shape[0] + 1, dtype=a.dtype, device=a.device) - torch.diag(a, -1)


def block_bidiagonal(A_blocks: Tensor) -> Tensor:
    """Block lower-bidiagonal ``A (T n, T n)``: identity blocks on the diagonal, ``-A_i`` below.

    ``A_blocks (T-1, n, n)`` are the transitions ``h_{i+1} = A_i h_i + ...``
    (seed section 1, the block form).
    """
    _check_blocks("block_bidiagonal", A_blocks)
    t1, n, _ = A_blocks.shape
    T = t1 + 1
    sub = torch.zeros(T, T, n, n, dtype=A_blocks.dtype, device=A_blocks.device)
    idx = torch.arange(t1, device=A_blocks.device)
    sub[idx + 1, idx] = A_blocks  # block (i+1, i)
    eye = torch.eye(T * n, dtype=A_blocks.dtype, device=A_blocks.device)
    return eye - sub.permute(0, 2, 1, 3).reshape(T * n, T * n)


def bidiagonal_inverse_generators(A_blocks: Tensor) -> Semiseparable:
    """Generators of ``A^{-1} = tril(U V^T)`` for the block-bidiagonal ``A``.

    With ``Phi_0 = I`` and ``Phi_i = A_{i-1} ... A_0`` (transitions applied from the start),
    block ``(i, j)`` of ``A^{-1}`` for ``i >= j`` is ``A_{i-1} ... A_j = Phi_i Phi_j^{-1}``, so
    ``U = [Phi_0; ...; Phi_{T-1}]`` and ``V = [Phi_0^{-T}; ...; Phi_{T-1}^{-T}]``, both
    ``(T n, n)``. Every ``A_i`` must be invertible. The diagonal blocks ``Phi_i Phi_i^{-1} = I``
    are lower triangular, so the scalar ``tril`` of ``U V^T`` is exactly the block one.

    Note: the products ``Phi_i`` grow or shrink geometrically; for long sequences with strong
    decay ``V`` overflows (this is why SSD works in log space, chunk by chunk).

    Args:
        A_blocks: ``(T-1, n, n)``, or ``(T-1,)`` for scalar dynamics (then ``n = 1``).
    """
    fn, want = "bidiagonal_inverse_generators", "(T-1,) or (T-1, n, n) with n >= 1"
    check_arg(fn, "A_blocks", A_blocks, want)
    if A_blocks.dim() == 1:
        A_blocks = A_blocks[:, None, None]
    _check_blocks(fn, A_blocks, want)
    t1, n, _ = A_blocks.shape
    phi = [torch.eye(n, dtype=A_blocks.dtype, device=A_blocks.device)]
    for i in range(t1):
        phi.append(A_blocks[i] @ phi[-1])
    Phi = torch.stack(phi)  # (T, n, n)
    U = Phi.reshape((t1 + 1) * n, n)
    # scalar dynamics: a plain reciprocal (an underflowed product gives inf, not an exception)
    with serial_lu(Phi):
        Phi_inv = 1.0 / Phi if n == 1 else torch.linalg.inv(Phi)
    V = Phi_inv.transpose(-2, -1).reshape((t1 + 1) * n, n)
    return Semiseparable(U, V)


def decay_mask(a: Tensor) -> Tensor:
    """The inverse of :func:`bidiagonal`: ``L_ts = a_s a_{s+1} ... a_{t-1}`` for ``t >= s``.

    Computed by products along each column (no inversion and no division, so ``a_i = 0`` is
    allowed here, unlike in the generator representation).

    Args:
        a: ``(..., T-1)``.

    Returns:
        ``(..., T, T)``, lower triangular with unit diagonal: a 1-semiseparable matrix.
    """
    check_arg("decay_mask", "a", a, "(..., T-1)")
    T = a.shape[-1] + 1
    ones = torch.ones(*a.shape[:-1], 1, dtype=a.dtype, device=a.device)
    shifted = torch.cat([ones, a], dim=-1)  # shifted[t] = a_{t-1}: the factor entering row t
    grid = shifted[..., :, None].expand(*a.shape[:-1], T, T)
    strict = torch.ones(T, T, dtype=torch.bool, device=a.device).tril(-1)
    grid = torch.where(strict, grid, torch.ones_like(grid))  # (t, s) holds a_{t-1} when t > s
    return torch.cumprod(grid, dim=-2).tril()


def _check_blocks(fn: str, A_blocks: Tensor, want: str = "(T-1, n, n) with n >= 1") -> None:
    check_arg(fn, "A_blocks", A_blocks, want, ndim=3, nonempty=(1,))
    if A_blocks.shape[-1] != A_blocks.shape[-2]:
        raise ValueError(f"{fn}: A_blocks must have shape {want}, got {shape_of(A_blocks)}")


def _check_ssm(
    fn: str, A_blocks: Tensor, B_blocks: Tensor, C_blocks: Tensor, x: Tensor | None
) -> None:
    """``A_blocks (T-1, n, n)``, ``B_blocks (T, n, m)``, ``C_blocks (T, n, k)``, ``x (T, m)``."""
    _check_blocks(fn, A_blocks)
    t1, n, _ = A_blocks.shape
    T = t1 + 1
    for name, t, want in (("B_blocks", B_blocks, f"({T}, {n}, m) with m >= 1"),
                          ("C_blocks", C_blocks, f"({T}, {n}, k) with k >= 1")):  # fmt: skip
        check_arg(fn, name, t, want, ndim=3, nonempty=(2,))
        if t.shape[:2] != (T, n):
            raise ValueError(f"{fn}: {name} must have shape {want} to match A_blocks "
                             f"{shape_of(A_blocks)}, got {shape_of(t)}")  # fmt: skip
    if x is not None:
        want = f"({T}, {B_blocks.shape[-1]}) to match B_blocks {shape_of(B_blocks)}"
        check_arg(fn, "x", x, want, ndim=2)
        if x.shape != (T, B_blocks.shape[-1]):
            raise ValueError(f"{fn}: x must have shape {want}, got {shape_of(x)}")
    check_same(fn, A_blocks=A_blocks, B_blocks=B_blocks, C_blocks=C_blocks, x=x)


def ssm_recurrence(
    A_blocks: Tensor, B_blocks: Tensor, C_blocks: Tensor, x: Tensor
) -> tuple[Tensor, Tensor]:
    """The SSM by iterating forward in time (seed section 1).

    ``h_0 = B_0 x_0``, ``h_t = A_{t-1} h_{t-1} + B_t x_t``, ``y_t = C_t^T h_t``.

    Args:
        A_blocks: ``(T-1, n, n)``; B_blocks: ``(T, n, m)``; C_blocks: ``(T, n, k)``; x: ``(T, m)``.

    Returns:
        ``(h (T, n), y (T, k))``.
    """
    _check_ssm("ssm_recurrence", A_blocks, B_blocks, C_blocks, x)
    h = [B_blocks[0] @ x[0]]
    for t in range(1, x.shape[0]):
        h.append(A_blocks[t - 1] @ h[-1] + B_blocks[t] @ x[t])
    hs = torch.stack(h)  # (T, n)
    return hs, torch.einsum("tnk,tn->tk", C_blocks, hs)


def ssm_block_matrices(
    A_blocks: Tensor, B_blocks: Tensor, C_blocks: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Dense block matrices of the SSM, ``y = C^T A^{-1} B x``.

    Returns:
        ``A (T n, T n)`` block bidiagonal, ``B (T n, T m)`` and ``C (T n, T k)`` block diagonal.
    """
    _check_ssm("ssm_block_matrices", A_blocks, B_blocks, C_blocks, None)
    return block_bidiagonal(A_blocks), torch.block_diag(*B_blocks), torch.block_diag(*C_blocks)


def ssm_semiseparable(
    A_blocks: Tensor, B_blocks: Tensor, C_blocks: Tensor, x: Tensor
) -> tuple[Tensor, Tensor]:
    """The SSM as ``h = A^{-1} (B x)`` by the semiseparable inverse; ``y = C^T h``.

    Linear in T for a fixed state size (``O(T n^2)``); needs invertible ``A_i``.

    Returns:
        ``(h (T, n), y (T, k))`` as :func:`ssm_recurrence`.
    """
    _check_ssm("ssm_semiseparable", A_blocks, B_blocks, C_blocks, x)
    T, n = B_blocks.shape[:2]
    bx = torch.einsum("tnm,tm->tn", B_blocks, x).reshape(T * n)  # B x, block by block
    h = (bidiagonal_inverse_generators(A_blocks) @ bx).reshape(T, n)
    return h, torch.einsum("tnk,tn->tk", C_blocks, h)


def scalar_ssm_matrices(a: Tensor, Bn: Tensor, Cn: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Dense matrices of the scalar-times-identity SSM, states separated.

    ``A = I_n (x) a`` (Kronecker; ``a`` the unit bidiagonal of :func:`bidiagonal`),
    ``B = [D(b^(1)); ...; D(b^(n))]``, ``C = [D(c^(1)); ...; D(c^(n))]``.

    Args:
        a: ``(T-1,)`` the scalar dynamics; Bn, Cn: ``(T, n)``, column k is ``b^(k)``, ``c^(k)``.

    Returns:
        ``A (n T, n T)``, ``B (n T, T)``, ``C (n T, T)``.
    """
    _check_sma("scalar_ssm_matrices", a, Bn, Cn, per_state=False)
    return per_state_ssm_matrices(a.expand(Bn.shape[-1], -1), Bn, Cn)


def per_state_ssm_matrices(a: Tensor, Bn: Tensor, Cn: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """As :func:`scalar_ssm_matrices` with dynamics ``a^(k)`` per state: ``a (n, T-1)``.

    ``A = blockdiag(a^(1), ..., a^(n))`` (bidiagonals).
    """
    _check_sma("per_state_ssm_matrices", a, Bn, Cn, per_state=True)
    A = torch.block_diag(*[bidiagonal(ak) for ak in a])
    B = torch.cat([torch.diag(b) for b in Bn.T])
    C = torch.cat([torch.diag(c) for c in Cn.T])
    return A, B, C


def _check_sma(
    fn: str, a: Tensor, Bn: Tensor, Cn: Tensor, *, per_state: bool, x: Tensor | None = None
) -> None:
    """``Bn, Cn (T, n)``; ``a (T-1,)`` (or ``(n, T-1)`` per state); ``x (T,)`` when given."""
    check_arg(fn, "Bn", Bn, "(T, n) with T, n >= 1", ndim=2, nonempty=(0, 1))
    T, n = Bn.shape
    check_arg(fn, "Cn", Cn, f"(T, n) = {(T, n)} like Bn", ndim=2)
    if Cn.shape != Bn.shape:
        raise ValueError(f"{fn}: Cn must have shape (T, n) = {(T, n)} like Bn, got {shape_of(Cn)}")
    want = (n, T - 1) if per_state else (T - 1,)
    check_arg(fn, "a", a, f"{want} for Bn {(T, n)}")
    if shape_of(a) != want:
        raise ValueError(
            f"{fn}: dynamics a must have shape {want} for Bn {shape_of(Bn)}, got {shape_of(a)}"
        )
    if x is not None:
        check_arg(fn, "x", x, f"({T},) for Bn {(T, n)}", ndim=1)
        if x.shape != (T,):
            raise ValueError(f"{fn}: x must have shape ({T},) for Bn {(T, n)}, got {shape_of(x)}")
    check_same(fn, a=a, Bn=Bn, Cn=Cn, x=x)


def ssm_as_masked_attention(a: Tensor, Bn: Tensor, Cn: Tensor) -> Tensor:
    """Scalar-times-identity SSM as structured masked attention: ``M = (C B^T) o a^{-1}``.

    Args:
        a: ``(T-1,)``; Bn, Cn: ``(T, n)``.

    Returns:
        ``M (T, T)`` with ``y = M x``.
    """
    _check_sma("ssm_as_masked_attention", a, Bn, Cn, per_state=False)
    return (Cn @ Bn.T) * decay_mask(a)


def ssm_as_sum_of_masked_attentions(a: Tensor, Bn: Tensor, Cn: Tensor) -> Tensor:
    """Per-state dynamics: ``M = sum_k (c^(k) b^(k)T) o (a^(k))^{-1}``.

    Args:
        a: ``(n, T-1)``, row k the dynamics of state k; Bn, Cn: ``(T, n)``.
    """
    _check_sma("ssm_as_sum_of_masked_attentions", a, Bn, Cn, per_state=True)
    return torch.einsum("tk,sk,kts->ts", Cn, Bn, decay_mask(a))


def ssm_masked_attention_product(a: Tensor, Bn: Tensor, Cn: Tensor, x: Tensor) -> Tensor:
    """``M x = sum_k c^(k) o (a^{-1} (b^(k) o x))`` with ``a^{-1}`` semiseparable.

    The low-rank mask identity with the roles swapped: ``M = a^{-1} o (C B^T)`` and
    ``a^{-1} = tril(u v^T)`` is applied in ``O(T)``, so the product is ``O(T n)``.

    Args:
        a: ``(T-1,)`` nonzero; Bn, Cn: ``(T, n)``; x: ``(T,)``.
    """
    _check_sma("ssm_masked_attention_product", a, Bn, Cn, per_state=False, x=x)
    ainv = bidiagonal_inverse_generators(a)  # u_t = a_0 ... a_{t-1}, v_t = 1 / u_t
    return low_rank_masked_product(ainv.matmul, Cn, Bn, x)
