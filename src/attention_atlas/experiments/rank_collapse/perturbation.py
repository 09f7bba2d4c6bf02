"""Chapter 2's perturbation experiments: Proposition 3.5, eq. (13), and where the spectrum of the
attention matrix moves (the critical scale of Conjecture 3.6).

* :func:`perturbation_checks`: eq. (12) (``||Delta S||_F <= L Ubar^2 M / tau``) and every step of
  eq. (13) on random instances (:func:`perturbation_chain`).
* :func:`sigma2_study`: ``sigma_2`` of ``A_R = softmax(S_Riem)`` and of ``A_E = softmax(S_Euc)``
  on the same queries and keys, several seeds per length, against the entry scale
  ``s = Ubar^2 M / tau`` (:func:`~attention_atlas.attention.riemannian.diagnostics.perturbation_entry_scale`),
  the largest change the metric can make to one score.
* :func:`onsets`, :func:`onset_slopes`, :func:`transition_verdict`: the scale at which
  ``|sigma_2(A_R) - sigma_2(A_E)|`` first reaches :data:`ONSET_DELTA`, and how it scales with L.
  Conjecture 3.6 puts the transition at ``Ubar^2 = Theta(tau / L)``, that is at ``s`` proportional
  to ``1 / L`` (slope -1 of ``log s_onset`` against ``log L``); a transition set by the size of one
  score entry has slope 0. The verdict is :func:`attention_atlas.stats.verdict` on the per-seed
  slopes with the smallest effect :data:`SESOI` ``["onset_slope"]``.
* :func:`eq13_checks`: eq. (13) at every point of the study, with the tightness of the bound and
  the linear response of ``sigma_2`` in the sub-critical regime.
* :func:`spectrum_pair`: one instance at a given metric strength and ``M``, for the chapter's
  exploration.

Every instance is drawn from its own generator (seeded by its length and seed), so a study gives
the same numbers whatever else ran before it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from attention_atlas import stats
from attention_atlas.attention.riemannian import geodesic_scores
from attention_atlas.attention.riemannian.diagnostics import perturbation_entry_scale
from attention_atlas.linalg import singular_values

__all__ = [
    "ONSET_DELTA",
    "SESOI",
    "entry_grid",
    "eq12_13_hold",
    "eq13_checks",
    "instance",
    "onset",
    "onset_slopes",
    "onsets",
    "perturbation_bound",
    "perturbation_chain",
    "perturbation_checks",
    "sigma2_study",
    "spectrum_pair",
    "study_samples",
    "transition_verdict",
    "unit_instance",
]

F64 = torch.float64

#: ``|sigma_2(A_R) - sigma_2(A_E)|`` that counts as "the spectrum moved": a twentieth of
#: ``sigma_1 >= 1``, the scale of a row-stochastic matrix's spectrum (eq. (13)'s own yardstick)
ONSET_DELTA = 0.05
#: smallest effects of interest, fixed before the runs
SESOI = {
    # slope of log s_onset against log L: halfway between no L-dependence (0) and Theta(tau/L) (-1)
    "onset_slope": 0.5,
}
#: the row softmax is 1/2-Lipschitz in the l2 norm (its Jacobian diag(p) - p p^T has norm <= 1/2)
SOFTMAX_LIPSCHITZ = 0.5
#: regime in which eq. (13) pins the spectrum: its bound L s at most this
SUBCRITICAL_BOUND = 0.1
_SLACK = 1 + 1e-12  # float64 rounding in the inequality checks


def _positive_ints(values: Sequence[int], name: str) -> list[int]:
    vals = list(values)
    if not vals or any(not isinstance(v, int | np.integer) or v < 1 for v in vals):
        raise ValueError(f"{name} must be a non-empty list of positive integers, got {vals!r}")
    return [int(v) for v in vals]


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
    if not isinstance(n_instances, int) or n_instances < 1:
        raise ValueError(f"n_instances must be a positive integer, got {n_instances!r}")
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


def eq12_13_hold(checks: pd.DataFrame) -> bool:
    """Every inequality of eqs. (12) and (13) on every row of :func:`perturbation_checks`, with
    the softmax step at its sharp constant 1/2: ``sv_gap <= dA_op <= dA_F <= dS / 2`` and
    ``dS <= bound``."""
    return bool(
        (checks["dS"] <= checks["bound"] * _SLACK).all()
        and (checks["dA_F"] <= SOFTMAX_LIPSCHITZ * checks["dS"] * _SLACK + 1e-15).all()
        and (checks["sv_gap"] <= checks["dA_op"] * _SLACK + 1e-15).all()
        and (checks["dA_op"] <= checks["dA_F"] * _SLACK + 1e-15).all()
    )


# ---- sigma_2 against the entry scale ----------------------------------------------------------


def entry_grid(low: float = 1e-3, high: float = 1e3, per_decade: int = 4) -> list[float]:
    """Log-spaced entry scales ``s`` from ``low`` to ``high``, ``per_decade`` per factor 10."""
    if not (0 < low < high) or per_decade < 1:
        raise ValueError(
            f"need 0 < low < high and per_decade >= 1, got {low}, {high}, {per_decade}"
        )
    n = round(math.log10(high / low) * per_decade) + 1
    return [float(x) for x in np.logspace(math.log10(low), math.log10(high), n)]


def unit_instance(
    L: int, seed: int, *, d: int = 16, r: int = 4, tau: float = 1.0
) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`instance` with unit-norm queries and keys and heterogeneous factors rescaled to
    entry scale 1 (``perturbation_entry_scale(q, k, U1, tau) == 1``), so that ``sqrt(s) U1`` has
    entry scale ``s``; drawn from ``torch.Generator().manual_seed(1000 * seed + L)``."""
    if not isinstance(L, int) or L < 2:
        raise ValueError(f"L must be an integer >= 2, got {L!r}")
    if not (tau > 0 and math.isfinite(tau)):
        raise ValueError(f"tau must be a positive number, got {tau!r}")
    g = torch.Generator().manual_seed(1000 * seed + L)
    q, k, U = instance(L, d, r, 1.0, tau, generator=g)
    return q, k, U / perturbation_entry_scale(q, k, U, tau).sqrt()


