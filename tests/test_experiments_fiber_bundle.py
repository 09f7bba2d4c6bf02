"""Chapter 4's experiment: the grid, the sweep runner it uses, the post-training analysis and
the chapter's views of the runs (per-seed values, paired differences, verdicts)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import spearmanr

from attention_atlas.data import TextCorpus, Vocab
from attention_atlas.experiments import experiment
from attention_atlas.experiments.fiber_bundle import run as fb
from attention_atlas.experiments.fiber_bundle import verdicts as V
from attention_atlas.experiments.fiber_bundle.analysis import (
    TYPE_NAMES,
    Runs,
    analyse,
    explore_window,
    token_types,
)
from attention_atlas.models import FiberBundleConfig
from attention_atlas.stats import mean_interval, paired_difference
from attention_atlas.sweep.runner import Cell, load_results, run_sweep


def test_the_sweep_runner_finds_this_module_by_name() -> None:
    assert experiment("fiber-bundle") is fb
    assert set(fb.PRESETS) >= {"smoke", "book", "long"}


def test_kappa_scale_is_tau_over_length() -> None:
    assert fb.kappa_scale(64, 4, 64) == pytest.approx(math.sqrt(2 * 16) / 64)
    assert fb.kappa_scale(64, 4, 32, tau=2.0) == pytest.approx(2.0 / 32)


def test_chapter_grid_changes_one_thing_per_configuration() -> None:
    grid = fb.chapter_grid(ranks=(1, 4), alphas=(0.0, 1.0), kappa_factors=(1.0, 10.0),
                           dot_temperatures=(0.5,))  # fmt: skip
    assert list(grid) == ["dot", "dot_temp-0.5", "fbt", "fbt_reg-none", "fbt_noise", "fbt_reg-l2",
                          "fbt_alpha-0", "fbt_rank-1", "fbt_kappa-10"]  # fmt: skip
    base = grid["fbt"]
    scale = fb.kappa_scale(64, 4, 64)
    assert base["reg"] == {"kind": "three", "kappa_max": scale, "kappa_min": scale / 2,
                           "weights": {}}  # fmt: skip
    assert grid["fbt_rank-1"]["model"] == {**base["model"], "rank": 1}
    assert grid["fbt_alpha-0"]["model"] == {**base["model"], "alpha": 0.0}
    assert grid["fbt_kappa-10"]["reg"]["kappa_max"] == pytest.approx(10 * scale)
    assert grid["fbt_reg-none"]["reg"]["kind"] == "none"
    assert grid["fbt_noise"]["model"] == {**base["model"], "metric_gradient": "noise"}
    assert grid["fbt_noise"]["reg"]["kind"] == "none"
    assert grid["fbt_reg-l2"]["reg"]["kind"] == "l2-matched"
    assert grid["dot_temp-0.5"]["model"] == {**grid["dot"]["model"],
                                             "attention_options": {"temperature": 0.5}}  # fmt: skip
    for name, params in grid.items():  # the same training everywhere
        assert params["train"] == grid["dot"]["train"], name
        if name in ("fbt", "fbt_alpha-0"):  # P2's arms are evaluated at each training alpha
            assert params["eval_alphas"] == [0.0, 1.0], name
    ablations = fb.chapter_grid(ablations=True)
    assert ablations["fbt_no-c"]["model"]["phase_c"] is False
    assert ablations["fbt_cayley"]["model"]["transport_kind"] == "cayley"
    FiberBundleConfig(**ablations["fbt_no-e"]["model"])  # every model spec builds a config


def test_book_preset_is_the_chapters_parameters_cell() -> None:
    """The book grid the chapter asks for is ``chapter_grid``'s defaults, so the stored book
    results are exactly that grid."""
    import ast
    from pathlib import Path

    src = (
        Path(fb.__file__).parents[4] / "notebooks" / "04_fiber_bundle_transformer.py"
    ).read_text()
    cell = src.split('# %% tags=["parameters"]')[1].split("# %%")[0]
    values = {t.id: ast.literal_eval(n.value) for n in ast.parse(cell).body
              if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}  # fmt: skip
    grid_keys = set(fb.chapter_grid.__kwdefaults__ or {})
    shared = {k: v for k, v in values.items() if k in grid_keys}
    assert shared and fb.chapter_grid(**shared) == fb.chapter_grid(**fb.PRESETS["book"])


def test_sweep_skips_finished_cells_and_reruns_changed_parameters(tmp_path) -> None:
    calls: list[tuple[str, int]] = []

    def run(params: dict, seed: int) -> dict:
        calls.append((str(params["x"]), seed))
        return {"value": params["x"] * 10 + seed, "history": {"step": [1, 2]}}

    cells = [Cell("a", s, {"x": 1}) for s in (0, 1)] + [Cell("b", 0, {"x": 2})]
    df = run_sweep(cells, run, tmp_path, log=None)
    assert len(calls) == 3 and sorted(df["value"]) == [10, 11, 20]
    assert "history" not in df.columns
    run_sweep(cells, run, tmp_path, log=None)
    assert len(calls) == 3  # all reused
    run_sweep([Cell("a", 0, {"x": 3})], run, tmp_path, log=None)
    assert len(calls) == 4  # new parameters -> new cell
    assert len(load_results(tmp_path)) == 4
    assert (tmp_path / "results.csv").exists()
    with pytest.raises(ValueError, match="duplicate"):
        run_sweep([cells[0], cells[0]], run, tmp_path, log=None)


def test_token_types_split_letters_into_word_initial_and_internal() -> None:
    itos = ["\n", "N", "_", "a", "b", "."]
    x = torch.tensor([[3, 4, 2, 3, 4, 5, 0, 3, 1]])  # "ab_ab.\naN"
    codes = token_types(x, itos).tolist()[0]
    assert codes == [-1, 1, 2, 0, 1, 5, 3, 0, 4]
    assert TYPE_NAMES[0] == "word_initial" and TYPE_NAMES[5] == "punct"


def _toy_corpus() -> TextCorpus:
    text = list("ab_ab._abba_\n" * 40)
    vocab = Vocab(sorted(set(text)))
    ids = vocab.encode(text)
    return TextCorpus("toy", ids[:300], ids[300:], ids[300:], vocab)


def test_analyse_measures_kappa_per_token_type_from_the_models_own_metric() -> None:
    torch.manual_seed(0)
    data = _toy_corpus()
    cfg = FiberBundleConfig(vocab_size=data.vocab_size, dim=16, n_layers=2, n_heads=2,
                            max_len=12, metric_init_std=0.5)  # fmt: skip
    model = cfg.build()
    torch.manual_seed(1)
    initial = cfg.build()
    res = analyse(model, data, seq_len=12, n_seqs=6, batch_size=4, initial=initial)
    tok = res.pop("tokens")
    assert len(tok) == 6 * 12 and set(tok.columns) == {"type", "surprisal", "kappa_1", "kappa_2"}
    x = torch.as_tensor(data.valid[:72]).view(6, 12)  # the first windows of the split
    out = model(x)
    kappa = (out.attentions[0].extras["metric_factor"].double() ** 2).sum((-1, -2)).mean(1)
    np.testing.assert_allclose(tok["kappa_1"].to_numpy(), kappa.detach().reshape(-1), rtol=1e-6)
    sel = tok["type"] == 0
    assert res["kappa_1_word_initial"] == pytest.approx(float(tok.loc[sel, "kappa_1"].mean()))
    assert res["kappa_1_mean"] == pytest.approx(float(tok["kappa_1"].mean()))
    assert math.isnan(res["kappa_1_digit_or_N"])  # no digit in this text
    assert {"erank_0", "erank_2", "sigma2_1", "sigma2_2", "entropy_1", "entry_scale_2",
            "kappa_2_spearman_surprisal"} <= set(res)  # fmt: skip
    q1 = res["kappa_quantiles"]["kappa_1"]["word_internal"]
    within = tok.loc[tok["type"] == 1, "kappa_1"].to_numpy()
    np.testing.assert_allclose(q1, np.quantile(within, [0.05, 0.25, 0.5, 0.75, 0.95]), rtol=1e-5)
    # the initial model's kappa on the same windows, against the trained model's surprisal
    k0 = (initial(x).attentions[1].extras["metric_factor"].double() ** 2).sum((-1, -2)).mean(1)
    k0 = k0.detach().reshape(-1).numpy()
    assert res["init_kappa_2_mean"] == pytest.approx(float(k0.mean()), rel=1e-6)
    ok = (tok["type"] >= 0) & np.isfinite(tok["surprisal"])
    rho = spearmanr(k0[ok.to_numpy()], tok.loc[ok, "surprisal"]).statistic
    assert res["init_kappa_2_spearman_surprisal"] == pytest.approx(float(rho), rel=1e-6)
    assert res["init_kappa_2_mean"] != pytest.approx(res["kappa_2_mean"], rel=1e-3)


def test_explore_window_keeps_one_texts_attention_and_kappa() -> None:
    torch.manual_seed(0)
    data = _toy_corpus()
    model = FiberBundleConfig(vocab_size=data.vocab_size, dim=16, n_layers=2, n_heads=2,
                              max_len=12, metric_init_std=0.5).build()  # fmt: skip
    rec = explore_window(model, data, length=10)
    x = torch.as_tensor(data.valid[:10]).view(1, 10)
    assert rec["text"] == "".join(data.vocab.itos[int(i)] for i in x[0])
    out = model(x, need_weights=True)
    A = np.array(rec["attention_2"])
    np.testing.assert_allclose(A, out.attentions[1].probs[0].mean(0).detach(), atol=5e-4)
    assert A.shape == (10, 10) and np.allclose(np.triu(A, 1), 0)  # causal
    kappa = (out.attentions[0].extras["metric_factor"][0] ** 2).sum((-1, -2)).mean(0)
    np.testing.assert_allclose(rec["kappa_1"], kappa.detach(), rtol=1e-3)


def _runs() -> Runs:
    df = pd.DataFrame({
        "config": ["dot", "dot", "fbt", "fbt"], "seed": [1, 0, 0, 1],
        "val_bpc": [3.1, 3.0, 2.9, 3.05], "kappa_1_cv": [0.1, 0.2, 0.3, 0.4],
        "kappa_2_cv": [0.3, 0.4, 0.5, 0.6],
    })  # fmt: skip
    hist = {"step": [1, 2], "fiber_bundle/l0/kappa_max": [1.0, 2.0],
            "fiber_bundle/l1/kappa_max": [3.0, 5.0], "fiber_bundle/l0/kappa_mean": [1.0, 2.0],
            "fiber_bundle/l1/kappa_mean": [2.0, 3.0]}  # fmt: skip
    cells = {
        ("fbt", s): {"history": hist, "init_kappa_1_mean": 0.1, "init_kappa_2_mean": 0.3}
        for s in (0, 1)
    }
    return Runs({"dot": {}, "fbt": {}}, [0, 1], df, cells, 2, "cmd")  # type: ignore[arg-type]


def test_runs_give_per_seed_values_and_paired_differences() -> None:
    runs = _runs()
    np.testing.assert_array_equal(runs.per_seed("dot", "val_bpc"), [3.0, 3.1])  # seed order
    got = runs.paired("fbt", "dot", "val_bpc")
    assert got == paired_difference(np.array([2.9, 3.05]), np.array([3.0, 3.1]))
    assert got.mean == pytest.approx(-0.075)
    np.testing.assert_allclose(runs.mean_over_layers("fbt", "kappa_{l}_cv"), [0.4, 0.5])
    np.testing.assert_allclose(runs.last_logged("fbt", "kappa_max"), [3.5, 3.5])
    steps, values = runs.trajectory("fbt", "kappa_max")
    assert steps == [1, 2] and values.tolist() == [[2.0, 3.5], [2.0, 3.5]]
    steps, values = runs.trajectory("fbt", "kappa_mean")  # starts at initialisation, step 0
    assert steps == [0.0, 1, 2] and values.tolist() == [[0.2, 1.5, 2.5], [0.2, 1.5, 2.5]]


def test_outcomes_give_every_chapter4_claim_an_outcome_and_the_sections_exist() -> None:
    """``outcomes(smoke=True)``: the stored grid if there is one, else the smoke grid run now."""
    from pathlib import Path

    from attention_atlas import claims

    mine = [c for c in claims.CLAIMS if c.module == "attention_atlas.experiments.fiber_bundle"]
    assert {c.key for c in mine} >= {"riemannian/eq-25", "riemannian/overhead"} | {
        f"riemannian/P{i}" for i in range(1, 7)
    }
    got = V.outcomes(smoke=True)
    assert set(got) >= {c.key for c in mine}
    assert all(isinstance(o, claims.Outcome) for o in got.values())
    assert got["riemannian/eq-25"].outcome == "contradicted"  # a float64 fact, at any scale
    chapter = (Path(fb.__file__).parents[4] / "notebooks" / f"{mine[0].chapter}.py").read_text()
    headings = {line[5:].strip() for line in chapter.splitlines() if line.startswith("# ## ")}
    assert {c.section for c in mine} <= headings


def test_a_diverged_cell_is_recorded_with_its_step_and_no_analysis(monkeypatch) -> None:
    """A Fiber Bundle run whose loss goes non-finite gives a record (``val_bpc`` NaN and the
    step), not an error from the analysis of the weights it kept: else the sweep would retry the
    cell forever and the grid could never be complete (the long grid's ``fbt_kappa-0.1`` and
    ``fbt_rank-8`` did just that). A finished run's record has no ``diverged_step``."""
    text = list("ab_ab._abba_\n" * 200)
    vocab = Vocab(sorted(set(text)))
    ids = vocab.encode(text)
    corpus = TextCorpus("toy", ids[:2000], ids[2000:], ids[2000:], vocab)
    monkeypatch.setattr(fb, "load_char_ptb", lambda: corpus)  # nothing read from disk
    grid = fb.chapter_grid(**fb.PRESETS["smoke"])
    params = {**grid["fbt_rank-1"], "train": {**grid["fbt_rank-1"]["train"], "steps": 4}}
    fine = fb.run_cell(params, 0)
    assert math.isfinite(fine["val_bpc"]) and "diverged_step" not in fine and "sigma2_1" in fine
    blown = {**params, "train": {**params["train"], "lr": 1e30, "warmup_steps": 0}}
    with pytest.warns(RuntimeWarning, match="training diverged at step"):
        rec = fb.run_cell(blown, 0)
    assert math.isnan(rec["val_bpc"]) and 1 <= rec["diverged_step"] <= 4
    assert "sigma2_1" not in rec and "explore" not in rec and isinstance(rec["history"], dict)
    assert rec["params_total"] == fine["params_total"]


