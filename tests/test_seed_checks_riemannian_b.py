"""The register's own checks of Sections 4 and 5 of the Riemannian attention paper
(``attention_atlas.claims.riemannian_b``, ``attention_atlas.experiments.seed_checks.riemannian_b``):
the outcomes through the register, and a negative control for every check."""

from __future__ import annotations

import pytest
import torch

from attention_atlas.attention.riemannian import geodesic_scores_dense, transport_dense
from attention_atlas.claims import CLAIMS, evaluate
from attention_atlas.claims import riemannian_b as claims_b
from attention_atlas.experiments.seed_checks import riemannian_b as sc
from attention_atlas.experiments.seed_checks.riemannian_b import PREFIX as P

CONTRADICTED = {
    "prop-4.3-metricnet-cost",
    "eq-20-component",
    "sec-5.3-first-order",
    "sec-5.5-dot-symmetric",
    "eq-23-tau",
    "eq-23-penalty",
    "sec-5.6-torsion-isometry",
    "eq-27-model",
    "eq-28-mismatch",
}
NOT_TESTED = {
    "eq-18": "ill-posed",
    "sec-5.1-curvature-torsion": "ill-posed",
    "sec-5.4-sufficient": "ill-posed",
    "sec-5.2-content": "not run",
    "sec-5.2-init-stability": "not run",
}


@pytest.fixture(scope="module")
def outcomes():
    keys = {c.key for c in claims_b.CLAIMS}
    mine = [c for c in CLAIMS if c.key in keys]
    assert len(mine) == len(keys) == len(claims_b.CLAIMS)
    return evaluate(mine)


def test_register_outcomes(outcomes) -> None:
    assert len(claims_b.CLAIMS) >= 20
    for c in claims_b.CLAIMS:
        name = c.key.removeprefix(P)
        o = outcomes[c.key]
        if name in NOT_TESTED:
            assert o.outcome == "not tested" and o.reason == NOT_TESTED[name], c.key
            assert not c.module and c.untested
        elif name in CONTRADICTED:
            assert o.outcome == "contradicted", (c.key, o.summary)
        else:
            assert o.outcome == "supported", (c.key, o.summary)
        if c.module:
            assert c.form == "exact" and o.form == "exact" and o.witness, c.key


def test_every_checked_claim_has_an_outcome() -> None:
    out = sc.outcomes()
    checked = {c.key for c in claims_b.CLAIMS if c.module}
    assert set(out) == checked


# -- negative controls: the check rejects a wrong instance (or, for a contradicted claim, accepts
#    the instance on which the claim would hold, so the contradiction is not the check's bias) --

CONTROLS = [
    # (check, kwargs of the wrong / positive-control instance)
    (sc.check_woodbury_example, {"d": 2048}),
    (sc.check_woodbury_example, {"stated": (2.6e5, 6.9e10, 1e6)}),
    (sc.check_woodbury_general, {"sign": 1.0}),
    (sc.check_precompute_cost, {"per_token": lambda d, r: 2 * r}),
    (sc.check_heads_sum, {"D": 40}),
    (
        sc.check_inversion_cost,
        {"fn": lambda h, U, u: h + (U @ U.mT @ U @ U.mT @ u[..., None])[..., 0]},
    ),
    (sc.check_eq17, {"same_metric": True}),
    (sc.check_ephemeral_geometry, {"swap": True}),
    (sc.check_metricnet_params, {"formula": lambda d, r, m: d * int(round(d * m)) * (1 + r)}),
    (sc.check_metric_dof, {"stated": lambda d, r: d * r}),
    (sc.check_metricnet_init, {"init_std": 1.0}),
    (sc.check_euclidean_start, {"normalise_keys": False}),
    (sc.check_gate, {"gamma_init": -2.0}),
    (sc.check_sqrt_identity, {"power": 1.0}),
    (sc.check_curvature_proxy, {"proxy": lambda U, b: b * U.pow(2).sum((-1, -2))}),
    (sc.check_perturbation_magnitude, {"power": 1.0}),
    (sc.check_curvature_not_scalar, {"slope": 0.0}),
    (sc.check_torsion_antisymmetric, {"build": lambda a, b: a @ b.T + b @ a.T}),
    (sc.check_so_d_surjective, {"pairs": 2}),
    (sc.check_collapse_modules, {"root": False}),
    (sc.check_eq25_identity, {"symmetric_part": 0.1}),
    (sc.check_eq25_psd_rank, {"rank_bound": 3}),
    (sc.check_eq25_second_order, {"symmetric_part": 1.0}),
    (sc.check_cayley, {"kind": "linear"}),
    (sc.check_eq26, {"fn": lambda h, U, u: h + u}),
    (sc.check_spectrum, {"sign": -0.05}),
    (sc.check_steepest_ascent, {"candidate": "euclidean"}),
    (sc.check_hybrid_scores, {"baseline": "distance"}),
    (sc.check_eq28, {"cross": 1.0}),
    (sc.check_distance_baseline, {"baseline": "dot"}),
]

POSITIVE = [  # contradicted claims: the instance on which the statement does hold passes
    (sc.check_projection_component, {"orthonormal": True}),
    (sc.check_sqrt_first_order, {"same_token": True}),
    (sc.check_dot_symmetric, {"tied": True}),
    (sc.check_tau_matches_dot, {"factor": 2.0}),
    (sc.check_omega_query_side, {"side": "key"}),
    (sc.check_torsion_isometry, {"with_transport": False}),
    (sc.check_hybrid_model, {"strip": True}),
    (sc.check_eq28_mismatch, {"tau_factor": 2.0}),
]


@pytest.mark.parametrize(("check", "kwargs"), CONTROLS, ids=lambda x: getattr(x, "__name__", ""))
def test_negative_control(check, kwargs) -> None:
    assert check()["passed"]
    assert not check(**kwargs)["passed"]


@pytest.mark.parametrize(("check", "kwargs"), POSITIVE, ids=lambda x: getattr(x, "__name__", ""))
def test_contradicted_check_can_pass(check, kwargs) -> None:
    assert not check()["passed"]
    assert check(**kwargs)["passed"]


def test_metricnet_cost_control() -> None:
    """The growth test behind the MetricNet contradiction accepts an O(d r) cost (Phase E's
    Woodbury count over d r^2 does not grow) and its count is exact."""
    c = sc.check_metricnet_cost()
    assert not c["passed"] and c["exact"] and c["growth"] > 4
    assert sc.check_inversion_cost()["passed"]
    assert sc.check_metricnet_cost(dims=(64, 64))["passed"]


def test_cayley_cost_control() -> None:
    c = sc.check_cayley_cost()
    assert c["passed"]
    dense = sc.check_cayley_cost(
        fn=lambda a, b, x: (transport_dense(a, b, "cayley") @ x[..., None])[..., 0]
    )
    assert not dense["passed"]


def test_never_materialised_control() -> None:
    assert sc.check_never_materialised()["passed"]
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(4, 12, generator=g, dtype=torch.float64) for _ in range(2))
    U = torch.randn(4, 12, 2, generator=g, dtype=torch.float64)
    dense = sc.check_never_materialised(lambda: geodesic_scores_dense(q, k, U, 1.0))
    assert not dense["passed"] and dense["n_bad"] > 0


def test_flash_control() -> None:
    assert sc.check_flash_remark()["passed"]
    assert not sc.check_flash_remark(method="reference")["passed"]
    assert sc.check_flash_remark(method="lowrank")["passed"]  # query blocks of L/4: (L/4, L)
