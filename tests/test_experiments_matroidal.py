"""Chapter 5's experiment (experiments/matroidal.py), its verdicts (matroidal_verdicts.py),
tables (matroidal_analysis.py) and checks (matroidal_checks.py): the grid has the arms it says,
a cell trains and measures, the verdicts follow the library's rule on synthetic runs, and every
matroidal claim gets an outcome."""

from __future__ import annotations

import inspect
import json
import math
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from scipy import stats as st

from attention_atlas.attention.graphs import CONTRAST_FAMILIES, GRAPH_FAMILIES
from attention_atlas.claims import CLAIMS
from attention_atlas.experiments import EXPERIMENTS, experiment
from attention_atlas.experiments.matroidal import analysis as an
from attention_atlas.experiments.matroidal import checks
from attention_atlas.experiments.matroidal import run as ex
from attention_atlas.experiments.matroidal import verdicts as vd
from attention_atlas.notebooks import chapter_parameters, chapter_smoke
from attention_atlas.provenance import Provenance
from attention_atlas.stats import Interval
from attention_atlas.sweep.runner import make_cells, run_sweep

CHAPTER = Path(__file__).resolve().parents[1] / "notebooks" / "05_matroidal_metric.py"
GRID_KEYS = set(inspect.signature(ex.chapter_configurations).parameters)
MINE = {c.key for c in CLAIMS if c.module == "attention_atlas.experiments.matroidal"}


# -- the grid -------------------------------------------------------------------------------


def test_the_experiment_is_registered_for_the_sweep_runner():
    assert EXPERIMENTS["matroidal"] == "attention_atlas.experiments.matroidal.run"
    assert experiment("matroidal") is ex
    assert {"smoke", "book", "long"} <= set(ex.PRESETS) <= set(ex.PRESET_SEEDS)
    assert all(len(s) >= 3 for s in ex.PRESET_SEEDS.values())  # the verdict rule's minimum


def test_the_grid_has_the_arms_it_says():
    """Main slice: every arm on every (data set, fraction); the seed's arms score one z, the qk
    arms q_i - k_j; m in {d, 2d, 4d}; every family at 2d, graph families grounded; the steps
    slice trains the seed's arm and its control for other budgets; pruning of matroidal models."""
    configs = ex.chapter_configurations()
    d = 16
    main = [p for p in configs.values() if p["slice"] == "main"]
    cells = {(p["dataset"], p["fraction"], p["arm"]) for p in main}
    assert cells == {("digits", f, a) for f in (0.1, 0.3, 1.0) for a in ex.ARMS} | {
        ("ptb-char", 1.0, a) for a in ex.ARMS
    }
    for p in main:
        att, opts = ex.ARMS[p["arm"]]
        assert p["attention"] == att and opts.items() <= p["options"].items()
        assert p["options"].get("shared", False) == (
            p["arm"] in ("dense", "matroidal", "matroidal-grounded")
        )
        if att == "matroidal":
            assert p["options"]["m"] == 2 * d and p["options"]["graph"] == "ring_chords"
        assert p["train"]["steps"] == (800 if p["dataset"] == "ptb-char" else 400)
        assert p["train"]["batch_size"] == (16 if p["dataset"] == "ptb-char" else 32)
        assert bool(p["prune_fractions"]) == (att == "matroidal")
    assert {repr(p["model"]) for p in configs.values()} == {
        repr({"dim": 64, "n_layers": 2, "n_heads": 8, "head_dim": d})
    }
    m_slice = [p["options"] for p in configs.values() if p["slice"] == "m"]
    assert [o["m"] for o in m_slice] == [d, 2 * d, 4 * d] and m_slice[0]["graph"] == "ring"
    fam = [p for p in configs.values() if p["slice"] == "family"]
    assert {p["options"]["graph"] for p in fam} == (
        set(GRAPH_FAMILIES) - {"ring", "complete"}
    ) | set(CONTRAST_FAMILIES)
    assert all(
        p["options"].get("grounded", False) == (p["options"]["graph"] in GRAPH_FAMILIES)
        for p in fam
    )
    steps = {(p["arm"], p["train"]["steps"]) for p in configs.values() if p["slice"] == "steps"}
    assert steps == {(a, n) for a in (ex.SEED_ARM, ex.CONTROL) for n in (100, 1600)}
    with pytest.raises(ValueError, match="unknown arms \\['nope'\\]"):
        ex.chapter_configurations(arms=["dot", "nope"])


