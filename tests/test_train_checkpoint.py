"""Checkpoints and resume: a run killed at any step (even inside a checkpoint write) resumes to
the weights and history of an uninterrupted run, bit for bit (CPU); a resume under changed
settings is refused; a non-finite loss stops a run, keeping the last good weights."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from train_helpers import LOSS_COLUMNS, TINY, tiny_cfg

from attention_atlas.data import copy_task
from attention_atlas.models import ModelConfig
from attention_atlas.train import register_regularizer, train
from attention_atlas.validate import ConfigError

torch.set_num_threads(1)  # tiny ops on a shared 2-core machine: threads only contend

DROPOUT = ModelConfig(dim=16, n_layers=2, n_heads=2, dropout=0.1)  # dropout: RNG state matters
RUN = dict(steps=14, log_every=3, checkpoint_every=4)


@pytest.fixture(scope="module")
def copy_data():
    return copy_task(256, 64, length=6, vocab=5)


@pytest.fixture(scope="module")
def full_run(copy_data, tmp_path_factory):
    """The uninterrupted run every resumed one must reproduce."""
    return train(DROPOUT, tiny_cfg(out_dir=str(tmp_path_factory.mktemp("full")), **RUN), copy_data)


def assert_same_run(full, resumed) -> None:
    for (n, a), (_, b) in zip(full.model.state_dict().items(), resumed.model.state_dict().items()):
        assert torch.equal(a, b), n
    pd.testing.assert_frame_equal(full.history[LOSS_COLUMNS], resumed.history[LOSS_COLUMNS])
    assert full.final["val_loss"] == resumed.final["val_loss"]


class Crash(RuntimeError):
    pass


def test_a_killed_run_resumes_to_bitwise_identical_weights_and_history(
    copy_data, full_run, tmp_path
):
    def crash_at_10(step, info):
        if step == 10:
            raise Crash  # after step 10's update, before its checkpoint: steps 9-10 are lost

    out = str(tmp_path / "killed")
    with pytest.raises(Crash):
        train(DROPOUT, tiny_cfg(out_dir=out, **RUN), copy_data, callbacks=[crash_at_10])
    saved = torch.load(Path(out) / "checkpoint.pt", weights_only=False)
    assert saved["step"] == 8
    resumed = train(DROPOUT, tiny_cfg(out_dir=out, **RUN), copy_data, resume=True)
    assert_same_run(full_run, resumed)
    # the CPU time goes on from the checkpoint's, as the wall time does
    assert resumed.final["train_cpu_s"] > saved["timing"]["cpu_s"] > 0


def test_resume_without_a_checkpoint_starts_fresh_and_needs_out_dir(copy_data, tmp_path):
    with pytest.raises(ValueError, match="resume=True needs out_dir"):
        train(TINY, tiny_cfg(), copy_data, resume=True)
    res = train(TINY, tiny_cfg(steps=3, out_dir=str(tmp_path)), copy_data, resume=True)
    assert list(res.history["step"]) == [3]


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
    copy_data, full_run, tmp_path, kill_at
):
    out = tmp_path / "killed"
    script = tmp_path / "kill_run.py"
    script.write_text(KILL_SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(out), str(kill_at)], timeout=300)
    assert proc.returncode == -9, "the child should die by SIGKILL"
    resumed = train(DROPOUT, tiny_cfg(out_dir=str(out), **RUN), copy_data, resume=True)
    assert_same_run(full_run, resumed)


DIE_IN_WRITE_SCRIPT = """
import io, os, signal, sys, torch
from attention_atlas.data import copy_task
from attention_atlas.models import ModelConfig
from attention_atlas.train import TrainConfig, train
torch.set_num_threads(1)
data = copy_task(256, 64, length=6, vocab=5)
cfg = TrainConfig(steps=14, batch_size=8, lr=1e-2, warmup_steps=3, log_every=3, eval_batches=2,
                  eval_batch_size=32, progress=False, measure_flops=False, checkpoint_every=4,
                  out_dir=sys.argv[1])
