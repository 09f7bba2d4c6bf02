"""Autograd functions on the native kernels: each is the fast path of one function of the
library, which calls it when :func:`attention_atlas.native.active` (same arguments, same
maths, other rounding), and each is tested against that function's reference in float64.

| here | the library's function (and its reference) |
| --- | --- |
| :class:`CausalPairwiseTerms`, :class:`PairwiseTerms` | ``riemannian.pairwise.pairwise_metric_terms`` (eq. (16)) |
| :class:`MetricProjection` | ``riemannian.geometry.metric_aware_projections`` (eq. (20)) |
| :class:`WoodburyApply` | ``riemannian.geometry.metric_preconditioned_update`` (eq. (26)) |
| :class:`SkewFactorsApply` | ``riemannian.geometry.skew_factors_apply`` (eqs. (22), (24)) |
| :class:`GramSums` | ``riemannian.regularizers.gram_sums`` (eqs. (32), (33)) |
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from . import call

__all__ = [
    "CausalPairwiseTerms",
    "GramSums",
    "MetricProjection",
    "PairwiseTerms",
    "SkewFactorsApply",
    "WoodburyApply",
]


def _above_diagonal(seq: int, device: torch.device) -> Tensor:
    return torch.ones(seq, seq, dtype=torch.bool, device=device).triu_(1)


class CausalPairwiseTerms(torch.autograd.Function):
    """``base + scale (|U_i^T (q_i - k_j)|^2 + |U_j^T (q_i - k_j)|^2)`` for ``j <= i`` and
    ``-inf`` above the diagonal, in place in ``base (N, L, L)``, or its row-wise softmax
    (``softmax=True``): ``ut (N, L, r, d)``, ``x (N, 2L, d)`` (queries, then keys)."""

    @staticmethod
    def forward(
        ctx: Any, base: Tensor, ut: Tensor, x: Tensor, scale: float, softmax: bool
    ) -> Tensor:  # type: ignore[override]
        seq = ut.shape[1]
        call("pairwise_forward", ut, x, base, *ut.shape, float(scale), 1)
        base.masked_fill_(_above_diagonal(seq, base.device), float("-inf"))
        ctx.scale, ctx.softmax = scale, softmax
        if softmax:
            out = torch.softmax(base, -1)
            ctx.save_for_backward(ut, x, out)
            return out
        ctx.mark_dirty(base)
        ctx.save_for_backward(ut, x)
        return base

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, Tensor, None, None]:  # type: ignore[override]
        ut, x, *probs = ctx.saved_tensors
        seq = ut.shape[1]
        if ctx.softmax:
            d_base = torch._softmax_backward_data(grad, probs[0], -1, probs[0].dtype)
        else:
            d_base = torch.where(_above_diagonal(seq, grad.device), 0.0, grad)
        d_base = d_base.contiguous()
        d_ut, d_x = torch.empty_like(ut), torch.empty_like(x)
        call("pairwise_backward", ut, x, d_base, d_ut, d_x, *ut.shape, float(ctx.scale), 1)
        return d_base, d_ut, d_x, None, None


class PairwiseTerms(torch.autograd.Function):
    """``scale (|U_i^T (q_i - k_j)|^2 + |U_j^T (q_i - k_j)|^2)`` for every pair, ``(N, L, L)``:
    ``ut (N, L, r, d)``, ``x (N, 2L, d)`` (queries, then keys)."""

    @staticmethod
    def forward(ctx: Any, ut: Tensor, x: Tensor, scale: float) -> Tensor:  # type: ignore[override]
        n, seq = ut.shape[:2]
        out = ut.new_zeros(n, seq, seq)
        call("pairwise_forward", ut, x, out, *ut.shape, float(scale), 0)
        ctx.scale = scale
        ctx.save_for_backward(ut, x)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, None]:  # type: ignore[override]
        ut, x = ctx.saved_tensors
        d_ut, d_x = torch.empty_like(ut), torch.empty_like(x)
        call("pairwise_backward", ut, x, grad.contiguous(), d_ut, d_x, *ut.shape,
             float(ctx.scale), 0)  # fmt: skip
        return d_ut, d_x, None


class MetricProjection(torch.autograd.Function):
    """``x + s U (U^T x)`` for each ``x (N, d)`` under the same ``ut = U^T (N, r, d)``, ``s ()``."""

    @staticmethod
    def forward(ctx: Any, ut: Tensor, s: Tensor, *xs: Tensor) -> tuple[Tensor, ...]:  # type: ignore[override]
        n, r, d = ut.shape
        ys = []
        for x in xs:
            y = torch.empty_like(x)
            call("projection_forward", ut, x, y, n, r, d, float(s))
            ys.append(y)
        ctx.save_for_backward(ut, s, *xs)
        return tuple(ys)

    @staticmethod
    def backward(ctx: Any, *gs: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        ut, s, *xs = ctx.saved_tensors
        n, r, d = ut.shape
        d_ut, ds = torch.zeros_like(ut), 0.0
        dxs: list[Tensor | None] = []
        for x, g in zip(xs, gs):
            if g is None:
                dxs.append(None)
                continue
            dx = torch.empty_like(x)
            ds += float(call("projection_backward", ut, x, g.contiguous(), dx, d_ut, n, r, d,
                             float(s)) or 0.0)  # fmt: skip
            dxs.append(dx)
        return (d_ut, s.new_tensor(ds).reshape(s.shape), *dxs)


class WoodburyApply(torch.autograd.Function):
    """``(I + U U^T)^{-1} x`` per token: ``ut = U^T (N, r, d)``, ``x (N, d)``."""

    @staticmethod
    def forward(ctx: Any, ut: Tensor, x: Tensor) -> Tensor:  # type: ignore[override]
        y = torch.empty_like(x)
        call("woodbury_forward", ut, x, y, *ut.shape)
        ctx.save_for_backward(ut, y)
        return y

    @staticmethod
    def backward(ctx: Any, dy: Tensor) -> tuple[Tensor, Tensor]:  # type: ignore[override]
        ut, y = ctx.saved_tensors
        dx, d_ut = torch.empty_like(y), torch.empty_like(ut)
        call("woodbury_backward", ut, y, dy.contiguous(), dx, d_ut, *ut.shape)
        return d_ut, dx


class SkewFactorsApply(torch.autograd.Function):
    """``x + sum_p w_p (L_p R_p^T - R_p L_p^T) x``: ``wt (N, 2P, r, d)``, ``x (N, d)``, ``w (P,)``."""

    @staticmethod
    def forward(ctx: Any, wt: Tensor, x: Tensor, w: Tensor) -> Tensor:  # type: ignore[override]
        n, p2, r, d = wt.shape
        y = torch.empty_like(x)
        wc = w.detach().contiguous()
        call("skew_forward", wt, x, wc, y, n, p2 // 2, r, d)
        ctx.save_for_backward(wt, x, wc)
        return y

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor, Tensor, Tensor]:  # type: ignore[override]
        wt, x, w = ctx.saved_tensors
        n, p2, r, d = wt.shape
        d_wt, dx = torch.empty_like(wt), torch.empty_like(x)
        dw = torch.zeros(p2 // 2, dtype=torch.float64)
        call("skew_backward", wt, x, g.contiguous(), w, d_wt, dx, dw, n, p2 // 2, r, d)
        return d_wt, dx, dw.to(w.dtype)


class GramSums(torch.autograd.Function):
    """``(|G_t|^2 (N, L), |C_t|^2 (N, L-1), |M|^2 (N,))`` with ``G_t = U_t^T U_t``, ``C_t =
    U_t^T U_{t+1}``, ``M = sum_t U_t U_t^T``, on ``ut = U^T (N, L, r, d)``."""

    @staticmethod
    def forward(ctx: Any, ut: Tensor) -> tuple[Tensor, Tensor, Tensor]:  # type: ignore[override]
        n, seq, r, d = ut.shape
        self_sq, cross = ut.new_empty(n, seq), ut.new_empty(n, seq - 1)
        total, m = ut.new_empty(n), ut.new_empty(n, d, d)
        call("gram_forward", ut, self_sq, cross, total, m, n, seq, r, d)
        ctx.save_for_backward(ut, m)
        return self_sq, cross, total

    @staticmethod
    def backward(ctx: Any, ds: Tensor, dc: Tensor, dm: Tensor) -> Tensor:  # type: ignore[override]
        ut, m = ctx.saved_tensors
        d_ut = torch.empty_like(ut)
        call("gram_backward", ut, m, ds.contiguous(), dc.contiguous(), dm.contiguous(), d_ut,
             *ut.shape)  # fmt: skip
        return d_ut
