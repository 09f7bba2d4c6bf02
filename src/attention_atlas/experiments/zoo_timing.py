"""Chapter 9's timing: one training step of every arm at the centre cell, side by side against
dot-product attention (:func:`attention_atlas.bench.compare`), as a cell of the zoo grid."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

__all__ = ["time_cell", "training_step"]


def training_step(
    variant: str, model: dict[str, Any], x: Tensor, y: Tensor, cofactor: dict[str, Any], seed: int
) -> Callable[[], Tensor]:
    """One AdamW step (forward, loss, backward, update) of a fresh ``variant`` model on the batch
    ``(x, y)``, as a callable for :func:`~attention_atlas.bench.compare` (gradients on even under
    its ``no_grad``). The ``"cofactor"`` arm adds its regulariser (with the probabilities)."""
    from ..attention.registry import get_regularizer
    from ..train.evaluate import cross_entropy
    from .zoo import model_config, quiet_no_mlp

    with torch.random.fork_rng(devices=[]), quiet_no_mlp():
        torch.manual_seed(seed)
        net = model_config(variant, {**model, "max_len": x.shape[1]}).build()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    reg = get_regularizer("cofactor")[0] if variant == "cofactor" else None
    opts = {k: v for k, v in cofactor.items() if k != "weight"}

    def step() -> Tensor:
        with torch.enable_grad():
            out = net(x, need_weights=reg is not None)
            loss = cross_entropy(out.logits, y)
            if reg is not None:
                loss = loss + cofactor["weight"] * reg(net, out, (x, y), **opts)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        return loss.detach()

    return step


def time_cell(params: dict[str, Any], seed: int) -> dict[str, Any]:
    """Median milliseconds of one training step of each arm (``<variant>_ms``) and its ratio to
    dot's (``ratio_<variant>``), timed in interleaved rounds on one MQAR batch drawn from
    ``seed``."""
    from ..bench import compare
    from ..data import mqar_task

    task = mqar_task(**params["task"], seed=seed)
    x, y = task.train_x[: params["batch_size"]], task.train_y[: params["batch_size"]]
    model = {**params["model"], "vocab_size": int(params["task"]["vocab_size"])}
    arm = params.get("arm_model", {})  # each arm's own model settings (the SSM's initialisation)
    fns = {v: training_step(v, {**model, **arm.get(v, {})}, x, y, params["cofactor"], seed)
           for v in params["variants"]}  # fmt: skip
    res = compare(fns, "dot", (), backward=False, warmup=1, reps=params["reps"], memory=False)
    out: dict[str, Any] = {"batch_size": params["batch_size"], "seq_len": x.shape[1]}
    for v, r in res["results"].items():
        out[f"{v}_ms"] = 1e3 * r["forward"]["median_s"]
        out[f"ratio_{v}"] = r["forward"]["ratio_median"]
    return out
