"""Chapter 5's family: matroidal Mahalanobis attention against the dense metric and dot.

Parts, each importing only the ones before it: :mod:`.run` (the arms, the grid, its presets and
one cell's run), :mod:`.analysis` (tables and figures of the runs), :mod:`.checks` (the float64
checks of the mathematical claims, the cost and a timed step), :mod:`.verdicts` (each
hypothesis against its control, and the claims' outcomes).
"""

from __future__ import annotations

from . import analysis, checks, run, verdicts
from .verdicts import outcomes

__all__ = ["analysis", "checks", "outcomes", "run", "verdicts"]
