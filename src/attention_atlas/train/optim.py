"""The optimiser's parameter groups and the learning-rate schedules."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from attention_atlas.attention.base import Attention

from .config import TrainConfig

__all__ = ["adamw_implementation", "lr_at", "lr_at_time", "param_groups"]


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate multiplier at optimiser step ``step`` (0-based): linear warm-up over
    ``warmup_steps`` then cosine decay to ``min_lr_ratio`` at ``steps``."""
    if cfg.warmup_steps > 0 and step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    span = max(1, cfg.steps - cfg.warmup_steps)
    t = min(1.0, (step - cfg.warmup_steps) / span)
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t))


def lr_at_time(step: int, frac: float, cfg: TrainConfig) -> float:
    """``schedule="time"``: linear warm-up over ``warmup_steps`` times a cosine over the fraction
    ``frac`` of the time budget ``max_time_s`` used so far (not reproducible: it follows the
    machine's speed)."""
    warm = min(1.0, (step + 1) / cfg.warmup_steps) if cfg.warmup_steps > 0 else 1.0
    t = min(1.0, max(0.0, frac))
    return warm * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups: decay on matrices; none on biases, norms, embeddings (token tables,
    learned positions, CLS token) and the metric parameters of attention variants."""
    no_decay: set[int] = set()
    for m in model.modules():
        if isinstance(m, nn.Embedding | nn.LayerNorm | nn.RMSNorm):
            no_decay.update(id(p) for p in m.parameters(recurse=False))
    for name, p in model.named_parameters():
        if p.dim() < 2 or name.split(".")[-1] in ("pos_emb", "cls") or name.endswith(".bias"):
            no_decay.add(id(p))
    for m in model.modules():  # a variant's geometry is shaped by its own regularisers, not decay
        if isinstance(m, Attention):
            no_decay.update(id(p) for p in m.metric_parameters())
    uniq = {id(p): p for p in model.parameters() if p.requires_grad}
    decay = [p for i, p in uniq.items() if i not in no_decay]
    rest = [p for i, p in uniq.items() if i in no_decay]
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": rest, "weight_decay": 0.0},
    ]


def adamw_implementation(device: torch.device) -> dict[str, bool]:
    """AdamW's implementation on ``device``: on a GPU one fused kernel for every parameter (the
    per-parameter loop, a few launches per tensor, took 28% of the Fiber Bundle Transformer's
    book-shape step on an H200); on a CPU the multi-tensor ("foreach") form, whose CPU ops loop
    over the tensors in C++ calling the same per-tensor kernels as the single-tensor loop every
    stored CPU result was made with: the same bits (tested over training steps of a Fiber
    Bundle model, so ``results verify`` still reproduces them), with one Python call per op
    instead of one per parameter (47 tensors in the Fiber Bundle model at chapter 4's shape)."""
    return {"fused": True} if device.type == "cuda" else {"foreach": True}
