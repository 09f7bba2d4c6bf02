"""Sampling: random windows of a token stream and random rows of arrays (seeded, resumable,
split across data-parallel ranks), and the deterministic evaluation windows."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

from .corpora import TextCorpus
from .tasks import ArrayTask

__all__ = ["RowSampler", "WindowSampler", "eval_windows", "make_sampler"]


class WindowSampler:
    """Random contiguous windows of a token stream, seeded and resumable.

    Each call to :meth:`next` draws a *global* batch of ``batch_size`` window starts from its
    own generator and returns this rank's share (rows ``rank::world_size``... in contiguous
    blocks), so every rank draws the same global batch and a data-parallel run sees the same
    data as a single-process one. ``x (b, seq_len)`` are inputs, ``y`` the next tokens.
    """

    def __init__(
        self,
        tokens: Tensor,
        batch_size: int,
        seq_len: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if tokens.dim() != 1 or tokens.numel() <= seq_len + 1:
            raise ValueError(
                f"need a 1-D stream longer than seq_len + 1 = {seq_len + 1}, got {tuple(tokens.shape)}"
            )
        if batch_size % world_size:
            raise ValueError(f"batch_size={batch_size} not divisible by world_size={world_size}")
        self.tokens, self.batch_size, self.seq_len = tokens, batch_size, seq_len
        self.rank, self.world_size = rank, world_size
        self.generator = torch.Generator().manual_seed(seed)
        self.steps = 0

    def next(self) -> tuple[Tensor, Tensor]:
        n = self.tokens.numel() - self.seq_len - 1
        starts = torch.randint(0, n + 1, (self.batch_size,), generator=self.generator)
        per = self.batch_size // self.world_size
        starts = starts[self.rank * per : (self.rank + 1) * per]
        offs = torch.arange(self.seq_len + 1)
        win = self.tokens[starts[:, None] + offs]  # (b, seq_len + 1)
        self.steps += 1
        return win[:, :-1], win[:, 1:]

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state(), "steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])
        self.steps = int(state["steps"])


class RowSampler:
    """Random rows of fixed arrays (with replacement across batches, reshuffled per epoch),
    seeded and resumable; global batch split across ranks like :class:`WindowSampler`."""

    def __init__(
        self,
        x: Tensor,
        y: Tensor,
        batch_size: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if batch_size % world_size:
            raise ValueError(f"batch_size={batch_size} not divisible by world_size={world_size}")
        self.x, self.y, self.batch_size = x, y, batch_size
        self.rank, self.world_size = rank, world_size
        self.generator = torch.Generator().manual_seed(seed)
        self.steps = 0
        self._perm = torch.randperm(x.shape[0], generator=self.generator)
        self._pos = 0

    def next(self) -> tuple[Tensor, Tensor]:
        idx = []
        need = self.batch_size
        while need:
            if self._pos >= self._perm.numel():
                self._perm = torch.randperm(self.x.shape[0], generator=self.generator)
                self._pos = 0
            take = self._perm[self._pos : self._pos + need]
            self._pos += take.numel()
            need -= take.numel()
            idx.append(take)
        rows = torch.cat(idx)
        per = self.batch_size // self.world_size
        rows = rows[self.rank * per : (self.rank + 1) * per]
        self.steps += 1
        return self.x[rows], self.y[rows]

    def state_dict(self) -> dict[str, Any]:
        return {
            "generator": self.generator.get_state(),
            "steps": self.steps,
            "perm": self._perm.clone(),
            "pos": self._pos,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])
        self.steps = int(state["steps"])
        self._perm = state["perm"].clone()
        self._pos = int(state["pos"])


def make_sampler(
    data: TextCorpus | ArrayTask,
    batch_size: int,
    seq_len: int,
    seed: int = 0,
    rank: int = 0,
    world_size: int = 1,
) -> WindowSampler | RowSampler:
    """The training sampler of a data set (windows of a stream, or rows of arrays)."""
    if isinstance(data, TextCorpus):
        return WindowSampler(data.train, batch_size, seq_len, seed, rank, world_size)
    return RowSampler(data.train_x, data.train_y, batch_size, seed, rank, world_size)


def eval_windows(
    tokens: Tensor, batch_size: int, seq_len: int, max_batches: int | None = None
) -> Iterator[tuple[Tensor, Tensor]]:
    """Deterministic evaluation: consecutive non-overlapping windows from the start of the
    stream, ``batch_size`` at a time (the last batch may be smaller; a tail shorter than
    ``seq_len`` is dropped). Yields ``(x, y)`` each ``(b, seq_len)``."""
    n_win = (tokens.numel() - 1) // seq_len
    starts = torch.arange(n_win) * seq_len
    offs = torch.arange(seq_len + 1)
    for bi, i in enumerate(range(0, n_win, batch_size)):
        if max_batches is not None and bi >= max_batches:
            break
        win = tokens[starts[i : i + batch_size, None] + offs]  # (b, seq_len + 1)
        yield win[:, :-1], win[:, 1:]
