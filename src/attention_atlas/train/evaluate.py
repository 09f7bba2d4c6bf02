"""The loss, evaluation on a split, and the diagnostics logged at each log step."""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from attention_atlas.data import IGNORE_INDEX, ArrayTask, TextCorpus, eval_windows
from attention_atlas.linalg import effective_rank
from attention_atlas.models import ModelOutput, Transformer
from attention_atlas.models.hooks import get_diagnostic

from .config import TrainConfig, spec_name
from .ddp import rank_world

__all__ = ["cross_entropy", "diagnostics", "eval_batches", "evaluate"]


def cross_entropy(logits: Tensor, y: Tensor, reduction: str = "mean") -> Tensor:
    """The training loss: next-token ``(B, L, V)`` against ``(B, L)`` (positions equal to
    ``IGNORE_INDEX`` not scored), or classes ``(B, C)`` against ``(B,)``; in float32."""
    if logits.dim() == 3:  # (B, L, V) against (B, L)
        return F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1),
            ignore_index=IGNORE_INDEX, reduction=reduction,
        )  # fmt: skip
    return F.cross_entropy(logits.float(), y, reduction=reduction)  # (B, C) against (B,)


def eval_batches(
    data: TextCorpus | ArrayTask, split: str, batch_size: int, seq_len: int, max_batches: int | None
) -> Iterator[tuple[Tensor, Tensor]]:
    """Deterministic ``(x, y)`` batches of a split: consecutive windows of a corpus stream, or
    the validation (or test) rows of an array task in order."""
    if isinstance(data, TextCorpus):
        tokens = {"val": data.valid, "valid": data.valid, "test": data.test}[split]
        yield from eval_windows(tokens, batch_size, seq_len, max_batches)
        return
    if split == "test":
        if data.test_x is None or data.test_y is None:
            raise ValueError(f"{data.name} has no test split")
        xs, ys = data.test_x, data.test_y
    else:
        xs, ys = data.val_x, data.val_y
    n = xs.shape[0]
    for bi, i in enumerate(range(0, n, batch_size)):
        if max_batches is not None and bi >= max_batches:
            break
        yield xs[i : i + batch_size], ys[i : i + batch_size]


@torch.no_grad()
def evaluate(
    model: Transformer,
    data: TextCorpus | ArrayTask,
    *,
    split: str = "val",
    batch_size: int = 32,
    seq_len: int = 128,
    max_batches: int | None = None,
    device: torch.device | None = None,
) -> dict[str, float]:
    """Mean loss (per scored token or example), accuracy, and bpc/ppl for corpora.

    Under DDP the batches are shared out across ranks and the sums all-reduced.
    """
    device = device or next(model.parameters()).device
    was_training = model.training
    model.eval()
    rank, world = rank_world()
    sums = torch.zeros(3, dtype=torch.float64, device=device)  # loss sum, correct, count
    for bi, (x, y) in enumerate(eval_batches(data, split, batch_size, seq_len, max_batches)):
        if bi % world != rank:
            continue
        x, y = x.to(device), y.to(device)
        logits = model(x).logits
        sums[0] += cross_entropy(logits, y, reduction="sum").double()
        valid = y != IGNORE_INDEX
        sums[1] += ((logits.argmax(-1) == y) & valid).sum()
        sums[2] += valid.sum()
    if world > 1:
        dist.all_reduce(sums)
    model.train(was_training)
    loss = float(sums[0] / sums[2].clamp_min(1))
    out = {"loss": loss, "acc": float(sums[1] / sums[2].clamp_min(1)), "n": float(sums[2])}
    if isinstance(data, TextCorpus):
        if data.level == "char":
            out["bpc"] = loss / math.log(2)
        else:
            out["ppl"] = math.exp(min(loss, 700.0))
    return out


@torch.no_grad()
def diagnostics(
    model: Transformer, batch: tuple[Tensor, Tensor], cfg: TrainConfig
) -> dict[str, float]:
    """need_weights forward on a few sequences: non-finite logits, effective ranks, diagnostics."""
    was_training = model.training
    model.eval()
    x, y = batch
    out: ModelOutput = model(x, need_weights=True)
    row: dict[str, float] = {}
    row["nonfinite_logits"] = float(
        sum(float(r.diagnostics.get("nonfinite_logits", torch.tensor(0))) for r in out.attentions)
    )
    row["nonfinite_out"] = float(
        sum(float(r.diagnostics.get("nonfinite_out", torch.tensor(0))) for r in out.attentions)
    )
    if cfg.effective_rank:
        for i, h in enumerate(out.hidden):
            row[f"erank_{i}"] = float(effective_rank(h.float()).mean())
    for spec in cfg.diagnostics:
        fn = get_diagnostic(spec_name("diagnostic", spec))
        opts = {k: v for k, v in spec.items() if k != "name"}
        for k, v in fn(model, out, batch, **opts).items():
            row[f"{spec['name']}/{k}"] = float(v)
    model.train(was_training)
    return row
