"""The timing harness on a known workload: one matrix product against three chained ones.

    python benchmarks/bench_compare.py [--n 256] [--reps 10] [--json artifacts/bench/compare.json]

:func:`attention_atlas.bench.timing.compare` times ``x @ x`` and ``x @ x @ x @ x`` (three products of
the same size) interleaved in one process; the median per-round ratio should be near 3 in
forward and forward+backward. A ratio far from 3 says the machine's load or a small size
dominates the measurement, which is why this claim is a benchmark and not a unit test (the
unit test checks ``compare``'s arithmetic on a scripted clock).
"""

from __future__ import annotations

import argparse

import torch

from attention_atlas.bench.timing import compare, format_table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=256, help="matrix size n (n x n)")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None, help="write the result here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    x = torch.randn(args.n, args.n, requires_grad=True)
    fns = {"one": lambda x: x @ x, "three": lambda x: x @ x @ x @ x}
    res = compare(fns, "one", (x,), reps=args.reps, meta={"n": args.n}, json_path=args.json)
    print(format_table(res))
    for mode in ("forward", "forward_backward"):
        ratio = res["results"]["three"][mode]["ratio_median"]
        print(f"{mode}: three products / one = {ratio:.2f} (expected about 3)")


if __name__ == "__main__":
    main()
