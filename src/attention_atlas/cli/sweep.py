"""``python -m attention_atlas sweep EXPERIMENT``: run an experiment grid over seeds into the
results store, every argument checked before a cell runs (the runner:
:mod:`attention_atlas.sweep.runner`)."""

from __future__ import annotations

import contextlib
import inspect
import json
import math
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from attention_atlas.atomic import FolderInUse, folder_lock
from attention_atlas.experiments import EXPERIMENTS, experiment
from attention_atlas.store.results import store_dir
from attention_atlas.sweep.backends import BACKENDS
from attention_atlas.sweep.runner import run_experiment
from attention_atlas.validate import ConfigError, check_output_path, close_matches

__all__ = ["add_subcommand", "run"]


def _finite(value: Any) -> bool:
    """Whether every number in ``value`` (a parsed ``-p`` value: nested lists and dicts) is
    finite."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return True


def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def add_subcommand(subparsers: Any) -> None:
    """Register ``sweep`` on the command line (see :mod:`attention_atlas.__main__`)."""
    p = subparsers.add_parser(
        "sweep",
        help="run an experiment grid over seeds (resumable; local pool or Dask cluster)",
        description=(
            "Run every (configuration, seed) cell of an experiment grid that is not finished yet; "
            "write one JSON per cell and results.csv, by default into the results store "
            "results/<experiment>/<preset>/. Example: python -m attention_atlas sweep "
            "fiber-bundle --preset long --seeds 0 1 2 3 4 --workers 2"
        ),
    )
    p.add_argument("experiment", choices=sorted(EXPERIMENTS), help="which experiment grid")
    p.add_argument("--preset", default="book", help="the grid's parameter set (book, smoke, long)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds (default 0 1 2)")
    p.add_argument("--out", default=None, help="output folder (default results/EXPERIMENT/PRESET)")
    p.add_argument("--only", nargs="+", default=None, help="run only these configurations")
    p.add_argument(
        "-p", "--param", dest="params", action="append", default=[], metavar="KEY=VALUE",
        help="override a grid parameter (JSON value), e.g. -p steps=500 -p ablations=true",
    )  # fmt: skip
    p.add_argument("--no-resume", action="store_true", help="re-run finished cells")
    p.add_argument("--redo-before", default=None, metavar="TIME",
                   help="re-run (and replace) stored cells that finished before TIME (ISO 8601, "
                        "e.g. 2026-12-07 or 2026-12-07T18:00:00+00:00; UTC when no zone is "
                        "given); cells stored since are kept, so the same command resumes")  # fmt: skip
    p.add_argument("--join", action="store_true",
                   help="share the cells of a sweep of the same grid already running into this "
                        "folder (without it, a folder in use is refused, naming its holder)")  # fmt: skip
    p.add_argument("--checkpoint-every", type=int, default=0, metavar="STEPS",
                   help="checkpoint each cell's training every STEPS steps under OUT/.checkpoints "
                        "so a killed cell resumes where it stopped (default 0: none)")  # fmt: skip
    _add_backend_arguments(p)
    p.set_defaults(func=run)


def _add_backend_arguments(p: Any) -> None:
    g = p.add_argument_group("where cells run")
    g.add_argument("--backend", choices=BACKENDS, default="local",
                   help="local: this machine, no server (default); dask: a Dask cluster")  # fmt: skip
    g.add_argument("--workers", type=int, default=None,
                   help="local processes (local backend, or dask without --address); default 1")  # fmt: skip
    g.add_argument("--address", default=None, metavar="HOST:PORT",
                   help="Dask scheduler address (e.g. tcp://10.0.0.5:8786)")  # fmt: skip
    g.add_argument("--scheduler-file", default=None,
                   help="Dask scheduler file (dask scheduler --scheduler-file ...)")  # fmt: skip
    g.add_argument("--threads", type=int, default=1,
                   help="torch threads per cell, and its CPU request on Dask (default 1)")  # fmt: skip
    g.add_argument("--gpus-per-cell", type=int, default=0, help="GPU request per cell on Dask")
    g.add_argument("--compile", action="store_true",
                   help="training steps through torch.compile (faster on CPU, other rounding)")  # fmt: skip
    g.add_argument("--native", action="store_true", help="native CPU kernels (other rounding)")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: Any) -> int:
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
            if not _finite(kwargs[key]):
                raise ConfigError(f"-p {key}: expected finite numbers, got {val}")
        try:
            grid = mod.chapter_grid(**kwargs)
        except (TypeError, ValueError) as err:
            raise ConfigError(f"{args.experiment} grid ({args.preset}, -p): {err}") from None
        check_cell = getattr(mod, "check_cell", None)  # every experiment of the table has one
        for name, cell_params in grid.items():  # the settings each cell would train with
            try:
                if check_cell is not None:
                    check_cell(cell_params)
            except (TypeError, ValueError) as err:
                raise ConfigError(f"{args.experiment} configuration {name}: {err}") from None
        unknown = sorted(set(args.only or ()) - set(grid))
        if unknown:
            raise ConfigError(
                f"--only: unknown configuration(s) {unknown}; known: {', '.join(grid)}"
            )
        out = args.out or str(store_dir(args.experiment, args.preset))
        check_output_path(out, "--out", folder=True)
        args.redo_before = _redo_before(args.redo_before, args.no_resume)
        return mod, kwargs, grid, out

    mod, kwargs, grid, out = checked()
    if args.only:
        grid = {k: v for k, v in grid.items() if k in args.only}
    print(f"sweep {args.experiment} preset={args.preset} {kwargs}: {len(grid)} configurations "
          f"x {len(args.seeds)} seeds -> {out}")  # fmt: skip
    return _run_cli_sweep(args, kwargs, out)


def _redo_before(text: str | None, no_resume: bool) -> datetime | None:
    """``--redo-before``'s time (UTC when it names no zone), checked (ConfigError, one line)."""
    if text is None:
        return None
    if no_resume:
        raise ConfigError("--redo-before re-runs only older cells: it cannot go with --no-resume, "
                          "which re-runs every cell")  # fmt: skip
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(f"--redo-before: expected an ISO 8601 time such as 2026-12-07 or "
                          f"2026-12-07T18:00:00+00:00, got {text!r}") from None  # fmt: skip
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def _run_cli_sweep(args: Any, kwargs: dict[str, Any], out: str) -> int:
    address = args.address
    if args.backend != "dask" and (address or args.scheduler_file):
        raise ConfigError("--address and --scheduler-file need --backend dask")
    if args.scheduler_file is not None:
        try:
            address = json.loads(Path(args.scheduler_file).read_text())["address"]
        except (OSError, ValueError, KeyError) as e:
            raise ConfigError(
                f"--scheduler-file {args.scheduler_file}: no scheduler address ({e})"
            ) from e
    if args.workers is not None and address is not None:
        raise ConfigError(
            "--workers starts local processes: a cluster at --address runs cells on its own "
            "workers (start more there with dask worker)"
        )
    args.workers = 1 if args.workers is None else args.workers
    for flag, value, least in (("--workers", args.workers, 1), ("--threads", args.threads, 1),
                               ("--gpus-per-cell", args.gpus_per_cell, 0),
                               ("--checkpoint-every", args.checkpoint_every, 0)):  # fmt: skip
        if value < least:
            raise ConfigError(f"{flag} must be at least {least}, got {value}")
    if args.backend == "local" and args.gpus_per_cell:
        raise ConfigError("--gpus-per-cell is a Dask resource request: it needs --backend dask")
    cores = os.cpu_count() or 1
    if address is None and args.workers > cores:  # local processes, or a local Dask cluster
        raise ConfigError(
            f"--workers: {args.workers} processes, but this machine has {cores} cores"
        )
    if address is None and args.threads * args.workers > cores:
        raise ConfigError(
            f"--threads {args.threads} x --workers {args.workers}: more threads than this "
            f"machine's {cores} cores"
        )
    # one writer per folder: a second sweep into it is refused naming the holder, unless it
    # --join's a running sweep (the runners then share the cells through per-cell locks, and a
    # sweep of another grid is refused by the folder's manifest)
    what = f"sweep {args.experiment} --preset {args.preset}"
    with contextlib.ExitStack() as writer:
        if not args.join:
            try:
                writer.enter_context(folder_lock(out, what))
            except FolderInUse as err:
                raise ConfigError(f"--out: {err} (or add --join to share its cells)") from None
        try:
            _run_grid_from_cli(args, kwargs, address)
        except ValueError as e:  # a folder holding another grid, a backend that cannot start
            raise ConfigError(f"sweep {args.experiment}: {e}") from e
    return 0


def _run_grid_from_cli(args: Any, kwargs: dict[str, Any], address: str | None) -> None:
    run_experiment(
        experiment(args.experiment), preset=args.preset, params=kwargs, seeds=args.seeds, only=args.only,
        out_dir=args.out, resume=not args.no_resume, threads=args.threads, backend=args.backend,
        workers=args.workers, address=address, gpus_per_cell=args.gpus_per_cell,
        progress=False if args.no_progress else None, compile=args.compile,
        checkpoint_every=args.checkpoint_every, native=args.native, redo_before=args.redo_before,
    )  # fmt: skip