def _sigma2(S: Tensor) -> float:
    return float(singular_values(torch.softmax(S, -1))[1])


def sigma2_study(
    lengths: Sequence[int],
    seeds: Sequence[int],
    scales: Sequence[float],
    *,
    d: int = 16,
    r: int = 4,
    tau: float = 1.0,
) -> pd.DataFrame:
    """``sigma_2(A_R)`` against ``sigma_2(A_E)`` on the same queries and keys
    (:func:`unit_instance` per length and seed) at every entry scale ``s`` of ``scales``.

    Returns:
        one row per ``(L, seed, s)``: ``entry_scale`` (``s``), ``bound`` (``L s``, the right-hand
        side of eqs. (12)-(13)), ``M``, ``c_paper`` (``Ubar^2 L / tau``, the paper's critical
        ratio), ``sigma2_riem``, ``sigma2_euc``, ``change`` (``sigma2_riem - sigma2_euc``),
        ``dS_F`` (``||Delta S||_F``) and ``dA_F`` (``||A_R - A_E||_F``).
    """
    lengths, seeds = _positive_ints(lengths, "lengths"), list(seeds)
    if not seeds:
        raise ValueError("seeds must be a non-empty list")
    if not scales or any(not (s > 0 and math.isfinite(s)) for s in scales):
        raise ValueError(f"scales must be a non-empty list of positive numbers, got {list(scales)}")
    rows = []
    for L in lengths:
        for seed in seeds:
            q, k, U1 = unit_instance(L, seed, d=d, r=r, tau=tau)
            s_euc = geodesic_scores(q, k, torch.zeros_like(U1), tau)
            a_e = torch.softmax(s_euc, -1)
            sig_e = float(singular_values(a_e)[1])
            M = float(((q.unsqueeze(1) - k.unsqueeze(0)) ** 2).sum(-1).max())
            for s in scales:
                s_riem = geodesic_scores(q, k, U1 * math.sqrt(s), tau)
                a_r = torch.softmax(s_riem, -1)
                sig_r = float(singular_values(a_r)[1])
                rows.append({
                    "L": L, "seed": seed, "entry_scale": s, "bound": L * s, "M": M,
                    "c_paper": s * L / M, "sigma2_riem": sig_r, "sigma2_euc": sig_e,
                    "change": sig_r - sig_e,
                    "dS_F": float(torch.linalg.matrix_norm(s_riem - s_euc)),
                    "dA_F": float(torch.linalg.matrix_norm(a_r - a_e)),
                })  # fmt: skip
    return pd.DataFrame(rows)