def test_a_verdict_whose_arms_diverged_is_not_tested_and_names_them() -> None:
    """P6 compares the largest and smallest metric rank: a seed where either diverged leaves
    nothing to pair, so the verdict is *not tested*, naming the arm, seeds and steps; dropping
    the seed would compare the arms on the seeds that survived."""

    rows = [
        {"config": c, "seed": s, "val_bpc": 2.0, "erank_2": e + 0.1 * s * (1 + (c == "fbt_rank-8"))}
        for c, e in (("fbt", 5.0), ("fbt_rank-1", 4.0), ("fbt_rank-8", 7.0))
        for s in (0, 1, 2)
    ]
    grid = {"fbt": {"model": {"rank": 4}}, "fbt_rank-1": {"model": {"rank": 1}},
            "fbt_rank-8": {"model": {"rank": 8}}}  # fmt: skip
    runs = Runs(grid, [0, 1, 2], pd.DataFrame(rows), {}, 2, "cmd")  # type: ignore[arg-type]
    assert runs.diverged("fbt_rank-8") == {} and V.diverged_reason(runs, ["fbt_rank-8"]) is None
    v = V.p6_verdict(runs)
    assert v.outcome != "not tested" and v.effect.mean == pytest.approx(3.1)
    rows[7] = {"config": "fbt_rank-8", "seed": 1, "val_bpc": math.nan, "diverged_step": 622}
    runs = Runs(grid, [0, 1, 2], pd.DataFrame(rows), {}, 2, "cmd")  # type: ignore[arg-type]
    assert runs.diverged("fbt_rank-8") == {1: 622} and runs.diverged("fbt_rank-1") == {}
    v = V.p6_verdict(runs)
    assert v.outcome == "not tested"
    assert v.reason == "fbt_rank-8 diverged in 1 of 3 seeds (seed 1 at step 622)"
    assert V.diverged_reason(runs, ["fbt", "fbt_rank-8", "fbt_rank-8"]) == v.reason


