"""The figures of chapter 4: each takes the runs of a grid (:class:`.analysis.Runs`) or a
computed check and returns a ``go.Figure``; the chapter shows them with ``viz.show``.

A configuration that diverged at some seed has no measurements: the figures over the grid draw
only the configurations that finished at every seed (:meth:`.analysis.Runs.finished`), and the
chapter names the ones left out. Nothing here computes a verdict (:mod:`.verdicts`) or trains.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from attention_atlas import viz

from .analysis import TYPE_NAMES, Runs

__all__ = [
    "bpc_and_time",
    "cap_regularisers",
    "eq25_bars",
    "geometry_gates",
    "p1_critical_axis",
    "p2_alpha_transfer",
    "p3_metric_strength",
    "p4_kappa_by_type",
    "p5_rank_against_entropy",
    "p6_rank_ablation",
    "run_view",
    "step_cost",
]


def _color(k: int) -> str:
    """The ``k``-th colour of the book's palette (cycling)."""
    return viz.COLORS[k % len(viz.COLORS)]


def bpc_and_time(runs: Runs) -> go.Figure:
    """Two bar panels over every configuration that finished: validation bits per character
    (``val_bpc``) and the training time (the column of :attr:`.analysis.Runs.time`), each the
    mean and 95% interval over the seeds."""
    time_col, time_name = runs.time
    finished = runs.finished()
    fig = make_subplots(rows=1, cols=2, subplot_titles=("validation bits per character", time_name))
    for col, metric in enumerate(("val_bpc", time_col), start=1):
        viz.mean_interval(
            {name: runs.per_seed(name, metric) for name in finished},
            fig=fig,
            row=1,
            col=col,
            mode="bar",
        )
    fig.update_layout(
        title=f"All configurations, mean and 95% interval over {len(runs.seeds)} seeds",
        height=440,
        margin={"t": 110},
    )
    return fig


def _window_panels(fig: go.Figure, ex: Mapping[str, Any], last: int) -> None:
    """Into ``fig`` (2 x 2): ``kappa_t`` of each block over a run's stored text (top right,
    ``ex["kappa_<l>"]``, one value per character of ``ex["text"]``) and the first and ``last``
    block's attention (``ex["attention_<l>"]``, ``(len, len)``, bottom), characters as ticks."""
    pos, chars = list(range(len(ex["text"]))), [c if c != " " else "_" for c in ex["text"]]
    for l in range(1, last + 1):
        if f"kappa_{l}" in ex:
            fig.add_trace(
                go.Scatter(x=pos, y=ex[f"kappa_{l}"], name=f"κ_t block {l}"), row=1, col=2
            )
    for col, l in ((1, 1), (2, last)):
        z = np.asarray(ex[f"attention_{l}"], dtype=np.float32)  # stored to 3 decimals
        fig.add_trace(
            go.Heatmap(z=z, x=pos, y=pos, colorscale="Viridis", zmin=0, zmax=1, showscale=col == 2),
            row=2,
            col=col,
        )
        fig.update_yaxes(autorange="reversed", row=2, col=col)
    for row, col in ((1, 2), (2, 1), (2, 2)):  # characters as tick labels (positions as values)
        fig.update_xaxes(tickvals=pos, ticktext=chars, tickangle=0, row=row, col=col)
    fig.update_yaxes(tickvals=pos, ticktext=chars, row=2)


def run_view(runs: Runs, config: str, seed: int) -> go.Figure:
    """One stored run of ``config`` at ``seed`` (the chapter's exploration): its validation bpc
    at each log step (:meth:`.analysis.Runs.history`), ``kappa_t`` (mean over heads) of each
    block over the first characters of the validation text, and the first and last block's
    attention over that text (mean over heads), from the record's ``explore`` entry. A run
    that diverged has no ``explore``: its training curve up to the divergence, and a title
    that says so."""
    rec, hist, last = runs.cells[(config, seed)], runs.history(config, seed), runs.n_layers
    fig = make_subplots(
        rows=2,
        cols=2,
        vertical_spacing=0.16,
        subplot_titles=(
            "validation bpc during training",
            "κ_t over the text (mean over heads)",
            "attention, block 1",
            f"attention, block {last}",
        ),
    )
    if len(hist):  # a run that diverged before its first log step has none
        fig.add_trace(go.Scatter(x=hist["step"], y=hist["val_bpc"], name="val bpc"), row=1, col=1)
    if "explore" not in rec:  # a diverged run: nothing was measured on its weights
        fig.update_layout(
            title=f"{config}, seed {seed}: diverged at step {rec['diverged_step']}, "
            "nothing measured",
            height=720,
        )
        return fig
    _window_panels(fig, rec["explore"], last)
    fig.update_layout(title=f"{config}, seed {seed}: final bpc {rec['val_bpc']:.3f}", height=720)
    return fig


