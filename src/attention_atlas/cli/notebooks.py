"""The ``notebooks`` command: ``notebooks run [--smoke] [NAME ...] [--out DIR] [-p k=v]`` and
``notebooks list``."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from attention_atlas.notebooks.chapters import (
    chapter_parameters,
    chapter_smoke,
    parse_override,
    read_chapter,
    tagged_cells,
)
from attention_atlas.notebooks.chapters import chapters as chapter_paths
from attention_atlas.notebooks.runner import run_chapters
from attention_atlas.validate import ConfigError, check_output_path

__all__ = ["add_subcommand"]


def _cmd_run(args: argparse.Namespace) -> int:
    if args.jobs < 1:
        raise ConfigError(f"--jobs: expected an integer >= 1, got {args.jobs}")
    if args.timeout is not None and not 0 < args.timeout < math.inf:
        raise ConfigError(f"--timeout: expected a number of seconds > 0, got {args.timeout}")
    if args.out:
        check_output_path(args.out, "--out", folder=True)
    overrides = dict(parse_override(t) for t in args.param)
    try:
        results = run_chapters(
            args.names or None,
            smoke=args.smoke,
            out_dir=Path(args.out) if args.out else None,
            overrides=overrides,
            jobs=args.jobs,
            timeout=args.timeout,
            progress_bar=not args.quiet,
        )
    except FileNotFoundError as err:  # an unknown chapter
        raise ConfigError(str(err)) from None
    failed = 0
    for r in results:
        if r.ok:
            print(f"ok      {r.chapter}  {r.seconds:6.1f} s  -> {r.output}")
        else:
            failed += 1
            print(f"FAILED  {r.chapter}\n{r.error}", file=sys.stderr)
    if failed:
        print(f"{failed} of {len(results)} chapter(s) failed", file=sys.stderr)
        return 1
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    for p in chapter_paths():
        nb = read_chapter(p)
        print(f"{p.stem}")
        smoke = chapter_smoke(p, nb) if tagged_cells(nb, "smoke") else {}
        for k, v in chapter_parameters(p, nb).items():
            extra = f"   (smoke: {smoke[k]!r})" if k in smoke else ""
            print(f"    {k} = {v!r}{extra}")
    return 0


def add_subcommand(subparsers: Any) -> None:
    """Register ``notebooks {run,list}`` on an argparse subparsers object."""
    p = subparsers.add_parser("notebooks", help="run the book's chapters headlessly")
    sub = p.add_subparsers(dest="notebooks_command", required=True)
    run = sub.add_parser(
        "run",
        help="execute chapters with papermill and write the executed .ipynb",
        description="Execute chapters (default: every notebooks/*.py) and write executed "
        "notebooks to --out (default _build/executed/{smoke,book}/).",
    )
    run.add_argument("names", nargs="*", metavar="NAME", help="chapter stem or path")
    run.add_argument("--smoke", action="store_true", help="inject the chapter's SMOKE values")
    run.add_argument("--out", metavar="DIR", help="folder for the executed notebooks")
    run.add_argument(
        "-p",
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a parameter (value parsed as a Python literal); repeatable",
    )
    run.add_argument("-j", "--jobs", type=int, default=1, help="chapters run at once")
    run.add_argument("--timeout", type=float, default=None, help="seconds allowed per cell")
    run.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    run.set_defaults(func=_cmd_run)
    ls = sub.add_parser("list", help="list chapters with their parameters and smoke values")
    ls.set_defaults(func=_cmd_list)