def study_samples(
    study: pd.DataFrame, column: str, *, absolute: bool = False
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """``column`` of :func:`sigma2_study` as ``(scales, {"L=<L>": (n_seeds, n_scales)})`` for
    :func:`attention_atlas.viz.line_band` (``absolute``: its absolute value)."""
    if column not in study.columns:
        raise ValueError(f"column must be one of {list(study.columns)}, got {column!r}")
    scales = np.sort(study["entry_scale"].unique())
    out = {}
    for L, part in study.groupby("L", sort=True):
        table = part.pivot_table(index="seed", columns="entry_scale", values=column)[scales]
        out[f"L={L}"] = np.abs(table.to_numpy()) if absolute else table.to_numpy()
    return scales, out


def onset(scales: Sequence[float], change: Sequence[float], delta: float = ONSET_DELTA) -> float:
    """The entry scale at which ``|change|`` first reaches ``delta``, interpolated linearly in
    ``|change|`` against ``log s`` between grid points (NaN if it never does; the first scale if
    it starts there)."""
    s, a = np.asarray(scales, dtype=float), np.abs(np.asarray(change, dtype=float))
    if s.shape != a.shape or s.ndim != 1:
        raise ValueError(
            f"scales and change must be 1-D of one length, got {s.shape} and {a.shape}"
        )
    if not delta > 0:
        raise ValueError(f"delta must be positive, got {delta!r}")
    hit = np.nonzero(a >= delta)[0]
    if len(hit) == 0:
        return float("nan")
    i = int(hit[0])
    if i == 0:
        return float(s[0])
    w = (delta - a[i - 1]) / (a[i] - a[i - 1])
    return float(math.exp(math.log(s[i - 1]) + w * (math.log(s[i]) - math.log(s[i - 1]))))


def onsets(study: pd.DataFrame, delta: float = ONSET_DELTA) -> pd.DataFrame:
    """Per ``(L, seed)`` of :func:`sigma2_study`: ``s_onset`` (:func:`onset`), ``bound_onset``
    (``L s_onset``: eq. (13)'s bound there) and ``c_onset`` (the paper's ``Ubar^2 L / tau``)."""
    rows = []
    for (length, seed), part in study.groupby(["L", "seed"], sort=True):
        part = part.sort_values("entry_scale")
        s_on = onset(part["entry_scale"].tolist(), part["change"].tolist(), delta)
        L, M = int(length), float(part["M"].iloc[0])  # type: ignore[call-overload]
        rows.append({"L": L, "seed": seed, "s_onset": s_on, "bound_onset": L * s_on, "c_onset": s_on * L / M})  # fmt: skip
    return pd.DataFrame(rows)


def onset_slopes(found: pd.DataFrame) -> pd.Series:
    """Per seed: the least-squares slope of ``log s_onset`` against ``log L`` over the lengths
    (seeds with a length whose sigma_2 never moved are left out). -1 is the Theta(tau/L) scaling
    of Conjecture 3.6; 0 a transition at a fixed size of one score entry."""
    slopes = {}
    for seed, part in found.groupby("seed", sort=True):
        if part["s_onset"].notna().all() and part["L"].nunique() >= 2:
            slopes[seed] = float(np.polyfit(np.log(part["L"]), np.log(part["s_onset"]), 1)[0])
    return pd.Series(slopes, name="onset_slope", dtype=float)


def transition_verdict(slopes: pd.Series) -> stats.Verdict:
    """Conjecture 3.6's critical scale: the claim is that the onset scales as ``1 / L`` at fixed
    entry scale, a slope of -1; :func:`attention_atlas.stats.verdict` with ``direction=-1`` and
    :data:`SESOI` ``["onset_slope"]`` (contradicted when the interval rules out a slope of -1/2
    or steeper; supported when it excludes zero on the negative side and is not contradicted)."""
    effect = stats.mean_interval(slopes.to_numpy()) if len(slopes) else None
    return stats.verdict(effect, sesoi=SESOI["onset_slope"], direction=-1)


def eq13_checks(study: pd.DataFrame) -> dict[str, float | bool]:
    """Eq. (13) at every point of :func:`sigma2_study`: ``|change| <= ||A_R - A_E||_F <= ||Delta
    S||_F / 2 <= L s / 2``, each measured on the same instance.

    Returns:
        ``holds`` (every inequality at every point), ``n`` (points), ``n_sub`` (points with
        ``L s <= SUBCRITICAL_BOUND``), ``tightness_median`` and ``tightness_max`` (``|change| /
        (L s)`` there: 1 would be a tight bound), ``linear`` (in every ``(L, seed)`` the change
        at the second-smallest scale over the change at the smallest equals the ratio of the
        scales within 5%: ``sigma_2`` responds linearly to a small metric) and ``linear_error``
        (the largest relative deviation of that ratio).
    """
    a = study["change"].abs()
    holds = bool(
        (a <= study["dA_F"] * _SLACK + 1e-15).all()
        and (study["dA_F"] <= SOFTMAX_LIPSCHITZ * study["dS_F"] * _SLACK + 1e-15).all()
        and (study["dS_F"] <= study["bound"] * _SLACK).all()
    )
    sub = study[study["bound"] <= SUBCRITICAL_BOUND]
    tight = (sub["change"].abs() / sub["bound"]) if len(sub) else pd.Series([np.nan])
    errors = []
    for _, part in study.groupby(["L", "seed"]):
        p = part.sort_values("entry_scale").iloc[:2]
        ratio = p["change"].iloc[1] / p["change"].iloc[0]
        expected = p["entry_scale"].iloc[1] / p["entry_scale"].iloc[0]
        errors.append(abs(ratio / expected - 1))
    return {
        "holds": holds,
        "n": len(study),
        "n_sub": len(sub),
        "tightness_median": float(tight.median()),
        "tightness_max": float(tight.max()),
        "linear": bool(max(errors) < 0.05),
        "linear_error": float(max(errors)),
    }


def spectrum_pair(
    strength: float, M: float, *, L: int = 64, d: int = 16, r: int = 4, tau: float = 1.0,
    seed: int = 0, top: int = 8,
) -> dict[str, object]:  # fmt: skip
    """One instance (:func:`unit_instance`) with queries and keys rescaled so that ``max_ij
    |q_i - k_j|^2 = M`` and factors so that ``Ubar^2 / tau = strength``.

    Returns:
        ``sigma_euc``, ``sigma_riem`` (the ``top`` largest singular values of ``A_E`` and
        ``A_R``), ``entry_scale`` (``Ubar^2 M / tau``), ``bound`` (``L`` times it, eq. (13)) and
        ``change`` (``sigma_2(A_R) - sigma_2(A_E)``).
    """
    if not (strength >= 0 and math.isfinite(strength)):
        raise ValueError(f"strength must be a non-negative number, got {strength!r}")
    if not (M > 0 and math.isfinite(M)):
        raise ValueError(f"M must be a positive number, got {M!r}")
    q, k, U1 = unit_instance(L, seed, d=d, r=r, tau=tau)
    a = math.sqrt(M / float(((q.unsqueeze(1) - k.unsqueeze(0)) ** 2).sum(-1).max()))
    q, k = a * q, a * k
    U = U1 / U1.pow(2).sum((-1, -2)).amax().sqrt() * math.sqrt(strength * tau)
    s_e, s_r = (
        singular_values(torch.softmax(geodesic_scores(q, k, u, tau), -1)).numpy()
        for u in (torch.zeros_like(U), U)
    )
    s = float(perturbation_entry_scale(q, k, U, tau))
    return {
        "sigma_euc": s_e[:top], "sigma_riem": s_r[:top], "entry_scale": s, "bound": L * s,
        "change": float(s_r[1] - s_e[1]),
    }  # fmt: skip
