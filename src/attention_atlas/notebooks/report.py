"""Building a variant's report: the template notebook ``notebooks/report/atlas_report.py``
executed headlessly by papermill with the variant as its parameter, rendered as a standalone
HTML page that works offline (its scripts and styles copied beside it: plotly.js from the
installed ``plotly``, as the book serves it, and the book's stylesheet), and its JSON summary.

``<out>/`` holds ``cells/`` (the sweep runner's cells: a second build reuses them),
``atlas_report.ipynb`` (the executed notebook), ``index.html`` with ``_static/``, and
``summary.json``.
"""

from __future__ import annotations

import base64
import html
import json
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .chapters import notebooks_dir, repo_root
from .runner import ChapterFailed, run_chapter

__all__ = ["REPORT_TEMPLATE", "ReportBuild", "build_report", "render_html", "template_path"]

#: the report's notebook, relative to ``notebooks/``
REPORT_TEMPLATE = "report/atlas_report.py"

#: code cells whose source is not shown on the page (the JupyterLab smoke switch)
_HIDDEN_TAGS = ("smoke",)


def template_path() -> Path:
    """The report template ``notebooks/report/atlas_report.py`` of this checkout."""
    path = notebooks_dir() / REPORT_TEMPLATE
    if not path.is_file():
        raise FileNotFoundError(f"the report template is missing: expected {path}")
    return path


@dataclass
class ReportBuild:
    """What :func:`build_report` made: the folder, the page, the summary (None when the
    notebook stopped before writing it), the seconds it took and the notebook's failure."""

    out_dir: Path
    html: Path
    summary: dict[str, Any] | None
    seconds: float
    error: str | None = None

    @property
    def ok(self) -> bool:
        """No check failed, every section was built, the notebook ran to its end."""
        return self.error is None and bool(self.summary and self.summary.get("ok"))


def build_report(
    spec: str,
    *,
    out_dir: str | Path,
    preset: str = "book",
    options: Mapping[str, Any] | None = None,
    params: Mapping[str, Any] | None = None,
    seeds: Sequence[int] = (0, 1, 2),
    timeout: float | None = None,
) -> ReportBuild:
    """Execute the report template for the variant ``spec`` into ``out_dir`` and render it.

    The arguments are the template's parameters (see :class:`attention_atlas.experiments.atlas.Report`);
    check them first (the ``atlas report`` command does). A cell that raises outside the
    report's sections (which catch the variant's failures) stops the notebook: the page is still
    rendered from what ran, and :attr:`ReportBuild.error` says where it stopped.
    """
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    summary_path = out / "summary.json"
    summary_path.unlink(missing_ok=True)
    overrides = {"variant": spec, "preset": preset, "options": dict(options or {}),
                 "params": dict(params or {}), "seeds": [int(s) for s in seeds],
                 "cells_dir": str(out / "cells"), "summary_path": str(summary_path)}  # fmt: skip
    t0 = time.perf_counter()
    error = None
    try:
        result = run_chapter(template_path(), out_dir=out, overrides=overrides, timeout=timeout)
        executed = result.output
    except ChapterFailed as e:
        error = str(e).splitlines()[0]
        executed = out / f"{Path(REPORT_TEMPLATE).stem}.ipynb"
    page = out / "index.html"
    if executed.is_file():
        import nbformat

        render_html(nbformat.read(executed, as_version=4), page, title=f"Atlas report: {spec}")
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else None
    return ReportBuild(out, page, summary, time.perf_counter() - t0, error)


# -- the page ----------------------------------------------------------------------------------


def _markdown(text: str) -> str:
    from markdown_it import MarkdownIt

    return str(MarkdownIt("commonmark", {"html": True}).enable("table").render(text))


def _text(value: Any) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


def _output_html(output: Mapping[str, Any]) -> str:
    kind = output.get("output_type")
    if kind == "stream":
        return f'<pre class="atlas-stream">{html.escape(_text(output.get("text", "")))}</pre>'
    if kind == "error":
        tb = "\n".join(output.get("traceback", []))
        import re

        tb = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", tb)
        return f'<pre class="atlas-error">{html.escape(tb)}</pre>'
    data = output.get("data", {})
    if "text/html" in data:
        return f'<div class="atlas-output">{_text(data["text/html"])}</div>'
    if "text/markdown" in data:
        return f'<div class="atlas-output atlas-markdown">{_markdown(_text(data["text/markdown"]))}</div>'
    if "image/png" in data:
        png = _text(data["image/png"]).replace("\n", "")
        base64.b64decode(png, validate=True)  # a damaged image fails here, not in the browser
        return f'<img class="atlas-output" alt="figure" src="data:image/png;base64,{png}">'
    if "text/plain" in data:
        return f'<pre class="atlas-output">{html.escape(_text(data["text/plain"]))}</pre>'
    return ""


_STYLE = """
body { font-family: system-ui, -apple-system, Segoe UI, Helvetica, Arial, sans-serif;
  max-width: 72rem; margin: 2rem auto; padding: 0 1.5rem; line-height: 1.5; color: #222; }
pre { background: #f6f8fa; padding: 0.6rem; overflow-x: auto; font-size: 0.85rem; }
pre.atlas-error { background: #fdecea; }
details.atlas-code summary { cursor: pointer; color: #666; font-size: 0.85rem; }
table { border-collapse: collapse; font-size: 0.85rem; margin: 0.5rem 0; }
th, td { border: 1px solid #ddd; padding: 0.25rem 0.5rem; text-align: left; vertical-align: top; }
.atlas-output { overflow-x: auto; margin: 0.4rem 0 1rem 0; }
"""


def render_html(nb: Any, path: str | Path, *, title: str) -> Path:
    """Write the executed notebook ``nb`` as one HTML page at ``path``, its scripts and styles
    in ``_static/`` beside it (nothing is fetched from another host): Markdown cells rendered,
    code cells folded under their outputs, plotly figures drawn by the page's own plotly.js."""
    import plotly

    page = Path(path)
    static = page.parent / "_static"
    static.mkdir(parents=True, exist_ok=True)
    plotly_js = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    if not plotly_js.is_file():
        raise FileNotFoundError(f"plotly.min.js not found in the plotly package ({plotly_js})")
    shutil.copyfile(plotly_js, static / "plotly.min.js")
    css = repo_root() / "book" / "_static" / "atlas.css"
    if css.is_file():
        shutil.copyfile(css, static / "atlas.css")
    body: list[str] = []
    for cell in nb.cells:
        tags = cell.get("metadata", {}).get("tags") or []
        if cell.cell_type == "markdown":
            body.append(f'<section class="atlas-markdown">{_markdown(cell.source)}</section>')
            continue
        if cell.cell_type != "code":
            continue
        if cell.source.strip() and not any(t in tags for t in _HIDDEN_TAGS):
            label = (
                "parameters" if "injected-parameters" in tags or "parameters" in tags else "code"
            )
            body.append(f'<details class="atlas-code"><summary>{label}</summary>'
                        f"<pre>{html.escape(cell.source)}</pre></details>")  # fmt: skip
        body += [_output_html(o) for o in cell.get("outputs", [])]
    text = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">\n'
        f"<title>{html.escape(title)}</title>\n"
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        '<link rel="icon" href="data:,">\n'
        '<link rel="stylesheet" href="_static/atlas.css">\n'
        f"<style>{_STYLE}</style>\n"
        '<script src="_static/plotly.min.js"></script>\n'
        "</head><body>\n" + "\n".join(b for b in body if b) + "\n</body></html>\n"
    )
    from attention_atlas.atomic import atomic_write_text

    atomic_write_text(text, page)
    return page
