"""Matroidal Mahalanobis attention (the matroidal seed, chapter 5).

The metric is ``M = A diag(l) A^T + eps I``: ``A (d, m)`` a fixed sparse covector matrix
(:mod:`.graphs`), ``l = softplus(theta)`` learned. ``x^T M x = sum_e l_e (a_e^T x)^2 + eps
|x|^2`` is a sum of rank-one PSD terms and depends on ``A``, ``theta`` only through the ``d x d``
matrix ``M``. With upper-triangular ``R``, ``R^T R = M`` (the R of a QR of
``[diag(sqrt(l)) A^T; sqrt(eps) I]``), ``(z_i - z_j)^T M (z_i - z_j) = |R z_i - R z_j|^2``:
Euclidean distance attention on ``y = z R^T`` (:mod:`.euclidean`), whose cost per token does
not grow with ``m``. The module shares its fast path, and the choice between scoring
``z_i - z_j`` (the seed's one projection) and ``q_i - k_j``, with the dense Mahalanobis baseline
(:mod:`.mahalanobis`).
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .base import check_same_device, check_tensor
from .euclidean import as_4d, squared_distance_attention
from .graphs import covector_matrix
from .mahalanobis import FactoredMetricAttention, check_metric_args, metric_factor

__all__ = [
    "MatroidalAttention",
    "matroidal_attention",
    "matroidal_coefficients",
    "matroidal_factor",
    "matroidal_logits",
    "matroidal_metric",
    "matroidal_pair_logits",
    "prune_columns",
]


def _check_covectors(A: Tensor, theta: Tensor, d: int, z: Tensor | None = None) -> None:
    """``A (..., d, m)`` and ``theta (..., m)`` (on ``z``'s device when ``z`` is given)."""
    check_tensor("A", A, expected=f"(..., d={d}, m)", min_dim=2)
    check_tensor("theta", theta, expected=f"(..., m={A.shape[-1]})", min_dim=1)
    if A.shape[-2] != d:
        raise ValueError(f"A must have shape (..., d={d}, m), got {tuple(A.shape)}")
    if theta.shape[-1:] != A.shape[-1:] or theta.dim() != A.dim() - 1:
        raise ValueError(
            f"theta must have shape (..., m={A.shape[-1]}) matching A {tuple(A.shape)}, "
            f"got {tuple(theta.shape)}"
        )
    if z is not None:
        check_same_device(z=z, A=A, theta=theta)


def _check_z(z: Tensor) -> None:
    check_tensor("z", z, expected="(batch, ..., n, d)", min_dim=3, nonempty=(-2, -1))


def _check_zv(z: Tensor, v: Tensor) -> None:
    _check_z(z)
    check_tensor("v", v, expected="(batch, ..., n, d_v)", min_dim=3, nonempty=(-2, -1))
    if v.shape[:-1] != z.shape[:-1]:
        raise ValueError(
            f"v must have shape (batch, ..., n, d_v) = {(*z.shape[:-1], 'd_v')} like z "
            f"{tuple(z.shape)}, got {tuple(v.shape)}"
        )
    if z.dtype != v.dtype:
        raise ValueError(f"z and v must share a dtype, got z {z.dtype}, v {v.dtype}")
    check_same_device(z=z, v=v)


def matroidal_coefficients(theta: Tensor) -> Tensor:
    """``l_e = softplus(theta_e) > 0``: the nonnegative weights of the rank-one terms."""
    return F.softplus(theta)


def matroidal_metric(A: Tensor, theta: Tensor, eps: float) -> Tensor:
    """``M = A diag(softplus(theta)) A^T + eps I``, ``A (..., d, m)``, ``theta (..., m)`` -> ``(..., d, d)``."""
    _check_covectors(A, theta, A.shape[-2])
    eye = torch.eye(A.shape[-2], dtype=A.dtype, device=A.device)
    return (A * matroidal_coefficients(theta).unsqueeze(-2)) @ A.transpose(-2, -1) + eps * eye


def matroidal_factor(A: Tensor, theta: Tensor, eps: float, *, method: str = "qr") -> Tensor:
    """``R (..., d, d)`` with ``R^T R = A diag(softplus(theta)) A^T + eps I``."""
    _check_covectors(A, theta, A.shape[-2])
    if eps <= 0:
        raise ValueError(f"the fast path needs eps > 0 (M positive definite), got eps={eps}")
    l = matroidal_coefficients(theta)
    root = l.clamp_min(torch.finfo(l.dtype).tiny).sqrt()  # sqrt(l_e); d/dtheta -> 0 as l -> 0
    return metric_factor(A * root.unsqueeze(-2), eps, method=method)


def matroidal_pair_logits(
    q: Tensor, k: Tensor, A: Tensor, theta: Tensor, eps: float, tau: float
) -> Tensor:
    """The seed's pseudocode for queries and keys: ``(..., Lq, Lk)``, materialised.

    ``-(sum_e l_e (a_e.(q_i - k_j))^2 + eps |q_i - k_j|^2) / (2 tau)``, ``q (..., Lq, d)``,
    ``k (..., Lk, d)``, ``A (d, m)`` or per head ``(H, d, m)`` with ``q (B, H, Lq, d)``, and
    ``theta`` shaped like ``A`` without its ``d``. Memory ``O(Lq Lk m)``: the reference only.
    """
    check_metric_args(eps, tau)
    _check_covectors(A, theta, q.shape[-1], q)
    uq = torch.einsum("...dm,...nd->...nm", A, q)  # u[n, e] = a_e^T q_n
    uk = torch.einsum("...dm,...nd->...nm", A, k)
    w = matroidal_coefficients(theta).unsqueeze(-2).unsqueeze(-2)  # (..., 1, 1, m)
    delta = uq.unsqueeze(-2) - uk.unsqueeze(-3)  # (..., Lq, Lk, m)
    diff = q.unsqueeze(-2) - k.unsqueeze(-3)  # (..., Lq, Lk, d)
    dist = (delta**2 * w).sum(-1) + eps * (diff**2).sum(-1)
    return -dist / (2 * tau)


def matroidal_logits(z: Tensor, A: Tensor, theta: Tensor, eps: float, tau: float) -> Tensor:
    """The seed's pseudocode (the reference): ``z (batch, n, d)`` -> logits ``(batch, n, n)``.

    ``-(sum_e softplus(theta_e) (a_e.(z_i - z_j))^2 + eps |z_i - z_j|^2) / (2 tau)``,
    ``A (d, m)``, ``theta (m,)``. Further leading dimensions ``(batch, ..., n, d)`` are batch
    dimensions too; a ``z`` without a batch dimension is an error.
    """
    _check_z(z)
    return matroidal_pair_logits(z, z, A, theta, eps, tau)


def matroidal_attention(
    z: Tensor,
    v: Tensor,
    A: Tensor,
    theta: Tensor,
    eps: float = 1e-4,
    tau: float = 1.0,
    causal: bool = False,
    *,
    method: str = "qr",
) -> Tensor:
    """``softmax(matroidal_logits(z, A, theta, eps, tau)) @ v`` by the fast path.

    ``z (batch, ..., n, d)``, ``v (batch, ..., n, d_v)``, ``A (d, m)``, ``theta (m,)``; returns
    ``(batch, ..., n, d_v)``. Cost per token: one ``d x d`` map and Euclidean distance
    attention, independent of ``m``; memory linear in ``n``. ``method`` picks the factorisation
    of ``M`` (:func:`metric_factor`).
    """
    check_metric_args(eps, tau)
    _check_zv(z, v)
    if A.dim() != 2 or theta.dim() != 1:
        raise ValueError(
            f"A must be (d, m) and theta (m,), got A {tuple(A.shape)}, theta {tuple(theta.shape)}"
        )
    _check_covectors(A, theta, z.shape[-1], z)
    R = matroidal_factor(A.to(z.dtype), theta.to(z.dtype), eps, method=method)  # R^T R = M
    y = z @ R.transpose(-2, -1)  # (..., n, d), |y_i - y_j|^2 = (z_i - z_j)^T M (z_i - z_j)
    y4, lead = as_4d(y)
    v4, _ = as_4d(v)
    out = squared_distance_attention(y4, y4, v4, 2 * tau, causal=causal)  # tau' = 2 tau
    return out.reshape(*lead, *out.shape[-2:])


def _inverse_softplus(x: float) -> float:
    return x + math.log(-math.expm1(-x))


class MatroidalAttention(FactoredMetricAttention):
    """Matroidal Mahalanobis attention: ``M_h = A diag(softplus(theta_h)) A^T + eps I`` per head.

    Args:
        m: number of covector columns (default ``head_dim``); graph families: edges.
        graph: covector family (:data:`GRAPH_FAMILIES` or :data:`CONTRAST_FAMILIES`).
        grounded: append a ground column ``e_r`` per connected component (graph families) so
            that ``A (d, m + c)`` spans ``R^d`` (:func:`~.graphs.ground_columns`).
        seed: seed of the random families.
        tau: temperature (default ``sqrt(head_dim)``, the dot-product scale when ``M = I``).
        eps: the fixed ridge ``eps I`` (default 1e-4).
        init_weight: initial ``l_e`` (default ``head_dim / |A|_F^2``: ``trace(M) - eps d = d`` for
            every family; ``d / (2m)`` for ``m`` edges).
        shared: score ``z_i - z_j`` with one projection ``z`` (the seed's form), else
            ``q_i - k_j``.

    Parameters: ``theta (H, m)``; buffer ``A (H, d, m)`` (the same ``A`` for every head unless
    pruned, when each head keeps its own columns, padded with zero columns).
    """

    name = "matroidal"

    A: Tensor

    def __init__(
        self,
        dim: int,
        n_heads: int,
        m: int | None = None,
        graph: str = "ring",
        seed: int = 0,
        tau: float | None = None,
        eps: float = 1e-4,
        init_weight: float | None = None,
        grounded: bool = False,
        shared: bool = False,
        **kwargs,
    ) -> None:
        super().__init__(dim, n_heads, tau=tau, eps=eps, shared=shared, **kwargs)
        d = self.head_dim
        m = d if m is None else int(m)
        A = covector_matrix(graph, d, m, seed=seed, grounded=grounded)
        self.graph, self.grounded = graph, bool(grounded)
        self.register_buffer("A", A.expand(n_heads, *A.shape).clone())
        w0 = d / float(A.square().sum()) if init_weight is None else float(init_weight)
        if not w0 > 0:
            raise ValueError(f"init_weight must be positive, got {init_weight}")
        self.init_weight = w0
        self.theta = nn.Parameter(torch.full((n_heads, A.shape[1]), _inverse_softplus(w0)))

    @property
    def m(self) -> int:
        return int(self.A.shape[-1])

    def active_columns(self) -> int:
        """Number of nonzero covector columns over all heads (the metric's effective size)."""
        return int((self.A.abs().sum(-2) > 0).sum())

    def coefficients(self) -> Tensor:
        """``l (H, m) = softplus(theta)``."""
        return matroidal_coefficients(self.theta)

    def metric(self) -> Tensor:
        """``M (H, d, d)``."""
        return matroidal_metric(self.A, self.theta, self.eps)

    def factor(self) -> Tensor:
        return matroidal_factor(self.A, self.theta, self.eps)

    def reference_logits(self, q: Tensor, k: Tensor) -> Tensor:
        return matroidal_pair_logits(q, k, self.A.to(q.dtype), self.theta, self.eps, self.tau)

    def metric_parameters(self) -> list[nn.Parameter]:
        return [self.theta]

    @torch.no_grad()
    def pruned(self, delta: float | Tensor) -> MatroidalAttention:
        """A copy without the columns whose ``l_e < delta`` (a number, or per head ``(H, 1)``)."""
        return self.keep_columns(self.coefficients() >= delta)

    @torch.no_grad()
    def keep_columns(self, keep: Tensor) -> MatroidalAttention:
        """A copy with only the columns where ``keep (H, m)`` (bool) is True, per head.

        Its output equals this module's with the other weights set to zero exactly; each head keeps
        its own columns, padded with zero columns (which add nothing) to the most a head keeps.
        """
        if keep.shape != self.theta.shape or keep.dtype != torch.bool:
            raise ValueError(
                f"keep must be a boolean (H, m) = {tuple(self.theta.shape)} mask, got "
                f"{keep.dtype} {tuple(keep.shape)}"
            )
        m_new = max(int(keep.sum(-1).max()), 1)
        new = copy.deepcopy(self)
        H, d, _ = self.A.shape
        A_new = self.A.new_zeros(H, d, m_new)
        th_new = self.theta.new_zeros(H, m_new)
        for h in range(H):
            idx = keep[h].nonzero().flatten()
            A_new[h, :, : idx.numel()] = self.A[h][:, idx]
            th_new[h, : idx.numel()] = self.theta[h, idx]
        new.A = A_new
        new.theta = nn.Parameter(th_new)
        return new

    def extra_repr(self) -> str:
        return (
            super().extra_repr() + f", graph={self.graph!r}, m={self.m}, grounded={self.grounded}"
        )


def prune_columns(A: Tensor, theta: Tensor, delta: float) -> tuple[Tensor, Tensor, Tensor]:
    """Drop the columns with ``softplus(theta_e) < delta``.

    ``A (d, m)``, ``theta (m,)`` -> ``(A[:, kept], theta[kept], kept)`` with ``kept`` the
    indices of the kept columns. The pruned metric equals the full one with the dropped
    weights set to zero.
    """
    _check_covectors(A, theta, A.shape[-2])
    if A.dim() != 2:
        raise ValueError(f"A must be (d, m), got {tuple(A.shape)}; use MatroidalAttention.pruned")
    kept = (matroidal_coefficients(theta) >= delta).nonzero().flatten()
    return A[:, kept], theta[kept], kept
