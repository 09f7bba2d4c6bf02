"""The shared interface of every attention variant, and the registry.

Every variant is an :class:`Attention` module with the same call::

    result = attn(x, causal=True, mask=None, need_weights=False)
    result.out          # (B, L, D) the layer output (after the output projection)
    result.probs        # (B, H, L, L) attention probabilities, or None
    result.diagnostics  # dict of scalar tensors (counts of non-finite logits, ...)

A subclass implements :meth:`Attention.attend`, which works on per-head queries,
keys and values ``(B, H, L, d_head)`` and may also read the hidden states ``x``
they come from (a Riemannian metric or an SSM decay is computed from ``x``).
Functional forms of each variant (for example :func:`attention_atlas.attention.dot.sdpa`)
take ``q, k, v`` directly, so the same maths is usable without a module.

Variants are built by name through :mod:`attention_atlas.attention.registry`
(``build_attention(name, **config)``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

__all__ = [
    "Attention",
    "AttentionResult",
    "check_qkv",
    "check_same_device",
    "check_tensor",
    "combine_masks",
    "count_nonfinite",
]


@dataclass
class AttentionResult:
    """What every attention call returns.

    Attributes:
        out: ``(B, L, D)`` for a module call, ``(B, H, L, d_v)`` from :meth:`Attention.attend`.
        probs: ``(B, H, L, L)`` attention probabilities when asked for (``need_weights=True``),
            else ``None``.
        diagnostics: scalar tensors keyed by name, for example ``"nonfinite_logits"`` (count of
            logits that are NaN or +inf among the unmasked entries; present whenever the logits
            were materialised) and ``"nonfinite_out"`` (count of non-finite outputs, always present).
        extras: tensors a variant wants to expose to its caller (a metric factor, a decay, ...).
    """

    out: Tensor
    probs: Tensor | None = None
    diagnostics: dict[str, Tensor] = field(default_factory=dict)
    extras: dict[str, Tensor] = field(default_factory=dict)


def count_nonfinite(t: Tensor, valid: Tensor | None = None) -> Tensor:
    """Number of NaN or infinite (either sign) entries of ``t`` (only where ``valid`` is True).

    Masked logits are ``-inf`` on purpose; pass ``valid`` (True = unmasked) to exclude them.
    """
    bad = ~torch.isfinite(t.detach())
    if valid is not None:
        bad = bad & valid
    return bad.sum()


def check_tensor(
    name: str,
    t: object,
    *,
    expected: str,
    min_dim: int = 1,
    ndim: int | None = None,
    floating: bool = True,
    nonempty: tuple[int, ...] = (),
) -> Tensor:
    """Check one tensor argument; raise naming ``name``, its shape and the ``expected`` one.

    Args:
        name: the argument, as the caller's signature spells it.
        expected: the expected shape in words, e.g. ``"(..., L, d)"``.
        min_dim / ndim: the least / exact number of dimensions.
        floating: it must be a floating-point tensor.
        nonempty: dimensions (negative indices) that must have size >= 1 (sequence lengths,
            widths): an empty sequence is an error, not an empty result.

    Raises:
        TypeError: not a tensor. ValueError: wrong rank, dtype or an empty dimension.
    """
    if not isinstance(t, Tensor):
        raise TypeError(
            f"{name} must be a torch.Tensor of shape {expected}, got {type(t).__name__}"
        )
    if (ndim is not None and t.dim() != ndim) or t.dim() < min_dim:
        raise ValueError(f"{name} must have shape {expected}, got {tuple(t.shape)}")
    if floating and not t.is_floating_point():
        raise ValueError(
            f"{name} must be a floating-point tensor of shape {expected}, got dtype {t.dtype}"
        )
    for axis in nonempty:
        if t.shape[axis] == 0:
            raise ValueError(
                f"{name} must have shape {expected} with no empty dimension, got {tuple(t.shape)}"
            )
    return t


def check_same_device(**tensors: Tensor) -> None:
    """All ``tensors`` on one device; else ValueError naming each argument's device."""
    devices = {t.device for t in tensors.values()}
    if len(devices) > 1:
        where = ", ".join(f"{n} on {t.device}" for n, t in tensors.items())
        raise ValueError(f"{', '.join(tensors)} must be on one device, got {where}")


