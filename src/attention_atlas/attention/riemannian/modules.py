"""The modules of Riemannian attention: factor networks for each phase, and
:class:`RiemannianAttention`, multi-head geodesic attention with every phase of the Fiber Bundle
Transformer (Song 2026, Section 5) behind a switch.

* :class:`MetricNet` (Phase A, eq. (19)): ``U_t (d, r)`` per token and head from the hidden state.
* :class:`MetricAwareProjection` (Phase A++, eq. (20)), gated.
* :class:`CurvatureProxy` (Phase B, eq. (21)), a learned scale of ``|U_t|_F^2``.
* :class:`TorsionNet` (Phase C, eq. (22)): the factors of ``T_t = L R^T - R L^T``.
* :class:`FiberTransport` (Phase D, eq. (24)): the factors of ``Delta_t``, linear or Cayley.

:class:`FiberBundleAttention` (registered ``"fiber_bundle"``) is :class:`RiemannianAttention`
whose scores are materialised by eq. (16) by default; the Fiber Bundle Transformer
(:class:`attention_atlas.models.FiberBundleConfig`) switches its phases on.
"""

from __future__ import annotations

import math
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attention_atlas.attention.base import Attention, AttentionResult, combine_masks
from attention_atlas.attention.dot import attention_from_logits, masked_softmax
from attention_atlas.profiling import phase

from . import scores as scores_module
from .diagnostics import metric_statistics
from .fast import Method, geodesic_attention
from .geometry import (
    cayley_transport_apply,
    curvature_proxy,
    metric_aware_projection,
    metric_aware_projections,
    skew_factors_apply,
    torsion_apply,
    transport_apply,
)
from .scores import Baseline, blend_weights, geodesic_scores, geodesic_scores_decomposed

__all__ = [
    "CurvatureProxy",
    "FiberBundleAttention",
    "FiberTransport",
    "MetricAwareProjection",
    "MetricNet",
    "RiemannianAttention",
    "TorsionNet",
]

METHODS = ("auto", "augmented", "sdpa", "lowrank", "reference", "decomposed")
#: ``method="auto"`` materialises eq. (16) while its scores hold at most this many numbers
#: (``B H L L``; 128 MiB in float32) and one sequence's pairwise products fit a cache-sized
#: slice (``L r 2L <= scores.PAIRWISE_CHUNK``), and takes a fast path beyond
MATERIALISED_ELEMENTS = 1 << 25
#: what trains MetricNet: the loss's gradient, or noise with no information in it (a control)
METRIC_GRADIENTS = ("task", "noise")


class _NoiseGradient(torch.autograd.Function):
    """Identity forward; backward replaces the incoming gradient by Gaussian noise (drawn from
    torch's default generator) rescaled to the same root-mean-square: zero mean, the gradient's
    size, no information about the loss."""

    @staticmethod
    def forward(ctx: Any, U: Tensor) -> Tensor:  # type: ignore[override]
        return U.view_as(U)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:  # type: ignore[override]
        noise = torch.randn_like(grad)
        return noise * (grad.pow(2).mean() / noise.pow(2).mean()).sqrt()


