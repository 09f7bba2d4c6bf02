"""The rule as chapter 4 applies it: the smallest effects of interest (:data:`SESOI`, each with
its reason in :data:`SESOI_REASON`), the training scale of a grid (:func:`training_scale`) below
which nothing is decided, a verdict stated at that scale (:func:`at_scale`), the weakest part of
a claim made of several (:func:`weakest`), and why arms that diverged cannot be compared
(:func:`diverged_reason`). The gate (:mod:`.gate`) and the predictions (:mod:`.verdicts`)
decide with these.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from attention_atlas.experiments.zoo.run import SESOI as ZOO_SESOI
from attention_atlas.stats import Verdict
from attention_atlas.verdicts import TrainingScale, outcome_from_verdict

from .analysis import Runs

__all__ = ["SESOI", "SESOI_REASON", "at_scale", "diverged_reason", "training_scale", "weakest"]

#: smallest effects of interest, fixed before any result was read (reasons in SESOI_REASON)
SESOI: dict[str, float] = {
    "sigma2": 0.05,
    "erank": 1.0,
    "log10_kappa": math.log10(2.0),
    "cv": 0.05,
    "spearman": 0.1,
    "bpc": 0.02,
    "overhead": math.log(1.25),
    "gate": 0.01,
    "gate_acc": 0.01,
    "test_acc": ZOO_SESOI["test_acc"],
}
SESOI_REASON: dict[str, str] = {
    "sigma2": "5% of the second singular value of causal attention spread evenly over the keys "
    "each query sees (1.01 at L = 64; Conjecture 3.6's quantity): a smaller change leaves how fast "
    "products of attention matrices contract about as it is",
    "erank": "one dimension of the hidden states' effective rank: less is not 'keeping rank'",
    "log10_kappa": "a factor of 2 in the mean metric strength, the width of the band "
    "[kappa_min, kappa_max] the regularisers hold: less is neither growth nor collapse",
    "cv": "a spread of kappa_t of 5% of its mean: less is not heterogeneity anyone would read "
    "structure into",
    "spearman": "a rank correlation of 0.1 explains 1% of the rank variance of the surprisal",
    "bpc": "0.02 bits per character, 1% of the 2 bpc a trained character model reaches: the "
    "smallest difference a character-level language-modelling comparison reports",
    "overhead": "negligible overhead: at most 25% more time per training step than dot product, "
    "log(1.25) in log ratio (Proposition 4.3's O(r/d) is 4/16 = 25% at the book's metric rank and "
    "head width)",
    "gate": "half the 0.02 bpc of the predictions' comparisons: a geometry whose removal at "
    "evaluation costs less than 0.01 bpc cannot be what a 0.02 bpc difference between arms is "
    "made of",
    "gate_acc": "half the 0.02 test accuracy of the MQAR comparisons (chapter 9's smallest effect "
    "for accuracy), as for the bpc gate: a geometry whose removal costs less than one point of "
    "recall cannot be what two points between arms are made of",
    "test_acc": "chapter 9's smallest effect for MQAR test accuracy (zoo.SESOI['test_acc']): two "
    "points of accuracy, below which the order of a leaderboard is noise",
}


def training_scale(runs: Runs) -> TrainingScale:
    """The scale of the grid: steps, training characters per run, seeds, and the dot-product
    baseline's mean validation bits per character."""
    p = runs.params
    return TrainingScale(
        steps=int(p["steps"]),
        tokens=int(p["steps"] * p["batch_size"] * p["seq_len"]),
        seeds=len(runs.seeds),
        baseline=float(runs.per_seed("dot", "val_bpc").mean()),
    )


def at_scale(v: Verdict, scale: TrainingScale) -> str:
    """The outcome of ``v`` at the training scale ``scale``
    (:func:`attention_atlas.verdicts.outcome_from_verdict`'s rule: below a decisive scale nothing is
    supported or contradicted), with its effect: what the chapter says of one part of a claim."""
    effect = f"{v.effect.format(spec='+.3g')}, " if v.effect is not None else ""
    return effect + outcome_from_verdict(v, "", scale=scale).outcome


def weakest(verdicts: list[Verdict]) -> Verdict:
    """The verdict of a claim made of several parts, all needed: the first part that is
    contradicted, else not tested, else not resolved; supported only when every part is."""
    for outcome in ("contradicted", "not tested", "not resolved"):
        for v in verdicts:
            if v.outcome == outcome:
                return v
    return verdicts[0]


def diverged_reason(runs: Runs, configs: Sequence[str]) -> str | None:
    """Why a verdict comparing ``configs`` cannot be computed: those of them whose training
    diverged at some seed (:meth:`Runs.diverged`), with the seeds and steps; None when every
    one of them finished at every seed. A diverged run has no trained metrics to compare, and
    dropping its seeds would compare the arms on the seeds that happened to survive."""
    parts = []
    for c in dict.fromkeys(configs):
        d = runs.diverged(c)
        if d:
            at = ", ".join(f"seed {s} at step {t}" for s, t in sorted(d.items()))
            parts.append(f"{c} diverged in {len(d)} of {len(runs.seeds)} seeds ({at})")
    return "; ".join(parts) if parts else None
