"""Chapter 5's experiment (experiments/matroidal.py) and checks (experiments/matroidal_checks.py):
the grid has the seed's arms, a cell trains and measures, and the analysis computes what it
says."""

from __future__ import annotations

import inspect
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from scipy import stats as st

from attention_atlas.attention.graphs import CONTRAST_FAMILIES, GRAPH_FAMILIES
from attention_atlas.experiments import EXPERIMENTS, experiment
from attention_atlas.experiments import matroidal as ex
from attention_atlas.experiments import matroidal_checks as checks
from attention_atlas.notebooks import chapter_parameters, chapter_smoke
from attention_atlas.sweep import make_cells, run_sweep

CHAPTER = Path(__file__).resolve().parents[1] / "notebooks" / "05_matroidal_metric.py"
GRID_KEYS = set(inspect.signature(ex.chapter_configurations).parameters)


# -- the grid -------------------------------------------------------------------------------


def test_the_experiment_is_registered_for_the_sweep_runner():
    assert EXPERIMENTS["matroidal"] == "attention_atlas.experiments.matroidal"
    assert experiment("matroidal") is ex
    assert {"smoke", "book", "long"} <= set(ex.PRESETS)


def test_the_grid_has_the_arms_the_seed_asks_for():
    """dot vs dense vs matroidal on both data sets and every fraction at matched width;
    m in {d, 2d, 4d}; every graph family and the two contrasts; pruning of matroidal models."""
    configs = ex.chapter_configurations()
    d = 16
    main = {n: p for n, p in configs.items() if p["slice"] == "main"}
    arms = {(p["dataset"], p["fraction"], p["attention"]) for p in main.values()}
    assert arms == {
        (ds, f, a)
        for ds in ("digits", "ptb-char")
        for f in (0.01, 0.1, 1.0)
        for a in ("dot", "mahalanobis", "matroidal")
    }
    assert {repr(p["model"]) for p in configs.values()} == {
        repr({"dim": 64, "n_layers": 2, "n_heads": 8, "head_dim": d})
    }
    m_slice = [p["options"] for p in configs.values() if p["slice"] == "m"]
    assert [o["m"] for o in m_slice] == [d, 2 * d, 4 * d]
    assert m_slice[0]["graph"] == "ring"  # the only family with exactly d edges for every d
    fams = {p["options"]["graph"] for p in configs.values() if p["slice"] == "family"}
    assert fams == (set(GRAPH_FAMILIES) - {"ring", "complete"}) | set(CONTRAST_FAMILIES)
    for p in configs.values():
        assert bool(p["prune_deltas"]) == (p["attention"] == "matroidal")
        ptb = p["dataset"] == "ptb-char"
        assert p["train"]["batch_size"] == (16 if ptb else 32)
        assert p["train"]["final_eval_batches"] == (16 if ptb else None)


def test_configurations_shared_by_slices_run_once():
    configs = ex.chapter_configurations()
    alias = ex.distinct_configurations(configs)
    grid = ex.chapter_grid()
    shared = "main/digits/0.1/matroidal"
    assert alias["m/2d"] == alias["family/ring_chords"] == shared
    assert (len(configs), len(grid)) == (26, 24)
    assert set(grid) == set(alias.values())
    for name, target in alias.items():  # equal up to the slice
        strip = lambda p: {k: v for k, v in p.items() if k != "slice"}
        assert strip(configs[name]) == strip(configs[target])


def test_the_book_and_smoke_presets_are_chapter_5s_parameters():
    """`sweep matroidal --preset book/smoke` runs the grid chapter 5 runs (book/SMOKE)."""
    book = {k: v for k, v in chapter_parameters(CHAPTER).items() if k in GRID_KEYS}
    assert ex.chapter_configurations(**book) == ex.chapter_configurations(**ex.PRESETS["book"])
    smoke = {k: v for k, v in chapter_smoke(CHAPTER).items() if k in GRID_KEYS}
    assert ex.chapter_configurations(**{**book, **smoke}) == ex.chapter_configurations(
        **ex.PRESETS["smoke"]
    )


