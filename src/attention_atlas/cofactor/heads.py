"""Attention probabilities of chosen layers and heads, for the cofactor penalty and diagnostics.

The penalty needs the probabilities of a few heads (the seed: one or two per layer), not of
all of them. Asking the model for ``need_weights=True`` moves *every* head of every layer off
the fused SDPA kernel onto the explicit path; :func:`head_probs` instead forms only the chosen
heads' probabilities, so the training forward stays on SDPA:

    probs_l[:, h] = softmax(q_h k_h^T / (sqrt(d) T)),   q_h, k_h = heads of qkv(ln_1(hidden[l]))

for dot-product attention (the operations of its explicit path, on the chosen heads only).
The queries and keys are the forward's own when its layers returned them (a forward under
autograd: :class:`~attention_atlas.attention.dot.DotProductAttention` puts them in
``extras``), so nothing is recomputed; otherwise the chosen rows of the projection are
recomputed from each layer's input (``output.hidden[l]``, kept with its autograd graph by
:class:`~attention_atlas.models.Transformer`). Any other variant runs its own
``need_weights=True`` call on ``ln_1(hidden[l])``. Gradients flow into the projections, the
LayerNorm and the residual stream exactly as through the explicit path's probabilities.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from attention_atlas.attention.dot import DotProductAttention

__all__ = [
    "attention_probs",
    "head_indices",
    "head_logits",
    "head_qk",
    "head_qk_views",
    "head_probs",
    "select_heads",
    "strictly_upper",
]


def head_indices(heads: Sequence[int] | int | None, n_heads: int) -> list[int]:
    """The chosen heads of a layer with ``n_heads``: all (None), the first ``k`` (an int), or a
    list of indices (each checked against ``n_heads``)."""
    if heads is None:
        return list(range(n_heads))
    if isinstance(heads, int):
        if heads < 1:
            raise ValueError(f"heads must be >= 1 (the first k heads), got {heads}")
        return list(range(min(heads, n_heads)))
    idx = list(heads)
    bad = [h for h in idx if not -n_heads <= h < n_heads]
    if bad or not idx:
        raise ValueError(f"head indices must be in [0, {n_heads}) and not empty, got {idx}")
    return [h % n_heads for h in idx]


def _layer_indices(layers: Sequence[int] | None, n_layers: int) -> list[int]:
    chosen = list(range(n_layers)) if layers is None else list(layers)
    for li in chosen:
        if not -n_layers <= li < n_layers:
            raise ValueError(f"layer index {li} out of range for {n_layers} layers")
    return chosen


def select_heads(
    probs: Sequence[Tensor | None], layers: Sequence[int] | None, heads: Sequence[int] | int | None
) -> list[Tensor]:
    """Pick ``(B, h, L, L)`` slices of the chosen layers and heads from per-layer probabilities
    ``(B, H, L, L)``."""
    out = []
    for li in _layer_indices(layers, len(probs)):
        p = probs[li]
        if p is None:
            raise ValueError(
                f"layer {li} returned no attention probabilities; the cofactor terms need "
                "need_weights=True and a variant that materialises its probabilities"
            )
        out.append(p[:, head_indices(heads, p.shape[1])])
    return out


def attention_probs(output: Any) -> list[Tensor | None]:
    """Per-layer probabilities from a model output with ``attentions`` (list of AttentionResult)."""
    atts = getattr(output, "attentions", None)
    if atts is None:
        raise ValueError("model output has no 'attentions'; run the model with need_weights=True")
    return [getattr(a, "probs", None) for a in atts]


def _qk_rows(idx: list[int], d: int, inner: int, device: torch.device) -> slice | Tensor:
    """The rows of the ``qkv`` projection viewed as ``(3, H d, D)`` (the q, k and v blocks,
    head by head) that belong to heads ``idx``: a slice (a view) when they are consecutive."""
    if idx == list(range(idx[0], idx[-1] + 1)):
        return slice(idx[0] * d, (idx[-1] + 1) * d)
    return torch.tensor([r for h in idx for r in range(h * d, (h + 1) * d)], device=device)


def _checked_model(model: Any, output: Any) -> tuple[Any, Any]:
    hidden = getattr(output, "hidden", None)
    blocks = getattr(model, "blocks", None)
    if hidden is None or blocks is None or len(hidden) != len(blocks) + 1:
        raise ValueError(
            "recomputing head probabilities needs a Transformer and its output's hidden states "
            f"(n_layers + 1 of them); got blocks={None if blocks is None else len(blocks)}, "
            f"hidden={None if hidden is None else len(hidden)}"
        )
    return hidden, blocks


def head_qk(
    model: Any,
    output: Any,
    *,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | int | None = 1,
    max_items: int | None = None,
) -> tuple[Tensor, Tensor, float] | None:
    """Queries and keys ``(layers, B, h, L, d)`` of the chosen heads of the chosen layers, from
    the forward's own or recomputed (module docstring), and the layers' temperature ``T`` (the
    logits are ``q k^T / (sqrt(d) T)``); differentiable. None unless every chosen layer is
    dot-product attention of one shape and temperature. Arguments as :func:`head_probs`."""
    found = _dot_layers(model, output, layers, heads)
    if found is None:
        return None
    hidden, blocks, chosen, idx, temperature = found
    qk = forward_qk(output, chosen, idx, max_items)
    if qk is None:
        qk = _recomputed_qk(blocks, hidden, chosen, idx, max_items)
    q, k = qk
    return q, k, temperature


def head_qk_views(
    model: Any,
    output: Any,
    *,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | int | None = 1,
) -> tuple[list[Tensor], list[Tensor], list[int], float] | None:
    """The chosen layers' whole query and key tensors ``(B, H, L, d)`` as the forward returned
    them (views of its projection, every head), the chosen head indices and the temperature:
    what a kernel that reads the chosen heads in place needs (no slice or stack). None where
    :func:`head_qk` would return None or recompute (a forward without autograd)."""
    found = _dot_layers(model, output, layers, heads)
    if found is None:
        return None
    _, _, chosen, idx, temperature = found
    extras = _forward_extras(output, chosen)
    if extras is None:
        return None
    return [e["query"] for e in extras], [e["key"] for e in extras], idx, temperature


def _dot_layers(
    model: Any, output: Any, layers: Sequence[int] | None, heads: Sequence[int] | int | None
) -> tuple[Sequence[Tensor], Any, list[int], list[int], float] | None:
    """``(hidden, blocks, chosen layers, head indices, temperature)``, or None unless every
    chosen layer is dot-product attention of one shape and temperature."""
    hidden, blocks = _checked_model(model, output)
    chosen = _layer_indices(layers, len(blocks))
    attns = [blocks[li].attn for li in chosen]
    first = attns[0]
    idx = head_indices(heads, first.n_heads)
    if type(first) is not DotProductAttention:
        return None
    same = (first.n_heads, first.head_dim, first.temperature)
    for a in attns:  # a loop, not generators: this runs on every training step
        if type(a) is not DotProductAttention or (a.n_heads, a.head_dim, a.temperature) != same:
            return None
    return hidden, blocks, chosen, idx, first.temperature


def head_logits(
    model: Any,
    output: Any,
    *,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | int | None = 1,
    max_items: int | None = None,
) -> Tensor | None:
    """Logits ``q_h k_h^T / (sqrt(d) T)`` ``(layers, B, h, L, L)`` of the chosen heads of the
    chosen layers, before any mask, from :func:`head_qk`; differentiable. None where
    :func:`head_qk` is. Arguments as :func:`head_probs`."""
    qk = head_qk(model, output, layers=layers, heads=heads, max_items=max_items)
    if qk is None:
        return None
    q, k, temperature = qk  # (layers, B, h, L, d) each
    # (layers, B, h, L, L), as DotProductAttention's explicit path
    return (q @ k.transpose(-2, -1)) / (math.sqrt(q.shape[-1]) * temperature)


def head_probs(
    model: Any,
    output: Any,
    *,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | int | None = 1,
    max_items: int | None = None,
) -> Tensor:
    """Probabilities ``(layers, B, h, L, L)`` of the chosen heads of the chosen layers, from the
    forward's queries and keys or recomputed from the layers' inputs ``output.hidden[l]``
    (module docstring); differentiable.

    Dot-product layers are computed together, a handful of batched operations for all layers
    (the per-operation overhead, not arithmetic, is what such small tensors cost); any other
    variant runs its own ``need_weights=True`` path on ``ln_1(hidden[l])``.

    Args:
        model: a :class:`~attention_atlas.models.Transformer` (``blocks[l].ln_1``,
            ``blocks[l].attn``, ``cfg.is_causal``) whose forward produced ``output``.
        output: its :class:`~attention_atlas.models.ModelOutput` (``hidden``: ``n_layers + 1``
            tensors ``(B, L, D)``). The forward must have had no extra attention ``mask`` (the
            training harness passes none): only the causal mask of ``cfg`` is applied.
        layers, heads: as :func:`select_heads` (the same heads in every layer).
        max_items: only the first ``max_items`` batch items.
    """
    from attention_atlas.attention.dot import masked_softmax

    logits = head_logits(model, output, layers=layers, heads=heads, max_items=max_items)
    causal = bool(model.cfg.is_causal)
    if logits is None:  # another variant, or mixed shapes: each layer's own explicit path
        hidden, blocks = _checked_model(model, output)
        chosen = _layer_indices(layers, len(blocks))
        idx = head_indices(heads, blocks[chosen[0]].attn.n_heads)
        return torch.stack([
            select_heads([blocks[li].attn(blocks[li].ln_1(hidden[li][:max_items]), causal=causal,
                                          mask=None, need_weights=True).probs], None, idx)[0]
            for li in chosen
        ])  # fmt: skip
    if not causal:
        return masked_softmax(logits, None)
    return torch.softmax(logits.masked_fill(strictly_upper(logits), float("-inf")), -1)


def strictly_upper(logits: Tensor) -> Tensor:
    """The causal mask of ``logits (..., L, L)``: True above the diagonal (no row all True)."""
    n = logits.shape[-1]
    return torch.ones(n, n, dtype=torch.bool, device=logits.device).triu(1)


def _forward_extras(output: Any, chosen: list[int]) -> list[dict[str, Tensor]] | None:
    """The chosen layers' ``extras`` when each holds the forward's ``query`` and ``key``, else
    None (a forward without autograd does not return them)."""
    atts = getattr(output, "attentions", None)
    if atts is None or len(atts) <= max(chosen):
        return None
    extras = [getattr(atts[li], "extras", None) or {} for li in chosen]
    if not all("query" in e and "key" in e for e in extras):
        return None
    return extras


def forward_qk(
    output: Any, chosen: list[int], idx: list[int], max_items: int | None
) -> tuple[Tensor, Tensor] | None:
    """The chosen heads' queries and keys ``(layers, B, h, L, d)`` as the forward computed them
    (``extras["query"]``, ``extras["key"]`` of each chosen layer's result), or None when a
    layer did not return them (a forward without autograd)."""
    extras = _forward_extras(output, chosen)
    if extras is None:
        return None
    heads = slice(idx[0], idx[-1] + 1) if idx == list(range(idx[0], idx[-1] + 1)) else idx
    q = torch.stack([e["query"][:max_items, heads] for e in extras])
    k = torch.stack([e["key"][:max_items, heads] for e in extras])
    return q, k


def _recomputed_qk(
    blocks: Any, hidden: Sequence[Tensor], chosen: list[int], idx: list[int],
    max_items: int | None,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """The chosen heads' queries and keys ``(layers, B, h, L, d)`` recomputed from the layers'
    inputs: the chosen rows of every layer's projection in one batched product."""
    attns = [blocks[li].attn for li in chosen]
    xs = [blocks[li].ln_1(hidden[li][:max_items]) for li in chosen]  # (B, L, D): attention inputs
    d, inner = attns[0].head_dim, attns[0].n_heads * attns[0].head_dim
    rows = _qk_rows(idx, d, inner, xs[0].device)
    x = torch.stack(xs)  # (layers, B, L, D)
    nl, bsz, n, dim = x.shape
    w = torch.stack([a.qkv.weight.view(3, inner, dim)[:2, rows] for a in attns])  # (nl, 2, hd, D)
    qk = x.view(nl, bsz * n, dim) @ w.view(nl, -1, dim).transpose(-2, -1)  # (nl, B L, 2 h d)
    if attns[0].qkv.bias is not None:
        b = torch.stack([a.qkv.bias.view(3, inner)[:2, rows] for a in attns])  # (nl, 2, hd)
        qk = qk + b.view(nl, 1, -1)
    q, k = qk.view(nl, bsz, n, 2, len(idx), d).permute(3, 0, 1, 4, 2, 5).unbind(0)
    return q, k
