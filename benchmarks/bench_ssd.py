"""SSD (Mamba-2 state-space dual): chunked against the quadratic masked-attention form, in one run.

Shapes from issue 8: batch 1, 8 heads, head dim 64, state 64, float32, forward pass.

1. ``ratio``: chunked against quadratic at L = 4096 and 16384 (goals: >= 80x and >= 300x), timed
   interleaved by :func:`attention_atlas.bench.compare` (median of per-round ratios). The
   quadratic form materialises ``(batch, heads, L, L)`` tensors (peak about 3 of them); when
   that exceeds ``--memory-budget-gb`` it can only run one head at a time, so one head is
   timed and its time multiplied by the number of heads (identical, independent heads), and
   the JSON says so; when even one head does not fit it is skipped.
2. ``linearity``: chunked at L = 2048 ... 16384, interleaved; time / L against L = 2048
   (goal: within 10 %).
3. ``accuracy``: float32 chunked against float64 quadratic (head by head) at L = 4096 with
   strong and weak decay (goal: relative error <= 1e-4).
4. ``sweep``: time and peak memory (forward) of recurrent, quadratic, chunked SSD and causal
   dot-product SDPA against L (the chapter's log-log plot); a method is skipped at an L whose
   predicted time exceeds ``--max-seconds`` or whose predicted memory exceeds the budget.

Run (about 10 to 20 minutes on 2 shared CPU cores)::

    python benchmarks/bench_ssd.py --out artifacts/bench/ssd.json

``--small`` runs every part at tiny sizes (seconds). Chapter 7 imports this file for its own,
smaller sweep and loads the JSON when it exists.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from attention_atlas.attention.dot import sdpa
from attention_atlas.attention.sma import ssd
from attention_atlas.bench import compare, peak_memory

Inputs = tuple[Tensor, Tensor, Tensor, Tensor]
GiB = 2**30

#: the quadratic form holds about this many (batch, heads, L, L) tensors at its peak (measured
#: with attention_atlas.bench.peak_memory at L = 512 and 1024: exactly 3.0)
QUADRATIC_PEAK_TENSORS = 3.0


def make_inputs(
    length: int,
    *,
    batch: int = 1,
    heads: int = 8,
    head_dim: int = 64,
    state: int = 64,
    decay: str = "mamba",
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> Inputs:
    """Random ``x, log_a, B, C`` for :func:`ssd`.

    ``decay``: ``"mamba"`` (``log_a = -A dt`` with ``A ~ U(1, 16)`` per head and
    ``dt`` log-uniform in ``[1e-3, 1e-1]``, Mamba-2's initial range), ``"strong"``
    (``log_a ~ -U(0, 4)``) or ``"weak"`` (``log_a ~ -U(0, 1e-3)``: memory over the whole sequence).
    """
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, length, heads, head_dim, generator=g, dtype=torch.float64)
    B = torch.randn(batch, length, heads, state, generator=g, dtype=torch.float64) / state**0.5
    C = torch.randn(batch, length, heads, state, generator=g, dtype=torch.float64) / state**0.5
    u = torch.rand(batch, length, heads, generator=g, dtype=torch.float64)
    if decay == "mamba":
        A = 1.0 + 15.0 * torch.rand(heads, generator=g, dtype=torch.float64)
        log_a = -A * torch.exp(math.log(1e-3) + u * math.log(100.0))
    elif decay == "strong":
        log_a = -4.0 * u
    elif decay == "weak":
        log_a = -1e-3 * u
    else:
        raise ValueError(f"decay must be 'mamba', 'strong' or 'weak', got {decay!r}")
    return tuple(t.to(dtype) for t in (x, log_a, B, C))  # type: ignore[return-value]


def quadratic_bytes(inputs: Inputs, per_head: bool = False) -> int:
    """Predicted peak bytes of the quadratic form (all heads, or one head)."""
    b, length, h, _ = inputs[0].shape
    heads = 1 if per_head else h
    return int(QUADRATIC_PEAK_TENSORS * b * heads * length**2 * inputs[0].element_size())


def quadratic_fn(
    inputs: Inputs, budget_bytes: float
) -> tuple[Callable[[], Tensor] | None, str, int]:
    """The quadratic form as a callable that fits the memory budget, and its time factor.

    * all heads fit: ``(fn, "all heads", 1)``;
    * one head fits: ``(fn on head 0 only, "one head timed x H", H)``: run head by head, the
      quadratic form's time is H times one head's (the heads are independent and identical in
      size), so a caller multiplies the measured time by the factor instead of running all H;
    * otherwise ``(None, reason, 0)``.
    """
    x, log_a, B, C = inputs
    heads = x.shape[2]
    if quadratic_bytes(inputs) <= budget_bytes:
        return functools.partial(ssd, x, log_a, B, C, method="quadratic"), "all heads", 1
    if quadratic_bytes(inputs, per_head=True) <= budget_bytes:
        one = (t[:, :, :1].contiguous() for t in inputs)
        fn = functools.partial(ssd, *one, method="quadratic")
        return fn, f"one head timed x {heads} (head by head)", heads
    return None, "skipped: one head exceeds the memory budget", 0


def _meta(inputs: Inputs) -> dict[str, Any]:
    b, length, h, p = inputs[0].shape
    return {
        "batch": b, "length": length, "heads": h, "head_dim": p, "state": inputs[2].shape[-1],
        "dtype": str(inputs[0].dtype).replace("torch.", ""),
    }  # fmt: skip


def ratio_benchmark(
    lengths: Sequence[int], *, reps: int, budget_bytes: float, chunk_size: int = 64, **shape: Any
) -> list[dict[str, Any]]:
    """Chunked against quadratic, forward, interleaved; ``speedup`` = quadratic / chunked."""
    rows = []
    for length in lengths:
        inputs = make_inputs(length, **shape)
        quad, mode, factor = quadratic_fn(inputs, budget_bytes)
        row: dict[str, Any] = {
            **_meta(inputs), "chunk_size": chunk_size, "quadratic_mode": mode,
            "quadratic_time_factor": factor,
            "quadratic_all_heads_peak_bytes_predicted": quadratic_bytes(inputs),
            "quadratic_one_head_peak_bytes_predicted": quadratic_bytes(inputs, per_head=True),
            "memory_budget_bytes": budget_bytes,
        }  # fmt: skip
        if quad is not None:
            x, log_a, B, C = inputs

            def chunked(x: Tensor = x, log_a: Tensor = log_a, B: Tensor = B, C: Tensor = C) -> Any:
                return ssd(x, log_a, B, C, chunk_size=chunk_size)

            res = compare(
                {"chunked": chunked, "quadratic": quad},
                "chunked", backward=False, memory=False, reps=reps, warmup=1, min_sample_s=0.0,
            )  # fmt: skip
            fq, fc = res["results"]["quadratic"]["forward"], res["results"]["chunked"]["forward"]
            row.update(
                chunked_s=fc["median_s"], quadratic_s=factor * fq["median_s"],
                speedup=factor * fq["ratio_median"], speedup_q25=factor * fq["ratio_q25"],
                speedup_q75=factor * fq["ratio_q75"], threads=res["threads"], reps=reps,
            )  # fmt: skip
        rows.append(row)
        print(f"[ratio] L={length}: {row.get('speedup', 'n/a')} ({mode})", file=sys.stderr)
    return rows


def linearity_benchmark(
    lengths: Sequence[int], *, reps: int, chunk_size: int = 64, **shape: Any
) -> dict[str, Any]:
    """Chunked time against L, interleaved; ``time_per_L_rel`` = (t_L / L) / (t_L0 / L0)."""
    fns: dict[str, Callable[[], Any]] = {}
    for length in lengths:
        x, log_a, B, C = make_inputs(length, **shape)
        fns[str(length)] = functools.partial(ssd, x, log_a, B, C, chunk_size=chunk_size)
    base = str(lengths[0])
    res = compare(fns, base, backward=False, memory=False, reps=reps, warmup=1, min_sample_s=0.1)
    rows = []
    for length in lengths:
        f = res["results"][str(length)]["forward"]
        rel = f["ratio_median"] / (length / lengths[0])
        rows.append({"length": length, "median_s": f["median_s"], "time_per_L_rel": rel,
                     "time_per_L_rel_q25": f["ratio_q25"] / (length / lengths[0]),
                     "time_per_L_rel_q75": f["ratio_q75"] / (length / lengths[0])})  # fmt: skip
    rels = [r["time_per_L_rel"] for r in rows]
    out = {
        "rows": rows, "threads": res["threads"], "reps": reps, "chunk_size": chunk_size,
        "max_deviation": max(abs(r - 1.0) for r in rels),
        "spread": max(rels) / min(rels) - 1.0,
    }  # fmt: skip
    print(f"[linearity] time/L relative to L={lengths[0]}: {rels}", file=sys.stderr)
    return out


def accuracy_check(
    length: int, decays: Sequence[str] = ("strong", "weak", "mamba"), chunk_size: int = 64,
    **shape: Any,
) -> list[dict[str, Any]]:  # fmt: skip
    """Relative error ``|y32 - y64| / |y64|`` (Frobenius) of float32 chunked against float64
    quadratic (one head at a time), and the max-abs error relative to ``max |y64|``."""
    rows = []
    for decay in decays:
        x, log_a, B, C = make_inputs(length, decay=decay, dtype=torch.float64, **shape)
        with torch.no_grad():
            ref = torch.cat(
                [ssd(x[:, :, i : i + 1], log_a[:, :, i : i + 1], B[:, :, i : i + 1],
                     C[:, :, i : i + 1], method="quadratic")  # type: ignore[misc]
                 for i in range(x.shape[2])], dim=2,
            )  # fmt: skip
            y32 = ssd(x.float(), log_a.float(), B.float(), C.float(), chunk_size=chunk_size)
            assert isinstance(y32, Tensor)
            err = y32.double() - ref
        rows.append({
            "decay": decay, "length": length, "rel_fro": float(err.norm() / ref.norm()),
            "rel_max": float(err.abs().max() / ref.abs().max()),
            "log_a_min": float(log_a.min()), "log_a_max": float(log_a.max()),
        })  # fmt: skip
        print(f"[accuracy] {decay}: {rows[-1]['rel_fro']:.2e}", file=sys.stderr)
    return rows


def sweep(
    lengths: Sequence[int],
    *,
    methods: Sequence[str] = ("chunked", "quadratic", "recurrent", "sdpa"),
    reps: int = 3,
    max_seconds: float = 20.0,
    budget_bytes: float = 4 * GiB,
    memory: bool = True,
    chunk_size: int = 64,
    verbose: bool = True,
    **shape: Any,
) -> list[dict[str, Any]]:
    """Forward time and peak memory of each method at each L (the chapter's log-log plot).

    1. Calibration, L ascending: each method is timed on one call (and its peak memory measured
       on another); a method is dropped from the L on where the time predicted from the previous L
       (``t * ratio^2`` for quadratic and SDPA, ``t * ratio`` otherwise) exceeds
       ``max_seconds``, or where the quadratic form does not fit ``budget_bytes`` even one head
       at a time.
    2. Timing: one :func:`attention_atlas.bench.compare` over every kept (method, L), so all of
       them run in the same rounds and a slow phase of the machine hits every L alike;
       ``ratio_to_chunked`` is the median over rounds of the per-round ratio to chunked at the
       same L.

    Memory is the live-tensor high-water mark of :func:`attention_atlas.bench.peak_memory`
    (forward, no grad). The quadratic form timed on one head (see :func:`quadratic_fn`) has its
    time scaled by the number of heads and its memory predicted (``peak_predicted``).
    """
    last: dict[str, tuple[int, float]] = {}
    skipped: dict[str, str] = {}
    fns: dict[str, Callable[[], Any]] = {}
    info: dict[str, dict[str, Any]] = {}
    for length in lengths:
        inputs = make_inputs(length, **shape)
        x, log_a, B, C = inputs
        q = C.transpose(1, 2).contiguous()  # SDPA on (batch, heads, L, d) tensors of the same size
        k = B.transpose(1, 2).contiguous()
        v = x.transpose(1, 2).contiguous()
        for m in methods:
            if m in skipped:
                continue
            power = 2 if m in ("quadratic", "sdpa") else 1
            if m in last:
                l0, t0 = last[m]
                pred = t0 * (length / l0) ** power
                if pred > max_seconds:
                    skipped[m] = (
                        f"skipped from L={length}: predicted {pred:.0f} s > {max_seconds:g} s"
                    )
                    continue
            note, factor = "", 1
            fn: Callable[[], Any] | None
            if m == "quadratic":
                fn, note, factor = quadratic_fn(inputs, budget_bytes)
                if fn is None:
                    skipped[m] = f"skipped from L={length}: {note}"
                    continue
            elif m == "sdpa":
                fn = functools.partial(sdpa, q, k, v, causal=True)
            else:
                fn = functools.partial(ssd, x, log_a, B, C, method=m, chunk_size=chunk_size)

            def step(fn: Callable[[], Any] = fn) -> None:
                with torch.no_grad():
                    fn()

            t0 = time.perf_counter()
            step()
            last[m] = (length, factor * (time.perf_counter() - t0))
            peak: int | None = None
            if factor > 1:
                peak = quadratic_bytes(inputs)  # predicted: all heads do not fit
            elif memory:
                peak = peak_memory(step, x.device)
            key = f"{m}@{length}"
            fns[key] = fn
            info[key] = {"method": m, "length": length, "note": note, "factor": factor,
                         "peak_bytes": peak, "peak_predicted": factor > 1}  # fmt: skip
        if verbose:
            print(f"[sweep] calibrated L={length}", file=sys.stderr)
    if f"chunked@{lengths[0]}" not in fns:
        raise ValueError("the sweep needs the chunked method (it is the baseline)")
    res = compare(fns, f"chunked@{lengths[0]}", backward=False, memory=False, reps=reps,
                  warmup=1, min_sample_s=0.05)  # fmt: skip
    rows: list[dict[str, Any]] = []
    for key, meta in info.items():
        f = res["results"][key]["forward"]
        base = res["results"][f"chunked@{meta['length']}"]["forward"]["samples_s"]
        fac = meta.pop("factor")
        ratios = [fac * a / b for a, b in zip(f["samples_s"], base)]
        rows.append({**meta, "median_s": fac * f["median_s"],
                     "ratio_to_chunked": statistics.median(ratios)})  # fmt: skip
    if verbose:
        for r in rows:
            print(f"[sweep] {r['method']} L={r['length']}: {r['median_s']:.3g} s", file=sys.stderr)
    for m, why in skipped.items():
        rows.append({"method": m, "length": None, "note": why})
    return rows


def crossover(rows: list[dict[str, Any]], a: str, b: str) -> float | None:
    """The L (log-log interpolated) where method ``a`` becomes faster than ``b``, or None."""
    ta = {r["length"]: r["median_s"] for r in rows if r["method"] == a and r.get("length")}
    tb = {r["length"]: r["median_s"] for r in rows if r["method"] == b and r.get("length")}
    common = sorted(set(ta) & set(tb))
    for l0, l1 in zip(common, common[1:]):
        d0, d1 = math.log(ta[l0] / tb[l0]), math.log(ta[l1] / tb[l1])
        if d0 > 0 >= d1:
            w = d0 / (d0 - d1)
            return float(math.exp(math.log(l0) + w * (math.log(l1) - math.log(l0))))
    if common and ta[common[0]] <= tb[common[0]]:
        return float(common[0])  # faster already at the smallest L measured
    return None


def run(
    args: argparse.Namespace, save: Callable[[dict[str, Any]], object] | None = None
) -> dict[str, Any]:
    """Run the parts named in ``args.parts``; ``save(out)`` is called after each part."""
    save = save or (lambda out: None)
    torch.set_num_threads(args.threads)
    budget = args.memory_budget_gb * GiB
    small = args.small
    out: dict[str, Any] = {
        "command": " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
        "torch": torch.__version__, "threads": torch.get_num_threads(),
        "machine": platform.processor() or platform.machine(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "memory_budget_bytes": budget, "small": small,
    }  # fmt: skip
    shape: dict[str, Any] = {"heads": 2, "head_dim": 16, "state": 16} if small else {}
    if "ratio" in args.parts:
        lengths = [256, 512] if small else args.ratio_lengths
        out["ratio"] = ratio_benchmark(lengths, reps=args.reps, budget_bytes=budget, **shape)
        save(out)
    if "linearity" in args.parts:
        lengths = [256, 512, 1024] if small else args.linear_lengths
        out["linearity"] = linearity_benchmark(lengths, reps=max(args.reps, 9), **shape)
        save(out)
    if "accuracy" in args.parts:
        out["accuracy"] = accuracy_check(300 if small else args.accuracy_length, **shape)
        save(out)
    if "sweep" in args.parts:
        lengths = [64, 128, 256] if small else args.sweep_lengths
        rows = sweep(lengths, reps=3, max_seconds=args.max_seconds, budget_bytes=budget, **shape)
        out["sweep"] = rows
        out["crossover"] = {
            "chunked_beats_quadratic": crossover(rows, "chunked", "quadratic"),
            "chunked_beats_sdpa": crossover(rows, "chunked", "sdpa"),
            "chunked_beats_recurrent": crossover(rows, "chunked", "recurrent"),
        }
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", default="artifacts/bench/ssd.json")
    p.add_argument("--parts", nargs="+", default=["ratio", "linearity", "accuracy", "sweep"],
                   choices=["ratio", "linearity", "accuracy", "sweep"])  # fmt: skip
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
    print(json.dumps({k: out[k] for k in ("ratio", "linearity", "accuracy", "crossover") if k in out},
                     indent=1))  # fmt: skip
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
