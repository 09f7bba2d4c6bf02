"""The sweep runner and its records: keys, atomic writes, per-cell locks, resume, the local
process pool, and two runners sharing one folder."""

from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import sweep_cells
import torch

from attention_atlas.__main__ import main
from attention_atlas.experiments import EXPERIMENTS, experiment, toy
from attention_atlas.store.records import (
    CellLocks,
    canonical,
    config_hash,
    dumps_record,
    read_records,
    seal,
    write_atomic,
)
from attention_atlas.sweep.runner import Cell, cell_key, load_results, make_cells, run_sweep

TESTS = Path(__file__).parent


def _metrics(df: pd.DataFrame) -> pd.DataFrame:
    return df.drop(columns=["cell_seconds"]).sort_values("key").reset_index(drop=True)


# -- keys ------------------------------------------------------------------------------------


def test_config_hash_is_the_sha256_of_sorted_compact_json() -> None:
    params = {"b": 1, "a": [0.5, True, None, "x"]}
    ref = hashlib.sha256(b'{"a":[0.5,true,null,"x"],"b":1}').hexdigest()[:12]
    assert config_hash(params) == ref


def test_config_hash_ignores_order_number_types_and_float_spelling() -> None:
    ref = config_hash({"lr": 0.001, "dims": [8, 16], "opt": {"beta": 0.9, "eps": 1e-8}, "on": True})
    same = [
        {"on": True, "opt": {"eps": 1e-08, "beta": 0.9}, "dims": (8, 16), "lr": 1e-3},
        {"lr": np.float64(0.001), "dims": np.array([8, 16]), "opt": {"beta": 0.9, "eps": 1e-8},
         "on": np.bool_(True)},
        {"lr": 0.001, "dims": [8.0, 16.0], "opt": {"beta": 0.9, "eps": 1e-8}, "on": True},
        {"lr": torch.tensor(0.001, dtype=torch.float64), "dims": torch.tensor([8, 16]),
         "opt": {"beta": 0.9, "eps": 1e-8}, "on": True},
    ]  # fmt: skip
    for params in same:
        assert config_hash(params) == ref, params
    assert config_hash({"x": -0.0}) == config_hash({"x": 0})


def test_config_hash_changes_with_any_value() -> None:
    base = {"lr": 0.001, "steps": 10, "flag": True, "name": "a"}
    variants = [{"lr": 0.0011}, {"lr": math.nextafter(0.001, 1.0)}, {"steps": 11},
                {"flag": 1}, {"name": "1"}, {"extra": None}]  # fmt: skip
    hashes = {config_hash({**base, **v}) for v in variants}
    assert config_hash(base) not in hashes and len(hashes) == len(variants)
    assert (
        config_hash({"x": math.nan})
        == config_hash({"x": float("nan")})
        != config_hash({"x": math.inf})
    )


def test_canonical_names_the_path_of_a_value_it_cannot_hash() -> None:
    with pytest.raises(TypeError, match=r"params\.model\.act: a object"):
        canonical({"model": {"act": object()}})
    with pytest.raises(TypeError, match="keys must be strings"):
        canonical({"model": {1: 2}})


def test_cell_key_is_config_seed_and_parameter_hash() -> None:
    cell = Cell("fbt rank/4", 3, {"rank": 4})
    assert cell_key(cell) == f"fbt-rank-4__seed3__{config_hash({'rank': 4})}"


# -- atomic writes ---------------------------------------------------------------------------


def test_write_atomic_never_clobbers_without_overwrite(tmp_path: Path) -> None:
    path = tmp_path / "a.json"
    assert write_atomic(path, "first", overwrite=False)
    assert not write_atomic(path, "second", overwrite=False)
    assert path.read_text() == "first"
    assert write_atomic(path, "third")
    assert path.read_text() == "third"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]  # no temporary left


