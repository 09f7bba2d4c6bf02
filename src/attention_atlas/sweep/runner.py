"""The resumable runner of experiment grids: (configuration x seed) cells on a local process pool
or a Dask cluster, one JSON record per finished cell.

A sweep is a list of :class:`Cell` (a configuration name, its parameters, a seed) run by a
function ``run_cell(params, seed) -> dict`` that returns metrics (numbers or strings; dicts and
lists, such as a training history, are kept in the cell's JSON and left out of the CSV). The
folder layout and record format are in :mod:`attention_atlas.store.records`; an experiment's grid run
from the command line goes to the results store (:mod:`attention_atlas.store.results`).

Every backend produces the same records:

* ``local`` (default): ``workers=1`` runs cells in this process; ``workers=N`` in a pool of N
  processes (spawned, each at ``threads`` torch threads). A worker killed mid-cell breaks the
  pool: the pool is restarted and the cells it was running are retried.
* ``dask``: each cell is a task on a Dask distributed cluster (``address`` of a scheduler
  started with ``dask scheduler``/``dask worker``, or dask-jobqueue on Slurm; without an
  address, a local cluster of ``workers`` processes on 127.0.0.1). A task asks for
  ``CPU=threads`` (and ``GPU=gpus_per_cell``) resources where workers advertise them
  (``dask worker --resources "CPU=8 GPU=1"``). A worker killed mid-cell: the scheduler
  re-runs the task elsewhere.

Cells are idempotent: the key hashes the parameters (:func:`~attention_atlas.store.records.cell_key`),
a finished cell is skipped, and a record is written by the runner only when the whole cell has
returned, atomically and never over another runner's (so a killed worker or runner leaves no
partial record). A runner holds a lock file per cell while it runs it, so two runners on one
folder share the cells and never both run one; a lock whose runner died is taken over.
"""

from __future__ import annotations

import json
import shlex
import shutil
import sys
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import pandas as pd

from attention_atlas.provenance import git_state
from attention_atlas.store.records import (
    MAX_RECORD_BYTES,
    Cell,
    CellLocks,
    cell_key,
    dumps_record,
    jsonable,
    load_record,
    make_cells,
    read_records,
    records_frame,
    seal,
    write_atomic,
    write_csv,
)
from attention_atlas.store.results import check_manifest, store_dir, update_manifest

from .backends import CellRun, WorkerLost, execute_cell, make_backend

__all__ = [
    "Cell", "cell_key", "execute_cell", "experiment_grid", "load_cell", "load_results",
    "make_cells", "run_experiment", "run_sweep", "sweep_command",
]  # fmt: skip


def load_cell(out_dir: str | Path, cell: Cell) -> dict[str, Any]:
    """The full JSON record of a finished cell (metrics, histories, params, provenance)."""
    path = Path(out_dir) / "cells" / f"{cell_key(cell)}.json"
    if not path.exists():
        raise FileNotFoundError(f"cell {cell.config} seed={cell.seed} is not finished: no {path}")
    return load_record(path)


def load_results(out_dir: str | Path, cells: Iterable[Cell] | None = None) -> pd.DataFrame:
    """Finished cells as a DataFrame (one row each; scalar metrics only).

    With ``cells``, only those cells (in that order, missing ones skipped); else every record
    under ``out_dir/cells``."""
    if cells is None:
        return records_frame(read_records(out_dir))
    paths = [Path(out_dir) / "cells" / f"{cell_key(c)}.json" for c in cells]
    return records_frame(load_record(p) for p in paths if p.exists())


# ----------------------------------------------------------------------------------------
# the runner
# ----------------------------------------------------------------------------------------


