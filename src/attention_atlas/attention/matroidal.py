"""Matroidal and dense Mahalanobis distance attention (the matroidal seed, chapter 5).

Both metrics are ``M = C C^T + eps I`` with ``C (d, p)``: ``C = A diag(sqrt(l))`` for the
matroidal metric (``A`` a fixed sparse covector matrix, ``l = softplus(theta)`` learned) and a
dense learned ``C = W`` for the Mahalanobis baseline. The quadratic form
``x^T M x = sum_e l_e (a_e^T x)^2 + eps |x|^2`` is a sum of rank-one PSD terms, and it depends
on ``A`` and ``theta`` only through the ``d x d`` matrix ``M``. With an upper-triangular
``R`` such that ``R^T R = M`` (the R of a QR factorisation of ``[C^T; sqrt(eps) I]``),
``(z_i - z_j)^T M (z_i - z_j) = |R z_i - R z_j|^2``, so the attention is Euclidean
distance attention on ``y = z R^T`` (:mod:`.euclidean`): its cost per token does not grow
with ``m``. The covector matrices ``A`` and their total unimodularity are in :mod:`.graphs`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .base import Attention, AttentionResult, check_qkv
from .dot import attention_from_logits
from .euclidean import as_4d, squared_distance_attention
from .graphs import covector_matrix

__all__ = [
    "MahalanobisAttention",
    "MatroidalAttention",
    "mahalanobis_attention",
    "mahalanobis_logits",
    "matroidal_attention",
    "matroidal_coefficients",
    "matroidal_factor",
    "matroidal_logits",
    "matroidal_metric",
    "matroidal_pair_logits",
    "metric_factor",
    "prune_columns",
]


def _check_metric_args(eps: float, tau: float) -> None:
    if not eps >= 0:
        raise ValueError(f"eps must be nonnegative, got {eps}")
    if not tau > 0:
        raise ValueError(f"tau must be positive, got {tau}")


def _check_covectors(A: Tensor, theta: Tensor, d: int) -> None:
    if A.dim() < 2 or A.shape[-2] != d:
        raise ValueError(f"A must have shape (..., d={d}, m), got {tuple(A.shape)}")
    if theta.shape[-1:] != A.shape[-1:] or theta.dim() != A.dim() - 1:
        raise ValueError(
            f"theta must have shape (..., m={A.shape[-1]}) matching A {tuple(A.shape)}, "
            f"got {tuple(theta.shape)}"
        )


def matroidal_coefficients(theta: Tensor) -> Tensor:
    """``l_e = softplus(theta_e) > 0``: the nonnegative weights of the rank-one terms."""
    return F.softplus(theta)


def matroidal_metric(A: Tensor, theta: Tensor, eps: float) -> Tensor:
    """``M = A diag(softplus(theta)) A^T + eps I``, ``A (..., d, m)``, ``theta (..., m)`` -> ``(..., d, d)``."""
    _check_covectors(A, theta, A.shape[-2])
    eye = torch.eye(A.shape[-2], dtype=A.dtype, device=A.device)
    return (A * matroidal_coefficients(theta).unsqueeze(-2)) @ A.transpose(-2, -1) + eps * eye


def metric_factor(C: Tensor, eps: float, *, method: str = "qr") -> Tensor:
    """Upper-triangular ``R (..., d, d)`` with ``R^T R = C C^T + eps I``, ``C (..., d, p)``.

    ``method="qr"`` (default) takes the R of ``[C^T; sqrt(eps) I]`` (``(p + d, d)``, full column
    rank when ``eps > 0``): it never forms ``M``, so it works with the square root of the
    condition number of ``M``. ``method="cholesky"`` factors ``M`` itself (``M = L L^T``,
    ``R = L^T``). Both are differentiable and give the same metric.
    """
    d = C.shape[-2]
    eye = torch.eye(d, dtype=C.dtype, device=C.device)
    if method == "qr":
        stacked = torch.cat([C.transpose(-2, -1), (eps**0.5) * eye.expand(*C.shape[:-2], d, d)], -2)
        return torch.linalg.qr(stacked).R  # (..., d, d)
    if method == "cholesky":
        M = C @ C.transpose(-2, -1) + eps * eye
        return torch.linalg.cholesky(M).transpose(-2, -1)
    raise ValueError(f"method must be 'qr' or 'cholesky', got {method!r}")


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
    _check_metric_args(eps, tau)
    _check_covectors(A, theta, q.shape[-1])
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
    ``A (d, m)``, ``theta (m,)``.
    """
    if z.dim() < 2:
        raise ValueError(f"z must have shape (batch, n, d), got {tuple(z.shape)}")
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

    ``z (batch, n, d)`` (any leading dims ``(..., n, d)``), ``v (..., n, d_v)``, ``A (d, m)``,
    ``theta (m,)``; returns ``(..., n, d_v)``. Cost per token: one ``d x d`` map and Euclidean
    distance attention, independent of ``m``; memory linear in ``n``. ``method`` picks the
    factorisation of ``M`` (:func:`metric_factor`).
    """
    _check_metric_args(eps, tau)
    check_qkv(z, z, v)
    if A.dim() != 2 or theta.dim() != 1:
        raise ValueError(
            f"A must be (d, m) and theta (m,), got A {tuple(A.shape)}, theta {tuple(theta.shape)}"
        )
    _check_covectors(A, theta, z.shape[-1])
    R = matroidal_factor(A.to(z.dtype), theta.to(z.dtype), eps, method=method)  # R^T R = M
    y = z @ R.transpose(-2, -1)  # (..., n, d), |y_i - y_j|^2 = (z_i - z_j)^T M (z_i - z_j)
    y4, lead = as_4d(y)
    v4, _ = as_4d(v)
    out = squared_distance_attention(y4, y4, v4, 2 * tau, causal=causal)  # tau' = 2 tau
    return out.reshape(*lead, *out.shape[-2:])


def mahalanobis_logits(q: Tensor, k: Tensor, W: Tensor, eps: float, tau: float) -> Tensor:
    """Reference dense Mahalanobis logits ``-(q_i - k_j)^T (W W^T + eps I)(q_i - k_j) / (2 tau)``.

    ``q (..., Lq, d)``, ``k (..., Lk, d)``, ``W (d, r)`` or per head ``(H, d, r)``; materialised.
    """
    _check_metric_args(eps, tau)
    if W.dim() < 2 or W.shape[-2] != q.shape[-1]:
        raise ValueError(f"W must have shape (..., d={q.shape[-1]}, r), got {tuple(W.shape)}")
    diff = q.unsqueeze(-2) - k.unsqueeze(-3)  # (..., Lq, Lk, d)
    proj = torch.einsum("...dr,...ijd->...ijr", W, diff)  # W^T (q_i - k_j)
    return -((proj**2).sum(-1) + eps * (diff**2).sum(-1)) / (2 * tau)


def mahalanobis_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    W: Tensor,
    eps: float = 1e-4,
    tau: float = 1.0,
    causal: bool = False,
    mask: Tensor | None = None,
) -> Tensor:
    """``softmax(mahalanobis_logits) @ v`` by the same fast path (``M = W W^T + eps I``)."""
    _check_metric_args(eps, tau)
    check_qkv(q, k, v)
    if eps <= 0:
        raise ValueError(f"the fast path needs eps > 0 (M positive definite), got eps={eps}")
    R = metric_factor(W.to(q.dtype), eps)  # (..., d, d)
    yq, yk = q @ R.transpose(-2, -1), k @ R.transpose(-2, -1)
    return squared_distance_attention(yq, yk, v, 2 * tau, causal=causal, mask=mask)


def _inverse_softplus(x: float) -> float:
    import math

    return x + math.log(-math.expm1(-x))


class _FactoredMetricAttention(Attention):
    """Shared body of the dense and matroidal metric attentions.

    A subclass defines :meth:`factor` (``R (H, d, d)`` with ``R^T R = M_h``) and
    :meth:`reference_logits`; ``attend`` maps ``q -> q R^T``, ``k -> k R^T`` and runs Euclidean
    distance attention at temperature ``2 tau`` (fast path), or the reference when weights are
    asked for.
    """

    def __init__(
        self, dim: int, n_heads: int, tau: float | None = None, eps: float = 1e-4, **kwargs
    ) -> None:
        super().__init__(dim, n_heads, **kwargs)
        self.tau = float(tau) if tau is not None else float(self.head_dim) ** 0.5
        self.eps = float(eps)
        _check_metric_args(self.eps, self.tau)
        if self.eps <= 0:
            raise ValueError(f"eps must be positive (M positive definite), got {eps}")

    def factor(self) -> Tensor:
        raise NotImplementedError

    def reference_logits(self, q: Tensor, k: Tensor) -> Tensor:
        raise NotImplementedError

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
        if need_weights:
            return attention_from_logits(self.reference_logits(q, k), v, causal=causal, mask=mask)
        R = self.factor().to(q.dtype)  # (H, d, d)
        Rt = R.transpose(-2, -1).unsqueeze(0)  # (1, H, d, d)
        yq, yk = q @ Rt, k @ Rt  # (B, H, L, d)
        out = squared_distance_attention(yq, yk, v, 2 * self.tau, causal=causal, mask=mask)
        return AttentionResult(out)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", tau={self.tau:.3g}, eps={self.eps:g}"


class MatroidalAttention(_FactoredMetricAttention):
    """Matroidal Mahalanobis attention: ``M_h = A diag(softplus(theta_h)) A^T + eps I`` per head.

    Args:
        m: number of covector columns (default ``head_dim``).
        graph: covector family (:data:`GRAPH_FAMILIES` or :data:`CONTRAST_FAMILIES`).
        seed: seed of the random families.
        tau: temperature (default ``sqrt(head_dim)``, the dot-product scale when ``M = I``).
        eps: the fixed ridge ``eps I`` (default 1e-4).
        init_weight: initial ``l_e`` (default ``head_dim / (2 m)``, so ``trace(M) ~= head_dim``).

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
        **kwargs,
    ) -> None:
        super().__init__(dim, n_heads, tau=tau, eps=eps, **kwargs)
        d = self.head_dim
        m = d if m is None else int(m)
        A = covector_matrix(graph, d, m, seed=seed)
        self.graph = graph
        self.register_buffer("A", A.expand(n_heads, d, m).clone())
        w0 = d / (2 * m) if init_weight is None else float(init_weight)
        if w0 <= 0:
            raise ValueError(f"init_weight must be positive, got {init_weight}")
        self.theta = nn.Parameter(torch.full((n_heads, m), _inverse_softplus(w0)))

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
    def pruned(self, delta: float) -> MatroidalAttention:
        """A copy without the columns whose weight ``l_e < delta`` (per head).

        Its output equals this module's output with those weights set to zero exactly; each
        head keeps its own columns (padded with zero columns, which add nothing, to the largest
        count kept by a head).
        """
        import copy

        keep = self.coefficients() >= delta  # (H, m)
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
        return super().extra_repr() + f", graph={self.graph!r}, m={self.m}"


