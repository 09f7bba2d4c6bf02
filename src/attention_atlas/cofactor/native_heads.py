"""The cofactor regulariser's native kernels on chosen heads read where they lie.

:class:`HeadMatrices` locates each chosen ``(item, head)`` matrix of per-layer ``(B, H, n, d)``
query and key tensors by address (any strides with ``d`` contiguous, such as a forward's views
of its ``qkv`` projection) and runs the kernels of
:class:`~attention_atlas.cofactor.penalty.CausalHeadPenalty` on them;
:class:`CausalHeadsPenalty` is the autograd node the harness's regulariser uses with the native
kernels on (through :func:`heads_penalty`): the chosen heads are views of the projection, no
stack or copy in the forward, and the backward only scales the gradient the forward kernel
formed.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable

from attention_atlas import native

__all__ = ["CausalHeadsPenalty", "HeadMatrices", "heads_penalty", "inplace_grads"]

_state = threading.local()


@contextlib.contextmanager
def inplace_grads(on: bool = True) -> Iterator[None]:
    """Within: the harness's cofactor regulariser adds the chosen heads' query and key gradients
    in place into the ones the rest of the backward pass gives the same tensors
    (:func:`heads_penalty` with ``inplace_grad``): one slice added per tensor, nothing
    zero-filled, no sparse tensor. The training step switches it on around its regularisers
    when its forward ran eagerly: it differentiates their sum with the task loss, and every
    head's queries and keys take a gradient of their own from the attention that consumed them
    (SDPA or a product, fresh tensors). A compiled forward's queries and keys are outputs of its
    graph, and a loss of the regulariser alone gives them no other gradient: the first leaves it
    off, the second fails with it on (a clear error); off is the default."""
    before = getattr(_state, "on", False)
    _state.on = bool(on)
    try:
        yield
    finally:
        _state.on = before


def inplace_grads_on() -> bool:
    """Whether :func:`inplace_grads` is on in this thread."""
    return bool(getattr(_state, "on", False))


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
    read in place (native kernels only): ``spec = (scale, beta, eps, items, h0, nh, inplace)``
    and each layer's queries then keys, ``(B, H, n, d)`` each, with ``d`` contiguous and any
    other strides (views of the forward's projection: :func:`heads_penalty` passes them); the
    matrices of items ``t < items`` and heads ``h0 <= h < h0 + nh``, located by address (no
    slice or copy); a float64 scalar. Under autograd the forward kernel also forms the gradient
    of the mean, matrix by matrix while its softmax rows are in cache (the loss is linear in its
    upstream gradient ``g``, so the backward only scales it by ``g``, into a zero gradient of
    each input's shape where the matrices are not all of it): one kernel call, and nothing
    stacked, sliced or written out in between. With ``inplace`` the backward returns no
    gradient for the inputs: it leaves each input's scaled matrices in ``ctx.pending``, which
    the pre-hook :func:`heads_penalty` puts on the node that made the input adds into the
    gradient the rest of the backward pass gives it (:func:`inplace_grads`)."""

    @staticmethod
    def forward(ctx: FunctionCtx, spec: tuple[float, ...], *qks: Tensor) -> Tensor:  # type: ignore[override]
        scale, beta, eps, items, h0, nh, inplace = spec
        items, h0, nh = int(items), int(h0), int(nh)
        nl, first = len(qks) // 2, qks[0]
        batch, heads, n, d = first.shape
        strides, kind = first.stride(), (first.shape, first.dtype, first.device)
        for t in qks:
            if t.stride() != strides or (t.shape, t.dtype, t.device) != kind or strides[-1] != 1:
                raise ValueError(
                    "the heads' queries and keys need one shape, dtype, device and strides with d "
                    f"contiguous, got {[(tuple(t.shape), t.stride(), t.dtype, str(t.device)) for t in qks]}"
                )
        if not (0 < items <= batch and 0 <= h0 and 0 < nh and h0 + nh <= heads):
            raise ValueError(f"items 1..{batch} and heads within 0..{heads - 1} expected, got "
                             f"{items} items and heads {h0}..{h0 + nh - 1}")  # fmt: skip
        offset = h0 * strides[1] * first.element_size()  # the first chosen head's first row
        bases = (ctypes.c_void_p * len(qks))(*[t.data_ptr() + offset for t in qks])
        grad = any(ctx.needs_input_grad[1:])  # type: ignore[attr-defined]
        # the gradients of the queries then of the keys, (2 nl, items, nh, n, d)
        units = torch.empty((2 * nl, items, nh, n, d) if grad else (1,), dtype=first.dtype)
        count = nl * items * nh
        loss = torch.empty(count + 1, dtype=torch.float64)  # each matrix's, then the mean
        at = ctypes.addressof(bases)
        fn = native.kernel("causal_heads_fused", first.dtype)
        fn(at, at + nl * ctypes.sizeof(ctypes.c_void_p), nl, items, nh, *strides[:2],
           *strides[:2], units.data_ptr(), units.data_ptr() + count * n * d * first.element_size(),
           loss.data_ptr(), n, d, strides[2], strides[2], scale, beta, eps, int(grad),
           int(native.level() >= 3))  # fmt: skip
        ctx.units, ctx.place = units, (batch, heads, items, h0)  # type: ignore[attr-defined]
        ctx.inplace, ctx.pending = inplace, [None] * len(qks)  # type: ignore[attr-defined]
        return loss[count]

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, g: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        units = ctx.units  # type: ignore[attr-defined]
        batch, heads, items, h0 = ctx.place  # type: ignore[attr-defined]
        two_nl, _, nh, n, d = units.shape
        needs = ctx.needs_input_grad[1:]  # type: ignore[attr-defined]
        if ctx.inplace:  # type: ignore[attr-defined]  # the hooks add them (heads_penalty)
            ctx.pending[:] = list((units * g).unbind(0))  # type: ignore[attr-defined]
            return (None,) * (1 + len(needs))
        if items == batch and nh == heads:
            grads = units * g
        else:  # the chosen matrices' gradients in place, zeros around them
            grads = units.new_zeros((two_nl, batch, heads, n, d))
            torch.mul(units, g, out=grads[:, :items, h0 : h0 + nh])
        return (None, *(gr if need else None for gr, need in zip(grads.unbind(0), needs)))


