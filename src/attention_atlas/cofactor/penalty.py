"""The seed's cofactor regulariser ``-log(|m| + eps) + beta KL(u || pi)`` and its harness entry.

:func:`cofactor_penalty` is the penalty of a batch of attention matrices (float64, exact
cofactors from one LU each, see :mod:`attention_atlas.cofactor.cofactors`);
:func:`cofactor_regularizer_from_probs` applies it to chosen layers and heads of a model's
attention probabilities; :func:`regularizer` is the training harness's ``"cofactor"`` entry
(registered in :mod:`attention_atlas.attention.registry`), which recomputes the probabilities
of the chosen heads only (:func:`~attention_atlas.cofactor.heads.head_probs`);
:func:`cofactor_flops` counts what the term costs, which a FLOP counter cannot see (LAPACK's LU
has no formula there).

**The fast path** (``method="lu"``). With ``M = L + 1 1^T / n`` (``L`` the Laplacian of ``A``),
one LU gives ``log|m| = log|det M|`` and ``x = M^{-T} w`` (``w = 1 / n``; ``c = m x``). Their
gradients are written out (:class:`FastPenalty`) instead of differentiating the factorisation:

    d log|det M| = tr(M^{-1} dM)             ->  G  = g_logm M^{-T}
    M^T x = w  =>  dx = -M^{-T} dM^T x       ->  G -= x (M^{-1} g_x)^T

so the backward is one inverse from the stored LU (``n`` right-hand sides) and a rank-one
update, and ``dM/dA`` (``M_ij = 1/n - A_ij`` off the diagonal, ``M_ii = 1/n + sum_{j != i}
A_ij``) gives ``dA_ij = G_ii - G_ij`` (``i != j``), ``dA_ii = 0``. ``method="lu-autograd"``
differentiates the same LU with torch's autograd (the previous implementation, kept as a
reference); ``"minors"`` is the ``O(n^4)`` reference.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable

from .cofactors import (
    _lu_logdet,
    _minors_cofactors,
    _shifted_laplacian,
    _with_fallback,
    lu_cofactors,
)
from .heads import attention_probs, head_probs, select_heads

__all__ = [
    "PENALTY_METHODS",
    "FastPenalty",
    "cofactor_flops",
    "cofactor_penalty",
    "cofactor_regularizer_from_probs",
    "regularizer",
]

#: methods of :func:`cofactor_penalty`
PENALTY_METHODS = ("lu", "lu-autograd", "minors")


class FastPenalty(torch.autograd.Function):
    """The per-matrix penalty ``-log(m + eps) + beta KL(u || pi)`` of ``A (..., n, n)`` and the
    ``singular`` flags, from one LU of ``M = L + 1 1^T / n`` (float64), with the backward of the
    module docstring written out: ``(loss (...), singular (...))``, the gradient in ``A``'s dtype.

    ``det M = m = sum_i c_i >= 0`` for row-stochastic ``A``: by the matrix-tree theorem each
    ``c_i`` is a sum over spanning trees of products of nonnegative weights, so ``log|det M|``
    is ``log m`` wherever ``M`` is not numerically singular. Matrices flagged ``singular`` have
    meaningless values and gradients: the caller replaces them (:func:`cofactor_penalty` does).

    With ``p_i = max(m x_i, 0) + eps``, ``S = sum_i p_i``: ``KL = log S - mean_i log p_i -
    log n``, ``dKL/dc_i = (1/S - 1/(n p_i)) [c_i > 0]``, ``c = m x``; so ``dloss/dlog m = m
    (-1/(m + eps) + beta x . dKL/dc)`` and ``dloss/dx = beta m dKL/dc``.
    """

    @staticmethod
    def forward(ctx: FunctionCtx, A: Tensor, beta: float, eps: float) -> tuple[Tensor, Tensor]:  # type: ignore[override]
        n = A.shape[-1]
        LU, piv, logm, singular = _lu_logdet(_shifted_laplacian(A, torch.float64))
        w = torch.full((*A.shape[:-1], 1), 1.0 / n, dtype=LU.dtype, device=A.device)
        x = torch.linalg.lu_solve(LU, piv, w, adjoint=True).squeeze(-1)  # M^T x = w, (..., n)
        m = logm.exp()
        loss = -torch.log(m + eps)  # the seed's -log(|m| + eps), m > 0
        dkl = None
        if beta:
            c = m.unsqueeze(-1) * x  # (..., n)
            pos = c.clamp_min(0.0) + eps
            total = pos.sum(-1, keepdim=True)
            loss = loss + beta * (total.squeeze(-1).log() - pos.log().mean(-1) - math.log(n))
            dkl = (total.reciprocal() - (n * pos).reciprocal()).masked_fill_(c <= 0, 0.0)
        ctx.save_for_backward(LU, piv, x, m, dkl)  # type: ignore[arg-type]
        ctx.consts = (beta, eps, A.dtype)  # type: ignore[attr-defined]
        ctx.mark_non_differentiable(singular)
        return loss, singular

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, g: Tensor, _: Tensor) -> tuple[Tensor, None, None]:  # type: ignore[override]
        LU, piv, x, m, dkl = ctx.saved_tensors  # type: ignore[attr-defined]
        beta, eps, dtype = ctx.consts  # type: ignore[attr-defined]
        g_logm = -g * m / (m + eps)  # (...)
        if dkl is not None:
            gm = (g * beta * m).unsqueeze(-1)
            g_logm = g_logm + gm.squeeze(-1) * (dkl * x).sum(-1)
            y = torch.linalg.lu_solve(LU, piv, (gm * dkl).unsqueeze(-1))  # M y = g_x, (..., n, 1)
        # G = g_logm M^{-T} - x y^T; dA_ij = G_ii - G_ij (i != j). X = g_logm M^{-1}, one solve
        X = torch.linalg.lu_solve(LU, piv, torch.diag_embed(g_logm.unsqueeze(-1).expand_as(x)))
        G = X.transpose(-2, -1)
        if dkl is not None:
            G = G - x.unsqueeze(-1) * y.transpose(-2, -1)  # (..., n, n)
        diag = G.diagonal(dim1=-2, dim2=-1).unsqueeze(-1)  # (..., n, 1)
        gA = diag - G  # dA_ij = G_ii - G_ij; 0 on the diagonal (A_ii is not in M)
        return gA.to(dtype), None, None


def _lu_autograd(A64: Tensor) -> tuple[Tensor, Tensor]:
    """``(log|m|, c)`` by :func:`lu_cofactors` under torch's autograd, the minors for singular
    matrices."""
    res = lu_cofactors(A64)
    c = _with_fallback(A64, res.cofactors, res.singular)
    logabs = res.logabsdet
    if bool(res.singular.any()):
        tiny = torch.finfo(torch.float64).tiny
        logabs = torch.where(res.singular, c.sum(-1).abs().clamp_min(tiny).log(), logabs)
    return logabs, c


def cofactor_penalty(
    A: Tensor,
    *,
    beta: float = 0.0,
    eps: float = 1e-8,
    method: str = "lu",
    reduce: str = "mean",
) -> Tensor:
    """The seed's regulariser ``-log(|sum c| + eps) + beta KL(u || pi)`` per matrix, in float64.

    ``pi_i = (max(c_i, 0) + eps) / sum_j (max(c_j, 0) + eps)`` and ``u_i = 1 / n``.

    The matrices are cast to float64 (differentiably). ``log(|m| + eps)`` is evaluated as
    ``logaddexp(log|m|, log eps)`` so a tiny margin does not underflow; the sign of ``m``, the
    clipping ``max(c, 0)`` and the choice of a fallback for singular matrices are decisions
    through which no gradient flows (gradients go through the determinant values only).

    Args:
        A: ``(..., n, n)`` row-stochastic (not validated: the caller produced it by a softmax).
        beta: weight of the KL term.
        eps: the seed's epsilon.
        method: ``"lu"`` (default: the fast path of the module docstring; a batch with a
            numerically singular matrix takes ``"lu-autograd"``), ``"lu-autograd"`` or
            ``"minors"`` (the reference).
        reduce: ``"mean"`` over matrices (scalar), or ``"none"`` (shape ``(...)``).
    """
    if method not in PENALTY_METHODS:
        raise ValueError(f"the penalty needs exact cofactors: method one of {PENALTY_METHODS}, "
                         f"got {method!r}")  # fmt: skip
    if reduce not in ("mean", "none"):
        raise ValueError(f"reduce must be 'mean' or 'none', got {reduce!r}")
    n = A.shape[-1]
    if method == "lu":
        loss, singular = FastPenalty.apply(A, float(beta), float(eps))
        if not bool(singular.any()):
            return loss.mean() if reduce == "mean" else loss
        method = "lu-autograd"  # rare: rank L < n - 1 to working precision
    if method == "lu-autograd":
        logabs, c = _lu_autograd(A.to(torch.float64))
    else:
        c = _minors_cofactors(A.to(torch.float64))
        logabs = c.sum(-1).abs().clamp_min(torch.finfo(torch.float64).tiny).log()
    log_eps = torch.full_like(logabs, math.log(eps))
    loss = -torch.logaddexp(logabs, log_eps)  # -log(|m| + eps)  (seed's penalty)
    if beta:
        pos = c.clamp_min(0.0) + eps
        log_pi = pos.log() - pos.sum(-1, keepdim=True).log()
        kl = -math.log(n) - log_pi.mean(-1)  # KL(u || pi) = sum u (log u - log pi)
        loss = loss + beta * kl
    return loss.mean() if reduce == "mean" else loss


def _penalty_of_heads(sel: Sequence[Tensor], **options: Any) -> Tensor:
    """The mean penalty over every matrix of ``sel`` (a list of ``(B, h, n, n)``), in one call."""
    n = sel[0].shape[-1]
    stacked = torch.cat([p.reshape(-1, n, n) for p in sel])  # (sum B h, n, n)
    return cofactor_penalty(stacked, **options)


def cofactor_regularizer_from_probs(
    probs: Sequence[Tensor | None],
    *,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | int | None = 1,
    beta: float = 0.0,
    eps: float = 1e-8,
    method: str = "lu",
    max_items: int | None = None,
) -> Tensor:
    """Mean cofactor penalty over the selected layers, heads and batch items (a scalar, float64).

    Args:
        probs: per-layer attention probabilities ``(B, H, L, L)`` (e.g. ``[r.probs for r in
            output.attentions]``).
        layers: layer indices (default all).
        heads: head indices, or an int ``k`` for the first ``k`` heads of each layer (default 1),
            or None for all.
        beta, eps, method: see :func:`cofactor_penalty`.
        max_items: use only the first ``max_items`` batch items (cost control).
    """
    sel = select_heads(probs, layers, heads)
    if max_items is not None:
        sel = [p[:max_items] for p in sel]
    return _penalty_of_heads(sel, beta=beta, eps=eps, method=method)


def regularizer(
    model: Any,
    output: Any,
    batch: Any,
    *,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | int | None = 1,
    beta: float = 0.0,
    eps: float = 1e-8,
    method: str = "lu",
    max_items: int | None = None,
) -> Tensor:
    """Harness regulariser ``"cofactor"``: the mean penalty over the chosen layers and heads
    (default: the first head of each layer). The probabilities are the output's when the
    forward returned them (``need_weights=True``), else those of the chosen heads recomputed
    from the layers' inputs (:func:`~attention_atlas.cofactor.heads.head_probs`), so the
    training forward stays on the fused kernel. Options as
    :func:`cofactor_regularizer_from_probs`."""
    opts: dict[str, Any] = {"beta": beta, "eps": eps, "method": method}
    probs = attention_probs(output)
    if all(p is not None for p in probs):
        return cofactor_regularizer_from_probs(
            probs, layers=layers, heads=heads, max_items=max_items, **opts
        )
    probs_sel = head_probs(model, output, layers=layers, heads=heads, max_items=max_items)
    n = probs_sel.shape[-1]
    return cofactor_penalty(probs_sel.reshape(-1, n, n), **opts)


def cofactor_flops(n: int) -> int:
    """FLOPs of the cofactor term for one ``n x n`` matrix, forward and backward, as
    :class:`FastPenalty` computes it.

    Forward: one LU (``2 n^3 / 3``) and one pair of triangular solves (``2 n^2``). Backward:
    ``M^{-T}`` from the stored LU (``n`` right-hand sides, ``2 n^2`` each: ``2 n^3``), then
    ``M^{-1} g_x`` (``2 n^2``) and the rank-one update and ``dA`` (``5 n^2``). In all
    ``8 n^3 / 3 + 9 n^2`` (rounded down). Counted by hand:
    :class:`torch.utils.flop_counter.FlopCounterMode` has no formula for LAPACK's LU.
    """
    return (8 * n**3) // 3 + 9 * n**2
