"""The one registry: every attention variant, regulariser and diagnostic, by name.

The built-in entries are the three tables below, written out in full: a name maps to the
``"module:attribute"`` that implements it, imported on first use (so ``import attention_atlas``
stays light and a missing module is an error, never silently skipped). A test imports every
entry and checks that no :class:`~attention_atlas.attention.base.Attention` subclass of the
package is left out.

Your own code can add entries at run time (a test, a notebook, a user's model)::

    @register_attention("my_attention")
    class MyAttention(Attention): ...

    @register_regularizer("my_penalty", needs_weights=True)
    def my_penalty(model, output, batch, **options) -> Tensor: ...   # scalar, added to the loss

    @register_diagnostic("my_stat")
    def my_stat(model, output, batch, **options) -> dict[str, float]: ...  # logged at log steps

A built-in name cannot be taken again.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from torch import nn

if TYPE_CHECKING:
    from torch import Tensor

    from .base import Attention

__all__ = [
    "DIAGNOSTICS",
    "REGULARIZERS",
    "VARIANTS",
    "attention_class",
    "attention_options",
    "available_attention",
    "available_diagnostics",
    "available_regularizers",
    "build_attention",
    "get_diagnostic",
    "get_regularizer",
    "register_attention",
    "register_diagnostic",
    "register_regularizer",
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
    "mixed": "attention_atlas.attention.mixed:MixedHeadAttention",
}

#: regulariser name -> ("module:function", needs_weights). The function is
#: ``fn(model, output, batch, **options) -> Tensor`` (a scalar added to the loss, times the
#: spec's ``weight``); with ``needs_weights`` the training forward runs with
#: ``need_weights=True`` so that ``output.attentions[l].probs`` exist.
REGULARIZERS: dict[str, tuple[str, bool]] = {
    "cofactor": ("attention_atlas.cofactor.penalty:regularizer", False),
    "fiber_bundle": (
        "attention_atlas.attention.riemannian.regularizers:fiber_bundle_regularizer",
        False,
    ),
}

#: diagnostic name -> "module:function"; ``fn(model, output, batch, **options) -> dict[str,
#: float]``, called at each log step (eval mode, no grad) with ``need_weights=True``.
DIAGNOSTICS: dict[str, str] = {
    "cofactor": "attention_atlas.cofactor.diagnostics:diagnostic",
    "fiber_bundle": "attention_atlas.attention.riemannian.diagnostics:fiber_bundle_diagnostic",
}

Regularizer = Callable[..., "Tensor"]
Diagnostic = Callable[..., dict[str, float]]

_ADDED_VARIANTS: dict[str, type[Attention]] = {}
_ADDED_REGULARIZERS: dict[str, tuple[Regularizer, bool]] = {}
_ADDED_DIAGNOSTICS: dict[str, Diagnostic] = {}


def _resolve(target: str) -> Any:
    """Import ``"module:attribute"`` and return the attribute."""
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def _unknown(kind: str, name: str, known: list[str]) -> ValueError:
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


def attention_class(name: str) -> type[Attention]:
    """The class of variant ``name``."""
    if name in _ADDED_VARIANTS:
        return _ADDED_VARIANTS[name]
    if name not in VARIANTS:
        raise _unknown("attention variant", name, available_attention())
    cls: type[Attention] = _resolve(VARIANTS[name])
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


# -- regularisers and diagnostics -------------------------------------------------------------


def register_regularizer(
    name: str, *, needs_weights: bool = False
) -> Callable[[Regularizer], Regularizer]:
    """Decorator: add a regulariser of your own (see :data:`REGULARIZERS` for the call)."""

    def deco(fn: Regularizer) -> Regularizer:
        taken = _ADDED_REGULARIZERS.get(name)
        if name in REGULARIZERS or (taken is not None and taken[0] is not fn):
            raise ValueError(f"regularizer {name!r} is already registered")
        _ADDED_REGULARIZERS[name] = (fn, needs_weights)
        return fn

    return deco


def register_diagnostic(name: str) -> Callable[[Diagnostic], Diagnostic]:
    """Decorator: add a diagnostic of your own (see :data:`DIAGNOSTICS` for the call)."""

    def deco(fn: Diagnostic) -> Diagnostic:
        if name in DIAGNOSTICS or _ADDED_DIAGNOSTICS.get(name, fn) is not fn:
            raise ValueError(f"diagnostic {name!r} is already registered")
        _ADDED_DIAGNOSTICS[name] = fn
        return fn

    return deco


def available_regularizers() -> list[str]:
    return sorted({*REGULARIZERS, *_ADDED_REGULARIZERS})


def available_diagnostics() -> list[str]:
    return sorted({*DIAGNOSTICS, *_ADDED_DIAGNOSTICS})


def get_regularizer(name: str) -> tuple[Regularizer, bool]:
    """``(fn, needs_weights)`` of regulariser ``name``."""
    if name in _ADDED_REGULARIZERS:
        return _ADDED_REGULARIZERS[name]
    if name not in REGULARIZERS:
        raise _unknown("regularizer", name, available_regularizers())
    target, needs_weights = REGULARIZERS[name]
    return _resolve(target), needs_weights


def get_diagnostic(name: str) -> Diagnostic:
    """The function of diagnostic ``name``."""
    if name in _ADDED_DIAGNOSTICS:
        return _ADDED_DIAGNOSTICS[name]
    if name not in DIAGNOSTICS:
        raise _unknown("diagnostic", name, available_diagnostics())
    fn: Diagnostic = _resolve(DIAGNOSTICS[name])
    return fn
