"""Chapter 4's family: the Fiber Bundle Transformer against its controls on char-PTB.

Parts, each importing only the ones before it: :mod:`.analysis` (the runs of a grid and
their tables), :mod:`.run` (the grid, its presets, one cell's run, the step timing),
:mod:`.cap` (the metric-cap check), :mod:`.verdicts` (each prediction against its control, and
the claims' outcomes), :mod:`.figures` (the chapter's figures, from the runs and the checks;
imported by none of the others).
"""

from __future__ import annotations

from . import analysis, cap, figures, run, verdicts
from .verdicts import outcomes

__all__ = ["analysis", "cap", "figures", "outcomes", "run", "verdicts"]