def p1_critical_axis(runs: Runs, arms: Mapping[str, str]) -> go.Figure:
    """P1: each finished arm of ``arms`` (legend label -> configuration) on the critical axis,
    one point per seed: the attention's sigma_2 (mean over blocks, left) and the last block's
    effective rank (right) against the perturbation scale ``Ū² M / τ`` (``entry_scale_<l>``,
    mean over blocks, log axis), with the dot-product model's mean as a dashed line and the
    scale 1 dotted."""
    last, finished = runs.n_layers, runs.finished()
    fig = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=("attention σ₂ (mean over blocks)", f"effective rank, block {last}"),
    )
    for k, (label, name) in enumerate(arms.items()):
        if name not in finished:
            continue
        x = runs.mean_over_layers(name, "entry_scale_{l}")
        for col, y in enumerate(
            (runs.mean_over_layers(name, "sigma2_{l}"), runs.per_seed(name, f"erank_{last}")),
            start=1,
        ):
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=y,
                    mode="markers",
                    name=label,
                    showlegend=col == 1,
                    marker={"color": _color(k), "size": 9},
                ),
                row=1,
                col=col,
            )
    for col, y in (
        (1, runs.mean_over_layers("dot", "sigma2_{l}").mean()),
        (2, runs.per_seed("dot", f"erank_{last}").mean()),
    ):
        fig.add_hline(y=y, line_dash="dash", annotation_text="dot product (mean)", row=1, col=col)
        fig.add_vline(x=1.0, line_dash="dot", line_color="grey", row=1, col=col)
    fig.update_xaxes(
        type="log", title_text="Ū² M / τ (Proposition 3.5's scale of one score change)"
    )
    fig.update_layout(
        title="P1: the trained models on the critical axis, one point per seed",
        height=460,
        margin={"t": 110},
    )
    return fig


def p2_alpha_transfer(runs: Runs, names: Mapping[float, str]) -> go.Figure:
    """P2: for each finished model of ``names`` (training alpha -> configuration), its
    validation bpc (``bpc_at_alpha_<a>``, mean and 95% interval over seeds) at every training
    alpha of ``names`` used as the evaluation alpha, one line per training alpha."""
    finished = runs.finished()
    fig = go.Figure()
    for k, (a_tr, n) in enumerate(names.items()):
        if n not in finished:
            continue
        bpc_at = {f"{a:g}": runs.per_seed(n, f"bpc_at_alpha_{a:g}") for a in names}
        viz.mean_interval(
            bpc_at, x=list(names), fig=fig, name=f"trained at alpha={a_tr:g}", color=_color(k)
        )
    fig.update_layout(
        title="P2: validation bpc at each evaluation alpha",
        height=420,
        xaxis_title="evaluation alpha",
        yaxis_title="bits per character",
    )
    return fig


def p3_metric_strength(runs: Runs, arms: Mapping[str, str]) -> go.Figure:
    """P3: the metric strength during training of each finished arm of ``arms`` (legend label
    -> configuration): mean ``kappa_t`` (from its value at initialisation, step 0) and its
    cross-token variance, averaged over blocks (:meth:`.analysis.Runs.trajectory`), mean and
    95% interval over seeds at each log step, log scale."""
    finished = runs.finished()
    fig = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=("mean kappa_t = |U_t|_F^2", "cross-token variance of kappa_t"),
    )
    for k, (label, n) in enumerate(arms.items()):
        if n not in finished:
            continue
        for col, key in enumerate(("kappa_mean", "kappa_var"), start=1):
            x, values = runs.trajectory(n, key)  # kappa_mean starts at its value at initialisation
            viz.mean_interval(
                {str(i): values[:, i] for i in range(values.shape[1])},
                x=x,
                fig=fig,
                row=1,
                col=col,
                name=label,
                mode="lines+markers",
                color=viz.COLORS[k],
                showlegend=col == 1,
            )
    fig.update_yaxes(type="log")
    fig.update_xaxes(title_text="step")
    fig.update_layout(
        title="P3: metric strength during training (mean and 95% interval over seeds)",
        height=440,
        margin={"t": 110},
    )
    return fig


