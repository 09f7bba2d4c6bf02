"""Chapter 5's checks of the matroidal metric over every covector family, and its short timing.

* :func:`unimodularity_survey`: every family at every feasible ``m`` on ``d`` nodes, checked
  structurally (signed incidence) and exhaustively (every square minor);
* :func:`decomposition_errors`: ``x^T M x = sum_e l_e (a_e^T x)^2 + eps |x|^2``, ``R^T R = M``
  and ``lambda_min(M) >= eps`` (worst case over the families and ``m``);
* :func:`fast_path_errors`: the fast path against the seed's pseudocode, outputs and gradients;
* :func:`null_directions`: the all-ones direction every incidence family misses, and grounding;
* :func:`math_outcomes`: the outcomes of the three mathematical claims from those checks;
* :func:`time_against_sdpa`: matroidal attention against SDPA through :func:`bench.compare`;
* :func:`memory_growth`: peak memory of one forward+backward against ``L``, live
  (:func:`bench.peak_memory`);
* :func:`stored_benchmark`: the tables of ``benchmarks/bench_matroidal.py``'s JSON;
* :func:`metric_view`: the exploration (graph family and ``m`` -> ``M``, its spectrum, the
  attention it gives).

Random draws use ``generator`` (the global RNG when None), in a fixed order.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch
import torch.nn.functional as F
from torch import Tensor

from attention_atlas.attention.dot import masked_softmax
from attention_atlas.attention.graphs import (
    CONTRAST_FAMILIES,
    GRAPH_FAMILIES,
    covector_matrix,
    graph_family_admits,
    is_signed_incidence,
    is_totally_unimodular,
)
from attention_atlas.attention.matroidal import (
    matroidal_attention,
    matroidal_coefficients,
    matroidal_factor,
    matroidal_logits,
    matroidal_metric,
)
from attention_atlas.bench.timing import compare, peak_memory
from attention_atlas.verdicts import Outcome, outcome_from_check

__all__ = [
    "decomposition_errors",
    "fast_path_errors",
    "fast_path_outcome",
    "loglog_slope",
    "math_outcomes",
    "memory_growth",
    "metric_cases",
    "metric_view",
    "null_directions",
    "psd_outcome",
    "step_costs",
    "stored_benchmark",
    "time_against_sdpa",
    "unimodular_outcome",
    "unimodularity_summary",
    "unimodularity_survey",
]

D64 = torch.float64


def unimodularity_survey(d: int, *, seed: int = 1) -> pd.DataFrame:
    """Every family of :data:`GRAPH_FAMILIES` (bare and grounded) and :data:`CONTRAST_FAMILIES`
    at every ``m`` from ``d`` to ``d (d - 1) / 2`` it admits: columns ``family``, ``grounded``,
    ``m``, ``signed incidence``, ``totally unimodular (exhaustive)``, ``rank``."""
    rows = []
    for family in GRAPH_FAMILIES + CONTRAST_FAMILIES:
        for grounded in (False, True) if family in GRAPH_FAMILIES else (False,):
            for m in range(d, d * (d - 1) // 2 + 1):
                try:
                    A = covector_matrix(family, d, m, seed=seed, grounded=grounded, dtype=D64)
                except ValueError:
                    continue
                rows.append({
                    "family": family, "grounded": grounded, "m": m,
                    "signed incidence": is_signed_incidence(A),
                    "totally unimodular (exhaustive)": is_totally_unimodular(A),
                    "rank": int(torch.linalg.matrix_rank(A)),
                })  # fmt: skip
    return pd.DataFrame(rows)


def unimodularity_summary(survey: pd.DataFrame) -> pd.DataFrame:
    """Per family (and grounding) of :func:`unimodularity_survey`: the ``m`` range (and count),
    how many pass the exhaustive check, how many are certified by the signed-incidence structure
    and how many span ``R^d``."""
    d = int(survey["rank"].max())
    return (
        survey.groupby(["family", "grounded"], sort=False)
        .agg(
            m_values=("m", lambda s: f"{s.min()}..{s.max()} ({len(s)})"),
            tu_pass=("totally unimodular (exhaustive)", "sum"),
            certified=("signed incidence", "sum"),
            spans=("rank", lambda r: int((r == d).sum())),
        )
        .reset_index()
    )


def unimodular_outcome(survey: pd.DataFrame) -> Outcome:
    """The claim "graph-incidence columns give a totally unimodular A" from the survey: every
    incidence matrix (bare and grounded) passes the exhaustive check; the contrasts show the
    check can fail."""
    inc = survey[survey.family.isin(GRAPH_FAMILIES)]
    con = survey[survey.family.isin(CONTRAST_FAMILIES)]
    ok = bool(inc["totally unimodular (exhaustive)"].all() and inc["signed incidence"].all())
    d = int(survey["rank"].max())
    failing = int((~con["totally unimodular (exhaustive)"]).sum())
    return outcome_from_check(
        ok,
        f"all {len(inc)} incidence matrices on d = {d} nodes ({len(GRAPH_FAMILIES)} families, "
        f"every feasible m, with and without ground columns) pass the exhaustive check of every "
        f"square minor; {failing} of the {len(con)} contrast matrices fail it",
        f"{int((~inc['totally unimodular (exhaustive)']).sum())} of {len(inc)} incidence "
        f"matrices on d = {d} nodes have a square minor outside {{-1, 0, 1}}",
    )


def metric_cases(d: int, multiples: Sequence[int] = (1, 2, 4)) -> list[tuple[str, int]]:
    """``(family, m)`` for every graph family and ``m = k d`` (``k`` in ``multiples``) it admits
    on ``d`` nodes."""
    return [
        (f, k * d) for f in GRAPH_FAMILIES for k in multiples if graph_family_admits(f, d, k * d)
    ]


def decomposition_errors(
    cases: Sequence[tuple[str, int]],
    d: int,
    eps: float,
    *,
    n: int = 64,
    generator: torch.Generator | None = None,
) -> dict[str, float]:
    """Worst case over ``cases`` (float64, ``theta ~ 2 N(0, 1)``, ``n`` random ``x``) of

    * ``decomposition``: the relative error of ``x^T M x = sum_e l_e (a_e^T x)^2 + eps |x|^2``;
    * ``factor``: ``max |R^T R - M| / max |M|`` for the fast path's factor ``R``;
    * ``min_eig_minus_eps``: ``lambda_min(M) - eps`` (nonnegative up to rounding).
    """
    worst = {"decomposition": 0.0, "factor": 0.0, "min_eig_minus_eps": math.inf}
    for family, m in cases:
        A = covector_matrix(family, d, m, seed=2, dtype=D64)
        theta = 2 * torch.randn(m, dtype=D64, generator=generator)
        x = torch.randn(n, d, dtype=D64, generator=generator)
        M = matroidal_metric(A, theta, eps)
        quad = torch.einsum("nd,de,ne->n", x, M, x)
        rank_one = ((x @ A) ** 2 * matroidal_coefficients(theta)).sum(-1) + eps * (x * x).sum(-1)
        R = matroidal_factor(A, theta, eps)
        rel = float(((quad - rank_one) / quad).abs().max())
        worst["decomposition"] = max(worst["decomposition"], rel)
        worst["factor"] = max(worst["factor"], float((R.T @ R - M).abs().max() / M.abs().max()))
        low = float(torch.linalg.eigvalsh(M).min()) - eps
        worst["min_eig_minus_eps"] = min(worst["min_eig_minus_eps"], low)
    return worst


def fast_path_errors(
    cases: Sequence[tuple[str, int]],
    d: int,
    length: int,
    eps: float,
    tau: float = 0.5,
    *,
    generator: torch.Generator | None = None,
) -> tuple[float, float]:
    """Largest ``|fast - pseudocode|`` over ``cases``, causal and not (float64, batch 2):
    ``(outputs, gradients with respect to z, v and theta)``."""
    err_out = err_grad = 0.0
    for family, m in cases:
        A = covector_matrix(family, d, m, seed=5, dtype=D64)
        theta = torch.randn(m, dtype=D64, generator=generator).requires_grad_()
        z, v, w = (torch.randn(2, length, d, dtype=D64, generator=generator) for _ in range(3))
        z.requires_grad_()
        v.requires_grad_()
        for causal in (False, True):
            logits = matroidal_logits(z, A, theta, eps, tau)  # the seed's pseudocode
            keep = torch.ones(length, length, dtype=torch.bool).tril() if causal else None
            ref = masked_softmax(logits, keep) @ v
            fast = matroidal_attention(z, v, A, theta, eps, tau, causal=causal)
            err_out = max(err_out, float((fast - ref).detach().abs().max()))
            g_ref = torch.autograd.grad((ref * w).sum(), (z, v, theta))
            g_fast = torch.autograd.grad((fast * w).sum(), (z, v, theta))
            err_grad = max(err_grad, *(float((a - b).abs().max()) for a, b in zip(g_ref, g_fast)))
    return err_out, err_grad


def psd_outcome(worst: dict[str, float], n_cases: int) -> Outcome:
    """The claim ``x^T M x = sum_e l_e (a_e^T x)^2 + eps |x|^2 >= eps |x|^2`` from
    :func:`decomposition_errors` (float64: errors at rounding level, 1e-12)."""
    ok = worst["decomposition"] < 1e-12 and worst["min_eig_minus_eps"] > -1e-12
    text = (f"over {n_cases} (family, m) cases the rank-one sum equals x^T M x to "
            f"{worst['decomposition']:.1e} (relative) and lambda_min(M) - eps >= "
            f"{worst['min_eig_minus_eps']:.1e}")  # fmt: skip
    return outcome_from_check(ok, text, text + ": beyond float64 rounding")


def fast_path_outcome(err_out: float, err_grad: float, n_cases: int) -> Outcome:
    """The claim that the fast path computes the seed's pairwise pseudocode, from
    :func:`fast_path_errors` (float64: 1e-10)."""
    ok = err_out < 1e-10 and err_grad < 1e-10
    text = (f"over {n_cases} (family, m) cases, causal and not, the fast path and the pseudocode "
            f"differ by {err_out:.1e} (outputs) and {err_grad:.1e} (gradients)")  # fmt: skip
    return outcome_from_check(ok, text, text + ": beyond float64 rounding")


def null_directions(d: int, m: int, eps: float = 1e-4, *, seed: int = 0) -> pd.DataFrame:
    """Each covector family at ``m`` columns on ``d`` nodes (graph families bare and grounded)
    and the dense metric ``I + eps I``, at the initial weights (``l_e = d / |A|_F^2``):
    ``rank`` of ``A``, ``lambda_min / eps`` of ``M``, ``|<v_min, u>|`` (its eigenvector against
    ``u = 1 / sqrt(d)``) and ``u^T M u / (tr M / d)`` (float64)."""
    rows = []
    u = torch.full((d,), d**-0.5, dtype=D64)
    cases = [(f, g) for f in GRAPH_FAMILIES for g in (False, True)]
    for family, grounded in cases + [(f, False) for f in CONTRAST_FAMILIES] + [("dense", False)]:
        if family == "dense":
            A = torch.eye(d, dtype=D64)
        elif graph_family_admits(family, d, m) or family in CONTRAST_FAMILIES:
            A = covector_matrix(family, d, m, seed=seed, grounded=grounded, dtype=D64)
        else:
            continue
        theta = torch.full((A.shape[1],), d / float(A.square().sum()), dtype=D64)
        M = matroidal_metric(A, torch.log(torch.expm1(theta)), eps)  # softplus^-1(l)
        evals, evecs = torch.linalg.eigh(M)
        rows.append({"family": family, "grounded": grounded, "columns": A.shape[1],
                     "rank": int(torch.linalg.matrix_rank(A)),
                     "lambda_min / eps": float(evals[0] / eps),
                     "|<v_min, 1>|": float((evecs[:, 0] @ u).abs()),
                     "ones Rayleigh": float(u @ M @ u / (M.trace() / d))})  # fmt: skip
    return pd.DataFrame(rows)


def math_outcomes(smoke: bool = False) -> dict[str, Outcome]:
    """The outcomes of the matroidal seed's mathematical claims (chapter 5, sections 1 to 3):
    total unimodularity (exhaustive, ``d = 5``), the rank-one decomposition and the fast path
    (``d = 9``, every family and ``m`` in ``{d, 2d, 4d}``); toy sizes when ``smoke``."""
    tu_d, d, n = (4, 5, 6) if smoke else (5, 9, 12)
    gen = torch.Generator().manual_seed(0)
    cases = metric_cases(d)
    worst = decomposition_errors(cases, d, 1e-4, generator=gen)
    err_out, err_grad = fast_path_errors(cases, d, n, 1e-4, generator=gen)
    return {
        "matroidal/unimodular": unimodular_outcome(unimodularity_survey(tu_d)),
        "matroidal/psd": psd_outcome(worst, len(cases)),
        "matroidal/fast-path": fast_path_outcome(err_out, err_grad, len(cases)),
    }


def time_against_sdpa(
    length: int,
    head_dim: int,
    m_multiples: Sequence[int],
    *,
    reps: int,
    eps: float = 1e-4,
    batch: int = 4,
    heads: int = 8,
) -> pd.DataFrame:
    """Matroidal attention (``m = k d``: the ring for ``k = 1``, else ring plus chords; ``tau =
    sqrt(d) / 2``) against dot-product SDPA on ``(batch, heads, length, head_dim)`` inputs,
    interleaved by :func:`attention_atlas.bench.timing.compare`: per variant the median ratio to SDPA
    and the median time, forward (no grad) and forward+backward (to ``z``, ``v``, ``theta``)."""
    d = head_dim
    q, k, v = (torch.randn(batch, heads, length, d, requires_grad=True) for _ in range(3))
    fns: dict[str, Any] = {"dot SDPA": lambda q, k, v: F.scaled_dot_product_attention(q, k, v)}
    for mult in m_multiples:
        A = covector_matrix("ring" if mult == 1 else "ring_chords", d, mult * d)
        theta = torch.zeros(mult * d, requires_grad=True)

        def fn(q: Tensor, k: Tensor, v: Tensor, A: Tensor = A, theta: Tensor = theta) -> Tensor:
            return matroidal_attention(q, v, A, theta, eps, d**0.5 / 2)

        fn.bench_params = [theta]  # type: ignore[attr-defined]
        fns[f"matroidal m={mult}d"] = fn
    res = compare(fns, "dot SDPA", (q, k, v), reps=reps, memory=False)["results"]
    modes = {"forward (no grad)": "forward", "forward+backward": "forward_backward"}
    table = {f"{label} ratio": {n: r[m]["ratio_median"] for n, r in res.items()}
             for label, m in modes.items()}  # fmt: skip
    table |= {f"{label} ms": {n: 1e3 * r[m]["median_s"] for n, r in res.items()}
              for label, m in modes.items()}  # fmt: skip
    return pd.DataFrame(table)


def memory_growth(
    lengths: Sequence[int], *, head_dim: int = 16, m: int = 64, heads: int = 8, eps: float = 1e-4
) -> pd.DataFrame:
    """Peak memory (MiB, :func:`attention_atlas.bench.timing.peak_memory`: live tensor bytes) of one
    forward+backward of dot-product SDPA and of matroidal attention (``m`` columns, ring plus
    chords) at batch 1, ``heads`` heads, for each ``L`` of ``lengths``, measured now. The
    pseudocode's ``(L, L, m)`` tensor alone would take ``4 heads L^2 m`` bytes (float32)."""
    d = head_dim
    A = covector_matrix("ring_chords", d, m)
    theta = torch.zeros(m, requires_grad=True)
    rows = []
    for L in lengths:
        q, k, v = (torch.randn(1, heads, L, d, requires_grad=True) for _ in range(3))

        def dot(q: Tensor = q, k: Tensor = k, v: Tensor = v) -> None:
            F.scaled_dot_product_attention(q, k, v).sum().backward()

        def mat(q: Tensor = q, v: Tensor = v) -> None:
            matroidal_attention(q, v, A, theta, eps, d**0.5 / 2).sum().backward()

        rows.append({"L": L, "dot SDPA": peak_memory(dot, q.device) / 2**20,
                     "matroidal": peak_memory(mat, q.device) / 2**20,
                     "pseudocode (L, L, m) tensor": 4 * heads * L * L * m / 2**20})  # fmt: skip
    return pd.DataFrame(rows).set_index("L")


