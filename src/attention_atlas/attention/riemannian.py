"""Riemannian attention with per-token low-rank metrics (Song 2026, the seed paper).

Every token ``t`` carries a metric ``g_t = I + U_t U_t^T`` with ``U_t (d, r)`` (eq. (4)); a pair
uses ``g_ij = I + (U_i U_i^T + U_j U_j^T) / 2`` (eq. (5)) and the score is the negative squared
distance under it (eq. (6)):

    S_ij = -(q_i - k_j)^T g_ij (q_i - k_j) / tau
         = -(|q_i - k_j|^2 + |U_i^T (q_i - k_j)|^2 / 2 + |U_j^T (q_i - k_j)|^2 / 2) / tau  (eq. (15))

Three ways to compute the scores, side by side:

* :func:`geodesic_scores_dense` forms every ``g_ij`` (``(L, L, d, d)``): the definition.
* :func:`geodesic_scores` materialises the differences ``q_i - k_j`` (``(L, L, d)``) and their
  projections (eq. (15)): the reference the fast paths are tested against.
* :func:`geodesic_scores_decomposed` is eq. (16): per-token quantities plus the pairwise
  ``U_i^T k_j`` and ``U_j^T q_i`` (``(L, L, r)``). These pair token i's metric with token j's key,
  so they cost ``O(d r)`` per pair, not the ``O(r)`` the paper states.

The fast path rests on one identity. Up to terms constant along a softmax row,

    S_ij = <Qhat_i, Khat_j>,  Qhat_i, Khat_j in R^{d^2 + 3d + 1}   (:func:`geodesic_features`)

because ``k^T A_i k = <A_i, k k^T>_F`` separates with the symmetric packing of
:func:`attention_atlas.linalg.sym_pack` (``d (d + 1) / 2`` numbers, Frobenius-isometric), and so
does ``q^T A_j q``. The whole score tile is then one matrix product, and
:func:`geodesic_attention` runs a blocked, online-softmax ("flash") attention on the augmented
features (:func:`blocked_attention`, a custom autograd function whose backward recomputes the
tiles), so memory stays linear in L. The augmented dimension ``d^2 + 3d + 1`` is exactly the
``d(d+1)``-sized obstruction of Theorem 3.2 plus the Euclidean part: the fast path is the
theorem's factorisation, made into an algorithm.

Also here: the curvature proxy (eq. (21)), MetricNet (eq. (19)), metric-aware projection
(eq. (20)), TorsionNet (eq. (22)), transport ``P = I + Delta`` and its Cayley form (eqs. (24),
(25)), the metric-preconditioned update (eq. (26)), hybrid blending (eq. (27), both baselines
of Section 5.8), the four regularisers (eqs. (31)-(34)) and the :class:`RiemannianAttention`
module, registered as ``"riemannian"``.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from ..linalg import (
    lowrank_gram_distance_sq,
    metric_inverse_apply,
    sym_pack_indices,
)
from .base import (
    Attention,
    AttentionResult,
    check_qkv,
    combine_masks,
    count_nonfinite,
)
from .dot import masked_softmax

__all__ = [
    "CurvatureProxy",
    "FiberTransport",
    "MetricAwareProjection",
    "MetricNet",
    "RiemannianAttention",
    "TorsionNet",
    "anti_flatness_loss",
    "augmented_dim",
    "blocked_attention",
    "cayley_transport_apply",
    "curvature_proxy",
    "curvature_smoothness_loss",
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
    "metric_cap_loss",
    "metric_diversity_loss",
    "metric_preconditioned_update",
    "metric_statistics",
    "pairwise_metric",
    "pure_attention_stack",
    "token_metric",
    "torsion_apply",
    "torsion_dense",
    "transport_apply",
    "transport_dense",
]

Baseline = Literal["distance", "dot"]
Method = Literal["auto", "augmented", "sdpa", "lowrank", "reference"]


# ----------------------------------------------------------------------------------------
# validation
# ----------------------------------------------------------------------------------------


def _check_metric_inputs(q: Tensor, k: Tensor, U: Tensor, tau: float) -> None:
    """``q, k (..., L, d)``, ``U (..., L, d, r)``: same batch dims, same L, same d, same dtype."""
    for name, t in (("q", q), ("k", k), ("U", U)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
    if q.dim() < 2 or k.shape != q.shape:
        raise ValueError(
            f"q and k must have the same shape (..., L, d), got q {tuple(q.shape)}, k {tuple(k.shape)}"
        )
    if U.dim() != q.dim() + 1 or U.shape[:-1] != q.shape:
        raise ValueError(
            f"U must have shape (..., L, d, r) = {tuple(q.shape)} + (r,) to match q, "
            f"got {tuple(U.shape)}"
        )
    if not (q.dtype == k.dtype == U.dtype):
        raise ValueError(f"q, k, U must share a dtype, got {q.dtype}, {k.dtype}, {U.dtype}")
    if not (isinstance(tau, (int, float)) and math.isfinite(tau) and tau > 0):
        raise ValueError(f"tau must be a positive finite number, got {tau!r}")


def _check_curvature(curvature: Tensor | None, q: Tensor) -> None:
    if curvature is not None and curvature.shape != q.shape[:-1]:
        raise ValueError(
            f"curvature must have shape (..., L) = {tuple(q.shape[:-1])}, got {tuple(curvature.shape)}"
        )


def _blend_coefficients(
    d: int, tau: float, alpha: float, baseline: str
) -> tuple[float, float, float]:
    """``(c_dot, c_euc, c_met)`` with ``S = c_dot q.k - c_euc |q - k|^2 - c_met (metric terms)``.

    ``baseline="distance"``: ``S = -(|q-k|^2 + alpha * metric) / tau`` (the Section 5.8 remark);
    ``baseline="dot"``: ``S = (1 - alpha) q.k / sqrt(d) + alpha * S_riem`` (eq. (27) as printed).
    """
    if not (isinstance(alpha, (int, float)) and math.isfinite(alpha)):
        raise ValueError(f"alpha must be a finite number, got {alpha!r}")
    if baseline == "distance":
        return 0.0, 1.0 / tau, alpha / tau
    if baseline == "dot":
        return (1.0 - alpha) / math.sqrt(d), alpha / tau, alpha / tau
    raise ValueError(f"baseline must be 'distance' or 'dot', got {baseline!r}")


# ----------------------------------------------------------------------------------------
# metrics and scores (references)
# ----------------------------------------------------------------------------------------


def token_metric(U: Tensor) -> Tensor:
    """Per-token metric ``g_t = I + U_t U_t^T`` (eq. (4)): ``U (..., d, r)`` -> ``(..., d, d)``."""
    d = U.shape[-2]
    return torch.eye(d, dtype=U.dtype, device=U.device) + U @ U.transpose(-1, -2)


def pairwise_metric(U: Tensor) -> Tensor:
    """Pairwise metric ``g_ij = I + (U_i U_i^T + U_j U_j^T) / 2`` (eq. (5)).

    ``U (..., L, d, r)`` -> ``(..., L, L, d, d)``. Dense: for small checks only.
    """
    A = U @ U.transpose(-1, -2)  # (..., L, d, d)
    d = U.shape[-2]
    eye = torch.eye(d, dtype=U.dtype, device=U.device)
    return eye + (A.unsqueeze(-3) + A.unsqueeze(-4)) / 2


def geodesic_scores_dense(q: Tensor, k: Tensor, U: Tensor, tau: float) -> Tensor:
    """The definition, eq. (6): ``S_ij = -(q_i - k_j)^T g_ij (q_i - k_j) / tau`` with every
    ``g_ij`` formed. ``(..., L, L)``; memory ``O(L^2 d^2)``, for small checks only."""
    _check_metric_inputs(q, k, U, tau)
    diff = q.unsqueeze(-2) - k.unsqueeze(-3)  # (..., L, L, d)
    g = pairwise_metric(U)  # (..., L, L, d, d)
    return -torch.einsum("...a,...ab,...b->...", diff, g, diff) / tau


def geodesic_scores(
    q: Tensor, k: Tensor, U: Tensor, tau: float, *, curvature: Tensor | None = None
) -> Tensor:
    """Geodesic scores by eq. (15), materialised: the reference.

    ``S_ij = -(|q_i - k_j|^2 + |U_i^T (q_i-k_j)|^2 / 2 + |U_j^T (q_i-k_j)|^2 / 2 + Omega_i + Omega_j) / tau``

    Args:
        q, k: ``(..., L, d)``.
        U: ``(..., L, d, r)``, one metric factor per position.
        tau: temperature ``> 0``.
        curvature: optional ``Omega (..., L)`` (eq. (23)); omitted = 0.

    Returns:
        ``(..., L, L)``. Memory ``O(L^2 (d + r))``.
    """
    _check_metric_inputs(q, k, U, tau)
    _check_curvature(curvature, q)
    diff = q.unsqueeze(-2) - k.unsqueeze(-3)  # (..., Li, Lj, d)
    proj_i = torch.einsum("...idr,...ijd->...ijr", U, diff)  # U_i^T (q_i - k_j)
    proj_j = torch.einsum("...jdr,...ijd->...ijr", U, diff)  # U_j^T (q_i - k_j)
    dist = (diff * diff).sum(-1) + 0.5 * (proj_i * proj_i).sum(-1) + 0.5 * (proj_j * proj_j).sum(-1)
    if curvature is not None:
        dist = dist + curvature.unsqueeze(-1) + curvature.unsqueeze(-2)
    return -dist / tau


def geodesic_scores_decomposed(q: Tensor, k: Tensor, U: Tensor, tau: float) -> Tensor:
    """Geodesic scores by the decomposition of eq. (16).

    ``|U_i^T (q_i - k_j)|^2 = |U_i^T q_i|^2 + |U_i^T k_j|^2 - 2 (U_i^T q_i).(U_i^T k_j)``, and the
    same for ``U_j``. ``U_i^T q_i`` and ``U_j^T k_j`` are per token (``O(d r)`` each), but
    ``U_i^T k_j`` and ``U_j^T q_i`` are per pair: ``(..., L, L, r)``, ``O(d r)`` work per pair.
    Returns ``(..., L, L)``.
    """
    _check_metric_inputs(q, k, U, tau)
    uq = (U.transpose(-1, -2) @ q.unsqueeze(-1)).squeeze(-1)  # U_i^T q_i      (..., L, r)
    uk = (U.transpose(-1, -2) @ k.unsqueeze(-1)).squeeze(-1)  # U_j^T k_j      (..., L, r)
    g_ij = torch.einsum("...idr,...jd->...ijr", U, k)  # U_i^T k_j          (..., L, L, r)
    h_ij = torch.einsum("...jdr,...id->...ijr", U, q)  # U_j^T q_i          (..., L, L, r)
    euc = (
        (q * q).sum(-1).unsqueeze(-1) + (k * k).sum(-1).unsqueeze(-2) - 2 * q @ k.transpose(-1, -2)
    )
    term_i = (
        (uq * uq).sum(-1).unsqueeze(-1)
        + (g_ij * g_ij).sum(-1)
        - 2 * (uq.unsqueeze(-2) * g_ij).sum(-1)
    )
    term_j = (
        (h_ij * h_ij).sum(-1)
        + (uk * uk).sum(-1).unsqueeze(-2)
        - 2 * (h_ij * uk.unsqueeze(-3)).sum(-1)
    )
    return -(euc + 0.5 * term_i + 0.5 * term_j) / tau


def hybrid_scores(
    q: Tensor,
    k: Tensor,
    U: Tensor,
    tau: float,
    alpha: float,
    *,
    baseline: Baseline = "distance",
    curvature: Tensor | None = None,
) -> Tensor:
    """Hybrid blending, eq. (27): ``s = s_euc + alpha (s_riem - s_euc)``, materialised.

    ``baseline="dot"``: ``s_euc = q_i.k_j / sqrt(d)`` (eq. (27) as printed; it mixes in the
    key-norm and temperature effects of eq. (28)). ``baseline="distance"``:
    ``s_euc = -|q_i - k_j|^2 / tau`` (the Section 5.8 remark), which is the geodesic score
    with ``U`` replaced by ``sqrt(alpha) U`` and ``Omega`` by ``alpha Omega``.
    Returns ``(..., L, L)``.
    """
    _check_metric_inputs(q, k, U, tau)
    s_riem = geodesic_scores(q, k, U, tau, curvature=curvature)
    if baseline == "dot":
        s_euc = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    elif baseline == "distance":
        s_euc = geodesic_scores(q, k, torch.zeros_like(U), tau)
    else:
        raise ValueError(f"baseline must be 'distance' or 'dot', got {baseline!r}")
    return s_euc + alpha * (s_riem - s_euc)


# ----------------------------------------------------------------------------------------
# the augmented factorisation
# ----------------------------------------------------------------------------------------


def augmented_dim(d: int) -> int:
    """Width of :func:`geodesic_features`: ``d^2 + 3 d + 1`` (``2d`` cross terms, one key bias,
    two packed symmetric blocks of ``d (d + 1) / 2``)."""
    return d * d + 3 * d + 1


def _row_constant(
    q: Tensor, U: Tensor, c_euc: float, c_met: float, curvature: Tensor | None
) -> Tensor:
    """The part of the score that depends on the query token only, ``(..., L)``."""
    uq = (U.transpose(-1, -2) @ q.unsqueeze(-1)).squeeze(-1)
    const = -c_euc * (q * q).sum(-1) - 0.5 * c_met * (uq * uq).sum(-1)
    if curvature is not None:
        const = const - c_met * curvature
    return const


def geodesic_features(
    q: Tensor,
    k: Tensor,
    U: Tensor,
    tau: float,
    *,
    alpha: float = 1.0,
    baseline: Baseline = "distance",
    curvature: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Augmented features with ``S_ij = <Qhat_i, Khat_j> + c_i`` (``c_i`` constant along row i).

    With ``A_t = U_t U_t^T`` and the blend coefficients ``(c_dot, c_euc, c_met)`` (for the plain
    geodesic score ``(0, 1/tau, 1/tau)``)::

        Qhat_i = [ (c_dot + 2 c_euc) q_i + c_met A_i q_i,  c_met q_i,  1,
                   -c_met/2 w^2 o tri(A_i),  -c_met/2 w^2 o tri(q_i q_i^T) ]
        Khat_j = [ k_j,  A_j k_j,  -c_euc |k_j|^2 - c_met (k_j^T A_j k_j / 2 + Omega_j),
                   tri(k_j k_j^T),  tri(A_j) ]

    where ``tri`` takes the upper triangle (``d (d + 1) / 2`` entries) and ``w^2`` is 1 on the
    diagonal and 2 off it, so ``<w^2 o tri(A), tri(B)> = <A, B>_F`` (the pairing of
    :func:`attention_atlas.linalg.sym_pack`). This is the separable
    representation of Theorem 3.2's proof made explicit; its width ``d^2 + 3d + 1``
    (:func:`augmented_dim`) is the price of heterogeneous metrics.

    Args:
        q, k: ``(..., L, d)``; U: ``(..., L, d, r)``; tau > 0.
        alpha, baseline: hybrid blending (eq. (27)); ``alpha=1`` is pure geodesic attention.
        curvature: optional ``Omega (..., L)`` (eq. (23)).

    Returns:
        ``(Qhat, Khat)``, each ``(..., L, d^2 + 3d + 1)``.
    """
    _check_metric_inputs(q, k, U, tau)
    _check_curvature(curvature, q)
    d = q.shape[-1]
    c_dot, c_euc, c_met = _blend_coefficients(d, tau, alpha, baseline)
    # Frobenius pairing <A, B>_F = sum_{a<=b} w_ab^2 A_ab B_ab over the upper triangle: the
    # weights w^2 (1 on the diagonal, 2 off it) go on the query side only, so the key side
    # is a plain gather (the same inner product as linalg.sym_pack on both sides).
    rows, cols, w = sym_pack_indices(d, q.device, q.dtype)
    flat = rows * d + cols
    w2 = w * w
    A = torch.einsum("...ar,...br->...ab", U, U)  # A_t = U_t U_t^T     (..., L, d, d)
    a_q = (A @ q.unsqueeze(-1)).squeeze(-1)  # A_i q_i                     (..., L, d)
    a_k = (A @ k.unsqueeze(-1)).squeeze(-1)  # A_j k_j                     (..., L, d)
    tri_a = A.flatten(-2).index_select(-1, flat)  # upper triangle of A   (..., L, d(d+1)/2)
    tri_qq = (q.unsqueeze(-1) * q.unsqueeze(-2)).flatten(-2).index_select(-1, flat)
    tri_kk = (k.unsqueeze(-1) * k.unsqueeze(-2)).flatten(-2).index_select(-1, flat)
    key_bias = -c_euc * (k * k).sum(-1, keepdim=True) - 0.5 * c_met * (k * a_k).sum(
        -1, keepdim=True
    )
    if curvature is not None:
        key_bias = key_bias - c_met * curvature.unsqueeze(-1)
    half_w2 = (-0.5 * c_met) * w2
    q_hat = torch.cat(
        [
            (c_dot + 2 * c_euc) * q + c_met * a_q,
            c_met * q,
            torch.ones_like(q[..., :1]),
            half_w2 * tri_a,
            half_w2 * tri_qq,
        ],
        dim=-1,
    )
    k_hat = torch.cat([k, a_k, key_bias, tri_kk, tri_a], dim=-1)
    return q_hat, k_hat


