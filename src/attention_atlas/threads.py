"""Torch's intra-op thread count, set for a block of work and restored after it.

The harness runs cells, benchmarks and training on a chosen number of threads (one thread for
the CPU-time clock and for bit-reproducible cells) and gives the caller back the count it had.
:func:`intra_op_threads` is that pattern's one home. It calls ``torch.set_num_threads`` only
when the count changes: with the MKL of PyTorch's pip wheels an explicit
``set_num_threads(k > 1)`` is what exposes the batched-LU fault that
:func:`attention_atlas.linalg.serial_lu` guards against, so a block that asks for the count
already in force makes no call at all.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

__all__ = ["intra_op_threads"]


@contextlib.contextmanager
def intra_op_threads(n: int | None) -> Iterator[None]:
    """``torch.set_num_threads(n)`` for the block, the previous count restored after it (also
    when the block raises, and also when the block itself changed the count).

    ``n=None`` keeps the current count for the block (and still restores it afterwards).
    Raises ValueError for anything but a positive int or None."""
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise ValueError(f"threads: expected a positive int or None, got {n!r}")
    before = torch.get_num_threads()
    if n is not None and n != before:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)
