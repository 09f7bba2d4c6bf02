"""The Fiber Bundle Transformer (Song 2026, Section 5) as a model of the training harness.

Each block composes the phases of the paper on the residual stream ``x (B, L, D)``; the geometry
``(U_t, P_t, T_t)`` is made afresh in every block from ``h = LayerNorm(x)``:

* **A** MetricNet (eq. (19)): per-token, per-head metric factors ``U_t (d, r)``, ``g_t = I + U_t U_t^T``.
  Off: ``U = 0`` (then A++, B and E have nothing to act with).
* **A++** metric-aware projection of q and k (eq. (20)), gated by ``sigmoid(gamma)``, gate at 0.047.
* **B** curvature proxy ``Omega_t = softplus(beta) |U_t|_F^2`` (eq. (21)) added to the distance (eq. (23)).
* **C** torsion ``T_t = L R^T - R L^T`` (eq. (22)) added to the transport, ``P' = P + gamma_T T``.
* **D** geodesic scores (eqs. (6), (15), (23)) and value transport ``P_t = I + Delta_t`` or its
  Cayley form (eqs. (24), (25)). Off: the scores use no metric (Euclidean distance, or dot product
  under the ``"dot"`` baseline) and ``P = I``.
* **E** metric-preconditioned feed-forward update ``x + g_t^{-1} FFN(x)`` (eq. (26)) by Woodbury, with
  the block-diagonal ``g_t`` whose blocks are the heads' metrics (needs ``H d = D``).
* hybrid blending ``alpha`` (eq. (27)) with the dot-product or distance baseline (Section 5.8).

The maths of every phase is :mod:`attention_atlas.attention.riemannian` (MetricNet, TorsionNet,
FiberTransport, the curvature proxy, geodesic attention, the regularisers); this module composes it.

Also here: the regulariser of Section 6.4 with its schedule (strong early, relaxed later), a
per-log-step diagnostic (``|U_t|_F^2`` mean/max/cross-token variance, curvature proxy statistics,
transport isometry error of eq. (25) linear vs Cayley, alpha, gates), the post-training analysis
used by chapter 4 (effective ranks, curvature by token type, evaluation at other alphas), and the
experiment grid of chapter 4 behind ``python -m attention_atlas sweep fiber-bundle``.

Training: :class:`FiberBundleConfig` is a :class:`~attention_atlas.models.ModelConfig`, so
``train.train(FiberBundleConfig(...), TrainConfig(regularizers=fiber_bundle_regularizers(...),
diagnostics=[{"name": "fiber_bundle"}]), data)`` trains it (the config's ``build()`` makes the model).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention.base import AttentionResult
from .attention.dot import attention_from_logits
from .attention.riemannian import (
    RiemannianAttention,
    TorsionNet,
    geodesic_attention,
    torsion_apply,
    torsion_dense,
    transport_dense,
)
from .linalg import effective_rank, metric_inverse_apply, sym_pack_gram
from .models import Block, ModelConfig, ModelOutput, Transformer, attention_modules

__all__ = [
    "FiberBundleAttention",
    "FiberBundleBlock",
    "FiberBundleConfig",
    "FiberBundleTransformer",
    "RegularizerSchedule",
    "analyse",
    "char_classes",
    "fiber_bundle_regularizers",
    "metric_factors",
    "set_alpha",
]

PHASES = ("a", "a_plus", "b", "c", "d", "e")


# ----------------------------------------------------------------------------------------
# attention: phases A, A++, B, C, D and blending
# ----------------------------------------------------------------------------------------


def geodesic_distance_sq(q: Tensor, k: Tensor, U: Tensor) -> Tensor:
    """``d_g^2(q_i, k_j)`` of eq. (15) for all pairs, by eq. (16), materialised: ``(..., L, L)``.

    ``|U_i^T (q_i - k_j)|^2 = |U_i^T q_i - U_i^T k_j|^2`` with all ``U_i^T k_j`` from one batched
    product ``(L r, d) x (d, L)`` (and the same for ``U_j^T q_i``): ``O(d r)`` work per pair,
    ``(..., L, r, L)`` memory. The same quantity as
    :func:`attention_atlas.attention.riemannian.geodesic_scores_decomposed` (times ``-tau``),
    laid out for speed at the short lengths of chapter 4. ``q, k (..., L, d)``, ``U (..., L, d, r)``.
    """
    *batch, seq, d, r = U.shape
    Ut = U.transpose(-1, -2)  # (..., L, r, d)
    uq = (Ut @ q.unsqueeze(-1)).squeeze(-1)  # U_i^T q_i  (..., L, r)
    uk = (Ut @ k.unsqueeze(-1)).squeeze(-1)  # U_j^T k_j  (..., L, r)
    flat = Ut.reshape(*batch, seq * r, d)
    g = (flat @ k.transpose(-1, -2)).view(*batch, seq, r, seq)  # [i, :, j] = U_i^T k_j
    h = (flat @ q.transpose(-1, -2)).view(*batch, seq, r, seq)  # [j, :, i] = U_j^T q_i
    term_i = (uq.unsqueeze(-1) - g).pow(2).sum(-2)  # (..., Li, Lj)
    term_j = (h - uk.unsqueeze(-1)).pow(2).sum(-2).transpose(-1, -2)  # (..., Lj, Li) -> (Li, Lj)
    euc = (
        (q * q).sum(-1).unsqueeze(-1) + (k * k).sum(-1).unsqueeze(-2) - 2 * q @ k.transpose(-1, -2)
    )
    return euc + 0.5 * term_i + 0.5 * term_j


class FiberBundleAttention(RiemannianAttention):
    """:class:`RiemannianAttention` with each phase switchable alone (for ablations).

    Args (beyond :class:`RiemannianAttention`'s):
        metric: Phase A. False: ``U = 0`` (MetricNet is kept but unused, so parameter counts of
            the ablation are comparable; its parameters get no gradient).
        geodesic: Phase D scores. False: the score has no metric term (``U`` is replaced by 0 in
            the distance and the curvature proxy is dropped), only the baseline remains.
        torsion_rank: Phase C; unlike the parent, torsion may be used without transport
            (``P' = I + gamma_T T``).

    Extras returned: ``metric_factor (B, H, L, d, r)``, ``curvature (B, H, L)`` if Phase B,
    ``transport_a``/``transport_b`` (the factors of ``Delta``) and ``torsion_l``/``torsion_r``.
    """

    name = "fiber_bundle"

    def __init__(
        self,
        dim: int,
        n_heads: int,
        metric: bool = True,
        geodesic: bool = True,
        torsion_rank: int = 0,
        **kwargs: Any,
    ) -> None:
        method = kwargs.pop("method", "decomposed")
        super().__init__(
            dim,
            n_heads,
            torsion_rank=0,
            method="auto" if method == "decomposed" else method,
            **kwargs,
        )
        self.method = method
        self.use_metric, self.use_geodesic = bool(metric), bool(geodesic)
        self.torsion = (
            TorsionNet(dim, n_heads, self.head_dim, torsion_rank) if torsion_rank > 0 else None
        )
        self.torsion_gate = nn.Parameter(torch.tensor(-3.0)) if torsion_rank > 0 else None

    def metric_factor(self, x: Tensor, dtype: torch.dtype) -> Tensor:
        """``U (B, H, L, d, r)`` from ``x (B, L, D)`` (zeros when Phase A is off)."""
        U = self.metric_net(x).to(dtype)
        return U if self.use_metric else torch.zeros_like(U)

    def attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        x: Tensor,
        causal: bool,
        mask: Tensor | None,
        need_weights: bool,
    ) -> AttentionResult:
        U = self.metric_factor(x, q.dtype)  # (B, H, L, d, r), Phase A
        if self.projection is not None:  # Phase A++
            q, k = self.projection(q, U), self.projection(k, U)
        omega = self.curvature(U) if self.curvature is not None else None  # (B, H, L), Phase B
        U_s = U if self.use_geodesic else torch.zeros_like(U)  # Phase D scores
        omega_s = omega if self.use_geodesic else None
        diagnostics: dict[str, Tensor] = {}
        probs = None
        if self.method == "decomposed" or need_weights:
            explicit = attention_from_logits(
                self.scores(q, k, U_s, omega_s), v, causal=causal, mask=mask
            )  # scores (B, H, L, L)
            out = explicit.out  # (B, H, L, d)
            if need_weights:
                probs, diagnostics = explicit.probs, explicit.diagnostics
        else:
            out = geodesic_attention(
                q, k, v, U_s, self.tau, causal, mask=mask, curvature=omega_s, alpha=self.alpha,
                baseline=self.baseline, method=self.method,  # type: ignore[arg-type]
            )  # fmt: skip
        extras: dict[str, Tensor] = {"metric_factor": U}
        if omega is not None:
            extras["curvature"] = omega
        moved = out
        if self.transport is not None and self.use_geodesic:  # Phase D transport, eq. (24)
            a, b = self.transport(x)
            moved = self.transport.apply_transport(a, b, out)
            extras["transport_a"], extras["transport_b"] = a, b
        if self.torsion is not None and self.torsion_gate is not None:  # Phase C
            lt, rt = self.torsion(x)
            moved = moved + torch.sigmoid(self.torsion_gate) * torsion_apply(lt, rt, out)
            extras["torsion_l"], extras["torsion_r"] = lt, rt
        return AttentionResult(moved, probs, diagnostics, extras)

    def scores(self, q: Tensor, k: Tensor, U: Tensor, omega: Tensor | None) -> Tensor:
        """Blended scores ``s_base + alpha (s_riem - s_base)`` (eqs. (23), (27)), materialised
        through the decomposition of eq. (16) (``(B, H, L, L, r)`` intermediates: cheapest at the
        short lengths of chapter 4). ``q, k (B, H, L, d)``, ``U (B, H, L, d, r)``."""
        s = -geodesic_distance_sq(q, k, U) / self.tau
        if omega is not None:
            s = s - (omega.unsqueeze(-1) + omega.unsqueeze(-2)) / self.tau
        if self.alpha == 1.0:
            return s
        if self.baseline == "dot":
            base = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        else:
            base = (
                -(
                    (q * q).sum(-1).unsqueeze(-1)
                    + (k * k).sum(-1).unsqueeze(-2)
                    - 2 * q @ k.transpose(-1, -2)
                )
                / self.tau
            )
        return base + self.alpha * (s - base)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", metric={self.use_metric}, geodesic={self.use_geodesic}"


# ----------------------------------------------------------------------------------------
# the block (Phase E) and the model
# ----------------------------------------------------------------------------------------


@dataclass
class FiberBundleConfig(ModelConfig):
    """A :class:`ModelConfig` for the Fiber Bundle Transformer; ``attention`` and
    ``attention_options`` are derived from the fields below (do not set them)."""

    rank: int = 4  # metric rank r (U_t is d x r per head)
    tau: float | None = None  # temperature (default sqrt(2 d), equal to dot-product scale at U = 0)
    alpha: float = 1.0  # hybrid blending, eq. (27): 0 = baseline only, 1 = fully Riemannian
    blend_baseline: str = (
        "distance"  # "distance" (Section 5.8 remark) or "dot" (eq. (27) as printed)
    )
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
    Built from a standard :class:`~attention_atlas.models.Block` (same modules, same init).
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
        if self.precondition and "metric_factor" in res.extras:
            U = res.extras["metric_factor"]  # (B, H, L, d, r)
            b, h, seq, d, _ = U.shape
            if h * d != m.shape[-1]:
                raise ValueError(
                    f"Phase E needs n_heads * head_dim = dim, got {h} * {d} != {m.shape[-1]}"
                )
            Ut = U.permute(0, 2, 1, 3, 4)  # (B, L, H, d, r)
            m = metric_inverse_apply(Ut, m.view(b, seq, h, d)).reshape(b, seq, h * d)
        return x + m, res


class FiberBundleTransformer(Transformer):
    """The harness :class:`~attention_atlas.models.Transformer` with :class:`FiberBundleBlock`s.

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


def build_model(cfg: ModelConfig) -> Transformer:
    """The model ``cfg`` describes: a :class:`FiberBundleTransformer` for a
    :class:`FiberBundleConfig`, else the harness :class:`Transformer`."""
    return cfg.build() if isinstance(cfg, FiberBundleConfig) else Transformer(cfg)


def fbt_attentions(model: nn.Module) -> list[FiberBundleAttention]:
    """The :class:`FiberBundleAttention` of each layer."""
    return [m for m in attention_modules(model) if isinstance(m, FiberBundleAttention)]


def metric_factors(output: ModelOutput) -> list[Tensor]:
    """``U (B, H, L, d, r)`` of every layer that has one, from a forward's :class:`ModelOutput`."""
    return [r.extras["metric_factor"] for r in output.attentions if "metric_factor" in r.extras]


def set_alpha(model: nn.Module, alpha: float) -> None:
    """Set the blending coefficient of every Fiber Bundle (or Riemannian) attention layer."""
    for m in attention_modules(model):
        if isinstance(m, RiemannianAttention):
            m.alpha = float(alpha)


@contextmanager
def evaluated_at_alpha(model: nn.Module, alpha: float) -> Iterator[None]:
    """Temporarily evaluate ``model`` at another blending ``alpha`` (prediction P2)."""
    mods = [m for m in attention_modules(model) if isinstance(m, RiemannianAttention)]
    before = [m.alpha for m in mods]
    try:
        set_alpha(model, alpha)
        yield
    finally:
        for m, a in zip(mods, before):
            m.alpha = a


# ----------------------------------------------------------------------------------------
# regularisers (Section 6.4) with a schedule
# ----------------------------------------------------------------------------------------


@dataclass
class RegularizerSchedule:
    """Weights of the geometric regularisers against the optimiser step.

    Anti-flatness (eq. (31)) and diversity (eq. (32)) are "strong early, relaxed later": their
    weight is ``w`` until ``relax_start * steps``, then falls along a half cosine to
    ``relax_to * w`` at ``relax_end * steps`` and stays there. Smoothness (eq. (33)), the cap
    (eq. (34)) and the plain L2 penalty (``mean_t |U_t|_F^2``, the "standard regularisation" of
    Conjecture 6.3) keep their weight.
    """

    steps: int = 1000
    anti: float = 0.0
    div: float = 0.0
    smooth: float = 0.0
    cap: float = 0.0
    l2: float = 0.0
    relax_start: float = 0.3
    relax_end: float = 0.7
    relax_to: float = 0.1

    def factor(self, step: int) -> float:
        """Multiplier of the scheduled weights at optimiser step ``step`` (0-based)."""
        if not 0 <= self.relax_start <= self.relax_end <= 1:
            raise ValueError(
                f"need 0 <= relax_start <= relax_end <= 1, got {self.relax_start}, {self.relax_end}"
            )
        t = step / max(1, self.steps)
        if t <= self.relax_start:
            return 1.0
        if t >= self.relax_end or self.relax_end == self.relax_start:
            return self.relax_to
        u = (t - self.relax_start) / (self.relax_end - self.relax_start)
        return self.relax_to + (1 - self.relax_to) * 0.5 * (1 + math.cos(math.pi * u))

    def weights(self, step: int) -> dict[str, float]:
        f = self.factor(step)
        return {
            "anti": self.anti * f,
            "div": self.div * f,
            "smooth": self.smooth,
            "cap": self.cap,
            "l2": self.l2,
        }


def regularizer_terms(U: Tensor, *, kappa_min: float, kappa_max: float) -> dict[str, Tensor]:
    """The raw Section 6.4 terms for one layer's ``U (B, H, L, d, r)``, all from one Gram matrix.

    ``S_ij = |U_i^T U_j|_F^2 = <A_i, A_j>_F`` (``A_t = U_t U_t^T``) for every pair of positions is
    one product of the Frobenius-isometric packings :func:`attention_atlas.linalg.sym_pack_gram`
    (``d (d + 1) / 2`` numbers per token) per sequence and head; then
    ``|A_i - A_j|_F^2 = S_ii - 2 S_ij + S_jj`` (the identity of Section 6.4). Returns ``anti`` (eq. (31)),
    ``div`` (eq. (32) over all ordered pairs ``i != j`` of a sequence), ``smooth`` (eq. (33)),
    ``cap`` (eq. (34)) and ``l2`` (``mean_t |U_t|_F^2``). Equal to
    :func:`~attention_atlas.attention.riemannian.anti_flatness_loss`,
    :func:`~attention_atlas.attention.riemannian.metric_diversity_loss` (all pairs),
    :func:`~attention_atlas.attention.riemannian.curvature_smoothness_loss` and
    :func:`~attention_atlas.attention.riemannian.metric_cap_loss` (tested), but one batched
    product instead of one tiny product per pair, which on CPU was most of a training step.
    """
    seq = U.shape[-3]
    if seq < 2:
        raise ValueError(f"the metric regularisers need at least 2 positions, got L={seq}")
    packed = sym_pack_gram(U)  # (..., L, d(d+1)/2)
    S = packed @ packed.transpose(-1, -2)  # (..., L, L): S_ij = |U_i^T U_j|_F^2
    self_sq = S.diagonal(dim1=-2, dim2=-1)  # (..., L)
    dist = self_sq.unsqueeze(-1) + self_sq.unsqueeze(-2) - 2 * S  # |A_i - A_j|_F^2
    kappa = (U * U).sum((-1, -2))  # (..., L)
    adjacent = dist.diagonal(offset=1, dim1=-2, dim2=-1)  # (..., L-1)
    return {
        "anti": F.relu(kappa_min - kappa).mean(),
        "div": -(dist.sum((-1, -2)) / (seq * (seq - 1))).mean(),  # the diagonal of dist is 0
        "smooth": adjacent.mean(),
        "cap": F.relu(kappa - kappa_max).mean(),
        "l2": kappa.mean(),
    }


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
    """Scheduled sum of the Section 6.4 terms over layers (mean over layers); the step is the
    model's ``train_step`` (see :class:`FiberBundleTransformer`)."""
    sched = RegularizerSchedule(steps, anti, div, smooth, cap, l2, relax_start, relax_end, relax_to)
    step = int(getattr(model, "train_step", torch.tensor(1))) - 1
    w = sched.weights(max(step, 0))
    Us = metric_factors(output)
    if not Us:
        return output.logits.new_zeros(())
    total = output.logits.new_zeros(())
    for U in Us:
        terms = regularizer_terms(U, kappa_min=kappa_min, kappa_max=kappa_max)
        total = total + sum(
            (w[k] * v for k, v in terms.items() if w[k] != 0.0), output.logits.new_zeros(())
        )
    return total / len(Us)


def fiber_bundle_regularizers(
    kind: str,
    *,
    steps: int,
    kappa_min: float,
    kappa_max: float,
    weights: dict[str, float] | None = None,
    **schedule: float,
) -> list[dict[str, Any]]:
    """``TrainConfig.regularizers`` for the three settings of prediction P3.

    ``kind``: ``"none"`` (no geometric regulariser), ``"l2"`` (L2 on ``|U_t|_F^2`` only) or
    ``"three"`` (anti-flatness + diversity + smoothness, with the cap of eq. (34)).
    ``weights`` overrides the default weights ``anti=1, div=1, smooth=0.1, cap=1, l2=1``.
    """
    w = {"anti": 1.0, "div": 1.0, "smooth": 0.1, "cap": 1.0, "l2": 1.0, **(weights or {})}
    if kind == "none":
        return []
    if kind == "l2":
        use = {"l2": w["l2"]}
    elif kind == "three":
        use = {k: w[k] for k in ("anti", "div", "smooth", "cap")}
    else:
        raise ValueError(f"kind must be 'none', 'l2' or 'three', got {kind!r}")
    return [
        {"name": "fiber_bundle", "weight": 1.0, "steps": int(steps), "kappa_min": float(kappa_min),
         "kappa_max": float(kappa_max), **use, **schedule}
    ]  # fmt: skip


# ----------------------------------------------------------------------------------------
# diagnostics (logged at each log step) and the post-training analysis
# ----------------------------------------------------------------------------------------


def kappa_statistics(U: Tensor) -> dict[str, float]:
    """``kappa_t = |U_t|_F^2`` for ``U (B, H, L, d, r)``: mean, max, cross-token variance
    (variance over positions, averaged over sequences and heads: the paper's ``sigma_U^2``)."""
    kappa = (U.detach().float() ** 2).sum((-1, -2))  # (B, H, L)
    return {
        "kappa_mean": float(kappa.mean()),
        "kappa_max": float(kappa.amax()),
        "kappa_var": float(kappa.var(-1, unbiased=False).mean()),
    }


def isometry_errors(a: Tensor, b: Tensor) -> dict[str, float]:
    """Mean over tokens of ``|P^T P - I|_F`` for the same ``Delta = A B^T - B A^T`` (eq. (25)),
    linear ``P = I + Delta`` against the Cayley form. ``a, b (..., d, r)``."""
    a, b = a.detach().double(), b.detach().double()
    eye = torch.eye(a.shape[-2], dtype=a.dtype, device=a.device)
    out = {}
    for kind in ("linear", "cayley"):
        P = transport_dense(a, b, kind)
        err = P.transpose(-1, -2) @ P - eye
        out[f"iso_{kind}"] = float(err.pow(2).sum((-1, -2)).sqrt().mean())
    out["delta_fro"] = float(torsion_dense(a, b).pow(2).sum((-1, -2)).sqrt().mean())
    return out


def attention_sigma2(probs: Tensor) -> float:
    """Mean second singular value of the attention matrices ``probs (B, H, L, L)`` (Conj. 3.6)."""
    s = torch.linalg.svdvals(probs.detach().double())  # (B, H, L)
    return float(s[..., 1].mean())


def fiber_bundle_diagnostic(
    model: nn.Module,
    output: ModelOutput,
    batch: Any,
    *,
    kappa_min: float = 0.0,
    kappa_max: float = math.inf,
) -> dict[str, float]:
    """Per layer ``l``: ``l<l>/kappa_{mean,max,var}``, ``l<l>/omega_{mean,max,std}`` (curvature
    proxy), ``l<l>/iso_{linear,cayley}`` and ``l<l>/delta_fro`` (transport), ``l<l>/sigma2`` (second
    singular value of the attention), ``l<l>/{anti,div,smooth,cap,l2}`` (raw regulariser terms),
    the gates ``l<l>/{gamma,gamma_T,beta_scale}``, the ratio ``l<l>/kappa_max_over_tau_L``, and ``alpha``."""
    row: dict[str, float] = {}
    mods = fbt_attentions(model)
    for i, res in enumerate(output.attentions):
        p = f"l{i}/"
        ex = res.extras
        if "metric_factor" in ex:
            U = ex["metric_factor"]
            for k, v in kappa_statistics(U).items():
                row[p + k] = v
            terms = regularizer_terms(U.detach(), kappa_min=kappa_min, kappa_max=kappa_max)
            row.update({p + k: float(v) for k, v in terms.items()})
            if i < len(mods):
                row[p + "kappa_max_over_tau_L"] = row[p + "kappa_max"] / (mods[i].tau / U.shape[-3])
        if "curvature" in ex:
            om = ex["curvature"].detach().float()
            row.update({p + "omega_mean": float(om.mean()), p + "omega_max": float(om.amax()),
                        p + "omega_std": float(om.std())})  # fmt: skip
        if "transport_a" in ex:
            row.update(
                {p + k: v for k, v in isometry_errors(ex["transport_a"], ex["transport_b"]).items()}
            )
        if res.probs is not None:
            row[p + "sigma2"] = attention_sigma2(res.probs)
        if i < len(mods):
            m = mods[i]
            if m.projection is not None:
                row[p + "gamma"] = float(torch.sigmoid(m.projection.gamma_param.detach()))
            if m.torsion_gate is not None:
                row[p + "gamma_T"] = float(torch.sigmoid(m.torsion_gate.detach()))
            if m.curvature is not None:
                row[p + "beta_scale"] = float(F.softplus(m.curvature.beta.detach()))
    if mods:
        row["alpha"] = float(mods[0].alpha)
    return row


def char_classes(itos: list[str]) -> dict[str, list[int]]:
    """Token ids of char-PTB by type: ``letter`` (a-z), ``space`` (``_``), ``newline``,
    ``digit_or_N`` (digits and the number token ``N``), ``punct`` (everything else)."""
    out: dict[str, list[int]] = {
        "letter": [],
        "space": [],
        "newline": [],
        "digit_or_N": [],
        "punct": [],
    }
    for i, s in enumerate(itos):
        if len(s) == 1 and "a" <= s <= "z":
            out["letter"].append(i)
        elif s == "_":
            out["space"].append(i)
        elif s == "\n":
            out["newline"].append(i)
        elif s.isdigit() or s == "N":
            out["digit_or_N"].append(i)
        else:
            out["punct"].append(i)
    return out


def token_types(x: Tensor, itos: list[str]) -> Tensor:
    """Type code per position of ``x (B, L)`` (ids): 0 word-initial letter, 1 word-internal
    letter, 2 space ``_``, 3 newline, 4 digit or ``N``, 5 punctuation/other. A letter is
    word-initial when the previous character is a space or newline (or it starts the window:
    the window's first position is then excluded, code -1)."""
    cls = char_classes(itos)
    lut = torch.full((len(itos),), 5, dtype=torch.int64)
    for name, c in (("letter", 1), ("space", 2), ("newline", 3), ("digit_or_N", 4)):
        lut[cls[name]] = c
    code = lut[x.cpu()]
    prev = torch.full_like(code, -1)
    prev[:, 1:] = code[:, :-1]
    initial = (code == 1) & ((prev == 2) | (prev == 3))
    code = torch.where(initial, torch.zeros_like(code), code)
    code[:, 0] = -1
    return code


TYPE_NAMES = ["word_initial", "word_internal", "space", "newline", "digit_or_N", "punct"]


@torch.no_grad()
def analyse(
    model: Transformer,
    data: Any,
    *,
    seq_len: int,
    n_seqs: int = 64,
    batch_size: int = 32,
) -> dict[str, Any]:
    """Post-training measurements on the first ``n_seqs`` validation windows.

    Returns ``erank_<l>`` (mean effective rank of each layer's hidden states, ``l = 0`` the
    embedding), ``sigma2_<l>`` (mean second singular value of the attention matrices), and for a
    Fiber Bundle model per layer ``kappa_<l>_{mean,max,var,cv}``, ``kappa_<l>_<type>`` (mean
    ``kappa_t`` over heads and positions of each token type of :func:`token_types`) and
    ``kappa_<l>_spearman_surprisal`` (rank correlation of ``kappa_t`` with the surprisal
    ``-log2 p(x_t | x_<t)``, positions 1..L-1); plus ``tokens`` (a DataFrame, one row per
    position with ``type``, ``surprisal`` and ``kappa_<l>``) for plotting.
    """
    from scipy.stats import spearmanr

    from .data import eval_windows

    was = model.training
    model.eval()
    device = next(model.parameters()).device
    itos = data.vocab.itos
    erank: dict[int, list[float]] = {}
    sig2: dict[int, list[float]] = {}
    kap: dict[int, list[Tensor]] = {}
    types, surpr = [], []
    n = 0
    for x, y in eval_windows(data.valid, batch_size, seq_len):
        if n >= n_seqs:
            break
        x, y = x[: n_seqs - n].to(device), y[: n_seqs - n].to(device)
        n += x.shape[0]
        out = model(x, need_weights=True)
        for i, h in enumerate(out.hidden):
            erank.setdefault(i, []).extend(effective_rank(h.double()).tolist())
        for i, res in enumerate(out.attentions):
            if res.probs is not None:
                s = torch.linalg.svdvals(res.probs.double())[..., 1]  # (B, H)
                sig2.setdefault(i + 1, []).extend(s.mean(-1).tolist())
            if "metric_factor" in res.extras:
                k = (res.extras["metric_factor"].double() ** 2).sum((-1, -2)).mean(1)  # (B, L)
                kap.setdefault(i + 1, []).append(k.cpu())
        logp = torch.log_softmax(out.logits.double(), -1)  # (B, L, V)
        nll = -logp.gather(-1, y.unsqueeze(-1)).squeeze(-1) / math.log(2)  # surprisal of x_{t+1}
        s = torch.full(x.shape, math.nan, dtype=torch.float64)
        s[:, 1:] = nll[:, :-1].cpu()  # surprisal of x_t given x_<t
        surpr.append(s)
        types.append(token_types(x, itos))
    model.train(was)
    res_: dict[str, Any] = {}
    for i, v in erank.items():
        res_[f"erank_{i}"] = float(np.mean(v))
    for i, v in sig2.items():
        res_[f"sigma2_{i}"] = float(np.mean(v))
    t_all = torch.cat(types).reshape(-1)
    s_all = torch.cat(surpr).reshape(-1)
    tok = pd.DataFrame({"type": t_all.numpy(), "surprisal": s_all.numpy()})
    for i, parts in kap.items():
        k_all = torch.cat(parts).reshape(-1)
        tok[f"kappa_{i}"] = k_all.numpy()
        kk = k_all.numpy()
        res_[f"kappa_{i}_mean"] = float(kk.mean())
        res_[f"kappa_{i}_max"] = float(kk.max())
        res_[f"kappa_{i}_var"] = float(kk.var())
        res_[f"kappa_{i}_cv"] = float(kk.std() / max(kk.mean(), 1e-30))
        for code, name in enumerate(TYPE_NAMES):
            sel = t_all.numpy() == code
            res_[f"kappa_{i}_{name}"] = float(kk[sel].mean()) if sel.any() else math.nan
        ok = np.isfinite(s_all.numpy()) & (t_all.numpy() >= 0)
        varies = ok.sum() > 2 and kk[ok].std() > 0  # kappa is identically 0 with Phase A off
        rho = spearmanr(kk[ok], s_all.numpy()[ok]).statistic if varies else math.nan
        res_[f"kappa_{i}_spearman_surprisal"] = float(rho)
    res_["tokens"] = tok
    return res_


# ----------------------------------------------------------------------------------------
# the experiments of chapter 4: one grid, one cell runner (see attention_atlas.sweep)
# ----------------------------------------------------------------------------------------

#: parameter sets of ``python -m attention_atlas sweep fiber-bundle --preset NAME``
PRESETS: dict[str, dict[str, Any]] = {
    "smoke": {"steps": 6, "dim": 32, "n_heads": 2, "batch_size": 4, "seq_len": 32, "ranks": [1, 4],
              "alphas": [0.0, 1.0], "kappa_factors": [1.0, 10.0], "eval_alphas": [0.0, 1.0],
              "analyse_seqs": 8, "final_eval_batches": 2, "log_every": 3},
    "book": {},
    "ablations": {"ablations": True},
    "long": {"steps": 2000, "dim": 128, "n_heads": 8, "batch_size": 32, "seq_len": 128,
             "log_every": 200, "analyse_seqs": 128, "final_eval_batches": 64},
}  # fmt: skip


def kappa_scale(dim: int, n_heads: int, seq_len: int, tau: float | None = None) -> float:
    """The critical metric strength of Proposition 3.5, ``tau / L`` (``tau`` by default
    ``sqrt(2 d_head)``, the temperature the attention uses)."""
    d = dim // n_heads
    return (tau if tau is not None else math.sqrt(2.0 * d)) / seq_len


def chapter_grid(
    *,
    steps: int = 100,
    dim: int = 64,
    n_layers: int = 2,
    n_heads: int = 4,
    seq_len: int = 64,
    batch_size: int = 8,
    lr: float = 3e-3,
    log_every: int = 25,
    ranks: Sequence[int] = (1, 2, 4, 8),
    alphas: Sequence[float] = (0.0, 0.5, 1.0),
    kappa_factors: Sequence[float] = (0.1, 1.0, 10.0),
    default_kappa_factor: float = 1.0,
    eval_alphas: Sequence[float] = (0.0, 0.5, 1.0),
    analyse_seqs: int = 32,
    final_eval_batches: int = 8,
    reg_weights: dict[str, float] | None = None,
    ablations: bool = False,
) -> dict[str, dict[str, Any]]:
    """The configurations of chapter 4, sharing runs across predictions.

    ``dot`` is the baseline; ``fbt`` the default Fiber Bundle Transformer (rank 4, alpha 1, the
    three regularisers with the cap, ``kappa_max = default_kappa_factor * tau / L`` and
    ``kappa_min = kappa_max / 2``), which is also the "three regularisers" arm of P3, the
    ``alpha = 1`` arm of P2, the ``r = 4`` arm of P6 and one level of P1. The others change one
    thing each: ``fbt_reg-none``, ``fbt_reg-l2`` (P3), ``fbt_alpha-<a>`` (P2), ``fbt_rank-<r>``
    (P6), ``fbt_kappa-<c>`` (P1), and with ``ablations`` ``fbt_no-<phase>`` (each phase off alone).
    """
    eval_alphas = [float(a) for a in eval_alphas]
    scale = kappa_scale(dim, n_heads, seq_len)
    train = {
        "steps": steps, "batch_size": batch_size, "seq_len": seq_len, "lr": lr,
        "warmup_steps": max(1, steps // 10), "log_every": log_every, "eval_batches": 2,
        "final_eval_batches": final_eval_batches, "eval_batch_size": 32,
    }  # fmt: skip
    model = {"dim": dim, "n_layers": n_layers, "n_heads": n_heads, "max_len": seq_len}

    def fbt(
        rank: int = 4,
        alpha: float = 1.0,
        reg: str = "three",
        factor: float = default_kappa_factor,
        evals: list[float] | None = None,
        keep_tokens: bool = False,
        **phases: Any,
    ) -> dict[str, Any]:
        return {
            "kind": "fbt", "model": {**model, "rank": rank, "alpha": alpha, **phases}, "train": train,
            "reg": {"kind": reg, "kappa_max": factor * scale, "kappa_min": 0.5 * factor * scale,
                    "weights": reg_weights or {}},
            "kappa_factor": factor, "eval_alphas": evals or [], "analyse_seqs": analyse_seqs,
            "keep_tokens": keep_tokens,
        }  # fmt: skip

    grid: dict[str, dict[str, Any]] = {
        "dot": {"kind": "dot", "model": model, "train": train, "analyse_seqs": analyse_seqs},
        "fbt": fbt(evals=eval_alphas, keep_tokens=True),
    }
    for reg in ("none", "l2"):
        grid[f"fbt_reg-{reg}"] = fbt(reg=reg)
    for a in alphas:
        if a != 1.0:
            grid[f"fbt_alpha-{a:g}"] = fbt(alpha=a, evals=eval_alphas)
    for r in ranks:
        if r != 4:
            grid[f"fbt_rank-{r}"] = fbt(rank=r)
    for c in kappa_factors:
        if c != default_kappa_factor:
            grid[f"fbt_kappa-{c:g}"] = fbt(factor=c)
    if ablations:
        for ph in PHASES:
            off: dict[str, Any] = {f"phase_{ph}": False}
            grid[f"fbt_no-{ph}"] = fbt(**off)
        grid["fbt_cayley"] = fbt(transport_kind="cayley")
    return grid


def run_cell(params: dict[str, Any], seed: int) -> dict[str, Any]:
    """Train one configuration of :func:`chapter_grid` at ``seed`` on char-PTB and measure it.

    Returns scalars (``val_bpc``, ``train_time_s``, ``tokens_per_s``, parameter counts, the
    :func:`analyse` scalars, ``bpc_at_alpha_<a>`` for each evaluation alpha) and, in the cell's
    JSON only, ``history`` (the training log, diagnostics included) and, if asked, ``tokens``.
    """
    from .data import load_char_ptb
    from .models import param_counts
    from .train import TrainConfig, evaluate, train

    data = load_char_ptb()
    is_fbt = params["kind"] == "fbt"
    mcfg: ModelConfig = (
        FiberBundleConfig(**params["model"]) if is_fbt else ModelConfig(**params["model"])
    )
    tp = dict(params["train"])
    regs: list[dict[str, Any]] = []
    diags: list[dict[str, Any]] = []
    if is_fbt:
        reg = params["reg"]
        regs = fiber_bundle_regularizers(
            reg["kind"], steps=tp["steps"], kappa_min=reg["kappa_min"], kappa_max=reg["kappa_max"],
            weights=_scaled_weights(reg.get("weights", {}), reg["kappa_max"]),
        )  # fmt: skip
        diags = [
            {"name": "fiber_bundle", "kappa_min": reg["kappa_min"], "kappa_max": reg["kappa_max"]}
        ]
    tcfg = TrainConfig(**tp, seed=seed, progress=False, measure_flops=False, regularizers=regs,
                       diagnostics=diags)  # fmt: skip
    t0 = time.perf_counter()
    out0 = _initial_metric_strength(mcfg, data, seed, tp["seq_len"]) if is_fbt else {}
    res = train(mcfg, tcfg, data)
    out: dict[str, Any] = {
        **out0,
        "val_bpc": res.final["val_bpc"],
        "train_time_s": res.final["train_time_s"],
        "tokens_per_s": res.final.get("tokens_per_s", math.nan),
    }
    pc = param_counts(res.model)
    out.update({f"params_{k}": v for k, v in pc.items()})
    an = analyse(res.model, data, seq_len=tp["seq_len"], n_seqs=int(params.get("analyse_seqs", 64)))
    tokens = an.pop("tokens")
    out.update(an)
    for a in params.get("eval_alphas", []):
        with evaluated_at_alpha(res.model, a):
            ev = evaluate(res.model, data, split="val", batch_size=tp.get("eval_batch_size", 32),
                          seq_len=tp["seq_len"], max_batches=tp.get("final_eval_batches"))  # fmt: skip
        out[f"bpc_at_alpha_{a:g}"] = ev["bpc"]
    out["cell_train_and_measure_s"] = time.perf_counter() - t0
    out["history"] = res.history.to_dict(orient="list")
    if params.get("keep_tokens") and is_fbt:
        out["tokens"] = tokens.to_dict(orient="list")
    return out


@torch.no_grad()
def _initial_metric_strength(
    mcfg: ModelConfig, data: Any, seed: int, seq_len: int
) -> dict[str, float]:
    """``kappa_init_<l>``: mean ``|U_t|_F^2`` of each layer at initialisation (the same initial
    weights as the training run: same seed, same construction order), on 8 validation windows."""
    from .data import eval_windows
    from .train import seed_everything

    cfg = replace(mcfg, vocab_size=int(data.vocab_size), max_len=max(mcfg.max_len, seq_len))
    seed_everything(seed)
    model = cfg.build().eval()
    x, _ = next(eval_windows(data.valid, 8, seq_len))
    out = model(x)
    return {
        f"kappa_init_{i + 1}": float((U**2).sum((-1, -2)).mean())
        for i, U in enumerate(metric_factors(out))
    }


def _scaled_weights(weights: dict[str, float], kappa_max: float) -> dict[str, float]:
    """Default regulariser weights made scale-free in the metric strength: the diversity and
    smoothness terms grow like ``kappa^2``, so their weights are divided by ``kappa_max``
    (their gradient then stays O(1) at the cap); the hinge terms (anti-flatness, cap) are linear
    in ``kappa`` and keep theirs, the cap ten times stronger than the diversity push."""
    w = {"anti": 1.0, "div": 1.0 / kappa_max, "smooth": 0.1 / kappa_max, "cap": 10.0, "l2": 1.0}
    w.update(weights)
    return w


def history_frame(cell: dict[str, Any]) -> pd.DataFrame:
    """The training history stored in a cell's JSON as a DataFrame."""
    return pd.DataFrame(cell["history"])
