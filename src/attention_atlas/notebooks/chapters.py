"""Where the chapters are, and their parameters: the ``parameters`` cell (book values), the
``SMOKE`` dict of the ``smoke`` cell, and the checks of overrides against them."""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from attention_atlas.validate import InputError

#: the two lines of the JupyterLab SMOKE switch that may follow ``SMOKE = {...}``
_SMOKE_SWITCH = re.compile(
    r"^(from attention_atlas\.notebooks\.lab import apply_smoke|apply_smoke\(SMOKE, globals\(\)\))[ \t]*(#.*)?$",
    re.M,
)

__all__ = [
    "ParameterError",
    "chapter_parameters",
    "chapter_smoke",
    "chapters",
    "notebooks_dir",
    "parse_override",
    "read_chapter",
    "repo_root",
    "resolve_chapter",
    "tagged_cells",
    "validate_parameters",
]


class ParameterError(InputError, ValueError):
    """A parameter override that the chapter does not declare, or of the wrong type."""


# -- where things are --------------------------------------------------------------------------


def repo_root(start: Path | None = None) -> Path:
    """The project root: the first folder above ``start`` (default: cwd) with ``notebooks/``
    and ``pyproject.toml``; else the checkout this package was installed from."""
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        if (d / "notebooks").is_dir() and (d / "pyproject.toml").is_file():
            return d
    pkg_root = Path(__file__).resolve().parents[3]
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


def read_chapter(path: Path) -> Any:
    """A chapter source read by jupytext (py:percent)."""
    import jupytext

    return jupytext.read(path, fmt="py:percent")


def tagged_cells(nb: Any, tag: str) -> list[tuple[int, Any]]:
    """``(index, cell)`` of every cell of ``nb`` tagged ``tag``."""
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
    nb = nb if nb is not None else read_chapter(path)
    cells = tagged_cells(nb, "parameters")
    if len(cells) != 1:
        raise ParameterError(
            f"{path.name}: expected exactly one cell tagged 'parameters', found {len(cells)}"
        )
    return _literal_assignments(cells[0][1].source, f"{path.name} parameters cell")


def chapter_smoke(path: Path, nb: Any = None) -> dict[str, Any]:
    """The smoke overrides of a chapter: the ``SMOKE`` dict of its ``smoke`` cell."""
    nb = nb if nb is not None else read_chapter(path)
    cells = tagged_cells(nb, "smoke")
    if len(cells) != 1:
        raise ParameterError(
            f"{path.name}: expected exactly one cell tagged 'smoke', found {len(cells)}"
        )
    # the lab switch (attention_atlas.notebooks.lab.apply_smoke) may follow SMOKE; blanked, lines kept
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
