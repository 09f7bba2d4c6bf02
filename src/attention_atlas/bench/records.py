"""Benchmark records in the results store: ``results/bench/<machine kind>/<name>.json``.

A record is the JSON of a benchmark (:func:`attention_atlas.experiments.performance.train_steps.bench_train`,
:func:`attention_atlas.bench.scaling.kernel_scaling`) plus its ``provenance``: the command that
made it, the git commit (and whether ``src/`` had uncommitted changes), the start and end (UTC)
and where it ran (:func:`attention_atlas.provenance.environment`: CPU, GPU, threads, versions),
in the same form as an experiment cell's, so :class:`attention_atlas.provenance.Provenance`
summarises it in the one line a chapter prints beside a figure.

The machine kind is ``cpu`` or ``cuda`` (the device the benchmark timed), so GPU records sit
beside CPU ones and a chapter shows whichever exist. A record of the same kind made on another
machine (another processor, another clock) goes one folder down,
``results/bench/<kind>/<machine>/<name>.json`` (``bench ... --store --machine LABEL``), beside
the kind's reference record rather than over it: a step's ratio to a dot-product step depends on
the machine, and the chapter shows each.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import torch

from attention_atlas.provenance import Provenance, environment, git_state
from attention_atlas.store.records import dumps_record, write_atomic
from attention_atlas.store.results import results_root

__all__ = [
    "KINDS",
    "bench_dir",
    "load_bench",
    "load_bench_kinds",
    "machine_kind",
    "other_machines",
    "provenance_text",
    "stamp",
    "store_bench",
]

#: machine kinds a record may be stored under
KINDS = ("cpu", "cuda")


def machine_kind(device: str | torch.device) -> str:
    """``"cuda"`` for a CUDA device, else ``"cpu"``."""
    return "cuda" if torch.device(device).type == "cuda" else "cpu"


#: a machine label (``--machine``): lower-case letters and digits, words joined by hyphens
_MACHINE = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")


def bench_dir(
    kind: str, root: str | os.PathLike[str] | None = None, machine: str | None = None
) -> Path:
    """``<results root>/bench/<kind>``, or ``.../<kind>/<machine>`` for another machine's."""
    if kind not in KINDS:
        raise ValueError(f"machine kind must be one of {KINDS}, got {kind!r}")
    base = (Path(root) if root is not None else results_root()) / "bench" / kind
    if machine is None:
        return base
    if not isinstance(machine, str) or _MACHINE.fullmatch(machine) is None:
        raise ValueError(
            "a machine label is lower-case letters and digits, words joined by hyphens "
            f"(e.g. intel-xeon-2ghz), got {machine!r}"
        )
    return base / machine


def other_machines(kind: str = "cpu", root: str | os.PathLike[str] | None = None) -> list[str]:
    """The labels of the other machines of ``kind`` with stored records (sorted)."""
    base = bench_dir(kind, root)
    if not base.is_dir():
        return []
    return sorted(p.name for p in base.iterdir() if p.is_dir() and _MACHINE.fullmatch(p.name))


def stamp(record: dict[str, Any], *, started: float, command: str | None = None) -> dict[str, Any]:
    """``record`` with its ``provenance`` (command, commit, times, environment) added."""

    def iso(t: float) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))

    cmd = (
        command if command is not None else "python -m attention_atlas " + shlex.join(sys.argv[1:])
    )
    device = str(record.get("device", "cpu"))
    return {
        **record,
        "provenance": {
            "command": cmd,
            "experiment": "bench",
            "preset": record.get("name"),
            **git_state(),
            "started": iso(started),
            "finished": iso(time.time()),
            **environment(used_cuda=machine_kind(device) == "cuda"),
        },
    }


def store_bench(
    record: dict[str, Any],
    name: str,
    root: str | os.PathLike[str] | None = None,
    machine: str | None = None,
) -> Path:
    """Write ``record`` (with its provenance, see :func:`stamp`) to
    ``results/bench/<kind>/<name>.json``, the kind from the record's ``device`` (under
    ``<kind>/<machine>/`` for another machine's record); the path."""
    if "provenance" not in record:
        raise ValueError("a stored benchmark record needs its provenance: pass it through stamp()")
    kind = machine_kind(str(record.get("device", "cpu")))
    path = bench_dir(kind, root, machine) / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, dumps_record(record))
    return path


def load_bench(
    name: str,
    kind: str = "cpu",
    root: str | os.PathLike[str] | None = None,
    machine: str | None = None,
) -> dict[str, Any] | None:
    """The stored record ``results/bench/<kind>[/<machine>]/<name>.json``, or None if there is
    none."""
    path = bench_dir(kind, root, machine) / f"{name}.json"
    return dict(json.loads(path.read_text())) if path.exists() else None


def load_bench_kinds(
    name: str, root: str | os.PathLike[str] | None = None
) -> dict[str, dict[str, Any]]:
    """``{kind: record}`` for every machine kind that has a stored record ``name``."""
    found = {k: load_bench(name, k, root) for k in KINDS}
    return {k: r for k, r in found.items() if r is not None}


def provenance_text(record: dict[str, Any], source: str = "stored") -> str:
    """The one line to print beside a figure made from ``record``: command, commit, date,
    device (as for an experiment's stored results); ``source="computed"`` for a record made
    by the page that shows it."""
    prov = Provenance.from_records(
        [{"provenance": record.get("provenance", {}), "cell_seconds": record.get("seconds", 0.0)}],
        source=source, experiment="bench", preset=str(record.get("name")), folder="results/bench",
    )  # fmt: skip
    return prov.text.replace("; 1 cells", "; 1 record")
