"""Register entries read off the seed text (see ``attention_atlas.experiments.seed_checks``):
Sections 6 to 8 of the Riemannian-attention paper (predictions, regularisers, open problems,
related work, limitations)."""

from __future__ import annotations

from .core import C2, C4, C10, Claim, claim_entry

_M = "seed_checks.riemannian_c"
_S = "The register's own checks"
_CMD = "python -m attention_atlas claims --seed riemannian"
_TRAIN = (
    "char-level LM, 4 blocks, width 256, 4 heads, head width 64, context 256, about 5M "
    "parameters, 20k steps, 5 seeds per arm"
)


def _check(key: str, source: str, kind: str, statement: str, declared: str, margin: float = 1e-12) -> Claim:  # fmt: skip
    """An entry decided by a float64 check of :mod:`attention_atlas.experiments.seed_checks.riemannian_c`."""
    return claim_entry(key, source, kind, statement, C10, _S, _M, _CMD, form="exact",
                       margin=margin, declared=declared)  # fmt: skip


CLAIMS: list[Claim] = [
    # -- 6.1 --------------------------------------------------------------------------------
    claim_entry(
        "riemannian/conj-6.1-content-words",
        'Sec. 6.1, Conjecture 6.1 (falsifiable prediction): "higher for content words than '
        'function words"',
        "conjecture",
        "After training with the diversity regulariser, the per-token metric strength kappa_t "
        "is larger on content words than on function words.",
        C4,
        "P4: is curvature heterogeneous, and does it follow the text?",
        "",
        form="superiority",
        margin=0.1,
        declared="mean log kappa_t on content words minus on function words (a closed-class "
        "word list), per trained model: supported when the interval over seeds lies above 0.1; "
        "contradicted when it lies below 0.1",
        untested="needs word-level text (the chapter trains on characters): a word- or "
        f"BPE-level FBT with the three regularisers ({_TRAIN}) plus a dot-product control "
        "for the tagging pipeline, kappa_t averaged over each word's tokens, content/function "
        "split by a fixed closed-class list; about 10 GPU-hours on one H100",
    ),
    _check(
        "riemannian/kappa-homogeneous",
        'Sec. 6.1, theoretical basis: "homogeneous metrics (κt constant across t) reduce to '
        'a global metric"',
        "remark",
        "Tokens whose metric strengths kappa_t = ||U_t||_F^2 are all equal share one global "
        "metric, so Theorem 3.2's Gram case applies.",
        "a score matrix built from factors with equal kappa_t: supported when its rank is at "
        "most d + 2 (the rank of any global-metric score), contradicted when it is higher",
        margin=1e-9,
    ),
    claim_entry(
        "riemannian/ce-penalizes-collapse",
        'Sec. 6.1, theoretical basis: "collapsed representations have high perplexity"',
        "remark",
        "Cross-entropy training penalises rank collapse, which creates a weak pressure toward "
        "heterogeneous metrics.",
        C4,
        "P4: is curvature heterogeneous, and does it follow the text?",
        "",
        form="ill-posed",
        declared="no measurable quantity is named for the 'pressure'",
        untested="the 'weak pressure' has no defined measure, and a residual Transformer that "
        "reaches low perplexity without metrics (the dot-product baseline) shows perplexity "
        "does not require heterogeneous metrics; what would be testable is P4 (registered)",
    ),
    # -- 6.2 --------------------------------------------------------------------------------
    _check(
        "riemannian/nonconvex-wq",
        'Sec. 6.2: "global convexity of ℒ in WQ, which is false for Transformers"',
        "remark",
        "The attention loss is not convex in the query weights W_Q.",
        "the smallest Hessian eigenvalue of a toy blended-attention loss in W_Q at random "
        "points: supported when one is negative (below -1e-8)",
        margin=1e-8,
    ),
    _check(
        "riemannian/prop-6.2",
        'Sec. 6.2, Proposition 6.2, eq. (29): "strictly suboptimal for αinfer≠αtrain"',
        "proposition",
        "At a strict local minimiser for alpha_train with a nonzero cross-derivative, reusing "
        "its weights at a nearby alpha_infer gives a strictly higher loss than the minimiser "
        "for alpha_infer.",
        "on a toy blended attention loss with Newton-solved minimisers: supported when the "
        "Hessian is positive definite, c != 0 and every gap L(W*(a_t), a) - L(W*(a), a) is "
        "positive at |a - a_t| in {1e-2, 1e-3}",
        margin=0.0,
    ),
    _check(
        "riemannian/eq-30",
        'Sec. 6.2, proof of Proposition 6.2, eq. (30): "dŴQ/dα = −H⁻¹c"',
        "identity",
        "The minimiser path W_Q(alpha) has slope -H^-1 c at alpha_train (implicit function "
        "theorem).",
        "-H^-1 c against the central difference (step 1e-5) of re-solved minimisers: supported "
        "within 1e-6 relative",
        margin=1e-6,
    ),
    _check(
        "riemannian/prop-6.2-a3",
        'Sec. 6.2, remark on the assumptions: "when the geometric correction Δsgeo is '
        'identically zero"',
        "remark",
        "Assumption (a3) fails when the geometric correction is identically zero: then the "
        "cross-derivative c vanishes and alpha does not matter.",
        "the toy loss with U = 0: supported when |c| and every retraining gap are at most 1e-12",
    ),
    claim_entry(
        "riemannian/a3-measure-zero",
        'Sec. 6.2, remark on the assumptions: "fails only on a measure-zero set"',
        "remark",
        "The genericity condition (a3) fails only on a measure-zero set of degenerate problems.",
        C10,
        _S,
        "",
        form="ill-posed",
        declared="no measure on the space of problems is given",
        untested="'measure zero' needs a measure on a space of problems (losses, data, "
        "architectures), which the text does not define; the one example it names (Delta "
        "s^geo = 0) is checked as riemannian/prop-6.2-a3",
    ),
    _check(
        "riemannian/a1-differentiable",
        'Sec. 6.2, remark on the assumptions: "(a1) holds for any differentiable '
        'attention/loss combination"',
        "remark",
        "Assumption (a1), twice continuous differentiability, holds for any differentiable "
        "attention and loss.",
        "one-sided second differences of a standard differentiable loss at a point: supported "
        "when they agree (1e-3 relative), contradicted by a jump",
        margin=1e-3,
    ),
    _check(
        "riemannian/prop-6.2-lower",
        'Sec. 6.2, remark: "evaluating at αinfer may even lower the loss"',
        "remark",
        "Evaluating trained weights at another alpha can lower the loss below its value at "
        "alpha_train; only the comparison with retraining is signed.",
        "on the toy loss: supported when a step of 1e-2 in alpha against dL/dalpha lowers "
        "L(W*(alpha_train), .)",
        margin=0.0,
    ),
    # -- 6.3 --------------------------------------------------------------------------------
    _check(
        "riemannian/conj-6.3-distance-dot",
        'Sec. 6.3, Conjecture 6.3: "coincides with standard dot-product attention only when '
        'key norms"',
        "remark",
        "At U_t = 0 the pure score is -||q_i - k_j||^2 / tau, whose attention equals dot-product "
        "attention (at temperature tau/2) when every key has the same norm, and differs when the "
        "norms differ.",
        "the library's score at U = 0 against -|q - k|^2/tau, and the two softmaxes: supported "
        "when equal within 1e-12 for equal key norms and apart by more than that for unequal",
    ),
    _check(
        "riemannian/euclidean-saddle",
        'Sec. 6.3, theoretical basis: "the Euclidean solution is a local minimum of the loss"',
        "remark",
        "The Euclidean point U_t = 0 is a local minimum of the Riemannian attention loss, so "
        "gradient descent routes around the metric.",
        "at the Euclidean optimum of a toy attention loss (W_Q trained, U = 0): supported when "
        "the Hessian in U is positive semidefinite (smallest eigenvalue >= -1e-10), "
        "contradicted when it has a negative eigenvalue",
        margin=1e-10,
    ),
    # -- 6.4 --------------------------------------------------------------------------------
    _check(
        "riemannian/eq-31",
        'Sec. 6.4, eq. (31): "the penalty vanishes once the floor is met"',
        "identity",
        "The anti-flatness penalty mean_t ReLU(kappa_min - ||U_t||_F^2) vanishes once every "
        "token is above the floor, is positive below it, and keeps the metric non-trivial.",
        "the library's eq. (31) against the explicit formula (1e-12), zero above the floor, "
        "positive below, and its gradient at U_t = 0",
    ),
    _check(
        "riemannian/eq-32-identity",
        'Sec. 6.4, eq. (32): "which never materializes the d×d matrices"',
        "identity",
        "||U_i U_i^T - U_j U_j^T||_F^2 = ||U_i^T U_i||_F^2 - 2 ||U_i^T U_j||_F^2 + "
        "||U_j^T U_j||_F^2.",
        "the library's r x r form against the materialised d x d difference: supported within "
        "1e-12 relative",
    ),
    _check(
        "riemannian/eq-32-cost",
        'Sec. 6.4, eq. (32): "the cost is only O(r²d) per pair"',
        "cost",
        "The pairwise metric distance of eq. (32) costs O(r^2 d) per pair, without d x d matrices.",
        "matrix-product FLOPs of the library's pair distance counted by torch's FlopCounterMode: "
        "supported when exactly 6 r^2 d at every (d, r) tried",
        margin=0.0,
    ),
    _check(
        "riemannian/eq-32-gram",
        'Sec. 6.4, eq. (32): "UiᵀUi=UjᵀUj does not imply gi=gj"',
        "remark",
        "Equal column Grams U^T U do not imply equal metrics, so the diversity term must compare "
        "U U^T.",
        "U_j = Q U_i with Q orthogonal: supported when U^T U agree (1e-12) and U U^T differ by "
        "more than 1e-6 relative",
    ),
    _check(
        "riemannian/eq-32-homogeneous",
        'Sec. 6.4, eq. (32): "this regularizer enforces that prerequisite"',
        "remark",
        "The diversity term is zero exactly on homogeneous metrics and negative otherwise, so "
        "minimising it enforces metric heterogeneity.",
        "the library's eq. (32) on one metric carried by different factors (must be 0 within "
        "1e-12 relative) and on random metrics (negative, equal to the materialised pair mean)",
    ),
    _check(
        "riemannian/eq-32-unbounded",
        'Sec. 6.4, on the missing upper bound: "can drive ‖Ut‖F2 to grow without bound"',
        "remark",
        "The diversity term alone has no lower bound: it keeps rewarding growth of ||U_t||_F^2.",
        "the library's eq. (32) along lam U: supported when it equals lam^4 L_div(U) with "
        "L_div(U) < 0 (1e-12 relative)",
    ),
    _check(
        "riemannian/eq-33",
        'Sec. 6.4, eq. (33): "The same O(r²d) identity applies"',
        "identity",
        "The smoothness term is the mean over adjacent positions of ||U_t U_t^T - U_{t+1} "
        "U_{t+1}^T||_F^2, computed by the r x r identity, and vanishes when adjacent metrics "
        "agree.",
        "the library's eq. (33) against the materialised mean (1e-12 relative) and on a "
        "sequence of one metric (0 within 1e-12)",
    ),
    claim_entry(
        "riemannian/design-tradeoff",
        'Sec. 6.4, design principle: "smoothness prevents collapse to noise"',
        "remark",
        "Anti-flatness prevents collapse to zero, diversity collapse to a homogeneous metric, "
        "smoothness collapse to noise; together they steer toward the regime of Conjecture 6.1.",
        C4,
        "P3: does the metric collapse, $U_t \\to 0$?",
        "",
        form="ill-posed",
        declared="'collapse to noise' and 'steer toward' name no measure",
        untested="the three collapse modes are not defined as measurable quantities; the "
        "checkable parts are registered separately (riemannian/eq-31: the floor has zero "
        "gradient at U_t = 0; riemannian/eq-32-homogeneous; riemannian/P3, riemannian/P4)",
    ),
    claim_entry(
        "riemannian/schedule",
        'Sec. 6.4, design principle: "The regularization weights should be scheduled"',
        "hypothesis",
        "Strong anti-flatness and diversity weights early, relaxed later, give better training "
        "than constant weights.",
        C4,
        "P3: does the metric collapse, $U_t \\to 0$?",
        "",
        form="superiority",
        margin=0.01,
        declared="validation bpc, constant weights minus the relaxed schedule: supported when "
        "the interval over seeds lies above 0.01 bpc; contradicted when below",
        untested=f"two FBT arms ({_TRAIN}): the library's RegularizerSchedule (relax from 30% to "
        "70% of training to 0.1 of the weight) against the same weights held constant, a "
        "dot-product control for scale; about 4 GPU-hours on one H100",
    ),
    _check(
        "riemannian/weight-decay-cap",
        'Sec. 6.4, on the missing upper bound: "or weight decay on the MetricNet parameters"',
        "remark",
        "Weight decay on MetricNet's parameters gives the diversity term the upper bound on "
        "||U_t||_F^2 it lacks, as an alternative to the cap (34).",
        "diversity plus weight decay along MetricNet's last layer scaled by lam: supported when "
        "the sum at lam = 1000 is no lower than at lam = 1 (bounded), contradicted when it "
        "falls",
        margin=0.0,
    ),
    # -- 6.5 --------------------------------------------------------------------------------
    claim_entry(
        "riemannian/conj-6.4-threshold",
        'Sec. 6.5, Conjecture 6.4: "above which the effective rank is maintained at Ω(r)"',
        "conjecture",
        "A threshold r_min(d, L), sublinear in L, exists below which the metric cannot prevent "
        "collapse and above which deep-layer effective rank stays Omega(r).",
        C4,
        "P6: metric rank ablation",
        "",
        form="ill-posed",
        declared="Omega(r) and 'sublinear' are asymptotic with no constants",
        untested="Omega(r) has no constant and 'sublinear in L' is a statement about L -> "
        "infinity; a finite proxy would be: pure Riemannian stacks (no residual) at r in "
        "{1, 2, 4, 8, 16}, L in {64, 256, 1024}, d = 64, 5 seeds, the rank r* at which "
        "deep-layer effective rank first exceeds 2, fitted against L; about 3 GPU-hours",
    ),
    claim_entry(
        "riemannian/conj-6.4-diversity",
        'Sec. 6.5, Conjecture 6.4: "increasing function of the metric rank r and the metric '
        'diversity"',
        "conjecture",
        "The anti-collapse benefit (deep-layer effective rank) increases with the metric "
        "diversity sigma_U^2.",
        C4,
        "P6: metric rank ablation",
        "",
        form="superiority",
        margin=1.0,
        declared="last-block effective rank, highest minus lowest diversity weight: supported "
        "when the interval lies above 1",
        untested=f"FBT arms ({_TRAIN}) at diversity weights {{0, 0.1, 1, 10}} with the cap, "
        "measuring the achieved sigma_U^2 and last-block effective rank, against an "
        "entropy-matched dot-product control; about 8 GPU-hours on one H100",
    ),
    # -- 6.6 open problems ------------------------------------------------------------------
    claim_entry(
        "riemannian/O1",
        'Sec. 6.6, O1: "Formal rank preservation in the super-critical regime"',
        "open problem",
        "Whether the singular values of A^Riem stay away from the degenerate spectrum when "
        "U-bar^2 exceeds Theta(tau/L) is open.",
        C2,
        "Where does the spectrum of $A$ move? (Conjecture 3.6)",
        "",
        form="ill-posed",
        declared="a proof question; a numerical probe can only suggest",
        untested="deciding it is a proof; the numerical probe would draw random q, k, U at "
        "L in {64, 256, 1024}, d = 64, r in {4, 16}, sweep U-bar^2 over 1e-3 to 1e3 times tau/L, "
        "100 draws each, and record sigma_2 of products of 32 such attention matrices (minutes "
        "on a CPU); the text's claim that Proposition 3.5 'settles' the sub-critical regime is "
        "registered as riemannian/conj-3.6-sub",
    ),
    claim_entry(
        "riemannian/O2",
        'Sec. 6.6, O2: "Optimization landscape of metric parameters"',
        "open problem",
        "Whether gradient descent on U_t reaches the heterogeneous regime or collapses without "
        "regularisation is open.",
        C4,
        "P3: does the metric collapse, $U_t \\to 0$?",
        "",
        form="ill-posed",
        declared="an open question, not a claim",
        untested="the empirical side is P3 and P4 (registered); a mean-field analysis is "
        "theory; the non-convexity it asserts is checked as riemannian/O2-nonconvex",
    ),
    _check(
        "riemannian/O2-nonconvex",
        'Sec. 6.6, O2: "The loss landscape for Ut is non-convex"',
        "remark",
        "The loss is non-convex in the metric factors U_t (through U_t U_t^T).",
        "the Hessian in U at U = 0 of a toy attention loss: supported when it has a negative "
        "eigenvalue (below -1e-8)",
        margin=1e-8,
    ),
    claim_entry(
        "riemannian/O3",
        'Sec. 6.6, O3: "Torsion–semantics correspondence"',
        "open problem",
        "Whether the torsion tensor T_t corresponds to directed semantic relations, and can be "
        "probed from trained models, is open.",
        C4,
        "Open problem O3: torsion and semantics",
        "",
        form="superiority",
        margin=0.05,
        declared="held-out accuracy of a linear probe of directed relations from T_t minus "
        "the same probe from hidden states: supported when the interval over seeds lies above "
        "0.05 (a 'formal correspondence' itself is a proof question)",
        untested="a probe would train word-level FBTs with TorsionNet (about 5M parameters, "
        "20k steps, 5 seeds), then fit a linear probe from T_t of word pairs to directed "
        "relations (hypernymy, cause) from a lexical resource, against a probe on the same "
        "pairs' hidden states and a shuffled-label control; about 10 GPU-hours",
    ),
    claim_entry(
        "riemannian/O4",
        'Sec. 6.6, O4: "Convergence of the metric-preconditioned FFN"',
        "open problem",
        "Whether the metric-preconditioned update of eq. (26) speeds up optimisation relative "
        "to the Euclidean FFN is open.",
        C4,
        "Open problem O4: the preconditioned FFN",
        "",
        form="superiority",
        margin=0.1,
        declared="steps to reach the Euclidean-FFN model's final validation bpc, as a log "
        "ratio (Euclidean over preconditioned): supported when the interval lies above 0.1",
        untested=f"two FBT arms differing only in Phase E ({_TRAIN}), plus a dot-product "
        "control; about 4 GPU-hours on one H100. Section 8.3's point that g^-1 never "
        "amplifies is checked as riemannian/precondition-contracts",
    ),
    claim_entry(
        "riemannian/O5",
        'Sec. 6.6, O5: "Metric rank selection"',
        "open problem",
        "An information-theoretic bound on the optimal r as a function of d, L and the data's "
        "semantic complexity is open.",
        C4,
        "P6: metric rank ablation",
        "",
        form="ill-posed",
        declared="'semantic complexity' is not defined",
        untested="a bound is a proof; its empirical face is P6 and riemannian/conj-6.4-threshold "
        "(registered)",
    ),
    claim_entry(
        "riemannian/O6",
        'Sec. 6.6, O6: "Rigorous differential-geometric formulation"',
        "open problem",
        "Formalising the Fiber Bundle Transformer as a true fibre bundle (structure group, "
        "discrete connection, curvature and torsion tensors) is open.",
        C4,
        "Open problem O6: a true fibre bundle",
        "",
        form="ill-posed",
        declared="a construction, not a measurable claim",
        untested="deciding it is a mathematical construction, not an experiment; no compute "
        "would settle it",
    ),
    # -- 7 related work ---------------------------------------------------------------------
    claim_entry(
        "riemannian/dong-residual",
        'Sec. 7, rank collapse: "partially mitigate but do not eliminate the collapse pressure"',
        "citation",
        "Dong et al. (2021) showed that residual connections and FFN sublayers partially "
        "mitigate but do not eliminate rank collapse.",
        C2,
        "Rank collapse in pure attention stacks",
        "",
        form="ill-posed",
        declared="'collapse pressure' is not a defined quantity",
        untested="'collapse pressure' has no definition; the cited work (dong2021attention in "
        "the book's bibliography) states in its abstract that skip connections and MLPs stop "
        "the output from degeneration, which is stronger than 'partially mitigate'",
    ),
    claim_entry(
        "riemannian/helm",
        'Sec. 7, hyperbolic embeddings: "each expert has a different fixed curvature"',
        "citation",
        "HELM (He et al. 2025) builds LLMs from Mixture-of-Curvature experts, each with its "
        "own fixed curvature, and constant-curvature approaches support neither per-token "
        "metrics nor torsion.",
        C10,
        _S,
        "",
        form="exact",
        declared="a bibliographic claim: true when the cited paper describes experts of fixed, "
        "distinct curvature",
        untested="the cited paper (arXiv:2505.24722) is not in the book's bibliography and no "
        "computation decides what it says; checking needs reading it",
    ),
    claim_entry(
        "riemannian/normformer",
        'Sec. 7, anti-rank-collapse methods: "NormFormer [14] normalizes query/key/value '
        'magnitudes"',
        "citation",
        "NormFormer, cited as [14], normalises query, key and value magnitudes.",
        C10,
        _S,
        "",
        form="exact",
        declared="a bibliographic claim: true when reference [14] is NormFormer and it "
        "normalises q, k, v",
        untested="not a computation, and not in the book's bibliography; as cited it is "
        "inconsistent: the seed's reference [14] is Narang et al. 2021 ('Do Transformer "
        "Modifications Transfer...'), not NormFormer, and NormFormer (Shleifer, Weston and "
        "Ott 2021, arXiv:2110.09456) adds a LayerNorm after attention, head-wise scaling of "
        "attention outputs and a LayerNorm inside the FFN, not q/k/v normalisation",
    ),
    claim_entry(
        "riemannian/rezero",
        'Sec. 7, anti-rank-collapse methods: "modify the strength of the skip connection"',
        "citation",
        "ReZero (Bachlechner et al. 2021) modifies the strength of the skip connection.",
        C10,
        _S,
        "",
        form="exact",
        declared="a bibliographic claim",
        untested="not a computation, and not in the book's bibliography; ReZero multiplies the "
        "residual branch by a learned scalar initialised at zero (x + a F(x)) and leaves the "
        "skip path itself at weight 1, so 'strength of the skip connection' is loose",
    ),
    _check(
        "riemannian/alibi",
        'Sec. 7, adaptive metrics: "giving a richer, pair-dependent structure"',
        "remark",
        "The metric correction Delta S of eq. (11) acts as a learned, content-dependent and "
        "pair-dependent bias, unlike ALiBi's fixed content-independent bias.",
        "Delta S from the library: supported when it changes with q, k at fixed positions and "
        "its double-centred part (not a per-query plus per-key term) exceeds 1e-6 relative",
        margin=1e-6,
    ),
    # -- 8 ----------------------------------------------------------------------------------
    claim_entry(
        "riemannian/sub-critical-theorem",
        'Sec. 8.2: "the sub-critical regime there is a theorem, not a conjecture"',
        "remark",
        "That collapse proceeds in the sub-critical regime is a theorem (Proposition 3.5).",
        C2,
        "Proposition 3.5 and eq. (13) on random instances",
        "",
        form="ill-posed",
        declared="Proposition 3.5 bounds ||Delta S||_F only",
        untested="Proposition 3.5 bounds the score perturbation; no result in the paper "
        "carries the bound through softmax and depth to rank collapse, and Section 3's own "
        "Conjecture 3.6 states the sub-critical behaviour as conjecture (registered as "
        "riemannian/conj-3.6-sub)",
    ),
    _check(
        "riemannian/precondition-contracts",
        'Sec. 8.3, limitations: "it never amplifies compressed directions"',
        "remark",
        "With g_t = I + U_t U_t^T >= I, the preconditioner g_t^-1 only shrinks updates along "
        "stretched directions and never amplifies any, while I + U U^T - V V^T could.",
        "the library's preconditioned update: supported when no |g^-1 v|/|v| exceeds 1 + 1e-12, "
        "directions orthogonal to U are untouched (1e-12), and the alternative has an "
        "eigenvalue below 1",
    ),
    _check(
        "riemannian/specific-input",
        'Sec. 8.3, limitations: "a d′=O(d) factorization trivially exists"',
        "remark",
        "For a specific input with L <= d, the L x L score matrix has rank at most L and an "
        "exact factorisation of width L = O(d).",
        "a heterogeneous score matrix with L = d: supported when a width-L factorisation "
        "reproduces it within 1e-10 relative",
        margin=1e-10,
    ),
    _check(
        "riemannian/stochastic-products",
        'Sec. 8.4, conclusion: "products of such matrices converge to rank-1"',
        "remark",
        "Products of row-stochastic (softmax) attention matrices converge to rank one.",
        "Dobrushin's coefficient of a product of 40 softmax matrices of random scores: "
        "supported when below 1e-8 and under the sub-multiplicative bound (Seneta 2006)",
        margin=1e-8,
    ),
]
