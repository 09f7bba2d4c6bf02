"""Atomic file writes: a temporary file beside the target, flushed to disk, then renamed over
it, so a process killed at any moment leaves either the old file or the new one (and at most a
``.NAME.partial`` that nothing reads and the next write replaces)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["atomic_path", "atomic_torch_save", "atomic_write_text", "partial_path"]


def partial_path(path: str | os.PathLike[str]) -> Path:
    """The temporary file an atomic write of ``path`` goes through: ``.NAME.partial``."""
    p = Path(path)
    return p.with_name(f".{p.name}.partial")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path to write ``path``'s new content to; on success it is synced and
    renamed over ``path``; on an exception it is removed and ``path`` is left as it was."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = partial_path(target)
    try:
        yield tmp
        with tmp.open("rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(text: str, path: str | os.PathLike[str]) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def atomic_torch_save(obj: Any, path: str | os.PathLike[str]) -> None:
    """:func:`torch.save` ``obj`` to ``path`` atomically."""
    import torch

    with atomic_path(path) as tmp, tmp.open("wb") as f:
        torch.save(obj, f)