def test_runs_frame_maps_each_distinct_cell_onto_every_slice_that_shares_it():
    configs = ex.chapter_configurations(**ex.PRESETS["smoke"])
    grid = ex.chapter_grid(**ex.PRESETS["smoke"])
    raw = pd.DataFrame(
        [
            {"config": c, "seed": s, "val_loss": i + s / 10}
            for i, c in enumerate(grid)
            for s in (0, 1)
        ]
    )
    runs = ex.runs_frame(raw, configs)
    assert len(runs) == 2 * len(configs) > len(raw)
    alias = ex.distinct_configurations(configs)
    for name, p in configs.items():
        rows = runs[runs.config == name]
        src = raw[raw.config == alias[name]]
        assert rows.val_loss.tolist() == src.val_loss.tolist()
        assert (rows.slice == p["slice"]).all() and (rows.m == p["options"].get("m", 0)).all()


# -- one cell --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smoke_cells(tmp_path_factory):
    """A matroidal and a dense cell (2 steps, small width) through the sweep runner."""
    grid = ex.chapter_grid(
        datasets=["digits"], fractions=[0.1], steps=2, dim=32, n_heads=2, m_multiples=[1],
        families=[], prune_deltas=[0.0, 1e9],
    )  # fmt: skip
    grid = {k: v for k, v in grid.items() if k.endswith(("matroidal", "mahalanobis"))}
    out = tmp_path_factory.mktemp("sweep")
    return run_sweep(make_cells(grid, [0]), ex.run_cell, out, log=None).set_index("config")


def test_one_cell_trains_and_returns_finite_metrics(smoke_cells):
    mat = smoke_cells.loc["main/digits/0.1/matroidal"]
    for col in ("val_loss", "val_acc", "grad_norm_var", "grad_norm_cv", "metric_drift"):
        assert math.isfinite(mat[col]), col
    assert math.isnan(mat.val_bpc)  # digits: no bits per character
    assert 0.0 <= mat.val_acc <= 1.0 and mat.val_loss > 0
    assert mat.nonfinite_logits == mat.nonfinite_out == 0
    assert mat.params_metric == 2 * 2 * 32  # theta (H, m) in two layers, m = 2d
    den = smoke_cells.loc["main/digits/0.1/mahalanobis"]
    assert den.params_metric == 2 * 2 * 16 * 16  # W (H, d, d) in two layers
    assert den.params_total - den.params_metric == mat.params_total - mat.params_metric
    assert mat.attn_flops_fwd == den.attn_flops_fwd > 0  # the same fast path, any metric
    assert math.isnan(den["pruned_val_loss@0"])  # only matroidal models are pruned


def test_pruning_at_zero_keeps_everything_and_above_every_weight_keeps_nothing(smoke_cells):
    mat = smoke_cells.loc["main/digits/0.1/matroidal"]
    assert mat["pruned_kept@0"] == 1.0
    assert mat["pruned_val_loss@0"] == pytest.approx(mat.val_loss, rel=1e-6)
    assert mat["pruned_kept@1e+09"] == 0.0 and math.isfinite(mat["pruned_val_loss@1e+09"])


# -- analysis --------------------------------------------------------------------------------


def test_interval_text_is_the_mean_and_student_t_interval():
    x = np.array([1.0, 2.0, 4.0])
    half = st.t.ppf(0.975, 2) * x.std(ddof=1) / math.sqrt(3)
    assert ex.interval_text(x) == f"{x.mean():.4g} [{x.mean() - half:.4g}, {x.mean() + half:.4g}]"
    assert ex.interval_text([1.0, math.nan]) == "nan"


