"""The pairwise products of eq. (16): ``|U_i^T (q_i - k_j)|^2 + |U_j^T (q_i - k_j)|^2`` for every
pair, the part of the geodesic score that costs ``O(d r)`` per pair.

``U_i^T q_i`` and ``U_j^T k_j`` are per token (the centres); ``U_t^T k_s`` and ``U_t^T q_s`` for
every pair come from matrix products ``(L r, d) x (d, 2L)`` per batch item, with the backward
written out (``dG = 2 (G - c) dD``, then two products). Under a causal mask only pairs
``j <= i`` are ever used: ``causal=True`` tiles the tokens in blocks and multiplies each block
of ``U_t`` only by the keys before it and the queries after it (``L + b`` columns instead of
``2L``, about half the products at ``b << L``); the entries ``j > i`` are then left
unspecified. The scores of :func:`~attention_atlas.attention.riemannian.scores.geodesic_scores_decomposed`
come from here.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from attention_atlas import native

from .geometry import check_metric_inputs, factor_rows, factor_t_apply

__all__ = ["CAUSAL_BLOCK", "PAIRWISE_CHUNK", "pairwise_metric_terms"]

#: the pairwise products ``G`` of eq. (16) are formed this many numbers at a time (a slice of
#: the batch), and recomputed in the backward, once they would hold more than four times this
#: (past the caches, memory traffic costs more than the products' recomputation)
PAIRWISE_CHUNK = 1 << 20
#: ``causal=True``: tokens per block (``b``); each block's products ``(b r, L + b)`` per item,
#: a quarter of the slice budget (:func:`_budget`) per tile
CAUSAL_BLOCK = 32
#: on a GPU the same budgets in numbers: there each slice is a handful of kernel launches
#: that the host issues one by one (at chapter 4's long shape the CPU's cache-sized slices, 88
#: tiles a layer, made some 18,000 operator calls a step out of the causal terms, and the step
#: 16x a dot step on an H200, host-bound), and memory is plentiful, so a slice may hold this
#: many (256 MiB in float32): at that shape, with :data:`DEVICE_BLOCK`, one tile for the batch
DEVICE_CHUNK = 1 << 26
#: on a GPU, tokens per block of the causal products: fewer, larger tiles (at L = 128 one, the
#: full ``2L`` columns: twice the causal half's products, but one launch instead of four)
DEVICE_BLOCK = 128


def _block(device: torch.device) -> int:
    """Tokens per block of the causal products on ``device``: :data:`CAUSAL_BLOCK` on a CPU,
    :data:`DEVICE_BLOCK` elsewhere."""
    return CAUSAL_BLOCK if device.type == "cpu" else DEVICE_BLOCK


def _budget(device: torch.device) -> int:
    """Numbers one slice of the pairwise products may hold on ``device``:
    :data:`PAIRWISE_CHUNK` on a CPU (the caches), :data:`DEVICE_CHUNK` elsewhere (launches)."""
    return PAIRWISE_CHUNK if device.type == "cpu" else DEVICE_CHUNK


def _centred_products(ut: Tensor, x: Tensor, c: Tensor) -> Tensor:
    """``G - c``: ``(N, L, r, nb, M)`` from ``ut (N, L, r, d)``, ``x (N, nb, M, d)``, ``c (N, L,
    r, nb)``; one product ``(L r, d) x (d, nb M)`` per batch item."""
    n, seq, r, d = ut.shape
    nb, m = x.shape[1], x.shape[2]
    g = torch.bmm(ut.reshape(n, seq * r, d), x.reshape(n, nb * m, d).transpose(1, 2))
    return g.view(n, seq, r, nb, m).sub_(c.unsqueeze(-1))


def _chunks(n: int, per_item: int, chunk: int) -> list[slice]:
    """Slices of the batch: all of it while at most ``4 chunk`` numbers, else about ``chunk``
    numbers each (``chunk`` from :func:`_budget`)."""
    if n * per_item <= 4 * chunk:
        return [slice(0, n)]
    step = max(1, chunk // per_item)
    return [slice(i, min(i + step, n)) for i in range(0, n, step)]


class _PairwiseMetricTerms(torch.autograd.Function):
    """``scale (D[n, i, 0, j] + D[n, j, 1, i])`` with ``D[n, t, b, s] = |c[n, t, :, b] - G[n, t,
    :, b, s]|^2``, ``G = U_t^T x_{b, s}``: ``ut (N, L, r, d)``, ``x (N, 2, L, d)``, ``c (N, L, r,
    2)`` -> ``(N, L, L)``. The backward (``dG = 2 (G - c) dD``, then two products) is written
    out. Large batches go in slices (:func:`_chunks`), their ``G`` recomputed in the backward
    rather than stored, so the ``(L, r, 2L)`` products stay in cache."""

    @staticmethod
    def forward(ctx, ut: Tensor, x: Tensor, c: Tensor, scale: float) -> Tensor:  # type: ignore[override]
        n, seq, r, _ = ut.shape
        parts = _chunks(n, seq * r * 2 * seq, _budget(ut.device))
        out = ut.new_empty(n, seq, seq)
        kept = []
        for sl in parts:
            g = _centred_products(ut[sl], x[sl], c[sl])
            d = (g.square() if len(parts) == 1 else g.square_()).sum(2)  # (n, L, 2, L)
            torch.add(d[:, :, 0], d[:, :, 1].transpose(1, 2), out=out[sl]).mul_(scale)
            if len(parts) == 1:
                kept.append(g)
        ctx.scale = scale
        ctx.save_for_backward(ut, x, c, *kept)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor, Tensor, None]:  # type: ignore[override]
        ut, x, c, *stored = ctx.saved_tensors
        n, seq, r, d = ut.shape
        d_ut, d_x, d_c = torch.empty_like(ut), torch.empty_like(x), torch.empty_like(c)
        for sl in [slice(0, n)] if stored else _chunks(n, seq * r * 2 * seq, _budget(ut.device)):
            g = stored[0] if stored else _centred_products(ut[sl], x[sl], c[sl])
            gs = (2.0 * ctx.scale) * grad[sl]
            dd = torch.stack([gs, gs.transpose(1, 2)], 2).unsqueeze(2)  # (n, L, 1, 2, L)
            dg = g * dd if stored else g.mul_(dd)  # dG = 2 scale (G - c) dD
            k = dg.shape[0]
            flat = dg.view(k, seq * r, 2 * seq)
            d_ut[sl] = torch.bmm(flat, x[sl].reshape(k, 2 * seq, d)).view(k, seq, r, d)
            d_x[sl] = torch.bmm(flat.transpose(1, 2), ut[sl].reshape(k, seq * r, d)).view(
                k, 2, seq, d
            )
            d_c[sl] = -dg.sum(-1)
        return d_ut, d_x, d_c, None


def _causal_tiles(
    n: int, seq: int, r: int, block: int, device: torch.device
) -> list[tuple[slice, int, int]]:
    """``(batch slice, t0, t1)`` tiles of the causal products: token blocks ``[t0, t1)`` of
    ``block`` tokens, the batch sliced so a tile's products hold about a quarter of the slice
    budget on ``device`` (:func:`_budget`) at most."""
    tiles = []
    for t0 in range(0, seq, block):
        t1 = min(t0 + block, seq)
        for sl in _chunks(n, (t1 - t0) * r * (seq - t0 + t1), _budget(device) // 4):
            tiles.append((sl, t0, t1))
    return tiles


def _tile_products(ut: Tensor, x: Tensor, sl: slice, t0: int, t1: int) -> tuple[Tensor, Tensor]:
    """``(G - c, c)`` of one tile: ``G (m, b, r, W)`` is the block's ``U_t^T`` against the
    queries ``q_s, s >= t0`` then the keys ``k_s, s < t1`` (``x (N, 2L, d)`` is ``[q; k]``, so
    these are its rows ``[t0, L + t1)``). Both hold each token's own ``q_t`` and ``k_t``, so the
    centres ``U_t^T k_t`` (of the query columns) and ``U_t^T q_t`` (of the key columns) are
    entries of ``G``: ``c (m, b, r, 2)`` is read off it before the centring."""
    seq = ut.shape[1]
    u = ut[sl, t0:t1]  # (m, b, r, d)
    m, b, r, d = u.shape
    cols = x[sl, t0 : seq + t1]  # (m, W, d)
    g = torch.bmm(u.reshape(m, b * r, d), cols.transpose(1, 2)).view(m, b, r, -1)
    nq = seq - t0
    own_k, own_q = _own_columns(g, nq, t0, b)
    c = torch.stack([own_k, own_q], -1).transpose(1, 2)  # (m, b, r, 2)
    g[..., :nq].sub_(c[..., 0:1])
    g[..., nq:].sub_(c[..., 1:2])
    return g, c


def _own_columns(g: Tensor, nq: int, t0: int, b: int) -> tuple[Tensor, Tensor]:
    """Views ``(m, r, b)`` of a tile's entries ``U_t^T k_t`` and ``U_t^T q_t``."""
    own_k = g[..., nq + t0 : nq + t0 + b].diagonal(dim1=1, dim2=3)
    return own_k, g[..., :b].diagonal(dim1=1, dim2=3)


