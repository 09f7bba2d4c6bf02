"""What chapter 5 shows of its experiment: tables, figures, the metrics' movement with training
and the long preset's size. The verdicts and the claims' outcomes are in :mod:`.verdicts`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from attention_atlas import viz
from attention_atlas.provenance import Provenance, format_duration
from attention_atlas.stats import mean_interval
from attention_atlas.store.records import time_column

from .run import ARMS, CONTROL, HIGHER_IS_BETTER, MATERIAL_CHANGE, SEED_ARM, TASK_METRIC

__all__ = [
    "choices_summary",
    "interval_text",
    "long_preset_text",
    "main_table",
    "metric_against_fraction",
    "movement_summary",
    "movement_table",
    "parameter_table",
    "prune_summary",
    "prune_table",
    "seeds_needed",
    "slice_table",
    "steps_to_material",
]

#: plot colour of each arm
COLORS = {"dot": "#636efa", "dense": "#ef553b", "matroidal": "#00cc96",
          "matroidal-grounded": "#ab63fa", "dense-qk": "#ffa15a", "matroidal-qk": "#19d3f3"}  # fmt: skip


def interval_text(values: Any, spec: str = ".4g") -> str:
    """``"mean [low, high]"`` over seeds (95% t-interval); the mean alone when a run is not
    finite (a NaN metric, a diverged run)."""
    x = np.asarray(values, dtype=float)
    if not np.isfinite(x).all():
        return f"{x.mean():{spec}}"
    return mean_interval(x).format(spec=spec)


# ----------------------------------------------------------------------------------------
# tables and figures
# ----------------------------------------------------------------------------------------


def parameter_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per arm of the main slice: total and metric parameters, attention-core FLOPs (forward,
    train step), ``m`` (covector columns) and whether the arm scores one ``z``."""
    first = runs[runs.slice == "main"].drop_duplicates("arm").set_index("arm")
    table = first[["attention", "params_total", "params_metric", "attn_flops_fwd",
                   "attn_flops_train", "m"]].copy()  # fmt: skip
    table["one z"] = [bool(ARMS[a][1].get("shared", False)) for a in table.index]
    return table


def main_table(runs: pd.DataFrame) -> pd.DataFrame:
    """The main slice by (data set, fraction, arm): the task metric, validation loss,
    gradient-norm CV, self-attention weight, metric change (intervals over seeds), non-finite
    counts and the mean training time (CPU time where every cell has it:
    :func:`~attention_atlas.store.records.time_column`)."""
    rows = []
    main = runs[runs.slice == "main"]
    tcol, tname = time_column(runs)
    for (ds, frac, arm), g in main.groupby(["dataset", "fraction", "arm"], sort=False):
        metric = TASK_METRIC[str(ds)]
        rows.append({
            "dataset": ds, "fraction": frac, "arm": arm,
            metric: interval_text(g[metric]), "val_loss": interval_text(g.val_loss),
            "grad-norm CV": interval_text(g.grad_norm_cv),
            "self-attention": interval_text(g.self_attention, ".3f"),
            "metric change": interval_text(g.metric_change, ".3f") if "metric_change" in g
            and g.metric_change.notna().all() else "",
            "nonfinite": int(g.nonfinite_logits.sum() + g.nonfinite_out.sum()),
            tname: f"{g[tcol].mean():.1f}",
        })  # fmt: skip
    return pd.DataFrame(rows)


def metric_against_fraction(runs: pd.DataFrame, dataset: str) -> go.Figure:
    """The task metric of ``dataset`` (mean and 95% interval over seeds) against the training
    fraction, one line per arm of the main slice."""
    main = runs[(runs.slice == "main") & (runs.dataset == dataset)]
    metric = TASK_METRIC[dataset]
    fractions = sorted(main.fraction.unique())
    fig = go.Figure()
    for arm in main.arm.unique():
        g = main[main.arm == arm]
        groups = {f"{f:g}": g[g.fraction == f][metric].to_numpy() for f in fractions}
        viz.mean_interval(groups, x=fractions, fig=fig, name=arm, mode="lines+markers",
                          color=COLORS.get(arm))  # fmt: skip
    fig.update_xaxes(type="log", title="training fraction")
    fig.update_yaxes(title=f"{metric}, mean and 95% interval over seeds")
    return fig.update_layout(title=f"{dataset}: {metric} against the training-set fraction")


