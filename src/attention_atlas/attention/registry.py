"""The attention registry: every attention variant, by name.

The built-in entries are the table below, written out in full: a name maps to the
``"module:attribute"`` that implements it, imported on first use (so ``import attention_atlas``
stays light and a missing module is an error, never silently skipped). A test imports every
entry and checks that no :class:`~attention_atlas.attention.base.Attention` subclass of the
package is left out.

Your own code can add entries at run time (a test, a notebook, a user's model)::

    @register_attention("my_attention")
    class MyAttention(Attention): ...

A built-in name cannot be taken again. ``"mixed"`` (heads split among variants, which it builds
by name through this registry) registers itself the same way, from
:mod:`attention_atlas.attention.mixed`, which the package front imports: a composite sits above
the registry it looks names up in. The training hooks (regularisers and diagnostics, which
take a model) are registered one layer up, in :mod:`attention_atlas.models.hooks`.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from torch import nn

if TYPE_CHECKING:
    from .base import Attention

__all__ = [
    "VARIANTS",
    "attention_class",
    "attention_options",
    "available_attention",
    "build_attention",
    "register_attention",
    "variant_fingerprint",
]

#: attention variant name -> "module:class"
VARIANTS: dict[str, str] = {
    "dot": "attention_atlas.attention.dot:DotProductAttention",
    "euclidean": "attention_atlas.attention.euclidean:EuclideanAttention",
    "matroidal": "attention_atlas.attention.matroidal:MatroidalAttention",
    "mahalanobis": "attention_atlas.attention.mahalanobis:MahalanobisAttention",
    "riemannian": "attention_atlas.attention.riemannian:RiemannianAttention",
    "fiber_bundle": "attention_atlas.attention.riemannian:FiberBundleAttention",
    "ssm": "attention_atlas.attention.sma.module:SSMAttention",
}

_ADDED_VARIANTS: dict[str, type[Attention]] = {}


def resolve(target: str) -> Any:
    """Import ``"module:attribute"`` and return the attribute."""
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def unknown(kind: str, name: str, known: list[str]) -> ValueError:
    return ValueError(f"unknown {kind} {name!r}; known: {', '.join(known) or '(none)'}")


# -- attention variants -----------------------------------------------------------------------

A = TypeVar("A", bound="type[Attention]")


def register_attention(name: str) -> Callable[[A], A]:
    """Class decorator: make a variant of your own buildable by ``build_attention(name, ...)``."""

    def deco(cls: A) -> A:
        if name in VARIANTS or (name in _ADDED_VARIANTS and _ADDED_VARIANTS[name] is not cls):
            raise ValueError(f"attention variant {name!r} is already registered")
        cls.name = name
        _ADDED_VARIANTS[name] = cls
        return cls

    return deco


def available_attention() -> list[str]:
    """Names of every variant (built-in and registered), sorted."""
    return sorted({*VARIANTS, *_ADDED_VARIANTS})


def variant_fingerprint(name: str) -> str:
    """A hash of the source of an added variant's module (``""`` for a built-in one, whose code
    the library's own hash covers): a run memoised for a variant of your own is reused only by
    the code that made it."""
    import hashlib

    if name not in _ADDED_VARIANTS:
        attention_class(name)  # an unknown name: the usual error
        return ""
    cls = _ADDED_VARIANTS[name]
    try:
        source = inspect.getsource(inspect.getmodule(cls) or cls)
    except (OSError, TypeError):  # defined in a notebook cell or an interactive session
        source = inspect.getsource(cls) if _has_source(cls) else repr(sorted(vars(cls)))
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def _has_source(cls: type) -> bool:
    try:
        inspect.getsource(cls)
    except (OSError, TypeError):
        return False
    return True


def attention_class(name: str) -> type[Attention]:
    """The class of variant ``name``."""
    if name in _ADDED_VARIANTS:
        return _ADDED_VARIANTS[name]
    if name not in VARIANTS:
        raise unknown("attention variant", name, available_attention())
    cls: type[Attention] = resolve(VARIANTS[name])
    return cls


def attention_options(name: str) -> dict[str, inspect.Parameter]:
    """Every keyword option of a variant's constructor (following ``**kwargs`` up the MRO)."""
    from .base import Attention

    opts: dict[str, inspect.Parameter] = {}
    for klass in attention_class(name).__mro__:
        if klass is nn.Module or not issubclass(klass, Attention):
            continue
        params = [p for p in inspect.signature(klass.__init__).parameters.values()]
        for p in params[1:]:  # skip self
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
                opts.setdefault(p.name, p)
        if not any(p.kind == p.VAR_KEYWORD for p in params):
            break
    return opts


def build_attention(name: str, **config: Any) -> Attention:
    """Build an attention variant by name.

    Args:
        name: see :func:`available_attention`.
        **config: constructor options of that variant (``dim`` and ``n_heads`` always).

    Raises:
        ValueError: unknown name (the message lists the known ones), an option the variant
            does not take (the message lists those it takes) or a required option missing.
    """
    cls = attention_class(name)
    opts = attention_options(name)
    unknown = sorted(set(config) - set(opts))
    if unknown:
        raise ValueError(
            f"attention variant {name!r} does not take option(s) {unknown}; "
            f"it takes: {', '.join(sorted(opts))}"
        )
    missing = [
        n for n, p in opts.items() if p.default is inspect.Parameter.empty and n not in config
    ]
    if missing:
        raise ValueError(f"attention variant {name!r} needs option(s) {missing}")
    return cls(**config)
