""":func:`resumable_training`: checkpoints for the :func:`~attention_atlas.train.train` runs of
one piece of work (a sweep cell), so that work killed mid-way resumes where it stopped.

Inside the block, the ``i``-th run that writes nowhere itself (``out_dir`` unset) and takes no
callbacks checkpoints every ``every`` optimiser steps to ``folder/run<i>/checkpoint.pt`` and, if
that file is already there (the block ran before and was killed), resumes from it. Resumes are
exact (:mod:`attention_atlas.train.checkpoint`: weights, optimiser, schedule, sampler and RNG
states), so a cell killed and run again returns what it would have returned uninterrupted, bit
for bit on a CPU at one thread; the runs are numbered in the order the work starts them, which
is the same every time for deterministic work. A run with callbacks is not checkpointed: what a
callback accumulates (per-step gradient norms, say) is not in a checkpoint, so resuming it would
change the result. ``sweep --checkpoint-every N`` runs every cell in such a block
(:func:`attention_atlas.sweep.backends.execute_cell`), under ``OUT/.checkpoints/<cell key>``,
removed once the cell has returned.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import warnings
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Resumable", "Slot", "claim_slot", "in_flight", "resumable_training"]


@dataclass
class Resumable:
    """The state of a :func:`resumable_training` block: ``resumed``, the step each resumed run
    started from (in run order; empty when nothing resumed), and ``carried_s``, the training
    time (wall seconds) those runs had spent before, in earlier attempts."""

    folder: Path
    every: int
    runs: int = 0  # runs that claimed a slot so far
    resumed: list[int] = field(default_factory=list)
    carried_s: float = 0.0


@dataclass(frozen=True)
class Slot:
    """Where one run of a block checkpoints: ``path`` (``.../run<i>/checkpoint.pt``) every
    ``every`` steps; ``block`` is told the step the run resumes from (:meth:`resumed_at`)."""

    path: Path
    every: int
    block: Resumable

    def resumed_at(self, step: int, trained_s: float) -> None:
        """The run resumed at ``step``, after ``trained_s`` seconds of training before."""
        self.block.resumed.append(int(step))
        self.block.carried_s += float(trained_s)


_ACTIVE: ContextVar[Resumable | None] = ContextVar("attention_atlas_resumable", default=None)


@contextlib.contextmanager
def resumable_training(
    folder: str | os.PathLike[str] | None, every: int
) -> Iterator[Resumable | None]:
    """Checkpoint (every ``every`` steps, under ``folder``) and resume the training runs inside
    the block, as the module docstring says; yields the block's :class:`Resumable`. ``folder``
    None or ``every`` 0 changes nothing (yields None).

    Raises:
        ValueError: ``every`` is negative.
    """
    if every < 0:
        raise ValueError(f"checkpoint interval must be a number of steps >= 0, got {every}")
    if folder is None or every == 0:
        yield None
        return
    state = Resumable(Path(folder), int(every))
    token = _ACTIVE.set(state)
    try:
        yield state
    finally:
        _ACTIVE.reset(token)


def claim_slot(*, writes_itself: bool, has_callbacks: bool) -> Slot | None:
    """The :class:`Slot` of the next run of the innermost :func:`resumable_training` block, or
    None (no block, or a run that writes its own checkpoints or takes callbacks; such a run
    does not take a number, so the others keep theirs). A folder that cannot be made (a Dask
    worker on another machine, say, where the runner's path does not exist) costs the run its
    checkpoints, not its result: a :class:`RuntimeWarning` names it and the run goes on
    without."""
    block = _ACTIVE.get()
    if block is None or writes_itself or has_callbacks:
        return None
    index = block.runs
    block.runs += 1
    path = block.folder / f"run{index}" / "checkpoint.pt"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        warnings.warn(f"no checkpoints for this run: cannot make {path.parent} ({err})",
                      RuntimeWarning, stacklevel=3)  # fmt: skip
        return None
    return Slot(path, block.every, block)


def in_flight(out: str | os.PathLike[str]) -> dict[str, list[tuple[int, int]]]:
    """The cells in flight in the sweep folder ``out``, checkpointed (``sweep --checkpoint-every``)
    by a runner that is running them or was killed before they returned: ``{cell key: [(step,
    steps), ...]}`` in key order, one pair per checkpointed run in run order, the step the next
    runner resumes that run from and the run's steps; ``(-1, -1)`` for a checkpoint that cannot
    be read. Empty when there are none. Each checkpoint is opened memory-mapped (the weights
    are not read)."""
    import torch

    found: dict[str, list[tuple[int, int]]] = {}
    for cell in sorted(p for p in (Path(out) / ".checkpoints").glob("*") if p.is_dir()):
        runs = []
        paths = sorted(cell.glob("run*/checkpoint.pt"), key=lambda p: int(p.parent.name[3:] or 0))
        for path in paths:
            try:
                state = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
                runs.append((int(state["step"]), int(state["train_config"]["steps"])))
            except (OSError, RuntimeError, KeyError, TypeError, EOFError, pickle.UnpicklingError):
                runs.append((-1, -1))
        if runs:
            found[cell.name] = runs
    return found