def test_p1_is_not_tested_when_its_weakest_level_diverged_and_keeps_its_scales() -> None:
    """P1 pairs the strongest imposed metric level with the weakest (``fbt_kappa-0.1``, which
    diverged at two seeds of the long grid): decided, with the sign strongest minus weakest,
    while every seed finished; *not tested*, naming the level, once one diverged, with the
    critical scales the chapter prints still given for both levels."""

    levels = {
        "fbt_kappa-0.1": (0.1, 0.5, 0.2),
        "fbt": (1.0, 2.0, 0.3),
        "fbt_kappa-10": (10.0, 20.0, 0.5),
    }
    rows = [
        {"config": c, "seed": s, "val_bpc": 2.0, "entry_scale_1": e, "entry_scale_2": e,
         "sigma2_1": g + 0.01 * s * f, "sigma2_2": g + 0.01 * s * f}
        for c, (f, e, g) in levels.items() for s in (0, 1, 2)
    ]  # fmt: skip
    grid = {c: {"kappa_factor": f} for c, (f, _, _) in levels.items()}
    v, p1 = V.p1_verdict(Runs(grid, [0, 1, 2], pd.DataFrame(rows), {}, 2, "cmd"))  # type: ignore[arg-type]
    assert (p1["weakest"], p1["strongest"]) == ("fbt_kappa-0.1", "fbt_kappa-10")
    assert v.outcome != "not tested" and v.effect.mean == pytest.approx(0.3 + 0.01 * 9.9)
    rows[2] = {"config": "fbt_kappa-0.1", "seed": 2, "val_bpc": math.nan, "diverged_step": 421}
    v, p1 = V.p1_verdict(Runs(grid, [0, 1, 2], pd.DataFrame(rows), {}, 2, "cmd"))  # type: ignore[arg-type]
    assert v.outcome == "not tested" and v.effect is None
    assert v.reason == "fbt_kappa-0.1 diverged in 1 of 3 seeds (seed 2 at step 421)"
    assert set(p1["scale"]) == set(levels) and p1["scale"]["fbt_kappa-10"].tolist() == [20.0] * 3


