"""The registry is explicit and complete: every entry imports, and every attention variant
class of the package has an entry."""

from __future__ import annotations

import inspect
import pkgutil
import subprocess
import sys

import pytest

import attention_atlas
from attention_atlas.attention import Attention
from attention_atlas.attention.registry import (
    VARIANTS,
    attention_class,
    available_attention,
    build_attention,
)
from attention_atlas.models.hooks import (
    DIAGNOSTICS,
    REGULARIZERS,
    get_diagnostic,
    get_regularizer,
    register_diagnostic,
    register_regularizer,
)


@pytest.mark.parametrize("name", [*VARIANTS, "mixed"])
def test_every_variant_entry_imports_and_carries_its_name(name: str) -> None:
    cls = attention_class(name)
    assert issubclass(cls, Attention)
    assert cls.name == name


@pytest.mark.parametrize("name", sorted(REGULARIZERS))
def test_every_regularizer_entry_imports(name: str) -> None:
    fn, needs_weights = get_regularizer(name)
    assert callable(fn) and isinstance(needs_weights, bool)


@pytest.mark.parametrize("name", sorted(DIAGNOSTICS))
def test_every_diagnostic_entry_imports(name: str) -> None:
    assert callable(get_diagnostic(name))


def test_every_attention_class_of_the_package_is_registered() -> None:
    """Import every module of the package; each concrete Attention subclass defined there
    (not private, with its own ``name``) must be the class its name resolves to."""
    found: dict[str, type] = {}
    for mod in pkgutil.walk_packages(attention_atlas.__path__, "attention_atlas."):
        if mod.name.endswith("__main__"):
            continue
        module = __import__(mod.name, fromlist=["_"])
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if (
                issubclass(obj, Attention)
                and obj is not Attention
                and obj.__module__ == module.__name__
                and not obj.__name__.startswith("_")
                and "name" in vars(obj)
            ):
                found[obj.name] = obj
    assert found, "no attention variant found in the package"
    missing = sorted(set(found) - set(available_attention()))
    assert not missing, f"variants without a registry entry: {missing}"
    for name, cls in found.items():
        assert attention_class(name) is cls, f"{name!r} resolves to another class"


def test_unknown_names_list_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown attention variant 'nosuch'; known: .*dot"):
        build_attention("nosuch", dim=8, n_heads=2)
    with pytest.raises(ValueError, match="unknown regularizer 'nosuch'; known: .*cofactor"):
        get_regularizer("nosuch")
    with pytest.raises(ValueError, match="unknown diagnostic 'nosuch'; known: .*cofactor"):
        get_diagnostic("nosuch")


def test_built_in_names_cannot_be_taken_again() -> None:
    with pytest.raises(ValueError, match="already registered"):
        register_regularizer("cofactor")(lambda *a, **k: None)
    with pytest.raises(ValueError, match="already registered"):
        register_diagnostic("fiber_bundle")(lambda *a, **k: {})


#: options a variant needs beyond dim and n_heads
EXTRA = {"mixed": {"groups": [{"name": "dot", "heads": 1}, {"name": "euclidean", "heads": 1}]}}


@pytest.mark.parametrize("name", [*VARIANTS, "mixed"])
def test_a_fresh_interpreter_builds_every_variant_by_name(name: str) -> None:
    options = EXTRA.get(name, {})
    code = (
        "from attention_atlas import build_attention; "
        f"m = build_attention({name!r}, dim=32, n_heads=2, **{options!r}); "
        "print(type(m).__name__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == attention_class(name).__name__


def test_available_attention_lists_every_built_in() -> None:
    assert set(VARIANTS) <= set(available_attention())
