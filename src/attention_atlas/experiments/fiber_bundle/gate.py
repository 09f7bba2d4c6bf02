"""The geometry gate of issue 53 and the two claims it led to. Is the geometry doing anything?
Per trained Fiber Bundle model, the change of the task's measure when the Riemannian part is
removed at evaluation (``alpha -> 0``, and every metric factor ``U_t = 0``), with an interval over
seeds (:class:`Gate`, :func:`geometry_gate`, :func:`gate_table`); a prediction about the
geometry is decided only where the gate is active (:func:`gate_reason`, :func:`gated`), else it
is *not tested: geometry inert* with the measured change. The claims: the regularised metric
stays in its band, or what grew first where it did not (:func:`divergence_finding`,
:func:`divergence_outcome`); and the unregularised model, whose geometry acts, against
dot-product models matched in parameters, training FLOPs and wall clock, on char-PTB
(:func:`matched_dot_verdicts`, :func:`matched_dot_outcome`) and on MQAR
(:func:`mqar_matched_verdicts`, :func:`mqar_matched_outcome`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from attention_atlas.stats import Interval, Verdict, mean_interval, verdict
from attention_atlas.verdicts import (
    Outcome,
    TrainingScale,
    outcome_from_check,
    outcome_from_verdict,
)

from .analysis import Runs
from .mqar import MQAR_ARMS, mqar_command
from .rule import SESOI, at_scale, diverged_reason, training_scale, weakest
from .run import GATE_COMMAND, MATCHED_COMMAND

__all__ = [
    "GATES",
    "GATE_SINCE",
    "GATE_MEASURES",
    "MATCHED",
    "RUNAWAY",
    "Gate",
    "divergence_finding",
    "divergence_outcome",
    "gate_reason",
    "gate_table",
    "gated",
    "geometry_gate",
    "long_regate_command",
    "matched_dot_outcome",
    "ungated",
    "matched_dot_verdicts",
    "mqar_matched_outcome",
    "mqar_matched_verdicts",
]

# -- the geometry gate ----------------------------------------------------------------------

#: the two ways the geometry is removed at evaluation: the Riemannian score blended out
#: (``alpha -> 0``) and every metric factor ``U_t = 0`` at the model's own alpha
GATES = ("alpha0", "u0")


@dataclass(frozen=True)
class Gate:
    """The geometry gate of one Fiber Bundle configuration: per way of removing the geometry
    (:data:`GATES`), the change of validation bpc over seeds with its 95% interval (None where
    a cell lacks the evaluation or diverged). ``active`` when some interval lies wholly beyond
    the declared smallest effect ``sesoi`` on either side: removing the geometry costs at least
    that, or gains at least that (a geometry that hurts is doing something too)."""

    config: str
    alpha0: Interval | None
    u0: Interval | None
    sesoi: float
    unit: str = "bpc"  # what the change is measured in ("test accuracy lost" on MQAR)

    @property
    def measured(self) -> bool:
        return self.alpha0 is not None or self.u0 is not None

    @property
    def active(self) -> bool:
        return any(i is not None and i.resolved and (i.low > self.sesoi or i.high < -self.sesoi)
                   for i in (self.alpha0, self.u0))  # fmt: skip

    @property
    def state(self) -> str:
        """``active``, ``inert`` or ``not measured``."""
        return "active" if self.active else ("inert" if self.measured else "not measured")

    def text(self) -> str:
        """``"+2.5e-05 [..] (alpha -> 0), +1e-4 [..] (U -> 0)"``: what removing it changes."""
        parts = [f"{i.format(spec='+.2g')} {self.unit} ({label})"
                 for i, label in ((self.alpha0, "alpha -> 0"), (self.u0, "U -> 0"))
                 if i is not None]  # fmt: skip
        return ", ".join(parts) if parts else "not measured"


#: what a gate is measured in -> (column prefix, key of its smallest effect in SESOI, unit): the
#: change of validation bpc on char-PTB, the test accuracy lost on MQAR (:mod:`.mqar`)
GATE_MEASURES = {"bpc": ("gate_", "gate", "bpc"),
                 "acc": ("gate_acc_", "gate_acc", "test accuracy lost")}  # fmt: skip


def _gate_values(runs: Runs, config: str, which: str, on: str = "bpc") -> np.ndarray | None:
    """Per seed, the change of the measure ``on`` (:data:`GATE_MEASURES`) when the geometry is
    removed by ``which`` (:data:`GATES`): the cell's ``gate_<which>`` (``gate_acc_<which>``),
    or for ``alpha0`` in a char-PTB grid stored before the gate ``bpc_at_alpha_0 - val_bpc``;
    None when a seed lacks it or diverged."""
    if runs.diverged(config):
        return None
    df = runs.df
    col = f"{GATE_MEASURES[on][0]}{which}"
    if col in df and np.isfinite(runs.per_seed(config, col)).all():
        return runs.per_seed(config, col)
    if on == "bpc" and which == "alpha0" and "bpc_at_alpha_0" in df:
        x = runs.per_seed(config, "bpc_at_alpha_0") - runs.per_seed(config, "val_bpc")
        if np.isfinite(x).all():
            return x
    return None


def geometry_gate(runs: Runs, config: str, on: str = "bpc") -> Gate:
    """The :class:`Gate` of ``config`` over the grid's seeds, measured ``on`` validation bpc
    (against ``SESOI["gate"]``) or MQAR test accuracy (``"acc"``, against
    ``SESOI["gate_acc"]``)."""
    _, key, unit = GATE_MEASURES[on]
    vals = {w: _gate_values(runs, config, w, on) for w in GATES}
    ivs = {w: None if v is None else mean_interval(v) for w, v in vals.items()}
    return Gate(config, ivs["alpha0"], ivs["u0"], SESOI[key], unit)


def gate_table(runs: Runs, on: str = "bpc") -> pd.DataFrame:
    """One row per Fiber Bundle configuration of ``runs``: its ``kappa_max`` in units of
    ``tau / L`` and regulariser (NaN and ``none`` on MQAR, whose Fiber Bundle arm has none),
    the gates measured ``on`` bpc or MQAR test accuracy (``alpha -> 0``, ``U -> 0``: mean,
    low, high) and ``state`` (:attr:`Gate.state`)."""
    rows = []
    for name, p in runs.grid.items():
        if p["kind"] != "fbt" and p.get("variant") != "fiber_bundle":
            continue
        g = geometry_gate(runs, name, on)
        row: dict[str, Any] = {"config": name,
                               "kappa_factor": float(p.get("kappa_factor", math.nan)),
                               "reg": p.get("reg", {"kind": "none"})["kind"], "state": g.state,
                               "diverged": len(runs.diverged(name))}  # fmt: skip
        for w, iv in (("alpha0", g.alpha0), ("u0", g.u0)):
            m, lo, hi = iv.as_tuple() if iv is not None else (math.nan,) * 3
            row.update({f"{w}_mean": m, f"{w}_low": lo, f"{w}_high": hi})
        rows.append(row)
    return pd.DataFrame(rows)


def ungated(runs: Runs) -> list[str]:
    """The Fiber Bundle configurations of a char-PTB grid that lack a gate measurement
    (``alpha -> 0`` or ``U -> 0``) on some seed that trained: cells stored before the gate.
    Left out: arms trained at ``alpha = 0`` (Euclidean by design: removing a geometry they do not
    use changes nothing) and arms diverged at every seed (no model to evaluate)."""
    out = []
    df = runs.df
    for name, p in runs.grid.items():
        if p["kind"] != "fbt" or float(p["model"].get("alpha", 1.0)) == 0.0:
            continue
        trained = df[(df.config == name) & ~df.seed.isin(list(runs.diverged(name)))]
        cols = [f"gate_{w}" for w in GATES]
        if len(trained) and any(
            c not in trained or not np.isfinite(trained[c]).all() for c in cols
        ):
            out.append(name)
    return out


#: when the geometry gate arrived (commit 51dac4a): a cell stored before it lacks the gate
GATE_SINCE = "2026-12-07T18:19:27+00:00"


def long_regate_command(configs: Sequence[str]) -> str:
    """The command that re-runs the ``long`` grid's ``configs`` whose cells were stored before
    the gate (:data:`GATE_SINCE`), each cell checkpointed so that a stop loses little: run again,
    the same command resumes where it stopped (``--redo-before`` keeps the cells re-run since)."""
    return ("python -m attention_atlas sweep fiber-bundle --preset long --seeds 0 1 2 3 4 "
            f"--only {' '.join(configs)} --redo-before {GATE_SINCE} --checkpoint-every 200 "
            "--workers 1 --threads 1")  # fmt: skip


def gate_reason(runs: Runs, configs: Sequence[str], on: str = "bpc") -> Verdict | None:
    """The *not tested* verdict (*geometry inert*, with the measured change; its ``sesoi`` a
    placeholder for the caller to replace) when one of ``configs`` fails the geometry gate;
    None when every one passes or lacks the evaluation (a grid stored before the gate: then
    the claim is decided as before, and the chapter's gate table says "not measured").
    ``on``: the gate's measure (:data:`GATE_MEASURES`)."""
    _, key, unit = GATE_MEASURES[on]
    inert = []
    for c in dict.fromkeys(configs):
        g = geometry_gate(runs, c, on)
        if g.measured and not g.active:
            inert.append(f"{c}: {g.text()}")
    if inert:
        return verdict(None, sesoi=SESOI[key], not_tested=(
            f"the geometry is inert in the arms compared: removing it at evaluation changes "
            f"the {'bpc' if on == 'bpc' else 'test accuracy'} by {'; '.join(inert)}, none "
            f"above the {SESOI[key]:g}{' bpc' if on == 'bpc' else ''} gate"))  # fmt: skip
    return None


def gated(v: Verdict | None, sesoi: float, direction: int = 1) -> Verdict | None:
    """``v`` (from :func:`gate_reason`) at the claim's own margin and direction: what a
    prediction guarded by the gate returns when it is not tested."""
    if v is None:
        return None
    return Verdict(v.outcome, None, sesoi, direction, v.reason, category=v.category)


# -- the divergences ----------------------------------------------------------------------------

#: a block's mean metric strength this many times its run's ``kappa_max`` has left the band the
#: regularisers target (the soft cap of eq. (34) is a hinge: a factor of 10 is far past it)
RUNAWAY = 10.0


def _block_kappas(h: pd.DataFrame) -> list[str]:
    return sorted(
        c for c in h.columns if c.startswith("fiber_bundle/l") and c.endswith("/kappa_mean")
    )


def divergence_finding(runs: Runs) -> pd.DataFrame:
    """What grew first in every run trained with the three regularisers: one row per run
    (``config``, ``seed``, ``kappa_max``, ``rank``, ``diverged_step`` or NaN), at its first
    logged step where a block's mean ``kappa_t`` exceeds :data:`RUNAWAY` times ``kappa_max``
    (``runaway_step``, NaN when none did): that block (``block``), its kappa before (the
    previous log, or at initialisation) and then (``kappa_before``, ``kappa_at``), the largest
    kappa of the other blocks then (``others_at``), the most negative diversity term over blocks
    (``div_at``), the weighted regulariser (``reg_at``) and the task's training loss
    (``loss_at``); for a run that never ran away, its largest ``kappa / kappa_max`` logged."""
    rows = []
    for (config, seed), cell in runs.cells.items():
        p = runs.grid[config]
        if p["kind"] != "fbt" or p["reg"]["kind"] != "three" or "history" not in cell:
            continue  # (a record without its training log has nothing to read)
        h = runs.history(config, seed)
        cols = _block_kappas(h)
        kmax = float(p["reg"]["kappa_max"])
        row: dict[str, Any] = {"config": config, "seed": seed, "kappa_max": kmax,
                               "kappa_factor": float(p["kappa_factor"]),
                               "rank": int(p["model"].get("rank", 4)),
                               "diverged_step": float(cell.get("diverged_step", math.nan)),
                               "runaway_step": math.nan}  # fmt: skip
        ratio = h[cols].to_numpy(dtype=float) / kmax if cols and len(h) else np.zeros((0, 1))
        row["largest_ratio"] = float(np.nanmax(ratio)) if ratio.size else math.nan
        away: np.ndarray = (
            np.flatnonzero((ratio > RUNAWAY).any(axis=1)) if ratio.size else np.zeros(0, int)
        )
        if len(away):
            i = int(away[0])
            b = int(np.argmax(ratio[i]))
            col = cols[b]
            block = int(col.split("/")[1][1:])
            before = (float(h[col].iloc[i - 1]) if i > 0
                      else float(cell.get(f"kappa_{block + 1}_mean", math.nan)))  # fmt: skip
            others = [float(h[c].iloc[i]) for c in cols if c != col]
            divs = [float(h[c.replace("kappa_mean", "div")].iloc[i]) for c in cols]
            row.update({"runaway_step": float(h["step"].iloc[i]), "block": block,
                        "kappa_before": before, "kappa_at": float(h[col].iloc[i]),
                        "others_at": max(others) if others else math.nan, "div_at": min(divs),
                        "reg_at": float(h["reg/fiber_bundle"].iloc[i]),
                        "loss_at": float(h["train_loss"].iloc[i])})  # fmt: skip
        rows.append(row)
    return pd.DataFrame(rows)


def _span(x: Any, spec: str = ".2g") -> str:
    v = np.asarray(x, dtype=float)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return "n/a"
    lo, hi = float(v.min()), float(v.max())
    return f"{lo:{spec}}" if f"{lo:{spec}}" == f"{hi:{spec}}" else f"[{lo:{spec}}, {hi:{spec}}]"


def divergence_outcome(runs: Runs, scale: TrainingScale, evidence: str) -> Outcome:
    """``riemannian/regularised-kappa-band``: every run trained with the three regularisers
    keeps each block's mean ``kappa_t`` within :data:`RUNAWAY` times its ``kappa_max`` at every
    logged step (an exact check on the records); contradicted with, per configuration that
    ran away, the conditions and what grew first (:func:`divergence_finding`)."""
    f = divergence_finding(runs)
    what = f"every logged block mean kappa_t at most {RUNAWAY:g} kappa_max"
    if f.empty:
        return Outcome("not tested", "no run trained with the three regularisers",
                       form="exact", reason="not run", evidence=evidence)  # fmt: skip
    held, away = f[f.runaway_step.isna()], f[f.runaway_step.notna()]
    witness = (f"the check reads {len(f)} runs' logs; {len(held)} of them stay within the band "
               f"(largest kappa / kappa_max {_span(held.largest_ratio, '.3g')})"
               if len(held) else f"the check reads {len(f)} runs' logs")  # fmt: skip
    if not scale.decisive:
        return Outcome("not tested", f"{what}: not decisive, since {scale.reason()}",
                       form="exact", reason="baseline not trained", scale=scale.text(),
                       evidence=evidence, witness=witness)  # fmt: skip
    if away.empty:
        return outcome_from_check(True, f"{what}: {witness}", "", witness=witness,
                                  scale=scale.text(), evidence=evidence)  # fmt: skip
    parts = []
    for config, g in away.groupby("config", sort=False):
        n_all = int((f.config == config).sum())
        div = g.diverged_step.dropna()
        tail = g[g.diverged_step.notna()]
        unlogged = int((f[(f.config == config)].diverged_step.notna()
                        & f[(f.config == config)].runaway_step.isna()).sum())  # fmt: skip
        parts.append(
            f"{config} (kappa_max = {g.kappa_factor.iloc[0]:g} tau/L = {g.kappa_max.iloc[0]:.3g}, "
            f"rank {int(g['rank'].iloc[0])}): {len(g)} of {n_all} runs ran away, at the log of step "
            f"{_span(g.runaway_step, '.0f')}; block {_span(g.block, '.0f')}'s mean kappa grew "
            f"from {_span(g.kappa_before, '.2g')} to {_span(g.kappa_at, '.2g')} while the other "
            f"blocks stayed at most {_span(g.others_at, '.2g')}; the diversity term reached "
            f"{_span(g.div_at, '.2g')} and the weighted regulariser {_span(g.reg_at, '.2g')}, "
            f"the task loss still {_span(g.loss_at, '.2f')} nats; "
            f"{len(div)} of them then diverged (at step {_span(tail.diverged_step, '.0f')})"
            + (f"; {unlogged} more diverged before a log showed the runaway" if unlogged else "")
        )
    summary = (f"{what}: contradicted. " + "; ".join(parts) + ". The diversity term (minus the "
               "variance of kappa_t, eq. (32)) is unbounded below and grows with kappa^2, the "
               "cap's hinge only linearly: in one block it outran the cap and the task")  # fmt: skip
    return outcome_from_check(False, "", summary, witness=witness, scale=scale.text(),
                              evidence=evidence)  # fmt: skip


# -- the unregularised model against matched dot-product controls ---------------------------

#: the dot-product controls of ``fbt_reg-none`` (:func:`~.run.matched_dot_controls`)
MATCHED = {"dot_params": "parameters", "dot_flops": "training FLOPs", "dot_time": "wall clock"}


def matched_dot_verdicts(runs: Runs, config: str = "fbt_reg-none") -> dict[str, Verdict]:
    """Per matched control (:data:`MATCHED`): ``config``'s validation bpc minus the control's,
    paired by seed, predicted lower by ``SESOI["bpc"]``; not tested when an arm diverged or
    ``config``'s geometry fails the gate (:func:`gate_reason`), or the control is absent."""
    out = {}
    for name in MATCHED:
        if name not in runs.grid:
            out[name] = verdict(None, sesoi=SESOI["bpc"], direction=-1,
                                not_tested=f"{name} is not in this grid; `{GATE_COMMAND}` runs it")  # fmt: skip
            continue
        diverged = diverged_reason(runs, [config, name])
        if diverged:
            out[name] = verdict(None, sesoi=SESOI["bpc"], direction=-1, not_tested=diverged)
            continue
        inert = gated(gate_reason(runs, [config]), SESOI["bpc"], direction=-1)
        out[name] = inert or verdict(runs.paired(config, name, "val_bpc"), sesoi=SESOI["bpc"],
                                     direction=-1)  # fmt: skip
    return out


def matched_dot_outcome(gate_runs: Runs | None, gate_grid: Any) -> Outcome:
    """``riemannian/fbt-vs-matched-dot`` from a stored grid with the matched controls (the
    ``matched`` preset, else ``gate``): the weakest of :func:`matched_dot_verdicts`; *not tested*
    (not run) while the grid is incomplete (the message names the command that runs it)."""
    matched = gate_grid is not None and gate_grid.provenance.preset == "matched"
    command = MATCHED_COMMAND if matched else GATE_COMMAND
    what = "bpc, unregularised Fiber Bundle Transformer minus the dot-product model matched in "
    if gate_runs is None:
        done = 0 if gate_grid is None else len(gate_grid.records)
        total = done + (0 if gate_grid is None else len(gate_grid.missing))
        return Outcome("not tested", f"{what}parameters, FLOPs and wall clock: the grid has "
                       f"{done} of {total} cells stored; `{command}` runs the rest",
                       form="superiority", reason="not run")  # fmt: skip
    vs = matched_dot_verdicts(gate_runs)
    scale = training_scale(gate_runs)
    detail = "; ".join(f"{MATCHED[n]}: {at_scale(v, scale)}" for n, v in vs.items())
    return outcome_from_verdict(weakest(list(vs.values())), f"{what}parameters, training FLOPs "
                                f"and wall clock, the weakest ({detail})", scale=scale,
                                evidence=gate_runs.command)  # fmt: skip


# -- the same comparison on MQAR ----------------------------------------------------------------


def mqar_matched_verdicts(runs: Runs, config: str = "fbt_reg-none",
                          command: str = mqar_command(None)) -> dict[str, Verdict]:  # fmt: skip
    """Per matched control of the MQAR grid (:data:`MATCHED`, :func:`~.mqar.mqar_grid`):
    ``config``'s test accuracy minus the control's, paired by seed, predicted higher by
    ``SESOI["test_acc"]`` (chapter 9's); not tested when an arm diverged, ``config``'s geometry
    fails the gate on MQAR (:func:`gate_reason` ``on="acc"``), the control is at the ceiling,
    or it is absent (``command``: what runs it)."""
    out = {}
    for name in MATCHED:
        if name not in runs.grid:
            out[name] = verdict(None, sesoi=SESOI["test_acc"], direction=1,
                                not_tested=f"{name} is not in this grid; `{command}` runs it")  # fmt: skip
            continue
        diverged = diverged_reason(runs, [config, name])
        if diverged:
            out[name] = verdict(None, sesoi=SESOI["test_acc"], direction=1, not_tested=diverged)
            continue
        inert = gated(gate_reason(runs, [config], on="acc"), SESOI["test_acc"], direction=1)
        ceiling = _ceiling_reason(runs, name)
        if inert is None and ceiling is not None:
            out[name] = verdict(None, sesoi=SESOI["test_acc"], direction=1, not_tested=ceiling)
            continue
        out[name] = inert or verdict(runs.paired(config, name, "test_acc"),
                                     sesoi=SESOI["test_acc"], direction=1)  # fmt: skip
    return out


def _ceiling_reason(runs: Runs, control: str) -> str | None:
    """Why a superiority claim over ``control`` cannot be decided on test accuracy: the
    control's mean over seeds is within the smallest effect of the ceiling of 1, so no arm's
    mean (at most 1) can be higher by that much, and the test could not have supported the claim
    (a saturated measure); None when there is headroom."""
    acc = runs.per_seed(control, "test_acc")
    mean = float(np.mean(acc))
    if np.isfinite(acc).all() and 1.0 - mean < SESOI["test_acc"]:
        return (f"measure saturated: {control}'s mean test accuracy is {mean:.4f} (seeds "
                f"{float(np.min(acc)):.4f} to {float(np.max(acc)):.4f}), less than "
                f"{SESOI['test_acc']:g} below the ceiling of 1, so no arm's mean could have been "
                "higher by the smallest effect")  # fmt: skip
    return None


def mqar_matched_outcome(mqar_runs: Runs | None, mqar_grid: Any) -> Outcome:
    """``riemannian/fbt-vs-matched-dot-mqar`` from a stored MQAR grid (``gate-mqar-long``, else
    ``gate-mqar``): the weakest of :func:`mqar_matched_verdicts`; *not tested* (not run) while
    the grid is incomplete. No training scale applies (MQAR has no bigram regime): the rule
    decides at face value."""
    what = ("MQAR test accuracy, unregularised Fiber Bundle Transformer minus the dot-product "
            "model matched in ")  # fmt: skip
    preset = None if mqar_grid is None else mqar_grid.provenance.preset
    command = mqar_command(preset)
    if mqar_runs is None:
        done = 0 if mqar_grid is None else len(mqar_grid.records)
        total = done + (0 if mqar_grid is None else len(mqar_grid.missing))
        total = total or len(MQAR_ARMS) * 5
        return Outcome("not tested", f"{what}parameters, FLOPs and wall clock: the "
                       f"{preset or 'gate-mqar'} grid has {done} of {total} cells stored; "
                       f"`{command}` runs the rest", form="superiority", reason="not run")  # fmt: skip
    vs = mqar_matched_verdicts(mqar_runs, command=command)
    detail = "; ".join(f"{MATCHED[n]}: {_stated(v)}" for n, v in vs.items())
    return outcome_from_verdict(weakest(list(vs.values())), f"{what}parameters, training FLOPs "
                                f"and wall clock, the weakest ({detail})", scale=None,
                                evidence=mqar_runs.command)  # fmt: skip


def _stated(v: Verdict) -> str:
    effect = f"{v.effect.format(spec='+.3g')}, " if v.effect is not None else ""
    return effect + v.outcome
