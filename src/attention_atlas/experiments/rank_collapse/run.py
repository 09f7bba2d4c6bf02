"""Chapter 2's stacks and its claims: rank collapse in pure attention stacks (Theorem 2.2), and
Conjectures 3.4 and 3.6 tested with metrics that do not depend on the tokens.

* The grid (:data:`PRESETS`, :func:`chapter_grid`, :func:`run_cell`) of random pure attention
  stacks (:func:`~.stacks.pure_attention_stack`: dot, Euclidean, a homogeneous metric, fixed
  per-position metrics of controlled spread and rank, and token-dependent metrics, each metric
  arm held at a mean entry scale ``mean_t ||U_t||_F^2 M / tau`` at every layer) is the sweep
  runner's ``"rank-collapse"``: ``python -m attention_atlas sweep rank-collapse --preset long``;
  :func:`stack_runs` runs it in memory.
* :func:`stack_verdicts`: effective rank at the last layer against the controls (homogeneous
  metric of the same mean strength; Euclidean), paired by seed, through
  :func:`attention_atlas.stats.verdict` with :data:`SESOI`.
* :func:`outcomes` (the claims register) and :func:`chapter_outcomes` (the chapter, from its own
  runs): the outcome of every chapter-2 claim, from :mod:`.perturbation` and the stacks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch

from attention_atlas import stats, verdicts
from attention_atlas.linalg import effective_rank, relative_residual
from attention_atlas.validate import ConfigError, check_count

from . import perturbation as pt
from .stacks import STACK_SCORES, collapse_layer, log_residual_growth, pure_attention_stack

__all__ = [
    "BOOK",
    "PRESETS",
    "SESOI",
    "SMOKE",
    "chapter_grid",
    "chapter_outcomes",
    "check_cell",
    "collapse_delay",
    "outcomes",
    "regime",
    "run_cell",
    "stack_outcomes",
    "stack_runs",
    "stack_summary",
    "stack_verdicts",
]

F64 = torch.float64
#: smallest effects of interest, fixed before the runs
SESOI = {
    # effective rank of H^(n) against the control: half a dimension; a floor f(r, sigma_U^2) > 1
    # nearer the collapsed value 1 than this is not a preserved rank
    "effective_rank": 0.5,
    # growth of -log residual per layer beyond 1 (exponential decay); doubly exponential gives 2
    "log_residual_growth": 0.5,
}

#: the chapter's parameters (book) and its SMOKE values: :func:`outcomes` uses the same sizes
BOOK: dict[str, Any] = {
    "n_instances": 300, "sweep_lengths": [32, 64, 128, 256], "onset_seeds": [0, 1, 2, 3, 4],
    "scale_low": 1e-5, "scale_high": 1e3, "per_decade": 3, "stack_length": 32, "stack_dim": 16,
    "depth": 24, "stack_entries": [0.001, 1.0, 10.0, 100.0], "stack_ranks": [1, 4],
    "spreads": [0.0, 0.8], "seeds": [0, 1, 2, 3, 4, 5], "seed": 0,
}  # fmt: skip
SMOKE: dict[str, Any] = {
    "n_instances": 20, "sweep_lengths": [16, 32, 64], "onset_seeds": [0, 1, 2], "per_decade": 2,
    "depth": 8, "stack_entries": [0.001, 100.0], "stack_ranks": [4], "spreads": [0.8],
    "seeds": [0, 1, 2],
}  # fmt: skip


# ---- the grid of chapter 2 (sweep runner: "rank-collapse") -----------------------------------

#: the experiment's name on the command line and in the results store
NAME = "rank-collapse"

PRESETS: dict[str, dict[str, Any]] = {
    "smoke": {"entries": [0.001, 100.0], "ranks": [4], "spreads": [0.8], "depth": 8},
    "book": {},
    "long": {"entries": [2.5e-4, 1.0, 10.0, 100.0, 1000.0], "length": 128, "dim": 64, "depth": 48},
}


def chapter_grid(
    *,
    entries: Sequence[float] = (0.001, 1.0, 10.0, 100.0),
    ranks: Sequence[int] = (1, 4),
    spreads: Sequence[float] = (0.0, 0.8),
    length: int = 32,
    dim: int = 16,
    depth: int = 24,
    token_rank: int = 4,
) -> dict[str, dict[str, Any]]:
    """Stacks of chapter 2: ``dot``, ``euclidean``, then for each mean entry scale ``s``:
    ``homogeneous r=<r> s=<s>`` and ``fixed r=<r> rho=<rho> s=<s>`` for each rank and spread, and
    ``token r=<token_rank> s=<s>``."""
    if any(not (s >= 0 and math.isfinite(s)) for s in entries):
        raise ValueError(f"entries must be non-negative numbers, got {list(entries)}")
    if any(not 0 <= rho < 1 for rho in spreads):
        raise ValueError(f"spreads must lie in [0, 1), got {list(spreads)}")
    if any(r < 1 for r in (*ranks, token_rank)) or length < 2 or dim < 1 or depth < 1:
        raise ValueError(
            f"ranks, dim and depth must be >= 1 and length >= 2, got ranks {list(ranks)}, "
            f"token_rank {token_rank}, length {length}, dim {dim}, depth {depth}"
        )
    shared = {"length": length, "dim": dim, "depth": depth}
    grid = {
        "dot": {"score": "dot", "entry": 0.0, "rank": 1, "spread": 0.0, **shared},
        "euclidean": {"score": "euclidean", "entry": 0.0, "rank": 1, "spread": 0.0, **shared},
    }
    for s in entries:
        for r in ranks:
            grid[f"homogeneous r={r} s={s:g}"] = {"score": "homogeneous", "entry": float(s), "rank": r, "spread": 0.0, **shared}  # fmt: skip
            for rho in spreads:
                grid[f"fixed r={r} rho={rho:g} s={s:g}"] = {"score": "fixed", "entry": float(s), "rank": r, "spread": float(rho), **shared}  # fmt: skip
        grid[f"token r={token_rank} s={s:g}"] = {"score": "token", "entry": float(s), "rank": token_rank, "spread": 0.0, **shared}  # fmt: skip
    return grid


def check_cell(params: dict[str, Any]) -> None:
    """Check one configuration's parameters before any work: ``score`` one of
    :data:`~.stacks.STACK_SCORES`; ``length`` an integer >= 2; ``dim``, ``depth`` and ``rank``
    integers >= 1; ``entry`` a finite number >= 0; ``spread`` in [0, 1). (A stack trains
    nothing: there is no training or model configuration.) Raises ConfigError (one line)."""
    if params.get("score") not in STACK_SCORES:
        raise ConfigError(
            f"score: expected one of {', '.join(STACK_SCORES)}, got {params.get('score')!r}"
        )
    for key, least in (("length", 2), ("dim", 1), ("depth", 1), ("rank", 1)):
        check_count("ranks or token_rank" if key == "rank" else key, params[key], least)
    for key, high in (("entry", math.inf), ("spread", 1.0)):
        value = params[key]
        number = not isinstance(value, bool) and isinstance(value, int | float)
        if not (number and math.isfinite(value) and 0 <= value < high):
            name = "entries" if key == "entry" else "spreads"
            span = "a finite number >= 0" if key == "entry" else "a number in [0, 1)"
            raise ConfigError(f"{name}: expected {span}, got {value!r}")


def run_cell(params: dict[str, Any], seed: int) -> dict[str, Any]:
    """One stack of :func:`chapter_grid` at ``seed`` (Gaussian input and weights from
    ``torch.Generator().manual_seed(1000 + seed)``; the same input for every arm).

    Returns:
        ``collapse_layer`` (:func:`collapse_layer`), ``final_residual``, ``final_erank`` and, in
        the cell's JSON only, per layer: ``residual`` (:func:`~attention_atlas.linalg.relative_residual`)
        and ``erank`` (:func:`~attention_atlas.linalg.effective_rank`), input included, and
        ``entry_scale`` and ``dispersion`` of each layer's metric.
    """
    g = torch.Generator().manual_seed(1000 + seed)
    h0 = torch.randn(params["length"], params["dim"], generator=g, dtype=F64)
    H, scales, disp = pure_attention_stack(
        h0, params["depth"], score=params["score"], rank=params["rank"], entry=params["entry"],
        spread=params["spread"], generator=g,
    )  # fmt: skip
    res = relative_residual(H).tolist()
    if not all(math.isfinite(x) for x in res):
        raise FloatingPointError(f"non-finite residual in stack {params}: {res}")
    erank = effective_rank(H).tolist()
    return {
        "collapse_layer": collapse_layer(res), "final_residual": res[-1], "final_erank": erank[-1],
        "residual": res, "erank": erank, "entry_scale": scales.tolist(), "dispersion": disp.tolist(),
    }  # fmt: skip


def stack_runs(
    grid: dict[str, dict[str, Any]], seeds: Sequence[int]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Run every (configuration, seed) of ``grid`` in memory (:func:`run_cell`).

    Returns:
        ``(layers, stacks)``: ``layers`` one row per layer (``label, score, entry, rank,
        spread, seed, layer, residual, erank``, and ``entry_scale``, ``dispersion`` of the metric
        that made it: NaN for the input), ``stacks`` one row per stack (the same keys, and
        ``collapse_layer``, ``final_erank``, ``bound_max`` (the largest ``L Ubar^2 M / tau`` over
        its layers), ``entry_min`` (the smallest ``Ubar^2 M / tau``), ``growth`` (median
        :func:`~.stacks.log_residual_growth`, NaN when no layer qualifies) and
        ``dispersion_first``, ``dispersion_last`` (:func:`~.stacks.metric_dispersion` of the
        first and last layer's metrics)), both in grid order.
    """
    if not list(seeds):
        raise ValueError("seeds must be a non-empty list")
    layers, stacks = [], []
    for label, params in grid.items():
        for seed in seeds:
            cell = run_cell(params, seed)
            key = {"label": label, **{k: params[k] for k in ("score", "entry", "rank", "spread")}, "seed": seed}  # fmt: skip
            scales = [float("nan"), *cell["entry_scale"]]
            disp = [float("nan"), *cell["dispersion"]]
            growth = log_residual_growth(cell["residual"])
            stacks.append({
                **key, "collapse_layer": cell["collapse_layer"], "final_erank": cell["final_erank"],
                "bound_max": params["length"] * max(cell["entry_scale"], default=0.0),
                "entry_min": min(cell["entry_scale"], default=0.0),
                "growth": float(np.median(growth)) if growth else float("nan"),
                "dispersion_first": disp[1] if len(disp) > 1 else float("nan"),
                "dispersion_last": disp[-1],
            })  # fmt: skip
            layers += [
                {**key, "layer": i, "residual": x, "erank": e, "entry_scale": s, "dispersion": dd}
                for i, (x, e, s, dd) in enumerate(zip(cell["residual"], cell["erank"], scales, disp))
            ]  # fmt: skip
    return pd.DataFrame(layers), pd.DataFrame(stacks)


