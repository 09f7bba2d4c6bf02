"""Chapter 4's experiment: the Fiber Bundle Transformer on char-PTB, predictions P1 to P6.

One grid of configurations (:func:`chapter_grid`), each trained from scratch at every seed by
:func:`run_cell` (train, then :func:`~attention_atlas.experiments.fiber_bundle_analysis.analyse`),
run by the resumable sweep runner::

    python -m attention_atlas sweep fiber-bundle --preset book --seeds 0 1 2

:func:`run_chapter` runs (or resumes) the grid for the chapter and loads every cell;
:func:`step_cost` times one training step of each variant against the dot-product model, side by
side (:func:`attention_atlas.bench.compare`). The analysis of the finished cells is
:mod:`attention_atlas.experiments.fiber_bundle_analysis`.
"""

from __future__ import annotations

import inspect
import json
import math
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from ..attention.riemannian.regularizers import fiber_bundle_regularizers
from ..bench import compare
from ..data import eval_windows, load_char_ptb
from ..models import (
    PHASES,
    FiberBundleConfig,
    ModelConfig,
    evaluated_at_alpha,
    metric_factors,
    param_counts,
)
from ..sweep import load_cell, make_cells, run_sweep
from ..train import TrainConfig, evaluate, seed_everything, train
from .fiber_bundle_analysis import Runs, analyse

__all__ = [
    "PRESETS",
    "chapter_grid",
    "kappa_scale",
    "run_cell",
    "run_chapter",
    "step_cost",
    "sweep_command",
]

#: parameter sets of ``python -m attention_atlas sweep fiber-bundle --preset NAME``
PRESETS: dict[str, dict[str, Any]] = {
    "smoke": {"steps": 6, "dim": 32, "n_heads": 2, "batch_size": 4, "seq_len": 32, "ranks": [1, 4],
              "alphas": [0.0, 1.0], "kappa_factors": [1.0, 10.0], "eval_alphas": [0.0, 1.0],
              "analyse_seqs": 8, "final_eval_batches": 2, "log_every": 3},
    "book": {},
    "ablations": {"ablations": True},
    "long": {"steps": 2000, "dim": 128, "n_heads": 8, "batch_size": 32, "seq_len": 128,
             "log_every": 200, "analyse_seqs": 128, "final_eval_batches": 64},
}  # fmt: skip


def kappa_scale(dim: int, n_heads: int, seq_len: int, tau: float | None = None) -> float:
    """The critical metric strength of Proposition 3.5, ``tau / L`` (``tau`` by default
    ``sqrt(2 d_head)``, the temperature the attention uses)."""
    d = dim // n_heads
    return (tau if tau is not None else math.sqrt(2.0 * d)) / seq_len


