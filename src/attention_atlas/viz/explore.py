"""Explorations: one function, shown as live ipywidgets in JupyterLab and as a plotly slider or
dropdown over a precomputed grid in the static book, so the two cannot disagree.

A chapter writes the figure once, as a function of the controls' values, and names the
controls::

    def attention_map(temperature, sequence):            # values -> go.Figure (or traces)
        A = dot_weights(sequence, temperature)          # recomputed by the library
        return viz.heatmap(A, title=f"T = {temperature:g}")

    viz.explore(
        attention_map,
        {"temperature": viz.slider(temperatures, live_range=(0.03, 30), log=True),
         "sequence": viz.text(text)},
        main=True,
    )

* In a live kernel (:func:`attention_atlas.viz.is_interactive`) each control becomes an
  ipywidget; moving it calls the function again and replaces the figure.
* Everywhere else (papermill, ``make book``, the tests) the function is called once per point
  of the product of the controls' ``grid`` values; the traces of every point go into one
  figure and a plotly slider (or dropdown) per control shows one point at a time. A control
  with a single grid value (a free-text sequence, say) stays at that value in the book.

Findable in a browser: the live widget is a box with the CSS class ``atlas-explore``, each
control has ``atlas-control`` and ``atlas-control-<name>``, the figure area ``atlas-output``;
the chapter's main exploration (``main=True``) marks its first control ``atlas-main-control``.
The static figure's ``<div>`` has the class ``atlas-explore-static`` (and ``atlas-main`` when
main). Errors raised by the function while a widget moves are shown in the figure area.
"""

from __future__ import annotations

import itertools
import json
import math
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio
from plotly.basedatatypes import BaseTraceType

from .selectors import add_selector, add_sliders

__all__ = [
    "Control",
    "Exploration",
    "dropdown",
    "explore",
    "slider",
    "text",
]

KINDS = ("slider", "dropdown", "text")
#: layout keys never copied between grid points (the selector's own and plotly's defaults)
_LAYOUT_SKIP = {"template", "sliders", "updatemenus", "meta"}


# -- controls ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Control:
    """One control of an exploration.

    Attributes:
        grid: the values the static book precomputes (one slider step or menu entry each); a
            live widget without ``live_range`` offers exactly these.
        value: the value shown first, live and static; one of ``grid``.
        kind: ``"slider"``, ``"dropdown"`` or ``"text"``.
        label: words before the control (default: its name).
        labels: how each grid value is written (default ``f"{v:g}"`` for floats, ``str``).
        live_range: ``(low, high)``: the live widget is a continuous slider over this range
            (ints: an integer slider) instead of the grid's steps.
        step: the live slider's step (in ``log10`` units when ``log``); default 1/100 of the range.
        log: a logarithmic live slider.
    """

    grid: tuple[Any, ...]
    value: Any
    kind: str = "slider"
    label: str | None = None
    labels: tuple[str, ...] | None = None
    live_range: tuple[float, float] | None = None
    step: float | None = None
    log: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if not self.grid:
            raise ValueError("a control needs at least one grid value, got an empty grid")
        if self.value not in self.grid:
            raise ValueError(f"value {self.value!r} is not in the grid {list(self.grid)}")
        if self.labels is not None and len(self.labels) != len(self.grid):
            raise ValueError(f"{len(self.labels)} labels for {len(self.grid)} grid values")
        if self.live_range is not None:
            lo, hi = self.live_range
            if not lo < hi or (self.log and lo <= 0):
                raise ValueError(
                    f"live_range must be (low, high) with low < high (and low > 0 when log), "
                    f"got {self.live_range}"
                )

    def labels_all(self) -> list[str]:
        """The text of every grid value."""
        return [self.label_of(i) for i in range(len(self.grid))]

    def label_of(self, index: int) -> str:
        """The text of grid value ``index`` (slider step, menu entry)."""
        if self.labels is not None:
            return self.labels[index]
        v = self.grid[index]
        return f"{v:g}" if isinstance(v, float) else str(v)


