"""``python -m attention_atlas results list | show | verify``: the results store
(:mod:`attention_atlas.store.results`) on the command line.

``list`` gives every stored grid: its cells stored out of the grid's, seeds, the commits and
devices that made them, the compute they took, what the missing cells would take ("to go"),
and the cells in flight: started and checkpointed by a runner (``sweep --checkpoint-every``)
that is running them now or was killed, each checkpointed run's step out of its steps (where
the next runner on that folder resumes it). ``show`` gives one grid's provenance and per-configuration means,
``verify`` re-runs stored cells (:func:`attention_atlas.sweep.verify.verify`).

What they show comes from the records, each checked against its checksum: a damaged or edited
record is named and skipped with a one-line warning, and a ``results.csv`` that no longer matches
the records (edited, or left behind) is rebuilt from them, with a warning saying so.
"""

from __future__ import annotations

import math
import sys
import warnings
from pathlib import Path
from typing import Any

import pandas as pd

from attention_atlas.experiments import verify
from attention_atlas.provenance import format_duration
from attention_atlas.store.records import DamagedRecord, write_csv
from attention_atlas.store.results import Grid, load_grid, read_manifest, results_root, store_dir
from attention_atlas.sweep.verify import RTOL
from attention_atlas.train.resumable import in_flight
from attention_atlas.validate import ConfigError, close_matches

__all__ = ["add_subcommand"]


def _to_go(grid: Grid) -> str:
    """The compute a grid's missing cells would take, each at the mean time of its
    configuration's stored cells (``""`` when complete; cells of configurations with none
    stored yet are counted apart)."""
    if not grid.missing:
        return ""
    mean: Any = grid.frame.groupby("config")["cell_seconds"].mean() if len(grid.frame) else {}
    known = [float(mean[c]) for c, _ in grid.missing if c in mean]
    unknown = len(grid.missing) - len(known)
    text = f"{format_duration(sum(known))}" if known else ""
    return text + (f"{' + ' if text else ''}{unknown} cells not timed yet" if unknown else "")


def _in_flight(folder: Path) -> str:
    """The cells of ``folder`` in flight, as ``name step/steps`` (each checkpointed run), or
    ``""``; a checkpoint that cannot be read shows ``?``."""
    return "; ".join(
        f"{key.rsplit('__', 1)[0]} " + ", ".join(f"{s}/{n}" if s >= 0 else "?" for s, n in runs)
        for key, runs in in_flight(folder).items()
    )


def add_subcommand(subparsers: Any) -> None:
    """Register ``results`` on the command line (see :mod:`attention_atlas.__main__`)."""
    p = subparsers.add_parser("results", help="the stored results: list, show, verify",
                              description="The results store (results/<experiment>/<preset>/).")  # fmt: skip
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    sub.add_parser(
        "list",
        help="every stored grid: cells, seeds, commits, devices, compute time, to go, in flight",
    )
    show = sub.add_parser("show", help="one grid: provenance and per-configuration means")
    show.add_argument("experiment")
    show.add_argument("preset")
    show.add_argument(
        "--columns", nargs="+", default=None, help="metrics to show (default: first 6)"
    )
    ver = sub.add_parser("verify", help="re-run stored cells and check that they reproduce")
    ver.add_argument("--sample", type=int, default=1, help="cells to re-run (default 1)")
    ver.add_argument("--experiment", default=None, help="only this experiment")
    ver.add_argument("--preset", default=None, help="only this preset")
    ver.add_argument("--seed", type=int, default=0, help="seed of the random choice of cells")
    ver.add_argument(
        "--rtol", type=float, default=RTOL, help=f"tolerance off the same CPU (default {RTOL:g})"
    )
    for q in (p, *sub.choices.values()):
        q.set_defaults(func=_cli_results)