def run_sweep(
    cells: Sequence[Cell],
    run_cell: Callable[[dict[str, Any], int], dict[str, Any]],
    out_dir: str | Path,
    *,
    resume: bool = True,
    log: Callable[[str], None] | None = print,
    threads: int | None = 1,
    backend: str = "local",
    workers: int = 1,
    address: Any = None,
    gpus_per_cell: int = 0,
    progress: bool | None = None,
    provenance: Mapping[str, Any] | None = None,
    max_attempts: int = 3,
    stale_after: float = 300.0,
    compile: bool = False,
    checkpoint_every: int = 0,
    native: bool = False,
    on_record: Callable[[], None] | None = None,
    redo_before: datetime | None = None,
) -> pd.DataFrame:
    """Run every cell not already finished under ``out_dir``; return all their results.

    Args:
        cells: the sweep (see :func:`make_cells`).
        run_cell: ``(params, seed) -> dict`` of metrics for one cell (a module-level function
            for ``workers > 1`` or ``dask``: it is sent to other processes by reference).
        out_dir: where cells and ``results.csv`` are written (created if missing).
        resume: skip cells whose record exists (False re-runs and overwrites them).
        log: progress printer (None for silence).
        threads: torch intra-op threads per cell (None = leave). One by default: on a shared,
            oversubscribed machine several OpenMP threads per process made small models over
            ten times slower here, and one thread makes CPU results reproducible bit for bit.
        backend, workers, address, gpus_per_cell: where cells run (see the module docstring).
        progress: a tqdm bar on stderr (None: when stderr is a terminal).
        provenance: ``command``, ``experiment``, ``preset`` stored in each record.
        max_attempts: runs of one cell whose worker died before it is given up.
        stale_after: seconds without a heartbeat after which another runner's lock is stale.
        compile: the cells' training steps through ``torch.compile``
            (:func:`~attention_atlas.train.compiled.compiled_training`; not part of a cell's key:
            its record says ``compile``, and ``results verify`` re-runs it compiled).
        checkpoint_every: each cell's training runs checkpoint every this many steps under
            ``out_dir/.checkpoints/<key>`` (git-ignored; removed when the cell returns), and a
            cell killed mid-way resumes from them when run again, to the same result
            (:mod:`~attention_atlas.train.resumable`); 0 (default): none.
        native: the native CPU kernels (:mod:`attention_atlas.native`) at their current level,
            recorded (``native``, ``native_level``) as ``compile`` is.
        on_record: called after each record this runner writes (the experiment runner writes
            its grid manifest on the first).
        redo_before: with ``resume``, a stored record that finished before this time (aware
            datetime) counts as not finished: it is run again, from its checkpoints when a
            killed run left some, and overwritten. A record written since is kept, so the same
            command resumes such a re-run across sessions (``--no-resume`` would start it over).

    Returns:
        The results of ``cells`` (in order), with columns ``config``, ``seed``, ``key``,
        ``cell_seconds`` and the metrics.
    """
    root = Path(out_dir)
    (root / "cells").mkdir(parents=True, exist_ok=True)
    keys = [cell_key(c) for c in cells]
    if len(set(keys)) != len(keys):
        dup = sorted({k for k in keys if keys.count(k) > 1})
        raise ValueError(f"duplicate cells in the sweep: {dup}")
    if workers > 1 or backend != "local":
        if getattr(run_cell, "__module__", "__main__") == "__main__":
            raise ValueError("run_cell must be importable (defined in a module) to run in workers")
    context = {"command": None, "experiment": None, "preset": None, **(provenance or {}),
               **git_state(), "backend": backend}  # fmt: skip
    if redo_before is not None and (not resume or redo_before.tzinfo is None):
        raise ValueError("redo_before: expected a time zone aware datetime and resume=True")
    done = _Done(root, redo_before if resume else None)
    todo = [(c, k) for c, k in zip(cells, keys) if not (resume and done(k))]
    for k in keys:  # this grid's stored records: a damaged one is refused before any work
        if resume and _path(root, k).exists():
            load_record(_path(root, k))
    from tqdm.auto import tqdm

    show = sys.stderr.isatty() if progress is None else progress
    bar = tqdm(total=len(cells), initial=len(cells) - len(todo), disable=not show, unit="cell",
               desc=str(context["experiment"] or root.name), file=sys.stderr)  # fmt: skip

    def say(msg: str) -> None:
        if log is not None:
            with bar.external_write_mode():  # above the bar, which is then drawn again
                log(msg)

    t_all = time.perf_counter()
    locks = CellLocks(root / "cells", stale_after=stale_after, heartbeat=min(30.0, stale_after / 4))
    how = CellRun(threads, compile, checkpoint_every, str(root / ".checkpoints"), native)
    exe = make_backend(backend, workers, address, threads, gpus_per_cell)
    ok = False
    try:
        n_run = _drive(todo, run_cell, exe, locks, root, context, done if resume else None,
                       how, max_attempts, bar, say, on_record)  # fmt: skip
        ok = True
    finally:
        exe.close(abort=not ok)
        locks.close()
        bar.close()
        write_csv(root)
    df = load_results(root, cells)
    say(f"[sweep] {n_run} cell(s) run, {len(cells) - n_run} reused, "
        f"{time.perf_counter() - t_all:.1f} s; results in {root / 'results.csv'}")  # fmt: skip
    return df


