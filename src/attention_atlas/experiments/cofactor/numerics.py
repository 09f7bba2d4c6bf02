"""Chapter 6's numerical sections: the identities, near-reducibility, the three methods' error
and time, and the LU-against-minors benchmark.

Each function returns a table the chapter shows and asserts on; the maths is in
:mod:`attention_atlas.cofactor`, the independent references and matrix families in
:mod:`attention_atlas.cofactor.references`, the timing in :func:`attention_atlas.bench.timing.compare`
and :func:`attention_atlas.bench.timing.cpu_time_ratio`. ``benchmarks/bench_cofactor.py`` runs
:func:`lu_vs_minors` from the command line.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd
import torch
from torch import Tensor

from attention_atlas.bench.timing import compare, cpu_time_ratio
from attention_atlas.cofactor import (
    FAMILIES,
    coupled_blocks,
    exact_cofactors,
    left_perron_vector,
    nonzero_eigen_product,
    power_stationary,
    principal_cofactors,
    softmax_family,
    spectral_gap,
    stability_margin,
    stationary_distribution,
    toward_reducible,
)

__all__ = [
    "coupling_table",
    "identity_table",
    "lu_vs_minors",
    "method_sweep",
    "perturbation_data",
    "speedup_table",
]

F64 = torch.float64


def identity_table(n: int, count: int) -> pd.DataFrame:
    """The three identities on ``count`` matrices ``(n, n)`` of each of the :data:`FAMILIES`, by
    the reference (``"minors"``) and the LU method, each row the worst matrix:

    * ``c^T L = 0``: ``max |c^T L| / max |c|``;
    * ``sum c = prod_{k>=2} lambda_k(L)`` (eigenvalues from ``torch.linalg.eigvals``);
    * ``c / sum c = pi`` (the left eigenvector of ``A`` for 1, numpy's ``eig``), in l1.
    """
    rows = []
    for kind in FAMILIES:
        A = softmax_family(kind, n, count)
        L = torch.eye(n, dtype=F64) - A
        m_eig = nonzero_eigen_product(A)
        pi_eig = left_perron_vector(A)
        for method in ["minors", "lu"]:
            c = principal_cofactors(A, method)
            null = (c.unsqueeze(-2) @ L).squeeze(-2)  # c^T L
            rows.append(
                {
                    "family": kind,
                    "method": method,
                    "max |c^T L| / max|c|": float(null.abs().max() / c.abs().max()),
                    "max rel. err of sum c vs prod lambda": float(
                        ((c.sum(-1) - m_eig).abs() / m_eig.abs()).max()
                    ),
                    "max ||c/sum c - pi||_1": float(
                        (c / c.sum(-1, keepdim=True) - pi_eig).abs().sum(-1).max()
                    ),
                    "min c_i": float(c.min()),
                }
            )
    return pd.DataFrame(rows)


def _rel_err(c: Tensor, ref: Tensor) -> float:
    """Worst relative error ``max_i |c_i - ref_i| / max_i |ref_i|`` over the matrices."""
    return float(((c - ref).abs().amax(-1) / ref.abs().amax(-1)).max())


def coupling_table(
    n: int, couplings: Sequence[float], count: int, seed: int = 3, n_exact: int = 2
) -> pd.DataFrame:
    """Two blocks of ``n / 2`` tokens coupled by ``eps`` (:func:`coupled_blocks`), for each
    ``eps``: the mean margin, ``n min pi`` and spectral gap over ``count`` matrices, and on the
    first ``n_exact`` the error of the LU (float64 and float32) and of the minors against
    50-digit cofactors (:func:`exact_cofactors`), and the LU's residual ``|c^T L| / |c|``."""
    rows = []
    for eps in couplings:
        A = coupled_blocks(n // 2, n - n // 2, eps, count=count, seed=seed)
        exact = torch.stack([exact_cofactors(a) for a in A[:n_exact]])
        c_ref = principal_cofactors(A[:n_exact], "minors")
        c_lu = principal_cofactors(A[:n_exact], "lu")
        c_32 = principal_cofactors(A[:n_exact].float(), "lu").double()
        pi = stationary_distribution(A, "lu")
        L = torch.eye(n, dtype=F64) - A[:n_exact]
        null = (c_lu.unsqueeze(-2) @ L).abs().amax((-1, -2))  # |c^T L| per matrix
        rows.append(
            {
                "coupling": eps,
                "margin": float(stability_margin(A).mean()),
                "n min pi": float((n * pi.amin(-1)).mean()),
                "spectral gap": float(spectral_gap(A).mean()),
                "lu error (float64)": _rel_err(c_lu, exact),
                "minors error (float64)": _rel_err(c_ref, exact),
                "lu error (float32)": _rel_err(c_32, exact),
                "|c^T L| / |c| (lu)": float((null / c_lu.abs().amax(-1)).max()),
            }
        )
    return pd.DataFrame(rows)


def _cofactors_of(A: Tensor, method: str, power_tol: float | None = None) -> Tensor:
    """``principal_cofactors`` without the input check (the timed call)."""
    return principal_cofactors(A, method, check=False, power_tol=power_tol)


def method_sweep(sizes: Sequence[int], batch: int, reps: int, tol: float = 1e-10) -> pd.DataFrame:
    """Error against the float64 minors and time of ``"minors"``, ``"lu"`` and ``"power"`` (to
    ``tol`` in l1) on ``batch`` softmax matrices (:func:`softmax_family` ``"random"``, seed ``n``)
    for each ``n``, timed side by side by :func:`~attention_atlas.bench.timing.compare`. The power
    method's a-posteriori bound is given beside its measured error; ``power err - bound (max)``
    is the largest excess of the error over the bound (at most round-off if the bound holds)."""
    rows = []
    for n in sizes:
        A = softmax_family("random", n, batch, seed=n)
        ref = principal_cofactors(A, "minors")
        pi_ref = ref / ref.sum(-1, keepdim=True)
        c_lu = principal_cofactors(A, "lu")
        pi_pw, bound, iters = power_stationary(A, tol=tol)
        err_pw = (pi_pw - pi_ref).abs().sum(-1)
        fns: dict[str, Callable[..., Any]] = {
            m: functools.partial(_cofactors_of, method=m, power_tol=tol)
            for m in ["minors", "lu", "power"]
        }
        res = compare(fns, "lu", (A,), backward=False, warmup=1, reps=reps, memory=False)
        times = {
            f"time {k} (ms)": 1e3 * v["forward"]["median_s"] for k, v in res["results"].items()
        }
        c_pw = principal_cofactors(A, "power", power_tol=tol)
        rows.append(
            {
                "n": n,
                "lu rel. err": _rel_err(c_lu, ref),
                "power rel. err": _rel_err(c_pw, ref),
                "power ||pi - pi_ref||_1": float(err_pw.max()),
                "power bound": float(bound.max()),
                "power iterations": iters,
                **times,
                "power err - bound (max)": float((err_pw - bound).max()),
            }
        )
    return pd.DataFrame(rows)


def lu_vs_minors(
    sizes: Sequence[int], batch: int, reps: int, seed: int = 0
) -> dict[int, dict[str, Any]]:
    """``"lu"`` against ``"minors"`` on ``batch`` float64 softmax matrices of each size ``n``:
    :func:`~attention_atlas.bench.timing.compare` (forward and forward+backward with respect to ``A``,
    peak memory), with the forward CPU-time ratio (:func:`~attention_atlas.bench.timing.cpu_time_ratio`)
    in ``meta["cpu_time_speedup_forward"]``. Returns ``{n: compare result}``."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for n in sizes:
        z = torch.randn(batch, n, n, generator=g, dtype=F64)
        A = torch.softmax(z, -1).requires_grad_(True)
        minors, lu = (functools.partial(_cofactors_of, method=m) for m in ("minors", "lu"))
        res = compare({"minors": minors, "lu": lu}, "lu", (A,), warmup=1, reps=reps,
                      meta={"n": n, "batch": batch, "dtype": "float64"})  # fmt: skip
        res["meta"]["cpu_time_speedup_forward"] = cpu_time_ratio(minors, lu, (A,), reps)
        out[n] = res
    return out


def speedup_table(results: dict[int, dict[str, Any]]) -> pd.DataFrame:
    """One row per size of :func:`lu_vs_minors`: times (ms), speed-ups of ``"lu"`` over
    ``"minors"`` (median of per-round ratios, forward quartiles, CPU time) and peak memory (MB)."""
    rows = []
    for n, res in results.items():
        r, mi, lu = res["results"], res["results"]["minors"], res["results"]["lu"]
        fwd = mi["forward"]
        rows.append(
            {
                "n": n,
                "batch": res["meta"]["batch"],
                "minors fwd (ms)": 1e3 * fwd["median_s"],
                "lu fwd (ms)": 1e3 * lu["forward"]["median_s"],
                "minors fwd+bwd (ms)": 1e3 * mi["forward_backward"]["median_s"],
                "lu fwd+bwd (ms)": 1e3 * lu["forward_backward"]["median_s"],
                "speed-up fwd": fwd["ratio_median"],
                "speed-up fwd (q25-q75)": f"{fwd['ratio_q25']:.0f}-{fwd['ratio_q75']:.0f}",
                "speed-up fwd+bwd": mi["forward_backward"]["ratio_median"],
                "speed-up fwd (CPU time)": res["meta"]["cpu_time_speedup_forward"],
                "peak MB minors": r["minors"]["peak_memory_bytes"] / 2**20,
                "peak MB lu": r["lu"]["peak_memory_bytes"] / 2**20,
            }
        )
    return pd.DataFrame(rows)


def perturbation_data(target: str, eps: float, n: int, eps_grid: Sequence[float]) -> dict[str, Any]:
    """The exploration of chapter 6 at one point: for ``A(eps)`` of
    :func:`~attention_atlas.cofactor.references.toward_reducible`, the normalised cofactors
    ``pi`` (zeros when every cofactor vanishes), the eigenvalues of ``A`` (real and imaginary
    parts), its margin and spectral gap, and the margins and gaps over ``eps_grid``."""
    A = toward_reducible(target, eps, n)
    c = principal_cofactors(A)
    total = float(c.sum())
    ev = torch.linalg.eigvals(A)
    curve = [toward_reducible(target, e, n) for e in eps_grid]
    return {
        "pi": (c / total if total > 0 else torch.zeros_like(c)).tolist(),
        "eig_real": ev.real.tolist(),
        "eig_imag": ev.imag.tolist(),
        "margin": float(stability_margin(A)),
        "gap": float(spectral_gap(A)),
        "margins": [float(stability_margin(a)) for a in curve],
        "gaps": [float(spectral_gap(a)) for a in curve],
    }