def _check(args: Any) -> None:
    """Every argument of ``results`` checked before any work (ConfigError: one line, exit 2)."""
    from attention_atlas.experiments import EXPERIMENTS

    if args.action == "verify":
        if args.sample < 1:
            raise ConfigError(f"--sample: expected an integer >= 1, got {args.sample}")
        if not (math.isfinite(args.rtol) and args.rtol >= 0):
            raise ConfigError(f"--rtol: expected a finite number >= 0, got {args.rtol}")
        if args.experiment is not None and args.experiment not in EXPERIMENTS:
            raise ConfigError(
                f"--experiment: unknown experiment {args.experiment!r}"
                f"{close_matches(args.experiment, EXPERIMENTS)}; known: {', '.join(EXPERIMENTS)}"
            )
    if args.action == "show":
        stored = sorted(
            p.parent.name for p in results_root().glob(f"{args.experiment}/*/grid.json")
        )
        if not stored:
            known = sorted({p.parent.parent.name for p in results_root().glob("*/*/grid.json")})
            raise ConfigError(
                f"unknown experiment {args.experiment!r}{close_matches(args.experiment, known)}; "
                f"stored under {results_root()}: {', '.join(known) or '(none)'}"
            )
        if args.preset not in stored:
            raise ConfigError(
                f"no stored {args.preset!r} grid of {args.experiment}"
                f"{close_matches(args.preset, stored)}; stored: {', '.join(stored)}"
            )


def _cli_results(args: Any) -> int:
    _check(args)
    with warnings.catch_warnings(record=True) as seen:  # damaged records: one line each
        warnings.simplefilter("always", RuntimeWarning)
        code = _results(args)
    for w in seen:
        print(f"warning: {w.message}", file=sys.stderr)
    return code


def _refresh_csv(folder: Path) -> None:
    """Rebuild ``folder/results.csv`` from the records when it no longer matches them (not
    while a record is damaged: that is reported already, and may be restored)."""
    try:
        rebuilt = write_csv(folder, skip_damaged=False)
    except DamagedRecord:
        return
    if rebuilt:
        warnings.warn(f"{folder / 'results.csv'} did not match the records; rebuilt from them",
                      RuntimeWarning, stacklevel=2)  # fmt: skip


def _results(args: Any) -> int:
    if args.action == "verify":
        outcomes = verify(args.sample, experiment=args.experiment, preset=args.preset,
                          rtol=args.rtol, seed=args.seed)  # fmt: skip
        counts = {
            s: sum(o.status == s for o in outcomes)
            for s in ("exact", "close", "differs", "skipped")
        }
        print("[verify] " + ", ".join(f"{n} {s}" for s, n in counts.items()))
        return 1 if counts["differs"] or counts["exact"] + counts["close"] == 0 else 0
    if args.action == "show":
        grid = load_grid(args.experiment, args.preset, complete=False, skip_damaged=True)
        _refresh_csv(store_dir(args.experiment, args.preset))
        print(grid.provenance.text)
        if grid.missing:
            print(f"missing: {len(grid.missing)} cells, e.g. {grid.missing[:3]}")
        if flight := _in_flight(store_dir(args.experiment, args.preset)):
            print(f"in flight (step/steps of their checkpoints, where a runner resumes): {flight}")
        if len(grid.frame):
            skip = {"seed", "cell_seconds"}
            cols = (
                args.columns
                or [c for c in grid.frame.select_dtypes("number").columns if c not in skip][:6]
            )
            table = grid.frame.groupby("config", sort=False)[cols].mean()
            table.insert(0, "seeds", grid.frame.groupby("config", sort=False)["seed"].count())
            print(table.to_string())
        return 0
    rows = []
    for manifest_path in sorted(results_root().glob("*/*/grid.json")):
        try:
            m = read_manifest(manifest_path.parent) or {}
            g = load_grid(manifest_path.parents[1].name, manifest_path.parent.name,
                          complete=False, skip_damaged=True)  # fmt: skip
        except (DamagedRecord, ValueError, KeyError) as err:
            warnings.warn(f"{manifest_path}: {err}; grid skipped"
                          if str(manifest_path) not in str(err) else f"{err}; grid skipped",
                          RuntimeWarning, stacklevel=1)  # fmt: skip
            continue
        _refresh_csv(manifest_path.parent)
        pv = g.provenance
        rows.append({"experiment": m["experiment"], "preset": manifest_path.parent.name,
                     "cells": f"{pv.n_cells}/{pv.n_cells + len(g.missing)}", "seeds": len(m["seeds"]),
                     "commits": " ".join(pv.commits), "devices": "; ".join(pv.devices),
                     "compute": format_duration(pv.compute_seconds), "to go": _to_go(g),
                     "in flight": _in_flight(manifest_path.parent)})  # fmt: skip
    print(
        pd.DataFrame(rows).to_string(index=False)
        if rows
        else f"nothing stored under {results_root()}"
    )
    return 0