def geodesic_scores_augmented(
    q: Tensor,
    k: Tensor,
    U: Tensor,
    tau: float,
    *,
    alpha: float = 1.0,
    baseline: Baseline = "distance",
    curvature: Tensor | None = None,
) -> Tensor:
    """Scores from :func:`geodesic_features` as one matrix product, with the row constant
    added back, so that the result equals :func:`hybrid_scores` (and :func:`geodesic_scores`
    at ``alpha=1``). ``(..., L, L)``."""
    q_hat, k_hat = geodesic_features(
        q, k, U, tau, alpha=alpha, baseline=baseline, curvature=curvature
    )
    c_dot, c_euc, c_met = _blend_coefficients(q.shape[-1], tau, alpha, baseline)
    const = _row_constant(q, U, c_euc, c_met, curvature)
    return q_hat @ k_hat.transpose(-1, -2) + const.unsqueeze(-1)


# ----------------------------------------------------------------------------------------
# blocked ("flash") attention on arbitrary features, in pure PyTorch
# ----------------------------------------------------------------------------------------

#: score-tile budget in elements (batch x query block x key block) of the blocked paths
TILE_ELEMENTS = 1 << 22
#: largest key block; a row shorter than this is done in one pass (no online rescaling)
MAX_KEY_BLOCK = 1024