def test_configurations_shared_by_slices_run_once():
    configs = ex.chapter_configurations()
    alias = ex.distinct_configurations(configs)
    grid = ex.chapter_grid()
    assert alias["m/2d"] == "main/digits/1/matroidal"
    assert alias["family/ring_chords"] == "main/digits/1/matroidal-grounded"
    assert len(configs) - len(grid) == 2 and set(grid) == set(alias.values())
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
    assert chapter_parameters(CHAPTER)["seeds"] == ex.PRESET_SEEDS["book"]


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
        assert rows.val_loss.tolist() == raw[raw.config == alias[name]].val_loss.tolist()
        assert (rows.slice == p["slice"]).all() and (rows.arm == p["arm"]).all()
        assert (rows.steps == p["train"]["steps"]).all()
        assert (rows.grounded == p["options"].get("grounded", False)).all()


# -- one cell --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smoke_cells(tmp_path_factory):
    """Four arms (2 steps, width 32, two heads) through the sweep runner, pruning 0 and 1/2."""
    grid = ex.chapter_grid(
        datasets=["digits"], fractions=[0.1], steps=2, dim=32, n_heads=2, m_multiples=[],
        families=[], steps_multiples=[], prune_fractions=[0.0, 0.5],
        arms=["dot", "dense", "matroidal", "matroidal-qk"],
    )  # fmt: skip
    out = tmp_path_factory.mktemp("sweep")
    return run_sweep(make_cells(grid, [0]), ex.run_cell, out, log=None).set_index("config")


def test_one_cell_trains_and_returns_finite_metrics(smoke_cells):
    mat = smoke_cells.loc["main/digits/0.1/matroidal"]
    for col in (
        "val_loss",
        "val_acc",
        "grad_norm_var",
        "grad_norm_cv",
        "metric_change",
        "coef_change",
    ):
        assert math.isfinite(mat[col]), col
    assert math.isnan(mat.val_bpc) and 0.0 <= mat.val_acc <= 1.0 and mat.val_loss > 0
    assert mat.nonfinite_logits == mat.nonfinite_out == 0
    assert mat.params_metric == 2 * 2 * 32  # theta (H, m) in two layers, m = 2d
    assert mat.tokens == 2 * 32  # steps x images per batch
    den, qk = (
        smoke_cells.loc["main/digits/0.1/dense"],
        smoke_cells.loc["main/digits/0.1/matroidal-qk"],
    )
    assert den.params_metric == 2 * 2 * 16 * 16  # W (H, d, d) in two layers
    assert den.params_total - den.params_metric == mat.params_total - mat.params_metric
    assert qk.params_total - mat.params_total == 2 * 32 * 32  # the key projection, two layers
    assert mat.attn_flops_fwd == den.attn_flops_fwd > 0  # the same fast path, any metric
    # the all-ones direction: eps d / tr M for bare incidence columns, about 1 for dense
    assert mat.ones_rayleigh == pytest.approx(1e-4, rel=0.2) and den.ones_rayleigh > 0.5
    for row in (mat, den, qk, smoke_cells.loc["main/digits/0.1/dot"]):
        assert 0 < row.self_attention < 1
    assert math.isnan(den["pruned_val_acc@0"])  # only matroidal models are pruned


def test_pruning_nothing_changes_nothing_and_half_removes_half(smoke_cells):
    mat = smoke_cells.loc["main/digits/0.1/matroidal"]
    assert mat["pruned_val_acc@0"] == mat.val_acc and mat["random_pruned_val_acc@0"] == mat.val_acc
    assert mat["pruned_val_loss@0"] == pytest.approx(mat.val_loss, rel=1e-6)
    assert math.isfinite(mat["pruned_val_loss@0.5"]) and math.isfinite(
        mat["random_pruned_val_loss@0.5"]
    )


def test_prune_mask_removes_the_smallest_weights_of_each_head_or_random_ones():
    w = torch.tensor([[0.5, 0.1, 0.9, 0.3], [0.2, 0.8, 0.4, 0.6]])
    keep = ex.prune_mask(w, 0.5)
    assert keep.tolist() == [[True, False, True, False], [False, True, False, True]]
    assert ex.prune_mask(w, 0.0).all() and not ex.prune_mask(w, 1.0).any()
    g = torch.Generator().manual_seed(0)
    rnd = ex.prune_mask(w, 0.5, smallest=False, generator=g)
    assert rnd.sum(1).tolist() == [2, 2]  # as many columns as the pruning removes, per head
    draws = {
        tuple(ex.prune_mask(w, 0.5, smallest=False, generator=g).flatten().tolist())
        for _ in range(20)
    }
    assert len(draws) > 1  # random, not the smallest


