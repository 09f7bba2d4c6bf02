"""Geodesic attention ``softmax(geodesic_scores) v`` without materialising ``(L, L, r)`` tensors.

Three fast paths, each tested against the materialised reference
(:func:`geodesic_attention_reference`, eq. (15)):

* ``"augmented"``: the features of Theorem 3.2's factorisation
  (:func:`~attention_atlas.attention.riemannian.scores.geodesic_features`, width ``d^2 + 3d + 1``)
  through the generic blocked online-softmax kernel :func:`attention_atlas.attention.flash.blocked_attention`:
  one GEMM per tile, memory ``O(L d^2)``.
* ``"sdpa"``: the same features through :func:`torch.nn.functional.scaled_dot_product_attention`.
* ``"lowrank"``: query-blocked, ``O(d r)`` per pair: the ``2d + 1`` linear feature columns plus
  the pairwise ``|U_i^T k_j|^2`` and ``|U_j^T q_i|^2`` of one query block at a time
  (``(bq, L, r)`` intermediates, recomputed in the backward by checkpointing).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from attention_atlas.attention.base import check_qkv, combine_masks
from attention_atlas.attention.dot import attention_from_logits, masked_softmax
from attention_atlas.attention.flash import TILE_ELEMENTS, blocked_attention

from .scores import (
    Baseline,
    augmented_dim,
    blend_coefficients,
    check_curvature,
    check_metric_inputs,
    geodesic_features,
    geodesic_scores,
    linear_features,
)

__all__ = ["geodesic_attention", "geodesic_attention_reference"]

Method = Literal["auto", "augmented", "sdpa", "lowrank", "reference"]


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
    """Materialised reference: ``(out (..., L, d_v), probs (..., L, L), logits (..., L, L))``,
    the logits by eq. (15) (:func:`~attention_atlas.attention.riemannian.scores.geodesic_scores`)."""
    check_qkv(q, k, v)
    logits = geodesic_scores(q, k, U, tau, curvature=curvature, alpha=alpha, baseline=baseline)
    res = attention_from_logits(logits, v, causal=causal, mask=mask)
    assert res.probs is not None
    return res.out, res.probs, logits


def _lowrank_block(
    qb: Tensor,
    ub: Tensor,
    q_lin: Tensor,
    k_lin: Tensor,
    k: Tensor,
    U: Tensor,
    v: Tensor,
    c_met: float,
    keep: Tensor | None,
) -> Tensor:
    """One query block of the ``O(d r)``-per-pair path: full key rows, exact softmax."""
    s = q_lin @ k_lin.transpose(-1, -2)  # cross terms and key bias: (..., bq, Lk)
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
    Ut = U.transpose(-1, -2)
    a_q = (U @ (Ut @ q.unsqueeze(-1))).squeeze(-1)  # A_i q_i without forming A_i
    a_k = (U @ (Ut @ k.unsqueeze(-1))).squeeze(-1)
    q_lin, k_lin = linear_features(q, k, a_q, a_k, c, curvature)
    lq, lk = q.shape[-2], k.shape[-2]
    n = math.prod(q.shape[:-2])
    r = U.shape[-1]
    bq = block_q if block_q is not None else max(8, TILE_ELEMENTS // max(1, n * lk * (2 * r + 1)))
    keep_all = combine_masks(lq, lk, causal=causal, mask=mask, device=q.device)
    outs = []
    for i0 in range(0, lq, bq):
        i1 = min(i0 + bq, lq)
        keep = None if keep_all is None else keep_all[..., i0:i1, :]
        args = (q[..., i0:i1, :], U[..., i0:i1, :, :], q_lin[..., i0:i1, :], k_lin, k, U, v)
        if torch.is_grad_enabled() and any(t.requires_grad for t in args):
            o = checkpoint(_lowrank_block, *args, c[2], keep, use_reentrant=False)
        else:
            o = _lowrank_block(*args, c[2], keep)
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
        alpha, baseline: hybrid blending (eq. (27)).
        method: ``"augmented"`` (one GEMM per tile on the augmented features, blocked online
            softmax, memory ``O(L d^2)``), ``"sdpa"`` (the same features through
            :func:`torch.nn.functional.scaled_dot_product_attention`, ``v`` zero-padded to the
            feature width), ``"lowrank"`` (query-blocked, ``O(d r)`` per pair, checkpointed),
            ``"reference"`` (materialised), ``"auto"`` (augmented or lowrank by d and r).
        block_q, block_k: tile sizes for the blocked paths.

    Returns:
        ``(..., L, d_v)``.
    """
    check_qkv(q, k, v)
    check_metric_inputs(q, k, U, tau)
    check_curvature(curvature, q)
    if method == "auto":
        method = _auto_method(q, U)  # type: ignore[assignment]
    if method == "reference":
        return geodesic_attention_reference(
            q, k, v, U, tau, causal, mask=mask, curvature=curvature, alpha=alpha, baseline=baseline
        )[0]
    if method == "lowrank":
        c = blend_coefficients(q.shape[-1], tau, alpha, baseline)
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
