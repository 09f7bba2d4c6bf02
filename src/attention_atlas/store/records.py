"""Cell records on disk: keys, JSON records, atomic writes, per-cell locks and provenance.

The sweep runner (:mod:`attention_atlas.sweep.runner`) and the results store
(:mod:`attention_atlas.store.results`) share these. A sweep folder holds::

    cells/<config>__seed<seed>__<hash>.json   one record per finished cell (never partial)
    cells/<same stem>.lock                    while a runner works on the cell (not committed)
    results.csv                               every finished cell, one row each
    grid.json                                 the grid: experiment, preset, parameters, seeds

A record is ``{"config", "seed", "key", "cell_seconds", <metrics>..., "params", "provenance",
"checksum"}``: the metrics the cell returned at the top level (dicts and lists, e.g. training
histories, stay in the JSON and out of the CSV), the cell's parameters, where it came from
(command, git commit and dirty flag, library versions, CPU and GPU, torch threads, wall time),
and the sha256 of all of that (:func:`record_checksum`), checked on every load: a record edited
by hand, or damaged, is reported (:class:`DamagedRecord`) instead of read as if a run had made
it. ``results.csv`` is a convenience copy, rebuilt from the records after every sweep and by
``results list``; nothing reads metrics from it.

Keys: ``<hash>`` is 12 hex digits of the sha256 of the parameters in a canonical JSON form
(:func:`canonical`): keys sorted, tuples as lists, numpy and torch scalars as Python numbers,
a float equal to an integer as that integer (``1.0`` and ``1``, ``-0.0`` and ``0`` are one
parameter value), other floats by their shortest round-trip repr. So dict order, the number type
and float formatting never change a key; any change of a value does.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import socket
import threading
import time
import uuid
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from attention_atlas.atomic import pid_alive
from attention_atlas.validate import InputError

__all__ = [
    "RESERVED",
    "Cell",
    "CellLocks",
    "canonical",
    "cell_key",
    "config_hash",
    "dumps_record",
    "jsonable",
    "make_cells",
    "read_records",
    "record_checksum",
    "records_frame",
    "seal",
    "time_column",
    "write_atomic",
    "write_csv",
]

#: top-level record fields that are not metrics (a cell may not return a metric so named)
RESERVED = ("config", "seed", "key", "cell_seconds", "params", "provenance", "checksum")
#: a record larger than this is written with a warning (the store is for metrics, not weights)
MAX_RECORD_BYTES = 4_000_000


@dataclass(frozen=True)
class Cell:
    """One run of a sweep: configuration ``config`` with ``params``, at ``seed``."""

    config: str
    seed: int
    params: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)


def make_cells(configs: Mapping[str, Mapping[str, Any]], seeds: Sequence[int]) -> list[Cell]:
    """Every ``(config, seed)`` pair, config-major (a configuration's seeds stay together)."""
    return [Cell(name, int(s), dict(p)) for name, p in configs.items() for s in seeds]


# ----------------------------------------------------------------------------------------
# keys
# ----------------------------------------------------------------------------------------


def canonical(obj: Any, where: str = "params") -> Any:
    """``obj`` in the canonical JSON form that :func:`config_hash` hashes (see the module
    docstring). Raises TypeError naming the path of a value that has no JSON form."""
    if obj is None or isinstance(obj, str | bool | np.bool_):
        return bool(obj) if isinstance(obj, np.bool_) else obj
    if isinstance(obj, int | np.integer):
        return int(obj)
    if isinstance(obj, float | np.floating):
        x = float(obj)
        if not math.isfinite(x):
            return {"__float__": repr(x)}  # nan, inf, -inf (JSON has no literal for them)
        return int(x) if x.is_integer() and abs(x) < 2**53 else x
    if isinstance(obj, Mapping):
        bad = [k for k in obj if not isinstance(k, str)]
        if bad:
            raise TypeError(
                f"{where}: keys must be strings, got {bad[0]!r} ({type(bad[0]).__name__})"
            )
        return {k: canonical(v, f"{where}.{k}") for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [canonical(v, f"{where}[{i}]") for i, v in enumerate(obj)]
    if hasattr(obj, "tolist"):  # numpy array, torch tensor
        return canonical(obj.tolist(), where)
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    raise TypeError(
        f"{where}: a {type(obj).__name__} has no canonical JSON form "
        "(expected str, number, bool, None, list, tuple or dict)"
    )


def config_hash(params: Mapping[str, Any]) -> str:
    """12 hex digits of the sha256 of ``params`` in canonical JSON (sorted keys, no spaces)."""
    text = json.dumps(canonical(params), sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def cell_key(cell: Cell) -> str:
    """File stem of a cell: ``<config>__seed<seed>__<config_hash(params)>``."""
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in cell.config)
    return f"{safe}__seed{cell.seed}__{config_hash(cell.params)}"


# ----------------------------------------------------------------------------------------
# JSON records and atomic writes
# ----------------------------------------------------------------------------------------


def jsonable(obj: Any, where: str = "record") -> Any:
    """``obj`` with numpy/torch values as Python numbers and lists, tuples as lists, mapping
    keys as strings (NaN and infinities kept). TypeError names the path of anything else."""
    if obj is None or isinstance(obj, str | bool | int | float):
        return obj
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v, f"{where}.{k}") for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [jsonable(v, f"{where}[{i}]") for i, v in enumerate(obj)]
    if hasattr(obj, "tolist"):
        return jsonable(obj.tolist(), where)
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    raise TypeError(f"{where}: cannot store a {type(obj).__name__} in a JSON record")


def dumps_record(record: Mapping[str, Any]) -> str:
    """The JSON text of a record: one top-level field per line, each value compact."""
    lines = [f"{json.dumps(k)}: {json.dumps(jsonable(v, k))}" for k, v in record.items()]
    return "{\n" + ",\n".join(lines) + "\n}\n"


def write_atomic(path: str | os.PathLike[str], text: str, *, overwrite: bool = True) -> bool:
    """Write ``text`` to ``path`` so that no reader ever sees a partial file.

    The text goes to a hidden temporary file beside ``path`` (flushed to disk), which then
    becomes ``path`` in one step: ``os.replace`` if ``overwrite``, else a hard link, which fails
    when ``path`` exists (then nothing is written and False is returned). A process killed
    before that step leaves only the temporary file (``.<name>.<random>.tmp``), never ``path``.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        with open(tmp, "x", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if overwrite:
            os.replace(tmp, path)
            return True
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        except OSError:  # a filesystem without hard links: check, then rename (small race)
            if path.exists():
                return False
            os.replace(tmp, path)
        return True
    finally:
        tmp.unlink(missing_ok=True)


def record_checksum(record: Mapping[str, Any]) -> str:
    """``sha256:<hex>`` of ``record`` without its ``checksum`` field, in sorted-key compact
    JSON (so a record read back and checked hashes the same text it was sealed from)."""
    body = {k: v for k, v in record.items() if k != "checksum"}
    text = json.dumps(jsonable(body), sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def seal(record: Mapping[str, Any]) -> dict[str, Any]:
    """``record`` with its ``checksum`` (last), made anew: what the runner writes. A person who
    changes a record on purpose reseals it with this, and says why in the commit."""
    body = {k: v for k, v in record.items() if k != "checksum"}
    return {**body, "checksum": record_checksum(body)}


class DamagedRecord(InputError, ValueError):
    """A stored record that cannot be read (the message names its file and why)."""


def load_record(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The record in ``path``; :class:`DamagedRecord` naming the file when it is not a JSON
    object (truncated, edited into something else, unreadable) or its content does not match
    its ``checksum`` (edited after it was written). A record without a checksum (a fixture
    written by hand) is read as it is."""
    try:
        record = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DamagedRecord(f"{path}: not a readable record ({err})") from None
    if not isinstance(record, dict):
        raise DamagedRecord(f"{path}: not a record (a JSON {type(record).__name__})")
    if "checksum" in record and record["checksum"] != record_checksum(record):
        raise DamagedRecord(
            f"{path}: changed after it was written (its content does not match its checksum; "
            "restore it from git, re-run the cell, or reseal it with store.records.seal)"
        )
    return record


def read_records(folder: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every finished cell's record under ``folder/cells``, sorted by key
    (:class:`DamagedRecord` names one that cannot be read)."""
    return [load_record(p) for p in sorted(Path(folder, "cells").glob("*.json"))]


def records_frame(records: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per record: ``config``, ``seed``, ``key``, ``cell_seconds`` and the scalar
    metrics (dicts and lists, ``params`` and ``provenance`` left out)."""
    return pd.DataFrame(
        [
            {k: v for k, v in r.items() if not isinstance(v, dict | list) and k != "checksum"}
            for r in records
        ]
    )


def time_column(frame: pd.DataFrame) -> tuple[str, str]:
    """The cells' training-time column to compare costs by, and its label: ``train_cpu_s``
    (the process's CPU time, which pauses and time-sharing do not inflate) when every row has
    it, else ``train_time_s`` (wall time: comparable only between cells run side by side on an
    otherwise idle machine; grids stored before CPU times were recorded have only this)."""
    if "train_cpu_s" in frame.columns and bool(frame["train_cpu_s"].notna().all()):
        return "train_cpu_s", "training CPU time (s)"
    return "train_time_s", "training time (s)"


def write_csv(folder: str | os.PathLike[str], *, skip_damaged: bool = True) -> bool:
    """Rebuild ``folder/results.csv`` from the records (atomically), when it differs from them:
    :func:`records_frame` of every readable record, plus the provenance columns ``git_commit``,
    ``git_dirty``, ``device``, ``threads``, ``finished``. A damaged record is left out with a
    warning (``skip_damaged=False``: :class:`DamagedRecord` is raised and nothing is written);
    with no record at all nothing is written. Returns whether the file was (re)written,
    so a caller can say that a stale or edited ``results.csv`` was replaced."""
    recs = []
    for p in sorted(Path(folder, "cells").glob("*.json")):
        try:
            recs.append(load_record(p))
        except DamagedRecord as err:
            if not skip_damaged:
                raise
            warnings.warn(f"{err}; left out of results.csv", RuntimeWarning, stacklevel=2)
    path = Path(folder) / "results.csv"
    if not recs:
        return False
    df = records_frame(recs)
    for col in ("git_commit", "git_dirty", "device", "threads", "finished"):
        df[col] = [r.get("provenance", {}).get(col) for r in recs]
    text = df.to_csv(index=False)
    try:
        if path.read_text() == text:
            return False
    except (OSError, UnicodeDecodeError):
        pass
    write_atomic(path, text)
    return True


# ----------------------------------------------------------------------------------------
# per-cell locks
# ----------------------------------------------------------------------------------------


class CellLocks:
    """Lock files ``<folder>/<name>.lock`` held by this runner, refreshed by a heartbeat.

    A lock is a file created exclusively (``O_EXCL``) holding ``{host, pid, token, since}``.
    Another runner may take it over only when it is stale: its process is dead (same host), or
    its file was not refreshed for ``stale_after`` seconds (any host; a holder refreshes every
    ``heartbeat`` seconds from a background thread, even while a long cell runs). A takeover
    moves the stale file aside, checks that it moved the lock it judged stale (else puts it
    back), and then creates its own; so two runners never both hold a cell.
    """

    def __init__(
        self, folder: str | os.PathLike[str], *, stale_after: float = 300.0, heartbeat: float = 30.0
    ) -> None:
        if not 0 < heartbeat < stale_after:
            raise ValueError(f"need 0 < heartbeat < stale_after, got {heartbeat}, {stale_after}")
        self.folder = Path(folder)
        self.stale_after, self.heartbeat = float(stale_after), float(heartbeat)
        self.host, self.pid = socket.gethostname(), os.getpid()
        self._held: dict[str, str] = {}  # name -> token
        self._mutex = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def path(self, name: str) -> Path:
        return self.folder / f"{name}.lock"

    def held(self) -> list[str]:
        with self._mutex:
            return list(self._held)

    def try_acquire(self, name: str) -> bool:
        """Take the lock ``name`` if it is free or stale; False if another runner holds it."""
        path = self.path(name)
        token = uuid.uuid4().hex
        for _ in range(4):
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                if not self._take_over_if_stale(path):
                    return False
                continue
            with os.fdopen(fd, "w") as f:
                json.dump({"host": self.host, "pid": self.pid, "token": token, "since": _now()}, f)
            with self._mutex:
                self._held[name] = token
            self._start_heartbeat()
            return True
        return False

    def release(self, name: str) -> None:
        """Give up lock ``name`` (its file is removed only if it is still ours)."""
        with self._mutex:
            token = self._held.pop(name, None)
        if token is not None and self._token(self.path(name)) == token:
            self.path(name).unlink(missing_ok=True)

    def close(self) -> None:
        """Release every lock and stop the heartbeat."""
        for name in self.held():
            self.release(name)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def is_stale(self, path: Path) -> bool:
        """Whether the lock file ``path`` may be taken over (see the class docstring)."""
        try:
            age = time.time() - path.stat().st_mtime
            info = json.loads(path.read_text())
        except FileNotFoundError:
            return True
        except (OSError, ValueError):  # being written, or its writer died while writing it
            return age > 10.0
        if age > self.stale_after:
            return True
        return info.get("host") == self.host and not pid_alive(int(info.get("pid", -1)))

    def _take_over_if_stale(self, path: Path) -> bool:
        try:
            before = path.read_bytes()
        except FileNotFoundError:
            return True
        if not self.is_stale(path):
            return False
        aside = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.stale")
        try:
            os.rename(path, aside)
        except FileNotFoundError:
            return True  # someone else removed it: try to create ours
        try:
            if aside.read_bytes() != before:  # we moved a fresh lock made meanwhile: restore it
                try:
                    os.link(aside, path)
                except FileExistsError:
                    pass
                return False
            return True
        finally:
            aside.unlink(missing_ok=True)

    def _token(self, path: Path) -> str | None:
        try:
            return str(json.loads(path.read_text()).get("token"))
        except (OSError, ValueError):
            return None

    def _start_heartbeat(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._beat, name="cell-lock-heartbeat", daemon=True
            )
            self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat):
            with self._mutex:
                held = dict(self._held)
            for name, token in held.items():
                path = self.path(name)
                if self._token(path) != token:
                    warnings.warn(f"lost the lock {path} (taken over as stale)", stacklevel=1)
                    continue
                try:
                    os.utime(path)
                except FileNotFoundError:
                    pass


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
