"""What a report says, computed from its grid: the contract's checks over seeds, the probes'
tables, the variant's recall and language results (the same summary chapter 9 prints for each of
its arms: :func:`recall_summary`, :func:`recall_text`), its place beside the stored zoo, the
verdicts against dot in the register's form, and the JSON summary (:func:`report_summary`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from attention_atlas.stats import Interval, decide, mean_interval, paired_difference
from attention_atlas.verdicts import Outcome, TrainingScale, outcome_from_verdict

__all__ = [
    "COMPARISONS",
    "contract_frame",
    "failed_checks",
    "probe_table",
    "recall_summary",
    "recall_text",
    "report_summary",
    "stored_zoo",
    "verdict_table",
    "verdicts",
    "zoo_frame",
]

#: the comparisons against dot a report decides: name -> (metric, form, better side, what);
#: margins are chapter 9's declared smallest effects of interest (``zoo.SESOI``)
COMPARISONS: dict[str, tuple[str, str, int, str]] = {
    "recall": ("test_acc", "non-inferiority", 1,
               "MQAR test accuracy (mean over the cross's cells), variant minus dot, paired by seed"),
    "data efficiency": ("learning_auc", "non-inferiority", 1,
                        "mean validation accuracy over the MQAR learning curve, variant minus dot"),
    "language at equal wall clock": ("val_bpc", "non-inferiority", -1,
                                     "char-PTB validation bpc after the same wall-clock budget, "
                                     "variant minus dot, paired by seed"),
}  # fmt: skip


def _interval_dict(iv: Interval | None) -> dict[str, float] | None:
    if iv is None:
        return None
    return {"mean": iv.mean, "low": iv.low, "high": iv.high, "n": iv.n}


def _finite_interval(values: Any) -> Interval | None:
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    return mean_interval(x) if x.size else None


# -- the contract and the probes ---------------------------------------------------------------


def contract_frame(records: Mapping[tuple[str, int], Mapping[str, Any]]) -> pd.DataFrame:
    """One row per check: ``passed`` (True only when it passed at every seed; None for an
    informational check), the seeds it failed at, and its detail (of the first failing seed, else
    of the first seed)."""
    rows: dict[str, dict[str, Any]] = {}
    for (config, seed), rec in sorted(records.items(), key=lambda kv: kv[0][1]):
        if config != "contract":
            continue
        for c in rec["checks"]:
            row = rows.setdefault(c["check"], {"check": c["check"], "passed": c["passed"],
                                               "failed at seeds": [], "detail": c["detail"]})  # fmt: skip
            if c["passed"] is False:
                if not row["failed at seeds"]:
                    row["detail"] = c["detail"]
                row["failed at seeds"].append(seed)
                row["passed"] = False
    return pd.DataFrame(
        list(rows.values()), columns=["check", "passed", "failed at seeds", "detail"]
    )


def failed_checks(contract: pd.DataFrame) -> list[str]:
    """``"check: detail"`` of every failed check."""
    bad = contract[contract["passed"] == False]  # noqa: E712 (None is informational)
    return [f"{r.check}: {r.detail}" for r in bad.itertuples()]


def probe_table(records: Mapping[tuple[str, int], Mapping[str, Any]], kind: str) -> pd.DataFrame:
    """The rows of every seed's ``kind`` probe (``rank``, ``depth``, ``cost``), with ``seed``."""
    frames = []
    for (config, seed), rec in records.items():
        if config != kind:
            continue
        t = pd.DataFrame(rec.get("table", []))
        if len(t):
            t["seed"] = seed
            frames.append(t)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


# -- recall and language (shared with chapter 9) -----------------------------------------------


def zoo_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """The MQAR rows of a grid's frame, as chapter 9 reads them (``cell``, ``chance``), without
    the cells a failed contract kept from running."""
    from attention_atlas.experiments.zoo.anchors import mqar_frame

    df = frame[frame["config"].str.startswith("mqar/")]
    if "test_acc" not in df:
        return df.iloc[0:0]
    return mqar_frame(df[df["test_acc"].notna()])


