"""The Fiber Bundle Transformer (Song 2026, Section 5): its config, its blocks with Phase E, and
the hooks the training harness calls on it (the regulariser of Section 6.4 and the diagnostic).

The model is the :class:`~attention_atlas.models.transformer.Transformer` with
:class:`~attention_atlas.attention.riemannian.RiemannianAttention` (phases A to D switched on,
:class:`FiberBundleConfig`) and Phase E in each block (:class:`FiberBundleBlock`). The geometry's
maths (the terms of eqs. (31) to (34), transport, torsion) lives in
:mod:`attention_atlas.attention.riemannian`; this module applies it to a model's output.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attention_atlas import native
from attention_atlas.attention.base import AttentionResult
from attention_atlas.attention.riemannian import RiemannianAttention, metric_preconditioned_update
from attention_atlas.attention.riemannian.diagnostics import (
    attention_sigma2,
    isometry_errors,
    kappa_statistics,
)
from attention_atlas.attention.riemannian.geometry import factor_rows
from attention_atlas.attention.riemannian.regularizers import (
    TERMS,
    RegularizerSchedule,
    check_positions,
    regularizer_terms,
)
from attention_atlas.profiling import phase

from .transformer import Block, ModelConfig, ModelOutput, Transformer, attention_modules

__all__ = [
    "PHASES",
    "FiberBundleBlock",
    "FiberBundleConfig",
    "FiberBundleTransformer",
    "evaluated_at_alpha",
    "evaluated_without_metric",
    "fbt_attentions",
    "fiber_bundle_diagnostic",
    "fiber_bundle_regularizer",
    "metric_factors",
    "set_alpha",
]


# ----------------------------------------------------------------------------------------

#: the switchable phases: A MetricNet, A++ metric-aware projection, B curvature proxy,
#: C torsion, D geodesic scores and transport, E metric-preconditioned feed-forward update
PHASES = ("a", "a_plus", "b", "c", "d", "e")


@dataclass
class FiberBundleConfig(ModelConfig):
    """A :class:`ModelConfig` for the Fiber Bundle Transformer; ``attention`` and
    ``attention_options`` are derived from the fields below (do not set them).

    Each block composes the phases on the residual stream; the geometry ``(U_t, P_t, T_t)`` is
    made afresh in every block from ``h = LayerNorm(x)`` (see
    :class:`~attention_atlas.attention.riemannian.RiemannianAttention` for phases A to D).
    """

    rank: int = 4  # metric rank r (U_t is d x r per head)
    tau: float | None = None  # temperature (default sqrt(2 d), equal to dot-product scale at U = 0)
    alpha: float = 1.0  # hybrid blending, eq. (27): 0 = baseline only, 1 = fully Riemannian
    blend_baseline: str = "distance"  # "distance" (Section 5.8 remark) or "dot" (eq. (27))
    metric_expansion: float = 1.0  # MetricNet hidden width m * D
    metric_init_std: float = 0.02  # MetricNet last-layer scale: U ~ 0 at initialisation
    transport_rank: int = 2  # rank of the transport factors A_t, B_t (Phase D)
    transport_kind: str = "linear"  # "linear" P = I + Delta, or "cayley" (exactly orthogonal)
    torsion_rank: int = 2  # rank of the torsion factors L_t, R_t (Phase C)
    method: str = "decomposed"  # materialised eq. (16) scores, or a geodesic_attention method
    phase_a: bool = True  # MetricNet (off: U = 0)
    phase_a_plus: bool = True  # metric-aware projection of q, k
    phase_b: bool = True  # curvature proxy in the scores
    phase_c: bool = True  # torsion in the transport
    phase_d: bool = True  # geodesic scores and transport
    phase_e: bool = True  # metric-preconditioned feed-forward update
    metric_gradient: str = "task"  # "noise": MetricNet trained on noise (a control, chapter 4)

    def __post_init__(self) -> None:
        if self.transport_kind not in ("linear", "cayley"):
            raise ValueError(
                f"transport_kind must be 'linear' or 'cayley', got {self.transport_kind!r}"
            )
        if self.blend_baseline not in ("distance", "dot"):
            raise ValueError(
                f"blend_baseline must be 'distance' or 'dot', got {self.blend_baseline!r}"
            )
        self.attention = "fiber_bundle"
        self.layers = None
        self.attention_options = {
            "rank": self.rank,
            "tau": self.tau,
            "alpha": self.alpha,
            "baseline": self.blend_baseline,
            "metric_expansion": self.metric_expansion,
            "metric_init_std": self.metric_init_std,
            "curvature": self.phase_b,
            "metric_projection": self.phase_a_plus,
            "transport_rank": self.transport_rank if self.phase_d else 0,
            "transport_kind": self.transport_kind,
            "torsion_rank": self.torsion_rank if self.phase_c else 0,
            "method": self.method,
            "metric": self.phase_a,
            "geodesic": self.phase_d,
            "metric_gradient": self.metric_gradient,
        }
        super().__post_init__()

    def phases(self) -> dict[str, bool]:
        return {p: bool(getattr(self, f"phase_{p}")) for p in PHASES}

    def build(self) -> FiberBundleTransformer:
        return FiberBundleTransformer(self)


class FiberBundleBlock(nn.Module):
    """Pre-norm block with Phase E: ``x + attn(ln(x))`` then ``x + g^{-1} mlp(ln(x))`` (eq. (26)).

    ``g_t`` is block diagonal over heads, block ``h`` being ``I + U_{t,h} U_{t,h}^T`` of this
    block's attention, so ``g_t^{-1}`` is one ``r x r`` Woodbury solve per head and token.
    Built from a standard :class:`Block` (same modules, same init).
    """

    def __init__(self, block: Block, precondition: bool) -> None:
        super().__init__()
        self.ln_1, self.attn, self.ln_2, self.mlp = block.ln_1, block.attn, block.ln_2, block.mlp
        self.precondition = bool(precondition)

    def forward(
        self, x: Tensor, *, causal: bool, mask: Tensor | None, need_weights: bool
    ) -> tuple[Tensor, AttentionResult]:
        res = self.attn(self.ln_1(x), causal=causal, mask=mask, need_weights=need_weights)
        x = x + res.out  # (B, L, D)
        m = self.mlp(self.ln_2(x))  # (B, L, D)
        if not (self.precondition and "metric_factor" in res.extras):
            return x + m, res
        U = res.extras["metric_factor"]  # (B, H, L, d, r)
        b, h, seq, d, _ = U.shape
        if h * d != m.shape[-1]:
            raise ValueError(
                f"Phase E needs n_heads * head_dim = dim, got {h} * {d} != {m.shape[-1]}"
            )
        with phase("preconditioned_update"):
            xh, mh = (t.view(b, seq, h, d).transpose(1, 2) for t in (x, m))  # (B, H, L, d)
            x = metric_preconditioned_update(xh, U, mh).transpose(1, 2).reshape(x.shape)
        return x, res


class FiberBundleTransformer(Transformer):
    """The :class:`Transformer` with :class:`FiberBundleBlock`s.

    ``train_step`` (a buffer, saved in checkpoints) counts training-mode forward passes, i.e.
    optimiser steps under :func:`attention_atlas.train.train`; the regulariser schedule reads it.
    """

    train_step: Tensor

    def __init__(self, cfg: FiberBundleConfig) -> None:
        if not isinstance(cfg, FiberBundleConfig):
            raise TypeError(
                f"FiberBundleTransformer needs a FiberBundleConfig, got {type(cfg).__name__}"
            )
        super().__init__(cfg)
        self.blocks = nn.ModuleList([FiberBundleBlock(b, cfg.phase_e) for b in self.blocks])  # type: ignore[arg-type]
        self.register_buffer("train_step", torch.zeros((), dtype=torch.int64))

    def forward(
        self, inputs: Tensor, *, need_weights: bool = False, mask: Tensor | None = None
    ) -> ModelOutput:
        if self.training and torch.is_grad_enabled():
            self.train_step.add_(1)
        return super().forward(inputs, need_weights=need_weights, mask=mask)


def fbt_attentions(model: nn.Module) -> list[RiemannianAttention]:
    """The Riemannian (Fiber Bundle) attention of each layer."""
    return [m for m in attention_modules(model) if isinstance(m, RiemannianAttention)]


def metric_factors(output: ModelOutput) -> list[Tensor]:
    """``U (B, H, L, d, r)`` of every layer that has one, from a forward's :class:`ModelOutput`."""
    return [r.extras["metric_factor"] for r in output.attentions if "metric_factor" in r.extras]