class _CausalPairwiseMetricTerms(torch.autograd.Function):
    """``base + scale (D[n, i, 0, j] + D[n, j, 1, i])`` (:class:`_PairwiseMetricTerms`) for the
    pairs ``j <= i``, ``-inf`` for ``j > i``, written into ``base (N, L, L)`` in place:
    ``ut (N, L, r, d)``, ``x (N, 2L, d)`` (``[q; k]``); the centres are entries of the products
    (:func:`_tile_products`), and their gradient goes back through the same entries. The
    tiles' products are stored for the backward while they fit the caches (all of them at most
    ``4 PAIRWISE_CHUNK`` numbers), else recomputed there. ``softmax=True`` returns the
    row-wise softmax instead (``base`` is then scratch): its backward is 0 above the
    diagonal by itself, so no pass masks the gradient."""

    @staticmethod
    def forward(
        ctx, base: Tensor, ut: Tensor, x: Tensor, scale: float, block: int, softmax: bool
    ) -> Tensor:  # type: ignore[override]
        keep = _keeps_products(ut, block)  # store the products, or recompute them
        out, kept = _causal_forward(base, ut, x, scale, block, softmax, keep)
        ctx.scale, ctx.block, ctx.softmax = scale, block, softmax
        ctx.kept = len(kept)
        if softmax:
            ctx.save_for_backward(ut, x, *kept, out)
            return out
        ctx.mark_dirty(base)
        ctx.save_for_backward(ut, x, *kept)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor, Tensor, None, None, None]:  # type: ignore[override]
        ut, x, *rest = ctx.saved_tensors
        kept = rest[: ctx.kept]
        probs = rest[-1] if ctx.softmax else None
        d_base, d_ut, d_x = _causal_backward(
            grad, ut, x, kept, probs, ctx.scale, ctx.block, ctx.softmax
        )
        return d_base, d_ut, d_x, None, None, None


