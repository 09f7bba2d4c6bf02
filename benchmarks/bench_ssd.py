"""SSD (Mamba-2 state-space dual) and the ``"ssm"`` attention: every benchmark part in one run.

Shapes: batch 1, 8 heads, head dim 64, state 64, float32, forward pass, where the quadratic
form's L^2 cost dominates and the chunked form's linear cost shows. The parts are those of the
experiment :mod:`attention_atlas.experiments.sma.scaling` (its ``"long"`` preset; chapter 7 loads
its ``"sweep"`` and ``"flops"`` from the results store), plus the training step:

1. ``ratio``: chunked against quadratic at L = 1024, 4096 and 16384, interleaved; where the
   quadratic form's ``(batch, heads, L, L)`` tensors exceed ``--memory-budget-gb`` one head is
   timed and multiplied by the number of heads (the JSON says so); where even one head does not
   fit it is skipped. The ratio should grow about as L / (2 Q) (quadratic ``L^2 (n + p)`` FLOPs
   against chunked ``L Q (n + p) + 2 L n p``).
2. ``linearity``: chunked at L = 2048 ... 16384, interleaved; time / L against L = 2048 (a
   linear algorithm keeps it near 1 once the working set is bounded by ``block_len``).
3. ``accuracy``: float32 chunked against float64 quadratic (head by head) at L = 4096 with
   strong and weak decay (float32 rounding is about 1e-7 per operation).
4. ``sweep``: time and peak memory (forward) of recurrent, quadratic, chunked SSD and causal
   dot-product SDPA against L; a method is skipped at an L whose predicted time exceeds
   ``--max-seconds`` or whose predicted memory exceeds the budget.
5. ``flops``: matrix-product FLOPs of chunked and quadratic SSD against L (counted).
6. ``train``: one training step (forward and backward of the loss) of the ``"ssm"`` model
   against the ``"dot"`` model at chapter 4's shape (width 64, 2 layers, 4 heads, batches of
   8 x 64 characters), side by side in wall and CPU time, with counted FLOPs
   (:func:`attention_atlas.experiments.sma.lm.step_cost`).

Run (about 10 to 20 minutes on 2 shared CPU cores)::

    python benchmarks/bench_ssd.py --out artifacts/bench/ssd.json

``--small`` runs every part at tiny sizes (seconds). The first five parts, one resumable cell
each, stored where chapter 7 finds them: ``python -m attention_atlas sweep ssd-scaling
--preset long --seeds 0``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from attention_atlas.experiments.sma import lm as ssm_lm
from attention_atlas.experiments.sma import scaling as ssd_scaling

PARTS = ["ratio", "linearity", "accuracy", "sweep", "flops", "train"]


def run(
    args: argparse.Namespace, save: Callable[[dict[str, Any]], object] | None = None
) -> dict[str, Any]:
    """Run the parts named in ``args.parts``; ``save(out)`` is called after each part."""
    save = save or (lambda out: None)
    torch.set_num_threads(args.threads)
    out: dict[str, Any] = {
        "command": " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
        "torch": torch.__version__, "threads": torch.get_num_threads(),
        "machine": platform.processor() or platform.machine(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "memory_budget_bytes": args.memory_budget_gb * ssd_scaling.GiB, "small": args.small,
    }  # fmt: skip
    params: dict[str, Any] = dict(
        lengths=args.sweep_lengths, ratio_lengths=args.ratio_lengths,
        linear_lengths=args.linear_lengths, accuracy_length=args.accuracy_length,
        reps=3, ratio_reps=args.reps, max_seconds=args.max_seconds,
        memory_gb=args.memory_budget_gb,
    )  # fmt: skip
    if args.small:  # the smoke preset's sizes and shapes, this command's rounds
        skip = ("parts", "reps", "ratio_reps")
        params.update({k: v for k, v in ssd_scaling.PRESETS["smoke"].items() if k not in skip})
        params["lengths"] = [64, 128, 256]
    grid = ssd_scaling.chapter_grid(parts=[p for p in args.parts if p != "train"], **params)
    for part, params in grid.items():
        res = ssd_scaling.run_cell({**params, "verbose": True}, seed=0)
        if part == "sweep":
            rows = res["rows"]
            out["crossover"] = {
                f"chunked_beats_{b}": ssd_scaling.crossover(rows, "chunked", b)
                for b in ("quadratic", "sdpa", "recurrent")
            }
        out[part] = res if part in ("linearity", "flops") else res["rows"]
        save(out)
    if "train" in args.parts:
        shape = (
            {"dim": 16, "layers": 1, "heads": 2, "batch": 2, "seq_len": 32} if args.small else {}
        )
        out["train"] = ssm_lm.step_cost(reps=args.reps, **shape)
        print(f"[train] ssm / dot step: {out['train']['cpu_ratio']:.2f}x CPU time", file=sys.stderr)
        save(out)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", default="artifacts/bench/ssd.json")
    p.add_argument("--parts", nargs="+", default=PARTS, choices=PARTS)
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (1: steadier timings on a shared machine)")  # fmt: skip
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--memory-budget-gb", type=float, default=4.0)
    p.add_argument("--max-seconds", type=float, default=20.0)
    p.add_argument("--ratio-lengths", type=int, nargs="+", default=[1024, 4096, 16384])
    p.add_argument("--linear-lengths", type=int, nargs="+", default=[2048, 4096, 8192, 16384])
    p.add_argument("--accuracy-length", type=int, default=4096)
    p.add_argument("--sweep-lengths", type=int, nargs="+",
                   default=[256, 512, 1024, 2048, 4096, 8192, 16384])  # fmt: skip
    p.add_argument("--small", action="store_true", help="tiny sizes (seconds), for tests")
    args = p.parse_args(argv)
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    out = run(args, save=lambda partial: path.write_text(json.dumps(partial, indent=2)))
    path.write_text(json.dumps(out, indent=2))
    print(json.dumps({k: out[k] for k in ("ratio", "linearity", "accuracy", "crossover", "train")
                      if k in out},
                     indent=1))  # fmt: skip
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
