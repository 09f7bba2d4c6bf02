"""Mixed-head attention: one layer whose heads are split among registered variants.

``build_attention("mixed", dim=..., n_heads=8, groups=[{"name": "dot", "heads": 6},
{"name": "euclidean", "heads": 2, "tau": 4.0}])`` uses dot-product attention in heads 0-5 and
Euclidean distance attention in heads 6-7 of the same layer, sharing one q/k/v/output projection.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from .base import Attention, AttentionResult
from .registry import build_attention, register_attention

__all__ = ["MixedHeadAttention"]


@register_attention("mixed")
class MixedHeadAttention(Attention):
    """One attention layer whose heads are split among variants.

    Args:
        groups: ``[{"name": variant, "heads": n, **options}, ...]`` with head counts summing to
            ``n_heads``. Head ``h`` belongs to the group whose range contains it, in order.

    The layer owns the shared q/k/v/output projections; each group is a registered variant
    built with ``n_heads=heads`` and the same ``head_dim``, whose own projections are removed
    (only its :meth:`attend` and any geometry parameters it adds are used).
    """

    def __init__(
        self, dim: int, n_heads: int, groups: list[dict[str, Any]] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(dim, n_heads, **kwargs)
        if not groups:
            raise ValueError("mixed attention needs groups=[{'name': ..., 'heads': n}, ...]")
        counts = []
        mods = []
        for i, g in enumerate(groups):
            g = dict(g)
            if "name" not in g or "heads" not in g:
                raise ValueError(f"groups[{i}] needs 'name' and 'heads', got {g!r}")
            name, heads = str(g.pop("name")), int(g.pop("heads"))
            if name == "mixed":
                raise ValueError("mixed attention groups cannot themselves be 'mixed'")
            if heads <= 0:
                raise ValueError(f"groups[{i}] heads must be positive, got {heads}")
            mod = build_attention(
                name, dim=dim, n_heads=heads, head_dim=self.head_dim, bias=False, **g
            )
            # the shared projections of this layer replace the group's own
            mod.qkv = None  # type: ignore[assignment]
            mod.proj = None  # type: ignore[assignment]
            counts.append(heads)
            mods.append(mod)
        if sum(counts) != n_heads:
            raise ValueError(
                f"group head counts {counts} sum to {sum(counts)}, not n_heads={n_heads}"
            )
        self.groups = nn.ModuleList(mods)
        self.head_counts = counts

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
        outs: list[Tensor] = []
        probs: list[Tensor] = []
        diags: dict[str, Tensor] = {}
        extras: dict[str, Tensor] = {}
        start = 0
        for gi, (mod, h) in enumerate(zip(self.groups, self.head_counts)):
            sl = slice(start, start + h)
            start += h
            gmask = mask
            if mask is not None and mask.dim() == 4 and mask.shape[1] == self.n_heads:
                gmask = mask[:, sl]  # a per-head mask follows its heads
            r = mod.attend(  # type: ignore[operator]
                q[:, sl], k[:, sl], v[:, sl], x=x, causal=causal, mask=gmask,
                need_weights=need_weights,
            )  # fmt: skip
            outs.append(r.out)  # (B, h, L, d)
            if r.probs is not None:
                probs.append(r.probs)
            for key, val in r.diagnostics.items():
                diags[key] = diags[key] + val if key in diags else val
            for key, val in r.extras.items():
                extras[f"group{gi}.{key}"] = val
        all_probs = torch.cat(probs, dim=1) if len(probs) == len(outs) else None
        return AttentionResult(torch.cat(outs, dim=1), all_probs, diags, extras)

    def metric_parameters(self) -> list[nn.Parameter]:
        seen: dict[int, nn.Parameter] = {}
        for mod in self.groups:
            for p in mod.metric_parameters():  # type: ignore[operator]
                seen[id(p)] = p
        return list(seen.values())

    def extra_repr(self) -> str:
        names = [f"{m.name}x{h}" for m, h in zip(self.groups, self.head_counts)]
        return super().extra_repr() + f", groups=[{', '.join(names)}]"
