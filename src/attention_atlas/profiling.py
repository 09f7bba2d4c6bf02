"""Named phases of a computation, for the step-cost profile of :mod:`attention_atlas.experiments.performance.train_steps`.

``with phase("metric_net"): ...`` opens a :func:`torch.profiler.record_function` range named
``"atlas:metric_net"`` while a profiler is recording, and does nothing otherwise (so the model
pays nothing for it in training). The profile attributes each operator to the innermost such
range around it, and each backward operator to the range of the forward operator it
differentiates (autograd's sequence numbers link the two).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

__all__ = ["PREFIX", "phase"]

#: prefix of every range name this module opens
PREFIX = "atlas:"


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """A profiler range ``atlas:<name>`` while a profiler records; a no-op otherwise, and inside
    a graph that ``torch.compile`` traces (asked first: the profiler's state is a Python bool
    that would break the graph at every phase)."""
    if torch.compiler.is_compiling() or not torch.autograd._profiler_enabled():
        yield
        return
    with torch.profiler.record_function(PREFIX + name):
        yield