# ---- verdicts --------------------------------------------------------------------------------


def regime(bound_max: float, entry_min: float) -> str:
    """``"sub-critical"`` when eq. (13)'s bound ``L Ubar^2 M / tau`` stayed at most
    :data:`~.perturbation.SUBCRITICAL_BOUND` at every layer (the spectrum of every ``A`` is
    pinned to the Euclidean one), ``"super-critical"`` when one score entry could change by at
    least 1 at every layer (``Ubar^2 M / tau >= 1``, at least ``L`` times the paper's
    ``tau / L``), else ``"between"``."""
    if bound_max <= pt.SUBCRITICAL_BOUND:
        return "sub-critical"
    return "super-critical" if entry_min >= 1.0 else "between"


def stack_summary(stacks: pd.DataFrame) -> pd.DataFrame:
    """Per configuration of :func:`stack_runs`: ``label, score, entry, rank, spread``,
    ``regime`` (:func:`regime`), ``collapse_layer`` and ``final_erank`` (mean [95% interval]
    over seeds, as text), and the mean metric dispersion of the first and last layer."""
    rows = []
    for label, part in stacks.groupby("label", sort=False):
        first = part.iloc[0]
        rows.append({
            "label": label, **{k: first[k] for k in ("score", "entry", "rank", "spread")},
            "regime": regime(float(part["bound_max"].max()), float(part["entry_min"].min()))
            if first["score"] not in ("dot", "euclidean") else "-",
            "collapse_layer": stats.mean_interval(part["collapse_layer"]).format(1),
            "final_erank": stats.mean_interval(part["final_erank"]).format(3),
            "dispersion_first": float(part["dispersion_first"].mean()),
            "dispersion_last": float(part["dispersion_last"].mean()),
        })  # fmt: skip
    return pd.DataFrame(rows)


