"""The register's own checks of the matroidal, cofactor and SMA seeds
(``attention_atlas.claims.cards``, ``attention_atlas.experiments.seed_checks.cards``): each
outcome through the register, and for every check a wrong instance it rejects."""

from __future__ import annotations

import time

import pytest
import torch

from attention_atlas.claims import CLAIMS, evaluate
from attention_atlas.claims import cards as card_claims
from attention_atlas.experiments.seed_checks import cards as sc
from attention_atlas.threads import intra_op_threads

KEYS = {c.key for c in card_claims.CLAIMS}
CONTRADICTED = {"cofactor/slogdet"}
UNTESTED = {
    "matroidal/tau-eps",
    "matroidal/low-param",
    "cofactor/alpha",
    "cofactor/isolating-heads",
    "sma/structured-efficient",
    "sma/mamba2-citation",
}


@pytest.fixture(autouse=True)
def one_thread():
    with intra_op_threads(1):
        yield


def test_register_outcomes() -> None:
    mine = [c for c in CLAIMS if c.key in KEYS]
    assert len(mine) == len(KEYS) >= 15
    out = evaluate(mine)
    for key, o in out.items():
        if key in UNTESTED:
            assert o.outcome == "not tested", key
        elif key in CONTRADICTED:
            assert o.outcome == "contradicted", (key, o.summary)
        else:
            assert o.outcome == "supported", (key, o.summary)
            assert o.witness, key
    assert set(sc.outcomes()) == {c.key for c in mine if c.module}


def test_keys_new_and_prefixed() -> None:
    others = [c.key for c in CLAIMS if c.key not in KEYS]
    assert not KEYS & set(others)
    assert all(k.split("/")[0] in ("matroidal", "cofactor", "sma") for k in KEYS)


def test_fast() -> None:
    t = time.perf_counter()
    sc.outcomes()
    assert time.perf_counter() - t < 2.0


# -- every check passes on its instance and rejects a wrong one -------------------------------
NEGATIVE = {
    "softplus": (sc.check_softplus, dict(coef=lambda t: t)),
    "eps_ridge": (sc.check_eps_ridge, dict(shift=2e-4)),
    "pseudocode": (sc.check_pseudocode, dict(perturb=1e-6)),
    "prune": (sc.check_prune, dict(family="sparse_random")),
    "m_sweep": (sc.check_m_sweep, dict(count=lambda d: d * d)),
    "matched_params": (sc.check_matched_params, dict(H=2)),
    "fewer_params": (sc.check_fewer_params, dict(D=16, H=4, graph="sparse_random")),
    "matrix_tree": (sc.check_matrix_tree, dict(orient="out")),
    "weak_access": (sc.check_weak_access, dict(reverse=True)),
    "general_L": (sc.check_general_L, dict(row_shift=0.1)),
    "row_stochastic": (sc.check_row_stochastic, dict(dim=0)),
    "zero_eigenvalue": (sc.check_zero_eigenvalue, dict(scale=0.999)),
    "softmax_rank": (sc.check_softmax_rank, dict(spread=800.0)),
    "pi": (sc.check_pi, dict(formula_eps=1e-7)),
    "grad": (sc.check_grad, dict(terms=3)),
    "minors_float64": (sc.check_minors_float64, dict(dtype=torch.float32)),
    "causal_cumsum": (sc.check_causal_cumsum, dict(lower=False)),
    "unstructured": (sc.check_unstructured, dict(diagonal=-1)),
    "causal_lowrank": (sc.check_causal_lowrank, dict(dense=True)),
    "recurrence": (sc.check_recurrence, dict(dense=True)),
    "invertible": (sc.check_invertible, dict(singular=None)),
    "kron_orderings": (sc.check_kron_orderings, dict(shuffle=False)),
    "kron_inverse": (sc.check_kron_inverse, dict(swap=True)),
    "bidiagonal_inverse": (
        sc.check_bidiagonal_inverse,
        dict(matrix=torch.tril(torch.randn(8, 8, dtype=torch.float64))),
    ),
    "scalar_needed": (sc.check_scalar_needed, dict(distinct=False)),
}


def test_every_check_has_a_negative_control() -> None:
    checks = {n.removeprefix("check_") for n in sc.__all__ if n.startswith("check_")}
    assert checks == set(NEGATIVE) | {"slogdet"}


@pytest.mark.parametrize("name", sorted(NEGATIVE))
def test_check_passes_and_rejects_wrong_instance(name: str) -> None:
    fn, wrong = NEGATIVE[name]
    assert fn().passed, name
    assert not fn(**wrong).passed, name


def test_slogdet_contradicted_but_passable() -> None:
    """The float32 reconstruction fails on a self-attending head (the cofactors underflow) but
    the same check passes on a mixing head, and in float64 on both."""
    c = sc.check_slogdet()
    assert not c.passed
    assert c.v["errs"][0.01] == pytest.approx(1.0)  # every cofactor underflowed to zero
    assert c.v["logdet_err"][0.01] < 1e-3  # log|det| itself was fine
    assert sc.check_slogdet(torch.float32, (0.5,)).passed
    assert sc.check_slogdet(torch.float64).passed


def test_count_work_sees_matrix_vector_products() -> None:
    A, x = torch.randn(5, 5), torch.randn(5)
    assert sc.count_work(lambda: A @ x) == 2 * 25
    assert sc.count_work(lambda: torch.einsum("ij,j->i", A, x)) == 2 * 25
    assert sc.count_work(lambda: x.cumsum(0)) == 5
