"""Where one training step of a variant spends its time, by operator: a torch.profiler table
(CPU and, on a GPU, CUDA time per operator), the step's operator and kernel-launch counts, and
the calls that make the host wait for the GPU (``aten::item``, ``aten::_local_scalar_dense``,
device-to-host copies). For the prepared run on your GPU machine (benchmarks/gpu_run.sh) and
for a CPU alike:

    python benchmarks/profile_step.py riemannian fiber_bundle --shape long --device cuda

Writes the tables to stdout. Not a benchmark (nothing is compared): ratios live in
``python -m attention_atlas bench --train``.
"""

from __future__ import annotations

import argparse
import collections

import torch
from torch.profiler import ProfilerActivity, profile

from attention_atlas.data import load_char_ptb
from attention_atlas.experiments.performance.train_steps import (
    SHAPES,
    TRAIN_VARIANTS,
    variant_run,
)
from attention_atlas.train import step_callable

#: operators that wait for the GPU before the host can go on
SYNCS = ("aten::item", "aten::_local_scalar_dense", "cudaStreamSynchronize", "cudaMemcpyAsync",
         "cudaDeviceSynchronize")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("variants", nargs="+", choices=TRAIN_VARIANTS)
    p.add_argument("--shape", default="long", choices=sorted(SHAPES))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--steps", type=int, default=3, help="profiled steps (after 3 warm-up steps)")
    p.add_argument("--top", type=int, default=20, help="rows of each table")
    args = p.parse_args()
    corpus = load_char_ptb()
    dev = torch.device(args.device)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    for v in args.variants:
        step = step_callable(variant_run(v, SHAPES[args.shape], corpus, 0, dev))
        for _ in range(3):
            step()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        with profile(activities=acts) as prof:
            for _ in range(args.steps):
                step()
            if dev.type == "cuda":
                torch.cuda.synchronize()
        ev = prof.key_averages()
        n = collections.Counter({e.key: e.count for e in ev})
        launches = sum(c for k, c in n.items() if k.startswith("cudaLaunchKernel"))
        aten = sum(c for k, c in n.items() if k.startswith("aten::"))
        print(f"== {v}, shape {args.shape} {SHAPES[args.shape]}, {dev}, {args.steps} steps: "
              f"{aten / args.steps:.0f} aten calls and {launches / args.steps:.0f} kernel "
              f"launches a step; waits for the GPU: "
              + ", ".join(f"{k} {n[k] / args.steps:.0f}" for k in SYNCS if n.get(k)))  # fmt: skip
        print(ev.table(sort_by="self_cpu_time_total", row_limit=args.top))
        if dev.type == "cuda":
            print(ev.table(sort_by="self_cuda_time_total", row_limit=args.top))


if __name__ == "__main__":
    main()
