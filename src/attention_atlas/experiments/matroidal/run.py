"""Chapter 5's experiment: dot-product, dense Mahalanobis and matroidal attention in training.

The matroidal seed's first experiment: a 2-layer, 8-head Transformer on character-level Penn
Treebank and on 8x8 digits as patch tokens, comparing dot-product attention, a dense learned
Mahalanobis metric and the matroidal metric at matched width, over training-set fractions, the
number of covector columns ``m in {d, 2d, 4d}``, the covector family, and pruning of small
weights. The arms of the main slice (:data:`ARMS`):

* ``dot``: dot-product attention (SDPA), the control every training verdict is scaled by;
* ``dense`` and ``matroidal``: the seed's experiment: one projection ``z`` per token scored by
  ``(z_i - z_j)^T M (z_i - z_j)`` (the seed's pseudocode), with a dense learned ``M`` or the
  matroidal ``M`` on graph-incidence columns;
* ``matroidal-grounded``: the same with a ground column per connected component, so that the
  covectors span ``R^d`` (incidence columns all miss the all-ones direction);
* ``dense-qk`` and ``matroidal-qk``: the metric applied to ``q_i - k_j`` with separate query and
  key projections (the usual attention layout; what this chapter ran before).

Slices, each with every seed: ``main`` (every arm on every data set and fraction), ``m`` (the
seed's arm with ``m = k d``) and ``family`` (every covector family at ``m = main_m d``, graph
families grounded so that every family spans ``R^d``). Every matroidal model is also evaluated
after pruning its smallest-weight columns (and, as a control, as many random columns).

A configuration shared by two slices runs once (:func:`chapter_grid`); :func:`runs_frame` maps
the cells back onto the slices. ``python -m attention_atlas sweep matroidal --preset book``
runs it; :mod:`.analysis` holds what chapter 5 shows, :mod:`.verdicts` the
verdicts, and :func:`outcomes` the claims' outcomes (the mathematical claims by the float64
checks of :mod:`.checks`).
"""

from __future__ import annotations

import copy
import functools
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch

from attention_atlas.validate import ConfigError, from_mapping, is_number, one_line

if TYPE_CHECKING:
    from attention_atlas.models import ModelConfig
    from attention_atlas.train import TrainConfig

__all__ = [
    "ARMS",
    "CONTROL",
    "DATASETS",
    "PRESETS",
    "SEED_ARM",
    "SESOI",
    "cell_configs",
    "chapter_configurations",
    "chapter_grid",
    "check_cell",
    "distinct_configurations",
    "load_runs",
    "metric_measures",
    "prune_mask",
    "run_cell",
    "runs_frame",
    "self_attention",
]

#: the experiment's name on the command line and in the results store
NAME = "matroidal"

#: parameter sets of ``python -m attention_atlas sweep matroidal --preset NAME``: "book" is the
#: defaults of :func:`chapter_grid` (chapter 5's parameters), "smoke" its SMOKE grid, "long" the
#: grid sized for the real answer (see chapter 5, "How long is long enough")
PRESETS: dict[str, dict[str, Any]] = {
    "smoke": {"datasets": ["digits"], "fractions": [1.0], "steps": 2, "final_eval_batches": 2,
              "m_multiples": [1, 2], "families": ["sparse_random"], "prune_fractions": [0.5],
              "steps_multiples": [2.0]},
    "book": {},
    "long": {"steps": 4000, "lm_steps": 10000, "lm_fractions": [0.1, 1.0],
             "final_eval_batches": 64, "steps_multiples": [0.1, 0.3, 3.0]},
}  # fmt: skip
#: seeds of each preset (at least 3: the verdict rule's minimum). The long preset's 20: the
#: book runs' spread of the seed's comparison needs 20 (digits) to 28 (char-PTB) seeds for an
#: interval inside its SESOI (chapter 5, section 6, recomputes it from whichever grid it shows)
PRESET_SEEDS = {"smoke": [0, 1, 2], "book": [0, 1, 2], "long": list(range(20))}

