"""Chapter 2's family: perturbation of attention scores and rank collapse in deep stacks.

Parts, each importing only the ones before it: :mod:`.perturbation` (how a perturbation of the
scores moves the attention, and the onset of the transition), :mod:`.stacks` (pure-attention
stacks and the layer where each collapses), :mod:`.run` (the grid, its presets, one cell's run
and the claims' outcomes).
"""

from __future__ import annotations

from . import perturbation, run, stacks
from .run import outcomes

__all__ = ["outcomes", "perturbation", "run", "stacks"]