def test_a_writer_killed_before_the_rename_leaves_no_record(tmp_path: Path) -> None:
    """SIGKILL between writing the temporary file and linking it: no record, only a hidden
    temporary file that readers ignore."""
    script = textwrap.dedent(f"""
        import os, signal
        from attention_atlas.store import records
        os.link = lambda *a: os.kill(os.getpid(), signal.SIGKILL)
        records.write_atomic({str(tmp_path / "cells" / "c.json")!r}, '{{"config": "c"}}', overwrite=False)
    """)
    (tmp_path / "cells").mkdir()
    proc = subprocess.run([sys.executable, "-c", script], timeout=120)
    assert proc.returncode == -signal.SIGKILL
    left = [p.name for p in (tmp_path / "cells").iterdir()]
    assert len(left) == 1 and left[0].startswith(".c.json.") and left[0].endswith(".tmp")
    assert read_records(tmp_path) == [] and load_results(tmp_path).empty


# -- locks -----------------------------------------------------------------------------------


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _lock_file(path: Path, *, host: str, pid: int, age: float = 0.0) -> None:
    path.write_text(json.dumps({"host": host, "pid": pid, "token": "other", "since": "then"}))
    if age:
        t = time.time() - age
        os.utime(path, (t, t))


def test_a_held_lock_is_not_taken_and_a_released_one_is(tmp_path: Path) -> None:
    a, b = CellLocks(tmp_path), CellLocks(tmp_path)
    try:
        assert a.try_acquire("cell")
        assert not b.try_acquire("cell")  # same host, live process, fresh heartbeat
        a.release("cell")
        assert not (tmp_path / "cell.lock").exists()
        assert b.try_acquire("cell")
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize(
    ("host", "dead", "age", "stale"),
    [
        ("here", True, 0.0, True),  # its runner died on this host
        ("here", False, 0.0, False),  # a live runner on this host
        ("here", False, 1000.0, True),  # alive but no heartbeat for 1000 s (reused pid, hung)
        ("elsewhere", True, 0.0, False),  # another host: its pid means nothing here, age decides
        ("elsewhere", True, 1000.0, True),
    ],
)
def test_stale_locks_are_taken_over_and_live_ones_are_not(
    tmp_path: Path, host: str, dead: bool, age: float, stale: bool
) -> None:
    path = tmp_path / "cell.lock"
    _lock_file(path, host=socket.gethostname() if host == "here" else "elsewhere.example",
               pid=_dead_pid() if dead else os.getppid(), age=age)  # fmt: skip
    locks = CellLocks(tmp_path, stale_after=300.0)
    try:
        assert locks.try_acquire("cell") is stale
        assert (json.loads(path.read_text())["token"] != "other") is stale
    finally:
        locks.close()


def test_a_half_written_lock_is_stale_only_once_its_writer_had_time(tmp_path: Path) -> None:
    path = tmp_path / "cell.lock"
    path.write_text('{"host": ')
    locks = CellLocks(tmp_path)
    try:
        assert not locks.try_acquire("cell")
        t = time.time() - 60
        os.utime(path, (t, t))
        assert locks.try_acquire("cell")
    finally:
        locks.close()


def test_the_heartbeat_keeps_a_lock_fresh(tmp_path: Path) -> None:
    locks = CellLocks(tmp_path, stale_after=2.0, heartbeat=0.1)
    other = CellLocks(tmp_path, stale_after=2.0, heartbeat=0.1)
    try:
        assert locks.try_acquire("cell")
        t = time.time() - 10
        os.utime(tmp_path / "cell.lock", (t, t))
        time.sleep(0.5)
        assert time.time() - (tmp_path / "cell.lock").stat().st_mtime < 1.0
        assert not other.try_acquire("cell")
    finally:
        locks.close()
        other.close()


# -- the runner ------------------------------------------------------------------------------


def test_sweep_skips_finished_cells_and_reruns_changed_parameters(tmp_path: Path) -> None:
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
    assert len(pd.read_csv(tmp_path / "results.csv")) == 4
    with pytest.raises(ValueError, match="duplicate"):
        run_sweep([cells[0], cells[0]], run, tmp_path, log=None)