def _keeps_products(ut: Tensor, block: int) -> bool:
    """Whether :class:`_CausalPairwiseMetricTerms` keeps its tiles' products for the backward:
    while all of them hold at most four slice budgets (:func:`_budget`: on a CPU they stay in
    the caches)."""
    n, seq, r, _ = ut.shape
    return n * r * seq * (seq + block) <= 4 * _budget(ut.device)


def _causal_forward(
    base: Tensor, ut: Tensor, x: Tensor, scale: float, block: int, softmax: bool, keep: bool
) -> tuple[Tensor, list[Tensor]]:
    """:class:`_CausalPairwiseMetricTerms`' forward: the scores written into ``base`` (or their
    softmax, a new tensor), and the tiles' products when ``keep`` (else none are kept)."""
    n, seq, r, _ = ut.shape
    kept = []
    for sl, t0, t1 in _causal_tiles(n, seq, r, block, ut.device):
        g = _tile_products(ut, x, sl, t0, t1)[0]
        if keep:
            kept.append(g)
            dsq = torch.linalg.vecdot(g, g, dim=2).mul_(scale)  # (m, b, W)
        else:
            dsq = g.square_().sum(2).mul_(scale)
        nq = seq - t0
        base[sl, t0:t1, :t1] += dsq[..., nq:]  # |U_i^T (q_i - k_j)|^2, i in the block
        base[sl, t0:, t0:t1] += dsq[..., :nq].transpose(1, 2)  # |U_j^T (q_i - k_j)|^2
    base.masked_fill_(_above_diagonal(seq, base.device), float("-inf"))
    return (torch.softmax(base, -1) if softmax else base), kept


