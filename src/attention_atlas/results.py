"""The results store: experiment records committed under ``results/``, loaded with provenance.

``results/<experiment>/<preset>/`` holds one sweep folder (layout in
:mod:`attention_atlas.records`): ``cells/*.json`` (one small record per cell: metrics and
histories, never weights), ``results.csv`` (the grid, one row per cell) and ``grid.json`` (the
experiment, preset, grid parameters, configurations and seeds). ``python -m attention_atlas
sweep NAME --preset P`` writes there; a run may stop at any cell and be resumed, and each
finished cell can be committed as it comes.

Chapters call::

    grid = results.stored_or_run("fiber-bundle", params=book_params, seeds=seeds, stored="long")
    grid.frame                     # one row per (config, seed): scalar metrics
    grid.records[("fbt", 0)]       # the whole record (histories, params, provenance)
    print(grid.provenance.text)    # "stored results of `python -m ...`, commit abc1234, ..."

which loads ``results/fiber-bundle/long`` when every cell of its grid is there, and otherwise
runs the chapter's own grid. :func:`load_grid` loads a stored grid alone; :func:`verify`
re-runs stored cells and checks that they reproduce: exactly when re-run on the same kind of
CPU with the same torch at one thread, else within ``rtol`` (default :data:`RTOL`, for GPU
runs or other hardware). Timings (metrics named ``*_s``, ``*_seconds``, ``*time``,
``*per_s``, or matching an experiment module's ``VOLATILE_METRICS`` patterns) are not compared.
"""

from __future__ import annotations

import fnmatch
import json
import math
import os
import random
import re
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from .provenance import Provenance
from .records import RESERVED, CellLocks, canonical, cell_key, config_hash, make_cells, write_atomic

__all__ = [
    "RTOL",
    "Grid",
    "IncompleteGrid",
    "Provenance",
    "load_grid",
    "results_root",
    "store_dir",
    "stored_or_run",
    "update_manifest",
    "verify",
]

#: relative tolerance of ``results verify`` when the re-run is on other hardware (or a GPU)
RTOL = 1e-3
#: absolute tolerance added to it (values near zero)
ATOL = 1e-6
_VOLATILE = re.compile(r"(^|_)(s|sec|seconds|time)$|per_s$")


def results_root() -> Path:
    """``$ATTENTION_ATLAS_RESULTS``, else ``results/`` of the source checkout."""
    env = os.environ.get("ATTENTION_ATLAS_RESULTS")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "results"


def store_dir(experiment: str, preset: str, root: str | os.PathLike[str] | None = None) -> Path:
    """``<root>/<experiment>/<preset>``: where the store (default :func:`results_root`) keeps
    that grid."""
    return (Path(root) if root is not None else results_root()) / experiment / preset


def _read_manifest(folder: Path) -> dict[str, Any] | None:
    path = folder / "grid.json"
    return dict(json.loads(path.read_text())) if path.exists() else None


