"""SSD, the state-space dual of Mamba-2 (Dao & Gu, 2024), three ways.

    y_t = sum_{s<=t} (C_t . B_s) exp(log_a_{s+1} + ... + log_a_t) x_s

by the recurrence (a scan over time steps), by the materialised structured masked attention
``((C B^T) o exp(segsum(log_a))) x`` (quadratic) and by the linear-time chunked algorithm
(after Mamba-2's ``ssd_minimal.py``). :func:`ssd` is the stable entry point.
"""

from __future__ import annotations

import math
from typing import Any, Literal, overload

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from attention_atlas import native

from ._checks import check_arg, check_same, shape_of

__all__ = ["SSD_METHODS", "segsum", "ssd", "ssd_matrix", "ssd_step"]

SSD_METHODS = ("chunked", "quadratic", "recurrent")


def segsum(log_a: Tensor) -> Tensor:
    """Segment sums ``S_ts = log_a_{s+1} + ... + log_a_t`` (``t >= s``), ``-inf`` above.

    Each entry is summed directly (a masked cumulative sum down each column), never as the
    difference of two long prefix sums, so no catastrophic cancellation in float32.

    Args:
        log_a: ``(..., T)``.

    Returns:
        ``(..., T, T)``; ``exp`` of it is the 1-semiseparable decay mask.
    """
    check_arg("segsum", "log_a", log_a, "(..., T) with T >= 1", nonempty=(-1,))
    T = log_a.shape[-1]
    grid = log_a[..., :, None].expand(*log_a.shape, T)  # grid[t, s] = log_a_t
    strict = torch.ones(T, T, dtype=torch.bool, device=log_a.device).tril(-1)
    grid = grid.masked_fill(~strict, 0.0)
    out = torch.cumsum(grid, dim=-2)  # out[t, s] = sum_{s < k <= t} log_a_k
    causal = torch.ones(T, T, dtype=torch.bool, device=log_a.device).tril()
    return out.masked_fill_(~causal, -math.inf)


_X = "(batch, length, heads, head_dim)"
_LOG_A = "(batch, length, heads)"
_BC = "(batch, length, heads, state)"


def _check_ssd_inputs(
    fn: str, log_a: Tensor, B: Tensor, C: Tensor, x: Tensor | None = None
) -> None:
    """``x (b, L, h, p)`` (when given), ``log_a (b, L, h)``, ``B, C (b, L, h, n)``: floating,
    one dtype and device, no empty length, heads or dimension."""
    if x is not None:
        check_arg(fn, "x", x, _X, ndim=4, nonempty=(1, 2, 3))
    check_arg(fn, "log_a", log_a, _LOG_A, ndim=3, nonempty=(1, 2))
    check_arg(fn, "B", B, _BC, ndim=4, nonempty=(1, 2, 3))
    check_arg(fn, "C", C, _BC, ndim=4, nonempty=(1, 2, 3))
    bLh = shape_of(x)[:3] if x is not None else shape_of(log_a)
    if x is not None and shape_of(log_a) != bLh:
        raise ValueError(
            f"{fn}: log_a must have shape (batch, length, heads) = {bLh} to match x "
            f"{shape_of(x)}, got {shape_of(log_a)}"
        )
    for name, t in (("B", B), ("C", C)):
        if shape_of(t)[:3] != bLh:
            what = f"x {shape_of(x)}" if x is not None else f"log_a {shape_of(log_a)}"
            raise ValueError(
                f"{fn}: {name} must have shape (batch, length, heads, state) with (batch, "
                f"length, heads) = {bLh} to match {what}, got {shape_of(t)}"
            )
    if B.shape[-1] != C.shape[-1]:
        raise ValueError(
            f"{fn}: B and C must have the same state size (last dim), got B {shape_of(B)}, "
            f"C {shape_of(C)}"
        )
    check_same(fn, x=x, log_a=log_a, B=B, C=C)


def _check_ssd(x: Tensor, log_a: Tensor, B: Tensor, C: Tensor, h0: Tensor | None) -> None:
    _check_ssd_inputs("ssd", log_a, B, C, x)
    if h0 is not None:
        b, _, h, p = x.shape
        want = (b, h, p, B.shape[-1])
        check_arg("ssd", "initial_state", h0, f"(batch, heads, head_dim, state) = {want}")
        if shape_of(h0) != want:
            raise ValueError(
                f"ssd: initial_state must have shape (batch, heads, head_dim, state) = {want}, "
                f"got {shape_of(h0)}"
            )
        check_same("ssd", x=x, initial_state=h0)