# -- verdicts on synthetic runs ----------------------------------------------------------------


def fake_runs(
    acc_gain: float = 0.0,
    bpc_gain: float = 0.0,
    noise: float = 0.005,
    dot_acc: float = 0.9,
    dot_bpc: float = 2.5,
    low_extra: float = 0.0,
    m_gain: float = 0.0,
) -> pd.DataFrame:
    """Main slice (digits at 0.1 and 1, char-PTB at 1), 3 seeds: dense = dot; matroidal better
    than dense by ``*_gain`` (+ ``low_extra`` at fraction 0.1) with seed noise; an m slice."""
    rows = []
    base = {"steps": 400, "tokens": 12800, "grad_norm_cv": 1.0, "nonfinite_logits": 0.0,
            "nonfinite_out": 0.0, "params_metric": 0}  # fmt: skip
    for ds, frac in (("digits", 0.1), ("digits", 1.0), ("ptb-char", 1.0)):
        for s in range(3):
            wiggle = noise * (s - 1) * (1.3 if frac == 0.1 else 1.0)  # seeds differ per cell
            for arm in ("dot", "dense", "matroidal", "matroidal-grounded"):
                g = (acc_gain if ds == "digits" else bpc_gain) + (low_extra if frac == 0.1 else 0)
                g = g + wiggle if arm.startswith("matroidal") else 0.0
                acc = dot_acc + 0.01 * s + (g if ds == "digits" else 0)
                bpc = dot_bpc + 0.01 * s - (g if ds == "ptb-char" else 0)
                rows.append({**base, "slice": "main", "dataset": ds, "fraction": frac, "arm": arm,
                             "config": f"main/{ds}/{frac:g}/{arm}", "seed": s,
                             "val_acc": acc if ds == "digits" else math.nan,
                             "val_bpc": bpc if ds == "ptb-char" else math.nan,
                             "pruned_val_acc@0.25": acc - 0.001 - 0.0004 * s,
                             "pruned_val_bpc@0.25": bpc + 0.001 + 0.0004 * s,
                             "grad_norm_cv": 1.0 + (0.003 * s if arm.startswith("matroidal") else 0),
                             "random_pruned_val_acc@0.25": acc - 0.01,
                             "random_pruned_val_bpc@0.25": bpc + 0.01})  # fmt: skip
        for m in (16, 64):
            for s in range(3):
                rows.append({**base, "slice": "m", "dataset": "digits", "fraction": 1.0,
                             "arm": "matroidal", "config": f"m/{m}", "seed": s, "m": m,
                             "val_acc": 0.9 + 0.01 * s + (m_gain + 0.002 * s if m == 64 else 0)})  # fmt: skip
    return pd.DataFrame(rows).drop_duplicates(["config", "seed"])


def test_gain_is_signed_so_that_positive_is_better():
    a = pd.DataFrame({"seed": [0, 1, 2], "val_acc": [0.6, 0.7, 0.8], "val_bpc": [2.0, 2.1, 2.2]})
    c = a.assign(val_acc=a.val_acc - 0.1, val_bpc=a.val_bpc + 0.1)
    assert vd.gain(a, c, "val_acc").mean == pytest.approx(0.1)  # higher accuracy is better
    assert vd.gain(a, c, "val_bpc").mean == pytest.approx(0.1)  # lower bpc is better


def test_non_inferiority_is_the_verdict_rule_both_ways():
    def iv(lo, hi):
        return Interval((lo + hi) / 2, lo, hi, 3)

    assert vd.non_inferior(iv(0.01, 0.05), 0.02).outcome == "supported"  # better
    assert vd.non_inferior(iv(-0.01, 0.01), 0.02).outcome == "supported"  # equal within sesoi
    assert vd.non_inferior(iv(-0.08, -0.03), 0.02).outcome == "contradicted"  # worse by > sesoi
    assert vd.non_inferior(iv(-0.05, 0.01), 0.02).outcome == "not resolved"
    assert vd.non_inferior(Interval(0.1, 0.05, 0.15, 2), 0.02).outcome == "not tested"  # 2 seeds


