"""Chapter 6's experiment: the seed's cofactor regulariser in training, at equal training FLOPs.

A 6-layer pre-norm Transformer is trained by the harness (:func:`attention_atlas.train.train`)
on two tasks, each without and with the ``"cofactor"`` regulariser
(:mod:`attention_atlas.cofactor.penalty`, ``alpha * (-log(|m| + eps) + beta KL(u || pi))`` on the
first ``reg_heads`` head(s) of every layer):

* ``lm_*``: WikiText-2 language modelling (causal) at character level (``lm_level``, a fixed
  parameter: at word level the 33,278-word softmax, not attention, would dominate the step of
  a model this small);
* ``digits_*``: scikit-learn's 8x8 digits as sixteen 2x2 patch tokens (bidirectional).

**Equal training FLOPs.** :func:`training_flops` counts a baseline step with
:func:`attention_atlas.train.measure_flops` and adds the LU behind the penalty (which a FLOP
counter cannot see) from :func:`~attention_atlas.cofactor.penalty.cofactor_flops`; the regularised
arm gets ``round(steps * base / (base + extra))`` steps (:func:`chapter_grid`). That charge is
kept (the stored runs were made with it), and :func:`regularizer_path_flops` counts the
regulariser on the path the harness really takes (no LU on a causal model's heads, and the
heads' logit products, which the charge leaves out): :func:`flops_table` shows both and the
steps each gives.

Per run (:func:`run_cell`): validation loss and accuracy, the gradient-norm statistics of
:func:`grad_stats` (from the harness's per-step callback), and the cofactor diagnostics of the
regularised heads and of all heads on ``probe_items`` validation sequences. The verdicts are in
:mod:`.analysis`, the timings in :mod:`.timing`, the numerical checks in
:mod:`.numerics`; :func:`outcomes` gives the claims register every cofactor claim.

``python -m attention_atlas sweep cofactor --preset book`` runs the grid (resumable: a finished
cell is never re-run) into ``results/cofactor/book``; ``--preset long`` is the grid sized for
the real answer (:data:`PRESETS`).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from attention_atlas.cofactor import cofactor_diagnostics, cofactor_flops
from attention_atlas.data import ArrayTask, TextCorpus, load_digits_patches, load_wikitext2
from attention_atlas.models import ModelConfig, Transformer
from attention_atlas.store.results import Grid
from attention_atlas.train import TrainConfig, measure_flops, train
from attention_atlas.train.config import check_model, check_run
from attention_atlas.validate import ConfigError, is_number, one_line
from attention_atlas.verdicts import Outcome

from .analysis import ARMS, TASKS, claim_outcome, criteria

__all__ = [
    "PRESETS",
    "cell_configs",
    "chapter_grid",
    "check_cell",
    "flops_table",
    "model_config",
    "grid_configs",
    "grad_stats",
    "load_task",
    "outcomes",
    "regularizer_path_flops",
    "run_cell",
    "stored_grid",
    "training_flops",
]

#: the experiment's name on the command line and in the results store
NAME = "cofactor"

#: parameter sets of ``python -m attention_atlas sweep cofactor --preset NAME``: ``book`` is
#: :func:`chapter_grid`'s defaults (the chapter's parameters; its results are stored in
#: ``results/cofactor/book``); ``long`` is the grid sized for the real answer, run with
#: ``--seeds 0 1 2 3 4``: width 128, 8 heads, windows of 64 characters, 3,000 steps. Sized by
#: one-seed runs of 1,000 steps at that shape: the regulariser acts within the first 100 steps
#: (log-margin of the regularised LM heads -0.26 against -3.4), the baseline's nearly
#: disconnected heads appear from about step 200 (LM) and 300 (digits), and the baseline's
#: LM margin and validation loss still fall at step 1,000 (2.53 bpc), so three times that.
#: Estimated cost, from the CPU time of short runs at that shape (one thread, this 2-core
#: machine): 2.6 CPU-hours for the 20 runs
PRESETS: dict[str, dict[str, Any]] = {
    "smoke": {"train_steps": 4, "lm_seq_len": 16, "lm_batch": 4, "lm_dim": 16, "digits_batch": 16,
              "digits_dim": 16, "n_layers": 2, "n_heads": 2, "eval_batches": 1,
              "final_eval_batches": 1, "log_every": 3},
    "book": {},
    "long": {"train_steps": 3000, "lm_seq_len": 64, "lm_batch": 32, "lm_dim": 128,
             "digits_dim": 128, "n_heads": 8, "log_every": 250, "final_eval_batches": 64},
}  # fmt: skip

#: the seeds of the stored book grid and of the long preset
BOOK_SEEDS = (0, 1, 2, 3, 4)


@functools.lru_cache(maxsize=4)
def load_task(name: str, level: str = "char") -> TextCorpus | ArrayTask:
    """The data of a task: ``"lm"`` (WikiText-2 at ``level``, from the local data folder) or
    ``"digits"`` (2x2 patches)."""
    if name == "lm":
        return load_wikitext2(mode=level, download=False)
    if name == "digits":
        return load_digits_patches(2)
    raise ValueError(f"task must be one of {TASKS}, got {name!r}")


def model_config(task: str, data: TextCorpus | ArrayTask, dim: int, n_layers: int, n_heads: int,
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


def regularizer_path_flops(
    model: dict[str, Any],
    data: TextCorpus | ArrayTask,
    batch: int,
    seq_len: int,
    reg_heads: int,
    beta: float = 0.0,
) -> dict[str, float]:
    """FLOPs of the regulariser on the path the harness takes for this model, for the first
    ``batch`` examples: ``counted`` (what :class:`~torch.utils.flop_counter.FlopCounterMode`
    sees of the ``"cofactor"`` regulariser's forward and of its backward down to the layers'
    queries and keys: the chosen heads' logits and their two backward products, ``6 n^2 d`` per
    matrix), ``lu`` (:func:`~attention_atlas.cofactor.penalty.cofactor_flops` per matrix where
    the path factorises: bidirectional heads; a causal model's heads take the closed form, no
    LU) and ``total``. :func:`training_flops` charges the LU to every task instead (the grid's
    step counts, kept so the stored runs stay valid); chapter 6 shows both. The global RNG and
    the model's parameters are left as they were."""
    from torch.utils.flop_counter import FlopCounterMode

    from attention_atlas.cofactor.penalty import regularizer

    x, y = _first_batch(data, batch, seq_len)
    with torch.random.fork_rng(devices=[]):
        net = Transformer(ModelConfig(**model))
        with torch.enable_grad():
            out = net(x)
            qk = []  # the layers' queries and keys as leaves: the count stops there
            for a in out.attentions:
                for name in ("query", "key"):
                    a.extras[name] = a.extras[name].detach().requires_grad_()
                    qk.append(a.extras[name])
            with FlopCounterMode(display=False) as fcm:
                loss = regularizer(net, out, (x, y), heads=reg_heads, beta=beta)
                torch.autograd.grad(loss, qk, allow_unused=True)
    counted = float(sum(fcm.get_flop_counts().get("Global", {}).values()))
    mats = batch * int(model["n_layers"]) * reg_heads
    lu = 0.0 if net.cfg.is_causal else float(mats * cofactor_flops(x.shape[1]))
    return {"counted": counted, "lu": lu, "total": counted + lu}


