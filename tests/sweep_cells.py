"""Cell functions for the sweep tests, importable by worker processes (local pool, Dask).

Each wraps the toy experiment's cell (:func:`attention_atlas.experiments.toy.run_cell`) with
what a test needs to see from outside: a start mark per attempt (``$SWEEP_TEST_MARKS``), a
pause (``$SWEEP_TEST_SLEEP`` seconds) so a test can act while the cell runs, or a death.
Test-only behaviour comes from the environment, never from the parameters, so the cells'
keys and results are those of the toy experiment.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from attention_atlas.experiments import toy

_TOY_CELL = toy.run_cell  # the toy cell itself, even where a test puts another in its place


def mark_start(params: dict[str, Any], seed: int) -> Path | None:
    """Write ``<marks>/dim-<D>_seed<seed>_pid<pid>_<ns>.start`` if ``$SWEEP_TEST_MARKS`` is set."""
    marks = os.environ.get("SWEEP_TEST_MARKS")
    if not marks:
        return None
    path = Path(marks) / f"dim-{params['dim']}_seed{seed}_pid{os.getpid()}_{time.time_ns()}.start"
    path.touch()
    return path


def toy_cell(params: dict[str, Any], seed: int) -> dict[str, Any]:
    """The toy cell, after a start mark and a pause of ``$SWEEP_TEST_SLEEP`` seconds."""
    mark_start(params, seed)
    time.sleep(float(os.environ.get("SWEEP_TEST_SLEEP", "0")))
    return toy.run_cell(params, seed)


def die_once_cell(params: dict[str, Any], seed: int) -> dict[str, Any]:
    """Kill its own process (SIGKILL, mid-cell) on the first attempt at ``dim == 8``; the toy
    cell otherwise. Attempts are remembered in ``$SWEEP_TEST_MARKS``."""
    mark = mark_start(params, seed)
    assert mark is not None, "die_once_cell needs $SWEEP_TEST_MARKS"
    if params["dim"] == 8 and len(list(mark.parent.glob(f"dim-8_seed{seed}_*.start"))) == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return toy.run_cell(params, seed)


def starts(marks: Path) -> dict[tuple[int, int], list[int]]:
    """``(dim, seed) ->`` the pids that started that cell, in order."""
    out: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for p in marks.glob("*.start"):
        dim, seed, pid, ns = p.stem.split("_")
        out.setdefault((int(dim[4:]), int(seed[4:])), []).append((int(ns), int(pid[3:])))
    return {k: [pid for _, pid in sorted(v)] for k, v in out.items()}


def compile_aware_cell(params: dict[str, Any], seed: int) -> dict[str, Any]:
    """The toy cell plus ``compiled_steps``: 1.0 when it ran inside
    :func:`~attention_atlas.train.compiled.compiled_training` (``sweep --compile``), else 0.0."""
    from attention_atlas.train.compiled import compiling

    return {**_TOY_CELL(params, seed), "compiled_steps": float(compiling() is not None)}


def train_cell(params: dict[str, Any], seed: int) -> dict[str, Any]:
    """A cell that trains with :func:`attention_atlas.train.train` (a tiny model with dropout on
    the copy task, ``params["steps"]`` steps): its final validation loss, the history's losses
    and a checksum of the final weights. ``$SWEEP_TEST_KILL_AT_STEP``: SIGKILL its own process
    right after that optimiser step (before that step's checkpoint), mid-cell;
    ``$SWEEP_TEST_STEP_SLEEP``: a pause of that many seconds in every step."""

    from attention_atlas.data import copy_task
    from attention_atlas.models import ModelConfig
    from attention_atlas.train import TrainConfig, loop, train

    kill_at = int(os.environ.get("SWEEP_TEST_KILL_AT_STEP", "0"))
    pause = float(os.environ.get("SWEEP_TEST_STEP_SLEEP", "0"))
    real_step = loop.optimiser_step

    def step_then_maybe_die(run: Any, *args: Any) -> Any:
        out = real_step(run, *args)
        time.sleep(pause)  # inside the step: training time
        if run.progress.step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, no handlers: a real kill
        return out

    loop.optimiser_step = step_then_maybe_die  # type: ignore[assignment]
    try:
        data = copy_task(256, 64, length=6, vocab=5)
        cfg = TrainConfig(steps=int(params["steps"]), batch_size=8, lr=1e-2, warmup_steps=3,
                          log_every=3, eval_batches=2, eval_batch_size=32, progress=False,
                          measure_flops=False, seed=seed)  # fmt: skip
        res = train(ModelConfig(dim=16, n_layers=2, n_heads=2, dropout=0.1), cfg, data)
    finally:
        loop.optimiser_step = real_step  # type: ignore[assignment]
    weights = sum(float(p.detach().double().square().sum()) for p in res.model.parameters())
    return {"val_loss": float(res.final["val_loss"]), "weights_sq": weights,
            "train_loss": [float(v) for v in res.history["train_loss"]],
            "train_cpu_s": float(res.final["train_cpu_s"])}  # fmt: skip
