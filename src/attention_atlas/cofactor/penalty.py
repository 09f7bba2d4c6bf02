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

so with ``M^{-1}`` (one solve of the stored LU against ``I``, taken in the forward when a
gradient is wanted, which then also gives ``x`` as the column means of ``M^{-1}``) the backward
is products and a rank-one update, no further factorisation or solve; ``dM/dA`` (``M_ij = 1/n -
A_ij`` off the diagonal, ``M_ii = 1/n + sum_{j != i} A_ij``) gives ``dA_ij = G_ii - G_ij``
(``i != j``), ``dA_ii = 0``. ``method="lu-autograd"`` differentiates the same LU with torch's
autograd (the previous implementation, kept as a reference); ``"minors"`` is the ``O(n^4)``
reference.

**Causal attention** (``causal=True``: ``A`` lower triangular, a decoder's heads). Then ``L`` is
lower triangular with ``L_00 = 0`` and ``L_ii = s_i = sum_{j<i} A_ij``, every minor keeping row
0 vanishes and (chapter 6, section 1; the matrix determinant lemma gives the same ``det M``)

    c = m e_0,   m = det M = prod_{i>=1} s_i,   x = e_0,

so the penalty is a function of ``m`` alone: ``-log(m + eps) + beta (log(m + n eps) - (log(m +
eps) + (n - 1) log eps) / n - log n)``, computed from the ``n - 1`` sums ``s_i`` in ``O(n^2)``
with no factorisation, its gradient by autograd (which, through the product, is exact where an
``s_i`` vanishes). This holds for every lower-triangular ``A``, so it is the same function the
general path computes, restricted to the causal inputs it is given. The harness's causal
dot-product heads go further: :class:`CausalHeadPenalty` takes the heads' queries and keys and
forms the logits, the softmax, the sums and the penalty in one node with a written-out
backward.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable

from attention_atlas import native

from .cofactors import lu_cofactors, lu_logdet, minors_cofactors, shifted_laplacian, with_fallback
from .heads import attention_probs, head_probs, head_qk, head_qk_views, select_heads
from .native_heads import CausalHeadsPenalty, HeadMatrices, heads_penalty, inplace_grads_on

__all__ = [
    "PENALTY_METHODS",
    "CausalHeadPenalty",
    "CausalHeadsPenalty",
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
        LU, piv, logm, singular = lu_logdet(shifted_laplacian(A, torch.float64))
        Minv = None
        if ctx.needs_input_grad[0]:  # type: ignore[attr-defined]
            eye = torch.eye(n, dtype=LU.dtype, device=A.device).expand_as(LU)
            Minv = torch.linalg.lu_solve(LU, piv, eye)  # M^{-1}, (..., n, n)
            x = Minv.mean(-2)  # M^T x = w = 1/n: x_j = sum_i (M^{-1})_ij / n, (..., n)
        else:
            w = torch.full((*A.shape[:-1], 1), 1.0 / n, dtype=LU.dtype, device=A.device)
            x = torch.linalg.lu_solve(LU, piv, w, adjoint=True).squeeze(-1)  # M^T x = w
        m = logm.exp()
        loss = -torch.log(m + eps)  # the seed's -log(|m| + eps), m > 0
        dkl = None
        if beta:
            c = m.unsqueeze(-1) * x  # (..., n)
            pos = c.clamp_min(0.0) + eps
            total = pos.sum(-1, keepdim=True)
            loss = loss + beta * (total.squeeze(-1).log() - pos.log().mean(-1) - math.log(n))
            dkl = (total.reciprocal() - (n * pos).reciprocal()).masked_fill_(c <= 0, 0.0)
        ctx.save_for_backward(Minv, x, m, dkl)  # type: ignore[arg-type]
        ctx.consts = (beta, eps, A.dtype)  # type: ignore[attr-defined]
        ctx.mark_non_differentiable(singular)
        return loss, singular

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, g: Tensor, _: Tensor) -> tuple[Tensor, None, None]:  # type: ignore[override]
        Minv, x, m, dkl = ctx.saved_tensors  # type: ignore[attr-defined]
        beta, eps, dtype = ctx.consts  # type: ignore[attr-defined]
        g_logm = -g * m / (m + eps)  # (...)
        if dkl is not None:
            g_x = (g * beta * m).unsqueeze(-1) * dkl  # dloss/dx, (..., n)
            g_logm = g_logm + (g_x * x).sum(-1)
        # G = g_logm M^{-T} - x y^T with M y = g_x; dA_ij = G_ii - G_ij (i != j)
        G = Minv.transpose(-2, -1) * g_logm[..., None, None]  # (..., n, n)
        if dkl is not None:  # y = M^{-1} g_x, (..., 1, n); elementwise: n is small, a bmm is not
            y = (Minv * g_x.unsqueeze(-2)).sum(-1).unsqueeze(-2)
            G.sub_(x.unsqueeze(-1) * y)
        diag = G.diagonal(dim1=-2, dim2=-1).unsqueeze(-1)  # (..., n, 1)
        gA = diag - G  # dA_ij = G_ii - G_ij; 0 on the diagonal (A_ii is not in M)
        return gA.to(dtype), None, None


def _lu_autograd(A64: Tensor) -> tuple[Tensor, Tensor]:
    """``(log|m|, c)`` by :func:`lu_cofactors` under torch's autograd, the minors for singular
    matrices."""
    res = lu_cofactors(A64)
    c = with_fallback(A64, res.cofactors, res.singular)
    logabs = res.logabsdet
    if bool(res.singular.any()):
        tiny = torch.finfo(torch.float64).tiny
        logabs = torch.where(res.singular, c.sum(-1).abs().clamp_min(tiny).log(), logabs)
    return logabs, c


def _causal_penalty(A: Tensor, beta: float, eps: float) -> Tensor:
    """The penalty of lower-triangular ``A (..., n, n)`` by the closed form of the module
    docstring (``c = m e_0``, ``m = prod_{i>=1} s_i``), per matrix ``(...)``, float64."""
    s = A.tril(-1).sum(-1, dtype=torch.float64)  # L_ii = s_i = sum_{j<i} A_ij
    return _causal_loss(s, beta, eps)


@functools.lru_cache(maxsize=16)
def _causal_masks(n: int, dtype: torch.dtype, device: torch.device) -> tuple[Tensor, Tensor]:
    """``(bias, lower)`` ``(n, n)`` of one causal head: ``bias`` 0 on and below the diagonal and
    ``-inf`` above (added to the logits), ``lower`` 1 strictly below the diagonal, else 0.
    Cached per size, dtype and device; never written to."""
    upper = torch.ones(n, n, dtype=torch.bool, device=device).triu(1)
    bias = torch.zeros(n, n, dtype=dtype, device=device).masked_fill(upper, float("-inf"))
    lower = torch.ones(n, n, dtype=dtype, device=device).tril(-1)
    return bias, lower


class CausalHeadPenalty(torch.autograd.Function):
    """The closed-form penalty of causal dot-product heads from their queries and keys, as one
    node: ``q, k (b, n, d)``, ``scale`` (``1 / (sqrt(d) T)``) -> the loss per head ``(b,)``,
    float64 (:func:`_causal_loss`)::

        z = scale q k^T (j <= i),   A = softmax(z),   s_i = sum_{j<i} A_ij,   m = prod_{i>=1} s_i

    Forward: the product, scale and mask in one ``baddbmm``, the softmax, and the row sums
    (in the logits' dtype: positive terms, so each sum keeps its relative precision). Backward,
    written out: ``dloss/dm`` in closed form; ``dm/ds_i = prod_{k>=1, k != i} s_k`` (exclusive
    products, exact where an ``s_k`` vanishes); the softmax's backward for a gradient constant
    along each row's strict lower part, ``dz_ij = A_ij g_i ([j < i] - s_i)``; ``dq = scale dz
    k`` and ``dk = scale dz^T q``. Nothing is factorised and no ``(b, n, n)`` temporary but
    ``A`` and ``dz`` is made. With the native kernels on (:mod:`attention_atlas.native`) the
    forward, the loss included, is one kernel call and so is the backward (``dloss/dm`` and the
    exclusive products by prefix and suffix products, then ``dq`` and ``dk``).
    """

    @staticmethod
    def forward(
        ctx: FunctionCtx, q: Tensor, k: Tensor, scale: float, beta: float, eps: float
    ) -> Tensor:  # type: ignore[override]
        b, n, d = q.shape
        if native.active(q, k):  # the native kernel (opt-in): the same maths, loss included
            q, k = q.contiguous(), k.contiguous()
            heads = HeadMatrices([q.unsqueeze(1)], [k.unsqueeze(1)], [0], b)
            loss, A, s = heads.forward(scale, beta, eps)
            ctx.save_for_backward(q, k, A, s)
            ctx.consts = (scale, beta, eps, True)  # type: ignore[attr-defined]
            return loss
        bias, lower = _causal_masks(n, q.dtype, q.device)
        A = torch.softmax(torch.baddbmm(bias, q, k.transpose(-2, -1), alpha=scale), -1)
        s = (A * lower).sum(-1).to(torch.float64)  # (b, n); s_0 = 0
        m = s[..., 1:].prod(-1)
        ctx.save_for_backward(q, k, A, s, m)
        ctx.consts = (scale, beta, eps, False)  # type: ignore[attr-defined]
        return _loss_of_m(m, n, beta, eps)

    @staticmethod
    @once_differentiable
    def backward(
        ctx: FunctionCtx, g: Tensor
    ) -> tuple[Tensor | None, Tensor | None, None, None, None]:  # type: ignore[override]
        scale, beta, eps, fast = ctx.consts  # type: ignore[attr-defined]
        if fast:  # dloss/dm, the exclusive products and dq, dk in the kernel
            q, k, A, s = ctx.saved_tensors  # type: ignore[attr-defined]
            gq, gk = torch.empty_like(q), torch.empty_like(k)
            heads = HeadMatrices([q.unsqueeze(1)], [k.unsqueeze(1)], [0], q.shape[0])
            heads.backward(g, A, s, [gq.unsqueeze(1)], [gk.unsqueeze(1)], scale, beta, eps)
            return gq, gk, None, None, None
        q, k, A, s, m = ctx.saved_tensors  # type: ignore[attr-defined]
        n = A.shape[-1]
        dm = -1.0 / (m + eps)
        if beta:
            dm = dm + beta * (1.0 / (m + n * eps) - 1.0 / (n * (m + eps)))
        t = s[..., 1:]  # (b, n - 1)
        if bool((t > 0).all()):
            dmds = m.unsqueeze(-1) / t  # prod_{k >= 1, k != i} s_k
        else:  # a vanished s_k: the exclusive products themselves
            one = torch.ones_like(t[..., :1])
            before = torch.cat([one, t[..., :-1]], -1).cumprod(-1)  # prod_{1 <= k < i} s_k
            after = torch.cat([one, t[..., 1:].flip(-1)], -1).cumprod(-1).flip(-1)  # k > i
            dmds = before * after
        # scale * dloss/ds_i, (b, n); row 0 gets 0 (s_0 = 0 and [j < 0] is empty, so dz_0 = 0)
        gs = F.pad((g * dm * scale).unsqueeze(-1) * dmds, (1, 0))
        lower = _causal_masks(n, A.dtype, A.device)[1]
        # dz_ij = A_ij g_i ([j < i] - s_i), scaled
        dz = (lower * gs.to(A.dtype).unsqueeze(-1)).sub_((gs * s).to(A.dtype).unsqueeze(-1))
        dz.mul_(A)
        needs_q, needs_k = ctx.needs_input_grad[:2]  # type: ignore[attr-defined]
        dq = torch.bmm(dz, k) if needs_q else None
        dk = torch.bmm(dz.transpose(-2, -1), q) if needs_k else None
        return dq, dk, None, None, None


def _causal_loss(s: Tensor, beta: float, eps: float) -> Tensor:
    """The closed-form penalty per matrix ``(...)`` from the row sums ``s (..., n)`` of a
    causal head (``s_0 = 0`` is not used)."""
    return _loss_of_m(s[..., 1:].prod(-1), s.shape[-1], beta, eps)  # m = det M = c_0 = sum c


def _loss_of_m(m: Tensor, n: int, beta: float, eps: float) -> Tensor:
    """The penalty of a causal ``n x n`` head from ``m = prod_{i>=1} s_i`` (its only nonzero
    cofactor): ``-log(m + eps) + beta KL(u || pi)`` with ``p = (m + eps, eps, ..., eps)``."""
    log_m_eps = torch.log(m + eps)
    loss = -log_m_eps  # the seed's -log(|m| + eps)
    if beta:  # p = (m + eps, eps, ..., eps), S = m + n eps: KL = log S - mean log p - log n
        const = (n - 1) / n * math.log(eps) + math.log(n)
        loss = loss + beta * (torch.log(m + n * eps) - log_m_eps / n - const)
    return loss


def _check_lower_triangular(A: Tensor) -> None:
    """Raise unless ``A`` has no nonzero entry above its diagonal (``causal=True`` claims it)."""
    upper = A.detach().triu(1)
    if bool(upper.any()):
        raise ValueError(
            "causal=True needs lower-triangular attention matrices (causal heads), got an "
            f"entry {float(upper.abs().max()):.3g} above the diagonal of a {tuple(A.shape)} "
            "batch"
        )


def cofactor_penalty(
    A: Tensor,
    *,
    beta: float = 0.0,
    eps: float = 1e-8,
    method: str = "lu",
    reduce: str = "mean",
    causal: bool = False,
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
        causal: ``A`` is lower triangular (causal heads; checked): ``method="lu"`` takes the
            closed form of the module docstring, no factorisation. The references ignore it.
    """
    if method not in PENALTY_METHODS:
        raise ValueError(f"the penalty needs exact cofactors: method one of {PENALTY_METHODS}, "
                         f"got {method!r}")  # fmt: skip
    if reduce not in ("mean", "none"):
        raise ValueError(f"reduce must be 'mean' or 'none', got {reduce!r}")
    if causal:
        _check_lower_triangular(A)
    return _penalty(A, float(beta), float(eps), method, reduce, causal)


def _penalty(A: Tensor, beta: float, eps: float, method: str, reduce: str, causal: bool) -> Tensor:
    """:func:`cofactor_penalty` without checking ``causal`` (the caller vouches for it)."""
    n = A.shape[-1]
    if method == "lu" and causal:
        loss = _causal_penalty(A, beta, eps)
        return loss.mean() if reduce == "mean" else loss
    if method == "lu":
        loss, singular = FastPenalty.apply(A, beta, eps)
        if not bool(singular.any()):
            return loss.mean() if reduce == "mean" else loss
        method = "lu-autograd"  # rare: rank L < n - 1 to working precision
    if method == "lu-autograd":
        logabs, c = _lu_autograd(A.to(torch.float64))
    else:
        c = minors_cofactors(A.to(torch.float64))
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
    causal: bool = False,
) -> Tensor:
    """Mean cofactor penalty over the selected layers, heads and batch items (a scalar, float64).

    Args:
        probs: per-layer attention probabilities ``(B, H, L, L)`` (e.g. ``[r.probs for r in
            output.attentions]``).
        layers: layer indices (default all).
        heads: head indices, or an int ``k`` for the first ``k`` heads of each layer (default 1),
            or None for all.
        beta, eps, method, causal: see :func:`cofactor_penalty`.
        max_items: use only the first ``max_items`` batch items (cost control).
    """
    sel = select_heads(probs, layers, heads)
    if max_items is not None:
        sel = [p[:max_items] for p in sel]
    return _penalty_of_heads(sel, beta=beta, eps=eps, method=method, causal=causal)


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
    training forward stays on the fused kernel. A causal model's heads (``model.cfg.is_causal``)
    take the closed form of the module docstring (unchecked for recomputed heads, which
    :func:`~attention_atlas.cofactor.heads.head_probs` masks itself). Options as
    :func:`cofactor_regularizer_from_probs`."""
    causal = bool(getattr(getattr(model, "cfg", None), "is_causal", False))
    opts: dict[str, Any] = {"beta": beta, "eps": eps, "method": method, "causal": causal}
    probs = attention_probs(output)
    if all(p is not None for p in probs):
        return cofactor_regularizer_from_probs(
            probs, layers=layers, heads=heads, max_items=max_items, **opts
        )
    if causal and method == "lu":  # dot-product heads: queries and keys are all it needs
        views = head_qk_views(model, output, layers=layers, heads=heads)
        if views is not None and native.active(views[0][0]):  # read in place (checked there)
            qs, ks, idx, temperature = views
            items = qs[0].shape[0] if max_items is None else min(max_items, qs[0].shape[0])
            scale = _logit_scale(qs[0].shape[-1], temperature)
            return heads_penalty(qs, ks, idx, items, scale, float(beta), float(eps),
                                 inplace_grad=inplace_grads_on())  # fmt: skip
        qk = head_qk(model, output, layers=layers, heads=heads, max_items=max_items)
        if qk is not None:
            q, k, temperature = qk  # (layers, B, h, n, d)
            scale = _logit_scale(q.shape[-1], temperature)
            loss = CausalHeadPenalty.apply(
                q.flatten(0, -3), k.flatten(0, -3), scale, float(beta), float(eps)
            )
            return loss.mean()
    probs_sel = head_probs(model, output, layers=layers, heads=heads, max_items=max_items)
    n = probs_sel.shape[-1]
    if method not in PENALTY_METHODS:
        return cofactor_penalty(probs_sel, **opts)  # its error
    # a causal model's recomputed heads are lower triangular (head_probs applies the causal mask)
    return _penalty(probs_sel.reshape(-1, n, n), float(beta), float(eps), method, "mean", causal)


def _logit_scale(head_dim: int, temperature: float) -> float:
    """``1 / (sqrt(d) T)``: the logits of a dot-product head are ``scale q k^T``."""
    return 1.0 / (math.sqrt(head_dim) * temperature)


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
