"""The models: a small pre-norm Transformer with a pluggable attention per layer and per head
group (:mod:`.transformer`), the Fiber Bundle Transformer built on it (:mod:`.fiber_bundle`), and
the named regularisers and diagnostics the training harness calls on a model (:mod:`.hooks`)."""

from .fiber_bundle import (
    PHASES,
    FiberBundleBlock,
    FiberBundleConfig,
    FiberBundleTransformer,
    evaluated_at_alpha,
    fbt_attentions,
    metric_factors,
    set_alpha,
)
from .transformer import (
    MLP,
    Block,
    MixedHeadAttention,
    ModelConfig,
    ModelOutput,
    Transformer,
    attention_modules,
    param_counts,
)

__all__ = [
    "MLP",
    "PHASES",
    "Block",
    "FiberBundleBlock",
    "FiberBundleConfig",
    "FiberBundleTransformer",
    "MixedHeadAttention",
    "ModelConfig",
    "ModelOutput",
    "Transformer",
    "attention_modules",
    "evaluated_at_alpha",
    "fbt_attentions",
    "metric_factors",
    "param_counts",
    "set_alpha",
]