class _HeadFactorNet(nn.Module):
    """``Linear(D, D m) -> SiLU -> Linear(D m, n_factors H d r)``, final layer ~ N(0, std^2 / (D m))."""

    row_order: Tensor

    def __init__(
        self,
        dim: int,
        n_heads: int,
        head_dim: int,
        rank: int,
        n_factors: int,
        expansion: float,
        init_std: float,
    ) -> None:
        super().__init__()
        if rank <= 0:
            raise ValueError(f"rank must be positive, got {rank}")
        hidden = max(1, int(round(dim * expansion)))
        self.n_heads, self.head_dim, self.rank, self.n_factors = n_heads, head_dim, rank, n_factors
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, n_factors * n_heads * head_dim * rank)
        nn.init.normal_(self.fc2.weight, std=init_std / math.sqrt(hidden))
        nn.init.zeros_(self.fc2.bias)
        # fc2's outputs are numbered (factor, head, d, r); read them in the order (head,
        # factor, r, d), so that each token's r-major (r, d) blocks are contiguous
        order = torch.arange(n_factors * n_heads * head_dim * rank)
        order = order.view(n_factors, n_heads, head_dim, rank).permute(1, 0, 3, 2).reshape(-1)
        self.register_buffer("row_order", order, persistent=False)

    def hidden_output(self, x: Tensor) -> Tensor:
        """``x (B, L, D)`` -> ``(B, L, H, n_factors r d)``: fc2's outputs per head, each
        factor transposed (``U^T``, r-major)."""
        w = self.fc2.weight.index_select(0, self.row_order)
        y = F.linear(F.silu(self.fc1(x)), w, self.fc2.bias.index_select(0, self.row_order))
        return y.view(*x.shape[:-1], self.n_heads, -1)

    def factors(self, x: Tensor) -> Tensor:
        """``x (B, L, D)`` -> ``(n_factors, B, H, L, d, r)``.

        Stored ``r``-major per token (the last two dimensions are the transpose of a
        contiguous ``(r, d)`` block): one copy here, and then ``U^T x`` products and the
        flattened ``(L r, d)`` matrix of the pairwise scores need none."""
        b, seq, _ = x.shape
        f, h, d, r = self.n_factors, self.n_heads, self.head_dim, self.rank
        y = self.hidden_output(x).view(b, seq, h, f, r, d)
        return y.permute(3, 0, 2, 1, 4, 5).contiguous().transpose(-1, -2)


class MetricNet(_HeadFactorNet):
    """Phase A, eq. (19): per-token, per-head metric factors ``U_t = MetricNet(h_t)``.

    ``Linear(D, D m) -> SiLU -> Linear(D m, H d r)``; the last layer starts at
    ``N(0, init_std^2 / (D m))`` and zero bias, so ``U ~ 0`` and ``g ~ I`` at initialisation.

    Args:
        dim: hidden width D; n_heads: H; head_dim: d; rank: r; expansion: m; init_std: sigma.
    """

    def __init__(
        self,
        dim: int,
        n_heads: int,
        head_dim: int,
        rank: int = 4,
        expansion: float = 1.0,
        init_std: float = 0.02,
    ) -> None:
        super().__init__(dim, n_heads, head_dim, rank, 1, expansion, init_std)

    def forward(self, x: Tensor) -> Tensor:
        """``x (B, L, D)`` -> ``U (B, H, L, d, r)``."""
        return self.factors(x).squeeze(0)  # a view: its backward keeps the r-major layout


class TorsionNet(_HeadFactorNet):
    """Phase C, eq. (22): low-rank factors ``L_t, R_t`` of the torsion ``T_t = L R^T - R L^T``."""

    def __init__(
        self,
        dim: int,
        n_heads: int,
        head_dim: int,
        rank: int = 2,
        expansion: float = 1.0,
        init_std: float = 0.02,
    ) -> None:
        super().__init__(dim, n_heads, head_dim, rank, 2, expansion, init_std)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``x (B, L, D)`` -> ``(L_t, R_t)``, each ``(B, H, L, d, r_T)``."""
        f = self.factors(x)
        return f[0], f[1]


class FiberTransport(_HeadFactorNet):
    """Phase D transport ``P_t = I + Delta_t``, ``Delta_t = A_t B_t^T - B_t A_t^T`` (eq. (24)),
    factors from the hidden state; ``kind="cayley"`` uses the exactly orthogonal Cayley form."""

    def __init__(
        self,
        dim: int,
        n_heads: int,
        head_dim: int,
        rank: int = 2,
        expansion: float = 1.0,
        init_std: float = 0.02,
        kind: str = "linear",
    ) -> None:
        super().__init__(dim, n_heads, head_dim, rank, 2, expansion, init_std)
        if kind not in ("linear", "cayley"):
            raise ValueError(f"kind must be 'linear' or 'cayley', got {kind!r}")
        self.kind = kind

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``x (B, L, D)`` -> ``(A_t, B_t)``, each ``(B, H, L, d, r)``."""
        f = self.factors(x)
        return f[0], f[1]

    def apply_transport(self, a: Tensor, b: Tensor, y: Tensor) -> Tensor:
        """``P_t y_t`` for ``y (B, H, L, d)``."""
        if self.kind == "cayley":
            return cayley_transport_apply(a, b, y)
        return transport_apply(a, b, y)