#: arm of the main slice -> (registered attention, its options); "{m}", "{graph}" filled in
ARMS: dict[str, tuple[str, dict[str, Any]]] = {
    "dot": ("dot", {}),
    "dense": ("mahalanobis", {"shared": True}),
    "matroidal": ("matroidal", {"shared": True}),
    "matroidal-grounded": ("matroidal", {"shared": True, "grounded": True}),
    "dense-qk": ("mahalanobis", {}),
    "matroidal-qk": ("matroidal", {}),
}
#: the seed's experiment: one z, graph-incidence columns as the seed restricts them
SEED_ARM = "matroidal"
#: the seed's comparison: the dense learned metric in the same form
CONTROL = "dense"
#: the comparisons chapter 5 reports: (arm, control it is paired with, what it measures)
COMPARISONS: list[tuple[str, str, str]] = [
    ("matroidal", "dense", "the seed's comparison: structured against dense metric"),
    ("matroidal", "dot", "the seed's metric against dot-product attention"),
    ("dense", "dot", "the dense metric against dot-product attention"),
    ("matroidal-grounded", "matroidal", "ground columns: the all-ones direction restored"),
    ("matroidal-qk", "matroidal", "q_i - k_j instead of one z"),
    ("matroidal-qk", "dense-qk", "structured against dense, both on q_i - k_j"),
]

#: smallest effects of interest, declared before any result was read; each claim about the
#: task metric uses the data set's entry (the metric of its TrainingScale)
SESOI: dict[str, float] = {
    # 0.02 bits per character: 1% of a 2-bpc model, the size of the gains reported between
    # character-level architectures of one size; a smaller difference changes no choice
    "val_bpc": 0.02,
    # 0.02 accuracy: 9 of the 450 validation digits; less is within one image per class
    "val_acc": 0.02,
    # 0.1 in the coefficient of variation of the gradient norm after warm-up (0.3 to 3 here):
    # a tenth of the mean norm, the least change that alters which learning rate is usable
    "grad_norm_cv": 0.1,
    # one non-finite logit or output in a run: any failure is a loss of stability
    "nonfinite": 1.0,
}
#: the task metric of each data set (what the verdicts compare) and whether higher is better
TASK_METRIC = {"digits": "val_acc", "ptb-char": "val_bpc"}
HIGHER_IS_BETTER = {"val_acc": True, "val_bpc": False}
#: a learned metric has "moved materially" when its median relative change reaches this: a
#: quarter of the initial metric (Frobenius norm), well outside the seeds' spread at init
MATERIAL_CHANGE = 0.25


