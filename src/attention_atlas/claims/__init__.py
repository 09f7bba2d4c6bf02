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

from . import cofactor, matroidal, riemannian, sma
from .core import C1, C2, C3, C4, C5, C6, C7, C9, SEEDS, Claim

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
    "claim",
    "evaluate",
    "outcome_from_check",
    "outcome_from_verdict",
    "register",
]

#: the register, in reading order (one list per seed)
CLAIMS: list[Claim] = [*riemannian.CLAIMS, *matroidal.CLAIMS, *cofactor.CLAIMS, *sma.CLAIMS]


def claim(key: str) -> Claim:
    """The claim with this key."""
    for c in CLAIMS:
        if c.key == key:
            return c
    raise ValueError(f"unknown claim {key!r}; known: {', '.join(c.key for c in CLAIMS)}")


def evaluate(claims: list[Claim] | None = None, *, smoke: bool = False) -> dict[str, Outcome]:
    """Outcomes of ``claims`` (default: all), each module's ``outcomes(smoke)`` called once.

    A module that returns no outcome for one of its claims is an error (a claim is never left
    without an outcome silently)."""
    claims = CLAIMS if claims is None else claims
    by_module: dict[str, list[Claim]] = {}
    for c in claims:
        by_module.setdefault(c.module, []).append(c)
    out: dict[str, Outcome] = {}
    for module, cs in by_module.items():
        found = importlib.import_module(module).outcomes(smoke=smoke)
        for c in cs:
            if c.key not in found:
                raise KeyError(f"{module}.outcomes() gave no outcome for claim {c.key!r}")
            if not isinstance(found[c.key], Outcome):
                raise TypeError(f"{module}.outcomes()[{c.key!r}] is not an Outcome")
            out[c.key] = found[c.key]
    return out


def register(*, smoke: bool = False, seed: str | None = None) -> pd.DataFrame:
    """The register as a table: one row per claim with its outcome, effect and evidence."""
    claims = [c for c in CLAIMS if seed is None or c.seed == seed]
    outcomes = evaluate(claims, smoke=smoke)
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
            }
        )
    return pd.DataFrame(rows)