def test_a_failed_sweep_resumes_with_the_cells_it_did_not_finish(tmp_path: Path) -> None:
    calls: list[int] = []

    def run(params: dict, seed: int) -> dict:
        calls.append(seed)
        if seed == 2 and len(calls) == 3:
            raise FloatingPointError("diverged")
        return {"value": seed}

    cells = [Cell("a", s, {}) for s in range(4)]
    with pytest.raises(RuntimeError, match=r"cell a seed=2 failed: FloatingPointError"):
        run_sweep(cells, run, tmp_path, log=None)
    assert sorted(r["seed"] for r in read_records(tmp_path)) == [0, 1]
    assert not list((tmp_path / "cells").glob("*.lock"))  # the failed runner released its locks
    df = run_sweep(cells, run, tmp_path, log=None)
    assert calls == [0, 1, 2, 2, 3] and list(df["value"]) == [0, 1, 2, 3]


def test_redo_before_reruns_only_records_older_than_it_and_resumes(tmp_path: Path) -> None:
    from datetime import UTC, datetime, timedelta

    calls: list[int] = []

    def run(params: dict, seed: int) -> dict:
        calls.append(seed)
        return {"value": seed + 100 * len(calls)}

    cells = [Cell("a", s, {}) for s in range(3)]
    first = run_sweep(cells, run, tmp_path, log=None)
    assert calls == [0, 1, 2]
    record = tmp_path / "cells" / f"{cell_key(cells[1])}.json"  # seed 1: stored a day earlier
    old = json.loads(record.read_text())
    old["provenance"]["finished"] = (datetime.now(UTC) - timedelta(days=1)).isoformat()
    write_atomic(record, dumps_record(seal(old)))
    cut = datetime.now(UTC) - timedelta(hours=1)
    again = run_sweep(cells, run, tmp_path, log=None, redo_before=cut)
    assert calls == [0, 1, 2, 1]  # only the older record ran again, and was replaced
    assert list(again["value"]) == [first["value"][0], 401, first["value"][2]]
    run_sweep(cells, run, tmp_path, log=None, redo_before=cut)
    assert calls == [0, 1, 2, 1]  # the same command again: the re-run record is kept
    with pytest.raises(ValueError, match="time zone aware"):
        run_sweep(cells, run, tmp_path, log=None, redo_before=datetime(2026, 1, 1))


def test_the_table_follows_each_record_so_a_grid_can_be_committed_mid_sweep(
    tmp_path: Path,
) -> None:
    seen: list[int] = []

    def run(params: dict, seed: int) -> dict:
        csv = tmp_path / "results.csv"
        seen.append(len(pd.read_csv(csv)) if csv.exists() else 0)
        return {"value": seed}

    run_sweep([Cell("a", s, {}) for s in range(3)], run, tmp_path, log=None)
    assert seen == [0, 1, 2]


def test_a_record_holds_metrics_params_and_provenance(tmp_path: Path) -> None:
    cell = make_cells(toy.chapter_grid(steps=3, dims=[8]), [5])[0]
    prov = {"command": "python -m attention_atlas sweep toy", "experiment": "toy", "preset": "x"}
    run_sweep([cell], toy.run_cell, tmp_path, log=None, provenance=prov)
    (rec,) = read_records(tmp_path)
    assert (rec["config"], rec["seed"], rec["key"]) == ("dim-8", 5, cell_key(cell))
    assert rec["params"] == cell.params and len(rec["history"]["loss"]) == 3
    p = rec["provenance"]
    assert {k: p[k] for k in prov} == prov
    assert p["threads"] == 1 and p["device"] == "cpu" and p["backend"] == "local"
    assert p["versions"]["torch"] == torch.__version__ and p["cpu"]
    assert len(p["git_commit"]) == 40 and isinstance(p["git_dirty"], bool)
    assert p["started"] <= p["finished"] and rec["cell_seconds"] > 0


def test_metrics_named_like_record_fields_are_refused(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"metric\(s\) \['seed'\]"):
        run_sweep([Cell("a", 0, {})], lambda p, s: {"seed": 1}, tmp_path, log=None)