def ssd_matrix(log_a: Tensor, B: Tensor, C: Tensor) -> Tensor:
    """The materialised SMA matrix ``M = (C B^T) o exp(segsum(log_a))``, ``(batch, heads, L, L)``.

    ``M_ts = (C_t . B_s) exp(log_a_{s+1} + ... + log_a_t)`` for ``t >= s``, 0 above.
    ``log_a (batch, L, heads)``, ``B, C (batch, L, heads, state)``.
    """
    _check_ssd_inputs("ssd_matrix", log_a, B, C)
    mask = segsum(log_a.transpose(1, 2)).exp_()  # (b, h, L, L)
    return torch.einsum("blhn,bshn->bhls", C, B) * mask


def _check_ssd_step(x: Tensor, log_a: Tensor, B: Tensor, C: Tensor, state: Tensor) -> None:
    fn = "ssd_step"
    check_arg(fn, "x", x, "(batch, heads, head_dim)", ndim=3, nonempty=(1, 2))
    b, h, p = x.shape
    check_arg(fn, "log_a", log_a, f"(batch, heads) = {(b, h)}", ndim=2)
    check_arg(fn, "B", B, f"(batch, heads, state) = ({b}, {h}, state)", ndim=3, nonempty=(2,))
    n = B.shape[-1]
    check_arg(fn, "C", C, f"(batch, heads, state) = {(b, h, n)}", ndim=3)
    check_arg(fn, "state", state, f"(batch, heads, head_dim, state) = {(b, h, p, n)}", ndim=4)
    for name, t, want in (("log_a", log_a, (b, h)), ("B", B, (b, h, n)), ("C", C, (b, h, n)),
                          ("state", state, (b, h, p, n))):  # fmt: skip
        if shape_of(t) != want:
            raise ValueError(f"{fn}: {name} must have shape {want} to match x {shape_of(x)} "
                             f"and B {shape_of(B)}, got {shape_of(t)}")  # fmt: skip
    check_same(fn, x=x, log_a=log_a, B=B, C=C, state=state)


def ssd_step(
    x: Tensor, log_a: Tensor, B: Tensor, C: Tensor, state: Tensor
) -> tuple[Tensor, Tensor]:
    """One step of the recurrence: ``h <- exp(log_a) h + x B^T``, ``y = h C``.

    Args:
        x: ``(batch, heads, head_dim)``; log_a: ``(batch, heads)``;
        B, C: ``(batch, heads, state)``; state: ``(batch, heads, head_dim, state)``.

    Returns:
        ``(y (batch, heads, head_dim), new state)``.
    """
    _check_ssd_step(x, log_a, B, C, state)
    state = torch.exp(log_a)[..., None, None] * state + torch.einsum("bhp,bhn->bhpn", x, B)
    return torch.einsum("bhpn,bhn->bhp", state, C), state


def _ssd_recurrent(
    x: Tensor, log_a: Tensor, B: Tensor, C: Tensor, h0: Tensor
) -> tuple[Tensor, Tensor]:
    state, ys = h0, []
    for t in range(x.shape[1]):
        y, state = ssd_step(x[:, t], log_a[:, t], B[:, t], C[:, t], state)
        ys.append(y)
    return torch.stack(ys, dim=1), state


def _ssd_quadratic(
    x: Tensor, log_a: Tensor, B: Tensor, C: Tensor, h0: Tensor | None
) -> tuple[Tensor, Tensor | None]:
    # 1. the structured masked attention: y = ((C B^T) o L) x
    M = ssd_matrix(log_a, B, C)  # (b, h, L, L)
    y = torch.einsum("bhls,bshp->blhp", M, x)
    if h0 is None:
        return y, None
    # 2. initial state: y_t += exp(log_a_0 + ... + log_a_t) C_t . h0 ; final state from the last row
    cum = torch.cumsum(log_a, dim=1)  # (b, L, h)
    y = y + torch.einsum("blhn,bhpn,blh->blhp", C, h0, torch.exp(cum))
    last = torch.exp(segsum(log_a.transpose(1, 2))[..., -1, :])  # (b, h, L): decay s -> L-1
    final = (
        torch.einsum("bhs,bshp,bshn->bhpn", last, x, B)
        + torch.exp(cum[:, -1])[..., None, None] * h0
    )
    return y, final


