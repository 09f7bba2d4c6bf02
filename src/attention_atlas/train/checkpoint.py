"""Seeds, RNG states and checkpoints: atomic writes and an exact resume.

A checkpoint holds the model, optimiser and scheduler, every rank's RNG states (torch, numpy,
python, CUDA) and sampler position, the run's :class:`Progress` (step, history, the current
log interval, FLOPs, training time) and the configs it was written under. It is written to a
temporary file, flushed and renamed (:mod:`attention_atlas.atomic`), so a kill at any moment
leaves either the previous checkpoint or the new one. A resume under changed settings is
refused, listing the changes (:func:`config_changes`).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from attention_atlas.atomic import atomic_torch_save
from attention_atlas.validate import ConfigError

from .ddp import rank_world

__all__ = [
    "RESUMABLE_CHANGES",
    "Progress",
    "TrainClock",
    "config_changes",
    "load_checkpoint",
    "new_interval",
    "rng_state",
    "save_checkpoint",
    "seed_everything",
    "set_rng_state",
]


def seed_everything(seed: int) -> None:
    """Seed python's ``random``, numpy's global RNG and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed % (2**32))  # noqa: NPY002 (seed the legacy global RNG on purpose)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    """The RNG states of torch (and CUDA), numpy's global RNG and python's ``random``."""
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),  # noqa: NPY002
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])  # noqa: NPY002
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def new_interval() -> dict[str, Any]:
    """Sums over the current log interval: loss, gradient norms, tokens, steps, regularisers."""
    return {"loss": 0.0, "gnorms": [], "tokens": 0, "n": 0, "reg": {}}


@dataclass
class Progress:
    """Where a run is: what a checkpoint holds besides the model, optimiser, scheduler,
    sampler and RNG states."""

    step: int = 0  # optimiser steps done
    history: list[dict[str, float]] = field(default_factory=list)  # one row per log step
    interval: dict[str, Any] = field(default_factory=new_interval)  # the current log interval
    flops: dict[str, int] = field(default_factory=dict)  # measure_flops, once per run
    timing: dict[str, float] = field(
        default_factory=lambda: {"t_train": 0.0, "interval_elapsed": 0.0}
    )  # training time so far, and within the current interval


def save_checkpoint(
    path: Path,
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    sched: Any,
    sampler: Any,
    progress: Progress,
    configs: dict[str, dict[str, Any]],
) -> None:
    """Every rank's RNG and sampler state are gathered; rank 0 writes the file atomically.
    ``configs`` (``train_config``, ``model_config``) are stored beside the state."""
    rank, world = rank_world()
    rng, samp = rng_state(), sampler.state_dict()
    if world > 1:
        rngs: list[Any] = [None] * world
        samps: list[Any] = [None] * world
        dist.all_gather_object(rngs, rng)
        dist.all_gather_object(samps, samp)
    else:
        rngs, samps = [rng], [samp]
    if rank == 0:
        atomic_torch_save(
            {
                "step": progress.step,
                "model": model.state_dict(),
                "optimizer": opt.state_dict(),
                "scheduler": sched.state_dict(),
                "sampler": samps,
                "rng": rngs,
                "history": progress.history,
                "interval": progress.interval,
                "flops": progress.flops,
                "timing": progress.timing,
                "world_size": world,
                **configs,
            },
            path,
        )
    if world > 1:
        dist.barrier()


#: train settings a resumed run may change: they do not change what the run computes (the
#: device, the threads, ``compile`` and ``native`` change only the rounding)
RESUMABLE_CHANGES = (
    "progress", "out_dir", "num_threads", "device", "checkpoint_every", "compile", "native",
)  # fmt: skip


def config_changes(saved: dict[str, dict[str, Any]], now: dict[str, dict[str, Any]]) -> list[str]:
    """``"section.key: saved -> now"`` for every setting that differs between the configs a
    checkpoint was written with and the current ones (settings in :data:`RESUMABLE_CHANGES`
    aside)."""
    changes = []
    for section in ("model_config", "train_config"):
        old, new = saved.get(section), now.get(section)
        if old is None or new is None:
            continue
        for key in sorted(set(old) | set(new)):
            if section == "train_config" and key in RESUMABLE_CHANGES:
                continue
            if old.get(key) != new.get(key):
                name = section.removesuffix("_config")
                changes.append(f"{name}.{key}: {old.get(key)!r} -> {new.get(key)!r}")
    return changes


def load_checkpoint(
    path: Path,
    device: torch.device,
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    sched: Any,
    sampler: Any,
    configs: dict[str, dict[str, Any]] | None = None,
) -> Progress:
    """Restore model, optimiser, scheduler, this rank's sampler and RNG states from ``path``;
    return the run's progress.

    Raises:
        ConfigError: the checkpoint was written under other ``configs`` (``train_config``,
            ``model_config``; the message lists every difference) or another number of processes.
    """
    rank, world = rank_world()
    state = torch.load(path, map_location=device, weights_only=False)
    if state["world_size"] != world:
        raise ConfigError(
            f"checkpoint {path} was written by {state['world_size']} processes, "
            f"resuming with {world}"
        )
    changes = config_changes(state, configs or {})
    if changes:
        raise ConfigError(
            f"cannot resume from {path}: the configuration changed since it was written "
            f"({'; '.join(changes)}); restore those settings, or start a new run in another folder"
        )
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    sched.load_state_dict(state["scheduler"])
    sampler.load_state_dict(state["sampler"][rank])
    set_rng_state(state["rng"][rank])
    progress = Progress(state["step"], state["history"], state["interval"], state["flops"])
    if "timing" in state:
        progress.timing = state["timing"]
    return progress


class TrainClock:
    """Training wall time: the total so far and the current log interval, paused while a
    checkpoint is written (checkpoint time is not training time); and the process's CPU time
    over the same span (all its threads; a stopped or time-shared process accrues none)."""

    def __init__(self, timing: dict[str, float]) -> None:
        self.t_train = timing["t_train"]
        self.t_interval = time.perf_counter() - timing["interval_elapsed"]
        self.cpu_start = time.process_time() - timing.get("cpu_s", 0.0)  # older checkpoints: 0

    def cpu_s(self) -> float:
        return time.process_time() - self.cpu_start

    def elapsed(self) -> float:
        """Training time so far, the current interval included."""
        return self.t_train + (time.perf_counter() - self.t_interval)

    def close_interval(self) -> float:
        """End the current interval: add it to the total and return its length."""
        dt = time.perf_counter() - self.t_interval
        self.t_train += dt
        return dt

    def open_interval(self) -> None:
        self.t_interval = time.perf_counter()

    def state(self) -> dict[str, float]:
        return {"t_train": self.t_train, "interval_elapsed": time.perf_counter() - self.t_interval,
                "cpu_s": self.cpu_s()}  # fmt: skip