def loglog_slope(table: pd.DataFrame) -> pd.Series:
    """Per column, the log-log slope of ``table`` (indexed by ``L``) over its two largest ``L``:
    1 is linear growth, 2 quadratic."""
    top = table.sort_index().iloc[-2:]
    return np.log(top.iloc[1] / top.iloc[0]) / np.log(top.index[1] / top.index[0])


def stored_benchmark(path: str | Path) -> dict[str, Any] | None:
    """The result of ``benchmarks/bench_matroidal.py --out PATH`` as tables, or None if there is
    no such file: ``text`` (the command, threads, shape, the pseudocode's ratio), ``ratios``
    (to SDPA: forward, forward no grad, forward+backward), ``memory`` (peak MiB of one
    forward+backward by ``L``) and ``growth`` (the log-log slope of memory over the two largest
    ``L``: 1 is linear)."""
    p = Path(path)
    if not p.exists():
        return None
    bench = json.loads(p.read_text())
    ratios = pd.DataFrame({
        "forward": bench["ratio_forward"],
        "forward (no grad)": bench["ratio_forward_no_grad"],
        "forward+backward": bench["ratio_forward_backward"],
    })  # fmt: skip
    text = (
        f"From `{bench['command']}` (threads={bench['threads']}, torch {bench['torch']}): "
        f"ratios to SDPA at B=4, H=8, L={bench['shape']['L']}, d={bench['shape']['d']}; "
        f"the seed's pseudocode took {bench.get('ratio_reference_forward', float('nan')):.0f}x "
        "SDPA's forward time there."
    )
    mem = pd.DataFrame(bench["peak_bytes_forward_backward"]) / 2**20
    mem.index = mem.index.astype(int)
    mem.index.name = "L"
    return {"text": text, "ratios": ratios, "memory": mem, "growth": loglog_slope(mem)}