def test_the_scale_of_a_cell_is_the_dot_arm_at_its_budget():
    runs = fake_runs(dot_acc=0.9, dot_bpc=2.5)
    assert vd.scale_of(runs, "digits", 1.0).decisive and vd.scale_of(runs, "ptb-char", 1.0).decisive
    weak = fake_runs(dot_acc=0.4, dot_bpc=3.3)
    assert not vd.scale_of(weak, "digits", 1.0).decisive  # less than halfway from 0.1 to 1
    assert "bigram regime" in vd.scale_of(weak, "ptb-char", 1.0).reason()
    text = vd.scale_summary(weak)
    assert "ptb-char at fraction 1: 400 steps, 12,800 tokens per run, 3 seeds" in text
    assert "not decisive: the dot-product arm is at 3.31 bpc" in text


def test_outcomes_follow_the_effects_on_synthetic_runs():
    keys = {"matroidal/loss", "matroidal/smoother", "matroidal/stability", "matroidal/pruning",
            "matroidal/low-data", "matroidal/m"}  # fmt: skip
    better = vd.empirical_outcomes(fake_runs(acc_gain=0.1, bpc_gain=0.1), evidence="test")
    assert set(better) == keys and better["matroidal/loss"].outcome == "supported"
    assert better["matroidal/loss"].extra["cells"] == {"digits 0.1": "supported", "digits 1": "supported",
                                                       "ptb-char 1": "supported"}  # fmt: skip
    assert better["matroidal/pruning"].outcome == "supported"  # 0.001 lost, inside 0.02
    stability = better["matroidal/stability"]  # no failure anywhere: nothing to count
    assert (stability.outcome, stability.reason) == ("not tested", "no events")
    assert better["matroidal/smoother"].outcome == "contradicted"  # equal CV: no decrease >= 0.1
    assert better["matroidal/m"].outcome == "contradicted"  # m changes nothing
    worse = vd.empirical_outcomes(fake_runs(acc_gain=-0.1, bpc_gain=-0.1), evidence="test")
    assert worse["matroidal/loss"].outcome == "contradicted"
    assert worse["matroidal/loss"].effect.mean == pytest.approx(-0.1)
    noisy = vd.empirical_outcomes(fake_runs(noise=0.05), evidence="test")
    assert noisy["matroidal/loss"].outcome == "not resolved"
    weak = vd.empirical_outcomes(
        fake_runs(acc_gain=0.1, bpc_gain=0.1, dot_acc=0.3, dot_bpc=3.4), evidence="x"
    )
    assert (
        weak["matroidal/loss"].outcome == "not tested"
        and "bigram" in weak["matroidal/loss"].summary
    )
    low = vd.empirical_outcomes(fake_runs(low_extra=0.1), evidence="test")["matroidal/low-data"]
    assert low.outcome == "supported" and low.effect.mean == pytest.approx(0.1)
    flat = vd.empirical_outcomes(fake_runs(), evidence="test")["matroidal/low-data"]
    assert flat.outcome == "contradicted"
    m = vd.empirical_outcomes(fake_runs(m_gain=0.1), evidence="test")["matroidal/m"]
    assert m.outcome == "supported"


def test_comparison_table_says_what_the_interval_shows():
    table = vd.comparison_table(fake_runs(acc_gain=0.1, bpc_gain=0.0, noise=0.001))
    row = lambda ds, frac, arm, control: table[(table.dataset == ds) & (table.fraction == frac)
                                               & (table.arm == arm) & (table.control == control)].iloc[0]  # fmt: skip
    assert row("digits", 1.0, "matroidal", "dense").verdict == "better"
    assert row("ptb-char", 1.0, "matroidal", "dense").verdict == "equivalent within +-0.02"
    weak = vd.comparison_table(fake_runs(dot_acc=0.3))
    assert weak[weak.dataset == "digits"].verdict.str.startswith("not tested").all()
    text = vd.comparison_summary(table)
    assert "matroidal against dense on digits at fraction 1: better, gain +0.100" in text
    assert text.endswith("not tested: 0.") and "Not resolved: " in text


def test_interval_text_is_the_mean_and_student_t_interval():
    x = np.array([1.0, 2.0, 4.0])
    half = st.t.ppf(0.975, 2) * x.std(ddof=1) / math.sqrt(3)
    assert an.interval_text(x) == f"{x.mean():.4g} [{x.mean() - half:.4g}, {x.mean() + half:.4g}]"
    assert an.interval_text([1.0, math.nan]) == "nan"