class CurvatureProxy(nn.Module):
    """Phase B, eq. (21): ``Omega_t = softplus(beta) ||U_t||_F^2`` with a learned ``beta``."""

    def __init__(self, beta_init: float = 0.0) -> None:
        super().__init__()
        self.beta = nn.Parameter(torch.tensor(float(beta_init)))

    def forward(self, U: Tensor) -> Tensor:
        """``U (..., d, r)`` -> ``(...)``."""
        return curvature_proxy(U, self.beta)


class MetricAwareProjection(nn.Module):
    """Phase A++, eq. (20), gated: ``q + sigmoid(gamma_param) / sqrt(d) U U^T q``, ``gamma_param``
    starts at -3 (``gamma ~ 0.047``)."""

    def __init__(self, gamma_init: float = -3.0) -> None:
        super().__init__()
        self.gamma_param = nn.Parameter(torch.tensor(float(gamma_init)))

    def forward(self, q: Tensor, U: Tensor) -> Tensor:
        return metric_aware_projection(q, U, torch.sigmoid(self.gamma_param))

    def pair(self, q: Tensor, k: Tensor, U: Tensor) -> tuple[Tensor, Tensor]:
        """The projections of ``q`` and ``k`` under the same ``U``, in one pass."""
        q, k = metric_aware_projections(U, torch.sigmoid(self.gamma_param).to(U.dtype), q, k)
        return q, k


