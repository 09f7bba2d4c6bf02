"""The claim type and the helpers the register's four seed lists use (:func:`claim_entry`,
chapter stems, long-sweep commands). The outcome types and the training-scale gate live one
layer down, in :mod:`attention_atlas.verdicts`, where the experiments that compute them reach."""

from __future__ import annotations

from dataclasses import dataclass

from attention_atlas.verdicts import (
    BIGRAM_BPC,
    Outcome,
    TrainingScale,
    outcome_from_check,
    outcome_from_verdict,
)

#: seed key -> (title, citation)
SEEDS: dict[str, tuple[str, str]] = {
    "riemannian": ("Riemannian attention and the Fiber Bundle Transformer", "arXiv:2608.01283"),
    "matroidal": ("Matroidal Mahalanobis attention", "research card"),
    "cofactor": ("Cofactor-stable attention", "arXiv:2607.02843"),
    "sma": ("SSMs as structured masked attention", "Paltorp 2025"),
}

#: the kinds of claim
KINDS = (
    "theorem",
    "proposition",
    "identity",
    "conjecture",
    "prediction",
    "hypothesis",
    "cost",
    "algorithm",
    "claim",  # a statement of the abstract or introduction
    "remark",  # a remark or design choice stated as fact ("matches", "ensures", "prevents")
    "citation",  # a result the seed attributes to another work
    "open problem",
)


@dataclass(frozen=True)
class Claim:
    """One claim of a seed, its declared form, and where the book tests it.

    The form (:data:`attention_atlas.stats.FORMS`) is declared here, before any data:
    ``margin`` is the exact check's tolerance or the empirical claim's smallest effect of
    interest (the rule's margin), ``declared`` says in words what would support and what would
    contradict it (the direction, which side is better). A claim no experiment decides carries
    ``untested``: why it is ill-posed as written, or what deciding it would take (compute,
    seeds); its outcome is then *not tested* with that reason."""

    key: str  # "<seed>/<short-name>", unique
    seed: str  # a key of SEEDS
    source: str  # where in the seed: section, equation or result ("Sec. 3.2, Theorem 3.2")
    kind: str  # one of KINDS
    statement: str  # what the seed claims, in one sentence (our words)
    chapter: str  # notebook stem of the chapter that tests it ("" when none does)
    section: str  # heading (text) of the chapter's section that tests it
    module: str  # experiment module with ``outcomes(smoke) -> {key: Outcome}`` ("" when none)
    command: str  # the command that reproduces the evidence
    form: str = "exact"  # one of stats.FORMS
    margin: float | None = None  # tolerance (exact) or smallest effect of interest
    declared: str = ""  # the test in words: what supports, what contradicts
    untested: str = ""  # why no experiment decides it (ill-posed, or what it would take)


def claim_entry(key: str, source: str, kind: str, statement: str, chapter: str, section: str,
       module: str, command: str | None = None, *, form: str, margin: float | None = None,
       declared: str = "", untested: str = "") -> Claim:  # fmt: skip
    """A register entry; ``module`` is the experiment module under
    ``attention_atlas.experiments`` ("" for a claim no experiment decides: then ``untested``
    says why)."""
    from attention_atlas.stats import FORMS

    seed = key.split("/", 1)[0]
    if kind not in KINDS:
        raise ValueError(f"{key}: kind must be one of {KINDS}, got {kind!r}")
    if form not in FORMS:
        raise ValueError(f"{key}: form must be one of {FORMS}, got {form!r}")
    if form == "ill-posed" and not untested:
        raise ValueError(f"{key}: an ill-posed claim says why (untested=...)")
    if not module and not untested:
        raise ValueError(f"{key}: a claim no experiment decides says why (untested=...)")
    if form in ("non-inferiority", "equivalence", "superiority") and module and margin is None:
        raise ValueError(f"{key}: an empirical claim declares its margin (smallest effect)")
    if form == "ill-posed" and not declared:
        declared = "ill-posed as written: no measurement could support or contradict it"
    cmd = command or (f"python -m attention_atlas notebooks run {chapter}" if chapter else "")
    return Claim(key, seed, source, kind, statement, chapter, section,
                 f"attention_atlas.experiments.{module}" if module else "", cmd, form, margin,
                 declared, untested)  # fmt: skip


C1, C2, C3 = "01_non_gram_scores", "02_perturbation_and_rank_collapse", "03_low_rank_geometry_cost"
C4, C5, C6 = "04_fiber_bundle_transformer", "05_matroidal_metric", "06_cofactor_stability"
C7 = "07_ssm_as_masked_attention"
C9 = "09_zoo_equal_footing"
C10 = (
    "10_verdicts"  # the register's own float64 checks of the seeds' text (experiments.seed_checks)
)

_R = "riemannian"
SWEEP_FBT = "python -m attention_atlas sweep fiber-bundle --preset long"
SWEEP_MAT = "python -m attention_atlas sweep matroidal --preset long"
SWEEP_COF = "python -m attention_atlas sweep cofactor --preset long --seeds 0 1 2 3 4"
SWEEP_ZOO = "python -m attention_atlas sweep zoo --preset long"
ZOO_SECTION = "5. Stability and data efficiency against the dot control"

__all__ = [
    "BIGRAM_BPC",
    "Claim",
    "KINDS",
    "Outcome",
    "SEEDS",
    "TrainingScale",
    "claim_entry",
    "outcome_from_check",
    "outcome_from_verdict",
]