def slice_table(runs: pd.DataFrame, slice_: str, by: str) -> pd.DataFrame:
    """One slice (``"m"`` or ``"family"``) by ``by``: the task metric, gradient-norm CV, trained
    all-ones weight, metric parameters, attention FLOPs and mean training time."""
    rows = []
    tcol, tname = time_column(runs)
    for key, g in runs[runs.slice == slice_].groupby(by, sort=False):
        metric = TASK_METRIC[str(g.dataset.iloc[0])]
        rows.append({
            by: key, "grounded": bool(g.grounded.iloc[0]), metric: interval_text(g[metric]),
            "grad-norm CV": interval_text(g.grad_norm_cv),
            "ones Rayleigh": f"{g.ones_rayleigh.median():.2g}",
            "metric params": int(g.params_metric.iloc[0]),
            "attn FLOPs (fwd)": int(g.attn_flops_fwd.iloc[0]),
            tname: f"{g[tcol].mean():.1f}",
        })  # fmt: skip
    return pd.DataFrame(rows)


def choices_summary(runs: pd.DataFrame) -> tuple[str, pd.DataFrame]:
    """What section 4's two choices did in the main slice: the mean self-attention weight per
    arm and the trained all-ones weight (``ones_rayleigh``), by data set; a sentence and the table."""
    main = runs[runs.slice == "main"]
    table = main.groupby(["dataset", "arm"], sort=False)[["self_attention", "ones_rayleigh"]].mean()
    parts = []
    for ds, t in table.groupby(level="dataset", sort=False):
        t = t.droplevel("dataset")
        arms = [
            a for a in ("matroidal", "dense", "matroidal-qk", "dense-qk", "dot") if a in t.index
        ]
        selfs = ", ".join(f"{a} {t.self_attention[a]:.2f}" for a in arms)
        ones = (f"; trained all-ones weight, bare {t.ones_rayleigh['matroidal']:.2g} against "
                f"grounded {t.ones_rayleigh['matroidal-grounded']:.2g} of the mean eigenvalue"
                if {"matroidal", "matroidal-grounded"} <= set(t.index) else "")  # fmt: skip
        parts.append(f"{ds}: mean self-attention weight {selfs}{ones}")
    return "; ".join(parts) + ".", table


def prune_table(runs: pd.DataFrame) -> pd.DataFrame:
    """The seed's arm of the main slice and the m and family slices, by pruning fraction: the
    task metric unpruned, after removing the smallest-weight columns and after removing as many
    random ones (the control), with the paired gains (pruned minus unpruned, so negative = lost)."""
    rows = []
    sel = runs[((runs.slice == "main") & (runs.arm == SEED_ARM)) | runs.slice.isin(["m", "family"])]
    fracs = sorted({c.split("@")[1] for c in runs.columns if c.startswith("pruned_val_loss@")})
    for name, g in sel.groupby("config", sort=False):
        metric = TASK_METRIC[str(g.dataset.iloc[0])]
        for f in fracs:
            col, rnd = f"pruned_{metric}@{f}", f"random_pruned_{metric}@{f}"
            if col not in g or g[col].isna().all():
                continue
            sign = 1 if HIGHER_IS_BETTER[metric] else -1
            rows.append({
                "config": name, "removed": float(f), metric: interval_text(g[metric]),
                "smallest removed": interval_text(sign * (g[col] - g[metric]), "+.3f"),
                "random removed": interval_text(sign * (g[rnd] - g[metric]), "+.3f"),
            })  # fmt: skip
    return pd.DataFrame(rows)


def prune_summary(runs: pd.DataFrame) -> str:
    """Per main-slice cell of the seed's arm and pruning fraction: the mean task-metric change
    from removing the smallest-weight columns against removing as many random ones (the
    control); both are no-retraining evaluations of the same trained models."""
    sel = runs[(runs.slice == "main") & (runs.arm == SEED_ARM)]
    parts = []
    for (ds, frac), g in sel.groupby(["dataset", "fraction"], sort=False):
        metric = TASK_METRIC[str(ds)]
        sign = 1 if HIGHER_IS_BETTER[metric] else -1
        for c in sorted(c for c in g.columns if c.startswith(f"pruned_{metric}@")):
            f = c.split("@")[1]
            small = sign * (g[c] - g[metric]).mean()
            rnd = sign * (g[f"random_pruned_{metric}@{f}"] - g[metric]).mean()
            parts.append(f"{ds} at fraction {frac:g}, {f} removed: {small:+.3f} against {rnd:+.3f}")
    return ("Change of the task metric (positive: better), smallest weights removed against "
            "random columns removed: " + "; ".join(parts) + ".") if parts else ""  # fmt: skip


