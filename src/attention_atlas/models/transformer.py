"""A small pre-norm Transformer with a pluggable attention per layer and per head group.

Built in the style of nanoGPT (``karpathy/nanoGPT``, ``model.py``): one config dataclass,
small modules that each do one thing (:class:`MLP`, :class:`Block`), shape comments.

Two heads share the same trunk:

* ``task="lm"``: a causal language model over tokens (characters or words), logits ``(B, L, V)``;
* ``task="classify"``: a patch-token classifier (linear patch embedding, learned positions,
  mean-pool or a CLS token), logits ``(B, n_classes)``.

Which attention each layer uses is set by ``ModelConfig.attention`` (+ ``attention_options``),
or per layer by ``ModelConfig.layers``; a layer spec ``{"name": "mixed", "groups": [...]}`` splits
that layer's heads among variants (:class:`MixedHeadAttention`), so a variant can be used in
some heads only.

The Fiber Bundle Transformer (Song 2026, Section 5) is the same model with other blocks:
:mod:`attention_atlas.models.fiber_bundle`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attention_atlas.attention.base import Attention, AttentionResult
from attention_atlas.attention.mixed import MixedHeadAttention
from attention_atlas.attention.registry import build_attention
from attention_atlas.validate import Fraction, PositiveFloat, PositiveInt

__all__ = [
    "MLP",
    "Block",
    "MixedHeadAttention",
    "ModelConfig",
    "ModelOutput",
    "Transformer",
    "attention_modules",
    "param_counts",
]


@dataclass
class ModelConfig:
    """Everything a :class:`Transformer` is built from (and nothing else). The annotations state
    each setting's range (:mod:`attention_atlas.validate`)."""

    task: str = "lm"  # "lm" (causal language model) or "classify" (patch-token classifier)
    vocab_size: PositiveInt = 50  # lm: number of token types (50 for char-PTB)
    n_classes: PositiveInt = 10  # classify: number of classes
    patch_dim: PositiveInt = 4  # classify: features per patch token (4 for 2x2 digit patches)
    dim: PositiveInt = 128  # model width D
    n_layers: PositiveInt = 2  # number of Transformer blocks
    n_heads: PositiveInt = 8  # attention heads H per block
    head_dim: PositiveInt | None = None  # per-head width d (default dim // n_heads)
    mlp_ratio: PositiveFloat = 4.0  # MLP hidden width = mlp_ratio * dim
    max_len: PositiveInt = 256  # longest sequence (learned positions)
    dropout: Fraction = 0.0  # dropout on embeddings, attention output and MLP output
    bias: bool = False  # biases in Linear layers and LayerNorms
    attention: str = "dot"  # registered attention variant used by every layer ...
    attention_options: dict[str, Any] = field(default_factory=dict)  # ... with these options
    layers: list[dict[str, Any]] | None = None  # per-layer [{"name": ..., **options}] override
    tie_embeddings: bool = True  # lm: output matrix = token embedding matrix
    token_shift: bool = (
        False  # lm: add W h_{t-1} to each embedding h_t (H3's shift; Fu et al. 2023)
    )
    pool: str = "mean"  # classify: "mean" over patch tokens or a learned "cls" token
    causal: bool | None = None  # default: True for "lm", False for "classify"

    def __post_init__(self) -> None:
        if self.task not in ("lm", "classify"):
            raise ValueError(f"task must be 'lm' or 'classify', got {self.task!r}")
        if self.pool not in ("mean", "cls"):
            raise ValueError(f"pool must be 'mean' or 'cls', got {self.pool!r}")
        if self.layers is not None and len(self.layers) != self.n_layers:
            raise ValueError(
                f"layers has {len(self.layers)} entries but n_layers={self.n_layers}; "
                "give one spec {'name': ..., **options} per layer"
            )
        for i, spec in enumerate(self.layers or []):
            if not isinstance(spec, dict) or "name" not in spec:
                raise ValueError(f"layers[{i}] must be a dict with a 'name' key, got {spec!r}")
        if self.head_dim is None and self.n_heads > 0 and self.dim % self.n_heads:
            raise ValueError(
                f"dim={self.dim} is not divisible by n_heads={self.n_heads}; "
                "choose them so that it is, or set head_dim"
            )

    @property
    def is_causal(self) -> bool:
        """Whether the attention is causal (the lm default) or bidirectional."""
        return self.causal if self.causal is not None else self.task == "lm"

    def layer_spec(self, i: int) -> tuple[str, dict[str, Any]]:
        """``(name, options)`` of layer ``i``'s attention."""
        if self.layers is not None:
            spec = dict(self.layers[i])
            return str(spec.pop("name")), spec
        return self.attention, dict(self.attention_options)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def build(self) -> Transformer:
        """The model this config describes (a config subclass may build a Transformer subclass,
        e.g. :class:`FiberBundleConfig`); ``train`` calls this."""
        return Transformer(self)


