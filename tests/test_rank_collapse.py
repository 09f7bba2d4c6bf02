"""Chapter 2's experiments: Proposition 3.5 and eq. (13), the sigma_2 sweep and its onsets,
and pure attention stacks (Dong et al. 2021) with Riemannian scores, against explicit references."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from attention_atlas import linalg, stats
from attention_atlas.experiments import experiment
from attention_atlas.experiments import rank_collapse as rc
from attention_atlas.sweep import load_results, make_cells, run_sweep

DT = torch.float64
TOL = 1e-10


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def explicit_geodesic_scores(q: torch.Tensor, k: torch.Tensor, U: torch.Tensor, tau: float):
    """``-(q_i - k_j)^T (I + (U_i U_i^T + U_j U_j^T) / 2) (q_i - k_j) / tau``, pair by pair."""
    L, d = q.shape
    S = torch.empty(L, L, dtype=q.dtype)
    for i in range(L):
        for j in range(L):
            g = torch.eye(d, dtype=q.dtype) + (U[i] @ U[i].T + U[j] @ U[j].T) / 2
            x = q[i] - k[j]
            S[i, j] = -(x @ g @ x) / tau
    return S


# ---- pure attention stacks --------------------------------------------------------------------


def test_pure_attention_stack_shapes_and_row_stochastic_mixing():
    g = torch.Generator().manual_seed(0)
    h0 = torch.randn(2, 10, 6, generator=g, dtype=DT)
    for score in ("dot", "euclidean", "homogeneous", "heterogeneous"):
        H = rc.pure_attention_stack(h0, 3, score=score, strength=5.0, generator=g)  # type: ignore[arg-type]
        assert H.shape == (4, 2, 10, 6)
        assert torch.equal(H[0], h0)
    # identical tokens stay identical: a row-stochastic A maps 1 x^T to 1 (x W)^T
    same = torch.randn(1, 6, generator=g, dtype=DT).expand(10, 6)
    H = rc.pure_attention_stack(same, 2, score="heterogeneous", generator=g)
    assert float(linalg.relative_residual(H[-1])) < 1e-12


@pytest.mark.parametrize("score", ["homogeneous", "heterogeneous"])
def test_pure_attention_stack_metric_strength_is_the_mean_squared_factor_norm(score):
    # E ||U_t||_F^2 = strength, over 2000 independent layers' factor draws. Tokens of norm ~8 and
    # strength 7 (not 1), so a missing normalisation of h_t or a missing square root shows.
    g = torch.Generator().manual_seed(3)
    h = 3.0 * torch.randn(6, 8, generator=g, dtype=DT)
    strength, draws = 7.0, 2000
    kappa = torch.stack(
        [
            (rc.metric_factors(h, score, rank=4, strength=strength, generator=g) ** 2).sum((-1, -2))
            for _ in range(draws)
        ]
    )  # (draws, L): ||U_t||_F^2 per draw and token
    mean = stats.mean_interval(kappa.mean(-1).numpy(), level=0.999)
    assert mean.low <= strength <= mean.high, f"E ||U_t||_F^2 = {mean.format(3)}, not {strength}"
    assert mean.half_width < 0.03 * strength  # the check resolves a 3 % error in the scale


def test_a_stack_layer_is_eq1_with_the_geodesic_score_of_its_factors():
    # H^1 = softmax(S) H^0 W_V with S built pair by pair from the drawn W_Q, W_K and factors U
    h0 = torch.randn(7, 5, generator=torch.Generator().manual_seed(1), dtype=DT)
    for score in ("dot", "euclidean", "homogeneous", "heterogeneous"):
        H = rc.pure_attention_stack(
            h0, 1, score=score, rank=2, strength=3.0, tau=1.3,
            generator=torch.Generator().manual_seed(4),
        )  # fmt: skip
        g = torch.Generator().manual_seed(4)
        wq, wk, wv = (torch.randn(5, 5, generator=g, dtype=DT) / math.sqrt(5) for _ in range(3))
        q, k, v = h0 @ wq, h0 @ wk, h0 @ wv
        if score == "dot":
            S = q @ k.T / math.sqrt(5)
        else:
            U = rc.metric_factors(h0, score, rank=2, strength=3.0, generator=g)
            S = explicit_geodesic_scores(q, k, U, 1.3)
        A = torch.exp(S - S.max(-1, keepdim=True).values)
        assert rel(H[1], (A / A.sum(-1, keepdim=True)) @ v) < TOL, score


def test_pure_attention_stack_at_zero_strength_is_the_euclidean_stack():
    h0 = torch.randn(8, 5, generator=torch.Generator().manual_seed(1), dtype=DT)
    runs = [
        rc.pure_attention_stack(
            h0, 2, score=s, strength=0.0, generator=torch.Generator().manual_seed(2)
        )  # type: ignore[arg-type]
        for s in ("euclidean", "homogeneous", "heterogeneous")
    ]
    # the metric draws consume the generator differently, so compare layer 1 only (same W_Q, W_K, W_V)
    assert rel(runs[1][1], runs[0][1]) < TOL and rel(runs[2][1], runs[0][1]) < TOL
    with pytest.raises(ValueError, match="score must be"):
        rc.pure_attention_stack(h0, 1, score="cosine")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="depth must be"):
        rc.pure_attention_stack(h0, -1)


def test_collapse_layer_and_doubly_exponential_growth():
    assert rc.collapse_layer([1.0, 1e-5, 1e-13, 0.0]) == 2
    assert rc.collapse_layer([1.0, 0.5, 0.1]) == 3  # never: one past the last layer
    # res_l = exp(-2^l): log res doubles per layer; the step to exp(-32) < 1e-12 (round-off
    # territory) is left out
    res = [math.exp(-(2.0**layer)) for layer in range(6)]
    growth = rc.log_residual_growth(res)
    assert growth == pytest.approx([2.0] * 4, rel=1e-12)
    # res_l = exp(-l - 1): an exponential decay grows log res by (l + 2) / (l + 1) -> 1
    slow = rc.log_residual_growth([math.exp(-layer - 1.0) for layer in range(5)])
    assert slow == pytest.approx([(layer + 2) / (layer + 1) for layer in range(4)], rel=1e-12)


# ---- the grid and the sweep runner -----------------------------------------------------------


def test_chapter_grid_names_every_stack_and_run_cell_measures_it():
    grid = rc.chapter_grid(strengths=[2.0, 30.0], length=9, dim=4, depth=5, rank=2)
    assert list(grid) == [
        "dot", "euclidean", "homogeneous kappa=2", "heterogeneous kappa=2",
        "homogeneous kappa=30", "heterogeneous kappa=30",
    ]  # fmt: skip
    assert grid["heterogeneous kappa=30"] == {
        "score": "heterogeneous", "strength": 30.0, "length": 9, "dim": 4, "depth": 5, "rank": 2,
    }  # fmt: skip
    cell = rc.run_cell(grid["dot"], seed=3)
    # the input layer's residual, from the composite norm written out
    h0 = torch.randn(9, 4, generator=torch.Generator().manual_seed(1003), dtype=DT)
    res = h0 - h0.mean(0)

    def norm_1inf(X):
        return math.sqrt(float(X.abs().sum(0).max()) * float(X.abs().sum(1).max()))

    assert len(cell["residual"]) == 6
    assert cell["residual"][0] == pytest.approx(norm_1inf(res) / norm_1inf(h0), rel=1e-12)
    assert cell["collapse_layer"] == rc.collapse_layer(cell["residual"])
    assert cell["final_residual"] == cell["residual"][-1]


def test_rank_collapse_is_a_registered_experiment_the_sweep_runner_runs(tmp_path):
    mod = experiment("rank-collapse")
    assert mod is rc and set(mod.PRESETS) >= {"smoke", "book", "long"}
    grid = mod.chapter_grid(**mod.PRESETS["smoke"])
    df = run_sweep(make_cells(grid, [0, 1]), mod.run_cell, tmp_path, log=None)
    assert len(df) == len(grid) * 2
    assert len(load_results(tmp_path)) == len(grid) * 2
    stacks, depths = rc.stack_runs(grid, [0, 1])
    # the in-memory runs are the same cells
    merged = depths.merge(df, left_on=["label", "seed"], right_on=["config", "seed"])
    assert len(merged) == len(df)
    assert (merged["collapse_layer_x"] == merged["collapse_layer_y"]).all()
    assert len(stacks) == len(grid) * 2 * (mod.PRESETS["smoke"]["depth"] + 1)


def test_median_collapse_layers():
    depths = pd.DataFrame(
        {
            "kind": ["homogeneous"] * 3 + ["heterogeneous"] * 3,
            "strength": [5.0] * 6,
            "collapse_layer": [3, 4, 9, 7, 2, 6],
        }
    )
    table = rc.median_collapse_layers(depths, [5.0])
    assert table.iloc[0].to_dict() == {
        "strength": 5.0, "homogeneous": 4.0, "heterogeneous": 6.0, "difference": 2.0,
    }  # fmt: skip


# ---- Proposition 3.5 and eq. (13) ------------------------------------------------------------


def test_instance_has_the_requested_largest_factor_norm():
    g = torch.Generator().manual_seed(0)
    q, k, U = rc.instance(12, 5, 3, 0.37, 1.0, generator=g)
    kappa = (U**2).sum((-1, -2))
    assert float(kappa.max()) == pytest.approx(0.37, rel=1e-12)
    assert float(kappa.min()) >= 0.37 / 3 - 1e-12  # heterogeneous: within a factor 3
    assert torch.allclose(q.norm(dim=-1), torch.ones(12, dtype=DT))
    _, _, U = rc.instance(12, 5, 3, 0.37, 1.0, generator=g, heterogeneous=False)
    assert torch.allclose((U**2).sum((-1, -2)), torch.full((12,), 0.37, dtype=DT))


def test_perturbation_chain_matches_eq11_and_eq12_written_out():
    g = torch.Generator().manual_seed(5)
    L, d, tau = 6, 3, 0.8
    q, k, U = rc.instance(L, d, 2, 2.0, tau, generator=g, unit=False)
    chain = rc.perturbation_chain(q, k, U, tau)
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
    checks = rc.perturbation_checks(25, generator=torch.Generator().manual_seed(0))
    assert len(checks) == 25
    slack = 1 + 1e-12
    assert (checks["dS"] <= checks["bound"] * slack).all()
    assert (checks["dA_F"] <= 0.5 * checks["dS"] * slack + 1e-15).all()  # Jacobian norm <= 1/2
    assert (checks["sv_gap"] <= checks["dA_op"] * slack + 1e-15).all()
    assert (checks["dA_op"] <= checks["dA_F"] * slack + 1e-15).all()
    assert np.allclose(checks["dS_over_bound"], checks["dS"] / checks["bound"], rtol=1e-15)
    assert checks["L"].between(4, 96).all() and checks["d"].between(2, 16).all()


# ---- sigma_2 across the critical scale -------------------------------------------------------


def test_sigma2_sweep_against_numpy_singular_values():
    sweep = rc.sigma2_sweep([8, 12], [0.01, 1e4], rank=2, generator=torch.Generator().manual_seed(9), d=4)  # fmt: skip
    assert list(sweep["c"]) == [0.01, 1e4, 0.01, 1e4]
    # redraw the instances from the same generator and compute sigma_2 with numpy
    g = torch.Generator().manual_seed(9)
    tau = math.sqrt(8)
    for L in (8, 12):
        q, k, U = rc.instance(L, 4, 2, 1.0, tau, generator=g)
        for c in (0.01, 1e4):
            row = sweep[(sweep["L"] == L) & (sweep["c"] == c)].iloc[0]
            A = torch.softmax(explicit_geodesic_scores(q, k, U * math.sqrt(c * tau / L), tau), -1)
            A_e = torch.softmax(-((q[:, None] - k[None]) ** 2).sum(-1) / tau, -1)
            s2 = np.linalg.svd(A.numpy(), compute_uv=False)[1]
            s2_e = np.linalg.svd(A_e.numpy(), compute_uv=False)[1]
            assert row["sigma2_riem"] == pytest.approx(s2, rel=1e-9)
            assert row["sigma2_euc"] == pytest.approx(s2_e, rel=1e-9)
            assert row["Ubar2_over_tau"] == pytest.approx(c / L, rel=1e-12)
    sub = sweep[sweep["c"] == 0.01]  # eq. (13) in the sub-critical regime
    assert ((sub["sigma2_riem"] - sub["sigma2_euc"]).abs() <= sub["bound"]).all()


def test_onset_interpolates_log_linearly():
    part = pd.DataFrame({"c": [1.0, 10.0, 100.0], "sigma2_ratio": [1.0, 1.2, 3.0]})
    w = (math.log(1.5) - math.log(1.2)) / (math.log(3.0) - math.log(1.2))
    assert rc.onset(part) == pytest.approx(10.0 ** (1 + w), rel=1e-12)
    assert rc.onset(part.assign(sigma2_ratio=[1.0, 1.1, 0.9])) is None
    assert rc.onset(part.assign(sigma2_ratio=[0.5, 1.0, 1.0])) == 1.0  # moved down from the start
    sweep = pd.concat([part.assign(L=16), part.assign(L=64, sigma2_ratio=[1.0, 1.0, 1.6])])
    found = rc.onsets(sweep)
    assert list(found["L"]) == [16, 64]
    assert np.allclose(found["Ubar2_over_tau_onset"], found["c_onset"] / found["L"])
    scaling = rc.onset_scaling(sweep, found)
    assert scaling["c_spread"] == pytest.approx(found["c_onset"].max() / found["c_onset"].min())
    assert scaling["moved_near"] == pytest.approx(0.2)  # the largest |ratio - 1| at c <= 10
