"""Chapter 9's experiment (experiments/zoo.py, zoo_analysis.py): the cross and its cells, the
learning-rate selection (by validation accuracy, once per arm), the anchors and the claims'
verdicts on frames whose answer is known, and a small dot model that learns MQAR."""

from __future__ import annotations

import json
import warnings
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from attention_atlas import claims
from attention_atlas.experiments.zoo import analysis as za
from attention_atlas.experiments.zoo import run as zoo

torch.set_num_threads(1)


def test_the_grid_is_a_cross_with_the_centre_once_and_longer_sequences_for_many_pairs():
    g = zoo.chapter_grid(variants=["dot", "ssm", "riemannian"], widths=[32, 64, 128],
                         pairs=[4, 8, 16, 32], centre_width=64, centre_pairs=8, seq_len=64,
                         centre_only=["riemannian"])  # fmt: skip
    mqar = {k: v for k, v in g.items() if k.startswith("mqar/")}
    cells = sorted({(v["width"], v["pairs"]) for v in mqar.values()})
    assert cells == [(32, 8), (64, 4), (64, 8), (64, 16), (64, 32), (128, 8)]
    assert len(mqar) == 2 * 6 + 1  # riemannian: the centre only
    assert "mqar/riemannian/w64-p8" in mqar and "mqar/riemannian/w32-p8" not in mqar
    assert {v["task"]["seq_len"] for v in mqar.values() if v["pairs"] < 32} == {64}
    assert {v["task"]["seq_len"] for v in mqar.values() if v["pairs"] == 32} == {128}
    sel = mqar["mqar/ssm/w32-p8"]["selection"]  # every cell selects at the centre
    assert (sel["model"]["dim"], sel["task"]["n_pairs"]) == (64, 8)
    others = {k for k, v in g.items() if not k.startswith("mqar/")}
    assert others == {"ptb/dot", "ptb/ssm", "ptb/riemannian", "time/w64-p8",
                      "ablation/mlp/w64-p4", "ablation/tied/w64-p4", "ablation/noshift/w64-p4",
                      "ablation/ssm-init/w64-p8"}  # fmt: skip
    mlp, tied = g["ablation/mlp/w64-p4"], g["ablation/tied/w64-p4"]  # at the easiest cell
    noshift = g["ablation/noshift/w64-p4"]
    dot = mqar["mqar/dot/w64-p4"]["model"]
    assert dot["token_shift"] is True and "attention_options" not in dot
    assert mlp["model"] == {**dot, "mlp_ratio": 4.0}
    assert tied["model"] == {**dot, "tie_embeddings": True}
    assert noshift["model"] == {**dot, "token_shift": False}
    assert mlp["selection"] == tied["selection"] == mqar["mqar/dot/w64-p4"]["selection"]
    # every SSM cell (and its char-PTB and timing models) starts from the recall initialisation;
    # the ablation is the same cell with the SSM's own defaults
    ssm = mqar["mqar/ssm/w64-p8"]
    assert all(v["model"]["attention_options"] == zoo.SSM_RECALL_INIT
               for k, v in mqar.items() if "/ssm/" in k)  # fmt: skip
    assert g["ptb/ssm"]["model"]["attention_options"] == zoo.SSM_RECALL_INIT
    assert g["time/w64-p8"]["arm_model"]["ssm"]["attention_options"] == zoo.SSM_RECALL_INIT
    init = g["ablation/ssm-init/w64-p8"]
    assert init["model"] == {k: v for k, v in ssm["model"].items() if k != "attention_options"}
    assert init["selection"] == ssm["selection"] and init["variant"] == "ssm"
    plain = zoo.chapter_grid(variants=["dot", "ssm"], token_shift=False, ssm_recall_init=False)
    assert not any(k.startswith(("ablation/noshift", "ablation/ssm-init")) for k in plain)
    assert all(v["model"]["token_shift"] is False and "attention_options" not in v["model"]
               for k, v in plain.items() if k.startswith(("mqar/", "ptb/")))  # fmt: skip
    with pytest.raises(ValueError, match="the centre"):
        zoo.chapter_grid(widths=[32], pairs=[4], centre_width=64, centre_pairs=4)
    with pytest.raises(ValueError, match="unknown arm"):
        zoo.chapter_grid(variants=["dot", "linear"])


