"""Chapter 2's experiments: the perturbation bound, the critical regime and rank collapse.

* :func:`perturbation_checks`: Proposition 3.5 (eq. (12), ``||Delta S||_F <= L Ubar^2 M / tau``)
  and every step of eq. (13) (softmax 1-Lipschitz in Frobenius norm, operator norm below
  Frobenius, Weyl) on random instances.
* :func:`sigma2_sweep` and :func:`onsets`: ``sigma_2`` of the Riemannian attention matrix
  against the Euclidean one as ``Ubar^2`` crosses multiples ``c`` of the paper's critical scale
  ``tau / L`` (Conjecture 3.6, prediction P1); :func:`onset_scaling` asks whether the onsets
  line up in ``c`` or in ``Ubar^2 / tau``.
* :func:`pure_attention_stack`: random pure self-attention stacks ``H^{l+1} = A^l H^l W_V^l``
  (eq. (1), Dong, Cordonnier and Loukas 2021) with dot, Euclidean, homogeneous-metric or
  heterogeneous-metric scores; the grid of chapter 2 (:data:`PRESETS`, :func:`chapter_grid`,
  :func:`run_cell`) is the sweep runner's ``"rank-collapse"``:
  ``python -m attention_atlas sweep rank-collapse --preset long``.

Random draws come from the ``generator`` each function is given, in a fixed order, in float64,
so a chapter that calls them in order with one seeded generator reproduces its numbers exactly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from ..attention.riemannian import geodesic_scores
from ..linalg import relative_residual, singular_values

__all__ = [
    "COLLAPSED",
    "PRESETS",
    "attention_layer",
    "chapter_grid",
    "collapse_layer",
    "instance",
    "log_residual_growth",
    "median_collapse_layers",
    "metric_factors",
    "onset",
    "onset_scaling",
    "onsets",
    "perturbation_bound",
    "perturbation_chain",
    "perturbation_checks",
    "pure_attention_stack",
    "run_cell",
    "sigma2_sweep",
    "stack_runs",
]

F64 = torch.float64
StackScore = Literal["dot", "euclidean", "homogeneous", "heterogeneous"]
STACK_SCORES: tuple[StackScore, ...] = ("dot", "euclidean", "homogeneous", "heterogeneous")
#: relative residual counted as collapsed (float64 round-off is ~1e-16)
COLLAPSED = 1e-12


# ---- Proposition 3.5 and eq. (13) ------------------------------------------------------------


def perturbation_bound(L: int, ubar2: float, M: float, tau: float) -> float:
    """Proposition 3.5: ``||Delta S||_F <= L Ubar^2 M / tau`` with ``Ubar^2 = max_t ||U_t||_F^2``
    and ``M = max_ij |q_i - k_j|^2`` (eq. (12)); by eq. (13) it also bounds
    ``|sigma_k(A_Riem) - sigma_k(A_Euc)|``."""
    return L * ubar2 * M / tau


def instance(
    L: int,
    d: int,
    r: int,
    ubar2: float,
    tau: float,
    *,
    generator: torch.Generator,
    heterogeneous: bool = True,
    unit: bool = True,
) -> tuple[Tensor, Tensor, Tensor]:
    """Gaussian ``q, k (L, d)`` (unit rows if ``unit``) and ``U (L, d, r)`` with ``max_t
    ||U_t||_F^2 = ubar2``; with ``heterogeneous`` the ``||U_t||_F^2`` vary over a factor 3.
    (``tau`` is not used by the draw; it is here so that an instance is named by its setting.)"""
    q = torch.randn(L, d, generator=generator, dtype=F64)
    k = torch.randn(L, d, generator=generator, dtype=F64)
    if unit:
        q, k = q / q.norm(dim=-1, keepdim=True), k / k.norm(dim=-1, keepdim=True)
    U = torch.randn(L, d, r, generator=generator, dtype=F64)
    U = U / U.flatten(-2).norm(dim=-1)[:, None, None]  # ||U_t||_F = 1
    kappa = (
        0.5 + torch.rand(L, generator=generator, dtype=F64) if heterogeneous else torch.ones(L, dtype=F64)
    )  # fmt: skip
    U = U * (kappa / kappa.max()).sqrt()[:, None, None] * math.sqrt(ubar2)
    return q, k, U


def perturbation_chain(q: Tensor, k: Tensor, U: Tensor, tau: float) -> dict[str, float]:
    """The quantities of eqs. (12) and (13) for one instance ``q, k (L, d)``, ``U (L, d, r)``:
    ``dS = ||Delta S||_F``, ``bound`` (:func:`perturbation_bound`), ``dA_F`` and ``dA_op``
    (``||A_R - A_E||`` in Frobenius and operator norm) and ``sv_gap = max_k |sigma_k(A_R) -
    sigma_k(A_E)|``."""
    s_riem = geodesic_scores(q, k, U, tau)
    s_euc = geodesic_scores(q, k, torch.zeros_like(U), tau)
    M = float(((q.unsqueeze(1) - k.unsqueeze(0)) ** 2).sum(-1).max())
    ubar2 = float((U**2).sum((-1, -2)).max())
    a_r, a_e = torch.softmax(s_riem, -1), torch.softmax(s_euc, -1)
    return {
        "dS": float(torch.linalg.matrix_norm(s_riem - s_euc)),
        "bound": perturbation_bound(q.shape[-2], ubar2, M, tau),
        "dA_F": float(torch.linalg.matrix_norm(a_r - a_e)),
        "dA_op": float(torch.linalg.matrix_norm(a_r - a_e, ord=2)),
        "sv_gap": float((singular_values(a_r) - singular_values(a_e)).abs().max()),
    }


def perturbation_checks(n_instances: int, *, generator: torch.Generator) -> pd.DataFrame:
    """Random instances: ``L in [4, 96]``, ``d in [2, 16]``, ``r in [1, 4]``, ``tau`` log-uniform
    in [0.1, 10], ``Ubar^2`` in [1e-4, 1e2], query and key scales uniform in [0, 1].

    Returns:
        one row per instance: ``L, d, r, tau``, ``strength`` (= ``bound``, the right-hand side of
        eq. (12)), ``dS`` (``||Delta S||_F``), ``dA_F``, ``dA_op`` (``||A_R - A_E||`` in Frobenius
        and operator norm), ``sv_gap`` (``max_k |sigma_k(A_R) - sigma_k(A_E)|``) and the ratios
        ``dS_over_bound``, ``dA_over_dS``, ``sv_gap_over_bound`` (1 = tight).
    """
    rows = []
    for _ in range(n_instances):
        L = int(torch.randint(4, 97, (1,), generator=generator))
        d = int(torch.randint(2, 17, (1,), generator=generator))
        r = int(torch.randint(1, 5, (1,), generator=generator))
        tau = float(10 ** (torch.rand(1, generator=generator, dtype=F64) * 2 - 1))
        ubar2 = float(10 ** (torch.rand(1, generator=generator, dtype=F64) * 6 - 4))
        q, k, U = instance(L, d, r, ubar2, tau, generator=generator, unit=False)
        q = q * float(torch.rand(1, generator=generator, dtype=F64))
        k = k * float(torch.rand(1, generator=generator, dtype=F64))
        c = perturbation_chain(q, k, U, tau)
        rows.append({"L": L, "d": d, "r": r, "tau": tau, "strength": c["bound"], **c})
    df = pd.DataFrame(rows)
    df["dS_over_bound"] = df["dS"] / df["bound"]
    df["dA_over_dS"] = df["dA_F"] / df["dS"]
    df["sv_gap_over_bound"] = df["sv_gap"] / df["bound"]
    return df


# ---- sigma_2 across the critical scale (Conjecture 3.6, P1) ----------------------------------


def sigma2_sweep(
    lengths: Sequence[int],
    strengths: Sequence[float],
    *,
    rank: int,
    generator: torch.Generator,
    d: int = 16,
) -> pd.DataFrame:
    """``sigma_2`` of ``softmax(S_Riem)`` and ``softmax(S_Euc)`` on the same unit-norm queries
    and keys, ``tau = sqrt(2 d)``, heterogeneous factors scaled to ``Ubar^2 = c tau / L`` for
    each ``c`` in ``strengths``.

    Returns:
        columns ``L, c, Ubar2, Ubar2_over_tau, sigma2_riem, sigma2_euc``, ``bound`` (eq. (12)
        with ``M = 4``) and ``sigma2_ratio``.
    """
    tau = math.sqrt(2 * d)
    rows = []
    for L in lengths:
        q, k, U1 = instance(L, d, rank, 1.0, tau, generator=generator)
        s2_e = float(singular_values(torch.softmax(geodesic_scores(q, k, torch.zeros_like(U1), tau), -1))[1])  # fmt: skip
        for c in strengths:
            ubar2 = c * tau / L
            a_r = torch.softmax(geodesic_scores(q, k, U1 * math.sqrt(ubar2), tau), -1)
            rows.append({
                "L": L, "c": c, "Ubar2": ubar2, "Ubar2_over_tau": ubar2 / tau,
                "sigma2_riem": float(singular_values(a_r)[1]), "sigma2_euc": s2_e,
                "bound": perturbation_bound(L, ubar2, 4, tau),
            })  # fmt: skip
    sweep = pd.DataFrame(rows)
    sweep["sigma2_ratio"] = sweep["sigma2_riem"] / sweep["sigma2_euc"]
    return sweep


def onset(part: pd.DataFrame, factor: float = 1.5) -> float | None:
    """Strength ``c`` at which ``sigma_2`` first moves by ``factor`` from the Euclidean value,
    interpolated log-linearly between grid points (None if it never does)."""
    c = part["c"].to_numpy()
    dev = np.abs(np.log(part["sigma2_ratio"].to_numpy()))
    target = math.log(factor)
    hit = np.nonzero(dev >= target)[0]
    if len(hit) == 0:
        return None
    i = int(hit[0])
    if i == 0:
        return float(c[0])
    w = (target - dev[i - 1]) / (dev[i] - dev[i - 1])
    return float(math.exp(math.log(c[i - 1]) + w * (math.log(c[i]) - math.log(c[i - 1]))))


def onsets(sweep: pd.DataFrame, factor: float = 1.5) -> pd.DataFrame:
    """Per length: ``c_onset`` (:func:`onset`) and ``Ubar2_over_tau_onset = c_onset / L``."""
    rows = []
    for L in sweep["L"].unique():
        c_on = onset(sweep[sweep["L"] == L], factor)
        rows.append({"L": int(L), "c_onset": c_on, "Ubar2_over_tau_onset": None if c_on is None else c_on / L})  # fmt: skip
    return pd.DataFrame(rows)


def onset_scaling(sweep: pd.DataFrame, found: pd.DataFrame) -> dict[str, float]:
    """How the onsets scale with L.

    Args:
        sweep: :func:`sigma2_sweep`.
        found: the rows of :func:`onsets` with an onset.

    Returns:
        ``moved_near`` (largest ``|sigma2_ratio - 1|`` at ``c <= 10``), ``c_spread`` and
        ``u_spread`` (max / min onset across lengths in ``c`` and in ``Ubar^2 / tau``; NaN with
        fewer than two onsets).
    """
    near = sweep[sweep["c"] <= 10]
    moved_near = float((near["sigma2_ratio"] - 1).abs().max()) if len(near) else float("nan")

    def spread(col: str) -> float:
        return float(found[col].max() / found[col].min()) if len(found) > 1 else float("nan")

    return {
        "moved_near": moved_near,
        "c_spread": spread("c_onset"),
        "u_spread": spread("Ubar2_over_tau_onset"),
    }


# ---- pure attention stacks (Dong, Cordonnier and Loukas 2021) --------------------------------


def _gaussian(shape: tuple[int, ...], like: Tensor, generator: torch.Generator | None) -> Tensor:
    """Standard normal draws on the CPU generator, moved to ``like``'s device and dtype."""
    return torch.randn(*shape, generator=generator, dtype=like.dtype).to(like.device)


