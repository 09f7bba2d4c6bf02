"""What chapter 5 shows of its experiment: tables, figures, verdicts and the claims' outcomes.

Every comparison is a paired difference over seeds (:func:`attention_atlas.stats.paired_difference`)
of the data set's task metric (accuracy for digits, bits per character for char-PTB), signed as
a *gain* (positive: the arm is better than its control), judged by :func:`attention_atlas.stats.verdict`
against the smallest effect of interest :data:`.matroidal.SESOI` declared in code, and stated
with its training scale (:class:`attention_atlas.claims.TrainingScale`, the dot-product arm at
the same budget): a scale that is not decisive (char-PTB above 3 bpc, digits less than halfway
from chance to perfect) makes the outcome *not tested*, the interval still shown.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from .. import viz
from ..claims import Outcome, TrainingScale, outcome_from_verdict
from ..stats import Interval, Verdict, mean_interval, paired_difference, verdict
from .matroidal import (
    ARMS,
    COMPARISONS,
    CONTROL,
    HIGHER_IS_BETTER,
    MATERIAL_CHANGE,
    SEED_ARM,
    SESOI,
    TASK_METRIC,
)

__all__ = [
    "choices_summary",
    "comparison_table",
    "empirical_outcomes",
    "gain",
    "interval_text",
    "long_preset_text",
    "main_table",
    "metric_against_fraction",
    "movement_summary",
    "movement_table",
    "non_inferior",
    "parameter_table",
    "prune_table",
    "scale_of",
    "slice_table",
    "steps_to_material",
    "verdict_summary",
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


def _by_seed(g: pd.DataFrame, col: str) -> pd.Series:
    return g.set_index("seed")[col].astype(float)


def gain(arm: pd.DataFrame, control: pd.DataFrame, metric: str) -> Interval:
    """Paired (by seed) improvement of ``arm`` over ``control`` in ``metric``: ``arm - control``
    when higher is better (accuracy), ``control - arm`` otherwise (bpc, CV, failures)."""
    a, c = _by_seed(arm, metric), _by_seed(control, metric)
    return (
        paired_difference(a, c) if HIGHER_IS_BETTER.get(metric, False) else paired_difference(c, a)
    )


def non_inferior(effect: Interval, sesoi: float) -> Verdict:
    """ "Equal or better" (a gain no worse than ``-sesoi``) by the library's rule: *supported*
    when the gain excludes zero upwards (``direction=+1``) or lies inside ``+-sesoi``
    (``direction=0``), *contradicted* when it is worse by at least ``sesoi``, else *not resolved*."""
    better = verdict(effect, sesoi=sesoi, direction=+1)
    return better if better.outcome == "supported" else verdict(effect, sesoi=sesoi, direction=0)


def scale_of(runs: pd.DataFrame, dataset: str, fraction: float) -> TrainingScale:
    """The training scale of a (data set, fraction) cell: the dot arm's mean task metric."""
    dot = runs[(runs.slice == "main") & (runs.arm == "dot") & (runs.dataset == dataset)
               & (runs.fraction == fraction)]  # fmt: skip
    metric = TASK_METRIC[dataset]
    steps, tokens, base = 0, 0, math.nan
    if not dot.empty:
        steps, tokens, base = (
            int(dot.steps.iloc[0]),
            int(dot.tokens.iloc[0]),
            float(dot[metric].mean()),
        )
    if dataset == "digits":
        return TrainingScale(steps, tokens, len(dot), base, metric="acc", chance=0.1,
                             what="dot-product arm (images, not tokens)")  # fmt: skip
    return TrainingScale(steps, tokens, len(dot), base, what="dot-product arm")


def _cells(runs: pd.DataFrame) -> list[tuple[str, float, pd.DataFrame]]:
    main = runs[runs.slice == "main"]
    keys: list[Any] = list(main.groupby(["dataset", "fraction"], sort=False))
    return [(str(ds), float(fr), g) for (ds, fr), g in keys]


def _arm(g: pd.DataFrame, arm: str) -> pd.DataFrame:
    return g[g.arm == arm]


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
    counts and the mean training time."""
    rows = []
    main = runs[runs.slice == "main"]
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
            "train s": f"{g.train_time_s.mean():.1f}",
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


def comparison_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Every comparison of :data:`.matroidal.COMPARISONS` in every (data set, fraction) cell:
    the paired gain in the task metric and the verdict at that cell's scale (two-sided: better
    or worse by at least the SESOI, equivalent within it, or not resolved)."""
    rows = []
    for ds, frac, g in _cells(runs):
        metric, scale = TASK_METRIC[ds], scale_of(runs, ds, frac)
        for arm, control, what in COMPARISONS:
            a, c = _arm(g, arm), _arm(g, control)
            if a.empty or c.empty:
                continue
            eff = gain(a, c, metric)
            rows.append({"dataset": ds, "fraction": frac, "arm": arm, "control": control,
                         f"gain ({metric})": eff.format(spec="+.3f"),
                         "verdict": _two_sided(eff, SESOI[metric], scale), "what": what})  # fmt: skip
    return pd.DataFrame(rows)