def update_manifest(
    folder: str | os.PathLike[str],
    *,
    experiment: str,
    preset: str,
    params: Mapping[str, Any],
    configs: Mapping[str, Mapping[str, Any]],
    seeds: Sequence[int],
) -> dict[str, Any]:
    """Record the grid of ``folder`` in ``grid.json``: the seeds are added to those there, and
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
        old = _read_manifest(folder)
        new_configs = {k: canonical(v) for k, v in configs.items()}
        if old is not None:
            diff = [d for d in _grid_differences(old["configs"], new_configs)
                    if not d.endswith(" added")]  # fmt: skip
            if diff:
                raise ValueError(
                    f"{folder} holds another grid of {old['experiment']} ({'; '.join(diff[:5])}); "
                    "run into another folder (--out) or clear this one"
                )
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
    *, source: str, experiment: str, preset: str,
) -> Grid:  # fmt: skip
    """The records of ``configs x seeds`` found in ``folder`` (a sweep folder)."""
    from .records import records_frame

    records, missing = {}, []
    for cell in make_cells(configs, seeds):
        path = Path(folder) / "cells" / f"{cell_key(cell)}.json"
        if path.exists():
            records[(cell.config, cell.seed)] = json.loads(path.read_text())
        else:
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
) -> Grid:
    """The stored grid ``results/<experiment>/<preset>`` (``root``: another store than results/).

    ``configs`` and ``seeds`` default to those of its ``grid.json``. Raises FileNotFoundError
    when nothing is stored there, and :class:`IncompleteGrid` when a cell is missing (unless
    ``complete=False``: then the grid has what is there and ``missing`` lists the rest).
    """
    folder = store_dir(experiment, preset, root)
    manifest = _read_manifest(folder)
    if manifest is None and (configs is None or seeds is None):
        raise FileNotFoundError(
            f"no stored grid of {experiment} preset {preset}: no {folder / 'grid.json'}"
        )
    configs = configs if configs is not None else manifest["configs"]  # type: ignore[index]
    seeds = seeds if seeds is not None else manifest["seeds"]  # type: ignore[index]
    grid = grid_from_folder(
        folder, configs, seeds, source="stored", experiment=experiment, preset=preset
    )
    if complete and grid.missing:
        (c, s), n = grid.missing[0], len(grid.missing)
        raise IncompleteGrid(
            f"{folder}: {n} of {n + len(grid.records)} cells missing (e.g. {c} seed {s}); resume "
            f"with: python -m attention_atlas sweep {experiment} --preset {preset} --seeds "
            + " ".join(map(str, seeds))
        )
    return grid


def stored_or_run(
    experiment: str,
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
    """The first complete stored grid among ``stored`` (in order), else ``experiment``'s
    ``preset`` grid (``PRESETS[preset]`` updated with ``params``) over ``seeds``, run now into
    ``out_dir`` (a temporary folder if None; finished cells there are reused).

    A stored preset other than ``preset`` (``"long"``, say) is taken whole, as its
    ``grid.json`` describes it. The stored ``preset`` itself counts only if it holds every cell
    of exactly the grid asked for (same configurations, parameters and seeds), so a chapter run
    with other parameters never shows stale results. ``use_stored=False`` (a smoke run) always
    runs. ``sweep_kwargs`` go to :func:`attention_atlas.sweep.run_sweep` (``workers``, ...). The
    returned grid's ``provenance.source`` says which happened, ``provenance.text`` how it was
    made.
    """
    from .sweep import experiment_grid, run_experiment

    _, kwargs, configs = experiment_grid(experiment, preset, params)
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
    run_experiment(experiment, preset=preset, params=kwargs, seeds=seeds, out_dir=out, log=log,
                   command_out=out_dir is not None, **sweep_kwargs)  # fmt: skip
    return grid_from_folder(
        out, configs, seeds, source="computed", experiment=experiment, preset=preset
    )


# ----------------------------------------------------------------------------------------
# verify: re-run stored cells
# ----------------------------------------------------------------------------------------


def _volatile(name: str, patterns: Sequence[str]) -> bool:
    return bool(_VOLATILE.search(name)) or any(fnmatch.fnmatchcase(name, p) for p in patterns)


def compare(
    stored: Any, new: Any, *, rtol: float, atol: float, volatile: Sequence[str] = (), path: str = ""
) -> tuple[list[str], float]:
    """Differences between two JSON values (a stored record's metrics and a re-run's), and the
    largest relative difference of the numbers compared. Numbers agree when ``|new - stored|
    <= atol + rtol |stored|`` (both NaN agree); keys that are timings are skipped."""
    if isinstance(stored, dict) and isinstance(new, dict):
        keys = [k for k in {*stored, *new} if not _volatile(k, volatile)]
        diffs, worst = [], 0.0
        for k in sorted(keys):
            if k not in stored or k not in new:
                diffs.append(
                    f"{path}{k}: only in the {'stored' if k in stored else 're-run'} record"
                )
                continue
            d, w = compare(
                stored[k], new[k], rtol=rtol, atol=atol, volatile=volatile, path=f"{path}{k}."
            )
            diffs += d
            worst = max(worst, w)
        return diffs, worst
    where = path.rstrip(".") or "value"
    if isinstance(stored, list) and isinstance(new, list):
        if len(stored) != len(new):
            return [f"{where}: length {len(stored)} stored, {len(new)} re-run"], math.inf
        bad, worst = [], 0.0
        for i, (a, b) in enumerate(zip(stored, new)):
            d, w = compare(a, b, rtol=rtol, atol=atol, volatile=volatile, path=f"{where}[{i}].")
            bad += d
            worst = max(worst, w)
        more = f" (and {len(bad) - 1} more in {where})" if len(bad) > 1 else ""
        return ([bad[0] + more] if bad else []), worst
    numbers = (int, float)
    if isinstance(stored, numbers) and isinstance(new, numbers) and not isinstance(stored, bool):
        if stored == new or (math.isnan(stored) and math.isnan(new)):
            return [], 0.0
        rel = abs(new - stored) / max(abs(stored), 1e-300)
        ok = abs(new - stored) <= atol + rtol * abs(stored)
        return ([] if ok else [f"{where}: {stored!r} stored, {new!r} re-run"]), rel
    return ([] if stored == new else [f"{where}: {stored!r} stored, {new!r} re-run"]), 0.0


@dataclass
class Verified:
    """The outcome of re-running one stored cell."""

    path: Path
    status: str  #: "exact", "close" (within tolerance), "differs" or "skipped"
    detail: str


def _hide_gpus() -> None:
    os.environ["CUDA_VISIBLE_DEVICES"] = ""


def _rerun(
    run_cell: Any, params: dict[str, Any], seed: int, threads: int, hide_gpus: bool,
    compile: bool = False, native: bool | int = False,
) -> dict[str, Any]:  # fmt: skip
    from .sweep_backends import execute_cell

    if not hide_gpus:
        return execute_cell(run_cell, params, seed, threads, compile, native=native)
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=ctx, initializer=_hide_gpus) as pool:
        return dict(pool.submit(execute_cell, run_cell, params, seed, threads, compile,
                                native=native).result())  # fmt: skip


def _native_level(prov: dict[str, Any]) -> int:
    """The native kernels' level a record was made at: 0 without them, its ``native_level``,
    else 1 (the records made before :data:`attention_atlas.native.LEVEL` existed)."""
    return int(prov.get("native_level", 1)) if prov.get("native") else 0


def verify(
    sample: int = 1,
    *,
    experiment: str | None = None,
    preset: str | None = None,
    rtol: float = RTOL,
    atol: float = ATOL,
    seed: int = 0,
    root: str | os.PathLike[str] | None = None,
    log: Callable[[str], None] | None = print,
) -> list[Verified]:
    """Re-run ``sample`` stored cells (chosen at random with ``seed``; all if fewer) and compare.

    A cell made on the CPU is re-run on the CPU (a GPU here is hidden from it) at its thread
    count; it must reproduce exactly when this CPU model and torch version are those that made
    it (its model name and :func:`~attention_atlas.provenance.cpu_id`: one name can cover
    processors with different vector units; a record made before ``cpu_id`` was stored is held
    to ``rtol``), else within ``rtol``. A cell made on a GPU is re-run on a GPU (skipped without one) and
    must agree within ``rtol``. A cell made with compiled steps (``sweep --compile``) is re-run
    compiled, one made with the native kernels (``sweep --native``) with them, at the level
    that made it (``native_level``; level 1 where the record predates levels).
    """
    import torch

    from .experiments import experiment as experiment_module

    base = Path(root) if root is not None else results_root()
    paths = sorted(base.glob(f"{experiment or '*'}/{preset or '*'}/cells/*.json"))
    if not paths:
        raise FileNotFoundError(
            f"no stored cells under {base} (experiment={experiment}, preset={preset})"
        )
    chosen = sorted(random.Random(seed).sample(paths, min(sample, len(paths))))
    outcomes = []
    for path in chosen:
        rec = json.loads(path.read_text())
        prov = rec.get("provenance", {})
        mod = experiment_module(prov.get("experiment") or path.parents[2].name)
        on_gpu = prov.get("device") == "cuda"
        if on_gpu and not torch.cuda.is_available():
            outcomes.append(Verified(path, "skipped", f"made on {prov.get('gpu')}; no GPU here"))
        else:
            out = _rerun(mod.run_cell, rec["params"], rec["seed"], int(prov.get("threads") or 1),
                         hide_gpus=not on_gpu and torch.cuda.is_available(),
                         compile=bool(prov.get("compile")), native=_native_level(prov))  # fmt: skip
            env = out["environment"]
            exact = not on_gpu and prov.get("threads") == 1 and env["cpu"] == prov.get("cpu") and \
                env["cpu_id"] == prov.get("cpu_id") and \
                env["versions"]["torch"] == prov.get("versions", {}).get("torch")  # fmt: skip
            stored = {k: v for k, v in rec.items() if k not in RESERVED}
            new = json.loads(json.dumps(out["metrics"]))
            diffs, worst = compare(stored, new, rtol=0.0 if exact else rtol, atol=0.0 if exact else atol,
                                   volatile=getattr(mod, "VOLATILE_METRICS", ()))  # fmt: skip
            status = "differs" if diffs else ("exact" if worst == 0 else "close")
            rule = "exactly (same CPU and torch, one thread)" if exact else f"within rtol {rtol:g}"
            detail = (
                "; ".join(diffs[:3])
                if diffs
                else f"reproduced {rule}, largest relative difference {worst:.2g}"
            )
            outcomes.append(Verified(path, status, detail))
        if log is not None:
            log(f"[verify] {path.relative_to(base)}: {outcomes[-1].status}: {outcomes[-1].detail}")
    return outcomes