def recall_summary(frame: pd.DataFrame, variant: str, control: str = "dot") -> dict[str, Any]:
    """One arm's results in a chapter-9 grid ``frame`` (a zoo grid or a report's): MQAR test
    accuracy per cell and over the cross (mean of each seed's cells), its difference to
    ``control`` paired by seed, the learning rate chosen; char-PTB bpc at the wall-clock budget
    (steps done, the difference to dot); time per training step against dot (geometric mean of
    the seeds' ratios). Intervals are 95% over seeds; what is not in the grid is None."""
    from attention_atlas.experiments.zoo.analysis import geometric_interval

    df = zoo_frame(frame)
    g = df[df.variant == variant]
    out: dict[str, Any] = {"variant": variant, "cells": {}, "test_acc": None,
                           "test_acc_minus_dot": None, "lr": None, "val_bpc": None,
                           "val_bpc_minus_dot": None, "steps_done": None, "time_ratio": None}  # fmt: skip
    for cell, c in g.groupby("cell", sort=False):
        out["cells"][cell] = _interval_dict(_finite_interval(c.test_acc))
    if len(g):
        per_seed = g.groupby("seed")["test_acc"].mean()
        out["test_acc"] = _interval_dict(_finite_interval(per_seed))
        out["lr"] = float(g["lr"].iloc[0])
        base = df[(df.variant == control) & df.cell.isin(g.cell.unique())]
        if len(base) and variant != control:
            out["test_acc_minus_dot"] = _interval_dict(
                paired_difference(per_seed, base.groupby("seed")["test_acc"].mean())
            )
    p = frame[frame["config"].str.startswith("ptb/")]
    if "val_bpc" in p:
        p = p[p["val_bpc"].notna()]
        mine: pd.DataFrame = p[p.variant == variant].set_index("seed")
        if len(mine):
            out["val_bpc"] = _interval_dict(_finite_interval(mine.val_bpc))
            out["steps_done"] = _interval_dict(_finite_interval(mine.steps_done))
            ptb_base = p[p.variant == control].set_index("seed")["val_bpc"]
            if variant != control and len(ptb_base):
                out["val_bpc_minus_dot"] = _interval_dict(paired_difference(mine.val_bpc, ptb_base))
    t = frame[frame["config"].str.startswith("time/")]
    col = f"ratio_{variant}"
    if col in t and t[col].notna().any():
        out["time_ratio"] = _interval_dict(geometric_interval(t[col].dropna()))
    return out


def _fmt(d: Mapping[str, float] | None, digits: int = 3, signed: bool = False) -> str:
    if d is None:
        return "not measured"
    iv = Interval(d["mean"], d["low"], d["high"], int(d["n"]))
    return iv.format(digits, signed=signed)


def recall_text(s: Mapping[str, Any]) -> str:
    """:func:`recall_summary` in one paragraph of Markdown."""
    v = s["variant"]
    cells = ", ".join(f"{c} {_fmt(iv)}" for c, iv in s["cells"].items()) or "no MQAR cell"
    parts = [f"**{v}**: MQAR test accuracy {_fmt(s['test_acc'])} over the cross ({cells})"]
    if s["test_acc_minus_dot"] is not None:
        parts.append(f"{_fmt(s['test_acc_minus_dot'], signed=True)} against dot")
    if s["lr"] is not None:
        parts.append(f"learning rate {s['lr']:g}")
    if s["val_bpc"] is not None:
        ptb = f"char-PTB {_fmt(s['val_bpc'])} bpc in {_fmt(s['steps_done'], 0)} steps"
        if s["val_bpc_minus_dot"] is not None:
            ptb += f" ({_fmt(s['val_bpc_minus_dot'], signed=True)} against dot)"
        parts.append(ptb)
    if s["time_ratio"] is not None:
        parts.append(f"time per training step {_fmt(s['time_ratio'], 2)} times dot's")
    return "; ".join(parts) + "."


def stored_zoo(preset: str) -> Any:
    """The stored chapter-9 grid ``results/zoo/<preset>`` (complete or not), or None."""
    from attention_atlas.store.results import load_grid

    try:
        return load_grid("zoo", preset, complete=False, skip_damaged=True)
    except FileNotFoundError:
        return None


# -- verdicts against dot ----------------------------------------------------------------------