def _two_sided(effect: Interval, sesoi: float, scale: TrainingScale) -> str:
    """A comparison's verdict in words: equivalent within the SESOI, better or worse (the
    interval excludes zero and is not inside the SESOI), else not resolved; not tested at a
    scale that is not decisive or with fewer than three seeds."""
    if effect.n < 3:
        return f"not tested: {effect.n} seed(s)"
    if not scale.decisive:
        return f"not tested: {scale.reason()}"
    if verdict(effect, sesoi=sesoi, direction=0).outcome == "supported":
        return f"equivalent within +-{sesoi:g}"
    for direction, word in ((+1, "better"), (-1, "worse")):
        if verdict(effect, sesoi=sesoi, direction=direction).outcome == "supported":
            return word
    return f"not resolved (detectable +-{effect.half_width:.3f})"


def slice_table(runs: pd.DataFrame, slice_: str, by: str) -> pd.DataFrame:
    """One slice (``"m"`` or ``"family"``) by ``by``: the task metric, gradient-norm CV, trained
    all-ones weight, metric parameters, attention FLOPs and mean training time."""
    rows = []
    for key, g in runs[runs.slice == slice_].groupby(by, sort=False):
        metric = TASK_METRIC[str(g.dataset.iloc[0])]
        rows.append({
            by: key, "grounded": bool(g.grounded.iloc[0]), metric: interval_text(g[metric]),
            "grad-norm CV": interval_text(g.grad_norm_cv),
            "ones Rayleigh": f"{g.ones_rayleigh.median():.2g}",
            "metric params": int(g.params_metric.iloc[0]),
            "attn FLOPs (fwd)": int(g.attn_flops_fwd.iloc[0]),
            "train s": f"{g.train_time_s.mean():.1f}",
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


def _growth(runs: pd.DataFrame, arm: str, col: str) -> tuple[float, float, float] | None:
    """``(exponent, steps, change)``: the log-log slope of the mean ``col`` against steps for
    ``arm`` over the steps slice and its main-slice cell, and the largest point."""
    steps_rows = runs[runs.slice == "steps"]
    if steps_rows.empty or col not in runs:
        return None
    ds, frac = steps_rows.dataset.iloc[0], steps_rows.fraction.iloc[0]
    sel = runs[runs.slice.isin(["main", "steps"]) & (runs.arm == arm) & (runs.dataset == ds)
               & (runs.fraction == frac)]  # fmt: skip
    mean = sel.groupby("steps")[col].mean().dropna()
    mean = mean[mean > 0]
    if len(mean) < 2:
        return None
    slope = float(np.polyfit(np.log(mean.index.to_numpy(float)), np.log(mean.to_numpy()), 1)[0])
    return slope, float(mean.index.max()), float(mean.iloc[-1])


def steps_to_material(runs: pd.DataFrame, arm: str, col: str = "metric_change") -> float:
    """Steps at which ``col`` of ``arm`` reaches :data:`.matroidal.MATERIAL_CHANGE`, extrapolated
    along the fitted power law from the largest budget measured (that budget if reached; NaN
    when it does not grow)."""
    g = _growth(runs, arm, col)
    if g is None:
        return math.nan
    slope, steps, change = g
    if change >= MATERIAL_CHANGE:
        return steps
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
            f"as steps^{slope:.2f}; " + (f"it passed {MATERIAL_CHANGE:g} within the budgets run"
            if need <= steps else f"{MATERIAL_CHANGE:g} would take about {need:,.0f} steps")
        )  # fmt: skip
    return ("Movement of the metrics: " + "; ".join(parts) + ".") if parts else ""


def long_preset_text(
    runs: pd.DataFrame, long: dict[str, Any], seeds: Sequence[int], book: dict[str, Any]
) -> str:
    """The long preset: its budgets and grid size, the expected metric movement at its budget,
    and its cost in CPU-hours from the per-step training time measured in ``runs`` (median per
    data set and arm; the long grid's cells that this grid has no time for use the slowest)."""
    from .matroidal import chapter_grid

    params = {**book, **long}
    grid = chapter_grid(**params)
    per_step = (runs.train_time_s / runs.steps).groupby([runs.dataset, runs.arm]).median().to_dict()
    slowest = max(per_step.values())
    seconds = sum(p["train"]["steps"] * per_step.get((p["dataset"], p["arm"]), slowest)
                  for p in grid.values()) * len(seeds)  # fmt: skip
    g = _growth(runs, SEED_ARM, "coef_change")
    expect = ""
    if g is not None:
        slope, steps, change = g
        s_long = params["steps"] if params["slice_dataset"] == "digits" else params["lm_steps"]
        expect = (f" At {s_long} steps the fitted power law puts the matroidal weights' median "
                  f"change at {change * (s_long / steps) ** slope:.2f}.")  # fmt: skip
    return (
        f"**The long preset**: {', '.join(f'`{k}` = {v}' for k, v in long.items())}; "
        f"{len(grid)} configurations x {len(seeds)} seeds = {len(grid) * len(seeds)} runs. "
        f"At the per-step times measured here it takes about {seconds / 3600:.0f} CPU-hours "
        f"(one thread per run).{expect}"
    )


def verdict_summary(outcomes: dict[str, Outcome], evidence: str) -> str:
    """The claims' outcomes in one paragraph: how many of each, and which."""
    by: dict[str, list[str]] = {}
    for key, o in outcomes.items():
        by.setdefault(o.outcome, []).append(key.split("/", 1)[1])
    counts = "; ".join(f"**{k}**: {', '.join(v)}" for k, v in sorted(by.items()))
    return f"Outcomes of the {len(outcomes)} matroidal claims: {counts}. *Evidence:* {evidence}."


# ----------------------------------------------------------------------------------------
# the claims' outcomes
# ----------------------------------------------------------------------------------------


def _combine(parts: list[tuple[str, Outcome]], what: str, evidence: str) -> Outcome:
    """One outcome from a claim's cells: *contradicted* when any tested cell contradicts it,
    *supported* when every tested cell supports it, *not tested* when no cell was tested, else
    *not resolved*; the effect shown is that of the deciding cell."""
    tested = [(c, o) for c, o in parts if o.outcome != "not tested"]
    if not parts:
        return Outcome("not tested", f"{what}: no cell of the grid tests it", evidence=evidence)
    if any(o.outcome == "contradicted" for _, o in tested):
        cell, o = next((c, o) for c, o in tested if o.outcome == "contradicted")
        outcome = "contradicted"
    elif tested and all(o.outcome == "supported" for _, o in tested):
        (cell, o), outcome = tested[-1], "supported"
    elif tested:
        cell, o = next((c, o) for c, o in tested if o.outcome == "not resolved")
        outcome = "not resolved"
    else:
        (cell, o), outcome = parts[-1], "not tested"
    cells = "; ".join(f"{c}: {p.outcome}" for c, p in parts)
    summary = f"{what} ({cells}). Deciding cell {cell}: {o.summary}"
    return Outcome(outcome, summary, o.effect, o.sesoi, o.scale, evidence=evidence,
                   extra={"cells": {c: p.outcome for c, p in parts}})  # fmt: skip


def _per_cell(runs: pd.DataFrame, rule: Any) -> list[tuple[str, Outcome]]:
    """``rule(dataset, g) -> (Verdict, what) | None`` on each (data set, fraction) cell of the
    main slice, each turned into an outcome at its scale."""
    out = []
    for ds, frac, g in _cells(runs):
        res = rule(ds, g)
        if res is not None:
            v, what = res
            scale = scale_of(runs, ds, frac)
            out.append((f"{ds} {frac:g}", outcome_from_verdict(v, what, scale=scale)))
    return out


def _seed_pair(g: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    a, c = _arm(g, SEED_ARM), _arm(g, CONTROL)
    return None if a.empty or c.empty else (a, c)


def _loss_rule(ds: str, g: pd.DataFrame) -> tuple[Verdict, str] | None:
    pair, metric = _seed_pair(g), TASK_METRIC[ds]
    if pair is None:
        return None
    return non_inferior(gain(*pair, metric), SESOI[metric]), f"{metric} gain over dense"


def _smoother_rule(ds: str, g: pd.DataFrame) -> tuple[Verdict, str] | None:
    pair = _seed_pair(g)
    if pair is None:
        return None
    v = verdict(gain(*pair, "grad_norm_cv"), sesoi=SESOI["grad_norm_cv"], direction=+1)
    return v, "gradient-norm CV, dense minus matroidal"


def _stability_rule(ds: str, g: pd.DataFrame) -> tuple[Verdict, str] | None:
    pair = _seed_pair(g)
    if pair is None:
        return None
    a, c = (x.assign(nonfinite=x.nonfinite_logits + x.nonfinite_out) for x in pair)
    v = non_inferior(gain(a, c, "nonfinite"), SESOI["nonfinite"])
    return v, "non-finite logits and outputs, dense minus matroidal"


def _pruning_rule(ds: str, g: pd.DataFrame) -> tuple[Verdict, str] | None:
    a, metric = _arm(g, SEED_ARM), TASK_METRIC[ds]
    cols = sorted(c for c in g.columns if c.startswith(f"pruned_{metric}@"))
    if a.empty or not cols or a[cols[0]].isna().all():
        return None
    eff = gain(a.assign(**{metric: a[cols[0]]}), a, metric)  # pruned against unpruned
    what = f"{metric} after removing the smallest {cols[0].split('@')[1]} of each head's columns"
    return non_inferior(eff, SESOI[metric]), what


def empirical_outcomes(runs: pd.DataFrame, *, evidence: str) -> dict[str, Outcome]:
    """The outcome of each hypothesis of the matroidal seed from the grid's ``runs``
    (:func:`.matroidal.runs_frame`): the seed's arm against the dense metric, both on one ``z``."""
    rules = {
        "matroidal/loss": (_loss_rule, "Matroidal against dense, task metric, equal or better"),
        "matroidal/smoother": (_smoother_rule, "Gradient-norm CV lower with the matroidal metric"),
        "matroidal/stability": (_stability_rule, "No more non-finite values than the dense metric"),
        "matroidal/pruning": (_pruning_rule, "Pruning the smallest weights keeps the task metric"),
    }
    out = {k: _combine(_per_cell(runs, rule), what, evidence) for k, (rule, what) in rules.items()}
    out["matroidal/low-data"] = _low_data(runs, evidence)
    out["matroidal/m"] = _m_outcome(runs, evidence)
    return out


def _low_data(runs: pd.DataFrame, evidence: str) -> Outcome:
    """Per data set: the gain over dense at the lowest fraction minus the gain at the highest,
    paired by seed; the claim predicts it is positive (the structure helps more with less data)."""
    parts = []
    main = runs[runs.slice == "main"]
    for ds, g in main.groupby("dataset", sort=False):
        lo, hi, metric = g.fraction.min(), g.fraction.max(), TASK_METRIC[str(ds)]
        if lo == hi:
            continue
        sign = 1 if HIGHER_IS_BETTER[metric] else -1

        def gains(
            f: float, g: pd.DataFrame = g, metric: str = metric, sign: int = sign
        ) -> pd.Series:
            x = g[g.fraction == f]
            return sign * (_by_seed(_arm(x, SEED_ARM), metric) - _by_seed(_arm(x, CONTROL), metric))

        v = verdict(paired_difference(gains(lo), gains(hi)), sesoi=SESOI[metric], direction=+1)
        what = f"gain over dense at fraction {lo:g} minus at {hi:g} ({metric})"
        parts.append((str(ds), outcome_from_verdict(v, what, scale=scale_of(runs, str(ds), lo))))
    return _combine(parts, "The structured metric helps more at the lowest fraction", evidence)


def _m_outcome(runs: pd.DataFrame, evidence: str) -> Outcome:
    """``m = 4d`` against ``m = d`` (the m slice): the claim that m matters is *supported* when
    the difference is at least the SESOI either way, *contradicted* when it is equivalent within
    it, else *not resolved*."""
    ms = runs[runs.slice == "m"]
    if ms.empty or ms.m.nunique() < 2:
        return Outcome("not tested", "the grid has fewer than two values of m", evidence=evidence)
    ds, frac = str(ms.dataset.iloc[0]), float(ms.fraction.iloc[0])
    metric = TASK_METRIC[ds]
    eff = gain(ms[ms.m == ms.m.max()], ms[ms.m == ms.m.min()], metric)
    same = verdict(eff, sesoi=SESOI[metric], direction=0)
    flip = {"supported": "contradicted", "contradicted": "supported"}
    v = Verdict(
        flip.get(same.outcome, same.outcome), eff, same.sesoi, 0, same.reason, same.detectable
    )
    what = f"{metric}, m = {ms.m.max()} minus m = {ms.m.min()} on {ds} at fraction {frac:g}"
    part = (f"{ds} {frac:g}", outcome_from_verdict(v, what, scale=scale_of(runs, ds, frac)))
    return _combine([part], "The number of columns m changes the task metric", evidence)