def _block_sizes(
    n: int, lq: int, lk: int, block_q: int | None, block_k: int | None
) -> tuple[int, int]:
    bk = block_k if block_k is not None else min(lk, MAX_KEY_BLOCK)
    bq = block_q if block_q is not None else max(16, TILE_ELEMENTS // max(1, n * bk))
    if bq <= 0 or bk <= 0:
        raise ValueError(f"block sizes must be positive, got block_q={bq}, block_k={bk}")
    return min(bq, max(lq, 1)), min(bk, max(lk, 1))


def _tile_keep(
    i0: int, i1: int, j0: int, j1: int, offset: int, causal: bool, keep: Tensor | None, device
) -> Tensor | None:
    """Boolean keep-mask of tile ``[i0:i1, j0:j1]`` (broadcastable to ``(N, bq, bk)``) or None."""
    tile: Tensor | None = None
    if causal and j1 - 1 > i0 + offset:  # some key in the tile lies after some query
        rows = torch.arange(i0, i1, device=device).unsqueeze(-1) + offset
        cols = torch.arange(j0, j1, device=device)
        tile = cols <= rows  # (bq, bk)
    if keep is not None:
        part = keep[..., i0:i1, j0:j1]
        tile = part if tile is None else (tile & part)
    return tile


def _flash_forward(
    qh: Tensor, kh: Tensor, v: Tensor, causal: bool, keep: Tensor | None, bq: int, bk: int
) -> tuple[Tensor, Tensor]:
    """Forward of :func:`blocked_attention` on ``(N, L, D)`` tensors: returns ``(out, lse)``."""
    n, lq, _ = qh.shape
    lk = kh.shape[1]
    offset = lk - lq  # causal alignment: query i sees keys j <= i + offset
    out = qh.new_zeros(n, lq, v.shape[-1])
    lse = qh.new_full((n, lq), float("inf"))  # +inf marks a row with no key (P = 0 there)
    kt = kh.transpose(1, 2)  # (N, D, Lk)
    for i0 in range(0, lq, bq):
        i1 = min(i0 + bq, lq)
        kend = min(lk, i1 + offset) if causal else lk
        if kend <= 0:
            continue
        qb = qh[:, i0:i1]
        m: Tensor | None = None
        l: Tensor | None = None
        acc: Tensor | None = None
        for j0 in range(0, kend, bk):
            j1 = min(j0 + bk, kend)
            s = torch.bmm(qb, kt[:, :, j0:j1])  # 1. score tile (N, bq, bk): one GEMM
            tile = _tile_keep(i0, i1, j0, j1, offset, causal, keep, qh.device)
            if tile is not None:
                s = s.masked_fill(~tile, float("-inf"))
            m_tile = s.amax(-1, keepdim=True)  # 2. online softmax (rescale old partials)
            m_new = m_tile if m is None else torch.maximum(m, m_tile)
            m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
            p = s.sub_(m_safe).exp_()
            p_sum = p.sum(-1, keepdim=True)
            pv = torch.bmm(p, v[:, j0:j1])  # 3. weighted values
            if m is None or l is None or acc is None:
                l, acc = p_sum, pv
            else:
                corr = torch.exp(m - m_safe)
                l = l * corr + p_sum
                acc = acc * corr + pv
            m = m_new  # keeps -inf for rows with no visible key yet (corr is then 0)
        if l is None or acc is None or m is None:  # unreachable: kend > 0
            continue
        ok = l > 0
        l_safe = torch.where(ok, l, torch.ones_like(l))
        out[:, i0:i1] = torch.where(ok, acc / l_safe, 0.0)
        lse[:, i0:i1] = torch.where(ok, m + torch.log(l_safe), float("inf")).squeeze(-1)
    return out, lse


def _flash_backward(
    qh: Tensor,
    kh: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    dout: Tensor,
    causal: bool,
    keep: Tensor | None,
    bq: int,
    bk: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """Backward of :func:`blocked_attention`, recomputing each probability tile from ``lse``."""
    n, lq, _ = qh.shape
    lk = kh.shape[1]
    offset = lk - lq
    delta = (dout * out).sum(-1, keepdim=True)  # (N, Lq, 1) = rowsum(dO o O)
    dq = torch.zeros_like(qh)
    dk = torch.zeros_like(kh)
    dv = torch.zeros_like(v)
    kt = kh.transpose(1, 2)
    for i0 in range(0, lq, bq):
        i1 = min(i0 + bq, lq)
        kend = min(lk, i1 + offset) if causal else lk
        if kend <= 0:
            continue
        qb, dob = qh[:, i0:i1], dout[:, i0:i1]
        lse_b = lse[:, i0:i1].unsqueeze(-1)
        for j0 in range(0, kend, bk):
            j1 = min(j0 + bk, kend)
            s = torch.bmm(qb, kt[:, :, j0:j1])  # 1. recompute the score tile
            tile = _tile_keep(i0, i1, j0, j1, offset, causal, keep, qh.device)
            if tile is not None:
                s = s.masked_fill(~tile, float("-inf"))
            p = s.sub_(lse_b).exp_()  # 2. probabilities from the saved log-sum-exp
            dv[:, j0:j1].baddbmm_(p.transpose(1, 2), dob)  # 3. dV += P^T dO
            ds = torch.bmm(dob, v[:, j0:j1].transpose(1, 2))  # 4. dP = dO V^T
            ds.sub_(delta[:, i0:i1]).mul_(p)  # 5. dS = P o (dP - delta)
            dq[:, i0:i1].baddbmm_(ds, kh[:, j0:j1])  # 6. dQ += dS K, dK += dS^T Q
            dk[:, j0:j1].baddbmm_(ds.transpose(1, 2), qb)
    return dq, dk, dv


class _BlockedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, qh, kh, v, causal, keep, bq, bk):  # type: ignore[override]
        out, lse = _flash_forward(qh, kh, v, causal, keep, bq, bk)
        ctx.save_for_backward(qh, kh, v, out, lse)
        ctx.causal, ctx.keep, ctx.bq, ctx.bk = causal, keep, bq, bk
        return out

    @staticmethod
    def backward(ctx: Any, dout):  # type: ignore[override]
        qh, kh, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _flash_backward(
            qh, kh, v, out, lse, dout.contiguous(), ctx.causal, ctx.keep, ctx.bq, ctx.bk
        )
        return dq, dk, dv, None, None, None, None


def blocked_attention(
    q_hat: Tensor,
    k_hat: Tensor,
    v: Tensor,
    *,
    causal: bool = False,
    mask: Tensor | None = None,
    block_q: int | None = None,
    block_k: int | None = None,
) -> Tensor:
    """``softmax(q_hat k_hat^T) v`` blocked over queries and keys with an online softmax.

    Pure PyTorch "flash" attention for features of any width (``q_hat``, ``k_hat`` share a
    width ``D``; ``v`` has its own width, unlike the CPU SDPA flash kernel). Memory is
    ``O(L (D + d_v))`` plus one score tile; the backward (a custom autograd function)
    recomputes each tile from the saved row log-sum-exp, as FlashAttention does.

    Args:
        q_hat: ``(..., Lq, D)`` (any score scale already folded in).
        k_hat: ``(..., Lk, D)``; v: ``(..., Lk, d_v)``.
        causal: query i sees keys ``j <= i + Lk - Lq``.
        mask: boolean, True = attend, broadcastable to ``(..., Lq, Lk)``.
        block_q, block_k: tile sizes (defaults: keys in blocks of up to
            ``MAX_KEY_BLOCK``, queries so a tile holds about ``TILE_ELEMENTS`` numbers).

    Returns:
        ``(..., Lq, d_v)``; rows with no visible key are 0.
    """
    check_qkv(q_hat, k_hat, v)
    batch = q_hat.shape[:-2]
    lq, lk = q_hat.shape[-2], k_hat.shape[-2]
    n = math.prod(batch)
    qh = q_hat.reshape(n, lq, -1).contiguous()
    kh = k_hat.reshape(n, lk, -1).contiguous()
    vv = v.reshape(n, lk, v.shape[-1]).contiguous()
    keep = None
    if mask is not None:
        if mask.dtype != torch.bool:
            raise ValueError(f"mask must be boolean (True = attend), got dtype {mask.dtype}")
        keep = torch.broadcast_to(mask, (*batch, lq, lk)).reshape(n, lq, lk)
    bq, bk = _block_sizes(n, lq, lk, block_q, block_k)
    out = _BlockedAttention.apply(qh, kh, vv, causal, keep, bq, bk)
    return out.reshape(*batch, lq, v.shape[-1])


# ----------------------------------------------------------------------------------------
# geodesic attention: reference and fast paths
# ----------------------------------------------------------------------------------------


def geodesic_attention_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    U: Tensor,
    tau: float,
    causal: bool = False,
    *,
    mask: Tensor | None = None,
    curvature: Tensor | None = None,
    alpha: float = 1.0,
    baseline: Baseline = "distance",
) -> tuple[Tensor, Tensor, Tensor]:
    """Materialised reference: ``(out (..., L, d_v), probs (..., L, L), logits (..., L, L))``."""
    check_qkv(q, k, v)
    if alpha == 1.0:
        logits = geodesic_scores(q, k, U, tau, curvature=curvature)
    else:
        logits = hybrid_scores(q, k, U, tau, alpha, baseline=baseline, curvature=curvature)
    keep = combine_masks(q.shape[-2], k.shape[-2], causal=causal, mask=mask, device=q.device)
    probs = masked_softmax(logits, keep)
    return probs @ v, probs, logits


