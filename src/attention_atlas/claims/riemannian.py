"""The claims of Riemannian attention and the Fiber Bundle Transformer (arXiv:2608.01283), in reading order."""

from __future__ import annotations

from .core import C1, C2, C3, C4, SWEEP_FBT, Claim, claim_entry

CLAIMS: list[Claim] = [
    # -- Riemannian attention (arXiv:2608.01283) -------------------------------------------
    claim_entry(
        "riemannian/thm-2.2",
        "Theorem 2.2 (Dong et al. 2021)",
        "theorem",
        "The effective rank of a pure self-attention stack (no residuals, no MLP) decays to 1 "
        "doubly exponentially with depth.",
        C2,
        "Rank collapse in pure attention stacks",
        "rank_collapse",
    ),
    claim_entry(
        "riemannian/thm-3.2",
        "Theorem 3.2",
        "theorem",
        "Scores with heterogeneous per-token metrics admit no universal factorisation "
        "phi_i . psi_j of dimension O(d).",
        C1,
        "Many draws, every metric rank",
        "non_gram",
    ),
    claim_entry(
        "riemannian/thm-3.2-homogeneous",
        "Theorem 3.2 (edge case)",
        "theorem",
        "With one metric shared by every token the score is a Gram form of dimension O(d).",
        C1,
        "The edge case: identical metrics are a Gram matrix in disguise",
        "non_gram",
    ),
    claim_entry(
        "riemannian/cor-3.3",
        "Corollary 3.3",
        "theorem",
        "The Riemannian attention matrix softmax(S) stays row-stochastic, and with heterogeneous "
        "metrics it is not softmax(Q' K'^T) for any factors of dimension O(d).",
        C1,
        "Corollary 3.3: row-stochastic, but not a softmax of a Gram form",
        "non_gram",
    ),
    claim_entry(
        "riemannian/prop-3.5",
        "Proposition 3.5, eq. (12)",
        "proposition",
        "||Delta S||_F <= L tau^-1 U-bar^2 M: the metric perturbs the scores by at most "
        "L U-bar^2 M / tau in Frobenius norm.",
        C2,
        "Proposition 3.5 and eq. (13) on random instances",
        "rank_collapse",
    ),
    claim_entry(
        "riemannian/conj-3.6",
        "Conjecture 3.6",
        "conjecture",
        "The spectrum of A moves from Euclidean-like to geometric at a critical metric strength "
        "U-bar^2 = Theta(tau / L).",
        C2,
        "Where does the spectrum of $A$ move? (Conjecture 3.6)",
        "rank_collapse",
    ),
    claim_entry(
        "riemannian/conj-3.6-sub",
        "Conjecture 3.6 (sub-critical regime)",
        "conjecture",
        "Below the critical strength the Riemannian attention is a perturbation of the Euclidean "
        "one and rank collapse proceeds as in Theorem 2.2.",
        C2,
        "Metrics that do not follow the tokens: Conjectures 3.4 and 3.6 in deep stacks",
        "rank_collapse",
    ),
    claim_entry(
        "riemannian/conj-3.4",
        "Conjecture 3.4",
        "conjecture",
        "With metric diversity sigma_U^2 > 0 and rank r >= r_min, a pure Riemannian attention "
        "stack keeps its effective rank above a bound f(r, sigma_U^2) > 1 at every depth.",
        C2,
        "Metrics that do not follow the tokens: Conjectures 3.4 and 3.6 in deep stacks",
        "rank_collapse",
    ),
    claim_entry(
        "riemannian/prop-4.1",
        "Proposition 4.1, eq. (14)",
        "proposition",
        "The inverse metric (I + U U^T)^-1 is given by Woodbury in O(d r^2).",
        C3,
        "Woodbury against a dense solve at d = 1024, r = 8",
        "low_rank",
    ),
    claim_entry(
        "riemannian/prop-4.2",
        "Proposition 4.2, eq. (15)-(16)",
        "identity",
        "The squared geodesic distance splits into a Euclidean part and two per-token metric "
        "terms, each decomposed into per-token and pairwise parts.",
        C3,
        "The identities, in float64",
        "low_rank",
    ),
    claim_entry(
        "riemannian/prop-4.2-cost",
        "Proposition 4.2 (cost)",
        "cost",
        "The pairwise term (U_i^T q_i).(U_i^T k_j) of eq. (16) costs O(r) per pair.",
        C3,
        "Counting the work per pair",
        "low_rank",
    ),
    claim_entry(
        "riemannian/prop-4.3",
        "Proposition 4.3",
        "cost",
        "Riemannian scores cost a dot product's O(B L^2 d) plus O(B L^2 r): an overhead ratio "
        "O(r/d), negligible for r << d.",
        C3,
        "Counting the work per pair",
        "low_rank",
    ),
    claim_entry(
        "riemannian/eq-25",
        "Section 5.6, eq. (25)",
        "identity",
        "The isometry error of P = I + Delta satisfies ||Delta^T Delta||_F = ||Delta||_F^2.",
        C4,
        "Transport: how far is $P = I + \\Delta$ from an isometry?",
        "fiber_bundle",
    ),
    claim_entry(
        "riemannian/P1",
        "Prediction P1 (from Conjecture 3.6)",
        "prediction",
        "Training at metric strengths near tau/L shows a transition from Euclidean-like "
        "(collapse proceeds) to geometric behaviour (collapse resisted).",
        C4,
        "P1: a transition at the critical metric strength?",
        "fiber_bundle",
        SWEEP_FBT,
    ),
    claim_entry(
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
    claim_entry(
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
    claim_entry(
        "riemannian/eq-34",
        "Section 6.4, eq. (34)",
        "hypothesis",
        "The soft cap ReLU(||U_t||_F^2 - kappa_max) of eq. (34) gives the diversity regulariser "
        "(32) the upper bound on the metric strength it lacks.",
        C4,
        "The cap of eq. (34): does it bound the metric?",
        "fiber_bundle",
    ),
    claim_entry(
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
    claim_entry(
        "riemannian/P5",
        "Prediction P5",
        "prediction",
        "Against a matched residual Transformer, Riemannian attention keeps a higher "
        "deep-layer effective rank.",
        C4,
        "P5: effective rank against a temperature-matched dot-product Transformer",
        "fiber_bundle",
        SWEEP_FBT,
    ),
    claim_entry(
        "riemannian/P6",
        "Prediction P6, Conjecture 6.4",
        "prediction",
        "Effective rank and task performance improve with the metric rank r.",
        C4,
        "P6: metric rank ablation",
        "fiber_bundle",
        SWEEP_FBT,
    ),
    claim_entry(
        "riemannian/overhead",
        "Abstract, Section 4.3",
        "cost",
        "Riemannian attention is feasible at scale with negligible overhead over standard "
        "attention.",
        C4,
        "Cost of one training step, side by side",
        "fiber_bundle",
    ),
]
