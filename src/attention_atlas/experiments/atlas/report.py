"""A report in the making: the variant, its grid run through the sweep runner, and each section
built or, when the variant breaks it, reported as broken while the others are still built.

The report's notebook (``notebooks/report/atlas_report.py``) is narrative plus calls on one
:class:`Report`::

    report = Report("examples/my_attention.py:MyAttention", preset="book")
    report.run()                       # every cell, resumable in cells_dir
    with report.section("contract"):   # an exception here is shown and recorded, not raised
        ...
    report.write_summary("summary.json")
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from attention_atlas.validate import one_line

from . import summary as S
from .run import CONTROL, NAME, PRESETS
from .variant import load_variant

__all__ = ["SECTIONS", "Report"]

#: the report's sections, in order (each is a key of the JSON summary's ``sections``)
SECTIONS = ("cells", "contract", "expressiveness", "depth", "cost", "recall and language",
            "verdicts")  # fmt: skip


class Report:
    """One variant's report (see the module's docstring).

    Args:
        variant: the spec (registered name, ``module:Class``, ``file.py:Class``).
        preset: ``smoke``, ``book`` or ``long`` (:data:`~.run.PRESETS`).
        options: the variant's constructor options.
        params: report grid parameters over the preset's (``rank_lengths``, ``depth``, ...).
        seeds: the seeds of every cell (at least 3 for the verdicts).
        cells_dir: where the cells are stored (finished ones are reused); None: a new
            temporary folder.
    """

    def __init__(self, variant: str, *, preset: str = "book", options: Mapping[str, Any] | None = None,
                 params: Mapping[str, Any] | None = None, seeds: Sequence[int] = (0, 1, 2),
                 cells_dir: str | Path | None = None) -> None:  # fmt: skip
        if preset not in PRESETS:
            raise ValueError(f"preset: expected one of {', '.join(PRESETS)}, got {preset!r}")
        self.variant = load_variant(variant)
        self.preset = preset
        self.options = dict(options or {})
        self.params = dict(params or {})
        self.seeds = [int(s) for s in seeds]
        self.cells_dir = None if cells_dir in (None, "") else Path(cells_dir)  # type: ignore[arg-type]
        self.grid: Any = None
        self.sections: dict[str, dict[str, Any]] = {}
        self.started = time.perf_counter()

    # -- running -------------------------------------------------------------------------------

    @property
    def grid_params(self) -> dict[str, Any]:
        return {**self.params, "variant": self.variant.spec, "options": self.options}

    def run(self, log: Any = print) -> Any:
        """Every cell of the report's grid (:func:`~.run.chapter_grid`) through the sweep runner
        into :attr:`cells_dir` (the cells stored there already are read, not run)."""
        from attention_atlas.experiments import stored_or_run

        self.grid = stored_or_run(NAME, params=self.grid_params, preset=self.preset,
                                  seeds=self.seeds, stored=None, use_stored=False,
                                  out_dir=self.cells_dir, log=log, progress=False)  # fmt: skip
        return self.grid

    @contextlib.contextmanager
    def section(self, name: str) -> Iterator[dict[str, Any]]:
        """Build one section; an exception inside is shown in one line and recorded in the
        summary (the report goes on). Yields the section's dict of headline numbers."""
        from attention_atlas import viz

        entry: dict[str, Any] = self.sections.setdefault(name, {})
        t0 = time.perf_counter()
        try:
            yield entry
        except Exception as e:  # the variant's failure: reported, the next section still built
            entry["error"] = f"{type(e).__name__}: {one_line(e)}"
            viz.markdown(f"**This section could not be built**: `{entry['error']}`")
        entry["seconds"] = round(time.perf_counter() - t0, 2)

    # -- what the sections read ----------------------------------------------------------------

    def _need_grid(self) -> Any:
        if self.grid is None:
            raise RuntimeError("the report's cells did not run (see the section 'cells')")
        return self.grid

    def contract(self) -> pd.DataFrame:
        """:func:`~.summary.contract_frame` of the report's contract cells."""
        return S.contract_frame(self._need_grid().records)

    def probe(self, kind: str) -> pd.DataFrame:
        """:func:`~.summary.probe_table` of ``kind`` (``rank``, ``depth``, ``cost``); a probe
        whose every row failed raises its first error."""
        t = S.probe_table(self._need_grid().records, kind)
        if not len(t):
            raise RuntimeError(f"no {kind} cell in the grid")
        if "error" in t:
            mine = t[t.variant == self.variant.name]
            errs = mine["error"].dropna().astype(str)
            errs = errs[errs != ""]
            if len(errs) and len(errs) == len(mine):
                raise RuntimeError(
                    f"the {kind} probe of {self.variant.name} failed: {errs.iloc[0]}"
                )
        return t

    def not_run(self) -> str | None:
        """Why the trained cells did not run (a failed contract check), or None."""
        f = self._need_grid().frame
        if "reason" in f:
            reasons = f["reason"].dropna().astype(str)
            reasons = reasons[reasons != ""]
            if len(reasons):
                return str(reasons.iloc[0])
        return None

    def training_errors(self) -> list[str]:
        """One line per trained cell of the variant that failed in training."""
        f = self._need_grid().frame
        if "error" not in f:
            return []
        bad = f[f["config"].str.match(r"^(mqar|ptb|time)/") & f["error"].notna()]
        return [f"{r.config} seed {r.seed}: {r.error}" for r in bad.itertuples()]

    def recall(self) -> dict[str, Any]:
        """:func:`~.summary.recall_summary` of the variant in the report's grid."""
        return S.recall_summary(self._need_grid().frame, self.variant.name, CONTROL)

    def verdicts(self) -> dict[str, Any]:
        """:func:`~.summary.verdicts` of the variant against dot."""
        g = self._need_grid()
        batch = next((int(r["params"]["train"]["batch_size"]) for r in g.records.values()
                      if r.get("params", {}).get("kind") == "mqar"), 0)  # fmt: skip
        return S.verdicts(g.frame, self.variant.name, evidence=g.provenance.text,
                          not_run=self.not_run(), batch=batch)  # fmt: skip

    def beside_zoo(self) -> tuple[pd.DataFrame, str]:
        """The variant's MQAR rows with the stored zoo grid's (``results/zoo/<preset>``), the
        variant first, and a line saying where the zoo's rows come from."""
        from attention_atlas.experiments.zoo.run import PRESETS as ZOO_PRESETS

        mine = S.zoo_frame(self._need_grid().frame)
        zoo_preset = {**PRESETS[self.preset], **self.params}.get("zoo", "book")
        stored = S.stored_zoo(zoo_preset)
        if stored is None or not len(stored.frame):
            return mine, f"no stored zoo grid results/zoo/{zoo_preset}: the report's own dot only"
        zoo = S.zoo_frame(stored.frame)
        same = _same_protocol(mine, zoo)
        if not same:
            return mine, (f"the stored zoo grid results/zoo/{zoo_preset} ran another protocol "
                          f"than this report's ({ZOO_PRESETS.get(zoo_preset)}): not placed beside it")  # fmt: skip
        zoo = zoo[~zoo.variant.isin([self.variant.name, CONTROL])]  # the report ran those
        both = pd.concat([mine, zoo[mine.columns.intersection(zoo.columns)]], ignore_index=True)
        return both, f"the zoo's arms from {stored.provenance.text}"

    def cost_beside_zoo(self, table: pd.DataFrame) -> tuple[pd.DataFrame, str]:
        """The variant's time ratios to SDPA at its longest length (this run's
        :func:`~.probes.cost_table`) beside every zoo kernel's in chapter 8's stored CPU record
        at the stored length nearest to it, and a line naming that record's sizes (a ratio to
        SDPA measured side by side travels between machines better than a time does)."""
        from attention_atlas.experiments.performance.kernels import (
            KERNEL_RECORD,
            kernel_frame,
            kernel_sizes_sentence,
            load_records,
        )

        mine = table[table.variant == self.variant.name]
        if not len(mine):
            raise RuntimeError(f"no cost row of {self.variant.name}")
        longest = int(mine["length"].max())
        record = load_records((KERNEL_RECORD,))[KERNEL_RECORD].get("cpu")
        if record is None:
            return mine, "no stored chapter-8 kernel record (results/bench/cpu): this run only"
        zoo = kernel_frame(record)
        nearest = int(zoo.iloc[(zoo["L"] - longest).abs().argsort()[:1]]["L"].iloc[0])
        zoo = zoo[zoo["L"] == nearest]
        ratio = {p: r for p, r in zip(mine["pass"], mine["ratio to SDPA"], strict=True)}
        rows = [{"variant": f"{self.variant.name} (this run)", "L": longest,
                 "forward / SDPA": ratio.get("forward", ""),
                 "forward+backward / SDPA": ratio.get("forward+backward", "")}]  # fmt: skip
        cols = ["variant", "forward / SDPA", "forward+backward / SDPA"]
        for v, fwd, both in zoo[cols].itertuples(index=False, name=None):
            rows.append({"variant": str(v), "L": nearest, "forward / SDPA": f"{fwd:.2f}",
                         "forward+backward / SDPA": f"{both:.2f}"})  # fmt: skip
        where = (f"chapter 8's stored kernel record ({record.get('device', 'cpu')}): "
                 f"{kernel_sizes_sentence(record)}")  # fmt: skip
        return pd.DataFrame(rows), where

    # -- the summary ---------------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        """The JSON summary (:func:`~.summary.report_summary`)."""
        contract = pd.DataFrame(columns=["check", "passed", "failed at seeds", "detail"])
        recall: dict[str, Any] = {}
        outcomes: dict[str, Any] = {}
        prov = "the cells did not run"
        if self.grid is not None:
            contract = self.contract()
            recall = self.recall()
            outcomes = self.verdicts()
            prov = self.grid.provenance.text
        v = {"name": self.variant.name, "spec": self.variant.spec, "source": self.variant.source,
             "options": self.options, "builtin": self.variant.builtin}  # fmt: skip
        out = S.report_summary(variant=v, preset=self.preset, contract=contract,
                               sections=self.sections, recall=recall, outcomes=outcomes,
                               provenance=prov)  # fmt: skip
        out["seconds"] = round(time.perf_counter() - self.started, 1)
        return out

    def write_summary(self, path: str | Path) -> dict[str, Any]:
        """Write :meth:`summary` to ``path`` (atomically) and return it."""
        from attention_atlas.atomic import atomic_write_text

        s = self.summary()
        atomic_write_text(json.dumps(s, indent=1, sort_keys=False), Path(path))
        return s


def _same_protocol(mine: pd.DataFrame, zoo: pd.DataFrame) -> bool:
    """The report's dot cells and the stored zoo's are the same cells (widths, pairs, steps)."""
    key = ["width", "pairs", "steps"]
    a = mine[mine.variant == CONTROL][key].drop_duplicates()
    b = zoo[zoo.variant == CONTROL][key].drop_duplicates()
    if not len(a) or not len(b):
        return False
    return set(map(tuple, a.to_numpy().tolist())) <= set(map(tuple, b.to_numpy().tolist()))
