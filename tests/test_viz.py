"""The plotly helpers: figures that draw in the static book (global Plotly, no CDN) and in
JupyterLab (plotly mimetype), and the statistics behind the error bands."""

from __future__ import annotations

import json
import re

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
import pytest

from attention_atlas import viz


def test_headless_runs_are_not_interactive(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(viz.HEADLESS_ENV, raising=False)
    assert not viz.is_interactive()  # plain Python: no kernel
    monkeypatch.setenv(viz.HEADLESS_ENV, "1")
    assert not viz.is_interactive()


def test_static_html_draws_with_the_global_plotly_and_loads_nothing() -> None:
    fig = viz.heatmap(np.eye(3), title="</script> in a title")
    html = viz.figure_html(fig, div_id="fig1")
    assert 'id="fig1" class="plotly-graph-div' in html
    assert 'window.Plotly.newPlot("fig1"' in html
    assert "http://" not in html and "https://" not in html and "src=" not in html
    assert html.count("</script>") == 1  # the title's "</script>" is escaped
    payload = re.search(r"var fig = (\{.*\});\n", html)
    assert payload is not None
    data = json.loads(payload.group(1))
    assert data["data"][0]["type"] == "heatmap" and data["config"]["displaylogo"] is False


def test_the_renderer_adds_the_plotly_mimetype_only_when_interactive(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fig = go.Figure(go.Scatter(x=[1, 2], y=[3, 4]))
    monkeypatch.setattr(viz.render, "is_interactive", lambda: False)
    assert set(viz.AtlasRenderer().to_mimebundle(fig.to_dict())) == {"text/html"}
    monkeypatch.setattr(viz.render, "is_interactive", lambda: True)
    bundle = viz.AtlasRenderer().to_mimebundle(fig.to_dict())
    assert bundle["application/vnd.plotly.v1+json"]["data"][0]["y"] == [3, 4]
    assert pio.renderers.default == "atlas"


def test_line_band_with_one_seed_collapses_the_band_onto_the_mean() -> None:
    fig = viz.line_band(np.arange(3), {"a": np.array([[1.0, 2.0, 3.0]])})
    band = np.asarray(fig.data[0].y, dtype=float)
    np.testing.assert_array_equal(band, [1.0, 2.0, 3.0, 3.0, 2.0, 1.0])


def test_loglog_slope_recovers_a_power_law() -> None:
    x = np.array([64, 128, 256, 512, 1024])
    assert viz.loglog_slope(x, 3.0 * x**2.0) == pytest.approx(2.0, abs=1e-12)
    fig = viz.loglog(x, {"quadratic": x**2.0})
    assert "slope 2.00" in fig.data[0].name and fig.layout.xaxis.type == "log"


def test_line_band_draws_a_band_and_a_mean_per_series() -> None:
    x = np.arange(4)
    fig = viz.line_band(x, {"a": np.ones((3, 4)), "b": np.zeros((3, 4))})
    assert len(fig.data) == 4 and fig.data[0].fill == "toself"
    with pytest.raises(ValueError, match=r"expected \(n_seeds, 4\)"):
        viz.line_band(x, np.ones((3, 5)))


def test_add_selector_shows_one_group_at_a_time() -> None:
    fig = go.Figure([go.Scatter(y=[i]) for i in range(4)])
    viz.add_selector(fig, ["a", "b"], [[0, 1], [2]], kind="dropdown")
    assert [t.visible for t in fig.data] == [True, True, False, True]  # trace 3 in no group
    step = fig.layout.updatemenus[0].buttons[1]
    assert step.args[0]["visible"] == [False, False, True, True]
    with pytest.raises(ValueError, match="out of range"):
        viz.add_selector(fig, ["a"], [[9]])


def test_heatmap_rejects_a_non_matrix() -> None:
    with pytest.raises(ValueError, match="2-D matrix"):
        viz.heatmap(np.ones(3))


def test_mean_interval_draws_each_groups_mean_and_t_interval_half_width() -> None:
    import numpy as np
    from scipy import stats as st

    runs = {"a": [1.0, 2.0, 3.0], "b": [2.0, 2.5, 4.0, 4.5], "one": [7.0]}
    fig = viz.mean_interval(runs, mode="bar", name="demo")
    tr = fig.data[0]
    assert list(tr.x) == ["a", "b", "one"]
    assert np.allclose(tr.y, [2.0, 3.25, 7.0])
    for label, half in zip(runs, tr.error_y.array):
        r = np.asarray(runs[label])
        want = 0.0 if r.size < 2 else st.t.ppf(0.975, r.size - 1) * st.sem(r)
        assert half == pytest.approx(want, rel=1e-12)


def test_lines_takes_a_shared_x_or_one_x_per_series() -> None:
    fig = viz.lines({"a": [1.0, 2.0], "b": [3.0, 4.0]}, x=[0.0, 1.0], log_y=True)
    assert [list(t.y) for t in fig.data] == [[1.0, 2.0], [3.0, 4.0]]
    assert fig.layout.yaxis.type == "log"
    fig = viz.lines({"a": ([1.0, 2.0, 3.0], [1.0, 4.0, 9.0]), "b": ([5.0], [7.0])})
    assert list(fig.data[0].x) == [1.0, 2.0, 3.0] and list(fig.data[1].y) == [7.0]
    with pytest.raises(ValueError, match="series 'a'"):
        viz.lines({"a": [1.0, 2.0]}, x=[0.0])


def test_loglog_slope_is_the_power_law_exponent_ignoring_missing_points() -> None:
    import numpy as np

    x = np.array([1.0, 2.0, 4.0, 8.0])
    y = 3.0 * x**1.5
    y[-1] = np.nan  # a point that was not measured
    assert viz.loglog_slope(x, y) == pytest.approx(1.5, abs=1e-12)
    fig = viz.loglog(None, {"c": (x[:3], y[:3])})
    assert "slope 1.50" in fig.data[0].name
