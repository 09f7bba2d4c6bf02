"""Explorations: the static figure (one trace set per grid point, one selector step per value)
and the live widget (a moved control recomputes the figure) come from one function and agree."""

from __future__ import annotations

import base64
import json

import numpy as np
import plotly.graph_objects as go
import pytest

from attention_atlas import viz


def power_curve(p: float, scale: float = 1.0) -> go.Figure:
    """y = scale * x^p on a few points, titled by its parameters."""
    x = np.linspace(0.0, 2.0, 5)
    return go.Figure(go.Scatter(x=x, y=scale * x**p), layout={"title": f"p={p:g}, s={scale:g}"})


def ys(trace) -> list[float]:
    return [float(v) for v in trace.y]


def test_static_figure_holds_one_trace_set_per_grid_point_and_one_step_per_value() -> None:
    grid = [0.5, 1.0, 2.0, 3.0]
    ex = viz.explore(power_curve, {"p": viz.slider(grid, value=2.0)}, interactive=False, show=False)
    fig = ex.figure
    assert len(fig.data) == len(grid)
    (s,) = fig.layout.sliders
    assert [step.label for step in s.steps] == ["0.5", "1", "2", "3"] and s.active == 2
    for k, (p, step) in enumerate(zip(grid, s.steps)):
        visible = step.args[0]["visible"]
        assert visible == [i == k for i in range(len(grid))]  # step k shows grid point k only
        assert ys(fig.data[k]) == ys(power_curve(p).data[0])  # ... computed by the function
        assert step.args[1]["title"]["text"] == f"p={p:g}, s=1"
    assert [t.visible for t in fig.data] == [False, False, True, False]
    assert fig.layout.title.text == "p=2, s=1"


def shown_y(ex) -> list[float]:
    """The y values of the first trace of the figure in the live output widget."""
    (out,) = ex._output.outputs
    y = out["data"]["application/vnd.plotly.v1+json"]["data"][0]["y"]
    if isinstance(y, dict):  # plotly 6 sends arrays as {"dtype", "bdata": base64}
        y = np.frombuffer(base64.b64decode(y["bdata"]), dtype=y["dtype"])
    return [float(v) for v in y]


def test_several_controls_give_one_slider_each_over_the_product_of_their_grids() -> None:
    controls = {"p": [1.0, 2.0, 3.0], "scale": viz.slider([1.0, 10.0], value=10.0)}
    ex = viz.explore(power_curve, controls, interactive=False, show=False)
    fig, meta = ex.figure, ex.figure.layout.meta["atlas_explore"]
    assert meta["shape"] == [3, 2] and len(meta["groups"]) == 6 and len(fig.data) == 6
    assert [len(s.steps) for s in fig.layout.sliders] == [3, 2]
    assert [s.active for s in fig.layout.sliders] == [1, 1]
    for k, (p, scale) in enumerate((p, s) for p in (1.0, 2.0, 3.0) for s in (1.0, 10.0)):
        (i,) = meta["groups"][k]  # row-major: the last control varies fastest
        assert ys(fig.data[i]) == ys(power_curve(p, scale).data[0])
        assert meta["layouts"][k]["title"]["text"] == f"p={p:g}, s={scale:g}"
    shown = [i for i, t in enumerate(fig.data) if t.visible]
    assert shown == meta["groups"][3]  # (p=2, scale=10), the controls' values
    assert viz.EXPLORE_JS in viz.figure_html(fig)  # the page combines the sliders


def test_a_control_with_one_grid_value_stays_fixed_and_a_menu_becomes_a_dropdown() -> None:
    def curve(p: float, name: str) -> go.Figure:
        return power_curve(p).update_layout(title=name)

    ex = viz.explore(
        curve,
        {"p": viz.dropdown({"linear": 1.0, "square": 2.0}), "name": viz.text("fixed")},
        interactive=False,
        show=False,
    )
    fig = ex.figure
    assert len(fig.data) == 2 and not fig.layout.sliders
    menu = fig.layout.updatemenus[0]
    assert [b.label for b in menu.buttons] == ["linear", "square"] and menu.active == 0
    assert viz.EXPLORE_JS not in viz.figure_html(fig)
    assert "atlas-explore-static" in viz.figure_html(fig)


def test_moving_the_live_control_recomputes_the_figure_shown_in_the_output() -> None:
    ex = viz.explore(
        power_curve,
        {"p": viz.slider([1.0, 2.0], value=1.0, live_range=(0.1, 4.0)), "scale": [1.0, 5.0, 9.0]},
        interactive=True,  # a fake interactive kernel: the ipywidgets are built
        main=True,
        show=False,
    )
    p_widget = ex.widget.children[0].children[0]
    assert (
        "atlas-main-control" in p_widget._dom_classes and "atlas-explore" in ex.widget._dom_classes
    )
    before = shown_y(ex)
    p_widget.value = 3.0  # off the static grid: the live slider is continuous
    after = shown_y(ex)
    assert after != before
    assert after == pytest.approx(ys(power_curve(3.0, 5.0).data[0]), rel=1e-15)
    assert ex.values == {"p": 3.0, "scale": 5.0} and ex.figure.layout.title.text == "p=3, s=5"


def test_live_and_static_agree_at_every_grid_point() -> None:
    controls = {"p": [0.5, 1.0, 2.0], "scale": [1.0, 3.0]}
    static = viz.explore(power_curve, controls, interactive=False, show=False).figure
    groups = static.layout.meta["atlas_explore"]["groups"]
    live = viz.explore(power_curve, controls, interactive=True, show=False)
    for k, (p, s) in enumerate((p, s) for p in controls["p"] for s in controls["scale"]):
        live.update(p=p, scale=s)
        assert [ys(static.data[i]) for i in groups[k]] == [ys(t) for t in live.figure.data]


def test_an_error_in_the_function_is_shown_in_place_of_the_live_figure() -> None:
    def fragile(p: float) -> go.Figure:
        if p > 1:
            raise ValueError(f"p={p} too large")
        return power_curve(p)

    ex = viz.explore(fragile, {"p": [1.0, 2.0]}, interactive=True, show=False)
    ex.widget.children[0].children[0].value = 2.0
    (out,) = ex._output.outputs
    assert out["name"] == "stderr" and "ValueError: p=2.0 too large" in out["text"]


def test_controls_reject_a_value_off_their_grid_and_bad_ranges() -> None:
    with pytest.raises(ValueError, match=r"value 5 is not in the grid \[1, 2\]"):
        viz.slider([1, 2], value=5)
    with pytest.raises(ValueError, match="low > 0 when log"):
        viz.slider([1.0], live_range=(0.0, 1.0), log=True)
    with pytest.raises(TypeError, match="plotly Figure or traces"):
        viz.explore(lambda p: np.ones(3), {"p": [1]}, interactive=False, show=False)


def test_a_two_slider_figure_is_plain_json_for_the_page() -> None:
    ex = viz.explore(
        power_curve, {"p": [1.0, 2.0], "scale": [1.0, 2.0]}, interactive=False, show=False
    )
    json.dumps(ex.figure.layout.meta["atlas_explore"])  # no numpy left in what the script reads