def chapter_configurations(
    *,
    datasets: Sequence[str] = ("digits", "ptb-char"),
    fractions: Sequence[float] = (0.1, 0.3, 1.0),
    lm_fractions: Sequence[float] | None = (1.0,),
    steps: int = 400,
    lm_steps: int | None = 800,
    batch_size: int = 32,
    lm_batch_size: int = 16,
    seq_len: int = 64,
    dim: int = 64,
    n_heads: int = 8,
    head_dim: int = 16,
    lr: float = 3e-3,
    eval_batches: int = 4,
    final_eval_batches: int = 16,
    main_m: int = 2,
    main_graph: str = "ring_chords",
    arms: Sequence[str] = tuple(ARMS),
    slice_dataset: str = "digits",
    slice_fraction: float = 1.0,
    m_multiples: Sequence[int] = (1, 2, 4),
    families: Sequence[str] = ("ring_chords", "knn", "random", "sparse_random", "unsigned"),
    prune_fractions: Sequence[float] = (0.25, 0.5),
    steps_multiples: Sequence[float] = (0.25, 4.0),
) -> dict[str, dict[str, Any]]:
    """Every configuration of every slice, by name (``main/<data>/<fraction>/<arm>``,
    ``m/<k>d``, ``family/<family>``), some of them identical across slices.

    ``batch_size``, ``steps`` and ``fractions`` are the digits runs' (images per batch), and
    ``lm_batch_size`` (windows), ``lm_steps`` and ``lm_fractions`` the char-PTB runs' (None: as
    digits); ``final_eval_batches`` applies to char-PTB (digits: all 450 validation images).
    A matroidal configuration with ``m = d`` uses the ring (the only family with exactly ``d``
    edges that every ``d`` admits). ``prune_fractions``: the share of each head's columns removed
    by pruning (smallest weights first; and at random, the control). ``steps_multiples``: the
    steps slice trains the seed's arm and its dense control on the slice data for these multiples
    of ``steps`` (how far the metrics move with training).
    """
    unknown = sorted(set(arms) - set(ARMS))
    if unknown:
        raise ValueError(f"unknown arms {unknown}; known: {', '.join(ARMS)}")
    model = {"dim": dim, "n_layers": 2, "n_heads": n_heads, "head_dim": head_dim}

    def cell(
        slice_: str, data: str, frac: float, arm: str, options: dict, n: int | None = None
    ) -> dict[str, Any]:
        digits = data == "digits"
        n = n or (steps if digits or lm_steps is None else lm_steps)
        train = {"steps": n, "batch_size": batch_size if digits else lm_batch_size,
                 "seq_len": seq_len, "lr": lr, "eval_batches": eval_batches,
                 "final_eval_batches": None if digits else final_eval_batches}  # fmt: skip
        att = ARMS[arm][0]
        prune = [float(f) for f in prune_fractions] if att == "matroidal" else []
        return {"slice": slice_, "dataset": data, "fraction": float(frac), "arm": arm,
                "attention": att, "options": options, "prune_fractions": prune, "model": model,
                "train": train}  # fmt: skip

    def options(arm: str, k: int = main_m, graph: str = main_graph) -> dict[str, Any]:
        att, opts = ARMS[arm]
        if att != "matroidal":
            return dict(opts)
        return {**opts, "m": k * head_dim, "graph": "ring" if k == 1 else graph}

    configs = {
        f"main/{ds}/{frac:g}/{arm}": cell("main", ds, frac, arm, options(arm))
        for ds in datasets
        for frac in (fractions if ds == "digits" or lm_fractions is None else lm_fractions)
        for arm in arms
    }
    for k in m_multiples:
        configs[f"m/{k}d"] = cell(
            "m", slice_dataset, slice_fraction, SEED_ARM, options(SEED_ARM, k)
        )
    for fam in families:
        from attention_atlas.attention.graphs import GRAPH_FAMILIES

        arm = "matroidal-grounded" if fam in GRAPH_FAMILIES else SEED_ARM
        opts = options(arm, graph=fam)
        configs[f"family/{fam}"] = cell("family", slice_dataset, slice_fraction, arm, opts)
    for mult in steps_multiples:
        for arm in (SEED_ARM, CONTROL):
            n = max(1, round(mult * (steps if slice_dataset == "digits" else lm_steps or steps)))
            configs[f"steps/{arm}/{n}"] = cell("steps", slice_dataset, slice_fraction, arm,
                                               options(arm), n)  # fmt: skip
    return configs


def distinct_configurations(configs: dict[str, dict[str, Any]]) -> dict[str, str]:
    """``name -> the name that runs it``: configurations equal except for their slice run once,
    under the first name that has them."""
    first: dict[str, str] = {}
    alias = {}
    for name, p in configs.items():
        key = repr(sorted((k, repr(v)) for k, v in p.items() if k != "slice"))
        alias[name] = first.setdefault(key, name)
    return alias


def chapter_grid(**params: Any) -> dict[str, dict[str, Any]]:
    """The distinct configurations of :func:`chapter_configurations` (what the sweep runs)."""
    configs = chapter_configurations(**params)
    alias = distinct_configurations(configs)
    return {name: p for name, p in configs.items() if alias[name] == name}


def runs_frame(raw: pd.DataFrame, configs: dict[str, dict[str, Any]]) -> pd.DataFrame:
    """One row per (configuration of :func:`chapter_configurations`, seed), from the sweep's
    results ``raw`` (one row per distinct cell), with columns ``config``, ``slice``,
    ``dataset``, ``fraction``, ``arm``, ``attention``, ``m`` (0 unless matroidal), ``graph``,
    ``grounded`` and ``steps``."""
    alias = distinct_configurations(configs)
    frames = []
    for name, p in configs.items():
        rows = raw[raw.config == alias[name]].copy()
        rows["config"] = name
        for k in ("slice", "dataset", "fraction", "arm", "attention"):
            rows[k] = p[k]
        rows["m"] = p["options"].get("m", 0)
        rows["graph"] = p["options"].get("graph", "")
        rows["grounded"] = bool(p["options"].get("grounded", False))
        rows["steps"] = p["train"]["steps"]
        frames.append(rows)
    return pd.concat(frames, ignore_index=True)


