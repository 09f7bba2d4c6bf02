"""Random float64 inputs shared by the Riemannian attention tests."""

from __future__ import annotations

import math

import torch

from attention_atlas.attention.riemannian import geodesic_scores_dense

DT = torch.float64
TOL = 1e-10


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest absolute difference relative to the largest entry of ``b``."""
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def inputs(shape=(2, 3), L=13, d=5, r=2, dv=4, seed=0, scale=0.5, grad=False):
    """``q, k (*shape, L, d)``, ``v (*shape, L, dv)``, ``U (*shape, L, d, r)`` in float64."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(*shape, L, d, generator=g, dtype=DT)
    k = torch.randn(*shape, L, d, generator=g, dtype=DT)
    v = torch.randn(*shape, L, dv, generator=g, dtype=DT)
    U = scale * torch.randn(*shape, L, d, r, generator=g, dtype=DT)
    if grad:
        for t in (q, k, v, U):
            t.requires_grad_(True)
    return q, k, v, U


def eq27_reference(q, k, U, tau, alpha, baseline, omega=None):
    """Eq. (27) as printed, ``s_base + alpha (s_riem - s_base)``, on the definition eq. (6)
    with the curvature proxy of eq. (23) (``-(Omega_i + Omega_j) / tau``)."""
    s_riem = geodesic_scores_dense(q, k, U, tau)
    if omega is not None:
        s_riem = s_riem - (omega.unsqueeze(-1) + omega.unsqueeze(-2)) / tau
    if baseline == "dot":
        s_base = q @ k.mT / math.sqrt(q.shape[-1])
    else:
        s_base = -((q.unsqueeze(-2) - k.unsqueeze(-3)) ** 2).sum(-1) / tau
    return s_base + alpha * (s_riem - s_base)
