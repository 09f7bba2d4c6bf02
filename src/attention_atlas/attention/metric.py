"""Distance-based attention: Euclidean, dense Mahalanobis and matroidal.

Euclidean distance attention scores ``S_ij = -|q_i - k_j|^2 / tau``. Because
``-|q - k|^2 = 2 q.k - |q|^2 - |k|^2`` and ``|q_i|^2`` is constant along a softmax row,
``softmax_j(S_ij) = softmax_j((2 q_i.k_j - |k_j|^2) / tau)``: a dot product of the augmented
vectors ``q' = [q, 1]`` and ``k' = [k, -|k|^2 / 2]`` at scale ``2 / tau``, which SDPA computes.
The CPU flash kernel needs q, k and v of equal head dimension, so v is padded by one zero
column and the pad is sliced off the output. On the CPU (no mask, ``d_v = d``) the key column
``-|k|^2 / 2`` is instead folded into a broadcast ``(B, H, 1, Lk)`` additive bias, so the forward
runs the flash kernel at head dimension ``d`` (see :class:`_FoldedNormSDPA`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .base import (
    Attention,
    AttentionResult,
    check_qkv,
    combine_masks,
)
from .dot import attention_from_logits, masked_softmax, sdpa

__all__ = [
    "CONTRAST_FAMILIES",
    "GRAPH_FAMILIES",
    "MahalanobisAttention",
    "MatroidalAttention",
    "covector_matrix",
    "graph_edges",
    "graph_family_admits",
    "incidence_matrix",
    "is_signed_incidence",
    "is_totally_unimodular",
    "mahalanobis_attention",
    "mahalanobis_logits",
    "matroidal_attention",
    "matroidal_coefficients",
    "matroidal_factor",
    "matroidal_logits",
    "matroidal_metric",
    "matroidal_pair_logits",
    "metric_factor",
    "prune_columns",
    "EuclideanAttention",
    "euclidean_attention",
    "euclidean_attention_explicit",
    "euclidean_logits",
    "squared_distance_attention",
]


def euclidean_logits(q: Tensor, k: Tensor, tau: float) -> Tensor:
    """Reference ``S_ij = -|q_i - k_j|^2 / tau``, ``(..., Lq, Lk)``, materialised pairwise."""
    diff = q.unsqueeze(-2) - k.unsqueeze(-3)  # (..., Lq, Lk, d)
    return -(diff * diff).sum(-1) / tau


def euclidean_attention_explicit(
    q: Tensor, k: Tensor, v: Tensor, tau: float, *, causal: bool = False, mask: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """Materialised reference: returns ``(out, probs, logits)``."""
    check_qkv(q, k, v)
    logits = euclidean_logits(q, k, tau)
    keep = combine_masks(q.shape[-2], k.shape[-2], causal=causal, mask=mask, device=q.device)
    probs = masked_softmax(logits, keep)
    return probs @ v, probs, logits


def _folded_kernel_applies(q: Tensor, k: Tensor, v: Tensor, causal: bool) -> bool:
    """Whether :class:`_FoldedNormSDPA` can run: CPU flash kernel, float32/64, d_v = d, aligned causal."""
    return (
        q.device.type == "cpu"
        and hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward")
        and q.dtype in (torch.float32, torch.float64)
        and v.shape[-1] == q.shape[-1]  # the kernel wants equal head sizes
        and not (causal and q.shape[-2] != k.shape[-2])
        and q.shape[-2] > 0
        and k.shape[-2] > 0
    )


class _FoldedNormSDPA(torch.autograd.Function):
    """``softmax(scale * (q_i.k_j + kn_j)) v`` with the key term ``kn`` as an additive bias.

    Forward: the CPU flash kernel at head dimension d with a broadcast ``(B, H, 1, Lk)`` float
    bias (no extra column, memory linear in L). Backward: the flash backward of the same logits
    written as augmented vectors ``[q, 1] . [k, kn]`` (head dimension d + 1), which also yields
    the gradient of ``kn`` (its last key column) from the forward's log-sum-exp.
    ``q (B, H, Lq, d)``, ``k (B, H, Lk, d)``, ``kn (B, H, Lk)``, ``v (B, H, Lk, d_v)``.
    """

    @staticmethod
    def forward(ctx, q, k, kn, v, scale, causal):  # type: ignore[override]
        bias = (scale * kn).unsqueeze(-2)  # (B, H, 1, Lk)
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, causal, attn_mask=bias, scale=scale
        )
        ctx.save_for_backward(q, k, kn, v, out, lse)
        ctx.scale, ctx.causal = scale, causal
        return out

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        q, k, kn, v, out, lse = ctx.saved_tensors
        d, dv = q.shape[-1], v.shape[-1]
        q_aug = torch.cat([q, torch.ones_like(q[..., :1])], -1)  # (B, H, Lq, d+1)
        k_aug = torch.cat([k, kn.unsqueeze(-1)], -1)  # (B, H, Lk, d+1)
        pad = max(d + 1 - dv, 0)
        gq, gk, gv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            F.pad(grad_out.contiguous(), (0, pad)),
            q_aug,
            k_aug,
            F.pad(v, (0, pad)),
            F.pad(out, (0, pad)),
            lse,
            0.0,
            ctx.causal,
            scale=ctx.scale,
        )
        return gq[..., :d], gk[..., :d], gk[..., d], gv[..., :dv], None, None


def squared_distance_attention(
    q: Tensor, k: Tensor, v: Tensor, tau: float, *, causal: bool = False, mask: Tensor | None = None
) -> Tensor:
    """``softmax(-|q_i - k_j|^2 / tau) v`` through SDPA with augmented q and k.

    ``q (..., Lq, d)``, ``k (..., Lk, d)``, ``v (..., Lk, d_v)`` -> ``(..., Lq, d_v)``.
    Any metric ``M = F F^T`` reduces to this by mapping ``q -> F^T q``, ``k -> F^T k``.
    """
    check_qkv(q, k, v)
    if tau <= 0:
        raise ValueError(f"tau must be positive, got {tau}")
    if mask is None and _folded_kernel_applies(q, k, v, causal):
        lead = tuple(q.shape[:-2])
        q4, k4, v4 = (_as_4d(t)[0] for t in (q, k, v))  # 3-D inputs miss the flash kernel
        kn = -0.5 * (k4 * k4).sum(-1)  # (B, H, Lk): the -|k|^2/2 column, folded into a bias
        out = _FoldedNormSDPA.apply(q4, k4, kn, v4, 2.0 / tau, causal)
        return out.reshape(*lead, *out.shape[-2:])
    ones = torch.ones_like(q[..., :1])
    q_aug = torch.cat([q, ones], dim=-1)  # (..., Lq, d+1)
    k_aug = torch.cat([k, -0.5 * (k * k).sum(-1, keepdim=True)], dim=-1)  # (..., Lk, d+1)
    dq, dv = q_aug.shape[-1], v.shape[-1]
    v_pad = F.pad(v, (0, dq - dv)) if dv < dq else v  # equal head dims for the flash kernel
    out = sdpa(q_aug, k_aug, v_pad, scale=2.0 / tau, causal=causal, mask=mask)
    return out[..., :dv]


euclidean_attention = squared_distance_attention


class EuclideanAttention(Attention):
    """Multi-head Euclidean distance attention ``softmax(-|q_i - k_j|^2 / tau) v``.

    Args:
        tau: temperature (default ``sqrt(2 * head_dim)``, which puts the logits on the
            scale of dot-product attention's).
    """

    name = "euclidean"

    def __init__(self, dim: int, n_heads: int, tau: float | None = None, **kwargs) -> None:
        super().__init__(dim, n_heads, **kwargs)
        self.tau = float(tau) if tau is not None else (2.0 * self.head_dim) ** 0.5

    def attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        x: Tensor,
        causal: bool,
        mask: Tensor | None,
        need_weights: bool,
    ) -> AttentionResult:
        if need_weights:
            check_qkv(q, k, v)
            return attention_from_logits(
                euclidean_logits(q, k, self.tau), v, causal=causal, mask=mask
            )
        return AttentionResult(
            squared_distance_attention(q, k, v, self.tau, causal=causal, mask=mask)
        )

    def extra_repr(self) -> str:
        return super().extra_repr() + f", tau={self.tau:.3g}"


# =====================================================================================
# Matroidal and dense Mahalanobis distance attention (the matroidal seed, chapter 5)
# =====================================================================================
#
# Both metrics are ``M = C C^T + eps I`` with ``C (d, p)``: ``C = A diag(sqrt(l))`` for the
# matroidal metric (``A`` a fixed sparse covector matrix, ``l = softplus(theta)`` learned) and a
# dense learned ``C = W`` for the Mahalanobis baseline. The quadratic form
# ``x^T M x = sum_e l_e (a_e^T x)^2 + eps |x|^2`` is a sum of rank-one PSD terms, and it depends
# on ``A`` and ``theta`` only through the ``d x d`` matrix ``M``. With an upper-triangular
# ``R`` such that ``R^T R = M`` (the R of a QR factorisation of ``[C^T; sqrt(eps) I]``),
# ``(z_i - z_j)^T M (z_i - z_j) = |R z_i - R z_j|^2``, so the attention is Euclidean
# distance attention on ``y = z R^T``: its cost per token does not grow with ``m``.

GRAPH_FAMILIES: tuple[str, ...] = ("ring", "ring_chords", "knn", "complete", "random")
"""Graph families whose signed incidence columns ``e_i - e_j`` make the covector matrix."""

CONTRAST_FAMILIES: tuple[str, ...] = ("unsigned", "sparse_random")
"""Sparse non-incidence families, for contrast: ``unsigned`` has columns ``e_i + e_j`` over the
ring-plus-chords edges (totally unimodular only when that graph is bipartite); ``sparse_random``
has three random entries in ``{-1, +1}`` per column (generically not totally unimodular)."""


def _check_graph_size(family: str, d: int, m: int) -> None:
    if d < 3:
        raise ValueError(f"graph family {family!r} needs d >= 3 nodes, got d={d}")
    if m < 1:
        raise ValueError(f"the number of edges m must be positive, got m={m}")
    most = d * (d - 1) // 2
    if m > most:
        raise ValueError(
            f"graph family {family!r} on d={d} nodes has at most d(d-1)/2={most} edges "
            f"(simple graph), but m={m} were asked for"
        )


def graph_family_admits(family: str, d: int, m: int) -> bool:
    """Whether graph family ``family`` has a graph on ``d`` vertices with exactly ``m`` edges
    (the condition under which :func:`graph_edges` returns instead of raising)."""
    try:
        graph_edges(family, d, m)
    except ValueError:
        return False
    return True


def graph_edges(family: str, d: int, m: int, *, seed: int = 0) -> list[tuple[int, int]]:
    """Exactly ``m`` distinct undirected edges ``(i, j)``, ``i < j``, on ``d`` nodes.

    Families:
        ``ring``: the cycle ``i -- i+1 (mod d)``; needs ``m == d``.
        ``ring_chords``: the ring plus ``m - d`` chords drawn at random (``seed``); ``m >= d``.
        ``knn``: circulant k-nearest-neighbour graph, node ``i`` joined to ``i +- 1, ..., i +- k``
            on the circle; needs ``m = k d`` with ``1 <= k < d / 2``.
        ``complete``: all pairs; needs ``m == d (d - 1) / 2``.
        ``random``: ``m`` pairs drawn uniformly at random (``seed``).

    Raises:
        ValueError: an unknown family, or an ``m`` the family cannot have on ``d`` nodes.
    """
    if family not in GRAPH_FAMILIES + ("unsigned",):
        raise ValueError(f"unknown graph family {family!r}; known: {', '.join(GRAPH_FAMILIES)}")
    _check_graph_size(family, d, m)
    ring = [(min(i, (i + 1) % d), max(i, (i + 1) % d)) for i in range(d)]
    all_pairs = [(i, j) for i in range(d) for j in range(i + 1, d)]
    gen = torch.Generator().manual_seed(seed)
    if family == "ring":
        if m != d:
            raise ValueError(f"a ring on d={d} nodes has exactly d={d} edges, got m={m}")
        return ring
    if family in ("ring_chords", "unsigned"):
        if m < d:
            raise ValueError(f"{family!r} on d={d} nodes needs m >= d={d} (the ring), got m={m}")
        chords = [p for p in all_pairs if p not in set(ring)]
        pick = torch.randperm(len(chords), generator=gen)[: m - d].tolist()
        return ring + [chords[i] for i in sorted(pick)]
    if family == "knn":
        k, rest = divmod(m, d)
        if rest or not 1 <= k < d / 2:
            raise ValueError(
                f"the circulant k-nearest graph on d={d} nodes has m = k*d edges with "
                f"1 <= k < d/2 (k <= {(d - 1) // 2}), got m={m}"
            )
        return [
            (min(i, (i + s) % d), max(i, (i + s) % d)) for s in range(1, k + 1) for i in range(d)
        ]
    if family == "complete":
        if m != len(all_pairs):
            raise ValueError(
                f"the complete graph on d={d} nodes has exactly d(d-1)/2={len(all_pairs)} "
                f"edges, got m={m}"
            )
        return all_pairs
    pick = torch.randperm(len(all_pairs), generator=gen)[:m].tolist()  # family == "random"
    return [all_pairs[i] for i in sorted(pick)]


def incidence_matrix(
    edges: list[tuple[int, int]], d: int, *, signed: bool = True, dtype: torch.dtype = torch.float32
) -> Tensor:
    """Incidence matrix ``(d, m)``: column ``e`` is ``e_i - e_j`` (or ``e_i + e_j`` if unsigned)."""
    A = torch.zeros(d, len(edges), dtype=dtype)
    for col, (i, j) in enumerate(edges):
        if not (0 <= i < d and 0 <= j < d) or i == j:
            raise ValueError(f"edge {col} = {(i, j)} is not a pair of distinct nodes in [0, {d})")
        A[i, col] = 1.0
        A[j, col] = -1.0 if signed else 1.0
    return A


def covector_matrix(
    family: str, d: int, m: int, *, seed: int = 0, dtype: torch.dtype = torch.float32
) -> Tensor:
    """The sparse covector matrix ``A (d, m)`` of a named family.

    Graph families (:data:`GRAPH_FAMILIES`) give signed incidence columns ``e_i - e_j``, which
    are totally unimodular; the contrast families (:data:`CONTRAST_FAMILIES`) do not in general.
    """
    if family in GRAPH_FAMILIES:
        return incidence_matrix(graph_edges(family, d, m, seed=seed), d, dtype=dtype)
    if family == "unsigned":
        return incidence_matrix(graph_edges(family, d, m, seed=seed), d, signed=False, dtype=dtype)
    if family == "sparse_random":
        if d < 3 or m < 1:
            raise ValueError(f"'sparse_random' needs d >= 3 and m >= 1, got d={d}, m={m}")
        gen = torch.Generator().manual_seed(seed)
        A = torch.zeros(d, m, dtype=dtype)
        for col in range(m):
            rows = torch.randperm(d, generator=gen)[:3]
            signs = torch.randint(0, 2, (3,), generator=gen).to(dtype) * 2 - 1
            A[rows, col] = signs
        return A
    known = ", ".join(GRAPH_FAMILIES + CONTRAST_FAMILIES)
    raise ValueError(f"unknown covector family {family!r}; known: {known}")


def is_signed_incidence(A: Tensor) -> bool:
    """True when every column of ``A`` has at most one ``+1``, at most one ``-1`` and zeros.

    Such a matrix (the incidence matrix of a directed graph) is totally unimodular
    (Poincare 1900; Heller and Tompkins 1956): a structural certificate, no minors needed.
    """
    if A.dim() != 2:
        raise ValueError(f"A must be a matrix (d, m), got shape {tuple(A.shape)}")
    entries_ok = bool(((A == 0) | (A == 1) | (A == -1)).all())
    return entries_ok and bool(((A == 1).sum(0) <= 1).all() and ((A == -1).sum(0) <= 1).all())


def is_totally_unimodular(A: Tensor, *, max_minors: int = 2_000_000) -> bool:
    """Exhaustive check that every square submatrix of ``A (d, m)`` has determinant in {-1, 0, 1}.

    Duplicate columns (and columns equal up to sign) are removed first, which does not change
    the answer. The number of minors is ``sum_k C(d, k) C(m', k)``; when that exceeds
    ``max_minors`` the check refuses (``ValueError``) rather than guess.

    Returns:
        True when ``A`` is totally unimodular, False as soon as one minor is not in {-1, 0, 1}.
    """
    import itertools
    import math

    import numpy as np

    if A.dim() != 2:
        raise ValueError(f"A must be a matrix (d, m), got shape {tuple(A.shape)}")
    a = A.detach().to("cpu", torch.float64).numpy()
    if not np.isin(a, (-1.0, 0.0, 1.0)).all():
        return False  # a 1 x 1 minor is already outside {-1, 0, 1}
    cols: list[tuple[float, ...]] = []
    seen: set[tuple[float, ...]] = set()
    for c in a.T:
        key, neg = tuple(c.tolist()), tuple((-c).tolist())
        if any(c) and key not in seen and neg not in seen:
            seen.add(key)
            cols.append(key)
    if not cols:
        return True
    a = np.array(cols).T  # (d, m')
    d, m = a.shape
    total = sum(math.comb(d, k) * math.comb(m, k) for k in range(2, min(d, m) + 1))
    if total > max_minors:
        raise ValueError(
            f"exhaustive total-unimodularity check of a ({d}, {m}) matrix needs {total} minors, "
            f"more than max_minors={max_minors}; use a smaller matrix or is_signed_incidence"
        )
    for k in range(2, min(d, m) + 1):
        rows = np.array(list(itertools.combinations(range(d), k)))  # (R, k)
        for cset in itertools.combinations(range(m), k):
            sub = a[rows][:, :, list(cset)]  # (R, k, k)
            det = np.abs(np.linalg.det(sub))
            if (det > 1.5).any() or ((det > 0.5) & (det < 1.5) & (np.abs(det - 1) > 1e-6)).any():
                return False
    return True


def _check_metric_args(eps: float, tau: float) -> None:
    if not eps >= 0:
        raise ValueError(f"eps must be nonnegative, got {eps}")
    if not tau > 0:
        raise ValueError(f"tau must be positive, got {tau}")


def _check_covectors(A: Tensor, theta: Tensor, d: int) -> None:
    if A.dim() < 2 or A.shape[-2] != d:
        raise ValueError(f"A must have shape (..., d={d}, m), got {tuple(A.shape)}")
    if theta.shape[-1:] != A.shape[-1:] or theta.dim() != A.dim() - 1:
        raise ValueError(
            f"theta must have shape (..., m={A.shape[-1]}) matching A {tuple(A.shape)}, "
            f"got {tuple(theta.shape)}"
        )


def matroidal_coefficients(theta: Tensor) -> Tensor:
    """``l_e = softplus(theta_e) > 0``: the nonnegative weights of the rank-one terms."""
    return F.softplus(theta)


def matroidal_metric(A: Tensor, theta: Tensor, eps: float) -> Tensor:
    """``M = A diag(softplus(theta)) A^T + eps I``, ``A (..., d, m)``, ``theta (..., m)`` -> ``(..., d, d)``."""
    _check_covectors(A, theta, A.shape[-2])
    eye = torch.eye(A.shape[-2], dtype=A.dtype, device=A.device)
    return (A * matroidal_coefficients(theta).unsqueeze(-2)) @ A.transpose(-2, -1) + eps * eye


def metric_factor(C: Tensor, eps: float, *, method: str = "qr") -> Tensor:
    """Upper-triangular ``R (..., d, d)`` with ``R^T R = C C^T + eps I``, ``C (..., d, p)``.

    ``method="qr"`` (default) takes the R of ``[C^T; sqrt(eps) I]`` (``(p + d, d)``, full column
    rank when ``eps > 0``): it never forms ``M``, so it works with the square root of the
    condition number of ``M``. ``method="cholesky"`` factors ``M`` itself (``M = L L^T``,
    ``R = L^T``). Both are differentiable and give the same metric.
    """
    d = C.shape[-2]
    eye = torch.eye(d, dtype=C.dtype, device=C.device)
    if method == "qr":
        stacked = torch.cat([C.transpose(-2, -1), (eps**0.5) * eye.expand(*C.shape[:-2], d, d)], -2)
        return torch.linalg.qr(stacked).R  # (..., d, d)
    if method == "cholesky":
        M = C @ C.transpose(-2, -1) + eps * eye
        return torch.linalg.cholesky(M).transpose(-2, -1)
    raise ValueError(f"method must be 'qr' or 'cholesky', got {method!r}")


def matroidal_factor(A: Tensor, theta: Tensor, eps: float, *, method: str = "qr") -> Tensor:
    """``R (..., d, d)`` with ``R^T R = A diag(softplus(theta)) A^T + eps I``."""
    _check_covectors(A, theta, A.shape[-2])
    if eps <= 0:
        raise ValueError(f"the fast path needs eps > 0 (M positive definite), got eps={eps}")
    l = matroidal_coefficients(theta)
    root = l.clamp_min(torch.finfo(l.dtype).tiny).sqrt()  # sqrt(l_e); d/dtheta -> 0 as l -> 0
    return metric_factor(A * root.unsqueeze(-2), eps, method=method)


def matroidal_pair_logits(
    q: Tensor, k: Tensor, A: Tensor, theta: Tensor, eps: float, tau: float
) -> Tensor:
    """The seed's pseudocode for queries and keys: ``(..., Lq, Lk)``, materialised.

    ``-(sum_e l_e (a_e.(q_i - k_j))^2 + eps |q_i - k_j|^2) / (2 tau)``, ``q (..., Lq, d)``,
    ``k (..., Lk, d)``, ``A (d, m)`` or per head ``(H, d, m)`` with ``q (B, H, Lq, d)``, and
    ``theta`` shaped like ``A`` without its ``d``. Memory ``O(Lq Lk m)``: the reference only.
    """
    _check_metric_args(eps, tau)
    _check_covectors(A, theta, q.shape[-1])
    uq = torch.einsum("...dm,...nd->...nm", A, q)  # u[n, e] = a_e^T q_n
    uk = torch.einsum("...dm,...nd->...nm", A, k)
    w = matroidal_coefficients(theta).unsqueeze(-2).unsqueeze(-2)  # (..., 1, 1, m)
    delta = uq.unsqueeze(-2) - uk.unsqueeze(-3)  # (..., Lq, Lk, m)
    diff = q.unsqueeze(-2) - k.unsqueeze(-3)  # (..., Lq, Lk, d)
    dist = (delta**2 * w).sum(-1) + eps * (diff**2).sum(-1)
    return -dist / (2 * tau)


def matroidal_logits(z: Tensor, A: Tensor, theta: Tensor, eps: float, tau: float) -> Tensor:
    """The seed's pseudocode (the reference): ``z (batch, n, d)`` -> logits ``(batch, n, n)``.

    ``-(sum_e softplus(theta_e) (a_e.(z_i - z_j))^2 + eps |z_i - z_j|^2) / (2 tau)``,
    ``A (d, m)``, ``theta (m,)``.
    """
    if z.dim() < 2:
        raise ValueError(f"z must have shape (batch, n, d), got {tuple(z.shape)}")
    return matroidal_pair_logits(z, z, A, theta, eps, tau)


def _as_4d(t: Tensor) -> tuple[Tensor, tuple[int, ...]]:
    """``(..., n, d)`` -> ``(B, H, n, d)`` for the flash kernel, and the leading shape to undo it."""
    lead = tuple(t.shape[:-2])
    if t.dim() == 4:
        return t, lead
    if t.dim() == 3:
        return t.unsqueeze(1), lead
    return t.reshape(-1, 1, *t.shape[-2:]), lead


def matroidal_attention(
    z: Tensor,
    v: Tensor,
    A: Tensor,
    theta: Tensor,
    eps: float = 1e-4,
    tau: float = 1.0,
    causal: bool = False,
    *,
    method: str = "qr",
) -> Tensor:
    """``softmax(matroidal_logits(z, A, theta, eps, tau)) @ v`` by the fast path.

    ``z (batch, n, d)`` (any leading dims ``(..., n, d)``), ``v (..., n, d_v)``, ``A (d, m)``,
    ``theta (m,)``; returns ``(..., n, d_v)``. Cost per token: one ``d x d`` map and Euclidean
    distance attention, independent of ``m``; memory linear in ``n``. ``method`` picks the
    factorisation of ``M`` (:func:`metric_factor`).
    """
    _check_metric_args(eps, tau)
    check_qkv(z, z, v)
    if A.dim() != 2 or theta.dim() != 1:
        raise ValueError(
            f"A must be (d, m) and theta (m,), got A {tuple(A.shape)}, theta {tuple(theta.shape)}"
        )
    _check_covectors(A, theta, z.shape[-1])
    R = matroidal_factor(A.to(z.dtype), theta.to(z.dtype), eps, method=method)  # R^T R = M
    y = z @ R.transpose(-2, -1)  # (..., n, d), |y_i - y_j|^2 = (z_i - z_j)^T M (z_i - z_j)
    y4, lead = _as_4d(y)
    v4, _ = _as_4d(v)
    out = squared_distance_attention(y4, y4, v4, 2 * tau, causal=causal)  # tau' = 2 tau
    return out.reshape(*lead, *out.shape[-2:])


def mahalanobis_logits(q: Tensor, k: Tensor, W: Tensor, eps: float, tau: float) -> Tensor:
    """Reference dense Mahalanobis logits ``-(q_i - k_j)^T (W W^T + eps I)(q_i - k_j) / (2 tau)``.

    ``q (..., Lq, d)``, ``k (..., Lk, d)``, ``W (d, r)`` or per head ``(H, d, r)``; materialised.
    """
    _check_metric_args(eps, tau)
    if W.dim() < 2 or W.shape[-2] != q.shape[-1]:
        raise ValueError(f"W must have shape (..., d={q.shape[-1]}, r), got {tuple(W.shape)}")
    diff = q.unsqueeze(-2) - k.unsqueeze(-3)  # (..., Lq, Lk, d)
    proj = torch.einsum("...dr,...ijd->...ijr", W, diff)  # W^T (q_i - k_j)
    return -((proj**2).sum(-1) + eps * (diff**2).sum(-1)) / (2 * tau)


def mahalanobis_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    W: Tensor,
    eps: float = 1e-4,
    tau: float = 1.0,
    causal: bool = False,
    mask: Tensor | None = None,
) -> Tensor:
    """``softmax(mahalanobis_logits) @ v`` by the same fast path (``M = W W^T + eps I``)."""
    _check_metric_args(eps, tau)
    check_qkv(q, k, v)
    if eps <= 0:
        raise ValueError(f"the fast path needs eps > 0 (M positive definite), got eps={eps}")
    R = metric_factor(W.to(q.dtype), eps)  # (..., d, d)
    yq, yk = q @ R.transpose(-2, -1), k @ R.transpose(-2, -1)
    return squared_distance_attention(yq, yk, v, 2 * tau, causal=causal, mask=mask)


def _inverse_softplus(x: float) -> float:
    import math

    return x + math.log(-math.expm1(-x))


class _FactoredMetricAttention(Attention):
    """Shared body of the dense and matroidal metric attentions.

    A subclass defines :meth:`factor` (``R (H, d, d)`` with ``R^T R = M_h``) and
    :meth:`reference_logits`; ``attend`` maps ``q -> q R^T``, ``k -> k R^T`` and runs Euclidean
    distance attention at temperature ``2 tau`` (fast path), or the reference when weights are
    asked for.
    """

    def __init__(
        self, dim: int, n_heads: int, tau: float | None = None, eps: float = 1e-4, **kwargs
    ) -> None:
        super().__init__(dim, n_heads, **kwargs)
        self.tau = float(tau) if tau is not None else float(self.head_dim) ** 0.5
        self.eps = float(eps)
        _check_metric_args(self.eps, self.tau)
        if self.eps <= 0:
            raise ValueError(f"eps must be positive (M positive definite), got {eps}")

    def factor(self) -> Tensor:
        raise NotImplementedError

    def reference_logits(self, q: Tensor, k: Tensor) -> Tensor:
        raise NotImplementedError

    def attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        x: Tensor,
        causal: bool,
        mask: Tensor | None,
        need_weights: bool,
    ) -> AttentionResult:
        if need_weights:
            return attention_from_logits(self.reference_logits(q, k), v, causal=causal, mask=mask)
        R = self.factor().to(q.dtype)  # (H, d, d)
        Rt = R.transpose(-2, -1).unsqueeze(0)  # (1, H, d, d)
        yq, yk = q @ Rt, k @ Rt  # (B, H, L, d)
        out = squared_distance_attention(yq, yk, v, 2 * self.tau, causal=causal, mask=mask)
        return AttentionResult(out)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", tau={self.tau:.3g}, eps={self.eps:g}"


class MatroidalAttention(_FactoredMetricAttention):
    """Matroidal Mahalanobis attention: ``M_h = A diag(softplus(theta_h)) A^T + eps I`` per head.

    Args:
        m: number of covector columns (default ``head_dim``).
        graph: covector family (:data:`GRAPH_FAMILIES` or :data:`CONTRAST_FAMILIES`).
        seed: seed of the random families.
        tau: temperature (default ``sqrt(head_dim)``, the dot-product scale when ``M = I``).
        eps: the fixed ridge ``eps I`` (default 1e-4).
        init_weight: initial ``l_e`` (default ``head_dim / (2 m)``, so ``trace(M) ~= head_dim``).

    Parameters: ``theta (H, m)``; buffer ``A (H, d, m)`` (the same ``A`` for every head unless
    pruned, when each head keeps its own columns, padded with zero columns).
    """

    name = "matroidal"

    A: Tensor

    def __init__(
        self,
        dim: int,
        n_heads: int,
        m: int | None = None,
        graph: str = "ring",
        seed: int = 0,
        tau: float | None = None,
        eps: float = 1e-4,
        init_weight: float | None = None,
        **kwargs,
    ) -> None:
        super().__init__(dim, n_heads, tau=tau, eps=eps, **kwargs)
        d = self.head_dim
        m = d if m is None else int(m)
        A = covector_matrix(graph, d, m, seed=seed)
        self.graph = graph
        self.register_buffer("A", A.expand(n_heads, d, m).clone())
        w0 = d / (2 * m) if init_weight is None else float(init_weight)
        if w0 <= 0:
            raise ValueError(f"init_weight must be positive, got {init_weight}")
        self.theta = nn.Parameter(torch.full((n_heads, m), _inverse_softplus(w0)))

    @property
    def m(self) -> int:
        return int(self.A.shape[-1])

    def active_columns(self) -> int:
        """Number of nonzero covector columns over all heads (the metric's effective size)."""
        return int((self.A.abs().sum(-2) > 0).sum())

    def coefficients(self) -> Tensor:
        """``l (H, m) = softplus(theta)``."""
        return matroidal_coefficients(self.theta)

    def metric(self) -> Tensor:
        """``M (H, d, d)``."""
        return matroidal_metric(self.A, self.theta, self.eps)

    def factor(self) -> Tensor:
        return matroidal_factor(self.A, self.theta, self.eps)

    def reference_logits(self, q: Tensor, k: Tensor) -> Tensor:
        return matroidal_pair_logits(q, k, self.A.to(q.dtype), self.theta, self.eps, self.tau)

    def metric_parameters(self) -> list[nn.Parameter]:
        return [self.theta]

    @torch.no_grad()
    def pruned(self, delta: float) -> MatroidalAttention:
        """A copy without the columns whose weight ``l_e < delta`` (per head).

        Its output equals this module's output with those weights set to zero exactly; each
        head keeps its own columns (padded with zero columns, which add nothing, to the largest
        count kept by a head).
        """
        import copy

        keep = self.coefficients() >= delta  # (H, m)
        m_new = max(int(keep.sum(-1).max()), 1)
        new = copy.deepcopy(self)
        H, d, _ = self.A.shape
        A_new = self.A.new_zeros(H, d, m_new)
        th_new = self.theta.new_zeros(H, m_new)
        for h in range(H):
            idx = keep[h].nonzero().flatten()
            A_new[h, :, : idx.numel()] = self.A[h][:, idx]
            th_new[h, : idx.numel()] = self.theta[h, idx]
        new.A = A_new
        new.theta = nn.Parameter(th_new)
        return new

    def extra_repr(self) -> str:
        return super().extra_repr() + f", graph={self.graph!r}, m={self.m}"


class MahalanobisAttention(_FactoredMetricAttention):
    """Dense learned Mahalanobis attention: ``M_h = W_h W_h^T + eps I`` per head.

    Args:
        rank: columns of ``W_h`` (default ``head_dim``: a full dense metric, ``d^2`` parameters
            per head).
        tau, eps: as :class:`MatroidalAttention`.

    Parameters: ``W (H, d, rank)``, initialised to the first ``rank`` columns of the identity.
    """

    name = "mahalanobis"

    def __init__(
        self,
        dim: int,
        n_heads: int,
        rank: int | None = None,
        tau: float | None = None,
        eps: float = 1e-4,
        **kwargs,
    ) -> None:
        super().__init__(dim, n_heads, tau=tau, eps=eps, **kwargs)
        d = self.head_dim
        r = d if rank is None else int(rank)
        if r < 1:
            raise ValueError(f"rank must be positive, got {rank}")
        eye = torch.eye(d, r)
        self.W = nn.Parameter(eye.expand(n_heads, d, r).clone())

    def metric(self) -> Tensor:
        """``M (H, d, d)``."""
        eye = torch.eye(self.head_dim, dtype=self.W.dtype, device=self.W.device)
        return self.W @ self.W.transpose(-2, -1) + self.eps * eye

    def factor(self) -> Tensor:
        return metric_factor(self.W, self.eps)

    def reference_logits(self, q: Tensor, k: Tensor) -> Tensor:
        return mahalanobis_logits(q, k, self.W.to(q.dtype), self.eps, self.tau)

    def metric_parameters(self) -> list[nn.Parameter]:
        return [self.W]


def prune_columns(A: Tensor, theta: Tensor, delta: float) -> tuple[Tensor, Tensor, Tensor]:
    """Drop the columns with ``softplus(theta_e) < delta``.

    ``A (d, m)``, ``theta (m,)`` -> ``(A[:, kept], theta[kept], kept)`` with ``kept`` the
    indices of the kept columns. The pruned metric equals the full one with the dropped
    weights set to zero.
    """
    _check_covectors(A, theta, A.shape[-2])
    if A.dim() != 2:
        raise ValueError(f"A must be (d, m), got {tuple(A.shape)}; use MatroidalAttention.pruned")
    kept = (matroidal_coefficients(theta) >= delta).nonzero().flatten()
    return A[:, kept], theta[kept], kept
