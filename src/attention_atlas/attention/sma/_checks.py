"""Argument checks shared by the public functions of :mod:`attention_atlas.attention.sma`.

Every error is one line that names the function, the argument, what came (shape, dtype or
device) and what was expected, raised before any work (never a failure deep inside torch).
"""

from __future__ import annotations

from torch import Tensor

from attention_atlas.attention.base import check_tensor

__all__ = ["check_arg", "check_length", "check_same", "shape_of"]


def shape_of(t: Tensor) -> tuple[int, ...]:
    """``t.shape`` as a plain tuple (how shapes are written in messages)."""
    return tuple(t.shape)


def check_arg(
    fn: str, name: str, t: object, expected: str, *, ndim: int | None = None, min_dim: int = 1,
    nonempty: tuple[int, ...] = (),
) -> Tensor:  # fmt: skip
    """A floating-point tensor of the expected rank with no empty dimension among ``nonempty``;
    else TypeError (not a tensor) or ValueError naming ``fn: name``, what came and ``expected``."""
    return check_tensor(
        f"{fn}: {name}", t, expected=expected, ndim=ndim, min_dim=min_dim, nonempty=nonempty
    )


def check_same(fn: str, **tensors: Tensor | None) -> None:
    """The given tensors (None skipped) share the first one's dtype and device."""
    given = [(n, t) for n, t in tensors.items() if t is not None]
    names = ", ".join(n for n, _ in given)
    n0, t0 = given[0]
    for n, t in given[1:]:
        if t.dtype != t0.dtype:
            raise ValueError(
                f"{fn}: {n} has dtype {t.dtype} but {n0} has {t0.dtype}; {names} must share "
                "one floating dtype"
            )
    for n, t in given[1:]:
        if t.device != t0.device:
            raise ValueError(
                f"{fn}: {n} is on {t.device} but {n0} is on {t0.device}; {names} must be on "
                "one device"
            )


def check_length(fn: str, name: str, t: Tensor, axis: int, want: int, expected: str) -> None:
    """``t.shape[axis] == want``; else ValueError naming ``name``, its shape and ``expected``."""
    if t.shape[axis] != want:
        raise ValueError(f"{fn}: {name} must have shape {expected}, got {shape_of(t)}")