def check_qkv(q: Tensor, k: Tensor, v: Tensor, *, same_dim: bool = True) -> None:
    """Validate per-head inputs ``q (..., Lq, d)``, ``k (..., Lk, d)``, ``v (..., Lk, d_v)``.

    Floating point, one dtype, one device, no empty sequence or width. Raises ``TypeError``
    (not a tensor) or ``ValueError`` naming the argument, its shape and the expected one.
    """
    for name, t, shape in (
        ("q", q, "(..., Lq, d)"),
        ("k", k, "(..., Lk, d)"),
        ("v", v, "(..., Lk, d_v)"),
    ):
        check_tensor(name, t, expected=shape, min_dim=2, nonempty=(-2, -1))
    if same_dim and q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must share their last dimension: q {tuple(q.shape)}, k {tuple(k.shape)}"
        )
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"k and v must have the same length (dim -2): k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if q.shape[:-2] != k.shape[:-2] or k.shape[:-2] != v.shape[:-2]:
        raise ValueError(
            "q, k, v must share their batch dimensions (...): "
            f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    check_same_device(q=q, k=k, v=v)


def combine_masks(
    lq: int, lk: int, *, causal: bool, mask: Tensor | None, device: torch.device
) -> Tensor | None:
    """Boolean mask ``(..., Lq, Lk)``, True where a query may attend to a key, or None.

    ``mask`` is boolean (True = keep) and broadcastable to ``(B, H, Lq, Lk)``: its last two
    dimensions are ``(Lq, Lk)``, or 1 where it broadcasts (a key-padding mask ``(B, 1, 1, Lk)``).
    """
    keep: Tensor | None = None
    if causal:
        keep = torch.ones(lq, lk, dtype=torch.bool, device=device).tril(diagonal=lk - lq)
    if mask is not None:
        if not isinstance(mask, Tensor):
            raise TypeError(f"mask must be a boolean torch.Tensor, got {type(mask).__name__}")
        if mask.dtype != torch.bool:
            raise ValueError(f"mask must be boolean (True = attend), got dtype {mask.dtype}")
        if mask.dim() < 2 or mask.shape[-2] not in (1, lq) or mask.shape[-1] not in (1, lk):
            raise ValueError(
                f"mask must end in (Lq, Lk) = ({lq}, {lk}) (or 1 where it broadcasts), "
                f"got shape {tuple(mask.shape)}"
            )
        dev = torch.device(device) if device is not None else mask.device
        if mask.device.type != dev.type or (dev.index is not None and mask.device != dev):
            raise ValueError(f"mask must be on the inputs' device {dev}, got {mask.device}")
        keep = mask if keep is None else (keep & mask)
    return keep


class Attention(nn.Module):
    """Multi-head self-attention with a pluggable score: the base of every variant.

    The module owns the query/key/value/output projections and the head split; a subclass
    implements :meth:`attend` on per-head tensors.

    Args:
        dim: model width D.
        n_heads: number of heads H.
        head_dim: per-head width d (default ``dim // n_heads``).
        bias: bias in the projections.
        dropout: dropout on the output projection.
    """

    #: registry name (see :mod:`attention_atlas.attention.registry`)
    name: str = "base"

    def __init__(
        self,
        dim: int,
        n_heads: int,
        head_dim: int | None = None,
        bias: bool = False,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if dim <= 0 or n_heads <= 0:
            raise ValueError(f"dim and n_heads must be positive, got dim={dim}, n_heads={n_heads}")
        if head_dim is None:
            if dim % n_heads:
                raise ValueError(
                    f"dim={dim} is not divisible by n_heads={n_heads}; pass head_dim explicitly"
                )
            head_dim = dim // n_heads
        self.dim, self.n_heads, self.head_dim = dim, n_heads, head_dim
        inner = n_heads * head_dim
        self.qkv = nn.Linear(dim, 3 * inner, bias=bias)
        self.proj = nn.Linear(inner, dim, bias=bias)
        self.dropout = nn.Dropout(dropout)

    # -- to override -----------------------------------------------------------------
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
        """Per-head attention. ``q, k, v (B, H, L, d)``, ``x (B, L, D)``; returns ``out (B, H, L, d)``."""
        raise NotImplementedError

    def metric_parameters(self) -> list[nn.Parameter]:
        """Parameters a variant adds to define its geometry (none for dot-product attention)."""
        return []

    # -- shared ----------------------------------------------------------------------
    def split_heads(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``x (B, L, D)`` -> ``q, k, v`` each ``(B, H, L, d)``."""
        b, l, _ = x.shape
        qkv = self.qkv(x).view(b, l, 3, self.n_heads, self.head_dim)  # (B, L, 3, H, d)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # 3 x (B, H, L, d)
        return q, k, v

    def forward(
        self,
        x: Tensor,
        *,
        causal: bool = False,
        mask: Tensor | None = None,
        need_weights: bool = False,
    ) -> AttentionResult:
        """``x (B, L, D)`` -> :class:`AttentionResult` with ``out (B, L, D)``.

        Raises ``TypeError``/``ValueError`` naming ``x``, its shape and the expected one (wrong
        rank or width, an empty sequence, a dtype or device other than the module's)."""
        self.check_input(x)
        q, k, v = self.split_heads(x)
        res = self.attend(q, k, v, x=x, causal=causal, mask=mask, need_weights=need_weights)
        b, h, l, dv = res.out.shape
        out = res.out.transpose(1, 2).reshape(b, l, h * dv)  # (B, L, H*d)
        res.out = self.dropout(self.proj(out))
        res.diagnostics.setdefault("nonfinite_out", count_nonfinite(res.out))
        return res

    def check_input(self, x: Tensor) -> None:
        """``x`` must be ``(B, L, D)`` with ``B, L >= 1``, in this module's dtype and on its device."""
        expected = f"(B, L, {self.dim})"
        if not isinstance(x, Tensor):
            raise TypeError(f"expected x of shape {expected}, got {type(x).__name__}")
        if x.dim() != 3 or x.shape[-1] != self.dim or 0 in x.shape[:2]:
            raise ValueError(f"expected x of shape {expected} with B, L >= 1, got {tuple(x.shape)}")
        w = self.qkv.weight
        if x.dtype != w.dtype:
            raise ValueError(f"expected x of this module's dtype {w.dtype}, got {x.dtype}")
        if x.device != w.device:
            raise ValueError(f"expected x on this module's device {w.device}, got {x.device}")

    def extra_repr(self) -> str:
        return f"dim={self.dim}, n_heads={self.n_heads}, head_dim={self.head_dim}"
