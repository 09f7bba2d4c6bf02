"""Random pure self-attention stacks (eq. (1), Dong, Cordonnier and Loukas 2021) with dot,
Euclidean or metric scores, for chapter 2 (:mod:`.rank_collapse` runs them).

The metric arms (:func:`metric_factors`) share one rule: at every layer the mean strength
``mean_t ||U_t||_F^2`` is set so that ``mean_t ||U_t||_F^2 M / tau`` equals the arm's ``entry``
(``M = max_ij |q_i - k_j|^2`` of that layer), so the regime of eq. (13) is held at every depth.
``homogeneous``: one factor shared by all tokens; ``fixed``: a factor per position drawn
independently of the tokens, with relative spread ``rho = sigma_U / mean kappa``; ``token``:
``U_t`` a random linear function of the normalised token (what a MetricNet computes, eq. (19)).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from attention_atlas.attention.riemannian import geodesic_scores
from attention_atlas.attention.riemannian.diagnostics import perturbation_entry_scale

__all__ = [
    "COLLAPSED",
    "STACK_SCORES",
    "attention_layer",
    "collapse_layer",
    "log_residual_growth",
    "metric_dispersion",
    "metric_factors",
    "pure_attention_stack",
]

StackScore = Literal["dot", "euclidean", "homogeneous", "fixed", "token"]
STACK_SCORES: tuple[StackScore, ...] = ("dot", "euclidean", "homogeneous", "fixed", "token")
#: relative residual counted as collapsed (float64 round-off is ~1e-16)
COLLAPSED = 1e-12


def _gaussian(shape: tuple[int, ...], like: Tensor, generator: torch.Generator | None) -> Tensor:
    """Standard normal draws on the CPU generator, moved to ``like``'s device and dtype."""
    return torch.randn(*shape, generator=generator, dtype=like.dtype).to(like.device)