@pytest.mark.timeout(300)
def test_the_local_pool_equals_this_process_and_retries_a_cell_whose_worker_died(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cells = make_cells(toy.chapter_grid(steps=5, dims=[8, 16]), [0, 1])
    here = run_sweep(cells, toy.run_cell, tmp_path / "here", log=None)
    monkeypatch.setenv("SWEEP_TEST_MARKS", str(tmp_path))
    pooled = run_sweep(cells, sweep_cells.die_once_cell, tmp_path / "pool", workers=2, log=None)
    pd.testing.assert_frame_equal(_metrics(here), _metrics(pooled))
    started = sweep_cells.starts(tmp_path)
    # each dim-8 cell died once, then ran; a cell may also be started again because the other
    # worker's death broke the pool it ran in (the whole pool restarts), so "at least twice"
    assert len(started[(8, 0)]) >= 2 and len(started[(8, 1)]) >= 2
    assert len(list((tmp_path / "pool" / "cells").glob("*.json"))) == len(cells)
    for c in cells:
        a = json.loads((tmp_path / "here" / "cells" / f"{cell_key(c)}.json").read_text())
        b = json.loads((tmp_path / "pool" / "cells" / f"{cell_key(c)}.json").read_text())
        assert a["history"] == b["history"]


_RUNNER = """
import sys, time
from pathlib import Path
sys.path.insert(0, {tests!r})
import sweep_cells
from attention_atlas.experiments import EXPERIMENTS, experiment, toy
from attention_atlas.sweep.runner import make_cells, run_sweep
cells = make_cells(toy.chapter_grid(steps=3, dims=[8, 16, 24]), [0, 1, 2])
Path({ready!r}).touch()
while not Path({go!r}).exists():
    time.sleep(0.02)
df = run_sweep(cells, sweep_cells.toy_cell, {out!r}, log=None, stale_after=60)
print(len(df), int(df["key"].is_unique))
"""


@pytest.mark.timeout(300)
def test_two_runners_on_one_folder_share_the_cells_and_never_run_one_twice(tmp_path: Path) -> None:
    out, marks = tmp_path / "out", tmp_path / "marks"
    marks.mkdir()
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "SWEEP_TEST_MARKS": str(marks),
        "SWEEP_TEST_SLEEP": "0.3",
    }
    procs = []
    for i in range(2):
        code = _RUNNER.format(
            tests=str(TESTS),
            ready=str(tmp_path / f"ready{i}"),
            go=str(tmp_path / "go"),
            out=str(out),
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True
            )
        )
    deadline = time.monotonic() + 120
    while not all((tmp_path / f"ready{i}").exists() for i in range(2)):
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
        time.sleep(0.05)
    (tmp_path / "go").touch()
    outputs = [p.communicate(timeout=180)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs) and outputs == [["9", "1"], ["9", "1"]]
    started = sweep_cells.starts(marks)
    assert len(started) == 9 and all(len(pids) == 1 for pids in started.values()), started
    by_runner = {pid for pids in started.values() for pid in pids}
    assert by_runner == {p.pid for p in procs}  # both did part of the work
    assert len(read_records(out)) == 9 and not list((out / "cells").glob("*.lock"))


@pytest.mark.timeout(300)
def test_a_killed_runner_leaves_no_record_and_its_cell_is_taken_over(tmp_path: Path) -> None:
    out, marks = tmp_path / "out", tmp_path / "marks"
    marks.mkdir()
    code = _RUNNER.format(
        tests=str(TESTS), ready=str(tmp_path / "ready"), go=str(tmp_path / "ready"), out=str(out)
    )
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "SWEEP_TEST_MARKS": str(marks),
        "SWEEP_TEST_SLEEP": "30",
    }
    proc = subprocess.Popen([sys.executable, "-c", code], env=env)
    try:
        deadline = time.monotonic() + 120
        while not sweep_cells.starts(marks):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        assert len(list((out / "cells").glob("*.lock"))) == 1
    finally:
        proc.kill()
        proc.wait()
    assert read_records(out) == []
    cells = make_cells(toy.chapter_grid(steps=3, dims=[8, 16, 24]), [0, 1, 2])
    df = run_sweep(cells, toy.run_cell, out, log=None)
    assert len(df) == 9 and len(read_records(out)) == 9
    assert not list((out / "cells").glob("*.lock"))