def collapse_delay(stacks: pd.DataFrame, label: str, control: str) -> stats.Interval:
    """Collapse layer of configuration ``label`` minus that of ``control``, paired by seed."""
    layer = stacks.set_index(["label", "seed"])["collapse_layer"].astype(float)
    return stats.paired_difference(layer.loc[label], layer.loc[control])


def stack_verdicts(stacks: pd.DataFrame) -> pd.DataFrame:
    """The effective rank at the last layer of every ``fixed`` arm against its controls, paired
    by seed: the ``homogeneous`` arm of the same rank and mean strength, and ``euclidean``.
    Super-critical arms test Conjecture 3.4 (``direction=+1``: heterogeneous metrics keep a
    higher effective rank), sub-critical ones the sub-critical half of Conjecture 3.6
    (``direction=0``: collapse as in the Euclidean stack); ``between`` arms get no verdict.

    Returns:
        one row per (arm, control): ``label, entry, rank, spread, regime, control, effect``
        (:class:`~attention_atlas.stats.Interval`), ``outcome``, ``reason``.
    """
    fin = stacks.set_index(["label", "seed"])["final_erank"]
    rows = []
    for label, part in stacks[stacks["score"] == "fixed"].groupby("label", sort=False):
        first = part.iloc[0]
        reg = regime(float(part["bound_max"].max()), float(part["entry_min"].min()))
        if reg == "between":
            continue
        homog = f"homogeneous r={first['rank']} s={first['entry']:g}"
        for control in (homog, "euclidean"):
            effect = stats.paired_difference(fin.loc[label], fin.loc[control])
            v = stats.verdict(
                effect, sesoi=SESOI["effective_rank"], direction=1 if reg == "super-critical" else 0
            )
            rows.append({
                "label": label, "entry": first["entry"], "rank": first["rank"],
                "spread": first["spread"], "regime": reg, "control": control.split(" ")[0],
                "effect": effect, "outcome": v.outcome, "reason": v.reason, "form": v.form,
                "category": v.category,
            })  # fmt: skip
    return pd.DataFrame(rows)


