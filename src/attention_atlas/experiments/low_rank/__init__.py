"""Chapter 3's family: the cost of low-rank Riemannian geometry.

Parts, each importing only the ones before it: :mod:`.cost` (Woodbury and identity checks,
FLOP ratios, and the claims' outcomes), :mod:`.bench` (the timed forward and backward passes).
"""

from __future__ import annotations

from . import bench, cost
from .cost import outcomes

__all__ = ["bench", "cost", "outcomes"]