def _train_step(arm: str, dataset: str, dim: int, m: int) -> tuple[Any, tuple[Tensor, Tensor]]:
    """One training step (forward, loss, backward, AdamW) of chapter 5's model for ``arm`` at
    the shape of ``dataset``'s runs, as a function of ``(x, y)``, and a batch."""
    from attention_atlas.models import ModelConfig
    from attention_atlas.train import take_step

    from .run import ARMS

    att, opts = ARMS[arm]
    opts = {**opts, "m": m, "graph": "ring_chords"} if att == "matroidal" else dict(opts)
    g = torch.Generator().manual_seed(0)
    if dataset == "digits":
        kw: dict[str, Any] = {"task": "classify", "patch_dim": 4}
        batch = (torch.randn(32, 16, 4, generator=g), torch.randint(0, 10, (32,), generator=g))
    else:
        kw = {"task": "lm", "vocab_size": 50}
        batch = tuple(torch.randint(0, 50, (16, 64), generator=g) for _ in range(2))  # type: ignore[assignment]
    torch.manual_seed(0)
    model = ModelConfig(dim=dim, n_layers=2, n_heads=8, head_dim=16, attention=att,
                        attention_options=opts, **kw).build()  # fmt: skip
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=False)

    def step(x: Tensor, y: Tensor) -> Tensor:
        with torch.enable_grad():
            return take_step(model, opt, (x, y)).loss

    def flops(x: Tensor, y: Tensor) -> Tensor:
        logits = model(x).logits
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

    step.flops = flops  # type: ignore[attr-defined]
    return step, batch


