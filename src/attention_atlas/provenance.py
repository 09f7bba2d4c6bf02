"""Provenance: where a cell ran (captured in the worker and the runner) and where a grid's
records came from (summarised in one line to print beside a figure).

A record's ``provenance`` holds the run's ``command``, ``experiment``, ``preset``,
``git_commit`` and ``git_dirty``, ``backend``, ``started``/``finished`` (UTC), and the
worker's :func:`environment`: ``device`` (``cuda`` when the cell used the GPU), ``cpu`` (the
model name), ``cpu_id`` (:func:`cpu_id`), ``gpu``, torch ``threads``, ``platform`` and library
``versions``.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "Provenance",
    "cpu_id",
    "cpu_model",
    "environment",
    "format_duration",
    "git_state",
    "package_version",
    "versions",
]


def _cpuinfo(path: str | os.PathLike[str] = "/proc/cpuinfo") -> dict[str, str]:
    """The first processor's fields in ``/proc/cpuinfo`` (empty where there is none)."""
    fields: dict[str, str] = {}
    try:
        text = Path(path).read_text()
    except OSError:
        return fields
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break  # the first processor's block only
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def cpu_model() -> str:
    """The processor's model name (``/proc/cpuinfo``), else what :mod:`platform` says."""
    return _cpuinfo().get("model name") or platform.processor() or platform.machine()


#: the ``/proc/cpuinfo`` flags (by prefix) that choose the vector code of PyTorch's kernels and
#: of a ``-march=native`` build
_ISA_PREFIXES = ("avx", "fma", "amx", "f16c", "sse4")


def cpu_id(cpuinfo: str | os.PathLike[str] = "/proc/cpuinfo") -> str:
    """The processor as the code paths that run on it see it: vendor, family, model and stepping,
    and its vector instruction sets, e.g. ``"AuthenticAMD 25/1/1 avx avx2 fma ..."``. A model
    name is not enough: under a hypervisor an EPYC 9004 (family 25, model 17, AVX-512) and an
    EPYC 7003 (model 1, AVX2) are both "AMD EPYC", and the same training run on the two differs
    in its last bits. Without ``cpuinfo``: :mod:`platform`'s machine and processor."""
    info = _cpuinfo(cpuinfo)
    if "flags" not in info:
        return f"{platform.machine()} {platform.processor()}".strip()
    isa = sorted(f for f in info["flags"].split() if f.startswith(_ISA_PREFIXES))
    ident = "/".join(info.get(k, "?") for k in ("cpu family", "model", "stepping"))
    return " ".join([info.get("vendor_id", "?"), ident, *isa])


def package_version() -> str:
    """This package's version, as installed (``"unknown"`` when it is not installed)."""
    try:
        return importlib.metadata.version("attention-atlas")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def versions() -> dict[str, str]:
    """Versions of python, torch (and CUDA where a GPU is present), numpy, pandas, this package,
    and the platform."""
    import pandas as pd
    import torch

    gpu = torch.cuda.is_available()
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "pandas": pd.__version__,
        "attention_atlas": package_version(),
        "platform": platform.platform(),
        **({"cuda": str(torch.version.cuda)} if gpu else {}),
    }


def environment(*, used_cuda: bool) -> dict[str, Any]:
    """Where a cell ran (called in the worker): ``device`` (``"cuda"`` if the cell used the
    GPU, else ``"cpu"``), ``cpu`` and ``gpu`` names, ``cpu_id`` (:func:`cpu_id`), torch
    ``threads``, library ``versions``."""
    import torch

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return {
        "device": "cuda" if used_cuda else "cpu",
        "cpu": cpu_model(),
        "cpu_id": cpu_id(),
        "gpu": gpu,
        "threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "versions": versions(),
    }


def _git_state_from_environment() -> dict[str, Any]:
    commit = os.environ.get("ATTENTION_ATLAS_GIT_COMMIT") or None
    dirty = os.environ.get("ATTENTION_ATLAS_GIT_DIRTY")
    if commit is not None and (
        len(commit) != 40 or any(c not in "0123456789abcdef" for c in commit)
    ):
        raise ValueError(f"ATTENTION_ATLAS_GIT_COMMIT: expected 40 hex digits, got {commit!r}")
    if dirty not in (None, "0", "1"):
        raise ValueError(f"ATTENTION_ATLAS_GIT_DIRTY: expected 0 or 1, got {dirty!r}")
    return {"git_commit": commit, "git_dirty": None if dirty is None else dirty == "1"}