def verdicts(frame: pd.DataFrame, variant: str, *, evidence: str = "computed",
             not_run: str | None = None, batch: int = 0) -> dict[str, Outcome]:  # fmt: skip
    """The comparisons of :data:`COMPARISONS` for ``variant`` against dot, each decided by the
    one rule by its declared form against chapter 9's margin, at the grid's scale (dot's MQAR
    accuracy against chance). ``not_run``: why the trained cells did not run (then each is *not
    tested* with that reason). ``batch``: the MQAR batch size (sequences per step), for the
    scale's count of sequences seen."""
    from attention_atlas.experiments.zoo.run import SESOI

    df = zoo_frame(frame)
    dot = df[df.variant == "dot"]
    steps = int(dot.steps.max()) if len(dot) else 0
    scale = TrainingScale(
        steps=steps, tokens=steps * batch, seeds=int(df.seed.nunique()) if len(df) else 0,
        baseline=float(dot.test_acc.mean()) if len(dot) else 0.0, metric="acc",
        chance=float(dot.chance.mean()) if len(dot) else 0.0,
        what="dot-product baseline (MQAR test accuracy over the cross; 'tokens' are sequences)",
    )  # fmt: skip
    p = frame[frame["config"].str.startswith("ptb/")]
    ptb_scale = None
    if "val_bpc" in p and (p.variant == "dot").any():
        d = p[(p.variant == "dot") & p.val_bpc.notna()]
        steps_done = int(d.steps_done.mean()) if len(d) else 0
        seen = int(d.tokens_seen.mean()) if "tokens_seen" in d and len(d) else 0
        ptb_scale = TrainingScale(
            steps=steps_done, tokens=seen, seeds=int(d.seed.nunique()),
            baseline=float(d.val_bpc.mean()) if len(d) else math.inf, metric="bpc",
            what="dot-product baseline (char-PTB at the same wall-clock budget)",
        )  # fmt: skip
    out: dict[str, Outcome] = {}
    for key, (metric, form, better, what) in COMPARISONS.items():
        effect, reason = None, not_run
        if reason is None and variant == "dot":
            reason = "not run: the variant is the control itself"
        if reason is None:
            src = p if metric == "val_bpc" else df
            if metric not in src:
                reason = f"not run: no {metric} in this grid"
            else:
                src = src[src[metric].notna()]
                if metric == "val_bpc":
                    mine, base = (
                        src[src.variant == a].set_index("seed")[metric] for a in (variant, "dot")
                    )
                else:
                    mine, base = (src[src.variant == a].groupby("seed")[metric].mean()
                                  for a in (variant, "dot"))  # fmt: skip
                if len(mine) and len(base) and len(mine.index.intersection(base.index)):
                    effect = paired_difference(mine, base)
                else:
                    reason = f"not run: no {variant} or dot runs of {metric} in this grid"
        v = decide(form, effect, margin=SESOI[metric], direction=better, not_tested=reason)
        out[key] = outcome_from_verdict(v, what, scale=ptb_scale if metric == "val_bpc" else scale,
                                        evidence=evidence)  # fmt: skip
    return out


def verdict_table(outcomes: Mapping[str, Outcome]) -> pd.DataFrame:
    """The verdicts in the register's columns: form, margin, effect, outcome, reason, witness."""
    rows = []
    for key, o in outcomes.items():
        rows.append({"comparison against dot": key, "form": o.form,
                     "margin": o.sesoi, "effect": "" if o.effect is None else o.effect.format(3, signed=True),
                     "outcome": o.outcome, "reason": o.reason or "", "evidence": o.summary,
                     "witness": o.witness or "", "scale": o.scale or ""})  # fmt: skip
    return pd.DataFrame(rows)


# -- the JSON summary --------------------------------------------------------------------------


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    if isinstance(x, float | np.floating):
        return float(x) if math.isfinite(float(x)) else None
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.bool_):
        return bool(x)
    return x


def report_summary(
    *,
    variant: Mapping[str, Any],
    preset: str,
    contract: pd.DataFrame,
    sections: Mapping[str, Mapping[str, Any]],
    recall: Mapping[str, Any],
    outcomes: Mapping[str, Outcome],
    provenance: str,
) -> dict[str, Any]:
    """The report's JSON summary: the variant, the preset, ``ok`` (no check failed and every
    section built), the contract's checks, each section's status (``ok``, ``error``) and headline
    numbers, the recall summary and the verdicts."""
    failed = failed_checks(contract)
    broken = {k: s["error"] for k, s in sections.items() if s.get("error")}
    return _jsonable({
        "variant": dict(variant), "preset": preset, "ok": not failed and not broken,
        "failed_checks": failed, "failed_sections": broken,
        "contract": contract.to_dict(orient="records"),
        "sections": {k: dict(s) for k, s in sections.items()},
        "recall": dict(recall),
        "verdicts": {k: {"form": o.form, "margin": o.sesoi, "outcome": o.outcome,
                         "reason": o.reason, "effect": _interval_dict(o.effect),
                         "summary": o.summary, "witness": o.witness} for k, o in outcomes.items()},
        "provenance": provenance,
    })  # fmt: skip