def _lowrank_block(
    qb: Tensor,
    ub: Tensor,
    base_q: Tensor,
    base_k: Tensor,
    k: Tensor,
    U: Tensor,
    v: Tensor,
    c_met: float,
    keep: Tensor | None,
) -> Tensor:
    """One query block of the ``O(d r)``-per-pair path: full key rows, exact softmax."""
    s = base_q @ base_k.transpose(-1, -2)  # cross terms and key bias: (..., bq, Lk)
    g = torch.einsum("...idr,...jd->...ijr", ub, k)  # U_i^T k_j  (..., bq, Lk, r)
    h = torch.einsum("...jdr,...id->...ijr", U, qb)  # U_j^T q_i  (..., bq, Lk, r)
    s = s - 0.5 * c_met * ((g * g).sum(-1) + (h * h).sum(-1))
    return masked_softmax(s, keep) @ v


def _geodesic_attention_lowrank(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    U: Tensor,
    c: tuple[float, float, float],
    curvature: Tensor | None,
    causal: bool,
    mask: Tensor | None,
    block_q: int | None,
) -> Tensor:
    """Query-blocked path that never forms the ``d^2`` features: ``O(d r)`` per pair, with
    ``(bq, L, r)`` intermediates; autograd recomputes each block (checkpointing)."""
    c_dot, c_euc, c_met = c
    Ut = U.transpose(-1, -2)
    a_q = (U @ (Ut @ q.unsqueeze(-1))).squeeze(-1)
    a_k = (U @ (Ut @ k.unsqueeze(-1))).squeeze(-1)
    key_bias = -c_euc * (k * k).sum(-1, keepdim=True) - 0.5 * c_met * (k * a_k).sum(
        -1, keepdim=True
    )
    if curvature is not None:
        key_bias = key_bias - c_met * curvature.unsqueeze(-1)
    ones = torch.ones_like(q[..., :1])
    base_q = torch.cat([(c_dot + 2 * c_euc) * q + c_met * a_q, c_met * q, ones], -1)
    base_k = torch.cat([k, a_k, key_bias], -1)
    lq, lk = q.shape[-2], k.shape[-2]
    n = math.prod(q.shape[:-2])
    r = U.shape[-1]
    bq = block_q if block_q is not None else max(8, TILE_ELEMENTS // max(1, n * lk * (2 * r + 1)))
    keep_all = combine_masks(lq, lk, causal=causal, mask=mask, device=q.device)
    outs = []
    for i0 in range(0, lq, bq):
        i1 = min(i0 + bq, lq)
        keep = None if keep_all is None else keep_all[..., i0:i1, :]
        args = (q[..., i0:i1, :], U[..., i0:i1, :, :], base_q[..., i0:i1, :], base_k, k, U, v)
        if torch.is_grad_enabled() and any(t.requires_grad for t in args):
            o = checkpoint(_lowrank_block, *args, c_met, keep, use_reentrant=False)
        else:
            o = _lowrank_block(*args, c_met, keep)
        outs.append(o)
    return torch.cat(outs, dim=-2)


def _auto_method(q: Tensor, U: Tensor) -> str:
    """The measured choice (benchmarks/riemannian_attention.py, section 4): at r = 4 the
    augmented single-GEMM path won at d = 8 and 16, the ``O(d r)``-per-pair path at d = 32 and
    64. The rule compares the augmented width ``d^2 + 3d + 1`` with about twice the direct
    path's ``(2r + 1) d`` (its elementwise squares cost more per number than a GEMM)."""
    d, r = q.shape[-1], U.shape[-1]
    return "augmented" if augmented_dim(d) <= 2 * (2 * r + 1) * d + 64 else "lowrank"


def geodesic_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    U: Tensor,
    tau: float,
    causal: bool = False,
    *,
    mask: Tensor | None = None,
    curvature: Tensor | None = None,
    alpha: float = 1.0,
    baseline: Baseline = "distance",
    method: Method = "auto",
    block_q: int | None = None,
    block_k: int | None = None,
) -> Tensor:
    """``softmax(geodesic_scores(q, k, U, tau)) @ v`` without materialising ``(L, L, r)`` tensors.

    Args:
        q, k: ``(..., L, d)``; v: ``(..., L, d_v)``; U: ``(..., L, d, r)``; tau > 0.
        causal: query i attends to keys ``j <= i``.
        mask: optional boolean keep-mask broadcastable to ``(..., L, L)``.
        curvature: optional ``Omega (..., L)``, scores ``-(d_g^2 + Omega_i + Omega_j) / tau``
            (eq. (23)); ``Omega_i`` is constant along a row and drops out of the softmax.
        alpha, baseline: hybrid blending (eq. (27), :func:`hybrid_scores`).
        method: ``"augmented"`` (one GEMM per tile on :func:`geodesic_features`, blocked
            online softmax, memory ``O(L d^2)``), ``"sdpa"`` (the same features through
            :func:`torch.nn.functional.scaled_dot_product_attention`, ``v`` zero-padded to the
            feature width), ``"lowrank"`` (query-blocked, ``O(d r)`` per pair, checkpointed),
            ``"reference"`` (materialised), ``"auto"`` (augmented or lowrank by d and r).
        block_q, block_k: tile sizes for the blocked paths.

    Returns:
        ``(..., L, d_v)``.
    """
    check_qkv(q, k, v)
    _check_metric_inputs(q, k, U, tau)
    _check_curvature(curvature, q)
    if method == "auto":
        method = _auto_method(q, U)  # type: ignore[assignment]
    if method == "reference":
        return geodesic_attention_reference(
            q, k, v, U, tau, causal, mask=mask, curvature=curvature, alpha=alpha, baseline=baseline
        )[0]
    if method == "lowrank":
        c = _blend_coefficients(q.shape[-1], tau, alpha, baseline)
        return _geodesic_attention_lowrank(q, k, v, U, c, curvature, causal, mask, block_q)
    if method not in ("augmented", "sdpa"):
        raise ValueError(
            f"method must be 'auto', 'augmented', 'sdpa', 'lowrank' or 'reference', got {method!r}"
        )
    q_hat, k_hat = geodesic_features(
        q, k, U, tau, alpha=alpha, baseline=baseline, curvature=curvature
    )
    if method == "augmented":
        return blocked_attention(
            q_hat, k_hat, v, causal=causal, mask=mask, block_q=block_q, block_k=block_k
        )
    dv, width = v.shape[-1], q_hat.shape[-1]
    v_pad = F.pad(v, (0, width - dv)) if dv < width else v
    keep = combine_masks(q.shape[-2], k.shape[-2], causal=causal, mask=mask, device=q.device)
    out = F.scaled_dot_product_attention(q_hat, k_hat, v_pad, attn_mask=keep, scale=1.0)
    return out[..., :dv]


