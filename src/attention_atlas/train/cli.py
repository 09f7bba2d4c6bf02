"""The ``train`` command: ``python -m attention_atlas train --task T --attention A -o key=value``."""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from .config import build_configs, load_config_file

__all__ = ["add_subcommand"]


def add_subcommand(subparsers: Any) -> None:
    """Register ``train`` on the command line (see :mod:`attention_atlas.__main__`)."""
    p = subparsers.add_parser(
        "train",
        help="train a Transformer on a task",
        description=(
            "Train a Transformer with a chosen attention on a task; prints progress and the final "
            "metrics, writes history.csv and run.json to --out. Example: python -m attention_atlas "
            "train --task ptb-char --attention dot -o steps=2000 -o dim=128 -o n_layers=2"
        ),
    )
    p.add_argument(
        "--task",
        default=None,
        help="ptb-char, ptb-word, wikitext2, wikitext2-char, digits, copy, recall",
    )
    p.add_argument("--attention", default=None, help="registered attention variant (default dot)")
    p.add_argument(
        "--config", default=None, help="JSON or YAML file with model/train/task sections"
    )
    p.add_argument(
        "-o", "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override a model or train setting (repeatable), e.g. -o lr=1e-3 -o n_heads=4",
    )  # fmt: skip
    p.add_argument(
        "--out", default=None, help="output folder (default runs/<task>-<attention>-<time>)"
    )
    p.add_argument(
        "--data-dir", default=None, help="data directory (default $ATTENTION_ATLAS_DATA)"
    )
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    p.set_defaults(func=_cli_train)


def _cli_train(args: argparse.Namespace) -> int:
    from ..data import load_task
    from .loop import train

    config = load_config_file(args.config) if args.config else {}
    task = args.task or config.get("task") or "ptb-char"
    overrides = list(args.overrides)
    if args.attention:
        overrides.insert(0, f"model.attention={args.attention}")
    mcfg, tcfg, task_opts = build_configs(config, overrides)
    out = (
        args.out
        or tcfg.out_dir
        or str(Path("runs") / f"{task}-{mcfg.attention}-{time.strftime('%Y%m%d-%H%M%S')}")
    )
    tcfg = replace(tcfg, out_dir=out)
    data = load_task(task, args.data_dir, **task_opts)
    rank = int(os.environ.get("RANK", "0"))
    if rank == 0:
        print(f"task {task}: {data!r}", file=sys.stderr)
    res = train(mcfg, tcfg, data, resume=args.resume)
    if rank == 0:
        pc = res.record["param_counts"]
        print(f"parameters: {pc}")
        if res.record["flops"]:
            print(f"flops: {res.record['flops']}")
        print("final: " + ", ".join(f"{k}={v:.4g}" for k, v in res.final.items()))
        print(f"history and run record in {out}")
    return 0