def cap_regularisers(cap: Mapping[str, Any]) -> go.Figure:
    """The regularisers of eqs. (31) to (34) along a scaled metric, from
    :func:`.cap.cap_check`: each weighted term (``cap["terms"]``, name -> values) and their sum
    (``cap["total"]``) against the mean ``kappa_t / kappa_max`` (``cap["ratio"]``, log axis),
    the peak of the sum (``cap["peak"]``) marked."""
    fig = go.Figure()
    for k, (term, values) in enumerate(cap["terms"].items()):
        fig.add_trace(
            go.Scatter(
                x=cap["ratio"], y=values, name=f"{term} (weighted)", line={"color": _color(k)}
            )
        )
    fig.add_trace(
        go.Scatter(x=cap["ratio"], y=cap["total"], name="sum", line={"color": "black", "width": 3})
    )
    fig.add_vline(x=cap["peak"], line_dash="dot", annotation_text="peak of the sum")
    fig.update_xaxes(type="log", title_text="mean κ_t / κ_max (U scaled by λ)")
    fig.update_yaxes(title_text="regulariser value (weighted)")
    fig.update_layout(
        title="The regularisers of eqs. (31) to (34) along a scaled metric (float64)", height=440
    )
    return fig


def p4_kappa_by_type(runs: Runs, config: str = "fbt") -> go.Figure:
    """P4: ``kappa_t`` by token type (:data:`.analysis.TYPE_NAMES`) after training, one panel
    per block: a box of the quantiles 5-25-50-75-95% (the record's ``kappa_quantiles``,
    averaged over seeds) per type present at every seed. Empty panels when ``config``
    diverged."""
    last = runs.n_layers
    fig = make_subplots(
        rows=1, cols=last, subplot_titles=[f"block {l}" for l in range(1, last + 1)]
    )
    for l in range(1, last + 1) if config in runs.finished() else ():
        by_seed = [runs.cells[(config, s)]["kappa_quantiles"][f"kappa_{l}"] for s in runs.seeds]
        for code, name in enumerate(TYPE_NAMES):
            q = np.array([qs.get(name, [np.nan] * 5) for qs in by_seed]).mean(0)
            if np.isfinite(q).all():
                box = go.Box(
                    name=name,
                    q1=[q[1]],
                    median=[q[2]],
                    q3=[q[3]],
                    lowerfence=[q[0]],
                    upperfence=[q[4]],
                    showlegend=False,
                    marker_color=_color(code),
                )
                fig.add_trace(box, row=1, col=l)
    fig.update_yaxes(title_text="κ_t (mean over heads)", col=1)
    fig.update_layout(
        title="P4: κ_t by token type after training (default model; quantiles 5-25-50-75-95%, "
        "averaged over seeds)",
        height=460,
        margin={"t": 110},
    )
    return fig


def p5_rank_against_entropy(runs: Runs, arms: Sequence[str]) -> go.Figure:
    """P5: the last block's effective rank (``erank_<L>``) against the attention's mean row
    entropy (``entropy_<l>``, mean over blocks), one point per seed, for each finished
    configuration of ``arms`` (dot-product models as circles, the others as diamonds)."""
    last, finished = runs.n_layers, runs.finished()
    fig = go.Figure()
    for k, name in enumerate(arms):
        if name not in finished:
            continue
        symbol = "circle" if name.startswith("dot") else "diamond"
        fig.add_trace(
            go.Scatter(
                x=runs.mean_over_layers(name, "entropy_{l}"),
                y=runs.per_seed(name, f"erank_{last}"),
                mode="markers",
                name=name,
                marker={"size": 9, "color": _color(k), "symbol": symbol},
            )
        )
    fig.update_layout(
        title=f"P5: effective rank of block {last} against attention entropy, one point per seed",
        xaxis_title="mean row entropy of the attention (nats, mean over blocks)",
        yaxis_title="effective rank",
        height=460,
    )
    return fig


