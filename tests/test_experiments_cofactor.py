"""Chapter 6's experiment (attention_atlas.experiments.cofactor and cofactor_numerics): the grid
at equal training FLOPs, a cell trained through the harness, the gradient statistics, the paired
analysis, and the numerical tables the chapter asserts on."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from scipy import stats as st

from attention_atlas.cofactor import cofactor_flops
from attention_atlas.experiments import EXPERIMENTS, experiment
from attention_atlas.experiments import cofactor as exp
from attention_atlas.experiments.cofactor_numerics import (
    coupling_table,
    identity_table,
    lu_vs_minors,
    method_sweep,
    speedup_table,
)
from attention_atlas.models import ModelConfig

SHARED = Path(os.environ.get("ATTENTION_ATLAS_DATA", "/work/shared/data"))
needs_wikitext = pytest.mark.skipif(
    not (SHARED / "wikitext-2" / "train.txt").exists(),
    reason="WikiText-2 is not in $ATTENTION_ATLAS_DATA",
)


@pytest.fixture(scope="module")
def smoke_grid() -> dict:
    if not (SHARED / "wikitext-2" / "train.txt").exists():
        pytest.skip("WikiText-2 is not in $ATTENTION_ATLAS_DATA")
    return exp.chapter_grid(**exp.PRESETS["smoke"])


def test_the_sweep_runner_knows_the_experiment():
    assert EXPERIMENTS["cofactor"] == "attention_atlas.experiments.cofactor"
    mod = experiment("cofactor")
    assert {"smoke", "book", "long"} <= set(mod.PRESETS)
    assert callable(mod.chapter_grid) and callable(mod.run_cell)


@needs_wikitext
def test_regularised_arm_gets_the_steps_of_equal_training_flops():
    """steps_reg * (base + extra) = steps * base, to within half a step, for both tasks."""
    grid = exp.chapter_grid(**{**exp.PRESETS["smoke"], "train_steps": 1000})
    for task in ("lm", "digits"):
        base_cfg, reg_cfg = grid[f"{task}_baseline"], grid[f"{task}_cofactor"]
        f = base_cfg["flops"]
        n = 16 if task == "digits" else exp.PRESETS["smoke"]["lm_seq_len"]
        batch = base_cfg["train"]["batch_size"]
        assert f["matrices"] == batch * base_cfg["model"]["n_layers"] * 1
        assert (
            f["regularizer"]
            == f["matrices"] * (2 * n**3 + 6 * n**2)
            == f["matrices"] * cofactor_flops(n)
        )
        steps_reg = reg_cfg["train"]["steps"]
        assert base_cfg["train"]["steps"] == 1000 and steps_reg < 1000
        assert (
            abs(steps_reg * (f["step"] + f["regularizer"]) - 1000 * f["step"])
            <= (f["step"] + f["regularizer"]) / 2
        )
        assert reg_cfg["regularizer"]["name"] == "cofactor" and base_cfg["regularizer"] is None
    table = exp.flops_table(grid)
    assert list(table.task) == ["lm", "digits"]
    np.testing.assert_allclose(
        table["extra fraction"], table["regulariser FLOPs"] / table["baseline step FLOPs"]
    )


@pytest.mark.parametrize("config", ["digits_cofactor", "lm_baseline"])
def test_a_smoke_cell_trains_through_the_harness_and_returns_finite_metrics(smoke_grid, config):
    params = smoke_grid[config]
    out = exp.run_cell(params, seed=0)
    steps = params["train"]["steps"]
    assert len(out["grad_norms"]) == steps  # one per optimiser step, from the harness callback
    assert all(math.isfinite(g) and g > 0 for g in out["grad_norms"])
    for key in exp.SUMMARY_METRICS + [
        "wall_s",
        "grad_norm_mean",
        "frac_with_near_zero (all heads)",
    ]:
        assert math.isfinite(out[key]), (key, out[key])
    history = pd.DataFrame(out["history"])
    assert history["step"].iloc[-1] == steps
    assert ("reg/cofactor" in history) == (params["arm"] == "cofactor")  # the regulariser ran
    assert "cofactor/spectral_gap" in history  # the diagnostic ran at the log steps
    assert 0 <= out["spectral_gap (all heads)"] <= 1 + 1e-12
    if params["task"] == "lm":  # causal heads: pi = e_0, n - 1 near-zero cofactors (section 1)
        n = params["train"]["seq_len"]
        assert abs(out["cofactor_min_prob_n (reg heads)"]) < 1e-9
        assert out["cofactor_near_zero (reg heads)"] == n - 1
    again = exp.run_cell(params, seed=0)
    assert again["grad_norms"] == out["grad_norms"] and again["val_loss"] == out["val_loss"]


def test_grad_stats_counts_spikes_against_the_trailing_median_after_the_warmup():
    g = [1.0] * 40
    g[30] = 2.5  # > 2 x the median (1) of the previous 20 steps: a spike
    g[33] = 1.9  # not above twice the median
    g[3] = 50.0  # in the warm-up: not counted, and not in the variance
    out = exp.grad_stats(g, warmup=5, spike_ratio=2.0)
    assert out["grad_spikes"] == 1
    tail = np.array(g[5:])
    assert (
        out["grad_norm_var"] == pytest.approx(tail.var()) and out["grad_norm_mean"] == tail.mean()
    )
    assert exp.grad_stats(g, warmup=5, spike_ratio=3.0)["grad_spikes"] == 0
    assert math.isnan(exp.grad_stats(g[:3], warmup=5, spike_ratio=2.0)["grad_norm_var"])


def _runs(values: dict[tuple[str, str], list[float]], metric: str) -> pd.DataFrame:
    """A results frame with one metric (every other criterion's metric set to the same 1.0)."""
    rows = []
    for (task, arm), vs in values.items():
        for seed, v in enumerate(vs):
            row = {"task": task, "arm": arm, "seed": seed, "steps": 10}
            row.update({m: 1.0 for _, m, _ in exp.CRITERIA} | {m: 1.0 for m in exp.SUMMARY_METRICS})
            row[metric] = v
            rows.append(row)
    return pd.DataFrame(rows)


def test_paired_effect_is_the_t_interval_of_the_per_seed_differences():
    a, b = [0.9, 1.4, 1.0, 1.7], [0.5, 0.6, 0.8, 0.7]
    runs = _runs({("lm", "cofactor"): a, ("lm", "baseline"): b}, "val_loss")
    eff = exp.paired_effect(runs, "lm", "val_loss")
    d = np.subtract(a, b)
    half = st.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d))
    assert eff.mean == pytest.approx(d.mean()) and eff.n == 4
    assert (eff.low, eff.high) == pytest.approx((d.mean() - half, d.mean() + half))


