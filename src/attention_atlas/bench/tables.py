"""The tables of a :func:`attention_atlas.experiments.performance.train_steps.bench_train` record: a step's matrix-product
FLOPs, its phases, and the plain-text summary the command line prints."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["format_train_table", "phase_table", "step_flops"]


def step_flops(result: dict[str, Any]) -> float:
    """The matrix-product FLOPs of one whole step of a :func:`~attention_atlas.experiments.performance.train_steps.bench_train` result: those the
    profile counted (model, loss and regularisers, the path the step really takes) plus the
    estimate of the LU factorisations of a cofactor regulariser on non-causal heads, which have
    no FLOP formula (causal heads take the closed form, no factorisation)."""
    f = result["flops"]
    return float(f["step_counted"] + f.get("regularizer_estimate", 0))


def phase_table(record: dict[str, Any], variant: str) -> list[dict[str, Any]]:
    """Rows ``{phase, ms, of dot step, share, forward MFLOP, backward MFLOP, GFLOP/s}`` of one
    variant's step, largest first; ``ms`` is the phase's share of the median step time, and
    ``GFLOP/s`` the rate its counted FLOPs ran at."""
    res = record["results"][variant]
    step_s, dot_s = res["step"]["median_s"], record["results"]["dot"]["step"]["median_s"]
    rows = [
        {"phase": name, "ms": 1e3 * p["share"] * step_s, "of dot step": p["share"] * step_s / dot_s,
         "share": p["share"], "forward MFLOP": p["forward_flops"] / 1e6,
         "backward MFLOP": p["backward_flops"] / 1e6,
         "GFLOP/s": (p["forward_flops"] + p["backward_flops"]) / (p["share"] * step_s) / 1e9
         if p["share"] > 0 else math.nan}
        for name, p in res["phases"].items()
    ]  # fmt: skip
    return sorted(rows, key=lambda r: -r["ms"])


def format_train_table(record: dict[str, Any]) -> str:
    """A plain-text summary of :func:`~attention_atlas.experiments.performance.train_steps.bench_train`: step time, ratio to dot, FLOPs."""
    s = record["sizes"]
    lines = [
        f"training step against dot, shape {record['shape']} {s} on {record['device']} "
        f"({record['threads']} threads), {record['reps']} interleaved rounds",
        f"{'variant':<14} {'step ms':>9} {'ratio':>7} {'[q25,q75]':>13} {'step GFLOP':>11} "
        f"{'FLOP ratio':>10}",
    ]
    dot_flops = step_flops(record["results"]["dot"])
    for v, r in record["results"].items():
        t, f = r["step"], step_flops(r)
        lines.append(
            f"{v:<14} {t['median_s'] * 1e3:>9.2f} {t['ratio_median']:>7.2f} "
            f"{'[' + format(t['ratio_q25'], '.2f') + ',' + format(t['ratio_q75'], '.2f') + ']':>13} "
            f"{f / 1e9:>11.3f} {f / dot_flops:>10.2f}"
        )
    if all("compiled" in r for r in record["results"].values()):
        lines.append("compiled forward (torch.compile), the same rounds; ratios to eager dot")
        lines.append(f"{'variant':<14} {'step ms':>9} {'ratio':>7} {'speedup':>8}  fell back")
        for v, r in record["results"].items():
            c = r["compiled"]
            lines.append(
                f"{v:<14} {c['median_s'] * 1e3:>9.2f} {c['ratio_median']:>7.2f} "
                f"{r['compile_speedup']:>8.2f}  {r['compile_error'] or 'no'}"
            )
    natives = {v: r for v, r in record["results"].items() if "native" in r}
    if natives:
        first = next(iter(natives.values()))
        level = f", level {first['native_level']}" if "native_level" in first else ""
        lines.append(
            f"native kernels ({first['native_status']}{level}), the same rounds; "
            "ratios to eager dot"
        )
        lines.append(
            f"{'variant':<14} {'step ms':>9} {'ratio':>7} {'[q25,q75]':>13} {'speedup':>8}"
        )
        for v, r in natives.items():
            c = r["native"]
            lines.append(
                f"{v:<14} {c['median_s'] * 1e3:>9.2f} {c['ratio_median']:>7.2f} "
                f"{'[' + format(c['ratio_q25'], '.2f') + ',' + format(c['ratio_q75'], '.2f') + ']':>13} "
                f"{r['native_speedup']:>8.2f}"
            )
    return "\n".join(lines)