def fake_runs(gap: float, cv_gap: float = 0.0, noise: float = 0.01) -> pd.DataFrame:
    """Main-slice runs, 3 seeds: matroidal = dense + gap (+ seed noise), dot = dense."""
    rows = []
    for ds in ("digits", "ptb-char"):
        for frac in (0.1, 1.0):
            for s in range(3):
                for att, dl, dc, pm in (
                    ("dot", 0.0, 0.0, 0), ("mahalanobis", 0.0, 0.0, 4096),
                    ("matroidal", gap + noise * (s - 1), cv_gap, 512),
                ):  # fmt: skip
                    rows.append({
                        "slice": "main", "dataset": ds, "fraction": frac, "attention": att,
                        "seed": s, "val_loss": 2.0 + 0.1 * s + dl, "grad_norm_cv": 1 + dc,
                        "nonfinite_logits": 0.0, "nonfinite_out": 0.0, "params_metric": pm,
                    })  # fmt: skip
    return pd.DataFrame(rows)


def test_verdict_calls_follow_the_paired_interval():
    better = ex.verdict_table(fake_runs(-0.5))
    assert better["(a) loss vs dense"].str.startswith("better (-0.500)").all()
    assert (better.criterion == "holds").all() and better._better.all()
    assert better._dloss.to_numpy() == pytest.approx(-0.5)
    assert ex.hypothesis_status(better, 0.1) == "supported in 4 cell(s) (2 of them at fraction 0.1)"
    worse = ex.verdict_table(fake_runs(+0.5))
    assert (worse.criterion == "fails").all() and worse["(a) loss vs dense"].str.startswith(
        "worse"
    ).all()
    assert ex.hypothesis_status(worse, 0.1).startswith("contradicted in digits at 0.1")
    equal = ex.verdict_table(fake_runs(0.0, noise=0.2))
    half = st.t.ppf(0.975, 2) * 0.2 / math.sqrt(3)  # the paired differences are -0.2, 0, 0.2
    assert (equal["(a) loss vs dense"] == f"equal within +-{half:.3f}").all()
    assert equal._half.to_numpy() == pytest.approx(half)
    assert ex.hypothesis_status(equal, 0.1).startswith("neither supported nor contradicted")
    unstable = fake_runs(-0.5)
    unstable.loc[unstable.attention == "matroidal", "nonfinite_out"] = 1.0
    assert (ex.verdict_table(unstable).criterion == "fails").all()


def test_prune_summary_and_table_report_kept_fraction_and_loss_change():
    runs = pd.DataFrame({
        "slice": ["m", "m", "main"], "config": ["m/1d", "m/1d", "main/x"], "seed": [0, 1, 0],
        "val_loss": [1.0, 2.0, 3.0], "pruned_val_loss@0.5": [1.5, 2.5, 3.0],
        "pruned_kept@0.5": [0.25, 0.75, 1.0],
    })  # fmt: skip
    assert ex.prune_summary(runs) == "0.5: kept 0.67, change +0.333 nats"
    table = ex.prune_table(runs)
    assert table.config.tolist() == ["m/1d"] and table["change"].iloc[0] == "0.5 [0.5, 0.5]"


def test_loss_against_fraction_plots_the_mean_per_variant_and_data_set():
    runs = fake_runs(-0.5)
    fig = ex.loss_against_fraction(runs, ["digits", "ptb-char"], [0.1, 1.0])
    assert len(fig.data) == 6
    mat = fig.data[2]
    assert mat.name == "matroidal (digits)" and list(mat.x) == [0.1, 1.0]
    assert list(mat.y) == pytest.approx([2.1 - 0.5, 2.1 - 0.5])
    assert fig.data[3].line.dash == "dot"


# -- the chapter's checks of the metric (sections 1 to 3) -------------------------------------


