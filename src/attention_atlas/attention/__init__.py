"""Attention variants, one module per family, all behind one interface (see :mod:`.base`)."""

from .base import Attention, AttentionResult
from .mixed import MixedHeadAttention  # registers "mixed"
from .registry import available_attention, build_attention, register_attention

__all__ = [
    "Attention",
    "AttentionResult",
    "MixedHeadAttention",
    "available_attention",
    "build_attention",
    "register_attention",
]
