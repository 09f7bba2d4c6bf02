"""Every attention variant's kernel against SDPA as the length grows, and against its floor.

:func:`kernel_scaling` times each registered variant's
:meth:`~attention_atlas.attention.base.Attention.attend` (forward, and forward+backward) against
dot-product attention (SDPA) on the same ``q, k, v`` at each length, interleaved
(:func:`attention_atlas.bench.timing.bench_attention`), with the peak memory of one forward+backward and
the FLOPs of its matrix products (:func:`attention_atlas.bench.timing.count_flops`). A variant is not run
at a length where the time extrapolated from the previous length (by the slope measured so far,
at least 2) passes ``max_call_s``, or where its memory passes ``max_memory_bytes`` (by default
half a GPU's memory, 2 GiB of a CPU's): its measured peak extrapolated the same way (slope at
least 1), or a fixed estimate for the materialised Fiber Bundle scores. A length that runs out
of memory is run again without the variant that took the most at the previous length.

Ratios to SDPA move when either side gets faster; the **floor ratio** does not: the measured time
divided by the time this machine's matrix products would take for the variant's counted FLOPs
(:func:`matmul_rate`, a square matrix product of the same dtype on the same device and
threads). A floor ratio of 1 is a kernel that does nothing but matrix products at the machine's
peak rate; elementwise work, memory traffic and small products push it up.

``python -m attention_atlas bench --lengths 256 ... 16384 --store`` stores the record in
``results/bench/<cpu|cuda>/kernels-<dtype>.json`` (:mod:`attention_atlas.bench.records`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import torch

from attention_atlas.train import flops as _flops  # noqa: F401  (registers the CPU SDPA FLOP formulas)

from .timing import bench_attention, count_flops, time_steps

__all__ = [
    "variant_flops",
    "KERNEL_VARIANTS",
    "LENGTHS",
    "floor_ratio",
    "kernel_scaling",
    "matmul_rate",
    "slopes",
]

#: the variants of chapter 8's kernel figures (registry names; ``dot`` is SDPA)
KERNEL_VARIANTS = ("dot", "euclidean", "matroidal", "mahalanobis", "riemannian", "fiber_bundle",
                   "ssm")  # fmt: skip
#: the lengths of the long run
LENGTHS = (256, 512, 1024, 2048, 4096, 8192, 16384)

#: bytes per (B, H, L, L) element each variant keeps alive at its peak, roughly (its largest
#: materialised tensors): the materialised fiber_bundle scores hold (L, r, 2L) products
_QUADRATIC_BYTES = {"fiber_bundle": 48}


def matmul_rate(
    dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu", n: int = 512,
    reps: int = 5,
) -> float:  # fmt: skip
    """FLOP/s of an ``n x n`` matrix product (``2 n^3`` FLOPs) on this device, dtype and thread
    count: the best of ``reps`` samples of at least 0.05 s each (the rate the machine can reach;
    on one CPU thread timed by the thread's CPU time, as :func:`kernel_scaling` times)."""
    dev = torch.device(device)
    clock = "cpu" if dev.type == "cpu" and torch.get_num_threads() == 1 else "wall"
    a = torch.randn(n, n, dtype=dtype, device=dev)
    b = torch.randn(n, n, dtype=dtype, device=dev)

    def step() -> None:
        torch.mm(a, b)

    t1 = time_steps(step, 1, dev, clock)
    number = max(1, math.ceil(0.05 / max(t1, 1e-9)))
    times = [time_steps(step, number, dev, clock) for _ in range(reps)]
    return 2 * n**3 / min(times)


def floor_ratio(seconds: float, flops: float, rate: float) -> float:
    """Measured time over the time of ``flops`` at ``rate`` FLOP/s (nan without FLOPs)."""
    return seconds / (flops / rate) if flops > 0 else math.nan


def _estimated_bytes(variant: str, batch: int, heads: int, length: int, itemsize: int) -> float:
    per = _QUADRATIC_BYTES.get(variant, 0)
    return per / 4 * itemsize * batch * heads * length * length


def kernel_scaling(
    variants: Sequence[str] = KERNEL_VARIANTS,
    lengths: Sequence[int] = LENGTHS,
    *,
    batch: int = 1,
    heads: int = 4,
    head_dim: int = 16,
    causal: bool = True,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    reps: int = 3,
    warmup: int = 1,
    max_call_s: float = 10.0,
    max_memory_bytes: float | None = None,
    memory: bool = True,
    log: Any = None,
    on_length: Any = None,
) -> dict[str, Any]:
    """Forward and forward+backward time, peak memory and FLOPs of each variant at each length,
    against SDPA measured side by side. ``on_length(record)`` is called with the record so far
    after each length (the command line stores it, so a run stopped part-way keeps its lengths).
    A length that runs out of memory is run again without the variant that took the most
    memory at the previous length (recorded in ``skipped``).

    Returns ``{"name": "kernels-<dtype>", "kind": "kernel_scaling", "device", "dtype",
    "threads", "sizes": {batch, heads, head_dim, causal}, "lengths", "matmul_flops_per_s",
    "results": {variant: {str(L): {"forward_s", "forward_backward_s", "forward_ratio",
    "forward_backward_ratio", "peak_memory_bytes", "forward_flops", "forward_backward_flops"}}},
    "skipped": {variant: {str(L): reason}}}``; every ratio is to ``dot`` in the same run.
    """
    t0 = time.time()
    dev = torch.device(device)
    clock = "cpu" if dev.type == "cpu" and torch.get_num_threads() == 1 else "wall"
    names = ["dot", *[v for v in variants if v != "dot"]]
    itemsize = torch.empty((), dtype=dtype).element_size()
    rate = matmul_rate(dtype, dev)
    if max_memory_bytes is None:  # half the GPU's memory; 2 GiB of a CPU's
        cuda = dev.type == "cuda"
        max_memory_bytes = torch.cuda.get_device_properties(dev).total_memory / 2 if cuda else 2**31
    results: dict[str, dict[str, Any]] = {v: {} for v in names}
    skipped: dict[str, dict[str, str]] = {v: {} for v in names}
    last: dict[str, tuple[int, float]] = {}  # variant -> (length, fwd+bwd seconds)

    def record() -> dict[str, Any]:
        return {
            "name": f"kernels-{str(dtype).replace('torch.', '')}", "kind": "kernel_scaling",
            "device": str(dev), "dtype": str(dtype).replace("torch.", ""),
            "threads": torch.get_num_threads(), "reps": reps, "clock": clock,
            "lengths": list(lengths),
            "sizes": {"batch": batch, "heads": heads, "head_dim": head_dim, "causal": causal},
            "matmul_flops_per_s": rate, "max_call_s": max_call_s,
            "max_memory_bytes": max_memory_bytes, "seconds": time.time() - t0,
            "results": results, "skipped": skipped,
        }  # fmt: skip

    for length in lengths:
        run = []
        for v in names:
            reason = _skip_reason(v, length, last, batch, heads, itemsize, max_call_s,
                                  max_memory_bytes, results)  # fmt: skip
            if reason:
                skipped[v][str(length)] = reason
            else:
                run.append(v)
        if "dot" not in run:
            break
        while True:  # out of memory: drop the variant that took the most at the last length
            try:
                res = bench_attention(run, "dot", batch=batch, heads=heads, length=length,
                                      head_dim=head_dim, causal=causal, dtype=dtype, device=dev,
                                      reps=reps, warmup=warmup, memory=memory, clock=clock)  # fmt: skip
                flops = variant_flops(run, batch, heads, length, head_dim, causal, dtype, dev)
                break
            except torch.OutOfMemoryError as e:
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
                culprit = _largest(run, results)
                if culprit == "dot":
                    raise
                run.remove(culprit)
                skipped[culprit][str(length)] = f"out of memory ({str(e).splitlines()[0][:80]})"
        for v in run:
            r = res["results"][v]
            fb = r["forward_backward"]["median_s"]
            results[v][str(length)] = {
                "forward_s": r["forward"]["median_s"], "forward_backward_s": fb,
                "forward_ratio": r["forward"]["ratio_median"],
                "forward_backward_ratio": r["forward_backward"]["ratio_median"],
                "peak_memory_bytes": r.get("peak_memory_bytes"), **flops[v],
            }  # fmt: skip
            last[v] = (length, fb)
        if log is not None:
            log(f"L={length}: " + ", ".join(f"{v} {results[v][str(length)]['forward_backward_ratio']:.2f}x"
                                            for v in run))  # fmt: skip
        if on_length is not None:
            on_length(record())
    return record()


def _largest(run: list[str], results: dict[str, Any]) -> str:
    """The variant of ``run`` other than ``dot`` with the largest peak memory at its last length
    (the first of them when no peak was measured); ``dot`` when it is alone."""

    def peak(v: str) -> float:
        by = results[v]
        last = by[max(by, key=int)] if by else {}
        return float(last.get("peak_memory_bytes") or 0)

    others = [v for v in run if v != "dot"]
    return max(others, key=peak) if others else "dot"


def _skip_reason(
    v: str, length: int, last: dict[str, tuple[int, float]], batch: int, heads: int,
    itemsize: int, max_call_s: float, max_memory: float, results: dict[str, Any],
) -> str:  # fmt: skip
    mem = _estimated_bytes(v, batch, heads, length, itemsize)
    peak = _extrapolated(results.get(v, {}), "peak_memory_bytes", length, min_slope=1.0)
    mem = max(mem, peak or 0.0)  # the measured peak, grown by its own slope (at least linear)
    if mem > max_memory:
        return f"estimated memory {mem / 2**30:.1f} GiB > {max_memory / 2**30:.1f} GiB"
    if v in last:
        est = _extrapolated(results[v], "forward_backward_s", length, min_slope=2.0)
        if est is not None and est > max_call_s:
            return f"estimated {est:.0f} s per forward+backward > {max_call_s:g} s"
    return ""


def _extrapolated(
    by_length: dict[str, Any], key: str, length: int, min_slope: float
) -> float | None:
    """``key`` at ``length`` from its value at the longest length measured, grown by the
    log-log slope of the last two lengths (at least ``min_slope``; ``min_slope`` itself with
    one length); None when nothing is measured."""
    pts = sorted((int(n), r[key]) for n, r in by_length.items() if r.get(key))
    if not pts:
        return None
    slope = min_slope
    if len(pts) >= 2:
        (la, ya), (lb, yb) = pts[-2], pts[-1]
        slope = max(min_slope, math.log(yb / ya) / math.log(lb / la))
    return pts[-1][1] * (length / pts[-1][0]) ** slope


def variant_flops(
    run: list[str], batch: int, heads: int, length: int, head_dim: int, causal: bool,
    dtype: torch.dtype, dev: torch.device,
) -> dict[str, dict[str, int]]:  # fmt: skip
    """Matrix-product FLOPs of one forward and one forward+backward of each variant of ``run``
    on ``(batch, heads, length, head_dim)`` inputs."""
    from attention_atlas.attention.registry import build_attention

    g = torch.Generator().manual_seed(0)
    shape = (batch, heads, length, head_dim)
    q, k, v = (
        torch.randn(shape, generator=g, dtype=dtype).to(dev).requires_grad_() for _ in range(3)
    )
    x = torch.randn(batch, length, heads * head_dim, generator=g, dtype=dtype).to(dev)
    out: dict[str, dict[str, int]] = {}
    for name in run:
        mod = build_attention(name, dim=heads * head_dim, n_heads=heads).to(dev, dtype)

        def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, _m: Any = mod) -> torch.Tensor:
            return _m.attend(q, k, v, x=x, causal=causal, mask=None, need_weights=False).out

        out[name] = {"forward_flops": count_flops(fn, q, k, v),
                     "forward_backward_flops": count_flops(fn, q, k, v, backward=True)}  # fmt: skip
    return out


def slopes(record: dict[str, Any], key: str = "forward_backward_s") -> dict[str, float]:
    """The log-log slope of ``key`` against the length, per variant, from a
    :func:`kernel_scaling` record (nan with fewer than two lengths)."""
    from attention_atlas.viz import loglog_slope

    out = {}
    for v, by_len in record["results"].items():
        pts = sorted((int(n), r[key]) for n, r in by_len.items() if r.get(key) is not None)
        out[v] = (
            loglog_slope([p[0] for p in pts], [p[1] for p in pts]) if len(pts) >= 2 else math.nan
        )
    return out
