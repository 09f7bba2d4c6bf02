"""Every chapter with a main control, live in JupyterLab: start JupyterLab with the project's own
command (``python -m attention_atlas lab --smoke``, what ``make lab SMOKE=1`` runs) on 127.0.0.1
with a token, check that it listens on loopback only, open the chapter through jupytext, run it
with its SMOKE values, move the chapter's main control (``viz.explore(..., main=True)``) and fail
unless the figure's data changed and no cell shows an error. The server is stopped whatever
happens. Screenshots: ``artifacts/screenshots/lab-<chapter>.png``.

Run by ``make test-live`` (CI's ``.ci/run`` calls it), not by ``make test``: about 40 s to start
JupyterLab and 10 s to 1 min per chapter on two cores.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import pytest
from conftest import wait_for_figure_change
from live_servers import (
    CHROMIUM,
    SCREENSHOTS,
    LabServer,
    chapters_with_a_main_control,
    figure_data_js,
    has_main_control,
    move_control,
    start_lab,
)

#: seconds a chapter may take to run with its SMOKE values in the live kernel
RUN_TIMEOUT = float(os.environ.get("ATTENTION_ATLAS_LIVE_TIMEOUT", "600"))

pytestmark = [pytest.mark.slow, pytest.mark.live]


@pytest.fixture(scope="module")
def lab_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    """JupyterLab started by ``python -m attention_atlas lab --smoke``; stopped at the end."""
    with start_lab(tmp_path_factory.mktemp("lab"), smoke=True) as server:
        yield server


def test_the_lab_listens_on_loopback_only(lab_server: LabServer) -> None:
    listening = lab_server.listening_addresses()
    assert listening, "found no listening socket of the JupyterLab server"
    assert all(ip == "127.0.0.1" for ip, _ in listening), listening


def test_a_main_exploration_is_found_through_nested_calls() -> None:
    assert has_main_control('viz.explore(f, {"t": viz.slider([1, 2])}, main=True)')
    assert has_main_control('viz.explore(f, {"t": viz.slider([1], r=(1, (2 + 3)))}, main=True)')
    assert not has_main_control('viz.explore(f, {"t": [1, 2]})\nshow(main=True)')
    assert not has_main_control('viz.explore(f, {"t": [1, 2]}, domain=True)')


RUN_STATE = """
() => {
  const prompts = Array.from(document.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt'));
  const text = prompts.map(p => p.textContent.trim());
  const errors = Array.from(document.querySelectorAll(
      '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.error"], '
      + '.atlas-output [data-mime-type="application/vnd.jupyter.stderr"]'))
    .map(e => e.textContent.slice(0, 2000));
  const stderr = Array.from(document.querySelectorAll(
      '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'))
    .map(e => e.textContent.slice(-1500)).slice(-3);
  const status = document.querySelector('.jp-Notebook-ExecutionIndicator');
  return {cells: text.length, running: text.filter(t => t.includes('*')).length,
          unrun: text.filter(t => t === '[ ]:' || t === '').length, errors, stderr,
          idle: status ? status.getAttribute('data-status') === 'idle' : null,
          text: document.querySelector('.jp-Notebook') ?
                document.querySelector('.jp-Notebook').innerText.includes('SMOKE values in use')
                : false};
}
"""

FIGURE_DATA = figure_data_js(".atlas-main .atlas-output .js-plotly-plot")


def _click_run_all(page) -> None:
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()


def _run_all(page, timeout_s: float) -> dict:
    """Run every cell (Run menu) and wait until each has run and the kernel is idle. A click
    that started nothing within 20 s (the menu entry can be inert while the notebook is still
    settling) is repeated, up to three times."""
    _click_run_all(page)
    deadline = time.monotonic() + timeout_s
    started, clicks, last_click, halted = False, 1, time.monotonic(), 0
    state: dict = {}
    while time.monotonic() < deadline:
        page.wait_for_timeout(1000)
        state = page.evaluate(RUN_STATE)
        if state["errors"] or (
            state["cells"] and not state["running"] and not state["unrun"] and state["idle"]
        ):
            return state
        started = started or bool(state["running"]) or state["unrun"] < state["cells"]
        # the run stopped part-way (a cell failed and its traceback went to stderr): say so now
        stopped = started and state["idle"] and not state["running"] and state["unrun"]
        halted = halted + 1 if stopped else 0
        if halted >= 10:
            raise AssertionError(
                f"the run stopped with {state['unrun']} of {state['cells']} cells unrun; "
                "last stderr:\n" + "\n---\n".join(state["stderr"])
            )
        if not started and clicks < 3 and time.monotonic() - last_click > 20:
            page.keyboard.press("Escape")
            _click_run_all(page)
            clicks, last_click = clicks + 1, time.monotonic()
    raise AssertionError(
        f"the chapter did not finish within {timeout_s:.0f} s ({clicks} clicks): {state}"
    )


IDLE = (
    "() => { const s = document.querySelector('.jp-Notebook-ExecutionIndicator');"
    " return !!s && s.getAttribute('data-status') === 'idle'; }"
)


def _start_kernel(page, timeout_error: type[Exception], within_s: float = 180) -> None:
    """Wait until the notebook's kernel is idle and no dialog has shown for 3 s, accepting
    JupyterLab's "Select Kernel" dialog whenever it appears (it can come seconds after the
    notebook opens, and the status bar may read idle meanwhile)."""
    dialog = page.locator(".jp-Dialog .jp-mod-accept")
    deadline, quiet = time.monotonic() + within_s, 0
    while time.monotonic() < deadline:
        shown = False
        with contextlib.suppress(timeout_error):
            if dialog.is_visible():
                shown = True
                dialog.click(timeout=3000)
        quiet = 0 if shown or not page.evaluate(IDLE) else quiet + 1
        if quiet >= 6:
            return
        page.wait_for_timeout(500)
    raise AssertionError(f"the kernel did not start within {within_s:.0f} s")


@pytest.mark.parametrize("path", chapters_with_a_main_control(), ids=lambda p: p.stem)
def test_moving_the_main_control_changes_the_figure(lab_server: LabServer, path: Path) -> None:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"Chromium not found at {CHROMIUM} (CI installs Debian's chromium)")
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    shot = SCREENSHOTS / f"lab-{path.stem}.png"
    blocked: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-gpu"]
        )
        context = browser.new_context(viewport={"width": 1400, "height": 1000})

        def route(r) -> None:
            url = r.request.url
            if (
                url.startswith(("data:", "blob:", "about:"))
                or urlparse(url).hostname == "127.0.0.1"
            ):
                r.continue_()
            else:
                blocked.append(url)
                r.abort()

        context.route("**/*", route)
        page = context.new_page()
        try:
            lab_server.start_session(f"notebooks/{path.name}")  # no "Select Kernel" question
            # ?reset: a fresh workspace, so only this chapter is open (the queries see one notebook)
            page.goto(lab_server.url(f"lab/tree/notebooks/{path.name}?reset"), timeout=120_000)
            page.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=120_000)
            _start_kernel(page, PlaywrightTimeout)
            state = _run_all(page, timeout_s=RUN_TIMEOUT)
            assert not state["errors"], "a cell shows an error:\n" + "\n---\n".join(state["errors"])
            assert state["text"], "the chapter did not report its SMOKE values (apply_smoke)"
            listening = lab_server.listening_addresses()  # the kernel's sockets too, now
            assert all(ip == "127.0.0.1" for ip, _ in listening), listening
            control = page.locator(".atlas-main-control").first
            control.scroll_into_view_if_needed()
            page.wait_for_function(f"({FIGURE_DATA})() !== null", timeout=60_000)
            before = page.evaluate(FIGURE_DATA)
            done = move_control(control)
            after = wait_for_figure_change(page, FIGURE_DATA, before, within_s=60)
            page.locator(".atlas-main").first.scroll_into_view_if_needed()
            page.screenshot(path=str(shot))
            state = page.evaluate(RUN_STATE)
            assert not state["errors"], f"after the {done}:\n" + "\n---\n".join(state["errors"])
            assert after != before, f"{done}, but the figure's data did not change within 60 s"
        except BaseException:
            page.screenshot(path=str(shot))
            raise
        finally:
            browser.close()
            lab_server.shutdown_kernels()  # the next chapter starts on a machine at rest
    assert not blocked, f"JupyterLab asked other hosts: {blocked[:10]}"
