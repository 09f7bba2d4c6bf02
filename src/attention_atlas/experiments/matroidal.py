"""Chapter 5's experiment: dot-product, dense Mahalanobis and matroidal attention in training.

The matroidal seed's first experiment: a 2-layer, 8-head Transformer on character-level Penn
Treebank and on 8x8 digits as patch tokens, comparing dot-product attention, a dense learned
Mahalanobis metric and the matroidal metric at matched width, over training-set fractions, the
number of covector columns ``m in {d, 2d, 4d}``, the covector family, and pruning of small
weights. The grid is run in slices, each with every seed:

1. ``main``: dot vs dense vs matroidal (``m = main_m d``, ``main_graph``) on every data set at
   every training fraction;
2. ``m``: matroidal with ``m = k d`` for ``k`` in ``m_multiples`` on the slice data set/fraction;
3. ``family``: the covector family at ``m = main_m d``, the two non-incidence contrasts included;
4. pruning: every trained matroidal model evaluated after dropping the columns with
   ``l_e < delta`` (no retraining), ``delta`` a multiple of the initial weight ``d / (2m)``.

A configuration shared by two slices (the main matroidal model on the slice data) runs once:
:func:`chapter_grid` holds the distinct configurations, :func:`chapter_configurations` every
slice's, and :func:`runs_frame` maps the finished cells back onto the slices. Run it with
``python -m attention_atlas sweep matroidal --preset book``. The analysis chapter 5 shows
follows: tables of means with 95% intervals over seeds, and the seed's success criterion cell
by cell from paired differences (:func:`attention_atlas.stats.paired_difference`).
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch

from .. import viz
from ..stats import Interval, mean_interval, paired_difference

__all__ = [
    "PRESETS",
    "chapter_configurations",
    "chapter_grid",
    "distinct_configurations",
    "hypothesis_status",
    "interval_text",
    "loss_against_fraction",
    "main_table",
    "parameter_table",
    "paired_call",
    "prune_summary",
    "prune_table",
    "run_cell",
    "runs_frame",
    "slice_table",
    "verdict_table",
]

#: parameter sets of ``python -m attention_atlas sweep matroidal --preset NAME``; "book" is the
#: defaults of :func:`chapter_grid` (chapter 5's parameters), "smoke" the grid of its SMOKE run
PRESETS: dict[str, dict[str, Any]] = {
    "smoke": {"datasets": ["digits"], "fractions": [1.0], "steps": 2, "final_eval_batches": 2,
              "m_multiples": [1, 2], "families": ["sparse_random"], "slice_fraction": 1.0,
              "prune_deltas": [1.0]},
    "book": {},
    "long": {"steps": 1000, "final_eval_batches": 64},
}  # fmt: skip

#: the variants of the main slice
VARIANTS = ("dot", "mahalanobis", "matroidal")


def chapter_configurations(
    *,
    datasets: Sequence[str] = ("digits", "ptb-char"),
    fractions: Sequence[float] = (0.01, 0.1, 1.0),
    steps: int = 80,
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
    slice_dataset: str = "digits",
    slice_fraction: float = 0.1,
    m_multiples: Sequence[int] = (1, 2, 4),
    families: Sequence[str] = ("ring_chords", "knn", "random", "sparse_random", "unsigned"),
    prune_deltas: Sequence[float] = (0.5, 0.9, 1.0, 1.1),
) -> dict[str, dict[str, Any]]:
    """Every configuration of every slice, by name (``main/<data>/<fraction>/<variant>``,
    ``m/<k>d``, ``family/<family>``), some of them identical across slices.

    ``batch_size`` is the digits batch (images), ``lm_batch_size`` the char-PTB one (windows);
    ``final_eval_batches`` applies to char-PTB (digits are evaluated on all validation images).
    A matroidal configuration with ``m = d`` uses the ring (the only family with exactly ``d``
    edges that every ``d`` admits).
    """
    model = {"dim": dim, "n_layers": 2, "n_heads": n_heads, "head_dim": head_dim}

    def cell(slice_: str, data: str, frac: float, att: str, options: dict) -> dict[str, Any]:
        digits = data == "digits"
        train = {"steps": steps, "batch_size": batch_size if digits else lm_batch_size,
                 "seq_len": seq_len, "lr": lr, "eval_batches": eval_batches,
                 "final_eval_batches": None if digits else final_eval_batches}  # fmt: skip
        prune = [float(r) for r in prune_deltas] if att == "matroidal" else []
        return {"slice": slice_, "dataset": data, "fraction": float(frac), "attention": att,
                "options": options, "prune_deltas": prune, "model": model, "train": train}  # fmt: skip

    def matroidal(k: int, graph: str) -> dict[str, Any]:
        return {"m": k * head_dim, "graph": "ring" if k == 1 else graph}

    main_opts = {"dot": {}, "mahalanobis": {}, "matroidal": matroidal(main_m, main_graph)}
    configs = {
        f"main/{ds}/{frac:g}/{att}": cell("main", ds, frac, att, main_opts[att])
        for ds in datasets
        for frac in fractions
        for att in VARIANTS
    }
    for k in m_multiples:
        opts = matroidal(k, main_graph)
        configs[f"m/{k}d"] = cell("m", slice_dataset, slice_fraction, "matroidal", opts)
    for fam in families:
        opts = matroidal(main_m, fam)
        configs[f"family/{fam}"] = cell("family", slice_dataset, slice_fraction, "matroidal", opts)
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
    ``dataset``, ``fraction``, ``attention``, ``m`` (0 unless matroidal) and ``graph``."""
    alias = distinct_configurations(configs)
    frames = []
    for name, p in configs.items():
        rows = raw[raw.config == alias[name]].copy()
        rows["config"] = name
        for k in ("slice", "dataset", "fraction", "attention"):
            rows[k] = p[k]
        rows["m"] = p["options"].get("m", 0)
        rows["graph"] = p["options"].get("graph", "")
        frames.append(rows)
    return pd.concat(frames, ignore_index=True)