def test_unimodularity_survey_certifies_every_incidence_family_and_no_contrast():
    tu = checks.unimodularity_survey(5, seed=1)
    inc = tu[tu.family.isin(GRAPH_FAMILIES)]
    assert set(inc.family) == set(GRAPH_FAMILIES) and inc.iloc[:, 2:].all().all()
    assert not tu[tu.family.isin(CONTRAST_FAMILIES)].iloc[:, 2:].any().any()
    summary = checks.unimodularity_summary(tu).set_index("family")
    assert summary.loc["complete", "m_values"] == "10..10 (1)"
    assert summary.loc["ring_chords"].tolist() == ["5..10 (6)", 6, 6]


def test_metric_cases_are_the_feasible_family_and_m_pairs():
    cases = checks.metric_cases(9)
    assert len(cases) == 11 and {f for f, _ in cases} == set(GRAPH_FAMILIES)
    assert ("complete", 36) in cases and ("ring", 18) not in cases


def test_decomposition_errors_are_rounding_and_catch_a_wrong_metric(monkeypatch):
    cases = checks.metric_cases(6)
    g = torch.Generator().manual_seed(0)
    worst = checks.decomposition_errors(cases, 6, 1e-4, generator=g)
    assert worst["decomposition"] < 1e-12 and worst["factor"] < 1e-12
    assert worst["min_eig_minus_eps"] > -1e-12
    from attention_atlas.attention.matroidal import matroidal_metric

    monkeypatch.setattr(checks, "matroidal_metric", lambda A, th, eps: matroidal_metric(A, th, 0))
    broken = checks.decomposition_errors(cases, 6, 1e-4, generator=g)
    assert broken["decomposition"] > 1e-8 and broken["min_eig_minus_eps"] < -1e-8


def test_fast_path_errors_are_rounding_and_catch_a_wrong_fast_path(monkeypatch):
    cases = checks.metric_cases(6)[:3]
    g = torch.Generator().manual_seed(0)
    out, grad = checks.fast_path_errors(cases, 6, 7, 1e-4, generator=g)
    assert out < 1e-10 and grad < 1e-10
    real = checks.matroidal_attention
    monkeypatch.setattr(checks, "matroidal_attention", lambda z, v, A, th, eps, tau, causal: real(
        z, v, A, th, eps, 2 * tau, causal=causal))  # fmt: skip
    out, grad = checks.fast_path_errors(cases, 6, 7, 1e-4, generator=g)
    assert out > 1e-3 and grad > 1e-3


def test_time_against_sdpa_reports_every_variant_against_the_baseline():
    table = checks.time_against_sdpa(16, 8, [1, 2], reps=1)
    assert table.index.tolist() == ["dot SDPA", "matroidal m=1d", "matroidal m=2d"]
    assert (table.loc["dot SDPA", ["forward (no grad) ratio", "forward+backward ratio"]] == 1).all()
    assert np.isfinite(table.to_numpy()).all() and (table.to_numpy() > 0).all()


def test_stored_benchmark_reads_the_bench_json_and_the_memory_growth(tmp_path):
    assert checks.stored_benchmark(tmp_path / "missing.json") is None
    ratio = {"dot": 1.0, "matroidal_m64": 1.2}
    bench = {
        "command": "python benchmarks/bench_matroidal.py", "threads": 1, "torch": "x",
        "shape": {"L": 1024, "d": 16}, "ratio_reference_forward": 40.0,
        "ratio_forward": ratio, "ratio_forward_no_grad": ratio, "ratio_forward_backward": ratio,
        "peak_bytes_forward_backward": {"dot": {"256": 2**20, "512": 2**21, "1024": 2**22},
                                        "matroidal_m4d": {"256": 2**20, "512": 2**22, "1024": 2**24}},
    }  # fmt: skip
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(bench))
    got = checks.stored_benchmark(path)
    assert got is not None and "took 40x" in got["text"]
    assert got["growth"].to_dict() == pytest.approx({"dot": 1.0, "matroidal_m4d": 2.0})
    assert got["memory"].loc[1024, "dot"] == 4.0
