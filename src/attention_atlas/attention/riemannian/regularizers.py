"""The geometric regularisers of Section 6.4, eqs. (31) to (34), their schedule, and the
settings of prediction P3 (the harness regulariser ``"fiber_bundle"`` that adds them to a
model's training loss is :func:`attention_atlas.models.fiber_bundle.fiber_bundle_regularizer`).

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
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from attention_atlas import native
from attention_atlas.linalg import lowrank_gram_distance_sq, sym_pack_gram

from .geometry import factor_rows, metric_strength

__all__ = [
    "TERMS",
    "RegularizerSchedule",
    "anti_flatness_loss",
    "check_positions",
    "curvature_smoothness_loss",
    "fiber_bundle_regularizers",
    "gram_sums",
    "metric_cap_loss",
    "metric_distances",
    "metric_diversity_loss",
    "regularizer_terms",
]


def check_positions(U: Tensor, what: str) -> int:
    """The number of positions of ``U (..., L, d, r)``; an error naming ``what`` if under 2."""
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
    ordered pairs ``i != j`` (or from ``distances``, :func:`metric_distances` if already
    computed): their sum is ``2 L sum_t |A_t|_F^2 - 2 |sum_t A_t|_F^2``, so all pairs cost
    ``O(L d r^2)``, no ``(L, L)`` matrix.
    """
    seq = check_positions(U, "metric diversity")
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
    if distances is not None:
        return -(distances.sum((-1, -2)) / (seq * (seq - 1))).mean()  # its diagonal is 0
    self_sq, total_sq = _pair_sums(U)
    return _mean_pair_distance(self_sq, total_sq, seq).neg().mean()


def _pair_sums(U: Tensor) -> tuple[Tensor, Tensor]:
    """``S_tt = |U_t^T U_t|_F^2`` per token ``(..., L)`` and ``sum_ij S_ij = |sum_t U_t U_t^T|_F^2``
    per sequence ``(...)``, with ``S_ij = |U_i^T U_j|_F^2 = <A_i, A_j>_F``: ``O(L d r^2)`` and one
    ``d x d`` matrix per sequence, no ``(L, L)`` one."""
    self_sq, _, total_sq = gram_sums(U)
    return self_sq, total_sq


class _GramSums(torch.autograd.Function):
    """``(|G_t|^2, |C_t|^2, |M|^2)`` with ``G_t = U_t^T U_t``, ``C_t = U_t^T U_{t+1}`` and
    ``M = sum_t U_t U_t^T``, on ``ut = U^T (N, L, r, d)``. The backward is written out, so it is
    a few products instead of autograd's many tiny ones: with respect to ``U_t^T``,
    ``4 ds_t G_t U_t^T + 2 dc_t C_t U_{t+1}^T + 2 dc_{t-1} C_{t-1}^T U_{t-1}^T + 4 dm U_t^T M``."""

    @staticmethod
    def forward(ctx, ut: Tensor) -> tuple[Tensor, Tensor, Tensor]:  # type: ignore[override]
        n, seq, r, d = ut.shape
        g = ut @ ut.transpose(-1, -2)  # (N, L, r, r)
        tokens = ut.reshape(n * seq, r, d)  # neighbours in one product; drop pairs across rows
        c = torch.bmm(tokens[:-1], tokens[1:].transpose(1, 2))
        c = torch.cat([c, c.new_zeros(1, r, r)]).view(n, seq, r, r)[:, :-1]  # (N, L-1, r, r)
        flat = ut.reshape(n, seq * r, d)
        m = flat.transpose(1, 2) @ flat  # (N, d, d)
        ctx.save_for_backward(ut, g, c, m)
        return g.square().sum((-1, -2)), c.square().sum((-1, -2)), m.square().sum((-1, -2))

    @staticmethod
    def backward(ctx, ds: Tensor, dc: Tensor, dm: Tensor) -> Tensor:  # type: ignore[override]
        ut, g, c, m = ctx.saved_tensors
        n, seq, r, d = ut.shape
        zero_c = c.new_zeros(n, 1, r, r)
        a_next = torch.cat([2 * dc[..., None, None] * c, zero_c], 1)  # multiplies U_{t+1}^T
        a_prev = torch.cat([zero_c, 2 * dc[..., None, None] * c.transpose(-1, -2)], 1)  # U_{t-1}^T
        zero_u = ut.new_zeros(n, 1, r, d)
        coef = torch.cat([4 * ds[..., None, None] * g, a_next, a_prev], -1)  # (N, L, r, 3r)
        rows = torch.cat(
            [ut, torch.cat([ut[:, 1:], zero_u], 1), torch.cat([zero_u, ut[:, :-1]], 1)], -2
        )
        grad = (coef @ rows).reshape(n, seq * r, d)  # (N, L r, d)
        grad = grad + (4 * dm[:, None, None]) * (ut.reshape(n, seq * r, d) @ m)  # M symmetric
        return grad.view(n, seq, r, d)


