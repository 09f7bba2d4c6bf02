"""Principal cofactors of attention Laplacians, the stability margin and the stationary distribution.

An attention matrix ``A (..., n, n)`` is row-stochastic (``A 1 = 1``), so ``L = I - A`` has
``L 1 = 0``. When ``rank L = n - 1`` (for example when the chain ``A`` is irreducible) the
adjugate of ``L`` has rank one, and since ``adj(L) L = L adj(L) = det(L) I = 0`` it is

    adj(L) = 1 c^T,        c_i = det(L with row i and column i removed),        c^T L = 0,

the vector of principal cofactors (the seed's eq. ``c^T L = 0``). Its sum is the *stability
margin* ``m = sum_i c_i = prod_{k>=2} lambda_k(L)`` (the product of the nonzero eigenvalues),
and by the Markov chain tree theorem (Leighton and Rivest, 1986) ``c`` is proportional to the
stationary distribution of ``A``.

Three ways to compute ``c``:

``"minors"``
    the reference: one determinant per deleted row and column, ``O(n^4)``.
``"lu"``
    exact, one ``O(n^3)`` factorisation. With any ``w`` such that ``w^T 1 = 1`` (we take
    ``w = 1 / n``), the rank-one shift ``M = L + 1 w^T`` has (matrix determinant lemma)

        det(M) = det(L) + w^T adj(L) 1 = (w^T 1)(c^T 1) = m,

    and ``c^T M = c^T L + (c^T 1) w^T = m w^T``, so ``c = m M^{-T} w``. The eigenvalues of ``M``
    are those of ``L`` with the zero replaced by ``w^T 1 = 1``, so ``M`` is as well conditioned as
    the nonzero spectrum of ``L``. One LU of ``M`` gives ``det(M)`` (its diagonal and pivots) and
    ``x = M^{-T} w`` (one solve); then ``c = det(M) x`` and, since ``1^T x = 1``, ``x`` is the
    normalised cofactor vector itself (the stationary distribution of an irreducible ``A``).
``"power"``
    approximate: power iteration ``pi_{k+1}^T = pi_k^T A`` for the stationary distribution,
    scaled by the margin from one determinant. The error bound is the Doeblin contraction:
    with ``delta = 1 - sum_j min_i A_ij`` (an upper bound of Dobrushin's ergodicity coefficient),
    ``||pi_k - pi||_1 <= delta / (1 - delta) * ||pi_k - pi_{k-1}||_1``; the bound is returned by
    :func:`power_stationary`. The vector part costs ``O(k n^2)``; the scale still needs one
    determinant, so ``"power"`` only saves time when only ``pi`` is wanted.

Numerics: ``L`` is formed as the Laplacian of the off-diagonal weights,
``L_ii = sum_{j != i} A_ij`` and ``L_ij = -A_ij``. For row-stochastic ``A`` this equals
``I - A``; it makes ``L 1 = 0`` hold to round-off and avoids the cancellation in ``1 - A_ii``
when ``A_ii`` is close to one (saturated self-attention). Gradients with respect to the logits
of a softmax are the same for both forms (they differ by a per-row constant, which the softmax
Jacobian annihilates).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from attention_atlas.linalg import serial_lu

__all__ = [
    "METHODS",
    "CofactorResult",
    "laplacian",
    "lu_cofactors",
    "lu_logdet",
    "minors_cofactors",
    "power_stationary",
    "principal_cofactors",
    "shifted_laplacian",
    "stability_margin",
    "stationary_distribution",
    "validate_stochastic",
    "with_fallback",
]

METHODS = ("minors", "lu", "power")


# --------------------------------------------------------------------------------------------
# validation and the Laplacian
# --------------------------------------------------------------------------------------------
def validate_stochastic(A: Tensor, atol: float = 1e-4, name: str = "A") -> None:
    """Raise a clear error unless ``A (..., n, n)`` is a floating, square, row-stochastic tensor.

    Args:
        A: candidate attention matrices.
        atol: tolerance on ``min A_ij >= -atol`` and ``|sum_j A_ij - 1| <= atol``.
            The default accepts float32 softmax round-off and rejects logits or unnormalised scores.
        name: the argument name used in error messages.

    Raises:
        TypeError: not a tensor.
        ValueError: not floating point, fewer than two dimensions, not square, or not
            row-stochastic within ``atol`` (the message gives the worst entry or row sum).
    """
    if not isinstance(A, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(A).__name__}")
    if not A.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor (float32/float64), got {A.dtype}")
    if A.dim() < 2 or A.shape[-1] != A.shape[-2]:
        raise ValueError(f"{name} must have shape (..., n, n) (square), got {tuple(A.shape)}")
    if A.shape[-1] == 0:
        raise ValueError(f"{name} must have n >= 1, got shape {tuple(A.shape)}")
    if atol < 0:
        raise ValueError(f"atol must be non-negative, got {atol}")
    with torch.no_grad():
        if not bool(torch.isfinite(A).all()):
            raise ValueError(f"{name} has non-finite entries (NaN or inf)")
        lo = float(A.min())
        if lo < -atol:
            raise ValueError(
                f"{name} must be row-stochastic: entries >= 0 (tolerance {atol}), "
                f"got minimum entry {lo:.3g}"
            )
        dev = float((A.sum(-1) - 1).abs().max())
        if dev > atol:
            raise ValueError(
                f"{name} must be row-stochastic: rows summing to 1 (tolerance {atol}), "
                f"got max |row sum - 1| = {dev:.3g}"
            )


def laplacian(A: Tensor) -> Tensor:
    """``L = I - A (..., n, n)`` formed as ``diag(sum_{j != i} A_ij) - offdiag(A)``.

    Equal to ``I - A`` for row-stochastic ``A``, with ``L 1 = 0`` to round-off (module docstring).
    """
    n = A.shape[-1]
    eye = torch.eye(n, dtype=torch.bool, device=A.device)
    off = A.masked_fill(eye, 0.0)  # (..., n, n)
    return torch.diag_embed(off.sum(-1)) - off


# --------------------------------------------------------------------------------------------
# the three methods
# --------------------------------------------------------------------------------------------
def minors_cofactors(A: Tensor) -> Tensor:
    """Reference: ``c_i = det(L_{-i,-i})`` by one determinant per minor. ``(..., n)``."""
    L = laplacian(A)
    n = L.shape[-1]
    ar = torch.arange(n, device=A.device)
    keep = ar[None, :] != ar[:, None]  # (n, n): row i keeps j != i
    idx = ar.expand(n, n)[keep].view(n, n - 1)  # (n, n-1)
    minors = L[..., idx[:, :, None], idx[:, None, :]]  # (..., n, n-1, n-1)
    return torch.linalg.det(minors)  # (..., n)


@dataclass
class CofactorResult:
    """Everything one LU of ``M = L + 1 w^T`` gives.

    Attributes:
        x: ``(..., n)``, ``M^{-T} w``: the normalised cofactors ``c / m`` (sum to one).
        sign: ``(...)``, sign of ``det(M) = m`` (a placeholder where singular).
        logabsdet: ``(...)``, ``log |m|`` (a placeholder where singular).
        singular: ``(...)`` bool, True where ``rank L < n - 1`` to working precision (a pivot
            below ``n eps`` times the largest, or a failed factorisation or solve).
    """

    x: Tensor
    sign: Tensor
    logabsdet: Tensor
    singular: Tensor

    @property
    def margin(self) -> Tensor:
        """``m = sum c = det(M)``, ``(...)`` (0 where singular)."""
        m = self.sign * self.logabsdet.exp()
        return torch.where(self.singular, torch.zeros_like(m), m)

    @property
    def cofactors(self) -> Tensor:
        """``c = m x``, ``(..., n)``."""
        return self.margin.unsqueeze(-1) * self.x


def shifted_laplacian(A: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    """``M = L + 1 1^T / n`` with ``L`` as :func:`laplacian` (off-diagonal row sums on the
    diagonal), in ``dtype`` (default ``A``'s), built in place on one copy of ``A``:
    ``M = 1/n - offdiag(A)``, then ``M_ii += sum_{j != i} A_ij``."""
    n = A.shape[-1]
    M = A.to(dtype or A.dtype, copy=True)
    M.diagonal(dim1=-2, dim2=-1).zero_()  # offdiag(A), (..., n, n)
    rows = M.sum(-1)  # sum_{j != i} A_ij
    M.neg_().add_(1.0 / n)  # every entry of L + J/n off the diagonal; 1/n on it
    M.diagonal(dim1=-2, dim2=-1).add_(rows)
    return M


def lu_logdet(M: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """LU of ``M (..., n, n)``: ``(LU, pivots, log|det|, numerically singular)``.

    Numerically singular: a pivot below ``n eps`` times the largest (``rank L < n - 1`` to
    working precision), a non-finite pivot, or a failed factorisation. One comparison decides
    all three: it is False for a NaN or infinite largest pivot, and LAPACK reports a failure
    (``info > 0``) only for an exactly zero pivot, below any positive bound."""
    n = M.shape[-1]
    with serial_lu(M):
        LU, piv, _ = torch.linalg.lu_factor_ex(M)  # (..., n, n), (..., n)
    piv_abs = LU.diagonal(dim1=-2, dim2=-1).abs()  # (..., n)
    with torch.no_grad():
        lo, hi = piv_abs.aminmax(dim=-1)  # NaN pivots give NaN, and NaN > x is False
        singular = ~(lo > (n * torch.finfo(M.dtype).eps) * hi)
    return LU, piv, piv_abs.log().sum(-1), singular


def _lu_parts(M: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """LU of ``M (..., n, n)``: ``(LU, pivots, sign det, log|det|, numerically singular)``."""
    n = M.shape[-1]
    LU, piv, logabsdet, singular = lu_logdet(M)
    ar = torch.arange(1, n + 1, device=M.device, dtype=piv.dtype)
    n_swaps = (piv != ar).sum(-1)
    diag = LU.diagonal(dim1=-2, dim2=-1).detach()
    sign = (1.0 - 2.0 * (n_swaps % 2).to(M.dtype)) * torch.sign(diag).prod(-1)
    return LU, piv, sign, logabsdet, singular


def lu_cofactors(A: Tensor) -> CofactorResult:
    """Exact cofactors from one LU of the rank-one shift ``M = L + 1 w^T``, ``w = 1 / n``.

    See the module docstring for the derivation (``det M = m``, ``c = m M^{-T} w``).
    Differentiable (through ``torch.linalg.lu_factor`` and ``lu_solve``) and batched.
    Matrices found numerically singular are replaced by the identity before the solve (a
    decision without gradient, so no NaN leaks into the backward pass); their entries in the
    result are placeholders (``x = w``) and are flagged in ``singular``.

    Args:
        A: ``(..., n, n)`` row-stochastic (not validated here).
    """
    n = A.shape[-1]
    M = shifted_laplacian(A)  # M = L + 1 w^T with w = 1/n
    LU, piv, sign, logabsdet, singular = _lu_parts(M)
    if bool(singular.any()):  # refactorise with the singular ones replaced (rare)
        eye = torch.eye(n, dtype=A.dtype, device=A.device)
        M = torch.where(singular[..., None, None], eye, M)
        LU, piv, sign, logabsdet, _ = _lu_parts(M)
    w = torch.full((*A.shape[:-1], 1), 1.0 / n, dtype=A.dtype, device=A.device)
    x = torch.linalg.lu_solve(LU, piv, w, adjoint=True).squeeze(-1)  # M^T x = w
    return CofactorResult(x=x, sign=sign, logabsdet=logabsdet, singular=singular)


def power_stationary(
    A: Tensor, *, tol: float | None = None, max_iter: int = 1000
) -> tuple[Tensor, Tensor, int]:
    """Stationary distribution by power iteration on ``A^T``, with an a-posteriori error bound.

    Iterates ``pi_{k+1}^T = pi_k^T A`` from the uniform distribution until
    ``||pi_{k+1} - pi_k||_1 <= tol`` for every matrix in the batch (or ``max_iter``).

    Error bound: ``delta = 1 - sum_j min_i A_ij`` bounds Dobrushin's coefficient, so
    ``||pi_k - pi||_1 <= delta / (1 - delta) ||pi_k - pi_{k-1}||_1`` (a contraction in the
    l1 norm on vectors summing to zero). The bound is ``inf`` where ``delta = 1`` (for example
    causal or sparse attention): the iteration may still converge, but nothing is guaranteed.

    Args:
        A: ``(..., n, n)`` row-stochastic.
        tol: stopping tolerance on the l1 step (default ``100 * eps(dtype)``).
        max_iter: iteration cap.

    Returns:
        ``(pi (..., n), bound (...), iterations)``, ``bound`` detached.
    """
    if tol is None:
        tol = 100 * torch.finfo(A.dtype).eps
    n = A.shape[-1]
    pi = torch.full(A.shape[:-1], 1.0 / n, dtype=A.dtype, device=A.device)  # (..., n)
    step = torch.full(A.shape[:-2], float("inf"), dtype=A.dtype, device=A.device)
    k = 0
    for k in range(1, max_iter + 1):  # noqa: B007 (k is returned)
        new = (pi.unsqueeze(-2) @ A).squeeze(-2)  # pi^T A
        new = new / new.sum(-1, keepdim=True)
        step = (new - pi).detach().abs().sum(-1)
        pi = new
        if bool((step <= tol).all()):
            break
    with torch.no_grad():
        delta = (1.0 - A.amin(-2).sum(-1)).clamp(0.0, 1.0)  # (...)
        bound = torch.where(delta < 1, delta / (1 - delta) * step, torch.full_like(step, math.inf))
    return pi, bound, k


def principal_cofactors(
    A: Tensor,
    method: str = "lu",
    *,
    atol: float = 1e-4,
    check: bool = True,
    power_tol: float | None = None,
    power_max_iter: int = 1000,
) -> Tensor:
    """Principal cofactors ``c_i = det((I - A) with row i and column i removed)``.

    Args:
        A: ``(..., n, n)`` row-stochastic (float32 or float64; any batch shape).
        method: ``"minors"`` (reference, ``O(n^4)``), ``"lu"`` (exact, one factorisation,
            ``O(n^3)``) or ``"power"`` (stationary distribution by power iteration, scaled by
            the margin; see :func:`power_stationary` for its error bound).
        atol: row-stochasticity tolerance of the input check.
        check: validate ``A`` (:func:`validate_stochastic`); turn off in hot loops.
        power_tol, power_max_iter: options of ``"power"``.

    Returns:
        ``c (..., n)``, same dtype as ``A``; differentiable.

    Where ``rank(I - A) < n - 1`` (several closed classes) every cofactor is zero; ``"lu"``
    then falls back to ``"minors"`` for those matrices (values exact, gradients as torch's
    ``det`` gives them at singular minors).
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if check:
        validate_stochastic(A, atol=atol)
    if method == "minors":
        return minors_cofactors(A)
    if method == "power":
        pi, _, _ = power_stationary(A, tol=power_tol, max_iter=power_max_iter)
        return stability_margin(A, check=False).unsqueeze(-1) * pi
    res = lu_cofactors(A)
    return with_fallback(A, res.cofactors, res.singular)


def with_fallback(A: Tensor, c: Tensor, singular: Tensor) -> Tensor:
    """Replace the LU cofactors of singular matrices by the reference minors (a decision made
    without gradient; the minors' values are exact, their gradients are torch's ``det``'s)."""
    if not bool(singular.any()):
        return c
    batch = A.shape[:-2]
    n = A.shape[-1]
    Af, cf, bad = A.reshape(-1, n, n), c.reshape(-1, n), singular.reshape(-1)
    cf = cf.masked_fill(bad.unsqueeze(-1), 0.0).index_put((bad,), minors_cofactors(Af[bad]))
    return cf.reshape(*batch, n)


def stability_margin(A: Tensor, *, atol: float = 1e-4, check: bool = True) -> Tensor:
    """``m = sum_i c_i = prod_{k>=2} lambda_k(I - A) = det(I - A + 1 1^T / n)``, shape ``(...)``.

    One LU (:func:`lu_cofactors`); zero where ``rank(I - A) < n - 1``.
    """
    if check:
        validate_stochastic(A, atol=atol)
    return lu_cofactors(A).margin


def stationary_distribution(
    A: Tensor,
    method: str = "lu",
    *,
    atol: float = 1e-4,
    check: bool = True,
    power_tol: float | None = None,
    power_max_iter: int = 1000,
) -> Tensor:
    """Normalised cofactors ``pi = c / sum c`` (the stationary distribution when ``A`` is
    irreducible; for a reducible ``A`` with one closed class, the stationary distribution
    supported on it). Shape ``(..., n)``.

    ``"lu"`` solves ``(I - A + 1 w^T)^T pi = w`` (Kemeny and Snell's fundamental-matrix form);
    ``"power"`` iterates :func:`power_stationary`; ``"minors"`` normalises the reference cofactors.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if check:
        validate_stochastic(A, atol=atol)
    if method == "power":
        return power_stationary(A, tol=power_tol, max_iter=power_max_iter)[0]
    if method == "minors":
        c = minors_cofactors(A)
        return c / c.sum(-1, keepdim=True)
    return lu_cofactors(A).x
