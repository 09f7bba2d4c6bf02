"""``TrainConfig(compile=True)``: the training steps' forward through :func:`torch.compile`."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

__all__ = ["CompiledSteps"]


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
            warnings.warn(
                f"torch.compile failed ({self.error[:300]}); the training steps run eagerly",
                RuntimeWarning,
                stacklevel=2,
            )
            return out
