"""Chapter 7's scaling experiment: SSD's three methods and causal SDPA against sequence length.

The inputs are ``x (batch, L, heads, head_dim)``, ``log_a``, ``B, C (batch, L, heads, state)``
(:func:`make_inputs`), forward pass, no grad. The grid's configurations are its parts:

* ``"sweep"``: time and peak memory of ``recurrent``, ``quadratic``, ``chunked`` SSD and causal
  dot-product SDPA (on ``q, k, v`` of the same sizes) against L, the chapter's log-log plot
  (:func:`time_memory_sweep`, summarised by :func:`sweep_summary`);
* ``"flops"``: matrix-product FLOPs of chunked and quadratic SSD against L, counted exactly by
  :func:`attention_atlas.bench.timing.count_flops` (:func:`flop_growth`: 2x per doubling of L for
  chunked, 4x for quadratic);
* ``"ratio"``, ``"linearity"``, ``"accuracy"``: the issue's performance goals (chunked against
  quadratic at L = 4096 and 16384, chunked time per token from 2048 to 16384, float32 chunked
  against float64 quadratic: :func:`.accuracy.accuracy_check`).

Timings are interleaved by :func:`attention_atlas.bench.timing.compare` (ratios within one round, so a
slow phase of the shared machine cancels); memory is :func:`attention_atlas.bench.timing.peak_memory`.
Presets: ``"smoke"`` (seconds), ``"book"`` (the chapter's caps: sweep and FLOPs), ``"long"``
(every part at the issue's sizes, 10 to 20 minutes on two cores). Run one with
``python -m attention_atlas sweep ssd-scaling --preset long --seeds 0``; the same parts as one
JSON file: ``python benchmarks/bench_ssd.py --out artifacts/bench/ssd.json``.
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd
import torch
from torch import Tensor

from attention_atlas.attention.dot import sdpa
from attention_atlas.attention.sma import ssd
from attention_atlas.bench.timing import compare, count_flops, peak_memory
from attention_atlas.validate import ConfigError, check_count
from attention_atlas.viz import loglog_slope

from .accuracy import Inputs, accuracy_check, make_inputs, say

__all__ = [
    "PARTS",
    "PRESETS",
    "chapter_grid",
    "check_cell",
    "crossover",
    "flop_growth",
    "format_benchmark",
    "linearity_benchmark",
    "make_inputs",
    "quadratic_fn",
    "ratio_benchmark",
    "run_cell",
    "sweep_summary",
    "sweep_table",
    "time_memory_sweep",
]

GiB = 2**30
PARTS = ("sweep", "flops", "ratio", "linearity", "accuracy")
METHODS = ("chunked", "quadratic", "recurrent", "sdpa")

#: the quadratic form holds about this many (batch, heads, L, L) tensors at its peak (measured
#: with attention_atlas.bench.timing.peak_memory at L = 512 and 1024: exactly 3.0)
QUADRATIC_PEAK_TENSORS = 3.0


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


# -- the chapter's sweep: time and memory against L ---------------------------------------------


def _method_fn(
    m: str, inputs: Inputs, budget_bytes: float, chunk_size: int
) -> tuple[Any, str, int]:
    """``(callable or None, note, time factor)`` of method ``m`` on ``inputs``."""
    x, log_a, B, C = inputs
    if m == "quadratic":
        return quadratic_fn(inputs, budget_bytes)
    if m == "sdpa":  # SDPA on (batch, heads, L, d) tensors of the same size
        q, k, v = (t.transpose(1, 2).contiguous() for t in (C, B, x))
        return functools.partial(sdpa, q, k, v, causal=True), "", 1
    return functools.partial(ssd, x, log_a, B, C, method=m, chunk_size=chunk_size), "", 1


def _calibrate(
    lengths: Sequence[int], methods: Sequence[str], max_seconds: float, budget_bytes: float,
    memory: bool, chunk_size: int, verbose: bool, shape: dict[str, Any],
) -> tuple[dict[str, Callable[[], Any]], dict[str, dict[str, Any]], dict[str, str]]:  # fmt: skip
    """Step 1 of :func:`time_memory_sweep`: one timed call and one memory measurement per kept
    (method, L); returns the callables, their metadata and why methods were dropped."""
    last: dict[str, tuple[int, float]] = {}
    skipped: dict[str, str] = {}
    fns: dict[str, Callable[[], Any]] = {}
    info: dict[str, dict[str, Any]] = {}
    for length in lengths:
        inputs = make_inputs(length, **shape)
        for m in (m for m in methods if m not in skipped):
            if m in last:  # predicted from the previous L: t L^2 (quadratic, SDPA), t L (else)
                l0, t0 = last[m]
                pred = t0 * (length / l0) ** (2 if m in ("quadratic", "sdpa") else 1)
                if pred > max_seconds:
                    skipped[m] = (
                        f"skipped from L={length}: predicted {pred:.0f} s > {max_seconds:g} s"
                    )
                    continue
            fn, note, factor = _method_fn(m, inputs, budget_bytes, chunk_size)
            if fn is None:
                skipped[m] = f"skipped from L={length}: {note}"
                continue

            def step(fn: Callable[[], Any] = fn) -> None:
                with torch.no_grad():
                    fn()

            t0 = time.perf_counter()
            step()
            last[m] = (length, factor * (time.perf_counter() - t0))
            peak = quadratic_bytes(inputs) if factor > 1 else None  # predicted: all heads
            if factor == 1 and memory:
                peak = peak_memory(step, inputs[0].device)
            fns[f"{m}@{length}"] = fn
            info[f"{m}@{length}"] = {"method": m, "length": length, "note": note,
                                     "factor": factor, "peak_bytes": peak,
                                     "peak_predicted": factor > 1}  # fmt: skip
        say(verbose, f"[sweep] calibrated L={length}")
    return fns, info, skipped


def time_memory_sweep(
    lengths: Sequence[int],
    *,
    methods: Sequence[str] = METHODS,
    reps: int = 3,
    max_seconds: float = 20.0,
    budget_bytes: float = 4 * GiB,
    memory: bool = True,
    chunk_size: int = 64,
    verbose: bool = False,
    **shape: Any,
) -> list[dict[str, Any]]:
    """Forward time and peak memory of each method at each L (the chapter's log-log plot).

    1. Calibration, L ascending: each method is timed on one call (and its peak memory measured
       on another); a method is dropped from the L on where the time predicted from the previous L
       (``t * ratio^2`` for quadratic and SDPA, ``t * ratio`` otherwise) exceeds
       ``max_seconds``, or where the quadratic form does not fit ``budget_bytes`` even one head
       at a time.
    2. Timing: one :func:`attention_atlas.bench.timing.compare` over every kept (method, L), so all of
       them run in the same rounds and a slow phase of the machine hits every L alike;
       ``ratio_to_chunked`` is the median over rounds of the per-round ratio to chunked at the
       same L.

    Memory is the live-tensor high-water mark of :func:`attention_atlas.bench.timing.peak_memory`
    (forward, no grad). The quadratic form timed on one head (see :func:`quadratic_fn`) has its
    time scaled by the number of heads and its memory predicted (``peak_predicted``).

    Returns:
        One row per measured (method, L): ``method, length, note, peak_bytes, peak_predicted,
        median_s, ratio_to_chunked``; then one row per dropped method: ``method, length=None,
        note`` (why).
    """
    fns, info, skipped = _calibrate(
        lengths, methods, max_seconds, budget_bytes, memory, chunk_size, verbose, shape
    )
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
        say(verbose, f"[sweep] {key}: {rows[-1]['median_s']:.3g} s")
    rows += [{"method": m, "length": None, "note": why} for m, why in skipped.items()]
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


def sweep_table(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The measured rows of :func:`time_memory_sweep` with ``ms`` and ``MiB`` columns added."""
    df = pd.DataFrame([r for r in rows if r.get("length")])
    return df.assign(ms=df.median_s * 1e3, MiB=df.peak_bytes.astype(float) / 2**20)


def sweep_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What the chapter says about a sweep: ``slope`` (fitted exponent of time against L, per
    method with two or more lengths), ``memory_slope`` (the same for peak memory), ``crossover``
    (the L where chunked becomes faster than quadratic, SDPA, recurrent), ``quadratic_last``
    (the largest L where the quadratic form ran and its time ratio to chunked there, or None)
    and ``skips`` (``"method (why)"`` per dropped method)."""
    df = sweep_table(rows)
    groups = [(m, s.sort_values("length")) for m, s in df.groupby("method", sort=False)]
    q = df[df.method == "quadratic"].sort_values("length")
    return {
        "slope": {m: loglog_slope(s.length, s.median_s) for m, s in groups if len(s) > 1},
        "memory_slope": {m: loglog_slope(s.length, s.MiB) for m, s in groups if len(s) > 1},
        "crossover": {b: crossover(rows, "chunked", b) for b in ("quadratic", "sdpa", "recurrent")},
        "quadratic_last": (int(q.length.iloc[-1]), float(q.ratio_to_chunked.iloc[-1]))
        if len(q)
        else None,
        "skips": [f"{r['method']} ({r['note']})" for r in rows if not r.get("length")],
    }


# -- counted work: FLOPs against L --------------------------------------------------------------


def flop_growth(
    lengths: Sequence[int],
    methods: Sequence[str] = ("chunked", "quadratic"),
    *,
    chunk_size: int = 64,
    verbose: bool = False,
    **shape: Any,
) -> dict[str, Any]:
    """Matrix-product FLOPs of :func:`ssd` at each L (:func:`attention_atlas.bench.timing.count_flops`)
    and their growth from one L to the next: ``{"flops": {method: [...]}, "growth": {method:
    [flops(L_{i+1}) / flops(L_i)]}}``. Exact counts, so no timing noise: for lengths that are
    multiples of the chunk size chunked SSD grows as L, the quadratic form as L^2."""
    flops: dict[str, list[int]] = {m: [] for m in methods}
    for length in lengths:
        x, log_a, B, C = make_inputs(length, **shape)
        for m in methods:
            fn = functools.partial(ssd, method=m, chunk_size=chunk_size)
            flops[m].append(count_flops(fn, x, log_a, B, C))
    growth = {m: [b / a for a, b in zip(f, f[1:])] for m, f in flops.items()}
    say(verbose, f"[flops] growth per step of L: {growth}")
    return {"lengths": list(lengths), "flops": flops, "growth": growth}


# -- the benchmark: ratio and linearity (accuracy: :mod:`.accuracy`) ----------------


def ratio_benchmark(
    lengths: Sequence[int], *, reps: int, budget_bytes: float, chunk_size: int = 64,
    verbose: bool = False, **shape: Any,
) -> list[dict[str, Any]]:  # fmt: skip
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
            chunked = functools.partial(ssd, *inputs, chunk_size=chunk_size)
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
        say(verbose, f"[ratio] L={length}: {row.get('speedup', 'n/a')} ({mode})")
    return rows


def linearity_benchmark(
    lengths: Sequence[int], *, reps: int, chunk_size: int = 64, verbose: bool = False,
    **shape: Any,
) -> dict[str, Any]:  # fmt: skip
    """Chunked time against L, interleaved; ``time_per_L_rel`` = (t_L / L) / (t_L0 / L0)."""
    fns: dict[str, Callable[[], Any]] = {
        str(length): functools.partial(ssd, *make_inputs(length, **shape), chunk_size=chunk_size)
        for length in lengths
    }
    res = compare(fns, str(lengths[0]), backward=False, memory=False, reps=reps, warmup=1,
                  min_sample_s=0.1)  # fmt: skip
    rows = []
    for length in lengths:
        f, n = res["results"][str(length)]["forward"], length / lengths[0]
        rows.append({"length": length, "median_s": f["median_s"],
                     "time_per_L_rel": f["ratio_median"] / n,
                     "time_per_L_rel_q25": f["ratio_q25"] / n,
                     "time_per_L_rel_q75": f["ratio_q75"] / n})  # fmt: skip
    rels = [r["time_per_L_rel"] for r in rows]
    say(verbose, f"[linearity] time/L relative to L={lengths[0]}: {rels}")
    return {
        "rows": rows, "threads": res["threads"], "reps": reps, "chunk_size": chunk_size,
        "max_deviation": max(abs(r - 1.0) for r in rels), "spread": max(rels) / min(rels) - 1.0,
    }  # fmt: skip


def format_benchmark(full: dict[str, Any]) -> str:
    """The tables of a stored benchmark run (``benchmarks/bench_ssd.py``'s JSON) as text."""
    ratio = pd.DataFrame(full.get("ratio", []))
    cols = ["length", "chunked_s", "quadratic_s", "speedup", "speedup_q25", "speedup_q75",
            "quadratic_mode"]  # fmt: skip
    parts = [
        ratio[[c for c in cols if c in ratio]].to_string(index=False, float_format="{:.3g}".format)
    ]
    if lin := full.get("linearity"):
        parts.append(pd.DataFrame(lin["rows"]).to_string(index=False, float_format="{:.3g}".format))
        parts.append(f"largest deviation of time/L from L = {lin['rows'][0]['length']}: "
                     f"{lin['max_deviation']:.1%}")  # fmt: skip
    if full.get("accuracy"):
        parts.append(
            pd.DataFrame(full["accuracy"]).to_string(index=False, float_format="{:.2e}".format)
        )
    return "\n".join(parts)


# -- the grid for the sweep runner --------------------------------------------------------------

_SMOKE_SHAPE = {"heads": 2, "head_dim": 16, "state": 16}
#: the experiment's name on the command line and in the results store
NAME = "ssd-scaling"

PRESETS: dict[str, dict[str, Any]] = {
    "smoke": {
        "lengths": [64, 128],
        "flop_lengths": [64, 128, 256],
        "ratio_lengths": [256, 512],
        "linear_lengths": [256, 512, 1024],
        "accuracy_length": 300,
        "reps": 1,
        "ratio_reps": 1,
        "parts": list(PARTS),
        **_SMOKE_SHAPE,
    },
    "book": {},
    "long": {"parts": list(PARTS), "max_seconds": 20.0, "memory_gb": 4.0},
}


def chapter_grid(
    *,
    parts: Sequence[str] = ("sweep", "flops"),
    lengths: Sequence[int] = (256, 512, 1024, 2048, 4096, 8192, 16384),
    flop_lengths: Sequence[int] = (256, 512, 1024, 2048),
    ratio_lengths: Sequence[int] = (1024, 4096, 16384),
    linear_lengths: Sequence[int] = (2048, 4096, 8192, 16384),
    accuracy_length: int = 4096,
    heads: int = 8,
    head_dim: int = 64,
    state: int = 64,
    chunk_size: int = 64,
    reps: int = 3,
    ratio_reps: int = 5,
    max_seconds: float = 6.0,
    memory_gb: float = 2.0,
) -> dict[str, dict[str, Any]]:
    """One configuration per part (see the module doc), with the parameters it needs. The
    defaults are the chapter's (batch 1, 8 heads, head dim 64, state 64, float32). ``reps``:
    rounds of the sweep; ``ratio_reps``: of the ratio (at least 9 for linearity)."""
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        raise ValueError(f"unknown part(s) {unknown}; known: {', '.join(PARTS)}")
    shape = {"heads": heads, "head_dim": head_dim, "state": state, "chunk_size": chunk_size}
    grid: dict[str, dict[str, Any]] = {
        "sweep": {"lengths": list(lengths), "reps": reps, "max_seconds": max_seconds,
                  "memory_gb": memory_gb},
        "flops": {"lengths": list(flop_lengths)},
        "ratio": {"lengths": list(ratio_lengths), "reps": ratio_reps, "memory_gb": memory_gb},
        "linearity": {"lengths": list(linear_lengths), "reps": max(ratio_reps, 9)},
        "accuracy": {"length": accuracy_length},
    }  # fmt: skip
    return {p: {"part": p, **grid[p], **shape} for p in parts}


#: the grid parameter each cell parameter comes from (for the messages of :func:`check_cell`)
_GRID_NAME = {
    "sweep": {"lengths": "lengths", "reps": "reps"},
    "flops": {"lengths": "flop_lengths"},
    "ratio": {"lengths": "ratio_lengths", "reps": "ratio_reps"},
    "linearity": {"lengths": "linear_lengths", "reps": "ratio_reps"},
    "accuracy": {"length": "accuracy_length"},
}


def check_cell(params: dict[str, Any]) -> None:
    """Check one configuration's parameters before any work: ``part`` one of :data:`PARTS`;
    ``heads``, ``head_dim``, ``state``, ``chunk_size`` integers >= 1; the part's sequence
    lengths a non-empty list of distinct integers >= 1 (``length`` for ``accuracy``), its
    rounds ``reps`` >= 1, its time cap ``max_seconds`` and memory budget ``memory_gb`` finite
    numbers > 0. Nothing is drawn or timed. Raises ConfigError (one line)."""
    part = params.get("part")
    if part not in PARTS:
        raise ConfigError(f"parts: expected names from {', '.join(PARTS)}, got {part!r}")
    names = _GRID_NAME[part]
    for key in ("heads", "head_dim", "state", "chunk_size"):
        check_count(key, params[key])
    if "lengths" in params:
        lengths = params["lengths"]
        if not isinstance(lengths, list) or not lengths:
            raise ConfigError(f"{names['lengths']}: expected a non-empty list, got {lengths!r}")
        for length in lengths:
            check_count(names["lengths"], length)
        if len(set(lengths)) != len(lengths):
            raise ConfigError(f"{names['lengths']}: expected distinct lengths, got {lengths}")
    if "length" in params:
        check_count(names.get("length", "length"), params["length"])
    if "reps" in params:
        check_count(names.get("reps", "reps"), params["reps"])
    for key in ("max_seconds", "memory_gb"):
        if key in params:
            value = params[key]
            number = not isinstance(value, bool) and isinstance(value, int | float)
            if not (number and math.isfinite(value) and value > 0):
                raise ConfigError(f"{key}: expected a finite number > 0, got {value!r}")


def run_cell(params: dict[str, Any], seed: int) -> dict[str, Any]:
    """Run one part of :func:`chapter_grid` with inputs drawn at ``seed``.

    Returns the part's scalars and, in the cell's JSON only, its ``rows`` (and for ``"flops"``
    the counts and growth): ``sweep``: ``slope_<method>``, ``crossover_<baseline>``;
    ``flops``: ``growth_<method>_max`` / ``_min``; ``ratio``: ``speedup_<L>``; ``linearity``:
    ``max_deviation``, ``spread``; ``accuracy``: ``rel_fro_<decay>``.
    """
    p = dict(params)
    part, lengths = p.pop("part"), p.pop("lengths", None)
    budget = p.pop("memory_gb", 4.0) * GiB
    kw = {**p, "seed": seed}
    if part == "sweep":
        rows = time_memory_sweep(lengths, reps=kw.pop("reps"), max_seconds=kw.pop("max_seconds"),
                                 budget_bytes=budget, **kw)  # fmt: skip
        s = sweep_summary(rows)
        return {**{f"slope_{m}": v for m, v in s["slope"].items()},
                **{f"crossover_{b}": v for b, v in s["crossover"].items()}, "rows": rows}  # fmt: skip
    if part == "flops":
        res = flop_growth(lengths, **kw)
        ext = {
            f"growth_{m}_{f.__name__}": f(g) for m, g in res["growth"].items() for f in (max, min)
        }
        return {**ext, **res}
    if part == "ratio":
        rows = ratio_benchmark(lengths, reps=kw.pop("reps"), budget_bytes=budget, **kw)
        return {**{f"speedup_{r['length']}": r.get("speedup") for r in rows}, "rows": rows}
    if part == "linearity":
        return linearity_benchmark(lengths, reps=kw.pop("reps"), **kw)
    if part == "accuracy":
        rows = accuracy_check(kw.pop("length"), **kw)
        return {**{f"rel_fro_{r['decay']}": r["rel_fro"] for r in rows}, "rows": rows}
    raise ValueError(f"unknown part {part!r}; known: {', '.join(PARTS)}")
