"""Sphinx extension for the Attention Atlas book (loaded through ``_config.yml``).

* Marks every execution as headless (``ATTENTION_ATLAS_HEADLESS=1`` in the environment that
  the notebook kernels inherit), so chapters show static figures instead of widgets.
* Serves plotly.js from the book itself: copies ``plotly.min.js`` from the installed ``plotly``
  package into ``_static/vendor/`` and adds it (before require.js) to every page that holds a
  figure drawn by :func:`attention_atlas.viz.show`.
* Drops sphinx-thebe's scripts (its inline config names a CDN and thebe 0.8 from unpkg).
* Adds ``_static/atlas-live.js`` to every chapter page: a "Go live" button that runs the
  page's cells on the local Jupyter server of ``make serve``, with the book's own copy of
  thebe (``vendor/thebe/``, fetched by ``vendor_js.py``).
* Checks that the npm-vendored JavaScript (MathJax, require.js, widget manager) is in
  ``book/_static/vendor/`` before building, with a message saying how to fetch it.
* Adds the ``atlas-bench-records`` directive: a table of the benchmark records stored under
  ``results/bench/`` (one row per record file), generated at build time, so that the measurements
  of each processor live in a generated table rather than in prose (``book/reference/records.md``).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.parsers.rst import Directive, directives
from sphinx.application import Sphinx
from sphinx.errors import ExtensionError

HEADLESS_ENV = "ATTENTION_ATLAS_HEADLESS"
PLOTLY_JS = "vendor/plotly.min.js"
LIVE_JS = "atlas-live.js"
#: pages that get the "Go live" button: the chapters
CHAPTER_PAGES = "notebooks/"
#: required files under book/_static/vendor (kept in step with vendor_js.REQUIRED)
VENDORED = [
    "require.js",
    "html-manager/embed-amd.js",
    "mathjax/tex-mml-chtml.js",
    "thebe/index.js",
    "thebe/thebe.css",
]
#: the repository (book/_ext/ -> book/ -> root; resolved, so a build from a temporary folder whose
#: book/ links here still finds it) and the benchmark records under it
REPO = Path(__file__).resolve().parents[2]
BENCH_RECORDS = REPO / "results" / "bench"


def _plotly_js_source() -> Path:
    import plotly

    src = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    if not src.is_file():
        raise ExtensionError(f"atlas_book: plotly.min.js not found in the plotly package ({src})")
    return src


def _check_vendored(app: Sphinx) -> None:
    lacking: list[str] = []
    for static in app.config.html_static_path:
        base = Path(app.confdir) / static / "vendor"
        lacking = [f for f in VENDORED if not (base / f).is_file()]
        if not lacking:
            return
    raise ExtensionError(
        f"atlas_book: vendored JavaScript missing ({', '.join(lacking)}); "
        "run `make vendor` (or `python book/_ext/vendor_js.py`) first"
    )


def _add_plotly(
    app: Sphinx, pagename: str, templatename: str, context: dict[str, Any], doctree: Any
) -> None:
    if "plotly-graph-div" in (context.get("body") or ""):
        app.add_js_file(PLOTLY_JS, priority=300)  # before require.js (500): plotly stays global


def _add_live(
    app: Sphinx, pagename: str, templatename: str, context: dict[str, Any], doctree: Any
) -> None:
    if pagename.startswith(CHAPTER_PAGES):
        app.add_js_file(LIVE_JS, priority=800)


def _drop_thebe(
    app: Sphinx, pagename: str, templatename: str, context: dict[str, Any], doctree: Any
) -> None:
    """Remove sphinx-thebe's scripts (Jupyter Book always loads it; the book has no launch
    buttons). Its inline config names a CDN and is added twice, a console error."""

    def is_thebe(js: Any) -> bool:
        name = str(getattr(js, "filename", "") or "")
        body = str(getattr(js, "attributes", {}).get("body", ""))
        return "thebe" in name or "THEBE_JS_URL" in body

    if "script_files" in context:
        context["script_files"] = [js for js in context["script_files"] if not is_thebe(js)]


def _copy_plotly(app: Sphinx, exception: Exception | None) -> None:
    if exception is None and app.builder.format == "html":
        dest = Path(app.outdir) / "_static" / PLOTLY_JS
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_plotly_js_source(), dest)


# -- the benchmark records' table ---------------------------------------------------------------

Cell = str | nodes.Node


def _paragraph(cell: Cell) -> nodes.Node:
    return cell if isinstance(cell, nodes.Node) else nodes.paragraph(text=cell)


def _lines(lines: Sequence[str]) -> nodes.Node:
    """Several short lines in one table cell."""
    block = nodes.line_block()
    block += [nodes.line(text=line) for line in lines] or [nodes.line(text="-")]
    return block


def _row(cells: Sequence[Cell]) -> nodes.row:
    row = nodes.row()
    for cell in cells:
        entry = nodes.entry()
        entry += _paragraph(cell)
        row += entry
    return row


def _table(header: Sequence[str], rows: Sequence[Sequence[Cell]]) -> nodes.table:
    group = nodes.tgroup(cols=len(header))
    group += [nodes.colspec(colwidth=1) for _ in header]
    group += nodes.thead("", _row(header))
    group += nodes.tbody("", *[_row(r) for r in rows])
    table = nodes.table(classes=["atlas-bench-records"])
    table += group
    return table


def _x(ratio: Any) -> str:
    return f"{ratio:.2f}×" if isinstance(ratio, int | float) else "-"


def _common(record: dict[str, Any], folder: str) -> list[Cell]:
    """Machine folder, record name, processor, commit, date and rounds of one record."""
    prov = record.get("provenance") or {}
    cpu = str(prov.get("cpu") or "-")
    if prov.get("cpu_id"):
        cpu += f" ({prov['cpu_id']})"
    processor = f"{prov['gpu']} (host: {cpu})" if prov.get("gpu") else cpu
    commit = str(prov.get("git_commit") or "-")[:7] + (" (dirty)" if prov.get("git_dirty") else "")
    date = str(prov.get("started") or "-")[:10]
    name = str(record.get("name") or "-")
    return [folder, name, processor, commit, date, str(record.get("reps", "-"))]


def _train_row(record: dict[str, Any], folder: str) -> list[Cell]:
    """Each variant's median training step over the dot-product step (eager, and with the native
    kernels or torch.compile where the record has them), and the dot step itself."""
    results = record.get("results") or {}
    dot = (results.get("dot") or {}).get("step") or {}
    lines = []
    for variant, r in results.items():
        if variant == record.get("baseline", "dot"):
            continue
        text = f"{variant} {_x((r.get('step') or {}).get('ratio_median'))}"
        for other in ("native", "compiled"):
            if isinstance(r.get(other), dict):
                text += f", {other} {_x(r[other].get('ratio_median'))}"
        lines.append(text)
    ms = dot.get("median_s")
    dot_ms = f"{1e3 * ms:.1f} ms" if isinstance(ms, int | float) else "-"
    shape = str(record.get("shape", "-"))
    return [*_common(record, folder), shape, dot_ms, _lines(lines)]


def _kernel_row(record: dict[str, Any], folder: str) -> list[Cell]:
    """Each variant's forward+backward time over the dot product's (SDPA) at the longest length
    that every variant reached, and the lengths measured."""
    results = record.get("results") or {}
    reached = [{int(n) for n in r} for r in results.values() if r]
    common = set.intersection(*reached) if reached else set()
    lengths = sorted(set().union(*reached)) if reached else []
    span = f"{lengths[0]} to {lengths[-1]}" if lengths else "-"
    at = max(common) if common else None
    lines = [
        f"{variant} {_x((r.get(str(at)) or {}).get('forward_backward_ratio'))}"
        for variant, r in results.items()
        if variant != "dot" and at is not None
    ]
    rate = record.get("matmul_flops_per_s")
    gflops = f"{rate / 1e9:.0f}" if isinstance(rate, int | float) else "-"
    return [*_common(record, folder), span, gflops, str(at or "-"), _lines(lines)]


COMMON_HEADER = ["machine", "record", "processor", "commit", "date", "rounds"]
KINDS: dict[str, tuple[str, list[str], Callable[[dict[str, Any], str], list[Cell]]]] = {
    "train": (
        "train_step",
        [*COMMON_HEADER, "shape", "dot step (median)", "median step / dot step"],
        _train_row,
    ),
    "kernels": (
        "kernel_scaling",
        [*COMMON_HEADER, "lengths", "matmul GFLOP/s", "at length", "fwd+bwd / dot (SDPA)"],
        _kernel_row,
    ),
}


def _record_order(path: Path) -> tuple[str, int, str]:
    """cpu/ before cuda/, the reference machine's records before other machines' folders."""
    rel = path.relative_to(BENCH_RECORDS)
    return rel.parts[0], len(rel.parts), rel.as_posix()


class BenchRecords(Directive):
    """``{atlas-bench-records}`` with ``:kind: train`` (default) or ``:kind: kernels``: a table
    with one row per record of that kind under ``results/bench/``
    (``<cpu|cuda>[/<machine>]/<name>.json``), read when the book is built (stdlib json and
    docutils only: no torch, no network). Each file read is a dependency of the page."""

    has_content = False
    option_spec = {"kind": lambda arg: directives.choice(arg, tuple(KINDS))}

    def run(self) -> list[nodes.Node]:
        kind, header, make_row = KINDS[self.options.get("kind", "train")]
        env = getattr(self.state.document.settings, "env", None)
        rows = []
        for path in sorted(BENCH_RECORDS.rglob("*.json"), key=_record_order):
            try:
                record = json.loads(path.read_text())
            except (OSError, ValueError) as e:
                raise self.error(f"atlas-bench-records: cannot read {path}: {e}") from e
            if not isinstance(record, dict) or record.get("kind") != kind:
                continue
            if env is not None:
                env.note_dependency(str(path))
            rows.append(make_row(record, path.parent.relative_to(BENCH_RECORDS).as_posix()))
        if not rows:
            return [nodes.paragraph(text=f"No {kind} record is stored under results/bench/ yet.")]
        return [_table(header, rows)]


def setup(app: Sphinx) -> dict[str, Any]:
    os.environ[HEADLESS_ENV] = "1"
    app.add_directive("atlas-bench-records", BenchRecords)
    app.connect("builder-inited", _check_vendored)
    app.connect("html-page-context", _add_plotly)
    app.connect("html-page-context", _add_live)
    app.connect("html-page-context", _drop_thebe, priority=900)
    app.connect("build-finished", _copy_plotly)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
