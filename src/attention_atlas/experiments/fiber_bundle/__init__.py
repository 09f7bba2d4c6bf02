"""Chapter 4's family: the Fiber Bundle Transformer against its controls on char-PTB.

Parts, each importing only the ones before it: :mod:`.analysis` (the runs of a grid and
their tables), :mod:`.controls` (the dot-product models matched in parameters, FLOPs and wall
clock), :mod:`.mqar` (the MQAR half of that comparison: its cells, their run and checks),
:mod:`.run` (the grid, its presets, one cell's run, the step timing), :mod:`.cap` (the
metric-cap check), :mod:`.rule` (the smallest effects and the training scale), :mod:`.gate`
(the geometry gate, the divergences, the matched comparisons), :mod:`.verdicts` (each
prediction against its control, and every claim's outcome), :mod:`.figures` (the chapter's
figures, from the runs and the checks; imported by none of the others).
"""

from __future__ import annotations

from . import analysis, cap, controls, figures, gate, mqar, rule, run, verdicts
from .verdicts import outcomes

__all__ = [
    "analysis",
    "cap",
    "controls",
    "figures",
    "gate",
    "mqar",
    "outcomes",
    "rule",
    "run",
    "verdicts",
]
