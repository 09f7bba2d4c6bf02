"""Register entries read off the seed text (see ``attention_atlas.experiments.seed_checks``):
the statements of the matroidal, cofactor and structured-masked-attention seeds that the chapters'
own claims (``matroidal.py``, ``cofactor.py``, ``sma.py``) leave out, in reading order."""

from __future__ import annotations

from .core import C5, C6, C7, C10, Claim, claim_entry

_MOD = "seed_checks.cards"
_SEC = "The register's own checks"


def _check(key: str, source: str, kind: str, statement: str, *, margin: float,
           declared: str) -> Claim:  # fmt: skip
    """An entry decided by a float64 check in :mod:`attention_atlas.experiments.seed_checks.cards`."""
    return claim_entry(key, source, kind, statement, C10, _SEC, _MOD, form="exact",
                       margin=margin, declared=declared)  # fmt: skip


CLAIMS: list[Claim] = [
    # -- Matroidal Mahalanobis attention ------------------------------------------------------
    _check(
        "matroidal/softplus-nonneg",
        '(1) Integration point and (3): "learn only the coefficient vector"; "Computed from the '
        'paper: coefficient nonnegativity"',
        "proposition",
        "Learning theta with l_e = softplus(theta_e) keeps every metric weight nonnegative for "
        "any real theta, and every positive weight is reachable.",
        margin=1e-12,
        declared="softplus over theta in [-1000, 1000] (float64) never negative, and "
        "softplus(inverse-softplus(l)) = l to 1e-12 relative for l in [1e-8, 1e3]; any negative "
        "weight contradicts it",
    ),
    _check(
        "matroidal/eps-ridge",
        '(1) Integration point: "use a small fixed" epsilon, such as 1e-4',
        "remark",
        "The fixed eps |x|^2 term makes the metric positive definite with smallest eigenvalue "
        "at least eps; with graph-incidence columns (which all miss the all-ones direction) it is "
        "exactly eps, and without the ridge the metric is only semidefinite.",
        margin=1e-12,
        declared="lambda_min(M) = eps (to 1e-12 of |M|) for ring, knn and complete incidence "
        "supports, and lambda_min = 0 at eps = 0; a smaller lambda_min contradicts it",
    ),
    _check(
        "matroidal/pseudocode-exact",
        '(2) Pseudocode: "This is exactly" x^T M x "applied to pairwise differences"',
        "identity",
        "The pseudocode's dist (the weighted squared covector differences plus eps times the "
        "squared Euclidean difference) equals (z_i - z_j)^T M (z_i - z_j) with the materialised "
        "M = A diag(softplus(theta)) A^T + eps I, so logits = -dist / (2 tau).",
        margin=1e-12,
        declared="the library's pseudocode logits against the quadratic form of an explicitly "
        "built M on every pair, relative error <= 1e-12 in float64",
    ),
    claim_entry(
        "matroidal/tau-eps",
        '(3): "Estimated empirically: $\\tau$, $\\varepsilon$"',
        "open problem",
        "The temperature tau and the ridge eps of the matroidal metric are left to be chosen "
        "empirically (no value is derived).",
        C5,
        "Open: the temperature and the ridge",
        "",
        form="superiority",
        declared="a tuned (tau, eps) beats the defaults (tau = sqrt(d), eps = 1e-4) by at least "
        "0.02 validation bpc; no tuned pair doing so leaves the defaults standing",
        untested="deciding it takes a grid tau in {0.5, 1, 2} x sqrt(d), eps in {1e-6, 1e-4, "
        "1e-2} for the 2-layer, 8-head char-PTB model (d_model 128), 3 seeds each at 20k steps, "
        "against the defaults: 27 runs of about 0.5 GPU-hour, some 14 GPU-hours",
    ),
    _check(
        "matroidal/prune-tu",
        '(3): optionally prune columns with l_e < delta and "compare the resulting sparse model"',
        "remark",
        "Pruning the columns with l_e < delta keeps A a graph-incidence matrix, so the pruned "
        "sparse model keeps the total-unimodularity guarantee, and its metric equals the full "
        "one with the pruned weights set to zero.",
        margin=1e-14,
        declared="the pruned matrix passes the exhaustive total-unimodularity check, and its "
        "metric matches the zeroed full metric to 1e-14 relative; either failing contradicts it",
    ),
    _check(
        "matroidal/m-sweep-feasible",
        '(3) "restrict $A$ to graph-incidence columns" and (4) "Sweep $m\\in\\{d,2d,4d\\}$"',
        "remark",
        "The sweep m in {d, 2d, 4d} can be run with distinct graph-incidence columns, of which "
        "there are d(d-1)/2 on d coordinates, so only at head dimension d >= 9.",
        margin=0.0,
        declared="the library's graph families admit all three m exactly at the d where "
        "d(d-1)/2 >= 4d (counted over d = 3..64); any disagreement contradicts it",
    ),
    _check(
        "matroidal/matched-params",
        '(4) First experiment: "approximately matched parameter count"',
        "remark",
        "At matched hidden dimension, dot-product, dense-Mahalanobis and matroidal attention "
        "(m in {d, 2d, 4d}) have approximately matched attention parameter counts.",
        margin=0.05,
        declared="the library modules' parameter counts at hidden 128, 8 heads within 5% of "
        "dot-product attention's (and equal to the closed form 4D^2 + H d^2 or 4D^2 + H m); "
        "a larger gap contradicts it",
    ),
    _check(
        "matroidal/fewer-params",
        '(4) success criteria: "with fewer metric parameters"',
        "cost",
        "At matched head dimension the matroidal metric has fewer parameters (H m, m in "
        "{d, 2d, 4d}) than the dense learned metric (H d^2).",
        margin=0.0,
        declared="the library modules' metric parameters counted at hidden 128, 8 heads: "
        "matroidal below dense for every m and both equal to their closed forms",
    ),
    claim_entry(
        "matroidal/low-param",
        '(4) hypothesis: "low-data or low-parameter settings"',
        "hypothesis",
        "The structured metric is most useful in low-parameter settings: its gain over the "
        "dense metric is larger for smaller models.",
        C5,
        "Open: the gain against model size",
        "",
        form="superiority",
        declared="an interaction: validation-bpc gain of matroidal over dense at d_model 32 "
        "minus at d_model 256; supported when larger by 0.02 bpc or more",
        untested="deciding it takes the dense and matroidal arms (m = 2d) at d_model in {32, 64, "
        "128, 256}, 2 layers, 8 heads, char-PTB, 3 seeds at 20k steps each: 24 runs, about 10 "
        "GPU-hours, with the dot-product arm as the training-scale control",
    ),
    # -- Cofactor-stable attention --------------------------------------------------------------
    _check(
        "cofactor/matrix-tree",
        'Idea description: treat attention "as a graph transition matrix" and form L = I - A',
        "identity",
        "Each principal cofactor c_i of L = I - A is the weighted sum, over the spanning trees "
        "in which every token has an attention path to token i, of the product of their "
        "attention weights (the directed matrix-tree theorem).",
        margin=1e-12,
        declared="c_i from the determinants against an enumeration of all in-trees at n = 5, "
        "relative 1e-12; the opposite orientation must fail",
    ),
    _check(
        "cofactor/weak-access",
        'Idea description: "tokens with weak global access" to the rest of the layer',
        "proposition",
        "A token's cofactor vanishes exactly when some token has no attention path to it, so "
        "the cofactor vector flags tokens the rest of the layer cannot reach.",
        margin=1e-12,
        declared="on sparse row-stochastic patterns, c_i > 1e-12 exactly for the tokens every "
        "token reaches (transitive closure of A > 0); any mismatch contradicts it",
    ),
    _check(
        "cofactor/general-L",
        'Mathematical statement: "applies to any n by n matrix" L with L 1 = 0 and rank n - 1',
        "theorem",
        "For any L with zero row sums and rank n - 1 (negative off-diagonal entries and complex "
        "eigenvalues allowed), c^T L = 0 and sum_i c_i equals the product of the nonzero "
        "eigenvalues.",
        margin=1e-12,
        declared="both identities on a random real L with zero row sums, relative 1e-12; the "
        "rank hypothesis is probed at rank n - 2",
    ),
    _check(
        "cofactor/row-stochastic",
        'Key formulas and Mathematical statement: "A is row-stochastic, so" A 1 = 1',
        "identity",
        "The row-wise softmax A makes every row sum to one: A 1 = 1.",
        margin=1e-15,
        declared="|A 1 - 1| <= 4 n u (u = 2^-53) for softmax of logits of scale 10; a "
        "column-normalised matrix must fail",
    ),
    _check(
        "cofactor/zero-eigenvalue",
        'Mathematical statement: L = I - A "has a guaranteed zero eigenvalue"',
        "proposition",
        "Because A is row-stochastic, L = I - A always has the eigenvalue 0 with eigenvector 1.",
        margin=1e-13,
        declared="smallest |eigenvalue| of L <= 1e-13 and |L 1| at round-off; a substochastic "
        "A must fail",
    ),
    _check(
        "cofactor/softmax-rank",
        'Mathematical statement: "rank(L) = n - 1" and "For an attention matrix A"',
        "remark",
        "A softmax attention matrix meets the construction's hypotheses: its entries are "
        "positive, so rank(I - A) = n - 1.",
        margin=1e-8,
        declared="the two smallest singular values of L: the last at round-off and the "
        "second-last above 1e-8 of the largest at moderate logits; the float64 underflow case "
        "is reported beside it",
    ),
    _check(
        "cofactor/pi-stationary",
        'Key formulas: pi_i = (max(c_i, 0) + eps) / sum_j(...); Implementation notes: "Normalize '
        'positive cofactors into pi"',
        "remark",
        "The eps-smoothed normalised cofactors pi estimate the stationary distribution of the "
        "head (the Mathematical statement's c_i / sum of positive cofactors).",
        margin=1e-6,
        declared="|pi - c / sum c|_1 <= 1e-6 on a mixing head, and the deviation equals its "
        "closed form eps |1 - n s|_1 / (m + n eps) to 1e-6 relative (a difference of numbers "
        "of size 1/n: round-off allows no tighter); the nearly reducible case is reported beside "
        "it",
    ),
    _check(
        "cofactor/grad",
        'Implementation notes: "Backpropagate through the determinant values"',
        "algorithm",
        "The regulariser -log(|sum c| + eps) is differentiable through the principal minors' "
        "determinants, and its gradient is the analytic derivative of the margin.",
        margin=1e-9,
        declared="autograd of the library's penalty (minors and fast LU) with respect to the "
        "logits Z against the closed form d e_{n-1}(L)/dL = sum_j (-1)^j e_{n-2-j} (L^j)^T "
        "through the softmax, relative 1e-9",
    ),
    _check(
        "cofactor/minors-float64",
        'Implementation notes: "explicitly form each principal minor"; "Use float64 for this '
        'diagnostic branch"',
        "algorithm",
        "For sequences up to 32 tokens, explicit principal minors in float64 give the cofactors "
        "accurately.",
        margin=1e-10,
        declared="the library's minors at n = 32 against the closed form c = alpha^(n-1) p of "
        "A = (1 - alpha) I + alpha 1 p^T for alpha in {0.5, 0.01, 0.001}, relative 1e-10",
    ),
    _check(
        "cofactor/slogdet",
        'Implementation notes: "or use slogdet and reconstruct c_i" from sign times exp',
        "algorithm",
        "Computing each minor by slogdet and reconstructing c_i = sign exp(log|det|) is an "
        "alternative to running the diagnostic branch in float64.",
        margin=1e-4,
        declared="in float32 (the precision it would replace float64 in), the reconstructed "
        "cofactors match the closed form alpha^(n-1) p to 1e-4 relative at n = 32 for a mixing "
        "(alpha = 0.5) and a self-attending (alpha = 0.01) head; a larger error contradicts it",
    ),
    claim_entry(
        "cofactor/alpha",
        'Implementation notes: "with alpha between 1e-4 and 1e-3"',
        "remark",
        "A regulariser weight alpha in [1e-4, 1e-3] is the useful range.",
        C6,
        "Open: the regulariser weight",
        "",
        form="superiority",
        declared="validation loss at the best alpha in [1e-4, 1e-3] better by 0.02 than at both "
        "1e-5 and 1e-2",
        untested="deciding it takes an alpha sweep {1e-5, 1e-4, 3e-4, 1e-3, 1e-2} plus the "
        "unregularised control on the six-layer WikiText-2 model, 3 seeds at 20k steps: 18 "
        "runs, about 20 GPU-hours",
    ),
    claim_entry(
        "cofactor/isolating-heads",
        'Idea description: heads that isolate token groups "produce unstable or poorly '
        'propagated representations"',
        "hypothesis",
        "Heads that isolate token groups produce unstable or poorly propagated representations.",
        C6,
        "Open: what isolating heads do",
        "",
        form="superiority",
        declared="across trained heads, the lowest-margin decile shows higher gradient-norm "
        "variance and lower effective rank of its outputs than the rest, by 10% or more",
        untested="deciding it takes per-head margins, output effective rank and gradient "
        "statistics logged over training of the six-layer model (5 seeds, 20k steps, about 5 "
        "GPU-hours), plus an intervention (forcing a head reducible) to separate cause from "
        "correlation",
    ),
    # -- Structured masked attention ------------------------------------------------------------
    claim_entry(
        "sma/structured-efficient",
        'Introduction: "one can most often apply multiplication" with M efficiently',
        "remark",
        "When the mask L is structured, multiplication with M = L o B is most often efficient.",
        C7,
        "1. Masked attention and the low-rank mask identity",
        "",
        form="ill-posed",
        declared="none possible as written: it would need a definition of a structured mask "
        "and a cost bound that every such mask meets",
        untested="'structured', 'most often' and 'efficiently' are undefined, and the seed's own "
        "next example (the all-ones lower-triangular mask, efficient only when B is structured: "
        "sma/unstructured-quadratic) shows a structured mask alone does not suffice",
    ),
    _check(
        "sma/causal-cumsum",
        'Introduction: the lower-triangular all-ones mask, "viewed as a weighted cumulative sum"',
        "identity",
        "With L the lower-triangular all-ones matrix, (L o B) x is the weighted cumulative sum "
        "y_i = sum_{j <= i} B_ij x_j (the plain cumulative sum when B is all ones).",
        margin=1e-12,
        declared="the library's masked attention against an explicit loop and torch.cumsum, "
        "relative 1e-12; an upper-triangular mask must fail",
    ),
    _check(
        "sma/unstructured-quadratic",
        'Introduction: "it is not efficient unless" B itself has some structure',
        "cost",
        "For an unstructured B the causal masked product depends on all T(T+1)/2 lower entries "
        "of B, so any exact method reads quadratically many inputs.",
        margin=0.0,
        declared="the Jacobian of (L o B) x with respect to B is nonzero on exactly T(T+1)/2 "
        "entries for x without zeros",
    ),
    _check(
        "sma/causal-lowrank",
        'Introduction: B = U V^T makes "a semiseparable matrix for which multiplication" is linear',
        "proposition",
        "tril(U V^T) is semiseparable (every block on and below the diagonal has rank <= p) and "
        "its product is computed by prefix sums in work linear in T.",
        margin=1e-12,
        declared="prefix-sum product against the dense one (relative 1e-12), every lower block "
        "of rank <= p, and counted work exactly linear over T = 32, 64, 128",
    ),
    _check(
        "sma/recurrence-linear",
        'Section 1: "by simply iterating forwards in time" the states in linear time',
        "cost",
        "Iterating the SSM forward in time computes the states of A^-1 B x with work linear in "
        "T for a fixed state size.",
        margin=1e-12,
        declared="recurrence states against a dense solve (relative 1e-12) and counted work "
        "affine in T over T = 16, 32, 64 (second difference zero)",
    ),
    _check(
        "sma/invertible-needed",
        'Section 1: "assume that each transition matrix" A_i is invertible',
        "remark",
        "The generator representation of A^-1 needs invertible transitions, although the block "
        "bidiagonal A is always invertible and its inverse always semiseparable.",
        margin=1e-12,
        declared="with one singular A_i: det A = 1, the blocks of A^-1 are the transition "
        "products and the recurrence agrees (1e-12), while the generators fail (non-finite or "
        "off by O(1)); with invertible A_i the generators agree",
    ),
    _check(
        "sma/kron-orderings",
        'Section 2: "depending on how we organize the states"',
        "identity",
        "The time-major (a kron I_n) and state-major (I_n kron a) orderings of the scalar "
        "dynamics are one perfect shuffle apart and give the same SSM output.",
        margin=1e-12,
        declared="P (a kron I) P^T = I kron a exactly for the commutation matrix P, and the two "
        "orderings' outputs agree to 1e-12 relative",
    ),
    _check(
        "sma/kron-inverse",
        'Section 2: "the inverse of a Kronecker product" is the product of the inverses',
        "identity",
        "(X kron Y)^-1 = X^-1 kron Y^-1, so (I_n kron a)^-1 = I_n kron a^-1.",
        margin=1e-12,
        declared="both sides built densely for random invertible X and the bidiagonal a, "
        "relative 1e-12; the swapped order must fail",
    ),
    _check(
        "sma/bidiagonal-semiseparable",
        'Section 2: "the inverse of a bidiagonal matrix is semiseparable"',
        "proposition",
        "The inverse of the unit lower-bidiagonal a is lower triangular with entries "
        "a_s ... a_{t-1} and every block on and below the diagonal of rank <= 1, even when some "
        "a_i = 0.",
        margin=1e-12,
        declared="inverse against the closed form (relative 1e-12) and lower-block ranks <= 1, "
        "with and without a zero a_i",
    ),
    _check(
        "sma/scalar-needed",
        'Section 2: scalar-times-identity dynamics "in order for the mask to be structured"',
        "remark",
        "The scalar restriction is what makes one structured mask: with per-state dynamics the "
        "mask implied by M o/ (C B^T) is no longer 1-semiseparable.",
        margin=1e-8,
        declared="the implied mask's lower blocks have rank 1 for scalar dynamics and numerical "
        "rank >= 2 (sigma_2 / sigma_1 > 1e-8) for distinct per-state dynamics",
    ),
    claim_entry(
        "sma/mamba2-citation",
        'Section 2: "The SSM in the Mamba-2 paper restricts" the dynamics [1]',
        "citation",
        "Mamba-2 (Dao and Gu 2024) restricts the SSM dynamics to scalar-times-identity.",
        C7,
        "3. Scalar dynamics: the SSM is structured masked attention",
        "",
        form="exact",
        declared="supported if the cited paper's SSD layer uses A_t = a_t I (one scalar per "
        "step and head), contradicted if its dynamics are diagonal or dense",
        untested="a statement about another paper: deciding it takes reading Dao and Gu (2024), "
        "'Transformers are SSMs', where the SSD layer sets A_t = a_t I; no computation here can",
    ),
]
