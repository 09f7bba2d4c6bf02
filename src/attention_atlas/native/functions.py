"""Autograd functions on the native kernels: each is the fast path of one function of the
library, which calls it when :func:`attention_atlas.native.active` (same arguments, same
maths, other rounding), and each is tested against that function's reference in float64.

| here | the library's function (and its reference) |
| --- | --- |
| :class:`CausalPairwiseTerms`, :class:`PairwiseTerms` | ``riemannian.pairwise.pairwise_metric_terms`` (eq. (16)) |
| :class:`CausalScores` (level 2) | ``riemannian.scores.geodesic_scores_decomposed`` (causal, eq. (16) with its base) |
| :class:`MetricProjection` | ``riemannian.geometry.metric_aware_projections`` (eq. (20)) |
| :class:`WoodburyApply` | ``riemannian.geometry.metric_preconditioned_update`` (eq. (26)) |
| :class:`SkewFactorsApply` | ``riemannian.geometry.skew_factors_apply`` (eqs. (22), (24)) |
| :class:`GramSums` | ``riemannian.regularizers.gram_sums`` (eqs. (32), (33)) |
| :class:`MetricStrength` (level 2) | ``riemannian.geometry.metric_strength`` |
| :class:`FiberBundleTerms` (level 2) | ``riemannian.regularizers.fiber_bundle_regularizer`` (eqs. (31) to (34)) |
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from . import MAX_RANK, call, kernel

__all__ = [
    "CausalPairwiseTerms",
    "CausalScores",
    "FiberBundleTerms",
    "GramSums",
    "MetricStrength",
    "MetricProjection",
    "PairwiseTerms",
    "SkewFactorsApply",
    "WoodburyApply",
]


def _scores_backward(
    ctx: Any, grad: Tensor, **sums: Tensor
) -> tuple[Tensor | None, Tensor, Tensor]:
    """``(d_scores or None, d_ut, d_x)`` of the causal scores saved as ``(ut, x[, probs])``:
    one pairwise backward call that first forms, item by item while it is in cache, the
    scores' gradient from ``grad`` (through the softmax with ``ctx.softmax``, zero above the
    diagonal: ``scores_grad`` in ``kernels.c``, in place of torch's softmax backward and sums
    over ``(N, L, L)``), into a new ``(N, L, L)`` tensor, or, where ``d_row`` and ``d_col``
    (``(N, L)``) are given, only into those: its row and column sums."""
    ut, x, *probs = ctx.saved_tensors
    d_ut, d_x = torch.empty_like(ut), torch.empty_like(x)
    d_s = None if sums else torch.empty_like(grad, memory_format=torch.contiguous_format)
    call("pairwise_backward", ut, x, grad.contiguous(), d_ut, d_x, *ut.shape, float(ctx.scale),
         1, float(ctx.c1), 1, probs[0] if ctx.softmax else 0,
         0 if d_s is None else d_s, sums.get("d_row", 0), sums.get("d_col", 0))  # fmt: skip
    return d_s, d_ut, d_x


class CausalPairwiseTerms(torch.autograd.Function):
    """``base + scale (|U_i^T (q_i - k_j)|^2 + |U_j^T (q_i - k_j)|^2)`` for ``j <= i`` and
    ``-inf`` above the diagonal, in place in ``base (N, L, L)``, or its row-wise softmax
    (``softmax=True``): ``ut (N, L, r, d)``, ``x (N, 2L, d)`` (queries, then keys)."""

    @staticmethod
    def forward(
        ctx: Any, base: Tensor, ut: Tensor, x: Tensor, scale: float, softmax: bool
    ) -> Tensor:  # type: ignore[override]
        call("pairwise_forward", ut, x, base, *ut.shape, float(scale), 1, 0, 0, 0.0)  # -inf above
        ctx.scale, ctx.c1, ctx.softmax = scale, 0.0, softmax  # c1 = 0: no base in the kernel
        if softmax:
            out = torch.softmax(base, -1)
            ctx.save_for_backward(ut, x, out)
            return out
        ctx.mark_dirty(base)
        ctx.save_for_backward(ut, x)
        return base

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor, Tensor, None, None]:  # type: ignore[override]
        d_base, d_ut, d_x = _scores_backward(ctx, grad)
        return d_base, d_ut, d_x, None, None


class CausalScores(torch.autograd.Function):
    """The causal geodesic scores of eq. (16) with their base formed in the same kernel:
    ``c1 q_i . k_j + row_i + col_j + scale (|U_i^T (q_i - k_j)|^2 + |U_j^T (q_i - k_j)|^2)`` for
    ``j <= i`` and ``-inf`` above the diagonal, ``(N, L, L)``, or its row-wise softmax
    (``softmax=True``): ``ut (N, L, r, 16)``, ``x (N, 2L, 16)`` (queries, then keys), ``row``,
    ``col (N, L)``. Head dimension 16 only (the kernels' vector path). Native level 2: the
    batched product of the base and its backward are gone (the base's share of ``dq`` and ``dk``
    is summed with the pair terms'; ``d row`` and ``d col`` are the row and column sums of the
    scores' gradient). With ``softmax`` the kernel forms each row's softmax as soon as the row is
    complete (``softmax_row`` in ``kernels.c``: its own exponential, a few ulp, and a fixed order
    of sums), not in a second pass over the scores."""

    @staticmethod
    def forward(ctx: Any, ut: Tensor, x: Tensor, row: Tensor, col: Tensor, c1: float,
                scale: float, softmax: bool) -> Tensor:  # type: ignore[override]  # fmt: skip
        n, seq, r, d = ut.shape
        if d != 16 or r > MAX_RANK:
            raise ValueError(f"CausalScores takes head dimension 16 and ranks up to {MAX_RANK}, "
                             f"got d={d}, r={r}")  # fmt: skip
        out = ut.new_empty(n, seq, seq)
        causal = 2 if softmax else 1  # 2: each row's softmax in the kernel, while in cache
        call("pairwise_forward", ut, x, out, n, seq, r, d, float(scale), causal, row, col,
             float(c1))  # fmt: skip
        ctx.scale, ctx.c1, ctx.softmax = scale, c1, softmax
        if softmax:
            ctx.save_for_backward(ut, x, out)
            return out
        ctx.save_for_backward(ut, x)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        d_row, d_col = grad.new_empty(2, *grad.shape[:2])  # row and column sums of d scores
        _, d_ut, d_x = _scores_backward(ctx, grad, d_row=d_row, d_col=d_col)
        return d_ut, d_x, d_row, d_col, None, None, None


class PairwiseTerms(torch.autograd.Function):
    """``scale (|U_i^T (q_i - k_j)|^2 + |U_j^T (q_i - k_j)|^2)`` for every pair, ``(N, L, L)``:
    ``ut (N, L, r, d)``, ``x (N, 2L, d)`` (queries, then keys)."""

    @staticmethod
    def forward(ctx: Any, ut: Tensor, x: Tensor, scale: float) -> Tensor:  # type: ignore[override]
        n, seq = ut.shape[:2]
        out = ut.new_zeros(n, seq, seq)
        call("pairwise_forward", ut, x, out, *ut.shape, float(scale), 0, 0, 0, 0.0)
        ctx.scale = scale
        ctx.save_for_backward(ut, x)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, None]:  # type: ignore[override]
        ut, x = ctx.saved_tensors
        d_ut, d_x = torch.empty_like(ut), torch.empty_like(x)
        call("pairwise_backward", ut, x, grad.contiguous(), d_ut, d_x, *ut.shape,
             float(ctx.scale), 0, 0.0, 0, 0, 0, 0, 0)  # fmt: skip
        return d_ut, d_x, None


#: the path of the per-token kernels of :class:`MetricProjection` and :class:`SkewFactorsApply`
#: for head dimension 16: tokens as the lanes of vector values, 16 or 8 per pass
#: (:func:`attention_atlas.native.vector_lanes`) (1), or token by token, each row of 16 as two
#: vectors of 8 (0). Both sum over the head dimension in one order (``tree16`` in
#: ``kernels.c``: products of the two halves, then neighbours, pairs and halves), so the float
#: build gives the same bits either way (tested). Token by token needs no transposes: on an AMD
#: EPYC 7003 (AVX2) at chapter 4's book shape it took the skew factors' backward from 488 to
#: 158 us and the projection's from 313 to 136 us (the kernels called alone, interleaved)
TOKEN_LANES = 0


class MetricProjection(torch.autograd.Function):
    """``x + s U (U^T x)`` for each ``x`` under the same ``ut = U^T (N, r, d)``, ``s ()``: each
    ``x`` either ``(N, d)`` contiguous or a ``(B, H, L, d)`` view with ``B H L = N`` and ``d``
    contiguous, read through its strides (a head's queries inside the ``qkv`` projection: no
    copy); the outputs and the gradients of ``x`` are contiguous."""

    @staticmethod
    def forward(ctx: Any, ut: Tensor, s: Tensor, *xs: Tensor) -> tuple[Tensor, ...]:  # type: ignore[override]
        n, r, d = ut.shape
        ys = []
        for x in xs:
            y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
            call("projection_forward", ut, x.data_ptr(), y, *_tokens(x, n), r, d, float(s),
                 TOKEN_LANES)  # fmt: skip
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
            dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
            ds += float(call("projection_backward", ut, x.data_ptr(), g.contiguous(), dx, d_ut,
                             *_tokens(x, n), r, d, float(s), TOKEN_LANES) or 0.0)  # fmt: skip
            dxs.append(dx)
        return (d_ut, s.new_tensor(ds).reshape(s.shape), *dxs)


def _tokens(x: Tensor, n: int) -> tuple[int, ...]:
    """The three token dimensions of ``x`` and their strides, ``(B, H, L, sb, sh, sl)``, for a
    kernel that reads token ``(b H + h) L + l`` at ``b sb + h sh + l sl``: ``x (B, H, L, d)`` with
    ``d`` contiguous (any other strides), or ``(N, d)`` contiguous; ``n`` tokens in all."""
    if x.device.type != "cpu" or x.stride(-1) != 1 or x.numel() != n * x.shape[-1]:
        raise ValueError(f"x must hold {n} CPU tokens with d contiguous, got shape "
                         f"{tuple(x.shape)}, strides {x.stride()}, {x.device}")  # fmt: skip
    if x.dim() == 4:
        return (*x.shape[:3], *x.stride()[:3])
    if x.dim() == 2 and x.is_contiguous():
        return (n, 1, 1, x.shape[-1], 0, 0)
    raise ValueError(f"x must be (N, d) contiguous or (B, H, L, d), got shape {tuple(x.shape)}, "
                     f"strides {x.stride()}")  # fmt: skip


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
    """``x + sum_p w_p (L_p R_p^T - R_p L_p^T) x`` per token: ``x (B, Q, H, d)`` (any strides
    with ``d`` contiguous: a transposed view is read in place), ``w (P,)`` and the pairs'
    transposed factors ``L_p^T, R_p^T``, either one tensor per pair ``(B, Q, H, 2, r, d)``
    (``P`` tensors, e.g. the outputs of two nets, never stacked) or one tensor ``(B, Q, H, 2P,
    r, d)``; all contiguous. Returns ``y (B, Q, H, d)``, contiguous; ``dx`` has ``x``'s strides."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, w: Tensor, *factors: Tensor) -> Tensor:  # type: ignore[override]
        *_, r, d = factors[0].shape
        y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        wc = w.detach().contiguous()
        ptrs, fs = _pair_pointers(factors, w.shape[0])
        call("skew_forward", ptrs.data_ptr(), x.data_ptr(), wc, y, *_tokens(x, x.numel() // x.shape[-1]), w.shape[0],
             r, d, fs, TOKEN_LANES)  # fmt: skip
        ctx.save_for_backward(x, wc, *factors)
        return y

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        x, w, *factors = ctx.saved_tensors
        *_, r, d = factors[0].shape
        d_factors = [torch.empty_like(f) for f in factors]
        dx = torch.empty_like(x)  # x's strides (a dense view keeps them)
        dw = torch.zeros(w.shape[0], dtype=torch.float64)
        ptrs, fs = _pair_pointers(factors, w.shape[0])
        dptrs, _ = _pair_pointers(d_factors, w.shape[0])
        call("skew_backward", ptrs.data_ptr(), x.data_ptr(), g.contiguous(), w, dptrs.data_ptr(),
             dx.data_ptr(), dw, *_tokens(x, x.numel() // x.shape[-1]), w.shape[0], r, d, fs,
             TOKEN_LANES)  # fmt: skip
        return (dx, dw.to(w.dtype), *d_factors)


def _pair_pointers(factors: Sequence[Tensor], pairs: int) -> tuple[Tensor, int]:
    """The address of each pair's first factor and the factors' stride between tokens (in
    elements): one tensor per pair ``(..., 2, r, d)``, or one ``(..., 2P, r, d)``."""
    for f in factors:
        if not f.is_contiguous() or f.device.type != "cpu":
            raise ValueError(f"the skew factors must be contiguous CPU tensors, got {f.device} "
                             f"strides {f.stride()}")  # fmt: skip
    *_, p2, r, d = factors[0].shape
    size = factors[0].element_size()
    if len(factors) == 1:  # (..., 2P, r, d): pair p starts 2 p r d numbers into each token
        base = factors[0].data_ptr()
        addresses = [base + 2 * p * r * d * size for p in range(pairs)]
    else:
        addresses = [f.data_ptr() for f in factors]
    return torch.tensor(addresses, dtype=torch.int64), p2 * r * d


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


class FiberBundleTerms(torch.autograd.Function):
    """The scheduled sum of the Fiber Bundle regularisers, mean over layers: ``spec = (w,
    kappa_min, kappa_max)`` with ``w`` the five weights of
    ``riemannian.regularizers.TERMS`` (``anti, div, smooth, cap, l2``), then each layer's ``ut =
    U^T (N, L, r, d)`` (contiguous: the r-major storage of ``U (B, H, L, d, r)``); a scalar of
    their dtype, ``mean_layers sum_k w_k term_k``. One kernel call per layer forms the terms and,
    under autograd, the gradient of the sum (the Gram matrices, ``M`` and ``kappa`` still in
    hand), so the backward only scales it; the Gram sums are skipped where ``div`` and ``smooth``
    weigh 0. Native level 2 (:data:`attention_atlas.native.LEVEL`)."""

    @staticmethod
    def forward(ctx: Any, spec: tuple[Sequence[float], float, float], *uts: Tensor) -> Tensor:  # type: ignore[override]
        w, kappa_min, kappa_max = spec
        if len(w) != 5 or not uts:
            raise ValueError(f"need 5 weights and at least one layer, got {len(w)} and {len(uts)}")
        first = uts[0]
        n, seq, r, d = first.shape
        for ut in uts:
            if (ut.shape != first.shape or ut.dtype != first.dtype or not ut.is_contiguous()
                    or ut.device.type != "cpu"):  # fmt: skip
                raise ValueError("the layers' ut must be contiguous CPU (N, L, r, d) of one dtype, "
                                 f"got {[(tuple(u.shape), u.dtype, u.device.type, u.is_contiguous()) for u in uts]}")  # fmt: skip
        if r > MAX_RANK:
            raise ValueError(f"the native kernels take ranks up to {MAX_RANK}, got r={r}")
        weights = torch.tensor([float(x) for x in w], dtype=torch.float64)
        grams = int(w[1] != 0 or w[2] != 0)
        grad = any(ctx.needs_input_grad[1:])
        sc = 1.0 / len(uts)
        terms = torch.empty(len(uts), 5, dtype=torch.float64)
        fn = kernel("fbt_terms", first.dtype)
        grads = []
        for i, ut in enumerate(uts):
            dut = torch.empty_like(ut) if grad else None
            fn(ut.data_ptr(), 0 if dut is None else dut.data_ptr(), terms[i].data_ptr(), n, seq,
               r, d, weights.data_ptr(), float(kappa_min), float(kappa_max), sc, grams)  # fmt: skip
            grads.append(dut)
        ctx.grads = grads
        per_term = terms.sum(0).tolist()  # each term summed over the layers
        return torch.tensor(sc * sum(float(x) * t for x, t in zip(w, per_term)), dtype=first.dtype)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        if g.item() == 1.0:  # the usual weight: the gradient as formed (d * 1 would copy it)
            return (None, *ctx.grads)
        return (None, *(None if d is None else d * g for d in ctx.grads))


class MetricStrength(torch.autograd.Function):
    """``kappa_n = |x_n|^2`` for ``x (N, w)`` contiguous (the rows of ``ut = U^T``: ``kappa_t =
    |U_t|_F^2``), one pass, ``(N,)``; the backward ``2 g_n x_n``. Native level 2."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:  # type: ignore[override]
        out = x.new_empty(x.shape[0])
        call("sumsq", x, out, *x.shape)
        ctx.save_for_backward(x)
        return out

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Tensor:  # type: ignore[override]
        (x,) = ctx.saved_tensors
        return x * (2 * g).unsqueeze(-1)
