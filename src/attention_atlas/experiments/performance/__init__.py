"""Chapter 8's family: the native kernels and the training steps, measured side by side.

Parts, each importing only the ones before it: :mod:`.kernels` (kernel and step records, their
goals and figures), :mod:`.steps` (the training-step records across machines).
"""

from __future__ import annotations

from . import kernels, steps

__all__ = ["kernels", "steps"]