def set_alpha(model: nn.Module, alpha: float) -> None:
    """Set the blending coefficient of every Fiber Bundle (or Riemannian) attention layer."""
    for m in fbt_attentions(model):
        m.alpha = float(alpha)


@contextmanager
def evaluated_at_alpha(model: nn.Module, alpha: float) -> Iterator[None]:
    """Temporarily evaluate ``model`` at another blending ``alpha`` (prediction P2)."""
    mods = fbt_attentions(model)
    before = [m.alpha for m in mods]
    try:
        set_alpha(model, alpha)
        yield
    finally:
        for m, a in zip(mods, before):
            m.alpha = a


@contextmanager
def evaluated_without_metric(model: nn.Module) -> Iterator[None]:
    """Temporarily evaluate ``model`` with every metric factor ``U_t = 0`` at its own alpha (the
    geometry gate of chapter 4): Phase A off in every Fiber Bundle layer, so the scores reduce
    to the distance part ``-|q_i - k_j|^2 / tau`` (eq. (15) at ``g = I``; the curvature proxy
    and the metric-aware projection vanish with ``U``), Phase E's ``g^{-1}`` is the identity,
    and transport and torsion, which do not read ``U``, stay. Restores each layer's switch."""
    mods = fbt_attentions(model)
    before = [m.use_metric for m in mods]
    try:
        for m in mods:
            m.use_metric = False
        yield
    finally:
        for m, used in zip(mods, before):
            m.use_metric = used


# ----------------------------------------------------------------------------------------
# the training harness's hooks: regulariser and diagnostic "fiber_bundle"
# ----------------------------------------------------------------------------------------


