"""Chapter 3's experiments: low-rank geometry and its real cost (Propositions 4.1 to 4.3).

* :func:`woodbury_identities`, :func:`score_identities`: eq. (14) and the score decompositions
  (eqs. (15), (16), the augmented factorisation) against dense float64 references.
* :func:`work_per_pair`, :func:`flop_ratios`: multiply-adds per query-key pair, counted by hand
  and by :func:`attention_atlas.bench.count_flops`: eq. (16) costs ``(2r + 1) d`` per pair against
  ``d`` for a dot product, not the ``d + r`` of Proposition 4.3.
* :func:`score_cost`, :func:`marginal_rank_cost`: interleaved timings of the score paths against
  ``q @ k^T`` (:func:`attention_atlas.bench.compare`); the cost of one more unit of metric rank
  against the head width.
* :func:`live_attention`, :func:`woodbury_vs_dense`: ``geodesic_attention`` against SDPA, and
  Woodbury against a dense solve; :func:`peak_memory_at` and the paths of
  :func:`attention_paths` serve ``benchmarks/riemannian_attention.py``, whose stored result
  :func:`benchmark_table` and :func:`benchmark_memory` read.

Random draws come from the ``generator`` each function is given, in a fixed order, so a chapter
that calls them in order with one seeded generator reproduces its inputs exactly.
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

from ..attention.riemannian import (
    augmented_dim,
    geodesic_attention,
    geodesic_attention_reference,
    geodesic_scores,
    geodesic_scores_augmented,
    geodesic_scores_decomposed,
    geodesic_scores_dense,
)
from ..bench import compare, count_flops, peak_memory
from ..linalg import metric_dense, metric_inverse_apply, metric_inverse_dense, woodbury_inverse

__all__ = [
    "attention_inputs",
    "attention_paths",
    "benchmark_memory",
    "benchmark_table",
    "dense_solve",
    "flop_ratios",
    "live_attention",
    "load_benchmark",
    "marginal_fit",
    "marginal_rank_cost",
    "peak_memory_at",
    "rel_error",
    "score_cost",
    "score_inputs",
    "score_paths",
    "score_identities",
    "woodbury_identities",
    "woodbury_vs_dense",
    "work_per_pair",
]

F64 = torch.float64
MiB = 2**20


def rel_error(a: Tensor, b: Tensor) -> float:
    """``max |a - b| / max |b|``."""
    return float((a - b).abs().max() / b.abs().max())


def dense_solve(U: Tensor, x: Tensor) -> Tensor:
    """``(I + U U^T)^{-1} x`` by forming the ``(d, d)`` metric and ``torch.linalg.solve``."""
    return torch.linalg.solve(metric_dense(U), x.unsqueeze(-1)).squeeze(-1)


# ---- the identities, in float64 ---------------------------------------------------------------


def woodbury_identities(
    *,
    generator: torch.Generator,
    shapes: Sequence[tuple[int, int]] = ((4, 1), (16, 2), (64, 4), (256, 8), (512, 16)),
) -> pd.DataFrame:
    """Eq. (14) for four tokens per ``(d, r)``: the Woodbury matrix against a dense inverse, and
    :func:`~attention_atlas.linalg.metric_inverse_apply` against a dense solve (relative errors)."""
    rows = []
    for d, r in shapes:
        U = torch.randn(4, d, r, generator=generator, dtype=F64) / math.sqrt(d) * 2
        x = torch.randn(4, d, generator=generator, dtype=F64)
        rows.append({
            "d": d, "r": r,
            "woodbury_matrix_vs_dense_inverse": rel_error(woodbury_inverse(U), metric_inverse_dense(U)),
            "metric_inverse_apply_vs_dense_solve": rel_error(metric_inverse_apply(U, x), dense_solve(U, x)),
        })  # fmt: skip
    return pd.DataFrame(rows)


def score_identities(
    *,
    generator: torch.Generator,
    shapes: Sequence[tuple[int, int, int]] = ((8, 3, 1), (16, 8, 2), (24, 16, 4)),
    tau: float = 1.3,
) -> pd.DataFrame:
    """Eq. (15), eq. (16) and the augmented factorisation against the definition with every
    ``g_ij`` formed, per ``(L, d, r)`` (batch 2; relative errors)."""
    rows = []
    for L, d, r in shapes:
        q, k = (torch.randn(2, L, d, generator=generator, dtype=F64) for _ in range(2))
        U = torch.randn(2, L, d, r, generator=generator, dtype=F64) * 0.7
        ref = geodesic_scores_dense(q, k, U, tau)  # every g_ij formed: the definition
        rows.append({
            "L": L, "d": d, "r": r,
            "eq15_vs_definition": rel_error(geodesic_scores(q, k, U, tau), ref),
            "eq16_vs_definition": rel_error(geodesic_scores_decomposed(q, k, U, tau), ref),
            "augmented_vs_definition": rel_error(geodesic_scores_augmented(q, k, U, tau), ref),
        })  # fmt: skip
    return pd.DataFrame(rows)


# ---- counting the work per pair ---------------------------------------------------------------


def work_per_pair(
    dims: Sequence[int] = (16, 64, 128), ranks: Sequence[int] = (4, 8)
) -> pd.DataFrame:
    """Multiply-adds per query-key pair: dot product ``d``, Proposition 4.3's ``d + r``, eq. (16)
    computed directly ``(2r + 1) d``, and the augmented features ``d^2 + 3d + 1``."""
    return pd.DataFrame([
        {
            "d": d, "r": r, "dot": d, "paper_claim_d_plus_r": d + r,
            "direct_2rd_plus_d": (2 * r + 1) * d, "augmented": augmented_dim(d),
            "direct_over_dot": 2 * r + 1, "paper_over_dot": round(1 + r / d, 3),
        }
        for d in dims for r in ranks
    ])  # fmt: skip


def flop_ratios(
    dims: Sequence[int] = (16, 32, 64, 128),
    ranks: Sequence[int] = (1, 4, 8, 16),
    *,
    generator: torch.Generator,
    length: int = 256,
) -> pd.DataFrame:
    """Matrix-product FLOPs (:func:`~attention_atlas.bench.count_flops`) of the eq. (16) scores
    over those of ``q @ k^T``, for ``length`` tokens of width ``d`` and metric rank ``r``.

    Returns:
        columns ``d, r, eq16_over_dot``, ``count_2r_plus_1`` (the per-pair count) and
        ``paper_1_plus_r_over_d`` (Proposition 4.3's).
    """
    rows = []
    for d in dims:
        for r in ranks:
            q, k = (torch.randn(1, 1, length, d, generator=generator) for _ in range(2))
            U = torch.randn(1, 1, length, d, r, generator=generator)
            dot = count_flops(lambda q, k: q @ k.transpose(-1, -2), q, k)
            eq16 = count_flops(lambda q, k, U: geodesic_scores_decomposed(q, k, U, 1.0), q, k, U)
            rows.append({
                "d": d, "r": r, "eq16_over_dot": eq16 / dot,
                "count_2r_plus_1": 2 * r + 1, "paper_1_plus_r_over_d": 1 + r / d,
            })  # fmt: skip
    return pd.DataFrame(rows)


# ---- measured cost of the scores --------------------------------------------------------------


def score_paths(tau: float) -> dict[str, Callable[[Tensor, Tensor, Tensor], Tensor]]:
    """The ways to compute the ``(..., L, L)`` scores: ``dot`` (``q @ k^T``, the baseline),
    ``eq15_materialised``, ``eq16_decomposed`` and ``augmented_gemm``."""
    return {
        "dot": lambda q, k, U: q @ k.transpose(-1, -2),
        "eq15_materialised": lambda q, k, U: geodesic_scores(q, k, U, tau),
        "eq16_decomposed": lambda q, k, U: geodesic_scores_decomposed(q, k, U, tau),
        "augmented_gemm": lambda q, k, U: geodesic_scores_augmented(q, k, U, tau),
    }


def score_inputs(
    L: int, d: int, r: int, *, generator: torch.Generator, heads: int = 4
) -> tuple[Tensor, Tensor, Tensor]:
    """float32 ``q, k (1, heads, L, d)`` and ``U (1, heads, L, d, r) / sqrt(d)``."""
    q, k = (torch.randn(1, heads, L, d, generator=generator) for _ in range(2))
    U = torch.randn(1, heads, L, d, r, generator=generator) / math.sqrt(d)
    return q, k, U


def _time_scores(
    L: int, d: int, r: int, *, reps: int, generator: torch.Generator
) -> dict[str, dict[str, float]]:
    res = compare(
        score_paths(math.sqrt(2 * d)), "dot", score_inputs(L, d, r, generator=generator),
        reps=reps, backward=False, memory=False,
    )  # fmt: skip
    return {
        name: {"ms": 1e3 * v["forward"]["median_s"], "ratio": v["forward"]["ratio_median"]}
        for name, v in res["results"].items()
    }


def score_cost(
    lengths: Sequence[int],
    head_dims: Sequence[int],
    metric_ranks: Sequence[int],
    *,
    reps: int,
    generator: torch.Generator,
) -> pd.DataFrame:
    """Forward time of every :func:`score_paths` path against ``dot``, in three sweeps: ``"L"``
    (d 16, r 4), ``"d"`` (L 256, r 4) and ``"r"`` (L 256, d 32); batch 1, 4 heads, float32.

    Returns:
        columns ``sweep, L, d, r, path``, ``ms`` (median) and ``ratio`` (median per-round
        ratio to ``dot``).
    """
    settings = [("L", L, 16, 4) for L in lengths]
    settings += [("d", 256, d, 4) for d in head_dims]
    settings += [("r", 256, 32, r) for r in metric_ranks]
    rows = []
    for sweep, L, d, r in settings:
        for name, v in _time_scores(L, d, r, reps=reps, generator=generator).items():
            rows.append({"sweep": sweep, "L": L, "d": d, "r": r, "path": name, **v})
    return pd.DataFrame(rows)


def cost_series(cost: pd.DataFrame, sweep: str) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The ``sweep`` of :func:`score_cost` as ``(x values, {path: median ms})``."""
    part = cost[cost["sweep"] == sweep]
    series = {str(name): g.sort_values(sweep)["ms"].to_numpy() for name, g in part.groupby("path")}
    return np.sort(part[sweep].unique()), series


def marginal_rank_cost(
    dims: Sequence[int], *, reps: int, generator: torch.Generator, length: int = 256
) -> pd.DataFrame:
    """The eq. (16) scores at ``r = 1`` and ``r = 16`` per head width ``d`` (interleaved in one
    comparison with ``q @ k^T``; batch 1, 4 heads).

    Returns:
        columns ``d, ms_r1, ms_r16`` and ``marginal_ms_per_r = (ms_r16 - ms_r1) / 15``.
    """
    rows = []
    for d in dims:
        q, k = (torch.randn(1, 4, length, d, generator=generator) for _ in range(2))
        u1, u16 = (torch.randn(1, 4, length, d, r, generator=generator) / math.sqrt(d) for r in (1, 16))  # fmt: skip
        res = compare(
            {
                "dot": lambda q=q, k=k: q @ k.transpose(-1, -2),
                "r=1": lambda q=q, k=k, u=u1: geodesic_scores_decomposed(q, k, u, 1.0),
                "r=16": lambda q=q, k=k, u=u16: geodesic_scores_decomposed(q, k, u, 1.0),
            },
            "dot", (), reps=reps, backward=False, memory=False,
        )  # fmt: skip
        t = {n: 1e3 * v["forward"]["median_s"] for n, v in res["results"].items()}
        rows.append({"d": d, "ms_r1": t["r=1"], "ms_r16": t["r=16"], "marginal_ms_per_r": (t["r=16"] - t["r=1"]) / 15})  # fmt: skip
    return pd.DataFrame(rows)


def marginal_fit(marginal: pd.DataFrame) -> tuple[float, float]:
    """Least-squares ``marginal_ms_per_r = a + b d``: returns ``(a, b)``."""
    b, a = np.polyfit(marginal["d"], marginal["marginal_ms_per_r"], 1)
    return float(a), float(b)


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


def peak_memory_at(L: int, *, d: int = 16, r: int = 4, heads: int = 2) -> dict[str, int]:
    """Peak bytes of one causal forward+backward (:func:`~attention_atlas.bench.peak_memory`) of
    SDPA, the augmented and the SDPA-padded path, batch 1."""
    args = attention_inputs(1, heads, L, d, r)
    row = {}
    for name, f in attention_paths(math.sqrt(2 * d), True).items():
        if name == "geodesic_lowrank":
            continue

        def step(f: Callable[..., Tensor] = f) -> None:
            f(*args).sum().backward()

        row[name] = peak_memory(step, args[0].device)
    return row


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


def woodbury_vs_dense(
    tokens: int,
    *,
    reps: int,
    generator: torch.Generator,
    d: int = 1024,
    r: int = 8,
    meta: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Proposition 4.1 measured: ``metric_inverse_apply`` (Woodbury) against :func:`dense_solve`
    for ``tokens`` float64 factors ``U ~ N(0, 1) / 32``.

    Returns:
        ``rel_err``, ``speedup`` (median dense time over Woodbury time, per round) and
        ``compare`` (the :func:`~attention_atlas.bench.compare` result).
    """
    U = torch.randn(tokens, d, r, generator=generator, dtype=F64) / 32
    x = torch.randn(tokens, d, generator=generator, dtype=F64)
    err = rel_error(metric_inverse_apply(U, x), dense_solve(U, x))
    res = compare(
        {"dense_solve": dense_solve, "woodbury": metric_inverse_apply},
        "dense_solve", (U, x), reps=reps, backward=False, memory=False, meta=meta,
    )  # fmt: skip
    speedup = 1 / res["results"]["woodbury"]["forward"]["ratio_median"]
    return {"rel_err": err, "speedup": speedup, "compare": res}


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