def test_the_learning_rate_is_the_best_by_validation_accuracy_and_the_smaller_on_a_tie(monkeypatch):
    accs = {1e-3: 0.4, 3e-3: 0.9, 1e-2: 0.9}
    calls = []

    def fake(variant, model, task, train, reg, lr, seed):
        calls.append((lr, seed, task["n_pairs"]))
        return {"val_acc": accs[lr], "test_acc": accs[lr], "lr_used": lr}

    monkeypatch.setattr(zoo, "_mqar_run", fake)
    cell = zoo.chapter_grid(variants=["dot"], widths=[64], pairs=[4, 8], centre_width=64,
                            centre_pairs=4, select_seed=5)["mqar/dot/w64-p8"]  # fmt: skip
    out = zoo.run_cell(cell, 1)
    assert out["lr"] == 3e-3 and out["lr_used"] == 3e-3  # 3e-3 and 1e-2 tie: the smaller
    assert out["select_val_acc@0.003"] == 0.9
    # the selection runs at the centre (4 pairs) on the selection seed, then the cell itself
    assert calls == [(1e-3, 5, 4), (3e-3, 5, 4), (1e-2, 5, 4), (3e-3, 1, 8)]


def test_a_run_is_trained_once_and_then_read_back(monkeypatch, tmp_path):
    monkeypatch.setenv("ATTENTION_ATLAS_CACHE", str(tmp_path))
    trained = []

    def fake_train(*args):
        trained.append(args)
        return {"val_acc": 0.5, "history": {"step": [1]}}

    monkeypatch.setattr(zoo, "_train_mqar", fake_train)
    zoo._memo.cache_clear()
    args = ("dot", {"dim": 8}, {"n_pairs": 2}, {"steps": 1}, None, 1e-3, 0)
    first = zoo._mqar_run(*args)
    zoo._memo.cache_clear()  # a new process: the disk copy answers
    assert zoo._mqar_run(*args) == first and len(trained) == 1
    assert len(list((tmp_path / "zoo").glob("*.json"))) == 1
    zoo._mqar_run("dot", {"dim": 8}, {"n_pairs": 2}, {"steps": 1}, None, 3e-3, 0)
    assert len(trained) == 2  # another learning rate is another run
    zoo._memo.cache_clear()


def test_ssm_state_is_heads_times_d_squared_per_layer():
    assert zoo.ssm_state_size(64, 1, 2) == 2 * 64 * 64
    assert zoo.ssm_state_size(64, 4, 1) == 4 * 16 * 16


def test_a_small_dot_model_learns_mqar(monkeypatch):
    """The protocol's model (no MLP, untied embeddings, one head) on 4 pairs at length 16:
    from the 1/4 of copying a context value to near-perfect recall in 300 steps."""
    monkeypatch.setenv("ATTENTION_ATLAS_CACHE", "off")
    task = {"seq_len": 16, "n_pairs": 4, "vocab_size": 32, "query_dist": "power",
            "n_train": 4096, "n_val": 256, "n_test": 256}  # fmt: skip
    model = {"dim": 128, "n_layers": 2, "n_heads": 1, "tie_embeddings": False,
             "mlp_ratio": zoo.NO_MLP}  # fmt: skip
    train = {"steps": 300, "batch_size": 32, "warmup_steps": 25, "log_every": 50,
             "eval_batches": 1, "eval_batch_size": 256}  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning of the harness would be a defect here
        out = zoo._train_mqar("dot", model, task, train, None, 1e-3, 0)
    assert out["history"]["val_acc"][0] < 0.5  # the plateau of copying a context value ...
    assert out["test_acc"] > 0.95 and out["val_acc"] > 0.95  # ... left: it recalls
    assert out["train_acc"] - out["test_acc"] < 0.05  # not by memorising the training set


# -- analysis on frames whose answer is known ---------------------------------------------


def _frame(acc: dict, seeds=(0, 1, 2), **extra) -> pd.DataFrame:
    """MQAR rows: ``acc[(variant, width, pairs)] = per-seed test accuracies``."""
    rows = []
    for (v, w, p), values in acc.items():
        for s, a in zip(seeds, values):
            rows.append({"config": f"mqar/{v}/w{w}-p{p}", "seed": s, "variant": v, "width": w,
                         "pairs": p, "test_acc": a, "state_size": 2 * w * w, "lr": 1e-3,
                         "centre_width": 64, "centre_pairs": 2,
                         **{k: f(v, s) for k, f in extra.items()}})  # fmt: skip
    return za.mqar_frame(pd.DataFrame(rows))


