"""The claims register: every claim of the four seeds, where the book tests it, and its outcome.

Each :class:`Claim` names its seed and the section or equation it comes from, what it states (in
our words), the chapter and section that test it, and the experiment module whose
``outcomes(smoke=False) -> dict[str, Outcome]`` computes its :class:`Outcome`. Outcomes are never
typed here: a mathematical claim is decided by a float64 check that runs in seconds, an empirical
one by :func:`attention_atlas.stats.verdict` on stored results (a declared smallest effect of
interest, a control, at least three seeds, an interval, and the training scale).

``python -m attention_atlas claims [--json] [--seed S] [--smoke]`` prints the register with its
outcomes; chapter 10 shows it.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

import pandas as pd

from .stats import OUTCOMES, Interval, Verdict

__all__ = [
    "CLAIMS",
    "SEEDS",
    "Claim",
    "Outcome",
    "TrainingScale",
    "add_subcommand",
    "claim",
    "evaluate",
    "outcome_from_check",
    "outcome_from_verdict",
    "register",
]

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

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}, got {self.outcome!r}")


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


def outcome_from_check(passed: bool, supported: str, contradicted: str, **kw: Any) -> Outcome:
    """An exact (float64) check of a mathematical claim: *supported* with the sentence
    ``supported`` when it passes, else *contradicted* with ``contradicted``."""
    return Outcome(
        "supported" if passed else "contradicted", supported if passed else contradicted, **kw
    )


def outcome_from_verdict(
    v: Verdict, what: str, *, scale: TrainingScale | None, **kw: Any
) -> Outcome:
    """An empirical claim decided by :func:`attention_atlas.stats.verdict`; ``what`` names the
    effect ("paired difference of validation bpc, FBT minus dot"). A training verdict passes its
    :class:`TrainingScale`: at a scale that is not :attr:`~TrainingScale.decisive` the outcome is
    *not tested* whatever the interval says (the interval is still reported)."""
    scale_text = None if scale is None else scale.text()
    if scale is not None and not scale.decisive and v.outcome in ("supported", "contradicted"):
        summary = f"{what}: {v.reason}; not decisive, since {scale.reason()}"
        return Outcome("not tested", summary, v.effect, v.sesoi, scale_text, **kw)
    return Outcome(v.outcome, f"{what}: {v.reason}", v.effect, v.sesoi, scale_text, **kw)


def _c(key: str, source: str, kind: str, statement: str, chapter: str, section: str,
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
SWEEP_COF = "python -m attention_atlas sweep cofactor --preset long"
SWEEP_ZOO = "python -m attention_atlas sweep zoo --preset long"
ZOO_SECTION = "5. Stability and data efficiency against the dot control"

#: the register, in reading order
CLAIMS: list[Claim] = [
    # -- Riemannian attention (arXiv:2608.01283) -------------------------------------------
    _c(
        "riemannian/thm-2.2",
        "Theorem 2.2 (Dong et al. 2021)",
        "theorem",
        "The effective rank of a pure self-attention stack (no residuals, no MLP) decays to 1 "
        "doubly exponentially with depth.",
        C2,
        "Rank collapse in pure attention stacks",
        "rank_collapse",
    ),
    _c(
        "riemannian/thm-3.2",
        "Theorem 3.2",
        "theorem",
        "Scores with heterogeneous per-token metrics admit no universal factorisation "
        "phi_i . psi_j of dimension O(d).",
        C1,
        "What rank should we expect?",
        "non_gram",
    ),
    _c(
        "riemannian/thm-3.2-homogeneous",
        "Theorem 3.2 (edge case)",
        "theorem",
        "With one metric shared by every token the score is a Gram form of dimension O(d).",
        C1,
        "The edge case: identical metrics are a Gram matrix in disguise",
        "non_gram",
    ),
    _c(
        "riemannian/cor-3.3",
        "Corollary 3.3",
        "theorem",
        "The Riemannian attention matrix softmax(S) stays row-stochastic.",
        C1,
        "Corollary 3.3: still row-stochastic",
        "non_gram",
    ),
    _c(
        "riemannian/prop-3.5",
        "Proposition 3.5, eq. (12)",
        "proposition",
        "||Delta S||_F <= L tau^-1 U-bar^2 M: the metric perturbs the scores by at most "
        "L U-bar^2 M / tau in Frobenius norm.",
        C2,
        "Proposition 3.5 and eq. (13) on random instances",
        "rank_collapse",
    ),
    _c(
        "riemannian/conj-3.6",
        "Conjecture 3.6",
        "conjecture",
        "The spectrum of A moves from Euclidean-like to geometric at a critical metric strength "
        "U-bar^2 = Theta(tau / L).",
        C2,
        "Where does the spectrum of $A$ move? (Conjecture 3.6, prediction P1)",
        "rank_collapse",
    ),
    _c(
        "riemannian/conj-3.4",
        "Conjecture 3.4",
        "conjecture",
        "With metric diversity sigma_U^2 > 0 and rank r >= r_min, a pure Riemannian attention "
        "stack keeps its effective rank above a bound f(r, sigma_U^2) > 1 at every depth.",
        C2,
        "Rank collapse in pure attention stacks",
        "rank_collapse",
    ),
    _c(
        "riemannian/prop-4.1",
        "Proposition 4.1, eq. (14)",
        "proposition",
        "The inverse metric (I + U U^T)^-1 is given by Woodbury in O(d r^2).",
        C3,
        "Woodbury against a dense solve at d = 1024, r = 8",
        "riemannian_cost",
    ),
    _c(
        "riemannian/prop-4.2",
        "Proposition 4.2, eq. (15)-(16)",
        "identity",
        "The squared geodesic distance splits into a Euclidean part and two per-token metric "
        "terms, each decomposed into per-token and pairwise parts.",
        C3,
        "The identities, in float64",
        "riemannian_cost",
    ),
    _c(
        "riemannian/prop-4.2-cost",
        "Proposition 4.2 (cost)",
        "cost",
        "The pairwise term (U_i^T q_i).(U_i^T k_j) of eq. (16) costs O(r) per pair.",
        C3,
        "Counting the work per pair",
        "riemannian_cost",
    ),
    _c(
        "riemannian/prop-4.3",
        "Proposition 4.3",
        "cost",
        "Riemannian scores cost a dot product's O(B L^2 d) plus O(B L^2 r): an overhead ratio "
        "O(r/d), negligible for r << d.",
        C3,
        "Counting the work per pair",
        "riemannian_cost",
    ),
    _c(
        "riemannian/eq-25",
        "Section 5.6, eq. (25)",
        "identity",
        "The isometry error of P = I + Delta satisfies ||Delta^T Delta||_F = ||Delta||_F^2.",
        C4,
        "Transport: how far is $P = I + \\Delta$ from an isometry?",
        "fiber_bundle",
    ),
    _c(
        "riemannian/P1",
        "Prediction P1 (from Conjecture 3.6)",
        "prediction",
        "Training at metric strengths near tau/L shows a transition from Euclidean-like "
        "(collapse proceeds) to geometric behaviour (collapse resisted).",
        C4,
        "P1: a transition at metric strength $\\tau / L$?",
        "fiber_bundle",
        SWEEP_FBT,
    ),
    _c(
        "riemannian/P2",
        "Prediction P2, Proposition 6.2",
        "prediction",
        "A blended model evaluated at alpha_infer != alpha_train does worse than one trained at "
        "alpha_infer.",
        C4,
        "P2: train at one $\\alpha$, evaluate at another",
        "fiber_bundle",
        SWEEP_FBT,
    ),
    _c(
        "riemannian/P3",
        "Prediction P3, Conjecture 6.3",
        "prediction",
        "Without geometric regularisation (or with an l2 penalty on U) the metric collapses, "
        "U_t -> 0.",
        C4,
        "P3: does the metric collapse, $U_t \\to 0$?",
        "fiber_bundle",
        SWEEP_FBT,
    ),
    _c(
        "riemannian/P4",
        "Prediction P4, Conjecture 6.1",
        "prediction",
        "After training with the diversity regulariser, kappa_t = ||U_t||_F^2 is heterogeneous "
        "across tokens and correlates with semantic complexity.",
        C4,
        "P4: is curvature heterogeneous, and does it follow the text?",
        "fiber_bundle",
        SWEEP_FBT,
    ),
    _c(
        "riemannian/P5",
        "Prediction P5",
        "prediction",
        "Against a matched residual Transformer, Riemannian attention keeps a higher "
        "deep-layer effective rank.",
        C4,
        "P5: effective rank per layer against a matched dot-product Transformer",
        "fiber_bundle",
        SWEEP_FBT,
    ),
    _c(
        "riemannian/P6",
        "Prediction P6, Conjecture 6.4",
        "prediction",
        "Effective rank and task performance improve with the metric rank r.",
        C4,
        "P6: metric rank ablation",
        "fiber_bundle",
        SWEEP_FBT,
    ),
    _c(
        "riemannian/overhead",
        "Abstract, Section 4.3",
        "cost",
        "Riemannian attention is feasible at scale with negligible overhead over standard "
        "attention.",
        C4,
        "Cost of one training step, side by side",
        "fiber_bundle",
    ),
    # -- Matroidal Mahalanobis attention ---------------------------------------------------
    _c(
        "matroidal/unimodular",
        "(1), (3): graph-incidence support",
        "theorem",
        "Graph-incidence covector columns give a totally unimodular A.",
        C5,
        "1. Covector matrices and their unimodular support",
        "matroidal",
    ),
    _c(
        "matroidal/psd",
        "(2), (3): x^T M x",
        "identity",
        "The distance is x^T M x = sum_e l_e (a_e^T x)^2 + eps |x|^2 with l_e = softplus(theta_e) "
        ">= 0: a sum of rank-one PSD terms.",
        C5,
        "2. The paper's side: nonnegative weights and the rank-one decomposition",
        "matroidal",
    ),
    _c(
        "matroidal/fast-path",
        "(2) pseudocode",
        "algorithm",
        "The pairwise pseudocode (an (n, n, m) tensor) computes the logits.",
        C5,
        "3. The fast path is the pseudocode",
        "matroidal",
    ),
    _c(
        "matroidal/loss",
        "(4) hypothesis",
        "hypothesis",
        "With fewer metric parameters, the matroidal metric reaches equal or better validation "
        "loss than a dense learned Mahalanobis metric.",
        C5,
        "5. Verdict at this scale",
        "matroidal",
        SWEEP_MAT,
    ),
    _c(
        "matroidal/low-data",
        "(4) hypothesis",
        "hypothesis",
        "The structured metric is most useful in the low-data regime.",
        C5,
        "5. Verdict at this scale",
        "matroidal",
        SWEEP_MAT,
    ),
    _c(
        "matroidal/smoother",
        "(4) success criteria",
        "hypothesis",
        "Training with the matroidal metric is smoother (lower gradient-norm variance) than with "
        "the dense metric.",
        C5,
        "5. Verdict at this scale",
        "matroidal",
        SWEEP_MAT,
    ),
    _c(
        "matroidal/stability",
        "(4) success criteria",
        "hypothesis",
        "The matroidal metric loses no numerical stability relative to the dense baseline.",
        C5,
        "5. Verdict at this scale",
        "matroidal",
        SWEEP_MAT,
    ),
    _c(
        "matroidal/m",
        "(3), (4): the number of columns m",
        "hypothesis",
        "The number of support columns m in {d, 2d, 4d} matters for validation loss.",
        C5,
        "5. Verdict at this scale",
        "matroidal",
        SWEEP_MAT,
    ),
    _c(
        "matroidal/pruning",
        "(3): pruning",
        "hypothesis",
        "Pruning columns with l_e < delta keeps validation loss.",
        C5,
        "5. Verdict at this scale",
        "matroidal",
        SWEEP_MAT,
    ),
    _c(
        "matroidal/zoo-stability",
        "(4) success criteria",
        "hypothesis",
        "The matroidal metric loses no numerical stability (tested on MQAR as the gradient-norm "
        "variance against dot-product attention, in both directions).",
        C9,
        ZOO_SECTION,
        "zoo",
        SWEEP_ZOO,
    ),
    _c(
        "matroidal/zoo-low-data",
        "(4) hypothesis",
        "hypothesis",
        "The structured metric is most useful in the low-data regime (tested on MQAR as data "
        "efficiency: the mean accuracy over the learning curve, against dot-product attention).",
        C9,
        ZOO_SECTION,
        "zoo",
        SWEEP_ZOO,
    ),
    # -- Cofactor-stable attention (arXiv:2607.02843) ----------------------------------------
    _c(
        "cofactor/left-null",
        "Mathematical statement",
        "theorem",
        "The principal cofactors c of L = I - A satisfy c^T L = 0.",
        C6,
        "1. The identities, over four families of attention matrices",
        "cofactor",
    ),
    _c(
        "cofactor/margin",
        "Key formulas",
        "theorem",
        "The margin m = sum_i c_i equals the product of the nonzero eigenvalues of L.",
        C6,
        "1. The identities, over four families of attention matrices",
        "cofactor",
    ),
    _c(
        "cofactor/stationary",
        "Mathematical statement",
        "theorem",
        "For an irreducible stochastic A the cofactors are nonnegative and proportional to the "
        "stationary distribution.",
        C6,
        "1. The identities, over four families of attention matrices",
        "cofactor",
    ),
    _c(
        "cofactor/reducible",
        "Idea description",
        "hypothesis",
        "A small margin flags heads that isolate token groups (nearly reducible attention).",
        C6,
        "2. Nearly reducible attention: what happens as the coupling goes to zero",
        "cofactor",
    ),
    _c(
        "cofactor/margin-rewards-mixing",
        "Key formulas: the regulariser",
        "hypothesis",
        "Penalising -log m pushes attention away from reducible or nearly singular heads.",
        C6,
        "What the margin term rewards",
        "cofactor",
    ),
    _c(
        "cofactor/power",
        "Implementation notes",
        "algorithm",
        "Power iteration on A^T approximates the stationary distribution for long sequences.",
        C6,
        "3. Three methods: error and time against $n$",
        "cofactor",
    ),
    _c(
        "cofactor/decoder",
        "Implementation notes",
        "hypothesis",
        "The cofactor diagnostics apply to decoder (causal) heads as well as encoder heads.",
        C6,
        "6. The seed's experiment: runs",
        "cofactor",
        SWEEP_COF,
    ),
    _c(
        "cofactor/disconnected",
        "Implementation notes: success",
        "hypothesis",
        "The regulariser gives fewer nearly disconnected heads than baseline attention.",
        C6,
        "Do the seed's success criteria hold at this scale?",
        "cofactor",
        SWEEP_COF,
    ),
    _c(
        "cofactor/spikes",
        "Implementation notes: success",
        "hypothesis",
        "The regulariser gives lower gradient spikes than baseline attention.",
        C6,
        "Do the seed's success criteria hold at this scale?",
        "cofactor",
        SWEEP_COF,
    ),
    _c(
        "cofactor/accuracy",
        "Implementation notes: success",
        "hypothesis",
        "The regulariser keeps equal or better validation accuracy.",
        C6,
        "Do the seed's success criteria hold at this scale?",
        "cofactor",
        SWEEP_COF,
    ),
    _c(
        "cofactor/zoo-spikes",
        "Implementation notes: success",
        "hypothesis",
        "The regulariser gives lower gradient spikes than baseline attention (tested on MQAR, "
        "against unregularised dot-product attention).",
        C9,
        ZOO_SECTION,
        "zoo",
        SWEEP_ZOO,
    ),
    _c(
        "cofactor/zoo-accuracy",
        "Implementation notes: success",
        "hypothesis",
        "The regulariser keeps the accuracy of baseline attention (tested on MQAR recall, "
        "against unregularised dot-product attention, in both directions).",
        C9,
        ZOO_SECTION,
        "zoo",
        SWEEP_ZOO,
    ),
    # -- SSMs as structured masked attention (Paltorp 2025) -----------------------------------
    _c(
        "sma/low-rank-mask",
        "Masked attention, rank-p mask",
        "identity",
        "(L o B) x = sum_i D(u_i) B D(v_i) x for a rank-p mask L = U V^T: p products with B.",
        C7,
        "1. Masked attention and the low-rank mask identity",
        "sma_claims",
    ),
    _c(
        "sma/ssm-semiseparable",
        "Section 1",
        "identity",
        "An SSM up to time T is y = C A^-1 B x with A^-1 block semiseparable, applied in linear "
        "time for a fixed state size.",
        C7,
        "2. The state-space model as structured matrices",
        "sma_claims",
    ),
    _c(
        "sma/ssm-is-sma",
        "Section 2",
        "identity",
        "With scalar-times-identity dynamics the SSM is structured masked attention: "
        "C^T A^-1 B = (C B^T) o a^-1.",
        C7,
        "3. Scalar dynamics: the SSM is structured masked attention",
        "sma_claims",
    ),
    _c(
        "sma/sum-of-sma",
        "Section 2",
        "identity",
        "Independent but different per-state dynamics give a sum of masked attentions.",
        C7,
        "3. Scalar dynamics: the SSM is structured masked attention",
        "sma_claims",
    ),
    _c(
        "sma/generators",
        "Section 2, semiseparable generators",
        "algorithm",
        "The product through the generators u_i = prod a, v_i = 1/u_i computes the SSM in linear "
        "time.",
        C7,
        "4. The fast product, and where the generator representation breaks",
        "sma_claims",
    ),
    _c(
        "sma/ssd-linear",
        "SSD (Mamba-2) as SMA",
        "cost",
        "The chunked (SSD) algorithm computes the same output in time linear in the length.",
        C7,
        "5. SSD three ways: recurrence, masked attention, chunks",
        "sma_claims",
    ),
]


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


def add_subcommand(subparsers: Any) -> None:
    """Register ``claims`` on the command line (see :mod:`attention_atlas.__main__`)."""
    p = subparsers.add_parser(
        "claims",
        help="the claims register: every claim of the seeds, its test and its outcome",
        description="Evaluate and print the claims register (mathematical checks run now; "
        "empirical outcomes come from the stored results).",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--seed", choices=sorted(SEEDS), help="only the claims of this seed")
    p.add_argument("--smoke", action="store_true", help="toy sizes for the computed checks")
    p.set_defaults(func=_cli_claims)


def _cli_claims(args: argparse.Namespace) -> int:
    df = register(smoke=args.smoke, seed=args.seed)
    if args.json:
        json.dump(df.to_dict(orient="records"), sys.stdout, indent=1, default=str)
        print()
        return 0
    for seed, g in df.groupby("seed", sort=False):
        print(f"\n{SEEDS[str(seed)][0]} ({SEEDS[str(seed)][1]})")
        for r in g.itertuples():
            print(f"  [{r.outcome:>12}] {r.key:<32} {r.source}: {r.summary}")
    counts = df["outcome"].value_counts()
    print("\n" + ", ".join(f"{counts.get(o, 0)} {o}" for o in OUTCOMES))
    return 0
