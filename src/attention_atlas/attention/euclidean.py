"""Euclidean (squared-distance) attention.

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
from torch import Tensor

from .base import Attention, AttentionResult, check_qkv, combine_masks
from .dot import attention_from_logits, masked_softmax, sdpa

__all__ = [
    "EuclideanAttention",
    "as_4d",
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


def as_4d(t: Tensor) -> tuple[Tensor, tuple[int, ...]]:
    """``(..., n, d)`` -> ``(B, H, n, d)`` for the flash kernel, and the leading shape to undo it."""
    lead = tuple(t.shape[:-2])
    if t.dim() == 4:
        return t, lead
    if t.dim() == 3:
        return t.unsqueeze(1), lead
    return t.reshape(-1, 1, *t.shape[-2:]), lead


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
        q4, k4, v4 = (as_4d(t)[0] for t in (q, k, v))  # 3-D inputs miss the flash kernel
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
        if not self.tau > 0:
            raise ValueError(f"tau must be positive (a temperature), got tau={tau}")

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
