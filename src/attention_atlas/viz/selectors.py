"""Static selectors over precomputed traces: the book's half of an exploration.

A figure holds the traces of every setting; a plotly slider or dropdown shows one group of
traces at a time. :func:`add_selector` does it for one control with plotly alone (each step an
``update`` of trace visibility and layout). :func:`add_sliders` stacks one slider per control
for several controls; their steps only move (``method="skip"``) and :data:`EXPLORE_JS`, which
:func:`attention_atlas.viz.figure_html` attaches to such a figure, shows the group the sliders
select together. :func:`attention_atlas.viz.explore` builds both from one function.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go

__all__ = ["EXPLORE_JS", "add_selector", "add_sliders"]

#: vertical room (pixels) for each stacked slider of :func:`add_sliders`
SLIDER_ROOM = 80

#: the page script of a several-slider figure: on a slider move, show the group that all
#: sliders select together (row-major over ``layout.meta.atlas_explore.shape``) and its layout
EXPLORE_JS = (
    "function (gd) { var ex = gd.layout.meta.atlas_explore; var grouped = {};"
    " ex.groups.forEach(function (g) { g.forEach(function (i) { grouped[i] = true; }); });"
    " gd.on('plotly_sliderchange', function () { var k = 0;"
    " ex.shape.forEach(function (n, s) { k = k * n + gd.layout.sliders[s].active; });"
    " var vis = gd.data.map(function (t, i) { return !grouped[i] || ex.groups[k].indexOf(i) >= 0; });"
    " window.Plotly.update(gd, {visible: vis}, ex.layouts[k] || {}); }); }"
)


def _visible(n: int, groups: Sequence[Sequence[int]], k: int) -> list[bool]:
    """Trace visibility showing group ``k`` (traces in no group stay visible)."""
    grouped = {i for g in groups for i in g}
    return [(i not in grouped) or (i in groups[k]) for i in range(n)]


def _check_groups(fig: go.Figure, groups: Sequence[Sequence[int]]) -> None:
    n = len(fig.data)
    bad = sorted({i for g in groups for i in g if not 0 <= i < n})
    if bad:
        raise ValueError(f"trace indices {bad} out of range for a figure with {n} traces")


def add_selector(
    fig: go.Figure,
    labels: Sequence[str],
    groups: Sequence[Sequence[int]],
    *,
    kind: str = "slider",
    prefix: str = "",
    active: int = 0,
    titles: Sequence[str] | None = None,
    layouts: Sequence[Mapping[str, Any]] | None = None,
) -> go.Figure:
    """Show one group of traces at a time, chosen by a plotly slider or dropdown.

    A static stand-in for a widget: precompute every setting, add all traces to ``fig``, then
    say which trace indices belong to which label (:func:`explore` does this for you).

    Args:
        labels: one label per group (slider step or dropdown entry).
        groups: trace indices (into ``fig.data``) shown for each label; traces in no group
            stay visible always.
        kind: ``"slider"`` or ``"dropdown"``.
        titles: optional figure title per label.
        layouts: optional layout update per label (plotly ``relayout`` keys, e.g. axis ticks).
    """
    if len(labels) != len(groups):
        raise ValueError(f"{len(labels)} labels for {len(groups)} groups")
    if kind not in ("slider", "dropdown"):
        raise ValueError(f"kind must be 'slider' or 'dropdown', got {kind!r}")
    for extra, what in ((titles, "titles"), (layouts, "layouts")):
        if extra is not None and len(extra) != len(labels):
            raise ValueError(f"{len(extra)} {what} for {len(labels)} labels")
    _check_groups(fig, groups)
    n = len(fig.data)

    def layout(k: int) -> dict[str, Any]:
        lay = dict(layouts[k]) if layouts is not None else {}
        if titles is not None:
            lay["title"] = {"text": titles[k]}
        return lay

    def args(k: int) -> list[dict[str, Any]]:
        return [{"visible": _visible(n, groups, k)}, layout(k)]

    for i, v in enumerate(_visible(n, groups, active)):
        fig.data[i].visible = v
    steps = [
        {"label": str(lab), "method": "update", "args": args(k)} for k, lab in enumerate(labels)
    ]
    if kind == "slider":
        fig.update_layout(
            sliders=[
                {
                    "active": active,
                    "currentvalue": {"prefix": prefix},
                    "steps": steps,
                    "pad": {"t": 40},
                }
            ]
        )
    else:
        fig.update_layout(
            updatemenus=[
                {
                    "active": active,
                    "buttons": steps,
                    "x": 1.0,
                    "xanchor": "right",
                    "y": 1.1,
                    "yanchor": "bottom",
                }
            ]
        )
    fig.update_layout(layout(active))
    return fig


def add_sliders(
    fig: go.Figure,
    sliders: Sequence[tuple[str, Sequence[str], int]],
    groups: Sequence[Sequence[int]],
    *,
    layouts: Sequence[Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """One slider per control, stacked; the sliders together pick one group of traces.

    Args:
        sliders: ``(prefix, step labels, active step)`` per control.
        groups: trace indices per point of the product of the sliders' steps, row-major
            (the last slider varies fastest).
        layouts: optional layout update per point.

    Returns:
        ``{"groups", "layouts", "shape"}`` for ``layout.meta["atlas_explore"]``, which
        :data:`EXPLORE_JS` reads in the page.
    """
    shape = [len(labels) for _, labels, _ in sliders]
    size = 1
    for n in shape:
        size *= n
    if len(groups) != size:
        raise ValueError(f"{len(groups)} groups for {shape} slider steps ({size} points)")
    if layouts is not None and len(layouts) != size:
        raise ValueError(f"{len(layouts)} layouts for {size} points")
    _check_groups(fig, groups)
    flat = 0
    for n, (_, _, active) in zip(shape, sliders):
        flat = flat * n + active
    for i, v in enumerate(_visible(len(fig.data), groups, flat)):
        fig.data[i].visible = v
    menus = [
        {
            "active": active,
            "currentvalue": {"prefix": prefix},
            "steps": [{"label": lab, "method": "skip", "args": [None]} for lab in labels],
            "pad": {"t": 40 + SLIDER_ROOM * k},
        }
        for k, (prefix, labels, active) in enumerate(sliders)
    ]
    room = SLIDER_ROOM * (len(sliders) - 1)
    margin_b = fig.layout.margin.b if fig.layout.margin.b is not None else 50
    height = fig.layout.height or 420
    fig.update_layout(sliders=menus, margin={"b": margin_b + room}, height=height + room)
    if layouts is not None:
        fig.update_layout(dict(layouts[flat]))
    return {
        "groups": [list(g) for g in groups],
        "layouts": [dict(lay) for lay in (layouts or [{}] * size)],
        "shape": shape,
    }