# ----------------------------------------------------------------------------------------
# curvature proxy, metric-aware projection, torsion, transport, preconditioned update
# ----------------------------------------------------------------------------------------


def curvature_proxy(U: Tensor, beta: Tensor | float) -> Tensor:
    """Curvature proxy ``Omega_t = softplus(beta) ||U_t||_F^2`` (eq. (21)): ``(..., d, r)`` -> ``(...)``."""
    beta_t = torch.as_tensor(beta, dtype=U.dtype, device=U.device)
    return F.softplus(beta_t) * (U * U).sum((-1, -2))


def metric_aware_projection(q: Tensor, U: Tensor, gamma: Tensor | float) -> Tensor:
    """Phase A++, eq. (20): ``q + gamma / sqrt(d) * U U^T q`` for ``q (..., d)``, ``U (..., d, r)``.

    (The extracted text of eq. (20) reads ``gamma . 1 d``; we take the lost radical as
    ``1 / sqrt(d)``, like the paper's other scalings.) ``gamma`` is the gate, already squashed.
    """
    uq = U.transpose(-1, -2) @ q.unsqueeze(-1)  # (..., r, 1)
    return q + gamma / math.sqrt(q.shape[-1]) * (U @ uq).squeeze(-1)


def torsion_apply(left: Tensor, right: Tensor, x: Tensor) -> Tensor:
    """``T x`` with ``T = L R^T - R L^T`` (eq. (22)), ``O(d r_T)``: ``left, right (..., d, r_T)``, ``x (..., d)``."""
    lx = left.transpose(-1, -2) @ x.unsqueeze(-1)  # L^T x
    rx = right.transpose(-1, -2) @ x.unsqueeze(-1)  # R^T x
    return (left @ rx - right @ lx).squeeze(-1)


