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
)


@dataclass(frozen=True)
class Claim:
    """One claim of a seed and where the book tests it."""

    key: str  # "<seed>/<short-name>", unique
    seed: str  # a key of SEEDS
    source: str  # section, equation or result of the seed ("Theorem 3.2", "eq. (25)")
    kind: str  # one of KINDS
    statement: str  # what the seed claims, in one sentence (our words)
    chapter: str  # notebook stem of the chapter that tests it
    section: str  # heading (text) of the chapter's section that tests it
    module: str  # experiment module with ``outcomes(smoke) -> {key: Outcome}``
    command: str  # the command that reproduces the evidence


def claim_entry(key: str, source: str, kind: str, statement: str, chapter: str, section: str,
       module: str, command: str | None = None) -> Claim:  # fmt: skip
    seed = key.split("/", 1)[0]
    cmd = command or f"python -m attention_atlas notebooks run {chapter}"
    return Claim(key, seed, source, kind, statement, chapter, section,
                 f"attention_atlas.experiments.{module}", cmd)  # fmt: skip


C1, C2, C3 = "01_non_gram_scores", "02_perturbation_and_rank_collapse", "03_low_rank_geometry_cost"
C4, C5, C6 = "04_fiber_bundle_transformer", "05_matroidal_metric", "06_cofactor_stability"
C7 = "07_ssm_as_masked_attention"
C9 = "09_zoo_equal_footing"

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