def test_movement_extrapolates_the_power_law_to_the_material_change():
    rows = [{"slice": "steps" if n != 400 else "main", "dataset": "digits", "fraction": 1.0,
             "arm": arm, "seed": s, "steps": n,
             "metric_change": c * (n / 100) ** 0.5, "coef_change": c * (n / 100) ** 0.5}
            for arm, c in (("matroidal", 0.01), ("dense", 0.2)) for n in (100, 400, 1600)
            for s in range(3)]  # fmt: skip
    runs = pd.DataFrame(rows)
    # matroidal: 0.01 sqrt(n / 100) = 0.25 at n = 100 * 25^2 = 62,500 steps
    assert an.steps_to_material(runs, "matroidal") == pytest.approx(62_500, rel=1e-6)
    assert an.steps_to_material(runs, "dense") == 400  # 0.2 sqrt(4) = 0.4 >= 0.25 at 400 steps
    table = an.movement_table(runs)
    assert table[table.arm == "dense"].material.tolist() == [False, True, True]


def test_prune_summary_sets_the_smallest_weights_against_random_columns():
    text = an.prune_summary(fake_runs())
    assert "digits at fraction 1, 0.25 removed: -0.001 against -0.010" in text
    assert (
        "ptb-char at fraction 1, 0.25 removed: -0.001 against -0.010" in text
    )  # bpc: sign flipped


def test_seeds_needed_resolve_the_sesoi_at_the_spread_seen():
    runs = fake_runs(noise=0.01)  # paired differences -0.01, 0, 0.01: sd 0.01
    need = an.seeds_needed(runs)
    sd = 0.01
    for ds, sesoi in (("digits", ex.SESOI["val_acc"]), ("ptb-char", ex.SESOI["val_bpc"])):
        n = need[ds]
        assert st.t.ppf(0.975, n - 1) * sd / math.sqrt(n) < sesoi
        assert n == 3 or st.t.ppf(0.975, n - 2) * sd / math.sqrt(n - 1) >= sesoi


def test_long_preset_cost_is_its_steps_times_the_measured_time_per_step():
    runs = fake_runs().assign(train_time_s=lambda r: 0.036 * r.steps)  # 36 ms per step, any arm
    grid = ex.chapter_grid(**ex.PRESETS["long"])
    hours = sum(p["train"]["steps"] for p in grid.values()) * 6 * 0.036 / 3600
    text = an.long_preset_text(runs, ex.PRESETS["long"], [0, 1, 2, 3, 4, 5])
    assert f"{len(grid)} configurations x 6 seeds" in text
    assert f"about {hours:.0f} CPU-hours" in text
    assert "the grid this chapter shows" not in text


def test_long_preset_text_says_when_it_describes_the_grid_shown():
    runs = fake_runs().assign(train_time_s=lambda r: 0.036 * r.steps)
    prov = Provenance("stored", "matroidal", "long", "results/matroidal/long", ("cmd",), ("abc",),
                      ("2026-12-01",), ("CPU x, 1 thread(s)",), 840, 40 * 3600.0)  # fmt: skip
    text = an.long_preset_text(runs, ex.PRESETS["long"], [0, 1], shown=prov)
    assert "It is the grid this chapter shows: its 840 stored runs took 40.0 h of compute" in text
    for other in (replace(prov, preset="book"), replace(prov, source="computed")):
        assert "the grid this chapter shows" not in an.long_preset_text(
            runs, ex.PRESETS["long"], [0, 1], shown=other
        )


# -- the claims ----------------------------------------------------------------------------------


def test_every_matroidal_claim_names_a_heading_of_chapter_5():
    headings = {h.strip() for h in re.findall(r"^# #+ (.+)$", CHAPTER.read_text(), flags=re.M)}
    for c in CLAIMS:
        if c.module == "attention_atlas.experiments.matroidal":
            assert c.chapter == CHAPTER.stem and c.section in headings, c.key


@pytest.mark.slow
def test_outcomes_in_smoke_cover_every_matroidal_claim():
    out = vd.outcomes(smoke=True)
    assert set(out) == MINE
    for key in ("matroidal/unimodular", "matroidal/psd", "matroidal/fast-path"):
        assert out[key].outcome == "supported", out[key]
    for key in MINE - {"matroidal/unimodular", "matroidal/psd", "matroidal/fast-path"}:
        assert out[key].outcome == "not tested", out[key]  # 2 steps: not a decisive scale


