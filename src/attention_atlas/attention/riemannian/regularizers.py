"""The geometric regularisers of Section 6.4, eqs. (31) to (34), their schedule, and the harness
regulariser ``"fiber_bundle"`` that adds them to a training loss.

With ``kappa_t = |U_t|_F^2`` and ``A_t = U_t U_t^T``, per sequence of L positions:

* anti-flatness, eq. (31): ``mean_t ReLU(kappa_min - kappa_t)``;
* diversity, eq. (32): ``-mean_{(i, j)} |A_i - A_j|_F^2`` over pairs of positions;
* curvature smoothness, eq. (33): ``mean_t |A_t - A_{t+1}|_F^2``;
* cap, eq. (34): ``mean_t ReLU(kappa_t - kappa_max)``.

The distances ``|A_i - A_j|_F^2`` never form ``d x d`` matrices: for all pairs they are one Gram
product of the Frobenius-isometric packings (:func:`metric_distances`), for a few pairs the
``O(r^2 d)`` identity of Section 6.4 (:func:`attention_atlas.linalg.lowrank_gram_distance_sq`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...linalg import lowrank_gram_distance_sq, sym_pack_gram
from .geometry import metric_strength

if TYPE_CHECKING:
    from ...models import ModelOutput

__all__ = [
    "RegularizerSchedule",
    "anti_flatness_loss",
    "curvature_smoothness_loss",
    "fiber_bundle_regularizer",
    "fiber_bundle_regularizers",
    "metric_cap_loss",
    "metric_distances",
    "metric_diversity_loss",
    "regularizer_terms",
]


def _check_positions(U: Tensor, what: str) -> int:
    seq = U.shape[-3] if U.dim() >= 3 else 0
    if seq < 2:
        raise ValueError(f"{what} needs at least 2 positions, got L={seq} (U {tuple(U.shape)})")
    return seq


def metric_distances(U: Tensor) -> Tensor:
    """``D_ij = |U_i U_i^T - U_j U_j^T|_F^2`` for every pair of positions, ``(..., L, L)``.

    ``S_ij = |U_i^T U_j|_F^2 = <A_i, A_j>_F`` is one product of the packings
    :func:`attention_atlas.linalg.sym_pack_gram` (``d (d + 1) / 2`` numbers per token), and
    ``D_ij = S_ii - 2 S_ij + S_jj`` (the identity of Section 6.4). ``U (..., L, d, r)``.
    """
    packed = sym_pack_gram(U)  # (..., L, d(d+1)/2)
    S = packed @ packed.transpose(-1, -2)  # (..., L, L): S_ij = |U_i^T U_j|_F^2
    self_sq = S.diagonal(dim1=-2, dim2=-1)  # (..., L)
    return self_sq.unsqueeze(-1) + self_sq.unsqueeze(-2) - 2 * S


def anti_flatness_loss(U: Tensor, kappa_min: float, *, kappa: Tensor | None = None) -> Tensor:
    """Eq. (31): mean over tokens of ``ReLU(kappa_min - ||U_t||_F^2)``. ``U (..., L, d, r)``;
    ``kappa``: :func:`metric_strength` of ``U`` if already computed."""
    kappa = metric_strength(U) if kappa is None else kappa
    return F.relu(kappa_min - kappa).mean()


def metric_cap_loss(U: Tensor, kappa_max: float, *, kappa: Tensor | None = None) -> Tensor:
    """Eq. (34): mean over tokens of ``ReLU(||U_t||_F^2 - kappa_max)``. ``U (..., L, d, r)``;
    ``kappa``: :func:`metric_strength` of ``U`` if already computed."""
    kappa = metric_strength(U) if kappa is None else kappa
    return F.relu(kappa - kappa_max).mean()


def metric_diversity_loss(
    U: Tensor,
    *,
    pairs: Tensor | None = None,
    n_pairs: int | None = None,
    generator: torch.Generator | None = None,
    distances: Tensor | None = None,
) -> Tensor:
    """Eq. (32): ``-mean over pairs (i, j) of ||U_i U_i^T - U_j U_j^T||_F^2`` within each sequence.

    ``U (..., L, d, r)``. Pairs: ``pairs (P, 2)`` of positions, or ``n_pairs`` sampled uniformly
    among ``i != j`` (with ``generator``), both by the ``O(r^2 d)`` identity; or by default all
    ordered pairs ``i != j``, from :func:`metric_distances` (or ``distances``, its value if
    already computed).
    """
    seq = _check_positions(U, "metric diversity")
    if pairs is None and n_pairs is not None:
        i = torch.randint(0, seq, (n_pairs,), generator=generator, device="cpu")
        j = (i + torch.randint(1, seq, (n_pairs,), generator=generator, device="cpu")) % seq
        pairs = torch.stack([i, j], -1)
    if pairs is not None:
        pairs = pairs.to(U.device)
        if pairs.dim() != 2 or pairs.shape[-1] != 2:
            raise ValueError(f"pairs must have shape (P, 2), got {tuple(pairs.shape)}")
        ui = U.index_select(-3, pairs[:, 0])
        uj = U.index_select(-3, pairs[:, 1])
        return -lowrank_gram_distance_sq(ui, uj).mean()
    dist = metric_distances(U) if distances is None else distances
    return -(dist.sum((-1, -2)) / (seq * (seq - 1))).mean()  # the diagonal of dist is 0


def curvature_smoothness_loss(U: Tensor, *, distances: Tensor | None = None) -> Tensor:
    """Eq. (33): mean over adjacent positions of ``||U_t U_t^T - U_{t+1} U_{t+1}^T||_F^2``, by the
    ``O(r^2 d)`` identity, or read off ``distances`` (:func:`metric_distances`) when given."""
    _check_positions(U, "curvature smoothness")
    if distances is not None:
        return distances.diagonal(offset=1, dim1=-2, dim2=-1).mean()
    return lowrank_gram_distance_sq(U[..., :-1, :, :], U[..., 1:, :, :]).mean()


def regularizer_terms(U: Tensor, *, kappa_min: float, kappa_max: float) -> dict[str, Tensor]:
    """The raw Section 6.4 terms of one layer's ``U (B, H, L, d, r)``: ``anti`` (eq. (31)),
    ``div`` (eq. (32), all ordered pairs ``i != j`` of a sequence), ``smooth`` (eq. (33)),
    ``cap`` (eq. (34)) and ``l2`` (``mean_t |U_t|_F^2``, the "standard regularisation" of
    Conjecture 6.3), sharing one :func:`metric_strength` and one :func:`metric_distances`."""
    _check_positions(U, "the metric regularisers")
    dist = metric_distances(U)
    kappa = metric_strength(U)  # (..., L)
    return {
        "anti": anti_flatness_loss(U, kappa_min, kappa=kappa),
        "div": metric_diversity_loss(U, distances=dist),
        "smooth": curvature_smoothness_loss(U, distances=dist),
        "cap": metric_cap_loss(U, kappa_max, kappa=kappa),
        "l2": kappa.mean(),
    }


@dataclass
class RegularizerSchedule:
    """Weights of the geometric regularisers against the optimiser step.

    Anti-flatness (eq. (31)) and diversity (eq. (32)) are "strong early, relaxed later": their
    weight is ``w`` until ``relax_start * steps``, then falls along a half cosine to
    ``relax_to * w`` at ``relax_end * steps`` and stays there. Smoothness (eq. (33)), the cap
    (eq. (34)) and the plain L2 penalty (``mean_t |U_t|_F^2``) keep their weight.
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
    from ...models import metric_factors  # the model layer sits above this package

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
