"""The tests' shared set-up, in one place: the chapters executed once per session with their
SMOKE parameters, and the book built once from those executed notebooks (execution off), reused
by test_notebooks.py, test_book.py and test_browser.py; the :func:`one_thread` fixture; the
explicit pair-by-pair geodesic scores (:func:`explicit_geodesic_scores`), the float64 reference
of several test files; and the browser tests' wait for a figure to change
(:func:`wait_for_figure_change`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "book" / "_ext"))

#: kernels run at once for the smoke runs (the machine has 2 cores)
SMOKE_JOBS = int(os.environ.get("ATTENTION_ATLAS_SMOKE_JOBS", "2"))
#: seconds allowed per cell in a smoke run
SMOKE_CELL_TIMEOUT = float(os.environ.get("ATTENTION_ATLAS_SMOKE_TIMEOUT", "600"))


@pytest.fixture
def one_thread():  # type: ignore[no-untyped-def]
    """One intra-op thread for the test (small tensors: faster, and much faster on a loaded
    machine; the native kernels' bit-for-bit tests need it), the count restored after. Use it
    with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def explicit_geodesic_scores(
    q: torch.Tensor, k: torch.Tensor, U: torch.Tensor, tau: float
) -> torch.Tensor:
    """``-(q_i - k_j)^T (I + (U_i U_i^T + U_j U_j^T) / 2) (q_i - k_j) / tau``, pair by pair, the
    metric formed as a ``d x d`` matrix: ``q, k (L, d)``, ``U (L, d, r)`` -> ``(L, L)``."""
    L, d = q.shape
    S = torch.empty(L, L, dtype=q.dtype)
    for i in range(L):
        for j in range(L):
            g = torch.eye(d, dtype=q.dtype) + (U[i] @ U[i].T + U[j] @ U[j].T) / 2
            x = q[i] - k[j]
            S[i, j] = -(x @ g @ x) / tau
    return S


def wait_for_figure_change(page: object, figure_js: str, before: object, within_s: float = 60):
    """Poll the page every half second until ``figure_js`` (a JavaScript function returning the
    figure's data, or null) returns something other than ``before``; the last value (equal to
    ``before`` when the figure did not change within ``within_s`` seconds)."""
    after = before
    for _ in range(int(within_s * 2)):
        page.wait_for_timeout(500)  # type: ignore[attr-defined]
        after = page.evaluate(figure_js)  # type: ignore[attr-defined]
        if after is not None and after != before:
            break
    return after


def _chapters_needed(session: pytest.Session) -> list[Path]:
    """Chapters the selected tests need: all of them if the book is built, else only those
    of the selected per-chapter smoke tests (so ``pytest -k 00_attention_zoo`` runs one)."""
    from attention_atlas.notebooks import chapters

    every = chapters(ROOT / "notebooks")
    wanted: set[Path] = set()
    for item in session.items:
        names = getattr(item, "fixturenames", ())
        if "smoke_book" in names or "served_book" in names:
            return every
        callspec = getattr(item, "callspec", None)
        if "smoke_runs" in names and callspec is not None and "path" in callspec.params:
            wanted.add(Path(callspec.params["path"]))
    return [p for p in every if p in wanted] if wanted else every


@pytest.fixture(scope="session")
def smoke_runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The chapters executed with their SMOKE values: ``{stem: ChapterResult}`` (errors kept).

    Runs once per session, ``SMOKE_JOBS`` kernels at a time."""
    from attention_atlas.notebooks import run_chapters

    out = tmp_path_factory.mktemp("executed-smoke")
    results = run_chapters(
        _chapters_needed(request.session),
        smoke=True,
        out_dir=out,
        jobs=SMOKE_JOBS,
        timeout=SMOKE_CELL_TIMEOUT,
    )
    return {r.chapter: r for r in results}


@dataclass
class BookBuild:
    """A book built by the tests: its HTML folder, exit status and log."""

    html: Path
    returncode: int
    log: str


def ensure_vendored() -> None:
    """Fetch the book's pinned JavaScript (npm) if it is not there yet."""
    import vendor_js

    if vendor_js.missing():
        vendor_js.ensure(quiet=True)


def build_book_from_executed(executed: dict[str, Path], workdir: Path) -> BookBuild:
    """Build the book from already executed notebooks (execution off), ``-W --keep-going``.

    The source is a temporary folder holding the project's ``_toc.yml``, its ``_config.yml``
    with execution off, a link to ``book/`` and the executed ``notebooks/*.ipynb``.
    """
    import yaml

    ensure_vendored()
    src = workdir / "src"
    (src / "notebooks").mkdir(parents=True)
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    config.setdefault("execute", {})["execute_notebooks"] = "off"
    (src / "_config.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    shutil.copy(ROOT / "_toc.yml", src / "_toc.yml")
    (src / "book").symlink_to(ROOT / "book", target_is_directory=True)
    for stem, nb in executed.items():
        shutil.copy(nb, src / "notebooks" / f"{stem}.ipynb")
    jb = Path(sys.executable).with_name("jupyter-book")
    cmd = [str(jb), "build", str(src), "-W", "--keep-going", "--path-output", str(workdir)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=src)
    return BookBuild(workdir / "_build" / "html", proc.returncode, proc.stdout + proc.stderr)


@pytest.fixture(scope="session")
def smoke_book(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> BookBuild:
    """The book built from the smoke-executed chapters. A chapter whose run failed is built
    from what papermill wrote (its outputs up to the failure), or without outputs.

    With ``ATTENTION_ATLAS_BOOK_HTML=<folder>`` set, that already built book is used instead
    (``make book-check`` runs the book and browser tests on ``make book``'s output)."""
    import jupytext

    prebuilt = os.environ.get("ATTENTION_ATLAS_BOOK_HTML")
    if prebuilt:
        return BookBuild(Path(prebuilt).resolve(), 0, f"prebuilt book at {prebuilt}")

    smoke_runs = request.getfixturevalue("smoke_runs")
    workdir = tmp_path_factory.mktemp("book")
    executed: dict[str, Path] = {}
    for stem, r in smoke_runs.items():
        if r.output.is_file():
            executed[stem] = r.output
        else:  # never executed (bad parameters): the unexecuted notebook
            path = workdir / f"{stem}.unexecuted.ipynb"
            jupytext.write(jupytext.read(r.source), path)
            executed[stem] = path
    return build_book_from_executed(executed, workdir)
