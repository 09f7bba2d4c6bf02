"""Riemannian attention with per-token low-rank metrics (Song 2026, the seed paper).

Every token ``t`` carries a metric ``g_t = I + U_t U_t^T``, ``U_t (d, r)`` (eq. (4)), and a query
scores a key by the negative squared distance under the pair's metric (eqs. (5), (6)). One idea
per module, one home per equation:

* :mod:`.scores`: the geodesic score once per form (definition eq. (6), reference eq. (15),
  decomposition eq. (16), the augmented features of Theorem 3.2) and blending eq. (27);
* :mod:`.fast`: :func:`geodesic_attention` without ``(L, L, r)`` tensors, and the materialised
  reference attention (the generic blocked kernel is :mod:`attention_atlas.attention.flash`);
* :mod:`.geometry`: curvature proxy, metric-aware projection, torsion, transport and its Cayley
  form, isometry defect, preconditioned update (eqs. (20) to (26));
* :mod:`.regularizers`: eqs. (31) to (34), their schedule, the harness regulariser;
* :mod:`.diagnostics`: metric statistics, isometry errors, the harness diagnostic;
* :mod:`.modules`: MetricNet, TorsionNet, FiberTransport, and :class:`RiemannianAttention`
  (registered ``"riemannian"``) with a switch per phase; :class:`FiberBundleAttention`
  (``"fiber_bundle"``) is the same module with eq. (16) scores.
"""

from attention_atlas.attention.flash import blocked_attention

from .diagnostics import metric_statistics
from .fast import geodesic_attention, geodesic_attention_reference
from .geometry import (
    cayley_transport_apply,
    curvature_proxy,
    factor_apply,
    factor_t_apply,
    isometry_defect,
    metric_aware_projection,
    metric_aware_projections,
    metric_preconditioned_update,
    metric_strength,
    skew_factors_apply,
    torsion_apply,
    torsion_dense,
    transport_apply,
    transport_dense,
)
from .modules import (
    CurvatureProxy,
    FiberBundleAttention,
    FiberTransport,
    MetricAwareProjection,
    MetricNet,
    RiemannianAttention,
    TorsionNet,
)
from .regularizers import (
    anti_flatness_loss,
    curvature_smoothness_loss,
    metric_cap_loss,
    metric_distances,
    metric_diversity_loss,
)
from .scores import (
    augmented_dim,
    blend_weights,
    geodesic_features,
    geodesic_scores,
    geodesic_scores_augmented,
    geodesic_scores_decomposed,
    geodesic_scores_dense,
    hybrid_scores,
    pairwise_metric,
    pairwise_metric_terms,
    token_metric,
)

__all__ = [
    "CurvatureProxy",
    "FiberBundleAttention",
    "FiberTransport",
    "MetricAwareProjection",
    "MetricNet",
    "RiemannianAttention",
    "TorsionNet",
    "anti_flatness_loss",
    "augmented_dim",
    "blend_weights",
    "blocked_attention",
    "cayley_transport_apply",
    "curvature_proxy",
    "curvature_smoothness_loss",
    "factor_apply",
    "factor_t_apply",
    "geodesic_attention",
    "geodesic_attention_reference",
    "geodesic_features",
    "geodesic_scores",
    "geodesic_scores_augmented",
    "geodesic_scores_decomposed",
    "geodesic_scores_dense",
    "hybrid_scores",
    "isometry_defect",
    "metric_aware_projection",
    "metric_aware_projections",
    "metric_cap_loss",
    "metric_distances",
    "metric_diversity_loss",
    "metric_preconditioned_update",
    "metric_statistics",
    "metric_strength",
    "pairwise_metric",
    "pairwise_metric_terms",
    "skew_factors_apply",
    "token_metric",
    "torsion_apply",
    "torsion_dense",
    "transport_apply",
    "transport_dense",
]