def test_criteria_read_met_contradicted_not_resolved_vacuous_and_degenerate():
    base = [1.0, 1.1, 0.9]
    cases = {
        # (metric, cofactor runs) -> expected reading on the lm task
        ("grad_spikes", (0.5, 0.7, 0.4)): "met",  # lower is better, interval below zero
        ("grad_spikes", (1.5, 1.7, 1.4)): "contradicted",
        ("grad_spikes", (1.5, 0.7, 0.9)): "not resolved",
        ("spectral_gap (reg heads)", (1.5, 1.7, 1.4)): "met",  # higher is better
        ("val_acc", (1.5, 0.7, 0.9)): "met (no significant difference)",
        ("val_acc", (0.5, 0.7, 0.4)): "contradicted",
    }
    for (metric, reg), expected in cases.items():
        runs = _runs({("lm", "cofactor"): list(reg), ("lm", "baseline"): base,
                      ("digits", "cofactor"): base, ("digits", "baseline"): base}, metric)  # fmt: skip
        got = {(c.task, c.metric): c.verdict for c in exp.criteria(runs)}
        assert got[("lm", metric)] == expected, (metric, reg, got[("lm", metric)])
    zeros = _runs({k: [0.0] * 3 for k in [("lm", "cofactor"), ("lm", "baseline"),
                   ("digits", "cofactor"), ("digits", "baseline")]},
                  "frac_disconnected (reg heads)")  # fmt: skip
    got = {(c.task, c.metric): c.verdict for c in exp.criteria(zeros)}
    assert got[("lm", "frac_disconnected (reg heads)")] == "vacuous (none in any run)"
    assert got[("lm", "cofactor_near_zero (reg heads)")] == "degenerate (1 in every run)"
    one_seed = _runs({k: [1.0] for k in [("lm", "cofactor"), ("lm", "baseline"),
                      ("digits", "cofactor"), ("digits", "baseline")]}, "val_loss")  # fmt: skip
    assert exp.criteria(one_seed)[0].verdict == "not resolved (one seed)"
    table = exp.criteria_table(exp.criteria(zeros))
    assert list(table.columns) == [
        "task", "criterion", "cofactor - baseline", "95% low", "95% high", "verdict"
    ]  # fmt: skip
    assert len(table) == 2 * len(exp.CRITERIA)


