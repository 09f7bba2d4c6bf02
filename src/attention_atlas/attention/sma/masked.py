"""Masked attention ``M = L o B``, the low-rank mask identity, and semiseparable matrices.

Masked attention (Dao & Gu, 2024) is ``y = M x`` with a mask ``L`` applied elementwise
(``o``, the Hadamard product) to a score matrix ``B``. When ``L`` has rank ``p``,
``(B o U V^T) x = sum_i D(U_i) B D(V_i) x`` takes p products with ``B`` (seed, check 1).
A semiseparable matrix ``tril(U V^T)`` is applied in ``O(n p)`` by prefix sums.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ._checks import check_arg, check_same, shape_of

__all__ = ["Semiseparable", "low_rank_masked_product", "masked_attention"]


def _as_matrix(fn: str, x: Tensor, n: int, name: str, batch_ndim: int) -> tuple[Tensor, bool]:
    """``x (..., n)`` or ``(..., n, k)`` -> ``(..., n, k)`` and whether it was a vector."""
    want = f"(..., {n}) or (..., {n}, k) with {batch_ndim} leading batch dim(s)"
    check_arg(fn, name, x, want, nonempty=(-1,))
    if x.dim() == batch_ndim + 1 and x.shape[-1] == n:
        return x.unsqueeze(-1), True
    if x.dim() == batch_ndim + 2 and x.shape[-2] == n:
        return x, False
    raise ValueError(f"{fn}: {name} must have shape {want}, got {shape_of(x)}")


def masked_attention(mask: Tensor, scores: Tensor, x: Tensor) -> Tensor:
    """``(L o B) x``: masked attention applied to a vector or a matrix.

    Args:
        mask: ``L (..., n, n)``.
        scores: ``B (..., n, n)``.
        x: ``(..., n)`` or ``(..., n, k)``.

    Returns:
        ``M x`` shaped like ``x``.
    """
    fn = "masked_attention"
    check_arg(fn, "mask", mask, "(..., n, n) with n >= 1", min_dim=2, nonempty=(-1,))
    check_arg(fn, "scores", scores, "(..., n, n) with n >= 1", min_dim=2, nonempty=(-1,))
    if mask.shape[-2:] != scores.shape[-2:] or mask.shape[-1] != mask.shape[-2]:
        raise ValueError(
            f"{fn}: mask L and scores B must be square and equal in size (..., n, n), got "
            f"L {shape_of(mask)}, B {shape_of(scores)}"
        )
    xm, vec = _as_matrix(fn, x, mask.shape[-1], "x", mask.dim() - 2)
    check_same(fn, mask=mask, scores=scores, x=x)
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
    fn = "low_rank_masked_product"
    check_arg(fn, "U", U, "(n, p) with n, p >= 1", ndim=2, nonempty=(0, 1))
    check_arg(fn, "V", V, f"(n, p) = {shape_of(U)} like U", ndim=2)
    if V.shape != U.shape:
        raise ValueError(
            f"{fn}: V must have shape (n, p) = {shape_of(U)} like U, got {shape_of(V)}"
        )
    n, p = U.shape
    if isinstance(scores, Tensor):
        check_arg(fn, "scores", scores, f"({n}, {n}) to match U {shape_of(U)}", ndim=2)
        if scores.shape != (n, n):
            raise ValueError(
                f"{fn}: scores B must have shape ({n}, {n}) to match U {shape_of(U)}, got "
                f"{shape_of(scores)}"
            )
        check_same(fn, U=U, V=V, scores=scores)
        mat = scores
        apply: Callable[[Tensor], Tensor] = lambda z: mat @ z
    elif callable(scores):
        apply = scores
    else:
        raise TypeError(
            f"{fn}: scores must be a tensor ({n}, {n}) or a callable applying B, got "
            f"{type(scores).__name__}"
        )
    xm, vec = _as_matrix(fn, x, n, "x", 0)
    check_same(fn, U=U, V=V, x=x)
    y = torch.zeros_like(xm)
    for i in range(p):  # p products with B, 2p diagonal scalings
        y = y + U[:, i, None] * apply(V[:, i, None] * xm)
    return y.squeeze(-1) if vec else y


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
        fn = "Semiseparable"
        check_arg(fn, "U", self.U, "(..., n, p) with n, p >= 1", min_dim=2, nonempty=(-2, -1))
        check_arg(fn, "V", self.V, f"(..., n, p) = {shape_of(self.U)} like U", min_dim=2)
        if self.U.shape != self.V.shape:
            raise ValueError(
                f"{fn}: generators U and V must share a shape (..., n, p), got "
                f"U {shape_of(self.U)}, V {shape_of(self.V)}"
            )
        check_same(fn, U=self.U, V=self.V)

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
        xm, vec = _as_matrix("Semiseparable.matmul", x, self.n, "x", self.U.dim() - 2)
        check_same("Semiseparable.matmul", U=self.U, x=x)
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
