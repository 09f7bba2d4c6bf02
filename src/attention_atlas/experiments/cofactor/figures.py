"""The figures of chapter 6: each takes what the chapter computed (the identities' float64
tables of :mod:`.numerics`, one point of the exploration, the records of the training grid)
and returns a ``go.Figure``; the chapter shows them with ``viz.show`` or ``viz.explore``.
Nothing here computes a table or trains.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from attention_atlas import viz

from .analysis import grad_norm_matrix, history_matrix

__all__ = [
    "COUPLING_SERIES",
    "coupling",
    "grad_norms",
    "method_errors",
    "method_times",
    "perturbation",
    "regularised_heads",
]

#: the columns of :func:`.numerics.coupling_table` that :func:`coupling` draws
COUPLING_SERIES = [
    "margin",
    "spectral gap",
    "n min pi",
    "lu error (float64)",
    "minors error (float64)",
    "lu error (float32)",
]


def coupling(table: pd.DataFrame, n: int) -> go.Figure:
    """Two blocks of ``n // 2`` tokens coupled by epsilon (:func:`.numerics.coupling_table`
    at size ``n``): the margin, spectral gap, ``n min pi`` and the errors of the LU and minors
    against 50-digit cofactors, each column of :data:`COUPLING_SERIES` against ``coupling``
    on log-log axes (values clipped below at 1e-18)."""
    return viz.loglog(
        table["coupling"],
        {k: table[k].clip(lower=1e-18) for k in COUPLING_SERIES},
        title=f"Two blocks of {n // 2} tokens coupled by epsilon "
        "(errors against 50-digit cofactors)",
        xlabel="coupling epsilon",
        ylabel="value",
        slopes_in_legend=False,
    )


def perturbation(
    d: Mapping[str, Any], eps: float, target: str, eps_grid: Sequence[float]
) -> go.Figure:
    """One point of the exploration toward a reducible matrix (:func:`.numerics.perturbation_data`
    ``d`` of ``A(eps)`` toward ``target``, over ``eps_grid``), in three panels: the normalised
    cofactors ``d["pi"]`` (one bar per token, ``n = len(d["pi"])``), the eigenvalues of ``A``
    (``d["eig_real"]``, ``d["eig_imag"]``) with the unit circle, and the margin and spectral
    gap over ``eps_grid`` (``d["margins"]``, ``d["gaps"]``, log-log, clipped at 1e-16) with the
    current ``eps`` marked."""
    n = len(d["pi"])
    title = f"m = {d['margin']:.3g}, gap = {max(d['gap'], 0.0):.3g}"
    fig = make_subplots(
        1, 3, subplot_titles=("normalised cofactors pi_i", "eigenvalues of A", title)
    )
    fig.add_bar(x=list(range(n)), y=d["pi"], name="pi_i", row=1, col=1)
    t = np.linspace(0, 2 * np.pi, 100)
    fig.add_scatter(x=np.cos(t), y=np.sin(t), mode="lines", name="unit circle", row=1, col=2)
    fig.add_scatter(
        x=d["eig_real"], y=d["eig_imag"], mode="markers", name="lambda(A)", row=1, col=2
    )
    fig.add_scatter(x=eps_grid, y=d["margins"], name="margin m", row=1, col=3)
    fig.add_scatter(
        x=eps_grid, y=np.clip(d["gaps"], 1e-16, None), name="spectral gap", row=1, col=3
    )
    fig.add_scatter(
        x=[eps, eps],
        y=np.clip([d["margin"], d["gap"]], 1e-16, None),
        mode="markers",
        marker={"size": 12, "symbol": "x"},
        name=f"eps = {eps:g}",
        row=1,
        col=3,
    )
    fig.update_xaxes(type="log", row=1, col=3)
    fig.update_yaxes(type="log", row=1, col=3)
    fig.update_yaxes(range=[0, 1], row=1, col=1)
    fig.update_xaxes(range=[-1.15, 1.15], row=1, col=2)
    fig.update_yaxes(range=[-1.15, 1.15], row=1, col=2)
    return fig.update_layout(title=f"toward {target}, eps = {eps:g} (n = {n})", height=380)


def method_times(table: pd.DataFrame, batch: int, repeats: int) -> go.Figure:
    """Time of the three methods against ``n`` (:func:`.numerics.method_sweep`'s columns
    ``time minors (ms)``, ``time lu (ms)``, ``time power (ms)``) for ``batch`` matrices, the
    median of ``repeats`` rounds, on log-log axes."""
    return viz.loglog(
        table["n"],
        {k: table[f"time {k} (ms)"] for k in ["minors", "lu", "power"]},
        title=f"Time for {batch} matrices (float64, median of {repeats})",
        xlabel="n",
        ylabel="ms",
    )


def method_errors(table: pd.DataFrame) -> go.Figure:
    """Error against the float64 minors of :func:`.numerics.method_sweep`'s LU and power
    methods (``lu rel. err``, ``power rel. err``) and the power iteration's stated bound
    (``power bound``) against ``n`` on log-log axes (clipped below at 1e-17)."""
    return viz.loglog(
        table["n"],
        {
            "lu vs minors": table["lu rel. err"].clip(lower=1e-17),
            "power vs minors": table["power rel. err"].clip(lower=1e-17),
            "power: stated bound on ||pi - pi_ref||_1": table["power bound"].clip(lower=1e-17),
        },
        title="Error against the float64 minors",
        xlabel="n",
        ylabel="relative error",
        slopes_in_legend=False,
    )


def grad_norms(
    records: Mapping[tuple[str, int], dict[str, Any]],
    configs: Mapping[str, Mapping[str, Any]],
    seeds: Sequence[int],
) -> go.Figure:
    """The gradient norm before clipping at every step (:func:`.analysis.grad_norm_matrix`,
    ``(seeds, steps)``), mean and 95% interval over ``seeds``, one band per configuration of
    ``configs`` (name -> parameters with ``task`` and ``arm``), from the grid's ``records``
    (``(name, seed)`` -> record); log scale."""
    fig = go.Figure()
    for name, params in configs.items():
        g = grad_norm_matrix([records[(name, s)] for s in seeds])  # (seeds, steps)
        viz.line_band(
            np.arange(1, g.shape[1] + 1), {f"{params['task']} {params['arm']}": g}, fig=fig
        )
    fig.update_layout(
        title="Gradient norm before clipping (mean and 95% interval over seeds)",
        xaxis_title="step",
        yaxis_title="||grad||",
        yaxis_type="log",
    )
    return fig


def regularised_heads(
    records: Mapping[tuple[str, int], dict[str, Any]],
    configs: Mapping[str, Mapping[str, Any]],
    seeds: Sequence[int],
    gap_tol: float,
) -> go.Figure:
    """The regularised heads during training, from the log steps of each record's history
    (:func:`.analysis.history_matrix`): their log-margin (left) and the fraction of them
    nearly disconnected, spectral gap below ``gap_tol`` (right), mean and 95% interval over
    ``seeds``, one band per configuration of ``configs`` (as in :func:`grad_norms`)."""
    fig = make_subplots(
        1,
        2,
        subplot_titles=(
            "log-margin, regularised heads",
            f"fraction nearly disconnected (gap < {gap_tol:g})",
        ),
    )
    for col, column in enumerate(["cofactor/cofactor_log_margin", "cofactor/frac_disconnected"], 1):
        for name, params in configs.items():
            steps, values = history_matrix([records[(name, s)] for s in seeds], column)
            band = viz.line_band(steps, {f"{params['task']} {params['arm']}": values})
            for trace in band.data:
                fig.add_trace(trace.update(showlegend=col == 1, legendgroup=name), row=1, col=col)
    fig.update_xaxes(title_text="step")
    return fig.update_layout(title="The regularised heads during training (mean and 95% interval)")
