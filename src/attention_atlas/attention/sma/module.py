"""SSM attention: Mamba-2's state-space model as a causal attention variant (``"ssm"``)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attention_atlas.attention.base import Attention, AttentionResult, check_tensor, count_nonfinite

from ._checks import shape_of
from .duality import SSD_METHODS, ssd, ssd_matrix, ssd_step

__all__ = ["ROW_STOCHASTIC_TOL", "SSMAttention", "is_row_stochastic"]

#: tolerance of :func:`is_row_stochastic` on row sums and on negative entries
ROW_STOCHASTIC_TOL = 1e-6


def is_row_stochastic(W: Tensor, tol: float = ROW_STOCHASTIC_TOL) -> Tensor:
    """Whether every row of ``W (..., L, L)`` is a probability distribution: entries
    ``>= -tol`` and row sums within ``tol`` of one. A boolean scalar tensor."""
    return (W >= -tol).all() & ((W.sum(-1) - 1).abs() <= tol).all()


class SSMAttention(Attention):
    """Mamba-2-style SSM as causal attention: queries as C, keys as B, values as x.

    Per head, with ``dt_t = softplus(w . x_t + b)`` computed from the hidden state and a learned
    rate ``A = -exp(A_log) < 0`` (Mamba-2's parametrisation), the layer computes

        y_t = sum_{s<=t} scale (q_t . k_s) exp(A (dt_{s+1} + ... + dt_t)) dt_s v_s

    with :func:`ssd` (``log_a = A dt``, ``x = dt v``), in linear time and memory.

    The weights are not a softmax: rows do not sum to one and entries can be negative.
    ``need_weights=True`` materialises ``W_ts = scale (q_t . k_s) exp(A (...)) dt_s`` so that
    ``out = W v`` exactly, and reports it as ``probs`` (probability-*like*, for plots); its
    diagnostics carry ``row_stochastic`` (1 if every row of ``W`` is a probability distribution,
    nonnegative and summing to one within ``ROW_STOCHASTIC_TOL``, else 0: measured on ``W``,
    so 0 in practice), the mean row sum and the fraction of negative causal entries, besides
    ``nonfinite_logits`` (non-finite causal entries of ``W``).

    Only causal use is defined: a state-space recurrence runs forward in time, so
    ``causal=False`` and explicit masks raise ``ValueError``.

    Args:
        method: :func:`ssd` method for the forward pass (``"chunked"`` by default).
        chunk_size: chunk length of the chunked method.
        scale: factor on ``q . k`` (default ``1 / sqrt(head_dim)``, as dot-product attention).
        dt_min, dt_max: the initial ``dt`` is log-uniform in this range (via the bias).
        a_init_range: the initial rates ``-A`` are uniform in this range.
    """

    name = "ssm"

    def __init__(
        self,
        dim: int,
        n_heads: int,
        method: str = "chunked",
        chunk_size: int = 64,
        scale: float | None = None,
        dt_min: float = 1e-3,
        dt_max: float = 0.1,
        a_init_range: tuple[float, float] = (1.0, 16.0),
        **kwargs,
    ) -> None:
        super().__init__(dim, n_heads, **kwargs)
        if method not in SSD_METHODS:
            raise ValueError(f"method must be one of {SSD_METHODS}, got {method!r}")
        if not 0.0 < dt_min <= dt_max:
            raise ValueError(f"need 0 < dt_min <= dt_max, got dt_min={dt_min}, dt_max={dt_max}")
        lo, hi = a_init_range
        if not 0.0 < lo <= hi:
            raise ValueError(f"a_init_range must satisfy 0 < lo <= hi, got {a_init_range}")
        self.method, self.chunk_size = method, int(chunk_size)
        self.scale = float(scale) if scale is not None else self.head_dim**-0.5
        self.dt_proj = nn.Linear(dim, n_heads, bias=True)  # x_t -> dt_t (before softplus)
        with torch.no_grad():
            dt = torch.exp(
                torch.rand(n_heads) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min)
            )
            self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus^{-1}(dt)
        self.A_log = nn.Parameter(torch.log(torch.empty(n_heads).uniform_(lo, hi)))

    def metric_parameters(self) -> list[nn.Parameter]:
        """The decay parameters (they define the mask ``L``): ``A_log`` and the dt projection."""
        return [self.A_log, *self.dt_proj.parameters()]

    def decay(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``x (B, L, D)`` -> ``(dt, log_a)``, both ``(B, L, H)``; ``log_a = -exp(A_log) dt``."""
        dt = F.softplus(self.dt_proj(x))
        return dt, -torch.exp(self.A_log) * dt

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
        if not causal:
            raise ValueError(
                "ssm attention is causal by construction (a state-space recurrence runs forward "
                "in time); got causal=False. Use it only in causal models (task='lm')."
            )
        if mask is not None:
            raise ValueError(
                "ssm attention takes no explicit mask (its mask is the learned decay); got a "
                f"mask of shape {shape_of(mask)}"
            )
        dt, log_a = self.decay(x)  # (B, L, H)
        extras = {"dt": dt.transpose(1, 2), "log_a": log_a.transpose(1, 2)}  # (B, H, L)
        # scale (q . k) dt v = (q . k) (scale dt v): the scale rides on the (B, L, H) step
        step = dt * self.scale
        Cq, Bk = q.transpose(1, 2), k.transpose(1, 2)  # (B, L, H, d): queries as C, keys as B
        if need_weights:
            weights = ssd_matrix(log_a, Bk, Cq) * step.transpose(1, 2)[:, :, None, :]  # (B,H,L,L)
            out = weights @ v
            causal_keep = torch.ones_like(weights[0, 0], dtype=torch.bool).tril()
            lower = weights.detach()[..., causal_keep]
            diagnostics = {
                "nonfinite_logits": count_nonfinite(lower),
                "row_stochastic": is_row_stochastic(weights.detach()).float(),
                "weights_row_sum_mean": weights.detach().sum(-1).mean(),
                "weights_negative_fraction": (lower < 0).float().mean(),
            }
            return AttentionResult(out, weights, diagnostics, extras)
        X = v.transpose(1, 2) * step[..., None]  # values as x, discretised by dt
        y = ssd(X, log_a, Bk, Cq, method=self.method, chunk_size=self.chunk_size)
        return AttentionResult(y.transpose(1, 2), None, {}, extras)

    def forward_with_state(self, x: Tensor, state: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Prefill: ``x (B, L, D)`` from ``state`` -> ``(out (B, L, D), state after it)``.

        ``state`` is ``(B, H, head_dim, head_dim)`` (value dim by state dim), zero if None.
        """
        self.check_input(x)  # (B, L, D), B and L >= 1, the module's dtype and device
        q, k, v = self.split_heads(x)
        dt, log_a = self.decay(x)
        y, new_state = ssd(
            v.transpose(1, 2) * dt[..., None],
            log_a,
            k.transpose(1, 2),
            (q * self.scale).transpose(1, 2),
            method=self.method,
            chunk_size=self.chunk_size,
            initial_state=state,
            return_final_state=True,
        )
        b, length, h, d = y.shape
        return self.dropout(self.proj(y.reshape(b, length, h * d))), new_state

    def step(self, x_t: Tensor, state: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """One generation step: ``x_t (B, D)`` -> ``(out_t (B, D), new state (B, H, d, d))``.

        The state is carried explicitly: start from ``None`` (zeros) or from
        :meth:`forward_with_state`. Equal to the forward pass position by position.
        """
        self._check_step_input(x_t)
        b = x_t.shape[0]
        qkv = self.qkv(x_t).view(b, 3, self.n_heads, self.head_dim)
        q, k, v = qkv.unbind(1)  # (B, H, d) each
        dt, log_a = self.decay(x_t)  # (B, H)
        if state is None:
            state = x_t.new_zeros(b, self.n_heads, self.head_dim, self.head_dim)
        else:
            want = (b, self.n_heads, self.head_dim, self.head_dim)
            check_tensor("state", state, expected=f"(B, H, d, d) = {want}")
            if shape_of(state) != want:
                raise ValueError(
                    f"state must have shape (B, H, d, d) = {want}, got {shape_of(state)}"
                )
        y, state = ssd_step(v * dt[..., None], log_a, k, q * self.scale, state)
        return self.dropout(self.proj(y.reshape(b, -1))), state

    def _check_step_input(self, x_t: Tensor) -> None:
        """``x_t (B, D)``, ``B >= 1``, in the module's dtype and on its device."""
        expected = f"(B, {self.dim}) with B >= 1"
        check_tensor("x_t", x_t, expected=expected, ndim=2, nonempty=(0,))
        if x_t.shape[-1] != self.dim:
            raise ValueError(f"expected x_t of shape {expected}, got {shape_of(x_t)}")
        w = self.qkv.weight
        if x_t.dtype != w.dtype or x_t.device != w.device:
            raise ValueError(
                f"expected x_t in this module's dtype {w.dtype} on {w.device}, got {x_t.dtype} "
                f"on {x_t.device}"
            )

    def extra_repr(self) -> str:
        return super().extra_repr() + f", method={self.method!r}, chunk_size={self.chunk_size}"
