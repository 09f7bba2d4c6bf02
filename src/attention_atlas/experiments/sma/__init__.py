"""Chapter 7's family: state-space models as structured masked attention.

Parts, each importing only the ones before it: :mod:`.accuracy` (the inputs, and how close
SSD's methods stay to float64), :mod:`.scaling` (time, memory and FLOPs against length: the
``ssd-scaling`` grid), :mod:`.checks` (the seed's identities and cost claims, and their
outcomes), :mod:`.lm` (the SSM against dot on char-PTB: the ``ssm-lm`` grid).
"""

from __future__ import annotations

from . import accuracy, checks, lm, scaling
from .checks import outcomes

__all__ = ["accuracy", "checks", "lm", "outcomes", "scaling"]