def metric_factors(
    h: Tensor,
    score: StackScore,
    *,
    rank: int,
    strength: float,
    generator: torch.Generator | None = None,
) -> Tensor:
    """One layer's metric factors ``U (..., L, D, r)`` with ``E ||U_t||_F^2 = strength``.

    ``"euclidean"``: zero; ``"homogeneous"``: one Gaussian ``U`` shared by every token;
    ``"heterogeneous"``: ``U_t = W h_t / |h_t|`` (reshaped to ``(D, r)``) for a Gaussian
    ``W (D r, D)``, a random linear function of the normalised token as a MetricNet computes it
    (eq. (19)). Entries are ``N(0, strength / (D r))`` in both random cases.
    """
    dim = h.shape[-1]
    scale = math.sqrt(strength / (dim * rank))
    if score == "euclidean":
        return torch.zeros(*h.shape, rank, dtype=h.dtype, device=h.device)
    if score == "homogeneous":
        return (_gaussian((dim, rank), h, generator) * scale).expand(*h.shape, rank)
    if score == "heterogeneous":
        w = _gaussian((dim * rank, dim), h, generator)
        hn = h / h.norm(dim=-1, keepdim=True).clamp_min(1e-30)
        return (hn @ w.T).reshape(*h.shape, rank) * scale
    raise ValueError(f"score must be 'euclidean', 'homogeneous' or 'heterogeneous', got {score!r}")