GOOD = {("dot", 64, 2): [1.0, 0.995, 0.998], ("dot", 128, 2): [1.0, 1.0, 1.0],
        ("dot", 64, 4): [0.99, 0.98, 0.99], ("ssm", 64, 2): [0.9, 0.85, 0.95],
        ("ssm", 128, 2): [0.9, 0.9, 0.92], ("ssm", 64, 4): [0.4, 0.5, 0.45]}  # fmt: skip


def test_anchors_hold_on_a_sound_grid():
    a = za.anchors(_frame(GOOD))
    assert a["easiest"] == "w128-p2" and a["dot_ok"] and a["ssm_ok"] and a["chance_ok"]
    assert a["ssm_learns"]
    assert set(a["learners"]) == {"dot", "ssm"}
    assert a["ssm_fall"]["pairs"] == (2, 4) and a["ssm_fall"]["width"] == 64


def test_each_anchor_fails_when_its_condition_fails():
    bad_dot = {**GOOD, ("dot", 128, 2): [0.97, 0.98, 0.99]}
    assert not za.anchors(_frame(bad_dot))["dot_ok"]
    flat_ssm = {**GOOD, ("ssm", 64, 4): [0.9, 0.85, 0.95]}
    assert not za.anchors(_frame(flat_ssm))["ssm_ok"]
    # an SSM on the copying plateau (1/2) at the fewest pairs does not learn there: its fall
    # to 1/4 is the chance level's, and the anchor cannot ask it of that SSM
    plateau = {**GOOD, ("ssm", 64, 2): [0.5, 0.52, 0.6], ("ssm", 64, 4): [0.25, 0.26, 0.24]}
    a = za.anchors(_frame(plateau))
    assert a["ssm_ok"] and not a["ssm_learns"] and "ssm" in a["learners"]
    # a learner by its mean (0.8 > halfway from 1/2 to 1) whose interval reaches below chance
    shaky = {**GOOD, ("ssm", 128, 2): [1.0, 1.0, 0.4]}
    a = za.anchors(_frame(shaky))
    assert "ssm" in a["learners"] and not a["chance_ok"]
    # "beats chance" (1/2 here) is one-sided: every seed above it passes at the one-sided 95%
    # bound (0.617) though the two-sided 95% interval reaches down to 0.493
    spread = {**GOOD, ("ssm", 128, 2): [0.7, 0.97, 0.97]}
    a = za.anchors(_frame(spread))
    bound = a["chance_bounds"]["ssm"]
    sd = np.std([0.7, 0.97, 0.97], ddof=1)
    assert bound.level == za.ANCHOR_LEVEL and a["chance_ok"]
    assert abs(bound.low - (0.88 - 2.919986 * sd / 3**0.5)) < 1e-6
    assert za.mean_interval([0.7, 0.97, 0.97]).low < 0.5  # the two-sided 95% one would fail


def _grid(df: pd.DataFrame) -> SimpleNamespace:
    prov = SimpleNamespace(text="test grid", source="computed")
    rec = {("mqar/dot/w64-p2", 0): {"params": {"train": {"batch_size": 8}}}}
    return SimpleNamespace(frame=df, records=rec, provenance=prov)