def test_summary_table_gives_the_mean_and_interval_of_each_arm():
    runs = _runs({("lm", "cofactor"): [1.0, 2.0, 3.0], ("lm", "baseline"): [1.0, 1.0, 1.0],
                  ("digits", "cofactor"): [0.0, 0.0, 0.0], ("digits", "baseline"): [5.0, 5.0, 5.0]},
                 "val_loss")  # fmt: skip
    table = exp.summary_table(runs)
    assert list(table.columns) == [("lm", "baseline"), ("lm", "cofactor"),
                                   ("digits", "baseline"), ("digits", "cofactor")]  # fmt: skip
    half = st.t.ppf(0.975, 2) * 1.0 / math.sqrt(3)
    assert table.loc["val_loss", ("lm", "cofactor")] == f"2 [{2 - half:.4g}, {2 + half:.4g}]"
    assert table.loc["val_loss", ("digits", "baseline")] == "5 [5, 5]"
    assert table.loc["steps", ("lm", "cofactor")] == 10


def test_grad_norm_matrix_cuts_the_runs_to_the_shortest():
    m = exp.grad_norm_matrix([{"grad_norms": [1, 2, 3]}, {"grad_norms": [4, 5]}])
    np.testing.assert_array_equal(m, [[1, 2], [4, 5]])


def test_timing_helpers_return_positive_times_and_leave_the_global_rng_alone():
    from attention_atlas.data import TextCorpus, Vocab

    g = torch.Generator().manual_seed(0)
    corpus = TextCorpus("toy", torch.randint(0, 7, (400,), generator=g),
                        torch.randint(0, 7, (100,), generator=g), torch.randint(0, 7, (100,), generator=g),
                        vocab=Vocab([str(i) for i in range(7)]))  # fmt: skip
    torch.manual_seed(123)
    state = torch.get_rng_state()
    t = exp.lm_step_seconds(
        {"toy": corpus}, dim=8, n_layers=1, n_heads=2, batch=2, seq_len=8, reps=1
    )
    cfg = ModelConfig(task="classify", patch_dim=4, n_classes=3, dim=8, n_layers=2, n_heads=2,
                      max_len=6)  # fmt: skip
    x, y = torch.randn(4, 6, 4, generator=g), torch.randint(0, 3, (4,), generator=g)
    res = exp.regularizer_overhead(cfg, x, y, reps=1)["results"]
    assert torch.equal(torch.get_rng_state(), state)
    assert t["toy"] > 0
    assert set(res) == {"baseline", "need_weights", "cofactor"}
    assert all(r["forward_backward"]["median_s"] > 0 for r in res.values())


def test_identity_table_shows_the_three_identities_on_every_family():
    t = identity_table(8, 3)
    assert sorted(set(t.family)) == ["banded", "causal", "nearly_reducible", "random"]
    assert (t["max |c^T L| / max|c|"] < 1e-12).all()
    assert (t["max rel. err of sum c vs prod lambda"] < 1e-9).all()
    assert (t["max ||c/sum c - pi||_1"] < 1e-8).all()
    causal = t[t.family == "causal"]
    assert (causal["min c_i"].abs() < 1e-15).all()  # c = (prod (1 - A_jj)) e_0: zeros off token 0


def test_coupling_table_margin_and_gap_vanish_linearly_and_lu_tracks_the_50_digit_reference():
    t = coupling_table(6, [1e-2, 1e-3, 1e-4], count=3)
    for col in ("margin", "spectral gap"):
        ratio = t[col].to_numpy()[:-1] / t[col].to_numpy()[1:]
        assert ((ratio > 9) & (ratio < 11)).all(), (col, ratio)
    assert (t["lu error (float64)"] < 1e-10).all()
    assert (t["|c^T L| / |c| (lu)"] < 1e-14).all()


def test_method_sweep_and_speedup_table_report_what_they_measure():
    t = method_sweep([4, 12], batch=2, reps=1)
    assert (t["power err - bound (max)"] <= 1e-14).all() and (t["lu rel. err"] < 1e-12).all()
    assert (t[["time minors (ms)", "time lu (ms)", "time power (ms)"]] > 0).all().all()
    res = lu_vs_minors([8], batch=2, reps=1)
    table = speedup_table(res)
    r = res[8]["results"]["minors"]
    assert table.loc[0, "speed-up fwd"] == r["forward"]["ratio_median"]
    assert table.loc[0, "minors fwd (ms)"] == 1e3 * r["forward"]["median_s"]
    assert table.loc[0, "speed-up fwd (CPU time)"] == res[8]["meta"]["cpu_time_speedup_forward"] > 0
    assert table.loc[0, "peak MB minors"] > 0
