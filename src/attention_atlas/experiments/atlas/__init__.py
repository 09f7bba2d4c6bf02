"""Your own attention through the whole atlas: ``python -m attention_atlas atlas report SPEC``.

The parts import only downward: :mod:`.variant` (find, import and register the variant),
:mod:`.contract` (the checks every attention must pass), :mod:`.probes` (score rank against
length, rank collapse in depth, cost against SDPA), :mod:`.run` (the report's grid of cells for
the sweep runner, chapter 9's trained cells among them), :mod:`.summary` (what the report says,
and chapter 9's per-arm summary), :mod:`.report` (a report in the making, section by section).
The notebook ``notebooks/report/atlas_report.py`` is the report's page;
:mod:`attention_atlas.notebooks.report` executes and renders it.
"""

from .report import SECTIONS, Report
from .run import CONTROL, NAME, PRESETS, chapter_grid, check_cell, run_cell
from .summary import recall_summary, recall_text, report_summary, verdict_table, verdicts
from .variant import Variant, VariantError, canonical_spec, load_variant

__all__ = [
    "CONTROL",
    "NAME",
    "PRESETS",
    "SECTIONS",
    "Report",
    "Variant",
    "VariantError",
    "canonical_spec",
    "chapter_grid",
    "check_cell",
    "load_variant",
    "recall_summary",
    "recall_text",
    "report_summary",
    "run_cell",
    "verdict_table",
    "verdicts",
]
