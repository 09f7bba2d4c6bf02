"""Chapter 4's verdict code on synthetic grids whose answer is known: each prediction's effect
against its control, the rule's outcome, the scale that makes a run decisive or not, and the
float64 counterexample to eq. (25)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

from attention_atlas import claims
from attention_atlas.experiments.fiber_bundle import run as fb
from attention_atlas.experiments.fiber_bundle import verdicts as V
from attention_atlas.experiments.fiber_bundle.analysis import Runs

SEEDS = [0, 1, 2, 3, 4]
GRID = fb.chapter_grid(ranks=(1, 4, 8), alphas=(0.0, 1.0), kappa_factors=(0.1, 1.0, 10.0),
                       dot_temperatures=(0.5, 0.25))  # fmt: skip


#: the bpc change when the geometry is removed at evaluation (``gate_alpha0``, ``gate_u0``) of
#: every synthetic Fiber Bundle arm with alpha > 0: ten times the gate's smallest effect, so that
#: the predictions are decided; the alpha-0 arm has no Riemannian score to remove (0)
ACTIVE_GATE = 0.1


def _base(config: str, seed: int, rng: np.random.Generator) -> dict[str, Any]:
    """Every metric the verdicts read, at neutral values (a little seed noise)."""
    n = lambda: float(rng.normal(0, 1e-3))  # noqa: E731
    rec: dict[str, Any] = {"val_bpc": 2.0 + n(), "train_time_s": 1.0}
    for l in (1, 2):
        rec |= {f"sigma2_{l}": 0.5 + n(), f"entropy_{l}": 2.0 + n(), f"entry_scale_{l}": 1.0,
                f"kappa_{l}_mean": 1.0, f"init_kappa_{l}_mean": 0.1, f"kappa_{l}_cv": 0.3 + n(),
                f"init_kappa_{l}_cv": 0.3, f"kappa_{l}_spearman_surprisal": 0.2 + n(),
                f"init_kappa_{l}_spearman_surprisal": 0.2}  # fmt: skip
    rec |= {"erank_0": 10.0, "erank_1": 10.0, "erank_2": 10.0 + n()}
    rec |= {f"bpc_at_alpha_{a:g}": 2.0 + n() for a in (0.0, 1.0)}
    params = GRID[config]
    if params["kind"] == "fbt":  # the geometry gate: active wherever the Riemannian score acts
        gate = ACTIVE_GATE if float(params["model"].get("alpha", 1.0)) > 0 else 0.0
        rec |= {"gate_alpha0": gate + n(), "gate_u0": gate + n()}
    return rec


def runs_with(**changes: Any) -> Runs:
    """A synthetic grid: neutral metrics, then ``changes[config] = {metric: value or f(seed)}``."""
    rng = np.random.default_rng(0)
    records = {}
    for config, params in GRID.items():
        for s in SEEDS:
            rec = _base(config, s, rng)
            for k, v in changes.get(config.replace("-", "_").replace(".", "_"), {}).items():
                rec[k] = v(s) if callable(v) else v
            records[(config, s)] = {"config": config, "seed": s, "params": params, **rec}
    return Runs.from_records(records, "cmd")


def both_layers(stem: str, value: Any) -> dict[str, Any]:
    return {stem.format(l=l): value for l in (1, 2)}


# -- P1 ---------------------------------------------------------------------------------------


def test_p1_sigma2_rising_past_the_critical_scale_is_supported():
    noise = lambda s: 0.7 + 0.01 * s  # noqa: E731
    runs = runs_with(
        fbt_kappa_0_1=both_layers("entry_scale_{l}", 0.05),
        fbt_kappa_10=both_layers("entry_scale_{l}", 5.0) | both_layers("sigma2_{l}", noise),
    )
    v, info = V.p1_verdict(runs)
    assert v.outcome == "supported" and v.effect.mean == pytest.approx(0.22, abs=0.01)
    assert (info["weakest"], info["strongest"]) == ("fbt_kappa-0.1", "fbt_kappa-10")


def test_p1_is_not_tested_when_the_levels_do_not_straddle_the_critical_scale():
    runs = runs_with(fbt_kappa_0_1=both_layers("entry_scale_{l}", 2.0),
                     fbt_kappa_10=both_layers("entry_scale_{l}", 50.0))  # fmt: skip
    v, _ = V.p1_verdict(runs)
    assert v.outcome == "not tested" and "do not straddle" in v.reason


def test_p1_unchanged_sigma2_across_the_critical_scale_is_contradicted():
    runs = runs_with(fbt_kappa_0_1=both_layers("entry_scale_{l}", 0.05),
                     fbt_kappa_10=both_layers("entry_scale_{l}", 5.0))  # fmt: skip
    assert V.p1_verdict(runs)[0].outcome == "contradicted"  # |effect| << sesoi 0.05


# -- P2 ---------------------------------------------------------------------------------------


def test_p2_a_mismatched_alpha_costing_bits_is_supported_and_a_free_one_contradicted():
    worse = {"bpc_at_alpha_1": lambda s: 2.1 + 0.01 * s}  # trained at 0, evaluated at 1
    runs = runs_with(fbt_alpha_0=worse, fbt={"bpc_at_alpha_0": lambda s: 2.1 + 0.01 * s})
    gaps = V.p2_gaps(runs)
    assert set(gaps) == {(0.0, 1.0), (1.0, 0.0)}
    np.testing.assert_allclose(gaps[(0.0, 1.0)], 0.1 + 0.01 * np.arange(5), atol=0.005)
    assert V.p2_verdict(runs).outcome == "supported"
    assert V.p2_verdict(runs_with()).outcome == "contradicted"


# -- P3 ---------------------------------------------------------------------------------------


def test_p3_growth_beyond_the_noise_control_contradicts_collapse():
    runs = runs_with(
        fbt_noise=both_layers("kappa_{l}_mean", lambda s: 10.0 * (1 + 0.01 * s)),  # 100x
        fbt_reg_none=both_layers("kappa_{l}_mean", lambda s: 1000.0 * (1 + 0.02 * s)),  # 10^4 x
        fbt_reg_l2=both_layers("kappa_{l}_mean", lambda s: 0.01 * (1 + 0.03 * s)),  # 0.1x
    )
    p3 = V.p3_verdicts(runs)
    assert p3["none"].outcome == "contradicted"
    assert p3["none"].effect.mean == pytest.approx(2.0, abs=0.02)
    assert p3["l2"].outcome == "supported" and p3["l2"].effect.mean == pytest.approx(-3.0, abs=0.03)
    assert V.weakest([p3["l2"], p3["none"]]) is p3["none"]


def test_p3_growth_equal_to_the_noise_controls_is_contradicted_not_supported():
    same = both_layers("kappa_{l}_mean", lambda s: 10.0 * (1 + 0.01 * s))
    near = both_layers("kappa_{l}_mean", lambda s: 10.0 * (1 + 0.012 * s))  # the same, seed noise
    runs = runs_with(fbt_noise=same, fbt_reg_none=near, fbt_reg_l2=near)
    assert {v.outcome for v in V.p3_verdicts(runs).values()} == {"contradicted"}
    # identical to the control in every seed: a zero-width interval decides nothing
    ident = runs_with(fbt_noise=same, fbt_reg_none=same, fbt_reg_l2=same)
    v = V.p3_verdicts(ident)["none"]
    assert (v.outcome, v.category) == ("not tested", "measure saturated")


# -- P4 ---------------------------------------------------------------------------------------


def test_p4_needs_both_heterogeneity_and_correlation_to_grow_over_initialisation():
    more_cv = both_layers("kappa_{l}_cv", lambda s: 0.5 + 0.01 * s)
    more_rho = both_layers("kappa_{l}_spearman_surprisal", lambda s: 0.5 + 0.01 * s)
    both = V.p4_verdicts(runs_with(fbt=more_cv | more_rho))
    assert {k: v.outcome for k, v in both.items()} == {"cv": "supported", "spearman": "supported"}
    less_cv = both_layers("kappa_{l}_cv", lambda s: 0.15 + 0.01 * s)  # init 0.3, as in the book
    mixed = V.p4_verdicts(runs_with(fbt=less_cv | more_rho))
    assert mixed["cv"].outcome == "contradicted"
    assert V.weakest(list(mixed.values())).outcome == "contradicted"


# -- P5 ---------------------------------------------------------------------------------------


def test_matched_control_interpolates_inside_the_range_and_refuses_outside():
    xs, ys = np.array([3.0, 1.0, 2.0]), np.array([30.0, 10.0, 20.0])
    assert V.matched_control(1.5, xs, ys) == pytest.approx(15.0)
    assert V.matched_control(3.0, xs, ys) == pytest.approx(30.0)
    assert math.isnan(V.matched_control(0.5, xs, ys))
    assert math.isnan(V.matched_control(3.5, xs, ys))


def _entropy_rank(entropy: float, rank: Any) -> dict[str, Any]:
    return both_layers("entropy_{l}", entropy) | {"erank_2": rank}


def test_p5_compares_against_the_dot_model_at_the_same_attention_entropy():
    """Sharper dot attention keeps more rank (rank = 20 - 4 entropy here); the FBT at entropy 1.5
    has rank 14 + 1, one more than the matched dot model's 14, but six more than the T = 1
    model's 12 (entropy 2)."""
    runs = runs_with(
        dot=_entropy_rank(2.0, 12.0), dot_temp_0_5=_entropy_rank(1.0, 16.0),
        dot_temp_0_25=_entropy_rank(0.5, 18.0), fbt=_entropy_rank(1.5, lambda s: 15.0 + 0.1 * s),
    )  # fmt: skip
    ent, rank, matched = V.p5_matched(runs)
    np.testing.assert_allclose(ent, 1.5)
    np.testing.assert_allclose(matched, 14.0)
    v = V.p5_verdict(runs)
    assert v.effect.mean == pytest.approx(1.2) and v.outcome == "supported"
    assert runs.paired("fbt", "dot", "erank_2").mean == pytest.approx(3.2)  # the unmatched gap


