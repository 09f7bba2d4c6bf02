"""Structured masked attention: semiseparable matrices and state-space models as attention.

Masked attention (Dao & Gu, 2024, "Transformers are SSMs") is ``y = M x`` with

    M = L o B                                     # seed: masked attention

a mask ``L`` applied elementwise (``o``, the Hadamard product) to a score matrix ``B``.
When ``L`` is structured, ``M x`` is cheap (structured masked attention, SMA); the seed
(Paltorp, 2025, "Structured Masked Attention") walks through the algebra that makes a
state-space model (SSM) with scalar-times-identity dynamics (Mamba-2) such an SMA:

1. the low-rank mask identity ``(B o U V^T) x = sum_i D(U_i) B D(V_i) x`` (p products with B);
2. semiseparable matrices ``tril(U V^T)`` applied in ``O(n p)`` by prefix sums, and the
   generator representation of the inverse of a block-bidiagonal matrix;
3. the SSM three ways: the recurrence, the block matrices ``y = C^T A^{-1} B x`` with the
   semiseparable inverse, and, for scalar dynamics, the SMA ``M = (C B^T) o a^{-1}``
   (a sum of such SMAs when each state has its own dynamics);
4. :func:`ssd`, the state-space dual, by recurrence, by the materialised (quadratic) SMA and
   by the linear-time chunked algorithm of Mamba-2 (after ``ssd_minimal.py``);
5. :class:`SSMAttention`, registered as ``"ssm"``: queries as C, keys as B, values as x,
   with a learned, input-dependent per-head decay, and a recurrent :meth:`~SSMAttention.step`.

Conventions: sequences are indexed ``t = 0 .. T-1`` in code (``1 .. T`` in the seed). A dense
matrix named for the seed's block matrices (``A``, ``B``, ``C``) is ``(T n, T m)``; its block
``(i, j)`` is rows ``i n : (i+1) n``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, overload

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .base import Attention, AttentionResult, count_nonfinite

__all__ = [
    "SSD_METHODS",
    "SSMAttention",
    "Semiseparable",
    "bidiagonal",
    "bidiagonal_inverse_generators",
    "block_bidiagonal",
    "decay_mask",
    "low_rank_masked_product",
    "masked_attention",
    "scalar_ssm_matrices",
    "segsum",
    "ssd",
    "ssd_matrix",
    "ssd_step",
    "ssm_as_masked_attention",
    "ssm_as_sum_of_masked_attentions",
    "ssm_block_matrices",
    "ssm_masked_attention_product",
    "ssm_recurrence",
    "ssm_semiseparable",
    "per_state_ssm_matrices",
]

SSD_METHODS = ("chunked", "quadratic", "recurrent")


def _shape(t: Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


# --------------------------------------------------------------------------------------
# 1. Masked attention and the low-rank mask identity
# --------------------------------------------------------------------------------------


def _as_matrix(x: Tensor, n: int, name: str, batch_ndim: int) -> tuple[Tensor, bool]:
    """``x (..., n)`` or ``(..., n, k)`` -> ``(..., n, k)`` and whether it was a vector."""
    if x.dim() == batch_ndim + 1 and x.shape[-1] == n:
        return x.unsqueeze(-1), True
    if x.dim() == batch_ndim + 2 and x.shape[-2] == n:
        return x, False
    raise ValueError(
        f"{name} must have shape (..., {n}) or (..., {n}, k) with {batch_ndim} leading "
        f"batch dims, got {_shape(x)}"
    )


def masked_attention(mask: Tensor, scores: Tensor, x: Tensor) -> Tensor:
    """``(L o B) x``: masked attention applied to a vector or a matrix.

    Args:
        mask: ``L (..., n, n)``.
        scores: ``B (..., n, n)``.
        x: ``(..., n)`` or ``(..., n, k)``.

    Returns:
        ``M x`` shaped like ``x``.
    """
    if mask.shape[-2:] != scores.shape[-2:] or mask.shape[-1] != mask.shape[-2]:
        raise ValueError(
            f"mask L and scores B must be square and equal in size, got L {_shape(mask)}, "
            f"B {_shape(scores)}"
        )
    xm, vec = _as_matrix(x, mask.shape[-1], "x", mask.dim() - 2)
    y = (mask * scores) @ xm
    return y.squeeze(-1) if vec else y


def low_rank_masked_product(
    scores: Tensor | Callable[[Tensor], Tensor], U: Tensor, V: Tensor, x: Tensor
) -> Tensor:
    """``(B o U V^T) x = sum_i D(U_i) B D(V_i) x`` in p products with B.

    The rank-p mask ``U V^T`` is never formed: each of its p rank-one terms becomes two
    diagonal scalings around one product with ``B``.

    Args:
        scores: ``B (n, n)``, or any callable applying ``B`` to an ``(n, k)`` matrix (so a
            structured ``B`` keeps its fast product).
        U, V: ``(n, p)``, the mask's factors.
        x: ``(n,)`` or ``(n, k)``.

    Returns:
        ``M x`` shaped like ``x``.
    """
    if U.dim() != 2 or U.shape != V.shape:
        raise ValueError(f"U and V must both be (n, p), got U {_shape(U)}, V {_shape(V)}")
    n, p = U.shape
    if isinstance(scores, Tensor):
        if scores.shape != (n, n):
            raise ValueError(
                f"scores B must be ({n}, {n}) to match U {_shape(U)}, got {_shape(scores)}"
            )
        mat = scores
        apply: Callable[[Tensor], Tensor] = lambda z: mat @ z
    else:
        apply = scores
    xm, vec = _as_matrix(x, n, "x", 0)
    y = torch.zeros_like(xm)
    for i in range(p):  # p products with B, 2p diagonal scalings
        y = y + U[:, i, None] * apply(V[:, i, None] * xm)
    return y.squeeze(-1) if vec else y


# --------------------------------------------------------------------------------------
# 2. Semiseparable matrices and the inverse of a (block) bidiagonal matrix
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Semiseparable:
    """A generator-represented semiseparable matrix, never formed densely.

    ``symmetric=False``: ``S = tril(U V^T)`` (the seed's ``SymSemiseparableCholesky(U', V')``).
    ``symmetric=True``: ``S = tril(U V^T) + triu(V U^T, 1)`` (``SymSemiseparable(U', V')``).

    Attributes:
        U, V: generators ``(..., n, p)``; ``p`` is the semiseparability rank.
        symmetric: which of the two forms.

    ``S @ x`` costs ``O(n p k)`` for ``x (..., n, k)`` by prefix sums:
    ``(tril(U V^T) x)_i = U_i^T sum_{j <= i} V_j x_j^T``.
    """

    U: Tensor
    V: Tensor
    symmetric: bool = False

    def __post_init__(self) -> None:
        if self.U.dim() < 2 or self.U.shape != self.V.shape:
            raise ValueError(
                f"Semiseparable generators U and V must share a shape (..., n, p), "
                f"got U {_shape(self.U)}, V {_shape(self.V)}"
            )

    @property
    def n(self) -> int:
        """Matrix size."""
        return int(self.U.shape[-2])

    @property
    def rank(self) -> int:
        """Semiseparability rank p."""
        return int(self.U.shape[-1])

    def dense(self) -> Tensor:
        """The ``(..., n, n)`` matrix (for checks; ``O(n^2 p)``)."""
        lower = torch.tril(self.U @ self.V.transpose(-2, -1))
        if not self.symmetric:
            return lower
        return lower + torch.triu(self.V @ self.U.transpose(-2, -1), diagonal=1)

    def matmul(self, x: Tensor) -> Tensor:
        """``S x`` for ``x (..., n)`` or ``(..., n, k)`` in ``O(n p k)``, by prefix sums."""
        xm, vec = _as_matrix(x, self.n, "x", self.U.dim() - 2)
        # 1. lower part: y_i = U_i . cumsum_{j<=i}(V_j x_j^T)
        prefix = torch.einsum("...jp,...jk->...jpk", self.V, xm).cumsum(dim=-3)
        y = torch.einsum("...ip,...ipk->...ik", self.U, prefix)
        if self.symmetric:
            # 2. strict upper part: y_i += V_i . sum_{j>i}(U_j x_j^T), a suffix sum
            terms = torch.einsum("...jp,...jk->...jpk", self.U, xm)
            suffix = terms.flip(-3).cumsum(dim=-3).flip(-3)  # sum_{j >= i}
            suffix = F.pad(suffix[..., 1:, :, :], (0, 0, 0, 0, 0, 1))  # sum_{j > i}
            y = y + torch.einsum("...ip,...ipk->...ik", self.V, suffix)
        return y.squeeze(-1) if vec else y

    def __matmul__(self, x: Tensor) -> Tensor:
        return self.matmul(x)


def bidiagonal(a: Tensor) -> Tensor:
    """The ``(T, T)`` unit lower-bidiagonal matrix with ``-a`` below the diagonal; ``a (T-1,)``."""
    if a.dim() != 1:
        raise ValueError(f"a must be a vector (T-1,), got {_shape(a)}")
    return torch.eye(a.shape[0] + 1, dtype=a.dtype, device=a.device) - torch.diag(a, -1)


def block_bidiagonal(A_blocks: Tensor) -> Tensor:
    """Block lower-bidiagonal ``A (T n, T n)``: identity blocks on the diagonal, ``-A_i`` below.

    ``A_blocks (T-1, n, n)`` are the transitions ``h_{i+1} = A_i h_i + ...``
    (seed section 1, the block form).
    """
    if A_blocks.dim() != 3 or A_blocks.shape[-1] != A_blocks.shape[-2]:
        raise ValueError(f"A_blocks must be (T-1, n, n), got {_shape(A_blocks)}")
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
    if A_blocks.dim() == 1:
        A_blocks = A_blocks[:, None, None]
    if A_blocks.dim() != 3 or A_blocks.shape[-1] != A_blocks.shape[-2]:
        raise ValueError(f"A_blocks must be (T-1,) or (T-1, n, n), got {_shape(A_blocks)}")
    t1, n, _ = A_blocks.shape
    phi = [torch.eye(n, dtype=A_blocks.dtype, device=A_blocks.device)]
    for i in range(t1):
        phi.append(A_blocks[i] @ phi[-1])
    Phi = torch.stack(phi)  # (T, n, n)
    U = Phi.reshape((t1 + 1) * n, n)
    # scalar dynamics: a plain reciprocal (an underflowed product gives inf, not an exception)
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
    T = a.shape[-1] + 1
    ones = torch.ones(*a.shape[:-1], 1, dtype=a.dtype, device=a.device)
    shifted = torch.cat([ones, a], dim=-1)  # shifted[t] = a_{t-1}: the factor entering row t
    grid = shifted[..., :, None].expand(*a.shape[:-1], T, T)
    strict = torch.ones(T, T, dtype=torch.bool, device=a.device).tril(-1)
    grid = torch.where(strict, grid, torch.ones_like(grid))  # (t, s) holds a_{t-1} when t > s
    return torch.cumprod(grid, dim=-2).tril()


# --------------------------------------------------------------------------------------
# 3. The state-space model three ways
# --------------------------------------------------------------------------------------


def _check_ssm(A_blocks: Tensor, B_blocks: Tensor, C_blocks: Tensor, x: Tensor | None) -> None:
    if A_blocks.dim() != 3 or A_blocks.shape[-1] != A_blocks.shape[-2]:
        raise ValueError(f"A_blocks must be (T-1, n, n), got {_shape(A_blocks)}")
    t1, n, _ = A_blocks.shape
    if B_blocks.dim() != 3 or B_blocks.shape[:2] != (t1 + 1, n):
        raise ValueError(f"B_blocks must be ({t1 + 1}, {n}, m), got {_shape(B_blocks)}")
    if C_blocks.dim() != 3 or C_blocks.shape[:2] != (t1 + 1, n):
        raise ValueError(f"C_blocks must be ({t1 + 1}, {n}, k), got {_shape(C_blocks)}")
    if x is not None and (x.dim() != 2 or x.shape != (t1 + 1, B_blocks.shape[-1])):
        raise ValueError(f"x must be ({t1 + 1}, {B_blocks.shape[-1]}), got {_shape(x)}")


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
    _check_ssm(A_blocks, B_blocks, C_blocks, x)
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
    _check_ssm(A_blocks, B_blocks, C_blocks, None)
    return block_bidiagonal(A_blocks), torch.block_diag(*B_blocks), torch.block_diag(*C_blocks)


def ssm_semiseparable(
    A_blocks: Tensor, B_blocks: Tensor, C_blocks: Tensor, x: Tensor
) -> tuple[Tensor, Tensor]:
    """The SSM as ``h = A^{-1} (B x)`` by the semiseparable inverse; ``y = C^T h``.

    Linear in T for a fixed state size (``O(T n^2)``); needs invertible ``A_i``.

    Returns:
        ``(h (T, n), y (T, k))`` as :func:`ssm_recurrence`.
    """
    _check_ssm(A_blocks, B_blocks, C_blocks, x)
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
    return per_state_ssm_matrices(a.expand(Bn.shape[-1], -1), Bn, Cn)


def per_state_ssm_matrices(a: Tensor, Bn: Tensor, Cn: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """As :func:`scalar_ssm_matrices` with dynamics ``a^(k)`` per state: ``a (n, T-1)``.

    ``A = blockdiag(a^(1), ..., a^(n))`` (bidiagonals).
    """
    _check_sma(a, Bn, Cn, per_state=True)
    A = torch.block_diag(*[bidiagonal(ak) for ak in a])
    B = torch.cat([torch.diag(b) for b in Bn.T])
    C = torch.cat([torch.diag(c) for c in Cn.T])
    return A, B, C


def _check_sma(a: Tensor, Bn: Tensor, Cn: Tensor, *, per_state: bool) -> None:
    if Bn.dim() != 2 or Bn.shape != Cn.shape:
        raise ValueError(f"Bn and Cn must both be (T, n), got Bn {_shape(Bn)}, Cn {_shape(Cn)}")
    T, n = Bn.shape
    want = (n, T - 1) if per_state else (T - 1,)
    if _shape(a) != want:
        raise ValueError(f"dynamics a must have shape {want} for Bn {_shape(Bn)}, got {_shape(a)}")


def ssm_as_masked_attention(a: Tensor, Bn: Tensor, Cn: Tensor) -> Tensor:
    """Scalar-times-identity SSM as structured masked attention: ``M = (C B^T) o a^{-1}``.

    Args:
        a: ``(T-1,)``; Bn, Cn: ``(T, n)``.

    Returns:
        ``M (T, T)`` with ``y = M x``.
    """
    _check_sma(a, Bn, Cn, per_state=False)
    return (Cn @ Bn.T) * decay_mask(a)


def ssm_as_sum_of_masked_attentions(a: Tensor, Bn: Tensor, Cn: Tensor) -> Tensor:
    """Per-state dynamics: ``M = sum_k (c^(k) b^(k)T) o (a^(k))^{-1}``.

    Args:
        a: ``(n, T-1)``, row k the dynamics of state k; Bn, Cn: ``(T, n)``.
    """
    _check_sma(a, Bn, Cn, per_state=True)
    return torch.einsum("tk,sk,kts->ts", Cn, Bn, decay_mask(a))


def ssm_masked_attention_product(a: Tensor, Bn: Tensor, Cn: Tensor, x: Tensor) -> Tensor:
    """``M x = sum_k c^(k) o (a^{-1} (b^(k) o x))`` with ``a^{-1}`` semiseparable.

    The low-rank mask identity with the roles swapped: ``M = a^{-1} o (C B^T)`` and
    ``a^{-1} = tril(u v^T)`` is applied in ``O(T)``, so the product is ``O(T n)``.

    Args:
        a: ``(T-1,)`` nonzero; Bn, Cn: ``(T, n)``; x: ``(T,)``.
    """
    _check_sma(a, Bn, Cn, per_state=False)
    ainv = bidiagonal_inverse_generators(a)  # u_t = a_0 ... a_{t-1}, v_t = 1 / u_t
    return low_rank_masked_product(ainv.matmul, Cn, Bn, x)


# --------------------------------------------------------------------------------------
# 4. SSD: the state-space dual, three ways
# --------------------------------------------------------------------------------------


def segsum(log_a: Tensor) -> Tensor:
    """Segment sums ``S_ts = log_a_{s+1} + ... + log_a_t`` (``t >= s``), ``-inf`` above.

    Each entry is summed directly (a masked cumulative sum down each column), never as the
    difference of two long prefix sums, so no catastrophic cancellation in float32.

    Args:
        log_a: ``(..., T)``.

    Returns:
        ``(..., T, T)``; ``exp`` of it is the 1-semiseparable decay mask.
    """
    T = log_a.shape[-1]
    grid = log_a[..., :, None].expand(*log_a.shape, T)  # grid[t, s] = log_a_t
    strict = torch.ones(T, T, dtype=torch.bool, device=log_a.device).tril(-1)
    grid = grid.masked_fill(~strict, 0.0)
    out = torch.cumsum(grid, dim=-2)  # out[t, s] = sum_{s < k <= t} log_a_k
    causal = torch.ones(T, T, dtype=torch.bool, device=log_a.device).tril()
    return out.masked_fill_(~causal, -math.inf)


def _check_ssd(x: Tensor, log_a: Tensor, B: Tensor, C: Tensor) -> None:
    for name, t, nd in (("x", x, 4), ("log_a", log_a, 3), ("B", B, 4), ("C", C, 4)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != nd:
            want = "(batch, length, heads)" if nd == 3 else "(batch, length, heads, dim)"
            raise ValueError(f"ssd: {name} must be {nd}-D {want}, got shape {_shape(t)}")
        if not t.is_floating_point():
            raise ValueError(f"ssd: {name} must be floating point, got dtype {t.dtype}")
    if log_a.shape != x.shape[:3]:
        raise ValueError(
            f"ssd: log_a must be (batch, length, heads) = {_shape(x)[:3]} to match "
            f"x {_shape(x)}, got {_shape(log_a)}"
        )
    if B.shape[:3] != x.shape[:3] or B.shape != C.shape:
        raise ValueError(
            f"ssd: B and C must both be (batch, length, heads, state) with (batch, length, heads) "
            f"= {_shape(x)[:3]}, got B {_shape(B)}, C {_shape(C)}"
        )
    if not (x.dtype == log_a.dtype == B.dtype == C.dtype):
        raise ValueError(
            f"ssd: x, log_a, B, C must share a dtype, got {x.dtype}, {log_a.dtype}, "
            f"{B.dtype}, {C.dtype}"
        )


def ssd_matrix(log_a: Tensor, B: Tensor, C: Tensor) -> Tensor:
    """The materialised SMA matrix ``M = (C B^T) o exp(segsum(log_a))``, ``(batch, heads, L, L)``.

    ``M_ts = (C_t . B_s) exp(log_a_{s+1} + ... + log_a_t)`` for ``t >= s``, 0 above.
    ``log_a (batch, L, heads)``, ``B, C (batch, L, heads, state)``.
    """
    mask = segsum(log_a.transpose(1, 2)).exp_()  # (b, h, L, L)
    return torch.einsum("blhn,bshn->bhls", C, B) * mask


def ssd_step(
    x: Tensor, log_a: Tensor, B: Tensor, C: Tensor, state: Tensor
) -> tuple[Tensor, Tensor]:
    """One step of the recurrence: ``h <- exp(log_a) h + x B^T``, ``y = h C``.

    Args:
        x: ``(batch, heads, head_dim)``; log_a: ``(batch, heads)``;
        B, C: ``(batch, heads, state)``; state: ``(batch, heads, head_dim, state)``.

    Returns:
        ``(y (batch, heads, head_dim), new state)``.
    """
    state = torch.exp(log_a)[..., None, None] * state + torch.einsum("bhp,bhn->bhpn", x, B)
    return torch.einsum("bhpn,bhn->bhp", state, C), state


def _ssd_recurrent(
    x: Tensor, log_a: Tensor, B: Tensor, C: Tensor, h0: Tensor
) -> tuple[Tensor, Tensor]:
    state, ys = h0, []
    for t in range(x.shape[1]):
        y, state = ssd_step(x[:, t], log_a[:, t], B[:, t], C[:, t], state)
        ys.append(y)
    return torch.stack(ys, dim=1), state


def _ssd_quadratic(
    x: Tensor, log_a: Tensor, B: Tensor, C: Tensor, h0: Tensor | None
) -> tuple[Tensor, Tensor | None]:
    # 1. the structured masked attention: y = ((C B^T) o L) x
    M = ssd_matrix(log_a, B, C)  # (b, h, L, L)
    y = torch.einsum("bhls,bshp->blhp", M, x)
    if h0 is None:
        return y, None
    # 2. initial state: y_t += exp(log_a_0 + ... + log_a_t) C_t . h0 ; final state from the last row
    cum = torch.cumsum(log_a, dim=1)  # (b, L, h)
    y = y + torch.einsum("blhn,bhpn,blh->blhp", C, h0, torch.exp(cum))
    last = torch.exp(segsum(log_a.transpose(1, 2))[..., -1, :])  # (b, h, L): decay s -> L-1
    final = (
        torch.einsum("bhs,bshp,bshn->bhpn", last, x, B)
        + torch.exp(cum[:, -1])[..., None, None] * h0
    )
    return y, final


def _ssd_chunked(
    x: Tensor, log_a: Tensor, B: Tensor, C: Tensor, h0: Tensor, chunk_size: int
) -> tuple[Tensor, Tensor]:
    b, length, h, p = x.shape
    n = B.shape[-1]
    # 0. pad to a multiple of the chunk size (zero inputs and zero log-decay after the end
    #    change neither the outputs before it nor the final state) and split into chunks
    pad = (-length) % chunk_size
    if pad:
        x, B, C = (F.pad(t, (0, 0, 0, 0, 0, pad)) for t in (x, B, C))
        log_a = F.pad(log_a, (0, 0, 0, pad))
    c = x.shape[1] // chunk_size
    # one copy each into a head-major layout, so every product below is a plain batched matmul
    X = x.transpose(1, 2).contiguous().view(b, h, c, chunk_size, p)  # (b, h, c, l, p)
    Bc = B.transpose(1, 2).contiguous().view(b, h, c, chunk_size, n)  # (b, h, c, l, n)
    Cc = C.transpose(1, 2).contiguous().view(b, h, c, chunk_size, n)  # (b, h, c, l, n)
    A = log_a.transpose(1, 2).contiguous().view(b, h, c, chunk_size)  # (b, h, c, l)
    A_cumsum = torch.cumsum(A, dim=-1)  # within each chunk only: short sums

    # 1. intra-chunk outputs (diagonal blocks): Y_diag = ((C B^T) o L) X, chunk by chunk
    L = torch.exp(segsum(A))  # (b, h, c, l, s)
    scores = torch.einsum("bhcln,bhcsn->bhcls", Cc, Bc) * L
    Y_diag = torch.einsum("bhcls,bhcsp->bhclp", scores, X)

    # 2. chunk states (right factor of the off-diagonal blocks; B terms):
    #    the state each chunk would leave behind if it started from zero
    decay_states = torch.exp(A_cumsum[..., -1:] - A_cumsum)  # (b, h, c, l) decay l -> chunk end
    states = torch.einsum("bhcln,bhclp->bhcpn", Bc * decay_states[..., None], X)

    # 3. inter-chunk recurrence (middle factor; A terms): a scan over chunks, linear in L
    decay_chunk = torch.exp(A_cumsum[..., -1])  # (b, h, c) decay across a whole chunk
    state, entering = h0, []
    for k in range(c):
        entering.append(state)
        state = decay_chunk[:, :, k, None, None] * state + states[:, :, k]
    prev = torch.stack(entering, dim=2)  # (b, h, c, p, n): the state entering each chunk

    # 4. state -> output per chunk (left factor; C terms)
    Y_off = torch.einsum("bhcln,bhcpn->bhclp", Cc * torch.exp(A_cumsum)[..., None], prev)

    y = (Y_diag + Y_off).permute(0, 2, 3, 1, 4).reshape(b, c * chunk_size, h, p)
    return y[:, :length], state


def _ssd_chunked_blocks(
    x: Tensor, log_a: Tensor, B: Tensor, C: Tensor, h0: Tensor, chunk_size: int, block_len: int
) -> tuple[Tensor, Tensor]:
    # 5. a long sequence goes through steps 0-4 in blocks of whole chunks, the state carried
    #    from one block to the next: the same arithmetic, but the working set stays bounded
    #    (it fits in cache), so the time per token does not grow with L
    block = max(1, block_len // chunk_size) * chunk_size
    ys, state = [], h0
    for s in range(0, x.shape[1], block):
        sl = slice(s, s + block)
        y, state = _ssd_chunked(x[:, sl], log_a[:, sl], B[:, sl], C[:, sl], state, chunk_size)
        ys.append(y)
    return torch.cat(ys, dim=1), state


@overload
def ssd(
    x: Tensor,
    log_a: Tensor,
    B: Tensor,
    C: Tensor,
    method: str = ...,
    chunk_size: int = ...,
    *,
    initial_state: Tensor | None = ...,
    return_final_state: Literal[False] = ...,
    block_len: int = ...,
) -> Tensor: ...


@overload
def ssd(
    x: Tensor,
    log_a: Tensor,
    B: Tensor,
    C: Tensor,
    method: str = ...,
    chunk_size: int = ...,
    *,
    initial_state: Tensor | None = ...,
    return_final_state: Literal[True],
    block_len: int = ...,
) -> tuple[Tensor, Tensor]: ...


def ssd(
    x: Tensor,
    log_a: Tensor,
    B: Tensor,
    C: Tensor,
    method: str = "chunked",
    chunk_size: int = 64,
    *,
    initial_state: Tensor | None = None,
    return_final_state: bool = False,
    block_len: int = 2048,
) -> Tensor | tuple[Tensor, Tensor]:
    """State-space dual (Mamba-2 SSD) of Dao & Gu (2024):

        y_t = sum_{s<=t} (C_t . B_s) exp(log_a_{s+1} + ... + log_a_t) x_s

    Equivalently the recurrence ``h_t = exp(log_a_t) h_{t-1} + x_t B_t^T``, ``y_t = h_t C_t``
    (``h_{-1}`` is ``initial_state``, zero by default), or the structured masked attention
    ``y = ((C B^T) o exp(segsum(log_a))) x`` per head.

    Args:
        x: ``(batch, length, heads, head_dim)``.
        log_a: ``(batch, length, heads)``, the log of the per-step decay (<= 0 for a decay;
            any real is accepted).
        B, C: ``(batch, length, heads, state_dim)``.
        method: ``"chunked"`` (linear time: intra-chunk blocks, chunk states, a scan over
            chunks, state to output), ``"quadratic"`` (the materialised ``(L, L)`` masked
            attention per head) or ``"recurrent"`` (a scan over time steps).
        chunk_size: chunk length for ``"chunked"``; any sequence length works.
        initial_state: ``(batch, heads, head_dim, state_dim)``, the state before ``t = 0``.
        return_final_state: also return the state after the last step.
        block_len: ``"chunked"`` runs at most this many tokens (rounded down to whole chunks,
            at least one) at a time, carrying the state between blocks; the result is the
            same, the memory is bounded and the time stays linear in L beyond the cache size.

    Returns:
        ``y`` shaped like ``x``, or ``(y, final_state)``.
    """
    _check_ssd(x, log_a, B, C)
    if method not in SSD_METHODS:
        raise ValueError(f"ssd: method must be one of {SSD_METHODS}, got {method!r}")
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"ssd: chunk_size must be a positive int, got {chunk_size!r}")
    if not isinstance(block_len, int) or block_len < 1:
        raise ValueError(f"ssd: block_len must be a positive int, got {block_len!r}")
    b, _, h, p = x.shape
    n = B.shape[-1]
    if initial_state is not None and _shape(initial_state) != (b, h, p, n):
        raise ValueError(
            f"ssd: initial_state must be (batch, heads, head_dim, state) = {(b, h, p, n)}, "
            f"got {_shape(initial_state)}"
        )
    h0 = initial_state
    if h0 is None and (method != "quadratic" or return_final_state):
        h0 = x.new_zeros(b, h, p, n)
    final: Tensor | None
    if x.shape[1] == 0:  # an empty sequence: no output, the state passes through unchanged
        y, final = x.clone(), h0
    elif method == "recurrent":
        assert h0 is not None
        y, final = _ssd_recurrent(x, log_a, B, C, h0)
    elif method == "quadratic":
        y, final = _ssd_quadratic(x, log_a, B, C, h0)
    else:
        assert h0 is not None
        y, final = _ssd_chunked_blocks(x, log_a, B, C, h0, chunk_size, block_len)
    if return_final_state:
        assert final is not None
        return y, final
    return y


# --------------------------------------------------------------------------------------
# 5. SSM attention: an attention variant of the harness
# --------------------------------------------------------------------------------------


class SSMAttention(Attention):
    """Mamba-2-style SSM as causal attention: queries as C, keys as B, values as x.

    Per head, with ``dt_t = softplus(w . x_t + b)`` computed from the hidden state and a learned
    rate ``A = -exp(A_log) < 0`` (Mamba-2's parametrisation), the layer computes

        y_t = sum_{s<=t} scale (q_t . k_s) exp(A (dt_{s+1} + ... + dt_t)) dt_s v_s

    with :func:`ssd` (``log_a = A dt``, ``x = dt v``), in linear time and memory.

    The weights are not a softmax: rows do not sum to one and entries can be negative.
    ``need_weights=True`` materialises ``W_ts = scale (q_t . k_s) exp(A (...)) dt_s`` so that
    ``out = W v`` exactly, and reports it as ``probs`` (probability-*like*, for plots); its
    diagnostics carry ``row_stochastic = 0``, the mean row sum and the fraction of negative
    causal entries, besides ``nonfinite_logits`` (non-finite causal entries of ``W``).

    Only causal use is defined: a state-space recurrence runs forward in time, so
    ``causal=False`` and explicit masks raise ``ValueError``.

    Args:
        method: :func:`ssd` method for the forward pass (``"chunked"`` by default).
        chunk_size: chunk length of the chunked method.
        scale: factor on ``q . k`` (default ``1 / sqrt(head_dim)``, as dot-product attention).
        dt_min, dt_max: the initial ``dt`` is log-uniform in this range (via the bias).
        a_init_range: the initial rates ``-A`` are uniform in this range.
    """

    name = "ssm"

    def __init__(
        self,
        dim: int,
        n_heads: int,
        method: str = "chunked",
        chunk_size: int = 64,
        scale: float | None = None,
        dt_min: float = 1e-3,
        dt_max: float = 0.1,
        a_init_range: tuple[float, float] = (1.0, 16.0),
        **kwargs,
    ) -> None:
        super().__init__(dim, n_heads, **kwargs)
        if method not in SSD_METHODS:
            raise ValueError(f"method must be one of {SSD_METHODS}, got {method!r}")
        if not 0.0 < dt_min <= dt_max:
            raise ValueError(f"need 0 < dt_min <= dt_max, got dt_min={dt_min}, dt_max={dt_max}")
        lo, hi = a_init_range
        if not 0.0 < lo <= hi:
            raise ValueError(f"a_init_range must satisfy 0 < lo <= hi, got {a_init_range}")
        self.method, self.chunk_size = method, int(chunk_size)
        self.scale = float(scale) if scale is not None else self.head_dim**-0.5
        self.dt_proj = nn.Linear(dim, n_heads, bias=True)  # x_t -> dt_t (before softplus)
        with torch.no_grad():
            dt = torch.exp(
                torch.rand(n_heads) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min)
            )
            self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus^{-1}(dt)
        self.A_log = nn.Parameter(torch.log(torch.empty(n_heads).uniform_(lo, hi)))

    def metric_parameters(self) -> list[nn.Parameter]:
        """The decay parameters (they define the mask ``L``): ``A_log`` and the dt projection."""
        return [self.A_log, *self.dt_proj.parameters()]

    def decay(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``x (B, L, D)`` -> ``(dt, log_a)``, both ``(B, L, H)``; ``log_a = -exp(A_log) dt``."""
        dt = F.softplus(self.dt_proj(x))
        return dt, -torch.exp(self.A_log) * dt

    def attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        x: Tensor,
        causal: bool,
        mask: Tensor | None,
        need_weights: bool,
    ) -> AttentionResult:
        if not causal:
            raise ValueError(
                "ssm attention is causal by construction (a state-space recurrence runs forward "
                "in time); got causal=False. Use it only in causal models (task='lm')."
            )
        if mask is not None:
            raise ValueError(
                "ssm attention takes no explicit mask (its mask is the learned decay); got a "
                f"mask of shape {_shape(mask)}"
            )
        dt, log_a = self.decay(x)  # (B, L, H)
        Cq = (q * self.scale).transpose(1, 2)  # (B, L, H, d): queries as C
        Bk = k.transpose(1, 2)  # keys as B
        X = v.transpose(1, 2) * dt[..., None]  # values as x, discretised by dt
        extras = {"dt": dt.transpose(1, 2), "log_a": log_a.transpose(1, 2)}  # (B, H, L)
        if need_weights:
            weights = ssd_matrix(log_a, Bk, Cq) * dt.transpose(1, 2)[:, :, None, :]  # (B,H,L,L)
            out = weights @ v
            causal_keep = torch.ones_like(weights[0, 0], dtype=torch.bool).tril()
            lower = weights.detach()[..., causal_keep]
            diagnostics = {
                "nonfinite_logits": count_nonfinite(lower),
                "row_stochastic": torch.zeros((), device=v.device),
                "weights_row_sum_mean": weights.detach().sum(-1).mean(),
                "weights_negative_fraction": (lower < 0).float().mean(),
            }
            return AttentionResult(out, weights, diagnostics, extras)
        y = ssd(X, log_a, Bk, Cq, method=self.method, chunk_size=self.chunk_size)
        return AttentionResult(y.transpose(1, 2), None, {}, extras)

    def forward_with_state(self, x: Tensor, state: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Prefill: ``x (B, L, D)`` from ``state`` -> ``(out (B, L, D), state after it)``.

        ``state`` is ``(B, H, head_dim, head_dim)`` (value dim by state dim), zero if None.
        """
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"expected x of shape (B, L, {self.dim}), got {_shape(x)}")
        q, k, v = self.split_heads(x)
        dt, log_a = self.decay(x)
        y, new_state = ssd(
            v.transpose(1, 2) * dt[..., None],
            log_a,
            k.transpose(1, 2),
            (q * self.scale).transpose(1, 2),
            method=self.method,
            chunk_size=self.chunk_size,
            initial_state=state,
            return_final_state=True,
        )
        b, length, h, d = y.shape
        return self.dropout(self.proj(y.reshape(b, length, h * d))), new_state

    def step(self, x_t: Tensor, state: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """One generation step: ``x_t (B, D)`` -> ``(out_t (B, D), new state (B, H, d, d))``.

        The state is carried explicitly: start from ``None`` (zeros) or from
        :meth:`forward_with_state`. Equal to the forward pass position by position.
        """
        if x_t.dim() != 2 or x_t.shape[-1] != self.dim:
            raise ValueError(f"expected x_t of shape (B, {self.dim}), got {_shape(x_t)}")
        b = x_t.shape[0]
        qkv = self.qkv(x_t).view(b, 3, self.n_heads, self.head_dim)
        q, k, v = qkv.unbind(1)  # (B, H, d) each
        dt, log_a = self.decay(x_t)  # (B, H)
        if state is None:
            state = x_t.new_zeros(b, self.n_heads, self.head_dim, self.head_dim)
        elif _shape(state) != (b, self.n_heads, self.head_dim, self.head_dim):
            raise ValueError(
                f"state must be (B, H, d, d) = {(b, self.n_heads, self.head_dim, self.head_dim)}, "
                f"got {_shape(state)}"
            )
        y, state = ssd_step(v * dt[..., None], log_a, k, q * self.scale, state)
        return self.dropout(self.proj(y.reshape(b, -1))), state

    def extra_repr(self) -> str:
        return super().extra_repr() + f", method={self.method!r}, chunk_size={self.chunk_size}"
