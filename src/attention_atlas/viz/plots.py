"""Curves with intervals, plain curves and log-log costs: the plots every chapter draws (re-exported
by :mod:`attention_atlas.viz`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from attention_atlas.stats import interval

__all__ = [
    "COLORS",
    "as_numpy",
    "heatmap",
    "heatmap_grid",
    "line_band",
    "lines",
    "loglog",
    "loglog_slope",
    "mean_interval",
]

#: default figure height in pixels
DEFAULT_HEIGHT = 420

#: Okabe-Ito palette (distinguishable with the common colour-vision deficiencies), the book's
#: colorway (:data:`attention_atlas.viz.COLORS`)
COLORS = [
    "#0072B2",
    "#E69F00",
    "#009E73",
    "#D55E00",
    "#CC79A7",
    "#56B4E9",
    "#F0E442",
    "#000000",
]


def as_numpy(a: Any) -> np.ndarray:
    """A numpy array from a tensor (any device), array or nested list."""
    if hasattr(a, "detach"):
        a = a.detach().cpu().numpy()
    return np.asarray(a)


def line_band(
    x: Any,
    series: Mapping[str, Any] | Any,
    *,
    fig: go.Figure | None = None,
    level: float = 0.95,
    title: str | None = None,
    xlabel: str | None = None,
    ylabel: str | None = None,
    log_x: bool = False,
    log_y: bool = False,
) -> go.Figure:
    """Mean over seeds as a line with its ``level`` interval as a shaded band.

    Args:
        x: ``(n_x,)``.
        series: ``{name: samples (n_seeds, n_x)}`` or one ``(n_seeds, n_x)`` array.
    """
    xs = as_numpy(x)
    if not isinstance(series, Mapping):
        series = {"": series}
    fig = fig or go.Figure()
    offset = len(fig.data) // 2  # earlier calls on the same figure took the first colours
    for k, (name, samples) in enumerate(series.items()):
        s = as_numpy(samples)
        if s.ndim == 1:
            s = s[None]
        if s.shape[-1] != len(xs):
            raise ValueError(f"series {name!r}: expected (n_seeds, {len(xs)}), got {s.shape}")
        mean, lo, hi = interval(s, axis=0, level=level)
        lo, hi = np.where(np.isnan(lo), mean, lo), np.where(np.isnan(hi), mean, hi)  # one seed
        color = COLORS[(offset + k) % len(COLORS)]
        band_x = np.concatenate([xs, xs[::-1]])
        band_y = np.concatenate([hi, lo[::-1]])
        fig.add_trace(
            go.Scatter(
                x=band_x,
                y=band_y,
                fill="toself",
                fillcolor=_rgba(color, 0.2),
                line={"width": 0},
                hoverinfo="skip",
                showlegend=False,
                legendgroup=name,
                name=f"{name} {int(level * 100)}% interval",
            )
        )
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=mean,
                mode="lines+markers",
                line={"color": color},
                name=f"{name} (n={s.shape[0]})" if name else f"mean (n={s.shape[0]})",
                legendgroup=name,
            )
        )
    fig.update_layout(title=title, xaxis_title=xlabel, yaxis_title=ylabel)
    if log_x:
        fig.update_xaxes(type="log")
    if log_y:
        fig.update_yaxes(type="log")
    return fig


def mean_interval(
    groups: Mapping[str, Any],
    *,
    x: Sequence[Any] | None = None,
    fig: go.Figure | None = None,
    row: int | None = None,
    col: int | None = None,
    name: str | None = None,
    mode: str = "markers",
    level: float = 0.95,
    title: str | None = None,
    xlabel: str | None = None,
    ylabel: str | None = None,
    color: str | None = None,
    showlegend: bool | None = None,
) -> go.Figure:
    """Means over runs with their ``level`` Student-t intervals as error bars, one point (or
    bar, ``mode="bar"``) per group.

    Args:
        groups: ``{label: runs}``, each ``runs`` a 1-D array (one value per seed); the
            interval is :func:`attention_atlas.stats.interval` (none drawn for one run).
        x: x positions (default: the labels, a categorical axis).
        fig, row, col: add to this figure (and subplot) instead of a new one.
        name: legend name of the trace (no legend entry when None).
        mode: ``"markers"``, ``"lines+markers"`` or ``"bar"``.
        color: of the markers, bars and line; showlegend: default ``name is not None``.
    """
    labels = list(groups)
    means, errs = [], []
    for label in labels:
        runs = as_numpy(groups[label]).astype(float).ravel()
        m, _, hi = interval(runs, 0, level)
        means.append(float(m))
        errs.append(0.0 if np.isnan(hi) else float(hi - m))
    xs = list(x) if x is not None else labels
    if len(xs) != len(labels):
        raise ValueError(f"x has {len(xs)} positions for {len(labels)} groups")
    err = {"type": "data", "array": errs, "visible": True}
    style = {"color": color} if color else {}
    trace: go.Bar | go.Scatter
    if mode == "bar":
        trace = go.Bar(x=xs, y=means, error_y=err, name=name, marker=style)
    else:
        trace = go.Scatter(
            x=xs, y=means, error_y=err, mode=mode, name=name, marker=style, line=style
        )
    trace.showlegend = (name is not None) if showlegend is None else showlegend
    fig = fig or go.Figure()
    if row is not None and col is not None:
        fig.add_trace(trace, row=row, col=col)
    else:
        fig.add_trace(trace)
    if title is not None:
        fig.update_layout(title=title)
    if xlabel is not None or ylabel is not None:
        kw = {"row": row, "col": col} if row is not None and col is not None else {}
        if xlabel is not None:
            fig.update_xaxes(title=xlabel, **kw)
        if ylabel is not None:
            fig.update_yaxes(title=ylabel, **kw)
    return fig


def _rgba(hex_color: str, alpha: float) -> str:
    h = hex_color.lstrip("#")
    r, g, b = (int(h[i : i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha})"


def _series_xy(x: Any, series: Mapping[str, Any]) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """``[(name, x, y)]`` from a shared ``x`` and ``{name: y}``, or ``x=None`` and
    ``{name: (x, y)}``; shapes checked."""
    out = []
    for name, ys in series.items():
        if x is None:
            if not (isinstance(ys, tuple | list) and len(ys) == 2):
                raise ValueError(
                    f"series {name!r}: without a shared x, give (x, y), got {type(ys)}"
                )
            xs, yy = as_numpy(ys[0]).astype(float), as_numpy(ys[1]).astype(float)
        else:
            xs, yy = as_numpy(x).astype(float), as_numpy(ys).astype(float)
        if xs.shape != yy.shape or xs.ndim != 1:
            raise ValueError(
                f"series {name!r}: x and y must be 1-D of one length, got {xs.shape}, {yy.shape}"
            )
        out.append((str(name), xs, yy))
    return out


def lines(
    series: Mapping[str, Any],
    *,
    x: Any = None,
    mode: str = "lines+markers",
    log_x: bool = False,
    log_y: bool = False,
    title: str | None = None,
    xlabel: str | None = None,
    ylabel: str | None = None,
    fig: go.Figure | None = None,
    row: int | None = None,
    col: int | None = None,
) -> go.Figure:
    """Plain curves, one per series: ``{name: y}`` against a shared ``x``, or ``{name: (x, y)}``
    with ``x=None`` (each curve its own x). Optionally into a subplot ``(row, col)`` of ``fig``."""
    fig = fig or go.Figure()
    kw = {"row": row, "col": col} if row is not None and col is not None else {}
    for name, xs, yy in _series_xy(x, series):
        fig.add_trace(go.Scatter(x=xs, y=yy, mode=mode, name=name), **kw)
    fig.update_xaxes(title=xlabel, type="log" if log_x else None, **kw)
    fig.update_yaxes(title=ylabel, type="log" if log_y else None, **kw)
    if title is not None:
        fig.update_layout(title=title)
    return fig


def loglog_slope(x: Any, y: Any) -> float:
    """Least-squares slope of ``log y`` against ``log x`` (the exponent of a power law), over
    the points where both are finite and positive."""
    xa, ya = as_numpy(x).astype(float), as_numpy(y).astype(float)
    if xa.shape != ya.shape:
        raise ValueError(f"need x and y of the same shape, got {xa.shape}, {ya.shape}")
    ok = np.isfinite(xa) & np.isfinite(ya) & (xa > 0) & (ya > 0)
    lx, ly = np.log(xa[ok]), np.log(ya[ok])
    if lx.size < 2:
        raise ValueError(
            f"need x and y of the same shape with >= 2 points, got {lx.shape}, {ly.shape}"
        )
    return float(np.polyfit(lx, ly, 1)[0])


def loglog(
    x: Any,
    series: Mapping[str, Any],
    *,
    title: str | None = None,
    xlabel: str | None = None,
    ylabel: str | None = None,
    slopes_in_legend: bool = True,
) -> go.Figure:
    """Curves on log-log axes (for costs against sequence length); the legend gives each
    curve's fitted exponent when ``slopes_in_legend``. ``series`` is ``{name: y}`` against the
    shared ``x``, or ``{name: (x, y)}`` with ``x=None``."""
    fig = go.Figure()
    for name, xs, yy in _series_xy(x, series):
        label = f"{name} (slope {loglog_slope(xs, yy):.2f})" if slopes_in_legend else name
        fig.add_trace(go.Scatter(x=xs, y=yy, mode="lines+markers", name=label))
    fig.update_xaxes(type="log", title=xlabel)
    fig.update_yaxes(type="log", title=ylabel)
    fig.update_layout(title=title)
    return fig


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
    zz = as_numpy(z)
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
    arrays = [as_numpy(mats[n]) for n in names]
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
