"""The claims register's outcomes as a stored grid: one cell per experiment module that computes
outcomes (``outcomes(smoke) -> {claim key: Outcome}``), run by the sweep runner into
``results/claims/book`` like any experiment, with provenance (commit, versions, CPU).

``python -m attention_atlas claims`` reads these records instead of recomputing every float64
check and every stored grid's verdict (about a minute on two cores, several while tests run):
a record is used when the sources and stored results it rests on (``src/attention_atlas`` and
``results/``, the register's own folder left out) are unchanged since the commit that made it,
else the module's outcomes are computed anew. ``claims --recompute`` runs the grid again and
stores it; ``results verify --experiment claims`` re-runs stored cells and compares them.
"""

from __future__ import annotations

import importlib
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from attention_atlas.stats import Interval
from attention_atlas.validate import ConfigError
from attention_atlas.verdicts import Outcome

__all__ = [
    "MODULES",
    "NAME",
    "PRESETS",
    "chapter_grid",
    "check_cell",
    "fresh",
    "outcome_from_json",
    "outcome_to_json",
    "run_cell",
]

#: the experiment's name on the command line and in the results store
NAME = "claims"
#: the experiment modules (under ``attention_atlas.experiments``) whose ``outcomes`` the register
#: reads, in the register's order
MODULES = (
    "non_gram", "rank_collapse", "low_rank", "fiber_bundle", "matroidal", "cofactor", "sma",
    "zoo", "seed_checks.riemannian_a", "seed_checks.riemannian_b", "seed_checks.riemannian_c",
    "seed_checks.cards",
)  # fmt: skip
PRESETS: dict[str, dict[str, Any]] = {"book": {"smoke": False}, "smoke": {"smoke": True}}
#: where the sources the outcomes rest on live, relative to the repository
_ROOT = Path(__file__).resolve().parents[3]


def chapter_grid(smoke: bool = False, modules: Any = MODULES) -> dict[str, dict[str, Any]]:
    """One configuration per module: ``{"module": name, "smoke": smoke}``."""
    unknown = sorted(set(modules) - set(MODULES))
    if unknown:
        raise ValueError(f"modules: unknown {unknown}; known: {', '.join(MODULES)}")
    return {m: {"module": m, "smoke": smoke} for m in modules}


def check_cell(params: Mapping[str, Any]) -> None:
    """A cell names a known module and a boolean ``smoke``."""
    if params.get("module") not in MODULES:
        raise ConfigError(
            f"module: expected one of {', '.join(MODULES)}, got {params.get('module')!r}"
        )
    if not isinstance(params.get("smoke"), bool):
        raise ConfigError(f"smoke: expected true or false, got {params.get('smoke')!r}")


def outcome_to_json(o: Outcome) -> dict[str, Any]:
    """An outcome as JSON (its interval as ``[mean, low, high, n, level]``)."""
    e = o.effect
    return {
        "outcome": o.outcome, "summary": o.summary,
        "effect": None if e is None else [e.mean, e.low, e.high, e.n, e.level],
        "sesoi": o.sesoi, "scale": o.scale, "evidence": o.evidence, "form": o.form,
        "reason": o.reason, "witness": o.witness,
    }  # fmt: skip


def outcome_from_json(d: Mapping[str, Any]) -> Outcome:
    """The :class:`~attention_atlas.verdicts.Outcome` of :func:`outcome_to_json`."""
    e = d.get("effect")
    effect = None if e is None else Interval(float(e[0]), float(e[1]), float(e[2]), int(e[3]),
                                             float(e[4]))  # fmt: skip
    return Outcome(d["outcome"], d["summary"], effect, d.get("sesoi"), d.get("scale"),
                   d.get("evidence", "computed"), form=d.get("form"), reason=d.get("reason"),
                   witness=d.get("witness"))  # fmt: skip


def run_cell(params: dict[str, Any], seed: int) -> dict[str, Any]:
    """One module's outcomes (``seed`` is unused: the checks seed themselves)."""
    check_cell(params)
    mod = importlib.import_module(f"attention_atlas.experiments.{params['module']}")
    found = mod.outcomes(smoke=params["smoke"])
    return {"outcomes": {k: outcome_to_json(v) for k, v in found.items()}}


def fresh(commit: str | None) -> bool:
    """Whether the sources and stored results are unchanged since ``commit`` (in the
    working tree too); False without git or when the commit is unknown here."""
    if not commit:
        return False
    paths = ["src/attention_atlas", "results", ":(exclude)results/claims"]
    try:
        proc = subprocess.run(["git", "-C", str(_ROOT), "diff", "--quiet", commit, "--", *paths],
                              capture_output=True, timeout=30)  # fmt: skip
        untracked = subprocess.run(
            ["git", "-C", str(_ROOT), "ls-files", "--others", "--exclude-standard", "--",
             "src/attention_atlas"], capture_output=True, text=True, timeout=30,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return False
    return proc.returncode == 0 and untracked.returncode == 0 and not untracked.stdout.strip()
