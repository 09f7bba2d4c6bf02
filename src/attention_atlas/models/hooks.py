"""Training hooks by name: regularisers (a scalar added to the loss) and diagnostics (numbers
logged at each log step). Each takes the model, its output and the batch, so the table lives at
the model layer, above the attention variants it inspects::

    @register_regularizer("my_penalty", needs_weights=True)
    def my_penalty(model, output, batch, **options) -> Tensor: ...   # scalar, added to the loss

    @register_diagnostic("my_stat")
    def my_stat(model, output, batch, **options) -> dict[str, float]: ...  # logged at log steps

A built-in name cannot be taken again; the built-in entries are imported on first use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from attention_atlas.attention.registry import resolve, unknown

if TYPE_CHECKING:
    from torch import Tensor

__all__ = [
    "DIAGNOSTICS",
    "REGULARIZERS",
    "available_diagnostics",
    "available_regularizers",
    "get_diagnostic",
    "get_regularizer",
    "register_diagnostic",
    "register_regularizer",
]

#: regulariser name -> ("module:function", needs_weights). The function is
#: ``fn(model, output, batch, **options) -> Tensor`` (a scalar added to the loss, times the
#: spec's ``weight``); with ``needs_weights`` the training forward runs with
#: ``need_weights=True`` so that ``output.attentions[l].probs`` exist.
REGULARIZERS: dict[str, tuple[str, bool]] = {
    "cofactor": ("attention_atlas.cofactor.penalty:regularizer", False),
    "fiber_bundle": (
        "attention_atlas.models.fiber_bundle:fiber_bundle_regularizer",
        False,
    ),
}

#: diagnostic name -> "module:function"; ``fn(model, output, batch, **options) -> dict[str,
#: float]``, called at each log step (eval mode, no grad) with ``need_weights=True``.
DIAGNOSTICS: dict[str, str] = {
    "cofactor": "attention_atlas.cofactor.diagnostics:diagnostic",
    "fiber_bundle": "attention_atlas.models.fiber_bundle:fiber_bundle_diagnostic",
}

Regularizer = Callable[..., "Tensor"]
Diagnostic = Callable[..., dict[str, float]]

_ADDED_REGULARIZERS: dict[str, tuple[Regularizer, bool]] = {}
_ADDED_DIAGNOSTICS: dict[str, Diagnostic] = {}


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
        raise unknown("regularizer", name, available_regularizers())
    target, needs_weights = REGULARIZERS[name]
    return resolve(target), needs_weights


def get_diagnostic(name: str) -> Diagnostic:
    """The function of diagnostic ``name``."""
    if name in _ADDED_DIAGNOSTICS:
        return _ADDED_DIAGNOSTICS[name]
    if name not in DIAGNOSTICS:
        raise unknown("diagnostic", name, available_diagnostics())
    fn: Diagnostic = resolve(DIAGNOSTICS[name])
    return fn
