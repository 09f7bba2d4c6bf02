"""The register's float64 checks of Sections 6 to 8 of the Riemannian-attention paper
(``attention_atlas.experiments.seed_checks.riemannian_c``): each outcome through the register,
and for every check a wrong instance it rejects (a negative control)."""

from __future__ import annotations

import math

import pytest
import torch

from attention_atlas.claims import CLAIMS, evaluate
from attention_atlas.claims import riemannian_c as part
from attention_atlas.experiments.seed_checks import riemannian_c as sc

DT = torch.float64
KEYS = {c.key for c in part.CLAIMS}

CONTRADICTED = {
    "riemannian/kappa-homogeneous",
    "riemannian/a1-differentiable",
    "riemannian/euclidean-saddle",
    "riemannian/weight-decay-cap",
}


@pytest.fixture(scope="module")
def outcomes():
    mine = [c for c in CLAIMS if c.key in KEYS]
    assert len(mine) == len(KEYS) >= 20
    return evaluate(mine)


def test_every_outcome_of_the_part_is_as_expected(outcomes) -> None:
    for c in part.CLAIMS:
        o = outcomes[c.key]
        if not c.module:
            assert o.outcome == "not tested", c.key
            assert o.reason == ("ill-posed" if c.form == "ill-posed" else "not run"), c.key
        elif c.key in CONTRADICTED:
            assert o.outcome == "contradicted", (c.key, o.summary)
        else:
            assert o.outcome == "supported", (c.key, o.summary)
        if c.module:
            assert o.form == "exact" and o.witness, c.key


def _r(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=DT)


def test_kappa_check_accepts_a_shared_metric_and_rejects_constant_kappa() -> None:
    U = sc.constant_kappa_factors(12, 3)
    assert not sc.kappa_homogeneous_check(U)["passed"]
    assert sc.kappa_homogeneous_check(U[:1].expand(12, 3, 1).contiguous())["passed"]


def test_proposition_6_2_rejects_a_toy_without_geometry() -> None:
    good = sc.blend_mismatch_check(sc.ToyBlend(_r(5, 2, 1, seed=11) * 0.8))
    null = sc.blend_mismatch_check(sc.ToyBlend(torch.zeros(5, 2, 1, dtype=DT)))
    assert min(good["gaps"]) > 0 and good["eq30_error"] < 1e-6 and good["lowered"] < 0
    assert max(abs(g) for g in null["gaps"]) <= 1e-12  # (29) fails: nothing to gain
    assert null["c_norm"] <= 1e-12 and null["lowered"] == 0.0
    # eq. (30) with the wrong sign is rejected: the slope is not +H^-1 c
    assert good["eq30_wrong_sign"] > 1.0


def test_nonconvex_and_smoothness_checks_reject_convex_and_smooth_functions() -> None:
    assert not sc.nonconvex_check(lambda z: (z * z).sum(), 3)["passed"]
    assert sc.nonconvex_check(lambda z: torch.cos(z).sum(), 3)["passed"]
    assert sc.a1_smoothness_check(lambda x: x**3, 0.7)["passed"]
    assert not sc.a1_smoothness_check(lambda x: torch.relu(x) ** 2, 0.0)["passed"]


def test_distance_dot_check_rejects_unequal_key_norms() -> None:
    q, k = _r(6, 3, seed=1), _r(6, 3, seed=2)
    assert not sc.distance_dot_check(q, k)["passed"]
    assert sc.distance_dot_check(q, k / k.norm(dim=-1, keepdim=True))["passed"]


def test_euclidean_point_is_a_saddle_unless_an_l2_penalty_is_added() -> None:
    bare = sc.euclidean_point_check()
    assert not bare["passed"] and bare["grad_u"] <= 1e-14 and bare["cross"] <= 1e-12
    assert bare["second_difference"] < 0
    assert sc.euclidean_point_check(l2=1.0 + abs(bare["min_eig"]))["passed"]


