"""Shared linear algebra: low-rank metrics, Woodbury, ranks, spectra and collapse measures.

Low-rank metrics ``g = I + U U^T`` with ``U (..., d, r)`` appear throughout the Riemannian
chapters (Song 2026, eq. (4)); everything here works on them in ``O(d r^2)`` per token and
never forms the ``d x d`` matrix unless a function says it does (the ``*_dense`` references,
kept for tests).

Rank and spectrum measures used by several chapters:

* :func:`effective_rank`: the entropy effective rank of Roy and Vetterli (2007),
  ``exp(H(p))`` with ``p = sigma / sum(sigma)``.
* :func:`numerical_rank`: the number of singular values above a relative tolerance.
* :func:`spectral_gap` and :func:`singular_values`.
* :func:`composite_norm` and :func:`relative_residual`: the rank-collapse measure of Dong,
  Cordonnier and Loukas (2021), ``||res(X)||_{1,inf} / ||X||_{1,inf}``.
* :func:`sym_pack`, :func:`sym_pack_outer`, :func:`sym_pack_gram`: the packing of a symmetric
  matrix into ``d (d + 1) / 2`` numbers that preserves the Frobenius inner product
  (``<sym_pack(A), sym_pack(B)> = <A, B>_F``), the vectorisation that separates
  ``k^T A k = <A, k k^T>_F`` at the cost of ``d (d + 1) / 2`` dimensions.

:func:`serial_lu` guards the library's batched CPU LU factorisations (``inv``, ``solve``,
``lu_factor``) against a fault of PyTorch's CPU build: see its docstring.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from functools import lru_cache

import torch
from torch import Tensor

from .threads import intra_op_threads

__all__ = [
    "capacitance",
    "composite_norm",
    "effective_rank",
    "effective_rank_from_singular_values",
    "lowrank_gram_distance_sq",
    "lowrank_gram_distance_sq_dense",
    "metric_apply",
    "metric_dense",
    "metric_inverse_apply",
    "metric_inverse_dense",
    "metric_logdet",
    "numerical_rank",
    "rank_collapse_residual",
    "relative_residual",
    "serial_lu",
    "singular_values",
    "spectral_gap",
    "sym_pack",
    "sym_pack_gram",
    "sym_pack_indices",
    "sym_pack_outer",
    "woodbury_inverse",
]


# ----------------------------------------------------------------------------------------
# validation
# ----------------------------------------------------------------------------------------


def _check_factor(U: Tensor, name: str = "U") -> None:
    if not isinstance(U, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(U).__name__}")
    if U.dim() < 2:
        raise ValueError(f"{name} must have shape (..., d, r), got {tuple(U.shape)}")
    if not U.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {U.dtype}")
    if U.shape[-2] == 0:
        raise ValueError(f"{name} must have shape (..., d, r) with d >= 1, got {tuple(U.shape)}")


def _check_factor_vector(U: Tensor, x: Tensor) -> None:
    _check_factor(U)
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() < 1 or x.shape[-1] != U.shape[-2]:
        raise ValueError(
            f"x must have shape (..., d) with d = U.shape[-2] = {U.shape[-2]}; "
            f"got U {tuple(U.shape)} and x {tuple(x.shape)}"
        )
    if x.dtype != U.dtype:
        raise ValueError(f"U and x must share a dtype, got {U.dtype} and {x.dtype}")
    if x.device != U.device:
        raise ValueError(f"U and x must be on one device, got U on {U.device}, x on {x.device}")


def _check_matrix(X: Tensor, name: str = "X") -> None:
    if not isinstance(X, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(X).__name__}")
    if X.dim() < 2:
        raise ValueError(f"{name} must have shape (..., m, n), got {tuple(X.shape)}")
    if not (X.is_floating_point() or X.is_complex()):
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {X.dtype}")


# ----------------------------------------------------------------------------------------
# low-rank metrics g = I + U U^T
# ----------------------------------------------------------------------------------------


def metric_dense(U: Tensor) -> Tensor:
    """The metric ``g = I_d + U U^T`` as a dense ``(..., d, d)`` matrix (eq. (4)); a reference."""
    _check_factor(U)
    d = U.shape[-2]
    eye = torch.eye(d, dtype=U.dtype, device=U.device)
    return eye + U @ U.transpose(-1, -2)


def metric_apply(U: Tensor, x: Tensor) -> Tensor:
    """``g x = x + U (U^T x)`` for ``U (..., d, r)`` and ``x (..., d)`` in ``O(d r)``."""
    _check_factor_vector(U, x)
    coef = (U.transpose(-1, -2) @ x.unsqueeze(-1)).squeeze(-1)  # (..., r)
    return x + (U @ coef.unsqueeze(-1)).squeeze(-1)


def capacitance(U: Tensor) -> Tensor:
    """The Woodbury capacitance matrix ``I_r + U^T U``, ``(..., r, r)``, symmetric positive definite."""
    _check_factor(U)
    r = U.shape[-1]
    eye = torch.eye(r, dtype=U.dtype, device=U.device)
    return eye + U.transpose(-1, -2) @ U


def metric_inverse_apply(U: Tensor, x: Tensor) -> Tensor:
    """``(I + U U^T)^{-1} x`` by the Woodbury identity (Proposition 4.1, eq. (14)).

    ``g^{-1} x = x - U (I_r + U^T U)^{-1} U^T x``: one ``r x r`` Cholesky solve per token, so
    ``O(d r^2 + r^3)`` instead of the ``O(d^3)`` of a dense solve.

    Args:
        U: ``(..., d, r)`` metric factor.
        x: ``(..., d)``; its batch dimensions broadcast against ``U``'s.

    Returns:
        ``(..., d)``.
    """
    _check_factor_vector(U, x)
    ut_x = (U.transpose(-1, -2) @ x.unsqueeze(-1)).squeeze(-1)  # (..., r)
    chol = torch.linalg.cholesky(capacitance(U))  # (..., r, r)
    shape = torch.broadcast_shapes(chol.shape[:-2], ut_x.shape[:-1])
    chol = chol.expand(*shape, *chol.shape[-2:])
    coef = torch.cholesky_solve(ut_x.expand(*shape, ut_x.shape[-1]).unsqueeze(-1), chol)
    return x - (U @ coef).squeeze(-1)


def woodbury_inverse(U: Tensor) -> Tensor:
    """``(I + U U^T)^{-1} = I - U (I_r + U^T U)^{-1} U^T`` as a dense ``(..., d, d)`` matrix (eq. (14))."""
    _check_factor(U)
    d = U.shape[-2]
    eye = torch.eye(d, dtype=U.dtype, device=U.device)
    inner = torch.linalg.solve(capacitance(U), U.transpose(-1, -2))  # (..., r, d)
    return eye - U @ inner


def metric_inverse_dense(U: Tensor) -> Tensor:
    """``(I + U U^T)^{-1}`` by a dense inverse of the ``d x d`` matrix: the reference."""
    g = metric_dense(U)
    with serial_lu(g):
        return torch.linalg.inv(g)


#: the smallest matrix order at which PyTorch's CPU batched LU runs LAPACK's ``getrf`` on several
#: threads at once (its grain size, ``3200 / n^3`` matrices per thread, truncates to 0)
SERIAL_LU_MIN_N = 15


@contextlib.contextmanager
def serial_lu(A: Tensor) -> Iterator[None]:
    """One intra-op thread while a batched LU of ``A (..., n, n)`` runs on the CPU.

    PyTorch's CPU batched LU (``linalg.inv``, ``solve``, ``lu_factor``) factorises the
    matrices of a batch on several threads at once once ``n >= 15``; with the MKL of its
    pip wheels, after any explicit ``torch.set_num_threads(k)`` with ``k > 1`` (which the
    harness's thread restore makes), these concurrent ``getrf`` calls fail for ``n`` from
    about 150 ("Intel oneMKL ERROR: Parameter 6 was incorrect on entry to DLASWP") and spin
    for ever (measured with torch 2.13.0 on an Intel Xeon: ``(4, 160, 160)`` float64 hangs,
    ``(4, 128, 128)`` and one ``(512, 512)`` matrix do not; pytorch/pytorch#141358, and the
    grain-size fix proposed in pull request #181570). Inside this context such a call runs
    on one thread: the same LAPACK call per matrix, so the same numbers. A no-op on other
    devices, for one matrix, below ``n = 15``, or at one thread already."""
    if (A.device.type != "cpu" or torch.get_num_threads() == 1 or A.shape[-1] < SERIAL_LU_MIN_N
            or A[..., 0, 0].numel() <= 1):  # fmt: skip
        yield
        return
    with intra_op_threads(1):
        yield


def metric_logdet(U: Tensor) -> Tensor:
    """``log det(I_d + U U^T) = log det(I_r + U^T U)`` (matrix determinant lemma), ``(...)``."""
    return torch.linalg.cholesky(capacitance(U)).diagonal(dim1=-2, dim2=-1).log().sum(-1) * 2


def lowrank_gram_distance_sq(Ui: Tensor, Uj: Tensor) -> Tensor:
    """``||U_i U_i^T - U_j U_j^T||_F^2`` without forming ``d x d`` matrices (Section 6.4).

    ``= ||U_i^T U_i||_F^2 - 2 ||U_i^T U_j||_F^2 + ||U_j^T U_j||_F^2``, ``O(r^2 d)`` per pair.
    ``Ui (..., d, r)``, ``Uj (..., d, r')`` broadcast; returns ``(...)``.
    """
    _check_factor(Ui, "Ui")
    _check_factor(Uj, "Uj")
    if Ui.shape[-2] != Uj.shape[-2]:
        raise ValueError(f"Ui and Uj must share d, got {tuple(Ui.shape)} and {tuple(Uj.shape)}")
    gi = Ui.transpose(-1, -2) @ Ui
    gj = Uj.transpose(-1, -2) @ Uj
    gij = Ui.transpose(-1, -2) @ Uj
    sq = lambda m: (m * m).sum((-1, -2))
    return sq(gi) - 2 * sq(gij) + sq(gj)


def lowrank_gram_distance_sq_dense(Ui: Tensor, Uj: Tensor) -> Tensor:
    """Reference for :func:`lowrank_gram_distance_sq` through the dense ``d x d`` matrices."""
    diff = Ui @ Ui.transpose(-1, -2) - Uj @ Uj.transpose(-1, -2)
    return (diff * diff).sum((-1, -2))


# ----------------------------------------------------------------------------------------
# symmetric packing (Frobenius-isometric)
# ----------------------------------------------------------------------------------------


@lru_cache(maxsize=64)
def _sym_pack_indices_cpu(d: int) -> tuple[Tensor, Tensor, Tensor]:
    rows, cols = torch.triu_indices(d, d)
    weight = torch.full(rows.shape, math.sqrt(2.0), dtype=torch.float64)
    weight[rows == cols] = 1.0
    return rows, cols, weight


def sym_pack_indices(
    d: int, device: torch.device | None = None, dtype: torch.dtype = torch.float64
) -> tuple[Tensor, Tensor, Tensor]:
    """Row and column indices of the upper triangle of a ``d x d`` matrix, and the weights
    (1 on the diagonal, ``sqrt(2)`` off it) that make :func:`sym_pack` Frobenius-isometric.
    Each has length ``d (d + 1) / 2``."""
    rows, cols, weight = _sym_pack_indices_cpu(d)
    return rows.to(device), cols.to(device), weight.to(device=device, dtype=dtype)


def sym_pack(A: Tensor) -> Tensor:
    """Pack symmetric ``A (..., d, d)`` into ``(..., d (d + 1) / 2)`` with
    ``<sym_pack(A), sym_pack(B)> = <A, B>_F`` for symmetric A, B."""
    _check_matrix(A, "A")
    d = A.shape[-1]
    if A.shape[-2] != d:
        raise ValueError(f"A must be square (..., d, d), got {tuple(A.shape)}")
    rows, cols, w = sym_pack_indices(d, A.device, A.dtype)
    return A[..., rows, cols] * w


def sym_pack_outer(x: Tensor) -> Tensor:
    """``sym_pack(x x^T)`` for ``x (..., d)`` without forming ``x x^T``: ``(..., d (d + 1) / 2)``."""
    d = x.shape[-1]
    rows, cols, w = sym_pack_indices(d, x.device, x.dtype)
    return x[..., rows] * x[..., cols] * w


def sym_pack_gram(U: Tensor) -> Tensor:
    """``sym_pack(U U^T)`` for ``U (..., d, r)``: ``(..., d (d + 1) / 2)``."""
    _check_factor(U)
    A = U @ U.transpose(-1, -2)
    return sym_pack(A)


# ----------------------------------------------------------------------------------------
# ranks and spectra
# ----------------------------------------------------------------------------------------


def singular_values(X: Tensor) -> Tensor:
    """Singular values of ``X (..., m, n)`` in decreasing order, ``(..., min(m, n))``."""
    _check_matrix(X)
    return torch.linalg.svdvals(X)


def effective_rank_from_singular_values(s: Tensor, eps: float = 0.0) -> Tensor:
    """Entropy effective rank ``exp(-sum p_k log p_k)``, ``p = s / sum(s)`` (Roy and Vetterli 2007).

    ``s (..., n)`` non-negative; returns ``(...)``, between 1 and the number of nonzero entries.
    A zero vector gives 0. Entries ``<= eps * max(s)`` are dropped.
    """
    if (s < 0).any():
        raise ValueError("singular values must be non-negative")
    if eps > 0:
        s = torch.where(s > eps * s.amax(-1, keepdim=True), s, torch.zeros_like(s))
    total = s.sum(-1, keepdim=True)
    p = s / total.clamp_min(torch.finfo(s.dtype).tiny)
    ent = -(torch.where(p > 0, p * p.log(), torch.zeros_like(p))).sum(-1)
    return torch.where(total.squeeze(-1) > 0, ent.exp(), torch.zeros_like(ent))


def effective_rank(X: Tensor, eps: float = 0.0) -> Tensor:
    """Entropy effective rank of ``X (..., m, n)`` (Roy and Vetterli 2007), ``(...)``.

    ``erank(X) = exp(H(p))`` with ``p_k = sigma_k / sum_j sigma_j``; it is 1 for a rank-one
    matrix and ``min(m, n)`` when all singular values are equal.
    """
    return effective_rank_from_singular_values(singular_values(X), eps=eps)


def numerical_rank(X: Tensor, rtol: float | None = None, atol: float = 0.0) -> Tensor:
    """Number of singular values above ``max(atol, rtol * sigma_max)``, ``(...)`` int64.

    The default ``rtol`` is ``max(m, n) * eps(dtype)`` (the LAPACK / NumPy convention).
    """
    _check_matrix(X)
    s = singular_values(X)
    if rtol is None:
        rtol = max(X.shape[-2:]) * torch.finfo(s.dtype).eps
    tol = torch.clamp(rtol * s[..., :1], min=atol)
    return (s > tol).sum(-1)


def spectral_gap(A: Tensor, kind: str = "singular") -> Tensor:
    """Spectral gap of ``A (..., n, n)``, ``(...)``.

    ``kind="singular"``: ``sigma_1 - sigma_2``; ``kind="eigen"``: ``1 - |lambda_2|`` where
    ``lambda_2`` is the eigenvalue of second-largest modulus (for a row-stochastic matrix
    ``lambda_1 = 1`` and this is the gap that controls how fast ``A^n`` mixes).
    """
    _check_matrix(A, "A")
    if A.shape[-1] != A.shape[-2] or A.shape[-1] < 2:
        raise ValueError(f"A must be square with n >= 2, got {tuple(A.shape)}")
    if kind == "singular":
        s = singular_values(A)
        return s[..., 0] - s[..., 1]
    if kind == "eigen":
        mod = torch.linalg.eigvals(A).abs().sort(-1, descending=True).values
        return 1 - mod[..., 1]
    raise ValueError(f"kind must be 'singular' or 'eigen', got {kind!r}")


# ----------------------------------------------------------------------------------------
# rank collapse (Dong, Cordonnier and Loukas 2021)
# ----------------------------------------------------------------------------------------


def composite_norm(X: Tensor) -> Tensor:
    """``||X||_{1,inf} = sqrt(||X||_1 ||X||_inf)`` of ``X (..., m, n)`` (Dong et al. 2021), ``(...)``.

    ``||X||_1`` is the largest column absolute sum, ``||X||_inf`` the largest row absolute sum.
    """
    _check_matrix(X)
    a = X.abs()
    return torch.sqrt(a.sum(-2).amax(-1) * a.sum(-1).amax(-1))


def rank_collapse_residual(X: Tensor, kind: str = "mean") -> Tensor:
    """``res(X) = X - 1 x^T`` for token representations ``X (..., L, d)``.

    ``kind="mean"``: ``x`` is the mean token (the Frobenius-optimal ``x``); ``kind="rank1"``:
    ``X`` minus its best rank-one approximation (truncated SVD), the proxy of Dong et al.'s
    experiments. Both are zero exactly when every token is the same (``"mean"``) or
    ``X`` has rank one (``"rank1"``).
    """
    _check_matrix(X)
    if kind == "mean":
        return X - X.mean(-2, keepdim=True)
    if kind == "rank1":
        u, s, vh = torch.linalg.svd(X, full_matrices=False)
        return X - s[..., :1].unsqueeze(-1) * u[..., :, :1] @ vh[..., :1, :]
    raise ValueError(f"kind must be 'mean' or 'rank1', got {kind!r}")


def relative_residual(X: Tensor, kind: str = "mean") -> Tensor:
    """``||res(X)||_{1,inf} / ||X||_{1,inf}``, ``(...)``: 0 for collapsed representations."""
    return composite_norm(rank_collapse_residual(X, kind)) / composite_norm(X).clamp_min(
        torch.finfo(X.dtype).tiny
    )
