"""Chapter 8's analysis: every variant's kernels and training steps against SDPA and their floors.

The measurements are benchmark records in the results store (:mod:`attention_atlas.bench.records`),
made from the command line on each kind of machine::

    python -m attention_atlas bench --lengths 256 512 1024 2048 4096 8192 16384 --store
    python -m attention_atlas bench --train --shape book --store
    python -m attention_atlas bench --train --shape long --store
    python -m attention_atlas bench --train --compile --shape book --store   # and long

This module turns them into tables and figures (:func:`kernel_frame`, :func:`train_frame`,
:func:`phase_frame`, :func:`kernel_figure`, ...), states the step-cost goals of issue 16 against
them (:func:`goals`), and runs the chapter's small live measurements (:func:`live_kernel`,
:func:`live_train`), so the chapter has no timing loop of its own.
"""

from __future__ import annotations

import math
import time
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from attention_atlas.bench.records import KINDS, load_bench_kinds, provenance_text, stamp
from attention_atlas.bench.scaling import floor_ratio, kernel_scaling, matmul_rate, slopes
from attention_atlas.bench.timing import bench_attention
from attention_atlas.experiments.performance.train_steps import bench_train, phase_table, step_flops
from attention_atlas.threads import intra_op_threads

__all__ = [
    "GOALS",
    "with_goals",
    "KERNEL_RECORD",
    "LIVE_SIZES",
    "REGULARIZER_SHARE_GOAL",
    "kernel_sizes_sentence",
    "goal_sentence",
    "goals",
    "at_longest",
    "kernel_figure",
    "kernel_frame",
    "kernel_summary",
    "live_kernel",
    "longest_sentence",
    "live_kernel_figure",
    "live_train",
    "load_records",
    "phase_figure",
    "phase_frame",
    "provenance_text",
    "slope_frame",
    "stored_kinds",
    "stored_or_live_kernels",
    "stored_or_live_train",
    "train_figure",
    "train_frame",
]

#: the stored kernel record chapter 8 plots (per machine kind)
KERNEL_RECORD = "kernels-float32"
#: issue 16's step-cost goals: the Fiber Bundle Transformer's step at most 3x a dot-product
#: step, every other variant's at most 1.5x (the cofactor regulariser's own goal, 5% of a step,
#: is chapter 6's)
GOALS = {"fiber_bundle": 3.0, "default": 1.5}
#: issue 16's goal for the cofactor regulariser: at most this share of a training step
REGULARIZER_SHARE_GOAL = 0.05


def load_records(
    names: tuple[str, ...] = (
        KERNEL_RECORD,
        "train-book",
        "train-long",
        "train-book-compiled",
        "train-long-compiled",
        "train-book-native",
        "train-long-native",
    ),
) -> dict[str, dict[str, Any]]:
    """``{name: {kind: record}}`` for every stored record of ``names`` (kinds ``cpu``, ``cuda``)."""
    return {name: load_bench_kinds(name) for name in names}


def kernel_frame(record: dict[str, Any]) -> pd.DataFrame:
    """One row per (variant, length) of a kernel-scaling record: times (ms), ratios to SDPA,
    peak memory (MiB), FLOPs and the floor ratios (time over the matmul-rate time of its FLOPs)."""
    rate = record["matmul_flops_per_s"]
    rows = []
    for v, by_len in record["results"].items():
        for length, r in by_len.items():
            rows.append({
                "variant": v, "L": int(length), "forward ms": 1e3 * r["forward_s"],
                "forward+backward ms": 1e3 * r["forward_backward_s"],
                "forward / SDPA": r["forward_ratio"],
                "forward+backward / SDPA": r["forward_backward_ratio"],
                "peak MiB": (r["peak_memory_bytes"] or math.nan) / 2**20,
                "forward GFLOP": r["forward_flops"] / 1e9,
                "forward floor ratio": floor_ratio(r["forward_s"], r["forward_flops"], rate),
                "forward+backward floor ratio": floor_ratio(
                    r["forward_backward_s"], r["forward_backward_flops"], rate),
            })  # fmt: skip
    return pd.DataFrame(rows).sort_values(["variant", "L"]).reset_index(drop=True)


def slope_frame(record: dict[str, Any]) -> pd.DataFrame:
    """Log-log slopes against L of each variant's forward and forward+backward time and its
    peak memory, and the longest length it ran at."""
    fwd, fb = slopes(record, "forward_s"), slopes(record, "forward_backward_s")
    mem = slopes(record, "peak_memory_bytes")
    longest = {v: max((int(n) for n in by), default=0) for v, by in record["results"].items()}
    return pd.DataFrame(
        {"forward slope": fwd, "forward+backward slope": fb, "memory slope": mem,
         "longest L": longest}
    )  # fmt: skip


