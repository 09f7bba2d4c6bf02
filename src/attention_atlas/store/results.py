"""The results store: experiment records committed under ``results/``, loaded with provenance.

``results/<experiment>/<preset>/`` holds one sweep folder (layout in
:mod:`attention_atlas.store.records`): ``cells/*.json`` (one small record per cell: metrics and
histories, never weights), ``results.csv`` (the grid, one row per cell) and ``grid.json`` (the
experiment, preset, grid parameters, configurations and seeds). ``python -m attention_atlas
sweep NAME --preset P`` writes there; a run may stop at any cell and be resumed, and each
finished cell can be committed as it comes.

Chapters call::

    grid = experiments.stored_or_run("fiber-bundle", params=book_params, seeds=seeds, stored="long")
    grid.frame                     # one row per (config, seed): scalar metrics
    grid.records[("fbt", 0)]       # the whole record (histories, params, provenance)
    print(grid.provenance.text)    # "stored results of `python -m ...`, commit abc1234, ..."

which loads ``results/fiber-bundle/long`` when every cell of its grid is there, and otherwise
runs the chapter's own grid (:mod:`attention_atlas.sweep.stored`, one layer up: running is the
runner's). :func:`load_grid` loads a stored grid alone; ``results verify``
(:mod:`attention_atlas.sweep.verify`) re-runs stored cells and checks that they reproduce.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from attention_atlas.provenance import Provenance

from .records import (
    CellLocks,
    canonical,
    cell_key,
    config_hash,
    load_record,
    make_cells,
    write_atomic,
)

__all__ = [
    "Grid",
    "IncompleteGrid",
    "Provenance",
    "grid_from_folder",
    "load_grid",
    "check_manifest",
    "read_manifest",
    "results_root",
    "store_dir",
    "update_manifest",
]


def results_root() -> Path:
    """``$ATTENTION_ATLAS_RESULTS``, else ``results/`` of the source checkout."""
    env = os.environ.get("ATTENTION_ATLAS_RESULTS")
    return Path(env) if env else Path(__file__).resolve().parents[3] / "results"


def store_dir(experiment: str, preset: str, root: str | os.PathLike[str] | None = None) -> Path:
    """``<root>/<experiment>/<preset>``: where the store (default :func:`results_root`) keeps
    that grid."""
    return (Path(root) if root is not None else results_root()) / experiment / preset


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """``folder/grid.json``, None when there is none; :class:`~.records.DamagedRecord` naming
    it when it cannot be read."""
    from .records import DamagedRecord

    path = folder / "grid.json"
    if not path.exists():
        return None
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DamagedRecord(f"{path}: not a readable grid manifest ({err})") from None
    if not isinstance(manifest, dict) or not {"experiment", "seeds", "configs"} <= set(manifest):
        raise DamagedRecord(f"{path}: not a grid manifest (no experiment, seeds and configs)")
    return dict(manifest)


def check_manifest(
    folder: str | os.PathLike[str], configs: Mapping[str, Mapping[str, Any]]
) -> None:
    """Refuse (ValueError) a grid ``configs`` that ``folder``'s ``grid.json`` does not admit: one
    that removes or changes a configuration stored there (adding configurations is fine).
    Reads only: :func:`update_manifest` writes the manifest once a cell is stored."""
    folder = Path(folder)
    old = read_manifest(folder)
    if old is None:
        return
    new_configs = {k: canonical(v) for k, v in configs.items()}
    diff = [d for d in _grid_differences(old["configs"], new_configs) if not d.endswith(" added")]
    if diff:
        raise ValueError(
            f"{folder} holds another grid of {old['experiment']} ({'; '.join(diff[:5])}); "
            "run into another folder (--out) or clear this one"
        )


def update_manifest(
    folder: str | os.PathLike[str],
    *,
    experiment: str,
    preset: str,
    params: Mapping[str, Any],
    configs: Mapping[str, Mapping[str, Any]],
    seeds: Sequence[int],
) -> dict[str, Any]:
    """Record the grid of ``folder`` in ``grid.json`` (the runner does once the grid's first cell
    is stored, so a run that fails before leaves no manifest): the seeds are added to those there, and
    so are configurations (a grid may grow: a stored cell's key is its configuration's hash,
    so every stored cell stays valid); a folder whose grid has a configuration this one
    removes or changes is refused."""
    folder = Path(folder)
    (folder / "cells").mkdir(parents=True, exist_ok=True)
    locks = CellLocks(folder, stale_after=60.0, heartbeat=10.0)
    deadline = time.monotonic() + 60
    while not locks.try_acquire("grid"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{folder / 'grid.lock'} held for over a minute")
        time.sleep(0.2)
    try:
        check_manifest(folder, configs)
        old = read_manifest(folder)
        new_configs = {k: canonical(v) for k, v in configs.items()}
        if old is not None:
            seeds = sorted({*old["seeds"], *map(int, seeds)})
        manifest = {"experiment": experiment, "preset": preset, "params": canonical(params),
                    "seeds": sorted(map(int, seeds)), "configs": new_configs}  # fmt: skip
        write_atomic(folder / "grid.json", json.dumps(manifest, indent=1) + "\n")
        return manifest
    finally:
        locks.close()


def _grid_differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    out = [
        f"configuration {k} {'removed' if k in old else 'added'}"
        for k in sorted(set(old) ^ set(new))
    ]
    for k in sorted(set(old) & set(new)):
        if config_hash(old[k]) != config_hash(new[k]):
            flat_old, flat_new = _flatten(old[k]), _flatten(new[k])
            keys = sorted(
                p for p in set(flat_old) | set(flat_new) if flat_old.get(p) != flat_new.get(p)
            )
            out.append(
                f"{k}: "
                + ", ".join(f"{p} {flat_old.get(p)} -> {flat_new.get(p)}" for p in keys[:3])
            )
    return out


def _flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(obj, Mapping):
        return {k2: v2 for k, v in obj.items() for k2, v2 in _flatten(v, f"{prefix}{k}.").items()}
    return {prefix.rstrip("."): obj}


# ----------------------------------------------------------------------------------------
# loading, with provenance
# ----------------------------------------------------------------------------------------


class IncompleteGrid(LookupError):
    """A stored grid lacks some of the cells asked for."""


@dataclass
class Grid:
    """A grid's results: ``frame`` (one row per cell, scalar metrics), ``records`` (``(config,
    seed) ->`` whole record), ``provenance``, and the ``missing`` cells."""

    frame: pd.DataFrame
    records: dict[tuple[str, int], dict[str, Any]]
    provenance: Provenance
    missing: list[tuple[str, int]] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not self.missing


def grid_from_folder(
    folder: str | os.PathLike[str], configs: Mapping[str, Mapping[str, Any]], seeds: Sequence[int],
    *, source: str, experiment: str, preset: str, skip_damaged: bool = False,
) -> Grid:  # fmt: skip
    """The records of ``configs x seeds`` found in ``folder`` (a sweep folder). A record that
    cannot be read or fails its checksum raises :class:`~.records.DamagedRecord` naming it, or
    with ``skip_damaged`` is warned about and counted missing."""
    from .records import DamagedRecord, records_frame

    records, missing = {}, []
    for cell in make_cells(configs, seeds):
        path = Path(folder) / "cells" / f"{cell_key(cell)}.json"
        try:
            if path.exists():
                records[(cell.config, cell.seed)] = load_record(path)
                continue
        except DamagedRecord as err:
            if not skip_damaged:
                raise
            warnings.warn(f"{err}; skipped", RuntimeWarning, stacklevel=2)
        missing.append((cell.config, cell.seed))
    recs = list(records.values())
    prov = Provenance.from_records(recs, source=source, experiment=experiment, preset=preset,
                                   folder=folder)  # fmt: skip
    return Grid(records_frame(recs), records, prov, missing)


def load_grid(
    experiment: str,
    preset: str,
    configs: Mapping[str, Mapping[str, Any]] | None = None,
    seeds: Sequence[int] | None = None,
    *,
    root: str | os.PathLike[str] | None = None,
    complete: bool = True,
    skip_damaged: bool = False,
) -> Grid:
    """The stored grid ``results/<experiment>/<preset>`` (``root``: another store than results/).

    ``configs`` and ``seeds`` default to those of its ``grid.json``. Raises FileNotFoundError
    when nothing is stored there, and :class:`IncompleteGrid` when a cell is missing (unless
    ``complete=False``: then the grid has what is there and ``missing`` lists the rest).
    ``skip_damaged``: see :func:`grid_from_folder`.
    """
    folder = store_dir(experiment, preset, root)
    manifest = read_manifest(folder)
    if manifest is None and (configs is None or seeds is None):
        raise FileNotFoundError(
            f"no stored grid of {experiment} preset {preset}: no {folder / 'grid.json'}"
        )
    configs = configs if configs is not None else manifest["configs"]  # type: ignore[index]
    seeds = seeds if seeds is not None else manifest["seeds"]  # type: ignore[index]
    grid = grid_from_folder(
        folder,
        configs,
        seeds,
        source="stored",
        experiment=experiment,
        preset=preset,
        skip_damaged=skip_damaged,
    )
    if complete and grid.missing:
        (c, s), n = grid.missing[0], len(grid.missing)
        raise IncompleteGrid(
            f"{folder}: {n} of {n + len(grid.records)} cells missing (e.g. {c} seed {s}); resume "
            f"with: python -m attention_atlas sweep {experiment} --preset {preset} --seeds "
            + " ".join(map(str, seeds))
        )
    return grid
