"""Matroidal attention against dot-product SDPA: forward and forward+backward ratios in one run.

Shapes from issue 6: B=4, H=8, L=1024, head dim d=16, m in {d, 2d, 4d}. Each variant is timed
interleaved with the baseline (round robin, median of ``--repeats``), so machine noise hits
all of them alike. Also: the seed's pseudocode reference (forward only, run one (b, h) slice
at a time because its (L, L, m) tensors do not fit otherwise, summed over the slices), and the
peak memory growth of one forward+backward at several L (peak RSS of a fresh process), which
should grow linearly in L.

    python benchmarks/bench_matroidal.py --out artifacts/bench_matroidal.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from attention_atlas.attention.graphs import covector_matrix
from attention_atlas.attention.matroidal import matroidal_attention, matroidal_logits


def _family(d: int, m: int) -> str:
    return "ring" if m == d else "ring_chords"


def _time(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def interleaved(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median seconds of each function, timed round robin after one warm-up call each."""
    for f in fns.values():
        f()
    times: dict[str, list[float]] = {n: [] for n in fns}
    for _ in range(repeats):
        for n, f in fns.items():
            times[n].append(_time(f))
    return {n: statistics.median(t) for n, t in times.items()}


def _rss_peak() -> int:
    """Peak resident set size (bytes) since the last :func:`_reset_rss_peak` (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def _rss_now() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def _probe(variant: str, B: int, H: int, L: int, d: int) -> int:
    """Run in a fresh process: growth of the peak RSS (bytes) over one forward+backward at L."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, L, d).requires_grad_() for _ in range(3))
    A, theta = covector_matrix("ring_chords", d, 4 * d), torch.zeros(4 * d).requires_grad_()
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak-RSS high-water mark
    before = _rss_now()
    if variant == "dot":
        F.scaled_dot_product_attention(q, k, v).sum().backward()
    else:
        matroidal_attention(q, v, A, theta, 1e-4, d**0.5 / 2).sum().backward()
    return _rss_peak() - before


def peak_bytes(variant: str, B: int, H: int, L: int, d: int) -> int:
    """:func:`_probe` in a subprocess, so each measurement starts from a fresh high-water mark."""
    import subprocess
    import sys

    cmd = [sys.executable, __file__, "--probe", variant, str(B), str(H), str(L), str(d)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return int(out.strip().splitlines()[-1])


def main() -> None:
    import sys

    if len(sys.argv) == 7 and sys.argv[1] == "--probe":
        variant, *dims = sys.argv[2:]
        B, H, L, d = (int(x) for x in dims)
        print(_probe(variant, B, H, L, d))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--length", type=int, default=1024)
    ap.add_argument("--head-dim", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--reference", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--memory-lengths", type=int, nargs="*", default=[256, 512, 1024, 2048])
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--out", type=Path, default=Path("artifacts/bench_matroidal.json"))
    args = ap.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    B, H, L, d = args.batch, args.heads, args.length, args.head_dim
    torch.manual_seed(0)
    tau, eps = d**0.5 / 2, 1e-4  # logits -|y_i - y_j|^2 / (2 tau): the dot-product scale

    def leaf(*shape: int) -> torch.Tensor:
        return torch.randn(*shape).requires_grad_()

    q, k, v = leaf(B, H, L, d), leaf(B, H, L, d), leaf(B, H, L, d)
    z = leaf(B, H, L, d)
    ms = [d, 2 * d, 4 * d]
    As = {m: covector_matrix(_family(d, m), d, m) for m in ms}
    thetas = {m: torch.zeros(m).requires_grad_() for m in ms}

    def dot_fwd() -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v)

    def mat_fwd(m: int) -> Callable[[], torch.Tensor]:
        return lambda: matroidal_attention(z, v, As[m], thetas[m], eps, tau)

    def fwd_bwd(f: Callable[[], torch.Tensor]) -> Callable[[], None]:
        def run() -> None:
            f().sum().backward()

        return run

    results: dict[str, object] = {
        "shape": {"B": B, "H": H, "L": L, "d": d, "m": ms},
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "machine": platform.machine(),
        "command": "python " + " ".join(sys.argv),
    }
    fwd = {"dot": dot_fwd, **{f"matroidal_m{m}": mat_fwd(m) for m in ms}}
    with torch.no_grad():
        t_nograd = interleaved(fwd, args.repeats)
    t_fwd = interleaved(fwd, args.repeats)
    t_fb = interleaved({n: fwd_bwd(f) for n, f in fwd.items()}, args.repeats)
    results["forward_no_grad_s"] = t_nograd
    results["forward_s"] = t_fwd
    results["forward_backward_s"] = t_fb
    results["ratio_forward_no_grad"] = {n: t / t_nograd["dot"] for n, t in t_nograd.items()}
    results["ratio_forward"] = {n: t / t_fwd["dot"] for n, t in t_fwd.items()}
    results["ratio_forward_backward"] = {n: t / t_fb["dot"] for n, t in t_fb.items()}

    if args.reference:  # the seed's pseudocode, one (b, h) slice at a time, forward only
        m = 4 * d
        zs, vs = z.detach().reshape(B * H, L, d), v.detach().reshape(B * H, L, d)

        def reference() -> None:
            with torch.no_grad():
                for i in range(B * H):
                    logits = matroidal_logits(zs[i : i + 1], As[m], thetas[m], eps, tau)
                    torch.softmax(logits, -1) @ vs[i : i + 1]

        t_ref = _time(reference)
        with torch.no_grad():
            t_dot = statistics.median(_time(dot_fwd) for _ in range(5))
        results["reference_forward_s"] = t_ref
        results["ratio_reference_forward"] = t_ref / t_dot

    mem: dict[str, dict[str, int]] = {"dot": {}, "matroidal_m4d": {}}
    for n in args.memory_lengths:
        mem["dot"][str(n)] = peak_bytes("dot", B, H, n, d)
        mem["matroidal_m4d"][str(n)] = peak_bytes("matroidal", B, H, n, d)
    results["peak_bytes_forward_backward"] = mem
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(
        json.dumps({k: v for k, v in results.items() if k.startswith(("ratio", "peak"))}, indent=2)
    )


if __name__ == "__main__":
    main()
