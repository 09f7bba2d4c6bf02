"""The ``bench`` command: time registered attention variants against a baseline
(:func:`attention_atlas.bench.timing.bench_attention`), every argument checked first."""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from attention_atlas.bench.timing import bench_attention, format_table
from attention_atlas.threads import intra_op_threads
from attention_atlas.validate import (
    ConfigError,
    NonNegativeInt,
    PositiveInt,
    check_device,
    check_output_path,
    close_matches,
    from_mapping,
)

__all__ = ["BenchSizes", "add_subcommand", "check_bench_args"]


def add_subcommand(subparsers: Any) -> None:
    """Register ``bench`` on the command line (see :mod:`attention_atlas.__main__`)."""
    p = subparsers.add_parser(
        "bench",
        help="time attention variants against a baseline",
        description=(
            "Time registered attention variants (forward and forward+backward of attend on the "
            "same q, k, v), interleaved, against a baseline; prints a table and writes JSON. "
            "Example: python -m attention_atlas bench euclidean euclidean@explicit "
            "--baseline dot -L 1024 --json artifacts/bench/euclid.json. Chapter 8's records: "
            "bench --train --shape book --store (training steps against dot) and bench "
            "--lengths 256 512 ... 16384 --store (kernels against SDPA)"
        ),
    )
    p.add_argument(
        "variants",
        nargs="*",
        help="registry names; NAME@explicit for the materialised path (with --train: names of "
        "bench_train.TRAIN_VARIANTS; with --train or --lengths the default is all of them)",
    )
    p.add_argument(
        "--train",
        action="store_true",
        help="time one training step of each variant against a dot-product model (the "
        "harness's step, interleaved), with a profile of its phases and their FLOPs",
    )
    p.add_argument("--shape", default="book", help="--train: chapter 4's shape, book or long")
    p.add_argument(
        "--compile",
        action="store_true",
        help="--train: also time each step with its forward through torch.compile "
        "(TrainConfig(compile=True)), side by side with the eager one",
    )
    p.add_argument(
        "--native",
        action="store_true",
        help="--train: also time (and profile) the Riemannian and Fiber Bundle steps with the "
        "native CPU kernels (TrainConfig(native=True)), side by side",
    )
    p.add_argument(
        "--lengths",
        type=int,
        nargs="+",
        default=None,
        help="time every variant's kernel against SDPA at each of these lengths (chapter 8)",
    )
    p.add_argument("--max-call-s", type=float, default=10.0, help="--lengths: skip beyond this")
    p.add_argument(
        "--max-memory-gib",
        type=float,
        default=None,
        help="--lengths: skip beyond this estimate (default 2 on a CPU, half a GPU's memory)",
    )
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    p.add_argument(
        "--store",
        action="store_true",
        help="store the record in results/bench/<cpu|cuda>/ with its provenance (chapter 8)",
    )
    p.add_argument(
        "--machine",
        default=None,
        metavar="LABEL",
        help="with --store: another machine's record, stored under results/bench/<cpu|cuda>/"
        "LABEL/ beside the reference one instead of over it (e.g. intel-xeon-2ghz)",
    )
    p.add_argument("--baseline", default="dot")
    p.add_argument("-B", "--batch", type=int, default=4)
    p.add_argument("-H", "--heads", type=int, default=8)
    p.add_argument("-L", "--length", type=int, default=1024)
    p.add_argument("-d", "--head-dim", type=int, default=16)
    p.add_argument(
        "--dtype", default="float32", choices=["float32", "float64", "float16", "bfloat16"]
    )
    p.add_argument("--device", default=None,
                   help="where to run (cpu, cuda; default cpu), also for --train and --lengths")  # fmt: skip
    p.add_argument("--no-causal", action="store_true")
    p.add_argument("--no-backward", action="store_true")
    p.add_argument("--no-memory", action="store_true")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--options", default="{}", help='JSON: {"euclidean": {"tau": 4.0}}')
    p.add_argument("--json", default=None, help="write the result here")
    p.set_defaults(func=_cli_bench)


@dataclass
class BenchSizes:
    """The sizes and repetitions of a ``bench`` run, with their ranges."""

    batch: PositiveInt
    heads: PositiveInt
    length: PositiveInt
    head_dim: PositiveInt
    reps: PositiveInt
    warmup: NonNegativeInt