@dataclass
class ModelOutput:
    """What :meth:`Transformer.forward` returns.

    Attributes:
        logits: ``(B, L, V)`` for ``task="lm"``, ``(B, n_classes)`` for ``task="classify"``.
        attentions: one :class:`AttentionResult` per layer (``probs`` set when ``need_weights``).
        hidden: ``n_layers + 1`` hidden states ``(B, L, D)``: ``hidden[0]`` is the embedding
            output, ``hidden[l]`` the output of block ``l`` (before the final LayerNorm).
    """

    logits: Tensor
    attentions: list[AttentionResult]
    hidden: list[Tensor]


class MLP(nn.Module):
    """Position-wise feed-forward: Linear -> GELU -> Linear -> dropout."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        hidden = int(cfg.mlp_ratio * cfg.dim)
        self.fc = nn.Linear(cfg.dim, hidden, bias=cfg.bias)
        self.proj = nn.Linear(hidden, cfg.dim, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.proj(F.gelu(self.fc(x))))  # (B, L, D)


class Block(nn.Module):
    """Pre-norm block: ``x + attn(ln(x))`` then ``x + mlp(ln(x))``."""

    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        name, opts = cfg.layer_spec(layer)
        self.ln_1 = nn.LayerNorm(cfg.dim, bias=cfg.bias)
        kw = {"head_dim": cfg.head_dim, "bias": cfg.bias, "dropout": cfg.dropout, **opts}
        self.attn = build_attention(name, dim=cfg.dim, n_heads=cfg.n_heads, **kw)
        self.ln_2 = nn.LayerNorm(cfg.dim, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(
        self, x: Tensor, *, causal: bool, mask: Tensor | None, need_weights: bool
    ) -> tuple[Tensor, AttentionResult]:
        res = self.attn(self.ln_1(x), causal=causal, mask=mask, need_weights=need_weights)
        x = x + res.out  # (B, L, D)
        x = x + self.mlp(self.ln_2(x))  # (B, L, D)
        return x, res


class Transformer(nn.Module):
    """Pre-norm Transformer: a causal LM or a patch-token classifier (see :class:`ModelConfig`)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d = cfg.dim
        if cfg.task == "lm":
            self.tok_emb = nn.Embedding(cfg.vocab_size, d)
        else:
            self.patch_emb = nn.Linear(cfg.patch_dim, d, bias=True)
            if cfg.pool == "cls":
                self.cls = nn.Parameter(torch.zeros(1, 1, d))
        n_pos = cfg.max_len + (1 if cfg.task == "classify" and cfg.pool == "cls" else 0)
        self.pos_emb = nn.Parameter(torch.zeros(1, n_pos, d))
        self.drop = nn.Dropout(cfg.dropout)
        self.shift = nn.Linear(d, d, bias=False) if cfg.token_shift and cfg.task == "lm" else None
        self.blocks = nn.ModuleList([Block(cfg, i) for i in range(cfg.n_layers)])
        self.ln_f = nn.LayerNorm(d, bias=cfg.bias)
        if cfg.task == "lm":
            self.head = nn.Linear(d, cfg.vocab_size, bias=False)
            if cfg.tie_embeddings:
                self.head.weight = self.tok_emb.weight
        else:
            self.head = nn.Linear(d, cfg.n_classes, bias=True)
        self._init_weights()

    def _init_weights(self) -> None:
        """GPT-2 initialisation of the modules this file owns (variants keep their own)."""
        std = 0.02
        nn.init.normal_(self.pos_emb, std=std)
        if self.cfg.task == "lm":
            nn.init.normal_(self.tok_emb.weight, std=std)
        else:
            nn.init.normal_(self.patch_emb.weight, std=std)
            nn.init.zeros_(self.patch_emb.bias)
        if self.shift is not None:
            nn.init.normal_(self.shift.weight, std=std)
        if not (self.cfg.task == "lm" and self.cfg.tie_embeddings):
            nn.init.normal_(self.head.weight, std=std)
        if self.head.bias is not None:
            nn.init.zeros_(self.head.bias)
        resid_std = std / math.sqrt(2 * self.cfg.n_layers)  # scaled residual projections
        for block in self.blocks:
            assert isinstance(block, Block)
            attn = block.attn
            nn.init.normal_(attn.qkv.weight, std=std)
            nn.init.normal_(attn.proj.weight, std=resid_std)
            nn.init.normal_(block.mlp.fc.weight, std=std)
            nn.init.normal_(block.mlp.proj.weight, std=resid_std)
            for lin in (attn.qkv, attn.proj, block.mlp.fc, block.mlp.proj):
                if lin.bias is not None:
                    nn.init.zeros_(lin.bias)

    def embed(self, inputs: Tensor) -> Tensor:
        """Token ids ``(B, L)`` or patches ``(B, P, patch_dim)`` -> ``(B, L', D)``."""
        cfg = self.cfg
        if not isinstance(inputs, Tensor):
            raise TypeError(f"inputs must be a torch.Tensor, got {type(inputs).__name__}")
        if inputs.device != self.pos_emb.device:
            raise ValueError(
                f"inputs must be on the model's device {self.pos_emb.device}, got {inputs.device}"
            )
        if inputs.dim() >= 2 and 0 in inputs.shape[:2]:
            raise ValueError(f"inputs must not be empty (B, L >= 1), got {tuple(inputs.shape)}")
        if cfg.task == "lm":
            if inputs.dim() != 2 or inputs.dtype not in (torch.int64, torch.int32):
                raise ValueError(
                    f"lm inputs must be integer token ids (B, L), got {tuple(inputs.shape)} "
                    f"{inputs.dtype}"
                )
            if inputs.shape[1] > cfg.max_len:
                raise ValueError(f"sequence length {inputs.shape[1]} > max_len={cfg.max_len}")
            # the id range needs two values from the tensor, which a compiled graph cannot read
            # without breaking in three (torch.compile): there an id out of range fails in the
            # embedding lookup itself
            if not torch.compiler.is_compiling():
                lo, hi = int(inputs.min()), int(inputs.max())
                if lo < 0 or hi >= cfg.vocab_size:
                    raise ValueError(
                        f"lm inputs must be token ids in [0, {cfg.vocab_size}), got ids in [{lo}, {hi}]"
                    )
            h = self.tok_emb(inputs) + self.pos_emb[:, : inputs.shape[1]]  # (B, L, D)
            if self.shift is not None:  # h_t + W h_{t-1}, with h_{-1} = 0
                h = h + self.shift(F.pad(h, (0, 0, 1, 0))[:, :-1])
            return h
        if inputs.dim() != 3 or inputs.shape[-1] != cfg.patch_dim:
            raise ValueError(
                f"classify inputs must be patches (B, P, {cfg.patch_dim}), got {tuple(inputs.shape)}"
            )
        if inputs.dtype != self.patch_emb.weight.dtype:
            raise ValueError(
                f"classify inputs must have the model's dtype {self.patch_emb.weight.dtype}, "
                f"got {inputs.dtype}"
            )
        if inputs.shape[1] > cfg.max_len:
            raise ValueError(f"{inputs.shape[1]} patches > max_len={cfg.max_len}")
        h = self.patch_emb(inputs)  # (B, P, D)
        if cfg.pool == "cls":
            h = torch.cat([self.cls.expand(h.shape[0], -1, -1), h], dim=1)  # (B, 1+P, D)
        return h + self.pos_emb[:, : h.shape[1]]

    def forward(
        self, inputs: Tensor, *, need_weights: bool = False, mask: Tensor | None = None
    ) -> ModelOutput:
        """``inputs``: token ids ``(B, L)`` (lm) or patches ``(B, P, patch_dim)`` (classify).

        ``mask``: optional boolean attention mask (True = attend) broadcastable to
        ``(B, H, L, L)``, combined with the causal mask for the lm.
        """
        h = self.drop(self.embed(inputs))  # (B, L, D)
        hidden = [h]
        attentions: list[AttentionResult] = []
        for block in self.blocks:
            h, res = block(h, causal=self.cfg.is_causal, mask=mask, need_weights=need_weights)
            hidden.append(h)
            attentions.append(res)
        h = self.ln_f(h)
        if self.cfg.task == "lm":
            logits = self.head(h)  # (B, L, V)
        else:
            pooled = h[:, 0] if self.cfg.pool == "cls" else h.mean(dim=1)  # (B, D)
            logits = self.head(pooled)  # (B, n_classes)
        return ModelOutput(logits, attentions, hidden)


def attention_modules(model: nn.Module) -> list[Attention]:
    """The top-level attention module of each layer (not the groups inside a mixed layer)."""
    found: list[Attention] = []

    def visit(m: nn.Module) -> None:
        for child in m.children():
            if isinstance(child, Attention):
                found.append(child)
            else:
                visit(child)

    visit(model)
    return found


def param_counts(model: nn.Module) -> dict[str, int]:
    """Trainable-parameter counts: ``total``, ``attention`` (inside attention modules, including
    their projections) and ``metric`` (the union of each attention module's
    :meth:`~attention_atlas.attention.base.Attention.metric_parameters`). Shared (tied) tensors
    count once."""

    def count(params: Any) -> int:
        uniq = {id(p): p for p in params if p.requires_grad}
        return sum(p.numel() for p in uniq.values())

    mods = attention_modules(model)
    return {
        "total": count(model.parameters()),
        "attention": count(p for m in mods for p in m.parameters()),
        "metric": count(p for m in mods for p in m.metric_parameters()),
    }
