"""Chapter 9's family: every attention variant trained on equal footing (MQAR and char-PTB).

Parts, each importing only the ones before it: :mod:`.run` (the grid, its presets, one
cell's run, and the timing cell: a training step of each variant), :mod:`.anchors` (the
set-up's anchors: dot solves the easiest cell, the SSM falls with the number of pairs),
:mod:`.analysis` (tables, figures and the claims' outcomes).
"""

from __future__ import annotations

from . import analysis, anchors, run
from .analysis import outcomes

__all__ = ["analysis", "anchors", "outcomes", "run"]
