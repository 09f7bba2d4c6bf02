"""Monitoring the geometry during training: metric strength (prediction P3), transport isometry
(eq. (25)), and the attention's second singular value (Conjecture 3.6); the harness diagnostic that logs
them per layer at each log step is :func:`attention_atlas.models.fiber_bundle.fiber_bundle_diagnostic`."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .geometry import isometry_defect, metric_strength, torsion_dense, transport_dense

__all__ = [
    "attention_sigma2",
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
