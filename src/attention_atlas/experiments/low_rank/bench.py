"""Chapter 3's attention-level measurements: ``geodesic_attention`` against SDPA (time and
peak memory), and the stored benchmark of ``benchmarks/riemannian_attention.py``.

* :func:`attention_inputs`, :func:`attention_paths`: the inputs and the paths (SDPA, the three
  methods of ``geodesic_attention``, the materialised reference) the benchmark compares.
* :func:`peak_memory_at`, :func:`memory_scaling`: peak memory of one causal forward+backward
  (:func:`attention_atlas.bench.timing.peak_memory`), measured live at small sizes.
* :func:`live_attention`: the fast path against SDPA, timed, with its error from the reference.
* :func:`load_benchmark`, :func:`benchmark_table`, :func:`benchmark_memory`: the benchmark's
  stored JSON (large sizes).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor

from attention_atlas.attention.riemannian import geodesic_attention, geodesic_attention_reference
from attention_atlas.bench.timing import compare, peak_memory

__all__ = [
    "attention_inputs",
    "attention_paths",
    "benchmark_memory",
    "benchmark_table",
    "live_attention",
    "load_benchmark",
    "memory_scaling",
    "peak_memory_at",
]

MiB = 2**20


# ---- geodesic attention against SDPA ----------------------------------------------------------


def attention_inputs(
    b: int, h: int, L: int, d: int, r: int, *, dtype: torch.dtype = torch.float32, seed: int = 0
) -> list[Tensor]:
    """``q, k, v (b, h, L, d)`` and ``U = 0.3 N(0, 1) / sqrt(d) (b, h, L, d, r)``, requiring grad."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, L, d, generator=g, dtype=dtype) for _ in range(3))
    U = 0.3 * torch.randn(b, h, L, d, r, generator=g, dtype=dtype) / math.sqrt(d)
    return [t.requires_grad_() for t in (q, k, v, U)]


def attention_paths(tau: float, causal: bool) -> dict[str, Callable[..., Tensor]]:
    """SDPA and the three paths of ``geodesic_attention`` (``fn(q, k, v, U)``)."""

    def geodesic(method: str) -> Callable[..., Tensor]:
        return lambda q, k, v, U: geodesic_attention(q, k, v, U, tau, causal, method=method)  # type: ignore[arg-type]

    return {
        "sdpa": lambda q, k, v, U: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
        "geodesic_augmented": geodesic("augmented"),
        "geodesic_sdpa_padded": geodesic("sdpa"),
        "geodesic_lowrank": geodesic("lowrank"),
    }


def peak_memory_at(
    L: int, *, d: int = 16, r: int = 4, heads: int = 2, reference: bool = False
) -> dict[str, int]:
    """Peak bytes of one causal forward+backward (:func:`~attention_atlas.bench.timing.peak_memory`) of
    SDPA, the augmented and the SDPA-padded path, batch 1; with ``reference`` also of the
    materialised reference (``(L, L)`` scores and ``(L, L, r)`` projections)."""
    if not isinstance(L, int) or L < 1:
        raise ValueError(f"L must be a positive integer, got {L!r}")
    args = attention_inputs(1, heads, L, d, r)
    tau = math.sqrt(2 * d)
    paths = {n: f for n, f in attention_paths(tau, True).items() if n != "geodesic_lowrank"}
    if reference:
        paths["reference"] = lambda q, k, v, U: geodesic_attention_reference(q, k, v, U, tau, True)[0]  # fmt: skip
    row = {}
    for name, f in paths.items():

        def step(f: Callable[..., Tensor] = f) -> None:
            f(*args).sum().backward()

        row[name] = peak_memory(step, args[0].device)
    return row


