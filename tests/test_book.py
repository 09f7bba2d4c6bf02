"""The book builds from the smoke-executed chapters (execution off, -W --keep-going), has a page
per chapter, and references nothing outside itself: no CDN, no external script or style."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from attention_atlas.notebooks import chapters

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow

#: an element that makes the browser load something: its URL attribute
_LOADING_TAG = re.compile(
    r"<(script|link|img|iframe|source|video|audio|embed|object|track|input)\b[^>]*?"
    r"\b(src|href|data|poster|srcset)\s*=\s*[\"']?\s*((?:https?:)?//[^\"'\s>]+)",
    re.IGNORECASE,
)
_CSS_URL = re.compile(r"(?:url\(\s*[\"']?|@import\s+[\"'])\s*((?:https?:)?//[^\"')\s]+)", re.I)
_JS_LOAD = re.compile(
    r"(?:\bsrc|\bhref|importScripts|\bimport)\s*[:=(]\s*[\"']((?:https?:)?//[^\"']+)[\"']"
)
_CDN_HOSTS = re.compile(r"cdn\.jsdelivr\.net|unpkg\.com|cdnjs\.cloudflare\.com|cdn\.plot\.ly")


def external_references(html_dir: Path) -> list[str]:
    """Every place in a built book that makes a browser fetch from another host."""
    found: list[str] = []
    for path in sorted(html_dir.rglob("*")):
        if not path.is_file():
            continue
        rel = path.relative_to(html_dir)
        if path.suffix == ".html":
            text = path.read_text(errors="replace")
            found += [f"{rel}: <{m[0]} {m[1]}={m[2]}>" for m in _LOADING_TAG.findall(text)]
            found += [f"{rel}: CSS url {u}" for u in _CSS_URL.findall(text)]
            found += [f"{rel}: CDN host {m}" for m in _CDN_HOSTS.findall(text)]
        elif path.suffix == ".css":
            found += [
                f"{rel}: CSS url {u}" for u in _CSS_URL.findall(path.read_text(errors="replace"))
            ]
        elif path.suffix == ".js" and "vendor" not in rel.parts:
            # the book's and the theme's own scripts; vendored libraries mention URLs in
            # comments and defaults (the browser test catches any request they would make)
            found += [
                f"{rel}: script loads {u}"
                for u in _JS_LOAD.findall(path.read_text(errors="replace"))
            ]
    return found


def test_the_book_builds_without_warnings_from_the_smoke_runs(smoke_book) -> None:
    if smoke_book.returncode != 0:
        pytest.fail(
            f"jupyter-book build -W --keep-going exited {smoke_book.returncode}:\n"
            + smoke_book.log[-6000:],
            pytrace=False,
        )
    assert (smoke_book.html / "index.html").is_file()


def test_every_chapter_has_a_page(smoke_book) -> None:
    missing = [
        p.stem
        for p in chapters(ROOT / "notebooks")
        if not (smoke_book.html / "notebooks" / f"{p.stem}.html").is_file()
    ]
    assert not missing, f"no page for {missing}"


def test_the_built_book_references_nothing_outside_itself(smoke_book) -> None:
    refs = external_references(smoke_book.html)
    assert not refs, "external references in the built book:\n" + "\n".join(refs[:50])


def test_the_scanner_finds_external_scripts_styles_and_cdn_hosts(tmp_path: Path) -> None:
    (tmp_path / "a.html").write_text(
        '<script src="https://cdn.example.org/x.js"></script>'
        "<link rel='stylesheet' href='//fonts.example.org/y.css'>"
        '<a href="https://example.org/">a link is fine</a>'
        '<script src="_static/local.js"></script>'
    )
    (tmp_path / "b.css").write_text("@import url(https://fonts.example.org/z.css);")
    (tmp_path / "c.js").write_text('s.src = "https://unpkg.com/thing.js";')
    refs = external_references(tmp_path)
    assert len(refs) == 4, refs


def test_plotly_mathjax_and_widget_manager_are_served_from_the_book(smoke_book) -> None:
    import plotly

    static = smoke_book.html / "_static" / "vendor"
    shipped = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    assert (static / "plotly.min.js").read_bytes() == shipped.read_bytes()
    for f in ("mathjax/tex-mml-chtml.js", "require.js", "html-manager/embed-amd.js"):
        assert (static / f).is_file(), f
    zoo = (smoke_book.html / "notebooks" / "00_attention_zoo.html").read_text()
    assert 'src="../_static/vendor/plotly.min.js' in zoo
    assert 'src="../_static/vendor/mathjax/tex-mml-chtml.js' in zoo
    assert zoo.index("vendor/plotly.min.js") < zoo.index("plotly-graph-div")
