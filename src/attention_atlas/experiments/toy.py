"""A tiny experiment for the sweep runner's own tests and for ``results verify`` in CI.

One causal dot-product attention layer (:class:`~attention_atlas.attention.dot.DotProductAttention`
through the registry) learns the previous-token copy task: at position ``t >= 1`` predict
``x_{t-1}`` from ``x_{<=t}``. Token and position embeddings ``(V, D)``, ``(L, D)``, the
attention layer, a linear read-out ``(D, V)``; Adam for ``steps`` steps on fresh random batches.
A cell takes well under a second on one CPU thread and is deterministic there (same seed, same
numbers, bit for bit), so tests can compare backends exactly and CI can re-run a stored cell.

``python -m attention_atlas sweep toy --preset book --seeds 0`` makes the stored cells in
``results/toy/book/``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attention_atlas.attention.registry import build_attention
from attention_atlas.train import take_step
from attention_atlas.validate import ConfigError, check_count, check_number

__all__ = ["PRESETS", "PreviousTokenModel", "chapter_grid", "check_cell", "run_cell"]

#: the experiment's name on the command line and in the results store
NAME = "toy"

#: parameter sets of ``python -m attention_atlas sweep toy --preset NAME``
PRESETS: dict[str, dict[str, Any]] = {
    "smoke": {"steps": 5, "dims": [8]},
    "book": {},
}


class PreviousTokenModel(nn.Module):
    """Embeddings, one causal attention layer and a read-out: tokens ``(B, L)`` -> logits
    ``(B, L, V)``."""

    def __init__(self, vocab: int, seq_len: int, dim: int, n_heads: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq_len, dim)
        self.attn = build_attention("dot", dim=dim, n_heads=n_heads)
        self.out = nn.Linear(dim, vocab)

    def forward(self, x: Tensor) -> Tensor:
        h = self.tok(x) + self.pos(torch.arange(x.shape[1], device=x.device))  # (B, L, D)
        return self.out(h + self.attn(h, causal=True).out)  # (B, L, V)


def chapter_grid(
    *,
    steps: int = 30,
    dims: list[int] | tuple[int, ...] = (8, 16),
    vocab: int = 8,
    seq_len: int = 8,
    batch_size: int = 16,
    n_heads: int = 2,
    lr: float = 3e-2,
) -> dict[str, dict[str, Any]]:
    """One configuration per model width: ``dim-<D>`` -> its parameters (each checked: a
    ``ValueError`` names the first one out of range)."""
    counts = {"steps": steps, "vocab": vocab, "seq_len": seq_len, "batch_size": batch_size,
              "n_heads": n_heads, **{f"dims[{i}]": d for i, d in enumerate(dims)}}  # fmt: skip
    _check_counts(counts)
    check_number("lr", lr)
    for d in dims:
        if d % n_heads:
            raise ConfigError(f"dims: {d} is not divisible by n_heads={n_heads}")
    return {
        f"dim-{d}": {
            "dim": int(d),
            "n_heads": n_heads,
            "vocab": vocab,
            "seq_len": seq_len,
            "batch_size": batch_size,
            "steps": steps,
            "lr": lr,
        }  # fmt: skip
        for d in dims
    }


def _check_counts(counts: dict[str, Any], least: dict[str, int] | None = None) -> None:
    """Each value an integer >= 1 (>= ``least[name]`` where given), else ConfigError naming it."""
    for name, value in counts.items():
        check_count(name, value, (least or {}).get(name, 1))


def check_cell(params: dict[str, Any]) -> None:
    """Check one configuration's parameters before any work: ``steps``, ``vocab``,
    ``batch_size``, ``n_heads``, ``dim`` integers >= 1, ``seq_len`` >= 2 (position ``t >= 1``
    predicts token ``t - 1``: one position leaves nothing to predict), ``lr`` a finite number
    > 0, ``dim`` divisible by ``n_heads``. (The cell builds its own small model, no
    training or model configuration.) Raises ConfigError (one line)."""
    _check_counts({k: params[k] for k in ("steps", "vocab", "seq_len", "batch_size", "n_heads",
                                          "dim")}, least={"seq_len": 2})  # fmt: skip
    check_number("lr", params["lr"])
    if params["dim"] % params["n_heads"]:
        raise ConfigError(f"dims: {params['dim']} is not divisible by n_heads={params['n_heads']}")


def _batch(gen: torch.Generator, batch_size: int, seq_len: int, vocab: int) -> Tensor:
    return torch.randint(vocab, (batch_size, seq_len), generator=gen)  # (B, L)


def _loss_and_accuracy(model: nn.Module, x: Tensor) -> tuple[Tensor, Tensor]:
    logits = model(x)[:, 1:]  # position t predicts x_{t-1}: (B, L-1, V)
    target = x[:, :-1]
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
    return loss, (logits.argmax(-1) == target).float().mean()


def _loss(model: nn.Module, x: Tensor) -> Tensor:
    return _loss_and_accuracy(model, x)[0]


def run_cell(params: dict[str, Any], seed: int) -> dict[str, Any]:
    """Train :class:`PreviousTokenModel` with ``params`` at ``seed`` on the CPU.

    Returns ``loss_initial``, ``loss_final``, ``accuracy_final`` (cross-entropy in nats and
    accuracy on one held-out batch of 64 sequences, before and after training) and ``history``
    (``step``, ``loss``: the training loss of every step).
    """
    torch.manual_seed(seed)
    model = PreviousTokenModel(params["vocab"], params["seq_len"], params["dim"], params["n_heads"])
    gen = torch.Generator().manual_seed(10_000 + seed)
    held_out = _batch(gen, 64, params["seq_len"], params["vocab"])
    opt = torch.optim.Adam(model.parameters(), lr=params["lr"])
    with torch.no_grad():
        loss_initial = float(_loss_and_accuracy(model, held_out)[0])
    losses = []
    for step in range(params["steps"]):
        batch = _batch(gen, params["batch_size"], params["seq_len"], params["vocab"])
        res = take_step(model, opt, batch, objective=_loss, step=step)
        losses.append(res.loss.item())
    with torch.no_grad():
        loss_final, acc_final = _loss_and_accuracy(model, held_out)
    return {
        "loss_initial": loss_initial,
        "loss_final": float(loss_final),
        "accuracy_final": float(acc_final),
        "history": {"step": list(range(1, len(losses) + 1)), "loss": losses},
    }
