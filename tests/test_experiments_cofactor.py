"""Chapter 6's experiment (attention_atlas.experiments.cofactor.run and cofactor_numerics): the grid
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

from attention_atlas.claims import CLAIMS, Outcome
from attention_atlas.cofactor import cofactor_flops
from attention_atlas.experiments import EXPERIMENTS, experiment
from attention_atlas.experiments.cofactor import analysis as ana
from attention_atlas.experiments.cofactor import checks, timing
from attention_atlas.experiments.cofactor import run as exp
from attention_atlas.experiments.cofactor.numerics import (
    coupling_table,
    identity_table,
    lu_vs_minors,
    method_sweep,
    speedup_table,
)

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
    assert EXPERIMENTS["cofactor"] == "attention_atlas.experiments.cofactor.run"
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
            == f["matrices"] * ((8 * n**3) // 3 + 9 * n**2)
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
    # the path's count: the heads' logits (2 n^2 d) and their two backward products (4 n^2 d)
    # per matrix, by hand; the LU only on the bidirectional digits heads
    for task in table.task:
        cfg = grid[f"{task}_baseline"]
        n = 16 if task == "digits" else exp.PRESETS["smoke"]["lm_seq_len"]
        d = cfg["model"]["dim"] // cfg["model"]["n_heads"]
        mats = cfg["flops"]["matrices"]
        lu = mats * cofactor_flops(n) if task == "digits" else 0
        path = table.set_index("task").loc[task]
        assert path["of which LU"] == lu
        assert path["regulariser FLOPs (path)"] == mats * 6 * n * n * d + lu
        f = cfg["flops"]["step"]
        assert path["regularised steps (path)"] == round(1000 * f / (f + mats * 6 * n * n * d + lu))


@pytest.mark.parametrize("config", ["digits_cofactor", "lm_baseline"])
def test_a_smoke_cell_trains_through_the_harness_and_returns_finite_metrics(smoke_grid, config):
    params = smoke_grid[config]
    out = exp.run_cell(params, seed=0)
    steps = params["train"]["steps"]
    assert len(out["grad_norms"]) == steps  # one per optimiser step, from the harness callback
    assert all(math.isfinite(g) and g > 0 for g in out["grad_norms"])
    raw = [m for m in ana.SUMMARY_METRICS if m not in ("val_bpc", "grad_spike_rate")]
    for key in raw + [
        "grad_spikes",
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


SCALE_OK = {"val_loss": 1.5, "val_acc": 0.95}  # a decisive scale: 2.16 bpc, 95% accuracy


def _runs(
    values: dict[tuple[str, str], list[float]], metric: str, base: dict | None = None
) -> pd.DataFrame:
    """A results frame of run_cell rows (three seeds): every metric at a decisive scale and
    equal in both arms, except ``metric``, which takes ``values[(task, arm)]`` seed by seed
    where given."""
    rows = []
    for task in ana.TASKS:
        for arm in ana.ARMS:
            vs = values.get((task, arm))
            for seed, v in enumerate(vs if vs is not None else [None] * 3):
                row = {"task": task, "arm": arm, "seed": seed, "steps": 1000, "batch_size": 16,
                       "seq_len": 32, "grad_spikes": 10.0, "grad_norm_var": 1.0,
                       "frac_disconnected (reg heads)": 0.2, **SCALE_OK, **(base or {})}  # fmt: skip
                row.update({m: 1.0 for m in ana.SUMMARY_METRICS if m not in row})
                if v is not None:
                    row[metric] = v
                rows.append(row)
    return pd.DataFrame(rows)


def _outcome(runs: pd.DataFrame, task: str, metric: str) -> ana.Criterion:
    return next(c for c in ana.criteria(runs) if c.task == task and c.metric == metric)


def test_paired_effect_is_the_t_interval_of_the_per_seed_differences():
    a, b = [0.9, 1.4, 1.0, 1.7], [0.5, 0.6, 0.8, 0.7]
    runs = _runs({("lm", "cofactor"): a, ("lm", "baseline"): b}, "val_loss")
    eff = ana.paired_effect(runs, "lm", "val_loss")
    d = np.subtract(a, b)
    half = st.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d))
    assert eff.mean == pytest.approx(d.mean()) and eff.n == 4
    assert (eff.low, eff.high) == pytest.approx((d.mean() - half, d.mean() + half))


def test_derived_metrics_are_bits_per_character_spike_rate_and_log_variance():
    runs = _runs({}, "val_loss", base={"val_loss": math.log(2) * 2.5, "grad_spikes": 4.0,
                                        "grad_norm_var": math.e})  # fmt: skip
    d = ana.derived_metrics(runs).iloc[0]
    # 1000 steps: warm-up 100, then the 20-step window: 880 steps counted
    assert d.val_bpc == pytest.approx(2.5) and d.grad_spike_rate == pytest.approx(4000 / 880)
    assert d.log_grad_norm_var == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("metric", "cofactor", "expected"),
    [
        # fewer disconnected heads: baseline 0.2 in every run; SESOI 0.05
        ("frac_disconnected (reg heads)", [0.02, 0.03, 0.01], "supported"),
        ("frac_disconnected (reg heads)", [0.2, 0.21, 0.19], "contradicted"),  # rules out -0.05
        ("frac_disconnected (reg heads)", [0.0, 0.4, 0.1], "not resolved"),
        ("frac_disconnected (reg heads)", [0.5, 0.45, 0.55], "contradicted"),  # more of them
        # equal or better accuracy (digits), SESOI 0.02: harm ruled out / shown / undecided
        ("val_acc", [0.951, 0.949, 0.952], "supported"),
        ("val_acc", [0.85, 0.86, 0.84], "contradicted"),
        ("val_acc", [0.90, 0.99, 0.95], "not resolved"),
        ("val_acc", [0.99, 0.98, 0.985], "supported"),  # better is fine
    ],
)
def test_criteria_verdicts_on_synthetic_runs_with_known_answers(metric, cofactor, expected):
    runs = _runs({("digits", "cofactor"): cofactor}, metric)
    assert _outcome(runs, "digits", metric).outcome.outcome == expected


def test_lm_accuracy_is_judged_in_bits_per_character_and_harm_is_a_rise():
    worse = _runs({("lm", "cofactor"): [1.6, 1.61, 1.59]}, "val_loss")  # +0.14 bpc
    assert _outcome(worse, "lm", "val_bpc").outcome.outcome == "contradicted"
    same = _runs({("lm", "cofactor"): [1.5001, 1.4999, 1.5002]}, "val_loss")
    assert _outcome(same, "lm", "val_bpc").outcome.outcome == "supported"


def test_a_baseline_with_nothing_to_remove_is_not_tested():
    runs = _runs({("digits", "baseline"): [0.0, 0.01, 0.0], ("digits", "cofactor"): [0.0] * 3},
                 "frac_disconnected (reg heads)")  # fmt: skip
    c = _outcome(runs, "digits", "frac_disconnected (reg heads)")
    assert c.verdict.outcome == "not tested" and "nothing to remove" in c.verdict.reason


def test_a_scale_that_is_not_decisive_turns_a_verdict_into_not_tested():
    bigram = _runs(
        {("lm", "cofactor"): [0.02, 0.03, 0.01]},
        "frac_disconnected (reg heads)",
        base={"val_loss": 3.5 * math.log(2)},
    )  # 3.5 bpc: the bigram regime
    c = _outcome(bigram, "lm", "frac_disconnected (reg heads)")
    assert c.verdict.outcome == "supported" and c.outcome.outcome == "not tested"
    assert "bigram" in c.outcome.summary
    chance = _runs(
        {("digits", "cofactor"): [0.02, 0.03, 0.01]},
        "frac_disconnected (reg heads)",
        base={"val_acc": 0.5},
    )  # less than halfway from 0.1 to 1
    assert (
        _outcome(chance, "digits", "frac_disconnected (reg heads)").outcome.outcome == "not tested"
    )


def test_claim_outcome_combines_the_tasks():
    both = _runs({("lm", "cofactor"): [0.02, 0.03, 0.01], ("digits", "cofactor"): [0.0, 0.01, 0.02]},
                 "frac_disconnected (reg heads)")  # fmt: skip
    assert ana.claim_outcome(ana.criteria(both), "cofactor/disconnected").outcome == "supported"
    one_bad = _runs({("lm", "cofactor"): [0.02, 0.03, 0.01], ("digits", "cofactor"): [0.5, 0.45, 0.55]},
                    "frac_disconnected (reg heads)")  # fmt: skip
    o = ana.claim_outcome(ana.criteria(one_bad), "cofactor/disconnected")
    assert o.outcome == "contradicted" and o.extra["per_task"] == {"lm": "supported",
                                                                   "digits": "contradicted"}  # fmt: skip
    mixed = _runs({("lm", "cofactor"): [0.02, 0.03, 0.01], ("digits", "cofactor"): [0.0, 0.4, 0.1]},
                  "frac_disconnected (reg heads)")  # fmt: skip
    assert ana.claim_outcome(ana.criteria(mixed), "cofactor/disconnected").outcome == "not resolved"
    one_seed = _runs({k: [1.0] for k in [("lm", "baseline"), ("lm", "cofactor"),
                      ("digits", "baseline"), ("digits", "cofactor")]}, "val_loss")  # fmt: skip
    assert ana.claim_outcome(ana.criteria(one_seed), "cofactor/accuracy").outcome == "not tested"
    table = ana.criteria_table(ana.criteria(both))
    assert len(table) == len(ana.CRITERIA) and set(table.claim) >= set(exp.EMPIRICAL)


def test_every_sesoi_is_declared_positive_and_used():
    assert all(v > 0 for v in ana.SESOI.values())
    assert {m for _, _, m, _, _ in ana.CRITERIA} == set(ana.SESOI)


def test_summary_table_gives_the_mean_and_interval_of_each_arm():
    runs = _runs({("lm", "cofactor"): [1.0, 2.0, 3.0], ("lm", "baseline"): [1.0, 1.0, 1.0],
                  ("digits", "cofactor"): [0.0, 0.0, 0.0], ("digits", "baseline"): [5.0, 5.0, 5.0]},
                 "val_acc")  # fmt: skip
    table = ana.summary_table(runs)
    assert list(table.columns) == [("lm", "baseline"), ("lm", "cofactor"),
                                   ("digits", "baseline"), ("digits", "cofactor")]  # fmt: skip
    half = st.t.ppf(0.975, 2) * 1.0 / math.sqrt(3)
    assert table.loc["val_acc", ("lm", "cofactor")] == f"2 [{2 - half:.4g}, {2 + half:.4g}]"
    assert table.loc["val_acc", ("digits", "baseline")] == "5 [5, 5]"
    assert table.loc["steps", ("lm", "cofactor")] == 1000


def test_grad_norm_matrix_cuts_the_runs_to_the_shortest():
    m = ana.grad_norm_matrix([{"grad_norms": [1, 2, 3]}, {"grad_norms": [4, 5]}])
    np.testing.assert_array_equal(m, [[1, 2], [4, 5]])


def test_timing_helpers_return_positive_times_and_leave_the_global_rng_alone(smoke_grid):
    from attention_atlas.data import TextCorpus, Vocab

    g = torch.Generator().manual_seed(0)
    corpus = TextCorpus("toy", torch.randint(0, 7, (400,), generator=g),
                        torch.randint(0, 7, (100,), generator=g), torch.randint(0, 7, (100,), generator=g),
                        vocab=Vocab([str(i) for i in range(7)]))  # fmt: skip
    torch.manual_seed(123)
    state = torch.get_rng_state()
    t = timing.lm_step_seconds(
        {"toy": corpus}, dim=8, n_layers=1, n_heads=2, batch=2, seq_len=8, reps=1
    )
    res = timing.step_overhead(smoke_grid, "digits", reps=1, warmup=1, min_sample_s=0.0)
    assert torch.equal(torch.get_rng_state(), state)
    assert t["toy"] > 0
    assert set(res["results"]) == {"baseline", "cofactor", "reference"}
    assert set(res["meta"]["cpu_time_ratio"]) == {"cofactor", "reference"}
    assert all(r["forward"]["median_s"] > 0 for r in res["results"].values())


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


# -- the claims register: every cofactor claim, computed ------------------------------------


COFACTOR_CLAIMS = [c for c in CLAIMS if c.module == "attention_atlas.experiments.cofactor"]


def test_outcomes_cover_every_cofactor_claim_in_smoke():
    found = exp.outcomes(smoke=True)
    assert {c.key for c in COFACTOR_CLAIMS} == set(found)
    assert all(isinstance(o, Outcome) for o in found.values())
    # the mathematical claims are decided, the way the chapter shows them
    assert found["cofactor/left-null"].outcome == "supported"
    assert found["cofactor/margin-rewards-mixing"].outcome == "contradicted"
    assert found["cofactor/decoder"].outcome == "contradicted"


def test_every_cofactor_claim_names_a_heading_of_the_chapter():
    root = Path(__file__).resolve().parents[1]
    text = (root / "notebooks" / "06_cofactor_stability.py").read_text()
    headings = {line.lstrip("# ").strip() for line in text.splitlines()
                if line.startswith("# #")}  # fmt: skip
    missing = [(c.key, c.section) for c in COFACTOR_CLAIMS if c.section not in headings]
    assert not missing, missing
    assert all(c.chapter == "06_cofactor_stability" for c in COFACTOR_CLAIMS)


def test_empirical_outcomes_without_stored_results_are_not_tested():
    out = exp.empirical_outcomes(None)
    assert set(out) == set(exp.EMPIRICAL)
    assert all(o.outcome == "not tested" and "no stored results" in o.summary for o in out.values())


def test_mixing_check_margins_are_the_closed_forms():
    for n in (4, 9):
        m, o = checks.mixing_check(n)
        assert m["margin rank one"] == pytest.approx(1, abs=1e-12)
        assert m["margin cycle"] == pytest.approx(n, rel=1e-12)
        assert m["margin others"] == pytest.approx((n / (n - 1)) ** (n - 1), rel=1e-12)
        assert abs(m["gap cycle"]) < 1e-12 and o.outcome == "contradicted"


def test_reducible_check_compares_a_lazy_chain_with_coupled_blocks():
    m, o = checks.reducible_check(16)
    assert m["margin lazy"] == pytest.approx(0.5**15, rel=1e-10)  # (1 - t)^(n - 1), t = 1/2
    assert m["gap lazy"] == pytest.approx(0.5, abs=1e-12)
    assert m["slope"] == pytest.approx(1, abs=0.01) and o.outcome == "contradicted"
    # with few tokens the lazy chain's margin is large: the check then passes
    m4, o4 = checks.reducible_check(4)
    assert m4["margin lazy"] == pytest.approx(0.125) and o4.outcome == "supported"


def test_causal_check_finds_the_diagonal_formula():
    m, o = checks.causal_check(8, 3)
    assert m["max |c_i| off token 0"] < 1e-15 and m["c_0 rel. err"] < 1e-12
    assert o.outcome == "contradicted" and "e_0" in o.summary


def test_power_check_reports_the_bound_parameter_of_each_family():
    t, o = checks.power_check((4, 12), 2)
    assert o.outcome == "supported"
    assert (t["delta (causal)"] < 1).all()  # every row attends to token 0
    assert t.loc[t.n == 12, "delta (banded)"].item() == 1.0  # no column within +-2 of every row
    assert (t["err - bound (max)"] <= 1e-14).all()


def test_the_chapters_parameters_are_the_book_preset_so_the_stored_grid_is_found():
    """results.stored_or_run loads results/cofactor/book only for exactly the grid asked for."""
    import inspect

    root = Path(__file__).resolve().parents[1]
    text = (root / "notebooks" / "06_cofactor_stability.py").read_text()
    cell = text.split('# %% tags=["parameters"]')[1].split("# %%")[0]
    params: dict = {}
    exec(cell, {}, params)  # literal assignments only
    defaults = {k: p.default for k, p in inspect.signature(exp.chapter_grid).parameters.items()}
    book = {**defaults, **exp.PRESETS["book"]}
    shared = {k: params[k] for k in book if k in params}
    assert shared == {k: book[k] for k in shared}
    assert len(shared) >= 15 and params["seeds"] == list(exp.BOOK_SEEDS)
