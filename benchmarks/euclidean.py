"""Euclidean distance attention: the augmented-SDPA fast path against its materialised reference
and against dot-product SDPA.

    python benchmarks/euclidean.py [--length 1024] [--threads 1] [--json artifacts/bench/euclidean.json]

1. accuracy: max |fast - explicit| in float64 (outputs, and gradients of a random projection);
2. time: fast vs explicit (float32, forward and forward+backward) at batch 1, 8 heads, d = 16
   (the explicit form materialises a (B, H, L, L, d) difference tensor, so it runs at batch 1);
3. time: Euclidean fast path vs dot-product SDPA at B = 4, H = 8, d = 16 (bench_attention).
All timings are interleaved medians in one process (see attention_atlas.bench.timing).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from attention_atlas.attention.euclidean import (
    euclidean_attention_explicit,
    squared_distance_attention,
)
from attention_atlas.bench.timing import bench_attention, compare, format_table


def accuracy(length: int, causal: bool) -> dict[str, float]:
    g = torch.Generator().manual_seed(0)
    shape = (1, 8, length, 16)
    q, k, v = (
        torch.randn(shape, generator=g, dtype=torch.float64).requires_grad_() for _ in range(3)
    )
    tau = (2 * 16) ** 0.5
    fast = squared_distance_attention(q, k, v, tau, causal=causal)
    ref = euclidean_attention_explicit(q, k, v, tau, causal=causal)[0]
    w = torch.randn(shape, generator=g, dtype=torch.float64)
    gf = torch.autograd.grad((fast * w).sum(), (q, k, v))
    gr = torch.autograd.grad((ref * w).sum(), (q, k, v))
    return {
        "max_abs_diff_out": float((fast - ref).detach().abs().max()),
        "max_abs_diff_grad": max(float((a - b).abs().max()) for a, b in zip(gf, gr)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--length", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--json", default="artifacts/bench/euclidean.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    L = args.length
    out: dict = {"length": L, "threads": args.threads}

    out["accuracy_float64"] = {f"causal={c}": accuracy(L, c) for c in (False, True)}
    print("float64 fast vs explicit:", json.dumps(out["accuracy_float64"], indent=1))

    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 8, L, 16, generator=g).requires_grad_() for _ in range(3))
    tau = (2 * 16) ** 0.5
    fns = {
        "fast": lambda q, k, v: squared_distance_attention(q, k, v, tau, causal=True),
        "explicit": lambda q, k, v: euclidean_attention_explicit(q, k, v, tau, causal=True)[0],
    }
    r1 = compare(fns, "fast", (q, k, v), reps=args.reps, meta={"batch": 1, "heads": 8, "length": L, "head_dim": 16, "causal": True})  # fmt: skip
    print(format_table(r1))
    out["fast_vs_explicit"] = r1

    r2 = bench_attention(["euclidean"], "dot", batch=4, heads=8, length=L, head_dim=16, causal=True, reps=args.reps)  # fmt: skip
    print(format_table(r2))
    out["euclidean_vs_dot"] = r2

    p = Path(args.json)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(out, indent=2))
    print(f"wrote {p}")


if __name__ == "__main__":
    main()