def test_anti_flatness_check_rejects_a_wrong_floor() -> None:
    U = _r(10, 4, 2, seed=3) * 0.5
    assert sc.anti_flatness_check(U, 2.0)["passed"]
    wrong = lambda u, m: torch.relu(m - u.norm(dim=(-1, -2))).mean()  # noqa: E731
    assert not sc.anti_flatness_check(U, 2.0, loss=wrong)["passed"]


def test_diversity_checks_reject_wrong_formulas() -> None:
    Ui, Uj = _r(4, 6, 2, seed=4), _r(4, 6, 2, seed=5)
    assert sc.diversity_identity_check(Ui, Uj)["passed"]
    minus_one = lambda a, b: (  # noqa: E731
        (a.mT @ a).square().sum((-1, -2)) - (a.mT @ b).square().sum((-1, -2))
        + (b.mT @ b).square().sum((-1, -2)))  # fmt: skip
    assert not sc.diversity_identity_check(Ui, Uj, dist=minus_one)["passed"]
    assert sc.diversity_cost_check()["passed"]
    assert not sc.diversity_cost_check(dist=sc.lowrank_gram_distance_sq_dense)["passed"]
    U = _r(6, 2, seed=6)
    assert sc.gram_vs_metric_check(U, sc._orthogonal(6, torch.Generator().manual_seed(0)))["passed"]
    assert not sc.gram_vs_metric_check(U, torch.eye(6, dtype=DT))["passed"]
    hom, het = sc.homogeneous_factors(8, 5, 2), _r(8, 5, 2, seed=7)
    assert sc.diversity_homogeneous_check(hom, het)["passed"]
    factors = lambda u: -((u[:, None] - u[None]) ** 2).sum() / 56  # noqa: E731
    assert not sc.diversity_homogeneous_check(hom, het, loss=factors)["passed"]
    assert sc.diversity_scaling_check(het)["passed"]
    assert not sc.diversity_scaling_check(het, loss=lambda u: -(u * u).sum())["passed"]
    assert sc.smoothness_check(het)["passed"]
    wrong = lambda u: sc.curvature_smoothness_loss(u) * 7 / 8  # noqa: E731
    assert not sc.smoothness_check(het, loss=wrong)["passed"]


def test_weight_decay_check_accepts_a_quartic_penalty() -> None:
    assert not sc.weight_decay_check()["passed"]
    quartic = lambda m: 10.0 * sum((p * p).sum() for p in m.parameters()) ** 2  # noqa: E731
    assert sc.weight_decay_check(quartic)["passed"]


def test_alibi_precondition_specific_and_product_checks_reject_wrong_instances() -> None:
    q, k, U = _r(7, 3, seed=8), _r(7, 3, seed=9), _r(7, 3, 2, seed=10)
    assert sc.alibi_check(q, k, U)["passed"]
    assert not sc.alibi_check(q, k, torch.zeros_like(U))["passed"]
    Up = _r(6, 2, seed=11)
    assert sc.precondition_check(Up)["passed"]
    amplify = lambda h, u, v: h + v + (u @ (u.mT @ v.unsqueeze(-1))).squeeze(-1)  # noqa: E731
    assert not sc.precondition_check(Up, apply=amplify)["passed"]
    S = sc.geodesic_scores(_r(4, 4, seed=12), _r(4, 4, seed=13), _r(4, 4, 2, seed=14), 1.0)
    assert sc.specific_input_check(S, 4)["passed"]
    assert not sc.specific_input_check(S, 3)["passed"]
    assert sc.stochastic_product_check(sc.softmax_stack(40, 6))["passed"]
    assert not sc.stochastic_product_check([torch.eye(6, dtype=DT)] * 40)["passed"]
    grow = sc.stochastic_product_check(sc.softmax_stack(40, 6, growth=1.0))
    assert not grow["passed"] and grow["bound_holds"] and not math.isnan(grow["delta"])
