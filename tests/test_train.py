"""Training: schedule, optimiser groups, metrics, extension points, resume, DDP, command line."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from attention_atlas.data import copy_task, load_digits_patches
from attention_atlas.linalg import effective_rank
from attention_atlas.models import ModelConfig, Transformer
from attention_atlas.train import (
    TrainConfig,
    build_configs,
    lr_at,
    measure_flops,
    param_groups,
    register_diagnostic,
    register_regularizer,
    train,
)

torch.set_num_threads(1)  # tiny ops on a shared 2-core machine: threads only contend

TINY = ModelConfig(dim=16, n_layers=2, n_heads=2, max_len=64)
LOSS_COLUMNS = [
    "step",
    "train_loss",
    "grad_norm_mean",
    "grad_norm_var",
    "lr",
    "val_loss",
    "val_acc",
]


def tiny_cfg(**kw) -> TrainConfig:
    base = dict(
        steps=12, batch_size=8, lr=1e-2, warmup_steps=3, log_every=3, eval_batches=2,
        eval_batch_size=32, progress=False, measure_flops=False,
    )  # fmt: skip
    base.update(kw)
    return TrainConfig(**base)


@pytest.fixture(scope="module")
def copy_data():
    return copy_task(256, 64, length=6, vocab=5)


# -- pieces --------------------------------------------------------------------------------


def test_learning_rate_warms_up_linearly_then_decays_by_cosine_to_the_floor():
    cfg = TrainConfig(steps=110, warmup_steps=10, min_lr_ratio=0.1)
    assert lr_at(0, cfg) == pytest.approx(0.1) and lr_at(9, cfg) == pytest.approx(1.0)
    assert lr_at(10, cfg) == pytest.approx(1.0)
    assert lr_at(60, cfg) == pytest.approx(0.55)  # half-way: (1 + 0.1) / 2
    assert lr_at(110, cfg) == pytest.approx(0.1)


def test_no_weight_decay_on_norms_biases_and_embeddings():
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=7, dim=8, n_layers=1, n_heads=2, bias=True))
    decay, rest = param_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    assert decayed == {
        "blocks.0.attn.qkv.weight",
        "blocks.0.attn.proj.weight",
        "blocks.0.mlp.fc.weight",
        "blocks.0.mlp.proj.weight",
    }
    assert decay["weight_decay"] == 0.1 and rest["weight_decay"] == 0.0
    assert len(decay["params"]) + len(rest["params"]) == len(list(model.parameters()))


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


def test_flop_counter_sees_the_cpu_sdpa_kernel():
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=7, dim=16, n_layers=2, n_heads=2, max_len=32)
    model = Transformer(cfg)
    x = torch.randint(0, 7, (3, 32))
    before = [p.detach().clone() for p in model.parameters()]
    f = measure_flops(model, x, x)
    b, h, length, d = 3, 2, 32, 8
    # q k^T and p v: 2 matmuls of 2 b h L^2 d flops, per layer
    assert f["forward_attention_core"] == 2 * (2 * 2 * b * h * length * length * d)
    assert f["forward_attention"] == f["forward_attention_core"] + 2 * (2 * b * length * 16 * 64)
    assert f["train_step_attention_core"] > 2 * f["forward_attention_core"]
    assert f["train_step_total"] > f["forward_total"] > f["forward_attention"]
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
    assert all(p.grad is None for p in model.parameters())


# -- a run ---------------------------------------------------------------------------------


def test_a_run_logs_every_metric_and_writes_history_and_record(copy_data, tmp_path):
    res = train(TINY, tiny_cfg(out_dir=str(tmp_path), measure_flops=True), copy_data)
    h = res.history
    assert list(h["step"]) == [3, 6, 9, 12]
    for col in LOSS_COLUMNS + ["tokens_per_s", "nonfinite_logits", "erank_0", "erank_1", "erank_2"]:
        assert col in h and h[col].notna().all(), col
    assert (h["nonfinite_logits"] == 0).all()
    assert res.final["val_loss"] < math.log(5) + 0.5
    saved = pd.read_csv(tmp_path / "history.csv")
    pd.testing.assert_frame_equal(saved, h, check_dtype=False)
    record = json.loads((tmp_path / "run.json").read_text())
    assert record["seed"] == 0 and record["versions"]["torch"] == torch.__version__
    assert "commit" in record["git"] and record["flops"]["forward_attention_core"] > 0
    assert record["model_config"]["vocab_size"] == 6  # filled in from the data
    assert record["param_counts"]["total"] == sum(p.numel() for p in res.model.parameters())


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


def test_a_time_schedule_stops_at_the_budget_with_the_lr_decayed(copy_data):
    cfg = tiny_cfg(steps=10**6, log_every=10**6, schedule="time", max_time_s=1.5, min_lr_ratio=0.1)
    res = train(TINY, cfg, copy_data)
    assert 1 <= res.final["steps"] < 10**6 and res.final["train_time_s"] >= 1.5
    assert res.history["lr"].iloc[-1] == pytest.approx(0.1 * 1e-2)
    with pytest.raises(ValueError, match="needs max_time_s"):
        train(TINY, tiny_cfg(schedule="time"), copy_data)


# -- checkpoints and resume ------------------------------------------------------------------


class Crash(RuntimeError):
    pass


def test_a_killed_run_resumes_to_bitwise_identical_weights_and_history(copy_data, tmp_path):
    model = ModelConfig(dim=16, n_layers=2, n_heads=2, dropout=0.1)  # dropout: RNG state matters
    cfg = dict(steps=14, log_every=3, checkpoint_every=4)
    full = train(model, tiny_cfg(out_dir=str(tmp_path / "full"), **cfg), copy_data)

    def crash_at_10(step, info):
        if step == 10:
            raise Crash  # after step 10's update, before its checkpoint: steps 9-10 are lost

    out = str(tmp_path / "killed")
    with pytest.raises(Crash):
        train(model, tiny_cfg(out_dir=out, **cfg), copy_data, callbacks=[crash_at_10])
    assert torch.load(Path(out) / "checkpoint.pt", weights_only=False)["step"] == 8
    resumed = train(model, tiny_cfg(out_dir=out, **cfg), copy_data, resume=True)
    for (n, a), (_, b) in zip(full.model.state_dict().items(), resumed.model.state_dict().items()):
        assert torch.equal(a, b), n
    pd.testing.assert_frame_equal(full.history[LOSS_COLUMNS], resumed.history[LOSS_COLUMNS])
    assert full.final["val_loss"] == resumed.final["val_loss"]


def test_resume_without_a_checkpoint_starts_fresh_and_needs_out_dir(copy_data, tmp_path):
    with pytest.raises(ValueError, match="resume=True needs out_dir"):
        train(TINY, tiny_cfg(), copy_data, resume=True)
    res = train(TINY, tiny_cfg(steps=3, out_dir=str(tmp_path)), copy_data, resume=True)
    assert list(res.history["step"]) == [3]


# -- data parallel ---------------------------------------------------------------------------

DDP_SCRIPT = """
import json, sys, torch
from attention_atlas.data import copy_task
from attention_atlas.models import ModelConfig
from attention_atlas.train import TrainConfig, train
torch.set_num_threads(1)
data = copy_task(256, 64, length=6, vocab=5)
cfg = TrainConfig(steps=6, batch_size=8, lr=1e-2, warmup_steps=2, log_every=3, eval_batches=2,
                  progress=False, measure_flops=False, checkpoint_every=3, out_dir=sys.argv[1])