def test_the_overview_names_a_diverged_arm_and_finished_leaves_it_out() -> None:
    """A configuration that diverged at some seed has no interval in the chapter's overview (its
    row says ``diverged``, the ``diverged`` column gives seeds and steps) and is not among
    :meth:`Runs.finished`, which the figures draw; the other rows are the paired intervals."""
    rows = [
        {"config": c, "seed": s, "val_bpc": b + 0.01 * s, "train_cpu_s": t + s, "erank_2": 5.0 + s,
         "entropy_1": 2.0, "entropy_2": 2.0 + 0.1 * s}
        for c, b, t in (("dot", 2.0, 10.0), ("fbt", 1.9, 40.0), ("fbt_rank-8", 1.8, 80.0))
        for s in (0, 1, 2)
    ]  # fmt: skip
    grid = {c: {} for c in ("dot", "fbt", "fbt_rank-8")}
    runs = Runs(grid, [0, 1, 2], pd.DataFrame(rows), {}, 2, "cmd")  # type: ignore[arg-type]
    assert runs.finished() == ["dot", "fbt", "fbt_rank-8"]
    assert "diverged" not in runs.overview().columns
    for s, step in ((0, 622), (2, 718)):
        rows[6 + s] = {"config": "fbt_rank-8", "seed": s, "val_bpc": math.nan,
                       "train_cpu_s": 30.0, "diverged_step": step}  # fmt: skip
    runs = Runs(grid, [0, 1, 2], pd.DataFrame(rows), {}, 2, "cmd")  # type: ignore[arg-type]
    assert runs.finished() == ["dot", "fbt"] and runs.finished(["fbt_rank-8", "fbt"]) == ["fbt"]
    table = runs.overview()
    assert (
        table.loc["fbt_rank-8", "diverged"]
        == "2 of 3 seeds: seed 0 at step 622, seed 2 at step 718"
    )
    assert (table.loc["fbt_rank-8"].drop("diverged") == "diverged").all()
    assert (
        table.loc["fbt", "diverged"] == "" and table.loc["fbt", "time / dot"] == f"{41 / 11:.1f}x"
    )
    assert table.loc["fbt", "bpc - dot"] == paired_difference(
        runs.per_seed("fbt", "val_bpc"), runs.per_seed("dot", "val_bpc")
    ).format(3, signed=True)
    assert table.loc["fbt", "val bpc"] == mean_interval([1.9, 1.91, 1.92]).format(3)


