"""Which attention a report is about: a registered name, ``package.module:Class`` or
``path/to/file.py:Class``, loaded and registered so that every analysis can build it by name.

A report's cells may run in other processes (the sweep runner's workers, a Dask cluster), so a
cell carries the variant's *spec* (the string above, a file path made absolute) and loads it
again there with :func:`load_variant`; loading twice is harmless.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attention_atlas.attention import (
    Attention,
    attention_class,
    available_attention,
    register_attention,
    variant_fingerprint,
)
from attention_atlas.validate import InputError

__all__ = ["Variant", "VariantError", "canonical_spec", "load_variant"]

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
#: the prefix of the module name a variant's file is imported under
_FILE_MODULE = "atlas_user_"


class VariantError(InputError, ValueError):
    """The variant cannot be found, imported or is not an attention module (one line)."""


@dataclass(frozen=True)
class Variant:
    """A loaded variant.

    Attributes:
        name: the name it is registered (and built, and stored) under.
        spec: how it was asked for, canonical (a file path absolute).
        cls: the :class:`~attention_atlas.attention.base.Attention` subclass.
        builtin: one of the library's own variants.
        fingerprint: a hash of its module's source (``""`` for a built-in one).
    """

    name: str
    spec: str
    cls: type
    builtin: bool
    fingerprint: str

    @property
    def source(self) -> str:
        """Where its code is: ``module:Class`` (and the file when there is one)."""
        file = inspect.getsourcefile(self.cls) if _has_file(self.cls) else None
        where = f"{self.cls.__module__}:{self.cls.__qualname__}"
        return f"{where} ({file})" if file else where


def _has_file(cls: type) -> bool:
    try:
        return inspect.getsourcefile(cls) is not None
    except TypeError:
        return False


def canonical_spec(spec: str) -> str:
    """``spec`` with a file path made absolute (``path/x.py:Class`` -> ``/abs/path/x.py:Class``),
    so that another process, in another folder, finds the same file."""
    if not isinstance(spec, str) or not spec.strip():
        raise VariantError(
            "variant: expected a registered name, package.module:Class or path/to/file.py:Class, "
            f"got {spec!r}"
        )
    spec = spec.strip()
    where, sep, attr = spec.rpartition(":")
    if sep and where.endswith(".py"):
        return f"{Path(where).expanduser().resolve()}:{attr}"
    return spec


def _import_file(path: Path) -> Any:
    """Import the Python file ``path`` as a module named after its content's hash (so that two
    files called ``attention.py`` do not collide, and the same file is imported once)."""
    if not path.is_file():
        raise VariantError(
            f"variant: expected an existing .py file, got {str(path)!r} (no such file)"
        )
    digest = hashlib.sha256(str(path).encode() + path.read_bytes()).hexdigest()[:12]
    module_name = f"{_FILE_MODULE}{re.sub(r'[^0-9A-Za-z_]', '_', path.stem)}_{digest}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise VariantError(f"variant: cannot import {str(path)!r} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    before = sys.dont_write_bytecode
    sys.dont_write_bytecode = True  # no __pycache__ beside the reader's file
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[module_name]
        raise VariantError(
            f"variant: importing {str(path)!r} raised {type(e).__name__}: {e}"
        ) from e
    finally:
        sys.dont_write_bytecode = before
    return module


def load_variant(spec: str) -> Variant:
    """Find, import and register the variant ``spec`` and return it.

    Args:
        spec: a registered name (``"dot"``, or one your code registered with
            :func:`~attention_atlas.attention.register_attention`), ``"package.module:Class"``
            (importable from ``sys.path``) or ``"path/to/file.py:Class"``.

    The class must subclass :class:`~attention_atlas.attention.base.Attention` (its constructor
    takes ``dim`` and ``n_heads``). A class not yet registered is registered under its own
    ``name`` attribute when it has one, else its class name; a name the library already uses
    for another class is refused (rename the class or register it under another name).

    Raises:
        VariantError: one line naming what was expected and what came.
    """
    spec = canonical_spec(spec)
    where, sep, attr = spec.rpartition(":")
    if not sep:
        if spec not in available_attention():
            raise VariantError(
                f"variant: expected a registered name ({', '.join(available_attention())}), "
                f"package.module:Class or path/to/file.py:Class, got {spec!r}"
            )
        cls = attention_class(spec)
        return Variant(spec, spec, cls, _is_builtin(spec), variant_fingerprint(spec))
    if not where or not attr:
        raise VariantError(f"variant: expected module:Class with both parts, got {spec!r}")
    if where.endswith(".py"):
        module = _import_file(Path(where))
    else:
        try:
            module = importlib.import_module(where)
        except Exception as e:
            raise VariantError(
                f"variant: cannot import module {where!r} ({type(e).__name__}: {e}); is its "
                "folder on PYTHONPATH? A file works too: path/to/file.py:Class"
            ) from e
    found: Any = getattr(module, attr, None)
    if found is None:
        raise VariantError(f"variant: module {where!r} has no attribute {attr!r}")
    if not (isinstance(found, type) and issubclass(found, Attention)):
        what = found.__name__ if isinstance(found, type) else type(found).__name__
        raise VariantError(
            f"variant: expected a subclass of attention_atlas.attention.Attention, got "
            f"{where}:{attr} = {what}"
        )
    name = _register(found)
    return Variant(name, spec, found, _is_builtin(name), variant_fingerprint(name))


def _file(cls: type) -> str | None:
    try:
        return inspect.getsourcefile(cls)
    except TypeError:
        return None


def _is_builtin(name: str) -> bool:
    from attention_atlas.attention.registry import VARIANTS

    return name in VARIANTS


def _register(cls: type) -> str:
    """The name ``cls`` is registered under, registering it if it is not yet."""
    own = cls.__dict__.get("name")
    name = own if isinstance(own, str) and own else cls.__name__
    if not _NAME.match(name):
        raise VariantError(f"variant: expected a name of letters, digits and _, got {name!r}")
    if name in available_attention():
        known = attention_class(name)
        same = known is cls or (
            known.__module__ == cls.__module__ and known.__qualname__ == cls.__qualname__
        )
        by_file = all(c.__module__.startswith(_FILE_MODULE) for c in (known, cls))
        if not same and by_file and _file(known) is not None and _file(known) == _file(cls):
            raise VariantError(
                f"variant: {_file(cls)} changed after {name!r} was loaded from it in this "
                "process; run the report again (its stored cells are kept)"
            )
        if not same:
            raise VariantError(
                f"variant: the name {name!r} is taken by {known.__module__}:{known.__qualname__}; "
                f"rename {cls.__qualname__} or register it under another name"
            )
        return name
    register_attention(name)(cls)
    return name
