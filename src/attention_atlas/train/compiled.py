"""``TrainConfig(compile=True)``: the training steps' forward through :func:`torch.compile`; and
:func:`compiled_training`, which asks every :func:`~attention_atlas.train.train` run inside it to
compile its steps whatever its config says (how ``sweep --compile`` runs an experiment's cells
compiled without changing their configurations)."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

__all__ = ["CompiledSteps", "Compiling", "compiled_training", "compiling"]


@dataclass
class Compiling:
    """The state of a :func:`compiled_training` block: ``fallbacks``, the compiler errors of the
    runs in it that fell back to eager steps (empty when every run compiled)."""

    fallbacks: list[str] = field(default_factory=list)


_ACTIVE: ContextVar[Compiling | None] = ContextVar("attention_atlas_compiling", default=None)


@contextlib.contextmanager
def compiled_training(on: bool = True) -> Iterator[Compiling | None]:
    """Inside the block (``on``), every :func:`~attention_atlas.train.train` run compiles its
    training steps as ``TrainConfig(compile=True)`` would; yields the block's
    :class:`Compiling` (None when not ``on``, which changes nothing). Compiled steps are the
    same maths in another order: a run is not bit-identical to an eager one, but it is to
    another compiled run on the same machine and versions."""
    if not on:
        yield None
        return
    state = Compiling()
    token = _ACTIVE.set(state)
    try:
        yield state
    finally:
        _ACTIVE.reset(token)


def compiling() -> Compiling | None:
    """The :class:`Compiling` of the innermost :func:`compiled_training` block, else None."""
    return _ACTIVE.get()


class CompiledSteps:
    """``module`` called through :func:`torch.compile` (inductor, static shapes), with an eager
    fallback: when a call through the compiled module raises and the same call made eagerly
    does not, the compiler failed (no C++ compiler on the machine, an operation it cannot
    trace), so a :class:`RuntimeWarning` names the error once and every later call is eager.
    An error the eager call raises too is the module's own and is raised. Only the training
    steps go through it; evaluation stays eager. (Inductor compiles a step's backward at its
    first use: an error there is raised, not caught.)"""

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.compiled: Callable[..., Any] | None = torch.compile(module, dynamic=False)
        self.error: str | None = None  # the compiler's error, once it failed

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.compiled is None:
            return self.module(*args, **kwargs)
        try:
            return self.compiled(*args, **kwargs)
        except Exception as err:  # the compiler's, or the module's own (then eager raises it)
            out = self.module(*args, **kwargs)
            self.compiled = None
            self.error = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
            state = compiling()
            if state is not None:
                state.fallbacks.append(self.error)
            warnings.warn(
                f"torch.compile failed ({self.error[:300]}); the training steps run eagerly",
                RuntimeWarning,
                stacklevel=2,
            )
            return out