def metric_factors(
    h: Tensor,
    score: StackScore,
    *,
    rank: int,
    strength: float | Tensor,
    spread: float = 0.0,
    generator: torch.Generator | None = None,
) -> Tensor:
    """One layer's metric factors ``U (..., L, D, r)`` for tokens ``h (..., L, D)``, with
    ``mean_t ||U_t||_F^2 = strength`` exactly (``strength`` a float or a ``(...)`` tensor).

    ``"euclidean"``: zero. ``"homogeneous"``: one Gaussian direction shared by every token.
    ``"fixed"``: a Gaussian direction per position (independent of ``h``), with ``||U_t||_F^2 =
    strength (1 + spread e_t)``, ``e_t = +-1`` on a random half of the positions (0 on the odd
    one out), so the relative spread ``std_t ||U_t||_F^2 / strength`` is ``spread`` for even L.
    ``"token"``: ``U_t = W h_t / |h_t|`` for a Gaussian ``W (D r, D)`` (a random MetricNet,
    eq. (19)), rescaled to the mean strength.
    """
    if not 0.0 <= spread < 1.0:
        raise ValueError(f"spread must be in [0, 1) (kappa_t must stay positive), got {spread!r}")
    *batch, L, dim = h.shape
    s = torch.as_tensor(strength, dtype=h.dtype, device=h.device).reshape(*batch, 1, 1, 1)
    if score == "euclidean":
        return torch.zeros(*h.shape, rank, dtype=h.dtype, device=h.device)
    if score == "homogeneous":
        V = _gaussian((dim, rank), h, generator)
        return (V / V.norm() * s.sqrt()).expand(*h.shape, rank)
    if score == "fixed":
        V = _gaussian((*batch, L, dim, rank), h, generator)
        V = V / V.flatten(-2).norm(dim=-1)[..., None, None]
        order = torch.rand(*batch, L, generator=generator).argsort(-1).to(h.device)
        e = torch.where(order < L // 2, -1.0, 1.0).to(h.dtype)
        e = torch.where(order == L - 1, 0.0, e) if L % 2 else e
        return V * (1 + spread * e).sqrt()[..., None, None] * s.sqrt()
    if score == "token":
        w = _gaussian((dim * rank, dim), h, generator)
        hn = h / h.norm(dim=-1, keepdim=True).clamp_min(1e-30)
        U = (hn @ w.T).reshape(*h.shape, rank)
        mean = U.pow(2).sum((-1, -2)).mean(-1).reshape(*batch, 1, 1, 1)
        return U * (s / mean).sqrt()
    raise ValueError(f"score must be 'euclidean', 'homogeneous', 'fixed' or 'token', got {score!r}")


def metric_dispersion(U: Tensor) -> Tensor:
    """Relative dispersion of the metrics ``A_t = U_t U_t^T`` over positions: ``sqrt(mean_t
    ||A_t - mean A||_F^2) / mean_t ||A_t||_F``; 0 for one shared metric. ``(..., L, D, r)`` ->
    ``(...)`` (0 where every factor is zero)."""
    A = U @ U.transpose(-1, -2)
    spread = (A - A.mean(-3, keepdim=True)).pow(2).sum((-1, -2)).mean(-1).sqrt()
    size = A.pow(2).sum((-1, -2)).sqrt().mean(-1)
    return torch.where(size > 0, spread / size.clamp_min(1e-300), torch.zeros_like(size))


def attention_layer(
    h: Tensor,
    *,
    score: StackScore,
    rank: int,
    entry: float,
    tau: float,
    spread: float = 0.0,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """One layer ``A H W_V`` with fresh Gaussian ``W_Q, W_K, W_V (D, D) / sqrt(D)`` (drawn in
    that order, then the metric factors): ``A = softmax(q k^T / sqrt(D))`` for ``"dot"``, else
    ``softmax`` of the geodesic score (eq. (6)) with factors of mean strength ``entry tau / M``.

    Returns:
        ``(A H W_V, entry_scale, dispersion)``: the output, the measured ``Ubar^2 M / tau``
        (:func:`~attention_atlas.attention.riemannian.diagnostics.perturbation_entry_scale`) and
        :func:`metric_dispersion`, each ``(...)`` (zero for dot and Euclidean scores).
    """
    dim = h.shape[-1]
    wq, wk, wv = (_gaussian((dim, dim), h, generator) / math.sqrt(dim) for _ in range(3))
    q, k, v = h @ wq, h @ wk, h @ wv
    zero = torch.zeros(h.shape[:-2], dtype=h.dtype, device=h.device)
    if score == "dot":
        A = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(dim), dim=-1)
        return A @ v, zero, zero
    M = (q.unsqueeze(-2) - k.unsqueeze(-3)).pow(2).sum(-1).flatten(-2).amax(-1)
    U = metric_factors(
        h, score, rank=rank, strength=entry * tau / M, spread=spread, generator=generator
    )
    A = torch.softmax(geodesic_scores(q, k, U, tau), dim=-1)
    return A @ v, perturbation_entry_scale(q, k, U, tau), metric_dispersion(U)


def pure_attention_stack(
    h0: Tensor,
    depth: int,
    *,
    score: StackScore = "dot",
    rank: int = 4,
    entry: float = 1.0,
    spread: float = 0.0,
    tau: float | None = None,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """A random pure self-attention stack ``H^{l+1} = A^l H^l W_V^l`` (eq. (1)): no residual
    connections, no feed-forward layers, one head, fresh Gaussian weights per layer
    (:func:`attention_layer`).

    Args:
        h0: ``(..., L, D)`` input tokens.
        depth: number of layers.
        score: ``"dot"`` (``q.k / sqrt(D)``, Dong et al.'s setting), ``"euclidean"``
            (``-|q-k|^2 / tau``), or a metric arm of :func:`metric_factors`.
        rank: metric rank r.
        entry: the metric's mean entry scale ``mean_t ||U_t||_F^2 M / tau``, held at every layer.
        spread: relative spread of ``||U_t||_F^2`` (``"fixed"`` only).
        tau: temperature of the distance scores (default ``sqrt(2 D)``).
        generator: for the random weights (drawn on the CPU).

    Returns:
        ``(states, entry_scale, dispersion)``: ``(depth + 1, ..., L, D)`` (the input and every
        layer's output), and per layer ``(depth, ...)`` the measured ``Ubar^2 M / tau`` and
        :func:`metric_dispersion`.
    """
    if not isinstance(depth, int) or depth < 0:
        raise ValueError(f"depth must be an integer >= 0, got {depth!r}")
    if score not in STACK_SCORES:
        raise ValueError(f"score must be one of {STACK_SCORES}, got {score!r}")
    if not (entry >= 0 and math.isfinite(entry)):
        raise ValueError(f"entry must be a non-negative number, got {entry!r}")
    t = tau if tau is not None else math.sqrt(2 * h0.shape[-1])
    states, scales, disp = [h0], [], []
    for _ in range(depth):
        h, s, dsp = attention_layer(
            states[-1], score=score, rank=rank, entry=entry, tau=t, spread=spread,
            generator=generator,
        )  # fmt: skip
        states.append(h)
        scales.append(s)
        disp.append(dsp)
    empty = torch.zeros(0, *h0.shape[:-2], dtype=h0.dtype)
    return (
        torch.stack(states),
        torch.stack(scales) if scales else empty,
        torch.stack(disp) if disp else empty,
    )


def collapse_layer(residuals: Sequence[float], floor: float = COLLAPSED) -> int:
    """First layer whose relative residual is below ``floor`` (``len(residuals)`` if none:
    one past the last layer)."""
    below = [i for i, x in enumerate(residuals) if x < floor]
    return below[0] if below else len(residuals)


def log_residual_growth(median_residual: Sequence[float], floor: float = COLLAPSED) -> list[float]:
    """``log res_{l+1} / log res_l`` for the layers where the residual is below 1/2 and the next
    one above ``floor``: about 2 per layer for a doubly exponential decay, 1 for an exponential."""
    res = np.asarray(median_residual, dtype=float)
    logs = np.log(res)
    window = [i for i in range(len(logs) - 1) if res[i] < 0.5 and res[i + 1] > floor]
    return [float(logs[i + 1] / logs[i]) for i in window]
