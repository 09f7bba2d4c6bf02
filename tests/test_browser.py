"""Open every page of the built book in headless Chromium, offline, and fail on any console
error, failed request, request to another host, plotly figure without its SVG, or math that
MathJax did not typeset. A screenshot of each page goes to artifacts/screenshots/."""

from __future__ import annotations

import functools
import http.server
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCREENSHOTS = ROOT / "artifacts" / "screenshots"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]

pytestmark = pytest.mark.slow


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@pytest.fixture(scope="module")
def served_book(smoke_book) -> Iterator[tuple[str, Path]]:
    """The smoke-built book served on 127.0.0.1 (a free port) from a thread."""
    if smoke_book.returncode != 0 or not (smoke_book.html / "index.html").is_file():
        pytest.fail("the book did not build (see test_book.py)", pytrace=False)
    handler = functools.partial(_QuietHandler, directory=str(smoke_book.html))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", smoke_book.html
    finally:
        server.shutdown()
        server.server_close()


def _pages(html_dir: Path) -> list[str]:
    return sorted(
        str(p.relative_to(html_dir))
        for p in html_dir.rglob("*.html")
        if "_static" not in p.parts and "_sources" not in p.parts
    )


CHECK_PAGE = """
() => {
  const figs = Array.from(document.querySelectorAll('div.plotly-graph-div'));
  const undrawn = figs.filter(d => !d.querySelector('svg.main-svg')).map(d => d.id);
  const math = Array.from(document.querySelectorAll('.math'));
  const untypeset = math.filter(m => !m.querySelector('mjx-container'))
                        .map(m => m.textContent.slice(0, 80));
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  const raw = [];
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    if (n.parentElement.closest('pre, code, script, style, textarea, .highlight, mjx-container'))
      continue;
    const t = n.textContent;
    // a TeX delimiter or command (\\lVert, \\top, ...) that reached the reader as text
    if (t.includes('\\\\(') || t.includes('\\\\[') || /\\$\\$/.test(t) || /\\\\[A-Za-z]{2,}/.test(t))
      raw.push(t.slice(0, 80));
  }
  return {figures: figs.length, undrawn, math: math.length,
          mjx: document.querySelectorAll('mjx-container').length, untypeset, raw};
}
"""


def test_every_page_renders_offline_in_chromium(served_book) -> None:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"Chromium not found at {CHROMIUM} (CI installs Debian's chromium)")
    from playwright.sync_api import sync_playwright

    base, html_dir = served_book
    pages = _pages(html_dir)
    assert pages, "no HTML pages"
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    problems: list[str] = []
    summary: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS)
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        blocked: list[str] = []

        def route(r) -> None:
            url = r.request.url
            host = urlparse(url).hostname
            if url.startswith(("data:", "blob:", "about:")) or host == "127.0.0.1":
                r.continue_()
            else:
                blocked.append(url)
                r.abort()

        context.route("**/*", route)
        for rel in pages:
            page = context.new_page()
            errors: list[str] = []
            page.on(
                "console",
                lambda m, errors=errors: (
                    errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None
                ),
            )
            page.on("pageerror", lambda e, errors=errors: errors.append(f"page error: {e}"))
            page.on(
                "requestfailed",
                lambda r, errors=errors: errors.append(f"request failed: {r.url} {r.failure}"),
            )
            page.on(
                "response",
                lambda r, errors=errors: (
                    errors.append(f"HTTP {r.status}: {r.url}")
                    if r.status >= 400 and not r.url.endswith("/favicon.ico")  # none: fine
                    else None
                ),
            )
            blocked.clear()
            page.goto(f"{base}/{rel}", wait_until="load", timeout=60_000)
            page.wait_for_load_state("networkidle", timeout=60_000)
            page.evaluate(
                "async () => { if (window.MathJax && MathJax.startup && MathJax.startup.promise)"
                " { await MathJax.startup.promise; } }"
            )
            info = page.evaluate(CHECK_PAGE)
            shot = SCREENSHOTS / (rel.replace("/", "__").removesuffix(".html") + ".png")
            page.screenshot(path=str(shot), full_page=True)
            summary.append(
                f"{rel}: {info['figures']} figures, {info['math']} math, {info['mjx']} typeset"
            )
            problems += [f"{rel}: {e}" for e in errors]
            problems += [f"{rel}: request to another host blocked: {u}" for u in blocked]
            problems += [f"{rel}: plotly figure {d} drew no svg.main-svg" for d in info["undrawn"]]
            problems += [f"{rel}: math not typeset: {t!r}" for t in info["untypeset"]]
            problems += [f"{rel}: raw TeX left in the page: {t!r}" for t in info["raw"]]
            page.close()
        browser.close()
    assert not problems, "\n".join(problems + ["", *summary])
    assert any(" 0 figures" not in s for s in summary), "no page drew any plotly figure"