def test_p5_is_not_tested_when_no_temperature_is_as_sharp_as_the_fbt():
    runs = runs_with(dot=_entropy_rank(2.0, 12.0), dot_temp_0_5=_entropy_rank(1.8, 13.0),
                     dot_temp_0_25=_entropy_rank(1.6, 14.0), fbt=_entropy_rank(0.8, 20.0))  # fmt: skip
    v = V.p5_verdict(runs)
    assert v.outcome == "not tested" and "do not reach" in v.reason


# -- P6 ---------------------------------------------------------------------------------------


def test_p6_reads_the_largest_against_the_smallest_metric_rank():
    runs = runs_with(fbt_rank_8={"erank_2": lambda s: 13.0 + 0.1 * s})
    assert V.p6_names(runs) == {1: "fbt_rank-1", 4: "fbt", 8: "fbt_rank-8"}
    v = V.p6_verdict(runs)
    assert v.outcome == "supported" and v.effect.mean == pytest.approx(3.2, abs=0.01)


# -- the geometry gate ---------------------------------------------------------------------


def inert_everywhere(**changes: Any) -> dict[str, Any]:
    """``changes`` with every Fiber Bundle arm's gate tiny: removing the geometry at evaluation
    changes the bpc by about 2.5e-5 (the long grid's default cap), far below ``SESOI["gate"]``."""
    tiny = {"gate_alpha0": lambda s: 2.5e-5 + 1e-6 * s, "gate_u0": lambda s: 4e-5 + 1e-6 * s}
    out = dict(changes)
    for name, p in GRID.items():
        if p["kind"] == "fbt":
            key = name.replace("-", "_").replace(".", "_")
            out[key] = {**out.get(key, {}), **tiny}
    return out


