"""The register's own checks of the Riemannian seed's abstract and Sections 1-3
(``attention_atlas.experiments.seed_checks.riemannian_a``): every outcome through the register,
and for every check a negative control that the check rejects."""

from __future__ import annotations

import math

import pytest
import torch

from attention_atlas.attention.riemannian import (
    MetricNet,
    geodesic_features,
    geodesic_scores,
    geodesic_scores_dense,
    pairwise_metric,
    token_metric,
)
from attention_atlas.claims import CLAIMS, evaluate
from attention_atlas.claims.riemannian_a import CLAIMS as MINE
from attention_atlas.experiments.seed_checks import riemannian_a as ra
from attention_atlas.linalg import singular_values, sym_pack

F64 = torch.float64
P = "riemannian/"

SUPPORTED = {
    "collapse-independent-of-gram", "cor-3.3-bounds-dont-carry", "residual-prevents-doubly-exp",
    "intro-metric-dof", "prop-3.7-dim", "prop-3.7-bottleneck", "prop-3.7-metricnet-params",
    "def-3.1-spd", "eq-5", "thm-3.2-cross-terms", "thm-3.2-vec-identity", "thm-3.2-span-sym",
    "eq-11", "softmax-1-lipschitz", "nash-dimension",
}  # fmt: skip
CONTRADICTED = {
    "dong-euclidean-cause", "open-problem-O1", "dong-unconditional", "row-stochastic-products",
    "remark-3.7-euclidean-coupled", "thm-3.2-span-2-suffices", "conj-3.4-sigma-u",
    "row-stochastic-spectrum-scale", "conj-3.6-sigma2-suffices", "sec-2.3-widening",
    "nash-widening", "kappa-curvature",
}  # fmt: skip
NOT_TESTED = {
    "dong-rate-eq-2", "intro-deep-layers-low-rank", "not-training-artifact",
    "qualitative-expressivity", "nash-kuiper-c1", "nash-nonconstructive", "function-words-flat",
}  # fmt: skip


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.fixture(scope="module")
def outcomes():
    keys = {c.key for c in MINE}
    return evaluate([c for c in CLAIMS if c.key in keys])


def test_every_claim_has_its_expected_outcome(outcomes):
    assert set(outcomes) == {P + k for k in SUPPORTED | CONTRADICTED | NOT_TESTED}
    assert len(MINE) >= 25
    for k in SUPPORTED:
        assert outcomes[P + k].outcome == "supported", (k, outcomes[P + k].summary)
    for k in CONTRADICTED:
        assert outcomes[P + k].outcome == "contradicted", (k, outcomes[P + k].summary)
    for k in NOT_TESTED:
        assert outcomes[P + k].outcome == "not tested", k
    for k, o in outcomes.items():
        if o.outcome != "not tested":
            assert o.form == "exact" and o.witness, k


def test_smoke_gives_the_same_outcomes(outcomes):
    smoke = ra.outcomes(smoke=True)
    for k, o in smoke.items():
        assert o.outcome == outcomes[k].outcome, k


# ---- negative controls: each check rejects a wrong instance ------------------------------


def test_collapse_checks_reject_a_stack_that_keeps_its_rank():
    H = torch.randn(16, 4, generator=gen(), dtype=F64)
    # identity layers (row-stochastic with zeros) keep the residual: "collapsed" is false
    assert ra.product_residual([torch.eye(16, dtype=F64)] * 10, H) > 0.5
    # one layer is not enough to collapse: the predicate residual < 1e-12 fails
    U = torch.randn(16, 4, 2, generator=gen(1), dtype=F64)
    one = ra.collapse_stack(H, U, 1, entry=20.0, generator=gen(2))
    assert one["residual"][-1] > 1e-12 and one["dobrushin_ok"]
    # Dobrushin's inequality is tight enough to fail with a smaller coefficient
    A = torch.softmax(torch.randn(16, 16, generator=gen(3), dtype=F64) * 3, -1)
    Hd = torch.randn(16, 4, generator=gen(4), dtype=F64)
    diam = lambda X: float((X[:, None] - X[None]).norm(dim=-1).max())  # noqa: E731
    assert diam(A @ Hd) <= ra.dobrushin(A) * diam(Hd)
    assert ra.dobrushin(torch.eye(16, dtype=F64)) == 1.0
    assert diam(A @ Hd) > 0.01 * ra.dobrushin(A) * diam(Hd)


