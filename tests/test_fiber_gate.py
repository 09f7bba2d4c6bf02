"""Chapter 4's geometry gate: a trained Fiber Bundle model evaluated with the metric removed
(``U_t = 0`` at its own alpha, :func:`evaluated_without_metric`) attends by the distance part
of the geodesic score, ``-|q_i - k_j|^2 / tau`` (eq. (15) at ``g = I``), and is restored after;
the gate's interval and its decision against the declared smallest effect."""

from __future__ import annotations

import math

import pytest
import torch

from attention_atlas.models import FiberBundleConfig, fbt_attentions
from attention_atlas.models.fiber_bundle import evaluated_without_metric

DT = torch.float64

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = {"vocab_size": 11, "dim": 16, "n_layers": 2, "n_heads": 2, "max_len": 12}


def _grown(**kw: object) -> torch.nn.Module:
    """A tiny float64 Fiber Bundle model whose metric, curvature and projection are non-zero."""
    torch.manual_seed(0)
    model = FiberBundleConfig(**{**TINY, **kw}).build().to(DT)  # type: ignore[arg-type]
    g = torch.Generator().manual_seed(1)
    for m in fbt_attentions(model):
        with torch.no_grad():
            w = m.metric_net.fc2.weight
            w.copy_(0.3 * torch.randn(w.shape, generator=g, dtype=DT))
        if m.curvature is not None:
            m.curvature.beta.data.fill_(0.4)
        if m.projection is not None:
            m.projection.gamma_param.data.fill_(0.5)
    return model.eval()


def _distance_probs(q: torch.Tensor, k: torch.Tensor, tau: float) -> torch.Tensor:
    """Causal ``softmax_j(-|q_i - k_j|^2 / tau)`` written out: ``(B, H, L, L)`` from ``(B, H, L, d)``."""
    diff = q[..., :, None, :] - k[..., None, :, :]  # (B, H, L, L, d)
    s = -(diff**2).sum(-1) / tau
    n = q.shape[-2]
    keep = torch.ones(n, n, dtype=torch.bool).tril()
    return torch.softmax(s.masked_fill(~keep, -math.inf), dim=-1)