def test_claims_follow_the_verdict_rule_against_the_dot_control():
    arms = {("dot", 64, 2): [1.0, 1.0, 1.0], ("matroidal", 64, 2): [1.0, 1.0, 1.0],
            ("cofactor", 64, 2): [1.0, 0.999, 1.0]}  # fmt: skip
    rng = np.random.default_rng(0)
    noise = {s: rng.normal(0, 0.01) for s in range(3)}
    df = _frame(
        arms,
        steps=lambda v, s: 100,
        learning_auc=lambda v, s: 0.5 + (0.2 + 0.01 * s if v == "matroidal" else 0.0) + noise[s],
        log10_grad_var=lambda v, s: -2.0 + noise[s] + (0.01 * s if v == "matroidal" else 0.0),
        grad_spikes=lambda v, s: 5.0 + s + 0.5 * s * s if v == "cofactor" else 1.0 + s,
    )
    out = za.outcomes(grid=_grid(df))
    assert {c.key for c in claims.CLAIMS if c.module.endswith(".zoo")} == set(out)
    assert out["matroidal/zoo-low-data"].outcome == "supported"  # +0.2 against SESOI 0.02
    assert out["matroidal/zoo-stability"].outcome == "supported"  # within +-0.3 in log10
    assert out["cofactor/zoo-spikes"].outcome == "contradicted"  # 4 to 6 more spikes, not fewer
    assert out["cofactor/zoo-accuracy"].outcome == "supported"  # equal within 0.02
    assert "dot-product baseline" in out["cofactor/zoo-accuracy"].scale


def test_claims_are_not_tested_when_the_dot_baseline_has_not_learned():
    arms = {("dot", 64, 2): [0.5, 0.55, 0.5], ("matroidal", 64, 2): [0.5, 0.5, 0.5],
            ("cofactor", 64, 2): [0.5, 0.5, 0.5]}  # fmt: skip
    df = _frame(arms, steps=lambda v, s: 100, learning_auc=lambda v, s: 0.9 if v == "matroidal" else 0.1 + 0.01 * s,
                log10_grad_var=lambda v, s: 0.0, grad_spikes=lambda v, s: float(s))  # fmt: skip
    out = za.outcomes(grid=_grid(df))
    assert out["matroidal/zoo-low-data"].outcome == "not tested"  # the interval says more...
    assert "halfway" in out["matroidal/zoo-low-data"].summary  # ...but the scale decides nothing


def test_the_leaderboard_has_every_arm_and_cell_with_intervals():
    board = za.leaderboard(_frame(GOOD))
    assert list(board.index) == ["dot", "ssm"] and list(board.columns) == [
        "w64-p2",
        "w128-p2",
        "w64-p4",
    ]
    assert board.loc["ssm", "w64-p4"].startswith("0.450 [")


def test_ratio_intervals_are_geometric_and_stay_positive():
    iv = za.geometric_interval([1.0, 4.0, 16.0])
    assert iv.mean == pytest.approx(4.0) and iv.low > 0 and iv.high > 16.0
    frame = pd.DataFrame({"config": ["time/w64-p4"] * 3, "dot_ms": [10.0, 12.0, 11.0],
                          "ratio_dot": [1.0] * 3, "ssm_ms": [20.0, 30.0, 22.0],
                          "ratio_ssm": [2.0, 2.5, 2.0]})  # fmt: skip
    table = za.timing_table(frame)
    assert list(table.index) == ["dot", "ssm"]
    assert table.loc["dot", "ratio to dot"] == "1.00 [1.00, 1.00]"
    assert table.loc["ssm", "ratio to dot"].startswith("2.15 [")


def test_the_chapter_runs_the_book_grid_and_has_each_claims_section():
    """Chapter 9's parameters are chapter_grid's defaults (so the chapter and the register's
    outcomes load the same stored book grid) and every zoo claim's section is a heading."""
    import inspect

    from attention_atlas.notebooks.chapters import chapter_parameters, repo_root

    chapter = repo_root() / "notebooks" / "09_zoo_equal_footing.py"
    book = chapter_parameters(chapter)
    defaults = {k: p.default for k, p in inspect.signature(zoo.chapter_grid).parameters.items()}
    shared = set(book) & set(defaults)
    assert shared >= {"variants", "widths", "pairs", "steps", "seq_len", "lrs", "centre_only"}
    for k in shared:
        assert (
            list(book[k]) == list(defaults[k])
            if isinstance(book[k], list)
            else book[k] == defaults[k]
        ), k
    assert book["seeds"] == [0, 1, 2] and zoo.PRESETS["book"] == {}
    text = chapter.read_text()
    for c in claims.CLAIMS:
        if c.module.endswith(".zoo"):
            assert f"# ## {c.section}\n" in text, c.section
            assert c.chapter == chapter.stem