def chapter_grid(
    *,
    lm_level: str = "char",
    train_steps: int = 2000,
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
    log_every: int = 100,
    spike_ratio: float = 2.0,
    probe_items: int = 32,
) -> dict[str, dict[str, Any]]:
    """The four configurations ``{lm,digits}_{baseline,cofactor}``; the regularised arm of each
    task gets the steps that match the baseline's training FLOPs (:func:`training_flops`)."""
    grid: dict[str, dict[str, Any]] = {}
    for task in TASKS:
        data = load_task(task, lm_level)
        batch, dim = (lm_batch, lm_dim) if task == "lm" else (digits_batch, digits_dim)
        model = model_config(task, data, dim, n_layers, n_heads, lm_seq_len)
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
    """Per task of :func:`chapter_grid`: FLOPs of a baseline step and of the regulariser as the
    grid charges it (:func:`training_flops`), the matrices it penalises per step, the extra
    fraction and the steps of each arm; then the regulariser's FLOPs on the path the harness
    really takes (:func:`regularizer_path_flops`) and the steps the regularised arm would get
    at equal FLOPs by that count."""
    rows = []
    for task in TASKS:
        base, reg = grid[f"{task}_baseline"], grid[f"{task}_cofactor"]
        f, tp = base["flops"], base["train"]
        path = regularizer_path_flops(
            base["model"], load_task(task, base["lm_level"]), tp["batch_size"], tp["seq_len"],
            base["reg_heads"], reg["regularizer"].get("beta", 0.0),
        )  # fmt: skip
        rows.append(
            {
                "task": task,
                "baseline step FLOPs": f["step"],
                "regulariser FLOPs": f["regularizer"],
                "matrices per step": f["matrices"],
                "extra fraction": f["regularizer"] / f["step"],
                "baseline steps": tp["steps"],
                "regularised steps": reg["train"]["steps"],
                "regulariser FLOPs (path)": path["total"],
                "of which LU": path["lu"],
                "regularised steps (path)": int(
                    round(tp["steps"] * f["step"] / (f["step"] + path["total"]))
                ),
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


def cell_configs(params: dict[str, Any], seed: int) -> tuple[ModelConfig, TrainConfig]:
    """The model and the training run of a configuration of :func:`chapter_grid` at ``seed``
    (the harness fills in the data's fields of the model): the regulariser of its arm, the
    ``"cofactor"`` diagnostic on the regularised heads."""
    reg = params["regularizer"]
    tcfg = TrainConfig(
        **params["train"], seed=seed, progress=False, measure_flops=False, effective_rank=False,
        regularizers=[reg] if reg else [],
        diagnostics=[{"name": "cofactor", "heads": params["reg_heads"]}],
    )  # fmt: skip
    return ModelConfig(**params["model"]), tcfg


#: the WikiText-2 levels :func:`load_task` reads
LM_LEVELS = ("char", "word")


def check_cell(params: dict[str, Any]) -> None:
    """Check one configuration's parameters before any work: its task, arm and level; the model
    and training run it trains with (:func:`cell_configs`, through
    :func:`~attention_atlas.train.config.check_model` and
    :func:`~attention_atlas.train.config.check_run`); ``reg_heads`` from 1 to the model's
    heads; the regulariser of the cofactor arm (weight ``alpha`` > 0, ``beta`` >= 0), none for
    the baseline; ``spike_ratio`` > 0 and ``probe_items`` >= 1. No data is loaded, nothing is
    built or trained. Raises ConfigError (one line)."""
    for key, known in (("task", TASKS), ("arm", ARMS), ("lm_level", LM_LEVELS)):
        if params.get(key) not in known:
            raise ConfigError(f"{key}: expected one of {', '.join(known)}, got {params.get(key)!r}")
    try:
        mcfg, tcfg = cell_configs(params, 0)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{params['task']} settings: {one_line(err)}") from None
    check_model(mcfg)
    check_run(tcfg)
    heads = params["reg_heads"]
    if isinstance(heads, bool) or not isinstance(heads, int) or not 1 <= heads <= mcfg.n_heads:
        raise ConfigError(
            f"reg_heads: expected an integer from 1 to n_heads={mcfg.n_heads}, got {heads!r}"
        )
    reg = params["regularizer"]
    if (reg is None) != (params["arm"] == "baseline"):
        raise ConfigError(f"regularizer: the {params['arm']} arm does not take {reg!r}")
    if reg is not None:
        if not (is_number(reg.get("weight")) and reg["weight"] > 0):
            raise ConfigError(f"alpha: expected a finite number > 0, got {reg.get('weight')!r}")
        if not (is_number(reg.get("beta", 0.0)) and reg.get("beta", 0.0) >= 0):
            raise ConfigError(f"beta: expected a finite number >= 0, got {reg.get('beta')!r}")
        if reg.get("heads", heads) != heads:
            raise ConfigError(
                f"regularizer heads: expected reg_heads={heads}, got {reg['heads']!r}"
            )
    if not (is_number(params["spike_ratio"]) and params["spike_ratio"] > 0):
        raise ConfigError(
            f"spike_ratio: expected a finite number > 0, got {params['spike_ratio']!r}"
        )
    items = params["probe_items"]
    if isinstance(items, bool) or not isinstance(items, int) or items < 1:
        raise ConfigError(f"probe_items: expected an integer >= 1, got {items!r}")


def run_cell(params: dict[str, Any], seed: int) -> dict[str, Any]:
    """Train one configuration of :func:`chapter_grid` at ``seed`` through the harness (with the
    ``"cofactor"`` diagnostic on the regularised heads at each log step) and measure it.

    Returns scalars (``task``, ``arm``, ``steps``, ``wall_s``, ``val_loss``, ``val_acc``, the
    :func:`grad_stats` and the head measures) and, in the cell's JSON only, ``grad_norms`` (one
    per step, before clipping) and ``history`` (the harness's log).
    """
    data = load_task(params["task"], params["lm_level"])
    tp = dict(params["train"])
    grad_norms: list[float] = []
    mcfg, tcfg = cell_configs(params, seed)
    t0 = time.perf_counter()
    res = train(mcfg, tcfg, data,
                callbacks=[lambda step, info: grad_norms.append(info["grad_norm"])])  # fmt: skip
    wall = time.perf_counter() - t0
    x = _probe(data, params["probe_items"], tp["seq_len"])
    return {
        "task": params["task"], "arm": params["arm"], "steps": tp["steps"], "wall_s": wall,
        "train_cpu_s": res.final["train_cpu_s"],
        "batch_size": tp["batch_size"], "seq_len": x.shape[1],  # tokens per sequence
        "val_loss": res.final["val_loss"], "val_acc": res.final["val_acc"],
        **grad_stats(grad_norms, tcfg.warmup_steps, params["spike_ratio"]),
        **_head_measures(res.model, x, params["reg_heads"]),
        "grad_norms": grad_norms, "history": res.history.to_dict(orient="list"),
    }  # fmt: skip


def grid_configs(grid: Grid) -> dict[str, dict[str, Any]]:
    """The configurations of a loaded grid, by name (from its records' ``params``)."""
    return {c: r["params"] for (c, _), r in sorted(grid.records.items())}


# -- the claims register ---------------------------------------------------------------------


def stored_grid(log: Any = None) -> Grid | None:
    """The stored grid the register reads: ``results/cofactor/long`` when complete, else
    ``results/cofactor/book`` (as its ``grid.json`` describes it), else None."""
    from attention_atlas.store.results import IncompleteGrid, load_grid

    for preset in ("long", "book"):
        try:
            return load_grid("cofactor", preset)
        except (FileNotFoundError, IncompleteGrid) as e:
            if log is not None:
                log(f"[results] no complete stored {preset} grid of cofactor ({e})")
    return None


#: the claims decided by the training runs
EMPIRICAL = ("cofactor/disconnected", "cofactor/spikes", "cofactor/accuracy")


def empirical_outcomes(grid: Grid | None) -> dict[str, Outcome]:
    """The seed's success criteria as claims (:func:`.analysis.claim_outcome`) from a
    grid's results; *not tested* for each when there is no grid."""
    if grid is None:
        why = "no stored results (run: python -m attention_atlas sweep cofactor --preset book)"
        return {k: Outcome("not tested", why, evidence="none") for k in EMPIRICAL}
    crit = criteria(grid.frame)
    return {k: claim_outcome(crit, k, grid.provenance.text) for k in EMPIRICAL}


def outcomes(smoke: bool = False) -> dict[str, Outcome]:
    """Every cofactor claim of :data:`attention_atlas.claims.CLAIMS`: the mathematical ones by
    float64 checks run now (:func:`.checks.math_outcomes`; toy sizes when ``smoke``),
    the seed's success criteria by verdicts on the stored results (:func:`stored_grid`)."""
    from .checks import math_outcomes

    return {**math_outcomes(smoke), **empirical_outcomes(stored_grid())}
