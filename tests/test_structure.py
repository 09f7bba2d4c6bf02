"""The layout a newcomer can hold in their head (issues 11 and 50), checked: layers whose imports
only go down (no circles, no private names across modules), one idea per module, chapters that
are narrative plus calls, one home per equation, and a main control in every chapter."""

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

#: a module longer than this says in its docstring why it is one idea ("One idea: ...")
LONG_MODULE_LINES = 600
#: the most modules at the top of src/attention_atlas/ beside the packages
MAX_TOP_MODULES = 10
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
def test_a_long_module_says_why_it_is_one_idea(path: Path) -> None:
    n = len(path.read_text().splitlines())
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    assert n <= LONG_MODULE_LINES or "One idea:" in doc, (
        f"{path.relative_to(ROOT)} has {n} lines (> {LONG_MODULE_LINES}) and its docstring does "
        "not say why it is one idea ('One idea: ...')"
    )


def test_the_package_top_holds_few_modules() -> None:
    top = sorted(p.name for p in SRC.glob("*.py"))
    assert len(top) <= MAX_TOP_MODULES, f"{len(top)} modules at the top of the package: {top}"


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


# ------------------------------------------------------------------------------------------
# Layers: every import goes down (issue 50). DESIGN.md draws the target; this is the rule.
# ------------------------------------------------------------------------------------------

#: the layers of ``src/attention_atlas``, lowest first: a module may import from its own layer
#: (without a circle) or any layer below, never from one above. An entry names a module or a
#: package (everything under it).
LAYERS: list[tuple[str, list[str]]] = [
    (
        "utilities",
        [
            "validate",
            "atomic",
            "threads",
            "profiling",
            "stats",
            "verdicts",
            "linalg",
            "provenance",
            "viz",
        ],
    ),  # fmt: skip
    ("native kernels", ["native"]),
    ("attention", ["attention"]),
    ("cofactor", ["cofactor"]),
    ("models", ["models"]),
    ("data", ["data"]),
    ("training", ["train"]),
    ("results store", ["store"]),
    ("benchmarks", ["bench"]),
    ("sweep runner", ["sweep"]),
    ("experiments", ["experiments"]),
    ("claims register", ["claims"]),
    ("notebooks, lab and serve", ["notebooks"]),
    ("command line", ["cli", "__main__"]),
    ("package front", [""]),  # attention_atlas/__init__.py
]
PKG = "attention_atlas"


def _modules() -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package's ``__init__``), for every module under src/."""
    out = {}
    for p in sorted(SRC.rglob("*.py")):
        parts = list(p.relative_to(SRC.parent).with_suffix("").parts)
        front = parts[-1] == "__init__"
        out[".".join(parts[:-1] if front else parts)] = (p, front)
    return out


MODULES = _modules()


def layer_of(module: str) -> int:
    """The index in :data:`LAYERS` of a module (the longest entry that contains it)."""
    rel = module[len(PKG) + 1 :] if module != PKG else ""
    best, found = -1, None
    for i, (_, entries) in enumerate(LAYERS):
        for e in entries:
            if (rel == e or rel.startswith(e + ".") or e == "") and len(e) > best:
                best, found = len(e), i
    assert found is not None, f"{module} is in no layer of LAYERS"
    return found


def _owner(name: str) -> str | None:
    """The module a dotted name lives in (the longest prefix that is a module)."""
    parts = name.split(".")
    while parts and ".".join(parts) not in MODULES:
        parts.pop()
    return ".".join(parts) or None


def imports(module: str) -> list[tuple[str, str | None, int]]:
    """Every import of our own modules by ``module``, at module level or inside a function:
    ``(imported module, imported name or None, line)``. A string constant that names one of our
    modules (``importlib.import_module("attention_atlas.x")``, a table of commands) counts too."""
    path, front = MODULES[module]
    here = module.split(".") if front else module.split(".")[:-1]
    out: list[tuple[str, str | None, int]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(m, None, node.lineno) for a in node.names if (m := _owner(a.name))]
        elif isinstance(node, ast.ImportFrom):
            base = here[: len(here) - node.level + 1] if node.level else []
            target = ".".join([*base, node.module] if node.module else base)
            for a in node.names:
                if f"{target}.{a.name}" in MODULES:
                    out.append((f"{target}.{a.name}", None, node.lineno))
                elif (m := _owner(target)) is not None:
                    out.append((m, a.name, node.lineno))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            name = node.value.split(":")[0]
            if name.startswith(PKG + ".") and name in MODULES:
                out.append((name, None, node.lineno))
    return [(m, n, line) for m, n, line in out if m != module and m.startswith(PKG)]


GRAPH = {m: sorted({t for t, _, _ in imports(m)}) for m in MODULES}


def test_every_import_goes_down_the_layers() -> None:
    up = [
        f"{m} ({LAYERS[layer_of(m)][0]}) imports {t} ({LAYERS[layer_of(t)][0]}), line {line}"
        for m in MODULES
        for t, _, line in imports(m)
        if layer_of(t) > layer_of(m)
    ]
    assert not up, f"{len(up)} import(s) from a lower layer up to a higher one:\n" + "\n".join(up)


def import_circles(graph: dict[str, list[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, []):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_import_circles_are_found() -> None:
    """The circle finder itself: a loop of three is found, a chain is not."""
    assert import_circles({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == [["a", "b", "c"]]
    assert import_circles({"a": ["b"], "b": ["c"], "c": []}) == []


def test_no_import_circles() -> None:
    circles = import_circles(GRAPH)
    assert not circles, f"{len(circles)} import circle(s):\n" + "\n".join(map(str, circles))


def test_no_private_name_crosses_modules() -> None:
    private = [
        f"{m} imports {name} from {t} (line {line})"
        for m in MODULES
        for t, name, line in imports(m)
        if name is not None and name.startswith("_") and not name.startswith("__")
    ]
    assert not private, f"{len(private)} private name(s) taken from another module:\n" + "\n".join(
        private
    )


def test_every_module_is_in_a_layer() -> None:
    for m in MODULES:
        layer_of(m)


def _optimiser_steps(path: Path) -> list[str]:
    """Calls that take an optimiser step by hand in ``path``: ``<opt>.zero_grad()`` or
    ``<opt>.step()`` on a name that says optimiser (``opt``, ``optimizer``, ``run.opt``, ...)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
            if node.func.attr == "zero_grad" or (node.func.attr == "step" and "opt" in name):
                where = path.relative_to(ROOT) if ROOT in path.parents else path.name
                found.append(f"{where}:{node.lineno}")
    return found


def test_steps_finder_sees_a_hand_written_step(tmp_path: Path) -> None:
    p = tmp_path / "hand_step.py"
    p.write_text("opt.zero_grad()\nloss.backward()\nopt.step()\nsched.step()\n")
    assert _optimiser_steps(p) == ["hand_step.py:1", "hand_step.py:3"]


def test_no_optimiser_step_is_taken_outside_train() -> None:
    """One training step has one home (``attention_atlas.train.step``): the library, the
    benchmarks and the chapters take their steps through it."""
    train = SRC / "train"
    files = [p for p in SRC.rglob("*.py") if train not in p.parents]
    files += sorted((ROOT / "benchmarks").glob("*.py")) + CHAPTERS
    by_hand = [hit for p in files for hit in _optimiser_steps(p)]
    assert not by_hand, "optimiser steps taken by hand (use attention_atlas.train):\n" + "\n".join(
        by_hand
    )
