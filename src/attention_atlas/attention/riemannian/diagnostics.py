"""Monitoring the geometry during training: metric strength (prediction P3), transport isometry
(eq. (25)), the attention's second singular value (Conjecture 3.6), and the harness diagnostic
``"fiber_bundle"`` that logs them per layer at each log step."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .geometry import isometry_defect, metric_strength, torsion_dense, transport_dense
from .regularizers import regularizer_terms

if TYPE_CHECKING:
    from ...models import ModelOutput
    from .modules import RiemannianAttention

__all__ = [
    "attention_sigma2",
    "fiber_bundle_diagnostic",
    "isometry_errors",
    "kappa_statistics",
    "metric_statistics",
    "perturbation_entry_scale",
]


def metric_statistics(U: Tensor) -> dict[str, Tensor]:
    """Monitoring for metric collapse (prediction P3): mean, variance and max of
    ``kappa_t = ||U_t||_F^2`` for ``U (..., L, d, r)`` (the variance is over positions, averaged
    over the rest: the paper's ``sigma_U^2``; the max is its ``U-bar^2``), detached scalars."""
    kappa = metric_strength(U.detach())
    return {
        "metric_kappa_mean": kappa.mean(),
        "metric_kappa_var": kappa.var(-1, unbiased=False).mean(),
        "metric_kappa_max": kappa.amax(),
    }


def perturbation_entry_scale(q: Tensor, k: Tensor, U: Tensor, tau: float) -> Tensor:
    """``U-bar^2 M / tau``: the largest change the metric can make to one score entry
    (Proposition 3.5: ``|Delta S_ij| <= U-bar^2 M / tau`` with ``U-bar^2 = max_t ||U_t||_F^2`` and
    ``M = max_ij ||q_i - k_j||^2``, each per sequence and head). Eq. (12)'s Frobenius bound is
    ``L`` times it. The axis of prediction P1 in chapters 2 and 4: the spectrum of ``A`` can move
    only once this is of order one.

    ``q, k (..., L, d)``, ``U (..., L, d, r)`` -> ``(...)``.
    """
    if q.shape != k.shape or U.shape[:-1] != q.shape:
        raise ValueError(
            f"expected q, k (..., L, d) and U (..., L, d, r) of one (..., L, d), got q "
            f"{tuple(q.shape)}, k {tuple(k.shape)}, U {tuple(U.shape)}"
        )
    if not (math.isfinite(tau) and tau > 0):
        raise ValueError(f"tau must be a positive finite number, got {tau!r}")
    ubar2 = metric_strength(U).amax(-1)  # (...)
    diff = q.unsqueeze(-2) - k.unsqueeze(-3)  # (..., L, L, d)
    M = diff.pow(2).sum(-1).flatten(-2).amax(-1)  # (...)
    return ubar2 * M / tau


def kappa_statistics(U: Tensor) -> dict[str, float]:
    """:func:`metric_statistics` of ``U (B, H, L, d, r)`` in float32, as floats named
    ``kappa_mean``, ``kappa_max``, ``kappa_var``."""
    stats = metric_statistics(U.float())
    return {k: float(stats[f"metric_{k}"]) for k in ("kappa_mean", "kappa_max", "kappa_var")}


def isometry_errors(a: Tensor, b: Tensor) -> dict[str, float]:
    """Mean over tokens of ``|P^T P - I|_F`` for the same ``Delta = A B^T - B A^T`` (eq. (25)):
    ``iso_linear`` for ``P = I + Delta`` (:func:`isometry_defect`), ``iso_cayley`` for the Cayley
    form (formed densely: zero up to rounding), and ``delta_fro = mean |Delta|_F``, in float64.
    ``a, b (..., d, r)``."""
    a, b = a.detach().double(), b.detach().double()
    P = transport_dense(a, b, "cayley")
    eye = torch.eye(a.shape[-2], dtype=a.dtype, device=a.device)
    err = P.transpose(-1, -2) @ P - eye
    return {
        "iso_linear": float(isometry_defect(a, b).mean()),
        "iso_cayley": float(err.pow(2).sum((-1, -2)).sqrt().mean()),
        "delta_fro": float(torsion_dense(a, b).pow(2).sum((-1, -2)).sqrt().mean()),
    }


def attention_sigma2(probs: Tensor) -> float:
    """Mean second singular value of the attention matrices ``probs (B, H, L, L)`` (Conj. 3.6)."""
    s = torch.linalg.svdvals(probs.detach().double())  # (B, H, L)
    return float(s[..., 1].mean())


def _layer_gates(m: RiemannianAttention) -> dict[str, float]:
    """The squashed gates of one layer: ``gamma`` (A++), ``gamma_T`` (C), ``beta_scale`` (B)."""
    row: dict[str, float] = {}
    if m.projection is not None:
        row["gamma"] = float(torch.sigmoid(m.projection.gamma_param.detach()))
    if m.torsion_gate is not None:
        row["gamma_T"] = float(torch.sigmoid(m.torsion_gate.detach()))
    if m.curvature is not None:
        row["beta_scale"] = float(F.softplus(m.curvature.beta.detach()))
    return row


def _layer_row(
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
    from ...models import fbt_attentions  # the model layer sits above this package

    row: dict[str, float] = {}
    mods = fbt_attentions(model)
    for i, res in enumerate(output.attentions):
        p = f"l{i}/"
        layer = _layer_row(res.extras, kappa_min, kappa_max, mods[i].tau if i < len(mods) else None)
        if res.probs is not None:
            layer["sigma2"] = attention_sigma2(res.probs)
        if i < len(mods):
            layer.update(_layer_gates(mods[i]))
        row.update({p + k: v for k, v in layer.items()})
    if mods:
        row["alpha"] = float(mods[0].alpha)
    return row