def movement_table(runs: pd.DataFrame) -> pd.DataFrame:
    """How far training moved the metrics against the number of steps (the steps slice and the
    main slice's cells on the same data): by arm and steps, the median relative change of ``M``
    and of the matroidal weights, and whether the mean change reached
    :data:`.matroidal.MATERIAL_CHANGE`."""
    steps_rows = runs[runs.slice == "steps"]
    if steps_rows.empty:
        return pd.DataFrame()
    ds, frac = steps_rows.dataset.iloc[0], steps_rows.fraction.iloc[0]
    sel = runs[runs.slice.isin(["main", "steps"]) & runs.arm.isin([SEED_ARM, CONTROL])
               & (runs.dataset == ds) & (runs.fraction == frac)]  # fmt: skip
    rows = []
    for (arm, steps), g in sel.groupby(["arm", "steps"], sort=True):
        coef = g.coef_change if "coef_change" in g else pd.Series(dtype=float)
        rows.append({"arm": arm, "steps": int(steps),
                     "metric change": interval_text(g.metric_change, ".3f"),
                     "weight change": interval_text(coef, ".3f") if coef.notna().all() and len(coef) else "",
                     "material": bool(g.metric_change.mean() >= MATERIAL_CHANGE)})  # fmt: skip
    return pd.DataFrame(rows)


def _budgets(runs: pd.DataFrame, arm: str, col: str) -> pd.Series:
    """Mean ``col`` of ``arm`` by training steps, over the steps slice and the main-slice cell
    on the same data (positive values only; empty without a steps slice)."""
    steps_rows = runs[runs.slice == "steps"]
    if steps_rows.empty or col not in runs:
        return pd.Series(dtype=float)
    ds, frac = steps_rows.dataset.iloc[0], steps_rows.fraction.iloc[0]
    sel = runs[runs.slice.isin(["main", "steps"]) & (runs.arm == arm) & (runs.dataset == ds)
               & (runs.fraction == frac)]  # fmt: skip
    mean = sel.groupby("steps")[col].mean().dropna()
    return mean[mean > 0]


def _growth(runs: pd.DataFrame, arm: str, col: str) -> tuple[float, float, float] | None:
    """``(exponent, steps, change)``: the log-log slope of the mean ``col`` against steps for
    ``arm`` (:func:`_budgets`), and its largest budget and value there."""
    mean = _budgets(runs, arm, col)
    if len(mean) < 2:
        return None
    slope = float(np.polyfit(np.log(mean.index.to_numpy(float)), np.log(mean.to_numpy()), 1)[0])
    return slope, float(mean.index.max()), float(mean.iloc[-1])


def steps_to_material(runs: pd.DataFrame, arm: str, col: str = "metric_change") -> float:
    """Steps at which the mean ``col`` of ``arm`` reaches :data:`.matroidal.MATERIAL_CHANGE`: the
    smallest budget measured that reaches it, else extrapolated along the fitted power law from
    the largest budget (inf when it does not grow, NaN without a steps slice)."""
    g = _growth(runs, arm, col)
    if g is None:
        return math.nan
    slope, steps, change = g
    mean = _budgets(runs, arm, col)
    reached = mean[mean >= MATERIAL_CHANGE]
    if len(reached):
        return float(reached.index.min())
    return steps * (MATERIAL_CHANGE / change) ** (1 / slope) if slope > 0 else math.inf


