"""A resumable sweep runner: (configuration x seed) cells -> one JSON per cell + a results CSV.

A sweep is a list of :class:`Cell` (a configuration name, its parameters, a seed). Each cell is
run by a function ``run_cell(params, seed) -> dict`` that returns flat metrics (numbers or
strings; a value that is a dict or list is stored in the cell's JSON but left out of the CSV).
Results go under ``out_dir``::

    out_dir/cells/<config>__seed<seed>__<hash>.json   one per finished cell
    out_dir/results.csv                               every finished cell, one row each

The hash covers the parameters, so changing any parameter makes a new cell rather than reusing
a stale result; a finished cell (its JSON exists) is skipped, so a killed sweep restarts where it
stopped. Cells are written atomically (temporary file then rename).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch

__all__ = [
    "EXPERIMENTS",
    "Cell",
    "add_subcommand",
    "cell_key",
    "load_cell",
    "load_results",
    "make_cells",
    "run_sweep",
]

from .experiments import EXPERIMENTS, experiment


@dataclass(frozen=True)
class Cell:
    """One run of a sweep: configuration ``config`` with ``params``, at ``seed``."""

    config: str
    seed: int
    params: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def cell_key(cell: Cell) -> str:
    """File stem of a cell: ``<config>__seed<seed>__<10 hex of the parameters' sha1>``."""
    h = hashlib.sha1(_canonical(cell.params).encode()).hexdigest()[:10]
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in cell.config)
    return f"{safe}__seed{cell.seed}__{h}"


def make_cells(configs: dict[str, dict[str, Any]], seeds: Sequence[int]) -> list[Cell]:
    """Every ``(config, seed)`` pair, seeds innermost (so a partial sweep covers configs evenly
    only if it finishes; order is config-major to keep a configuration's seeds together)."""
    return [Cell(name, int(s), dict(p)) for name, p in configs.items() for s in seeds]


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(path.suffix + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1, default=float))
    os.replace(tmp, path)


def load_cell(out_dir: str | os.PathLike[str], cell: Cell) -> dict[str, Any]:
    """The full JSON record of a finished cell (metrics, and any dicts or lists it stored)."""
    path = Path(out_dir) / "cells" / f"{cell_key(cell)}.json"
    if not path.exists():
        raise FileNotFoundError(f"cell {cell.config} seed={cell.seed} is not finished: no {path}")
    return dict(json.loads(path.read_text()))


def load_results(
    out_dir: str | os.PathLike[str], cells: Iterable[Cell] | None = None
) -> pd.DataFrame:
    """Finished cells as a DataFrame (one row each; scalar metrics only).

    With ``cells``, only those cells (in that order, missing ones skipped); else every JSON
    under ``out_dir/cells``.
    """
    root = Path(out_dir) / "cells"
    if cells is None:
        paths = sorted(root.glob("*.json"))
    else:
        paths = [root / f"{cell_key(c)}.json" for c in cells]
    rows = []
    for p in paths:
        if not p.exists():
            continue
        rec = json.loads(p.read_text())
        rows.append({k: v for k, v in rec.items() if not isinstance(v, dict | list)})
    return pd.DataFrame(rows)