def test_fixed_point_rejects_a_wrong_value_matrix():
    good, bad = ra.fixed_point_measure(1.0), ra.fixed_point_measure(1.0, value_scale=1.6)
    assert good["error"] < 1e-12 and good["erank"] > 1.9
    assert bad["error"] > 1e-6  # a W_V off by 2.6%: no fixed point, so no counterexample


def test_products_check_passes_positive_matrices():
    pos = torch.softmax(torch.randn(6, 6, generator=gen(), dtype=F64), -1)
    assert ra.product_residual([pos] * 41, torch.randn(6, 3, generator=gen(1), dtype=F64)) < 1e-9


def test_dong_order_separates_the_two_score_kinds():
    S = torch.randn(5, 1, dtype=F64) + torch.randn(1, 5, dtype=F64)
    assert float(ra.double_centre(S).abs().max()) < 1e-14
    assert abs(ra.dong_order("dot", gen(3)) - 2) < 1e-3
    assert abs(ra.dong_order("riemannian", gen(3)) - 2) > 0.5  # rejected as a bilinear order


def test_residual_check_rejects_the_pure_stack():
    H = torch.randn(16, 4, generator=gen(), dtype=F64)
    U = torch.zeros(16, 4, 1, dtype=F64)
    rd = ra.collapse_stack(H, U, 10, kind="dot", entry=0.0, generator=gen(1))["residual"]
    ratios = [math.log(rd[i + 1]) / math.log(rd[i]) for i in range(len(rd) - 1)
              if 1e-13 < rd[i + 1] and rd[i] < 0.5]  # fmt: skip
    assert max(ratios) >= 1.5


def test_dof_ranks_reject_wrong_constants():
    jr = ra.distance_jacobian_ranks(21, 4, 2, gen())
    assert jr == {"vector": 4, "full_metric": 10, "factor": 7}
    assert jr["full_metric"] != 4 * 4 and jr["factor"] != 4 * 2
    assert ra.metric_image_dim(6, 2, gen(1)) != 6 * 2
    small = ra.distance_jacobian_ranks(4, 8, 2, gen(2))
    assert small["vector"] == 3  # full: the Euclidean coupling claim fails here
    assert jr["vector"] < 20  # ... and holds with more than d others


def test_bottleneck_and_parameter_count_reject_wrong_instances():
    wide = MetricNet(dim=18, n_heads=1, head_dim=6, rank=3).double()
    h = torch.randn(1, 1, 18, generator=gen(), dtype=F64)
    J = torch.autograd.functional.jacobian(lambda x: wide(x).flatten(), h).reshape(18, 18)
    assert int(torch.linalg.matrix_rank(J)) > 6  # an 18-dimensional input is no bottleneck
    m = MetricNet(dim=16, n_heads=1, head_dim=16, rank=2)
    n = sum(p.numel() for p in m.parameters())
    assert n == 16 * 16 + 16 + 16 * 16 * 2 + 16 * 2
    assert n != 16 * 16 + 16 * 16 * 2  # without the biases


def test_spd_and_pair_metric_reject_wrong_metrics():
    U = 10 * torch.randn(5, 6, 2, generator=gen(), dtype=F64)
    assert float(torch.linalg.eigvalsh(token_metric(U)).min()) >= 1 - 1e-9
    bad = torch.eye(6, dtype=F64) - U @ U.transpose(-1, -2)
    assert float(torch.linalg.eigvalsh(bad).min()) < 1 - 1e-9
    Ue = torch.randn(5, 4, 2, generator=gen(1), dtype=F64)
    A = Ue @ Ue.transpose(-1, -2)
    one_sided = torch.eye(4, dtype=F64) + A[:, None].expand(5, 5, 4, 4)
    assert float((pairwise_metric(Ue) - one_sided).abs().max()) > 1e-13


