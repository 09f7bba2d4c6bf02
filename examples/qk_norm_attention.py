"""An attention variant written outside the library, for ``atlas report``.

Query-key normalised attention (Henry et al. 2020, "Query-Key Normalization for
Transformers"): queries and keys are scaled to unit length per head, so a score is a cosine
similarity, and a learned per-head scale ``g`` sets how sharp the softmax can get::

    scores = g * (q / |q|) (k / |k|)^T        # (B, H, L, L), each entry in [-g, g]

Report it beside the zoo (the smoke preset takes about a minute, the book preset a few)::

    python -m attention_atlas atlas report examples/qk_norm_attention.py:QKNormAttention --preset smoke
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attention_atlas.attention import Attention, AttentionResult
from attention_atlas.attention.dot import attention_from_logits


class QKNormAttention(Attention):
    """Cosine-similarity scores times a learned per-head scale.

    Args:
        dim, n_heads: model width D and heads H (as every variant).
        init_scale: the scale ``g`` every head starts at (> 0).
    """

    def __init__(self, dim: int, n_heads: int, init_scale: float = 10.0, **kwargs: Any) -> None:
        super().__init__(dim, n_heads, **kwargs)
        if not (math.isfinite(init_scale) and init_scale > 0):
            raise ValueError(f"init_scale must be a positive finite number, got {init_scale!r}")
        self.log_scale = nn.Parameter(
            torch.full((n_heads, 1, 1), math.log(init_scale))
        )  # (H, 1, 1)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, *, x: Tensor, causal: bool,
               mask: Tensor | None, need_weights: bool) -> AttentionResult:  # fmt: skip
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)  # (B, H, L, d), unit rows
        logits = self.log_scale.exp() * (q @ k.transpose(-2, -1))  # (B, H, L, L)
        res = attention_from_logits(logits, v, causal=causal, mask=mask)
        if not need_weights:
            res.probs = None
        return res