def test_predictions_on_inert_geometry_are_not_tested_with_the_measured_change():
    """The setups that P1, P2, P5 and P6 decide (supported) above, with every arm's gate at
    about 2.7e-5 bpc: each is *not tested: geometry inert*, and says by how much removing the
    geometry moved the bpc."""
    p1_up = dict(
        fbt_kappa_0_1=both_layers("entry_scale_{l}", 0.05),
        fbt_kappa_10=both_layers("entry_scale_{l}", 5.0) | both_layers("sigma2_{l}", lambda s: 0.7 + 0.01 * s),
    )  # fmt: skip
    p2_up = {"fbt_alpha_0": {"bpc_at_alpha_1": lambda s: 2.1 + 0.01 * s},
             "fbt": {"bpc_at_alpha_0": lambda s: 2.1 + 0.01 * s}}  # fmt: skip
    p5_up = dict(dot=_entropy_rank(2.0, 12.0), dot_temp_0_5=_entropy_rank(1.0, 16.0),
                 dot_temp_0_25=_entropy_rank(0.5, 18.0),
                 fbt=_entropy_rank(1.5, lambda s: 15.0 + 0.1 * s))  # fmt: skip
    p6_up = {"fbt_rank_8": {"erank_2": lambda s: 13.0 + 0.1 * s}}
    decide = {
        "P1": (p1_up, lambda r: V.p1_verdict(r)[0], ["fbt_kappa-10"]),
        "P2": (p2_up, V.p2_verdict, ["fbt"]),
        "P5": (p5_up, V.p5_verdict, ["fbt"]),
        "P6": (p6_up, V.p6_verdict, ["fbt_rank-1", "fbt_rank-8"]),
    }
    for name, (changes, rule, arms) in decide.items():
        assert rule(runs_with(**changes)).outcome == "supported", name  # active gates: decided
        runs = runs_with(**inert_everywhere(**changes))
        v = rule(runs)
        assert (v.outcome, v.category) == ("not tested", "geometry inert"), name
        assert v.effect is None and "inert" in v.reason
        for arm in arms:  # the measured change of every inert arm compared, in the reason
            g = V.geometry_gate(runs, arm)
            assert g.state == "inert" and g.alpha0 is not None and g.u0 is not None
            assert g.alpha0.mean == pytest.approx(2.7e-5) and g.u0.mean == pytest.approx(4.2e-5)
            assert f"{arm}: {g.text()}" in v.reason and "+2.7e-05" in g.text(), name
    out = V.outcomes_from_runs(runs_with(**inert_everywhere(**p1_up)), _timing([1.0, 1.1, 1.0]),
                               evidence="x")  # fmt: skip
    assert out["riemannian/P1"].outcome == "not tested"
    assert "inert" in out["riemannian/P1"].summary + str(out["riemannian/P1"].reason)