def _add_pending(
    node: Any, inputs: list[tuple[int, int]], grads: tuple[Tensor | None, ...]
) -> tuple[Tensor | None, ...] | None:
    """Pre-hook of the node that made inputs ``(i, output_nr)`` of a :class:`CausalHeadsPenalty`
    node ``node`` with ``inplace``: add the chosen matrices' gradients that this backward pass's
    call of ``node`` left (none where the pass did not reach it) into the node's incoming
    gradients ``grads``, in place (fresh tensors from the consumers' backward; an expanded one,
    with a zero stride, is copied first)."""
    out = list(grads)
    _, _, items, h0 = node.place
    for i, nr in inputs:
        part, node.pending[i] = node.pending[i], None
        if part is None:
            continue
        grad = out[nr]
        if grad is None:
            raise RuntimeError(
                "the cofactor regulariser's in-place gradients (native_heads.inplace_grads) need "
                "a gradient of its queries and keys from elsewhere in the same backward pass (the "
                "task loss's), got none: differentiate the regulariser alone with them off"
            )
        if 0 in grad.stride():
            out[nr] = grad = grad.clone()
        grad[:items, h0 : h0 + part.shape[1]].add_(part)
    return tuple(out)


def heads_penalty(
    qs: Sequence[Tensor], ks: Sequence[Tensor], idx: Sequence[int], items: int,
    scale: float, beta: float, eps: float, *, inplace_grad: bool = False,
) -> Tensor:  # fmt: skip
    """:class:`CausalHeadsPenalty` of heads ``idx`` of the first ``items`` items of each layer's
    queries and keys ``qs``, ``ks`` (``(B, H, n, d)`` each, ``d`` contiguous: a forward's views
    of its projection). A run of consecutive heads is read in place (no view or copy: the
    kernel takes the first head's address); other choices are gathered. ``inplace_grad``: the
    run's gradients are added by a pre-hook on the nodes that made the inputs (one per node: a
    layer's queries and keys come from one) into the gradients the rest of the backward pass
    gives them, in place (:class:`CausalHeadsPenalty`), for views (not leaves) whose other
    consumers give them fresh gradients of their own, as an attention does; with none, the hook
    refuses. :func:`inplace_grads` switches it on for the harness's regulariser."""
    idx, ts = list(idx), [*qs, *ks]
    if idx == list(range(idx[0], idx[0] + len(idx))):  # in place
        if any(t.grad_fn is None for t in ts):  # a leaf has no node to hook: dense gradients
            inplace_grad = False
        spec = (scale, beta, eps, items, idx[0], len(idx), inplace_grad)
        loss = CausalHeadsPenalty.apply(spec, *ts)
        if inplace_grad and loss.grad_fn is not None:  # one pre-hook per node that made inputs
            made: dict[Any, list[tuple[int, int]]] = {}
            for i, t in enumerate(ts):
                made.setdefault(t.grad_fn, []).append((i, t.output_nr))
            for fn, inputs in made.items():
                fn.register_prehook(functools.partial(_add_pending, loss.grad_fn, inputs))
        return loss
    pick = [t[:items, idx] for t in ts]
    return CausalHeadsPenalty.apply((scale, beta, eps, items, 0, len(idx), False), *pick)
