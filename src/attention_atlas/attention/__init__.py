"""Attention variants, one module per family, all behind one interface (see :mod:`.base`)."""

from .base import Attention, AttentionResult
from .mixed import MixedHeadAttention  # registers "mixed"
from .registry import (
    attention_class,
    available_attention,
    build_attention,
    register_attention,
    variant_fingerprint,
)

__all__ = [
    "Attention",
    "AttentionResult",
    "MixedHeadAttention",
    "attention_class",
    "available_attention",
    "build_attention",
    "register_attention",
    "variant_fingerprint",
]