def _combined(rows: pd.DataFrame, what: str, *, every: bool) -> verdicts.Outcome:
    """One outcome from several settings' verdicts: with ``every`` (a claim that must hold in
    each), supported only if all are, contradicted if any is; otherwise (a claim that some
    setting must show) supported if any is, contradicted only if all are."""
    if rows.empty:
        return verdicts.Outcome("not tested", f"{what}: no setting of this run is in its regime",
                                reason="not run")  # fmt: skip
    if (rows["outcome"] == "not tested").all():  # e.g. every arm at effective rank 1: saturated
        first = rows.iloc[0]
        return verdicts.Outcome(
            "not tested", f"{what}: none of the {len(rows)} settings could decide it; at "
            f"{first['label']}: {first['reason']}", first["effect"], SESOI["effective_rank"],
            form=first["form"], reason=first["category"],
        )  # fmt: skip
    counts = rows["outcome"].value_counts()
    n = len(rows)
    if every:
        out = "supported" if counts.get("supported", 0) == n else (
            "contradicted" if counts.get("contradicted", 0) else "not resolved")  # fmt: skip
    else:
        out = "supported" if counts.get("supported", 0) else (
            "contradicted" if counts.get("contradicted", 0) == n else "not resolved")  # fmt: skip
    best = rows.iloc[int(np.argmax([e.high for e in rows["effect"]]))]
    tally = ", ".join(f"{counts[o]} {o}" for o in stats.OUTCOMES if o in counts)
    text = (
        f"{what}: {n} setting(s), {tally}; largest effect at {best['label']}: "
        f"{best['effect'].format(3, signed=True, spec='.3g')}"
    )
    widths = [e.high - e.low for e in rows["effect"]]
    witness = (f"the runs differ on the measure in {sum(w > 0 for w in widths)} of {n} settings "
               f"(widest interval {max(widths):.3g})")  # fmt: skip
    return verdicts.Outcome(out, text, best["effect"], SESOI["effective_rank"],
                            form=best["form"], witness=witness)  # fmt: skip


