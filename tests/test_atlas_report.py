"""``atlas report``: a variant written outside the library gets its report (every section, an
offline page whose controls move its figures, a JSON summary); broken variants get a report
naming the failed check and a non-zero exit; the report's trained cells are chapter 9's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attention_atlas.experiments import atlas
from attention_atlas.experiments.atlas.variant import VariantError, load_variant

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = f"{ROOT / 'examples' / 'qk_norm_attention.py'}:QKNormAttention"
BROKEN = Path(__file__).resolve().parent / "atlas_variants.py"

pytestmark = pytest.mark.slow


def report(spec: str, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "attention_atlas", "atlas", "report", spec, "--preset", "smoke",
         "--out", str(out), *extra],
        capture_output=True, text=True, timeout=900, cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip


# -- the variant -------------------------------------------------------------------------------


def test_a_variant_loads_by_name_module_or_file_and_registers_once(monkeypatch) -> None:
    assert load_variant("dot").name == "dot" and load_variant("dot").builtin
    by_file = load_variant(EXAMPLE)
    assert by_file.name == "QKNormAttention" and not by_file.builtin and by_file.fingerprint
    assert load_variant(EXAMPLE).cls is by_file.cls  # the same file is imported once
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    with pytest.raises(VariantError, match="the name 'QKNormAttention' is taken"):
        load_variant("qk_norm_attention:QKNormAttention")  # the same name, another module
    rel = os.path.relpath(ROOT / "examples" / "qk_norm_attention.py")
    assert atlas.canonical_spec(f"{rel}:QKNormAttention") == EXAMPLE


@pytest.mark.parametrize(
    "spec,fragment",
    [
        ("nosuch", "expected a registered name"),
        ("/no/such/file.py:X", "no such file"),
        (f"{BROKEN}:Nope", "has no attribute 'Nope'"),
        ("math:pi", "expected a subclass of attention_atlas.attention.Attention"),
        ("no_such_module_x:Cls", "cannot import module"),
        (":Cls", "expected module:Class with both parts"),
    ],
)
def test_a_bad_spec_is_one_line_naming_it(spec: str, fragment: str) -> None:
    with pytest.raises(VariantError) as err:
        load_variant(spec)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_the_reports_trained_cells_are_chapter_9s_cells() -> None:
    """A book-preset report of a zoo arm runs exactly the stored zoo book grid's cells of that arm
    and of dot (same parameters), so the report and chapter 9 cannot disagree."""
    from attention_atlas.experiments.zoo import run as zoo

    for arm in ("dot", "matroidal", "riemannian"):
        mine = atlas.chapter_grid(variant=arm)
        book = zoo.chapter_grid(**zoo.PRESETS["book"])
        trained = {k: {kk: vv for kk, vv in v.items() if kk != "atlas"}
                   for k, v in mine.items() if k.split("/")[0] in ("mqar", "ptb")}  # fmt: skip
        assert trained and all(k in book for k in trained)
        for k, cell in trained.items():
            assert cell == book[k], k
        assert {k.split("/")[1] for k in trained} == {"dot", arm}


# -- the reports -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def example_report(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path_factory.mktemp("report") / "qknorm"
    return report(EXAMPLE, out), out


def test_a_variant_of_your_own_gets_every_section(example_report) -> None:
    proc, out = example_report
    assert proc.returncode == 0, proc.stdout + proc.stderr
    s = json.loads((out / "summary.json").read_text())
    assert s["ok"] and not s["failed_checks"] and not s["failed_sections"], s
    assert set(s["sections"]) == set(atlas.SECTIONS)
    checks = {c["check"]: c["passed"] for c in s["contract"]}
    assert checks["causal"] is True and checks["gradcheck"] is True and checks["finite"] is True
    assert s["recall"]["test_acc"] is not None and s["recall"]["val_bpc"] is not None
    assert set(s["verdicts"]) == set(atlas.summary.COMPARISONS)
    assert all(v["outcome"] in ("supported", "contradicted", "not resolved", "not tested")
               for v in s["verdicts"].values())  # fmt: skip
    page = (out / "index.html").read_text()
    assert "QKNormAttention" in page and "plotly-graph-div" in page
    assert (out / "_static" / "plotly.min.js").is_file()
    assert "http://" not in page.replace("http://www.w3.org", "")  # nothing from another host


@pytest.mark.parametrize(
    "cls,check,cause",
    [("PeekingAttention", "causal", "depends on token"), ("NaNAttention", "finite", "")],
)
def test_a_broken_variant_gets_a_report_naming_the_failed_check(
    tmp_path, cls, check, cause
) -> None:
    out = tmp_path / cls
    proc = report(f"{BROKEN}:{cls}", out)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"failed: {check}:" in proc.stdout, proc.stdout
    s = json.loads((out / "summary.json").read_text())
    assert not s["ok"]
    failed = {c["check"]: c["detail"] for c in s["contract"] if c["passed"] is False}
    assert check in failed and cause in failed[check], failed
    assert all(v["outcome"] == "not tested" for v in s["verdicts"].values())
    page = (out / "index.html").read_text()
    assert "Not trained" in page and check in page


# -- the page in a browser ---------------------------------------------------------------------

VISIBLE = (
    "(id) => { const gd = document.getElementById(id);"
    " return gd._fullData.map(t => t.visible === true ? 1 : 0).join(''); }"
)


def test_the_report_page_works_offline_and_its_controls_move_the_figures(example_report) -> None:
    """The book's offline browser check on the report page: no console error, no request to
    another host, every plotly figure drawn, no raw TeX; then each slider and dropdown is moved
    with the mouse and the figure must show other traces."""
    import functools
    import http.server
    import threading

    from live_servers import CHROMIUM, block_other_hosts
    from playwright.sync_api import sync_playwright
    from test_browser import CHECK_PAGE

    if not Path(CHROMIUM).exists():
        pytest.fail(f"Chromium not found at {CHROMIUM} (CI installs Debian's chromium)")
    proc, out = example_report
    assert proc.returncode == 0, proc.stdout + proc.stderr
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(out))
    handler.log_message = lambda *a: None  # type: ignore[assignment]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    errors: list[str] = []
    blocked: list[str] = []
    moved: dict[str, tuple[str, str]] = {}
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            context = browser.new_context(viewport={"width": 1280, "height": 900})
            block_other_hosts(context, blocked)
            page = context.new_page()
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("requestfailed", lambda r: errors.append(f"failed: {r.url}"))
            page.on("response", lambda r: errors.append(f"HTTP {r.status} {r.url}")
                    if r.status >= 400 else None)  # fmt: skip
            page.goto(f"http://127.0.0.1:{server.server_address[1]}/index.html",
                      wait_until="load")  # fmt: skip
            page.wait_for_load_state("networkidle")
            info = page.evaluate(CHECK_PAGE)
            ids = page.evaluate(
                "() => Array.from(document.querySelectorAll('div.plotly-graph-div')).map(d => d.id)"
            )
            for fid in ids:
                fig = page.locator(f"#{fid}")
                fig.scroll_into_view_if_needed()
                before = page.evaluate(VISIBLE, fid)
                rail = fig.locator(".slider-group .slider-rail-touch-rect")
                menu = fig.locator(".updatemenu-header-group")
                if rail.count():
                    box = rail.first.bounding_box()
                    assert box is not None
                    page.mouse.click(box["x"] + box["width"] - 8, box["y"] + box["height"] / 2)
                elif menu.count():
                    menu.first.click()
                    fig.locator(".updatemenu-dropdown-button").last.click()
                else:
                    continue
                page.wait_for_function(f"(id) => ({VISIBLE})(id) !== {before!r}", arg=fid,
                                       timeout=10_000)  # fmt: skip
                moved[fid] = (before, page.evaluate(VISIBLE, fid))
            browser.close()
    finally:
        server.shutdown()
        server.server_close()
    assert not errors and not blocked, errors + blocked
    assert info["figures"] >= 4 and not info["undrawn"] and not info["raw"], info
    assert len(moved) >= 2, f"controls moved in {len(moved)} figures of {len(ids)}"


def test_the_sweep_runs_the_reports_cells_and_the_report_reuses_them(tmp_path) -> None:
    """`sweep atlas -p variant=SPEC --out DIR/cells` (how a long report's cells go to a Dask
    cluster) stores cells that `atlas report --out DIR` then reads instead of running."""
    out = tmp_path / "rep"
    sweep = subprocess.run(
        [sys.executable, "-m", "attention_atlas", "sweep", "atlas", "--preset", "smoke",
         "--seeds", "0", "1", "2", "-p", f"variant={EXAMPLE}", "--only", "contract", "rank",
         "--out", str(out / "cells"), "--no-progress"],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert sweep.returncode == 0, sweep.stdout + sweep.stderr
    swept = {p.name: p.stat().st_mtime_ns for p in (out / "cells" / "cells").glob("*.json")}
    assert len(swept) == 6
    proc = report(EXAMPLE, out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    after = {p.name: p.stat().st_mtime_ns for p in (out / "cells" / "cells").glob("*.json")}
    assert {k: after[k] for k in swept} == swept and len(after) > len(swept)
