"""Geodesic (Riemannian) attention: fast paths against dot-product SDPA, memory against L,
the choice between the augmented and the low-rank path, and Woodbury against a dense solve.

    python benchmarks/riemannian_attention.py [--threads 1] [--reps 7] [--json artifacts/bench/riemannian.json]

1. accuracy: max |fast - reference| in float64, causal and not (outputs and gradients);
2. time: geodesic_attention (augmented, sdpa-augmented, lowrank) vs SDPA at B=2, H=8, L=1024,
   d=16, r=4, forward and forward+backward (interleaved medians, attention_atlas.bench.timing.compare);
   the materialised reference at B=1 (it holds a (B, H, L, L, d) tensor);
3. peak memory of one forward+backward against L = 1024 .. 8192 (B=1, H=2, d=16, r=4);
4. augmented vs lowrank against the head width d (L=512, r=4, forward): where each wins;
5. metric_inverse_apply (Woodbury) vs torch.linalg.solve on the dense I + U U^T, d=1024, r=8.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from attention_atlas.attention import riemannian as R
from attention_atlas.bench.timing import compare, format_table
from attention_atlas.experiments.low_rank.bench import (
    attention_inputs,
    attention_paths,
    peak_memory_at,
)
from attention_atlas.experiments.low_rank.cost import woodbury_vs_dense


def accuracy(L: int, causal: bool) -> dict[str, float]:
    q, k, v, U = attention_inputs(1, 4, L, 16, 4, dtype=torch.float64)
    tau = math.sqrt(32)
    w = torch.randn_like(v)
    ref = R.geodesic_attention_reference(q, k, v, U, tau, causal)[0]
    gr = torch.autograd.grad((ref * w).sum(), (q, k, v, U))
    out: dict[str, float] = {}
    for method in ("augmented", "sdpa", "lowrank"):
        fast = R.geodesic_attention(q, k, v, U, tau, causal, method=method)  # type: ignore[arg-type]
        gf = torch.autograd.grad((fast * w).sum(), (q, k, v, U))
        out[f"{method}_max_abs_diff_out"] = float((fast - ref).detach().abs().max())
        out[f"{method}_max_abs_diff_grad"] = max(float((a - b).abs().max()) for a, b in zip(gf, gr))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--length", type=int, default=1024)
    ap.add_argument("--max-memory-length", type=int, default=8192)
    ap.add_argument("--skip", nargs="*", default=[], help="sections to skip: 1 2 3 4 5")
    ap.add_argument("--json", default="artifacts/bench/riemannian.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    L, d, r = args.length, 16, 4
    tau = math.sqrt(2 * d)
    out: dict[str, Any] = {"threads": args.threads, "length": L, "head_dim": d, "rank": r}
    p = Path(args.json)
    p.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        p.write_text(json.dumps(out, indent=2))

    if "1" not in args.skip:
        out["accuracy_float64"] = {f"causal={c}": accuracy(256, c) for c in (False, True)}
        print("float64 fast vs reference:", json.dumps(out["accuracy_float64"], indent=1))
        save()

    if "2" not in args.skip:
        for causal in (False, True):
            res = compare(
                attention_paths(tau, causal),
                "sdpa",
                attention_inputs(2, 8, L, d, r),
                reps=args.reps,
                meta={
                    "batch": 2,
                    "heads": 8,
                    "length": L,
                    "head_dim": d,
                    "rank": r,
                    "causal": causal,
                },
            )
            print(format_table(res))
            out[f"vs_sdpa_causal={causal}"] = res
            save()
        ref = {
            "sdpa": attention_paths(tau, False)["sdpa"],
            "geodesic_augmented": attention_paths(tau, False)["geodesic_augmented"],
            "reference": lambda q, k, v, U: R.geodesic_attention_reference(q, k, v, U, tau)[0],
        }
        res = compare(
            ref, "sdpa", attention_inputs(1, 8, L, d, r), reps=max(3, args.reps // 2), backward=False,
            meta={"batch": 1, "heads": 8, "length": L, "head_dim": d, "rank": r, "causal": False},
        )  # fmt: skip
        print(format_table(res))
        out["reference_vs_sdpa"] = res
        save()

    if "3" not in args.skip:
        mem: dict[str, dict[str, int]] = {}
        length = 1024
        while length <= args.max_memory_length:
            row = peak_memory_at(length, d=d, r=r, heads=2)
            mem[str(length)] = row
            print(
                "peak memory (MiB) at L =", length, {n: round(b / 2**20, 1) for n, b in row.items()}
            )
            out["peak_memory_bytes_fwd_bwd_B1_H2"] = mem
            save()
            length *= 2

    if "4" not in args.skip:
        sweep: dict[str, Any] = {}
        for dd in (8, 16, 32, 64):
            t = math.sqrt(2 * dd)
            res = compare(
                {
                    "sdpa": lambda q, k, v, U: F.scaled_dot_product_attention(q, k, v),
                    "augmented": lambda q, k, v, U, t=t: R.geodesic_attention(q, k, v, U, t, method="augmented"),
                    "lowrank": lambda q, k, v, U, t=t: R.geodesic_attention(q, k, v, U, t, method="lowrank"),
                },
                "sdpa", attention_inputs(1, 4, 512, dd, r), reps=max(3, args.reps // 2), backward=False,
                memory=False, meta={"batch": 1, "heads": 4, "length": 512, "head_dim": dd, "rank": r},
            )  # fmt: skip
            print(format_table(res))
            sweep[str(dd)] = res
        out["augmented_vs_lowrank_by_head_dim"] = sweep
        save()

    if "5" not in args.skip:
        wood = woodbury_vs_dense(
            16, reps=args.reps, generator=torch.Generator().manual_seed(3),
            meta={"tokens": 16, "d": 1024, "r": 8, "dtype": "float64"},
        )  # fmt: skip
        res = wood["compare"]
        res["meta"]["rel_err"] = wood["rel_err"]
        print(format_table(res))
        out["woodbury_vs_dense_solve"] = res
        save()
    print(f"wrote {p}")


if __name__ == "__main__":
    main()
