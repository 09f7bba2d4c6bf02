"""Plotly helpers shared by the chapters: one look, and figures that render everywhere.

``show(fig)`` (and plain ``fig.show()`` or a figure as the last expression of a cell, since
importing this module makes :class:`AtlasRenderer` plotly's default renderer) emits one output
bundle with

* ``application/vnd.plotly.v1+json`` in a live kernel, drawn by JupyterLab's plotly extension
  (offline, interactive), and
* ``text/html``: a ``<div>`` and a small script calling ``Plotly.newPlot`` on the global
  ``Plotly``, which the static book loads from its own ``_static/vendor/plotly.min.js`` (no CDN;
  the book's Sphinx extension adds that script to every page that holds a figure).

Headless executions (papermill through :mod:`attention_atlas.notebooks`, ``make book``, the
tests) set ``ATTENTION_ATLAS_HEADLESS=1``; :func:`is_interactive` is then False and chapters
show static figures (plotly sliders or dropdowns over precomputed sweeps) instead of ipywidgets.

Explorations (:mod:`attention_atlas.explore`, re-exported here): :func:`explore` shows one
function of named controls (:func:`slider`, :func:`dropdown`, :func:`text`) as live ipywidgets
in JupyterLab and as a plotly slider or dropdown over a precomputed grid in the book;
:func:`add_selector` is its static half (a selector over groups of traces).

Other helpers: :func:`heatmap`, :func:`heatmap_grid`, :func:`line_band` (mean and 95 % interval over seeds, from
:func:`attention_atlas.stats.interval`), :func:`loglog` and :func:`loglog_slope`, :func:`markdown` (prose with numbers from the run).
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio
from plotly.io._base_renderers import MimetypeRenderer
from plotly.subplots import make_subplots

from .explore import Control, Exploration, dropdown, explore, slider, text
from .plots import COLORS, _np, line_band, lines, loglog, loglog_slope, mean_interval
from .selectors import EXPLORE_JS, add_selector

__all__ = [
    "COLORS",
    "PLOTLY_CONFIG",
    "AtlasRenderer",
    "Control",
    "Exploration",
    "add_selector",
    "dropdown",
    "explore",
    "figure_html",
    "heatmap",
    "heatmap_grid",
    "is_interactive",
    "line_band",
    "lines",
    "loglog",
    "loglog_slope",
    "markdown",
    "mean_interval",
    "show",
    "slider",
    "text",
]

HEADLESS_ENV = "ATTENTION_ATLAS_HEADLESS"  # same name as attention_atlas.notebooks.HEADLESS_ENV


#: plotly.js config for every figure: no logo link, resize with the page
PLOTLY_CONFIG: dict[str, Any] = {"displaylogo": False, "responsive": True}
DEFAULT_HEIGHT = 420

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


# -- arrays ------------------------------------------------------------------------------------


# -- figures -----------------------------------------------------------------------------------


def heatmap(
    z: Any,
    *,
    x: Sequence[Any] | None = None,
    y: Sequence[Any] | None = None,
    title: str | None = None,
    colorscale: str = "Viridis",
    zmin: float | None = None,
    zmax: float | None = None,
    colorbar_title: str | None = None,
    xlabel: str = "key j",
    ylabel: str = "query i",
    height: int | None = None,
) -> go.Figure:
    """A matrix ``z (n, m)`` as a heatmap, row 0 at the top (as a matrix is written)."""
    zz = _np(z)
    if zz.ndim != 2:
        raise ValueError(f"heatmap expects a 2-D matrix, got shape {zz.shape}")
    fig = go.Figure(
        go.Heatmap(
            z=zz,
            x=list(x) if x is not None else None,
            y=list(y) if y is not None else None,
            colorscale=colorscale,
            zmin=zmin,
            zmax=zmax,
            colorbar={"title": {"text": colorbar_title}} if colorbar_title else None,
        )
    )
    fig.update_yaxes(autorange="reversed", title=ylabel)
    fig.update_xaxes(title=xlabel)
    fig.update_layout(title=title, height=height or DEFAULT_HEIGHT)
    return fig


def heatmap_grid(
    mats: Mapping[str, Any],
    *,
    cols: int | None = None,
    title: str | None = None,
    colorscale: str = "Viridis",
    shared_scale: bool = True,
    x: Sequence[Any] | None = None,
    y: Sequence[Any] | None = None,
    height: int | None = None,
) -> go.Figure:
    """Several matrices side by side (one subplot each, titled by the mapping's keys).

    With ``shared_scale`` every panel uses the min/max over all of them and one colour bar.
    """
    names = list(mats)
    arrays = [_np(mats[n]) for n in names]
    cols = cols or min(len(names), 4)
    rows = -(-len(names) // cols)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=names, horizontal_spacing=0.06)
    lo = min(float(a.min()) for a in arrays) if shared_scale else None
    hi = max(float(a.max()) for a in arrays) if shared_scale else None
    for i, a in enumerate(arrays):
        fig.add_trace(
            go.Heatmap(
                z=a,
                x=list(x) if x is not None else None,
                y=list(y) if y is not None else None,
                colorscale=colorscale,
                zmin=lo,
                zmax=hi,
                showscale=(i == 0) or not shared_scale,
            ),
            row=i // cols + 1,
            col=i % cols + 1,
        )
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(title=title, height=height or max(DEFAULT_HEIGHT, 300 * rows))
    return fig
