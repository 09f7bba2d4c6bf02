"""Chapter 6's family: cofactor-stable attention, its identities and its training runs.

Parts, each importing only the ones before it: :mod:`.numerics` (the identities' float64
tables), :mod:`.checks` (the mathematical claims' outcomes), :mod:`.analysis` (the seed's
success criteria and tables of the runs), :mod:`.run` (the grid, its presets, one
cell's run and the claims' outcomes), :mod:`.timing` (the regulariser's cost in a training
step), :mod:`.figures` (the chapter's figures, from the tables and the runs; imported by none
of the others).
"""

from __future__ import annotations

from . import analysis, checks, figures, numerics, run, timing
from .run import outcomes

__all__ = ["analysis", "checks", "figures", "numerics", "outcomes", "run", "timing"]
