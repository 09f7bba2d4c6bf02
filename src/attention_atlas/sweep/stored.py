"""Stored or run: the results a chapter shows, loaded from the results store when a complete
grid is there, else run now by the sweep runner (by name: :func:`attention_atlas.experiments.stored_or_run`)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from attention_atlas.store.results import Grid, IncompleteGrid, grid_from_folder, load_grid

from .runner import experiment_grid, run_experiment

__all__ = ["stored_or_run"]


def stored_or_run(
    mod: ModuleType,
    *,
    params: Mapping[str, Any] | None = None,
    preset: str = "book",
    seeds: Sequence[int] = (0, 1, 2),
    stored: str | Sequence[str] | None = ("long", "book"),
    use_stored: bool = True,
    out_dir: str | os.PathLike[str] | None = None,
    log: Callable[[str], None] | None = print,
    **sweep_kwargs: Any,
) -> Grid:
    """The first complete stored grid among ``stored`` (in order), else the experiment module
    ``mod``'s
    ``preset`` grid (``PRESETS[preset]`` updated with ``params``) over ``seeds``, run now into
    ``out_dir`` (a temporary folder if None; finished cells there are reused).

    A stored preset other than ``preset`` (``"long"``, say) is taken whole, as its
    ``grid.json`` describes it. The stored ``preset`` itself counts only if it holds every cell
    of exactly the grid asked for (same configurations, parameters and seeds), so a chapter run
    with other parameters never shows stale results. ``use_stored=False`` (a smoke run) always
    runs. ``sweep_kwargs`` go to :func:`~attention_atlas.sweep.runner.run_sweep` (``workers``, ...). The
    returned grid's ``provenance.source`` says which happened, ``provenance.text`` how it was
    made.
    """
    experiment = mod.NAME
    _, kwargs, configs = experiment_grid(mod, preset, params)
    names = [stored] if isinstance(stored, str) else list(stored or ())
    for name in names if use_stored else []:
        try:
            if name == preset:
                grid = load_grid(experiment, name, configs, seeds)
            else:
                grid = load_grid(experiment, name)
        except (FileNotFoundError, IncompleteGrid) as e:
            if log is not None:
                log(f"[results] no complete stored {name} grid ({e})")
            continue
        if log is not None:
            log(f"[results] {grid.provenance.text}")
        return grid
    if log is not None:
        log(f"[results] running the {preset} grid of {experiment}")
    out = Path(out_dir) if out_dir is not None else Path(tempfile.mkdtemp(prefix=f"{experiment}-"))
    run_experiment(mod, preset=preset, params=kwargs, seeds=seeds, out_dir=out, log=log,
                   command_out=out_dir is not None, **sweep_kwargs)  # fmt: skip
    return grid_from_folder(
        out, configs, seeds, source="computed", experiment=experiment, preset=preset
    )
