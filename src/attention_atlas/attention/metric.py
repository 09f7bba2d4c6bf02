"""Distance-based attention: Euclidean, dense Mahalanobis and matroidal.

Euclidean distance attention scores ``S_ij = -|q_i - k_j|^2 / tau``. Because
``-|q - k|^2 = 2 q.k - |q|^2 - |k|^2`` and ``|q_i|^2`` is constant along a softmax row,
``softmax_j(S_ij) = softmax_j((2 q_i.k_j - |k_j|^2) / tau)``: a dot product of the augmented
vectors ``q' = [q, 1]`` and ``k' = [k, -|k|^2 / 2]`` at scale ``2 / tau``, which SDPA computes.
The CPU flash kernel needs q, k and v of equal head dimension, so v is padded by one zero
column and the pad is sliced off the output.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .base import (
    Attention,
    AttentionResult,
    check_qkv,
    combine_masks,
    count_nonfinite,
    register_attention,
)
from .dot import masked_softmax, sdpa

__all__ = [
    "EuclideanAttention",
    "euclidean_attention",
    "euclidean_attention_explicit",
    "euclidean_logits",
    "squared_distance_attention",
]


def euclidean_logits(q: Tensor, k: Tensor, tau: float) -> Tensor:
    """Reference ``S_ij = -|q_i - k_j|^2 / tau``, ``(..., Lq, Lk)``, materialised pairwise."""
    diff = q.unsqueeze(-2) - k.unsqueeze(-3)  # (..., Lq, Lk, d)
    return -(diff * diff).sum(-1) / tau


def euclidean_attention_explicit(
    q: Tensor, k: Tensor, v: Tensor, tau: float, *, causal: bool = False, mask: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """Materialised reference: returns ``(out, probs, logits)``."""
    check_qkv(q, k, v)
    logits = euclidean_logits(q, k, tau)
    keep = combine_masks(q.shape[-2], k.shape[-2], causal=causal, mask=mask, device=q.device)
    probs = masked_softmax(logits, keep)
    return probs @ v, probs, logits


def squared_distance_attention(
    q: Tensor, k: Tensor, v: Tensor, tau: float, *, causal: bool = False, mask: Tensor | None = None
) -> Tensor:
    """``softmax(-|q_i - k_j|^2 / tau) v`` through SDPA with augmented q and k.

    ``q (..., Lq, d)``, ``k (..., Lk, d)``, ``v (..., Lk, d_v)`` -> ``(..., Lq, d_v)``.
    Any metric ``M = F F^T`` reduces to this by mapping ``q -> F^T q``, ``k -> F^T k``.
    """
    check_qkv(q, k, v)
    if tau <= 0:
        raise ValueError(f"tau must be positive, got {tau}")
    ones = torch.ones_like(q[..., :1])
    q_aug = torch.cat([q, ones], dim=-1)  # (..., Lq, d+1)
    k_aug = torch.cat([k, -0.5 * (k * k).sum(-1, keepdim=True)], dim=-1)  # (..., Lk, d+1)
    dq, dv = q_aug.shape[-1], v.shape[-1]
    v_pad = F.pad(v, (0, dq - dv)) if dv < dq else v  # equal head dims for the flash kernel
    out = sdpa(q_aug, k_aug, v_pad, scale=2.0 / tau, causal=causal, mask=mask)
    return out[..., :dv]


euclidean_attention = squared_distance_attention


@register_attention("euclidean")
class EuclideanAttention(Attention):
    """Multi-head Euclidean distance attention ``softmax(-|q_i - k_j|^2 / tau) v``.

    Args:
        tau: temperature (default ``sqrt(2 * head_dim)``, which puts the logits on the
            scale of dot-product attention's).
    """

    def __init__(self, dim: int, n_heads: int, tau: float | None = None, **kwargs) -> None:
        super().__init__(dim, n_heads, **kwargs)
        self.tau = float(tau) if tau is not None else (2.0 * self.head_dim) ** 0.5

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
            out, probs, logits = euclidean_attention_explicit(
                q, k, v, self.tau, causal=causal, mask=mask
            )
            keep = combine_masks(
                q.shape[-2], k.shape[-2], causal=causal, mask=mask, device=q.device
            )
            return AttentionResult(out, probs, {"nonfinite_logits": count_nonfinite(logits, keep)})
        return AttentionResult(
            squared_distance_attention(q, k, v, self.tau, causal=causal, mask=mask)
        )

    def extra_repr(self) -> str:
        return super().extra_repr() + f", tau={self.tau:.3g}"