def attention_layer(
    h: Tensor,
    *,
    score: StackScore,
    rank: int,
    strength: float,
    tau: float,
    generator: torch.Generator | None = None,
) -> Tensor:
    """One layer ``A H W_V`` with fresh Gaussian ``W_Q, W_K, W_V (D, D) / sqrt(D)`` (drawn in
    that order, then the metric factors), ``A = softmax(q k^T / sqrt(D))`` for ``"dot"`` and
    ``softmax`` of the geodesic score (eq. (6)) at temperature ``tau`` otherwise."""
    dim = h.shape[-1]
    wq, wk, wv = (_gaussian((dim, dim), h, generator) / math.sqrt(dim) for _ in range(3))
    q, k, v = h @ wq, h @ wk, h @ wv
    if score == "dot":
        logits = q @ k.transpose(-1, -2) / math.sqrt(dim)
    else:
        U = metric_factors(h, score, rank=rank, strength=strength, generator=generator)
        logits = geodesic_scores(q, k, U, tau)
    return torch.softmax(logits, dim=-1) @ v


def pure_attention_stack(
    h0: Tensor,
    depth: int,
    *,
    score: StackScore = "dot",
    rank: int = 4,
    strength: float = 1.0,
    tau: float | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Hidden states of a random pure self-attention stack ``H^{l+1} = A^l H^l W_V^l`` (eq. (1)):
    no residual connections, no feed-forward layers, one head, fresh Gaussian weights per layer
    (:func:`attention_layer`).

    Args:
        h0: ``(..., L, D)`` input tokens.
        depth: number of layers.
        score: ``"dot"`` (``q.k / sqrt(D)``, Dong et al.'s setting), ``"euclidean"``
            (``-|q-k|^2 / tau``), ``"homogeneous"`` (one metric factor ``U`` per layer, shared
            by every token: a global Mahalanobis distance) or ``"heterogeneous"`` (``U_t`` a
            random linear function of the normalised token, :func:`metric_factors`).
        rank: metric rank r.
        strength: expected ``||U_t||_F^2`` (the paper's kappa) of the metric factors.
        tau: temperature of the distance scores (default ``sqrt(2 D)``).
        generator: for the random weights (drawn on the CPU).

    Returns:
        ``(depth + 1, ..., L, D)``: the input and every layer's output.
    """
    if depth < 0:
        raise ValueError(f"depth must be >= 0, got {depth}")
    if score not in STACK_SCORES:
        raise ValueError(
            f"score must be 'dot', 'euclidean', 'homogeneous' or 'heterogeneous', got {score!r}"
        )
    t = tau if tau is not None else math.sqrt(2 * h0.shape[-1])
    states = [h0]
    for _ in range(depth):
        states.append(
            attention_layer(
                states[-1], score=score, rank=rank, strength=strength, tau=t, generator=generator
            )
        )
    return torch.stack(states)


def collapse_layer(residuals: Sequence[float], floor: float = COLLAPSED) -> int:
    """First layer whose relative residual is below ``floor`` (``len(residuals)`` if none:
    one past the last layer)."""
    below = [i for i, x in enumerate(residuals) if x < floor]
    return below[0] if below else len(residuals)


def log_residual_growth(median_residual: Sequence[float], floor: float = COLLAPSED) -> list[float]:
    """``log res_{l+1} / log res_l`` for the layers where the residual is below 1/2 and the next
    one above ``floor``: about 2 per layer for a doubly exponential decay, 1 for an exponential."""
    res = np.asarray(median_residual, dtype=float)
    logs = np.log(res)
    window = [i for i in range(len(logs) - 1) if res[i] < 0.5 and res[i + 1] > floor]
    return [float(logs[i + 1] / logs[i]) for i in window]


# ---- the grid of chapter 2 (sweep runner: "rank-collapse") -----------------------------------

PRESETS: dict[str, dict[str, Any]] = {
    "smoke": {"strengths": [1000.0], "depth": 6},
    "book": {},
    "long": {"strengths": [1.0, 10.0, 100.0, 1000.0, 1e4], "length": 128, "dim": 64, "depth": 24},
}


def chapter_grid(
    *,
    strengths: Sequence[float] = (1.0, 10.0, 100.0, 1000.0),
    length: int = 32,
    dim: int = 16,
    depth: int = 12,
    rank: int = 4,
) -> dict[str, dict[str, Any]]:
    """Stacks of chapter 2: ``dot``, ``euclidean``, then ``homogeneous kappa=<s>`` and
    ``heterogeneous kappa=<s>`` for each metric strength ``s``."""
    shared = {"length": length, "dim": dim, "depth": depth, "rank": rank}
    grid = {
        "dot": {"score": "dot", "strength": 0.0, **shared},
        "euclidean": {"score": "euclidean", "strength": 0.0, **shared},
    }
    for s in strengths:
        for kind in ("homogeneous", "heterogeneous"):
            grid[f"{kind} kappa={s:g}"] = {"score": kind, "strength": float(s), **shared}
    return grid


def run_cell(params: dict[str, Any], seed: int) -> dict[str, Any]:
    """One stack of :func:`chapter_grid` at ``seed`` (Gaussian input and weights from
    ``torch.Generator().manual_seed(1000 + seed)``; the same weights for every score kind).

    Returns:
        ``collapse_layer`` (:func:`collapse_layer`), ``final_residual`` and, in the cell's JSON
        only, ``residual``: the relative residual (:func:`attention_atlas.linalg.relative_residual`)
        of every layer, input included.
    """
    g = torch.Generator().manual_seed(1000 + seed)
    h0 = torch.randn(params["length"], params["dim"], generator=g, dtype=F64)
    H = pure_attention_stack(
        h0, params["depth"], score=params["score"], rank=params["rank"],
        strength=params["strength"], generator=g,
    )  # fmt: skip
    res = relative_residual(H).tolist()
    if not all(math.isfinite(x) for x in res):
        raise FloatingPointError(f"non-finite residual in stack {params}: {res}")
    return {"collapse_layer": collapse_layer(res), "final_residual": res[-1], "residual": res}


def stack_runs(
    grid: dict[str, dict[str, Any]], seeds: Sequence[int]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Run every (configuration, seed) of ``grid`` in memory (:func:`run_cell`).

    Returns:
        ``(stacks, depths)``: ``stacks`` one row per layer (``label, kind, strength, seed,
        layer, residual``), ``depths`` one row per stack (``label, kind, strength, seed,
        collapse_layer``), both in grid order.
    """
    layers, stacks = [], []
    for label, params in grid.items():
        for seed in seeds:
            cell = run_cell(params, seed)
            key = {"label": label, "kind": params["score"], "strength": params["strength"], "seed": seed}  # fmt: skip
            stacks.append({**key, "collapse_layer": cell["collapse_layer"]})
            layers += [{**key, "layer": i, "residual": x} for i, x in enumerate(cell["residual"])]
    return pd.DataFrame(layers), pd.DataFrame(stacks)


def median_collapse_layers(depths: pd.DataFrame, strengths: Sequence[float]) -> pd.DataFrame:
    """Median collapse layer of homogeneous and heterogeneous stacks per metric strength.

    Returns:
        columns ``strength, homogeneous, heterogeneous, difference`` (heterogeneous minus
        homogeneous).
    """

    def med(kind: str, s: float) -> float:
        sel = depths[(depths["kind"] == kind) & (depths["strength"] == s)]["collapse_layer"]
        return float(sel.median())

    rows = [
        {"strength": s, "homogeneous": med("homogeneous", s), "heterogeneous": med("heterogeneous", s)}
        for s in strengths
    ]  # fmt: skip
    df = pd.DataFrame(rows)
    df["difference"] = df["heterogeneous"] - df["homogeneous"]
    return df