def p6_rank_ablation(runs: Runs, names: Mapping[int, str]) -> go.Figure:
    """P6: the last block's effective rank, validation bpc and training time (mean and 95%
    interval over seeds) against the metric rank, for the finished models of ``names`` (rank
    -> configuration), the dot-product model's mean as a dashed line in each panel."""
    last, finished = runs.n_layers, runs.finished()
    time_col, time_name = runs.time
    shown = {r: n for r, n in names.items() if n in finished}
    fig = make_subplots(
        rows=1,
        cols=3,
        subplot_titles=(f"effective rank, block {last}", "validation bpc", time_name),
    )
    for col, column in enumerate((f"erank_{last}", "val_bpc", time_col), start=1):
        viz.mean_interval(
            {n: runs.per_seed(n, column) for n in shown.values()},
            x=list(shown),
            fig=fig,
            row=1,
            col=col,
            name="Fiber Bundle",
            color=viz.COLORS[0],
            showlegend=col == 1,
        )
        fig.add_hline(
            y=float(runs.per_seed("dot", column).mean()),
            line_dash="dash",
            row=1,
            col=col,
            annotation_text="dot product",
        )
    fig.update_xaxes(type="log", title_text="metric rank r")
    fig.update_layout(title="P6: metric rank ablation", height=440, margin={"t": 110})
    return fig


def eq25_bars(c: Mapping[str, float], rank: int) -> go.Figure:
    """The two sides of eq. (25)'s identity and the true bound for one random ``Δ`` of factor
    rank ``rank`` (:func:`.verdicts.eq25_counterexample`'s ``lhs``, ``rhs`` and ``bound``), as
    three bars."""
    labels = ["‖ΔᵀΔ‖_F (= ‖PᵀP − I‖_F)", "‖Δ‖_F² (eq. (25))", "‖Δ‖_F² / √2 (the bound)"]
    fig = go.Figure(
        go.Bar(x=labels, y=[c["lhs"], c["rhs"], c["bound"]], marker_color=viz.COLORS[:3])
    )
    fig.update_layout(title=f"Δ = A Bᵀ − B Aᵀ, A, B of rank {rank} in R^8 (float64)", height=380)
    return fig


def step_cost(cost: pd.DataFrame, shape: str) -> go.Figure:
    """The forward+backward time of each model relative to the dot-product model's, one bar per
    row of ``cost`` (:func:`.run.step_cost_table`, column ``"forward+backward ratio"``), at the
    timed ``shape`` (for the title)."""
    fig = go.Figure(go.Bar(x=list(cost.index), y=cost["forward+backward ratio"]))
    fig.update_layout(
        title=f"Forward+backward time relative to the dot-product model ({shape})",
        yaxis_title="ratio to dot product",
        height=400,
    )
    return fig


def geometry_gates(table: pd.DataFrame, sesoi: float, title: str = "",
                   unit: str = "bpc") -> go.Figure:  # fmt: skip
    """The geometry gate of every configuration of ``table``
    (:func:`~.verdicts.gate_table`): the change of validation bpc when the geometry is removed
    at evaluation (``alpha -> 0``, ``U -> 0``), mean and 95% interval over seeds, with the
    smallest effect of interest ``sesoi`` drawn
    (a gate is active when its interval lies above that line). Configurations without the
    evaluation are named on the axis with no marker. ``unit``: what the change is measured in
    (MQAR's gate is the test accuracy lost)."""
    fig = go.Figure()
    for k, (w, label) in enumerate((("alpha0", "alpha -> 0"), ("u0", "U -> 0"))):
        m = table[f"{w}_mean"].to_numpy(dtype=float)
        fig.add_trace(go.Scatter(
            x=table["config"], y=m, mode="markers", name=label, marker={"color": _color(k)},
            error_y={"type": "data", "symmetric": False,
                     "array": table[f"{w}_high"].to_numpy(dtype=float) - m,
                     "arrayminus": m - table[f"{w}_low"].to_numpy(dtype=float)},
        ))  # fmt: skip
    fig.add_hline(y=sesoi, line_dash="dash", annotation_text=f"smallest effect {sesoi:g} {unit}")
    fig.add_hline(y=0.0, line_width=1, line_color="grey")
    fig.update_layout(title=title or f"Geometry gate: {unit} change when the geometry is removed",
                      xaxis_title="configuration", yaxis_title=f"change: {unit} (95% interval)",
                      height=380)  # fmt: skip
    return fig
