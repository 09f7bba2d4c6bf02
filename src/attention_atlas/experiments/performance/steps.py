"""Chapter 8's training-step records read other ways: compiled and native steps beside the eager
ones, the GPU's beside the CPU's, another CPU's beside the reference one, and the cofactor
regulariser's share of a step (issue 16's goal for it). The records are those of :mod:`attention_atlas.experiments.performance.kernels` (made by
``python -m attention_atlas bench --train [--compile | --native] [--device cuda] --store``);
the tables, goals and figures they share are there.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from attention_atlas.bench.records import load_bench, other_machines, provenance_text
from attention_atlas.experiments.performance.train_steps import step_flops

from .kernels import GOALS, REGULARIZER_SHARE_GOAL, with_goals

__all__ = [
    "compile_figure",
    "compile_frame",
    "compile_sentence",
    "device_step_sentence",
    "machine_sentence",
    "native_figure",
    "native_frame",
    "native_sentence",
    "other_machine_records",
    "record_caption",
    "regularizer_sentence",
    "regularizer_share",
    "stored_train",
]


def regularizer_share(
    record: dict[str, Any],
    variant: str = "cofactor",
    phase: str = "regularizer/cofactor",
    *,
    native: bool = False,
) -> dict[str, float] | None:
    """The share of ``variant``'s training step that its regulariser takes, from a
    :func:`~attention_atlas.experiments.performance.train_steps.bench_train` record, two ways: ``timed``, the step's
    excess over the dot-product step measured side by side (``1 - 1 / ratio``; ``timed_low`` and
    ``timed_high`` from the ratio's quartiles), and ``profiled``, the regulariser phase's share
    of the profiled step; with ``flops``, the phase's counted FLOPs over the step's (the share it
    would take at the model's FLOP rate) and the ``goal``. None when the record has no
    ``variant`` or no ``phase`` (a live run of other variants). With ``native``, the same
    from the step with the native kernels (``bench --train --native``: its timing, over the
    eager dot-product step of the same rounds, and its profile, with the FLOPs counted in the
    eager profile: a counter cannot see into a native kernel); None where it was not run."""
    res = record["results"].get(variant)
    timing, phases = ("native", "native_phases") if native else ("step", "phases")
    if res is None or timing not in res or phase not in res.get(phases, {}):
        return None
    t, p = res[timing], res[phases][phase]
    counted = res.get("phases", {}).get(phase, p)  # the native kernels' FLOPs are the eager ones'
    flops = counted["forward_flops"] + counted["backward_flops"]
    return {
        "timed": 1.0 - 1.0 / t["ratio_median"],
        "timed_low": 1.0 - 1.0 / t["ratio_q25"],
        "timed_high": 1.0 - 1.0 / t["ratio_q75"],
        "profiled": float(p["share"]),
        "flops": flops / step_flops(res),
        "goal": REGULARIZER_SHARE_GOAL,
    }


def regularizer_sentence(
    shares: dict[str, dict[str, float] | None], subject: str = "The cofactor regulariser"
) -> str:
    """:func:`regularizer_share` per shape (``{shape: shares}``) in words, met or not, the
    sentence opening with ``subject``."""
    parts = [
        f"at the {shape} shape {100 * r['timed']:.1f}% of a step by the side-by-side timing "
        f"(quartiles {100 * r['timed_low']:.1f}% to {100 * r['timed_high']:.1f}%), "
        f"{100 * r['profiled']:.1f}% by the profile, for {100 * r['flops']:.1f}% of the step's "
        f"FLOPs: goal {'met' if r['timed'] <= r['goal'] else 'not met'}"
        for shape, r in shares.items()
        if r is not None
    ]
    if not parts:
        return "No record here has the cofactor regulariser's step."
    goal = next(r["goal"] for r in shares.values() if r is not None)
    return f"{subject} (goal: at most {100 * goal:g}% of a step): " + "; ".join(parts) + "."


def compile_frame(record: dict[str, Any]) -> pd.DataFrame:
    """One row per variant of a ``bench --train --compile`` record: the eager and the compiled
    step (ms, medians of the same interleaved rounds), the speed-up (eager over compiled), each
    step over the eager dot-product step, the compiled step over the compiled dot-product step,
    the goal, and the compiler's error where the steps fell back to eager."""
    res = record["results"]
    dot_c = res["dot"]["compiled"]["median_s"]
    rows = []
    for v, r in res.items():
        e, c = r["step"], r["compiled"]
        rows.append({
            "variant": v, "eager ms": 1e3 * e["median_s"], "compiled ms": 1e3 * c["median_s"],
            "speed-up": r["compile_speedup"], "eager / dot": e["ratio_median"],
            "compiled / eager dot": c["ratio_median"], "compiled / compiled dot": c["median_s"] / dot_c,
            "goal": GOALS.get(v, GOALS["default"]) if v != "dot" else math.nan,
            "fell back": r["compile_error"] or "",
        })  # fmt: skip
    return pd.DataFrame(rows).set_index("variant")


def _eager_and_other_bars(frames: dict[str, pd.DataFrame], col: str, label: str,
                          title: str) -> go.Figure:  # fmt: skip
    """Bars of each variant's eager step (``eager / dot``) and of ``col``, one group per shape,
    with the goals as markers."""
    fig = go.Figure()
    for shape, df in frames.items():
        for c, name in (("eager / dot", "eager"), (col, label)):
            fig.add_trace(go.Bar(x=df.index, y=df[c], name=f"{name}, {shape}"))
    return with_goals(fig, frames, "ratio to the eager dot-product step", title)


def compile_figure(frames: dict[str, pd.DataFrame]) -> go.Figure:
    """Each variant's step over the eager dot-product step, eager and compiled, one group per
    shape (``{shape: compile_frame}``), with the goals as markers."""
    return _eager_and_other_bars(frames, "compiled / eager dot", "compiled",
                                 "Training steps, eager and through torch.compile")  # fmt: skip


def stored_train(
    records: dict[str, dict[str, Any]], suffix: str = "", kind: str = "cpu"
) -> dict[str, dict[str, Any]]:
    """``{shape: record}`` of the stored training-step records ``train-<shape>[-<suffix>]``
    (suffix ``compiled``, ``native`` or none) of chapter 4's two shapes made on ``kind``
    (``cpu``, ``cuda``), those that are stored."""
    tail = f"-{suffix}" if suffix else ""
    found = {shape: records.get(f"train-{shape}{tail}", {}).get(kind) for shape in ("book", "long")}
    return {shape: rec for shape, rec in found.items() if rec is not None}


def device_step_sentence(
    gpu: dict[str, dict[str, Any]], cpu: dict[str, dict[str, Any]], n_phases: int = 2
) -> str:
    """The GPU training steps (``{shape: record}``) in words beside the CPU's at the same shape:
    each variant's median ratio to dot on both, and where the costliest variant's GPU step goes
    (its ``n_phases`` largest profiled phases, as shares of its step)."""
    if not gpu:
        return "No GPU training-step record is stored yet."
    parts = []
    for shape, rec in gpu.items():
        res, on_cpu = rec["results"], cpu.get(shape, {}).get("results", {})
        ratios = {v: r["step"]["ratio_median"] for v, r in res.items() if v != "dot"}
        each = ", ".join(
            f"{v} {x:.2f}x"
            + (f" ({on_cpu[v]['step']['ratio_median']:.2f}x on the CPU)" if v in on_cpu else "")
            for v, x in sorted(ratios.items(), key=lambda kv: -kv[1])
        )
        worst = max(ratios, key=lambda v: ratios[v])
        phases = sorted(res[worst]["phases"].items(), key=lambda kv: -kv[1]["share"])[:n_phases]
        where = " and ".join(f"{p} {100 * ph['share']:.0f}%" for p, ph in phases)
        step_ms = 1e3 * res["dot"]["step"]["median_s"]
        parts.append(
            f"at the {shape} shape (dot step {step_ms:.2f} ms) {each}; the largest phases of "
            f"{worst}'s step there are {where}"
        )
    return "On the GPU, in dot-product steps: " + "; ".join(parts) + "."


def other_machine_records(
    suffix: str = "native", kind: str = "cpu", root: str | None = None
) -> dict[str, dict[str, dict[str, Any]]]:
    """``{machine label: {shape: record}}``: the training-step records ``train-<shape>[-<suffix>]``
    stored for other machines of ``kind`` (``bench --train ... --store --machine LABEL``)."""
    tail = f"-{suffix}" if suffix else ""
    found: dict[str, dict[str, dict[str, Any]]] = {}
    for label in other_machines(kind, root):
        recs = {shape: load_bench(f"train-{shape}{tail}", kind, root, label)
                for shape in ("book", "long")}  # fmt: skip
        if any(r is not None for r in recs.values()):
            found[label] = {shape: r for shape, r in recs.items() if r is not None}
    return found


def machine_sentence(
    label: str, records: dict[str, dict[str, Any]], reference: dict[str, dict[str, Any]]
) -> str:
    """Another machine's native-kernel records (``{shape: record}``) in words beside the
    reference machine's (``{shape: record}``, the same shapes where stored): each machine's
    processor and dot-product step, then :func:`native_sentence` and the cofactor regulariser's
    share (:func:`regularizer_sentence`) on the other machine."""
    if not records:
        return f"No training-step record of machine {label!r} is stored."
    parts = []
    for shape, rec in records.items():
        cpu = _processor(rec)
        text = f"at the {shape} shape its dot-product step takes {1e3 * rec['results']['dot']['step']['median_s']:.2f} ms ({cpu})"
        ref = reference.get(shape)
        if ref is not None:
            ref_cpu = _processor(ref)
            text += f" against {1e3 * ref['results']['dot']['step']['median_s']:.2f} ms on the reference machine ({ref_cpu})"
        parts.append(text)
    frames = {shape: native_frame(rec) for shape, rec in records.items()}
    shares = {shape: regularizer_share(rec, native=True) for shape, rec in records.items()}
    text = (
        f"Machine {label}: " + "; ".join(parts) + ". " + native_sentence(frames) + " "
        + regularizer_sentence(shares, "With the native kernels there, the cofactor regulariser")
    )  # fmt: skip
    return text + " " + _goal_flips(_goals_met(records), _goals_met(reference))


def _processor(record: dict[str, Any]) -> str:
    """A record's processor: its model name and, where stored, its ``cpu_id`` (family, model,
    stepping and vector units: one name can cover processors with different vector units)."""
    prov = record.get("provenance", {})
    cpu = prov.get("cpu") or "unnamed processor"
    return f"{cpu}; {prov['cpu_id']}" if prov.get("cpu_id") else cpu


def _goals_met(records: dict[str, dict[str, Any]]) -> dict[tuple[str, str], bool]:
    """``{(goal, shape): met}`` of native-kernel records ``{shape: record}``: each variant's step
    against its goal and the cofactor regulariser's share against its own."""
    met: dict[tuple[str, str], bool] = {}
    for shape, rec in records.items():
        for v, row in native_frame(rec).iterrows():
            met[(f"{v}'s step", shape)] = bool(row["met"])
        share = regularizer_share(rec, native=True)
        if share is not None:
            met[("the cofactor regulariser's share", shape)] = share["timed"] <= share["goal"]
    return met


def _goal_flips(here: dict[tuple[str, str], bool], there: dict[tuple[str, str], bool]) -> str:
    """Which goals one machine meets and the reference does not, and the other way round."""
    both = [key for key in here if key in there]
    if not both:
        return "No goal was measured on both machines."

    def names(keys: list[tuple[str, str]]) -> str:
        return ", ".join(f"{goal} ({shape} shape)" for goal, shape in keys) or "none"

    lost = [k for k in both if there[k] and not here[k]]
    won = [k for k in both if here[k] and not there[k]]
    return (
        f"Of the {len(both)} goals measured on both machines, met on the reference machine and "
        f"not on this one: {names(lost)}; met on this one and not on the reference: {names(won)}."
    )


def record_caption(record: dict[str, Any]) -> str:
    """A training-step record's shape, sizes and provenance, in one line."""
    return f"{record['shape']} {record['sizes']}: {provenance_text(record)}"


def native_frame(record: dict[str, Any]) -> pd.DataFrame:
    """One row per variant of a ``bench --train --native`` record that ran with the native
    kernels: the eager and the native step (ms, medians of the same interleaved rounds), the
    speed-up, each over the eager dot-product step (median and quartiles of the per-round
    ratios), the FLOP ratio to dot, the goal and whether the native step meets it."""
    res = record["results"]
    dot_flops = step_flops(res["dot"])
    rows = []
    for v, r in res.items():
        if "native" not in r:
            continue
        e, n = r["step"], r["native"]
        goal = GOALS.get(v, GOALS["default"])
        rows.append({
            "variant": v, "eager ms": 1e3 * e["median_s"], "native ms": 1e3 * n["median_s"],
            "speed-up": r["native_speedup"], "eager / dot": e["ratio_median"],
            "native / dot": n["ratio_median"], "native q25": n["ratio_q25"],
            "native q75": n["ratio_q75"], "FLOP ratio": step_flops(r) / dot_flops,
            "goal": goal, "met": n["ratio_median"] <= goal,
        })  # fmt: skip
    return pd.DataFrame(rows).set_index("variant")


def native_figure(frames: dict[str, pd.DataFrame]) -> go.Figure:
    """Each variant's step over the eager dot-product step, eager and with the native kernels,
    one group per shape (``{shape: native_frame}``), with the goals as markers."""
    return _eager_and_other_bars(frames, "native / dot", "native kernels",
                                 "Training steps, eager and with the native CPU kernels")  # fmt: skip


def native_sentence(frames: dict[str, pd.DataFrame]) -> str:
    """:func:`native_frame` per shape (``{shape: frame}``) in words: each variant's native step
    against its goal, its quartiles and the floor its FLOPs set."""
    if not frames:
        return "No training-step record with the native kernels is stored."
    parts = []
    for shape, f in frames.items():
        items = [
            f"{v} {row['native / dot']:.2f}x (quartiles {row['native q25']:.2f} to "
            f"{row['native q75']:.2f}; eager {row['eager / dot']:.2f}x; FLOPs "
            f"{row['FLOP ratio']:.2f}x): goal ({row['goal']:g}) {'met' if row['met'] else 'not met'}"
            for v, row in f.iterrows()
        ]
        parts.append(f"at the {shape} shape " + "; ".join(items))
    return "With the native kernels, in eager dot-product steps: " + "; ".join(parts) + "."


def compile_sentence(frames: dict[str, pd.DataFrame]) -> str:
    """:func:`compile_frame` per shape (``{shape: frame}``) in words: the range of the
    speed-ups, the variants that fell back, and the Fiber Bundle Transformer's step against its
    goal, eager and compiled."""
    if not frames:
        return "No compiled training-step record is stored."
    parts = []
    for shape, f in frames.items():
        sp = f["speed-up"]
        text = (
            f"at the {shape} shape compiling speeds the steps up by {sp.min():.2f}x "
            f"({sp.idxmin()}) to {sp.max():.2f}x ({sp.idxmax()})"
        )
        fell = [str(v) for v in f.index if f.loc[v, "fell back"]]
        if fell:
            text += f"; {', '.join(fell)} fell back to eager steps"
        if "fiber_bundle" in f.index:
            row, goal = f.loc["fiber_bundle"], GOALS["fiber_bundle"]
            both = row["compiled / compiled dot"]
            text += (
                f"; the Fiber Bundle Transformer's step is {row['eager / dot']:.2f} eager dot "
                f"steps eagerly, {row['compiled / eager dot']:.2f} compiled, and {both:.2f} "
                f"compiled dot steps with both compiled: goal ({goal:g}) "
                f"{'met' if both <= goal else 'not met'}"
            )
        parts.append(text)
    return (
        "With `TrainConfig(compile=True)` (the forward through `torch.compile`): "
        + "; ".join(parts)
        + "."
    )
