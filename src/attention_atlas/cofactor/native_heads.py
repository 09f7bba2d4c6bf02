"""The cofactor regulariser's native kernels on chosen heads read where they lie.

:class:`HeadMatrices` locates each chosen ``(item, head)`` matrix of per-layer ``(B, H, n, d)``
query and key tensors by address (any strides with ``d`` contiguous, such as a forward's views
of its ``qkv`` projection) and runs the kernels of
:class:`~attention_atlas.cofactor.penalty.CausalHeadPenalty` on them;
:class:`CausalHeadsPenalty` is the autograd node the harness's regulariser uses with the native
kernels on: no slice, stack or copy of the heads in the forward, and in the backward whole
``(B, H, n, d)`` gradients written only at the chosen heads.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable

from .. import native

__all__ = ["CausalHeadsPenalty", "HeadMatrices"]


class HeadMatrices:
    """The native kernels' view of chosen heads: ``qs``, ``ks`` one ``(B, H, n, d)`` tensor per
    layer (any strides with ``d`` contiguous, e.g. a head's view of a projection), heads
    ``idx`` of the first ``items`` items; matrix ``(layer, item, head)`` in that order, located
    by address (no slice, stack or copy)."""

    def __init__(
        self, qs: Sequence[Tensor], ks: Sequence[Tensor], idx: Sequence[int], items: int
    ) -> None:
        self.idx, self.items, self.dtype = list(idx), items, qs[0].dtype
        self.n, self.d = qs[0].shape[-2:]
        self.qp, self.rq = self.addresses(qs)
        self.kp, self.rk = self.addresses(ks)
        self.count = len(self.qp)

    def addresses(self, ts: Sequence[Tensor]) -> tuple[Tensor, int]:
        """Each chosen matrix's first row's address and the rows' stride (one for all)."""
        strides = ts[0].stride()
        if strides[-1] != 1 or any(t.stride() != strides or t.shape != ts[0].shape for t in ts):
            raise ValueError("the heads' queries and keys need one shape and strides with d "
                             f"contiguous, got strides {[t.stride() for t in ts]}")  # fmt: skip
        offsets = _matrix_offsets(strides[:2], ts[0].element_size(), tuple(self.idx), self.items)
        at = [base + o for base in [t.data_ptr() for t in ts] for o in offsets]
        return torch.tensor(at, dtype=torch.int64), strides[2]

    def forward(self, scale: float, beta: float, eps: float) -> tuple[Tensor, Tensor, Tensor]:
        """``(loss (count,), A (count, n (n + 1) / 2) packed rows, s (count, n))``."""
        n = self.n
        A = torch.empty(self.count, n * (n + 1) // 2, dtype=self.dtype)  # row i's j <= i, packed
        s = torch.empty(self.count, n, dtype=torch.float64)
        loss = torch.empty(self.count, dtype=torch.float64)
        native.call("causal_head_forward", self.qp.data_ptr(), self.kp.data_ptr(), A, s, loss,
                    self.count, n, self.d, self.rq, self.rk, scale, beta, eps)  # fmt: skip
        return loss, A, s

    def backward(
        self, g: Tensor, A: Tensor, s: Tensor, dqs: Sequence[Tensor], dks: Sequence[Tensor],
        scale: float, beta: float, eps: float,
    ) -> None:  # fmt: skip
        """Write ``dq``, ``dk`` of the chosen matrices into ``dqs``, ``dks`` (laid out as
        ``qs``, ``ks``; other entries untouched) for the loss's gradient ``g (count,)``."""
        dqp, rdq = self.addresses(dqs)
        dkp, rdk = self.addresses(dks)
        native.call("causal_head_backward", self.qp.data_ptr(), self.kp.data_ptr(), A,
                    g.to(torch.float64).contiguous(), s, dqp.data_ptr(), dkp.data_ptr(),
                    self.count, self.n, self.d, self.rq, self.rk, rdq, rdk, scale, beta, eps)  # fmt: skip


@functools.lru_cache(maxsize=64)
def _matrix_offsets(
    strides: tuple[int, int], size: int, idx: tuple[int, ...], items: int
) -> tuple[int, ...]:
    """Byte offsets of the matrices ``(item, head)`` of a ``(B, H, n, d)`` tensor with item and
    head strides ``strides``, items first (cached: a step asks for the same ones each time)."""
    return tuple((b * strides[0] + h * strides[1]) * size for b in range(items) for h in idx)


class CausalHeadsPenalty(torch.autograd.Function):
    """The mean of :class:`~attention_atlas.cofactor.penalty.CausalHeadPenalty` over chosen heads
    read in place (native kernels only): ``spec = (idx, items, scale, beta, eps)`` and the
    layers' whole queries then keys, ``(B, H, n, d)`` each (the forward's views of its
    projection); a float64 scalar. Under autograd the forward kernel also forms the gradient
    of the mean, matrix by matrix while its softmax rows are in cache (the loss is linear in
    its upstream gradient ``g``, so the backward only scales it by ``g`` into whole ``(B, H, n,
    d)`` gradients, zero outside the chosen heads): one kernel call each way and nothing
    stacked, sliced or written out in between."""

    @staticmethod
    def forward(ctx: FunctionCtx, spec: tuple[Any, ...], *qks: Tensor) -> Tensor:  # type: ignore[override]
        idx, items, scale, beta, eps = spec
        nl = len(qks) // 2
        heads = HeadMatrices(qks[:nl], qks[nl:], idx, items)
        grad = any(ctx.needs_input_grad[1:])  # type: ignore[attr-defined]
        shape = (heads.count, heads.n, heads.d) if grad else (1,)
        gq, gk = torch.empty(shape, dtype=heads.dtype), torch.empty(shape, dtype=heads.dtype)
        loss = torch.empty(heads.count, dtype=torch.float64)
        native.call("causal_heads_fused", heads.qp.data_ptr(), heads.kp.data_ptr(), gq, gk, loss,
                    heads.count, heads.n, heads.d, heads.rq, heads.rk, scale, beta, eps,
                    int(grad))  # fmt: skip
        ctx.heads, ctx.units = heads, (gq, gk)  # type: ignore[attr-defined]
        ctx.shapes = [(t.shape, t.dtype) for t in qks]  # type: ignore[attr-defined]
        return loss.mean()

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, g: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        heads, (gq, gk) = ctx.heads, ctx.units  # type: ignore[attr-defined]
        grads = [torch.zeros(shape, dtype=dtype) for shape, dtype in ctx.shapes]  # type: ignore[attr-defined]
        nl = len(grads) // 2
        dqp, rdq = heads.addresses(grads[:nl])
        dkp, rdk = heads.addresses(grads[nl:])
        native.call("causal_heads_scatter", gq, gk, dqp.data_ptr(), dkp.data_ptr(), heads.count,
                    heads.n, heads.d, rdq, rdk, float(g))  # fmt: skip
        needs = ctx.needs_input_grad[1:]  # type: ignore[attr-defined]
        return (None, *(gr if need else None for gr, need in zip(grads, needs)))
