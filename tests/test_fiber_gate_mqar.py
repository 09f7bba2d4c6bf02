"""The MQAR half of chapter 4's matched comparison: the grid's arms are matched as declared
(parameters, training FLOPs, wall clock), a cell is checked before any work, a Fiber Bundle
cell records its geometry gate as the test accuracy lost, and the comparison is decided by the
rule, gated."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import pytest

from attention_atlas.experiments.fiber_bundle import mqar as M
from attention_atlas.experiments.fiber_bundle import run as R
from attention_atlas.experiments.fiber_bundle import verdicts as V
from attention_atlas.experiments.fiber_bundle.analysis import Runs
from attention_atlas.validate import ConfigError

pytestmark = pytest.mark.usefixtures("one_thread")

TINY: dict[str, Any] = {"width": 16, "pairs": 2, "seq_len": 16, "vocab_size": 16, "steps": 4, "batch_size": 8,
        "lrs": [1e-3, 3e-3], "n_train": 64, "n_val": 16, "n_test": 16, "log_every": 2,
        "time_budget_s": 0.5}  # fmt: skip


@pytest.fixture(scope="module")
def tiny_grid() -> dict[str, dict[str, Any]]:
    return R.chapter_grid(mqar=TINY)


def test_the_mqar_preset_is_the_mqar_arms_only_and_the_gate_preset_has_none() -> None:
    assert R.PRESETS["gate-mqar"] == {"mqar": {}}
    gate = R.chapter_grid(**R.PRESETS["gate"])
    assert all(p["kind"] in ("dot", "fbt") for p in gate.values())


def test_the_mqar_arms_are_matched_as_declared(tiny_grid: dict[str, dict[str, Any]]) -> None:
    from attention_atlas.experiments.fiber_bundle.controls import flop_ratio, matched_dot_width

    g = tiny_grid
    assert list(g) == list(M.MQAR_ARMS)
    assert {p["kind"] for p in g.values()} == {M.MQAR_KIND}
    assert g["fbt_reg-none"]["variant"] == "fiber_bundle"
    assert all(g[a]["variant"] == "dot" for a in M.MQAR_ARMS if a != "fbt_reg-none")
    model = g["dot"]["model"]
    assert (
        model == g["fbt_reg-none"]["model"] and model["token_shift"] and not model["tie_embeddings"]
    )
    assert g["dot_params"]["model"]["dim"] == matched_dot_width(model, 16) > model["dim"]
    ratio = flop_ratio(model, 8, 16, 16)
    assert ratio > 1.0 and g["dot_flops"]["train"]["steps"] == round(4 * ratio)
    t = g["dot_time"]["train"]
    assert (t["schedule"], t["max_time_s"]) == ("time", 0.5) and t["steps"] == 400
    for p in g.values():
        R.check_cell(p)  # every arm passes its checks


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"arm": "dot_everything"}, "arm"),
        ({"variant": "dot"}, "variant"),  # the Fiber Bundle arm built as dot
        ({"selection": {"lrs": [], "seed": 0}}, "lrs"),
        ({"selection": {"lrs": [1e-3, -1.0], "seed": 0}}, "lrs"),
        ({"selection": {"lrs": [1e-3], "seed": -1}}, "select_seed"),
        ({"flop_ratio": 0.5}, "flop_ratio"),
        (
            {
                "task": {
                    "seq_len": 4,
                    "n_pairs": 2,
                    "vocab_size": 16,
                    "query_dist": "power",
                    "n_train": 64,
                    "n_val": 16,
                    "n_test": 16,
                }
            },
            "seq_len >= 4",
        ),  # fmt: skip
    ],
)
def test_a_bad_mqar_cell_is_refused_before_any_work(
    tiny_grid: dict[str, dict[str, Any]], change: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        R.check_cell({**tiny_grid["fbt_reg-none"], **change})


def test_a_time_matched_arm_without_a_budget_is_refused(
    tiny_grid: dict[str, dict[str, Any]],
) -> None:
    p = tiny_grid["dot_time"]
    with pytest.raises(ConfigError, match="time_budget_s"):
        R.check_cell({**p, "train": {**p["train"], "max_time_s": 0.0}})


def test_a_fiber_bundle_mqar_cell_records_the_accuracy_its_geometry_is_worth(
    tiny_grid: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ATTENTION_ATLAS_CACHE", "off")
    out = R.run_cell(tiny_grid["fbt_reg-none"], 0)
    assert out["lr"] in TINY["lrs"] and out["steps_done"] == 4
    assert set(out) >= {"select_val_acc@0.001", "select_val_acc@0.003"}
    assert out["acc_own"] == pytest.approx(out["test_acc"], abs=1e-9)  # the same test split
    for key, at in (("gate_acc_alpha0", "acc_at_alpha_0"), ("gate_acc_u0", "acc_at_u0")):
        assert 0.0 <= out[at] <= 1.0
        assert out[key] == pytest.approx(out["acc_own"] - out[at], abs=1e-12)
    dot = R.run_cell(tiny_grid["dot"], 0)
    assert "gate_acc_alpha0" not in dot and math.isfinite(dot["test_acc"])


def _mqar_runs(fbt_acc: float, gate: float, seeds: int = 5, dot_acc: float = 0.80) -> Runs:
    """Synthetic MQAR runs: every dot arm at ``dot_acc`` test accuracy (a little seed noise,
    none at the ceiling of 1), the Fiber Bundle arm at ``fbt_acc`` with ``gate`` accuracy lost
    when its geometry is removed."""
    grid = R.chapter_grid(mqar=TINY)
    rng = np.random.default_rng(0)
    rows = []
    for arm in grid:
        for s in range(seeds):
            base = fbt_acc if arm == "fbt_reg-none" else dot_acc
            acc = min(1.0, base + float(rng.normal(0, 0.003)))
            row = {"config": arm, "seed": s, "test_acc": acc}
            if arm == "fbt_reg-none":
                row |= {"gate_acc_alpha0": gate + 0.001 * s, "gate_acc_u0": gate + 0.002 * s}
            rows.append(row)
    return Runs(grid, list(range(seeds)), pd.DataFrame(rows), {}, 2, "cmd")


def test_the_mqar_comparison_is_decided_by_the_rule_and_gated() -> None:
    ahead = V.mqar_matched_verdicts(_mqar_runs(0.90, 0.10))
    assert set(ahead) == set(V.MATCHED)
    assert all(v.outcome == "supported" for v in ahead.values())
    effect = ahead["dot_params"].effect
    assert effect is not None and effect.mean == pytest.approx(0.10, abs=0.01)
    level = V.mqar_matched_verdicts(_mqar_runs(0.80, 0.10))
    assert all(v.outcome == "contradicted" for v in level.values())  # within 0.02 of dot
    inert = V.mqar_matched_verdicts(_mqar_runs(0.90, 1e-4))  # ahead, but not by its geometry
    for v in inert.values():
        assert (v.outcome, v.category) == ("not tested", "geometry inert")
        assert "fbt_reg-none" in str(v.reason) and "test accuracy lost" in str(v.reason)
    g = V.geometry_gate(_mqar_runs(0.90, 1e-4), "fbt_reg-none", on="acc")
    assert g.state == "inert" and g.sesoi == V.SESOI["gate_acc"] == 0.01
    out = V.mqar_matched_outcome(_mqar_runs(0.90, 0.10), None)
    assert out.outcome == "supported" and "wall clock" in out.summary
    assert V.mqar_matched_outcome(None, None).outcome == "not tested"


def test_the_mqar_gate_table_has_the_fiber_bundle_arm_only() -> None:
    table = V.gate_table(_mqar_runs(0.90, 0.10), on="acc")
    assert table.config.tolist() == ["fbt_reg-none"] and table.state.iloc[0] == "active"
    assert table.alpha0_mean.iloc[0] == pytest.approx(0.102)


def test_a_control_at_the_ceiling_leaves_the_comparison_not_tested_measure_saturated() -> None:
    """Dot at 1.0 (as at chapter 9's book centre cell): no arm can be better by 0.02, so the
    superiority test could not have supported the claim; with headroom it is decided."""
    at_ceiling = V.mqar_matched_verdicts(_mqar_runs(0.999, 0.10, dot_acc=1.0))
    for v in at_ceiling.values():
        assert v.outcome == "not tested" and v.category == "measure saturated", v
        assert "below the ceiling of 1" in v.reason
    room = V.mqar_matched_verdicts(_mqar_runs(0.999, 0.10, dot_acc=0.97))
    assert all(v.outcome == "supported" for v in room.values())
    # one control seed at the ceiling is not saturation: the mean has room for the effect
    runs = _mqar_runs(0.999, 0.10, dot_acc=0.95)
    runs.df.loc[(runs.df.config == "dot_params") & (runs.df.seed == 0), "test_acc"] = 1.0
    assert V.mqar_matched_verdicts(runs)["dot_params"].outcome == "supported"


def test_the_long_mqar_preset_is_chapter_9s_long_protocol_at_its_hardest_cell() -> None:
    """``gate-mqar-long``: chapter 9's long protocol (64 tokens, vocabulary 512, 1,000 steps of
    32 sequences, the same learning rates) at width 32 and 8 pairs; every arm passes its checks,
    and the time-matched arm's budget is the stated measurement."""
    from attention_atlas.experiments.zoo.run import PRESETS as ZOO

    assert R.PRESETS["gate-mqar-long"] == {"mqar": M.MQAR_LONG}
    g = R.chapter_grid(**R.PRESETS["gate-mqar-long"])
    long = ZOO["long"]
    fbt = g["fbt_reg-none"]
    assert (fbt["model"]["dim"], fbt["task"]["n_pairs"]) == (32, 8)
    assert 32 in long["widths"] and 8 in long["pairs"]
    assert (
        fbt["task"]["seq_len"] == long["seq_len"]
        and fbt["task"]["vocab_size"] == long["vocab_size"]
    )
    assert (
        fbt["train"]["steps"] == long["steps"] and fbt["train"]["batch_size"] == long["batch_size"]
    )
    assert g["dot_time"]["train"]["max_time_s"] == M.MQAR_LONG["time_budget_s"] == 80.0
    for p in g.values():
        R.check_cell(p)
    assert M.mqar_command("gate-mqar-long") == M.MQAR_LONG_COMMAND != M.mqar_command(None)
    assert "--preset gate-mqar-long " in M.MQAR_LONG_COMMAND


def test_the_mqar_claim_is_decided_on_the_long_grid_once_it_is_started(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The long grid (started) decides; before it, the centre grid; an incomplete long grid
    leaves the claim not tested, naming the command that runs the rest."""
    from types import SimpleNamespace

    calls: list[str] = []

    def fake(preset: str = "gate") -> tuple[Any, Any]:
        calls.append(preset)
        grid = SimpleNamespace(
            records=[1, 2], missing=[3], provenance=SimpleNamespace(preset=preset)
        )
        return (None, grid) if preset == "gate-mqar-long" else ("centre", grid)

    monkeypatch.setattr(V, "load_gate_runs", fake)
    runs, grid = V.mqar_claim_grid()
    assert runs is None and grid.provenance.preset == "gate-mqar-long"
    out = V.mqar_matched_outcome(runs, grid)
    assert out.outcome == "not tested" and "2 of 3 cells" in out.summary
    assert M.MQAR_LONG_COMMAND in out.summary
    monkeypatch.setattr(V, "load_gate_runs", lambda preset="gate": (None, None)
                        if preset == "gate-mqar-long" else ("centre", None))  # fmt: skip
    assert V.mqar_claim_grid()[0] == "centre"
