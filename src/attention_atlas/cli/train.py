"""The ``train`` command: ``python -m attention_atlas train --task T --attention A -o key=value``."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

from attention_atlas.atomic import FolderInUse, folder_lock
from attention_atlas.models import ModelConfig
from attention_atlas.train.config import (
    TrainConfig,
    build_configs,
    check_model,
    check_run,
    load_config_file,
)
from attention_atlas.validate import ConfigError, check_output_path

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
        help=(
            "ptb-char, ptb-word, wikitext2, wikitext2-char, digits, copy, recall, mqar; a task's "
            "options as -o task.NAME=VALUE, e.g. --task mqar -o task.n_pairs=16 "
            "-o task.seq_len=64 -o task.vocab_size=128 -o task.query_dist=uniform"
        ),
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
    p.add_argument(
        "--resume", action="store_true", help="continue the run whose checkpoint is in --out"
    )
    p.set_defaults(func=_cli_train)


def _cli_train(args: argparse.Namespace) -> int:
    """Check everything (configs, task, output folder), then load the data and train."""
    from attention_atlas.data import load_task
    from attention_atlas.train.loop import train

    task, mcfg, tcfg, task_opts, resume = _checked(args)
    rank = int(os.environ.get("RANK", "0"))
    # one writer per --out, held from before the data loads (rank 0 writes the folder)
    writer: Any = folder_lock(str(tcfg.out_dir), "train") if rank == 0 else contextlib.nullcontext()
    try:
        writer.__enter__()
    except FolderInUse as err:
        raise ConfigError(f"--out: {err}") from None
    try:
        data = load_task(task, args.data_dir, **task_opts)
        if rank == 0:
            print(f"task {task}: {data!r}", file=sys.stderr)
        with warnings.catch_warnings():  # a divergence is reported below, in one line
            warnings.filterwarnings("ignore", "training diverged", RuntimeWarning)
            res = train(mcfg, tcfg, data, resume=resume)
    finally:
        writer.__exit__(None, None, None)
    if rank != 0:
        return 0 if res.diverged is None else 1
    if res.diverged is not None:
        print(f"error: {res.diverged['message']}; run record in {tcfg.out_dir}", file=sys.stderr)
        return 1
    print(f"parameters: {res.record['param_counts']}")
    if res.record["flops"]:
        print(f"flops: {res.record['flops']}")
    print("final: " + ", ".join(f"{k}={v:.4g}" for k, v in res.final.items()))
    print(f"history and run record in {tcfg.out_dir}")
    return 0


def _checked(
    args: argparse.Namespace,
) -> tuple[str, ModelConfig, TrainConfig, dict[str, Any], bool]:
    """The task, model and train configs, task options and whether to resume, every one
    checked (raises :class:`ConfigError` in one line before any work starts)."""
    from attention_atlas.data import check_task

    config = load_config_file(args.config) if args.config else {}
    task = args.task or config.get("task") or "ptb-char"
    overrides = list(args.overrides)
    if args.attention:
        overrides.insert(0, f"model.attention={args.attention}")
    mcfg, tcfg, task_opts = build_configs(config, overrides)
    check_task(task, task_opts)
    check_model(mcfg)
    out = Path(
        args.out
        or tcfg.out_dir
        or Path("runs") / f"{task}-{mcfg.attention}-{time.strftime('%Y%m%d-%H%M%S')}"
    )
    tcfg = replace(tcfg, out_dir=str(out))
    check_run(tcfg)
    if args.data_dir is not None and Path(args.data_dir).is_file():
        raise ConfigError(f"--data-dir: {args.data_dir} is a file, expected a folder")
    check_output_path(out, "--out", folder=True)
    ckpt = out / "checkpoint.pt"
    if args.resume and not ckpt.exists():
        raise ConfigError(
            f"--resume: there is no checkpoint in {out} (a run writes one every checkpoint_every "
            "steps); run without --resume to start a new run there"
        )
    if args.resume:
        _check_resumable(ckpt, mcfg, tcfg)
    if not args.resume and ckpt.exists():
        raise ConfigError(
            f"--out: {out} holds the checkpoint of an earlier run; pass --resume to continue it, "
            "or choose another --out"
        )
    return task, mcfg, tcfg, task_opts, bool(args.resume)


def _check_resumable(ckpt: Path, mcfg: ModelConfig, tcfg: TrainConfig) -> None:
    """Refuse (before the data is loaded) a resume whose settings differ from the checkpoint's;
    the fields the data fills in are compared when the run starts."""
    import torch

    from attention_atlas.train.checkpoint import config_changes

    try:
        state = torch.load(ckpt, map_location="cpu", weights_only=False, mmap=True)
    except Exception as err:  # a file that is not a checkpoint
        raise ConfigError(f"--resume: {ckpt} cannot be read as a checkpoint ({err})") from None
    data_fields = ("task", "vocab_size", "n_classes", "patch_dim", "max_len")
    saved_model = {k: v for k, v in state.get("model_config", {}).items() if k not in data_fields}
    now_model = {k: v for k, v in mcfg.to_dict().items() if k not in data_fields}
    changes = config_changes(
        {"model_config": saved_model, "train_config": state.get("train_config", {})},
        {"model_config": now_model, "train_config": tcfg.to_dict()},
    )
    if changes:
        raise ConfigError(
            f"cannot resume from {ckpt}: the configuration changed since it was written "
            f"({'; '.join(changes)}); restore those settings, or start a new run in another folder"
        )