def check_bench_args(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Check a ``bench`` command line before anything is built; return the parsed
    ``--options``. Raises :class:`ConfigError` (one line) naming the bad argument."""
    from attention_atlas.attention.registry import attention_options, available_attention

    sizes = {
        f: getattr(args, f) for f in ("batch", "heads", "length", "head_dim", "reps", "warmup")
    }
    from_mapping(BenchSizes, sizes, "bench")
    if args.threads < 1:
        raise ConfigError(f"--threads: expected a positive integer, got {args.threads}")
    check_device(args.device, "--device")
    if args.machine is not None:
        if not args.store:
            raise ConfigError(
                f"--machine {args.machine}: names where --store puts the record; add --store"
            )
        from attention_atlas.bench.records import bench_dir

        try:
            bench_dir("cpu", machine=args.machine)
        except ValueError as err:
            raise ConfigError(f"--machine: {err}") from None
    if args.train:
        from attention_atlas.experiments.performance.train_steps import SHAPES, TRAIN_VARIANTS

        for name in args.variants:
            if name not in TRAIN_VARIANTS:
                raise ConfigError(
                    f"bench --train: unknown variant {name!r}"
                    f"{close_matches(name, list(TRAIN_VARIANTS))}; known: {', '.join(TRAIN_VARIANTS)}"
                )
        if args.shape not in SHAPES:
            raise ConfigError(f"--shape: expected one of {', '.join(SHAPES)}, got {args.shape!r}")
        return {}
    if args.lengths is not None and any(n < 1 for n in args.lengths):
        raise ConfigError(f"--lengths: expected positive integers, got {args.lengths}")
    if not args.variants and args.lengths is None:
        raise ConfigError("bench: name at least one attention variant (or use --train/--lengths)")
    known = available_attention()
    for spec in [*args.variants, args.baseline]:
        name, _, path = spec.partition("@")
        if name not in known:
            raise ConfigError(
                f"bench: unknown attention variant {name!r}{close_matches(name, known)}; "
                f"known: {', '.join(known)}"
            )
        if path not in ("", "explicit"):
            raise ConfigError(f"bench: variant {spec!r}: the only path suffix is '@explicit'")
    try:
        options = json.loads(args.options)
    except json.JSONDecodeError as err:
        raise ConfigError(f"--options: not valid JSON ({err.msg}), got {args.options!r}") from None
    if not isinstance(options, dict) or not all(isinstance(v, dict) for v in options.values()):
        raise ConfigError(
            f'--options: expected {{"variant": {{"option": value}}}}, got {args.options!r}'
        )
    names = {spec.partition("@")[0] for spec in [*args.variants, args.baseline]}
    for name, opts in options.items():
        if name not in names:
            raise ConfigError(f"--options: {name!r} is not one of the variants benchmarked")
        takes = set(attention_options(name)) - {"dim", "n_heads"}
        bad = sorted(set(opts) - takes)
        if bad:
            raise ConfigError(
                f"--options: attention variant {name!r} does not take {bad[0]!r}; "
                f"it takes: {', '.join(sorted(takes))}"
            )
    if args.json:
        check_output_path(args.json, "--json", folder=False)
    for flag, value in (
        ("--max-call-s", args.max_call_s),
        ("--max-memory-gib", args.max_memory_gib),
    ):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ConfigError(f"{flag}: expected a finite number > 0, got {value}")
    return options


def _cli_bench(args: argparse.Namespace) -> int:
    options = check_bench_args(args)
    with intra_op_threads(args.threads):
        if args.train or args.lengths is not None:
            return _cli_record(args)
        return _cli_attention(args, options)


def _cli_record(args: argparse.Namespace) -> int:
    """``--train`` or ``--lengths``: a chapter 8 record, printed, written and stored."""
    import time

    from attention_atlas.bench.records import stamp, store_bench

    started = time.time()
    if args.train:
        from attention_atlas.experiments.performance.train_steps import (
            TRAIN_VARIANTS,
            bench_train,
            format_train_table,
        )

        rec = bench_train(args.variants or TRAIN_VARIANTS, args.shape, reps=args.reps,
                          warmup=args.warmup, compiled=args.compile,
                          device=args.device or "cpu", native=args.native)  # fmt: skip
        text = format_train_table(rec)
    else:
        from attention_atlas.bench.scaling import KERNEL_VARIANTS, kernel_scaling

        def partial(rec: dict[str, Any]) -> None:  # each length stored as it ends
            store_bench(stamp(rec, started=started), rec["name"], machine=args.machine)

        rec = kernel_scaling(
            args.variants or KERNEL_VARIANTS, args.lengths, batch=args.batch, heads=args.heads,
            head_dim=args.head_dim, causal=not args.no_causal, dtype=getattr(torch, args.dtype),
            device=args.device or "cpu", reps=args.reps, warmup=args.warmup,
            max_call_s=args.max_call_s,
            max_memory_bytes=None if args.max_memory_gib is None else args.max_memory_gib * 2**30,
            memory=not args.no_memory, log=lambda m: print(m, file=sys.stderr, flush=True),
            on_length=partial if args.store else None,
        )  # fmt: skip
        text = "\n".join(
            f"{v}: " + ", ".join(f"L={n} {r['forward_backward_ratio']:.2f}x" for n, r in by.items())
            for v, by in rec["results"].items()
        )
    rec = stamp(rec, started=started)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(rec, indent=1))
        print(f"wrote {args.json}", file=sys.stderr)
    if args.store:
        print(f"stored {store_bench(rec, rec['name'], machine=args.machine)}", file=sys.stderr)
    return 0


def _cli_attention(args: argparse.Namespace, options: dict[str, dict[str, Any]]) -> int:
    res = bench_attention(
        args.variants,
        args.baseline,
        batch=args.batch,
        heads=args.heads,
        length=args.length,
        head_dim=args.head_dim,
        causal=not args.no_causal,
        dtype=getattr(torch, args.dtype),
        device=args.device,
        options=options,
        backward=not args.no_backward,
        memory=not args.no_memory,
        reps=args.reps,
        warmup=args.warmup,
        json_path=args.json,
    )
    print(format_table(res))
    if args.json:
        print(f"wrote {args.json}", file=sys.stderr)
    return 0
