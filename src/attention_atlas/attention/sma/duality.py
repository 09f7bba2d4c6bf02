"""SSD, the state-space dual of Mamba-2 (Dao & Gu, 2024), three ways.

    y_t = sum_{s<=t} (C_t . B_s) exp(log_a_{s+1} + ... + log_a_t) x_s

by the recurrence (a scan over time steps), by the materialised structured masked attention
``((C B^T) o exp(segsum(log_a))) x`` (quadratic) and by the linear-time chunked algorithm
(after Mamba-2's ``ssd_minimal.py``). :func:`ssd` is the stable entry point.
"""

from __future__ import annotations

import math
from typing import Literal, overload

import torch
import torch.nn.functional as F
from torch import Tensor

from .masked import _shape

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
    T = log_a.shape[-1]
    grid = log_a[..., :, None].expand(*log_a.shape, T)  # grid[t, s] = log_a_t
    strict = torch.ones(T, T, dtype=torch.bool, device=log_a.device).tril(-1)
    grid = grid.masked_fill(~strict, 0.0)
    out = torch.cumsum(grid, dim=-2)  # out[t, s] = sum_{s < k <= t} log_a_k
    causal = torch.ones(T, T, dtype=torch.bool, device=log_a.device).tril()
    return out.masked_fill_(~causal, -math.inf)


def _check_ssd(x: Tensor, log_a: Tensor, B: Tensor, C: Tensor) -> None:
    for name, t, nd in (("x", x, 4), ("log_a", log_a, 3), ("B", B, 4), ("C", C, 4)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != nd:
            want = "(batch, length, heads)" if nd == 3 else "(batch, length, heads, dim)"
            raise ValueError(f"ssd: {name} must be {nd}-D {want}, got shape {_shape(t)}")
        if not t.is_floating_point():
            raise ValueError(f"ssd: {name} must be floating point, got dtype {t.dtype}")
    if log_a.shape != x.shape[:3]:
        raise ValueError(
            f"ssd: log_a must be (batch, length, heads) = {_shape(x)[:3]} to match "
            f"x {_shape(x)}, got {_shape(log_a)}"
        )
    if B.shape[:3] != x.shape[:3] or B.shape != C.shape:
        raise ValueError(
            f"ssd: B and C must both be (batch, length, heads, state) with (batch, length, heads) "
            f"= {_shape(x)[:3]}, got B {_shape(B)}, C {_shape(C)}"
        )
    if not (x.dtype == log_a.dtype == B.dtype == C.dtype):
        raise ValueError(
            f"ssd: x, log_a, B, C must share a dtype, got {x.dtype}, {log_a.dtype}, "
            f"{B.dtype}, {C.dtype}"
        )


def ssd_matrix(log_a: Tensor, B: Tensor, C: Tensor) -> Tensor:
    """The materialised SMA matrix ``M = (C B^T) o exp(segsum(log_a))``, ``(batch, heads, L, L)``.

    ``M_ts = (C_t . B_s) exp(log_a_{s+1} + ... + log_a_t)`` for ``t >= s``, 0 above.
    ``log_a (batch, L, heads)``, ``B, C (batch, L, heads, state)``.
    """
    mask = segsum(log_a.transpose(1, 2)).exp_()  # (b, h, L, L)
    return torch.einsum("blhn,bshn->bhls", C, B) * mask


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


def _ssd_chunked(
    x: Tensor, log_a: Tensor, B: Tensor, C: Tensor, h0: Tensor, chunk_size: int
) -> tuple[Tensor, Tensor]:
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
    A_cumsum = torch.cumsum(A, dim=-1)  # within each chunk only: short sums

    # 1. intra-chunk outputs (diagonal blocks): Y_diag = ((C B^T) o L) X, chunk by chunk
    L = torch.exp(segsum(A))  # (b, h, c, l, s)
    scores = torch.einsum("bhcln,bhcsn->bhcls", Cc, Bc) * L
    Y_diag = torch.einsum("bhcls,bhcsp->bhclp", scores, X)

    # 2. chunk states (right factor of the off-diagonal blocks; B terms):
    #    the state each chunk would leave behind if it started from zero
    decay_states = torch.exp(A_cumsum[..., -1:] - A_cumsum)  # (b, h, c, l) decay l -> chunk end
    states = torch.einsum("bhcln,bhclp->bhcpn", Bc * decay_states[..., None], X)

    # 3. inter-chunk recurrence (middle factor; A terms): a scan over chunks, linear in L
    decay_chunk = torch.exp(A_cumsum[..., -1])  # (b, h, c) decay across a whole chunk
    state, entering = h0, []
    for k in range(c):
        entering.append(state)
        state = decay_chunk[:, :, k, None, None] * state + states[:, :, k]
    prev = torch.stack(entering, dim=2)  # (b, h, c, p, n): the state entering each chunk

    # 4. state -> output per chunk (left factor; C terms)
    Y_off = torch.einsum("bhcln,bhcpn->bhclp", Cc * torch.exp(A_cumsum)[..., None], prev)

    y = (Y_diag + Y_off).permute(0, 2, 3, 1, 4).reshape(b, c * chunk_size, h, p)
    return y[:, :length], state


def _ssd_chunked_blocks(
    x: Tensor, log_a: Tensor, B: Tensor, C: Tensor, h0: Tensor, chunk_size: int, block_len: int
) -> tuple[Tensor, Tensor]:
    # 5. a long sequence goes through steps 0-4 in blocks of whole chunks, the state carried
    #    from one block to the next: the same arithmetic, but the working set stays bounded
    #    (it fits in cache), so the time per token does not grow with L
    block = max(1, block_len // chunk_size) * chunk_size
    ys, state = [], h0
    for s in range(0, x.shape[1], block):
        sl = slice(s, s + block)
        y, state = _ssd_chunked(x[:, sl], log_a[:, sl], B[:, sl], C[:, sl], state, chunk_size)
        ys.append(y)
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
    """
    _check_ssd(x, log_a, B, C)
    if method not in SSD_METHODS:
        raise ValueError(f"ssd: method must be one of {SSD_METHODS}, got {method!r}")
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"ssd: chunk_size must be a positive int, got {chunk_size!r}")
    if not isinstance(block_len, int) or block_len < 1:
        raise ValueError(f"ssd: block_len must be a positive int, got {block_len!r}")
    b, _, h, p = x.shape
    n = B.shape[-1]
    if initial_state is not None and _shape(initial_state) != (b, h, p, n):
        raise ValueError(
            f"ssd: initial_state must be (batch, heads, head_dim, state) = {(b, h, p, n)}, "
            f"got {_shape(initial_state)}"
        )
    h0 = initial_state
    if h0 is None and (method != "quadratic" or return_final_state):
        h0 = x.new_zeros(b, h, p, n)
    final: Tensor | None
    if x.shape[1] == 0:  # an empty sequence: no output, the state passes through unchanged
        y, final = x.clone(), h0
    elif method == "recurrent":
        assert h0 is not None
        y, final = _ssd_recurrent(x, log_a, B, C, h0)
    elif method == "quadratic":
        y, final = _ssd_quadratic(x, log_a, B, C, h0)
    else:
        assert h0 is not None
        y, final = _ssd_chunked_blocks(x, log_a, B, C, h0, chunk_size, block_len)
    if return_final_state:
        assert final is not None
        return y, final
    return y