def fiber_bundle_regularizer(
    model: nn.Module,
    output: ModelOutput,
    batch: Any,
    *,
    steps: int = 1000,
    kappa_min: float = 0.0,
    kappa_max: float = math.inf,
    anti: float = 0.0,
    div: float = 0.0,
    smooth: float = 0.0,
    cap: float = 0.0,
    l2: float = 0.0,
    relax_start: float = 0.3,
    relax_end: float = 0.7,
    relax_to: float = 0.1,
) -> Tensor:
    """Harness regulariser ``"fiber_bundle"``: the scheduled sum of the Section 6.4 terms, mean
    over the layers that have a metric; the step is the model's ``train_step`` (see
    :class:`attention_atlas.models.FiberBundleTransformer`)."""
    sched = RegularizerSchedule(steps, anti, div, smooth, cap, l2, relax_start, relax_end, relax_to)
    step = int(getattr(model, "train_step", torch.tensor(1))) - 1
    w = sched.weights(max(step, 0))
    Us = metric_factors(output)
    if not Us:
        return output.logits.new_zeros(())
    used = tuple(k for k in TERMS if w[k] != 0.0)  # a term of weight 0 is not computed
    if used and native.active(*Us, since=2) and Us[0].shape[-1] <= native.MAX_RANK:
        from attention_atlas.native.functions import (
            FiberBundleTerms,  # one kernel per layer (level 2)
        )

        check_positions(Us[0], "the metric regularisers")
        uts = [factor_rows(U, per_sequence=True).contiguous() for U in Us]
        spec = ([w[k] for k in TERMS], kappa_min, kappa_max)
        return FiberBundleTerms.apply(spec, *uts)
    total = output.logits.new_zeros(())
    for U in Us:
        terms = regularizer_terms(U, kappa_min=kappa_min, kappa_max=kappa_max, terms=used)
        total = total + sum((w[k] * v for k, v in terms.items()), output.logits.new_zeros(()))
    return total / len(Us)


def layer_gates(m: RiemannianAttention) -> dict[str, float]:
    """The squashed gates of one layer: ``gamma`` (A++), ``gamma_T`` (C), ``beta_scale`` (B)."""
    row: dict[str, float] = {}
    if m.projection is not None:
        row["gamma"] = float(torch.sigmoid(m.projection.gamma_param.detach()))
    if m.torsion_gate is not None:
        row["gamma_T"] = float(torch.sigmoid(m.torsion_gate.detach()))
    if m.curvature is not None:
        row["beta_scale"] = float(F.softplus(m.curvature.beta.detach()))
    return row


def layer_row(
    extras: dict[str, Tensor], kappa_min: float, kappa_max: float, tau: float | None
) -> dict[str, float]:
    """Metric strength (and its max over ``tau / L`` when ``tau`` is known), raw regulariser
    terms, curvature and transport of one layer's extras."""
    row: dict[str, float] = {}
    if "metric_factor" in extras:
        U = extras["metric_factor"]
        row.update(kappa_statistics(U))
        terms = regularizer_terms(U.detach(), kappa_min=kappa_min, kappa_max=kappa_max)
        row.update({k: float(v) for k, v in terms.items()})
        if tau is not None:
            row["kappa_max_over_tau_L"] = row["kappa_max"] / (tau / U.shape[-3])
    if "curvature" in extras:
        om = extras["curvature"].detach().float()
        row.update({"omega_mean": float(om.mean()), "omega_max": float(om.amax()),
                    "omega_std": float(om.std())})  # fmt: skip
    if "transport_a" in extras:
        row.update(isometry_errors(extras["transport_a"], extras["transport_b"]))
    return row


def fiber_bundle_diagnostic(
    model: nn.Module,
    output: ModelOutput,
    batch: Any,
    *,
    kappa_min: float = 0.0,
    kappa_max: float = math.inf,
) -> dict[str, float]:
    """Harness diagnostic ``"fiber_bundle"``. Per layer ``l``: ``l<l>/kappa_{mean,max,var}``,
    ``l<l>/{anti,div,smooth,cap,l2}`` (raw regulariser terms), ``l<l>/omega_{mean,max,std}``
    (curvature proxy), ``l<l>/iso_{linear,cayley}`` and ``l<l>/delta_fro`` (transport),
    ``l<l>/sigma2`` (second singular value of the attention), the ratio
    ``l<l>/kappa_max_over_tau_L``, the gates ``l<l>/{gamma,gamma_T,beta_scale}``; and ``alpha``."""
    row: dict[str, float] = {}
    mods = fbt_attentions(model)
    for i, res in enumerate(output.attentions):
        p = f"l{i}/"
        layer = layer_row(res.extras, kappa_min, kappa_max, mods[i].tau if i < len(mods) else None)
        if res.probs is not None:
            layer["sigma2"] = attention_sigma2(res.probs)
        if i < len(mods):
            layer.update(layer_gates(mods[i]))
        row.update({p + k: v for k, v in layer.items()})
    if mods:
        row["alpha"] = float(mods[0].alpha)
    return row