def at_longest(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of a :func:`kernel_frame` at each variant's longest length, indexed by variant."""
    longest = frame.groupby("variant")["L"].transform("max")
    return frame[frame["L"] == longest].set_index("variant")


def longest_sentence(frame: pd.DataFrame, where: str = "") -> str:
    """Each variant's forward+backward ratio to SDPA at its longest length, in words."""
    each = ", ".join(
        f"{v} {r['forward+backward / SDPA']:.1f}x (L = {int(r['L'])})"
        for v, r in at_longest(frame).iterrows()
    )
    return f"{where}At the longest length each reached, the kernels run at {each} SDPA's forward+backward time."


def kernel_figure(frame: pd.DataFrame, column: str, *, title: str, log_y: bool = True) -> go.Figure:
    """``column`` against L, one line per variant, log-log (log-linear when not ``log_y``)."""
    fig = go.Figure()
    for v, g in frame.groupby("variant", sort=False):
        fig.add_trace(go.Scatter(x=g["L"], y=g[column], mode="lines+markers", name=str(v)))
    fig.update_xaxes(type="log", title="sequence length L")
    fig.update_yaxes(type="log" if log_y else None, title=column)
    fig.update_layout(title=title)
    return fig


def train_frame(record: dict[str, Any]) -> pd.DataFrame:
    """One row per variant of a training-step record: median step (ms), the median and
    quartiles of its per-round ratio to the dot-product step, the counted FLOPs of a step
    (:func:`~attention_atlas.experiments.performance.train_steps.step_flops`) and their ratio to dot's, and the goal."""
    dot_flops = step_flops(record["results"]["dot"])
    rows = []
    for v, r in record["results"].items():
        t = r["step"]
        rows.append({
            "variant": v, "step ms": 1e3 * t["median_s"], "ratio to dot": t["ratio_median"],
            "q25": t["ratio_q25"], "q75": t["ratio_q75"],
            "step MFLOP": step_flops(r) / 1e6, "FLOP ratio": step_flops(r) / dot_flops,
            "goal": GOALS.get(v, GOALS["default"]) if v != "dot" else math.nan,
        })  # fmt: skip
    return pd.DataFrame(rows).set_index("variant")


def phase_frame(record: dict[str, Any], variant: str) -> pd.DataFrame:
    """The phases of one variant's step (:func:`attention_atlas.experiments.performance.train_steps.phase_table`), each
    in milliseconds and in units of the dot-product step, with its counted FLOPs."""
    return pd.DataFrame(phase_table(record, variant)).set_index("phase")


def goals(record: dict[str, Any]) -> pd.DataFrame:
    """Each variant's step ratio against its goal, and whether its counted FLOPs alone (the
    floor if it ran at dot's FLOP rate) already pass the goal: ``met``, ``FLOP floor above goal``."""
    df = train_frame(record).drop(index="dot")
    df["met"] = df["ratio to dot"] <= df["goal"]
    df["FLOP floor above goal"] = df["FLOP ratio"] > df["goal"]
    return df[["ratio to dot", "goal", "met", "FLOP ratio", "FLOP floor above goal"]]


def train_figure(frames: dict[str, pd.DataFrame]) -> go.Figure:
    """Step ratio to dot (median, quartile bars) and FLOP ratio per variant, one group per
    shape (``{shape: train_frame}``), with the goals as markers."""
    fig = go.Figure()
    for shape, df in frames.items():
        fig.add_trace(go.Bar(
            x=df.index, y=df["ratio to dot"], name=f"time, {shape}",
            error_y={"type": "data", "symmetric": False, "array": df["q75"] - df["ratio to dot"],
                     "arrayminus": df["ratio to dot"] - df["q25"]},
        ))  # fmt: skip
        fig.add_trace(go.Scatter(x=df.index, y=df["FLOP ratio"], mode="markers",
                                 name=f"FLOPs, {shape}", marker={"symbol": "diamond", "size": 9}))  # fmt: skip
    return with_goals(fig, frames, "ratio to the dot-product step",
                       "One training step against dot-product attention")  # fmt: skip


def with_goals(fig: go.Figure, frames: dict[str, pd.DataFrame], y: str, title: str) -> go.Figure:
    """``fig`` with each variant's goal as a marker (from the first frame's ``goal`` column),
    grouped bars, a log y axis titled ``y`` and the ``title``."""
    df0 = next(iter(frames.values()))
    fig.add_trace(go.Scatter(x=df0.index, y=df0["goal"], mode="markers", name="goal",
                             marker={"symbol": "line-ew-open", "size": 24, "line": {"width": 3}}))  # fmt: skip
    fig.update_yaxes(type="log", title=y)
    fig.update_layout(barmode="group", title=title)
    return fig


def phase_figure(record: dict[str, Any], variants: list[str]) -> go.Figure:
    """Stacked bars: each variant's step split into its phases, in units of the dot step."""
    frames = {v: phase_frame(record, v) for v in variants}
    names = sorted({p for f in frames.values() for p in f.index},
                   key=lambda p: -max(f["of dot step"].get(p, 0.0) for f in frames.values()))  # fmt: skip
    fig = go.Figure()
    for p in names:
        fig.add_trace(
            go.Bar(x=variants, y=[frames[v]["of dot step"].get(p, 0.0) for v in variants], name=p)
        )
    fig.update_layout(barmode="stack", title="Where a training step goes (profiled phases)",
                      yaxis_title="time, in dot-product steps")  # fmt: skip
    return fig


#: the sizes of the chapter's live kernel measurement (one causal sequence)
LIVE_SIZES = {"batch": 1, "heads": 2, "head_dim": 16}


def kernel_sizes_sentence(record: dict[str, Any]) -> str:
    """The sizes and lengths of a kernel record, in words."""
    z, lengths = record["sizes"], sorted({int(n) for by in record["results"].values() for n in by})
    return (
        f"Batch {z['batch']}, {z['heads']} heads of dimension {z['head_dim']}, "
        f"{'causal' if z['causal'] else 'bidirectional'}, {record['dtype']}, lengths "
        f"{lengths[0]:,} to {lengths[-1]:,}; {record['reps']} interleaved rounds per length."
    )


def live_kernel(
    variant: str, length: int, dtype: str = "float32", *, reps: int = 3
) -> dict[str, Any]:
    """A small live measurement: ``variant`` against SDPA at ``length`` (:data:`LIVE_SIZES`,
    causal), forward and forward+backward, with the FLOP floor of this machine."""
    dt = getattr(torch, dtype)
    b, h, d = LIVE_SIZES["batch"], LIVE_SIZES["heads"], LIVE_SIZES["head_dim"]
    clock = "cpu" if torch.get_num_threads() == 1 else "wall"
    rec = bench_attention([variant], "dot", batch=b, heads=h, length=length, head_dim=d,
                          dtype=dt, device="cpu", reps=reps, warmup=1, memory=False,
                          min_sample_s=0.02, clock=clock)  # fmt: skip
    rate = matmul_rate(dt, "cpu", n=256, reps=3)
    from attention_atlas.bench.scaling import variant_flops

    flops = variant_flops(["dot", variant], b, h, length, d, True, dt, torch.device("cpu"))
    out: dict[str, Any] = {"variant": variant, "L": length, "dtype": dtype, "rate": rate}
    for name in dict.fromkeys(["dot", variant]):
        r = rec["results"][name]
        out[name] = {m: {"ms": 1e3 * r[m]["median_s"], "ratio": r[m]["ratio_median"],
                         "floor ms": 1e3 * flops[name][f"{m}_flops"] / rate}
                     for m in ("forward", "forward_backward")}  # fmt: skip
    return out


def live_kernel_figure(variant: str, length: int, dtype: str) -> go.Figure:
    """:func:`live_kernel` as bars: measured and floor time of the variant and of SDPA."""
    res = live_kernel(variant, length, dtype)
    fig = make_subplots(rows=1, cols=2, subplot_titles=("forward", "forward+backward"))
    for col, m in enumerate(("forward", "forward_backward"), start=1):
        for name in dict.fromkeys(["dot", variant]):
            r = res[name][m]
            fig.add_trace(go.Bar(x=["measured", "FLOP floor"], y=[r["ms"], r["floor ms"]],
                                 name=f"{name} ({m})", showlegend=col == 1 or name != "dot"),
                          row=1, col=col)  # fmt: skip
    fig.update_yaxes(type="log", title="ms")
    ratio = res[variant]["forward_backward"]["ratio"]
    fig.update_layout(
        title=f"{variant} at L = {length}, {dtype}: {ratio:.2f}x SDPA forward+backward (live)"
    )
    return fig


def stored_or_live_kernels(
    records: dict[str, dict[str, Any]], variants: list[str], lengths: list[int], reps: int
) -> tuple[dict[str, Any], str]:
    """The stored CPU kernel record, or (none stored) a small one measured now at ``lengths``;
    and its source, ``"stored"`` or ``"computed"``."""
    stored = records.get(KERNEL_RECORD, {}).get("cpu")
    if stored is not None:
        return stored, "stored"
    rec = kernel_scaling(variants, lengths, reps=reps, memory=False)
    return stamp(rec, started=time.time() - rec["seconds"], command="chapter 8 (live)"), "computed"


def stored_or_live_train(
    records: dict[str, dict[str, Any]], shape: str, variants: list[str], live_shape: dict[str, int],
    reps: int,
) -> tuple[dict[str, Any] | None, str]:  # fmt: skip
    """The stored CPU training-step record of ``shape``; for the book shape with none stored, a
    small one measured now at ``live_shape`` (source ``"computed"``); else None."""
    stored = records.get(f"train-{shape}", {}).get("cpu")
    if stored is not None or shape != "book":
        return stored, "stored"
    rec = live_train(variants, live_shape, reps=reps)
    return stamp(rec, started=time.time() - rec["seconds"], command="chapter 8 (live)"), "computed"


def live_train(variants: list[str], shape: dict[str, int], *, reps: int = 3) -> dict[str, Any]:
    """A small live training-step benchmark (:func:`attention_atlas.experiments.performance.train_steps.bench_train`)
    on one thread at a small ``shape``."""
    with intra_op_threads(1):
        return bench_train(variants, shape, reps=reps, warmup=1, profile_steps=3, min_sample_s=0.01)


def stored_kinds(records: dict[str, dict[str, Any]], name: str) -> list[str]:
    """The machine kinds that have a stored ``name`` record, in :data:`KINDS` order."""
    return [k for k in KINDS if k in records.get(name, {})]


def goal_sentence(g: pd.DataFrame, shape: str) -> str:
    """The goals of :func:`goals` in words: met, not met with a FLOP floor above the goal, or not
    met although the FLOPs are within it (the excess is inefficiency, not arithmetic)."""
    met = [str(v) for v in g.index if g.loc[v, "met"]]
    floor = [str(v) for v in g.index if not g.loc[v, "met"] and g.loc[v, "FLOP floor above goal"]]
    slow = [
        str(v) for v in g.index if not g.loc[v, "met"] and not g.loc[v, "FLOP floor above goal"]
    ]

    table: dict[Any, Any] = g.to_dict(orient="index")

    def fmt(vs: list[str]) -> str:
        return (
            ", ".join(
                f"{v} ({table[v]['ratio to dot']:.2f}x, FLOPs {table[v]['FLOP ratio']:.2f}x, "
                f"goal {table[v]['goal']:g}x)"
                for v in vs
            )
            or "none"
        )

    return (
        f"At the {shape} shape the goal is met by {fmt(met)}. Missed with counted FLOPs already "
        f"above the goal (its floor at dot's FLOP rate): {fmt(floor)}. Missed although the FLOPs "
        f"are within the goal (many small operators and memory traffic, not arithmetic): {fmt(slow)}."
    )


def kernel_summary(frame: pd.DataFrame, slope: pd.DataFrame) -> str:
    """The kernels in words, from a :func:`kernel_frame` and its :func:`slope_frame`: which
    variants stay within twice SDPA's forward+backward time at every length they ran, which
    grow slower than ``L^1.5``, and the range of their median floor ratios."""
    worst = frame.groupby("variant")["forward+backward / SDPA"].max().drop("dot", errors="ignore")
    near = [str(v) for v, r in worst.items() if r <= 2.0]
    far = worst[worst > 2.0].sort_values()
    sub = [str(v) for v, s in slope["forward+backward slope"].items() if s < 1.5]
    floor = frame.groupby("variant")["forward+backward floor ratio"].median().sort_values()
    return (
        f"Within twice SDPA's forward+backward time at every length they ran: {', '.join(near) or 'none'}. "
        f"Above it: "
        + (", ".join(f"{v} (up to {r:.1f}x)" for v, r in far.items()) or "none")
        + f". Growing slower than $L^{{1.5}}$: {', '.join(sub) or 'none'}. Median floor ratios run from "
        f"{floor.iloc[0]:.1f} ({floor.index[0]}) to {floor.iloc[-1]:.1f} ({floor.index[-1]})."
    )
