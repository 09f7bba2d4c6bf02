"""Scaled dot-product attention: the SDPA fast path and the explicit reference.

``softmax(q k^T / sqrt(d)) v`` (Vaswani et al., 2017). The fast path is
:func:`torch.nn.functional.scaled_dot_product_attention`; :func:`explicit_attention`
computes the same thing as a reader would write it, and returns the probabilities.
"""

from __future__ import annotations

import math

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

__all__ = ["DotProductAttention", "explicit_attention", "masked_softmax", "sdpa"]


def masked_softmax(logits: Tensor, keep: Tensor | None) -> Tensor:
    """Softmax over the last dim with entries where ``keep`` is False removed.

    A row with no kept entry gives zeros (not NaN), as SDPA does; a NaN or ``+inf`` among the
    kept logits still gives NaN (the instability is reported, not hidden).
    """
    if keep is not None:
        logits = logits.masked_fill(~keep, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if keep is not None:
        empty = ~keep.any(dim=-1, keepdim=True)  # rows where every key is masked
        probs = probs.masked_fill(empty, 0.0)
    return probs


def explicit_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    scale: float | None = None,
    causal: bool = False,
    mask: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Reference attention ``softmax(q k^T * scale) v``, materialised.

    Args:
        q: ``(..., Lq, d)``; k: ``(..., Lk, d)``; v: ``(..., Lk, d_v)``.
        scale: default ``1 / sqrt(d)``.
        causal: query i sees keys j <= i (aligned at the end when Lq != Lk).
        mask: boolean, True = attend, broadcastable to ``(..., Lq, Lk)``.

    Returns:
        ``(out (..., Lq, d_v), probs (..., Lq, Lk), logits (..., Lq, Lk))``.
    """
    check_qkv(q, k, v)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    logits = (q @ k.transpose(-2, -1)) * scale  # (..., Lq, Lk)
    keep = combine_masks(q.shape[-2], k.shape[-2], causal=causal, mask=mask, device=q.device)
    probs = masked_softmax(logits, keep)
    return probs @ v, probs, logits


def sdpa(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    scale: float | None = None,
    causal: bool = False,
    mask: Tensor | None = None,
) -> Tensor:
    """Fast path: :func:`torch.nn.functional.scaled_dot_product_attention`.

    Shapes as :func:`explicit_attention`; returns ``(..., Lq, d_v)``.
    """
    check_qkv(q, k, v)
    if causal and mask is not None:
        mask = combine_masks(q.shape[-2], k.shape[-2], causal=True, mask=mask, device=q.device)
        causal = False
    if causal and q.shape[-2] != k.shape[-2]:
        mask = combine_masks(q.shape[-2], k.shape[-2], causal=True, mask=None, device=q.device)
        causal = False
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale)


@register_attention("dot")
class DotProductAttention(Attention):
    """Multi-head scaled dot-product attention (SDPA fast path, explicit path for weights)."""

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
            out, probs, logits = explicit_attention(q, k, v, causal=causal, mask=mask)
            keep = combine_masks(
                q.shape[-2], k.shape[-2], causal=causal, mask=mask, device=q.device
            )
            return AttentionResult(out, probs, {"nonfinite_logits": count_nonfinite(logits, keep)})
        return AttentionResult(sdpa(q, k, v, causal=causal, mask=mask))