def torsion_dense(left: Tensor, right: Tensor) -> Tensor:
    """Dense antisymmetric ``T = L R^T - R L^T`` (eq. (22)), ``(..., d, d)``."""
    return left @ right.transpose(-1, -2) - right @ left.transpose(-1, -2)


def transport_dense(a: Tensor, b: Tensor, kind: str = "linear") -> Tensor:
    """Dense transport: ``P = I + Delta`` (eq. (24)) or the Cayley form
    ``(I - Delta/2)^{-1} (I + Delta/2)``, ``Delta = A B^T - B A^T``. ``(..., d, d)``."""
    delta = torsion_dense(a, b)
    eye = torch.eye(a.shape[-2], dtype=a.dtype, device=a.device)
    if kind == "linear":
        return eye + delta
    if kind == "cayley":
        return torch.linalg.solve(eye - delta / 2, eye + delta / 2)
    raise ValueError(f"kind must be 'linear' or 'cayley', got {kind!r}")


def transport_apply(a: Tensor, b: Tensor, x: Tensor) -> Tensor:
    """``P x = x + Delta x`` with ``Delta = A B^T - B A^T`` (eq. (24)), ``O(d r)``."""
    return x + torsion_apply(a, b, x)


def cayley_transport_apply(a: Tensor, b: Tensor, x: Tensor) -> Tensor:
    """Exactly orthogonal transport ``(I - Delta/2)^{-1} (I + Delta/2) x`` in ``O(d r^2)``.

    ``Delta = W J W^T`` with ``W = [A, B] (d, 2r)`` and ``J = [[0, I], [-I, 0]]``; Woodbury gives
    ``(I - W J W^T / 2)^{-1} = I - W (2 J + W^T W)^{-1} W^T`` (a ``2r x 2r`` solve per token).
    ``a, b (..., d, r)``, ``x (..., d)`` -> ``(..., d)``.
    """
    y = x + 0.5 * torsion_apply(a, b, x)
    r = a.shape[-1]
    w = torch.cat([a, b], dim=-1)  # (..., d, 2r)
    zero = torch.zeros(r, r, dtype=a.dtype, device=a.device)
    eye = torch.eye(r, dtype=a.dtype, device=a.device)
    j = torch.cat([torch.cat([zero, eye], 1), torch.cat([-eye, zero], 1)], 0)
    cap = 2 * j + w.transpose(-1, -2) @ w  # (..., 2r, 2r)
    wy = w.transpose(-1, -2) @ y.unsqueeze(-1)
    shape = torch.broadcast_shapes(cap.shape[:-2], wy.shape[:-2])
    coef = torch.linalg.solve(cap.expand(*shape, 2 * r, 2 * r), wy.expand(*shape, 2 * r, 1))
    return y - (w @ coef).squeeze(-1)


def isometry_defect(a: Tensor, b: Tensor) -> Tensor:
    """``||P^T P - I||_F = ||Delta^T Delta||_F`` for ``P = I + Delta`` (eq. (25)), low rank.

    With ``Delta = W J W^T`` and ``G = W^T W``: ``Delta^T Delta = W K W^T``, ``K = -J G J``, so
    ``||Delta^T Delta||_F^2 = tr(K G K G)``; ``O(d r^2)``, no ``d x d`` matrix. Note that for an
    antisymmetric ``Delta`` this is at most ``||Delta||_F^2 / sqrt(2)``, not equal to
    ``||Delta||_F^2`` as eq. (25)'s text says (singular values of ``Delta`` come in pairs).
    """
    r = a.shape[-1]
    w = torch.cat([a, b], dim=-1)
    zero = torch.zeros(r, r, dtype=a.dtype, device=a.device)
    eye = torch.eye(r, dtype=a.dtype, device=a.device)
    j = torch.cat([torch.cat([zero, eye], 1), torch.cat([-eye, zero], 1)], 0)
    g = w.transpose(-1, -2) @ w
    kmat = -(j @ g @ j)
    kg = kmat @ g
    return torch.sqrt((kg * kg.transpose(-1, -2)).sum((-1, -2)).clamp_min(0))


def metric_preconditioned_update(h: Tensor, U: Tensor, update: Tensor) -> Tensor:
    """Phase E, eq. (26): ``h + g^{-1} update`` with ``g = I + U U^T`` by Woodbury, ``O(d r^2)``.

    ``h, update (..., d)``, ``U (..., d, r)``.
    """
    return h + metric_inverse_apply(U, update)


# ----------------------------------------------------------------------------------------
# regularisers (Section 6.4) and diagnostics
# ----------------------------------------------------------------------------------------


def _kappa(U: Tensor) -> Tensor:
    """``kappa_t = ||U_t||_F^2``: ``(..., L, d, r)`` -> ``(..., L)``."""
    return (U * U).sum((-1, -2))


def anti_flatness_loss(U: Tensor, kappa_min: float) -> Tensor:
    """Eq. (31): mean over tokens of ``ReLU(kappa_min - ||U_t||_F^2)``. ``U (..., L, d, r)``."""
    return F.relu(kappa_min - _kappa(U)).mean()


def metric_cap_loss(U: Tensor, kappa_max: float) -> Tensor:
    """Eq. (34): mean over tokens of ``ReLU(||U_t||_F^2 - kappa_max)``. ``U (..., L, d, r)``."""
    return F.relu(_kappa(U) - kappa_max).mean()


