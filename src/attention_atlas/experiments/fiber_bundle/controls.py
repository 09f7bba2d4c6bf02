"""The dot-product controls of the unregularised Fiber Bundle model (issue 53): a dot-product
model of the same blocks and heads matched in trainable parameters (:func:`matched_dot_width`),
in training FLOPs (more steps by :func:`flop_ratio`) and in wall clock (a time schedule), as
chapter 4's char-PTB grid (:func:`matched_dot_controls`) and its MQAR preset (:mod:`.mqar`)
build them.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch

from attention_atlas.models import FiberBundleConfig, ModelConfig, param_counts
from attention_atlas.train import measure_flops

__all__ = ["PTB_VOCAB", "flop_ratio", "matched_dot_controls", "matched_dot_width"]

#: char-PTB's vocabulary (the parameter counts of :func:`matched_dot_width` need it before any
#: data is loaded; a test checks it against the data)
PTB_VOCAB = 50


def matched_dot_width(model: dict[str, Any], vocab_size: int = PTB_VOCAB) -> int:
    """The width of the dot-product model (same blocks and heads, a head width that is a
    whole number) whose trainable-parameter count (:func:`param_counts`) is closest to the
    Fiber Bundle model's of the same ``model`` settings (ties to the narrower)."""
    return _matched_dot_width(tuple(sorted(model.items())), vocab_size)


@functools.lru_cache(maxsize=8)
def _matched_dot_width(model: tuple[tuple[str, Any], ...], vocab_size: int) -> int:
    m = dict(model)
    target = param_counts(FiberBundleConfig(**m, vocab_size=vocab_size).build())["total"]
    h, best = int(m["n_heads"]), (math.inf, 0)
    for width in range(h, 16 * int(m["dim"]) + 1, h):  # the count grows with the width
        total = param_counts(ModelConfig(**{**m, "dim": width}, vocab_size=vocab_size).build())
        best = min(best, (abs(total["total"] - target), width))
        if total["total"] > target:
            return int(best[1])
    raise ValueError(f"no dot-product width up to {16 * int(m['dim'])} reaches {target} parameters")


def flop_ratio(model: dict[str, Any], batch_size: int, seq_len: int,
               vocab_size: int = PTB_VOCAB) -> float:  # fmt: skip
    """Training FLOPs of one step of the unregularised Fiber Bundle model over the dot-product
    model's at the same settings, counted by
    :func:`~attention_atlas.train.measure_flops` (``train_step_total``: the matrix products
    FlopCounterMode counts, forward and backward; the element-wise work of the geodesic
    scores is not counted, so this ratio is a lower bound on the Fiber Bundle model's)."""
    return _flop_ratio(tuple(sorted(model.items())), batch_size, seq_len, vocab_size)


@functools.lru_cache(maxsize=8)
def _flop_ratio(model: tuple[tuple[str, Any], ...], batch_size: int, seq_len: int,
                vocab_size: int) -> float:  # fmt: skip
    m = dict(model)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        x = torch.randint(0, vocab_size, (batch_size, seq_len))
        y = torch.randint(0, vocab_size, (batch_size, seq_len))
        fbt, dot = (measure_flops(cfg.build(), x, y)["train_step_total"]
                    for cfg in (FiberBundleConfig(**m, vocab_size=vocab_size),
                                ModelConfig(**m, vocab_size=vocab_size)))  # fmt: skip
    return fbt / dot


def matched_dot_controls(
    model: dict[str, Any], train: dict[str, Any], time_budget_s: float
) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """The dot-product controls of the unregularised Fiber Bundle model (issue 53), name ->
    ``(model settings, training settings)``: ``dot_params``, as many parameters
    (:func:`matched_dot_width`); ``dot_flops``, as many training FLOPs (the steps times
    :func:`flop_ratio`, the warm-up scaled alike); ``dot_time``, as much training wall clock
    (``schedule="time"`` over ``time_budget_s``, the steps a cap it does not reach)."""
    ratio = flop_ratio(model, int(train["batch_size"]), int(train["seq_len"]))
    steps = int(round(train["steps"] * ratio))
    return {
        "dot_params": ({**model, "dim": matched_dot_width(model)}, train),
        "dot_flops": (model, {**train, "steps": steps,
                              "warmup_steps": max(1, steps // 10)}),
        "dot_time": (model, {**train, "steps": 100 * int(train["steps"]), "schedule": "time",
                             "max_time_s": float(time_budget_s)}),
    }  # fmt: skip