def git_state(repo: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """``git_commit`` and ``git_dirty`` (uncommitted changes under ``src/``, ``pyproject.toml``
    or ``requirements.lock``: what can change a result).

    ``ATTENTION_ATLAS_GIT_COMMIT`` and ``ATTENTION_ATLAS_GIT_DIRTY`` (``0``/``1``), when set,
    are taken instead of asking git: a copy of the working tree sent to another machine (your
    GPU machine) carries no ``.git`` or a stale one, so ``benchmarks/gpu_prepare.sh`` records
    them where the true checkout is. Outside a git checkout, without them: both None."""
    root = Path(repo) if repo is not None else Path(__file__).resolve().parents[2]
    if os.environ.get("ATTENTION_ATLAS_GIT_COMMIT") or not (root / ".git").exists():
        return _git_state_from_environment()

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, check=True, timeout=30
        ).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        dirty = bool(
            git("status", "--porcelain", "--", "src", "pyproject.toml", "requirements.lock")
        )
    except (OSError, subprocess.SubprocessError):
        return {"git_commit": None, "git_dirty": None}
    return {"git_commit": commit, "git_dirty": dirty}


def format_duration(seconds: float) -> str:
    """``41 s``, ``12 min`` or ``3.2 h``."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def _listed(items: Sequence[str], noun: str) -> str:
    if not items:
        return f"{noun} unknown"
    more = f" and {len(items) - 1} more" if len(items) > 1 else ""
    return f"{noun} {items[0]}{more}" if noun else f"{items[0]}{more}"


@dataclass(frozen=True)
class Provenance:
    """Where a grid's records came from, summarised over its cells."""

    source: str  #: "stored" (loaded from the store) or "computed" (run for this chapter)
    experiment: str
    preset: str
    folder: str
    commands: tuple[str, ...]  #: the distinct commands that made the cells, first first
    commits: tuple[str, ...]  #: short commits (``-dirty`` when made with uncommitted changes)
    dates: tuple[str, ...]  #: first and last day a cell finished (UTC)
    devices: tuple[str, ...]  #: ``GPU <name>`` or ``CPU <model>, <n> thread(s)`` (+ compile)
    n_cells: int
    compute_seconds: float  #: sum of the cells' wall times
    n_resumed: int = 0  #: cells resumed from checkpoints (``sweep --checkpoint-every``)

    @classmethod
    def from_records(
        cls, records: Sequence[Mapping[str, Any]], *, source: str, experiment: str, preset: str,
        folder: str | os.PathLike[str],
    ) -> Provenance:  # fmt: skip
        provs = [r.get("provenance", {}) for r in records]

        def unique(values: list[Any]) -> tuple[str, ...]:
            return tuple(dict.fromkeys(str(v) for v in values if v))

        commits = [(p["git_commit"] or "")[:7] + ("-dirty" if p.get("git_dirty") else "")
                   for p in provs if p.get("git_commit")]  # fmt: skip
        days = sorted(str(p["finished"])[:10] for p in provs if p.get("finished"))
        devices = [(f"GPU {p.get('gpu')}" if p.get("device") == "cuda" else
                    f"CPU {p.get('cpu', '?')}, {p.get('threads', '?')} thread(s)")
                   + (", compiled steps" if p.get("compile") else "")
                   + (", native kernels" if p.get("native") else "") for p in provs]  # fmt: skip
        return cls(source, experiment, preset, str(folder), unique([p.get("command") for p in provs]),
                   unique(commits), unique([days[0], days[-1]] if days else []), unique(devices),
                   len(records), float(sum(r.get("cell_seconds", 0.0) for r in records)),
                   sum(bool(p.get("resumed_from")) for p in provs))  # fmt: skip

    @property
    def text(self) -> str:
        """One line to print beside a figure: command, commit, date, device, size."""
        lead = "stored results of" if self.source == "stored" else "computed here, as by"
        command = f"`{self.commands[0]}`" if self.commands else f"a sweep into {self.folder}"
        if len(self.commands) > 1:
            command += f" (and {len(self.commands) - 1} more runs)"
        resumed = f" ({self.n_resumed} resumed from checkpoints)" if self.n_resumed else ""
        return (f"{lead} {command}, {_listed(self.commits, 'commit')}, {' to '.join(self.dates) or 'date unknown'}, "
                f"{_listed(self.devices, '')}; {self.n_cells} cells{resumed}, {format_duration(self.compute_seconds)} of compute")  # fmt: skip

    def __str__(self) -> str:
        return self.text