def test_math_outcomes_are_supported_and_fail_on_broken_checks(monkeypatch):
    out = checks.math_outcomes(smoke=True)
    assert {k: o.outcome for k, o in out.items()} == dict.fromkeys(
        ["matroidal/unimodular", "matroidal/psd", "matroidal/fast-path"], "supported"
    )
    monkeypatch.setattr(checks, "is_totally_unimodular", lambda A: False)
    monkeypatch.setattr(checks, "decomposition_errors", lambda *a, **k: {
        "decomposition": 1e-3, "factor": 0.0, "min_eig_minus_eps": 0.0})  # fmt: skip
    monkeypatch.setattr(checks, "fast_path_errors", lambda *a, **k: (1e-3, 0.0))
    broken = checks.math_outcomes(smoke=True)
    assert {o.outcome for o in broken.values()} == {"contradicted"}


# -- the chapter's checks of the metric (sections 1 to 4) -------------------------------------


def test_unimodularity_survey_certifies_every_incidence_family_and_no_contrast():
    tu = checks.unimodularity_survey(5, seed=1)
    inc = tu[tu.family.isin(GRAPH_FAMILIES)]
    assert set(inc.family) == set(GRAPH_FAMILIES)
    assert inc["signed incidence"].all() and inc["totally unimodular (exhaustive)"].all()
    assert (inc["rank"] == np.where(inc.grounded, 5, 4)).all()  # connected graphs on 5 nodes
    con = tu[tu.family.isin(CONTRAST_FAMILIES)]
    assert not con["signed incidence"].any() and not con["totally unimodular (exhaustive)"].any()
    summary = checks.unimodularity_summary(tu).set_index(["family", "grounded"])
    assert summary.loc[("complete", False), "m_values"] == "10..10 (1)"
    assert summary.loc[("ring_chords", True)].tolist() == ["5..10 (6)", 6, 6, 6]
    assert summary.loc[("ring_chords", False), "spans"] == 0


def test_null_directions_every_incidence_family_misses_the_all_ones_direction():
    null = checks.null_directions(8, 16).set_index(["family", "grounded"])
    for f in GRAPH_FAMILIES:
        if (f, False) in null.index:
            bare, grounded = null.loc[(f, False)], null.loc[(f, True)]
            assert bare["lambda_min / eps"] == pytest.approx(1.0, abs=1e-6)
            assert bare["|<v_min, 1>|"] == pytest.approx(1.0, abs=1e-9) and bare["rank"] == 7
            assert grounded["rank"] == 8 and grounded["lambda_min / eps"] > 10
    assert null.loc[("dense", False), "ones Rayleigh"] == pytest.approx(1.0)


def test_metric_view_recomputes_the_metric_for_each_control():
    a = checks.metric_view(12, "ring_chords", False, d=6)
    b = checks.metric_view(12, "knn", False, d=6)
    c = checks.metric_view(12, "ring_chords", True, d=6)
    assert len(a.data) == 3 and "rank 5" in a.layout.title.text and "rank 6" in c.layout.title.text
    assert not np.array_equal(a.data[0].z, b.data[0].z) and not np.array_equal(
        a.data[1].y, c.data[1].y
    )
    P = np.asarray(a.data[2].z)
    assert np.allclose(P.sum(1), 1) and (P.argmax(1) == np.arange(len(P))).all()  # one z: S_ii max
    assert (
        "exactly d(d-1)/2=15 edges"
        in checks.metric_view(9, "complete", False, d=6).layout.title.text
    )


def test_memory_growth_is_linear_for_the_fast_path_and_quadratic_for_the_pseudocode():
    mem = checks.memory_growth([64, 128, 256], head_dim=8, m=16, heads=2)
    slope = checks.loglog_slope(mem)
    assert slope["matroidal"] < 1.2 and slope["pseudocode (L, L, m) tensor"] == pytest.approx(2.0)
    assert (mem["matroidal"] > 0).all()


def test_step_costs_report_every_arm_against_dot_with_its_flop_ratio():
    table = checks.step_costs("digits", ["matroidal", "matroidal-qk"], dim=32, m=32, reps=1)
    assert table.index.tolist() == ["dot", "matroidal", "matroidal-qk"]
    assert table.loc["dot", "ratio to dot"] == 1 and (table["step ms"] > 0).all()
    # one z drops the key projection (fewer FLOPs than dot); q - k adds the folded d x d maps
    assert table.loc["matroidal", "FLOP ratio"] < 1 < table.loc["matroidal-qk", "FLOP ratio"]


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