res = train(ModelConfig(dim=16, n_layers=2, n_heads=2), cfg, data)
if int(__import__("os").environ.get("RANK", "0")) == 0:
    torch.save(res.model.state_dict(), sys.argv[1] + "/final.pt")
    json.dump({"history": res.history[["train_loss", "val_loss"]].values.tolist(),
               "world": res.record["world_size"]}, open(sys.argv[1] + "/out.json", "w"))
"""


def test_a_two_process_gloo_run_matches_one_process_on_the_same_global_batch(tmp_path):
    script = tmp_path / "ddp_run.py"
    script.write_text(DDP_SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    one, two = tmp_path / "one", tmp_path / "two"
    subprocess.run([sys.executable, str(script), str(one)], check=True, env=env, timeout=120)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                "--standalone", str(script), str(two)]  # fmt: skip
    proc = subprocess.run(torchrun, env=env, timeout=180, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r1, r2 = (json.loads((p / "out.json").read_text()) for p in (one, two))
    assert r1["world"] == 1 and r2["world"] == 2
    assert (two / "checkpoint.pt").exists()
    w1, w2 = (torch.load(p / "final.pt") for p in (one, two))
    for n in w1:
        torch.testing.assert_close(w1[n], w2[n], atol=2e-5, rtol=1e-4, msg=n)
    for a, b in zip(r1["history"], r2["history"]):
        assert a == pytest.approx(b, rel=1e-4, abs=1e-5)


# -- configs and the command line --------------------------------------------------------------


def test_overrides_route_to_model_and_train_configs():
    m, t, task = build_configs(
        {"model": {"dim": 32}, "train": {"steps": 5}},
        ["n_heads=4", "lr=1e-3", "model.attention=euclidean", "attention_options={\"tau\": 2}",
         "task.length=4", "out_dir=x", "eval_batches=null"],
    )  # fmt: skip
    assert (m.dim, m.n_heads, m.attention, m.attention_options) == (32, 4, "euclidean", {"tau": 2})
    assert (t.steps, t.lr, t.out_dir, t.eval_batches) == (5, 1e-3, "x", None)
    assert task == {"length": 4}
    with pytest.raises(ValueError, match="unknown setting 'width'"):
        build_configs({}, ["width=3"])
    with pytest.raises(ValueError, match="must look like key=value"):
        build_configs({}, ["dim"])


def test_command_line_train_prints_final_metrics_and_writes_history(tmp_path, capsys):
    from attention_atlas.__main__ import main

    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("task: copy\ntask_options: {n_train: 64, n_val: 32, length: 4}\n"
                   "model: {dim: 16, n_layers: 1, n_heads: 2}\n"
                   "train: {steps: 4, batch_size: 8, log_every: 2, progress: false, measure_flops: false}\n")  # fmt: skip
    rc = main(
        [
            "train",
            "--config",
            str(cfg),
            "--attention",
            "euclidean",
            "-o",
            "lr=1e-3",
            "--out",
            str(tmp_path / "run"),
        ]
    )
    assert rc == 0
    assert "final: val_loss=" in capsys.readouterr().out
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert (
        record["model_config"]["attention"] == "euclidean" and record["train_config"]["lr"] == 1e-3
    )
    assert len(pd.read_csv(tmp_path / "run" / "history.csv")) == 2


KILL_SCRIPT = """
import os, signal, sys, torch
from attention_atlas.data import copy_task
from attention_atlas.models import ModelConfig
from attention_atlas.train import TrainConfig, train
torch.set_num_threads(1)
data = copy_task(256, 64, length=6, vocab=5)
cfg = TrainConfig(steps=14, batch_size=8, lr=1e-2, warmup_steps=3, log_every=3, eval_batches=2,
                  eval_batch_size=32, progress=False, measure_flops=False, checkpoint_every=4,
                  out_dir=sys.argv[1])
