"""Eq. (34) of the Riemannian-attention paper against eq. (32): does the soft cap give the
diversity regulariser the upper bound on the metric strength it lacks? :func:`cap_setting`
reads the regularisers a grid trains with, :func:`cap_check` evaluates them in float64 along a
scaled metric ``lam U``, :func:`cap_outcome` decides the register's ``riemannian/eq-34``
(re-exported by :mod:`~attention_atlas.experiments.fiber_bundle.verdicts`, which computes every
chapter-4 outcome).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from attention_atlas.attention.riemannian.regularizers import regularizer_terms
from attention_atlas.verdicts import Outcome, outcome_from_check

from .analysis import Runs

__all__ = ["cap_check", "cap_outcome", "cap_setting"]


def cap_setting(runs: Runs, config: str = "fbt") -> dict[str, Any]:
    """What the regularisers of ``config`` act on, read from its grid entry: the head width
    ``d``, the window ``seq_len``, the metric ``rank``, ``kappa_min``, ``kappa_max`` and the
    weights the harness trains with at full strength (the first 30% of training, where the long
    grid's runs diverged): :func:`attention_atlas.experiments.fiber_bundle.run.scaled_weights`."""
    from .run import scaled_weights

    p = runs.grid[config]
    reg = p["reg"]
    return {"d": int(p["model"]["dim"]) // int(p["model"]["n_heads"]),
            "seq_len": int(p["train"]["seq_len"]), "rank": int(p["model"].get("rank", 4)),
            "kappa_min": float(reg["kappa_min"]), "kappa_max": float(reg["kappa_max"]),
            "weights": scaled_weights(dict(reg.get("weights", {})), float(reg["kappa_max"]))}  # fmt: skip


def cap_check(
    d: int,
    seq_len: int,
    rank: int,
    kappa_min: float,
    kappa_max: float,
    weights: dict[str, float],
    *,
    seed: int = 0,
    top: float = 1000.0,
    points: int = 121,
) -> dict[str, Any]:
    """Does the cap of eq. (34) bound the metric against the diversity push of eq. (32)?

    In float64: a random ``U (seq_len, d, rank)`` rescaled to ``lam U``, from mean ``kappa_t``
    at ``kappa_max / 2`` to ``top * kappa_max`` (``points`` log-spaced scales), and at each the
    regularisers of :func:`~attention_atlas.attention.riemannian.regularizers.regularizer_terms`
    with ``weights`` (the ``anti``, ``div``, ``smooth``, ``cap`` of the ``"three"`` setting).
    Diversity and smoothness are quartic in ``U`` (``|U_i U_i^T - U_j U_j^T|_F^2``), the cap and
    anti-flatness hinges quadratic (``kappa_t = |U_t|_F^2``): along ``lam U`` the sum is
    ``c4 lam^4 + O(lam^2)``, unbounded below whenever ``c4 < 0``.

    Returns ``ratio`` (mean ``kappa`` over ``kappa_max`` at each scale, ``(points,)``),
    ``terms`` (each weighted term, name -> ``(points,)``), ``total``, ``peak`` (the ``ratio``
    where ``total`` is largest: beyond it, the regularisers alone push the metric up without
    end), ``quartic`` (``c4`` per unit ``(mean kappa / kappa_max)^2``: the weighted diversity
    and smoothness at mean ``kappa = kappa_max``), and ``cap_slope`` (the cap's weighted value
    per unit ``mean kappa / kappa_max`` once every token is above ``kappa_max``, its linear
    rate), ``at_top`` and ``at_max`` (the sum at the largest scale and at mean ``kappa =
    kappa_max``).
    """
    g = torch.Generator().manual_seed(seed)
    U = torch.randn(1, 1, seq_len, d, rank, generator=g, dtype=torch.float64)
    U = U * math.sqrt(kappa_max / float((U * U).sum((-1, -2)).mean()))  # mean kappa = kappa_max
    ratio = np.geomspace(0.5, top, points)
    used = ("anti", "div", "smooth", "cap")
    terms: dict[str, list[float]] = {k: [] for k in used}
    for r in ratio:
        raw = regularizer_terms(U * math.sqrt(r), kappa_min=kappa_min, kappa_max=kappa_max,
                                terms=used)  # fmt: skip
        for k in used:
            terms[k].append(weights[k] * float(raw[k]))
    out = {k: np.asarray(v) for k, v in terms.items()}
    total = np.sum(np.stack(list(out.values())), axis=0)
    at_one = regularizer_terms(U, kappa_min=kappa_min, kappa_max=kappa_max, terms=("div", "smooth"))
    return {
        "ratio": ratio,
        "terms": out,
        "total": total,
        "peak": float(ratio[int(np.argmax(total))]),
        "quartic": weights["div"] * float(at_one["div"]) + weights["smooth"] * float(at_one["smooth"]),
        "cap_slope": weights["cap"] * kappa_max,
        "at_top": float(total[-1]),
        "at_max": float(np.interp(1.0, ratio, total)),
        "setting": {"d": d, "seq_len": seq_len, "rank": rank, "kappa_min": kappa_min,
                    "kappa_max": kappa_max, "weights": {k: weights[k] for k in used}},
    }  # fmt: skip


def cap_outcome(check: dict[str, Any]) -> Outcome:
    """The outcome of the claim that the cap (34) gives the diversity term (32) its missing
    upper bound: supported only if the weighted regularisers of :func:`cap_check` never fall
    below their value at ``kappa_max`` along the scaled metric (bounded below, so the
    regularisers alone do not push ``kappa`` up forever)."""
    st = check["setting"]
    at_max = check["at_max"]
    bounded = check["quartic"] >= 0 and check["at_top"] >= at_max
    where = (f"a random U (L, d, r) = ({st['seq_len']}, {st['d']}, {st['rank']}) with the grid's "
             f"weights (diversity {st['weights']['div']:.3g}, cap {st['weights']['cap']:.3g}, "
             f"kappa_max = {st['kappa_max']:.3g})")  # fmt: skip
    return outcome_from_check(
        bounded,
        f"for {where}, the regularisers stay above their value at kappa_max along lambda U",
        f"for {where}, diversity and smoothness are quartic in U and the cap only quadratic: "
        f"their sum peaks at mean kappa = {check['peak']:.3g} kappa_max and falls without bound "
        f"beyond it ({check['at_top']:.3g} at {check['ratio'][-1]:.0f} kappa_max, against "
        f"{at_max:.3g} at kappa_max; lambda^4 coefficient {check['quartic']:.3g})",
        extra={"peak": check["peak"], "quartic": check["quartic"], "at_top": check["at_top"]},
    )
