"""Atomic file writes: a temporary file beside the target, flushed to disk, then renamed over
it, so a process killed at any moment leaves either the old file or the new one (and at most a
``.NAME.partial`` that nothing reads and the next write replaces). And one writer per folder
(:func:`folder_lock`): a second run into a folder in use is refused, naming the holder."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "FolderInUse",
    "atomic_path",
    "atomic_torch_save",
    "atomic_write_text",
    "folder_lock",
    "partial_path",
    "pid_alive",
]


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


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` of this host runs (a zombie nobody reaped counts as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a killed child that nobody reaped yet is a zombie: dead for our purpose
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


class FolderInUse(RuntimeError):
    """Another live process writes into the folder (the message names it)."""


#: the lock file of :func:`folder_lock`, inside the folder
WRITER_LOCK = ".writer.lock"


@contextlib.contextmanager
def folder_lock(folder: str | os.PathLike[str], what: str = "run") -> Iterator[Path]:
    """Hold ``folder`` for this process while the block runs: ``<folder>/.writer.lock`` is
    created exclusively with ``{host, pid, since, what}`` and removed at the end. A folder held
    by a live process raises :class:`FolderInUse` naming it (pid, host, start time) before
    anything is written; a lock left by a dead process of this host is taken over, and one this
    process holds already is simply kept (the outer block releases it). A lock of another host
    is never judged stale here: the message says which file to remove. Folders the lock created
    are removed again at the end when the block left them empty (a refused run writes nothing)."""
    root = Path(folder)
    made = [d for d in (root, *root.parents) if not d.exists()]  # the folders this lock creates
    root.mkdir(parents=True, exist_ok=True)
    path = root / WRITER_LOCK
    me = {"host": socket.gethostname(), "pid": os.getpid(), "what": what,
          "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}  # fmt: skip
    for _ in range(3):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                held = json.loads(path.read_text())
            except (OSError, ValueError):
                held = {}
            same_host = held.get("host") == me["host"]
            if same_host and held.get("pid") == me["pid"]:  # this process holds it already
                yield path
                return
            if held and same_host and not pid_alive(int(held.get("pid", -1))):
                path.unlink(missing_ok=True)  # its holder died: take it over
                continue
            holder = (
                f"{held.get('what', 'a run')} of pid {held.get('pid', '?')} on "
                f"{held.get('host', '?')} since {held.get('since', '?')}"
                if held
                else "a process that is writing its lock"
            )
            more = "" if same_host or not held else f" (if it is gone, remove {path})"
            raise FolderInUse(f"{root} is in use by {holder}{more}") from None
        with os.fdopen(fd, "w") as f:
            json.dump(me, f)
        break
    else:
        raise FolderInUse(f"{root}: could not take {path}")
    try:
        yield path
    finally:
        try:
            if json.loads(path.read_text()).get("pid") == me["pid"]:
                path.unlink()
        except (OSError, ValueError):
            pass
        for d in made:  # a run refused or failed before writing leaves no empty folder behind
            try:
                d.rmdir()
            except OSError:  # not empty (the run wrote there), or not ours to remove
                break
