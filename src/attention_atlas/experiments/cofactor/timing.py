"""Chapter 6's timings: what the cofactor regulariser costs in a training step, and why the
language model is trained at character level.

:func:`step_overhead` times whole optimiser steps of the training harness (forward, loss,
regulariser, backward, clipping, AdamW: the harness's own step function, nothing
re-implemented) for the baseline arm, the regularised arm, and the regularised arm by the
reference path (every head's probabilities from the explicit attention path, and torch's
autograd through the LU: the implementation before the fast path of
:mod:`attention_atlas.cofactor.penalty`), interleaved in one process by
:func:`attention_atlas.bench.timing.compare`, with the CPU-time ratios
(:func:`attention_atlas.bench.timing.cpu_time_ratio`) beside the wall-time ones.
:func:`lm_step_seconds` times one step of the language model at word and at character level.
``python benchmarks/bench_cofactor.py --step`` runs :func:`step_overhead` from the command line.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from attention_atlas.bench.timing import compare, cpu_time_ratio
from attention_atlas.data import TextCorpus
from attention_atlas.models import ModelConfig, Transformer
from attention_atlas.models.hooks import available_regularizers, register_regularizer
from attention_atlas.train import TrainConfig, batch_step, build_run, step_callable

__all__ = ["REFERENCE", "lm_step_seconds", "step_overhead"]

#: the registered name of the reference path (registered on first use by :func:`step_overhead`)
REFERENCE = "cofactor_reference"


def _reference(model: Any, output: Any, batch: Any, **options: Any) -> Tensor:
    """The cofactor regulariser as it was before the fast path: the output's probabilities of
    every head (the forward runs with ``need_weights=True``), torch's autograd through the LU."""
    from attention_atlas.cofactor.penalty import regularizer

    return regularizer(model, output, batch, **{**options, "method": "lu-autograd"})


def _harness_step(
    params: dict[str, Any], reg: dict[str, Any] | None, seed: int
) -> Callable[[], Tensor]:
    """One call = one optimiser step of the harness's run of ``params`` (a configuration of
    :func:`~attention_atlas.experiments.cofactor.run.chapter_grid`) with regulariser ``reg``."""
    from .run import load_task

    tp = dict(params["train"])
    tcfg = TrainConfig(**tp, seed=seed, progress=False, measure_flops=False, effective_rank=False,
                       regularizers=[reg] if reg else [])  # fmt: skip
    data = load_task(params["task"], params["lm_level"])
    return step_callable(build_run(ModelConfig(**params["model"]), tcfg, data, "cpu"))


def step_overhead(
    grid: dict[str, dict[str, Any]], task: str, *, reps: int = 7, warmup: int = 2,
    min_sample_s: float = 0.05, reference: bool = True, seed: int = 0,
) -> dict[str, Any]:  # fmt: skip
    """Training steps of ``task``'s baseline and regularised configurations of ``grid``, side
    by side: :func:`~attention_atlas.bench.timing.compare` of ``baseline``, ``cofactor`` (the fast
    path) and, with ``reference``, ``reference`` (module docstring). ``meta`` holds the shape,
    and ``cpu_time_ratio`` (``{name: CPU time / baseline CPU time}``, median of ``reps``)."""
    if reference and REFERENCE not in available_regularizers():
        register_regularizer(REFERENCE, needs_weights=True)(_reference)
    base, reg = grid[f"{task}_baseline"], grid[f"{task}_cofactor"]
    arms: dict[str, dict[str, Any] | None] = {"baseline": None, "cofactor": reg["regularizer"]}
    if reference:
        arms["reference"] = {**reg["regularizer"], "name": REFERENCE}
    with torch.random.fork_rng(devices=[]):
        fns = {name: _harness_step(base, spec, seed) for name, spec in arms.items()}
    m, t = base["model"], base["train"]
    meta = {"task": task, "batch": t["batch_size"], "n": t["seq_len"] if task == "lm" else
            m["max_len"], "dim": m["dim"], "n_layers": m["n_layers"], "n_heads": m["n_heads"],
            "reg_heads": reg["regularizer"]["heads"], "beta": reg["regularizer"]["beta"]}  # fmt: skip
    res = compare(fns, "baseline", (), backward=False, warmup=warmup, reps=reps,
                  min_sample_s=min_sample_s, memory=False, meta=meta)  # fmt: skip
    res["meta"]["cpu_time_ratio"] = {
        name: cpu_time_ratio(f, fns["baseline"], (), reps=reps, min_sample_s=min_sample_s)
        for name, f in fns.items() if name != "baseline"
    }  # fmt: skip
    return res


def _training_step(
    cfg: ModelConfig, corpus: TextCorpus, batch: int, seq_len: int
) -> Callable[[], Tensor]:
    """One AdamW step of a fresh model (seed 0) on one random batch of ``corpus``, as a callable
    for :func:`~attention_atlas.bench.timing.compare` (gradients on even under its ``no_grad``)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Transformer(cfg)
        starts = torch.randint(0, corpus.train.numel() - seq_len - 1, (batch,))
    win = corpus.train[starts[:, None] + torch.arange(seq_len + 1)]
    x, y = win[:, :-1], win[:, 1:]
    return batch_step(model, torch.optim.AdamW(model.parameters(), lr=1e-3), (x, y))


def lm_step_seconds(
    corpora: dict[str, TextCorpus], *, dim: int, n_layers: int, n_heads: int, batch: int,
    seq_len: int, reps: int,
) -> dict[str, float]:  # fmt: skip
    """Median seconds of one training step of the language model on each corpus (its vocabulary
    sets the output layer), timed side by side by :func:`~attention_atlas.bench.timing.compare`."""
    from .run import model_config

    fns = {
        name: _training_step(ModelConfig(**model_config("lm", c, dim, n_layers, n_heads, seq_len)),
                             c, batch, seq_len)
        for name, c in corpora.items()
    }  # fmt: skip
    res = compare(fns, next(iter(fns)), (), backward=False, warmup=1, reps=reps, memory=False)
    return {name: r["forward"]["median_s"] for name, r in res["results"].items()}
