"""Chapter 5's checks of the matroidal metric over every covector family, and its short timing.

* :func:`unimodularity_survey`: every family at every feasible ``m`` on ``d`` nodes, checked
  structurally (signed incidence) and exhaustively (every square minor);
* :func:`decomposition_errors`: ``x^T M x = sum_e l_e (a_e^T x)^2 + eps |x|^2``, ``R^T R = M``
  and ``lambda_min(M) >= eps`` (worst case over the families and ``m``);
* :func:`fast_path_errors`: the fast path against the seed's pseudocode, outputs and gradients;
* :func:`time_against_sdpa`: matroidal attention against SDPA through :func:`bench.compare`;
* :func:`stored_benchmark`: the tables of ``benchmarks/bench_matroidal.py``'s JSON.

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
import torch
import torch.nn.functional as F
from torch import Tensor

from ..attention.dot import masked_softmax
from ..attention.graphs import (
    CONTRAST_FAMILIES,
    GRAPH_FAMILIES,
    covector_matrix,
    graph_family_admits,
    is_signed_incidence,
    is_totally_unimodular,
)
from ..attention.matroidal import (
    matroidal_attention,
    matroidal_coefficients,
    matroidal_factor,
    matroidal_logits,
    matroidal_metric,
)
from ..bench import compare

__all__ = [
    "decomposition_errors",
    "fast_path_errors",
    "metric_cases",
    "stored_benchmark",
    "time_against_sdpa",
    "unimodularity_summary",
    "unimodularity_survey",
]

D64 = torch.float64


def unimodularity_survey(d: int, *, seed: int = 1) -> pd.DataFrame:
    """Every family of :data:`GRAPH_FAMILIES` and :data:`CONTRAST_FAMILIES` at every ``m`` from
    ``d`` to ``d (d - 1) / 2`` it admits: columns ``family``, ``m``, ``signed incidence``,
    ``totally unimodular (exhaustive)``."""
    rows = []
    for family in GRAPH_FAMILIES + CONTRAST_FAMILIES:
        for m in range(d, d * (d - 1) // 2 + 1):
            try:
                A = covector_matrix(family, d, m, seed=seed)
            except ValueError:
                continue
            rows.append({
                "family": family, "m": m, "signed incidence": is_signed_incidence(A),
                "totally unimodular (exhaustive)": is_totally_unimodular(A),
            })  # fmt: skip
    return pd.DataFrame(rows)


def unimodularity_summary(survey: pd.DataFrame) -> pd.DataFrame:
    """Per family of :func:`unimodularity_survey`: the ``m`` range (and count), how many pass
    the exhaustive check and how many are certified by the signed-incidence structure."""
    return (
        survey.groupby("family", sort=False)
        .agg(
            m_values=("m", lambda s: f"{s.min()}..{s.max()} ({len(s)})"),
            tu_pass=("totally unimodular (exhaustive)", "sum"),
            certified=("signed incidence", "sum"),
        )
        .reset_index()
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
    interleaved by :func:`attention_atlas.bench.compare`: per variant the median ratio to SDPA
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
    top = mem.sort_index().iloc[-2:]
    growth = np.log(top.iloc[1] / top.iloc[0]) / np.log(top.index[1] / top.index[0])
    return {"text": text, "ratios": ratios, "memory": mem, "growth": growth}