def chapter_outcomes(
    checks: pd.DataFrame, study: pd.DataFrame, stacks: pd.DataFrame
) -> dict[str, verdicts.Outcome]:
    """The outcome of every chapter-2 claim from the chapter's runs: ``checks``
    (:func:`~.perturbation.perturbation_checks`), ``study`` (:func:`~.perturbation.sigma2_study`)
    and ``stacks`` (the second frame of :func:`stack_runs`)."""
    eq13 = pt.eq13_checks(study)
    ok = pt.eq12_13_hold(checks) and bool(eq13["holds"])
    n = len(checks) + int(eq13["n"])
    prop = verdicts.outcome_from_check(
        ok,
        f"eq. (12) and every step of eq. (13) (softmax step at its sharp constant 1/2) hold on "
        f"all {n} instances; at L U-bar^2 M / tau <= {pt.SUBCRITICAL_BOUND:g} the measured "
        f"|sigma_2 change| is at most {eq13['tightness_max']:.2g} of the bound",
        f"an inequality of eqs. (12)-(13) fails on one of {n} instances",
    )
    slopes = pt.onset_slopes(pt.onsets(study))
    transition = verdicts.outcome_from_verdict(
        pt.transition_verdict(slopes),
        f"slope of log s_onset against log L (s = U-bar^2 M / tau where |sigma_2 change| reaches "
        f"{pt.ONSET_DELTA:g}; Theta(tau/L) predicts -1)",
        scale=None,
    )
    found = {"riemannian/prop-3.5": prop, "riemannian/conj-3.6": transition}
    return {**found, **stack_outcomes(stacks)}


def stack_outcomes(stacks: pd.DataFrame) -> dict[str, verdicts.Outcome]:
    """The outcomes that rest on the stacks (second frame of :func:`stack_runs`): Theorem 2.2
    (dot-product stacks), Conjecture 3.4 (super-critical fixed metrics with ``sigma_U^2 > 0``
    against the homogeneous control; supported if any setting supports it) and the sub-critical
    half of Conjecture 3.6 (sub-critical fixed metrics against the Euclidean stack; supported
    only if every setting does)."""
    dot = stacks[stacks["score"] == "dot"].dropna(subset=["growth"])
    growth = stats.mean_interval(dot["growth"] - 1) if len(dot) else None
    thm = verdicts.outcome_from_verdict(
        stats.verdict(growth, sesoi=SESOI["log_residual_growth"], direction=1),
        "growth of -log residual per layer minus 1 in dot-product stacks (0: exponential decay)",
        scale=None,
    )
    table = stack_verdicts(stacks)
    if table.empty:
        table = pd.DataFrame(columns=["regime", "control", "spread", "outcome", "effect"])
    sup = table[(table["regime"] == "super-critical") & (table["control"] == "homogeneous")]
    sub = table[(table["regime"] == "sub-critical") & (table["control"] == "euclidean")]
    return {
        "riemannian/thm-2.2": thm,
        "riemannian/conj-3.4": _combined(
            sup[sup["spread"] > 0],
            "effective rank at the last layer, fixed heterogeneous metrics (sigma_U^2 > 0) minus "
            "homogeneous of the same mean strength, super-critical",
            every=False,
        ),
        "riemannian/conj-3.6-sub": _combined(
            sub,
            "effective rank at the last layer, fixed metrics minus Euclidean, sub-critical",
            every=True,
        ),
    }


def outcomes(smoke: bool = False) -> dict[str, verdicts.Outcome]:
    """Chapter 2's claims at the chapter's sizes (:data:`BOOK`; :data:`SMOKE` when ``smoke``):
    the same runs and the same :func:`chapter_outcomes` as the chapter."""
    p = {**BOOK, **(SMOKE if smoke else {})}
    checks = pt.perturbation_checks(p["n_instances"], generator=torch.Generator().manual_seed(p["seed"]))  # fmt: skip
    scales = pt.entry_grid(p["scale_low"], p["scale_high"], p["per_decade"])
    study = pt.sigma2_study(p["sweep_lengths"], p["onset_seeds"], scales)
    grid = chapter_grid(
        entries=p["stack_entries"], ranks=p["stack_ranks"], spreads=p["spreads"],
        length=p["stack_length"], dim=p["stack_dim"], depth=p["depth"],
    )  # fmt: skip
    _, stacks = stack_runs(grid, p["seeds"])
    return chapter_outcomes(checks, study, stacks)
