"""A training run: it learns, logs every metric, writes its history and record, calls the
extension points, and follows the time schedule."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time

import pandas as pd
import pytest
import torch
from train_helpers import LOSS_COLUMNS, TINY, tiny_cfg

from attention_atlas.data import copy_task, load_digits_patches
from attention_atlas.linalg import effective_rank
from attention_atlas.models import ModelConfig
from attention_atlas.train import TrainConfig, register_diagnostic, register_regularizer, train

torch.set_num_threads(1)  # tiny ops on a shared 2-core machine: threads only contend


@pytest.fixture(scope="module")
def copy_data():
    return copy_task(256, 64, length=6, vocab=5)


def copy_run(lr: float) -> dict[str, float]:
    """100 steps on the copy task (5 symbols, length 6); the final full-validation metrics."""
    data = copy_task(512, 64, length=6, vocab=5)
    cfg = TrainConfig(
        steps=100, batch_size=32, lr=lr, warmup_steps=10, log_every=100, eval_batches=2,
        progress=False, measure_flops=False, effective_rank=False,
    )  # fmt: skip
    return train(ModelConfig(dim=32, n_layers=2, n_heads=2), cfg, data).final


def test_training_learns_to_copy_below_the_entropy_of_the_symbols():
    # The copied symbols are uniform over 5, so a model that does not read the first half
    # cannot do better than log 5 = 1.61 nats (an untrained one scores about log 6 = 1.79).
    final = copy_run(lr=1e-2)
    assert final["val_loss"] < 0.1 * math.log(5)
    assert final["val_acc"] > 0.95


def test_a_run_logs_every_metric_and_writes_history_and_record(copy_data, tmp_path):
    res = train(TINY, tiny_cfg(out_dir=str(tmp_path), measure_flops=True), copy_data)
    h = res.history
    assert list(h["step"]) == [3, 6, 9, 12]
    for col in LOSS_COLUMNS + ["tokens_per_s", "nonfinite_logits", "erank_0", "erank_1", "erank_2"]:
        assert col in h and h[col].notna().all(), col
    assert (h["nonfinite_logits"] == 0).all()
    saved = pd.read_csv(tmp_path / "history.csv")
    pd.testing.assert_frame_equal(saved, h, check_dtype=False)
    record = json.loads((tmp_path / "run.json").read_text())
    assert record["seed"] == 0 and record["versions"]["torch"] == torch.__version__
    assert "commit" in record["git"] and record["flops"]["forward_attention_core"] > 0
    assert record["model_config"]["vocab_size"] == 6  # filled in from the data
    assert record["param_counts"]["total"] == sum(p.numel() for p in res.model.parameters())


def test_effective_rank_is_one_for_rank_one_and_n_for_orthogonal_matrices():
    u = torch.randn(10, 1, dtype=torch.float64)
    assert float(effective_rank(u @ torch.randn(1, 6, dtype=torch.float64))) == pytest.approx(
        1.0, abs=1e-6
    )
    assert float(effective_rank(torch.eye(6, dtype=torch.float64))) == pytest.approx(6.0)
    s = torch.tensor([3.0, 1.0], dtype=torch.float64)
    p = s / s.sum()
    want = math.exp(-(p * p.log()).sum())
    assert float(effective_rank(torch.diag(s))) == pytest.approx(want)
    assert effective_rank(torch.randn(4, 5, 3)).shape == (4,)


def test_digits_classifier_trains():
    data = load_digits_patches(patch=4)
    cfg = tiny_cfg(steps=40, log_every=40, batch_size=32, lr=1e-2, warmup_steps=5)
    res = train(ModelConfig(dim=16, n_layers=1, n_heads=2), cfg, data)
    assert res.record["model_config"]["task"] == "classify"
    assert res.final["val_acc"] > 0.6  # chance is 0.1


def test_regularizers_and_diagnostics_are_called_and_logged(copy_data):
    calls = {"reg": 0}

    @register_regularizer("_test_l2")
    def l2(model, output, batch, *, scale=1.0):
        calls["reg"] += 1
        return scale * sum((p * p).sum() for p in model.parameters())

    @register_diagnostic("_test_maxprob")
    def maxprob(model, output, batch):
        return {"max": float(max(a.probs.max() for a in output.attentions))}

    cfg = tiny_cfg(
        steps=6, regularizers=[{"name": "_test_l2", "weight": 1e-4, "scale": 2.0}],
        diagnostics=[{"name": "_test_maxprob"}],
    )  # fmt: skip
    h = train(TINY, cfg, copy_data).history
    assert calls["reg"] == 6
    assert (h["reg/_test_l2"] > 0).all()
    assert ((h["_test_maxprob/max"] > 0) & (h["_test_maxprob/max"] <= 1)).all()
    with pytest.raises(ValueError, match="unknown regularizer 'nope'; known: .*_test_l2"):
        train(TINY, tiny_cfg(regularizers=[{"name": "nope"}]), copy_data)


def test_regularizers_of_other_modules_resolve_by_name_without_an_import():
    code = "from attention_atlas.train import available_regularizers as r; print(r())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "cofactor" in out.stdout


def test_the_cpu_time_leaves_out_what_the_process_did_not_compute(copy_data):
    # a callback that sleeps stands for a pause (SIGSTOP) or another process holding the core:
    # wall time counts it, the process's CPU time does not
    res = train(TINY, tiny_cfg(steps=4), copy_data, callbacks=[lambda step, info: time.sleep(0.25)])
    wall, cpu = res.final["train_time_s"], res.final["train_cpu_s"]
    assert wall >= 1.0 and 0 < cpu < wall - 0.9, (wall, cpu)
    assert res.record["final"]["train_cpu_s"] == cpu


def test_a_time_schedule_stops_at_the_budget_with_the_lr_decayed(copy_data):
    cfg = tiny_cfg(steps=10**6, log_every=10**6, schedule="time", max_time_s=1.5, min_lr_ratio=0.1)
    res = train(TINY, cfg, copy_data)
    assert 1 <= res.final["steps"] < 10**6 and res.final["train_time_s"] >= 1.5
    assert res.history["lr"].iloc[-1] == pytest.approx(0.1 * 1e-2)
    with pytest.raises(ValueError, match="needs max_time_s"):
        train(TINY, tiny_cfg(schedule="time"), copy_data)
