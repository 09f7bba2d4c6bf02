"""Where the cells of a sweep run: this process, a local process pool, or a Dask cluster.

:func:`execute_cell` runs one cell wherever it is sent and returns its metrics with the
environment it ran in; the backends below submit it and report each outcome the same way, so
:func:`attention_atlas.sweep.runner.run_sweep` writes the same records whichever runs the cells. A
backend has ``capacity()`` (cells to keep in flight), ``submit(fn, *args)``, ``wait(futures,
timeout)`` (the finished ones), ``result(future)`` (raises :class:`WorkerLost` when the process
running the cell died, so the cell is retried) and ``close(abort)``.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor
from concurrent.futures import wait as wait_futures
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

from attention_atlas.provenance import environment
from attention_atlas.store.records import RESERVED, jsonable
from attention_atlas.threads import intra_op_threads

__all__ = ["BACKENDS", "CellRun", "WorkerLost", "execute_cell", "make_backend"]

BACKENDS = ("local", "dask")


@dataclass(frozen=True)
class CellRun:
    """How a sweep runs each cell (none of it is part of a cell's key): ``threads`` torch
    threads, ``compile`` its training steps, checkpoint them every ``checkpoint_every`` steps
    under ``checkpoint_root/<key>`` (0: no checkpoints), ``native``: with the native kernels
    (:mod:`attention_atlas.native`). See :func:`execute_cell`."""

    threads: int | None = 1
    compile: bool = False
    checkpoint_every: int = 0
    checkpoint_root: str | None = None
    native: bool = False

    def folder(self, key: str) -> str | None:
        """The checkpoint folder of the cell ``key`` (None without checkpoints)."""
        if not self.checkpoint_every or self.checkpoint_root is None:
            return None
        return f"{self.checkpoint_root}/{key}"

    def args(self, key: str) -> tuple[Any, ...]:
        """:func:`execute_cell`'s arguments after ``run_cell, params, seed``."""
        return (self.threads, self.compile, self.folder(key), self.checkpoint_every, self.native)


def execute_cell(
    run_cell: Callable[[dict[str, Any], int], dict[str, Any]],
    params: Mapping[str, Any],
    seed: int,
    threads: int | None,
    compile: bool = False,
    checkpoints: str | None = None,
    checkpoint_every: int = 0,
    native: bool | int = False,
) -> dict[str, Any]:
    """Run one cell at ``threads`` torch threads (None: leave them) and return its metrics
    (JSON-ready), wall time and the :func:`~attention_atlas.provenance.environment` it ran in.
    ``compile``: every training run of the cell compiles its steps
    (:func:`~attention_atlas.train.compiled.compiled_training`); the environment then says so
    (``compile``) with the compiler errors of any run that fell back to eager steps
    (``compile_fallbacks``). ``checkpoints`` (a folder) and ``checkpoint_every`` (steps, 0 for
    none): the cell's training runs checkpoint there and resume from what a killed earlier
    attempt left (:func:`~attention_atlas.train.resumable.resumable_training`); the folder is
    removed once the cell returns, and the environment lists the steps runs resumed from
    (``resumed_from``) when any did. A resumed cell's wall time is this attempt's plus the
    training time its runs had spent before (what the checkpoints carried; an attempt's steps
    after its last checkpoint, lost, are not counted), as its runs' ``train_time_s`` is;
    ``started`` and ``finished`` are this attempt's clock times. ``native``: the cell runs with
    the native kernels switched on (:func:`attention_atlas.native.enabled`: ``True`` at their
    current level, an int at that level); the environment then says ``native``, the level
    (``native_level``) and whether they loaded (``native_status``)."""
    import torch

    from attention_atlas import native as native_kernels
    from attention_atlas.train.compiled import compiled_training
    from attention_atlas.train.resumable import resumable_training

    with intra_op_threads(threads):
        started = time.time()
        t0 = time.perf_counter()
        with (
            compiled_training(compile) as state,
            resumable_training(checkpoints, checkpoint_every) as resumable,
            native_kernels.enabled(native),
        ):
            metrics = run_cell(dict(params), int(seed))
        seconds = time.perf_counter() - t0
        env = environment(used_cuda=torch.cuda.is_initialized())
        if state is not None:
            env.update(compile=True, compile_fallbacks=list(state.fallbacks))
        if native:
            env.update(
                native=True,
                native_level=native_kernels.resolve_level(native),
                native_status=native_kernels.status(),
            )
        if resumable is not None and resumable.resumed:
            env.update(resumed_from=list(resumable.resumed))
            seconds += resumable.carried_s
    if checkpoints is not None:
        shutil.rmtree(checkpoints, ignore_errors=True)
    if not isinstance(metrics, Mapping):
        raise TypeError(f"run_cell must return a dict of metrics, got {type(metrics).__name__}")
    clash = sorted(set(metrics) & set(RESERVED))
    if clash:
        raise ValueError(f"run_cell returned metric(s) {clash} named like record fields {RESERVED}")
    return {"metrics": jsonable(metrics, "metrics"), "cell_seconds": seconds,
            "started": started, "finished": time.time(), "environment": env}  # fmt: skip


class WorkerLost(RuntimeError):
    """The process running a cell died before returning it (the cell is retried)."""


class _InProcess:
    """``workers=1``: cells run here, one at a time."""

    def capacity(self) -> int:
        return 1

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        fut: Future[Any] = Future()
        try:
            fut.set_result(fn(*args))
        except Exception as e:  # re-raised by result(), naming the cell
            fut.set_exception(e)
        return fut

    def wait(self, futures: list[Any], timeout: float) -> list[Any]:
        return [f for f in futures if f.done()]

    def result(self, fut: Any) -> dict[str, Any]:
        return dict(fut.result())

    def close(self, abort: bool = False) -> None:
        pass


def _init_pool_worker(runner: int | None = None) -> None:
    import torch

    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set in this process
        pass
    if runner is not None:
        threading.Thread(target=_exit_when_orphaned, args=(runner,), daemon=True).start()


def _exit_when_orphaned(runner: int, every: float = 1.0) -> None:
    """End this worker once the runner that started it is gone (killed, even by SIGKILL): else
    it trains on with nowhere to return its cell, and writes checkpoints into the folder of a
    cell that the next runner resumes, two writers in one folder."""
    while os.getppid() == runner:
        time.sleep(every)
    os._exit(1)


class _LocalPool:
    """A pool of ``workers`` spawned processes; restarted when a worker dies."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.pool: ProcessPoolExecutor | None = None

    def _pool(self) -> ProcessPoolExecutor:
        import multiprocessing

        if self.pool is None:
            ctx = multiprocessing.get_context("spawn")
            self.pool = ProcessPoolExecutor(
                self.workers, mp_context=ctx, initializer=_init_pool_worker,
                initargs=(os.getpid(),),
            )  # fmt: skip
        return self.pool

    def capacity(self) -> int:
        return self.workers

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        try:
            return self._pool().submit(fn, *args)
        except BrokenProcessPool:  # a worker died: its cells fail as WorkerLost, start afresh
            self.close(abort=True)
            return self._pool().submit(fn, *args)

    def wait(self, futures: list[Any], timeout: float) -> list[Any]:
        return list(wait_futures(futures, timeout=timeout, return_when=FIRST_COMPLETED).done)

    def result(self, fut: Any) -> dict[str, Any]:
        try:
            return dict(fut.result())
        except BrokenProcessPool as e:
            raise WorkerLost(str(e)) from e

    def close(self, abort: bool = False) -> None:
        if self.pool is not None:
            if abort:
                for proc in list(getattr(self.pool, "_processes", {}).values()):
                    proc.kill()
            self.pool.shutdown(wait=not abort, cancel_futures=True)
            self.pool = None


class _Dask:
    """Cells as tasks on a Dask distributed cluster."""

    def __init__(self, address: Any, workers: int, threads: int | None, gpus: int) -> None:
        from distributed import Client, LocalCluster

        self.cluster = None
        if address is None:
            self.cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                        host="127.0.0.1", dashboard_address="127.0.0.1:0")  # fmt: skip
            address = self.cluster
        self.client = address if isinstance(address, Client) else Client(address)
        self.owns_client = not isinstance(address, Client)
        self.resources = self._resources({"CPU": threads or 1, "GPU": gpus})

    def _resources(self, wanted: dict[str, int]) -> dict[str, int] | None:
        try:
            self.client.wait_for_workers(1, timeout=600)
        except TimeoutError as e:
            raise TimeoutError(f"no Dask worker joined {self.client} in 10 minutes") from e
        info = self.client.scheduler_info(n_workers=-1)
        offered: set[str] = set()
        most: dict[str, float] = {}  # the most of each resource one worker offers
        for w in info["workers"].values():
            offered |= set(w.get("resources", {}))
            for k, v in w.get("resources", {}).items():
                most[k] = max(most.get(k, 0.0), float(v))
        if wanted["GPU"] and "GPU" not in offered:
            raise ValueError(
                f"{wanted['GPU']} GPU(s) per cell asked, but no worker of {info.get('address')} "
                'offers a GPU resource; start the workers with: dask worker ADDRESS --resources "GPU=1"'
            )
        for k, flag in (("CPU", "--threads"), ("GPU", "--gpus-per-cell")):
            if wanted[k] and k in most and wanted[k] > most[k]:  # the task would wait forever
                raise ValueError(
                    f"{flag} {wanted[k]}: no worker of {info.get('address')} offers that much "
                    f"{k} (the most one offers is {most[k]:g})"
                )
        res = {k: v for k, v in wanted.items() if v and k in offered}
        return res or None

    def capacity(self) -> int:
        return max(1, sum(self.client.nthreads().values()))

    def submit(self, fn: Callable[..., Any], *args: Any) -> Any:
        return self.client.submit(fn, *args, key=f"cell-{uuid.uuid4().hex}", pure=False,
                                  resources=self.resources)  # fmt: skip

    def wait(self, futures: list[Any], timeout: float) -> list[Any]:
        from distributed import wait

        try:
            wait(futures, timeout=timeout, return_when="FIRST_COMPLETED")
        except TimeoutError:
            pass
        return [f for f in futures if f.done()]

    def result(self, fut: Any) -> dict[str, Any]:
        return dict(fut.result())

    def close(self, abort: bool = False) -> None:
        if self.owns_client:
            self.client.close()
        if self.cluster is not None:
            self.cluster.close()


def make_backend(name: str, workers: int, address: Any, threads: int | None, gpus: int) -> Any:
    """The backend ``name`` (``local``: in this process if ``workers == 1``, else a pool;
    ``dask``: a cluster at ``address``, or a local one of ``workers`` processes)."""
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; known: {', '.join(BACKENDS)}")
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    if name == "dask":
        return _Dask(address, workers, threads, gpus)
    if address is not None:
        raise ValueError("an address is for --backend dask; the local backend starts no server")
    return _InProcess() if workers == 1 else _LocalPool(workers)
