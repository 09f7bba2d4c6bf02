"""Scaled dot-product attention: the SDPA fast path and the explicit reference.

``softmax(q k^T / sqrt(d)) v`` (Vaswani et al., 2017). The fast path is
:func:`torch.nn.functional.scaled_dot_product_attention`; :func:`explicit_attention`
computes the same thing as a reader would write it, and returns the probabilities.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .base import Attention, AttentionResult, check_qkv, combine_masks, count_nonfinite

__all__ = [
    "DotProductAttention",
    "attention_from_logits",
    "explicit_attention",
    "masked_softmax",
    "sdpa",
]


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
    res = attention_from_logits(logits, v, causal=causal, mask=mask)
    return res.out, res.probs, logits  # type: ignore[return-value]


def attention_from_logits(
    logits: Tensor, v: Tensor, *, causal: bool = False, mask: Tensor | None = None
) -> AttentionResult:
    """The explicit path every variant shares once it has its logits.

    ``logits (..., Lq, Lk)``, ``v (..., Lk, d_v)``: softmax over the kept entries (causal and/or
    boolean ``mask``, True = attend), ``out = probs @ v``, and ``diagnostics["nonfinite_logits"]``,
    the count of NaN/inf logits among the kept entries.
    """
    keep = combine_masks(
        logits.shape[-2], logits.shape[-1], causal=causal, mask=mask, device=logits.device
    )
    probs = masked_softmax(logits, keep)
    return AttentionResult(probs @ v, probs, {"nonfinite_logits": count_nonfinite(logits, keep)})


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


class DotProductAttention(Attention):
    """Multi-head scaled dot-product attention (SDPA fast path, explicit path for weights).

    ``temperature`` ``T``: ``softmax(q k^T / (sqrt(d) T)) v``; ``T < 1`` sharpens the attention
    (the temperature-matched control of chapter 4's prediction P5), ``T = 1`` is the standard
    scale.

    Under autograd the SDPA path's result carries the queries and keys ``(B, H, L, d)`` in
    ``extras["query"]`` and ``extras["key"]`` (views of the projection, which SDPA saves for
    its backward anyway): a caller that needs a few heads' probabilities (the cofactor
    regulariser, :func:`attention_atlas.cofactor.heads.head_probs`) takes them instead of
    recomputing the projection. Without autograd nothing is attached, so no layer's projection
    outlives its layer.
    """

    name = "dot"

    def __init__(self, dim: int, n_heads: int, temperature: float = 1.0, **kwargs: Any) -> None:
        super().__init__(dim, n_heads, **kwargs)
        if not (math.isfinite(temperature) and temperature > 0):
            raise ValueError(f"temperature must be a positive finite number, got {temperature!r}")
        self.temperature = float(temperature)

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
            check_qkv(q, k, v)
            logits = (q @ k.transpose(-2, -1)) / (math.sqrt(q.shape[-1]) * self.temperature)
            return attention_from_logits(logits, v, causal=causal, mask=mask)  # logits (B, H, L, L)
        # T = 1: SDPA's own default scale, bit for bit the standard model
        scale = (
            None if self.temperature == 1.0 else 1.0 / (math.sqrt(q.shape[-1]) * self.temperature)
        )
        res = AttentionResult(sdpa(q, k, v, scale=scale, causal=causal, mask=mask))
        if torch.is_grad_enabled():
            res.extras.update(query=q, key=k)
        return res

    def extra_repr(self) -> str:
        return super().extra_repr() + (
            f", temperature={self.temperature:g}" if self.temperature != 1.0 else ""
        )
