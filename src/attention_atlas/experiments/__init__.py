"""The chapters' experiments, one module per experiment, each run by the one sweep runner.

An experiment module defines::

    NAME: str                                     # its name on the command line and in results/
    PRESETS: dict[str, dict]                      # named grid parameters: "smoke", "book", "long", ...
    def chapter_grid(**params) -> dict[str, dict] # configuration name -> its parameters
    def run_cell(params: dict, seed: int) -> dict # one (configuration, seed) cell -> its metrics
    def check_cell(params: dict) -> None          # ConfigError (one line) for what run_cell would
                                                  # refuse: the same TrainConfig/ModelConfig checks

and usually the analysis its chapter shows. ``python -m attention_atlas sweep NAME`` runs the
grid of :data:`EXPERIMENTS` ``[NAME]`` (resumable; see :mod:`attention_atlas.sweep.runner`).

The sweep runner works on experiment modules and knows none by name; this table is where names
are resolved, so :func:`stored_or_run`, :func:`run_experiment`, :func:`sweep_command` and
:func:`verify` here take a name (or a module) and hand the module down.

Each family of a chapter is a subpackage (``atlas``, the report on a variant of your own; ``fiber_bundle``, ``matroidal``, ``cofactor``,
``zoo``, ``sma``, ``rank_collapse``, ``low_rank``, ``performance``) whose parts import only
downward: the specification and one cell's run (``run``), then analysis and figures, then
verdicts; its ``__init__`` is its front.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any

import pandas as pd

from attention_atlas.store.results import Grid
from attention_atlas.sweep import runner as _runner
from attention_atlas.sweep import stored as _stored
from attention_atlas.sweep import verify as _verify

__all__ = [
    "EXPERIMENTS",
    "experiment",
    "run_experiment",
    "stored_or_run",
    "sweep_command",
    "verify",
]

#: experiment name (as on the command line) -> module
EXPERIMENTS: dict[str, str] = {
    "atlas": "attention_atlas.experiments.atlas.run",
    "cofactor": "attention_atlas.experiments.cofactor.run",
    "fiber-bundle": "attention_atlas.experiments.fiber_bundle.run",
    "matroidal": "attention_atlas.experiments.matroidal.run",
    "claims": "attention_atlas.experiments.register",
    "rank-collapse": "attention_atlas.experiments.rank_collapse.run",
    "ssd-scaling": "attention_atlas.experiments.sma.scaling",
    "ssm-lm": "attention_atlas.experiments.sma.lm",
    "toy": "attention_atlas.experiments.toy",
    "zoo": "attention_atlas.experiments.zoo.run",
}


def experiment(name: str | ModuleType) -> ModuleType:
    """The module of experiment ``name`` (see :data:`EXPERIMENTS`); a module is returned as it
    is."""
    if isinstance(name, ModuleType):
        return name
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; known: {', '.join(sorted(EXPERIMENTS))}")
    return importlib.import_module(EXPERIMENTS[name])


def stored_or_run(name: str | ModuleType, **kwargs: Any) -> Grid:
    """:func:`attention_atlas.sweep.stored.stored_or_run` of experiment ``name``: the stored
    grid when complete, else the grid run now (``params``, ``preset``, ``seeds``, ``stored``,
    ``use_stored``, ``out_dir``, ``log`` and the runner's options)."""
    return _stored.stored_or_run(experiment(name), **kwargs)


def run_experiment(name: str | ModuleType, **kwargs: Any) -> pd.DataFrame:
    """:func:`attention_atlas.sweep.runner.run_experiment` of experiment ``name``."""
    return _runner.run_experiment(experiment(name), **kwargs)


def sweep_command(
    name: str | ModuleType, preset: str, params: Mapping[str, Any], seeds: Sequence[int],
    **kwargs: Any,
) -> str:  # fmt: skip
    """The ``python -m attention_atlas sweep`` line of a grid of experiment ``name``
    (:func:`attention_atlas.sweep.runner.sweep_command`)."""
    return _runner.sweep_command(experiment(name), preset, params, seeds, **kwargs)


def verify(sample: int = 1, **kwargs: Any) -> list[_verify.Verified]:
    """:func:`attention_atlas.sweep.verify.verify`: re-run ``sample`` stored cells, each by the
    experiment its record names."""
    return _verify.verify(sample, resolve=experiment, **kwargs)