def metric_diversity_loss(
    U: Tensor,
    *,
    pairs: Tensor | None = None,
    n_pairs: int | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Eq. (32): ``-mean over pairs (i, j) of ||U_i U_i^T - U_j U_j^T||_F^2`` within each sequence.

    ``U (..., L, d, r)``. Pairs: ``pairs (P, 2)`` of positions, or ``n_pairs`` sampled uniformly
    among ``i != j`` (with ``generator``), or by default all ordered pairs ``i != j``. Every
    distance uses the ``O(r^2 d)`` identity of :func:`attention_atlas.linalg.lowrank_gram_distance_sq`.
    """
    seq = U.shape[-3]
    if seq < 2:
        raise ValueError(f"metric diversity needs at least 2 positions, got L={seq}")
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
    # all pairs: sum_ij ||A_i - A_j||^2 = 2 L sum_i ||U_i^T U_i||^2 - 2 sum_ij ||U_i^T U_j||^2
    self_sq = (U.transpose(-1, -2) @ U).pow(2).sum((-1, -2))  # (..., L)
    cross = torch.einsum("...idr,...jds->...ijrs", U, U).pow(2).sum((-1, -2, -3, -4))  # (...)
    total = 2 * seq * self_sq.sum(-1) - 2 * cross
    return -(total / (seq * (seq - 1))).mean()


def curvature_smoothness_loss(U: Tensor) -> Tensor:
    """Eq. (33): mean over adjacent positions of ``||U_t U_t^T - U_{t+1} U_{t+1}^T||_F^2``."""
    if U.shape[-3] < 2:
        raise ValueError(f"curvature smoothness needs at least 2 positions, got L={U.shape[-3]}")
    return lowrank_gram_distance_sq(U[..., :-1, :, :], U[..., 1:, :, :]).mean()


def metric_statistics(U: Tensor) -> dict[str, Tensor]:
    """Monitoring for metric collapse (prediction P3): mean, variance and max of ``||U_t||_F^2``
    (``Var_t`` is the paper's ``sigma_U^2``, the max its ``U-bar^2``), detached scalars."""
    kappa = _kappa(U.detach())
    return {
        "metric_kappa_mean": kappa.mean(),
        "metric_kappa_var": kappa.var(-1, unbiased=False).mean(),
        "metric_kappa_max": kappa.amax(),
    }


# ----------------------------------------------------------------------------------------
# pure attention stacks (Dong, Cordonnier and Loukas 2021) with Riemannian scores
# ----------------------------------------------------------------------------------------

StackScore = Literal["dot", "euclidean", "homogeneous", "heterogeneous"]


def pure_attention_stack(
    h0: Tensor,
    depth: int,
    *,
    score: StackScore = "dot",
    rank: int = 4,
    strength: float = 1.0,
    tau: float | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Hidden states of a random pure self-attention stack ``H^{l+1} = A^l H^l W_V^l`` (eq. (1)):
    no residual connections, no feed-forward layers, one head, fresh Gaussian weights per layer.

    Args:
        h0: ``(..., L, D)`` input tokens.
        depth: number of layers.
        score: ``"dot"`` (``q.k / sqrt(D)``, Dong et al.'s setting), ``"euclidean"``
            (``-|q-k|^2 / tau``), ``"homogeneous"`` (one metric factor ``U`` per layer, shared
            by every token: a global Mahalanobis distance) or ``"heterogeneous"`` (``U_t`` a
            random linear function of the normalised token ``h_t / |h_t|``, as a MetricNet
            would make it, eq. (19)).
        rank: metric rank r.
        strength: expected ``||U_t||_F^2`` (the paper's kappa) of the metric factors.
        tau: temperature of the distance scores (default ``sqrt(2 D)``).
        generator: for the random weights.

    Returns:
        ``(depth + 1, ..., L, D)``: the input and every layer's output.
    """
    if depth < 0:
        raise ValueError(f"depth must be >= 0, got {depth}")
    if score not in ("dot", "euclidean", "homogeneous", "heterogeneous"):
        raise ValueError(
            f"score must be 'dot', 'euclidean', 'homogeneous' or 'heterogeneous', got {score!r}"
        )
    dim = h0.shape[-1]
    t = tau if tau is not None else math.sqrt(2 * dim)
    kw = dict(generator=generator, dtype=h0.dtype, device="cpu")
    scale = math.sqrt(strength / (dim * rank))
    states = [h0]
    h = h0
    for _ in range(depth):
        wq, wk, wv = (torch.randn(dim, dim, **kw).to(h0.device) / math.sqrt(dim) for _ in range(3))  # type: ignore[arg-type]
        q, k, v = h @ wq, h @ wk, h @ wv
        if score == "dot":
            logits = q @ k.transpose(-1, -2) / math.sqrt(dim)
        else:
            if score == "euclidean":
                U = torch.zeros(*h.shape, rank, dtype=h.dtype, device=h.device)
            elif score == "homogeneous":
                u = torch.randn(dim, rank, **kw).to(h0.device) * scale  # type: ignore[arg-type]
                U = u.expand(*h.shape, rank)
            else:
                wu = torch.randn(dim * rank, dim, **kw).to(h0.device)  # type: ignore[arg-type]
                hn = h / h.norm(dim=-1, keepdim=True).clamp_min(1e-30)
                U = (hn @ wu.T).reshape(*h.shape, rank) * scale
            logits = geodesic_scores(q, k, U, t)
        h = torch.softmax(logits, dim=-1) @ v
        states.append(h)
    return torch.stack(states)


# ----------------------------------------------------------------------------------------
# modules
# ----------------------------------------------------------------------------------------


class _HeadFactorNet(nn.Module):
    """``Linear(D, D m) -> SiLU -> Linear(D m, n_factors H d r)``, final layer ~ N(0, std^2 / (D m))."""

    def __init__(
        self,
        dim: int,
        n_heads: int,
        head_dim: int,
        rank: int,
        n_factors: int,
        expansion: float,
        init_std: float,
    ) -> None:
        super().__init__()
        if rank <= 0:
            raise ValueError(f"rank must be positive, got {rank}")
        hidden = max(1, int(round(dim * expansion)))
        self.n_heads, self.head_dim, self.rank, self.n_factors = n_heads, head_dim, rank, n_factors
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, n_factors * n_heads * head_dim * rank)
        nn.init.normal_(self.fc2.weight, std=init_std / math.sqrt(hidden))
        nn.init.zeros_(self.fc2.bias)

    def factors(self, x: Tensor) -> Tensor:
        """``x (B, L, D)`` -> ``(n_factors, B, H, L, d, r)``."""
        b, seq, _ = x.shape
        y = self.fc2(F.silu(self.fc1(x)))
        y = y.view(b, seq, self.n_factors, self.n_heads, self.head_dim, self.rank)
        return y.permute(2, 0, 3, 1, 4, 5)


class MetricNet(_HeadFactorNet):
    """Phase A, eq. (19): per-token, per-head metric factors ``U_t = MetricNet(h_t)``.

    ``Linear(D, D m) -> SiLU -> Linear(D m, H d r)``; the last layer starts at
    ``N(0, init_std^2 / (D m))`` and zero bias, so ``U ~ 0`` and ``g ~ I`` at initialisation.

    Args:
        dim: hidden width D; n_heads: H; head_dim: d; rank: r; expansion: m; init_std: sigma.
    """

    def __init__(
        self,
        dim: int,
        n_heads: int,
        head_dim: int,
        rank: int = 4,
        expansion: float = 1.0,
        init_std: float = 0.02,
    ) -> None:
        super().__init__(dim, n_heads, head_dim, rank, 1, expansion, init_std)

    def forward(self, x: Tensor) -> Tensor:
        """``x (B, L, D)`` -> ``U (B, H, L, d, r)``."""
        return self.factors(x)[0]


class TorsionNet(_HeadFactorNet):
    """Phase C, eq. (22): low-rank factors ``L_t, R_t`` of the torsion ``T_t = L R^T - R L^T``."""

    def __init__(
        self,
        dim: int,
        n_heads: int,
        head_dim: int,
        rank: int = 2,
        expansion: float = 1.0,
        init_std: float = 0.02,
    ) -> None:
        super().__init__(dim, n_heads, head_dim, rank, 2, expansion, init_std)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``x (B, L, D)`` -> ``(L_t, R_t)``, each ``(B, H, L, d, r_T)``."""
        f = self.factors(x)
        return f[0], f[1]


class FiberTransport(_HeadFactorNet):
    """Phase D transport ``P_t = I + Delta_t``, ``Delta_t = A_t B_t^T - B_t A_t^T`` (eq. (24)),
    factors from the hidden state; ``kind="cayley"`` uses the exactly orthogonal Cayley form."""

    def __init__(
        self,
        dim: int,
        n_heads: int,
        head_dim: int,
        rank: int = 2,
        expansion: float = 1.0,
        init_std: float = 0.02,
        kind: str = "linear",
    ) -> None:
        super().__init__(dim, n_heads, head_dim, rank, 2, expansion, init_std)
        if kind not in ("linear", "cayley"):
            raise ValueError(f"kind must be 'linear' or 'cayley', got {kind!r}")
        self.kind = kind

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``x (B, L, D)`` -> ``(A_t, B_t)``, each ``(B, H, L, d, r)``."""
        f = self.factors(x)
        return f[0], f[1]

    def apply_transport(self, a: Tensor, b: Tensor, y: Tensor) -> Tensor:
        """``P_t y_t`` for ``y (B, H, L, d)``."""
        if self.kind == "cayley":
            return cayley_transport_apply(a, b, y)
        return transport_apply(a, b, y)


class CurvatureProxy(nn.Module):
    """Phase B, eq. (21): ``Omega_t = softplus(beta) ||U_t||_F^2`` with a learned ``beta``."""

    def __init__(self, beta_init: float = 0.0) -> None:
        super().__init__()
        self.beta = nn.Parameter(torch.tensor(float(beta_init)))

    def forward(self, U: Tensor) -> Tensor:
        """``U (..., d, r)`` -> ``(...)``."""
        return curvature_proxy(U, self.beta)


class MetricAwareProjection(nn.Module):
    """Phase A++, eq. (20), gated: ``q + sigmoid(gamma_param) / sqrt(d) U U^T q``, ``gamma_param``
    starts at -3 (``gamma ~ 0.047``)."""

    def __init__(self, gamma_init: float = -3.0) -> None:
        super().__init__()
        self.gamma_param = nn.Parameter(torch.tensor(float(gamma_init)))

    def forward(self, q: Tensor, U: Tensor) -> Tensor:
        return metric_aware_projection(q, U, torch.sigmoid(self.gamma_param))


class RiemannianAttention(Attention):
    """Multi-head geodesic attention with per-token low-rank metrics from the hidden state.

    Each head computes ``U_t = MetricNet(x_t)`` (``(d, r)``) and attends with
    ``softmax(-d_g^2(q_i, k_j) / tau) v`` (eqs. (6), (15)), by the fast path
    (:func:`geodesic_attention`) or, with ``need_weights=True``, the materialised reference.

    Args:
        rank: metric rank r.
        tau: temperature (default ``sqrt(2 * head_dim)``, as :class:`EuclideanAttention`, so that
            at ``U = 0`` the two variants agree).
        alpha, baseline: hybrid blending (eq. (27)); ``alpha=1`` is fully Riemannian.
        metric_expansion, metric_init_std: MetricNet's ``m`` and initial scale.
        curvature: add the curvature proxy (Phase B, eq. (23)) to the distance.
        metric_projection: metric-aware projection of q and k (Phase A++, eq. (20), gated).
        transport_rank: if > 0, transport each head's output by ``P_i = I + Delta_i`` (eq. (24)).
        transport_kind: ``"linear"`` or ``"cayley"``.
        torsion_rank: if > 0, add ``gamma_T T_i`` to the transport (Phase C, gate starts at
            ``sigmoid(-3)``); needs ``transport_rank > 0``.
        method: fast-path method of :func:`geodesic_attention`.
    """

    name = "riemannian"

    def __init__(
        self,
        dim: int,
        n_heads: int,
        rank: int = 4,
        tau: float | None = None,
        alpha: float = 1.0,
        baseline: str = "distance",
        metric_expansion: float = 1.0,
        metric_init_std: float = 0.02,
        curvature: bool = False,
        metric_projection: bool = False,
        transport_rank: int = 0,
        transport_kind: str = "linear",
        torsion_rank: int = 0,
        method: str = "auto",
        **kwargs: Any,
    ) -> None:
        super().__init__(dim, n_heads, **kwargs)
        self.rank = int(rank)
        self.tau = float(tau) if tau is not None else (2.0 * self.head_dim) ** 0.5
        if self.tau <= 0:
            raise ValueError(f"tau must be positive, got {tau}")
        _blend_coefficients(self.head_dim, self.tau, alpha, baseline)  # validates
        if method not in ("auto", "augmented", "sdpa", "lowrank", "reference"):
            raise ValueError(f"unknown method {method!r}")
        if torsion_rank > 0 and transport_rank <= 0:
            raise ValueError("torsion_rank > 0 needs transport_rank > 0 (torsion enters P)")
        self.alpha, self.baseline, self.method = float(alpha), baseline, method
        self.metric_net = MetricNet(
            dim, n_heads, self.head_dim, self.rank, metric_expansion, metric_init_std
        )
        self.curvature = CurvatureProxy() if curvature else None
        self.projection = MetricAwareProjection() if metric_projection else None
        self.transport = (
            FiberTransport(dim, n_heads, self.head_dim, transport_rank, kind=transport_kind)
            if transport_rank > 0
            else None
        )
        self.torsion = (
            TorsionNet(dim, n_heads, self.head_dim, torsion_rank) if torsion_rank > 0 else None
        )
        self.torsion_gate = nn.Parameter(torch.tensor(-3.0)) if torsion_rank > 0 else None

    def metric_parameters(self) -> list[nn.Parameter]:
        mods: list[nn.Module] = [self.metric_net]
        for m in (self.curvature, self.projection, self.transport, self.torsion):
            if m is not None:
                mods.append(m)
        params = [p for m in mods for p in m.parameters()]
        if self.torsion_gate is not None:
            params.append(self.torsion_gate)
        return params

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
        U = self.metric_net(x).to(q.dtype)  # (B, H, L, d, r)
        if self.projection is not None:
            q, k = self.projection(q, U), self.projection(k, U)
        omega = self.curvature(U) if self.curvature is not None else None  # (B, H, L)
        probs = None
        diagnostics: dict[str, Tensor] = {}
        if need_weights:
            out, probs, logits = geodesic_attention_reference(
                q,
                k,
                v,
                U,
                self.tau,
                causal,
                mask=mask,
                curvature=omega,
                alpha=self.alpha,
                baseline=self.baseline,  # type: ignore[arg-type]
            )
            keep = combine_masks(
                q.shape[-2], k.shape[-2], causal=causal, mask=mask, device=q.device
            )
            diagnostics["nonfinite_logits"] = count_nonfinite(logits, keep)
        else:
            out = geodesic_attention(
                q,
                k,
                v,
                U,
                self.tau,
                causal,
                mask=mask,
                curvature=omega,
                alpha=self.alpha,
                baseline=self.baseline,  # type: ignore[arg-type]
                method=self.method,  # type: ignore[arg-type]
            )
        extras = {"metric_factor": U}
        if omega is not None:
            extras["curvature"] = omega
        if self.transport is not None:
            a, b = self.transport(x)
            moved = self.transport.apply_transport(a, b, out)
            if self.torsion is not None and self.torsion_gate is not None:
                lt, rt = self.torsion(x)
                moved = moved + torch.sigmoid(self.torsion_gate) * torsion_apply(lt, rt, out)
            out = moved
        diagnostics.update(metric_statistics(U))
        return AttentionResult(out, probs, diagnostics, extras)

    def extra_repr(self) -> str:
        return (
            super().extra_repr()
            + f", rank={self.rank}, tau={self.tau:.3g}, alpha={self.alpha}, baseline={self.baseline}"
        )
