"""Broken attention variants, written outside the library, for the report's tests: each breaks
one clause of the Attention contract on purpose."""

from __future__ import annotations

import torch
from torch import Tensor

from attention_atlas.attention import AttentionResult
from attention_atlas.attention.dot import DotProductAttention


class PeekingAttention(DotProductAttention):
    """Dot-product attention that adds the next token's value to each output: it sees the future
    even with ``causal=True``."""

    def attend(self, q: Tensor, k: Tensor, v: Tensor, **kw) -> AttentionResult:  # type: ignore[override]
        res = super().attend(q, k, v, **kw)
        nxt = torch.cat([v[..., 1:, :], torch.zeros_like(v[..., :1, :])], dim=-2)  # (B, H, L, d)
        res.out = res.out + 0.5 * nxt
        return res


class NaNAttention(DotProductAttention):
    """Dot-product attention whose output is NaN everywhere."""

    def attend(self, q: Tensor, k: Tensor, v: Tensor, **kw) -> AttentionResult:  # type: ignore[override]
        res = super().attend(q, k, v, **kw)
        res.out = res.out * float("nan")
        return res
