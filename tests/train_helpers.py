"""Shared pieces of the training tests: a tiny model, a tiny run, the columns every log has."""

from __future__ import annotations

from attention_atlas.models import ModelConfig
from attention_atlas.train import TrainConfig

TINY = ModelConfig(dim=16, n_layers=2, n_heads=2, max_len=64)
LOSS_COLUMNS = [
    "step",
    "train_loss",
    "grad_norm_mean",
    "grad_norm_var",
    "lr",
    "val_loss",
    "val_acc",
]


def tiny_cfg(**kw) -> TrainConfig:
    base = dict(
        steps=12, batch_size=8, lr=1e-2, warmup_steps=3, log_every=3, eval_batches=2,
        eval_batch_size=32, progress=False, measure_flops=False,
    )  # fmt: skip
    base.update(kw)
    return TrainConfig(**base)