def test_the_divergence_table_reads_each_diverged_run_at_its_last_log() -> None:
    """One row per diverged run: the step, its last log step, the largest block mean ``kappa``
    there (also over the run's ``kappa_max``) and the logged regulariser; NaN for a run that
    diverged before its first log; no row for a finished run."""
    hist = {"step": [200.0, 400.0], "reg/fiber_bundle": [-0.01, -3.6e11],
            "fiber_bundle/l0/kappa_mean": [0.004, 5.0e4], "fiber_bundle/l1/kappa_mean": [0.004, 0.01]}  # fmt: skip
    grid = {"fbt": {"reg": {"kappa_max": 0.5}}, "fbt_kappa-0.1": {"reg": {"kappa_max": 0.05}}}
    rows = [{"config": "fbt", "seed": 0, "val_bpc": 1.7},
            {"config": "fbt", "seed": 1, "val_bpc": math.nan, "diverged_step": 3},
            {"config": "fbt_kappa-0.1", "seed": 0, "val_bpc": math.nan, "diverged_step": 431},
            {"config": "fbt_kappa-0.1", "seed": 1, "val_bpc": 1.8}]  # fmt: skip
    cells = {("fbt", 1): {"history": {}}, ("fbt_kappa-0.1", 0): {"history": hist}}
    runs = Runs(grid, [0, 1], pd.DataFrame(rows), cells, 2, "cmd")  # type: ignore[arg-type]
    table = runs.divergence_table().set_index(["config", "seed"])
    assert list(table.index) == [("fbt", 1), ("fbt_kappa-0.1", 0)]
    row = table.loc[("fbt_kappa-0.1", 0)]
    assert (row["diverged_step"], row["last_log_step"], row["kappa_mean"]) == (431, 400.0, 5.0e4)
    assert row["kappa / kappa_max"] == pytest.approx(1.0e6) and row["regularizer"] == -3.6e11
    assert table.loc[("fbt", 1)][["last_log_step", "kappa_mean", "regularizer"]].isna().all()
    finished = Runs(grid, [0], pd.DataFrame(rows[:1]), {}, 2, "cmd")  # type: ignore[arg-type]
    assert finished.divergence_table().empty and "kappa / kappa_max" in finished.divergence_table()