def run_sweep(
    cells: Sequence[Cell],
    run_cell: Callable[[dict[str, Any], int], dict[str, Any]],
    out_dir: str | os.PathLike[str],
    *,
    resume: bool = True,
    log: Callable[[str], None] | None = print,
    threads: int | None = 1,
) -> pd.DataFrame:
    """Run every cell not already finished under ``out_dir``; return all their results.

    Args:
        cells: the sweep (see :func:`make_cells`).
        run_cell: ``(params, seed) -> dict`` of metrics for one cell.
        out_dir: where cells and ``results.csv`` are written (created if missing).
        resume: skip cells whose JSON exists (False re-runs and overwrites them).
        log: progress printer (None for silence).
        threads: torch intra-op threads while the sweep runs (restored after; None = leave).
            One thread by default: on a shared, oversubscribed machine several OpenMP threads
            per process made small models over ten times slower here.

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
    t_all = time.perf_counter()
    n_run = 0
    threads_before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        n_run = _run_cells(cells, keys, run_cell, root, resume, log)
    finally:
        torch.set_num_threads(threads_before)
    df = load_results(root, cells)
    load_results(root).to_csv(root / "results.csv", index=False)
    if log is not None:
        log(
            f"[sweep] {n_run} cell(s) run, {len(cells) - n_run} reused, "
            f"{time.perf_counter() - t_all:.1f} s; results in {root / 'results.csv'}"
        )
    return df


def _run_cells(
    cells: Sequence[Cell],
    keys: list[str],
    run_cell: Callable[[dict[str, Any], int], dict[str, Any]],
    root: Path,
    resume: bool,
    log: Callable[[str], None] | None,
) -> int:
    n_run = 0
    for i, (cell, key) in enumerate(zip(cells, keys)):
        path = root / "cells" / f"{key}.json"
        if resume and path.exists():
            continue
        t0 = time.perf_counter()
        metrics = run_cell(dict(cell.params), cell.seed)
        dt = time.perf_counter() - t0
        rec = {
            "config": cell.config,
            "seed": cell.seed,
            "key": key,
            "cell_seconds": dt,
            **metrics,
            "params": cell.params,
        }
        _write_json(path, rec)
        n_run += 1
        if log is not None:
            log(f"[sweep] {i + 1}/{len(cells)} {cell.config} seed={cell.seed}: {dt:.1f} s")
    return n_run


def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def add_subcommand(subparsers: Any) -> None:
    """Register ``sweep`` on the command line (see :mod:`attention_atlas.__main__`)."""
    p = subparsers.add_parser(
        "sweep",
        help="run an experiment grid over seeds (resumable), results under artifacts/",
        description=(
            "Run every (configuration, seed) cell of an experiment grid that is not finished yet; "
            "write one JSON per cell and results.csv. Example: python -m attention_atlas sweep "
            "fiber-bundle --preset book --seeds 0 1 2 --out artifacts/fiber_bundle/book"
        ),
    )
    p.add_argument("experiment", choices=sorted(EXPERIMENTS), help="which experiment grid")
    p.add_argument(
        "--preset", default="book", help="named parameter set of the grid (book, smoke, long)"
    )
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds (default 0 1 2)")
    p.add_argument(
        "--out", default=None, help="output folder (default artifacts/<experiment>/<preset>)"
    )
    p.add_argument("--only", nargs="+", default=None, help="run only these configurations")
    p.add_argument(
        "-p", "--param", dest="params", action="append", default=[], metavar="KEY=VALUE",
        help="override a grid parameter (JSON value), e.g. -p steps=500 -p ablations=true",
    )  # fmt: skip
    p.add_argument("--no-resume", action="store_true", help="re-run finished cells")
    p.set_defaults(func=_cli_sweep)


def _cli_sweep(args: Any) -> int:
    import inspect

    from .validate import ConfigError, close_matches

    def checked() -> tuple[Any, dict[str, Any], dict[str, Any], str]:
        """The experiment module, its grid parameters, the grid and the output folder; every
        argument checked before any cell runs (ConfigError, one line, exit 2)."""
        mod = experiment(args.experiment)
        if args.preset not in mod.PRESETS:
            raise ConfigError(
                f"--preset: unknown preset {args.preset!r}{close_matches(args.preset, mod.PRESETS)}"
                f" of {args.experiment}; known: {', '.join(mod.PRESETS)}"
            )
        if any(s < 0 for s in args.seeds) or len(set(args.seeds)) != len(args.seeds):
            raise ConfigError(f"--seeds: expected distinct integers >= 0, got {args.seeds}")
        kwargs = dict(mod.PRESETS[args.preset])
        params = inspect.signature(mod.chapter_grid).parameters
        open_ended = any(p.kind == p.VAR_KEYWORD for p in params.values())
        for item in args.params:
            key, sep, val = item.partition("=")
            if not sep or not key:
                raise ConfigError(f"-p {item!r} must look like key=value (e.g. -p steps=500)")
            if not open_ended and key not in params:
                raise ConfigError(
                    f"-p: {args.experiment} has no grid parameter {key!r}"
                    f"{close_matches(key, params)}; it has: {', '.join(params)}"
                )
            kwargs[key] = _parse_value(val)
        try:
            grid = mod.chapter_grid(**kwargs)
        except (TypeError, ValueError) as err:
            raise ConfigError(f"{args.experiment} grid ({args.preset}, -p): {err}") from None
        unknown = sorted(set(args.only or ()) - set(grid))
        if unknown:
            raise ConfigError(
                f"--only: unknown configuration(s) {unknown}; known: {', '.join(grid)}"
            )
        out = args.out or str(Path("artifacts") / args.experiment / args.preset)
        if Path(out).is_file():
            raise ConfigError(f"--out: {out} is a file, expected a folder")
        return mod, kwargs, grid, out

    mod, kwargs, grid, out = checked()
    if args.only:
        grid = {k: v for k, v in grid.items() if k in args.only}
    print(f"sweep {args.experiment} preset={args.preset} {kwargs}: {len(grid)} configurations "
          f"x {len(args.seeds)} seeds -> {out}")  # fmt: skip
    run_sweep(make_cells(grid, args.seeds), mod.run_cell, out, resume=not args.no_resume)
    return 0
