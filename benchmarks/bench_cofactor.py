"""Principal cofactors: one LU against n explicit minors, and the regulariser's training overhead.

Issue 7's goals: ``principal_cofactors(A, "lu")`` at least 40x faster than ``"minors"`` at
n = 64 and at least 100x at n = 128 (batch 16, float64, forward); forward+backward (gradient
with respect to A) reported too; the input is softmax attention of Gaussian logits. Ratios are medians of per-round ratios from
:func:`attention_atlas.bench.compare` (interleaved rounds, one process).

The overhead part times forward+backward of chapter 6's digits model (6 layers, width 48,
4 heads, 16 patch tokens, batch 32) three ways: the baseline (SDPA), with ``need_weights=True``,
and with the cofactor regulariser on one head per layer.

Run (one to two minutes on 2 shared CPU cores, one thread)::

    python benchmarks/bench_cofactor.py --out artifacts/bench/cofactor.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from attention_atlas.experiments.cofactor import regularizer_overhead
from attention_atlas.experiments.cofactor_numerics import lu_vs_minors
from attention_atlas.models import ModelConfig

GOALS = {64: 40.0, 128: 100.0}


def bench_overhead(batch: int, reps: int) -> dict:
    """:func:`regularizer_overhead` on chapter 6's digits model with random patch tokens."""
    cfg = ModelConfig(task="classify", patch_dim=4, n_classes=10, dim=48, n_layers=6, n_heads=4,
                      max_len=16)  # fmt: skip
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(batch, 16, 4, generator=g), torch.randint(0, 10, (batch,), generator=g)
    return regularizer_overhead(cfg, x, y, reps=reps, heads=1, beta=0.1, alpha=1e-3,
                                meta={"batch": batch, "model": cfg.to_dict()})  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="*", default=[64, 128])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=Path("artifacts/bench/cofactor.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    methods = lu_vs_minors(args.sizes, args.batch, args.reps)
    overhead = bench_overhead(32, args.reps)
    summary = {}
    for n, res in methods.items():
        r = res["results"]["minors"]
        fwd, fb = r["forward"]["ratio_median"], r["forward_backward"]["ratio_median"]
        cpu = res["meta"]["cpu_time_speedup_forward"]
        goal = GOALS.get(n)
        summary[f"n={n}"] = {"speedup_forward": fwd, "speedup_forward_backward": fb, "goal": goal,
                             "speedup_forward_cpu_time": cpu,
                             "goal_met_wall": None if goal is None else fwd >= goal,
                             "goal_met_cpu": None if goal is None else cpu >= goal}  # fmt: skip
        print(f"n={n:4d} batch={args.batch}: lu vs minors forward {fwd:7.1f}x wall "
              f"(q25-q75 {r['forward']['ratio_q25']:.1f}-{r['forward']['ratio_q75']:.1f}), "
              f"{cpu:7.1f}x CPU time; forward+backward {fb:6.1f}x wall"
              + ("" if goal is None else f"; goal {goal:g}x"))  # fmt: skip
    o = overhead["results"]
    frac = o["cofactor"]["forward_backward"]["ratio_median"] - 1
    fw = o["need_weights"]["forward_backward"]["ratio_median"] - 1
    summary["overhead"] = {"cofactor_fraction_of_step": frac, "need_weights_fraction": fw}
    print(f"regulariser overhead (forward+backward, digits model, batch 32): {100 * frac:.0f}% "
          f"of a baseline step ({100 * fw:.0f}% from need_weights alone)")  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    payload = {"summary": summary, "methods": {str(k): v for k, v in methods.items()},
               "overhead": overhead, "threads": args.threads}  # fmt: skip
    args.out.write_text(json.dumps(payload, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