real_save, calls = torch.save, [0]
def dying_save(obj, f, *args, **kwargs):  # the n-th checkpoint: half its bytes, then SIGKILL
    calls[0] += 1
    if calls[0] == int(sys.argv[2]):
        buf = io.BytesIO()
        real_save(obj, buf, *args, **kwargs)
        f.write(buf.getvalue()[: len(buf.getvalue()) // 2])
        f.flush()
        os.fsync(f.fileno())
        os.kill(os.getpid(), signal.SIGKILL)
    return real_save(obj, f, *args, **kwargs)
torch.save = dying_save
train(ModelConfig(dim=16, n_layers=2, n_heads=2, dropout=0.1), cfg, data)
"""


def test_a_process_killed_while_writing_a_checkpoint_resumes_from_the_previous_one(
    copy_data, full_run, tmp_path
):
    out = tmp_path / "killed"
    script = tmp_path / "die_in_write.py"
    script.write_text(DIE_IN_WRITE_SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(out), "2"], timeout=300)
    assert proc.returncode == -9, "the child should die by SIGKILL inside the second write"
    partial = out / ".checkpoint.pt.partial"
    assert partial.exists() and partial.stat().st_size > 0  # the torn write, never renamed
    assert torch.load(out / "checkpoint.pt", weights_only=False)["step"] == 4  # the old file
    resumed = train(DROPOUT, tiny_cfg(out_dir=str(out), **RUN), copy_data, resume=True)
    assert_same_run(full_run, resumed)
    assert not partial.exists()  # the next write went through it and renamed it


def test_a_resume_under_changed_settings_is_refused_listing_every_change(copy_data, tmp_path):
    out = str(tmp_path / "run")
    train(TINY, tiny_cfg(steps=4, checkpoint_every=4, out_dir=out), copy_data)
    changed = ModelConfig(dim=32, n_layers=2, n_heads=2, max_len=64)
    with pytest.raises(ConfigError, match="the configuration changed") as err:
        train(changed, tiny_cfg(steps=4, lr=2e-2, checkpoint_every=4, out_dir=out), copy_data, resume=True)  # fmt: skip
    msg = str(err.value)
    assert "model.dim: 16 -> 32" in msg and "train.lr: 0.01 -> 0.02" in msg and "\n" not in msg
    # settings that do not change what is computed may change
    res = train(TINY, tiny_cfg(steps=4, checkpoint_every=2, num_threads=1, compile=True, out_dir=out), copy_data, resume=True)  # fmt: skip
    assert res.final["steps"] == 4


def test_the_command_line_refuses_a_changed_resume_and_a_fresh_run_over_a_checkpoint(
    tmp_path, capsys
):
    from attention_atlas.__main__ import main

    base = ["train", "--task", "copy", "-o", "task.n_train=64", "-o", "dim=16", "-o", "n_heads=2"]
    base += ["-o", "steps=2", "-o", "checkpoint_every=2", "-o", "progress=false", "--out", str(tmp_path)]  # fmt: skip
    assert main(base) == 0
    capsys.readouterr()
    assert main(base) == 2  # no --resume over an earlier run's checkpoint
    assert "holds the checkpoint of an earlier run" in capsys.readouterr().err
    assert main([*base, "--resume", "-o", "lr=1e-4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "train.lr: 0.003 -> 0.0001" in err[0]


# -- divergence ----------------------------------------------------------------------------------

FAIL_AT = {"step": 0, "calls": 0}


@register_regularizer("_test_nonfinite")
def nonfinite_at(model, output, batch, *, kind="loss"):
    """0 until call FAIL_AT["step"]; then a NaN value ("loss") or a finite value whose
    gradient is not finite ("gradient")."""
    FAIL_AT["calls"] += 1
    p = next(model.parameters())
    if FAIL_AT["calls"] < FAIL_AT["step"]:
        return (p * 0).sum()
    if kind == "loss":
        return (p * 0).sum() + float("nan")
    return torch.sqrt((p * 0).sum())  # value 0, gradient 1 / (2 sqrt(0)) * 0 = nan


@pytest.mark.parametrize("kind,quantity", [("loss", "loss"), ("gradient", "gradient norm")])
def test_a_non_finite_loss_stops_the_run_keeping_the_last_good_weights(
    copy_data, tmp_path, kind, quantity
):
    FAIL_AT.update(step=6, calls=0)
    cfg = tiny_cfg(
        steps=12, checkpoint_every=4, out_dir=str(tmp_path),
        regularizers=[{"name": "_test_nonfinite", "weight": 1.0, "kind": kind}],
    )  # fmt: skip
    with pytest.warns(RuntimeWarning, match=f"diverged at step 6: the {quantity} is nan"):
        res = train(TINY, cfg, copy_data)
    assert res.diverged is not None and res.diverged["step"] == 6
    assert res.record["status"] == "diverged" and res.final["steps"] == 5
    assert all(math.isnan(v) for k, v in res.final.items() if k.startswith("val_"))
    record = json.loads((tmp_path / "run.json").read_text())
    assert record["status"] == "diverged" and record["diverged"]["quantity"] == quantity
    ckpt = torch.load(tmp_path / "checkpoint.pt", weights_only=False)
    assert ckpt["step"] == 4  # the last good checkpoint is kept
    assert all(torch.isfinite(p).all() for p in res.model.parameters())


def test_the_command_line_reports_divergence_in_one_line_and_exits_1(tmp_path, capsys):
    from attention_atlas.__main__ import main

    FAIL_AT.update(step=3, calls=0)
    rc = main(
        ["train", "--task", "copy", "-o", "task.n_train=64", "-o", "dim=16", "-o", "n_heads=2",
         "-o", "steps=6", "-o", "progress=false", "-o", "measure_flops=false",
         "-o", 'regularizers=[{"name": "_test_nonfinite"}]', "--out", str(tmp_path)]
    )  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1
    assert len([ln for ln in err if ln.startswith("error:")]) == 1
    assert "error: training diverged at step 3: the loss is nan" in err[-1]
