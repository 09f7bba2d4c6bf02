"""The live book: ``python -m attention_atlas serve --smoke`` (what ``make serve SMOKE=1`` runs)
serves the built book and a Jupyter server on 127.0.0.1; on each chapter page with a main
control, the "Go live" button runs the page's cells on that server with the book's own copy of
thebe, every request to another host blocked; the test then moves the chapter's main control
and fails unless the kernel recomputed the figure (its data changed) and no cell shows an
error. Screenshots: ``artifacts/screenshots/live-<chapter>.png``.

The book is built here with execution off from the chapters' sources (no outputs: going live
computes them), so this test needs no smoke runs. Run by ``make test-live``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import BookBuild, build_book_from_executed, wait_for_figure_change
from live_servers import (
    CHROMIUM,
    SCREENSHOTS,
    LabServer,
    block_other_hosts,
    chapters_with_a_main_control,
    figure_data_js,
    move_control,
    start_lab,
)

from attention_atlas.notebooks import chapters
from attention_atlas.notebooks.lab import live_fragment

pytestmark = [pytest.mark.slow, pytest.mark.live]

LIVE_STATE = "document.querySelector('.atlas-live-bar').getAttribute('data-state')"
FIGURE_DATA = figure_data_js(".atlas-main .atlas-output .plotly-graph-div")
#: live Markdown outputs whose $math$ was left as text (not typeset by the page's MathJax)
RAW_MATH = """
() => Array.from(document.querySelectorAll('.jp-RenderedMarkdown'))
  .map(e => e.textContent).filter(t => /\\$[^$\\n]+\\$/.test(t)).map(t => t.slice(0, 200))
"""
ERRORS = """
() => Array.from(document.querySelectorAll(
    '[data-mime-type="application/vnd.jupyter.error"], '
    + '.atlas-output [data-mime-type="application/vnd.jupyter.stderr"]'))
  .map(e => e.textContent.slice(0, 2000))
"""


@pytest.fixture(scope="module")
def unexecuted_book(tmp_path_factory: pytest.TempPathFactory) -> BookBuild:
    """The book built from the chapters' sources with execution off (code, no outputs)."""
    import jupytext

    work = tmp_path_factory.mktemp("live-book")
    sources: dict[str, Path] = {}
    for p in chapters(Path(__file__).resolve().parents[1] / "notebooks"):
        sources[p.stem] = work / f"{p.stem}.ipynb"
        jupytext.write(jupytext.read(p), sources[p.stem])
    build = build_book_from_executed(sources, work)
    if build.returncode != 0:
        pytest.fail(f"the book did not build:\n{build.log[-4000:]}", pytrace=False)
    return build


@pytest.fixture(scope="module")
def served(unexecuted_book: BookBuild, tmp_path_factory) -> Iterator[LabServer]:
    workdir = tmp_path_factory.mktemp("serve")
    with start_lab(workdir, smoke=True, html=unexecuted_book.html) as server:
        yield server


def test_serve_listens_on_loopback_only(served: LabServer) -> None:
    listening = served.listening_addresses()
    ports = {port for _, port in listening}
    assert served.port in ports and served.book_port in ports, listening
    assert all(ip == "127.0.0.1" for ip, _ in listening), listening


@pytest.mark.parametrize("path", chapters_with_a_main_control(), ids=lambda p: p.stem)
def test_going_live_runs_the_page_and_the_main_control_reaches_the_kernel(
    served: LabServer, path: Path
) -> None:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"Chromium not found at {CHROMIUM} (CI installs Debian's chromium)")
    from playwright.sync_api import sync_playwright

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    shot = SCREENSHOTS / f"live-{path.stem}.png"
    blocked: list[str] = []
    page_errors: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-gpu"]
        )
        context = browser.new_context(viewport={"width": 1280, "height": 1000})

        block_other_hosts(context, blocked)
        page = context.new_page()
        page.on("pageerror", lambda e: page_errors.append(str(e)))
        jupyter = f"http://127.0.0.1:{served.port}/"
        url = f"http://127.0.0.1:{served.book_port}/notebooks/{path.stem}.html"
        try:
            page.goto(url + live_fragment(jupyter, served.token), wait_until="load")
            assert "atlas-token" not in page.url, "the token stayed in the address bar"
            page.locator("button.atlas-go-live").click()
            page.wait_for_function(f"['live', 'error'].includes({LIVE_STATE})", timeout=600_000)
            status = page.locator(".atlas-live-bar").inner_text()
            assert page.evaluate(LIVE_STATE) == "live", status
            assert not page.evaluate(ERRORS), page.evaluate(ERRORS)
            page.wait_for_timeout(1000)  # MathJax typesets asynchronously
            assert not page.evaluate(RAW_MATH), page.evaluate(RAW_MATH)
            listening = served.listening_addresses()  # the kernel's sockets too, now
            assert all(ip == "127.0.0.1" for ip, _ in listening), listening
            control = page.locator(".atlas-main-control").first
            control.scroll_into_view_if_needed()
            before = page.evaluate(FIGURE_DATA)
            assert before is not None, "the main exploration drew no figure in the page"
            done = move_control(control)
            after = wait_for_figure_change(page, FIGURE_DATA, before, within_s=60)
            page.locator(".atlas-main").first.scroll_into_view_if_needed()
            page.screenshot(path=str(shot))
            assert not page.evaluate(ERRORS), page.evaluate(ERRORS)
            assert after != before, f"{done}, but the kernel's figure did not change within 60 s"
        except BaseException:
            page.screenshot(path=str(shot))
            raise
        finally:
            browser.close()
            served.shutdown_kernels()  # the next chapter starts on a machine at rest
    assert not blocked, f"the live page asked other hosts: {blocked[:10]}"
    assert not page_errors, f"errors in the page: {page_errors[:10]}"