def test_one_inert_arm_is_enough_to_leave_a_comparison_untested():
    p6_up = {"fbt_rank_8": {"erank_2": lambda s: 13.0 + 0.1 * s,
                            "gate_alpha0": 1e-4, "gate_u0": 1e-4}}  # fmt: skip
    v = V.p6_verdict(runs_with(**p6_up))
    assert v.outcome == "not tested" and "fbt_rank-8" in v.reason and "fbt_rank-1" not in v.reason
    table = V.gate_table(runs_with(**p6_up)).set_index("config")
    assert table.loc["fbt_rank-8", "state"] == "inert" and table.loc["fbt", "state"] == "active"
    assert table.loc["fbt_alpha-0", "state"] == "inert"  # no Riemannian score to remove


# -- eq. (25), the cost, the scale, every claim ----------------------------------------------


def test_eq25_identity_is_false_and_its_defect_is_at_most_the_norm_squared_over_root_2():
    for d, r, seed in ((8, 2, 0), (6, 1, 1), (12, 3, 2)):
        c = V.eq25_counterexample(d, r, seed)
        assert c["lhs"] == pytest.approx(c["defect"], rel=1e-12)  # P^T P - I = Delta^T Delta
        assert c["lowrank"] == pytest.approx(c["defect"], rel=1e-10)
        assert c["lhs"] < 0.99 * c["rhs"]  # eq. (25)'s identity fails ...
        assert c["lhs"] <= c["bound"] * (1 + 1e-12)  # ... the bound holds
    c = V.eq25_counterexample(6, 1, 1)  # rank 2: one pair of singular values, the bound is tight
    assert c["lhs"] == pytest.approx(c["bound"], rel=1e-12)


def _timing(ratio: list[float]) -> dict[str, Any]:
    dot = [0.01] * len(ratio)
    fbt = [0.01 * r for r in ratio]
    return {"results": {"dot": {"forward_backward": {"samples_s": dot}},
                        "fbt": {"forward_backward": {"samples_s": fbt}}}}  # fmt: skip