@functools.cache
def _dataset(name: str) -> Any:
    from ..data import load_char_ptb, load_digits_patches

    loaders: dict[str, Any] = {"digits": load_digits_patches, "ptb-char": load_char_ptb}
    if name not in loaders:
        raise ValueError(f"unknown data set {name!r}; known: {', '.join(loaders)}")
    return loaders[name]()


def run_cell(params: dict[str, Any], seed: int) -> dict[str, Any]:
    """Train one configuration of :func:`chapter_grid` at ``seed`` and measure it.

    Returns ``val_loss``, ``val_acc``, ``val_bpc`` (NaN for digits), the variance and
    coefficient of variation of the gradient norm after warm-up (``grad_norm_var``,
    ``grad_norm_cv``), the counts of non-finite attention logits and outputs, parameter counts
    (``params_total``, ``params_metric``), attention-core FLOPs (forward, train step), training
    time, ``metric_drift`` (matroidal: ``max |l_e / l_e(0) - 1|``; dense: ``max |W - I|``) and,
    for each pruning ``delta`` (a multiple of the initial weight), ``pruned_val_loss@<delta>``
    and ``pruned_kept@<delta>`` (the fraction of covector columns kept).
    """
    from ..data import subset
    from ..models import ModelConfig
    from ..train import TrainConfig, train

    data = _dataset(params["dataset"])
    if params["fraction"] < 1:
        data = subset(data, params["fraction"], seed=seed)
    mcfg = ModelConfig(**params["model"], attention=params["attention"],
                       attention_options=dict(params["options"]))  # fmt: skip
    tp = params["train"]
    warm = max(1, tp["steps"] // 10)
    tcfg = TrainConfig(**tp, warmup_steps=warm, log_every=max(1, tp["steps"] // 3), seed=seed,
                       progress=False, effective_rank=False)  # fmt: skip
    norms: list[float] = []
    res = train(mcfg, tcfg, data, callbacks=[lambda step, info: norms.append(info["grad_norm"])])
    after = np.array(norms[warm:] or norms)
    counts = res.record["param_counts"]
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
    }
    out.update(_metric_drift(res.model, params))
    out.update(_pruned_losses(res.model, data, params))
    return out


@torch.no_grad()
def _metric_drift(model: torch.nn.Module, params: dict[str, Any]) -> dict[str, float]:
    """How far training moved the metric from its initial value (no entry for dot)."""
    from ..models import attention_modules

    mods: list[Any] = attention_modules(model)
    d = params["model"]["head_dim"]
    if params["attention"] == "matroidal":
        w0 = d / (2 * params["options"]["m"])
        ratio = torch.cat([a.coefficients().flatten() for a in mods]) / w0
        return {"metric_drift": float((ratio - 1).abs().max())}  # max |l_e / l_e(0) - 1|
    if params["attention"] == "mahalanobis":
        eye = torch.eye(d, device=mods[0].W.device)
        return {"metric_drift": max(float((a.W - eye).abs().max()) for a in mods)}
    return {}


def _pruned_losses(model: torch.nn.Module, data: Any, params: dict[str, Any]) -> dict[str, float]:
    """Validation loss and kept-column fraction after pruning ``l_e < delta * d / (2m)``."""
    from ..models import attention_modules
    from ..train import evaluate

    out: dict[str, float] = {}
    if params["attention"] != "matroidal":
        return out
    m = params["options"]["m"]
    w0 = params["model"]["head_dim"] / (2 * m)
    columns = params["model"]["n_layers"] * params["model"]["n_heads"] * m
    tp = params["train"]
    for rel in params["prune_deltas"]:
        pruned: Any = copy.deepcopy(model)
        for block in pruned.blocks:
            block.attn = block.attn.pruned(rel * w0)
        ev = evaluate(pruned, data, batch_size=32, seq_len=tp["seq_len"],
                      max_batches=tp["final_eval_batches"])  # fmt: skip
        mods: list[Any] = attention_modules(pruned)
        kept = sum(a.active_columns() for a in mods)
        out[f"pruned_val_loss@{rel:g}"] = ev["loss"]
        out[f"pruned_kept@{rel:g}"] = kept / columns
    return out


# ----------------------------------------------------------------------------------------
# analysis: what chapter 5 shows
# ----------------------------------------------------------------------------------------

#: the task metric of each data set (beside the validation loss)
TASK_METRIC = {"digits": "val_acc", "ptb-char": "val_bpc"}
#: plot colour of each variant
COLORS = {"dot": "#636efa", "mahalanobis": "#ef553b", "matroidal": "#00cc96"}


def interval_text(values: Any) -> str:
    """``"mean [low, high]"`` over seeds (4 significant digits, 95% t-interval); the mean alone
    when a run is not finite (a NaN metric, a diverged run)."""
    x = np.asarray(values, dtype=float)
    if not np.isfinite(x).all():
        return f"{x.mean():.4g}"
    return mean_interval(x).format(spec=".4g")


def parameter_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per variant of the main slice: total and metric parameters, attention-core FLOPs
    (forward, train step) and ``m``."""
    first = runs[runs.slice == "main"].drop_duplicates("attention")
    cols = ["params_total", "params_metric", "attn_flops_fwd", "attn_flops_train", "m"]
    return first.set_index("attention")[cols]


def main_table(runs: pd.DataFrame) -> pd.DataFrame:
    """The main slice by (data set, fraction, variant): loss, task metric, gradient-norm
    smoothness (intervals over seeds), non-finite counts and mean training time."""
    rows = []
    main = runs[runs.slice == "main"]
    for (ds, frac, att), g in main.groupby(["dataset", "fraction", "attention"], sort=False):
        rows.append({
            "dataset": ds, "fraction": frac, "attention": att,
            "val_loss": interval_text(g.val_loss),
            TASK_METRIC[str(ds)]: interval_text(g[TASK_METRIC[str(ds)]]),
            "grad-norm CV": interval_text(g.grad_norm_cv),
            "grad-norm var": interval_text(g.grad_norm_var),
            "nonfinite": int(g.nonfinite_logits.sum() + g.nonfinite_out.sum()),
            "train s": f"{g.train_time_s.mean():.1f}",
        })  # fmt: skip
    return pd.DataFrame(rows)


def loss_against_fraction(
    runs: pd.DataFrame, datasets: Sequence[str], fractions: Sequence[float]
) -> go.Figure:
    """Validation loss (mean and 95% interval over seeds) against the training fraction, one
    line per (variant, data set); the first data set solid, the others dotted."""
    main = runs[runs.slice == "main"]
    fig = go.Figure()
    for ds in datasets:
        for att in VARIANTS:
            g = main[(main.dataset == ds) & (main.attention == att)]
            groups = {f"{f:g}": g[g.fraction == f].val_loss.to_numpy() for f in fractions}
            viz.mean_interval(groups, x=list(fractions), fig=fig, name=f"{att} ({ds})",
                              mode="lines+markers", color=COLORS[att])  # fmt: skip
            dash = "solid" if ds == datasets[0] else "dot"
            fig.data[-1].update(line={"color": COLORS[att], "dash": dash})
    fig.update_xaxes(type="log", title="training fraction")
    fig.update_yaxes(title="validation loss (nats), mean and 95% interval over seeds")
    fig.update_layout(title="Validation loss against training-set fraction")
    return fig


def slice_table(runs: pd.DataFrame, slice_: str, by: str) -> pd.DataFrame:
    """One slice (``"m"`` or ``"family"``) by ``by``: loss, accuracy, gradient-norm CV,
    metric parameters, attention FLOPs and mean training time."""
    rows = []
    for key, g in runs[runs.slice == slice_].groupby(by, sort=False):
        rows.append({
            by: key,
            "val_loss": interval_text(g.val_loss),
            "val_acc": interval_text(g.val_acc),
            "grad-norm CV": interval_text(g.grad_norm_cv),
            "metric params": int(g.params_metric.iloc[0]),
            "attn FLOPs (fwd)": int(g.attn_flops_fwd.iloc[0]),
            "train s": f"{g.train_time_s.mean():.1f}",
        })  # fmt: skip
    return pd.DataFrame(rows)


def _prune_levels(runs: pd.DataFrame) -> list[str]:
    return [c.split("@")[1] for c in runs.columns if c.startswith("pruned_val_loss@")]


def prune_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Each pruned configuration of the ``m`` and ``family`` slices by ``delta / initial
    weight``: kept columns, loss before and after pruning, and the change."""
    rows = []
    for name, g in runs[runs.slice.isin(["m", "family"])].groupby("config", sort=False):
        for rel in _prune_levels(runs):
            loss = g[f"pruned_val_loss@{rel}"]
            if loss.isna().all():
                continue
            rows.append({
                "config": name, "delta / initial weight": float(rel),
                "kept columns": interval_text(g[f"pruned_kept@{rel}"]),
                "val_loss unpruned": interval_text(g.val_loss),
                "val_loss pruned": interval_text(loss),
                "change": interval_text(loss - g.val_loss),
            })  # fmt: skip
    return pd.DataFrame(rows)


def prune_summary(runs: pd.DataFrame) -> str:
    """``"<delta>: kept <fraction>, change <loss change> nats"`` for each level, means over
    every pruned model, joined by ``"; "``."""
    return "; ".join(
        f"{rel}: kept {runs[f'pruned_kept@{rel}'].mean():.2f}, "
        f"change {(runs[f'pruned_val_loss@{rel}'] - runs.val_loss).mean():+.3f} nats"
        for rel in _prune_levels(runs)
    )


def paired_call(diff: Interval) -> str:
    """The text of a paired difference where lower is better: "better (m)" or "worse (m)" when
    the interval excludes zero, else "equal within +-h" (h its half-width)."""
    if not diff.resolved:
        return f"{diff.mean:+.3f} (one seed)"
    if diff.high < 0:
        return f"better ({diff.mean:+.3f})"
    if diff.low > 0:
        return f"worse ({diff.mean:+.3f})"
    return f"equal within +-{diff.half_width:.3f}"


def _by_seed(g: pd.DataFrame, col: str) -> pd.Series:
    return g.set_index("seed")[col]


def verdict_table(runs: pd.DataFrame) -> pd.DataFrame:
    """The seed's success criterion per (data set, fraction) of the main slice, matroidal
    against dense (paired by seed): (a) loss, (b) fewer metric parameters, (c) gradient-norm
    CV, (d) no non-finite logit or output; "holds" unless one is worse, and the loss against
    dot. Private columns ``_dloss`` (mean loss gap), ``_better``, ``_half`` (half-width)."""
    rows = []
    main = runs[runs.slice == "main"]
    for (ds, frac), g in main.groupby(["dataset", "fraction"], sort=False):
        mat, den, dot = (g[g.attention == a] for a in ("matroidal", "mahalanobis", "dot"))
        dl = paired_difference(_by_seed(mat, "val_loss"), _by_seed(den, "val_loss"))
        dc = paired_difference(_by_seed(mat, "grad_norm_cv"), _by_seed(den, "grad_norm_cv"))
        dd = paired_difference(_by_seed(mat, "val_loss"), _by_seed(dot, "val_loss"))
        stable = int(mat.nonfinite_logits.sum() + mat.nonfinite_out.sum()) == 0
        p_mat, p_den = int(mat.params_metric.iloc[0]), int(den.params_metric.iloc[0])
        loss_call, cv_call = paired_call(dl), paired_call(dc)
        worse = loss_call.startswith("worse") or cv_call.startswith("worse")
        fails = worse or not stable or p_mat >= p_den
        rows.append({
            "dataset": ds, "fraction": frac, "(a) loss vs dense": loss_call,
            "(b) metric params": f"{p_mat} vs {p_den}", "(c) grad-norm CV vs dense": cv_call,
            "(d) stable": stable, "criterion": "fails" if fails else "holds",
            "loss vs dot": paired_call(dd), "_dloss": dl.mean,
            "_better": loss_call.startswith("better"),
            "_half": dl.half_width if dl.resolved else math.nan,
        })  # fmt: skip
    return pd.DataFrame(rows)


def hypothesis_status(verdict: pd.DataFrame, low_fraction: float) -> str:
    """The seed's hypothesis at this scale, from :func:`verdict_table`: contradicted where the
    criterion fails, else supported where matroidal is detectably better, else neither."""
    failed = verdict[verdict.criterion == "fails"]
    if len(failed):
        where = ", ".join(f"{r.dataset} at {r.fraction:g}" for r in failed.itertuples())
        return "contradicted in " + where
    n_better = int(verdict._better.sum())
    if n_better == 0:
        return (
            "neither supported nor contradicted: the structured metric matches the dense one "
            "within the resolution of the test everywhere, with fewer metric parameters, and "
            "shows no detectable advantage in the low-data regime"
        )
    n_low = int((verdict._better & (verdict.fraction == low_fraction)).sum())
    return f"supported in {n_better} cell(s) ({n_low} of them at fraction {low_fraction:g})"