def _path(root: Path, key: str) -> Path:
    return root / "cells" / f"{key}.json"


class _Done:
    """Whether a cell's record is stored, and (with ``before``) finished at or after it."""

    def __init__(self, root: Path, before: datetime | None) -> None:
        self.root, self.before = root, before

    def __call__(self, key: str) -> bool:
        path = _path(self.root, key)
        if not path.exists():
            return False
        if self.before is None:
            return True
        finished = (load_record(path).get("provenance") or {}).get("finished")
        return finished is not None and datetime.fromisoformat(finished) >= self.before


def _drive(
    todo: list[tuple[Cell, str]],
    run_cell: Callable[[dict[str, Any], int], dict[str, Any]],
    exe: Any,
    locks: CellLocks,
    root: Path,
    context: dict[str, Any],
    done: Callable[[str], bool] | None,
    how: CellRun,
    max_attempts: int,
    bar: Any,
    say: Callable[[str], None],
    on_record: Callable[[], None] | None = None,
) -> int:
    """Submit cells as capacity allows, write each record as it returns; cells locked by
    another runner wait until it finishes them (or its lock goes stale); ``how`` runs each cell.
    ``done`` says whether a cell is finished (None: re-run every cell, afresh, its checkpoints
    removed; ``--no-resume``). Returns cells run."""

    def finished(key: str) -> bool:
        return done is not None and done(key)

    pending = deque(todo)
    waiting: list[tuple[Cell, str]] = []
    inflight: dict[Any, tuple[Cell, str]] = {}
    attempts: Counter[str] = Counter()
    n_run = 0
    while pending or inflight or waiting:
        while pending and len(inflight) < exe.capacity():
            cell, key = pending.popleft()
            if finished(key):
                bar.update(1)  # another runner finished it
            elif not locks.try_acquire(key):
                waiting.append((cell, key))
            elif finished(key):
                locks.release(key)
                bar.update(1)
            else:
                if (folder := how.folder(key)) is not None and done is None:  # start afresh
                    shutil.rmtree(folder, ignore_errors=True)
                fut = exe.submit(execute_cell, run_cell, cell.params, cell.seed, *how.args(key))
                inflight[fut] = (cell, key)
        if not inflight:
            if waiting:
                time.sleep(0.5)
                pending.extend(waiting)
                waiting.clear()
            continue
        for fut in exe.wait(list(inflight), timeout=1.0):
            cell, key = inflight.pop(fut)
            try:
                out = exe.result(fut)
            except WorkerLost as e:
                locks.release(key)
                attempts[key] += 1
                if attempts[key] >= max_attempts:
                    raise RuntimeError(f"cell {cell.config} seed={cell.seed}: its worker died "
                                       f"{attempts[key]} times ({e})") from e  # fmt: skip
                say(f"[sweep] {cell.config} seed={cell.seed}: worker died, cell retried")
                pending.appendleft((cell, key))
                continue
            except Exception as e:
                raise RuntimeError(f"cell {cell.config} seed={cell.seed} failed: {e!r}") from e
            text = dumps_record(_record(cell, key, out, context))
            if len(text) > MAX_RECORD_BYTES:
                say(f"[sweep] warning: the record of {cell.config} seed={cell.seed} is "
                    f"{len(text) / 1e6:.1f} MB; the results store is for metrics, not weights")  # fmt: skip
            # a re-run (no resume, or a record older than redo_before) replaces the old record;
            # one another runner wrote meanwhile is kept
            written = write_atomic(_path(root, key), text, overwrite=done is None or (
                _path(root, key).exists() and not done(key)))  # fmt: skip
            locks.release(key)
            n_run += int(written)
            if written:  # the table follows each record, so a grid may be committed mid-sweep
                write_csv(root)
            if written and on_record is not None:
                on_record()
            bar.update(1)
            say(f"[sweep] {cell.config} seed={cell.seed}: {out['cell_seconds']:.1f} s "
                f"({n_run}/{len(todo)} to run)")  # fmt: skip
    return n_run


def _record(cell: Cell, key: str, out: dict[str, Any], context: dict[str, Any]) -> dict[str, Any]:
    def iso(t: float) -> str:
        return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds")

    env = out["environment"]
    return seal({
        "config": cell.config, "seed": cell.seed, "key": key, "cell_seconds": out["cell_seconds"],
        **out["metrics"],
        "params": jsonable(cell.params, "params"),
        "provenance": {**context, "started": iso(out["started"]),
                       "finished": iso(out["finished"]), **env},
    })  # fmt: skip