def test_overhead_is_supported_only_inside_the_declared_margin():
    assert V.overhead_verdict(_timing([1.05, 1.08, 1.06, 1.07])).outcome == "supported"
    assert V.overhead_verdict(_timing([6.4, 6.6, 6.5])).outcome == "contradicted"


def test_outcomes_are_not_tested_in_the_bigram_regime_and_decided_below_it():
    supported = dict(
        fbt_kappa_0_1=both_layers("entry_scale_{l}", 0.05),
        fbt_kappa_10=both_layers("entry_scale_{l}", 5.0) | both_layers("sigma2_{l}", lambda s: 0.7 + 0.01 * s),
    )  # fmt: skip
    good = V.outcomes_from_runs(runs_with(**supported), _timing([6.4, 6.6, 6.5]), evidence="x")
    assert set(good) == {c.key for c in claims.CLAIMS if c.module.endswith(".fiber_bundle")}
    assert good["riemannian/P1"].outcome == "supported"  # dot baseline at 2 bpc: decisive
    assert good["riemannian/eq-25"].outcome == "contradicted"
    assert good["riemannian/overhead"].outcome == "contradicted"
    assert "2 bpc" in good["riemannian/P1"].scale and good["riemannian/P1"].evidence == "x"
    bigram = {**supported, "dot": {"val_bpc": lambda s: 3.4 + 0.01 * s}}
    early = V.outcomes_from_runs(runs_with(**bigram), _timing([6.4, 6.6, 6.5]), evidence="x")
    assert early["riemannian/P1"].outcome == "not tested"
    assert "bigram" in early["riemannian/P1"].summary
    assert early["riemannian/P1"].effect == good["riemannian/P1"].effect  # reported anyway
    assert early["riemannian/eq-25"].outcome == "contradicted"  # a float64 check has no scale


def test_training_scale_counts_the_characters_of_a_run():
    scale = V.training_scale(runs_with())
    assert (scale.steps, scale.tokens, scale.seeds) == (200, 200 * 8 * 64, 5)
    assert scale.baseline == pytest.approx(2.0, abs=0.01) and scale.decisive


def test_a_part_of_a_claim_is_stated_at_the_runs_scale_too():
    runs = runs_with(fbt_reg_none=both_layers("kappa_{l}_mean", lambda s: 1000.0 * (1 + 0.02 * s)))
    v = V.p3_verdicts(runs)["none"]  # growth far beyond the control: contradicted
    assert v.outcome == "contradicted"
    assert V.at_scale(v, V.training_scale(runs)).endswith(", contradicted")  # dot at 2 bpc
    bigram = runs_with(dot={"val_bpc": 3.4}, fbt_reg_none=both_layers("kappa_{l}_mean", 1000.0))
    assert V.at_scale(V.p3_verdicts(bigram)["none"], V.training_scale(bigram)).endswith(
        "not tested"
    )


def test_the_overview_compares_costs_by_cpu_time_once_every_cell_has_it():
    wall = runs_with()  # records made before CPU times: wall time, as stored
    assert wall.time == ("train_time_s", "training time (s)")
    table = wall.overview()
    assert "training time (s)" in table.columns and table.loc["fbt", "time / dot"] == "1.0x"
    fbt = {"train_cpu_s": 3.0}  # the Fiber Bundle cells three times the dot cells' CPU time
    cpu = runs_with(**{name: fbt for name in ("fbt", "fbt_noise")}, dot={"train_cpu_s": 1.0},
                    **{c.replace("-", "_").replace(".", "_"): {"train_cpu_s": 1.0}
                       for c in GRID if c not in ("fbt", "fbt_noise", "dot")})  # fmt: skip
    assert cpu.time == ("train_cpu_s", "training CPU time (s)")
    table = cpu.overview()
    assert "training CPU time (s)" in table.columns
    assert (
        table.loc["fbt", "time / dot"] == "3.0x" and table.loc["fbt_noise", "time / dot"] == "3.0x"
    )


# -- eq. (34): the cap against the diversity push ----------------------------------------------


