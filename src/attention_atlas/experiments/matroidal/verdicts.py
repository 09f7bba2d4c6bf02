"""Chapter 5's verdicts: each comparison of its experiment, and each hypothesis's outcome.

Every comparison is a paired difference over seeds (:func:`attention_atlas.stats.paired_difference`)
of the data set's task metric (accuracy for digits, bits per character for char-PTB), signed as
a *gain* (positive: the arm is better than its control), judged by :func:`attention_atlas.stats.verdict`
against the smallest effect of interest :data:`.matroidal.SESOI` declared in code, and stated
with its training scale (:class:`attention_atlas.verdicts.TrainingScale`, the dot-product arm at
the same budget): a scale that is not decisive (char-PTB above 3 bpc, digits less than halfway
from chance to perfect) makes the outcome *not tested*, the interval still shown.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from attention_atlas.stats import Interval, Verdict, non_inferiority, paired_difference, verdict
from attention_atlas.verdicts import Outcome, TrainingScale, outcome_from_verdict

from .checks import math_outcomes
from .run import (
    COMPARISONS,
    CONTROL,
    HIGHER_IS_BETTER,
    PRESET_SEEDS,
    PRESETS,
    SEED_ARM,
    SESOI,
    TASK_METRIC,
    load_runs,
)

__all__ = [
    "comparison_summary",
    "comparison_table",
    "empirical_outcomes",
    "gain",
    "non_inferior",
    "outcomes",
    "scale_of",
    "scale_summary",
    "verdict_summary",
]


def _by_seed(g: pd.DataFrame, col: str) -> pd.Series:
    return g.set_index("seed")[col].astype(float)


def gain(arm: pd.DataFrame, control: pd.DataFrame, metric: str) -> Interval:
    """Paired (by seed) improvement of ``arm`` over ``control`` in ``metric``: ``arm - control``
    when higher is better (accuracy), ``control - arm`` otherwise (bpc, CV, failures)."""
    a, c = _by_seed(arm, metric), _by_seed(control, metric)
    return (
        paired_difference(a, c) if HIGHER_IS_BETTER.get(metric, False) else paired_difference(c, a)
    )


def non_inferior(effect: Interval, sesoi: float, *, not_tested: str | None = None) -> Verdict:
    """ "Equal or better" by the one rule's non-inferiority form
    (:func:`attention_atlas.stats.non_inferiority`) on a *gain* (positive: the arm is better):
    *supported* when the whole interval lies above ``-sesoi``, *contradicted* when it lies
    below, else *not resolved*; a gain never contradicts it."""
    return non_inferiority(effect, margin=sesoi, better=+1, not_tested=not_tested)


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


def scale_summary(runs: pd.DataFrame) -> str:
    """The training scale of every (data set, fraction) cell of the main slice, and whether a
    verdict there may support or contradict anything."""
    parts = []
    for ds, frac, _ in _cells(runs):
        sc = scale_of(runs, ds, frac)
        verdict_text = "decisive" if sc.decisive else f"not decisive: {sc.reason()}"
        parts.append(f"{ds} at fraction {frac:g}: {sc.text()} ({verdict_text})")
    return "Training scale: " + "; ".join(parts) + "."


def comparison_summary(table: pd.DataFrame) -> str:
    """The resolved rows of :func:`comparison_table` in words (arm, control, cell, gain), and
    how many rows are not resolved or not tested."""
    parts = []
    for _, r in table.iterrows():
        if r.verdict.startswith(("not resolved", "not tested")):
            continue
        gain = next(r[c] for c in table.columns if c.startswith("gain (") and isinstance(r[c], str))
        parts.append(f"{r.arm} against {r.control} on {r.dataset} at fraction {r.fraction:g}: "
                     f"{r.verdict}, gain {gain}")  # fmt: skip
    rest = int(table.verdict.str.startswith("not resolved").sum())
    untested = int(table.verdict.str.startswith("not tested").sum())
    lead = ("Resolved: " + "; ".join(parts) + ".") if parts else "No comparison is resolved."
    return f"{lead} Not resolved: {rest} of {len(table)}; not tested: {untested}."


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
                   extra={"cells": {c: p.outcome for c, p in parts}}, form=o.form,
                   reason=o.reason if outcome == "not tested" else None,
                   witness=o.witness)  # fmt: skip


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
    events = int(a.nonfinite.sum() + c.nonfinite.sum())
    none = None if events else (f"no events: no non-finite value in either arm's {len(a) + len(c)}"
                                " runs, so a difference could not have shown")  # fmt: skip
    v = non_inferior(gain(a, c, "nonfinite"), SESOI["nonfinite"], not_tested=none)
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
    """``m = 4d`` against ``m = d`` (the m slice), a superiority claim: *supported* when the
    larger m is better by at least the SESOI, *contradicted* when the interval rules that out."""
    ms = runs[runs.slice == "m"]
    if ms.empty or ms.m.nunique() < 2:
        return Outcome("not tested", "the grid has fewer than two values of m", evidence=evidence)
    ds, frac = str(ms.dataset.iloc[0]), float(ms.fraction.iloc[0])
    metric = TASK_METRIC[ds]
    eff = gain(ms[ms.m == ms.m.max()], ms[ms.m == ms.m.min()], metric)
    v = verdict(eff, sesoi=SESOI[metric], direction=+1)  # more columns: better by the SESOI
    what = f"{metric}, m = {ms.m.max()} minus m = {ms.m.min()} on {ds} at fraction {frac:g}"
    part = (f"{ds} {frac:g}", outcome_from_verdict(v, what, scale=scale_of(runs, ds, frac)))
    return _combine([part], "The number of columns m changes the task metric", evidence)


def outcomes(smoke: bool = False) -> dict[str, Any]:
    """The outcome of every matroidal claim of :data:`attention_atlas.claims.CLAIMS`: the
    mathematical ones by chapter 5's float64 checks (toy sizes when ``smoke``), the hypotheses
    by :func:`attention_atlas.stats.verdict` on the stored results (``results/matroidal``; the
    smoke grid, run now, when ``smoke``)."""
    preset = "smoke" if smoke else "book"
    runs, grid = load_runs(
        {**PRESETS["book"], **PRESETS[preset]}, PRESET_SEEDS[preset], smoke=smoke
    )
    out = math_outcomes(smoke)
    out.update(empirical_outcomes(runs, evidence=grid.provenance.text))
    return out