#: the data sets a cell trains on (:func:`_dataset`)
DATASETS = ("digits", "ptb-char")


@functools.cache
def _dataset(name: str) -> Any:
    from attention_atlas.data import load_char_ptb, load_digits_patches

    loaders: dict[str, Any] = {"digits": load_digits_patches, "ptb-char": load_char_ptb}
    if name not in loaders:
        raise ValueError(f"unknown data set {name!r}; known: {', '.join(loaders)}")
    return loaders[name]()


def cell_configs(params: dict[str, Any], seed: int) -> tuple[ModelConfig, TrainConfig]:
    """The model and the training run of a configuration of :func:`chapter_grid` at ``seed``
    (the harness fills in the data's fields of the model): warm-up over the first tenth of the
    steps, four log rows."""
    from attention_atlas.models import ModelConfig
    from attention_atlas.train import TrainConfig

    mcfg = ModelConfig(**params["model"], attention=params["attention"],
                       attention_options=dict(params["options"]))  # fmt: skip
    tp = params["train"]
    warm = max(1, tp["steps"] // 10)
    tcfg = TrainConfig(**tp, warmup_steps=warm, log_every=max(1, tp["steps"] // 4), seed=seed,
                       progress=False, effective_rank=False)  # fmt: skip
    return mcfg, tcfg


def check_cell(params: dict[str, Any]) -> None:
    """Check one configuration's parameters before any work: its data set and arm, the share
    of the training set (in (0, 1]), the pruning fractions (in [0, 1), matroidal models only),
    and the model and training run it trains with (:func:`cell_configs`, through
    :func:`~attention_atlas.validate.from_mapping`,
    :func:`~attention_atlas.train.config.check_model` and
    :func:`~attention_atlas.train.config.check_run`: the attention variant, its options ``m``
    and ``graph``, widths, steps, learning rate). No data is loaded, nothing is trained.
    Raises ConfigError (one line)."""
    from attention_atlas.train import TrainConfig
    from attention_atlas.train.config import check_model, check_run

    for key, known in (("dataset", DATASETS), ("arm", tuple(ARMS))):
        if params.get(key) not in known:
            raise ConfigError(f"{key}: expected one of {', '.join(known)}, got {params.get(key)!r}")
    frac = params["fraction"]
    if not (is_number(frac) and 0 < frac <= 1):
        raise ConfigError(f"fractions: expected numbers in (0, 1], got {frac!r}")
    prune = params["prune_fractions"]
    if not isinstance(prune, list):
        raise ConfigError(f"prune_fractions: expected a list, got {prune!r}")
    for f in prune:
        if not (is_number(f) and 0 <= f < 1):
            raise ConfigError(f"prune_fractions: expected numbers in [0, 1), got {f!r}")
    if prune and params["attention"] != "matroidal":
        raise ConfigError(
            f"prune_fractions: only matroidal attention is pruned, got {params['attention']!r}"
        )
    from_mapping(TrainConfig, params["train"], "train")  # its steps, before the warm-up is made
    try:
        mcfg, tcfg = cell_configs(params, 0)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"model settings: {one_line(err)}") from None
    check_model(mcfg)
    check_run(tcfg)


def run_cell(params: dict[str, Any], seed: int) -> dict[str, Any]:
    """Train one configuration of :func:`chapter_grid` at ``seed`` and measure it.

    Returns ``val_loss``, ``val_acc``, ``val_bpc`` (NaN for digits), the variance and
    coefficient of variation of the gradient norm after warm-up (``grad_norm_var``,
    ``grad_norm_cv``), the counts of non-finite attention logits and outputs, parameter counts
    (``params_total``, ``params_metric``), attention-core FLOPs (forward, train step), training
    time, ``tokens`` (training tokens or images seen), the metric's movement
    (:func:`metric_measures`), ``self_attention`` (mean weight of a token on itself) and, per
    pruning fraction ``f``, ``pruned_<metric>@<f>`` and ``random_pruned_<metric>@<f>``.
    """
    from attention_atlas.data import subset
    from attention_atlas.train import train

    data = _dataset(params["dataset"])
    if params["fraction"] < 1:
        data = subset(data, params["fraction"], seed=seed)
    mcfg, tcfg = cell_configs(params, seed)
    tp = params["train"]
    warm = tcfg.warmup_steps
    norms: list[float] = []
    res = train(mcfg, tcfg, data, callbacks=[lambda step, info: norms.append(info["grad_norm"])])
    after = np.array(norms[warm:] or norms)
    counts = res.record["param_counts"]
    per_step = tp["batch_size"] * (1 if params["dataset"] == "digits" else tp["seq_len"])
    out = {
        "val_loss": res.final["val_loss"],
        "val_acc": res.final["val_acc"],
        "val_bpc": res.final.get("val_bpc", math.nan),
        "grad_norm_var": float(after.var()),
        "grad_norm_cv": float(after.std() / max(after.mean(), 1e-12)),
        "nonfinite_logits": float(res.history["nonfinite_logits"].sum()),
        "nonfinite_out": float(res.history["nonfinite_out"].sum()),
        "params_total": counts["total"],
        "params_metric": counts["metric"],
        "attn_flops_fwd": res.record["flops"]["forward_attention_core"],
        "attn_flops_train": res.record["flops"]["train_step_attention_core"],
        "train_time_s": res.final["train_time_s"],
        "train_cpu_s": res.final["train_cpu_s"],
        "tokens": tp["steps"] * per_step,
    }
    out.update(metric_measures(res.model))
    out["self_attention"] = self_attention(res.model, data, tp["seq_len"])
    out.update(_pruned(res.model, data, params, seed))
    return out


@torch.no_grad()
def metric_measures(model: torch.nn.Module) -> dict[str, float]:
    """How far training moved each metric attention's ``M`` from its initial value, and its
    all-ones direction (nothing for dot-product attention):

    * ``metric_change``: median over layers and heads of ``|M - M_0|_F / |M_0|_F``;
    * ``coef_change``, ``coef_change_max`` (matroidal): median and max of ``|l_e / l_e(0) - 1|``;
    * ``ones_rayleigh``: median over heads of ``u^T M u / (tr M / d)``, ``u = 1 / sqrt(d)``: the
      metric's weight on the all-ones direction against its mean eigenvalue (``eps d / tr M``,
      about ``1e-4``, for graph-incidence columns without ground).
    """
    from attention_atlas.attention.mahalanobis import MahalanobisAttention
    from attention_atlas.attention.matroidal import MatroidalAttention
    from attention_atlas.models import attention_modules

    mods: list[Any] = [a for a in attention_modules(model) if hasattr(a, "metric")]
    if not mods:
        return {}
    change, rayleigh, coef = [], [], []
    for a in mods:
        M = a.metric().double()  # (H, d, d)
        d = M.shape[-1]
        eye = torch.eye(d, dtype=M.dtype, device=M.device)
        if isinstance(a, MatroidalAttention):
            A = a.A.double()
            M0 = a.init_weight * A @ A.transpose(-2, -1) + a.eps * eye
            coef.append((a.coefficients().double() / a.init_weight - 1).abs().flatten())
        else:
            assert isinstance(a, MahalanobisAttention)
            M0 = (1 + a.eps) * eye.expand_as(M)
        change.append((M - M0).flatten(1).norm(dim=1) / M0.flatten(1).norm(dim=1))
        u = torch.full((d,), d**-0.5, dtype=M.dtype, device=M.device)
        rayleigh.append((u @ M @ u) / (M.diagonal(dim1=-2, dim2=-1).sum(-1) / d))
    out = {"metric_change": float(torch.cat(change).median()),
           "ones_rayleigh": float(torch.cat(rayleigh).median())}  # fmt: skip
    if coef:
        c = torch.cat(coef)
        out.update(coef_change=float(c.median()), coef_change_max=float(c.max()))
    return out


@torch.no_grad()
def self_attention(model: torch.nn.Module, data: Any, seq_len: int, batch: int = 4) -> float:
    """Mean attention weight of a token on itself, ``P_ii``, over the first ``batch`` validation
    sequences, every layer and head (causal models: positions ``i >= 1``, since ``P_00 = 1``)."""
    from attention_atlas.train.evaluate import eval_batches

    x, _ = next(eval_batches(data, "val", batch, seq_len, 1))
    was = model.training
    model.eval()
    out = model(x.to(next(model.parameters()).device), need_weights=True)
    model.train(was)
    causal = bool(model.cfg.is_causal)  # type: ignore[union-attr]
    diag = torch.stack([r.probs.diagonal(dim1=-2, dim2=-1) for r in out.attentions])  # type: ignore[union-attr]
    return float(diag[..., 1:].mean() if causal else diag.mean())


def prune_mask(
    weights: torch.Tensor,
    fraction: float,
    *,
    smallest: bool = True,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Which columns each head keeps, ``(H, m)`` bool, when ``round(fraction m)`` of them go:
    those with the smallest ``weights (H, m)``, or random ones (the control, drawn from
    ``generator``)."""
    H, m = weights.shape
    score = weights if smallest else torch.rand(H, m, generator=generator)
    order = score.argsort(dim=-1)  # ascending: the first round(fraction m) go
    keep = torch.ones(H, m, dtype=torch.bool)
    return keep.scatter_(1, order[:, : round(fraction * m)], False)


def _pruned(
    model: torch.nn.Module, data: Any, params: dict[str, Any], seed: int
) -> dict[str, float]:
    """Validation metrics after removing, in each head, the fraction ``f`` of columns with the
    smallest weights (``pruned_*@f``) or the same number of random columns (``random_pruned_*@f``,
    the control), for ``f`` in ``params["prune_fractions"]``; no retraining."""
    from attention_atlas.models import attention_modules
    from attention_atlas.train import evaluate

    out: dict[str, float] = {}
    tp = params["train"]
    metric = TASK_METRIC[params["dataset"]]
    gen = torch.Generator().manual_seed(10_007 + seed)
    for frac in params["prune_fractions"]:
        for kind in ("pruned", "random_pruned"):
            pruned: Any = copy.deepcopy(model)
            for block in pruned.blocks:
                att = block.attn
                keep = prune_mask(
                    att.coefficients().cpu(), frac, smallest=kind == "pruned", generator=gen
                )
                block.attn = att.keep_columns(keep.to(att.theta.device))
            ev = evaluate(pruned, data, batch_size=32, seq_len=tp["seq_len"],
                          max_batches=tp["final_eval_batches"])  # fmt: skip
            value = ev["bpc"] if metric == "val_bpc" else ev["acc"]
            out[f"{kind}_{metric}@{frac:g}"] = value
            out[f"{kind}_val_loss@{frac:g}"] = ev["loss"]
    if params["prune_fractions"]:
        mods: list[Any] = attention_modules(model)
        out["columns"] = float(sum(a.active_columns() for a in mods))
    return out


def load_runs(
    params: dict[str, Any], seeds: Sequence[int], *, smoke: bool = False
) -> tuple[pd.DataFrame, Any]:
    """``(runs, grid)``: the grid chapter 5 shows (:func:`attention_atlas.sweep.stored.stored_or_run`:
    the stored long grid when complete, else the stored book grid when it is exactly this one,
    else run now; ``smoke`` always runs the ``smoke`` preset) and its :func:`runs_frame`, mapped
    with the parameters the grid was made with."""
    from attention_atlas.sweep.stored import stored_or_run

    preset = "smoke" if smoke else "book"
    grid = stored_or_run(sys.modules[__name__], params=params, preset=preset, seeds=seeds,
                                 use_stored=not smoke, log=None)  # fmt: skip
    made_with = dict(params)
    manifest = Path(grid.provenance.folder) / "grid.json"
    if grid.provenance.source == "stored" and manifest.exists():
        made_with = json.loads(manifest.read_text())["params"]
    return runs_frame(grid.frame, chapter_configurations(**made_with)), grid
