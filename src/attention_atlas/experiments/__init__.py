"""The chapters' experiments, one module per experiment, each run by the one sweep runner.

An experiment module defines::

    PRESETS: dict[str, dict]                      # named grid parameters: "smoke", "book", "long", ...
    def chapter_grid(**params) -> dict[str, dict] # configuration name -> its parameters
    def run_cell(params: dict, seed: int) -> dict # one (configuration, seed) cell -> its metrics

and usually the analysis its chapter shows. ``python -m attention_atlas sweep NAME`` runs the
grid of :data:`EXPERIMENTS` ``[NAME]`` (resumable; see :mod:`attention_atlas.sweep`).
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["EXPERIMENTS", "experiment"]

#: experiment name (as on the command line) -> module
EXPERIMENTS: dict[str, str] = {
    "cofactor": "attention_atlas.experiments.cofactor",
    "fiber-bundle": "attention_atlas.experiments.fiber_bundle",
    "matroidal": "attention_atlas.experiments.matroidal",
    "rank-collapse": "attention_atlas.experiments.rank_collapse",
    "ssd-scaling": "attention_atlas.experiments.ssd_scaling",
    "ssm-lm": "attention_atlas.experiments.ssm_lm",
    "toy": "attention_atlas.experiments.toy",
    "zoo": "attention_atlas.experiments.zoo",
}


def experiment(name: str) -> ModuleType:
    """The module of experiment ``name`` (see :data:`EXPERIMENTS`)."""
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; known: {', '.join(sorted(EXPERIMENTS))}")
    return importlib.import_module(EXPERIMENTS[name])
