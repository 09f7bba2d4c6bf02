"""Run the book's chapters headlessly with papermill, with book or smoke parameters.

A chapter is a jupytext ``py:percent`` file ``notebooks/NN_name.py``. It declares its book
parameters in the cell tagged ``parameters`` (one ``name = literal`` per line) and its small
test values in the cell tagged ``smoke`` (``SMOKE = {"name": literal, ...}``)::

    # %% tags=["parameters"]
    n_steps = 400
    seeds = [0, 1, 2]

    # %% tags=["smoke"]
    SMOKE = {"n_steps": 5, "seeds": [0]}

:func:`run_chapter` reads the chapter with :func:`jupytext.read`, checks every injected value
against the parameter it overrides (unknown name or wrong type: :class:`ParameterError`,
before anything runs), executes it with :func:`papermill.execute_notebook` and writes the
executed ``.ipynb``. A failed cell (a failing ``assert``) raises :class:`ChapterFailed`, whose
message names the chapter, the cell and the error.

Command line: ``python -m attention_atlas notebooks run [--smoke] [NAME ...] [--out DIR]
[-p key=value ...]`` (see :func:`add_subcommand`).
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "HEADLESS_ENV",
    "ChapterFailed",
    "ChapterResult",
    "ParameterError",
    "add_subcommand",
    "chapter_parameters",
    "chapter_smoke",
    "chapters",
    "notebooks_dir",
    "output_path",
    "parse_override",
    "repo_root",
    "resolve_chapter",
    "run_chapter",
    "run_chapters",
    "validate_parameters",
]

#: Environment variable set for every headless execution (this runner, ``make book``, the tests).
#: :func:`attention_atlas.viz.is_interactive` reads it: widgets are built only when it is unset.
HEADLESS_ENV = "ATTENTION_ATLAS_HEADLESS"

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_SMOKE_SWITCH = re.compile(
    r"^(from attention_atlas\.lab import apply_smoke|apply_smoke\(SMOKE, globals\(\)\))[ \t]*(#.*)?$",
    re.M,
)


class ParameterError(ValueError):
    """A parameter override that the chapter does not declare, or of the wrong type."""


class ChapterFailed(RuntimeError):
    """A chapter raised while executing (for example a failing ``assert``)."""

    def __init__(self, message: str, *, chapter: str, cell: int | None, line: int | None) -> None:
        super().__init__(message)
        self.chapter = chapter
        self.cell = cell
        self.line = line


# -- where things are --------------------------------------------------------------------------


def repo_root(start: Path | None = None) -> Path:
    """The project root: the first folder above ``start`` (default: cwd) with ``notebooks/``
    and ``pyproject.toml``; else the checkout this package was installed from."""
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        if (d / "notebooks").is_dir() and (d / "pyproject.toml").is_file():
            return d
    pkg_root = Path(__file__).resolve().parents[2]
    if (pkg_root / "notebooks").is_dir():
        return pkg_root
    raise FileNotFoundError(
        f"no project root (a folder with notebooks/ and pyproject.toml) above {here}"
    )


def notebooks_dir(root: Path | None = None) -> Path:
    """``<repo root>/notebooks``."""
    return (root or repo_root()) / "notebooks"


def chapters(directory: Path | None = None) -> list[Path]:
    """Every chapter source ``notebooks/*.py`` (names starting with ``_`` skipped), sorted."""
    directory = directory or notebooks_dir()
    return sorted(p for p in directory.glob("*.py") if not p.name.startswith("_"))


def resolve_chapter(name: str | Path, directory: Path | None = None) -> Path:
    """A chapter by stem (``00_attention_zoo``), file name or path."""
    p = Path(name)
    if p.suffix == ".py" and p.is_file():
        return p.resolve()
    directory = directory or notebooks_dir()
    for cand in (directory / p.name, directory / f"{p.name}.py"):
        if cand.is_file() and cand.suffix == ".py":
            return cand.resolve()
    known = ", ".join(c.stem for c in chapters(directory)) or "(none)"
    raise FileNotFoundError(f"no chapter {str(name)!r} in {directory}; chapters: {known}")


# -- parameters --------------------------------------------------------------------------------


def _read(path: Path) -> Any:
    import jupytext

    return jupytext.read(path, fmt="py:percent")


def _tagged_cells(nb: Any, tag: str) -> list[tuple[int, Any]]:
    return [
        (i, c) for i, c in enumerate(nb.cells) if tag in (c.get("metadata", {}).get("tags") or [])
    ]


def _literal_assignments(source: str, where: str) -> dict[str, Any]:
    """``name = literal`` statements of a cell -> ``{name: value}``; anything else is an error."""
    try:
        tree = ast.parse(source)
    except SyntaxError as err:
        raise ParameterError(f"{where}: cannot parse: {err}") from err
    values: dict[str, Any] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target, value = stmt.targets[0], stmt.value
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            target, value = stmt.target, stmt.value
        else:
            raise ParameterError(
                f"{where}, line {stmt.lineno}: expected `name = literal`, got "
                f"{ast.get_source_segment(source, stmt)!r}"
            )
        if not isinstance(target, ast.Name):
            raise ParameterError(f"{where}, line {stmt.lineno}: the target must be a plain name")
        try:
            values[target.id] = ast.literal_eval(value)
        except ValueError as err:
            raise ParameterError(
                f"{where}, line {stmt.lineno}: {target.id} must be a literal "
                f"(int, float, bool, str, None, list, tuple, dict), got "
                f"{ast.get_source_segment(source, value)!r}"
            ) from err
    return values


def chapter_parameters(path: Path, nb: Any = None) -> dict[str, Any]:
    """The book parameters of a chapter: its ``parameters`` cell, ``{name: value}``."""
    nb = nb if nb is not None else _read(path)
    cells = _tagged_cells(nb, "parameters")
    if len(cells) != 1:
        raise ParameterError(
            f"{path.name}: expected exactly one cell tagged 'parameters', found {len(cells)}"
        )
    return _literal_assignments(cells[0][1].source, f"{path.name} parameters cell")


def chapter_smoke(path: Path, nb: Any = None) -> dict[str, Any]:
    """The smoke overrides of a chapter: the ``SMOKE`` dict of its ``smoke`` cell."""
    nb = nb if nb is not None else _read(path)
    cells = _tagged_cells(nb, "smoke")
    if len(cells) != 1:
        raise ParameterError(
            f"{path.name}: expected exactly one cell tagged 'smoke', found {len(cells)}"
        )
    # the lab switch (attention_atlas.lab.apply_smoke) may follow SMOKE; blanked, lines kept
    source = _SMOKE_SWITCH.sub("", cells[0][1].source)
    values = _literal_assignments(source, f"{path.name} smoke cell")
    if set(values) != {"SMOKE"} or not isinstance(values["SMOKE"], dict):
        raise ParameterError(
            f"{path.name} smoke cell: expected exactly `SMOKE = {{name: literal, ...}}`, "
            f"got names {sorted(values)}"
        )
    return dict(values["SMOKE"])


def _type_name(value: Any) -> str:
    """``int``, ``list[int]``, ``dict`` ... for messages."""
    if isinstance(value, list | tuple) and value:
        kinds = {_type_name(v) for v in value}
        inner = kinds.pop() if len(kinds) == 1 else "Any"
        return f"{type(value).__name__}[{inner}]"
    return type(value).__name__


def _conforms(value: Any, default: Any) -> bool:
    """Whether ``value`` may replace ``default`` (same type; int for float allowed)."""
    if default is None:
        return True
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    if isinstance(default, float):
        return isinstance(value, int | float)
    if isinstance(default, list | tuple):
        if not isinstance(value, type(default)):
            return False
        kinds = {type(v) for v in default}
        if len(kinds) == 1 and default:  # homogeneous default: check the elements too
            proto = default[0]
            return all(_conforms(v, proto) for v in value)
        return True
    return isinstance(value, type(default))


def validate_parameters(
    declared: Mapping[str, Any], overrides: Mapping[str, Any], *, chapter: str, source: str
) -> dict[str, Any]:
    """Check ``overrides`` against the ``declared`` parameters; return them (ints for floats
    converted). Raises :class:`ParameterError` naming the parameter and the expected type."""
    unknown = sorted(set(overrides) - set(declared))
    if unknown:
        raise ParameterError(
            f"{chapter}: unknown parameter(s) {unknown} in {source}; "
            f"the chapter declares: {', '.join(sorted(declared)) or '(none)'}"
        )
    checked: dict[str, Any] = {}
    for name, value in overrides.items():
        default = declared[name]
        if not _conforms(value, default):
            raise ParameterError(
                f"{chapter}: parameter {name!r} in {source} expects {_type_name(default)} "
                f"(book value {default!r}), got {_type_name(value)} {value!r}"
            )
        if isinstance(default, float) and isinstance(value, int):
            value = float(value)
        checked[name] = value
    return checked


def parse_override(text: str) -> tuple[str, Any]:
    """``"key=value"`` -> ``(key, value)``; the value is a Python literal, or a plain string."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key.isidentifier():
        raise ParameterError(f"-p expects key=value with a Python name as key, got {text!r}")
    try:
        value = ast.literal_eval(raw.strip())
    except (ValueError, SyntaxError):
        value = raw  # a bare word: a string
    return key, value


# -- execution ---------------------------------------------------------------------------------


@dataclass
class ChapterResult:
    """What :func:`run_chapters` reports for one chapter."""

    chapter: str
    source: Path
    output: Path
    parameters: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    error: Exception | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def _source_line(path: Path, cell_source: str) -> int | None:
    """1-based line of ``path`` where a cell's first non-blank line is, if found."""
    lines = cell_source.splitlines()
    first = next((i for i, ln in enumerate(lines) if ln.strip()), None)
    if first is None:
        return None
    text = path.read_text()
    at = text.find(cell_source.strip("\n"))  # the whole cell: unambiguous
    if at >= 0:
        return text[:at].count("\n") + 1
    for i, line in enumerate(text.splitlines(), start=1):  # e.g. magics jupytext commented out
        if line == lines[first]:
            return i
    return None


def output_path(path: Path, *, smoke: bool, out_dir: Path | None = None) -> Path:
    """Where the executed notebook of chapter ``path`` goes:
    ``<out_dir or <repo>/_build/executed/{smoke,book}>/<stem>.ipynb``."""
    if out_dir is None:
        out_dir = repo_root(path.parent) / "_build" / "executed" / ("smoke" if smoke else "book")
    return out_dir / f"{path.stem}.ipynb"


def run_chapter(
    name: str | Path,
    *,
    smoke: bool = False,
    out_dir: Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    progress_bar: bool = False,
    log_output: bool = False,
    timeout: float | None = None,
    cwd: Path | None = None,
) -> ChapterResult:
    """Execute one chapter and write ``<out_dir>/<stem>.ipynb``.

    Args:
        name: stem, file name or path of the chapter.
        smoke: inject the chapter's ``SMOKE`` values (then ``overrides`` on top).
        out_dir: default ``<repo>/_build/executed/{smoke,book}``.
        overrides: parameter values, checked against the ``parameters`` cell before execution.
        timeout: seconds allowed per cell (None: no limit).
        cwd: working directory of the kernel (default: the chapter's folder, as the book uses).

    Raises:
        ParameterError: an override or SMOKE value the chapter does not declare, or of the
            wrong type (nothing is executed).
        ChapterFailed: a cell raised; the message names the chapter, cell and source line.
    """
    import papermill
    from papermill.exceptions import PapermillExecutionError

    path = resolve_chapter(name)
    nb = _read(path)
    declared = chapter_parameters(path, nb)
    params: dict[str, Any] = {}
    if smoke:
        params.update(
            validate_parameters(
                declared, chapter_smoke(path, nb), chapter=path.stem, source="SMOKE"
            )
        )
    if overrides:
        params.update(validate_parameters(declared, overrides, chapter=path.stem, source="-p"))
    out = output_path(path, smoke=smoke, out_dir=out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    os.environ[HEADLESS_ENV] = "1"  # inherited by the kernel: no widgets, static figures
    engine_kwargs: dict[str, Any] = {}
    if timeout is not None:
        engine_kwargs["execution_timeout"] = timeout
    result = ChapterResult(path.stem, path, out, params)
    t0 = time.perf_counter()
    try:
        papermill.execute_notebook(
            nb,
            str(out),
            parameters=params,
            kernel_name="python3",
            language="python",
            cwd=str(cwd or path.parent),
            progress_bar=progress_bar,
            log_output=log_output,
            **engine_kwargs,
        )
    except PapermillExecutionError as err:
        result.seconds = time.perf_counter() - t0
        # papermill's cell_index counts the injected-parameters cell; find the cell by source
        line = _source_line(path, err.source)
        cell = next(
            (i for i, c in enumerate(nb.cells) if c.cell_type == "code" and c.source == err.source),
            None,
        )
        # 1-based, counting every cell of the chapter (markdown too), as a reader counts them
        where = f"cell {cell + 1}" if cell is not None else f"cell {err.cell_index}"
        if line is not None:
            where += f" ({path.name}, line {line})"
        first = next((ln for ln in err.source.splitlines() if ln.strip()), "")
        tb = _ANSI.sub("", "\n".join(err.traceback))
        raise ChapterFailed(
            f"chapter {path.stem} failed in {where}: {err.ename}: {err.evalue}\n"
            f"  cell begins: {first}\n  executed notebook: {out}\n{tb}",
            chapter=path.stem,
            cell=None if cell is None else cell + 1,
            line=line,
        ) from None
    result.seconds = time.perf_counter() - t0
    return result


def run_chapters(
    names: Sequence[str | Path] | None = None,
    *,
    smoke: bool = False,
    out_dir: Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    jobs: int = 1,
    timeout: float | None = None,
    progress_bar: bool = False,
) -> list[ChapterResult]:
    """Run several chapters (default: all), ``jobs`` kernels at a time; never raises for a
    failed chapter: each :class:`ChapterResult` carries its error.

    Parameters of every chapter are validated before any chapter starts.
    """
    paths = [resolve_chapter(n) for n in names] if names else chapters()
    for p in paths:  # fail fast on bad parameters, before executing anything
        nb = _read(p)
        declared = chapter_parameters(p, nb)
        if smoke:
            validate_parameters(declared, chapter_smoke(p, nb), chapter=p.stem, source="SMOKE")
        if overrides:
            validate_parameters(declared, overrides, chapter=p.stem, source="-p")
    if jobs > 1 and "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // jobs))

    def one(p: Path) -> ChapterResult:
        try:
            return run_chapter(
                p,
                smoke=smoke,
                out_dir=out_dir,
                overrides=overrides,
                timeout=timeout,
                progress_bar=progress_bar and jobs == 1,
            )
        except Exception as err:  # reported per chapter
            return ChapterResult(p.stem, p, output_path(p, smoke=smoke, out_dir=out_dir), error=err)

    if jobs <= 1 or len(paths) <= 1:
        return [one(p) for p in paths]
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(one, paths))


# -- command line ------------------------------------------------------------------------------


def _cmd_run(args: argparse.Namespace) -> int:
    overrides = dict(parse_override(t) for t in args.param)
    try:
        results = run_chapters(
            args.names or None,
            smoke=args.smoke,
            out_dir=Path(args.out) if args.out else None,
            overrides=overrides,
            jobs=args.jobs,
            timeout=args.timeout,
            progress_bar=not args.quiet,
        )
    except (ParameterError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    failed = 0
    for r in results:
        if r.ok:
            print(f"ok      {r.chapter}  {r.seconds:6.1f} s  -> {r.output}")
        else:
            failed += 1
            print(f"FAILED  {r.chapter}\n{r.error}", file=sys.stderr)
    if failed:
        print(f"{failed} of {len(results)} chapter(s) failed", file=sys.stderr)
        return 1
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    for p in chapters():
        nb = _read(p)
        print(f"{p.stem}")
        smoke = chapter_smoke(p, nb) if _tagged_cells(nb, "smoke") else {}
        for k, v in chapter_parameters(p, nb).items():
            extra = f"   (smoke: {smoke[k]!r})" if k in smoke else ""
            print(f"    {k} = {v!r}{extra}")
    return 0


def add_subcommand(subparsers: Any) -> None:
    """Register ``notebooks {run,list}`` on an argparse subparsers object."""
    p = subparsers.add_parser("notebooks", help="run the book's chapters headlessly")
    sub = p.add_subparsers(dest="notebooks_command", required=True)
    run = sub.add_parser(
        "run",
        help="execute chapters with papermill and write the executed .ipynb",
        description="Execute chapters (default: every notebooks/*.py) and write executed "
        "notebooks to --out (default _build/executed/{smoke,book}/).",
    )
    run.add_argument("names", nargs="*", metavar="NAME", help="chapter stem or path")
    run.add_argument("--smoke", action="store_true", help="inject the chapter's SMOKE values")
    run.add_argument("--out", metavar="DIR", help="folder for the executed notebooks")
    run.add_argument(
        "-p",
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a parameter (value parsed as a Python literal); repeatable",
    )
    run.add_argument("-j", "--jobs", type=int, default=1, help="chapters run at once")
    run.add_argument("--timeout", type=float, default=None, help="seconds allowed per cell")
    run.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    run.set_defaults(func=_cmd_run)
    ls = sub.add_parser("list", help="list chapters with their parameters and smoke values")
    ls.set_defaults(func=_cmd_list)


def main(argv: Iterable[str] | None = None) -> int:
    """``python -m attention_atlas.notebooks ...`` (same as ``attention_atlas notebooks ...``)."""
    parser = argparse.ArgumentParser(prog="attention_atlas.notebooks")
    add_subcommand(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["notebooks", *(argv if argv is not None else sys.argv[1:])])
    return int(args.func(args))
