"""Checks of configurations before any work starts: constrained field types for the config
dataclasses, and :class:`ConfigError`, whose message is one line naming the setting, what was
expected and what was given.

A config dataclass states its ranges in its annotations (``steps: PositiveInt = 1000``); the
types below are plain ``int``/``float`` to the type checker and at run time, and carry
:mod:`annotated_types` constraints that :func:`check_fields` enforces with pydantic (imported
only when a check runs)::

    check_fields(TrainConfig(batch_size=0), "train")
    # ConfigError: train setting batch_size: expected an integer >= 1, got 0
"""

from __future__ import annotations

import difflib
import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import fields, is_dataclass
from functools import cache
from pathlib import Path
from typing import Annotated, Any, TypeVar

from annotated_types import Ge, Gt, Le, Lt

__all__ = [
    "check_count",
    "check_number",
    "check_output_path",
    "check_device",
    "ConfigError",
    "Fraction",
    "InputError",
    "NonNegativeFloat",
    "NonNegativeInt",
    "PositiveFloat",
    "PositiveInt",
    "Probability",
    "check_fields",
    "close_matches",
    "from_mapping",
    "is_number",
    "one_line",
]

PositiveInt = Annotated[int, Ge(1)]
NonNegativeInt = Annotated[int, Ge(0)]
PositiveFloat = Annotated[float, Gt(0), Lt(math.inf)]  # finite and > 0
NonNegativeFloat = Annotated[float, Ge(0), Lt(math.inf)]  # finite and >= 0
Probability = Annotated[float, Ge(0), Le(1)]  # in [0, 1]
Fraction = Annotated[float, Ge(0), Lt(1)]  # in [0, 1): dropout, Adam's betas

T = TypeVar("T")


def is_number(value: Any) -> bool:
    """Whether ``value`` is a finite int or float (a bool is not a number here)."""
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


def check_count(name: str, value: Any, least: int = 1) -> None:
    """``value`` an integer >= ``least``, else :class:`ConfigError` ("name: expected an integer
    >= least, got value")."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ConfigError(f"{name}: expected an integer >= {least}, got {value!r}")


def check_number(name: str, value: Any, *, zero: bool = False, high: float | None = None) -> None:
    """``value`` a finite number > 0 (>= 0 with ``zero``; in ``[0, high]`` with ``high``), else
    :class:`ConfigError` ("name: expected a finite number > 0, got value")."""
    ok = is_number(value) and (value >= 0 if zero or high is not None else value > 0)
    if not ok or (high is not None and value > high):
        span = f"{'>= 0' if zero else '> 0'}" if high is None else f"in [0, {high:g}]"
        raise ConfigError(f"{name}: expected a finite number {span}, got {value!r}")


class InputError(Exception):
    """Bad input from the user: the command line reports it in one line and exits with 2."""


class ConfigError(InputError, ValueError):
    """A setting (of a command, a config file or a config object) outside its type, range or
    relations, or naming something that does not exist. The message is one line."""


def check_device(device: str | None, label: str) -> None:
    """Raise :class:`ConfigError` (``"<label>: ..."``, one line) unless ``device`` (None: the
    default) names a torch device this machine has."""
    import torch

    if device is None:
        return
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise ConfigError(
            f"{label}: expected a torch device such as 'cpu' or 'cuda:0', got {device!r}"
        ) from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"{label}: {device!r} asked for, but CUDA is not available")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ConfigError(
            f"{label}: {device!r} asked for, but there are only "
            f"{torch.cuda.device_count()} CUDA device(s)"
        )


def one_line(text: object, limit: int = 1000) -> str:
    """``text`` on one line (whitespace runs collapsed), cut to ``limit`` characters."""
    s = " ".join(str(text).split())
    return s if len(s) <= limit else s[: limit - 3] + "..."


def close_matches(word: str, known: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the closest known names, or ``""``."""
    near = difflib.get_close_matches(word, list(known), n=2, cutoff=0.6)
    return f"; did you mean {' or '.join(repr(n) for n in near)}?" if near else ""


@cache
def _adapter(cls: type) -> Any:
    from pydantic import TypeAdapter

    return TypeAdapter(cls)


