"""``results verify``: re-run stored cells and check that they reproduce, exactly when re-run on
the same kind of CPU with the same torch at one thread, else within ``rtol`` (default
:data:`RTOL`, for GPU runs or other hardware). Timings (metrics named ``*_s``, ``*_seconds``,
``*time``, ``*per_s``, or matching an experiment module's ``VOLATILE_METRICS`` patterns) are not
compared. The experiment modules come in through ``resolve`` (name -> module), so the runner
knows no experiment by name: :func:`attention_atlas.experiments.verify` passes the table."""

from __future__ import annotations

import fnmatch
import json
import math
import os
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from attention_atlas.store.records import RESERVED, load_record
from attention_atlas.store.results import results_root

from .backends import execute_cell

__all__ = ["ATOL", "RTOL", "Verified", "compare", "native_level", "verify"]

#: relative tolerance of ``results verify`` when the re-run is on other hardware (or a GPU)
RTOL = 1e-3
#: absolute tolerance added to it (values near zero)
ATOL = 1e-6
_VOLATILE = re.compile(r"(^|_)(s|sec|seconds|time)$|per_s$")


def _volatile(name: str, patterns: Sequence[str]) -> bool:
    return bool(_VOLATILE.search(name)) or any(fnmatch.fnmatchcase(name, p) for p in patterns)


def compare(
    stored: Any, new: Any, *, rtol: float, atol: float, volatile: Sequence[str] = (), path: str = ""
) -> tuple[list[str], float]:
    """Differences between two JSON values (a stored record's metrics and a re-run's), and the
    largest relative difference of the numbers compared. Numbers agree when ``|new - stored|
    <= atol + rtol |stored|`` (both NaN agree); keys that are timings are skipped."""
    if isinstance(stored, dict) and isinstance(new, dict):
        keys = [k for k in {*stored, *new} if not _volatile(k, volatile)]
        diffs, worst = [], 0.0
        for k in sorted(keys):
            if k not in stored or k not in new:
                diffs.append(
                    f"{path}{k}: only in the {'stored' if k in stored else 're-run'} record"
                )
                continue
            d, w = compare(
                stored[k], new[k], rtol=rtol, atol=atol, volatile=volatile, path=f"{path}{k}."
            )
            diffs += d
            worst = max(worst, w)
        return diffs, worst
    where = path.rstrip(".") or "value"
    if isinstance(stored, list) and isinstance(new, list):
        if len(stored) != len(new):
            return [f"{where}: length {len(stored)} stored, {len(new)} re-run"], math.inf
        bad, worst = [], 0.0
        for i, (a, b) in enumerate(zip(stored, new)):
            d, w = compare(a, b, rtol=rtol, atol=atol, volatile=volatile, path=f"{where}[{i}].")
            bad += d
            worst = max(worst, w)
        more = f" (and {len(bad) - 1} more in {where})" if len(bad) > 1 else ""
        return ([bad[0] + more] if bad else []), worst
    numbers = (int, float)
    if isinstance(stored, numbers) and isinstance(new, numbers) and not isinstance(stored, bool):
        if stored == new or (math.isnan(stored) and math.isnan(new)):
            return [], 0.0
        rel = abs(new - stored) / max(abs(stored), 1e-300)
        ok = abs(new - stored) <= atol + rtol * abs(stored)
        return ([] if ok else [f"{where}: {stored!r} stored, {new!r} re-run"]), rel
    return ([] if stored == new else [f"{where}: {stored!r} stored, {new!r} re-run"]), 0.0


@dataclass
class Verified:
    """The outcome of re-running one stored cell."""

    path: Path
    status: str  #: "exact", "close" (within tolerance), "differs" or "skipped"
    detail: str


def _hide_gpus() -> None:
    os.environ["CUDA_VISIBLE_DEVICES"] = ""


