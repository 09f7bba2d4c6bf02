"""How a figure reaches the reader: plotly's ``atlas`` template and renderer, :func:`show`,
:func:`figure_html` (the static book's HTML), :func:`is_interactive` (a live kernel, or a headless
run), :func:`markdown`. Importing this module makes :class:`AtlasRenderer` plotly's default
renderer (re-exported by :mod:`attention_atlas.viz`)."""

from __future__ import annotations

import json
import os
import sys
import uuid
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio
from plotly.io._base_renderers import MimetypeRenderer

from .plots import COLORS, DEFAULT_HEIGHT
from .selectors import EXPLORE_JS

__all__ = [
    "DEFAULT_HEIGHT",
    "HEADLESS_ENV",
    "PLOTLY_CONFIG",
    "AtlasRenderer",
    "figure_html",
    "is_interactive",
    "markdown",
    "show",
]

HEADLESS_ENV = "ATTENTION_ATLAS_HEADLESS"  # same name as attention_atlas.notebooks.HEADLESS_ENV


#: plotly.js config for every figure: no logo link, resize with the page
PLOTLY_CONFIG: dict[str, Any] = {"displaylogo": False, "responsive": True}

pio.templates["atlas"] = go.layout.Template(
    layout=go.Layout(
        font={"family": "system-ui, -apple-system, Segoe UI, Helvetica, Arial, sans-serif"},
        colorway=COLORS,
        margin={"l": 60, "r": 20, "t": 50, "b": 50},
        hovermode="closest",
        legend={"bgcolor": "rgba(255,255,255,0.6)"},
        coloraxis={"colorscale": "Viridis"},
    ),
    data={"heatmap": [go.Heatmap(colorscale="Viridis")]},
)
pio.templates.default = "plotly_white+atlas"


def is_interactive() -> bool:
    """True only in a live IPython kernel with a frontend (JupyterLab, Notebook, VS Code).

    False in plain Python, in a terminal IPython, and in every headless execution (the runner,
    ``make book`` and the tests set ``ATTENTION_ATLAS_HEADLESS=1``).
    """
    if os.environ.get(HEADLESS_ENV, "").strip() not in ("", "0"):
        return False
    if "ipykernel" not in sys.modules:
        return False
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def _fig_dict(fig: Any) -> dict[str, Any]:
    """A JSON-compatible ``{"data", "layout"}`` dict of a figure (or figure dict)."""
    return json.loads(pio.to_json(fig, validate=False, remove_uids=False))


def figure_html(fig: Any, *, div_id: str | None = None) -> str:
    """HTML for the static book: a ``<div>`` plus a script that calls ``Plotly.newPlot`` on the
    page's global ``Plotly`` (loaded by the page; drawn on ``load`` if it is not there yet).

    The figure of an exploration (:func:`explore`) gets the class ``atlas-explore-static``; one
    with several sliders also gets :data:`EXPLORE_JS`, which shows the grid point they select."""
    d = _fig_dict(fig)
    div_id = div_id or f"atlas-{uuid.uuid4().hex[:12]}"
    height = d.get("layout", {}).get("height") or DEFAULT_HEIGHT
    payload = json.dumps(
        {"data": d.get("data", []), "layout": d.get("layout", {}), "config": PLOTLY_CONFIG}
    ).replace("</", "<\\/")
    meta = d.get("layout", {}).get("meta")
    ex = meta.get("atlas_explore") if isinstance(meta, dict) else None
    classes = "plotly-graph-div atlas-figure"
    then = ""
    if isinstance(ex, dict):
        classes += " atlas-explore-static" + (" atlas-main" if ex.get("main") else "")
        if ex.get("groups"):
            then = f".then({EXPLORE_JS})"
    return (
        f'<div id="{div_id}" class="{classes}" '
        f'style="height:{int(height)}px; width:100%;"></div>\n'
        '<script type="text/javascript">\n'
        "(function () {\n"
        f"  var fig = {payload};\n"
        f'  var draw = function () {{ window.Plotly.newPlot("{div_id}", fig.data, fig.layout, '
        f"fig.config){then}; }};\n"
        "  if (window.Plotly) { draw(); } else { window.addEventListener('load', draw); }\n"
        "})();\n"
        "</script>"
    )


class AtlasRenderer(MimetypeRenderer):
    """Plotly renderer: plotly mimetype (live kernels) + static HTML (the book)."""

    def to_mimebundle(self, fig_dict: Any) -> dict[str, Any]:
        bundle: dict[str, Any] = {"text/html": figure_html(fig_dict)}
        if is_interactive():
            d = _fig_dict(fig_dict)
            d["config"] = PLOTLY_CONFIG
            bundle["application/vnd.plotly.v1+json"] = d
        return bundle


pio.renderers["atlas"] = AtlasRenderer()
pio.renderers.default = "atlas"


def show(fig: go.Figure) -> None:
    """Display a figure in a notebook (live in JupyterLab, static in the book).

    Outside IPython (a script) it does nothing but return, so chapters' code also runs as a
    plain Python file.
    """
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:  # pragma: no cover - IPython ships with the book requirements
        return
    if get_ipython() is None:
        return
    bundle = AtlasRenderer().to_mimebundle(fig.to_dict())
    bundle["text/plain"] = f"<Figure: {fig.layout.title.text or 'untitled'}>"
    display(bundle, raw=True)


def markdown(text: str) -> None:
    """Display Markdown (MyST in the book: ``$math$`` and ``{cite}`` work); use f-strings so
    numbers in prose come from the run."""
    from IPython.display import Markdown, display

    display(Markdown(text))
