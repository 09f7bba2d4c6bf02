"""Executing chapters with papermill: one (:func:`run_chapter`) or several at a time
(:func:`run_chapters`), with book or smoke parameters."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .chapters import (
    chapter_parameters,
    chapter_smoke,
    chapters,
    read_chapter,
    repo_root,
    resolve_chapter,
    validate_parameters,
)

__all__ = [
    "HEADLESS_ENV",
    "ChapterFailed",
    "ChapterResult",
    "output_path",
    "run_chapter",
    "run_chapters",
]

#: Environment variable set for every headless execution (this runner, ``make book``, the tests).
#: :func:`attention_atlas.viz.is_interactive` reads it: widgets are built only when it is unset.
HEADLESS_ENV = "ATTENTION_ATLAS_HEADLESS"

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class ChapterFailed(RuntimeError):
    """A chapter raised while executing (for example a failing ``assert``)."""

    def __init__(self, message: str, *, chapter: str, cell: int | None, line: int | None) -> None:
        super().__init__(message)
        self.chapter = chapter
        self.cell = cell
        self.line = line


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
    nb = read_chapter(path)
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
        raise _chapter_failed(err, path, nb, out) from None
    result.seconds = time.perf_counter() - t0
    return result


def _chapter_failed(err: Any, path: Path, nb: Any, out: Path) -> ChapterFailed:
    """A papermill execution error as :class:`ChapterFailed`, naming the chapter's cell (1-based,
    counting every cell, markdown too, as a reader counts them) and its source line."""
    # papermill's cell_index counts the injected-parameters cell; find the cell by source
    line = _source_line(path, err.source)
    cell = next(
        (i for i, c in enumerate(nb.cells) if c.cell_type == "code" and c.source == err.source),
        None,
    )
    where = f"cell {cell + 1}" if cell is not None else f"cell {err.cell_index}"
    if line is not None:
        where += f" ({path.name}, line {line})"
    first = next((ln for ln in err.source.splitlines() if ln.strip()), "")
    tb = _ANSI.sub("", "\n".join(err.traceback))
    return ChapterFailed(
        f"chapter {path.stem} failed in {where}: {err.ename}: {err.evalue}\n"
        f"  cell begins: {first}\n  executed notebook: {out}\n{tb}",
        chapter=path.stem,
        cell=None if cell is None else cell + 1,
        line=line,
    )


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
        nb = read_chapter(p)
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
