"""Chapter 2's stacks (Dong et al. 2021) with dot, Euclidean and metric scores against explicit
references, the grid and the sweep runner, and the verdicts on synthetic data with known
answers."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import explicit_geodesic_scores

from attention_atlas import claims, linalg, stats
from attention_atlas.experiments import experiment
from attention_atlas.experiments.rank_collapse import run as rc
from attention_atlas.experiments.rank_collapse import stacks as st
from attention_atlas.sweep.runner import load_results, make_cells, run_sweep

DT = torch.float64
TOL = 1e-10


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


# ---- pure attention stacks --------------------------------------------------------------------


def test_pure_attention_stack_shapes_and_row_stochastic_mixing():
    g = torch.Generator().manual_seed(0)
    h0 = torch.randn(2, 10, 6, generator=g, dtype=DT)
    for score in st.STACK_SCORES:
        H, s, disp = st.pure_attention_stack(h0, 3, score=score, entry=5.0, generator=g)
        assert H.shape == (4, 2, 10, 6) and s.shape == disp.shape == (3, 2)
        assert torch.equal(H[0], h0)
    # identical tokens stay identical: a row-stochastic A maps 1 x^T to 1 (x W)^T
    same = torch.randn(1, 6, generator=g, dtype=DT).expand(10, 6)
    H, _, _ = st.pure_attention_stack(same, 2, score="fixed", spread=0.5, generator=g)
    assert float(linalg.relative_residual(H[-1])) < 1e-12


@pytest.mark.parametrize("score", ["homogeneous", "fixed", "token"])
def test_metric_factors_have_the_requested_mean_strength_exactly(score):
    g = torch.Generator().manual_seed(3)
    h = 3.0 * torch.randn(2, 8, 5, generator=g, dtype=DT)
    strength = torch.tensor([7.0, 0.3], dtype=DT)  # one per sequence
    U = st.metric_factors(h, score, rank=3, strength=strength, spread=0.6, generator=g)
    kappa = (U**2).sum((-1, -2))  # (2, 8)
    assert torch.allclose(kappa.mean(-1), strength, rtol=1e-12)
    if score == "homogeneous":
        assert torch.allclose(kappa, strength[:, None].expand(2, 8), rtol=1e-12)
    if (
        score == "fixed"
    ):  # kappa_t = strength (1 +- spread) on two halves: sigma_U = spread strength
        assert torch.allclose(kappa.std(-1, unbiased=False), 0.6 * strength, rtol=1e-12)
        assert sorted(set(np.round((kappa[0] / 7.0).tolist(), 12))) == [0.4, 1.6]


def test_fixed_factors_ignore_the_tokens_and_token_factors_follow_them():
    h = torch.randn(6, 4, generator=torch.Generator().manual_seed(1), dtype=DT)
    same = h[:1].expand(6, 4)  # collapsed tokens

    def draw(score, x):
        return st.metric_factors(x, score, rank=2, strength=1.0, spread=0.5, generator=torch.Generator().manual_seed(9))  # fmt: skip

    assert torch.equal(draw("fixed", h), draw("fixed", same))  # the same draw whatever the tokens
    assert float(st.metric_dispersion(draw("fixed", same))) > 0.1
    assert float(st.metric_dispersion(draw("token", same))) < 1e-12  # collapses with the tokens
    assert float(st.metric_dispersion(draw("token", h))) > 0.1
    assert float(st.metric_dispersion(draw("homogeneous", h))) < 1e-12
    assert float(st.metric_dispersion(draw("euclidean", h))) == 0.0
    with pytest.raises(ValueError, match="spread must be"):
        st.metric_factors(h, "fixed", rank=2, strength=1.0, spread=1.0)


def test_metric_dispersion_against_the_formula_written_out():
    U = torch.randn(5, 4, 2, generator=torch.Generator().manual_seed(2), dtype=DT)
    A = [U[t] @ U[t].T for t in range(5)]
    mean = sum(A) / 5
    spread = math.sqrt(sum(float(((a - mean) ** 2).sum()) for a in A) / 5)
    size = sum(float(a.norm()) for a in A) / 5
    assert float(st.metric_dispersion(U)) == pytest.approx(spread / size, rel=1e-12)


@pytest.mark.parametrize("score", ["dot", "euclidean", "homogeneous", "fixed", "token"])
def test_a_stack_layer_is_eq1_with_the_geodesic_score_of_its_factors(score):
    # H^1 = softmax(S) H^0 W_V with S built pair by pair from the drawn W_Q, W_K and the factors,
    # whose mean strength is entry tau / M with M = max |q_i - k_j|^2 written out
    h0 = torch.randn(7, 5, generator=torch.Generator().manual_seed(1), dtype=DT)
    entry, tau = 0.4, 1.3
    H, s, _ = st.pure_attention_stack(
        h0, 1, score=score, rank=2, entry=entry, spread=0.5, tau=tau,
        generator=torch.Generator().manual_seed(4),
    )  # fmt: skip
    g = torch.Generator().manual_seed(4)
    wq, wk, wv = (torch.randn(5, 5, generator=g, dtype=DT) / math.sqrt(5) for _ in range(3))
    q, k, v = h0 @ wq, h0 @ wk, h0 @ wv
    if score == "dot":
        S = q @ k.T / math.sqrt(5)
    else:
        M = max(float((q[i] - k[j]) @ (q[i] - k[j])) for i in range(7) for j in range(7))
        U = st.metric_factors(h0, score, rank=2, strength=entry * tau / M, spread=0.5, generator=g)
        S = explicit_geodesic_scores(q, k, U, tau)
        ubar2 = max(float((U[t] ** 2).sum()) for t in range(7))
        assert float(s[0]) == pytest.approx(ubar2 * M / tau, rel=1e-12)
        if score == "homogeneous":
            assert float(s[0]) == pytest.approx(entry, rel=1e-12)
        if score == "fixed":
            assert float(s[0]) == pytest.approx(
                entry * 1.5, rel=1e-12
            )  # max is (1 + spread) x mean
    A = torch.exp(S - S.max(-1, keepdim=True).values)
    assert rel(H[1], (A / A.sum(-1, keepdim=True)) @ v) < TOL


def test_stack_argument_errors():
    h0 = torch.randn(4, 3, dtype=DT)
    with pytest.raises(ValueError, match="score must be one of"):
        st.pure_attention_stack(h0, 1, score="cosine")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="depth must be"):
        st.pure_attention_stack(h0, -1)
    with pytest.raises(ValueError, match="entry must be"):
        st.pure_attention_stack(h0, 1, score="fixed", entry=float("nan"))


def test_collapse_layer_and_doubly_exponential_growth():
    assert st.collapse_layer([1.0, 1e-5, 1e-13, 0.0]) == 2
    assert st.collapse_layer([1.0, 0.5, 0.1]) == 3  # never: one past the last layer
    # res_l = exp(-2^l): log res doubles per layer; the step to exp(-32) < 1e-12 (round-off
    # territory) is left out
    res = [math.exp(-(2.0**layer)) for layer in range(6)]
    growth = st.log_residual_growth(res)
    assert growth == pytest.approx([2.0] * 4, rel=1e-12)
    # res_l = exp(-l - 1): an exponential decay grows log res by (l + 2) / (l + 1) -> 1
    slow = st.log_residual_growth([math.exp(-layer - 1.0) for layer in range(5)])
    assert slow == pytest.approx([(layer + 2) / (layer + 1) for layer in range(4)], rel=1e-12)


# ---- the grid and the sweep runner -----------------------------------------------------------


def test_chapter_grid_names_every_stack_and_run_cell_measures_it():
    grid = rc.chapter_grid(entries=[2.0], ranks=[1, 3], spreads=[0.0, 0.5], length=9, dim=4, depth=5)  # fmt: skip
    assert list(grid) == [
        "dot", "euclidean", "homogeneous r=1 s=2", "fixed r=1 rho=0 s=2", "fixed r=1 rho=0.5 s=2",
        "homogeneous r=3 s=2", "fixed r=3 rho=0 s=2", "fixed r=3 rho=0.5 s=2", "token r=4 s=2",
    ]  # fmt: skip
    assert grid["fixed r=3 rho=0.5 s=2"] == {
        "score": "fixed", "entry": 2.0, "rank": 3, "spread": 0.5, "length": 9, "dim": 4, "depth": 5,
    }  # fmt: skip
    cell = rc.run_cell(grid["fixed r=3 rho=0.5 s=2"], seed=3)
    # the input layer's residual, from the composite norm written out; its effective rank by numpy
    h0 = torch.randn(9, 4, generator=torch.Generator().manual_seed(1003), dtype=DT)
    res = h0 - h0.mean(0)

    def norm_1inf(X):
        return math.sqrt(float(X.abs().sum(0).max()) * float(X.abs().sum(1).max()))

    sv = np.linalg.svd(h0.numpy(), compute_uv=False)
    p = sv / sv.sum()
    assert len(cell["residual"]) == len(cell["erank"]) == 6
    assert len(cell["entry_scale"]) == len(cell["dispersion"]) == 5
    assert cell["residual"][0] == pytest.approx(norm_1inf(res) / norm_1inf(h0), rel=1e-12)
    assert cell["erank"][0] == pytest.approx(math.exp(-(p * np.log(p)).sum()), rel=1e-12)
    assert cell["collapse_layer"] == st.collapse_layer(cell["residual"])
    assert cell["final_erank"] == cell["erank"][-1]
    assert cell["entry_scale"] == pytest.approx([2.0 * 1.5] * 5, rel=1e-12)  # held at every layer


def test_rank_collapse_is_a_registered_experiment_the_sweep_runner_runs(tmp_path):
    mod = experiment("rank-collapse")
    assert mod is rc and set(mod.PRESETS) >= {"smoke", "book", "long"}
    grid = mod.chapter_grid(**mod.PRESETS["smoke"])
    df = run_sweep(make_cells(grid, [0, 1]), mod.run_cell, tmp_path, log=None)
    assert len(df) == len(grid) * 2
    assert len(load_results(tmp_path)) == len(grid) * 2
    layers, stacks = rc.stack_runs(grid, [0, 1])
    # the in-memory runs are the same cells
    merged = stacks.merge(df, left_on=["label", "seed"], right_on=["config", "seed"])
    assert len(merged) == len(df)
    assert (merged["collapse_layer_x"] == merged["collapse_layer_y"]).all()
    assert len(layers) == len(grid) * 2 * (mod.PRESETS["smoke"]["depth"] + 1)


# ---- verdicts on synthetic stacks --------------------------------------------------------------


def synthetic_stacks(fixed_erank, homog_erank, *, entry=100.0, bound_max=3200.0, entry_min=100.0):
    """A stacks frame with one fixed arm, its homogeneous control and the Euclidean stack, the
    given final effective ranks per seed, and the regime measurements given."""
    rows = []
    for seed, (f, h) in enumerate(zip(fixed_erank, homog_erank, strict=True)):
        common = {
            "seed": seed,
            "bound_max": bound_max,
            "entry_min": entry_min,
            "rank": 4,
            "growth": float("nan"),
        }
        rows += [
            {
                "label": f"fixed r=4 rho=0.8 s={entry:g}",
                "score": "fixed",
                "entry": entry,
                "spread": 0.8,
                "final_erank": f,
                "collapse_layer": 9,
                **common,
            },  # fmt: skip
            {
                "label": f"homogeneous r=4 s={entry:g}",
                "score": "homogeneous",
                "entry": entry,
                "spread": 0.0,
                "final_erank": h,
                "collapse_layer": 6,
                **common,
            },  # fmt: skip
            {
                "label": "euclidean",
                "score": "euclidean",
                "entry": 0.0,
                "spread": 0.0,
                "final_erank": h,
                "collapse_layer": 4,
                **common,
            },  # fmt: skip
        ]
    return pd.DataFrame(rows)


def test_regime_is_set_by_the_bound_and_the_entry_scale():
    assert rc.regime(0.05, 0.001) == "sub-critical"
    assert rc.regime(320.0, 1.0) == "super-critical"
    assert rc.regime(5.0, 0.2) == "between"


@pytest.mark.parametrize(
    ("fixed", "outcome"),
    [
        ([3.1, 2.9, 3.0, 3.05], "supported"),  # a floor of about 3 where the control collapsed
        ([1.02, 0.98, 1.01, 0.99], "contradicted"),  # collapsed like the control
        ([1.0, 2.9, 1.0, 3.0], "not resolved"),
        ([1.0, 1.0, 1.0, 1.0], "not tested"),  # rank 1 in every arm: saturated, decides nothing
    ],
)
def test_stack_verdicts_super_critical_against_the_homogeneous_control(fixed, outcome):
    stacks = synthetic_stacks(fixed, [1.0] * 4)
    v = rc.stack_verdicts(stacks)
    assert list(v["control"]) == ["homogeneous", "euclidean"]
    row = v.iloc[0]
    assert row["regime"] == "super-critical" and row["outcome"] == outcome, row["reason"]
    assert row["effect"].mean == pytest.approx(np.mean(fixed) - 1.0)
    found = rc.stack_outcomes(stacks)
    assert found["riemannian/conj-3.4"].outcome == outcome
    assert found["riemannian/conj-3.6-sub"].outcome == "not tested"  # no sub-critical arm


def test_stack_verdicts_sub_critical_claim_no_difference():
    same = synthetic_stacks([1.02, 0.99, 1.0], [1.0, 1.0, 1.0], entry=0.001, bound_max=0.05, entry_min=0.001)  # fmt: skip
    assert rc.stack_outcomes(same)["riemannian/conj-3.6-sub"].outcome == "supported"
    flat = synthetic_stacks([1.0, 1.0, 1.0], [1.0, 1.0, 1.0], entry=0.001, bound_max=0.05, entry_min=0.001)  # fmt: skip
    sub = rc.stack_outcomes(flat)["riemannian/conj-3.6-sub"]  # every arm at rank 1: saturated
    assert (sub.outcome, sub.reason) == ("not tested", "measure saturated")
    apart = synthetic_stacks([2.0, 2.1, 1.9], [1.0, 1.0, 1.0], entry=0.001, bound_max=0.05, entry_min=0.001)  # fmt: skip
    assert rc.stack_outcomes(apart)["riemannian/conj-3.6-sub"].outcome == "contradicted"
    assert rc.stack_verdicts(synthetic_stacks([2.0] * 3, [1.0] * 3, bound_max=5.0, entry_min=0.2)).empty  # fmt: skip


def test_collapse_delay_is_paired_by_seed():
    stacks = synthetic_stacks([1.0] * 3, [1.0] * 3)
    d = rc.collapse_delay(stacks, "fixed r=4 rho=0.8 s=100", "homogeneous r=4 s=100")
    assert (d.mean, d.low, d.high) == (3.0, 3.0, 3.0)


def test_summary_formats_intervals_over_seeds():
    summary = rc.stack_summary(synthetic_stacks([1.0, 2.0, 3.0], [1.0] * 3).assign(dispersion_first=0.5, dispersion_last=0.1))  # fmt: skip
    row = summary.set_index("label").loc["fixed r=4 rho=0.8 s=100"]
    assert row["final_erank"] == stats.mean_interval([1.0, 2.0, 3.0]).format(3)
    assert row["regime"] == "super-critical"
    assert summary.set_index("label").loc["euclidean", "regime"] == "-"


def test_outcomes_cover_every_rank_collapse_claim_and_match_the_chapter():
    from attention_atlas.notebooks.chapters import chapter_parameters, chapter_smoke, repo_root

    mine = {c.key for c in claims.CLAIMS if c.module.endswith(".rank_collapse")}
    found = rc.outcomes(smoke=True)
    assert set(found) == mine and all(isinstance(o, claims.Outcome) for o in found.values())
    assert found["riemannian/prop-3.5"].outcome == "supported"
    chapter = repo_root() / "notebooks" / "02_perturbation_and_rank_collapse.py"
    assert chapter_parameters(chapter) == rc.BOOK  # the register runs the chapter's sizes
    assert chapter_smoke(chapter) == rc.SMOKE
    headings = chapter.read_text()
    for c in claims.CLAIMS:
        if c.key in mine:  # the claim's section is a heading of its chapter
            assert f"# ## {c.section}\n" in headings, c.section


def test_chapter_grid_rejects_bad_arguments():
    with pytest.raises(ValueError, match="entries must be"):
        rc.chapter_grid(entries=[-1.0])
    with pytest.raises(ValueError, match="spreads must lie"):
        rc.chapter_grid(spreads=[1.0])
    with pytest.raises(ValueError, match="length 1"):
        rc.chapter_grid(length=1)
