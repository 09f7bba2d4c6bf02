"""The layout a newcomer can hold in their head (issue 11), checked: small modules, chapters
that are narrative plus calls, one home per equation, and a main control in every chapter."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import jupytext
import pytest

from attention_atlas.notebooks import chapters

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "attention_atlas"
CHAPTERS = chapters(ROOT / "notebooks")
IDS = [p.stem for p in CHAPTERS]

#: the longest module under src/ (lines)
MAX_MODULE_LINES = 500
#: the longest function a chapter may define (lines, decorators and docstring included)
MAX_CHAPTER_FUNCTION_LINES = 25
#: calls that belong in the library, never in a chapter (training, FLOP counting, intervals)
FORBIDDEN_CALLS = {
    "backward": "a backward pass (training belongs in attention_atlas.train)",
    "FlopCounterMode": "a FLOP counter (use bench.count_flops)",
    "ppf": "an interval formula (use stats)",
    "zero_grad": "an optimiser step (training belongs in attention_atlas.train)",
}
#: timers: a chapter may time itself once, never inside a loop (timing loops live in bench)
TIMERS = {"perf_counter", "time", "monotonic", "process_time", "thread_time", "timeit"}


def _code(path: Path) -> str:
    """The chapter's code cells, IPython magics and shell lines blanked (line numbers kept)."""
    nb = jupytext.read(path)
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    return re.sub(r"^\s*[%!].*$", "", code, flags=re.M)


@pytest.mark.parametrize("path", sorted(SRC.rglob("*.py")), ids=lambda p: str(p.relative_to(SRC)))
def test_no_module_is_over_500_lines(path: Path) -> None:
    n = len(path.read_text().splitlines())
    assert n <= MAX_MODULE_LINES, f"{path.relative_to(ROOT)} has {n} lines (> {MAX_MODULE_LINES})"


@pytest.mark.parametrize("path", CHAPTERS, ids=IDS)
def test_chapter_functions_are_short(path: Path) -> None:
    tree = ast.parse(_code(path))
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"  # type: ignore[operator]
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        and node.end_lineno - node.lineno + 1 > MAX_CHAPTER_FUNCTION_LINES  # type: ignore[operator]
    ]
    assert not long, f"{path.name} defines long functions/classes: {long}"


def _called(node: ast.AST) -> str | None:
    """The name a call calls (``f(...)`` or ``x.f(...)``), else None."""
    if isinstance(node, ast.Call):
        f = node.func
        return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
    return None


@pytest.mark.parametrize("path", CHAPTERS, ids=IDS)
def test_chapter_has_no_training_timing_or_flop_loop(path: Path) -> None:
    tree = ast.parse(_code(path))
    found = [
        FORBIDDEN_CALLS[n] for node in ast.walk(tree) if (n := _called(node)) in FORBIDDEN_CALLS
    ]
    found += [
        f"a timer ({n}) inside a loop (use bench)"
        for loop in ast.walk(tree)
        if isinstance(loop, ast.For | ast.While | ast.comprehension)
        for node in ast.walk(loop)
        if (n := _called(node)) in TIMERS
    ]
    assert not found, f"{path.name} contains {sorted(set(found))}"


@pytest.mark.parametrize("path", CHAPTERS, ids=IDS)
def test_every_chapter_has_a_main_exploration(path: Path) -> None:
    """The control the JupyterLab and live-book tests move (issue 17)."""
    from live_servers import has_main_control

    assert has_main_control(path.read_text()), f"{path.name} has no viz.explore(..., main=True)"


#: the functions that define an equation of the seeds; each is defined once in src/, in the module
#: named for it (every fast path is tested against these)
EQUATION_HOMES = {
    "geodesic_scores": "attention/riemannian/scores.py",  # eq. (15)
    "geodesic_scores_dense": "attention/riemannian/scores.py",  # eq. (6)
    "geodesic_scores_decomposed": "attention/riemannian/scores.py",  # eq. (16)
    "blend_weights": "attention/riemannian/scores.py",  # eq. (27)
    "metric_inverse_apply": "linalg.py",  # eq. (14)
    "curvature_proxy": "attention/riemannian/geometry.py",  # eq. (21)
    "metric_aware_projection": "attention/riemannian/geometry.py",  # eq. (20)
    "principal_cofactors": "cofactor/cofactors.py",
    "stability_margin": "cofactor/cofactors.py",
    "matroidal_logits": "attention/matroidal.py",
    "ssd": "attention/sma/duality.py",
}


@pytest.mark.parametrize("name", sorted(EQUATION_HOMES))
def test_every_equation_has_one_home(name: str) -> None:
    pattern = re.compile(rf"^def {name}\(", re.M)
    homes = sorted(
        p.relative_to(SRC).as_posix() for p in SRC.rglob("*.py") if pattern.search(p.read_text())
    )
    assert homes == [EQUATION_HOMES[name]], f"{name} is defined in {homes}"