def memory_scaling(
    lengths: Sequence[int], *, d: int = 16, r: int = 4
) -> tuple[pd.DataFrame, dict[str, float]]:
    """:func:`peak_memory_at` (reference included) at each length, measured now.

    Returns:
        ``(frame, slopes)``: one row per ``(L, path)`` with ``MiB``, and per path the log-log
        slope of its peak memory against ``L`` (1: linear memory, 2: quadratic).
    """
    if len(lengths) < 2:
        raise ValueError(f"lengths must hold at least two lengths for a slope, got {list(lengths)}")
    rows = [
        {"L": L, "path": name, "MiB": b / MiB}
        for L in lengths
        for name, b in peak_memory_at(L, d=d, r=r, reference=True).items()
    ]
    df = pd.DataFrame(rows)
    slopes = {
        str(name): float(np.polyfit(np.log(g["L"]), np.log(g["MiB"]), 1)[0])
        for name, g in df.groupby("path")
    }
    return df, slopes


def live_attention(
    length: int, *, reps: int, generator: torch.Generator, d: int = 16, r: int = 4
) -> dict[str, float]:
    """Causal ``geodesic_attention`` (automatic path) against SDPA, batch 1, 4 heads, float32.

    Returns:
        ``forward_ratio``, ``fwd_bwd_ratio`` (medians), ``threads``, ``peak_MiB`` (one
        forward+backward) and ``max_abs_diff`` from the materialised reference.
    """
    tau = math.sqrt(2 * d)
    q, k, v = (torch.randn(1, 4, length, d, generator=generator).requires_grad_() for _ in range(3))
    U = (0.3 * torch.randn(1, 4, length, d, r, generator=generator) / math.sqrt(d)).requires_grad_()
    live = compare(
        {
            "sdpa": lambda q, k, v, U: F.scaled_dot_product_attention(q, k, v, is_causal=True),
            "geodesic_attention": lambda q, k, v, U: geodesic_attention(q, k, v, U, tau, causal=True),
        },
        "sdpa", (q, k, v, U), reps=reps,
    )  # fmt: skip
    g = live["results"]["geodesic_attention"]
    with torch.no_grad():
        fast = geodesic_attention(q, k, v, U, tau, causal=True)
        err = float((fast - geodesic_attention_reference(q, k, v, U, tau, True)[0]).abs().max())
    return {
        "forward_ratio": g["forward"]["ratio_median"],
        "fwd_bwd_ratio": g["forward_backward"]["ratio_median"],
        "threads": live["threads"],
        "peak_MiB": g["peak_memory_bytes"] / MiB,
        "max_abs_diff": err,
    }


# ---- the stored benchmark (benchmarks/riemannian_attention.py) -------------------------------


def load_benchmark(path: Path) -> dict[str, Any] | None:
    """The benchmark's JSON if it exists and holds the SDPA comparison, else None."""
    bench = json.loads(path.read_text()) if path.exists() else None
    return bench if bench is not None and "vs_sdpa_causal=False" in bench else None


def benchmark_table(bench: dict[str, Any]) -> pd.DataFrame:
    """Per path and causal flag: ``forward_ratio``, ``fwd_bwd_ratio`` (to SDPA) and ``peak_MiB``."""
    return pd.DataFrame([
        {
            "causal": key.endswith("True"), "path": name,
            "forward_ratio": v["forward"]["ratio_median"],
            "fwd_bwd_ratio": v["forward_backward"]["ratio_median"],
            "peak_MiB": v.get("peak_memory_bytes", float("nan")) / MiB,
        }
        for key in ("vs_sdpa_causal=False", "vs_sdpa_causal=True")
        for name, v in bench[key]["results"].items()
    ])  # fmt: skip


def benchmark_memory(bench: dict[str, Any]) -> tuple[list[int], dict[str, list[float]]]:
    """The benchmark's peak memory of one causal forward+backward: ``(lengths, {path: MiB})``
    (empty when it was not measured)."""
    mem = bench.get("peak_memory_bytes_fwd_bwd_B1_H2", {})
    if not mem:
        return [], {}
    Ls = sorted(int(x) for x in mem)
    return Ls, {name: [mem[str(L)][name] / MiB for L in Ls] for name in mem[str(Ls[0])]}
