"""Dense Mahalanobis distance attention, and the factored-metric module both metrics share.

A metric ``M = C C^T + eps I`` (``C (d, p)``) scores ``S_ij = -(q_i - k_j)^T M (q_i - k_j) /
(2 tau)``. With upper-triangular ``R``, ``R^T R = M`` (:func:`metric_factor`), that is
``-|R q_i - R k_j|^2 / (2 tau)``: Euclidean distance attention on mapped queries and keys
(:mod:`.euclidean`). The dense baseline learns ``C = W`` (``d^2`` parameters per head); the
matroidal metric (:mod:`.matroidal`) builds ``C`` from a fixed sparse covector matrix.

:class:`FactoredMetricAttention` is the module both use: in a model the map ``R`` is folded into
the projection weights (``R W_q``, ``R W_k``: ``d x d x D`` work per head, not per token), so a
step runs the token-side products of dot-product attention. ``shared=True`` scores ``z_i - z_j``
with one projection ``z = q = k`` (the matroidal seed's pseudocode; ``S_ii = 0`` is then the
largest logit of each row), ``shared=False`` the usual ``q_i - k_j``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.func import functional_call

from .base import (
    Attention,
    AttentionResult,
    check_qkv,
    check_same_device,
    check_tensor,
    count_nonfinite,
)
from .dot import attention_from_logits
from .euclidean import squared_distance_attention

__all__ = [
    "FactoredMetricAttention",
    "MahalanobisAttention",
    "check_metric_args",
    "mahalanobis_attention",
    "mahalanobis_logits",
    "metric_factor",
]


def check_metric_args(eps: float, tau: float) -> None:
    if not eps >= 0:
        raise ValueError(f"eps must be nonnegative, got {eps}")
    if not tau > 0:
        raise ValueError(f"tau must be positive, got {tau}")


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


def _check_dense(W: Tensor, q: Tensor) -> None:
    check_tensor("W", W, expected=f"(..., d={q.shape[-1]}, r)", min_dim=2)
    if W.shape[-2] != q.shape[-1]:
        raise ValueError(f"W must have shape (..., d={q.shape[-1]}, r), got {tuple(W.shape)}")
    check_same_device(q=q, W=W)


def mahalanobis_logits(q: Tensor, k: Tensor, W: Tensor, eps: float, tau: float) -> Tensor:
    """Reference dense Mahalanobis logits ``-(q_i - k_j)^T (W W^T + eps I)(q_i - k_j) / (2 tau)``.

    ``q (..., Lq, d)``, ``k (..., Lk, d)``, ``W (d, r)`` or per head ``(H, d, r)``; materialised.
    """
    check_metric_args(eps, tau)
    _check_dense(W, q)
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
    check_metric_args(eps, tau)
    check_qkv(q, k, v)
    _check_dense(W, q)
    if eps <= 0:
        raise ValueError(f"the fast path needs eps > 0 (M positive definite), got eps={eps}")
    R = metric_factor(W.to(q.dtype), eps)  # (..., d, d)
    yq, yk = q @ R.transpose(-2, -1), k @ R.transpose(-2, -1)
    return squared_distance_attention(yq, yk, v, 2 * tau, causal=causal, mask=mask)


class FactoredMetricAttention(Attention):
    """Shared body of the dense and matroidal metric attentions.

    A subclass defines :meth:`factor` (``R (H, d, d)`` with ``R^T R = M_h``) and
    :meth:`reference_logits`. The module's fast path folds ``R`` into the query and key rows of
    the projection (``y = x (R W)^T``) and runs Euclidean distance attention at temperature
    ``2 tau``; with ``need_weights`` it runs the materialised reference. ``shared=True`` uses one
    projection ``z = q = k`` (the seed's pseudocode; the projection then has two blocks, ``z``
    and ``v``, instead of three).
    """

    def __init__(
        self,
        dim: int,
        n_heads: int,
        tau: float | None = None,
        eps: float = 1e-4,
        shared: bool = False,
        **kwargs,
    ) -> None:
        super().__init__(dim, n_heads, **kwargs)
        self.tau = float(tau) if tau is not None else float(self.head_dim) ** 0.5
        self.eps = float(eps)
        check_metric_args(self.eps, self.tau)
        if self.eps <= 0:
            raise ValueError(f"eps must be positive (M positive definite), got {eps}")
        self.shared = bool(shared)
        if self.shared:  # blocks z, v
            inner = n_heads * self.head_dim
            self.qkv = nn.Linear(dim, 2 * inner, bias=self.qkv.bias is not None)

    def factor(self) -> Tensor:  # R (H, d, d), R^T R = M_h
        raise NotImplementedError

    def reference_logits(self, q: Tensor, k: Tensor) -> Tensor:  # materialised (B, H, L, L)
        raise NotImplementedError

    def split_heads(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``x (B, L, D)`` -> ``q, k, v (B, H, L, d)``; ``q`` and ``k`` are one tensor when shared."""
        if not self.shared:
            return super().split_heads(x)
        b, l, _ = x.shape
        z, v = self.qkv(x).view(b, l, 2, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        return z, z, v

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

    def forward(
        self,
        x: Tensor,
        *,
        causal: bool = False,
        mask: Tensor | None = None,
        need_weights: bool = False,
    ) -> AttentionResult:
        """As :meth:`Attention.forward`; the fast path maps by ``R`` inside the projection."""
        if need_weights:
            return super().forward(x, causal=causal, mask=mask, need_weights=True)
        self.check_input(x)
        b, n, _ = x.shape
        H, d = self.n_heads, self.head_dim
        blocks = 2 if self.shared else 3
        R = self.factor().to(x.dtype)  # (H, d, d)
        W = self.qkv.weight.view(blocks, H, d, self.dim)
        folded = {"weight": torch.cat([R @ W[:-1], W[-1:]]).view(-1, self.dim)}  # R W_q, R W_k
        if self.qkv.bias is not None:
            c = self.qkv.bias.view(blocks, H, d, 1)
            folded["bias"] = torch.cat([R @ c[:-1], c[-1:]]).view(-1)
        y = functional_call(self.qkv, folded, (x,))  # (B, L, blocks H d), counted as qkv
        ys = y.view(b, n, blocks, H, d).permute(2, 0, 3, 1, 4).unbind(0)  # (B, H, L, d) each
        yq, yk, v = (ys[0], ys[0], ys[1]) if self.shared else ys
        out = squared_distance_attention(yq, yk, v, 2 * self.tau, causal=causal, mask=mask)
        res = AttentionResult(self.dropout(self.proj(out.transpose(1, 2).reshape(b, n, H * d))))
        res.diagnostics["nonfinite_out"] = count_nonfinite(res.out)
        return res

    def extra_repr(self) -> str:
        return (
            super().extra_repr() + f", tau={self.tau:.3g}, eps={self.eps:g}, shared={self.shared}"
        )


class MahalanobisAttention(FactoredMetricAttention):
    """Dense learned Mahalanobis attention: ``M_h = W_h W_h^T + eps I`` per head.

    Args:
        rank: columns of ``W_h`` (default ``head_dim``: a full dense metric, ``d^2`` parameters
            per head).
        tau, eps, shared: as :class:`MatroidalAttention`.

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
        shared: bool = False,
        **kwargs,
    ) -> None:
        super().__init__(dim, n_heads, tau=tau, eps=eps, shared=shared, **kwargs)
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