def step_costs(
    dataset: str,
    arms: Sequence[str],
    *,
    dim: int = 64,
    m: int = 32,
    reps: int = 9,
    min_sample_s: float = 0.25,
) -> pd.DataFrame:
    """A whole training step of each arm against a dot-product step, side by side
    (:func:`attention_atlas.bench.timing.compare`, interleaved, one process) at chapter 5's shape for
    ``dataset``: the median time, the median and quartiles of the per-round ratio to dot, and
    the ratio of counted FLOPs (forward and backward: the arithmetic floor of the time ratio).
    Each timing sample repeats steps for at least ``min_sample_s`` (a shared machine's noise
    averages out over longer samples)."""
    from attention_atlas.bench.timing import count_flops
    from attention_atlas.train import flops as _registers_cpu_sdpa_flops  # noqa: F401

    made = {arm: _train_step(arm, dataset, dim, m) for arm in ("dot", *arms)}
    batch = made["dot"][1]
    res = compare({a: s for a, (s, _) in made.items()}, "dot", batch, backward=False,
                  reps=reps, memory=False, min_sample_s=min_sample_s)["results"]  # fmt: skip
    fl = {a: count_flops(s.flops, *batch, backward=True) for a, (s, _) in made.items()}
    return pd.DataFrame({
        "step ms": {a: 1e3 * r["forward"]["median_s"] for a, r in res.items()},
        "ratio to dot": {a: r["forward"]["ratio_median"] for a, r in res.items()},
        "ratio q25": {a: r["forward"]["ratio_q25"] for a, r in res.items()},
        "ratio q75": {a: r["forward"]["ratio_q75"] for a, r in res.items()},
        "FLOP ratio": {a: fl[a] / fl["dot"] for a in made},
    })  # fmt: skip


