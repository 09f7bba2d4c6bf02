"""Checkpoints and resume: a run killed at any step resumes to the weights and history of an
uninterrupted run, bit for bit (CPU)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from train_helpers import LOSS_COLUMNS, TINY, tiny_cfg

from attention_atlas.data import copy_task
from attention_atlas.models import ModelConfig
from attention_atlas.train import train

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
    assert torch.load(Path(out) / "checkpoint.pt", weights_only=False)["step"] == 8
    resumed = train(DROPOUT, tiny_cfg(out_dir=out, **RUN), copy_data, resume=True)
    assert_same_run(full_run, resumed)


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
