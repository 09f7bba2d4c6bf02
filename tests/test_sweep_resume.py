"""Cells that resume mid-way (``sweep --checkpoint-every``): a runner killed inside a cell's
training leaves no record, and the cell run again resumes from its last checkpoint to exactly
the record an uninterrupted cell makes (CPU, one thread); runs that a checkpoint cannot restore
(callbacks) or that checkpoint themselves are left alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sweep_cells
import torch
from train_helpers import tiny_cfg

from attention_atlas.data import copy_task
from attention_atlas.models import ModelConfig
from attention_atlas.provenance import Provenance
from attention_atlas.store.records import read_records
from attention_atlas.sweep.runner import Cell, cell_key, run_sweep
from attention_atlas.train import train
from attention_atlas.train.resumable import claim_slot, in_flight, resumable_training

torch.set_num_threads(1)

TESTS = Path(__file__).parent
CELL = Cell("tiny", 3, {"steps": 14})
DROPOUT = ModelConfig(dim=16, n_layers=2, n_heads=2, dropout=0.1)  # RNG state matters

_RUNNER = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {tests!r})
    import sweep_cells
    from attention_atlas.sweep.runner import Cell, run_sweep
    run_sweep([Cell("tiny", 3, {{"steps": 14}})], sweep_cells.train_cell, {out!r},
              checkpoint_every=4, log=None)
    """
)


def _metrics(record: dict) -> dict:
    return {k: record[k] for k in ("val_loss", "weights_sq", "train_loss")}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict:
    """The record of the cell run without checkpoints: what every resumed run must make."""
    out = tmp_path_factory.mktemp("plain")
    run_sweep([CELL], sweep_cells.train_cell, out, log=None)
    (record,) = read_records(out)
    assert "resumed_from" not in record["provenance"]
    return record


def _killed_runner(out: Path, kill_at: int) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "SWEEP_TEST_KILL_AT_STEP": str(kill_at),
           "SWEEP_TEST_STEP_SLEEP": "0.5"}  # fmt: skip
    code = _RUNNER.format(tests=str(TESTS), out=str(out))
    proc = subprocess.run([sys.executable, "-c", code], env=env, timeout=300)
    assert proc.returncode == -9, "the runner should die by SIGKILL mid-cell"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kill_at", [5, 10])
def test_a_runner_killed_mid_cell_resumes_the_cell_to_the_uninterrupted_record(
    tmp_path: Path, uninterrupted: dict, kill_at: int
) -> None:
    out = tmp_path / "out"
    _killed_runner(out, kill_at)  # after that step's update, before its checkpoint
    ckpt = out / ".checkpoints" / cell_key(CELL) / "run0" / "checkpoint.pt"
    assert read_records(out) == [] and ckpt.exists()
    saved = torch.load(ckpt, weights_only=False)
    last = kill_at // 4 * 4  # the last checkpoint written (every 4 steps)
    assert saved["step"] == last
    assert in_flight(out) == {cell_key(CELL): [(last, 14)]}  # what `results list` shows
    run_sweep([CELL], sweep_cells.train_cell, out, checkpoint_every=4, log=None)
    (record,) = read_records(out)
    assert _metrics(record) == _metrics(uninterrupted)  # bit for bit
    assert record["provenance"]["resumed_from"] == [last]
    assert json.loads((out / "cells" / f"{cell_key(CELL)}.json").read_text()) == record
    assert not (out / ".checkpoints" / cell_key(CELL)).exists()  # removed with the record
    assert in_flight(out) == {}
    assert record["train_cpu_s"] > saved["timing"]["cpu_s"] > 0  # it goes on from the saved
    carried = saved["timing"]["t_train"] + saved["timing"]["interval_elapsed"]
    # this attempt (well under a second of work) plus the training carried over (the killed
    # attempt paused 0.5 s in each of its steps)
    assert record["cell_seconds"] > carried >= 0.5 * last
    # the clock times are this attempt's: it finished before now, not `carried` seconds later
    started, finished = (
        datetime.fromisoformat(record["provenance"][k]) for k in ("started", "finished")
    )
    assert started <= finished <= datetime.now(UTC)
    text = Provenance.from_records([record, uninterrupted], source="stored", experiment="tiny",
                                   preset="book", folder=out).text  # fmt: skip
    assert "2 cells (1 resumed from checkpoints)" in text


