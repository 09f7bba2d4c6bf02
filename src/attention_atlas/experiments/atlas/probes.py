"""The book's analyses, run on any registered variant: score rank against length (chapter 1),
rank collapse in depth (chapter 2) and cost against SDPA (chapter 8), each as a tidy frame for
one seed (a sweep cell runs one), with its figure.

Every probe builds the variant by name (:func:`~.contract.build_seeded`) and calls only its
public interface, so it takes a variant it has never seen. A variant that raises does not stop
the caller: the rows it could not fill hold NaN and an ``error`` column says why, on one line
(``""`` on rows that ran).

* :func:`score_rank_frame`: the numerical rank of the layer's score matrix. A module shows its
  scores only through its probabilities, so the probe measures ``log P`` minus its row means:
  ``log P_ij = S_ij - logsumexp_j S_ij``, the row shift cancels on centring, and the rank is that
  of the row-centred logits (``S (I - 1 1^T / L)``), at most ``L - 1`` (column ``full``).
  Chapter 1's ranks of raw scores are at most one more. Dot products give at most ``d_head``.
* :func:`depth_frame`: Dong et al.'s relative residual ``||X - 1 xbar^T|| / ||X||`` (the
  composite ``(1, inf)`` norm of :func:`attention_atlas.linalg.relative_residual`, as chapter 2
  measures it) after each of ``depth`` freshly initialised layers, with and without residual
  connections; :func:`collapse_depth` reads the first layer below chapter 2's floor
  (:data:`~attention_atlas.experiments.rank_collapse.stacks.COLLAPSED`).
* :func:`cost_frame`: time (forward, forward+backward) and peak memory of the variant's
  :meth:`~attention_atlas.attention.base.Attention.attend` against SDPA on the same
  ``q, k, v (B, H, L, d)``, interleaved (:func:`attention_atlas.bench.timing.compare`), with
  FLOPs counted by :func:`attention_atlas.bench.timing.count_flops`: the kernel-level comparison
  of chapter 8's records, so a new variant sits beside the zoo's stored rows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from numbers import Integral
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch
from torch import Tensor

from attention_atlas import viz
from attention_atlas.attention import Attention
from attention_atlas.attention.dot import sdpa
from attention_atlas.bench.scaling import floor_ratio, matmul_rate
from attention_atlas.bench.timing import compare, count_flops, peak_memory
from attention_atlas.experiments.rank_collapse.stacks import COLLAPSED, collapse_layer
from attention_atlas.linalg import numerical_rank, relative_residual
from attention_atlas.validate import ConfigError, check_count, check_device, one_line

from .contract import build_seeded, call_layer, gaussian_input

__all__ = [
    "COST_COLUMNS",
    "DEPTH_COLUMNS",
    "PASSES",
    "RANK_COLUMNS",
    "attention_stack",
    "centred_log_rank",
    "collapse_depth",
    "cost_figure",
    "cost_frame",
    "cost_slope",
    "cost_table",
    "depth_figure",
    "depth_frame",
    "rank_figure",
    "score_rank_frame",
    "seed_medians",
]

F64 = torch.float64
RANK_COLUMNS = ["variant", "length", "d_head", "seed", "rank", "full", "note", "error"]
DEPTH_COLUMNS = ["variant", "residual", "seed", "layer", "rel_residual", "rms", "note", "error"]
COST_COLUMNS = [
    "variant", "length", "pass", "ms", "ms_sdpa", "ratio", "ratio_q25", "ratio_q75", "peak_mb",
    "peak_mb_sdpa", "flops", "flops_sdpa", "gflops_per_s", "gflops_per_s_sdpa", "floor_ratio",
    "batch", "n_heads", "d_head", "seed", "device", "clock", "memory_method", "error",
]  # fmt: skip
#: the passes of :func:`cost_frame`, as its ``pass`` column spells them
PASSES = ("forward", "forward+backward")


def _error(e: BaseException) -> str:
    return one_line(f"{type(e).__name__}: {e}", 300)


def _check_sizes(what: str, **sizes: Any) -> None:
    for name, value in sizes.items():
        check_count(f"{what} {name}", value)


def _check_list(what: str, name: str, values: Any) -> list[int]:
    """A non-empty list of positive integers, else one-line :class:`ConfigError`."""
    vals = list(values) if isinstance(values, Sequence) and not isinstance(values, str) else None
    if not vals or any(isinstance(v, bool) or not isinstance(v, Integral) or v < 1 for v in vals):
        raise ConfigError(
            f"{what} {name}: expected a non-empty list of integers >= 1, got {values!r}"
        )
    return [int(v) for v in vals]


# -- score rank (chapter 1) ----------------------------------------------------------------


def centred_log_rank(probs: Tensor, rtol: float) -> tuple[float, str]:
    """Numerical rank of ``log P`` minus its row means for one ``(L, L)`` matrix of weights, and
    a note (``""``, or why no rank: zeros, non-finite or non-distribution rows)."""
    P = probs.detach().to(F64)
    if not bool(torch.isfinite(P).all()):
        return math.nan, "non-finite weights"
    off = float((P.sum(-1) - 1).abs().max())
    if off > 1e-6 or bool((P < 0).any()):
        return math.nan, f"weights are not distributions (a row sums {off:.2g} off 1): no log rank"
    if bool((P == 0).any()):
        return math.nan, "weights with zeros (log P undefined): no log rank"
    logP = P.log()
    return float(numerical_rank(logP - logP.mean(-1, keepdim=True), rtol=rtol)), ""


def _rank_at(layer: Attention, L: int, seed: int, rtol: float) -> tuple[float, str]:
    """The largest centred log rank over the heads of ``layer`` on Gaussian ``x (1, L, D)``."""
    x = gaussian_input(1, L, layer.dim, seed=seed, dtype=F64)
    try:
        with torch.no_grad():
            probs = call_layer(layer, x, causal=False, need_weights=True).probs
    except ValueError as e:  # a causal-only variant (an SSM) has no unmasked scores
        if "causal" not in str(e):
            raise
        return math.nan, f"causal-only variant: no unmasked scores ({_error(e)})"
    if probs is None:
        return math.nan, "the variant returns no weights (probs is None)"
    ranks = [centred_log_rank(probs[0, h], rtol) for h in range(probs.shape[1])]
    notes = [n for _, n in ranks if n]
    return (math.nan, notes[0]) if notes else (max(r for r, _ in ranks), "")


def score_rank_frame(
    name: str,
    options: dict[str, Any] | None = None,
    *,
    lengths: Sequence[int],
    head_dims: Sequence[int],
    seed: int = 0,
    rtol: float = 1e-9,
    n_heads: int = 1,
) -> pd.DataFrame:
    """The numerical rank of the variant's (row-centred) score matrix against length and head
    width, in float64, without a mask (see the module docstring for the measure).

    For each ``d_head`` one layer ``(dim = n_heads d_head)`` is built from ``seed``; for each
    length ``x (1, L, dim)`` is Gaussian (seed ``seed``), the weights ``(1, H, L, L)`` come from
    ``need_weights=True``, and the rank is the largest over heads of
    :func:`~attention_atlas.linalg.numerical_rank` at relative tolerance ``rtol`` (chapter 1's).

    Returns:
        one row per ``(length, d_head)``: ``variant, length, d_head, seed, rank`` (float; NaN
        without a rank), ``full`` (``L - 1``, the most a row-centred matrix can have),
        ``note`` (why no rank: weights None, zeros or not distributions, a causal-only variant
        that refuses ``causal=False``) and ``error``.
    """
    lengths = _check_list("score_rank_frame", "lengths", lengths)
    head_dims = _check_list("score_rank_frame", "head_dims", head_dims)
    _check_sizes("score_rank_frame", n_heads=n_heads)
    if not (isinstance(rtol, float | int) and 0 < rtol < 1):
        raise ConfigError(f"score_rank_frame rtol: expected a number in (0, 1), got {rtol!r}")
    rows = []
    for d in head_dims:
        layer: Attention | None = None
        try:
            layer = build_seeded(name, options, dim=n_heads * d, n_heads=n_heads, seed=seed,
                                 dtype=F64)  # fmt: skip
            build_error = ""
        except Exception as e:
            build_error = _error(e)
        for L in lengths:
            rank, note, error = math.nan, "", build_error
            if layer is not None:
                try:
                    rank, note = _rank_at(layer, L, seed, rtol)
                except Exception as e:
                    error = _error(e)
            rows.append(dict(variant=name, length=L, d_head=d, seed=seed, rank=rank, full=L - 1,
                             note=note, error=error))  # fmt: skip
    return pd.DataFrame(rows, columns=RANK_COLUMNS)


def rank_figure(frame: pd.DataFrame) -> go.Figure:
    """Rank against length, one line per variant (mean over seeds), with the most a row-centred
    matrix can have (``L - 1``) and the dot-product bound ``d_head``; a slider over ``d_head``
    shows one width at a time (a static plotly control: it moves the figure in a plain page)."""
    _need(frame, RANK_COLUMNS[:6], "rank_figure")
    fig, groups, labels = go.Figure(), [], []
    for d, at_d in frame.groupby("d_head", sort=True):
        start = len(fig.data)
        mean = at_d.groupby(["variant", "length"])["rank"].mean()
        series: dict[str, tuple[Any, Any]] = {
            str(v): (m.index.get_level_values("length").to_numpy(), m.to_numpy())
            for v, m in mean.groupby(level="variant", sort=False)
        }
        lengths = np.sort(at_d["length"].unique()).astype(float)
        series["full (L - 1)"] = (lengths, lengths - 1.0)
        series[f"d_head = {d}"] = (lengths, np.full(len(lengths), float(str(d))))
        viz.lines(series, fig=fig)
        for tr in fig.data[-2:]:
            tr.line = {"dash": "dot", "color": "#888888"}
        groups.append(list(range(start, len(fig.data))))
        labels.append(str(d))
    viz.add_selector(fig, labels, groups, kind="slider", prefix="d_head = ")
    fig.update_layout(title="numerical rank of the row-centred scores",
                      xaxis_title="sequence length L", yaxis_title="rank")  # fmt: skip
    return fig


# -- rank collapse in depth (chapter 2) ------------------------------------------------------


def attention_stack(
    name: str,
    options: dict[str, Any] | None,
    *,
    depth: int,
    width: int,
    n_heads: int,
    seed: int,
    dtype: torch.dtype = F64,
) -> list[Attention]:
    """``depth`` freshly initialised layers of the variant, layer ``i`` built from seed
    ``seed * 1000 + i`` (:func:`~.contract.build_seeded`), in eval mode."""
    return [
        build_seeded(name, options, dim=width, n_heads=n_heads, seed=seed * 1000 + i, dtype=dtype)
        for i in range(depth)
    ]


def depth_frame(
    name: str,
    options: dict[str, Any] | None = None,
    *,
    depth: int,
    width: int,
    length: int,
    seed: int = 0,
    residual: bool,
    n_heads: int = 1,
) -> pd.DataFrame:
    """The relative residual after each layer of a stack of the variant, float64, no mask:
    ``X_{l+1} = attn_l(X_l)`` (``residual=False``, Dong et al.'s pure attention) or ``X_l +
    attn_l(X_l)``; ``X_0 (length, width)`` Gaussian from ``seed``; layers of
    :func:`attention_stack` (their own initialisation, no feed-forward, no normalisation).

    Returns:
        ``variant, residual, seed, layer`` (0 = the input, ``depth`` = the last output),
        ``rel_residual`` (:func:`attention_atlas.linalg.relative_residual`, chapter 2's
        measure; NaN where it is undefined: from a layer that raised or went non-finite on, or
        where every entry is zero), ``rms`` (root mean square of the entries: a vanishing or
        exploding signal shows here, not in the ratio), ``note`` (a causal-only variant's
        stacks run causal; a representation that vanished) and ``error``.
    """
    _check_sizes("depth_frame", depth=depth, width=width, length=length, n_heads=n_heads)
    res, rms = [math.nan] * (depth + 1), [math.nan] * (depth + 1)
    note, error = "", ""
    try:
        x = gaussian_input(1, length, width, seed=seed, dtype=F64)
        causal = _causal_only(name, options, width, n_heads)
        note = "causal-only variant: causal stacks" if causal else ""
        stack = attention_stack(name, options, depth=depth, width=width, n_heads=n_heads, seed=seed)
        with torch.no_grad():
            for i in range(depth + 1):
                if i:
                    out = call_layer(stack[i - 1], x, causal=causal).out
                    x = x + out if residual else out
                if not bool(torch.isfinite(x).all()):
                    error = f"non-finite output at layer {i}"
                    break
                rms[i] = float(x.pow(2).mean().sqrt())
                if rms[i] == 0:
                    note = "; ".join(filter(None, [note, f"all zeros from layer {i} on"]))
                    break
                res[i] = float(relative_residual(x[0]))
    except Exception as e:
        error = _error(e)
    rows = [dict(variant=name, residual=residual, seed=seed, layer=i, rel_residual=v, rms=r,
                 note=note, error=error) for i, (v, r) in enumerate(zip(res, rms))]  # fmt: skip
    return pd.DataFrame(rows, columns=DEPTH_COLUMNS)


def _causal_only(name: str, options: dict[str, Any] | None, width: int, n_heads: int) -> bool:
    """Whether the variant refuses ``causal=False`` (an SSM): its stacks then run causal."""
    layer = build_seeded(name, options, dim=width, n_heads=n_heads, seed=0, dtype=F64)
    try:
        with torch.no_grad():
            layer(gaussian_input(1, 2, width, seed=0, dtype=F64), causal=False)
    except ValueError as e:
        return "causal" in str(e)
    return False


def collapse_depth(frame: pd.DataFrame) -> pd.DataFrame:
    """The first layer whose relative residual is below chapter 2's floor ``COLLAPSED``
    (:func:`~attention_atlas.experiments.rank_collapse.stacks.collapse_layer`) per stack of a
    :func:`depth_frame` result.

    Returns:
        ``variant, residual, seed, collapse_layer`` (float: NaN when the stack never collapses
        within its depth or did not run).
    """
    _need(frame, DEPTH_COLUMNS[:5], "collapse_depth")
    rows = []
    for (v, r, s), stack in frame.groupby(["variant", "residual", "seed"], sort=False):
        res = stack.sort_values("layer")["rel_residual"].tolist()
        at = collapse_layer(res, COLLAPSED)  # len(res) when never
        rows.append({"variant": v, "residual": r, "seed": s,
                     "collapse_layer": float(at) if at < len(res) else math.nan})  # fmt: skip
    return pd.DataFrame(rows, columns=["variant", "residual", "seed", "collapse_layer"])


def depth_figure(frame: pd.DataFrame) -> go.Figure:
    """log10 of the relative residual against layer, one curve per (variant, residual or not)
    with its 95 % interval over seeds (:func:`attention_atlas.viz.line_band` on the logarithm:
    a residual spans many decades, and an interval of the residual itself would reach below
    zero), and chapter 2's collapse floor. A residual of exactly 0 is drawn at 1e-18."""
    _need(frame, DEPTH_COLUMNS[:5], "depth_figure")
    fig = go.Figure()
    for (v, r), stacks in frame.groupby(["variant", "residual"], sort=False):
        wide = stacks.pivot_table(index="seed", columns="layer", values="rel_residual",
                                  dropna=False)  # fmt: skip
        label = f"{v}, {'with' if r else 'no'} residual"
        logs = np.log10(np.clip(wide.to_numpy(dtype=float), 1e-18, None))
        viz.line_band(wide.columns.to_numpy(), {label: logs}, fig=fig)
    fig.add_hline(y=math.log10(COLLAPSED), line_dash="dot", line_color="#888888",
                  annotation_text=f"collapsed ({COLLAPSED:g})")  # fmt: skip
    fig.update_yaxes(title="log10 relative residual ||X - 1 x^T|| / ||X||")
    fig.update_xaxes(title="layer")
    fig.update_layout(title="rank collapse in depth")
    return fig


# -- cost against SDPA (chapter 8) ------------------------------------------------------------


def cost_frame(
    name: str,
    options: dict[str, Any] | None = None,
    *,
    lengths: Sequence[int],
    dim: int,
    n_heads: int,
    batch: int = 1,
    reps: int = 5,
    seed: int = 0,
    device: str = "cpu",
    causal: bool = True,
    warmup: int = 1,
    min_sample_s: float = 0.02,
    max_call_s: float = 10.0,
) -> pd.DataFrame:
    """Time, peak memory and FLOPs of the variant's :meth:`attend` against SDPA, per length.

    The variant's ``attend(q, k, v, x=x, causal=causal)`` and ``sdpa(q, k, v, causal=causal)``
    (:func:`attention_atlas.attention.dot.sdpa`, what ``dot`` runs) see the same Gaussian
    ``q, k, v (batch, n_heads, L, dim / n_heads)`` and ``x (batch, L, dim)``; both are timed in
    ``reps`` interleaved rounds by :func:`attention_atlas.bench.timing.compare` (this thread's
    CPU time on one CPU thread, wall time otherwise, as chapter 8); backward is taken w.r.t.
    ``q, k, v`` and the variant's own parameters beyond the projections (chapter 8's
    :func:`~attention_atlas.bench.timing.bench_attention` does the same). Peak memory is
    :func:`attention_atlas.bench.timing.peak_memory`: ``torch.cuda.max_memory_allocated`` on
    CUDA, on the CPU the high-water mark of live tensor bytes in a ``torch.profiler`` trace (a
    lower bound). FLOPs are :func:`~attention_atlas.bench.timing.count_flops` (matrix products
    only; SDPA counted as ``4 B H L^2 d`` forward and ``14 B H L^2 d`` forward+backward, the
    mask not discounted). ``floor_ratio`` is the time over the time of the counted FLOPs at this
    machine's matrix-product rate (:func:`~attention_atlas.bench.scaling.matmul_rate`).

    A length is skipped (``error`` says why) when the last forward+backward, grown
    quadratically, would pass ``max_call_s``; after a length fails, longer ones are not run.

    Returns:
        two rows per length (``pass`` = ``"forward"``, ``"forward+backward"``) with
        :data:`COST_COLUMNS`: ``ms``, ``ms_sdpa`` (median ms per call), ``ratio = ms / ms_sdpa``,
        ``ratio_q25``, ``ratio_q75`` (quartiles of the per-round ratio), ``peak_mb``,
        ``peak_mb_sdpa`` (MiB), ``flops``, ``flops_sdpa``, ``gflops_per_s``,
        ``gflops_per_s_sdpa``, ``floor_ratio``, the sizes, ``device``, ``clock``,
        ``memory_method`` and ``error``.
    """
    lengths = _check_list("cost_frame", "lengths", lengths)
    _check_sizes("cost_frame", dim=dim, n_heads=n_heads, batch=batch, reps=reps)
    if dim % n_heads:
        raise ConfigError(f"cost_frame dim: expected a multiple of n_heads={n_heads}, got {dim}")
    check_device(device, "cost_frame device")
    dev = torch.device(device)
    clock = "cpu" if dev.type == "cpu" and torch.get_num_threads() == 1 else "wall"
    memory_method = "cuda.max_memory_allocated" if dev.type == "cuda" else "torch.profiler live tensor bytes"  # fmt: skip
    d = dim // n_heads
    base = dict(variant=name, batch=batch, n_heads=n_heads, d_head=d, seed=seed,
                device=str(dev), clock=clock, memory_method=memory_method)  # fmt: skip
    rows: list[dict[str, Any]] = []
    rate = matmul_rate(torch.float32, dev)
    layer: Attention | None = None
    stop, last = "", None  # why longer lengths are not run; (L, fwd+bwd seconds) of the last
    for L in lengths:
        if not stop and last is not None and last[1] * (L / last[0]) ** 2 > max_call_s:
            est = last[1] * (L / last[0]) ** 2
            stop = (
                f"skipped: estimated {est:.3g} s per forward+backward > max_call_s {max_call_s:g}"
            )
        if stop:
            rows += [{**base, "length": L, "pass": p, "error": stop} for p in PASSES]
            continue
        try:
            layer = layer or build_seeded(name, options, dim=dim, n_heads=n_heads, seed=seed,
                                          device=dev)  # fmt: skip
            measured = _cost_at(layer, L, batch=batch, n_heads=n_heads, d=d, seed=seed, dev=dev,
                                causal=causal, reps=reps, warmup=warmup,
                                min_sample_s=min_sample_s, clock=clock)  # fmt: skip
        except Exception as e:
            stop = _error(e)
            rows += [{**base, "length": L, "pass": p, "error": stop} for p in PASSES]
            stop = f"not run: length {L} failed"
            continue
        for p, m in measured.items():
            rows.append({**base, "length": L, "pass": p, **m, "error": "",
                         "floor_ratio": floor_ratio(m["ms"] / 1e3, m["flops"], rate)})  # fmt: skip
        last = (L, measured["forward+backward"]["ms"] / 1e3)
    return pd.DataFrame(rows, columns=COST_COLUMNS)


def _cost_at(
    layer: Attention, L: int, *, batch: int, n_heads: int, d: int, seed: int, dev: torch.device,
    causal: bool, reps: int, warmup: int, min_sample_s: float, clock: str,
) -> dict[str, dict[str, float]]:  # fmt: skip
    """One length of :func:`cost_frame`: ``{pass: {ms, ms_sdpa, ratio, ...}}``."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, n_heads, L, d, generator=g).to(dev).requires_grad_()
               for _ in range(3))  # fmt: skip
    x = torch.randn(batch, L, n_heads * d, generator=g).to(dev)

    def variant(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return layer.attend(q, k, v, x=x, causal=causal, mask=None, need_weights=False).out

    def baseline(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return sdpa(q, k, v, causal=causal)

    variant.bench_params = [  # type: ignore[attr-defined]
        p for n, p in layer.named_parameters() if p.requires_grad and not n.startswith(("qkv.", "proj."))
    ]  # fmt: skip
    fns: dict[str, Callable[..., Any]] = {"variant": variant, "sdpa": baseline}
    res = compare(fns, "sdpa", (q, k, v), reps=reps, warmup=warmup, min_sample_s=min_sample_s,
                  clock=clock, device=dev)  # fmt: skip
    out: dict[str, dict[str, float]] = {}
    for p, key in zip(PASSES, ("forward", "forward_backward")):
        flops = {n: count_flops(f, q, k, v, backward=p != "forward") for n, f in fns.items()}
        peak = {n: _peak(f, (q, k, v), p, dev) for n, f in fns.items()}
        r = res["results"]
        ms, ms_sdpa = r["variant"][key]["median_s"] * 1e3, r["sdpa"][key]["median_s"] * 1e3
        out[p] = {
            "ms": ms, "ms_sdpa": ms_sdpa, "ratio": ms / ms_sdpa,
            "ratio_q25": r["variant"][key]["ratio_q25"], "ratio_q75": r["variant"][key]["ratio_q75"],
            "peak_mb": peak["variant"] / 2**20, "peak_mb_sdpa": peak["sdpa"] / 2**20,
            "flops": float(flops["variant"]), "flops_sdpa": float(flops["sdpa"]),
            "gflops_per_s": flops["variant"] / ms / 1e6, "gflops_per_s_sdpa": flops["sdpa"] / ms_sdpa / 1e6,
        }  # fmt: skip
    for t in (q, k, v, *variant.bench_params):  # type: ignore[attr-defined]
        t.grad = None  # count_flops's backward left them
    return out


def _peak(fn: Callable[..., Any], args: tuple[Tensor, ...], p: str, dev: torch.device) -> int:
    """Peak bytes of one forward (no grad) or one forward+backward of ``fn(*args)``."""

    def step() -> None:
        if p == "forward":
            with torch.no_grad():
                fn(*args)
        else:
            out = fn(*args)
            torch.autograd.grad(out, [a for a in args if a.requires_grad],
                                grad_outputs=torch.ones_like(out), allow_unused=True)  # fmt: skip

    return peak_memory(step, dev)


def seed_medians(frame: pd.DataFrame) -> pd.DataFrame:
    """A :func:`cost_frame` of several seeds as one row per (variant, pass, length): the median
    over seeds of ``ms`` and ``ms_sdpa`` (timings are noisy and skewed: the median, not the
    mean). A frame of one seed is returned as it is."""
    if "seed" not in frame or frame["seed"].nunique() <= 1:
        return frame
    keys = ["variant", "pass", "length"]
    return frame.groupby(keys, sort=False)[["ms", "ms_sdpa"]].median().reset_index()


def cost_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Per variant and pass, at the longest length every seed ran: the time ratio to SDPA
    (geometric mean of the seeds' ratios, 95% interval), milliseconds of both (medians), peak
    memory of both, the FLOPs counted for each, and the time over the counted FLOPs' floor
    (``floor_ratio``, median)."""
    from attention_atlas.stats import mean_interval

    _need(frame, ["variant", "length", "pass", "ms", "ms_sdpa", "ratio"], "cost_table")
    rows = []
    for (v, p), at in frame.groupby(["variant", "pass"], sort=False):
        ok = at[np.isfinite(at["ratio"].astype(float)) & (at["ratio"].astype(float) > 0)]
        if not len(ok):
            continue
        top = ok[ok["length"] == ok["length"].max()]
        logs = np.log(top["ratio"].to_numpy(dtype=float))
        if len(logs) >= 2:
            iv = mean_interval(logs)
            ratio = f"{math.exp(iv.mean):.2f} [{math.exp(iv.low):.2f}, {math.exp(iv.high):.2f}]"
        else:
            ratio = f"{math.exp(logs.mean()):.2f} (one seed)"
        rows.append({
            "variant": v, "pass": p, "length": int(top["length"].iloc[0]),
            "ratio to SDPA": ratio, "ms": float(top["ms"].median()),
            "ms SDPA": float(top["ms_sdpa"].median()),
            "peak MiB": float(top["peak_mb"].median()) if "peak_mb" in top else math.nan,
            "peak MiB SDPA": float(top["peak_mb_sdpa"].median()) if "peak_mb_sdpa" in top else math.nan,
            "FLOPs ratio to SDPA": float((top["flops"] / top["flops_sdpa"]).median())
            if "flops" in top else math.nan,
            "time / FLOP floor": float(top["floor_ratio"].median()) if "floor_ratio" in top else math.nan,
        })  # fmt: skip
    return pd.DataFrame(rows)


def cost_slope(frame: pd.DataFrame) -> pd.DataFrame:
    """The log-log slope of time against length (:func:`attention_atlas.viz.loglog_slope`) per
    variant and pass, for the variant and for SDPA beside it.

    Returns:
        ``variant, pass, slope, slope_sdpa, n_lengths`` (NaN slopes with fewer than 2 lengths).
    """
    _need(frame, ["variant", "length", "pass", "ms", "ms_sdpa"], "cost_slope")
    frame = seed_medians(frame)
    rows = []
    for (v, p), at in frame.groupby(["variant", "pass"], sort=False):
        ok = at[np.isfinite(at["ms"].astype(float)) & (at["ms"].astype(float) > 0)]
        n = int(ok["length"].nunique())
        rows.append({
            "variant": v, "pass": p, "n_lengths": n,
            "slope": viz.loglog_slope(ok["length"], ok["ms"]) if n >= 2 else math.nan,
            "slope_sdpa": viz.loglog_slope(ok["length"], ok["ms_sdpa"]) if n >= 2 else math.nan,
        })  # fmt: skip
    return pd.DataFrame(rows, columns=["variant", "pass", "slope", "slope_sdpa", "n_lengths"])


def cost_figure(frame: pd.DataFrame) -> go.Figure:
    """Milliseconds per call against length on log-log axes (the median over seeds), one curve
    per variant and its SDPA beside it (fitted slope in the legend); a dropdown switches between forward and
    forward+backward (a static plotly control)."""
    _need(frame, ["variant", "length", "pass", "ms", "ms_sdpa"], "cost_figure")
    slopes = cost_slope(frame).set_index(["variant", "pass"])
    frame = seed_medians(frame)
    several = frame["variant"].nunique() > 1
    fig, groups, labels = go.Figure(), [], []
    for p in [p for p in PASSES if p in set(frame["pass"])]:
        start, series = len(fig.data), {}
        for v, at in frame[frame["pass"] == p].groupby("variant", sort=False):
            at = at[np.isfinite(at["ms"].astype(float))].sort_values("length")
            s = slopes.loc[(v, p)]  # type: ignore[index]
            series[f"{v} (slope {s['slope']:.2f})"] = (at["length"], at["ms"])
            sdpa_name = f"SDPA beside {v}" if several else "SDPA"
            series[f"{sdpa_name} (slope {s['slope_sdpa']:.2f})"] = (at["length"], at["ms_sdpa"])
        viz.lines(series, fig=fig, log_x=True, log_y=True)
        groups.append(list(range(start, len(fig.data))))
        labels.append(p)
    if groups:
        viz.add_selector(fig, labels, groups, kind="dropdown")
    fig.update_layout(title="time per call against SDPA", xaxis_title="sequence length L",
                      yaxis_title="ms per call")  # fmt: skip
    return fig


def _need(frame: pd.DataFrame, columns: list[str], what: str) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ConfigError(f"{what}: expected a frame with columns {columns}, missing {missing}")