class MahalanobisAttention(_FactoredMetricAttention):
    """Dense learned Mahalanobis attention: ``M_h = W_h W_h^T + eps I`` per head.

    Args:
        rank: columns of ``W_h`` (default ``head_dim``: a full dense metric, ``d^2`` parameters
            per head).
        tau, eps: as :class:`MatroidalAttention`.

    Parameters: ``W (H, d, rank)``, initialised to the first ``rank`` columns of the identity.
    """

    name = "mahalanobis"

    def __init__(
        self,
        dim: int,
        n_heads: int,
        rank: int | None = None,
        tau: float | None = None,
        eps: float = 1e-4,
        **kwargs,
    ) -> None:
        super().__init__(dim, n_heads, tau=tau, eps=eps, **kwargs)
        d = self.head_dim
        r = d if rank is None else int(rank)
        if r < 1:
            raise ValueError(f"rank must be positive, got {rank}")
        eye = torch.eye(d, r)
        self.W = nn.Parameter(eye.expand(n_heads, d, r).clone())

    def metric(self) -> Tensor:
        """``M (H, d, d)``."""
        eye = torch.eye(self.head_dim, dtype=self.W.dtype, device=self.W.device)
        return self.W @ self.W.transpose(-2, -1) + self.eps * eye

    def factor(self) -> Tensor:
        return metric_factor(self.W, self.eps)

    def reference_logits(self, q: Tensor, k: Tensor) -> Tensor:
        return mahalanobis_logits(q, k, self.W.to(q.dtype), self.eps, self.tau)

    def metric_parameters(self) -> list[nn.Parameter]:
        return [self.W]


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