def _causal_backward(
    grad: Tensor, ut: Tensor, x: Tensor, kept: list[Tensor], probs: Tensor | None, scale: float,
    block: int, softmax: bool,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """:class:`_CausalPairwiseMetricTerms`' backward: ``(d_base, d_ut, d_x)``, the tiles'
    products from ``kept`` or recomputed; ``probs`` is the forward's output for ``softmax``."""
    n, seq, r, d = ut.shape
    if softmax:
        assert probs is not None
        d_base = torch._softmax_backward_data(grad, probs, -1, probs.dtype)
    else:
        d_base = torch.where(_above_diagonal(seq, grad.device), 0.0, grad)
    d_ut, d_x = torch.empty_like(ut), torch.zeros_like(x)
    for i, (sl, t0, t1) in enumerate(_causal_tiles(n, seq, r, block, ut.device)):
        nq = seq - t0
        dd = torch.cat([d_base[sl, t0:, t0:t1].transpose(1, 2), d_base[sl, t0:t1, :t1]], -1)
        dd = dd.mul_(2.0 * scale).unsqueeze(2)
        if kept:  # dG = 2 scale (G - c) dD
            dg = kept[i] * dd  # (m, b, r, W)
        else:
            dg = _tile_products(ut, x, sl, t0, t1)[0].mul_(dd)
        m, b = dg.shape[:2]
        d_ck, d_cq = -dg[..., :nq].sum(-1), -dg[..., nq:].sum(-1)  # (m, b, r)
        own_k, own_q = _own_columns(dg, nq, t0, b)  # the centres' entries
        own_k.add_(d_ck.transpose(1, 2))
        own_q.add_(d_cq.transpose(1, 2))
        flat = dg.view(m, b * r, -1)
        d_ut[sl, t0:t1] = torch.bmm(flat, x[sl, t0 : seq + t1]).view(m, b, r, d)
        d_x[sl, t0 : seq + t1] += torch.bmm(
            flat.transpose(1, 2), ut[sl, t0:t1].reshape(m, b * r, d)
        )
    return d_base, d_ut, d_x


# Under torch.compile, where the products are too many to keep, the same computation is one
# opaque operator with its backward (both recompute the tiles' products, as the eager node does
# at those sizes): traced, its Python loops over tiles and batch slices would be unrolled (at
# chapter 4's long shape some two hundred products and their elementwise passes, and minutes
# of compiling), for no gain, each tile being one product and a few passes already. Where the
# products are kept (a few tiles), the node is traced; eagerly it runs as it always has.


@torch.library.custom_op("attention_atlas::causal_pairwise_terms", mutates_args=())
def causal_pairwise_op(
    base: Tensor, ut: Tensor, x: Tensor, scale: float, block: int, softmax: bool
) -> Tensor:
    """:class:`_CausalPairwiseMetricTerms` as a custom operator (for ``torch.compile``): the
    scores (or their softmax) as a new tensor; ``base`` is not written to."""
    return _causal_forward(base.clone(), ut, x, scale, block, softmax, keep=False)[0]


@causal_pairwise_op.register_fake
def _(base: Tensor, ut: Tensor, x: Tensor, scale: float, block: int, softmax: bool) -> Tensor:
    return torch.empty_like(base)


@torch.library.custom_op("attention_atlas::causal_pairwise_terms_backward", mutates_args=())
def causal_pairwise_backward_op(
    grad: Tensor, ut: Tensor, x: Tensor, out: Tensor, scale: float, block: int, softmax: bool
) -> tuple[Tensor, Tensor, Tensor]:
    """The backward of :func:`causal_pairwise_op`: ``(d_base, d_ut, d_x)``."""
    return _causal_backward(grad, ut, x, [], out if softmax else None, scale, block, softmax)


@causal_pairwise_backward_op.register_fake
def _(
    grad: Tensor, ut: Tensor, x: Tensor, out: Tensor, scale: float, block: int, softmax: bool
) -> tuple[Tensor, Tensor, Tensor]:
    return torch.empty_like(grad), torch.empty_like(ut), torch.empty_like(x)


def _op_setup(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    _, ut, x, scale, block, softmax = inputs
    ctx.save_for_backward(ut, x, output)
    ctx.consts = (scale, block, softmax)


def _op_backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, Tensor, None, None, None]:
    ut, x, out = ctx.saved_tensors
    d_base, d_ut, d_x = causal_pairwise_backward_op(grad, ut, x, out, *ctx.consts)
    return d_base, d_ut, d_x, None, None, None


causal_pairwise_op.register_autograd(_op_backward, setup_context=_op_setup)


def _above_diagonal(seq: int, device: torch.device) -> Tensor:
    """``(L, L)``, True where ``j > i``."""
    return torch.ones(seq, seq, dtype=torch.bool, device=device).triu_(1)


def pairwise_metric_terms(
    U: Tensor,
    q: Tensor,
    k: Tensor,
    *,
    scale: float = 1.0,
    causal: bool = False,
    base: Tensor | None = None,
    softmax: bool = False,
) -> Tensor:
    """``scale (|U_i^T (q_i - k_j)|^2 + |U_j^T (q_i - k_j)|^2)``: the metric terms of eq. (16).

    ``U (..., L, d, r)``, ``q, k (..., L, d)`` -> ``(..., L, L)``. ``U_i^T q_i`` and ``U_j^T k_j``
    are per token; ``U_t^T k_s`` and ``U_t^T q_s`` for every pair come from one product ``(L r,
    d) x (d, 2L)`` per batch item (``O(d r)`` per pair), with a written-out backward.
    ``causal=True``: the terms of the pairs ``j <= i`` only, the entries ``j > i`` are ``-inf``
    (scores under a causal mask), from products over blocks of :data:`CAUSAL_BLOCK` tokens
    against ``L + b`` columns each; ``base (N, L, L)`` (``N`` the product of the batch
    dimensions; a fresh tensor, overwritten) is then added to the terms in place (the rest of a
    score, without another pass over ``L x L``); ``softmax=True`` (with ``causal``) returns the
    row-wise softmax of that sum, the attention probabilities, with a backward that needs no
    mask.
    """
    check_metric_inputs(q, k, U, 1.0)
    *batch, seq, d, r = U.shape
    ut = factor_rows(U, per_sequence=True)
    if causal:
        x = torch.cat([q, k], -2).reshape(-1, 2 * seq, d)
        acc = ut.new_zeros(ut.shape[0], seq, seq) if base is None else base
        if acc.shape != (ut.shape[0], seq, seq):
            raise ValueError(
                f"base must have shape {(ut.shape[0], seq, seq)}, got {tuple(acc.shape)}"
            )
        if native.active(ut, x, acc) and r <= native.MAX_RANK:  # the native kernel (opt-in)
            from attention_atlas.native.functions import CausalPairwiseTerms

            out = CausalPairwiseTerms.apply(acc, ut.contiguous(), x, float(scale), softmax)
            return out.view(*batch, seq, seq)
        block = _block(ut.device)
        opaque = torch.compiler.is_compiling() and not _keeps_products(ut, block)
        apply = causal_pairwise_op if opaque else _CausalPairwiseMetricTerms.apply
        out = apply(acc, ut, x, float(scale), block, softmax)
        return out.view(*batch, seq, seq)
    if base is not None or softmax:
        raise ValueError("base and softmax are only taken with causal=True")
    if native.active(ut, q, k) and r <= native.MAX_RANK:  # the native kernel (opt-in)
        from attention_atlas.native.functions import PairwiseTerms

        x = torch.cat([q, k], -2).reshape(-1, 2 * seq, d)
        return PairwiseTerms.apply(ut.contiguous(), x, float(scale)).view(*batch, seq, seq)
    uq, uk = factor_t_apply(U, q), factor_t_apply(U, k)  # the centres U_i^T q_i, U_j^T k_j
    x = torch.stack([k, q], -3).reshape(-1, 2, seq, d)
    c = torch.stack([uq, uk], -1).reshape(-1, seq, r, 2)
    return _PairwiseMetricTerms.apply(ut, x, c, float(scale)).view(*batch, seq, seq)
