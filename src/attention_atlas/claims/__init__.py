"""The claims register: every claim of the four seeds, where the book tests it, and its outcome.

Each :class:`Claim` names its seed and the section or equation it comes from, what it states (in
our words), the chapter and section that test it, and the experiment module whose
``outcomes(smoke=False) -> dict[str, Outcome]`` computes its :class:`Outcome`. Outcomes are never
typed here: a mathematical claim is decided by a float64 check that runs in seconds, an empirical
one by :func:`attention_atlas.stats.verdict` on stored results (a declared smallest effect of
interest, a control, at least three seeds, an interval, and the training scale).

``python -m attention_atlas claims [--json] [--seed S] [--smoke]`` prints the register with its
outcomes (:mod:`attention_atlas.cli.claims`); chapter 10 shows it.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import asdict

import pandas as pd

from attention_atlas.verdicts import (
    BIGRAM_BPC,
    Outcome,
    TrainingScale,
    outcome_from_check,
    outcome_from_verdict,
)

from . import cards, cofactor, matroidal, riemannian, riemannian_a, riemannian_b, riemannian_c, sma
from .core import C1, C2, C3, C4, C5, C6, C7, C9, SEEDS, Claim
from .report import referee_report

__all__ = [
    "BIGRAM_BPC",
    "C1",
    "C2",
    "C3",
    "C4",
    "C5",
    "C6",
    "C7",
    "C9",
    "CLAIMS",
    "SEEDS",
    "Claim",
    "Outcome",
    "TrainingScale",
    "checked",
    "claim",
    "evaluate",
    "outcome_from_check",
    "outcome_from_verdict",
    "referee_report",
    "register",
    "stored_outcomes",
]

#: the register, in reading order (one list per seed)
CLAIMS: list[Claim] = sorted(
    [*riemannian.CLAIMS, *riemannian_a.CLAIMS, *riemannian_b.CLAIMS, *riemannian_c.CLAIMS,
     *matroidal.CLAIMS, *cofactor.CLAIMS, *sma.CLAIMS, *cards.CLAIMS],
    key=lambda c: list(SEEDS).index(c.seed),
)  # fmt: skip


def claim(key: str) -> Claim:
    """The claim with this key."""
    for c in CLAIMS:
        if c.key == key:
            return c
    raise ValueError(f"unknown claim {key!r}; known: {', '.join(c.key for c in CLAIMS)}")


def stored_outcomes(*, fresh_only: bool = True) -> dict[str, dict[str, Outcome]]:
    """The stored register (``results/claims/book``, :mod:`attention_atlas.experiments.register`):
    module -> its outcomes, for the records made from a clean tree whose sources and stored
    results have not changed since (others are left out, to be computed)."""
    from attention_atlas.experiments import register as reg
    from attention_atlas.store.results import load_grid

    try:
        grid = load_grid(reg.NAME, "book", complete=False, skip_damaged=True)
    except FileNotFoundError:
        return {}
    out: dict[str, dict[str, Outcome]] = {}
    checked_commits: dict[str, bool] = {}
    for (module, _), rec in grid.records.items():
        prov = rec.get("provenance", {})
        commit = prov.get("git_commit")
        if fresh_only and (prov.get("git_dirty") or not commit):
            continue
        if not fresh_only:
            checked_commits[commit] = True
        elif commit not in checked_commits:
            checked_commits[commit] = reg.fresh(commit)
        if checked_commits[commit]:
            short = f"{commit[:7]}{'-dirty' if prov.get('git_dirty') else ''}"
            out[module] = {
                k: dataclasses.replace(reg.outcome_from_json(v),
                                       extra={"stored": f"stored register, commit {short}"})
                for k, v in rec["outcomes"].items()
            }  # fmt: skip
    return out


def evaluate(
    claims: list[Claim] | None = None,
    *,
    smoke: bool = False,
    recompute: bool = False,
    stored: dict[str, dict[str, Outcome]] | None = None,
) -> dict[str, Outcome]:
    """Outcomes of ``claims`` (default: all): each module's stored outcomes when they are fresh
    (:func:`stored_outcomes`; never for ``smoke`` or ``recompute``), else its
    ``outcomes(smoke)`` called once.

    A module that returns no outcome for one of its claims is an error (a claim is never left
    without an outcome silently)."""
    claims = CLAIMS if claims is None else claims
    if stored is None:
        stored = {} if smoke or recompute else stored_outcomes()
    by_module: dict[str, list[Claim]] = {}
    out: dict[str, Outcome] = {}
    for c in claims:
        if c.module:
            by_module.setdefault(c.module, []).append(c)
        else:  # no experiment decides it: not tested, and the register says why
            reason = "ill-posed" if c.form == "ill-posed" else "not run"
            out[c.key] = Outcome("not tested", c.untested, evidence="the register",
                                 form=c.form, reason=reason)  # fmt: skip
    for module, cs in by_module.items():
        found = stored.get(module.removeprefix("attention_atlas.experiments."))
        if found is None:
            found = importlib.import_module(module).outcomes(smoke=smoke)
        for c in cs:
            if c.key not in found:
                raise KeyError(f"{module}.outcomes() gave no outcome for claim {c.key!r}")
            if not isinstance(found[c.key], Outcome):
                raise TypeError(f"{module}.outcomes()[{c.key!r}] is not an Outcome")
            out[c.key] = checked(c, found[c.key])
    return {c.key: out[c.key] for c in claims}


def checked(c: Claim, o: Outcome) -> Outcome:
    """``o`` when it was decided by the rule of ``c``'s declared form and margin, else a
    ValueError naming the mismatch (the rule follows the form, never the data). A decided
    empirical outcome must carry its witness; no decided outcome rests on a zero-width
    interval."""
    if o.form is not None and o.form != c.form:
        raise ValueError(f"{c.key}: declared {c.form}, but its outcome was decided as {o.form}")
    if o.form is None and o.outcome != "not tested":
        raise ValueError(f"{c.key}: its {o.outcome} outcome says no form (decided by what rule?)")
    if c.form not in ("exact", "ill-posed") and o.sesoi is not None and c.margin is not None:
        if abs(o.sesoi - c.margin) > 1e-12 * max(1.0, abs(c.margin)):
            raise ValueError(f"{c.key}: declared margin {c.margin:g}, decided at {o.sesoi:g}")
    if o.outcome in ("supported", "contradicted", "not resolved") and c.form != "exact":
        if not o.witness:
            raise ValueError(f"{c.key}: an empirical {o.outcome} outcome without its witness")
        if o.effect is not None and o.effect.high - o.effect.low <= 0:
            raise ValueError(f"{c.key}: a {o.outcome} outcome on a zero-width interval")
    return o


def register(
    *,
    smoke: bool = False,
    seed: str | None = None,
    recompute: bool = False,
    stored: dict[str, dict[str, Outcome]] | None = None,
) -> pd.DataFrame:
    """The register as a table: one row per claim with its outcome, effect and evidence
    (``stored``: module -> outcomes to use instead of :func:`stored_outcomes`)."""
    claims = [c for c in CLAIMS if seed is None or c.seed == seed]
    outcomes = evaluate(claims, smoke=smoke, recompute=recompute, stored=stored)
    rows = []
    for c in claims:
        o = outcomes[c.key]
        rows.append(
            {
                **asdict(c),
                "outcome": o.outcome,
                "summary": o.summary,
                "effect": None if o.effect is None else o.effect.format(3, signed=True, spec=".3g"),
                "sesoi": o.sesoi,
                "scale": o.scale,
                "evidence": o.evidence,
                "reason": o.reason,
                "witness": o.witness,
                "stored": o.extra.get("stored", "computed now"),
            }
        )
    return pd.DataFrame(rows)
