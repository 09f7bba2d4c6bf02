"""Chapter 6's experiment: the seed's cofactor regulariser in training, at equal training FLOPs.

A 6-layer pre-norm Transformer is trained by the harness (:func:`attention_atlas.train.train`)
on two tasks, each without and with the ``"cofactor"`` regulariser
(:mod:`attention_atlas.cofactor.penalty`, ``alpha * (-log(|m| + eps) + beta KL(u || pi))`` on the
first ``reg_heads`` head(s) of every layer):

* ``lm_*``: WikiText-2 language modelling (causal; ``lm_level`` ``"char"`` or ``"word"``);
* ``digits_*``: scikit-learn's 8x8 digits as sixteen 2x2 patch tokens (bidirectional).

**Equal training FLOPs.** :func:`training_flops` counts a baseline step with
:func:`attention_atlas.train.measure_flops` and adds the LU behind the penalty (which a FLOP
counter cannot see) from :func:`~attention_atlas.cofactor.penalty.cofactor_flops`; the regularised
arm gets ``round(steps * base / (base + extra))`` steps (:func:`chapter_grid`).

Per run (:func:`run_cell`): validation loss and accuracy, the gradient-norm statistics of
:func:`grad_stats` (from the harness's per-step callback), and the cofactor diagnostics of the
regularised heads and of all heads on ``probe_items`` validation sequences. The analysis
(:func:`summary_table`, :func:`criteria`) pairs the arms by seed. The timing helpers of the
chapter (:func:`lm_step_seconds`, :func:`regularizer_overhead`) go through
:func:`attention_atlas.bench.compare`.

``python -m attention_atlas sweep cofactor --preset book`` runs the grid (resumable: a finished
cell is never re-run).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from ..bench import compare
from ..cofactor import cofactor_diagnostics, cofactor_flops, cofactor_regularizer_from_probs
from ..data import ArrayTask, TextCorpus, load_digits_patches, load_wikitext2
from ..models import ModelConfig, Transformer
from ..stats import Interval, mean_interval, paired_difference
from ..train import TrainConfig, measure_flops, train

__all__ = [
    "CRITERIA",
    "PRESETS",
    "SUMMARY_METRICS",
    "Criterion",
    "chapter_grid",
    "criteria",
    "criteria_table",
    "flops_table",
    "grad_norm_matrix",
    "grad_stats",
    "lm_step_seconds",
    "paired_effect",
    "load_task",
    "regularizer_overhead",
    "run_cell",
    "summary_table",
    "training_flops",
]

#: parameter sets of ``python -m attention_atlas sweep cofactor --preset NAME``
PRESETS: dict[str, dict[str, Any]] = {
    "smoke": {"train_steps": 4, "lm_seq_len": 16, "lm_batch": 4, "lm_dim": 16, "digits_batch": 16,
              "digits_dim": 16, "n_layers": 2, "n_heads": 2, "eval_batches": 1,
              "final_eval_batches": 1, "log_every": 3},
    "book": {},
    "long": {"train_steps": 2000, "lm_seq_len": 64, "lm_batch": 32, "lm_dim": 128,
             "digits_dim": 128, "n_heads": 8, "log_every": 200, "final_eval_batches": 64},
}  # fmt: skip

TASKS = ("lm", "digits")
ARMS = ("baseline", "cofactor")


@functools.lru_cache(maxsize=4)
def load_task(name: str, level: str = "char") -> TextCorpus | ArrayTask:
    """The data of a task: ``"lm"`` (WikiText-2 at ``level``, from the local data folder) or
    ``"digits"`` (2x2 patches)."""
    if name == "lm":
        return load_wikitext2(mode=level, download=False)
    if name == "digits":
        return load_digits_patches(2)
    raise ValueError(f"task must be one of {TASKS}, got {name!r}")


def _model(task: str, data: TextCorpus | ArrayTask, dim: int, n_layers: int, n_heads: int,
           seq_len: int) -> dict[str, Any]:  # fmt: skip
    """The model configuration (as a dict) of a task."""
    if task == "lm":
        return {"task": "lm", "vocab_size": int(data.vocab_size), "dim": dim,
                "n_layers": n_layers, "n_heads": n_heads, "max_len": seq_len}  # fmt: skip
    assert isinstance(data, ArrayTask)
    return {"task": "classify", "patch_dim": int(data.patch_dim), "n_classes": 10, "dim": dim,
            "n_layers": n_layers, "n_heads": n_heads, "max_len": data.seq_len}  # fmt: skip


def _first_batch(data: TextCorpus | ArrayTask, batch: int, seq_len: int) -> tuple[Tensor, Tensor]:
    """``(x, y)``: the first ``batch`` training examples (windows of ``seq_len + 1`` tokens)."""
    if isinstance(data, TextCorpus):
        win = data.train[torch.arange(batch)[:, None] * seq_len + torch.arange(seq_len + 1)]
        return win[:, :-1], win[:, 1:]
    return data.train_x[:batch], data.train_y[:batch]


def training_flops(
    model: dict[str, Any], data: TextCorpus | ArrayTask, batch: int, seq_len: int, reg_heads: int
) -> dict[str, float]:
    """FLOPs of one training step: ``step`` (the model, :func:`measure_flops`), ``regularizer``
    (``cofactor_flops(n)`` per regularised matrix: ``batch * n_layers * reg_heads`` matrices of
    size ``n``), ``matrices``. The global RNG is left as it was."""
    x, y = _first_batch(data, batch, seq_len)
    with torch.random.fork_rng(devices=[]):
        base = measure_flops(Transformer(ModelConfig(**model)), x, y)["train_step_total"]
    mats = batch * int(model["n_layers"]) * reg_heads
    return {"step": float(base), "regularizer": float(mats * cofactor_flops(x.shape[1])),
            "matrices": mats}  # fmt: skip


def chapter_grid(
    *,
    lm_level: str = "char",
    train_steps: int = 200,
    lm_seq_len: int = 32,
    lm_batch: int = 16,
    lm_dim: int = 48,
    digits_batch: int = 32,
    digits_dim: int = 48,
    n_layers: int = 6,
    n_heads: int = 4,
    reg_heads: int = 1,
    alpha: float = 1e-3,
    beta: float = 0.1,
    lr: float = 3e-3,
    eval_batches: int = 4,
    final_eval_batches: int = 16,
    log_every: int = 50,
    spike_ratio: float = 2.0,
    probe_items: int = 32,
) -> dict[str, dict[str, Any]]:
    """The four configurations ``{lm,digits}_{baseline,cofactor}``; the regularised arm of each
    task gets the steps that match the baseline's training FLOPs (:func:`training_flops`)."""
    grid: dict[str, dict[str, Any]] = {}
    for task in TASKS:
        data = load_task(task, lm_level)
        batch, dim = (lm_batch, lm_dim) if task == "lm" else (digits_batch, digits_dim)
        model = _model(task, data, dim, n_layers, n_heads, lm_seq_len)
        flops = training_flops(model, data, batch, lm_seq_len, reg_heads)
        for arm in ARMS:
            base, extra = flops["step"], flops["regularizer"] if arm == "cofactor" else 0.0
            steps = int(round(train_steps * base / (base + extra)))  # equal training FLOPs
            grid[f"{task}_{arm}"] = {
                "task": task, "arm": arm, "lm_level": lm_level, "model": model, "flops": flops,
                "train": {"steps": steps, "batch_size": batch, "seq_len": lm_seq_len, "lr": lr,
                          "warmup_steps": max(1, steps // 10), "log_every": log_every,
                          "eval_batches": eval_batches, "eval_batch_size": 32,
                          "final_eval_batches": final_eval_batches if task == "lm" else None},
                "regularizer": {"name": "cofactor", "weight": alpha, "heads": reg_heads,
                                "beta": beta} if arm == "cofactor" else None,
                "reg_heads": reg_heads, "spike_ratio": spike_ratio, "probe_items": probe_items,
            }  # fmt: skip
    return grid


def flops_table(grid: dict[str, dict[str, Any]]) -> pd.DataFrame:
    """Per task of :func:`chapter_grid`: FLOPs of a baseline step and of the regulariser, the
    matrices it factorises per step, the extra fraction, and the steps of each arm."""
    rows = []
    for task in TASKS:
        base, reg = grid[f"{task}_baseline"], grid[f"{task}_cofactor"]
        f = base["flops"]
        rows.append(
            {
                "task": task,
                "baseline step FLOPs": f["step"],
                "regulariser FLOPs": f["regularizer"],
                "matrices per step": f["matrices"],
                "extra fraction": f["regularizer"] / f["step"],
                "baseline steps": base["train"]["steps"],
                "regularised steps": reg["train"]["steps"],
            }
        )
    return pd.DataFrame(rows)


def grad_stats(grad_norms: Sequence[float], warmup: int, spike_ratio: float) -> dict[str, float]:
    """Variance and mean of the per-step gradient norms after ``warmup`` steps, and the number
    of spikes: steps whose norm exceeds ``spike_ratio`` times the median of the previous 20."""
    g = np.asarray(grad_norms[warmup:], dtype=float)
    spikes = sum(1 for t in range(20, len(g)) if g[t] > spike_ratio * np.median(g[t - 20 : t]))
    return {"grad_norm_var": float(g.var()) if g.size else math.nan,
            "grad_norm_mean": float(g.mean()) if g.size else math.nan,
            "grad_spikes": float(spikes)}  # fmt: skip


def _probe(data: TextCorpus | ArrayTask, items: int, seq_len: int) -> Tensor:
    """The first ``items`` validation sequences."""
    if isinstance(data, TextCorpus):
        return data.valid[: items * seq_len].view(items, seq_len)
    return data.val_x[:items]


def _head_measures(model: Transformer, x: Tensor, reg_heads: int) -> dict[str, float]:
    """Cofactor diagnostics of the regularised heads and of all heads, and the regularised heads'
    mean self-attention weight ``A_ii``, on ``x`` (eval mode)."""
    model.eval()
    with torch.no_grad():
        probs = [a.probs for a in model(x, need_weights=True).attentions]
    d_reg = cofactor_diagnostics(probs, heads=reg_heads, max_items=None)
    d_all = cofactor_diagnostics(probs, heads=None, max_items=None)
    a_ii = [p[:, :reg_heads].diagonal(dim1=-2, dim2=-1).mean() for p in probs if p is not None]
    out = {"self_attention (reg heads)": float(torch.stack(a_ii).mean())}
    for k in ["cofactor_min_prob_n", "cofactor_near_zero", "spectral_gap", "frac_disconnected",
              "frac_with_near_zero", "cofactor_log_margin"]:  # fmt: skip
        out[f"{k} (reg heads)"] = d_reg[k]
        out[f"{k} (all heads)"] = d_all[k]
    return out


def run_cell(params: dict[str, Any], seed: int) -> dict[str, Any]:
    """Train one configuration of :func:`chapter_grid` at ``seed`` through the harness (with the
    ``"cofactor"`` diagnostic on the regularised heads at each log step) and measure it.

    Returns scalars (``task``, ``arm``, ``steps``, ``wall_s``, ``val_loss``, ``val_acc``, the
    :func:`grad_stats` and the head measures) and, in the cell's JSON only, ``grad_norms`` (one
    per step, before clipping) and ``history`` (the harness's log).
    """
    data = load_task(params["task"], params["lm_level"])
    tp = dict(params["train"])
    reg = params["regularizer"]
    grad_norms: list[float] = []
    tcfg = TrainConfig(
        **tp, seed=seed, progress=False, measure_flops=False, effective_rank=False,
        regularizers=[reg] if reg else [],
        diagnostics=[{"name": "cofactor", "heads": params["reg_heads"]}],
    )  # fmt: skip
    t0 = time.perf_counter()
    res = train(ModelConfig(**params["model"]), tcfg, data,
                callbacks=[lambda step, info: grad_norms.append(info["grad_norm"])])  # fmt: skip
    wall = time.perf_counter() - t0
    x = _probe(data, params["probe_items"], tp["seq_len"])
    return {
        "task": params["task"], "arm": params["arm"], "steps": tp["steps"], "wall_s": wall,
        "val_loss": res.final["val_loss"], "val_acc": res.final["val_acc"],
        **grad_stats(grad_norms, tcfg.warmup_steps, params["spike_ratio"]),
        **_head_measures(res.model, x, params["reg_heads"]),
        "grad_norms": grad_norms, "history": res.history.to_dict(orient="list"),
    }  # fmt: skip


# -- timing -------------------------------------------------------------------------------------


def _training_step(
    cfg: ModelConfig, corpus: TextCorpus, batch: int, seq_len: int
) -> Callable[[], Tensor]:
    """One AdamW step of a fresh model (seed 0) on one random batch of ``corpus``, as a callable
    for :func:`~attention_atlas.bench.compare` (gradients on even under its ``no_grad``)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Transformer(cfg)
        starts = torch.randint(0, corpus.train.numel() - seq_len - 1, (batch,))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    win = corpus.train[starts[:, None] + torch.arange(seq_len + 1)]
    x, y = win[:, :-1], win[:, 1:]

    def step() -> Tensor:
        with torch.enable_grad():
            logits = model(x).logits
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()
        return loss.detach()

    return step


def lm_step_seconds(
    corpora: dict[str, TextCorpus], *, dim: int, n_layers: int, n_heads: int, batch: int,
    seq_len: int, reps: int,
) -> dict[str, float]:  # fmt: skip
    """Median seconds of one training step of the language model on each corpus (its vocabulary
    sets the output layer), timed side by side by :func:`~attention_atlas.bench.compare`."""
    fns = {
        name: _training_step(ModelConfig(**_model("lm", c, dim, n_layers, n_heads, seq_len)),
                             c, batch, seq_len)
        for name, c in corpora.items()
    }  # fmt: skip
    res = compare(fns, next(iter(fns)), (), backward=False, warmup=1, reps=reps, memory=False)
    return {name: r["forward"]["median_s"] for name, r in res["results"].items()}


def regularizer_overhead(
    cfg: ModelConfig, x: Tensor, y: Tensor, *, reps: int, alpha: float = 1e-3, heads: int = 1,
    beta: float = 0.1, seed: int = 0, meta: dict[str, Any] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """:func:`~attention_atlas.bench.compare` of forward and forward+backward of a classifier's
    loss three ways: ``baseline`` (fused SDPA), ``need_weights`` (the explicit path that returns
    the probabilities) and ``cofactor`` (plus ``alpha`` times the regulariser on the first
    ``heads`` head(s) of every layer). The model is built at ``seed`` (global RNG untouched)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Transformer(cfg)

    def loss(x: Tensor, weights: bool, reg: bool) -> Tensor:
        out = model(x, need_weights=weights)
        value = torch.nn.functional.cross_entropy(out.logits, y)
        if reg:
            probs = [a.probs for a in out.attentions]
            value = value + alpha * cofactor_regularizer_from_probs(probs, heads=heads, beta=beta)
        return value

    fns: dict[str, Callable[..., Any]] = {
        "baseline": functools.partial(loss, weights=False, reg=False),
        "need_weights": functools.partial(loss, weights=True, reg=False),
        "cofactor": functools.partial(loss, weights=True, reg=True),
    }
    for f in fns.values():
        f.bench_params = list(model.parameters())  # type: ignore[attr-defined]
    return compare(fns, "baseline", (x,), warmup=1, reps=reps, memory=False, meta=meta)


# -- analysis -----------------------------------------------------------------------------------

#: the metrics of the summary table (rows)
SUMMARY_METRICS = [
    "val_loss", "val_acc", "grad_norm_var", "grad_spikes", "self_attention (reg heads)",
    "cofactor_min_prob_n (reg heads)", "cofactor_near_zero (reg heads)",
    "spectral_gap (reg heads)", "frac_disconnected (reg heads)", "cofactor_log_margin (reg heads)",
    "spectral_gap (all heads)", "frac_disconnected (all heads)",
]  # fmt: skip

#: the seed's success criteria: (name, metric, which direction is better)
CRITERIA = [
    ("nearly disconnected heads (fraction, gap < 0.05, reg heads)",
     "frac_disconnected (reg heads)", "lower"),
    ("near-zero cofactors per head (reg heads)", "cofactor_near_zero (reg heads)", "lower"),
    ("spectral gap (reg heads)", "spectral_gap (reg heads)", "higher"),
    ("gradient spikes", "grad_spikes", "lower"),
    ("gradient-norm variance", "grad_norm_var", "lower"),
    ("validation accuracy", "val_acc", "higher"),
    ("validation loss", "val_loss", "lower"),
]  # fmt: skip


def summary_table(runs: pd.DataFrame, digits: str = ".4g") -> pd.DataFrame:
    """Mean and 95% interval over seeds (``Interval.format``) of :data:`SUMMARY_METRICS`, one
    column per (task, config), from the results of :func:`run_cell` (columns ``task``, ``arm``)."""
    cols = []
    for task in TASKS:
        for arm in ARMS:
            g = runs[(runs.task == task) & (runs.arm == arm)]
            cells = {m: mean_interval(g[m]).format(spec=digits) for m in SUMMARY_METRICS}
            cols.append({"task": task, "config": arm, "steps": int(g.steps.iloc[0]), **cells})
    return pd.DataFrame(cols).set_index(["task", "config"]).T


def paired_effect(runs: pd.DataFrame, task: str, metric: str) -> Interval:
    """``cofactor - baseline`` of ``metric`` on ``task``, paired by seed (95% interval)."""
    arm = {a: runs[(runs.task == task) & (runs.arm == a)].set_index("seed")[metric] for a in ARMS}
    return paired_difference(arm["cofactor"], arm["baseline"])


@dataclass(frozen=True)
class Criterion:
    """One of the seed's success criteria on one task: the paired effect and its reading."""

    task: str
    name: str
    metric: str
    effect: Interval
    verdict: str


def _reading(effect: Interval, better: str) -> str:
    """The chapter's reading of an effect: *met* when the interval lies on the favourable side
    of zero, *contradicted* on the other side, *not resolved* otherwise (issue 14 replaces it)."""
    if not effect.resolved:
        return "not resolved (one seed)"
    good, bad = (
        (effect.high < 0, effect.low > 0)
        if better == "lower"
        else (effect.low > 0, effect.high < 0)
    )
    return "met" if good else ("contradicted" if bad else "not resolved")


def criteria(runs: pd.DataFrame) -> list[Criterion]:
    """Each of :data:`CRITERIA` on each task. "Equal or better" accuracy and loss are met unless
    the interval is unfavourable; a count that is zero in every run is "vacuous", one that is the
    same in every run "degenerate"."""
    out = []
    for task in TASKS:
        for name, metric, better in CRITERIA:
            effect = paired_effect(runs, task, metric)
            v = _reading(effect, better)
            if metric in ("val_acc", "val_loss") and v == "not resolved":
                v = "met (no significant difference)"
            both = runs[runs.task == task][metric]
            counts = ("frac_disconnected (reg heads)", "cofactor_near_zero (reg heads)")
            if metric in counts and (both == 0).all():
                v = "vacuous (none in any run)"
            elif metric == "cofactor_near_zero (reg heads)" and both.nunique() == 1:
                v = f"degenerate ({both.iloc[0]:g} in every run)"
            out.append(Criterion(task, name, metric, effect, v))
    return out


def criteria_table(crit: Sequence[Criterion]) -> pd.DataFrame:
    """The criteria as a table: task, criterion, the paired difference and its interval, verdict."""
    return pd.DataFrame(
        [{"task": c.task, "criterion": c.name, "cofactor - baseline": c.effect.mean,
          "95% low": c.effect.low, "95% high": c.effect.high, "verdict": c.verdict}
         for c in crit]
    )  # fmt: skip


def grad_norm_matrix(records: Sequence[dict[str, Any]]) -> np.ndarray:
    """``(n_seeds, k)`` per-step gradient norms of the runs of one configuration (their stored
    ``grad_norms``), cut to the shortest run."""
    k = min(len(r["grad_norms"]) for r in records)
    return np.array([r["grad_norms"][:k] for r in records], dtype=float)
