"""Chapter 9's analysis of the zoo grid (:mod:`attention_atlas.experiments.zoo.run`): the
leaderboard, accuracy against width, pairs and parameters, the chosen learning rates, time per
step and char-PTB bpc at a fixed budget (all with intervals over seeds), the sanity anchors, the
exploration's figure, and the claims register's outcomes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from attention_atlas import viz
from attention_atlas.stats import Interval, decide, mean_interval, paired_difference

from .anchors import (
    ANCHOR_ACC,
    ANCHOR_LEVEL,
    anchor_text,
    anchors,
    cell_name,
    centre,
    long_anchors,
    mqar_frame,
)
from .run import CONTROL, PRESETS, SESOI, VARIANTS

__all__ = [
    "ANCHOR_ACC",
    "ANCHOR_LEVEL",
    "anchor_text",
    "long_anchors",
    "ablation_table",
    "CLAIMS",
    "accuracy_figure",
    "anchors",
    "cell_name",
    "chosen_lrs",
    "geometric_interval",
    "effects",
    "interval_text",
    "leaderboard",
    "learning_curves",
    "mqar_frame",
    "outcomes",
    "protocol_text",
    "ptb_table",
    "state_table",
    "summary",
    "timing_table",
    "zoo_grid",
]


#: claims register key -> (arm, metric, form, direction): the form the register declares
#: (:data:`attention_atlas.stats.FORMS`); ``direction`` is, for a superiority claim, what the
#: seed predicts for ``arm - dot`` (+1 higher, -1 lower), for a non-inferiority claim the better
#: side of the metric (+1: higher is better)
CLAIMS: dict[str, tuple[str, str, str, int]] = {
    "matroidal/zoo-stability": ("matroidal", "log10_grad_var", "equivalence", 0),
    "matroidal/zoo-low-data": ("matroidal", "learning_auc", "superiority", 1),
    "cofactor/zoo-spikes": ("cofactor", "grad_spikes", "superiority", -1),
    "cofactor/zoo-accuracy": ("cofactor", "test_acc", "non-inferiority", 1),
}

#: how each metric is named in a sentence
WHAT = {
    "log10_grad_var": "log10 gradient-norm variance after warm-up",
    "learning_auc": "mean validation accuracy over the learning curve (data efficiency)",
    "grad_spikes": "gradient-norm spikes per run",
    "test_acc": "MQAR test accuracy",
}


def zoo_grid(params: Mapping[str, Any] | None = None, *, smoke: bool = False, **kw: Any) -> Any:
    """The zoo grid through the results store: the stored long grid when complete, else the
    stored book grid when it is exactly the grid asked for, else run now (always run for
    ``smoke``, with the smoke preset)."""
    from attention_atlas.sweep.stored import stored_or_run

    from . import run

    preset = "smoke" if smoke else "book"
    full = {**PRESETS[preset], **(params or {})}
    return stored_or_run(run, params=full, preset=preset, use_stored=not smoke, **kw)


def interval_text(values: Any, digits: int = 3) -> str:
    """``mean [low, high]`` over seeds (95% t-interval), or the mean alone when a value is not
    finite (a diverged run)."""
    x = np.asarray(values, dtype=float)
    if not np.isfinite(x).all():
        return f"{np.nanmean(x):.{digits}f} (a run not finite)"
    return mean_interval(x).format(digits)


# ----------------------------------------------------------------------------------------
# frames
# ----------------------------------------------------------------------------------------


def _cells(df: pd.DataFrame) -> list[str]:
    """The cross's cells, widths first (at the centre's pairs), then pairs."""
    keys = df[["width", "pairs"]].drop_duplicates().sort_values(["pairs", "width"])
    return [cell_name(w, p) for w, p in keys.itertuples(index=False)]


def leaderboard(df: pd.DataFrame, metric: str = "test_acc") -> pd.DataFrame:
    """Variants by cells: ``metric`` as ``mean [low, high]`` over seeds."""
    cells = _cells(df)
    rows = {}
    for v, g in df.groupby("variant", sort=False):
        rows[v] = {c: interval_text(g[g.cell == c][metric]) for c in cells if (g.cell == c).any()}
    return pd.DataFrame.from_dict(rows, orient="index")[cells]


def chosen_lrs(df: pd.DataFrame) -> pd.DataFrame:
    """Per variant: the learning rate chosen at the centre and the validation accuracy of each
    candidate on the selection seed."""
    cols = sorted((c for c in df.columns if c.startswith("select_val_acc@")),
                  key=lambda c: float(c.split("@")[1]))  # fmt: skip
    first = df.drop_duplicates("variant").set_index("variant")
    out = first[["lr", *cols]].copy()
    out.columns = ["chosen lr", *(f"val acc at lr {c.split('@')[1]}" for c in cols)]
    return out


def accuracy_figure(df: pd.DataFrame, along: str) -> go.Figure:
    """Test accuracy against ``along`` (``"width"`` at the centre's pairs, ``"pairs"`` at the
    centre's width, or ``"params"``: every cell at its total parameter count), one line per
    variant with 95% intervals over seeds, and the chance level of copying a context value."""
    fig = go.Figure()
    for k, (v, g) in enumerate(df.groupby("variant", sort=False)):
        if along == "params":
            sub = g
            key = "params_total"
        else:
            fixed = "pairs" if along == "width" else "width"
            sub = g[g[fixed] == centre(df, fixed)]
            key = along
        groups = {str(x): s["test_acc"].to_numpy() for x, s in sub.groupby(key)}
        xs = [float(x) for x in groups]
        viz.mean_interval(groups, x=xs, fig=fig, name=str(v), mode="lines+markers",
                          color=viz.COLORS[k % len(viz.COLORS)])  # fmt: skip
    if along == "pairs":
        p = sorted(df.pairs.unique())
        fig.add_trace(go.Scatter(x=p, y=[1 / x for x in p], mode="lines", name="chance (1/pairs)",
                                 line={"dash": "dot", "color": "grey"}))  # fmt: skip
    label = {"width": "model width D", "pairs": "key-value pairs", "params": "parameters"}[along]
    fig.update_layout(xaxis_title=label, yaxis_title="MQAR test accuracy", yaxis_range=[0, 1.02])
    if along != "width":
        fig.update_xaxes(type="log")
    return fig


def learning_curves(records: Mapping[tuple[str, int], Mapping[str, Any]], variant: str,
                    width: int, pairs: int) -> go.Figure:  # fmt: skip
    """Validation accuracy (left) and training loss (right, log scale) against step for every
    seed of one MQAR cell (stored histories), with the chance of copying a context value; an
    empty figure that says so for a cell not in the cross. The loss shows what accuracy hides
    on a plateau: whether the arm is moving at all."""
    from plotly.subplots import make_subplots

    name = f"mqar/{variant}/{cell_name(width, pairs)}"
    runs = sorted((s, r) for (c, s), r in records.items() if c == name)
    fig = make_subplots(rows=1, cols=2, subplot_titles=("validation accuracy", "training loss"))
    for i, (s, r) in enumerate(runs):
        h, color = r["history"], viz.COLORS[i % len(viz.COLORS)]
        fig.add_trace(go.Scatter(x=h["step"], y=h["val_acc"], mode="lines+markers",
                                 name=f"seed {s} (test {r['test_acc']:.3f})", legendgroup=str(s),
                                 line={"color": color}), row=1, col=1)  # fmt: skip
        fig.add_trace(go.Scatter(x=h["step"], y=h["train_loss"], mode="lines", showlegend=False,
                                 legendgroup=str(s), line={"color": color}), row=1, col=2)  # fmt: skip
    title = f"{variant}, width {width}, {pairs} pairs"
    if not runs:
        title += ": not in the cross (widths vary at the centre's pairs, pairs at its width)"
    else:
        steps = runs[0][1]["history"]["step"]
        fig.add_trace(go.Scatter(x=[steps[0], steps[-1]], y=[1 / pairs] * 2, mode="lines",
                                 name="chance (1/pairs)", line={"dash": "dot", "color": "grey"}),
                      row=1, col=1)  # fmt: skip
    fig.update_xaxes(title_text="step")
    fig.update_yaxes(range=[0, 1.02], row=1, col=1)
    fig.update_yaxes(type="log", row=1, col=2)
    return fig.update_layout(title=title)


def geometric_interval(values: Any) -> Interval:
    """The geometric mean of positive runs (timings, ratios) and its 95% interval: the
    t-interval of their logarithms, mapped back (a ratio's interval stays positive)."""
    logs = mean_interval(np.log(np.asarray(values, dtype=float)))
    mean, low, high = (float(np.exp(v)) for v in logs.as_tuple())
    return Interval(mean, low, high, logs.n, logs.level)


def timing_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Per variant: milliseconds per training step and the ratio to dot's, measured side by side
    (one timing cell per seed; geometric means with 95% intervals over the seeds)."""
    t = frame[frame["config"].str.startswith("time/")]
    rows = {}
    others = [
        c[len("ratio_") :]
        for c in t.columns
        if c.startswith("ratio_") and c[len("ratio_") :] not in VARIANTS
    ]  # your own arms
    for v in [*VARIANTS, *others]:
        if f"{v}_ms" in t and t[f"{v}_ms"].notna().any():
            rows[v] = {"ms per step": geometric_interval(t[f"{v}_ms"]).format(1),
                       "ratio to dot": geometric_interval(t[f"ratio_{v}"]).format(2)}  # fmt: skip
    return pd.DataFrame.from_dict(rows, orient="index")


def ptb_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Per variant: char-PTB validation bpc after the wall-clock budget, the steps done in it,
    and the bpc difference to dot paired by seed."""
    p = frame[frame["config"].str.startswith("ptb/")]
    base = p[p.variant == CONTROL].set_index("seed")["val_bpc"]
    rows = {}
    for v, g in p.groupby("variant", sort=False):
        bpc = g.set_index("seed")["val_bpc"]
        diff = "" if v == CONTROL else paired_difference(bpc, base).format(3, signed=True)
        rows[v] = {"val bpc": interval_text(bpc), "steps done": interval_text(g["steps_done"], 0),
                   "bpc minus dot": diff}  # fmt: skip
    return pd.DataFrame.from_dict(rows, orient="index")


# ----------------------------------------------------------------------------------------
# the anchors
# ----------------------------------------------------------------------------------------


# ----------------------------------------------------------------------------------------
# claims
# ----------------------------------------------------------------------------------------


def _per_seed(df: pd.DataFrame, variant: str, metric: str) -> pd.Series:
    """``metric`` of ``variant`` averaged over the cross's cells, one value per seed."""
    return df[df.variant == variant].groupby("seed")[metric].mean()


def effects(df: pd.DataFrame) -> dict[str, Interval]:
    """Each claim's effect: ``arm - dot`` of its metric (each seed's mean over the cells),
    paired by seed."""
    return {
        key: paired_difference(_per_seed(df, arm, m), _per_seed(df, CONTROL, m))
        for key, (arm, m, _, _) in CLAIMS.items()
        if (df.variant == arm).any()
    }


def outcomes(smoke: bool = False, grid: Any = None) -> dict[str, Any]:
    """The register's outcomes of the claims chapter 9 tests (:data:`CLAIMS`): the verdict of
    each effect against its declared SESOI, at the training scale stated (dot's mean MQAR test
    accuracy over the cross, against the mean chance of copying a context value)."""
    from attention_atlas.verdicts import TrainingScale, outcome_from_verdict

    grid = grid if grid is not None else zoo_grid(smoke=smoke, log=None)
    df = mqar_frame(grid.frame)
    eff = effects(df)
    dot = df[df.variant == CONTROL]
    steps = int(dot.steps.max()) if len(dot) else 0
    batch = int(grid.records[next(iter(grid.records))]["params"].get("train", {})
                .get("batch_size", 0)) if grid.records else 0  # fmt: skip
    scale = TrainingScale(
        steps=steps, tokens=steps * batch, seeds=int(df.seed.nunique()),
        baseline=float(dot.test_acc.mean()) if len(dot) else 0.0, metric="acc",
        chance=float(dot.chance.mean()) if len(dot) else 0.0,
        what="dot-product baseline (MQAR test accuracy over the cross; 'tokens' are sequences)",
    )  # fmt: skip
    out = {}
    for key, (arm, metric, form, direction) in CLAIMS.items():
        effect = eff.get(key)
        v = decide(form, effect, margin=SESOI[metric], direction=direction,
                   not_tested=None if effect is not None else f"no {arm} runs in this grid")  # fmt: skip
        what = f"{WHAT[metric]}, {arm} minus dot, paired by seed (mean over the cross's cells)"
        out[key] = outcome_from_verdict(v, what, scale=scale, evidence=grid.provenance.text)
    return out


def summary(df: pd.DataFrame, frame: pd.DataFrame, anchor: Mapping[str, Any],
            register: Mapping[str, Any]) -> str:  # fmt: skip
    """The chapter's closing note, computed: the leaderboard per cell (arms in order of mean
    test accuracy, with intervals), the learning rates chosen, each arm's time per step against
    dot, char-PTB bpc at the budget, the anchors and the claims' outcomes."""
    lines = ["**Leaderboard** (MQAR test accuracy, mean [95% interval] over seeds, best first):"]
    for c in _cells(df):
        sub = df[df.cell == c]
        means = sub.groupby("variant")["test_acc"].mean().sort_values(ascending=False)
        ranked = ", ".join(
            f"{v} {interval_text(sub[sub.variant == v].test_acc)}" for v in means.index
        )
        lines.append(f"* {c} (chance {1 / int(sub.pairs.iloc[0]):.3f}): {ranked}.")
    lrs = df.drop_duplicates("variant").set_index("variant")["lr"]
    lines.append(
        "**Learning rates chosen**: " + ", ".join(f"{v} {lr:g}" for v, lr in lrs.items()) + "."
    )
    t = timing_table(frame)
    if len(t):
        lines.append(
            "**Time per training step against dot** (ratio, side by side): "
            + ", ".join(f"{v} {r}" for v, r in t["ratio to dot"].items())
            + "."
        )
    p = ptb_table(frame)
    if len(p):
        lines.append(
            "**char-PTB at the same wall-clock budget** (val bpc; steps done): "
            + ", ".join(f"{v} {r['val bpc']} ({r['steps done']} steps)" for v, r in p.iterrows())
            + "."
        )
    lines.append(
        f"**Anchors**: dot on the easiest cell {anchor['dot_easiest'].format(3)} "
        f"(at least {ANCHOR_ACC} asked: {anchor['dot_ok']}); the SSM falls with pairs: "
        f"{anchor.get('ssm_ok')}; every learner above chance: {anchor['chance_ok']}."
    )
    lines.append(
        "**Claims**: " + "; ".join(f"`{k}` {o.outcome}" for k, o in register.items()) + "."
    )
    return "\n\n".join(lines)


def protocol_text(grid: Any, long: Mapping[str, Any]) -> str:
    """The protocol of ``grid`` in words, every number read from its records, and what it
    leaves out of the full protocol (the ``long`` preset's parameters over
    :func:`~attention_atlas.experiments.zoo.run.chapter_grid`'s defaults)."""
    import inspect

    from .run import chapter_grid

    recs = [r["params"] for r in grid.records.values() if r["params"]["kind"] == "mqar"]
    ptb = [r["params"] for r in grid.records.values() if r["params"]["kind"] == "ptb"]
    p = recs[0]
    m, t, tr, sel = p["model"], p["task"], p["train"], p["selection"]
    widths = sorted({r["width"] for r in recs})
    pairs = sorted({r["pairs"] for r in recs})
    arms = list(dict.fromkeys(r["variant"] for r in recs))
    centre = (sel["model"]["dim"], sel["task"]["n_pairs"])
    only = [v for v in arms if {(r["width"], r["pairs"]) for r in recs if r["variant"] == v}
            == {centre}]  # fmt: skip
    cof = next((r["regularizer"] for r in recs if r["regularizer"]), None)
    full = {**{k: v.default for k, v in inspect.signature(chapter_grid).parameters.items()},
            **long}  # fmt: skip
    lines = [
        f"**This grid.** {m['n_layers']} layers, {m['n_heads']} head(s); {len(arms)} arms; "
        f"widths {widths} at {centre[1]} pairs and pairs {pairs} at width {centre[0]} (the "
        f"centre: width {centre[0]}, {centre[1]} pairs); sequence length "
        f"max({min(r['task']['seq_len'] for r in recs)}, 4N), vocabulary "
        f"{t['vocab_size']}; per seed {t['n_train']:,} training, {t['n_val']:,} validation and "
        f"{t['n_test']:,} test sequences; {tr['steps']:,} steps of {tr['batch_size']} sequences "
        f"(so each training sequence is seen {tr['steps'] * tr['batch_size'] / t['n_train']:.2f} "
        f"times on average); learning rates {sel['lrs']} chosen on seed {sel['seed']}.",
    ]
    ssm = next((r["model"].get("attention_options") for r in recs if r["variant"] == "ssm"), None)
    lines.append(
        f"Token shift (`W h_(t-1)` added to each embedding): {'on' if m.get('token_shift') else 'off'}"
        + (f"; the SSM arm's options: {ssm}." if ssm else ".")
    )
    if cof:
        lines.append(f"The cofactor arm adds weight {cof['weight']:g} times the seed's penalty "
                     f"(beta {cof['beta']:g}) on the first {cof['heads']} head(s) of each layer.")  # fmt: skip
    if ptb:
        q = ptb[0]
        lines.append(f"char-PTB: width {q['model']['dim']}, windows of {q['train']['seq_len']} "
                     f"characters, {q['train']['batch_size']} per step, "
                     f"{q['train']['budget_s']:g} s of training per run.")  # fmt: skip
    left = [f"widths {sorted(set(full['widths']) - set(widths))}" if set(full["widths"]) - set(widths) else "",
            f"pairs {sorted(set(full['pairs']) - set(pairs))}" if set(full["pairs"]) - set(pairs) else "",
            f"the cells off the centre for {', '.join(only)}" if only else ""]  # fmt: skip
    left = [x for x in left if x]
    less = [f"{tr['steps']:,} rather than {full['steps']:,} steps"
            if tr["steps"] != full["steps"] else "",
            f"length {t['seq_len']} rather than {full['seq_len']}"
            if t["seq_len"] != full["seq_len"] else "",
            f"vocabulary {t['vocab_size']} rather than {full['vocab_size']}"
            if t["vocab_size"] != full["vocab_size"] else "",
            f"char-PTB for {ptb[0]['train']['budget_s']:g} s rather than "
            f"{full['ptb_budget_s']:g} s" if ptb and ptb[0]["train"]["budget_s"]
            != full["ptb_budget_s"] else ""]  # fmt: skip
    less = [x for x in less if x]
    protocol = (
        f"(`--preset long`: widths {full['widths']} at {full['centre_pairs']} pairs, pairs "
        f"{full['pairs']} at width {full['centre_width']}, length max({full['seq_len']}, 4N), "
        f"vocabulary {full['vocab_size']}, {full['steps']:,} steps of {full['batch_size']}, "
        f"char-PTB {full['ptb_budget_s']:g} s per run)"
    )
    if not left and not less:
        lines.append(f"**This is the full protocol** {protocol}.")
    else:
        lines.append(
            f"**What it leaves out of the full protocol** {protocol}: "
            + ("; ".join(left) or "no cell")
            + (f"; and it runs {', '.join(less)}." if less else ".")
        )
    return "\n\n".join(lines)


def state_table(grid: Any) -> pd.DataFrame:
    """Per MQAR cell: the SSM's recurrent state (floats, all layers: fixed by the width) against
    what softmax attention keeps at the end of a sequence (its keys and values: ``2 L D`` floats
    per layer, growing with the length ``L``)."""
    rows = {}
    for r in grid.records.values():
        p = r["params"]
        if p["kind"] != "mqar" or p["variant"] != "ssm":
            continue
        m, length = p["model"], p["task"]["seq_len"]
        from .run import ssm_state_size

        rows[cell_name(p["width"], p["pairs"])] = {
            "sequence length": length,
            "SSM state (floats)": ssm_state_size(m["dim"], m["n_heads"], m["n_layers"]),
            "attention keys and values (floats)": 2 * length * m["dim"] * m["n_layers"],
        }
    return pd.DataFrame.from_dict(rows, orient="index")


def ablation_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Each ablation beside the protocol's cell it changes, test accuracy and the learning
    curve's mean (intervals over seeds): dot-product attention at the easiest cell with an MLP,
    with tied embeddings and without the token shift; the SSM at the centre with Mamba-2's
    initialisation instead of :data:`~attention_atlas.experiments.zoo.run.SSM_RECALL_INIT`. Empty
    when the grid has no ablations."""
    abl = frame[frame["config"].str.startswith("ablation/")]
    labels = {"mlp": ("dot", "with an MLP (4 D)"), "tied": ("dot", "with tied embeddings"),
              "noshift": ("dot", "without the token shift"),
              "ssm-init": ("ssm", "with Mamba-2's initialisation")}  # fmt: skip
    rows: dict[str, pd.DataFrame] = {}
    for config in dict.fromkeys(abl["config"]):
        _, name, cell = config.split("/")
        arm, label = labels.get(name, (CONTROL, name))
        rows.setdefault(
            f"{arm} {cell}: the protocol", frame[frame["config"] == f"mqar/{arm}/{cell}"]
        )
        rows[f"{arm} {cell}: {label}"] = abl[abl["config"] == config]
    return pd.DataFrame.from_dict(
        {k: {"test accuracy": interval_text(g["test_acc"]),
             "learning-curve mean": interval_text(g["learning_auc"])}
         for k, g in rows.items() if len(g)}, orient="index",
    )  # fmt: skip
