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

Explorations (:mod:`attention_atlas.viz.explore`, re-exported here): :func:`explore` shows one
function of named controls (:func:`slider`, :func:`dropdown`, :func:`text`) as live ipywidgets
in JupyterLab and as a plotly slider or dropdown over a precomputed grid in the book;
:func:`add_selector` is its static half (a selector over groups of traces).

Other helpers: :func:`heatmap`, :func:`heatmap_grid`, :func:`line_band` (mean and 95 % interval over seeds, from
:func:`attention_atlas.stats.interval`), :func:`loglog` and :func:`loglog_slope`, :func:`markdown` (prose with numbers from the run).
"""

from __future__ import annotations

from .explore import Control, Exploration, dropdown, explore, slider, text
from .plots import (
    COLORS,
    heatmap,
    heatmap_grid,
    line_band,
    lines,
    loglog,
    loglog_slope,
    mean_interval,
)
from .render import (
    HEADLESS_ENV,
    PLOTLY_CONFIG,
    AtlasRenderer,
    figure_html,
    is_interactive,
    markdown,
    show,
)
from .selectors import EXPLORE_JS, add_selector

__all__ = [
    "COLORS",
    "EXPLORE_JS",
    "HEADLESS_ENV",
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
