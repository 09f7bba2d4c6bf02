"""The geodesic score, once per form, and hybrid blending (eq. (27)), once.

Every token ``t`` carries a metric ``g_t = I + U_t U_t^T`` with ``U_t (d, r)`` (eq. (4)); a pair
uses ``g_ij = I + (U_i U_i^T + U_j U_j^T) / 2`` (eq. (5)) and the score is the negative squared
distance under it (eq. (6)):

    S_ij = -(q_i - k_j)^T g_ij (q_i - k_j) / tau
         = -(|q_i - k_j|^2 + |U_i^T (q_i - k_j)|^2 / 2 + |U_j^T (q_i - k_j)|^2 / 2) / tau

The forms, each tested against the definition in float64:

* :func:`geodesic_scores_dense`: the definition, eq. (6), every ``g_ij`` formed (``(L, L, d, d)``).
* :func:`geodesic_scores`: eq. (15), the differences ``q_i - k_j`` materialised: the reference.
* :func:`geodesic_scores_decomposed`: eq. (16), per-token parts plus the pairwise ``U_i^T k_j``
  and ``U_j^T q_i``. These pair token i's metric with token j's key, so they cost ``O(d r)`` per
  pair, not the ``O(r)`` the paper states. The Fiber Bundle Transformer of chapter 4 computes its
  scores with this function.
* :func:`geodesic_features`: the augmented features of Theorem 3.2's factorisation,
  ``S_ij = <Qhat_i, Khat_j> + c_i`` with ``Qhat, Khat`` of width ``d^2 + 3d + 1``
  (:func:`augmented_dim`), because ``k^T A_i k = <A_i, k k^T>_F`` separates with the symmetric
  packing of :func:`attention_atlas.linalg.sym_pack` (``d (d + 1) / 2`` numbers,
  Frobenius-isometric), and so does ``q^T A_j q``. The whole score tile is one matrix product.

Every form takes the blending of eq. (27) (:func:`blend_weights`) and the curvature proxy
``Omega (..., L)`` of eq. (23): ``S_ij = w_dot q_i.k_j / sqrt(d) - (w_euc |q_i - k_j|^2
+ w_met (metric terms + Omega_i + Omega_j)) / tau``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from attention_atlas import native
from attention_atlas.linalg import sym_pack_indices

from .geometry import check_curvature, check_metric_inputs, factor_rows
from .pairwise import PAIRWISE_CHUNK, pairwise_metric_terms

__all__ = [
    "PAIRWISE_CHUNK",
    "Baseline",
    "BlendWeights",
    "augmented_dim",
    "blend_coefficients",
    "blend_weights",
    "geodesic_features",
    "geodesic_scores",
    "geodesic_scores_augmented",
    "geodesic_scores_decomposed",
    "geodesic_scores_dense",
    "hybrid_scores",
    "pairwise_metric_terms",
    "pairwise_metric",
    "token_metric",
]

Baseline = Literal["distance", "dot"]


# ----------------------------------------------------------------------------------------
# validation
# ----------------------------------------------------------------------------------------


# ----------------------------------------------------------------------------------------
# blending, eq. (27)
# ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BlendWeights:
    """``S = dot q.k / sqrt(d) - (euc |q - k|^2 + met (metric terms + Omega_i + Omega_j)) / tau``."""

    dot: float
    euc: float
    met: float


def blend_weights(alpha: float, baseline: str = "distance") -> BlendWeights:
    """Hybrid blending, eq. (27): ``s = s_base + alpha (s_riem - s_base)``, as weights of the
    score's three parts (the only place eq. (27) is written; every score form takes these).

    ``baseline="distance"``: ``s_base = -|q_i - k_j|^2 / tau`` (the Section 5.8 remark), so alpha
    scales only the metric terms (the geodesic score with ``U`` replaced by ``sqrt(alpha) U`` and
    ``Omega`` by ``alpha Omega``). ``baseline="dot"``: ``s_base = q_i.k_j / sqrt(d)`` (eq. (27) as
    printed; it mixes in the key-norm and temperature effects of eq. (28)).
    ``alpha = 1`` is the pure geodesic score.
    """
    if not (isinstance(alpha, (int, float)) and math.isfinite(alpha)):
        raise ValueError(f"alpha must be a finite number, got {alpha!r}")
    if baseline == "distance":
        return BlendWeights(0.0, 1.0, float(alpha))
    if baseline == "dot":
        return BlendWeights(1.0 - alpha, float(alpha), float(alpha))
    raise ValueError(f"baseline must be 'distance' or 'dot', got {baseline!r}")


def blend_coefficients(
    d: int, tau: float, alpha: float, baseline: str = "distance"
) -> tuple[float, float, float]:
    """``(c_dot, c_euc, c_met)`` with ``S = c_dot q.k - c_euc |q - k|^2 - c_met (metric terms +
    Omega_i + Omega_j)``: the weights of :func:`blend_weights` with ``sqrt(d)`` and ``tau``
    folded in (the form the feature paths use)."""
    w = blend_weights(alpha, baseline)
    return w.dot / math.sqrt(d), w.euc / tau, w.met / tau


def _times(w: float, x: Tensor) -> Tensor:
    """``w * x``, and ``x`` itself for ``w = 1`` (the same graph as the unblended score)."""
    return x if w == 1.0 else w * x


def _blend(
    euc: Tensor,
    term_i: Tensor,
    term_j: Tensor,
    q: Tensor,
    k: Tensor,
    tau: float,
    w: BlendWeights,
    curvature: Tensor | None,
) -> Tensor:
    """``w.dot q.k / sqrt(d) - (w.euc euc + w.met (term_i + term_j) / 2 + w.met Omega) / tau``
    from the squared Euclidean distances ``euc`` and the two metric terms, each ``(..., L, L)``."""
    dist = _times(w.euc, euc) + (0.5 * w.met) * term_i + (0.5 * w.met) * term_j
    s = -dist / tau
    if curvature is not None:  # eq. (23): Omega_i + Omega_j added to the distance
        s = s - _times(w.met, curvature.unsqueeze(-1) + curvature.unsqueeze(-2)) / tau
    if w.dot != 0.0:
        s = s + (w.dot / math.sqrt(q.shape[-1])) * (q @ k.transpose(-1, -2))
    return s


# ----------------------------------------------------------------------------------------
# metrics and the three materialised forms
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
    check_metric_inputs(q, k, U, tau)
    diff = q.unsqueeze(-2) - k.unsqueeze(-3)  # (..., L, L, d)
    g = pairwise_metric(U)  # (..., L, L, d, d)
    return -torch.einsum("...a,...ab,...b->...", diff, g, diff) / tau


def geodesic_scores(
    q: Tensor,
    k: Tensor,
    U: Tensor,
    tau: float,
    *,
    curvature: Tensor | None = None,
    alpha: float = 1.0,
    baseline: Baseline = "distance",
) -> Tensor:
    """Geodesic scores by eq. (15), materialised: the reference.

    ``S_ij = -(|q_i - k_j|^2 + |U_i^T (q_i-k_j)|^2 / 2 + |U_j^T (q_i-k_j)|^2 / 2 + Omega_i + Omega_j) / tau``

    Args:
        q, k: ``(..., L, d)``.
        U: ``(..., L, d, r)``, one metric factor per position.
        tau: temperature ``> 0``.
        curvature: optional ``Omega (..., L)`` (eq. (23)); omitted = 0.
        alpha, baseline: hybrid blending (eq. (27), :func:`blend_weights`); ``alpha=1`` is the
            geodesic score itself.

    Returns:
        ``(..., L, L)``. Memory ``O(L^2 (d + r))``.
    """
    check_metric_inputs(q, k, U, tau)
    check_curvature(curvature, q)
    w = blend_weights(alpha, baseline)
    diff = q.unsqueeze(-2) - k.unsqueeze(-3)  # (..., Li, Lj, d)
    proj_i = torch.einsum("...idr,...ijd->...ijr", U, diff)  # U_i^T (q_i - k_j)
    proj_j = torch.einsum("...jdr,...ijd->...ijr", U, diff)  # U_j^T (q_i - k_j)
    dist = (
        _times(w.euc, (diff * diff).sum(-1))
        + (0.5 * w.met) * (proj_i * proj_i).sum(-1)
        + (0.5 * w.met) * (proj_j * proj_j).sum(-1)
    )
    if curvature is not None:
        dist = (
            dist + _times(w.met, curvature.unsqueeze(-1)) + _times(w.met, curvature.unsqueeze(-2))
        )
    s = -dist / tau
    if w.dot != 0.0:
        s = s + (w.dot / math.sqrt(q.shape[-1])) * (q @ k.transpose(-1, -2))
    return s


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
    """Hybrid blending, eq. (27), materialised: :func:`geodesic_scores` at ``alpha``."""
    return geodesic_scores(q, k, U, tau, curvature=curvature, alpha=alpha, baseline=baseline)


def _fused_base(q: Tensor, k: Tensor, U: Tensor) -> bool:
    """Whether the causal scores take :class:`~attention_atlas.native.functions.CausalScores`:
    native level 2, head dimension 16 (the kernels' vector path) and a rank they take."""
    return (q.shape[-1] == 16 and U.shape[-1] <= native.MAX_RANK
            and native.active(q, k, U, since=2))  # fmt: skip


def geodesic_scores_decomposed(
    q: Tensor,
    k: Tensor,
    U: Tensor,
    tau: float,
    *,
    curvature: Tensor | None = None,
    alpha: float = 1.0,
    baseline: Baseline = "distance",
    causal: bool = False,
    softmax: bool = False,
) -> Tensor:
    """Geodesic scores by the decomposition of eq. (16).

    ``|U_i^T (q_i - k_j)|^2 = |U_i^T q_i - U_i^T k_j|^2``, and the same for ``U_j``.
    ``U_i^T q_i`` and ``U_j^T k_j`` are per token (``O(d r)`` each), but ``U_i^T k_j`` and
    ``U_j^T q_i`` are per pair: both come from one batched product ``(L r, d) x (d, 2L)``
    (:func:`pairwise_metric_terms`, ``(..., L, r, 2L)`` memory, ``O(d r)`` work per pair), and
    ``|q_i - k_j|^2`` and the dot baseline from one ``(L, d) x (d, L)`` product with the norms
    as row and column terms: ``(2r + 1) d`` multiply-adds per pair. Curvature and blending as
    in :func:`geodesic_scores`. Returns ``(..., L, L)``; with ``causal=True`` the scores under a
    causal mask: ``-inf`` for ``j > i``, the pairwise products formed for ``j <= i`` only (about
    half of them); ``softmax=True`` (with ``causal``) returns their row-wise softmax, the
    attention probabilities (one pass less, forward and backward).
    """
    check_metric_inputs(q, k, U, tau)
    check_curvature(curvature, q)
    c_dot, c_euc, c_met = blend_coefficients(q.shape[-1], tau, alpha, baseline)
    row = -c_euc * (q * q).sum(-1)  # the |q_i|^2 and |k_j|^2 of |q_i - k_j|^2 (and Omega)
    col = -c_euc * (k * k).sum(-1)
    if curvature is not None:  # eq. (23): Omega_i + Omega_j added to the distance
        row, col = row - c_met * curvature, col - c_met * curvature
    if causal and _fused_base(q, k, U):  # native level 2: the base formed by the kernel
        from attention_atlas.native.functions import CausalScores

        seq, d = U.shape[-3:-1]
        ut = factor_rows(U, per_sequence=True).contiguous()
        x = torch.cat([q, k], -2).reshape(-1, 2 * seq, d)
        out = CausalScores.apply(ut, x, row.reshape(-1, seq).contiguous(),
                                 col.reshape(-1, seq).contiguous(), c_dot + 2 * c_euc,
                                 -0.5 * c_met, softmax)  # fmt: skip
        return out.view(*q.shape[:-1], seq)
    if causal:  # q.k, row and column terms as one product [c q, row, 1] . [k, 1, col]
        ones = torch.ones_like(row).unsqueeze(-1)
        qa = torch.cat([(c_dot + 2 * c_euc) * q, row.unsqueeze(-1), ones], -1)
        ka = torch.cat([k, ones, col.unsqueeze(-1)], -1)
        seq, width = q.shape[-2], q.shape[-1] + 2
        base = torch.bmm(qa.reshape(-1, seq, width), ka.reshape(-1, seq, width).transpose(1, 2))
        return pairwise_metric_terms(
            U, q, k, scale=-0.5 * c_met, causal=True, base=base, softmax=softmax
        )
    if softmax:
        raise ValueError("softmax=True needs causal=True")
    metric = pairwise_metric_terms(U, q, k, scale=-0.5 * c_met)  # (..., Li, Lj)
    qk = q @ k.transpose(-1, -2)  # one batched product (baddbmm loops over the batch on CPU)
    s = torch.add(metric, qk, alpha=c_dot + 2 * c_euc)
    return s + (row.unsqueeze(-1) + col.unsqueeze(-2))


# ----------------------------------------------------------------------------------------
# the augmented factorisation (Theorem 3.2)
# ----------------------------------------------------------------------------------------


def augmented_dim(d: int) -> int:
    """Width of :func:`geodesic_features`: ``d^2 + 3 d + 1`` (``2d`` cross terms, one key bias,
    two packed symmetric blocks of ``d (d + 1) / 2``)."""
    return d * d + 3 * d + 1


def row_constant(
    q: Tensor, U: Tensor, c_euc: float, c_met: float, curvature: Tensor | None
) -> Tensor:
    """The part of the score that depends on the query token only, ``(..., L)``."""
    uq = (U.transpose(-1, -2) @ q.unsqueeze(-1)).squeeze(-1)
    const = -c_euc * (q * q).sum(-1) - 0.5 * c_met * (uq * uq).sum(-1)
    if curvature is not None:
        const = const - c_met * curvature
    return const


def linear_features(
    q: Tensor,
    k: Tensor,
    a_q: Tensor,
    a_k: Tensor,
    c: tuple[float, float, float],
    curvature: Tensor | None,
) -> tuple[Tensor, Tensor]:
    """The first ``2d + 1`` columns of :func:`geodesic_features` (cross terms and key bias),
    from ``a_q = A_i q_i`` and ``a_k = A_j k_j`` (``A_t = U_t U_t^T``), all ``(..., L, d)``."""
    c_dot, c_euc, c_met = c
    key_bias = -c_euc * (k * k).sum(-1, keepdim=True) - 0.5 * c_met * (k * a_k).sum(
        -1, keepdim=True
    )
    if curvature is not None:
        key_bias = key_bias - c_met * curvature.unsqueeze(-1)
    ones = torch.ones_like(q[..., :1])
    q_lin = torch.cat([(c_dot + 2 * c_euc) * q + c_met * a_q, c_met * q, ones], dim=-1)
    k_lin = torch.cat([k, a_k, key_bias], dim=-1)
    return q_lin, k_lin


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

    With ``A_t = U_t U_t^T`` and the blend coefficients ``(c_dot, c_euc, c_met)`` of
    :func:`blend_coefficients` (for the plain geodesic score ``(0, 1/tau, 1/tau)``)::

        Qhat_i = [ (c_dot + 2 c_euc) q_i + c_met A_i q_i,  c_met q_i,  1,
                   -c_met/2 w^2 o tri(A_i),  -c_met/2 w^2 o tri(q_i q_i^T) ]
        Khat_j = [ k_j,  A_j k_j,  -c_euc |k_j|^2 - c_met (k_j^T A_j k_j / 2 + Omega_j),
                   tri(k_j k_j^T),  tri(A_j) ]

    where ``tri`` takes the upper triangle (``d (d + 1) / 2`` entries) and ``w^2`` is 1 on the
    diagonal and 2 off it, so ``<w^2 o tri(A), tri(B)> = <A, B>_F`` (the pairing of
    :func:`attention_atlas.linalg.sym_pack`). This is the separable representation of Theorem
    3.2's proof made explicit; its width ``d^2 + 3d + 1`` (:func:`augmented_dim`) is the price of
    heterogeneous metrics.

    Args:
        q, k: ``(..., L, d)``; U: ``(..., L, d, r)``; tau > 0.
        alpha, baseline: hybrid blending (eq. (27)); ``alpha=1`` is pure geodesic attention.
        curvature: optional ``Omega (..., L)`` (eq. (23)).

    Returns:
        ``(Qhat, Khat)``, each ``(..., L, d^2 + 3d + 1)``.
    """
    check_metric_inputs(q, k, U, tau)
    check_curvature(curvature, q)
    d = q.shape[-1]
    c = blend_coefficients(d, tau, alpha, baseline)
    # Frobenius pairing <A, B>_F = sum_{a<=b} w_ab^2 A_ab B_ab over the upper triangle: the
    # weights w^2 (1 on the diagonal, 2 off it) go on the query side only, so the key side
    # is a plain gather (the same inner product as linalg.sym_pack on both sides).
    rows, cols, w = sym_pack_indices(d, q.device, q.dtype)
    flat = rows * d + cols
    A = torch.einsum("...ar,...br->...ab", U, U)  # A_t = U_t U_t^T     (..., L, d, d)
    a_q = (A @ q.unsqueeze(-1)).squeeze(-1)  # A_i q_i                     (..., L, d)
    a_k = (A @ k.unsqueeze(-1)).squeeze(-1)  # A_j k_j                     (..., L, d)
    tri_a = A.flatten(-2).index_select(-1, flat)  # upper triangle of A   (..., L, d(d+1)/2)
    tri_qq = (q.unsqueeze(-1) * q.unsqueeze(-2)).flatten(-2).index_select(-1, flat)
    tri_kk = (k.unsqueeze(-1) * k.unsqueeze(-2)).flatten(-2).index_select(-1, flat)
    q_lin, k_lin = linear_features(q, k, a_q, a_k, c, curvature)
    half_w2 = (-0.5 * c[2]) * (w * w)
    q_hat = torch.cat([q_lin, half_w2 * tri_a, half_w2 * tri_qq], dim=-1)
    k_hat = torch.cat([k_lin, tri_kk, tri_a], dim=-1)
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
    added back, so that the result equals :func:`geodesic_scores` (at any ``alpha``).
    ``(..., L, L)``."""
    q_hat, k_hat = geodesic_features(
        q, k, U, tau, alpha=alpha, baseline=baseline, curvature=curvature
    )
    _, c_euc, c_met = blend_coefficients(q.shape[-1], tau, alpha, baseline)
    const = row_constant(q, U, c_euc, c_met, curvature)
    return q_hat @ k_hat.transpose(-1, -2) + const.unsqueeze(-1)
