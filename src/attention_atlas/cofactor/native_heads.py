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

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable

from .. import native

__all__ = ["CausalHeadsPenalty", "HeadMatrices", "heads_penalty", "sparse_grads"]

_state = threading.local()


@contextlib.contextmanager
def sparse_grads(on: bool = True) -> Iterator[None]:
    """Within: the harness's cofactor regulariser gives the chosen heads' queries and keys sparse
    gradients (:func:`heads_penalty` with ``sparse_grad``), added in place into the dense ones
    their attention gives them: nothing zero-filled or added where the regulariser's gradient is
    zero. The training step switches it on around its regularisers when its forward ran eagerly:
    it differentiates their sum with the task loss, and every head's queries and keys take a
    gradient from the logits. A compiled forward's queries and keys are outputs of its graph,
    whose backward takes dense gradients only, and a loss of the regulariser alone gives the
    views no dense one: both leave it off, its default."""
    before = getattr(_state, "on", False)
    _state.on = bool(on)
    try:
        yield
    finally:
        _state.on = before


def sparse_grads_on() -> bool:
    """Whether :func:`sparse_grads` is on in this thread."""
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
    read in place (native kernels only): ``spec = (scale, beta, eps, items, h0, nh, sparse)``
    and each layer's queries then keys, ``(B, H, n, d)`` each, with ``d`` contiguous and any
    other strides (views of the forward's projection: :func:`heads_penalty` passes them); the
    matrices of items ``t < items`` and heads ``h0 <= h < h0 + nh``, located by address (no
    slice or copy); a float64 scalar. Under autograd the forward kernel also forms the gradient
    of the mean, matrix by matrix while its softmax rows are in cache (the loss is linear in its
    upstream gradient ``g``, so the backward only scales it by ``g``, into a zero gradient of
    each input's shape where the matrices are not all of it): one kernel call, and nothing
    stacked, sliced or written out in between. With ``sparse`` the gradient of each input is a
    sparse tensor holding the chosen matrices only (sparse dimensions item and head, dense
    ``(n, d)``: nothing zero-filled), for views that also take a dense gradient from elsewhere
    in the backward pass, such as the attention that consumed them: autograd adds it into that
    one in place (:func:`sparse_grads`)."""

    @staticmethod
    def forward(ctx: FunctionCtx, spec: tuple[float, ...], *qks: Tensor) -> Tensor:  # type: ignore[override]
        scale, beta, eps, items, h0, nh, sparse = spec
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
        ctx.sparse = sparse  # type: ignore[attr-defined]
        return loss[count]

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, g: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        units = ctx.units  # type: ignore[attr-defined]
        batch, heads, items, h0 = ctx.place  # type: ignore[attr-defined]
        two_nl, _, nh, n, d = units.shape
        if items == batch and nh == heads:
            grads = units * g
        elif ctx.sparse:  # type: ignore[attr-defined]  # the chosen matrices only
            index = _sparse_index(items, h0, nh)
            vals = (units * g).reshape(two_nl, items * nh, n, d).unbind(0)
            grads = [torch.sparse_coo_tensor(index, v, (batch, heads, n, d), is_coalesced=True,
                                             check_invariants=False) for v in vals]  # fmt: skip
        else:  # the chosen matrices' gradients in place, zeros around them
            grads = units.new_zeros((two_nl, batch, heads, n, d))
            torch.mul(units, g, out=grads[:, :items, h0 : h0 + nh])
        needs = ctx.needs_input_grad[1:]  # type: ignore[attr-defined]
        grads = grads.unbind(0) if isinstance(grads, Tensor) else grads
        return (None, *(gr if need else None for gr, need in zip(grads, needs)))


@functools.lru_cache(maxsize=16)
def _sparse_index(items: int, h0: int, nh: int) -> Tensor:
    """The ``(2, items nh)`` (item, head) indices of the chosen matrices, items first (sorted
    and distinct: a coalesced sparse tensor's). Cached: read, never written."""
    b, h = torch.meshgrid(torch.arange(items), torch.arange(h0, h0 + nh), indexing="ij")
    return torch.stack([b.reshape(-1), h.reshape(-1)])


def heads_penalty(
    qs: Sequence[Tensor], ks: Sequence[Tensor], idx: Sequence[int], items: int,
    scale: float, beta: float, eps: float, *, sparse_grad: bool = False,
) -> Tensor:  # fmt: skip
    """:class:`CausalHeadsPenalty` of heads ``idx`` of the first ``items`` items of each layer's
    queries and keys ``qs``, ``ks`` (``(B, H, n, d)`` each, ``d`` contiguous: a forward's views
    of its projection). A run of consecutive heads is read in place (no view or copy: the
    kernel takes the first head's address); other choices are gathered. ``sparse_grad``: the
    run's gradients as sparse tensors (:class:`CausalHeadsPenalty`), for views (not leaves) that
    take a dense gradient from elsewhere in the same backward pass: with none, a view's own
    backward step refuses the sparse one. :func:`sparse_grads` switches it on for the harness's
    regulariser."""
    idx, ts = list(idx), [*qs, *ks]
    if idx == list(range(idx[0], idx[0] + len(idx))):  # in place
        if any(t.grad_fn is None for t in ts):  # a leaf's gradient stays dense
            sparse_grad = False
        spec = (scale, beta, eps, items, idx[0], len(idx), sparse_grad)
        return CausalHeadsPenalty.apply(spec, *ts)
    pick = [t[:items, idx] for t in ts]
    return CausalHeadsPenalty.apply((scale, beta, eps, items, 0, len(idx), False), *pick)