def chapter_grid(
    *,
    steps: int = 100,
    dim: int = 64,
    n_layers: int = 2,
    n_heads: int = 4,
    seq_len: int = 64,
    batch_size: int = 8,
    lr: float = 3e-3,
    log_every: int = 25,
    ranks: Sequence[int] = (1, 2, 4, 8),
    alphas: Sequence[float] = (0.0, 0.5, 1.0),
    kappa_factors: Sequence[float] = (0.1, 1.0, 10.0),
    default_kappa_factor: float = 1.0,
    eval_alphas: Sequence[float] = (0.0, 0.5, 1.0),
    analyse_seqs: int = 32,
    final_eval_batches: int = 8,
    reg_weights: dict[str, float] | None = None,
    ablations: bool = False,
) -> dict[str, dict[str, Any]]:
    """The configurations of chapter 4, sharing runs across predictions.

    ``dot`` is the baseline; ``fbt`` the default Fiber Bundle Transformer (rank 4, alpha 1, the
    three regularisers with the cap, ``kappa_max = default_kappa_factor * tau / L`` and
    ``kappa_min = kappa_max / 2``), which is also the "three regularisers" arm of P3, the
    ``alpha = 1`` arm of P2, the ``r = 4`` arm of P6 and one level of P1. The others change one
    thing each: ``fbt_reg-none``, ``fbt_reg-l2`` (P3), ``fbt_alpha-<a>`` (P2), ``fbt_rank-<r>``
    (P6), ``fbt_kappa-<c>`` (P1), and with ``ablations`` ``fbt_no-<phase>`` (each phase off alone).
    """
    eval_alphas = [float(a) for a in eval_alphas]
    scale = kappa_scale(dim, n_heads, seq_len)
    train = {
        "steps": steps, "batch_size": batch_size, "seq_len": seq_len, "lr": lr,
        "warmup_steps": max(1, steps // 10), "log_every": log_every, "eval_batches": 2,
        "final_eval_batches": final_eval_batches, "eval_batch_size": 32,
    }  # fmt: skip
    model = {"dim": dim, "n_layers": n_layers, "n_heads": n_heads, "max_len": seq_len}

    def fbt(
        rank: int = 4,
        alpha: float = 1.0,
        reg: str = "three",
        factor: float = default_kappa_factor,
        evals: list[float] | None = None,
        keep_tokens: bool = False,
        **phases: Any,
    ) -> dict[str, Any]:
        return {
            "kind": "fbt", "model": {**model, "rank": rank, "alpha": alpha, **phases}, "train": train,
            "reg": {"kind": reg, "kappa_max": factor * scale, "kappa_min": 0.5 * factor * scale,
                    "weights": reg_weights or {}},
            "kappa_factor": factor, "eval_alphas": evals or [], "analyse_seqs": analyse_seqs,
            "keep_tokens": keep_tokens,
        }  # fmt: skip

    grid: dict[str, dict[str, Any]] = {
        "dot": {"kind": "dot", "model": model, "train": train, "analyse_seqs": analyse_seqs},
        "fbt": fbt(evals=eval_alphas, keep_tokens=True),
    }
    for reg in ("none", "l2"):
        grid[f"fbt_reg-{reg}"] = fbt(reg=reg)
    for a in alphas:
        if a != 1.0:
            grid[f"fbt_alpha-{a:g}"] = fbt(alpha=a, evals=eval_alphas)
    for r in ranks:
        if r != 4:
            grid[f"fbt_rank-{r}"] = fbt(rank=r)
    for c in kappa_factors:
        if c != default_kappa_factor:
            grid[f"fbt_kappa-{c:g}"] = fbt(factor=c)
    if ablations:
        for ph in PHASES:
            off: dict[str, Any] = {f"phase_{ph}": False}
            grid[f"fbt_no-{ph}"] = fbt(**off)
        grid["fbt_cayley"] = fbt(transport_kind="cayley")
    return grid


def run_cell(params: dict[str, Any], seed: int) -> dict[str, Any]:
    """Train one configuration of :func:`chapter_grid` at ``seed`` on char-PTB and measure it.

    Returns scalars (``val_bpc``, ``train_time_s``, ``tokens_per_s``, parameter counts, the
    :func:`analyse` scalars, ``bpc_at_alpha_<a>`` for each evaluation alpha) and, in the cell's
    JSON only, ``history`` (the training log, diagnostics included) and, if asked, ``tokens``.
    """
    data = load_char_ptb()
    is_fbt = params["kind"] == "fbt"
    mcfg: ModelConfig = (
        FiberBundleConfig(**params["model"]) if is_fbt else ModelConfig(**params["model"])
    )
    tp = dict(params["train"])
    tcfg = _train_config(params, seed)
    t0 = time.perf_counter()
    out0 = _initial_metric_strength(mcfg, data, seed, tp["seq_len"]) if is_fbt else {}
    res = train(mcfg, tcfg, data)
    out: dict[str, Any] = {
        **out0,
        "val_bpc": res.final["val_bpc"],
        "train_time_s": res.final["train_time_s"],
        "tokens_per_s": res.final.get("tokens_per_s", math.nan),
    }
    pc = param_counts(res.model)
    out.update({f"params_{k}": v for k, v in pc.items()})
    an = analyse(res.model, data, seq_len=tp["seq_len"], n_seqs=int(params.get("analyse_seqs", 64)))
    tokens = an.pop("tokens")
    out.update(an)
    for a in params.get("eval_alphas", []):
        with evaluated_at_alpha(res.model, a):
            ev = evaluate(res.model, data, split="val", batch_size=tp.get("eval_batch_size", 32),
                          seq_len=tp["seq_len"], max_batches=tp.get("final_eval_batches"))  # fmt: skip
        out[f"bpc_at_alpha_{a:g}"] = ev["bpc"]  # prediction P2
    out["cell_train_and_measure_s"] = time.perf_counter() - t0
    out["history"] = res.history.to_dict(orient="list")
    if params.get("keep_tokens") and is_fbt:
        out["tokens"] = tokens.to_dict(orient="list")
    return out


def _train_config(params: dict[str, Any], seed: int) -> TrainConfig:
    """The harness configuration of a cell: its training parameters, and for a Fiber Bundle
    cell the regularisers of its kind (weights by :func:`_scaled_weights`) and the diagnostic."""
    tp = dict(params["train"])
    regs: list[dict[str, Any]] = []
    diags: list[dict[str, Any]] = []
    if params["kind"] == "fbt":
        reg = params["reg"]
        regs = fiber_bundle_regularizers(
            reg["kind"], steps=tp["steps"], kappa_min=reg["kappa_min"], kappa_max=reg["kappa_max"],
            weights=_scaled_weights(reg.get("weights", {}), reg["kappa_max"]),
        )  # fmt: skip
        diags = [
            {"name": "fiber_bundle", "kappa_min": reg["kappa_min"], "kappa_max": reg["kappa_max"]}
        ]
    return TrainConfig(**tp, seed=seed, progress=False, measure_flops=False, regularizers=regs,
                       diagnostics=diags)  # fmt: skip


@torch.no_grad()
def _initial_metric_strength(
    mcfg: ModelConfig, data: Any, seed: int, seq_len: int
) -> dict[str, float]:
    """``kappa_init_<l>``: mean ``|U_t|_F^2`` of each layer at initialisation (the same initial
    weights as the training run: same seed, same construction order), on 8 validation windows."""
    cfg = replace(mcfg, vocab_size=int(data.vocab_size), max_len=max(mcfg.max_len, seq_len))
    seed_everything(seed)
    model = cfg.build().eval()
    x, _ = next(eval_windows(data.valid, 8, seq_len))
    out = model(x)
    return {
        f"kappa_init_{i + 1}": float((U**2).sum((-1, -2)).mean())
        for i, U in enumerate(metric_factors(out))
    }


def _scaled_weights(weights: dict[str, float], kappa_max: float) -> dict[str, float]:
    """Default regulariser weights made scale-free in the metric strength: the diversity and
    smoothness terms grow like ``kappa^2``, so their weights are divided by ``kappa_max``
    (their gradient then stays O(1) at the cap); the hinge terms (anti-flatness, cap) are linear
    in ``kappa`` and keep theirs, the cap ten times stronger than the diversity push."""
    w = {"anti": 1.0, "div": 1.0 / kappa_max, "smooth": 0.1 / kappa_max, "cap": 10.0, "l2": 1.0}
    w.update(weights)
    return w


def sweep_command(grid_kwargs: dict[str, Any], seeds: Sequence[int], out: str | Path) -> str:
    """The command line that runs (or resumes) the grid of ``chapter_grid(**grid_kwargs)``:
    the book preset with ``-p`` for each parameter that differs from the default."""
    defaults = {k: p.default for k, p in inspect.signature(chapter_grid).parameters.items()}
    overrides = " ".join(
        f"-p {k}={json.dumps(v).replace(' ', '')}"
        for k, v in grid_kwargs.items()
        if json.dumps(v) != json.dumps(defaults[k])
    )
    return (
        f"python -m attention_atlas sweep fiber-bundle --preset book --seeds {' '.join(map(str, seeds))}"
        + (f" {overrides}" if overrides else "")
        + f" --out {out}"
    )


def run_chapter(
    grid_kwargs: dict[str, Any], seeds: Sequence[int], results_dir: str | Path, repo: Path
) -> Runs:
    """Run (or resume) the chapter's grid over ``seeds`` and load every cell.

    ``results_dir``: the sweep folder (relative to ``repo``), or empty for a temporary one;
    cells already there are reused. Prints the size of the grid, the command that reruns it and
    the sweep's progress.
    """
    grid = chapter_grid(**grid_kwargs)
    cells = make_cells(grid, seeds)
    out_dir = Path(results_dir) if results_dir else Path(tempfile.mkdtemp(prefix="fbt-"))
    if not out_dir.is_absolute():
        out_dir = repo / out_dir
    command = sweep_command(grid_kwargs, seeds, results_dir or out_dir)
    print(f"{len(grid)} configurations x {len(seeds)} seeds = {len(cells)} runs")
    print("command:", command)
    t0 = time.perf_counter()
    df = run_sweep(cells, run_cell, out_dir)
    print(
        f"sweep finished in {time.perf_counter() - t0:.0f} s (cells already in {out_dir} are reused)"
    )
    if len(df) != len(cells):
        raise RuntimeError(
            f"{len(cells) - len(df)} of {len(cells)} cells have no result in {out_dir}"
        )
    full = {(c.config, c.seed): load_cell(out_dir, c) for c in cells}
    return Runs(grid, list(seeds), df, full, int(grid_kwargs.get("n_layers", 2)), command)


def step_cost(
    *,
    dim: int,
    n_layers: int,
    n_heads: int,
    seq_len: int,
    batch_size: int,
    ranks: Sequence[int],
    reps: int,
    vocab_size: int = 50,
) -> pd.DataFrame:
    """One forward and one forward+backward of each model on the same batch, timed in one
    process, interleaved, on one thread (as the training runs): the dot-product model, the default
    Fiber Bundle Transformer, its metric ranks, each phase switched off alone, and the Cayley
    transport. Returns one row per model: median ``forward ratio`` and ``forward+backward ratio``
    to the dot-product model, and ``forward+backward ms``."""
    base: dict[str, Any] = {"vocab_size": vocab_size, "dim": dim, "n_layers": n_layers, "n_heads": n_heads,
            "max_len": seq_len}  # fmt: skip
    variants: dict[str, ModelConfig] = {
        "dot": ModelConfig(**base),
        "fbt": FiberBundleConfig(**base),
    }
    for r in ranks:
        if r != 4:
            variants[f"fbt_rank-{r}"] = FiberBundleConfig(**base, rank=r)
    for ph in PHASES:
        variants[f"fbt_no-{ph}"] = FiberBundleConfig(**{**base, f"phase_{ph}": False})
    variants["fbt_cayley"] = FiberBundleConfig(**base, transport_kind="cayley")
    threads_before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        x = torch.randint(0, vocab_size, (batch_size, seq_len))
        fns = {name: _logits_fn(cfg.build()) for name, cfg in variants.items()}
        timing = compare(fns, "dot", (x,), reps=reps, warmup=1, memory=False)
    finally:
        torch.set_num_threads(threads_before)
    return pd.DataFrame(
        {name: {"forward ratio": r["forward"]["ratio_median"],
                "forward+backward ratio": r["forward_backward"]["ratio_median"],
                "forward+backward ms": 1e3 * r["forward_backward"]["median_s"]}
         for name, r in timing["results"].items()}
    ).T  # fmt: skip


def _logits_fn(model: torch.nn.Module) -> Any:
    """``x -> model(x).logits``, with the model's parameters as the backward's inputs."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        return model(x).logits

    fn.bench_params = [p for p in model.parameters() if p.requires_grad]  # type: ignore[attr-defined]
    return fn