@pytest.mark.timeout(300)
def test_a_cell_run_afresh_ignores_the_checkpoints_of_a_killed_attempt(
    tmp_path: Path, uninterrupted: dict
) -> None:
    out = tmp_path / "out"
    _killed_runner(out, kill_at=6)
    assert (out / ".checkpoints" / cell_key(CELL) / "run0" / "checkpoint.pt").exists()
    run_sweep([CELL], sweep_cells.train_cell, out, checkpoint_every=4, resume=False, log=None)
    (record,) = read_records(out)
    assert "resumed_from" not in record["provenance"]
    assert _metrics(record) == _metrics(uninterrupted)


def test_a_run_with_callbacks_or_its_own_folder_takes_no_slot(tmp_path: Path) -> None:
    data = copy_task(256, 64, length=6, vocab=5)
    with resumable_training(tmp_path / "block", 2) as block:
        assert block is not None
        train(DROPOUT, tiny_cfg(steps=4), data, callbacks=[lambda step, info: None])
        train(DROPOUT, tiny_cfg(steps=4, out_dir=str(tmp_path / "own")), data)
        assert block.runs == 0 and not (tmp_path / "block").exists()
        train(DROPOUT, tiny_cfg(steps=4), data)  # the first run the block checkpoints
        assert block.runs == 1 and block.resumed == []
        saved = torch.load(tmp_path / "block" / "run0" / "checkpoint.pt", weights_only=False)
        assert saved["step"] == 4
        slot = claim_slot(writes_itself=False, has_callbacks=False)
        assert slot is not None and slot.path == tmp_path / "block" / "run1" / "checkpoint.pt"
    assert claim_slot(writes_itself=False, has_callbacks=False) is None  # outside the block


def test_a_finished_run_in_a_block_run_again_resumes_at_its_end(tmp_path: Path) -> None:
    data = copy_task(256, 64, length=6, vocab=5)
    plain = train(DROPOUT, tiny_cfg(steps=6), data)
    with resumable_training(tmp_path, 3):
        first = train(DROPOUT, tiny_cfg(steps=6), data)
    with resumable_training(tmp_path, 3) as again:
        second = train(DROPOUT, tiny_cfg(steps=6), data)
    assert again is not None and again.resumed == [6]
    for res in (first, second):
        for (n, a), b in zip(plain.model.state_dict().items(), res.model.state_dict().values()):
            assert torch.equal(a, b), n
        assert res.final["val_loss"] == plain.final["val_loss"]


def test_a_block_without_a_folder_or_interval_changes_nothing(tmp_path: Path) -> None:
    with resumable_training(None, 5) as a, resumable_training(tmp_path, 0) as b:
        assert a is None and b is None
        assert claim_slot(writes_itself=False, has_callbacks=False) is None
    with pytest.raises(ValueError, match="checkpoint interval must be a number of steps >= 0"):
        with resumable_training(tmp_path, -1):
            pass


def test_a_folder_that_cannot_be_made_costs_the_checkpoints_not_the_run(tmp_path: Path) -> None:
    data = copy_task(256, 64, length=6, vocab=5)
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    plain = train(DROPOUT, tiny_cfg(steps=4), data)
    with resumable_training(blocker / "checkpoints", 2) as block:
        with pytest.warns(RuntimeWarning, match="no checkpoints for this run: cannot make"):
            res = train(DROPOUT, tiny_cfg(steps=4), data)
    assert block is not None and block.resumed == [] and blocker.is_file()
    assert res.final["val_loss"] == plain.final["val_loss"]


@pytest.mark.timeout(300)
def test_checkpointed_cells_in_a_process_pool_make_the_records_of_this_process(
    tmp_path: Path, uninterrupted: dict
) -> None:
    cells = [CELL, Cell("tiny", 4, {"steps": 14})]
    run_sweep(cells, sweep_cells.train_cell, tmp_path / "pool", workers=2, checkpoint_every=4,
              log=None)  # fmt: skip
    run_sweep(cells, sweep_cells.train_cell, tmp_path / "here", log=None)
    pool = {r["seed"]: _metrics(r) for r in read_records(tmp_path / "pool")}
    here = {r["seed"]: _metrics(r) for r in read_records(tmp_path / "here")}
    assert pool == here and pool[3] == _metrics(uninterrupted)
    assert not any((tmp_path / "pool" / ".checkpoints").iterdir())  # each removed with its cell