def kill(step, info):
    if step == int(sys.argv[2]):
        os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, no exception handlers: a real kill
train(ModelConfig(dim=16, n_layers=2, n_heads=2, dropout=0.1), cfg, data, callbacks=[kill])
"""


@pytest.mark.parametrize("kill_at", [5, 10])
def test_a_sigkilled_process_resumes_to_bitwise_identical_weights_and_history(
    copy_data, tmp_path, kill_at
):
    model = ModelConfig(dim=16, n_layers=2, n_heads=2, dropout=0.1)
    cfg = dict(steps=14, log_every=3, checkpoint_every=4)
    full = train(model, tiny_cfg(out_dir=str(tmp_path / "full"), **cfg), copy_data)
    out = tmp_path / "killed"
    script = tmp_path / "kill_run.py"
    script.write_text(KILL_SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(out), str(kill_at)], timeout=300)
    assert proc.returncode == -9, "the child should die by SIGKILL"
    resumed = train(model, tiny_cfg(out_dir=str(out), **cfg), copy_data, resume=True)
    for (n, a), (_, b) in zip(full.model.state_dict().items(), resumed.model.state_dict().items()):
        assert torch.equal(a, b), n
    pd.testing.assert_frame_equal(full.history[LOSS_COLUMNS], resumed.history[LOSS_COLUMNS])
    assert full.final["val_loss"] == resumed.final["val_loss"]


def test_metric_parameters_of_attention_variants_are_not_decayed():
    model = Transformer(ModelConfig(dim=32, n_layers=1, n_heads=2, attention="matroidal"))
    groups = param_groups(model, 0.1)
    no_decay = {id(p) for p in groups[1]["params"]}
    metric = [
        p for m in model.modules() if hasattr(m, "metric_parameters") for p in m.metric_parameters()
    ]
    assert metric and all(id(p) in no_decay for p in metric)


def test_regularizers_of_other_modules_resolve_by_name_without_an_import():
    code = "from attention_atlas.train import available_regularizers as r; print(r())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "cofactor" in out.stdout