def gram_sums(U: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(|U_t^T U_t|_F^2 (..., L), |U_t^T U_{t+1}|_F^2 (..., L-1), |sum_t U_t U_t^T|_F^2 (...))``
    for ``U (..., L, d, r)``: the sums behind the diversity (eq. (32)) and smoothness (eq. (33))
    terms, with :class:`_GramSums`' written-out backward."""
    *batch, seq, d, r = U.shape
    ut = factor_rows(U, per_sequence=True)
    if native.active(ut) and r <= native.MAX_RANK:  # the native kernel (opt-in)
        from attention_atlas.native.functions import GramSums

        self_sq, cross_sq, total_sq = GramSums.apply(ut.contiguous())
    else:
        self_sq, cross_sq, total_sq = _GramSums.apply(ut)
    return (self_sq.view(*batch, seq), cross_sq.view(*batch, seq - 1), total_sq.view(batch))


def _mean_pair_distance(self_sq: Tensor, total_sq: Tensor, seq: int) -> Tensor:
    """``mean_{i != j} |A_i - A_j|_F^2 = (2 L sum_t S_tt - 2 sum_ij S_ij) / (L (L - 1))``."""
    return (2 * seq * self_sq.sum(-1) - 2 * total_sq) / (seq * (seq - 1))


def curvature_smoothness_loss(U: Tensor, *, distances: Tensor | None = None) -> Tensor:
    """Eq. (33): mean over adjacent positions of ``||U_t U_t^T - U_{t+1} U_{t+1}^T||_F^2``, by the
    ``O(r^2 d)`` identity, or read off ``distances`` (:func:`metric_distances`) when given."""
    check_positions(U, "curvature smoothness")
    if distances is not None:
        return distances.diagonal(offset=1, dim1=-2, dim2=-1).mean()
    return lowrank_gram_distance_sq(U[..., :-1, :, :], U[..., 1:, :, :]).mean()


TERMS = ("anti", "div", "smooth", "cap", "l2")


def regularizer_terms(
    U: Tensor, *, kappa_min: float, kappa_max: float, terms: tuple[str, ...] = TERMS
) -> dict[str, Tensor]:
    """The raw Section 6.4 terms of one layer's ``U (B, H, L, d, r)``: ``anti`` (eq. (31)),
    ``div`` (eq. (32), all ordered pairs ``i != j`` of a sequence), ``smooth`` (eq. (33)),
    ``cap`` (eq. (34)) and ``l2`` (``mean_t |U_t|_F^2``, the "standard regularisation" of
    Conjecture 6.3), or those of them named in ``terms``; they share one
    :func:`metric_strength` and the Gram sums of :func:`_pair_sums` (``O(L d r^2)``, no
    ``(L, L)`` matrix: the diversity by its all-pairs identity, the smoothness from
    ``|A_t|_F^2`` and ``|U_t^T U_{t+1}|_F^2``)."""
    seq = check_positions(U, "the metric regularisers")
    bad = sorted(set(terms) - set(TERMS))
    if bad:
        raise ValueError(f"unknown regulariser term {bad[0]!r}; the terms are {', '.join(TERMS)}")
    kappa = metric_strength(U)  # (..., L)
    out: dict[str, Tensor] = {}
    if "div" in terms or "smooth" in terms:
        self_sq, cross, total_sq = gram_sums(U)
        if "div" in terms:
            out["div"] = _mean_pair_distance(self_sq, total_sq, seq).neg().mean()
        if "smooth" in terms:  # |A_t - A_{t+1}|^2 = S_tt - 2 S_t,t+1 + S_t+1,t+1
            out["smooth"] = (self_sq[..., :-1] + self_sq[..., 1:] - 2 * cross).mean()
    if "anti" in terms:
        out["anti"] = anti_flatness_loss(U, kappa_min, kappa=kappa)
    if "cap" in terms:
        out["cap"] = metric_cap_loss(U, kappa_max, kappa=kappa)
    if "l2" in terms:
        out["l2"] = kappa.mean()
    return {k: out[k] for k in TERMS if k in out}


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