def _terms_by_hand(U: torch.Tensor, kappa_min: float, kappa_max: float) -> dict[str, float]:
    """Eqs. (31) to (34) of one sequence ``U (L, d, r)`` with every ``A_t = U_t U_t^T``
    materialised (float64) and the pairs looped over: the reference for :func:`V.cap_check`."""
    A = [u @ u.T for u in U]
    kappa = [float((u * u).sum()) for u in U]
    n = len(A)
    pairs = [float(((A[i] - A[j]) ** 2).sum()) for i in range(n) for j in range(n) if i != j]
    return {
        "anti": sum(max(kappa_min - k, 0.0) for k in kappa) / n,
        "div": -sum(pairs) / len(pairs),
        "smooth": sum(float(((A[t] - A[t + 1]) ** 2).sum()) for t in range(n - 1)) / (n - 1),
        "cap": sum(max(k - kappa_max, 0.0) for k in kappa) / n,
    }


def test_the_cap_check_matches_the_materialised_regularisers_and_finds_them_unbounded():
    """The weighted terms of :func:`V.cap_check` equal eqs. (31) to (34) computed with every
    ``d x d`` metric formed (float64, to 1e-10); diversity and smoothness scale like
    ``lambda^4`` and the cap grows linearly in ``kappa`` past ``kappa_max``; with the book
    grid's weights the sum peaks and falls without bound, so eq. (34)'s claim is contradicted."""
    runs = runs_with()
    setting = V.cap_setting(runs)
    book = fb.chapter_grid()["fbt"]
    assert (setting["d"], setting["seq_len"], setting["rank"]) == (16, 64, 4)
    assert setting["kappa_max"] == book["reg"]["kappa_max"] and setting["weights"]["cap"] == 10.0
    assert setting["weights"]["div"] == pytest.approx(1.0 / book["reg"]["kappa_max"])
    small = {**setting, "seq_len": 12, "d": 6, "rank": 2}
    c = V.cap_check(**small, points=9, top=100.0)
    g = torch.Generator().manual_seed(0)
    U = torch.randn(1, 1, 12, 6, 2, generator=g, dtype=torch.float64)
    U = U * math.sqrt(small["kappa_max"] / float((U * U).sum((-1, -2)).mean()))
    for i, r in enumerate(c["ratio"]):
        ref = _terms_by_hand(U[0, 0] * math.sqrt(r), small["kappa_min"], small["kappa_max"])
        for k, v in ref.items():
            assert c["terms"][k][i] == pytest.approx(small["weights"][k] * v, rel=1e-10, abs=1e-14)
    div, smooth = c["terms"]["div"], c["terms"]["smooth"]
    np.testing.assert_allclose(div / div[0], (c["ratio"] / c["ratio"][0]) ** 2, rtol=1e-12)
    np.testing.assert_allclose(smooth / smooth[0], (c["ratio"] / c["ratio"][0]) ** 2, rtol=1e-12)
    at_one = _terms_by_hand(U[0, 0], small["kappa_min"], small["kappa_max"])
    assert c["quartic"] == pytest.approx(
        small["weights"]["div"] * at_one["div"] + small["weights"]["smooth"] * at_one["smooth"],
        rel=1e-10,
    )
    assert c["quartic"] < 0 and c["at_top"] < c["total"][0] and 1.0 < c["peak"] < 100.0
    out = V.cap_outcome(V.cap_check(**setting))
    assert out.outcome == "contradicted" and "falls without bound" in out.summary
    assert (
        V.outcomes_from_runs(runs, _timing([1.0, 1.1, 1.0]), evidence="x")[
            "riemannian/eq-34"
        ].outcome
        == "contradicted"
    )


def test_the_cap_check_passes_when_nothing_pushes_the_metric_up():
    """The check can pass: with the diversity weight 0 (the hinges and smoothness only) the
    regularisers never fall below their value at ``kappa_max``, and the outcome is supported."""
    setting = V.cap_setting(runs_with())
    calm = {**setting, "weights": {**setting["weights"], "div": 0.0}}
    c = V.cap_check(**calm)
    assert c["quartic"] >= 0 and c["at_top"] > c["total"][0]
    assert V.cap_outcome(c).outcome == "supported"
