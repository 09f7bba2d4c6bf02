"""Chapter 2's perturbation experiments: Proposition 3.5 and eq. (13) against eq. (11) written
out, the sigma_2 study against numpy's singular values, and the onset verdict on synthetic data
with known answers."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import explicit_geodesic_scores

from attention_atlas.attention.riemannian.diagnostics import perturbation_entry_scale
from attention_atlas.experiments.rank_collapse import perturbation as pt

DT = torch.float64


# ---- Proposition 3.5 and eq. (13) ------------------------------------------------------------


def test_instance_has_the_requested_largest_factor_norm():
    g = torch.Generator().manual_seed(0)
    q, k, U = pt.instance(12, 5, 3, 0.37, 1.0, generator=g)
    kappa = (U**2).sum((-1, -2))
    assert float(kappa.max()) == pytest.approx(0.37, rel=1e-12)
    assert float(kappa.min()) >= 0.37 / 3 - 1e-12  # heterogeneous: within a factor 3
    assert torch.allclose(q.norm(dim=-1), torch.ones(12, dtype=DT))
    _, _, U = pt.instance(12, 5, 3, 0.37, 1.0, generator=g, heterogeneous=False)
    assert torch.allclose((U**2).sum((-1, -2)), torch.full((12,), 0.37, dtype=DT))


def test_perturbation_chain_matches_eq11_and_eq12_written_out():
    g = torch.Generator().manual_seed(5)
    L, d, tau = 6, 3, 0.8
    q, k, U = pt.instance(L, d, 2, 2.0, tau, generator=g, unit=False)
    chain = pt.perturbation_chain(q, k, U, tau)
    dS = torch.empty(L, L, dtype=DT)
    for i in range(L):
        for j in range(L):
            x = q[i] - k[j]
            dS[i, j] = -(float((U[i].T @ x) @ (U[i].T @ x)) + float((U[j].T @ x) @ (U[j].T @ x))) / (2 * tau)  # fmt: skip  # eq. (11)
    M = max(float((q[i] - k[j]) @ (q[i] - k[j])) for i in range(L) for j in range(L))
    ubar2 = max(float((U[t] ** 2).sum()) for t in range(L))
    assert chain["dS"] == pytest.approx(float(dS.pow(2).sum().sqrt()), rel=1e-12)
    assert chain["bound"] == pytest.approx(L * ubar2 * M / tau, rel=1e-12)
    euc = -((q[:, None] - k[None]) ** 2).sum(-1) / tau
    dA = torch.softmax(euc + dS, -1) - torch.softmax(euc, -1)
    assert chain["dA_F"] == pytest.approx(float(dA.pow(2).sum().sqrt()), rel=1e-10)
    assert chain["dA_op"] == pytest.approx(float(np.linalg.norm(dA.numpy(), 2)), rel=1e-10)


def test_perturbation_checks_satisfy_every_inequality_of_eq13():
    checks = pt.perturbation_checks(25, generator=torch.Generator().manual_seed(0))
    assert len(checks) == 25
    slack = 1 + 1e-12
    assert (checks["dS"] <= checks["bound"] * slack).all()
    assert (checks["dA_F"] <= 0.5 * checks["dS"] * slack + 1e-15).all()  # Jacobian norm <= 1/2
    assert (checks["sv_gap"] <= checks["dA_op"] * slack + 1e-15).all()
    assert (checks["dA_op"] <= checks["dA_F"] * slack + 1e-15).all()
    assert pt.eq12_13_hold(checks)
    # and the check fails when a step of the chain is broken
    assert not pt.eq12_13_hold(checks.assign(dS=checks["bound"] * 1.01))
    assert not pt.eq12_13_hold(checks.assign(dA_F=checks["dS"] * 0.6 + 1e-9))
    assert np.allclose(checks["dS_over_bound"], checks["dS"] / checks["bound"], rtol=1e-15)
    assert checks["L"].between(4, 96).all() and checks["d"].between(2, 16).all()


# ---- sigma_2 against the entry scale ---------------------------------------------------------


def test_entry_grid_and_unit_instance():
    assert pt.entry_grid(1e-2, 1e2, 2) == pytest.approx([10.0**e for e in (-2, -1.5, -1, -0.5, 0, 0.5, 1, 1.5, 2)])  # fmt: skip
    with pytest.raises(ValueError, match="0 < low < high"):
        pt.entry_grid(1.0, 0.5)
    q, k, U1 = pt.unit_instance(12, 3, d=5, r=2, tau=0.7)
    assert torch.allclose(q.norm(dim=-1), torch.ones(12, dtype=DT))
    M = max(float((q[i] - k[j]) @ (q[i] - k[j])) for i in range(12) for j in range(12))
    ubar2 = max(float((U1[t] ** 2).sum()) for t in range(12))
    assert ubar2 * M / 0.7 == pytest.approx(1.0, rel=1e-12)  # entry scale 1, written out
    q2, _, U2 = pt.unit_instance(12, 3, d=5, r=2, tau=0.7)  # its own generator: reproducible
    assert torch.equal(q, q2) and torch.equal(U1, U2)


def test_sigma2_study_against_numpy_singular_values_and_explicit_scores():
    study = pt.sigma2_study([6, 9], [0, 1], [1e-2, 3.0], d=3, r=2, tau=0.8)
    assert len(study) == 2 * 2 * 2
    for (L, seed), part in study.groupby(["L", "seed"]):
        q, k, U1 = pt.unit_instance(L, seed, d=3, r=2, tau=0.8)
        A_e = torch.softmax(-((q[:, None] - k[None]) ** 2).sum(-1) / 0.8, -1).numpy()
        for row in part.itertuples():
            U = U1 * math.sqrt(row.entry_scale)
            assert float(perturbation_entry_scale(q, k, U, 0.8)) == pytest.approx(row.entry_scale, rel=1e-12)  # fmt: skip
            S = explicit_geodesic_scores(q, k, U, 0.8)
            A_r = torch.softmax(S, -1).numpy()
            s_r = np.linalg.svd(A_r, compute_uv=False)[1]
            s_e = np.linalg.svd(A_e, compute_uv=False)[1]
            assert row.sigma2_riem == pytest.approx(s_r, rel=1e-9)
            assert row.sigma2_euc == pytest.approx(s_e, rel=1e-9)
            assert row.change == pytest.approx(s_r - s_e, abs=1e-12)
            assert row.bound == pytest.approx(L * row.entry_scale)
            assert row.dA_F == pytest.approx(np.linalg.norm(A_r - A_e), rel=1e-9)
    with pytest.raises(ValueError, match="lengths must be"):
        pt.sigma2_study([0], [0], [1.0])
    with pytest.raises(ValueError, match="scales must be"):
        pt.sigma2_study([4], [0], [-1.0])


def test_study_samples_arrange_seeds_by_scale():
    study = pt.sigma2_study([6], [0, 1, 2], [0.1, 1.0], d=3, r=1)
    xs, series = pt.study_samples(study, "change", absolute=True)
    assert list(xs) == [0.1, 1.0] and list(series) == ["L=6"]
    table = series["L=6"]
    assert table.shape == (3, 2)
    row = study[(study["seed"] == 2) & (study["entry_scale"] == 1.0)].iloc[0]
    assert table[2, 1] == abs(row["change"])
    with pytest.raises(ValueError, match="column must be"):
        pt.study_samples(study, "nope")


def test_onset_interpolates_linearly_against_log_scale():
    s = [1.0, 10.0, 100.0]
    w = (0.05 - 0.02) / (0.2 - 0.02)
    assert pt.onset(s, [0.0, -0.02, 0.2]) == pytest.approx(10.0 ** (1 + w), rel=1e-12)
    assert math.isnan(pt.onset(s, [0.0, 0.01, 0.04]))
    assert pt.onset(s, [0.3, 0.4, 0.5]) == 1.0
    with pytest.raises(ValueError, match="one length"):
        pt.onset(s, [0.1, 0.2])
    with pytest.raises(ValueError, match="L must be"):
        pt.unit_instance(1, 0)


def synthetic_onsets(slopes: dict[int, float], lengths=(32, 64, 128, 256)) -> pd.DataFrame:
    rows = [
        {"L": L, "seed": seed, "s_onset": 20.0 * (L / 32) ** b}
        for seed, b in slopes.items()
        for L in lengths
    ]
    return pd.DataFrame(rows)


def test_onset_slopes_recover_known_power_laws():
    found = synthetic_onsets({0: -1.0, 1: 0.0, 2: 0.3})
    slopes = pt.onset_slopes(found)
    assert slopes.to_dict() == pytest.approx({0: -1.0, 1: 0.0, 2: 0.3}, abs=1e-12)
    found.loc[(found["seed"] == 1) & (found["L"] == 64), "s_onset"] = float("nan")
    assert list(pt.onset_slopes(found).index) == [0, 2]  # a seed that never moved is left out


@pytest.mark.parametrize(
    ("slopes", "outcome"),
    [
        ({0: -1.02, 1: -0.97, 2: -1.0, 3: -0.99}, "supported"),  # Theta(tau/L): slope -1
        ({0: 0.21, 1: 0.18, 2: 0.25, 3: 0.2}, "contradicted"),  # one score entry: slope ~0
        ({0: -1.5, 1: 0.6, 2: -0.9, 3: 0.2}, "not resolved"),  # too noisy to tell
        ({0: -1.0, 1: -1.0}, "not tested"),  # two instance sets are not a verdict
    ],
)
def test_transition_verdict_on_synthetic_slopes(slopes, outcome):
    v = pt.transition_verdict(pt.onset_slopes(synthetic_onsets(slopes)))
    assert v.outcome == outcome, v.reason
    assert v.sesoi == pt.SESOI["onset_slope"] and v.direction == -1


def test_eq13_checks_hold_on_a_study_and_fail_on_a_broken_one():
    study = pt.sigma2_study([8, 16], [0, 1], pt.entry_grid(1e-5, 10.0, 2), d=4, r=2)
    res = pt.eq13_checks(study)
    assert res["holds"] and res["linear"] and res["n"] == len(study)
    assert res["n_sub"] == int((study["bound"] <= pt.SUBCRITICAL_BOUND).sum()) > 0
    assert 0 < res["tightness_median"] <= res["tightness_max"] < 0.5
    # a sigma_2 change larger than ||A_R - A_E||_F breaks Weyl's step
    assert not pt.eq13_checks(study.assign(change=study["dA_F"] * 1.5 + 1e-9))["holds"]
    # a change that does not grow with the metric is not a linear response
    assert not pt.eq13_checks(study.assign(change=1e-6))["linear"]


def test_spectrum_pair_sets_M_and_the_strength_exactly():
    p = pt.spectrum_pair(0.3, 2.5, L=10, d=4, r=2, tau=0.5, seed=1, top=4)
    assert p["entry_scale"] == pytest.approx(0.3 * 2.5, rel=1e-12)  # U-bar^2 / tau times M
    assert p["bound"] == pytest.approx(10 * 0.3 * 2.5, rel=1e-12)
    assert len(p["sigma_euc"]) == 4 and p["sigma_euc"][0] >= 1 - 1e-12  # row-stochastic
    assert p["change"] == pytest.approx(p["sigma_riem"][1] - p["sigma_euc"][1])
    zero = pt.spectrum_pair(0.0, 2.5, L=10, d=4, r=2, tau=0.5, seed=1)
    assert np.allclose(zero["sigma_riem"], zero["sigma_euc"], atol=1e-14)
    with pytest.raises(ValueError, match="M must be"):
        pt.spectrum_pair(0.3, 0.0)