class RiemannianAttention(Attention):
    """Multi-head geodesic attention with per-token low-rank metrics from the hidden state, and
    each phase of the Fiber Bundle Transformer behind a switch.

    Each head computes ``U_t = MetricNet(x_t)`` (``(d, r)``) and attends with
    ``softmax(-(d_g^2(q_i, k_j) + Omega_i + Omega_j) / tau) v`` (eqs. (6), (15), (23)), blended
    with a baseline by ``alpha`` (eq. (27)), then transports each output (eq. (24)).

    Args:
        rank: metric rank r.
        tau: temperature (default ``sqrt(2 * head_dim)``, as :class:`EuclideanAttention`, so that
            at ``U = 0`` the two variants agree).
        alpha, baseline: hybrid blending (eq. (27)); ``alpha=1`` is fully Riemannian.
        metric_expansion, metric_init_std: MetricNet's ``m`` and initial scale.
        curvature: Phase B, the curvature proxy (eq. (21)) added to the distance (eq. (23)).
        metric_projection: Phase A++, metric-aware projection of q and k (eq. (20), gated).
        transport_rank: if > 0, Phase D transport of each head's output by ``P_i = I + Delta_i``
            (eq. (24)).
        transport_kind: ``"linear"`` or ``"cayley"``.
        torsion_rank: if > 0, Phase C: add ``gamma_T T_i`` to the transport (``P' = P + gamma_T
            T``, or ``I + gamma_T T`` without transport), gate starting at ``sigmoid(-3)``.
        method: ``"decomposed"`` (materialised scores by eq. (16),
            :func:`~attention_atlas.attention.riemannian.scores.geodesic_scores_decomposed`:
            cheapest at short lengths), or a method of :func:`geodesic_attention` (fast paths).
            ``"auto"`` is ``"decomposed"`` while its scores and one sequence's ``(L r, 2L)``
            products stay small (:data:`MATERIALISED_ELEMENTS`; fewer FLOPs per pair than
            any fast path: ``(2 r + 1) d`` against the augmented ``d^2 + 3 d + 1``), else
            :func:`geodesic_attention`'s own choice.
            With ``need_weights=True`` the scores are materialised (by eq. (16) for
            ``"decomposed"``, else by the reference eq. (15)).
        metric: Phase A. False: ``U = 0`` (MetricNet is kept but unused, so parameter counts of
            an ablation are comparable; its parameters get no gradient).
        geodesic: Phase D. False: the scores have no metric term (``U`` replaced by 0 and no
            curvature in the distance, only the baseline remains) and no transport.
        metric_gradient: ``"task"``, or ``"noise"``: a control in which the gradient MetricNet's
            weights receive through ``U`` (the regularisers' too) is replaced by Gaussian noise
            of the same shape and root-mean-square as the true one, so their optimiser sees
            gradients of the right size with no information in them; the hidden state still
            gets the true gradient through ``U``, and the forward pass is unchanged.

    Extras returned: ``metric_factor (B, H, L, d, r)``, ``curvature (B, H, L)`` with Phase B,
    ``transport_a``/``transport_b`` (the factors of ``Delta``) and ``torsion_l``/``torsion_r``;
    with ``need_weights`` also ``query``/``key`` (``(B, H, L, d)``, as they enter the scores).
    Diagnostics: :func:`~attention_atlas.attention.riemannian.diagnostics.metric_statistics`
    (``metric_kappa_mean``, ``_var``, ``_max``) on a forward that is not a training step (eval
    mode, or no autograd); a training step, which nothing monitors, does not pay for them.
    """

    name = "riemannian"

    def __init__(
        self,
        dim: int,
        n_heads: int,
        rank: int = 4,
        tau: float | None = None,
        alpha: float = 1.0,
        baseline: str = "distance",
        metric_expansion: float = 1.0,
        metric_init_std: float = 0.02,
        curvature: bool = False,
        metric_projection: bool = False,
        transport_rank: int = 0,
        transport_kind: str = "linear",
        torsion_rank: int = 0,
        method: str = "auto",
        metric: bool = True,
        geodesic: bool = True,
        metric_gradient: str = "task",
        **kwargs: Any,
    ) -> None:
        super().__init__(dim, n_heads, **kwargs)
        if metric_gradient not in METRIC_GRADIENTS:
            raise ValueError(
                f"metric_gradient must be one of {METRIC_GRADIENTS}, got {metric_gradient!r}"
            )
        self.metric_gradient = metric_gradient
        self.rank = int(rank)
        self.tau = float(tau) if tau is not None else (2.0 * self.head_dim) ** 0.5
        if self.tau <= 0:
            raise ValueError(f"tau must be positive, got {tau}")
        blend_weights(alpha, baseline)  # validates
        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}; known: {', '.join(METHODS)}")
        self.alpha, self.baseline, self.method = float(alpha), baseline, method
        self.use_metric, self.use_geodesic = bool(metric), bool(geodesic)
        self.metric_net = MetricNet(
            dim, n_heads, self.head_dim, self.rank, metric_expansion, metric_init_std
        )
        self.curvature = CurvatureProxy() if curvature else None
        self.projection = MetricAwareProjection() if metric_projection else None
        self.transport = (
            FiberTransport(dim, n_heads, self.head_dim, transport_rank, kind=transport_kind)
            if transport_rank > 0
            else None
        )
        self.torsion = (
            TorsionNet(dim, n_heads, self.head_dim, torsion_rank) if torsion_rank > 0 else None
        )
        self.torsion_gate = nn.Parameter(torch.tensor(-3.0)) if torsion_rank > 0 else None

    def metric_parameters(self) -> list[nn.Parameter]:
        mods: list[nn.Module] = [self.metric_net]
        for m in (self.curvature, self.projection, self.transport, self.torsion):
            if m is not None:
                mods.append(m)
        params = [p for m in mods for p in m.parameters()]
        if self.torsion_gate is not None:
            params.append(self.torsion_gate)
        return params

    def metric_factor(self, x: Tensor, dtype: torch.dtype) -> Tensor:
        """``U (B, H, L, d, r)`` from ``x (B, L, D)`` (zeros when Phase A is off)."""
        if not self.use_metric:
            return torch.zeros_like(self.metric_net(x).to(dtype))
        if self.metric_gradient == "task":
            return self.metric_net(x).to(dtype)
        # "noise": MetricNet's weights get noise (through U_w, input detached); the input x still
        # gets the task's gradient (through U_x, weights detached); U_x - U_x.detach() is 0
        U_w = _NoiseGradient.apply(self.metric_net(x.detach()).to(dtype))
        frozen = {n: p.detach() for n, p in self.metric_net.named_parameters()}
        U_x = torch.func.functional_call(self.metric_net, frozen, (x,)).to(dtype)
        return U_w + (U_x - U_x.detach())

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
        with phase("metric_net"):
            U = self.metric_factor(x, q.dtype)  # (B, H, L, d, r), Phase A
        if self.projection is not None:  # Phase A++
            with phase("metric_projection"):
                q, k = self.projection.pair(q, k, U)
        omega = None
        if self.curvature is not None:  # Phase B
            with phase("curvature"):
                omega = self.curvature(U)  # (B, H, L)
        U_s = U if self.use_geodesic else torch.zeros_like(U)  # Phase D scores
        omega_s = omega if self.use_geodesic else None
        with phase("geodesic_scores"):
            res = self._aggregate(q, k, v, U_s, omega_s, causal, mask, need_weights)
        extras: dict[str, Tensor] = {"metric_factor": U}
        if need_weights:
            extras["query"], extras["key"] = q, k
        if omega is not None:
            extras["curvature"] = omega
        out = self._transport(x, res.out, extras)  # Phases D and C
        if not (self.training and torch.is_grad_enabled()):  # monitoring, read at evaluation
            with phase("metric_statistics"):
                res.diagnostics.update(metric_statistics(U))
        return AttentionResult(out, res.probs, res.diagnostics, extras)

    def _aggregate(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        U: Tensor,
        omega: Tensor | None,
        causal: bool,
        mask: Tensor | None,
        need_weights: bool,
    ) -> AttentionResult:
        """``softmax(scores) v`` per head, ``(B, H, L, d)``: materialised (eq. (16) or (15)) for
        ``method="decomposed"`` or ``need_weights``, else by :func:`geodesic_attention`."""
        alpha, baseline = self.alpha, cast(Baseline, self.baseline)
        method = self.method
        seq, r = k.shape[-2], U.shape[-1]
        fits = q.numel() // q.shape[-1] * seq <= MATERIALISED_ELEMENTS  # B H L L scores
        if method == "auto" and fits and seq * r * 2 * seq <= scores_module.PAIRWISE_CHUNK:
            method = "decomposed"  # (B, H, L, r, 2L) products of eq. (16)
        if need_weights:  # logits (B, H, L, L), every entry
            scores = geodesic_scores_decomposed if method == "decomposed" else geodesic_scores
            logits = scores(q, k, U, self.tau, curvature=omega, alpha=alpha, baseline=baseline)
            return attention_from_logits(logits, v, causal=causal, mask=mask)
        if method == "decomposed":  # under a causal mask, the pairs j <= i only
            fused = causal and mask is None  # then the causal softmax with the scores, one pass
            out = geodesic_scores_decomposed(q, k, U, self.tau, curvature=omega, alpha=alpha,
                                             baseline=baseline, causal=causal, softmax=fused)  # fmt: skip
            if fused:  # probabilities (B, H, L, L)
                return AttentionResult(out @ v)
            logits = out
            keep = combine_masks(
                q.shape[-2], k.shape[-2], causal=causal, mask=mask, device=q.device
            )
            return AttentionResult(masked_softmax(logits, keep) @ v)
        out = geodesic_attention(q, k, v, U, self.tau, causal, mask=mask, curvature=omega,
                                 alpha=alpha, baseline=baseline, method=cast(Method, method))  # fmt: skip
        return AttentionResult(out)

    def _transport(self, x: Tensor, out: Tensor, extras: dict[str, Tensor]) -> Tensor:
        """``P_i out_i`` (Phase D, eq. (24)) plus ``gamma_T T_i out_i`` (Phase C); the factors go
        to ``extras``. ``x (B, L, D)``, ``out (B, H, L, d)``. Linear transport and torsion of the
        same rank go in one pass (:func:`skew_factors_apply`), their factors laid out per token."""
        moved = out
        transport = self.transport if self.use_geodesic else None
        torsion, gate = self.torsion, self.torsion_gate
        nets = [m for m in (transport, torsion) if m is not None]
        if (not nets or (transport is not None and transport.kind != "linear")
                or len({m.rank for m in nets}) > 1):  # fmt: skip
            return self._transport_separately(x, out, extras)
        raw, weights = [], []
        if transport is not None:
            with phase("transport"):
                raw.append(transport.hidden_output(x))
                weights.append(out.new_ones(()))
        if torsion is not None and gate is not None:
            with phase("torsion"):
                raw.append(torsion.hidden_output(x))
                weights.append(torch.sigmoid(gate).to(out.dtype))
        with phase("transport"):  # per token in the order (B, L, H) of x and of the output
            b, h, seq, d = out.shape
            r = nets[0].rank
            pairs = [f.to(out.dtype).view(b, seq, h, 2, r, d) for f in raw]  # (L^T, R^T) per net
            moved = skew_factors_apply(pairs, out.transpose(1, 2), torch.stack(weights))
            moved = moved.transpose(1, 2)  # (B, H, L, d), heads merged next without a copy
        factors = [f.transpose(1, 2) for p in pairs for f in p.transpose(-1, -2).unbind(-3)]
        names = ["transport_a", "transport_b"] if transport is not None else []
        names += ["torsion_l", "torsion_r"] if torsion is not None else []
        extras.update(zip(names, factors))
        return moved

    def _transport_separately(self, x: Tensor, out: Tensor, extras: dict[str, Tensor]) -> Tensor:
        """:meth:`_transport` one phase at a time (Cayley transport, ranks that differ)."""
        moved = out
        if self.transport is not None and self.use_geodesic:
            with phase("transport"):
                a, b = self.transport(x)
                moved = self.transport.apply_transport(a, b, out)
            extras["transport_a"], extras["transport_b"] = a, b
        if self.torsion is not None and self.torsion_gate is not None:
            with phase("torsion"):
                lt, rt = self.torsion(x)
                moved = moved + torch.sigmoid(self.torsion_gate) * torsion_apply(lt, rt, out)
            extras["torsion_l"], extras["torsion_r"] = lt, rt
        return moved

    def extra_repr(self) -> str:
        return (
            super().extra_repr()
            + f", rank={self.rank}, tau={self.tau:.3g}, alpha={self.alpha}, baseline={self.baseline}"
        )


class FiberBundleAttention(RiemannianAttention):
    """:class:`RiemannianAttention` as the Fiber Bundle Transformer uses it: scores materialised
    by eq. (16) (``method="decomposed"``, the fastest at the short lengths of chapter 4); the
    phases are switched on by :class:`attention_atlas.models.FiberBundleConfig`."""

    name = "fiber_bundle"

    def __init__(self, dim: int, n_heads: int, method: str = "decomposed", **kwargs: Any) -> None:
        super().__init__(dim, n_heads, method=method, **kwargs)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", metric={self.use_metric}, geodesic={self.use_geodesic}"
