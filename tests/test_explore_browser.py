"""The static half of a several-control exploration in Chromium: the figure's own script
(viz.EXPLORE_JS) shows, after a slider moves, the grid point all sliders select together."""

from __future__ import annotations

import functools
import http.server
import shutil
import threading
from pathlib import Path

import numpy as np
import plotly
import plotly.graph_objects as go
import pytest
from live_servers import CHROMIUM, block_other_hosts

from attention_atlas import viz

pytestmark = pytest.mark.slow


def line(p: float, scale: float) -> go.Figure:
    x = np.arange(4.0)
    return go.Figure(go.Scatter(x=x, y=scale * x**p), layout={"title": f"p={p:g} s={scale:g}"})


def test_two_sliders_select_the_grid_point_together(tmp_path: Path) -> None:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"Chromium not found at {CHROMIUM} (CI installs Debian's chromium)")
    from playwright.sync_api import sync_playwright

    ps, scales = [1.0, 2.0, 3.0], [1.0, 10.0]
    ex = viz.explore(line, {"p": ps, "scale": viz.slider(scales, value=1.0)}, interactive=False)
    shutil.copy(Path(plotly.__file__).parent / "package_data" / "plotly.min.js", tmp_path)
    (tmp_path / "index.html").write_text(
        '<html><head><script src="plotly.min.js"></script></head><body>'
        + viz.figure_html(ex.figure, div_id="fig")
        + "</body></html>"
    )
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    shown = (
        "() => { const gd = document.getElementById('fig');"
        " return [gd.layout.title.text, gd.data.filter(t => t.visible !== false).length]; }"
    )
    blocked: list[str] = []
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            context = browser.new_context()
            block_other_hosts(context, blocked)
            page = context.new_page()
            page.goto(f"http://127.0.0.1:{server.server_address[1]}/index.html")
            page.wait_for_function("() => document.querySelectorAll('.slider-group').length == 2")
            assert page.evaluate(shown) == ["p=2 s=1", 1]
            rails = page.locator(".slider-group .slider-rail-touch-rect")

            def click_step(slider: int, step: int, steps: int) -> None:
                box = rails.nth(slider).bounding_box()
                assert box is not None
                page.mouse.click(box["x"] + 10 + (box["width"] - 20) * step / (steps - 1),
                                 box["y"] + box["height"] / 2)  # fmt: skip

            click_step(1, 1, len(scales))  # scale -> 10, p stays 2
            page.wait_for_function(f"({shown})()[0] === 'p=2 s=10'", timeout=10_000)
            click_step(0, 2, len(ps))  # p -> 3, scale stays 10
            page.wait_for_function(f"({shown})()[0] === 'p=3 s=10'", timeout=10_000)
            title, visible = page.evaluate(shown)
            ys = page.evaluate(  # the drawn (decoded) data of the visible trace
                "() => Array.from(document.getElementById('fig')._fullData"
                ".find(t => t.visible === true).y)"
            )
            browser.close()
    finally:
        server.shutdown()
        server.server_close()
    assert visible == 1 and not blocked
    np.testing.assert_allclose(ys, line(3.0, 10.0).data[0].y)
