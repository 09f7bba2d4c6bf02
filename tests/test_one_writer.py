"""One writer per output folder: a run into a folder another live run holds is refused in one
line naming the holder (pid, host, start time) before anything is written; a lock left by a
dead process is taken over; the lock goes with the run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attention_atlas.atomic import WRITER_LOCK, FolderInUse, folder_lock
from attention_atlas.data import copy_task
from attention_atlas.models import ModelConfig
from attention_atlas.train import TrainConfig, train
from attention_atlas.validate import ConfigError

ROOT = Path(__file__).resolve().parents[1]
MODEL = ModelConfig(dim=16, n_layers=1, n_heads=2)


def _cfg(out: Path) -> TrainConfig:
    return TrainConfig(steps=2, batch_size=4, log_every=2, eval_batches=1, progress=False,
                       measure_flops=False, out_dir=str(out))  # fmt: skip


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


HOLD = (
    "import sys, time\n"
    "from attention_atlas.atomic import folder_lock\n"
    "with folder_lock(sys.argv[1], 'train'):\n"
    "    print('held', flush=True)\n"
    "    time.sleep(600)\n"
)


def test_a_second_writer_is_refused_naming_the_holder_and_writes_nothing(tmp_path):
    out = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE,
                              text=True)  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(ConfigError, match=rf"in use by train of pid {holder.pid} on .* since"):
            train(MODEL, _cfg(out), copy_task(64, 16, length=4, vocab=5))
        assert sorted(p.name for p in out.iterdir()) == [WRITER_LOCK]
        with pytest.raises(FolderInUse, match=f"pid {holder.pid}"), folder_lock(out):
            pass
    finally:
        holder.kill()
        holder.wait()
    with folder_lock(out):  # its holder is dead: taken over
        pass
    assert not (out / WRITER_LOCK).exists()


def test_the_command_line_refuses_a_folder_in_use_in_one_line(tmp_path):
    out = tmp_path / "run"
    with folder_lock(out, "train"):
        proc = subprocess.run(
            [sys.executable, "-m", "attention_atlas", "train", "--task", "copy", "-o", "steps=2",
             "-o", "progress=false", "--out", str(out)],
            capture_output=True, text=True, cwd=ROOT, timeout=300,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )  # fmt: skip
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2, proc.stderr
    assert (
        len(lines) == 1 and lines[0].startswith("error: ") and "in use by train of pid" in lines[0]
    )
    assert not (out / "run.json").exists()


def test_a_lock_left_by_a_dead_process_is_taken_over_and_released(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    stale = {"host": os.uname().nodename, "pid": _dead_pid(), "what": "train", "since": "then"}
    (out / WRITER_LOCK).write_text(json.dumps(stale))
    res = train(MODEL, _cfg(out), copy_task(64, 16, length=4, vocab=5))
    assert res.final["steps"] == 2 and (out / "run.json").exists()
    assert not (out / WRITER_LOCK).exists()


def test_a_second_sweep_into_a_folder_in_use_is_refused_unless_it_joins(tmp_path, capsys):
    """`sweep --out` takes the same lock: refused in one line naming the holder, nothing
    written; `--join` shares the running sweep's cells instead (the per-cell locks)."""
    from attention_atlas.__main__ import main

    out = tmp_path / "grid"
    holder = subprocess.Popen([sys.executable, "-c", HOLD.replace("'train'", "'sweep toy'"),
                               str(out)], stdout=subprocess.PIPE, text=True)  # fmt: skip
    argv = ["sweep", "toy", "--preset", "smoke", "--seeds", "0", "--out", str(out), "--no-progress"]
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        capsys.readouterr()
        assert main(argv) == 2
        lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
        assert len(lines) == 1 and f"in use by sweep toy of pid {holder.pid} on" in lines[0]
        assert sorted(p.name for p in out.iterdir()) == [WRITER_LOCK]
        assert main([*argv, "--join"]) == 0
        assert (out / "grid.json").exists() and len(list((out / "cells").glob("*.json"))) == 1
    finally:
        holder.kill()
        holder.wait()
    assert main(argv) == 0  # its holder is dead: taken over, and every cell is stored already
    assert not (out / WRITER_LOCK).exists()
