"""Attention Atlas: Riemannian, matroidal, cofactor-stable and structured masked attention.

The importable core of the Attention Atlas book. See ``attention_atlas.attention`` for the
variants (``build_attention(name, **config)``), ``attention_atlas.cofactor`` for cofactor
stability, ``attention_atlas.models`` for the Transformer and ``attention_atlas.train`` for
training.
"""

from .attention import available_attention, build_attention

__version__ = "0.1.0"
__all__ = ["__version__", "available_attention", "build_attention"]