def _expected(err: Mapping[str, Any]) -> str:
    """What a pydantic error says was expected, in this project's words."""
    kind, ctx, given = err["type"], err.get("ctx") or {}, err.get("input")
    nonfinite = isinstance(given, float) and not math.isfinite(given)
    if isinstance(given, str) and given.strip().lower() in ("nan", "inf", "-inf", "infinity"):
        nonfinite = True
    if kind in ("less_than", "less_than_equal") and nonfinite:
        return "expected a finite number"
    if kind.startswith("int_"):
        bound = f" >= {ctx['ge']}" if "ge" in ctx else ""
        return f"expected an integer{bound}"
    words = {
        "greater_than_equal": lambda: f"expected a value >= {ctx.get('ge')}",
        "greater_than": lambda: f"expected a value > {ctx.get('gt')}",
        "less_than_equal": lambda: f"expected a value <= {ctx.get('le')}",
        "less_than": lambda: f"expected a value < {ctx.get('lt')}",
        "float_parsing": lambda: "expected a number",
        "float_type": lambda: "expected a number",
        "bool_parsing": lambda: "expected true or false",
        "bool_type": lambda: "expected true or false",
        "string_type": lambda: "expected a string",
        "list_type": lambda: "expected a list",
        "dict_type": lambda: "expected a mapping",
    }
    if kind in words:
        return words[kind]()
    msg = str(err.get("msg", kind))
    return "expected " + msg[0].lower() + msg[1:] if msg.startswith("Input should") else msg


def _message(section: str, err: Mapping[str, Any]) -> str:
    loc = ".".join(str(p) for p in err.get("loc", ()))
    if err["type"] == "value_error":  # raised by the dataclass's own __post_init__
        msg = str(err.get("msg", "")).removeprefix("Value error, ")
        return f"{section} settings: {msg}"
    return f"{section} setting {loc}: {_expected(err)}, got {err.get('input')!r}"


def from_mapping(cls: type[T], values: Mapping[str, Any], section: str) -> T:
    """An instance of the config dataclass ``cls`` from ``values``, every field checked against
    its annotation (types and ranges); unknown keys and bad values raise :class:`ConfigError`."""
    from pydantic import ValidationError

    if not isinstance(values, Mapping):
        raise ConfigError(f"{section} settings must be a mapping, got {type(values).__name__}")
    names = [f.name for f in fields(cls)]  # type: ignore[arg-type]
    unknown = [k for k in values if k not in names]
    if unknown:
        raise ConfigError(
            f"unknown {section} setting {unknown[0]!r}{close_matches(str(unknown[0]), names)} "
            f"(known: {', '.join(names)})"
        )
    for k, v in values.items():  # pydantic's lax mode reads True as 1: not for an int setting
        if isinstance(v, bool) and _wants_number(cls, k):
            raise ConfigError(f"{section} setting {k}: expected a number, got {v!r}")
    try:
        out: T = _adapter(cls).validate_python(dict(values))  # type: ignore[arg-type]
    except ValidationError as err:
        raise ConfigError("; ".join(_message(section, e) for e in err.errors()[:3])) from None
    return out


_NUMERIC = {"int", "float", *(n for n in __all__ if n[0].isupper() and n != "ConfigError")}


def _wants_number(cls: type, name: str) -> bool:
    """Whether field ``name`` of ``cls`` is a number (and not also a bool)."""
    annotation = next(str(f.type) for f in fields(cls) if f.name == name)  # type: ignore[arg-type]
    words = set(re.findall(r"\w+", annotation))
    return bool(words & _NUMERIC) and "bool" not in words


def check_fields(obj: Any, section: str, cls: type | None = None) -> None:
    """Check every field of the config dataclass instance ``obj`` against the annotations of
    ``cls`` (default: its own class); raise :class:`ConfigError` naming the first bad ones."""
    cls = cls or type(obj)
    if not is_dataclass(cls):
        raise TypeError(f"check_fields needs a dataclass, got {cls.__name__}")
    from_mapping(cls, {f.name: getattr(obj, f.name) for f in fields(cls)}, section)


#: file systems nothing is written to (kernel interfaces)
_SPECIAL_ROOTS = ("/proc", "/sys", "/dev")


def check_output_path(path: str | os.PathLike[str], option: str, *, folder: bool) -> None:
    """``path`` can be written (a folder with ``folder``, else a file): it is not an existing
    path of the other kind, no part above it is a file, it is not under ``/proc``, ``/sys`` or
    ``/dev``, and its nearest existing folder is writable; else :class:`ConfigError` naming
    ``option``. Nothing is created."""
    target = Path(path).expanduser()
    if target.exists() and target.is_dir() != folder:
        kind, want = ("a file", "a folder") if folder else ("a folder", "a file name")
        raise ConfigError(f"{option}: {path} is {kind}, expected {want}")
    absolute = Path(os.path.abspath(target))
    if any(absolute == Path(r) or Path(r) in absolute.parents for r in _SPECIAL_ROOTS):
        raise ConfigError(f"{option}: {path} is under {absolute.parts[0]}{absolute.parts[1]}, "
                          "where nothing is written")  # fmt: skip
    above = absolute.parent if not target.exists() else absolute
    while not above.exists():
        above = above.parent
    if not above.is_dir():
        raise ConfigError(f"{option}: {path} is under {above}, which is a file")
    if not os.access(above, os.W_OK | os.X_OK):
        raise ConfigError(f"{option}: {above} is not writable (for {path})")
