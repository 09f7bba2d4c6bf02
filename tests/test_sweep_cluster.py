"""A real Dask cluster on 127.0.0.1: a scheduler and two workers started with Dask's own
commands (``dask scheduler``, ``dask worker``), a worker process killed in the middle of a cell.

The grid must complete with every cell recorded exactly once, its records equal to the local
backend's (same metrics and histories, bit for bit: one torch thread per cell on the CPU), and
no process of the cluster may listen on anything but the loopback addresses. The cluster is
stopped by the fixture's finaliser whatever happens.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
import sweep_cells

from attention_atlas.experiments import toy
from attention_atlas.sweep.runner import cell_key, make_cells, run_sweep

LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}
DASK = str(Path(sys.executable).with_name("dask"))


@dataclass
class Cluster:
    address: str
    procs: list[subprocess.Popen[bytes]]
    marks: Path

    def processes(self) -> list[psutil.Process]:
        """The scheduler, nannies and workers now alive (workers restarted by a nanny too)."""
        out = []
        for p in self.procs:
            try:
                root = psutil.Process(p.pid)
                out += [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                pass
        return out

    def listening(self) -> set[tuple[int, str, int]]:
        """``(pid, ip, port)`` of every listening TCP socket of the cluster's processes."""
        found = set()
        for proc in self.processes():
            try:
                conns = proc.net_connections(kind="inet")
            except (psutil.NoSuchProcess, psutil.ZombieProcess):
                continue
            found |= {
                (proc.pid, c.laddr.ip, c.laddr.port)
                for c in conns
                if c.status == psutil.CONN_LISTEN
            }
        return found


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    marks = tmp_path / "marks"
    marks.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "SWEEP_TEST_MARKS": str(marks), "SWEEP_TEST_SLEEP": "1.5",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    sched_file = tmp_path / "scheduler.json"
    loopback = ["--host", "127.0.0.1", "--dashboard-address", "127.0.0.1:0"]
    procs: list[subprocess.Popen[bytes]] = []

    def start(*args: str, log: str) -> None:
        with open(tmp_path / log, "wb") as out:
            procs.append(subprocess.Popen([DASK, *args], stdout=out, stderr=subprocess.STDOUT,
                                          env=env, cwd=tmp_path, start_new_session=True))  # fmt: skip

    try:
        start(
            "scheduler",
            *loopback,
            "--port",
            "0",
            "--scheduler-file",
            str(sched_file),
            log="scheduler.log",
        )
        deadline = time.monotonic() + 30
        address = None
        while address is None:
            assert time.monotonic() < deadline, (tmp_path / "scheduler.log").read_text()[-2000:]
            try:
                address = json.loads(sched_file.read_text())["address"]
            except (OSError, ValueError, KeyError):
                time.sleep(0.1)
        for i in range(2):
            start("worker", "--scheduler-file", str(sched_file), *loopback, "--nthreads", "1",
                  "--nworkers", "1", "--local-directory", str(tmp_path / f"w{i}"),
                  "--death-timeout", "60", log=f"worker{i}.log")  # fmt: skip
        yield Cluster(address, procs, marks)
    finally:
        for p in procs:  # each in its own session: the group is the process and its children
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)


def _kill_first_worker_mid_cell(cl: Cluster, timeout: float = 60.0) -> tuple[tuple[int, int], int]:
    """Wait for the first cell to start on a worker and SIGKILL that worker process."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        started = sweep_cells.starts(cl.marks)
        if started:
            cell, pids = next(iter(started.items()))
            ours = {p.pid for p in cl.processes()}
            assert pids[0] in ours, f"pid {pids[0]} that ran {cell} is not a process of the cluster"
            os.kill(pids[0], signal.SIGKILL)
            return cell, pids[0]
        time.sleep(0.05)
    raise AssertionError("no cell started on the cluster within a minute")


def _comparable(rec: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in rec.items() if k not in ("cell_seconds", "provenance", "checksum")}


@pytest.mark.timeout(180)
def test_a_grid_on_a_loopback_dask_cluster_survives_a_killed_worker_and_equals_the_local_backend(
    cluster: Cluster, tmp_path: Path
) -> None:
    t0 = time.perf_counter()
    cells = make_cells(toy.chapter_grid(steps=10, dims=[8, 16]), [0, 1])
    out_dask = tmp_path / "dask"
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["df"] = run_sweep(cells, sweep_cells.toy_cell, out_dask, backend="dask",
                                     address=cluster.address, log=None, progress=False)  # fmt: skip
        except BaseException as e:  # re-raised in the test's thread
            result["error"] = e

    runner = threading.Thread(target=run)
    runner.start()
    listening: set[tuple[int, str, int]] = set()
    killed_cell, killed_pid = _kill_first_worker_mid_cell(cluster)
    while runner.is_alive():
        listening |= cluster.listening()
        runner.join(timeout=0.5)
    listening |= cluster.listening()
    assert "error" not in result, result.get("error")

    # the killed cell ran again elsewhere; every cell recorded exactly once, nothing partial left
    started = sweep_cells.starts(cluster.marks)
    assert len(started[killed_cell]) >= 2 and killed_pid not in started[killed_cell][1:]
    files = sorted(p.name for p in (out_dask / "cells").iterdir())
    assert files == sorted(f"{cell_key(c)}.json" for c in cells), files
    assert len(result["df"]) == len(cells) and result["df"]["key"].is_unique

    # the same records as the local backend (run in this process)
    out_local = tmp_path / "local"
    run_sweep(cells, toy.run_cell, out_local, log=None, progress=False)
    for c in cells:
        dask_rec = json.loads((out_dask / "cells" / f"{cell_key(c)}.json").read_text())
        local_rec = json.loads((out_local / "cells" / f"{cell_key(c)}.json").read_text())
        assert _comparable(dask_rec) == _comparable(local_rec), c
        assert (
            dask_rec["provenance"]["backend"] == "dask" and dask_rec["provenance"]["threads"] == 1
        )

    # servers: the scheduler's port among them, and all on loopback
    port = int(cluster.address.rsplit(":", 1)[1])
    assert any(p == port for _, _, p in listening), listening
    outside = sorted(x for x in listening if x[1] not in LOOPBACK)
    assert not outside, f"cluster processes listening beyond loopback: {outside}"
    print(
        f"cluster test: {len(listening)} listening sockets, all loopback; {time.perf_counter() - t0:.1f} s"
    )


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("offered", "threads", "gpus", "message"), [
    ({"CPU": 1}, 2, 0, "--threads 2: no worker of .* offers that much CPU \\(the most one offers is 1\\)"),
    ({"CPU": 4, "GPU": 1}, 1, 2, "--gpus-per-cell 2: no worker of .* offers that much GPU"),
    ({"CPU": 4}, 1, 1, "1 GPU\\(s\\) per cell asked, but no worker of .* offers a GPU"),
])  # fmt: skip
def test_a_cell_asking_more_than_any_worker_offers_is_refused_before_it_waits_forever(
    offered: dict[str, float], threads: int, gpus: int, message: str
) -> None:
    from distributed import Client, LocalCluster

    from attention_atlas.sweep.backends import make_backend

    # in one process (inproc transport: no socket at all)
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, resources=offered,
                      dashboard_address=None) as lc, Client(lc) as client:  # fmt: skip
        with pytest.raises(ValueError, match=message):
            make_backend("dask", 1, client, threads, gpus)
        make_backend("dask", 1, client, 1, 0).close()  # what it offers is accepted
