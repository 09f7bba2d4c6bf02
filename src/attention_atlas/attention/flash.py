"""Blocked ("flash") attention on features of any width, in pure PyTorch.

``softmax(q_hat k_hat^T) v`` computed tile by tile with an online softmax: the score matrix is
never materialised, memory stays linear in the length, and the backward (a custom autograd
function) recomputes each tile from the saved row log-sum-exp, as FlashAttention does. Nothing
here is specific to one score: any attention whose scores are one matrix product of features
(the augmented features of :mod:`attention_atlas.attention.riemannian.scores`, a kernel feature
map, ...) can run on it.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from .base import check_qkv

__all__ = ["MAX_KEY_BLOCK", "TILE_ELEMENTS", "blocked_attention"]

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
