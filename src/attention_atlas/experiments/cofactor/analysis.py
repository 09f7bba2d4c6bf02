"""Chapter 6's analysis: the seed's success criteria as verdicts against the baseline arm.

The seed's criteria (*fewer nearly disconnected heads, lower gradient spikes, and equal or
better validation accuracy*) are each a paired difference ``cofactor - baseline`` over seeds
(:func:`attention_atlas.stats.paired_difference`), judged by the library's one rule
(:func:`attention_atlas.stats.verdict`) against a smallest effect of interest declared here
(:data:`SESOI`), at the training scale of the runs (:func:`training_scale`): a language model
still in the bigram regime, or a classifier less than halfway from chance to perfect, decides
nothing (:func:`attention_atlas.verdicts.outcome_from_verdict`).

"Equal or better" is a non-inferiority claim: it is tested as the verdict on *harm* (a drop of
accuracy, a rise of bits per character, by at least the SESOI), read the other way round
(:func:`_non_inferiority`): harm ruled out is support, harm shown is a contradiction.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from attention_atlas.cofactor.diagnostics import GAP_TOL
from attention_atlas.stats import (
    Interval,
    Verdict,
    mean_interval,
    non_inferiority,
    paired_difference,
    verdict,
)
from attention_atlas.verdicts import Outcome, TrainingScale, outcome_from_verdict

__all__ = [
    "ARMS",
    "CRITERIA",
    "SESOI",
    "SUMMARY_METRICS",
    "TASKS",
    "Criterion",
    "claim_outcome",
    "criteria",
    "criteria_table",
    "derived_metrics",
    "grad_norm_matrix",
    "history_matrix",
    "paired_effect",
    "summary_table",
    "training_scale",
]

TASKS = ("lm", "digits")
ARMS = ("baseline", "cofactor")

#: smallest effects of interest of the criteria, in the units of each effect (cofactor minus
#: baseline, paired by seed), fixed with the code before any run was read
SESOI: dict[str, float] = {
    # one regularised head-item in twenty leaving the nearly disconnected set (gap < GAP_TOL)
    "frac_disconnected (reg heads)": 0.05,
    # one gradient spike fewer in every 200 steps: as often as a reader would see one in a curve
    "grad_spike_rate": 5.0,
    # a quarter more or less variance of the gradient norm (a log ratio)
    "log_grad_norm_var": math.log(1.25),
    # two points of digits accuracy: 9 of the 450 validation digits
    "val_acc": 0.02,
    # 0.02 bits per character, the resolution character-level models are compared at
    "val_bpc": 0.02,
}

_DISCONNECTED = f"fraction of nearly disconnected regularised heads (gap < {GAP_TOL:g})"
#: the criteria: (claim key or None, task, metric, direction of the claimed effect, what it
#: measures). Direction "-1": the claim predicts a decrease; "noninferior-acc" /
#: "noninferior-bpc": equal or better (no drop of accuracy, no rise of bpc, of SESOI or more).
#: The gradient-norm variance is a measure the seed asks to log, decided but tied to no claim.
CRITERIA: list[tuple[str | None, str, str, str, str]] = [
    ("cofactor/disconnected", "lm", "frac_disconnected (reg heads)", "-1", _DISCONNECTED),
    ("cofactor/spikes", "lm", "grad_spike_rate", "-1", "gradient spikes per 1,000 steps"),
    (None, "lm", "log_grad_norm_var", "-1", "log of the gradient-norm variance"),
    ("cofactor/accuracy", "lm", "val_bpc", "noninferior-bpc", "validation bits per character"),
    ("cofactor/disconnected", "digits", "frac_disconnected (reg heads)", "-1", _DISCONNECTED),
    ("cofactor/spikes", "digits", "grad_spike_rate", "-1", "gradient spikes per 1,000 steps"),
    (None, "digits", "log_grad_norm_var", "-1", "log of the gradient-norm variance"),
    ("cofactor/accuracy", "digits", "val_acc", "noninferior-acc", "validation accuracy"),
]

#: the metrics of the summary table (rows)
SUMMARY_METRICS = [
    "val_loss", "val_bpc", "val_acc", "grad_norm_var", "grad_spike_rate",
    "self_attention (reg heads)", "cofactor_min_prob_n (reg heads)",
    "cofactor_near_zero (reg heads)", "spectral_gap (reg heads)", "frac_disconnected (reg heads)",
    "cofactor_log_margin (reg heads)", "spectral_gap (all heads)", "frac_disconnected (all heads)",
]  # fmt: skip


def derived_metrics(runs: pd.DataFrame) -> pd.DataFrame:
    """``runs`` (one row per cell of :func:`~attention_atlas.experiments.cofactor.run.run_cell`)
    with ``val_bpc`` (validation loss in bits), ``grad_spike_rate`` (spikes per 1,000 steps
    counted, i.e. after the warm-up and the 20-step window of the spike rule) and
    ``log_grad_norm_var``."""
    out = runs.copy()
    out["val_bpc"] = out["val_loss"] / math.log(2)
    steps = out["steps"].astype(float)
    counted = (steps - np.maximum(1, steps // 10) - 20).clip(lower=1)
    out["grad_spike_rate"] = 1000 * out["grad_spikes"] / counted
    out["log_grad_norm_var"] = np.log(out["grad_norm_var"])
    return out


def summary_table(runs: pd.DataFrame, digits: str = ".4g") -> pd.DataFrame:
    """Mean and 95% interval over seeds (``Interval.format``) of :data:`SUMMARY_METRICS`, one
    column per (task, arm)."""
    runs = derived_metrics(runs)
    cols = []
    for task in TASKS:
        for arm in ARMS:
            g = runs[(runs.task == task) & (runs.arm == arm)]
            cells = {m: mean_interval(g[m]).format(spec=digits) for m in SUMMARY_METRICS}
            cols.append({"task": task, "config": arm, "steps": int(g.steps.iloc[0]), **cells})
    return pd.DataFrame(cols).set_index(["task", "config"]).T


def paired_effect(runs: pd.DataFrame, task: str, metric: str) -> Interval:
    """``cofactor - baseline`` of ``metric`` on ``task``, paired by seed (95% interval)."""
    runs = derived_metrics(runs) if metric not in runs else runs
    arm = {a: runs[(runs.task == task) & (runs.arm == a)].set_index("seed")[metric] for a in ARMS}
    return paired_difference(arm["cofactor"], arm["baseline"])


def training_scale(runs: pd.DataFrame, task: str) -> TrainingScale:
    """The scale of ``task``'s runs: the baseline arm's steps, tokens per run (characters, or
    digits' patches), seeds,
    and its final validation accuracy (digits, chance 1/10) or bits per character (LM)."""
    runs = derived_metrics(runs)
    base = runs[(runs.task == task) & (runs.arm == "baseline")]
    steps = int(base.steps.iloc[0])
    per_step = int(base.batch_size.iloc[0]) * int(base.seq_len.iloc[0])  # tokens (patches)
    if task == "lm":
        return TrainingScale(steps, steps * per_step, len(base), float(base.val_bpc.mean()),
                             what="baseline (dot-product attention)")  # fmt: skip
    return TrainingScale(steps, steps * per_step, len(base), float(base.val_acc.mean()),
                         metric="acc", chance=0.1, what="baseline (dot-product attention)")  # fmt: skip


@dataclass(frozen=True)
class Criterion:
    """One of the seed's success criteria on one task: its effect, verdict and outcome."""

    claim: str | None  # the claims-register key it decides, if any
    task: str
    metric: str
    what: str
    effect: Interval
    verdict: Verdict
    outcome: Outcome


def _non_inferiority(effect: Interval, sesoi: float, harm: int, reason: str | None) -> Verdict:
    """ "Equal or better" (``harm`` is the sign of a harmful effect): the one rule's
    non-inferiority form, the better side being ``-harm``."""
    return non_inferiority(effect, margin=sesoi, better=-harm, not_tested=reason)


def _not_tested(runs: pd.DataFrame, task: str, metric: str, direction: str) -> str | None:
    """Why a decrease cannot be tested: the baseline arm has (nearly) nothing to remove."""
    if direction != "-1" or metric not in ("frac_disconnected (reg heads)", "grad_spike_rate"):
        return None
    base = runs[(runs.task == task) & (runs.arm == "baseline")][metric]
    if (base < SESOI[metric]).all():
        return (f"the baseline's {metric} is below the SESOI ({SESOI[metric]:g}) in every run "
                f"(at most {base.max():.3g}): nothing to remove")  # fmt: skip
    return None


def criteria(runs: pd.DataFrame) -> list[Criterion]:
    """Every row of :data:`CRITERIA` on the runs: paired effect, verdict, and outcome at the
    task's training scale."""
    runs = derived_metrics(runs)
    out = []
    for claim, task, metric, direction, what in CRITERIA:
        effect = paired_effect(runs, task, metric)
        sesoi = SESOI[metric]
        if direction.startswith("noninferior"):
            v = _non_inferiority(effect, sesoi, -1 if direction.endswith("acc") else 1, None)
        else:
            v = verdict(effect, sesoi=sesoi, direction=int(direction),
                        not_tested=_not_tested(runs, task, metric, direction))  # fmt: skip
        label = f"{task}: {what}, cofactor minus baseline"
        o = outcome_from_verdict(v, label, scale=training_scale(runs, task))
        out.append(Criterion(claim, task, metric, what, effect, v, o))
    return out


def criteria_table(crit: Sequence[Criterion]) -> pd.DataFrame:
    """The criteria as a table: task, criterion, the paired difference and its interval, the
    SESOI, the verdict and the outcome at the task's scale."""
    return pd.DataFrame(
        [{"task": c.task, "criterion": c.what, "cofactor - baseline": c.effect.mean,
          "95% low": c.effect.low, "95% high": c.effect.high, "SESOI": c.verdict.sesoi,
          "verdict": c.verdict.outcome, "outcome at this scale": c.outcome.outcome,
          "claim": c.claim or ""}
         for c in crit]
    )  # fmt: skip


def claim_outcome(crit: Sequence[Criterion], claim: str, evidence: str = "computed") -> Outcome:
    """One claim's outcome from its criteria on every task: *contradicted* when one task
    contradicts it, *supported* when every task that tests it supports it, *not tested* when no
    task tests it, *not resolved* otherwise. The effect is that of the first deciding task."""
    rows = [c for c in crit if c.claim == claim]
    if not rows:
        raise KeyError(f"no criterion decides claim {claim!r}")
    tested = [c for c in rows if c.outcome.outcome != "not tested"]
    kinds = {c.outcome.outcome for c in tested}
    if not tested:
        outcome = "not tested"
    elif "contradicted" in kinds:
        outcome = "contradicted"
    elif kinds == {"supported"}:
        outcome = "supported"
    else:
        outcome = "not resolved"
    lead = next((c for c in rows if c.outcome.outcome == outcome), rows[0])
    return Outcome(
        outcome, "; ".join(c.outcome.summary for c in rows), lead.effect, lead.verdict.sesoi,
        " | ".join(f"{c.task}: {c.outcome.scale}" for c in rows), evidence,
        {"per_task": {c.task: c.outcome.outcome for c in rows}}, form=lead.outcome.form,
        reason=lead.outcome.reason if outcome == "not tested" else None,
        witness="; ".join(f"{c.task}: {c.outcome.witness}" for c in tested) or None,
    )  # fmt: skip


def grad_norm_matrix(records: Sequence[dict[str, Any]]) -> np.ndarray:
    """``(n_seeds, k)`` per-step gradient norms of the runs of one configuration (their stored
    ``grad_norms``), cut to the shortest run."""
    norms = [r["grad_norms"] for r in records]
    k = min(len(g) for g in norms)
    return np.array([g[:k] for g in norms], dtype=float)


def history_matrix(records: Sequence[dict[str, Any]], column: str) -> tuple[np.ndarray, np.ndarray]:
    """``(steps (k,), values (n_seeds, k))`` of one column of the runs' logged history (the
    ``"cofactor"`` diagnostic of the regularised heads at each log step, ``val_bpc``, ...), cut
    to the log steps every run has."""
    hist = [r["history"] for r in records]
    k = min(len(h["step"]) for h in hist)
    return np.asarray(hist[0]["step"][:k], dtype=float), np.array(
        [h[column][:k] for h in hist], dtype=float
    )