def _decay_mask_t(A: Tensor) -> Tensor:
    """The decay mask of :class:`_MaskedScoresT` in its layout: ``A (..., l)`` -> ``(..., l, l)``,
    ``L^T_st = a_{s+1} ... a_t`` (``a = exp(A)``, a cumulative product along the row) for
    ``t >= s``, 0 below."""
    length = A.shape[-1]
    upper = torch.ones(length, length, dtype=torch.bool, device=A.device)
    grid = torch.where(upper.triu(1), torch.exp(A)[..., None, :], 1.0)  # a_t for t > s
    return grid.cumprod_(-1).mul_(upper.triu().to(A.dtype))


class _MaskedScoresT(torch.autograd.Function):
    """``scores_t o L^T`` with the decay mask ``L = exp(segsum(A))`` of each chunk, in the
    transposed layout ``(..., s, t)``: ``scores_t (..., l, l)``, ``A (..., l)``.

    Forward: ``L^T_st = a_{s+1} ... a_t`` (``a = exp(A)``) by a cumulative product along the
    contiguous last dimension, each entry a product along its own segment (as in
    :func:`~.ssm.decay_mask`: no division, no difference of prefix sums), then zero for
    ``t < s``.

    Backward, from ``L_st = exp(cs_t - cs_s)`` with ``cs`` the prefix sums of ``A`` (exact in
    exact arithmetic; a gradient has no cancellation to fear): ``d scores = grad o L``,
    ``G = d scores o scores``, ``d cs_j = sum_s G_sj - sum_t G_jt``, ``dA_k = sum_{j >= k}
    d cs_j``: two reductions of one tensor instead of autograd's chain of masks, flips and
    cumulative sums. The intra-chunk blocks of the chunked method, and so a training step of
    the ``"ssm"`` attention, spend most of their elementwise time here.

    With the native kernels on (:func:`attention_atlas.native.enabled`, any level) and CPU
    tensors, each pass is one kernel that forms each chunk's ``L`` in a cache-resident buffer
    and never writes it out (``ssm_mask_forward``: the product; ``ssm_mask_backward``: ``L``
    again, ``d scores`` and ``G``, laid out as the incoming gradient, as the products below
    would be, so that their sums run in the same order). Each entry is the same float
    operations in the same order as here (the row products accumulated in double, as
    ``cumprod`` on a CPU does): the same bits, so no new native level.
    """

    @staticmethod
    def forward(ctx: Any, scores_t: Tensor, A: Tensor) -> Tensor:
        length = A.shape[-1]
        ctx.native = native.active(scores_t, A) and scores_t.shape[-2:] == (length, length)
        if ctx.native:
            scores_t, A = scores_t.contiguous(), A.contiguous()
            out = torch.empty_like(scores_t)
            native.call("ssm_mask_forward", scores_t, torch.exp(A), out, A.numel() // length,
                        length)  # fmt: skip
            ctx.save_for_backward(scores_t, A)  # L is formed again, not kept
            return out
        L = _decay_mask_t(A)
        ctx.save_for_backward(scores_t, L)
        return scores_t * L

    @staticmethod
    @once_differentiable  # a second derivative through it raises instead of being wrong
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor]:
        scores_t, saved = ctx.saved_tensors
        transposed = grad.transpose(-1, -2).is_contiguous()
        same = grad.dtype == scores_t.dtype and grad.shape == scores_t.shape
        if ctx.native and same and native.active(grad) and (transposed or grad.is_contiguous()):
            # d scores and G laid out as grad (as the products below would be): the same sums
            d_scores, G, a = torch.empty_like(grad), torch.empty_like(grad), torch.exp(saved)
            length = saved.shape[-1]
            native.kernel("ssm_mask_backward", grad.dtype)(
                grad.data_ptr(), a.data_ptr(), scores_t.data_ptr(), d_scores.data_ptr(),
                G.data_ptr(), saved.numel() // length, length, int(transposed))  # fmt: skip
        else:
            L = _decay_mask_t(saved) if ctx.native else saved
            d_scores = grad * L
            G = d_scores * scores_t
        d_cs = G.sum(-2) - G.sum(-1)  # (..., l)
        return d_scores, d_cs.flip(-1).cumsum(-1).flip(-1)  # dA_k = sum_{j >= k} d cs_j


def _ssd_chunked(
    x: Tensor, log_a: Tensor, B: Tensor, C: Tensor, h0: Tensor | None, chunk_size: int,
    need_final: bool,
) -> tuple[Tensor, Tensor | None]:  # fmt: skip
    b, length, h, p = x.shape
    n = B.shape[-1]
    # 0. pad to a multiple of the chunk size (zero inputs and zero log-decay after the end
    #    change neither the outputs before it nor the final state) and split into chunks
    pad = (-length) % chunk_size
    if pad:
        x, B, C = (F.pad(t, (0, 0, 0, 0, 0, pad)) for t in (x, B, C))
        log_a = F.pad(log_a, (0, 0, 0, pad))
    c = x.shape[1] // chunk_size
    # one copy each into a head-major layout, so every product below is a plain batched matmul
    X = x.transpose(1, 2).contiguous().view(b, h, c, chunk_size, p)  # (b, h, c, l, p)
    Bc = B.transpose(1, 2).contiguous().view(b, h, c, chunk_size, n)  # (b, h, c, l, n)
    Cc = C.transpose(1, 2).contiguous().view(b, h, c, chunk_size, n)  # (b, h, c, l, n)
    A = log_a.transpose(1, 2).contiguous().view(b, h, c, chunk_size)  # (b, h, c, l)

    # 1. intra-chunk outputs (diagonal blocks): Y_diag = ((C B^T) o L) X, chunk by chunk,
    #    with the scores and the mask held transposed, (s, t)
    scores_t = _MaskedScoresT.apply(torch.einsum("bhcsn,bhcln->bhcsl", Bc, Cc), A)
    Y = torch.einsum("bhcsl,bhcsp->bhclp", scores_t, X)
    if c == 1 and h0 is None and not need_final:
        # one chunk from a zero state: the diagonal block is the whole matrix (steps 2-4 add 0)
        return Y.permute(0, 2, 3, 1, 4).reshape(b, chunk_size, h, p)[:, :length], None

    # 2. chunk states (right factor of the off-diagonal blocks; B terms):
    #    the state each chunk would leave behind if it started from zero
    A_cumsum = torch.cumsum(A, dim=-1)  # within each chunk only: short sums
    decay_states = torch.exp(A_cumsum[..., -1:] - A_cumsum)  # (b, h, c, l) decay l -> chunk end
    states = torch.einsum("bhcln,bhclp->bhcpn", Bc * decay_states[..., None], X)

    # 3. inter-chunk recurrence (middle factor; A terms): a scan over chunks, linear in L
    decay_chunk = torch.exp(A_cumsum[..., -1])  # (b, h, c) decay across a whole chunk
    state = h0 if h0 is not None else x.new_zeros(b, h, p, n)
    entering = []
    for k in range(c):
        entering.append(state)
        state = decay_chunk[:, :, k, None, None] * state + states[:, :, k]
    prev = torch.stack(entering, dim=2)  # (b, h, c, p, n): the state entering each chunk

    # 4. state -> output per chunk (left factor; C terms)
    Y = Y + torch.einsum("bhcln,bhcpn->bhclp", Cc * torch.exp(A_cumsum)[..., None], prev)

    y = Y.permute(0, 2, 3, 1, 4).reshape(b, c * chunk_size, h, p)
    return y[:, :length], state


def _ssd_chunked_blocks(
    x: Tensor, log_a: Tensor, B: Tensor, C: Tensor, h0: Tensor | None, chunk_size: int,
    block_len: int, need_final: bool,
) -> tuple[Tensor, Tensor | None]:  # fmt: skip
    # 5. a long sequence goes through steps 0-4 in blocks of whole chunks, the state carried
    #    from one block to the next: the same arithmetic, but the working set stays bounded
    #    (it fits in cache), so the time per token does not grow with L
    block = max(1, block_len // chunk_size) * chunk_size
    ys, state, length = [], h0, x.shape[1]
    for s in range(0, length, block):
        sl = slice(s, s + block)
        last = s + block >= length
        y, state = _ssd_chunked(x[:, sl], log_a[:, sl], B[:, sl], C[:, sl], state, chunk_size,
                                need_final or not last)  # fmt: skip
        ys.append(y)
    if len(ys) == 1 and ys[0].is_contiguous():  # one block: what cat would copy, as it is
        return ys[0], state
    return torch.cat(ys, dim=1), state


@overload
def ssd(
    x: Tensor,
    log_a: Tensor,
    B: Tensor,
    C: Tensor,
    method: str = ...,
    chunk_size: int = ...,
    *,
    initial_state: Tensor | None = ...,
    return_final_state: Literal[False] = ...,
    block_len: int = ...,
) -> Tensor: ...


@overload
def ssd(
    x: Tensor,
    log_a: Tensor,
    B: Tensor,
    C: Tensor,
    method: str = ...,
    chunk_size: int = ...,
    *,
    initial_state: Tensor | None = ...,
    return_final_state: Literal[True],
    block_len: int = ...,
) -> tuple[Tensor, Tensor]: ...


def ssd(
    x: Tensor,
    log_a: Tensor,
    B: Tensor,
    C: Tensor,
    method: str = "chunked",
    chunk_size: int = 64,
    *,
    initial_state: Tensor | None = None,
    return_final_state: bool = False,
    block_len: int = 2048,
) -> Tensor | tuple[Tensor, Tensor]:
    """State-space dual (Mamba-2 SSD) of Dao & Gu (2024):

        y_t = sum_{s<=t} (C_t . B_s) exp(log_a_{s+1} + ... + log_a_t) x_s

    Equivalently the recurrence ``h_t = exp(log_a_t) h_{t-1} + x_t B_t^T``, ``y_t = h_t C_t``
    (``h_{-1}`` is ``initial_state``, zero by default), or the structured masked attention
    ``y = ((C B^T) o exp(segsum(log_a))) x`` per head.

    Args:
        x: ``(batch, length, heads, head_dim)``.
        log_a: ``(batch, length, heads)``, the log of the per-step decay (<= 0 for a decay;
            any real is accepted).
        B, C: ``(batch, length, heads, state_dim)``.
        method: ``"chunked"`` (linear time: intra-chunk blocks, chunk states, a scan over
            chunks, state to output), ``"quadratic"`` (the materialised ``(L, L)`` masked
            attention per head) or ``"recurrent"`` (a scan over time steps).
        chunk_size: chunk length for ``"chunked"``; any sequence length works.
        initial_state: ``(batch, heads, head_dim, state_dim)``, the state before ``t = 0``.
        return_final_state: also return the state after the last step.
        block_len: ``"chunked"`` runs at most this many tokens (rounded down to whole chunks,
            at least one) at a time, carrying the state between blocks; the result is the
            same, the memory is bounded and the time stays linear in L beyond the cache size.

    Returns:
        ``y`` shaped like ``x``, or ``(y, final_state)``.

    Raises:
        TypeError: an argument is not a tensor. ValueError (one line naming the argument, what
        came and what was expected): a wrong rank, a length, head count or state size that does
        not match ``x``, an empty sequence (``length == 0``), heads or dimension, an integer
        dtype, dtypes or devices that differ, an unknown ``method``, a ``chunk_size`` or
        ``block_len`` that is not a positive int.
    """
    _check_ssd(x, log_a, B, C, initial_state)
    if method not in SSD_METHODS:
        raise ValueError(f"ssd: method must be one of {SSD_METHODS}, got {method!r}")
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"ssd: chunk_size must be a positive int, got {chunk_size!r}")
    if isinstance(block_len, bool) or not isinstance(block_len, int) or block_len < 1:
        raise ValueError(f"ssd: block_len must be a positive int, got {block_len!r}")
    b, _, h, p = x.shape
    h0 = initial_state
    if h0 is None and (method == "recurrent" or (method == "quadratic" and return_final_state)):
        h0 = x.new_zeros(b, h, p, B.shape[-1])
    final: Tensor | None
    if method == "recurrent":
        assert h0 is not None
        y, final = _ssd_recurrent(x, log_a, B, C, h0)
    elif method == "quadratic":
        y, final = _ssd_quadratic(x, log_a, B, C, h0)
    else:
        y, final = _ssd_chunked_blocks(
            x, log_a, B, C, h0, chunk_size, block_len, return_final_state
        )
    if return_final_state:
        assert final is not None
        return y, final
    return y