def test_the_ablation_table_sets_the_protocol_beside_each_change():
    rows = [{"config": c, "seed": s, "test_acc": a, "learning_auc": a / 2}
            for c, acc in (("mqar/dot/w128-p4", [1.0, 1.0, 0.99]),
                           ("ablation/mlp/w128-p4", [0.3, 0.25, 0.28]),
                           ("ablation/tied/w128-p4", [0.26, 0.27, 0.25]),
                           ("mqar/ssm/w64-p8", [0.9, 0.8, 0.7]),
                           ("ablation/ssm-init/w64-p8", [0.1, 0.2, 0.3]),
                           ("mqar/dot/w64-p4", [0.2, 0.2, 0.2]))
            for s, a in enumerate(acc)]  # fmt: skip
    t = za.ablation_table(pd.DataFrame(rows))
    assert list(t.index) == [
        "dot w128-p4: the protocol",
        "dot w128-p4: with an MLP (4 D)",
        "dot w128-p4: with tied embeddings",
        "ssm w64-p8: the protocol",
        "ssm w64-p8: with Mamba-2's initialisation",
    ]
    assert t.iloc[1]["test accuracy"].startswith("0.277 [")
    assert t.iloc[3]["test accuracy"].startswith("0.800 [") and t.iloc[4][
        "test accuracy"
    ].startswith("0.200 [")
    assert za.ablation_table(pd.DataFrame(rows[-3:])).empty


def test_long_anchors_need_every_dot_and_ssm_cell_of_the_long_protocol(monkeypatch, tmp_path):
    import shutil

    from attention_atlas.store import results

    stored = results.results_root() / "zoo" / "long"
    configs = {k for k, v in zoo.chapter_grid(**zoo.PRESETS["long"]).items()
               if k.startswith("mqar/") and v["variant"] in ("dot", "ssm")}  # fmt: skip
    mine = tmp_path / "zoo" / "long"
    (mine / "cells").mkdir(parents=True)
    monkeypatch.setenv("ATTENTION_ATLAS_RESULTS", str(tmp_path))
    assert za.long_anchors() is None  # nothing stored
    shutil.copy(stored / "grid.json", mine / "grid.json")
    cells = [p for p in (stored / "cells").glob("*.json")
             if json.loads(p.read_text())["config"] in configs]  # fmt: skip
    assert len(cells) == 3 * len(configs)  # the stored long grid has them all, three seeds each
    for p in cells[1:]:
        shutil.copy(p, mine / "cells" / p.name)
    assert za.long_anchors() is None  # one cell missing
    shutil.copy(cells[0], mine / "cells" / cells[0].name)
    anchor, grid = za.long_anchors()
    assert len(grid.records) == len(cells)
    expect = za.anchors(za.mqar_frame(grid.frame))
    assert anchor["ssm_fall"]["difference"] == expect["ssm_fall"]["difference"]
    assert anchor["easiest"] == "w64-p4" and anchor["ssm_fall"]["pairs"] == (4, 32)


@pytest.mark.parametrize("preset", ["long", "book"])
def test_the_protocol_text_names_what_a_grid_shrinks_and_nothing_when_it_is_the_full_one(preset):
    """Read from the grid's own configurations: the long preset is the full protocol; the book
    grid names each parameter it shrinks (steps, length, vocabulary, the char-PTB budget) with
    the full value beside it, and no parameter it keeps."""
    configs = zoo.chapter_grid(**zoo.PRESETS[preset])
    grid = SimpleNamespace(records={(n, 0): {"params": c} for n, c in configs.items()})
    last = za.protocol_text(grid, zoo.PRESETS["long"]).split("\n\n")[-1]
    if preset == "long":
        assert last.startswith("**This is the full protocol**") and "rather than" not in last
        return
    book, full = zoo.PRESETS["book"], zoo.PRESETS["long"]
    defaults = zoo.chapter_grid.__kwdefaults__
    for key, words in [("steps", "{:,} rather than {:,} steps"), ("seq_len", "length {} rather than {}"),
                       ("vocab_size", "vocabulary {} rather than {}"),
                       ("ptb_budget_s", "char-PTB for {:g} s rather than {:g} s")]:  # fmt: skip
        mine, theirs = book.get(key, defaults[key]), full.get(key, defaults[key])
        assert (words.format(mine, theirs) in last) == (mine != theirs), key
    assert "batch" not in last.split("):")[-1]  # the batch size is the same in both