def movement_summary(runs: pd.DataFrame) -> str:
    """The movement of the metrics in words: per arm the change at the largest budget, its
    growth exponent with steps, and the steps at which it reaches the material change."""
    parts = []
    for arm, col, what in ((CONTROL, "metric_change", "dense metric"),
                           (SEED_ARM, "metric_change", "matroidal metric"),
                           (SEED_ARM, "coef_change", "matroidal weights")):  # fmt: skip
        g = _growth(runs, arm, col)
        if g is None:
            continue
        slope, steps, change = g
        need = steps_to_material(runs, arm, col)
        parts.append(
            f"the {what} changed by {change:.3f} (median relative) after {steps:.0f} steps, growing "
            f"as steps^{slope:.2f}; " + (f"it passed {MATERIAL_CHANGE:g} by {need:,.0f} steps"
            if need <= steps else f"{MATERIAL_CHANGE:g} would take about {need:,.0f} steps")
        )  # fmt: skip
    return ("Movement of the metrics: " + "; ".join(parts) + ".") if parts else ""


def seeds_needed(runs: pd.DataFrame) -> dict[str, int]:
    """Per data set, the fewest seeds whose 95% interval of the seed's paired comparison
    (matroidal against dense, task metric, at the largest fraction) would be narrower than
    :data:`.matroidal.SESOI` on each side, at the seed-to-seed spread of these runs."""
    from scipy import stats as st

    from .run import SESOI

    out = {}
    main = runs[runs.slice == "main"]
    for ds, g in main.groupby("dataset", sort=False):
        g = g[g.fraction == g.fraction.max()]
        metric = TASK_METRIC[str(ds)]
        diff = (g[g.arm == SEED_ARM].set_index("seed")[metric]
                - g[g.arm == CONTROL].set_index("seed")[metric]).dropna()  # fmt: skip
        if len(diff) < 2:
            continue
        sd = float(diff.std(ddof=1))
        out[str(ds)] = next(n for n in range(3, 10_000)
                            if st.t.ppf(0.975, n - 1) * sd / math.sqrt(n) < SESOI[metric])  # fmt: skip
    return out


def long_preset_text(
    runs: pd.DataFrame, long: dict[str, Any], seeds: Sequence[int], shown: Provenance | None = None
) -> str:
    """The long preset ``long`` (parameters over :func:`.matroidal.chapter_grid`'s defaults, as
    ``sweep --preset long`` runs it): its budgets and grid size, the expected metric movement,
    the seeds its comparisons need (:func:`seeds_needed`), and its cost in CPU-hours from the
    per-step training time measured in ``runs`` (median per data set and arm; cells of an arm
    this grid has no time for use the slowest). ``shown``, the provenance of the grid ``runs``
    came from: when it is the long preset's own stored grid, the text says so and sets the
    compute its cells took beside the estimate."""
    from .run import chapter_grid

    grid = chapter_grid(**long)
    by_arm = (runs[time_column(runs)[0]] / runs.steps).groupby([runs.dataset, runs.arm])
    per_step = by_arm.median().to_dict()
    slowest = max(per_step.values())
    seconds = sum(p["train"]["steps"] * per_step.get((p["dataset"], p["arm"]), slowest)
                  for p in grid.values()) * len(seeds)  # fmt: skip
    g = _growth(runs, SEED_ARM, "coef_change")
    expect = ""
    if g is not None:
        slope, steps, change = g
        top = max(p["train"]["steps"] for p in grid.values() if p["slice"] == "steps")
        expect = (f" Its longest budget on `slice_dataset`, {top} steps, puts the matroidal weights' "
                  f"median change at {change * (top / steps) ** slope:.2f} by the fitted power law.")  # fmt: skip
    need = "; ".join(f"{ds} {n}" for ds, n in seeds_needed(runs).items())
    itself = ""
    if shown is not None and shown.preset == "long" and shown.source == "stored":
        itself = (f" It is the grid this chapter shows: its {shown.n_cells} stored runs took "
                  f"{format_duration(shown.compute_seconds)} of compute in all (the cells' own "
                  "wall times, on the machines of the provenance line).")  # fmt: skip
    return (
        f"**The long preset**: {', '.join(f'`{k}` = {v}' for k, v in long.items())}; "
        f"{len(grid)} configurations x {len(seeds)} seeds = {len(grid) * len(seeds)} runs."
        f"{itself} At the per-step times measured here it takes about {seconds / 3600:.0f} "
        f"CPU-hours (one thread per run).{expect} Seeds the seed's comparison needs to resolve "
        f"its smallest effect of interest at the spread seen here: {need or 'unknown'}."
    )
