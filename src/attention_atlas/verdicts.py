"""What the book found for a claim: the :class:`Outcome` type, the training-scale gate
(:class:`TrainingScale`: runs whose dot baseline has barely left the bigram regime decide
nothing), and the two ways an outcome is made: an exact check (:func:`outcome_from_check`) or
the library's one rule on an interval (:func:`outcome_from_verdict` over
:func:`attention_atlas.stats.verdict`). The experiments compute outcomes; the claims register
(:mod:`attention_atlas.claims`) collects them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from attention_atlas.stats import (
    FORMS,
    NOT_TESTED,
    OUTCOMES,
    Interval,
    Verdict,
    not_tested_category,
)

__all__ = ["BIGRAM_BPC", "Outcome", "TrainingScale", "outcome_from_check", "outcome_from_verdict"]


@dataclass
class Outcome:
    """What the book found for one claim."""

    outcome: str  # one of stats.OUTCOMES
    summary: str  # one computed sentence: the evidence
    effect: Interval | None = None  # the measured effect, for empirical claims
    sesoi: float | None = None  # the declared smallest effect of interest
    scale: str | None = None  # training scale: steps, tokens, dot-baseline bpc
    evidence: str = "computed"  # "computed now" or the stored results' provenance
    extra: dict[str, Any] = field(default_factory=dict)
    form: str | None = None  # the form (stats.FORMS) the rule that made it decided
    reason: str | None = None  # for "not tested": why (one of stats.NOT_TESTED)
    witness: str | None = None  # why the test could have failed (computed in the same run)

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}, got {self.outcome!r}")
        if self.form is not None and self.form not in FORMS:
            raise ValueError(f"form must be one of {FORMS}, got {self.form!r}")
        if self.outcome == "not tested" and self.reason is None:
            self.reason = not_tested_category(self.summary)
        if self.reason is not None and self.reason not in NOT_TESTED:
            raise ValueError(f"reason must be one of {NOT_TESTED}, got {self.reason!r}")


#: a character-level model above this many bits per character has learned little beyond bigram
#: statistics (a char-PTB bigram model is at about 3.2 to 3.4 bpc): its runs decide nothing
BIGRAM_BPC = 3.0


@dataclass(frozen=True)
class TrainingScale:
    """The scale a training verdict rests on, stated beside it.

    ``metric`` is the baseline's quality measure at the same budget: ``"bpc"`` (lower is
    better; a character-level LM) or ``"acc"`` (higher is better; ``chance`` is its chance level).
    """

    steps: int  # optimiser steps per run
    tokens: int  # training tokens (or examples) seen per run
    seeds: int  # runs per arm
    baseline: float  # the dot-product baseline's final value of ``metric``
    metric: str = "bpc"
    chance: float | None = None
    what: str = "dot-product baseline"

    def __post_init__(self) -> None:
        if self.metric not in ("bpc", "acc"):
            raise ValueError(f"metric must be 'bpc' or 'acc', got {self.metric!r}")
        if self.metric == "acc" and self.chance is None:
            raise ValueError("an accuracy scale needs its chance level")

    @property
    def decisive(self) -> bool:
        """Whether runs at this scale may support or contradict a claim: a char-LM baseline at
        or below :data:`BIGRAM_BPC`; a classifier at least halfway from chance to perfect."""
        if self.metric == "bpc":
            return self.baseline <= BIGRAM_BPC
        assert self.chance is not None
        return self.baseline >= (1 + self.chance) / 2

    def text(self) -> str:
        unit = "bpc" if self.metric == "bpc" else "accuracy"
        return (
            f"{self.steps:,} steps, {self.tokens:,} tokens per run, {self.seeds} seeds; "
            f"{self.what} at {self.baseline:.3g} {unit}"
        )

    def reason(self) -> str:
        """Why runs at this scale decide nothing (empty when :attr:`decisive`)."""
        if self.decisive:
            return ""
        if self.metric == "bpc":
            return (
                f"the {self.what} is at {self.baseline:.2f} bpc, above {BIGRAM_BPC:g} bpc (the "
                "bigram regime): models at this scale have barely started learning"
            )
        return (
            f"the {self.what} is at {self.baseline:.2f} accuracy, less than halfway from chance "
            f"({self.chance:.2f}) to perfect"
        )


def outcome_from_check(
    passed: bool, supported: str, contradicted: str, *, witness: str | None = None, **kw: Any
) -> Outcome:
    """An exact (float64) check of a mathematical claim: *supported* with the sentence
    ``supported`` when it passes, else *contradicted* with ``contradicted``. ``witness``: that
    the check could fail (a perturbed instance it rejects, or the size of the error it
    tolerates)."""
    return Outcome(
        "supported" if passed else "contradicted", supported if passed else contradicted,
        form="exact", witness=witness, **kw,
    )  # fmt: skip


def outcome_from_verdict(
    v: Verdict, what: str, *, scale: TrainingScale | None, witness: str | None = None, **kw: Any
) -> Outcome:
    """An empirical claim decided by the one rule (:func:`attention_atlas.stats.decide`);
    ``what`` names the effect ("paired difference of validation bpc, FBT minus dot"). A training
    verdict passes its :class:`TrainingScale`: at a scale that is not
    :attr:`~TrainingScale.decisive` the outcome is *not tested* (reason "baseline not trained")
    whatever the interval says (the interval is still reported). ``witness``: why the test
    could have failed (a positive control that moved the measure, events counted); by default
    the spread of the runs on the measure (the rule already refuses a zero-width interval)."""
    scale_text = None if scale is None else scale.text()
    if witness is None and v.effect is not None and v.outcome != "not tested":
        witness = (f"the runs differ on the measure: {v.effect.n} runs, interval "
                   f"{v.effect.high - v.effect.low:.3g} wide")  # fmt: skip
    common = dict(form=v.form, witness=witness, **kw)
    if scale is not None and not scale.decisive and v.outcome in ("supported", "contradicted"):
        summary = f"{what}: {v.reason}; not decisive, since {scale.reason()}"
        return Outcome("not tested", summary, v.effect, v.sesoi, scale_text,
                       reason="baseline not trained", **common)  # fmt: skip
    return Outcome(v.outcome, f"{what}: {v.reason}", v.effect, v.sesoi, scale_text,
                   reason=v.category, **common)  # fmt: skip
