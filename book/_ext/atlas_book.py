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
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

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


def setup(app: Sphinx) -> dict[str, Any]:
    os.environ[HEADLESS_ENV] = "1"
    app.connect("builder-inited", _check_vendored)
    app.connect("html-page-context", _add_plotly)
    app.connect("html-page-context", _add_live)
    app.connect("html-page-context", _drop_thebe, priority=900)
    app.connect("build-finished", _copy_plotly)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