@pytest.mark.timeout(300)
def test_a_killed_runners_pool_workers_stop_with_it(tmp_path: Path) -> None:
    """SIGKILL to a runner with two local workers: its workers, mid-cell, end within seconds
    (they would otherwise train on with nowhere to return, writing a cell's checkpoints that
    the next runner resumes)."""
    import psutil

    out, marks = tmp_path / "out", tmp_path / "marks"
    marks.mkdir()
    code = _RUNNER.format(
        tests=str(TESTS), ready=str(tmp_path / "ready"), go=str(tmp_path / "ready"), out=str(out)
    ).replace("log=None,", "log=None, workers=2,")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "SWEEP_TEST_MARKS": str(marks),
           "SWEEP_TEST_SLEEP": "120"}  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-c", code], env=env)
    try:
        deadline = time.monotonic() + 120
        while len(sweep_cells.starts(marks)) < 2:
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        workers = {pid for pids in sweep_cells.starts(marks).values() for pid in pids}
        assert len(workers) == 2 and proc.pid not in workers
    finally:
        proc.kill()
        proc.wait()

    def alive(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    deadline = time.monotonic() + 30
    while any(alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [p for p in workers if alive(p)]
    for p in left:  # do not leave them behind when the check fails
        os.kill(p, signal.SIGKILL)
    assert not left, f"workers {left} outlived their runner"
    assert read_records(out) == []


def test_the_command_line_keeps_its_flags_and_records_the_command(tmp_path: Path) -> None:
    out = tmp_path / "toy"
    argv = ["sweep", "toy", "--preset", "smoke", "--seeds", "3", "--out", str(out), "--only", "dim-8",
            "-p", "steps=2", "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    (rec,) = read_records(out)
    assert rec["config"] == "dim-8" and rec["seed"] == 3 and rec["params"]["steps"] == 2
    assert rec["provenance"]["command"] == (
        f"python -m attention_atlas sweep toy --preset smoke --seeds 3 -p steps=2 --only dim-8 --out {out}"
    )
    assert main([*argv, "--redo-before", "2000-01-01"]) == 0  # stored since: kept as it is
    assert read_records(out) == [rec]
    assert main([*argv, "--no-resume"]) == 0
    (again,) = read_records(out)
    assert again["provenance"]["finished"] >= rec["provenance"]["finished"]
    assert json.loads((out / "grid.json").read_text())["seeds"] == [3]


def test_the_cluster_backend_needs_an_importable_cell_function(tmp_path: Path) -> None:
    def local(params: dict[str, Any], seed: int) -> dict[str, Any]:
        return {}

    local.__module__ = "__main__"
    with pytest.raises(ValueError, match="importable"):
        run_sweep([Cell("a", 0, {})], local, tmp_path, workers=2, log=None)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--address", "tcp://127.0.0.1:1"], "need --backend dask"),
        (["--workers", "0"], "--workers must be at least 1, got 0"),
        (["--threads", "0"], "--threads must be at least 1, got 0"),
        (["--gpus-per-cell", "-1"], "--gpus-per-cell must be at least 0, got -1"),
        (["--backend", "dask", "--scheduler-file", "/nonexistent.json"], "no scheduler address"),
        (["-p", "steps=9"], "holds another grid of toy (dim-8: steps 5 -> 9)"),
        (["--redo-before", "yesterday"], "--redo-before: expected an ISO 8601 time"),
        (["--redo-before", "2026-12-07", "--no-resume"], "cannot go with --no-resume"),
    ],
)
def test_the_command_line_refuses_bad_backend_settings_before_running(
    tmp_path: Path, extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = str(tmp_path / "toy")
    assert (
        main(["sweep", "toy", "--preset", "smoke", "--seeds", "0", "--out", out, "--no-progress"])
        == 0
    )
    capsys.readouterr()
    assert main(["sweep", "toy", "--preset", "smoke", "--seeds", "1", "--out", out, *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    assert [r["seed"] for r in read_records(out)] == [0]


@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_every_registered_experiment_has_presets_a_hashable_grid_and_a_cell_runner(
    name: str,
) -> None:
    mod = experiment(name)
    assert "book" in mod.PRESETS and callable(mod.run_cell)
    grid = mod.chapter_grid(**mod.PRESETS.get("smoke", mod.PRESETS["book"]))
    assert grid and all(isinstance(k, str) and isinstance(v, dict) for k, v in grid.items())
    keys = [cell_key(c) for c in make_cells(grid, [0])]
    assert len(set(keys)) == len(keys)
