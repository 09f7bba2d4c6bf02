"""The stable names of the matroidal seed's functional API (``DESIGN.md``), re-exported.

The code lives by idea: :mod:`.matroidal` (matroidal and dense Mahalanobis metrics),
:mod:`.euclidean` (squared-distance attention) and :mod:`.graphs` (covector matrices, total
unimodularity). Import from those; this module only keeps
``attention_atlas.attention.metric.matroidal_logits`` and ``matroidal_attention`` working.
"""

from .matroidal import matroidal_attention, matroidal_logits

__all__ = ["matroidal_attention", "matroidal_logits"]