def slider(
    grid: Sequence[Any],
    value: Any = None,
    *,
    live_range: tuple[float, float] | None = None,
    step: float | None = None,
    log: bool = False,
    label: str | None = None,
    labels: Sequence[str] | None = None,
) -> Control:
    """A slider over ``grid`` (the static book's steps); ``value`` defaults to the middle one.

    With ``live_range=(low, high)`` the live widget slides continuously over that range (the
    book still shows the grid); ``log=True`` makes it logarithmic."""
    grid = tuple(grid)
    value = grid[len(grid) // 2] if value is None and grid else value
    return Control(
        grid,
        value,
        "slider",
        label,
        tuple(labels) if labels is not None else None,
        live_range,
        step,
        log,
    )


def dropdown(
    options: Sequence[Any] | Mapping[str, Any], value: Any = None, *, label: str | None = None
) -> Control:
    """A menu over ``options`` (a sequence of values, or ``{label: value}``); ``value``
    defaults to the first."""
    if isinstance(options, Mapping):
        labels: tuple[str, ...] | None = tuple(options)
        grid = tuple(options.values())
    else:
        labels, grid = None, tuple(options)
    value = grid[0] if value is None and grid else value
    return Control(grid, value, "dropdown", label, labels)


def text(value: str, grid: Sequence[str] | None = None, *, label: str | None = None) -> Control:
    """A free-text box live; in the book, a menu over ``grid`` (default: ``value`` alone,
    which shows no menu)."""
    g = tuple(grid) if grid is not None else (value,)
    return Control(g if value in g else (value, *g), value, "text", label)


def as_control(spec: Control | Sequence[Any]) -> Control:
    """A :class:`Control`, or a plain list of values taken as ``slider(values)``."""
    if isinstance(spec, Control):
        return spec
    if isinstance(spec, str) or not isinstance(spec, Sequence):
        raise TypeError(
            f"a control is a viz.slider/dropdown/text or a list of values, got {type(spec)}"
        )
    return slider(spec)


# -- the exploration -----------------------------------------------------------------------------


def _as_figure(result: Any) -> go.Figure:
    """The function's result as a figure: a figure as is, one trace or a sequence of traces in
    a new figure."""
    if isinstance(result, go.Figure):
        return result
    if isinstance(result, BaseTraceType):
        return go.Figure(data=[result])
    if isinstance(result, list | tuple) and all(isinstance(t, BaseTraceType) for t in result):
        return go.Figure(data=list(result))
    raise TypeError(
        f"an exploration's function must return a plotly Figure or traces, got {type(result)}"
    )


def _display_data(fig: go.Figure) -> dict[str, Any]:
    """A live figure as a notebook output: plotly mimetype (JupyterLab), HTML, plain text."""
    from .render import PLOTLY_CONFIG, figure_html

    d = json.loads(pio.to_json(fig, validate=False))
    bundle = {
        "application/vnd.plotly.v1+json": {**d, "config": PLOTLY_CONFIG},
        "text/html": figure_html(fig),
        "text/plain": f"<Figure: {fig.layout.title.text or 'untitled'}>",
    }
    return {"output_type": "display_data", "data": bundle, "metadata": {}}


class Exploration:
    """A figure as a function of named controls, live (ipywidgets) or static (plotly selector).

    Attributes:
        compute: ``compute(**values) -> go.Figure`` (or traces).
        controls: ``{name: Control}`` in display order; the first is the main one.
        values: the current value of each control.
        figure: the last figure computed (live: at the current values; static: the figure with
            every grid point and its selector).
        widget: the ipywidgets box when live, else None.
    """

    def __init__(
        self,
        compute: Callable[..., Any],
        controls: Mapping[str, Control | Sequence[Any]],
        *,
        main: bool = False,
        interactive: bool | None = None,
    ) -> None:
        from .render import is_interactive

        if not controls:
            raise ValueError("an exploration needs at least one control")
        self.compute = compute
        self.controls = {name: as_control(c) for name, c in controls.items()}
        self.main = main
        self.values: dict[str, Any] = {n: c.value for n, c in self.controls.items()}
        self.widget: Any = None
        self.figure: go.Figure | None = None
        self._shown = False
        self._syncing = False
        live = is_interactive() if interactive is None else interactive
        if live:
            self._build_widget()
            self.update()
        else:
            self.figure = self.static_figure()

    # -- static ----------------------------------------------------------------------------

    def static_figure(self) -> go.Figure:
        """Every point of the controls' grid in one figure, one selector per control with more
        than one grid value (one slider or dropdown: native plotly; several sliders: combined by
        the page's script, see :func:`attention_atlas.viz.figure_html`)."""
        varying = [n for n, c in self.controls.items() if len(c.grid) > 1]
        ranges = [range(len(self.controls[n].grid)) for n in varying]
        points = list(itertools.product(*ranges))
        start = tuple(self.controls[n].grid.index(self.controls[n].value) for n in varying)
        fig: go.Figure | None = None
        groups: list[list[int]] = []
        layouts: list[dict[str, Any]] = []
        for point in points:
            values = dict(self.values)
            values.update({n: self.controls[n].grid[i] for n, i in zip(varying, point)})
            f = _as_figure(self.compute(**values))
            fig = fig if fig is not None else go.Figure()
            first = len(fig.data)
            fig.add_traces(list(f.data))
            groups.append(list(range(first, len(fig.data))))
            layouts.append(json.loads(pio.to_json(f.layout, validate=False)))  # plain JSON
        assert fig is not None
        active = points.index(start)
        fig.update_layout({k: v for k, v in layouts[active].items() if k != "template"})
        keys = sorted({k for lay in layouts for k in lay} - _LAYOUT_SKIP)
        changing = [k for k in keys if any(lay.get(k) != layouts[0].get(k) for lay in layouts)]
        updates = [{k: lay.get(k) for k in changing} for lay in layouts]
        meta: dict[str, Any] = {"controls": varying, "main": self.main}
        if len(varying) == 1:
            c = self.controls[varying[0]]
            add_selector(
                fig,
                c.labels_all(),
                groups,
                kind="dropdown" if c.kind in ("dropdown", "text") else "slider",
                prefix=f"{c.label or varying[0]} = ",
                active=active,
                layouts=updates,
            )
        elif len(varying) > 1:
            menus = [
                (f"{self.controls[n].label or n} = ", self.controls[n].labels_all(), i)
                for n, i in zip(varying, start)
            ]
            meta.update(add_sliders(fig, menus, groups, layouts=updates))
        fig.update_layout(meta={"atlas_explore": meta})
        return fig

    # -- live ------------------------------------------------------------------------------

    def _build_widget(self) -> None:
        import ipywidgets as widgets

        self._inputs: dict[str, Any] = {}
        for k, (name, c) in enumerate(self.controls.items()):
            w = _widget_for(widgets, name, c)
            w.add_class("atlas-control")
            w.add_class(f"atlas-control-{name}")
            if self.main and k == 0:
                w.add_class("atlas-main-control")
            w.observe(lambda change, name=name: self.update(**{name: change["new"]}), "value")
            self._inputs[name] = w
        self._output = widgets.Output()
        self._output.add_class("atlas-output")
        box = widgets.VBox([widgets.HBox(list(self._inputs.values())), self._output])
        box.add_class("atlas-explore")
        if self.main:
            box.add_class("atlas-main")
        self.widget = box

    def update(self, **values: Any) -> go.Figure | None:
        """Set some controls' values and recompute the figure (live); returns it, or None if
        the function raised (its traceback is shown in place of the figure)."""
        unknown = sorted(set(values) - set(self.values))
        if unknown:
            raise KeyError(f"no control {unknown}; controls: {list(self.values)}")
        self.values.update(values)
        if self._syncing:  # a widget moved by the loop below: computed once, after it
            return self.figure
        if self.widget is not None:  # keep the widgets in step when called from code
            self._syncing = True
            try:
                for name, v in values.items():
                    self._inputs[name].value = v
            finally:
                self._syncing = False
        try:
            fig = _as_figure(self.compute(**self.values))
        except Exception:
            if self.widget is not None:
                self._output.outputs = (
                    {"output_type": "stream", "name": "stderr", "text": traceback.format_exc()},
                )
            return None
        self.figure = fig
        if self.widget is not None:
            self._output.outputs = (_display_data(fig),)
        return fig

    # -- display ---------------------------------------------------------------------------

    def display(self) -> None:
        """Show the exploration (the widget when live, else the static figure); only the
        first call shows it, so :func:`explore` and a cell's last value do not show it twice."""
        from IPython import get_ipython
        from IPython.display import display

        if self._shown or get_ipython() is None:  # shown already, or a plain script
            return
        self._shown = True

        from .render import show

        if self.widget is not None:
            display(self.widget)
        else:
            show(self.figure)

    def _ipython_display_(self) -> None:
        self.display()


def _widget_for(widgets: Any, name: str, c: Control) -> Any:
    """The ipywidget of a control: text box, menu, or slider (continuous or over the grid)."""
    common = {"description": c.label or name, "style": {"description_width": "initial"}}
    if c.kind == "text":
        return widgets.Text(value=c.value, continuous_update=False, **common)
    options = [(c.label_of(i), v) for i, v in enumerate(c.grid)]
    if c.kind == "dropdown":
        return widgets.Dropdown(options=options, value=c.value, **common)
    if c.live_range is None:
        return widgets.SelectionSlider(
            options=options, value=c.value, continuous_update=False, **common
        )
    lo, hi = c.live_range
    if c.log:
        a, b = math.log10(lo), math.log10(hi)
        return widgets.FloatLogSlider(
            value=c.value, base=10, min=a, max=b, step=c.step or (b - a) / 100,
            continuous_update=False, **common,
        )  # fmt: skip
    if all(isinstance(v, int) for v in (*c.grid, lo, hi)):
        return widgets.IntSlider(
            value=c.value, min=int(lo), max=int(hi), step=int(c.step or 1),
            continuous_update=False, **common,
        )  # fmt: skip
    return widgets.FloatSlider(
        value=c.value, min=lo, max=hi, step=c.step or (hi - lo) / 100,
        continuous_update=False, **common,
    )  # fmt: skip


def explore(
    compute: Callable[..., Any],
    controls: Mapping[str, Control | Sequence[Any]],
    *,
    main: bool = False,
    interactive: bool | None = None,
    show: bool = True,
) -> Exploration:
    """Show ``compute(**values)`` with a control per entry of ``controls``: live ipywidgets in
    an interactive kernel, otherwise a plotly slider or dropdown over the controls' grids.

    Args:
        compute: ``compute(**values) -> go.Figure`` (or a trace, or a list of traces); called
            once per change live, once per grid point (product of the grids) for the book.
        controls: ``{name: viz.slider(...) | viz.dropdown(...) | viz.text(...) | [values]}``,
            names as ``compute``'s keyword arguments; the first is the main control.
        main: this is the chapter's main exploration (CSS class ``atlas-main-control`` on its
            first control; the JupyterLab browser test moves it).
        interactive: force live (True) or static (False); default
            :func:`attention_atlas.viz.is_interactive`.
        show: display it now (default); it is displayed once however often it is shown.

    Returns:
        The :class:`Exploration` (``.figure``, ``.values``, ``.update(name=value)``).
    """
    exploration = Exploration(compute, controls, main=main, interactive=interactive)
    if show:
        exploration.display()
    return exploration