def test_theorem_3_2_checks_reject_wrong_instances():
    q = torch.randn(40, 4, generator=gen(), dtype=F64)
    k = torch.randn(40, 4, generator=gen(1), dtype=F64)
    shared = torch.randn(1, 4, 1, generator=gen(2), dtype=F64).expand(40, 4, 1)
    ct = ra.cross_term_ranks(q, k, shared)
    assert ct["rank_square"] == 1 != 10  # one shared metric: no obstruction
    U = torch.randn(40, 4, 1, generator=gen(3), dtype=F64)
    A = U @ U.transpose(-1, -2)
    kk = k[:, :, None] * k[:, None, :]
    Qm = torch.einsum("ja,iab,jb->ij", k, A, k)
    rows, cols = torch.triu_indices(4, 4)
    unweighted = A[:, rows, cols] @ kk[:, rows, cols].T  # packing without the weights
    assert float((Qm - unweighted).abs().max() / Qm.abs().max()) > 1e-3
    assert ra.span_dim(U[:1].expand(10, 4, 1)) == 1


def test_span_and_sigma_checks_pass_generic_metrics():
    q = torch.randn(80, 5, generator=gen(), dtype=F64)
    k = torch.randn(80, 5, generator=gen(1), dtype=F64)
    U = torch.randn(80, 5, 2, generator=gen(2), dtype=F64)
    assert ra.score_rank(geodesic_scores(q, k, U, 1.0)) > 3 * 5
    assert float(U.pow(2).sum((1, 2)).var()) > 1e-25


def test_eq_11_rejects_the_wrong_sign():
    q = torch.randn(8, 5, generator=gen(), dtype=F64)
    k = torch.randn(8, 5, generator=gen(1), dtype=F64)
    U = torch.randn(8, 5, 2, generator=gen(2), dtype=F64)
    S_r = geodesic_scores_dense(q, k, U, 1.7)
    S_e = geodesic_scores(q, k, torch.zeros(8, 5, 1, dtype=F64), 1.7)
    diff = q[:, None] - k[None]
    pi = torch.einsum("idr,ijd->ijr", U, diff).pow(2).sum(-1)
    pj = torch.einsum("jdr,ijd->ijr", U, diff).pow(2).sum(-1)
    dS = -(pi + pj) / 3.4
    assert float((S_r - S_e - dS).abs().max() / dS.abs().max()) < 1e-13
    assert float((S_r - S_e + dS).abs().max() / dS.abs().max()) > 1


def test_lipschitz_check_rejects_an_expanding_map():
    fast = ra.softmax_lipschitz_measure(40, 8, gen(), lambda s: 10 * torch.softmax(s, -1))
    assert fast["lipschitz"] > 1


def test_spectrum_and_sigma2_checks_pass_the_identity():
    assert float(singular_values(torch.eye(16, dtype=F64))[0]) <= 1 + 1e-9
    H = torch.randn(16, 3, generator=gen(), dtype=F64)
    assert ra.product_residual([torch.eye(16, dtype=F64)] * 300, H) > 1e-6


def test_widening_rejects_other_metrics():
    q = torch.randn(60, 5, generator=gen(), dtype=F64)
    k = torch.randn(60, 5, generator=gen(1), dtype=F64)
    U = torch.randn(60, 5, 2, generator=gen(2), dtype=F64)
    assert ra.widening_error(q, k, U, 1.3)["error"] < 1e-12
    qh, kh = geodesic_features(q, k, U, 1.3)
    other = torch.softmax(geodesic_scores_dense(q, k, 1.01 * U, 1.3), -1)
    assert float((torch.softmax(qh @ kh.T, -1) - other).abs().max()) > 1e-12


def test_nash_order_rejects_a_small_manifold():
    assert not 3.5 <= math.log10(10 * (3 * 10 + 11) / 2) <= 4.5


def test_flat_metric_rejects_the_unmapped_points():
    U = 3 * torch.randn(6, 2, generator=gen(), dtype=F64)
    x = torch.randn(30, 6, generator=gen(1), dtype=F64)
    assert ra.flat_metric_measure(U, x)["isometry_error"] < 1e-9
    assert ra.flat_metric_measure(U, x, mapped=False)["isometry_error"] > 1e-9


def test_sym_pack_of_the_identity():
    assert float(sym_pack(torch.eye(2, dtype=F64)).sum()) == 2.0