@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_without_metric_the_scores_are_the_euclidean_distance_part(alpha: float) -> None:
    model = _grown(alpha=alpha)
    x = torch.randint(0, 11, (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        before = model(x, need_weights=True)
        with evaluated_without_metric(model):
            assert all(not m.use_metric for m in fbt_attentions(model))
            off = model(x, need_weights=True)
        after = model(x, need_weights=True)
    tau = fbt_attentions(model)[0].tau
    for res in off.attentions:
        assert torch.count_nonzero(res.extras["metric_factor"]) == 0
        ref = _distance_probs(res.extras["query"], res.extras["key"], tau)
        torch.testing.assert_close(res.probs, ref, rtol=1e-12, atol=1e-12)
    # the same reference does not hold with the metric on (the test could fail) ...
    res = before.attentions[0]
    ref_on = _distance_probs(res.extras["query"], res.extras["key"], tau)
    assert (res.probs - ref_on).abs().max() > 1e-4
    # ... and removing it changes the model's output, which is restored after
    assert (off.logits - before.logits).abs().max() > 1e-4
    torch.testing.assert_close(after.logits, before.logits, rtol=0, atol=0)
    assert all(m.use_metric for m in fbt_attentions(model))


@pytest.fixture(scope="module")
def smoke_gate_grid() -> dict[str, dict[str, object]]:
    from attention_atlas.experiments.fiber_bundle import run as R

    return R.chapter_grid(**R.PRESETS["smoke"], dot_controls=True, time_budget_s=1.0)


def test_every_fiber_bundle_cell_records_its_gate_against_the_same_windows(
    smoke_gate_grid: dict[str, dict[str, object]],
) -> None:
    from attention_atlas.experiments.fiber_bundle import run as R

    out = R.run_cell(smoke_gate_grid["fbt_reg-none"], 0)  # type: ignore[arg-type]
    # the gate's reference is the final evaluation itself, on the same windows
    assert out["bpc_own"] == pytest.approx(out["val_bpc"], rel=1e-9, abs=1e-9)
    for key, at in (("gate_alpha0", "bpc_at_alpha_0"), ("gate_u0", "bpc_at_u0")):
        assert math.isfinite(out[key])
        assert out[key] == pytest.approx(out[at] - out["bpc_own"], abs=1e-12)
    assert out["steps_done"] == 6


def test_the_parameter_matched_dot_model_is_the_closest_width(
    smoke_gate_grid: dict[str, dict[str, object]],
) -> None:
    from attention_atlas.experiments.fiber_bundle import run as R
    from attention_atlas.models import ModelConfig, param_counts

    model = smoke_gate_grid["fbt"]["model"]  # type: ignore[index]
    base = {k: model[k] for k in ("dim", "n_layers", "n_heads", "max_len")}  # type: ignore[index]
    width = R.matched_dot_width(base)
    assert smoke_gate_grid["dot_params"]["model"]["dim"] == width  # type: ignore[index]
    target = param_counts(FiberBundleConfig(**base, vocab_size=R.PTB_VOCAB).build())["total"]

    def gap(w: int) -> int:
        cfg = ModelConfig(**{**base, "dim": w}, vocab_size=R.PTB_VOCAB)
        return abs(param_counts(cfg.build())["total"] - target)

    h = base["n_heads"]
    assert width > base["dim"]  # the metric, transport and torsion nets add parameters
    assert gap(width) <= min(gap(width - h), gap(width + h))


def test_the_flop_matched_dot_arm_trains_more_steps_by_the_counted_ratio(
    smoke_gate_grid: dict[str, dict[str, object]],
) -> None:
    from attention_atlas.experiments.fiber_bundle import run as R

    g = smoke_gate_grid
    p = g["dot"]["train"]  # type: ignore[index]
    base = {k: g["dot"]["model"][k] for k in ("dim", "n_layers", "n_heads", "max_len")}  # type: ignore[index]
    ratio = R.flop_ratio(base, p["batch_size"], p["seq_len"])  # type: ignore[index]
    assert ratio > 1.0
    assert g["dot_flops"]["train"]["steps"] == round(p["steps"] * ratio)  # type: ignore[index]
    t = g["dot_time"]["train"]  # type: ignore[index]
    assert t["schedule"] == "time" and t["max_time_s"] == 1.0  # type: ignore[index]


def test_the_vocabulary_the_parameter_counts_assume_is_char_ptbs() -> None:
    from attention_atlas.data import load_char_ptb
    from attention_atlas.experiments.fiber_bundle import run as R

    assert load_char_ptb().vocab_size == R.PTB_VOCAB


def _runs(gates: dict[str, list[float]], extra: dict[str, list[float]] | None = None):  # type: ignore[no-untyped-def]
    """Runs of ``fbt`` (alpha 1) and ``fbt_alpha-0`` at three seeds with the given per-seed
    ``gate_u0`` of ``fbt`` and P2's evaluations (``fbt`` worse at alpha 0 by 0.1 bpc)."""
    import pandas as pd

    from attention_atlas.experiments.fiber_bundle.analysis import Runs

    rows = []
    for s in range(3):
        rows.append({"config": "fbt", "seed": s, "val_bpc": 2.0, "bpc_at_alpha_1": 2.0,
                     "bpc_at_alpha_0": 2.0 + gates["alpha0"][s], "gate_u0": gates["u0"][s],
                     "gate_alpha0": gates["alpha0"][s]})  # fmt: skip
        rows.append({"config": "fbt_alpha-0", "seed": s, "val_bpc": 2.1, "bpc_at_alpha_0": 2.1,
                     "bpc_at_alpha_1": 2.3 + 0.01 * s, "gate_u0": 0.0, "gate_alpha0": 0.0})  # fmt: skip
    grid = {"fbt": {"kind": "fbt", "model": {"alpha": 1.0}, "kappa_factor": 1.0,
                    "reg": {"kind": "three"}},
            "fbt_alpha-0": {"kind": "fbt", "model": {"alpha": 0.0}, "kappa_factor": 1.0,
                            "reg": {"kind": "three"}}}  # fmt: skip
    return Runs(grid, [0, 1, 2], pd.DataFrame(rows), {}, 2, "cmd")  # type: ignore[arg-type]


def test_the_gate_is_active_only_when_its_interval_lies_beyond_the_smallest_effect() -> None:
    from attention_atlas.experiments.fiber_bundle import verdicts as V

    inert = _runs({"alpha0": [1e-5, 2e-5, 3e-5], "u0": [1e-4, 2e-4, 1e-4]})
    g = V.geometry_gate(inert, "fbt")
    assert g.state == "inert" and g.alpha0 is not None and g.alpha0.mean == pytest.approx(2e-5)
    active = _runs({"alpha0": [0.10, 0.11, 0.12], "u0": [1e-4, 2e-4, 1e-4]})
    assert V.geometry_gate(active, "fbt").state == "active"
    # an interval reaching below the smallest effect is not enough, however large its mean
    wide = _runs({"alpha0": [0.0, 0.02, 0.2], "u0": [0.0, 0.0, 0.001]})
    assert V.geometry_gate(wide, "fbt").state == "inert"
    # a geometry whose removal helps by more than the smallest effect is acting too (it hurts)
    harmful = _runs({"alpha0": [-0.10, -0.11, -0.12], "u0": [1e-4, 2e-4, 1e-4]})
    assert V.geometry_gate(harmful, "fbt").state == "active"
    table = V.gate_table(active).set_index("config")
    assert table.loc["fbt", "state"] == "active" and table.loc[
        "fbt", "alpha0_mean"
    ] == pytest.approx(0.11)


def test_p2_is_not_tested_geometry_inert_on_an_inert_arm_and_decided_on_an_active_one() -> None:
    from attention_atlas.experiments.fiber_bundle import verdicts as V

    v = V.p2_verdict(_runs({"alpha0": [1e-5, 2e-5, 3e-5], "u0": [1e-4, 2e-4, 1e-4]}))
    assert v.outcome == "not tested" and v.category == "geometry inert"
    assert "2e-05" in v.reason and v.sesoi == V.SESOI["bpc"]
    v = V.p2_verdict(_runs({"alpha0": [0.10, 0.11, 0.12], "u0": [1e-4, 2e-4, 1e-4]}))
    assert v.outcome == "supported" and v.effect is not None
    # per seed, the mean of the two mismatched gaps: fbt at alpha 0 (2.0 + gate) minus the
    # alpha-0 arm (2.1), and the alpha-0 arm at alpha 1 (2.3 + 0.01 s) minus fbt (2.0)
    per_seed = [((0.10 + 0.01 * s - 0.1) + (0.3 + 0.01 * s)) / 2 for s in range(3)]
    assert v.effect.mean == pytest.approx(sum(per_seed) / 3, abs=1e-12)


def test_the_divergence_finding_names_the_block_that_ran_away_and_the_log_before() -> None:
    import pandas as pd

    from attention_atlas.experiments.fiber_bundle import verdicts as V
    from attention_atlas.experiments.fiber_bundle.analysis import Runs

    hist = {"step": [100, 200], "train_loss": [2.5, 2.4], "reg/fiber_bundle": [-1e-3, -3e11],
            "fiber_bundle/l0/kappa_mean": [0.004, 5e4], "fiber_bundle/l1/kappa_mean": [0.004, 0.01],
            "fiber_bundle/l0/div": [-1e-5, -2e11], "fiber_bundle/l1/div": [-1e-5, -1e-4]}  # fmt: skip
    calm = {**hist, "fiber_bundle/l0/kappa_mean": [0.004, 0.0045], "reg/fiber_bundle": [-1e-3] * 2}
    grid = {"fbt_kappa-0.1": {"kind": "fbt", "model": {"rank": 4}, "kappa_factor": 0.1,
                              "reg": {"kind": "three", "kappa_max": 0.0044}}}  # fmt: skip
    cells = {("fbt_kappa-0.1", 0): {"history": hist, "diverged_step": 231},
             ("fbt_kappa-0.1", 1): {"history": calm}}  # fmt: skip
    df = pd.DataFrame([{"config": "fbt_kappa-0.1", "seed": 0, "val_bpc": math.nan, "diverged_step": 231},
                       {"config": "fbt_kappa-0.1", "seed": 1, "val_bpc": 2.0, "diverged_step": math.nan}])  # fmt: skip
    runs = Runs(grid, [0, 1], df, cells, 2, "cmd")  # type: ignore[arg-type]
    f = V.divergence_finding(runs).set_index("seed")
    assert f.loc[0, "runaway_step"] == 200 and f.loc[0, "block"] == 0
    assert f.loc[0, "kappa_before"] == 0.004 and f.loc[0, "kappa_at"] == 5e4
    assert (
        f.loc[0, "others_at"] == 0.01 and f.loc[0, "div_at"] == -2e11 and f.loc[0, "loss_at"] == 2.4
    )
    assert math.isnan(f.loc[1, "runaway_step"])
    assert f.loc[1, "largest_ratio"] == pytest.approx(0.01 / 0.0044)  # block 1, the largest


def test_the_matched_preset_is_the_unregularised_model_and_its_controls_at_a_decisive_scale() -> (
    None
):
    from attention_atlas.experiments.fiber_bundle import run

    grid = run.chapter_grid(**run.PRESETS["matched"])
    assert list(grid) == ["dot", "fbt_reg-none", "dot_params", "dot_flops", "dot_time"]
    assert grid["fbt_reg-none"]["reg"]["kind"] == "none"
    assert grid["fbt_reg-none"]["train"]["steps"] == run.MATCHED_STEPS
    assert grid["dot_time"]["train"]["max_time_s"] == pytest.approx(
        run.GATE_TIME_BUDGET_S * run.MATCHED_STEPS / 400
    )
    # the controls are the gate preset's, at the matched preset's steps
    gate = run.chapter_grid(**{**run.PRESETS["gate"], "steps": run.MATCHED_STEPS, "log_every": 250,
                               "time_budget_s": run.MATCHED_TIME_BUDGET_S})  # fmt: skip
    for name in ("dot", "fbt_reg-none", "dot_params", "dot_flops"):
        assert grid[name] == gate[name], name
    with pytest.raises(ValueError, match="matched_only needs dot_controls"):
        run.chapter_grid(matched_only=True)


def test_ungated_lists_arms_missing_a_gate_on_a_trained_seed_and_spares_the_rest() -> None:
    """A cell stored before the gate (no ``gate_u0``) is listed; the alpha-0 arm (Euclidean by
    design) and an arm diverged at every seed are not; a diverged seed does not count."""
    import numpy as np

    from attention_atlas.experiments.fiber_bundle import verdicts as V

    runs = _runs({"alpha0": [1e-5, 2e-5, 3e-5], "u0": [1e-4, 2e-4, 1e-4]})
    assert V.ungated(runs) == []
    df = runs.df.copy()
    df.loc[df.config == "fbt", "gate_u0"] = np.nan  # stored before the gate
    df.loc[df.config == "fbt_alpha-0", "gate_u0"] = np.nan
    old = type(runs)(runs.grid, runs.seeds, df, {}, 2, "cmd")
    assert V.ungated(old) == ["fbt"]
    df2 = df.assign(diverged_step=np.where((df.config == "fbt") & (df.seed == 1), 300.0, np.nan))
    df2.loc[(df2.config == "fbt") & (df2.seed != 1), "gate_u0"] = 0.0  # re-run: seed 1 diverged
    assert V.ungated(type(runs)(runs.grid, runs.seeds, df2, {}, 2, "cmd")) == []
    df3 = df.assign(diverged_step=np.where(df.config == "fbt", 300.0, np.nan))
    assert V.ungated(type(runs)(runs.grid, runs.seeds, df3, {}, 2, "cmd")) == []
    line = V.long_regate_command(["fbt", "fbt_rank-8"])
    assert "--preset long" in line and "--only fbt fbt_rank-8" in line
    assert f"--redo-before {V.GATE_SINCE}" in line and "--no-resume" not in line