def metric_view(m: int, family: str, grounded: bool, *, d: int = 8, n: int = 12) -> Any:
    """The exploration of chapter 5: the metric ``M`` of a covector family with ``m`` columns on
    ``d`` nodes (initial weights, ``trace M = d``), its spectrum (the eigenvector closest to the
    all-ones direction marked) and the attention it gives on ``n`` fixed random tokens ``z``
    (the seed's form, ``softmax_j(-(z_i - z_j)^T M (z_i - z_j) / (2 sqrt d))``), recomputed."""
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=3, column_widths=[0.32, 0.28, 0.40], subplot_titles=(
        "metric M", "eigenvalues of M", "attention softmax(S)"))  # fmt: skip
    grounded = grounded and family in GRAPH_FAMILIES
    try:
        A = covector_matrix(family, d, m, seed=0, grounded=grounded, dtype=D64)
    except ValueError as e:
        return fig.update_layout(title=f"{family}, m = {m}: {e}", height=380)
    theta = torch.full((A.shape[1],), _inv_softplus(d / float(A.square().sum())), dtype=D64)
    M = matroidal_metric(A, theta, 1e-4)
    evals, evecs = torch.linalg.eigh(M)
    ones = int((evecs.T @ torch.full((d,), d**-0.5, dtype=D64)).abs().argmax())
    z = torch.randn(1, n, d, generator=torch.Generator().manual_seed(0), dtype=D64)
    P = torch.softmax(matroidal_logits(z, A, theta, 1e-4, d**0.5), -1)[0]
    fig.add_trace(go.Heatmap(z=M.numpy(), colorscale="RdBu", zmid=0, showscale=False), 1, 1)
    colors = ["#ef553b" if i == ones else "#636efa" for i in range(d)]
    fig.add_trace(go.Bar(x=list(range(1, d + 1)), y=evals.numpy(), marker_color=colors), 1, 2)
    fig.add_trace(go.Heatmap(z=P.numpy(), colorscale="Viridis", zmin=0, zmax=1), 1, 3)
    fig.update_yaxes(autorange="reversed", row=1, col=1)
    fig.update_yaxes(autorange="reversed", row=1, col=3)
    fig.update_yaxes(type="log", title="eigenvalue", row=1, col=2)
    title = (f"{family}{' + ground' if grounded else ''}, {A.shape[1]} columns on d = {d}: "
             f"rank {int(torch.linalg.matrix_rank(A))}, lambda_min = {float(evals[0]):.2g} "
             f"(red: the eigenvector nearest 1); mean self-attention {float(P.diagonal().mean()):.2f}")  # fmt: skip
    return fig.update_layout(title=title, showlegend=False, height=380)


def _inv_softplus(x: float) -> float:
    return x + math.log(-math.expm1(-x))