# ----------------------------------------------------------------------------------------
# experiments: an experiment module's grid (the table of experiments by name is one layer up,
# in attention_atlas.experiments; the command line in attention_atlas.cli.sweep)
# ----------------------------------------------------------------------------------------


def experiment_grid(
    mod: ModuleType, preset: str = "book", params: Mapping[str, Any] | None = None
) -> tuple[Any, dict[str, Any], dict[str, dict[str, Any]]]:
    """``(module, grid parameters, grid)`` of the experiment module ``mod`` (its ``NAME``,
    ``PRESETS``, ``chapter_grid`` and ``run_cell``): ``PRESETS[preset]`` updated with
    ``params``, and ``chapter_grid(**those)``."""
    name = mod.NAME
    if preset not in mod.PRESETS:
        raise ValueError(f"unknown preset {preset!r} of {name}; known: {', '.join(mod.PRESETS)}")
    kwargs = {**mod.PRESETS[preset], **(params or {})}
    return mod, kwargs, mod.chapter_grid(**kwargs)


def sweep_command(
    mod: ModuleType,
    preset: str,
    params: Mapping[str, Any],
    seeds: Sequence[int],
    *,
    only: Sequence[str] | None = None,
    out: str | Path | None = None,
    flags: Sequence[str] = (),
) -> str:
    """The ``python -m attention_atlas sweep`` line that runs this grid: ``-p`` for each of
    ``params`` that differs from the preset (or ``chapter_grid``'s default), then ``flags``
    (``compile``, ``native``) as ``--compile``, ``--native``."""
    import inspect

    name = mod.NAME
    base = {k: p.default for k, p in inspect.signature(mod.chapter_grid).parameters.items()}
    base.update(mod.PRESETS.get(preset, {}))
    over = []
    for k, v in params.items():
        if jsonable(v) != jsonable(base.get(k)):
            value = json.dumps(jsonable(v), separators=(",", ":"))
            over.append("-p " + shlex.quote(f"{k}={value}"))
    parts = ["python -m attention_atlas sweep", name, "--preset", preset,
             "--seeds", *map(str, seeds), *over]  # fmt: skip
    if only:
        parts += ["--only", *only]
    if out is not None:
        parts += ["--out", shlex.quote(str(out))]
    return " ".join(parts + [f"--{f}" for f in flags])


def run_experiment(
    mod: ModuleType,
    *,
    preset: str = "book",
    params: Mapping[str, Any] | None = None,
    seeds: Sequence[int] = (0, 1, 2),
    only: Sequence[str] | None = None,
    out_dir: str | Path | None = None,
    command_out: bool = True,
    **sweep_kwargs: Any,
) -> pd.DataFrame:
    """Run the experiment module ``mod``'s grid (``PRESETS[preset]`` updated with ``params``) over
    ``seeds`` into ``out_dir`` (default the results store, ``results/<name>/<preset>``),
    recording the grid in ``grid.json``; ``sweep_kwargs`` go to :func:`run_sweep`. The records'
    command names ``--out`` when it is not the default (and ``command_out``)."""
    name = mod.NAME
    _, kwargs, grid = experiment_grid(mod, preset, params)
    run = grid
    if only:
        unknown = sorted(set(only) - set(grid))
        if unknown:
            raise ValueError(f"unknown configuration(s) {unknown}; known: {', '.join(grid)}")
        run = {k: v for k, v in grid.items() if k in only}
    out = Path(out_dir) if out_dir is not None else store_dir(name, preset)
    default_out = out_dir is None or out.resolve() == store_dir(name, preset).resolve()
    command = sweep_command(mod, preset, kwargs, seeds, only=only,
                            out=None if default_out or not command_out else out_dir,
                            flags=[f for f in ("compile", "native") if sweep_kwargs.get(f)])  # fmt: skip
    check_manifest(out, grid)  # another grid in the folder: refused before any cell runs
    written: list[bool] = []

    def record_grid() -> None:  # once a cell of this grid is stored (not before: no phantom)
        if not written:
            update_manifest(out, experiment=name, preset=preset, params=kwargs, configs=grid,
                            seeds=seeds)  # fmt: skip
            written.append(True)

    prov = {"command": command, "experiment": name, "preset": preset}
    df = run_sweep(make_cells(run, seeds), mod.run_cell, out, provenance=prov,
                   on_record=record_grid, **sweep_kwargs)  # fmt: skip
    if len(df):  # every cell was stored before: the manifest still learns these seeds
        record_grid()
    return df
