"""The seed's cofactor regulariser ``-log(|m| + eps) + beta KL(u || pi)`` and its harness entry.

:func:`cofactor_penalty` is the penalty of a batch of attention matrices (float64, exact
cofactors from one LU each, see :mod:`attention_atlas.cofactor.cofactors`);
:func:`cofactor_regularizer_from_probs` applies it to chosen layers and heads of a model's
attention probabilities; :func:`regularizer` is the training harness's ``"cofactor"`` entry
(registered in :mod:`attention_atlas.attention.registry`); :func:`cofactor_flops` estimates what
the term costs, which a FLOP counter cannot see (LAPACK's LU has no formula there).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from .cofactors import _minors_cofactors, _with_fallback, lu_cofactors

__all__ = [
    "attention_probs",
    "cofactor_flops",
    "cofactor_penalty",
    "cofactor_regularizer_from_probs",
    "regularizer",
    "select_heads",
]


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
        method: ``"lu"`` (default) or ``"minors"`` (the reference).
        reduce: ``"mean"`` over matrices (scalar), or ``"none"`` (shape ``(...)``).
    """
    if method not in ("lu", "minors"):
        raise ValueError(
            f"the penalty needs exact cofactors: method 'lu' or 'minors', got {method!r}"
        )
    A64 = A.to(torch.float64)
    n = A64.shape[-1]
    if method == "lu":
        res = lu_cofactors(A64)
        singular = res.singular
        logabs = res.logabsdet
        c = _with_fallback(A64, res.cofactors, singular)
        if bool(singular.any()):
            tiny = torch.finfo(torch.float64).tiny
            logabs = torch.where(singular, c.sum(-1).abs().clamp_min(tiny).log(), logabs)
    else:
        c = _minors_cofactors(A64)
        logabs = c.sum(-1).abs().clamp_min(torch.finfo(torch.float64).tiny).log()
    log_eps = torch.full_like(logabs, math.log(eps))
    margin_term = -torch.logaddexp(logabs, log_eps)  # -log(|m| + eps)  (seed's penalty)
    loss = margin_term
    if beta:
        pos = c.clamp_min(0.0) + eps
        log_pi = pos.log() - pos.sum(-1, keepdim=True).log()
        kl = -math.log(n) - log_pi.mean(-1)  # KL(u || pi) = sum u (log u - log pi)
        loss = loss + beta * kl
    if reduce == "mean":
        return loss.mean()
    if reduce == "none":
        return loss
    raise ValueError(f"reduce must be 'mean' or 'none', got {reduce!r}")


def select_heads(
    probs: Sequence[Tensor | None], layers: Sequence[int] | None, heads: Sequence[int] | int | None
) -> list[Tensor]:
    """Pick ``(B, h, L, L)`` slices of the chosen layers and heads from per-layer probabilities."""
    n_layers = len(probs)
    chosen = range(n_layers) if layers is None else layers
    out = []
    for li in chosen:
        if not -n_layers <= li < n_layers:
            raise ValueError(f"layer index {li} out of range for {n_layers} layers")
        p = probs[li]
        if p is None:
            raise ValueError(
                f"layer {li} returned no attention probabilities; the cofactor terms need "
                "need_weights=True and a variant that materialises its probabilities"
            )
        h = p.shape[1]
        if heads is None:
            idx = list(range(h))
        elif isinstance(heads, int):
            idx = list(range(min(heads, h)))
        else:
            idx = list(heads)
        out.append(p[:, idx])
    return out


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
    n = sel[0].shape[-1]
    # one batched call for every selected (layer, item, head): (sum B h, n, n)
    stacked = torch.cat([p.reshape(-1, n, n) for p in sel])
    return cofactor_penalty(stacked, beta=beta, eps=eps, method=method)


def attention_probs(output: Any) -> list[Tensor | None]:
    """Per-layer probabilities from a model output with ``attentions`` (list of AttentionResult)."""
    atts = getattr(output, "attentions", None)
    if atts is None:
        raise ValueError("model output has no 'attentions'; run the model with need_weights=True")
    return [getattr(a, "probs", None) for a in atts]


def cofactor_flops(n: int) -> int:
    """Estimated FLOPs of the cofactor term for one ``n x n`` matrix, forward and backward.

    One LU (``2 n^3 / 3``) and one pair of triangular solves (``2 n^2``) forward; backward taken
    as twice the forward (the usual rule), so ``2 n^3 + 6 n^2``. An estimate:
    :class:`torch.utils.flop_counter.FlopCounterMode` has no formula for LAPACK's LU.
    """
    return 2 * n**3 + 6 * n**2


def regularizer(model: Any, output: Any, batch: Any, **options: Any) -> Tensor:
    """Harness regulariser ``"cofactor"``: :func:`cofactor_regularizer_from_probs` on the
    probabilities of ``output.attentions``. Options: ``layers``, ``heads`` (default 1: the
    first head of each layer), ``beta``, ``eps``, ``method``, ``max_items``."""
    return cofactor_regularizer_from_probs(attention_probs(output), **options)
