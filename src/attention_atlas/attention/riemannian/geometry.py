"""The phase operators of the Fiber Bundle Transformer (Song 2026, Section 5), eqs. (20) to (26).

Each works per token on low-rank factors ``(..., d, r)`` without forming ``d x d`` matrices
(the ``*_dense`` forms are the references they are tested against):

* metric strength ``kappa_t = |U_t|_F^2`` and the curvature proxy ``Omega_t = softplus(beta) kappa_t``
  (Phase B, eq. (21));
* metric-aware projection ``q + gamma / sqrt(d) U U^T q`` (Phase A++, eq. (20));
* torsion ``T = L R^T - R L^T`` (Phase C, eq. (22));
* transport ``P = I + Delta``, ``Delta = A B^T - B A^T`` (Phase D, eq. (24)), its isometry defect
  ``|P^T P - I|_F`` (eq. (25)) and the exactly orthogonal Cayley form;
* the metric-preconditioned update ``h + g^{-1} update`` (Phase E, eq. (26)), by Woodbury.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from attention_atlas import native
from attention_atlas.linalg import metric_inverse_apply, serial_lu

__all__ = [
    "cayley_transport_apply",
    "check_curvature",
    "check_metric_inputs",
    "curvature_proxy",
    "factor_apply",
    "factor_rows",
    "factor_t_apply",
    "isometry_defect",
    "metric_aware_projection",
    "metric_aware_projections",
    "metric_preconditioned_update",
    "metric_strength",
    "skew_factors_apply",
    "torsion_apply",
    "torsion_dense",
    "transport_apply",
    "transport_dense",
]


def factor_t_apply(U: Tensor, x: Tensor) -> Tensor:
    """``U_t^T x_t`` per token: ``U (..., d, r)``, ``x (..., d)`` -> ``(..., r)``. Broadcast
    products and a sum (many tiny matrix products are slower than one elementwise pass)."""
    return (U * x.unsqueeze(-1)).sum(-2)


def factor_apply(U: Tensor, c: Tensor) -> Tensor:
    """``U_t c_t`` per token: ``U (..., d, r)``, ``c (..., r)`` -> ``(..., d)``."""
    return (U * c.unsqueeze(-2)).sum(-1)


def factor_rows(U: Tensor, *, per_sequence: bool = False) -> Tensor:
    """``U_t^T`` token by token, the layout the native kernels read: ``(N, r, d)`` for ``U (...,
    d, r)``, or ``(N, L, r, d)`` with ``per_sequence`` (``U (..., L, d, r)``). A view when ``U``
    is stored r-major, as MetricNet stores it; else a copy."""
    d, r = U.shape[-2:]
    ut = U.transpose(-1, -2)
    return ut.reshape(-1, U.shape[-3], r, d) if per_sequence else ut.reshape(-1, r, d)


def metric_strength(U: Tensor) -> Tensor:
    """``kappa_t = ||U_t||_F^2`` (the paper's metric strength): ``(..., d, r)`` -> ``(...)``."""
    ut = U.transpose(-1, -2)
    if ut.is_contiguous() and native.active(U, since=2):  # one pass (native level 2)
        from attention_atlas.native.functions import MetricStrength

        return MetricStrength.apply(ut.reshape(-1, U.shape[-1] * U.shape[-2])).view(U.shape[:-2])
    return (U * U).sum((-1, -2))


def curvature_proxy(U: Tensor, beta: Tensor | float) -> Tensor:
    """Curvature proxy ``Omega_t = softplus(beta) ||U_t||_F^2`` (eq. (21)): ``(..., d, r)`` -> ``(...)``."""
    beta_t = torch.as_tensor(beta, dtype=U.dtype, device=U.device)
    return F.softplus(beta_t) * metric_strength(U)


def metric_aware_projection(q: Tensor, U: Tensor, gamma: Tensor | float) -> Tensor:
    """Phase A++, eq. (20): ``q + gamma / sqrt(d) * U U^T q`` for ``q (..., d)``, ``U (..., d, r)``.

    (The extracted text of eq. (20) reads ``gamma . 1 d``; we take the lost radical as
    ``1 / sqrt(d)``, like the paper's other scalings.) ``gamma`` is the gate, already squashed.
    """
    if U.shape[:-2] != q.shape[:-1] or U.shape[-2] != q.shape[-1]:  # broadcasting
        scale = gamma / math.sqrt(q.shape[-1])
        return q + scale * factor_apply(U, factor_t_apply(U, q))
    return metric_aware_projections(U, gamma, q)[0]


def metric_aware_projections(U: Tensor, gamma: Tensor | float, *xs: Tensor) -> tuple[Tensor, ...]:
    """:func:`metric_aware_projection` of several vectors per token under the same metric (the
    query and the key), in one pass with a written-out backward (:class:`_MetricProjection`).
    ``U (..., d, r)``, each ``x (..., d)`` with the same batch dimensions."""
    d, r = U.shape[-2:]
    for x in xs:
        if x.shape != U.shape[:-1]:
            raise ValueError(
                f"x must have shape {tuple(U.shape[:-1])} to match U, got {tuple(x.shape)}"
            )
    scale = torch.as_tensor(gamma / math.sqrt(d), dtype=U.dtype, device=U.device)
    ut = factor_rows(U)
    if native.active(ut, *xs):  # the native kernel (opt-in), each x read where it lies
        from attention_atlas.native.functions import MetricProjection

        tokens = [x if x.dim() == 4 and x.stride(-1) == 1 else x.reshape(-1, d).contiguous()
                  for x in xs]  # fmt: skip
        ys = MetricProjection.apply(ut.contiguous(), scale, *tokens)
        return tuple(y.view(x.shape) for x, y in zip(xs, ys))
    flat = [x.reshape(-1, d) for x in xs]
    ys = _MetricProjection.apply(ut, scale, *flat)
    return tuple(y.view(x.shape) for x, y in zip(xs, ys))


class _MetricProjection(torch.autograd.Function):
    """``y = x + s U (U^T x)`` per token for each ``x (N, d)``, ``ut (N, r, d)`` (``U^T``), ``s
    ()``, with the backward written out: ``dx = g + s U U^T g``, ``dU^T = s sum_x (c g^T + e
    x^T)`` and ``ds = sum e.c``, where ``c = U^T x`` and ``e = U^T g``."""

    @staticmethod
    def forward(ctx, ut: Tensor, s: Tensor, *xs: Tensor) -> tuple[Tensor, ...]:  # type: ignore[override]
        cs = [torch.bmm(ut, x.unsqueeze(-1)) for x in xs]  # (N, r, 1) each
        ctx.save_for_backward(ut, s, *xs, *cs)
        return tuple(x + s * (c * ut).sum(1) for x, c in zip(xs, cs))

    @staticmethod
    def backward(ctx, *gs: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        ut, s, *rest = ctx.saved_tensors
        xs, cs = rest[: len(gs)], rest[len(gs) :]
        dxs: list[Tensor | None] = []
        dut, ds = torch.zeros_like(ut), s.new_zeros(())
        for x, c, g in zip(xs, cs, gs):
            if g is None:
                dxs.append(None)
                continue
            e = torch.bmm(ut, g.unsqueeze(-1))  # (N, r, 1)
            dxs.append(g + s * (e * ut).sum(1))
            dut.addcmul_(c, g.unsqueeze(1)).addcmul_(e, x.unsqueeze(1))
            ds = ds + (e * c).sum()
        return (dut.mul_(s), ds.reshape(s.shape), *dxs)


def torsion_apply(left: Tensor, right: Tensor, x: Tensor) -> Tensor:
    """``T x`` with ``T = L R^T - R L^T`` (eq. (22)), ``O(d r_T)``: ``left, right (..., d, r_T)``, ``x (..., d)``."""
    return factor_apply(left, factor_t_apply(right, x)) - factor_apply(
        right, factor_t_apply(left, x)
    )


def torsion_dense(left: Tensor, right: Tensor) -> Tensor:
    """Dense antisymmetric ``T = L R^T - R L^T`` (eq. (22)), ``(..., d, d)``."""
    return left @ right.transpose(-1, -2) - right @ left.transpose(-1, -2)


def transport_dense(a: Tensor, b: Tensor, kind: str = "linear") -> Tensor:
    """Dense transport: ``P = I + Delta`` (eq. (24)) or the Cayley form
    ``(I - Delta/2)^{-1} (I + Delta/2)``, ``Delta = A B^T - B A^T``. ``(..., d, d)``."""
    delta = torsion_dense(a, b)
    eye = torch.eye(a.shape[-2], dtype=a.dtype, device=a.device)
    if kind == "linear":
        return eye + delta
    if kind == "cayley":
        lhs = eye - delta / 2
        with serial_lu(lhs):
            return torch.linalg.solve(lhs, eye + delta / 2)
    raise ValueError(f"kind must be 'linear' or 'cayley', got {kind!r}")


def transport_apply(a: Tensor, b: Tensor, x: Tensor) -> Tensor:
    """``P x = x + Delta x`` with ``Delta = A B^T - B A^T`` (eq. (24)), ``O(d r)``."""
    return x + torsion_apply(a, b, x)


class _SkewFactorsApply(torch.autograd.Function):
    """``y = x + sum_p w_p (L_p R_p^T - R_p L_p^T) x`` per token: ``wt (N, 2P, r, d)`` (the
    transposed factors ``L_1^T, R_1^T, L_2^T, ...``), ``x (N, d)``, ``w (P,)``. With ``c = W^T x``
    and ``e = W^T g`` per factor, the backward is written out: ``dx = g - sum_p w_p T_p g``,
    ``dL^T = w (c_R g^T - e_R x^T)``, ``dR^T = w (e_L x^T - c_L g^T)``, ``dw = sum e_L.c_R -
    e_R.c_L``."""

    @staticmethod
    def forward(ctx, wt: Tensor, x: Tensor, w: Tensor) -> Tensor:  # type: ignore[override]
        n, p2, r, d = wt.shape
        flat = wt.view(n, p2 * r, d)
        c = torch.bmm(flat, x.unsqueeze(-1)).view(n, p2 // 2, 2, r)  # L^T x, R^T x
        cm = torch.stack([c[:, :, 1], -c[:, :, 0]], 2) * w.view(1, -1, 1, 1)
        ctx.save_for_backward(wt, x, w, c, cm)
        return x + (cm.view(n, p2 * r, 1) * flat).sum(1)

    @staticmethod
    def backward(ctx, g: Tensor) -> tuple[Tensor, Tensor, Tensor]:  # type: ignore[override]
        wt, x, w, c, cm = ctx.saved_tensors
        n, p2, r, d = wt.shape
        flat = wt.view(n, p2 * r, d)
        e = torch.bmm(flat, g.unsqueeze(-1)).view(n, p2 // 2, 2, r)  # L^T g, R^T g
        dm = (torch.stack([e[:, :, 1], -e[:, :, 0]], 2) * w.view(1, -1, 1, 1)).view(n, p2 * r, 1)
        dx = g - (dm * flat).sum(1)
        dwt = (cm.view(n, p2 * r, 1) * g.unsqueeze(1)).addcmul_(dm, x.unsqueeze(1), value=-1)
        dw = (e[:, :, 0] * c[:, :, 1] - e[:, :, 1] * c[:, :, 0]).sum((0, 2))
        return dwt.view(n, p2, r, d), dx, dw


def skew_factors_apply(wt: Tensor | Sequence[Tensor], x: Tensor, w: Tensor) -> Tensor:
    """``x + sum_p w_p (L_p R_p^T - R_p L_p^T) x``: the transport ``P x = x + Delta x`` (eq. (24),
    ``w = 1``) and the torsion ``gamma_T T x`` (eq. (22)) of the same vector in one pass, as
    :func:`transport_apply` plus ``w`` times :func:`torsion_apply` (the references).

    ``wt (..., 2P, r, d)``: per token the transposed factors ``L_1^T, R_1^T, L_2^T, R_2^T, ...``,
    or a sequence of ``P`` tensors ``(..., 2, r, d)``, one per pair (the native kernel reads them
    where they are, with no stacked copy); ``x (..., d)``; ``w (P,)``. Returns ``(..., d)``;
    backward written out, ``O(P d r)`` per token.
    """
    pairs = [wt] if isinstance(wt, Tensor) else list(wt)
    *batch, p2, r, d = pairs[0].shape
    shapes = {(*t.shape[:-3], t.shape[-2], t.shape[-1]) for t in pairs}
    p2 = sum(t.shape[-3] for t in pairs)
    if (len(shapes) > 1 or p2 % 2 or (len(pairs) > 1 and any(t.shape[-3] != 2 for t in pairs))
            or w.shape != (p2 // 2,) or list(x.shape) != [*batch, d]):  # fmt: skip
        raise ValueError(
            f"wt must be (..., 2P, r, d) or P tensors (..., 2, r, d), x (..., d) and w (P,), got "
            f"{[tuple(t.shape) for t in pairs]}, {tuple(x.shape)}, {tuple(w.shape)}"
        )
    if native.active(x, w, *pairs) and r <= native.MAX_RANK:  # the native kernel (opt-in)
        from attention_atlas.native.functions import SkewFactorsApply

        x4 = x if x.dim() == 4 and x.stride(-1) == 1 else x.reshape(-1, 1, 1, d)
        flat = [t.reshape(*x4.shape[:3], t.shape[-3], r, d).contiguous() for t in pairs]
        return SkewFactorsApply.apply(x4, w, *flat).view(x.shape)
    stacked = pairs[0] if len(pairs) == 1 else torch.stack(pairs, -4).flatten(-4, -3)
    y = _SkewFactorsApply.apply(stacked.reshape(-1, p2, r, d).contiguous(), x.reshape(-1, d), w)
    return y.view(x.shape)


def _symplectic(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """``W = [A, B] (..., d, 2r)`` and ``J = [[0, I], [-I, 0]]`` with ``Delta = W J W^T``."""
    r = a.shape[-1]
    w = torch.cat([a, b], dim=-1)  # (..., d, 2r)
    zero = torch.zeros(r, r, dtype=a.dtype, device=a.device)
    eye = torch.eye(r, dtype=a.dtype, device=a.device)
    j = torch.cat([torch.cat([zero, eye], 1), torch.cat([-eye, zero], 1)], 0)
    return w, j


def cayley_transport_apply(a: Tensor, b: Tensor, x: Tensor) -> Tensor:
    """Exactly orthogonal transport ``(I - Delta/2)^{-1} (I + Delta/2) x`` in ``O(d r^2)``.

    ``Delta = W J W^T`` with ``W = [A, B] (d, 2r)`` and ``J = [[0, I], [-I, 0]]``; Woodbury gives
    ``(I - W J W^T / 2)^{-1} = I - W (2 J + W^T W)^{-1} W^T`` (a ``2r x 2r`` solve per token).
    ``a, b (..., d, r)``, ``x (..., d)`` -> ``(..., d)``.
    """
    y = x + 0.5 * torsion_apply(a, b, x)
    r = a.shape[-1]
    w, j = _symplectic(a, b)
    cap = 2 * j + w.transpose(-1, -2) @ w  # (..., 2r, 2r)
    wy = w.transpose(-1, -2) @ y.unsqueeze(-1)
    shape = torch.broadcast_shapes(cap.shape[:-2], wy.shape[:-2])
    coef = torch.linalg.solve(cap.expand(*shape, 2 * r, 2 * r), wy.expand(*shape, 2 * r, 1))
    return y - (w @ coef).squeeze(-1)


def isometry_defect(a: Tensor, b: Tensor) -> Tensor:
    """``||P^T P - I||_F = ||Delta^T Delta||_F`` for ``P = I + Delta`` (eq. (25)), low rank.

    With ``Delta = W J W^T`` and ``G = W^T W``: ``Delta^T Delta = W K W^T``, ``K = -J G J``, so
    ``||Delta^T Delta||_F^2 = tr(K G K G)``; ``O(d r^2)``, no ``d x d`` matrix. Note that for an
    antisymmetric ``Delta`` this is at most ``||Delta||_F^2 / sqrt(2)``, not equal to
    ``||Delta||_F^2`` as eq. (25)'s text says (singular values of ``Delta`` come in pairs).
    ``a, b (..., d, r)`` -> ``(...)``.
    """
    w, j = _symplectic(a, b)
    g = w.transpose(-1, -2) @ w
    kmat = -(j @ g @ j)
    kg = kmat @ g
    return torch.sqrt((kg * kg.transpose(-1, -2)).sum((-1, -2)).clamp_min(0))


class _WoodburyApply(torch.autograd.Function):
    """``y = (I + U U^T)^{-1} x`` for ``ut = U^T (N, r, d)``, ``x (N, d)``, with the backward
    written out: ``dx = g^{-1} dy`` (``g`` is symmetric) and ``dU = -(w (U^T y)^T + y (U^T
    w)^T)`` with ``w = g^{-1} dy``, both from the forward's inverse of the ``r x r``
    capacitance ``I + U^T U`` (symmetric, eigenvalues at least 1). Per-token products as batched
    matrix-vector products on ``U^T`` (contiguous when ``U`` is stored r-major)."""

    @staticmethod
    def forward(ctx, ut: Tensor, x: Tensor) -> Tensor:  # type: ignore[override]
        cap = torch.bmm(ut, ut.transpose(1, 2))
        cap.diagonal(dim1=1, dim2=2).add_(1.0)  # I + U^T U  (N, r, r), eigenvalues >= 1
        cap_inv = torch.linalg.inv_ex(cap)[0]
        y = _woodbury_solve(ut, cap_inv, x)
        ctx.save_for_backward(ut, cap_inv, y)
        return y

    @staticmethod
    def backward(ctx, dy: Tensor) -> tuple[Tensor, Tensor]:  # type: ignore[override]
        ut, cap_inv, y = ctx.saved_tensors
        w = _woodbury_solve(ut, cap_inv, dy)
        uty, utw = torch.bmm(ut, y.unsqueeze(-1)), torch.bmm(ut, w.unsqueeze(-1))  # (N, r, 1)
        d_ut = (uty * w.unsqueeze(1)).addcmul_(utw, y.unsqueeze(1)).neg_()  # (N, r, d)
        return d_ut, w


def _woodbury_solve(ut: Tensor, cap_inv: Tensor, x: Tensor) -> Tensor:
    """``x - U (I + U^T U)^{-1} U^T x`` given the inverse of ``I + U^T U``."""
    coef = torch.bmm(cap_inv, torch.bmm(ut, x.unsqueeze(-1)))  # (N, r, 1)
    return x - (coef * ut).sum(1)


def metric_preconditioned_update(h: Tensor, U: Tensor, update: Tensor) -> Tensor:
    """Phase E, eq. (26): ``h + g^{-1} update`` with ``g = I + U U^T`` by Woodbury, ``O(d r^2)``.

    ``h, update (..., d)``, ``U (..., d, r)`` with the same batch dimensions (one metric per
    vector). The same maths as :func:`attention_atlas.linalg.metric_inverse_apply` (the
    reference it is tested against), with its backward written out (:class:`_WoodburyApply`):
    one inverse of ``I_r + U^T U`` per token serves both passes.
    """
    if U.shape[:-2] != update.shape[:-1] or U.shape[-2] != update.shape[-1]:
        return h + metric_inverse_apply(U, update)  # broadcasting: the reference path
    d, r = U.shape[-2:]
    ut = factor_rows(U)
    if native.active(ut, update) and r <= native.MAX_RANK:  # the native kernel (opt-in)
        from attention_atlas.native.functions import WoodburyApply

        flat = WoodburyApply.apply(ut.contiguous(), update.reshape(-1, d).contiguous())
        return h + flat.view(update.shape)
    flat = _WoodburyApply.apply(ut, update.reshape(-1, d))
    return h + flat.view(update.shape)


# -- input checks of the score functions -------------------------------------------------------


def check_metric_inputs(q: Tensor, k: Tensor, U: Tensor, tau: float) -> None:
    """``q, k (..., L, d)``, ``U (..., L, d, r)``: same batch dims, same L, same d, same dtype."""
    for name, t in (("q", q), ("k", k), ("U", U)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
    if q.dim() < 2 or k.shape != q.shape:
        raise ValueError(
            f"q and k must have the same shape (..., L, d), got q {tuple(q.shape)}, k {tuple(k.shape)}"
        )
    if U.dim() != q.dim() + 1 or U.shape[:-1] != q.shape:
        raise ValueError(
            f"U must have shape (..., L, d, r) = {tuple(q.shape)} + (r,) to match q, "
            f"got {tuple(U.shape)}"
        )
    if not (q.dtype == k.dtype == U.dtype):
        raise ValueError(f"q, k, U must share a dtype, got {q.dtype}, {k.dtype}, {U.dtype}")
    if not (isinstance(tau, (int, float)) and math.isfinite(tau) and tau > 0):
        raise ValueError(f"tau must be a positive finite number, got {tau!r}")


def check_curvature(curvature: Tensor | None, q: Tensor) -> None:
    """``curvature`` is None or ``Omega (..., L)`` matching ``q (..., L, d)``."""
    if curvature is not None and curvature.shape != q.shape[:-1]:
        raise ValueError(
            f"curvature must have shape (..., L) = {tuple(q.shape[:-1])}, got {tuple(curvature.shape)}"
        )