def _rerun(
    run_cell: Any, params: dict[str, Any], seed: int, threads: int, hide_gpus: bool,
    compile: bool = False, native: bool | int = False,
) -> dict[str, Any]:  # fmt: skip
    if not hide_gpus:
        return execute_cell(run_cell, params, seed, threads, compile, native=native)
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=ctx, initializer=_hide_gpus) as pool:
        return dict(pool.submit(execute_cell, run_cell, params, seed, threads, compile,
                                native=native).result())  # fmt: skip


def native_level(prov: dict[str, Any]) -> int:
    """The native kernels' level a record was made at: 0 without them, its ``native_level``,
    else 1 (the records made before :data:`attention_atlas.native.LEVEL` existed)."""
    return int(prov.get("native_level", 1)) if prov.get("native") else 0


def verify(
    sample: int = 1,
    *,
    experiment: str | None = None,
    preset: str | None = None,
    rtol: float = RTOL,
    atol: float = ATOL,
    seed: int = 0,
    root: str | os.PathLike[str] | None = None,
    resolve: Callable[[str], ModuleType],
    log: Callable[[str], None] | None = print,
) -> list[Verified]:
    """Re-run ``sample`` stored cells (chosen at random with ``seed``; all if fewer) and compare.

    A cell made on the CPU is re-run on the CPU (a GPU here is hidden from it) at its thread
    count; it must reproduce exactly when this CPU model and torch version are those that made
    it (its model name and :func:`~attention_atlas.provenance.cpu_id`: one name can cover
    processors with different vector units; a record made before ``cpu_id`` was stored is held
    to ``rtol``), else within ``rtol``. A cell made on a GPU is re-run on a GPU (skipped without one) and
    must agree within ``rtol``. A cell made with compiled steps (``sweep --compile``) is re-run
    compiled, one made with the native kernels (``sweep --native``) with them, at the level
    that made it (``native_level``; level 1 where the record predates levels).
    """
    import torch

    base = Path(root) if root is not None else results_root()
    paths = sorted(base.glob(f"{experiment or '*'}/{preset or '*'}/cells/*.json"))
    if not paths:
        raise FileNotFoundError(
            f"no stored cells under {base} (experiment={experiment}, preset={preset})"
        )
    chosen = sorted(random.Random(seed).sample(paths, min(sample, len(paths))))
    outcomes = []
    for path in chosen:
        rec = load_record(path)
        prov = rec.get("provenance", {})
        mod = resolve(prov.get("experiment") or path.parents[2].name)
        on_gpu = prov.get("device") == "cuda"
        if on_gpu and not torch.cuda.is_available():
            outcomes.append(Verified(path, "skipped", f"made on {prov.get('gpu')}; no GPU here"))
        else:
            out = _rerun(mod.run_cell, rec["params"], rec["seed"], int(prov.get("threads") or 1),
                         hide_gpus=not on_gpu and torch.cuda.is_available(),
                         compile=bool(prov.get("compile")), native=native_level(prov))  # fmt: skip
            env = out["environment"]
            exact = not on_gpu and prov.get("threads") == 1 and env["cpu"] == prov.get("cpu") and \
                env["cpu_id"] == prov.get("cpu_id") and \
                env["versions"]["torch"] == prov.get("versions", {}).get("torch")  # fmt: skip
            stored = {k: v for k, v in rec.items() if k not in RESERVED}
            new = json.loads(json.dumps(out["metrics"]))
            diffs, worst = compare(stored, new, rtol=0.0 if exact else rtol, atol=0.0 if exact else atol,
                                   volatile=getattr(mod, "VOLATILE_METRICS", ()))  # fmt: skip
            status = "differs" if diffs else ("exact" if worst == 0 else "close")
            rule = "exactly (same CPU and torch, one thread)" if exact else f"within rtol {rtol:g}"
            detail = (
                "; ".join(diffs[:3])
                if diffs
                else f"reproduced {rule}, largest relative difference {worst:.2g}"
            )
            outcomes.append(Verified(path, status, detail))
        if log is not None:
            log(f"[verify] {path.relative_to(base)}: {outcomes[-1].status}: {outcomes[-1].detail}")
    return outcomes
