"""Chapter 6's mathematical claims, each decided by a float64 check that runs in seconds.

Every function returns the measurements (a dict the chapter prints and asserts on) and the
:class:`~attention_atlas.verdicts.Outcome` of its claim, so the chapter and the claims register
(:func:`attention_atlas.experiments.cofactor.run.outcomes`) compute the same thing. The tolerances
are module constants (:data:`TOL`), the maths in :mod:`attention_atlas.cofactor`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import torch

from attention_atlas.cofactor import (
    coupled_blocks,
    power_stationary,
    principal_cofactors,
    softmax_family,
    softmax_matrices,
    spectral_gap,
    stability_margin,
)
from attention_atlas.verdicts import Outcome, outcome_from_check

from .numerics import identity_table

__all__ = [
    "TOL",
    "causal_check",
    "identity_outcomes",
    "math_outcomes",
    "mixing_check",
    "power_check",
    "reducible_check",
]

F64 = torch.float64

#: tolerances of the checks (float64; relative unless said otherwise)
TOL = {
    "left_null": 1e-12,  # max |c^T L| / max |c|
    "margin": 1e-9,  # |sum c - prod lambda_k| / |prod lambda_k|
    "stationary": 1e-8,  # || c / sum c - pi ||_1 (pi: numpy's left eigenvector)
    "causal": 1e-12,  # c against (prod_{j>=1} (1 - A_jj)) e_0
    "power": 1e-8,  # || pi_power - pi ||_1 at a stopping tolerance of 1e-10
}


def identity_outcomes(n: int, count: int) -> tuple[pd.DataFrame, dict[str, Outcome]]:
    """The identities on ``count`` matrices of each family (:func:`identity_table`) and the
    outcomes of ``cofactor/left-null``, ``cofactor/margin`` and ``cofactor/stationary`` (the
    last on the irreducible families, with ``c >= 0`` checked)."""
    t = identity_table(n, count)
    irreducible = t[t.family != "causal"]
    worst = {k: float(t[c].max()) for k, c in [("left_null", "max |c^T L| / max|c|"),
             ("margin", "max rel. err of sum c vs prod lambda")]}  # fmt: skip
    pi_err = float(irreducible["max ||c/sum c - pi||_1"].max())
    c_min = float(irreducible["min c_i"].min())
    where = f"{count} matrices of each of {t.family.nunique()} families, n = {n}, minors and LU"
    out = {
        "cofactor/left-null": outcome_from_check(
            worst["left_null"] < TOL["left_null"],
            f"c^T L = 0 to {worst['left_null']:.1e} of max|c| ({where})",
            f"|c^T L| reaches {worst['left_null']:.1e} of max|c| ({where})",
        ),
        "cofactor/margin": outcome_from_check(
            worst["margin"] < TOL["margin"],
            f"sum c = prod of the nonzero eigenvalues of L to {worst['margin']:.1e} ({where})",
            f"sum c and the eigenvalue product differ by {worst['margin']:.1e} ({where})",
        ),
        "cofactor/stationary": outcome_from_check(
            pi_err < TOL["stationary"] and c_min > 0,
            f"on the irreducible families every c_i > 0 (smallest {c_min:.1e}) and c / sum c is "
            f"the stationary distribution to {pi_err:.1e} in l1",
            f"c / sum c misses the stationary distribution by {pi_err:.1e} or a cofactor is "
            f"{c_min:.1e}",
        ),
    }
    return t, out


def causal_check(n: int, count: int, seed: int = 1) -> tuple[dict[str, float], Outcome]:
    """``cofactor/decoder`` on ``count`` random causal matrices: for every causal ``A``,
    ``c = (prod_{j>=1} (1 - A_jj)) e_0`` and ``1 - |lambda_2(A)| = 1 - max_{j>=1} A_jj``, so the
    diagnostics are a function of the diagonal alone (the claim is contradicted when the check
    passes)."""
    A = softmax_family("causal", n, count, seed=seed)
    c = principal_cofactors(A, "lu")
    diag = A.diagonal(dim1=-2, dim2=-1)
    c0 = (1 - diag[:, 1:]).prod(-1)
    m = {
        "max |c_i| off token 0": float(c[:, 1:].abs().max()),
        "c_0 rel. err": float((c[:, 0] / c0 - 1).abs().max()),
        "gap err": float((spectral_gap(A) - (1 - diag[:, 1:].amax(-1))).abs().max()),
    }
    degenerate = (
        m["max |c_i| off token 0"] < TOL["causal"] * float(c0.min())
        and max(m["c_0 rel. err"], m["gap err"]) < 1e-10
    )
    where = f"{count} random causal matrices, n = {n}"
    return m, outcome_from_check(
        not degenerate,
        "causal cofactors vary with more than the diagonal",
        f"for every causal head c = (prod_(j>=1) (1 - A_jj)) e_0 ({where}: off token 0 at most "
        f"{m['max |c_i| off token 0']:.0e}, c_0 to {m['c_0 rel. err']:.0e}): pi = e_0 and "
        f"{n - 1} of {n} cofactors vanish whatever the attention, and margin and gap depend on "
        "the diagonal A_jj alone",
    )


def reducible_check(
    n: int = 16, couplings: tuple[float, ...] = (1e-2, 1e-3, 1e-4), laziness: float = 0.5
) -> tuple[dict[str, float], Outcome]:
    """``cofactor/reducible``: does a small margin single out nearly reducible heads? It sees
    them (the margin of two blocks coupled by ``eps`` vanishes like ``eps``), but the lazy chain
    ``A = t I + (1 - t) 1 1^T / n``, which mixes in one step to within ``t`` (gap ``1 - t``),
    has ``m = (1 - t)^(n - 1)``: the check passes only if every nearly reducible head has a
    smaller margin than this well-mixing one. ``n`` defaults to 16, the digits task's length
    (the margin of the lazy chain falls exponentially with ``n``, so the register and the
    chapter use one stated ``n``, smoke or not)."""
    m_c = np.array(
        [float(stability_margin(coupled_blocks(n // 2, n - n // 2, e))) for e in couplings]
    )
    gap_c = [float(spectral_gap(coupled_blocks(n // 2, n - n // 2, e))) for e in couplings]
    slope = float(np.polyfit(np.log(couplings), np.log(m_c), 1)[0])
    lazy = laziness * torch.eye(n, dtype=F64) + (1 - laziness) / n
    m_lazy, gap_lazy = float(stability_margin(lazy)), float(spectral_gap(lazy))
    m = {"slope": slope, "margin lazy": m_lazy, "gap lazy": gap_lazy, "coupling": couplings[1],
         "margin coupled": float(m_c[1]), "gap coupled": gap_c[1]}  # fmt: skip
    passed = abs(slope - 1) < 0.05 and bool((m_c < m_lazy).all())
    return m, outcome_from_check(
        passed,
        f"the margin vanishes like the coupling (log-log slope {slope:.2f}) and every nearly "
        f"reducible head has a smaller margin than a well-mixing one (n = {n})",
        f"the margin sees near-reducibility (it vanishes like the coupling, log-log slope "
        f"{slope:.2f}) but does not single it out: a lazy head that mixes in one step (gap "
        f"{gap_lazy:.2f}) has m = {m_lazy:.1e}, below the {m['margin coupled']:.1e} of two "
        f"blocks coupled by {couplings[1]:g} (gap {m['gap coupled']:.0e}), n = {n}; the "
        "spectral gap tells them apart",
    )


def mixing_check(n: int, seed: int = 0) -> tuple[dict[str, float], Outcome]:
    """``cofactor/margin-rewards-mixing``: the margin of a rank-one head ``1 p^T`` (mixes in one
    step, ``m = 1``), of a deterministic ``n``-cycle (never mixes: periodic, gap 0, ``m = n``)
    and of uniform attention to the other tokens (``m = (n / (n - 1))^(n - 1)``). The claim
    holds only if the penalty ``-log m`` prefers the rank-one head to the cycle."""
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(n, generator=g, dtype=F64), -1)
    heads = {
        "rank one": p.expand(n, n).contiguous(),
        "cycle": torch.roll(torch.eye(n, dtype=F64), 1, dims=1),
        "others": (torch.ones(n, n, dtype=F64) - torch.eye(n, dtype=F64)) / (n - 1),
    }
    m = {f"margin {k}": float(stability_margin(a)) for k, a in heads.items()}
    m.update({f"gap {k}": float(spectral_gap(a)) for k, a in heads.items()})
    ok = abs(m["margin rank one"] - 1) < 1e-12 and abs(m["margin cycle"] - n) < 1e-9
    assert ok and abs(m["margin others"] - (n / (n - 1)) ** (n - 1)) < 1e-9, m
    return m, outcome_from_check(
        m["margin rank one"] > m["margin cycle"],
        "the penalty prefers perfect mixing to a periodic cycle",
        f"-log m prefers a deterministic {n}-cycle (m = {m['margin cycle']:.3g}, penalty "
        f"{-math.log(m['margin cycle']):.2f}, spectral gap {max(0.0, m['gap cycle']):.2f}: it never mixes) "
        f"to a rank-one head that mixes in one step (m = {m['margin rank one']:.3g}, penalty "
        f"{-math.log(m['margin rank one']):.2f}): it rewards eigenvalues far from 1, not mixing",
    )


def power_check(
    sizes: tuple[int, ...], batch: int, tol: float = 1e-10
) -> tuple[pd.DataFrame, Outcome]:
    """``cofactor/power``: power iteration on ``A^T`` to ``tol`` against the minors on ``batch``
    softmax matrices per size (no timing): its l1 error, its a-posteriori bound, iterations,
    and the bound's ``delta = 1 - sum_j min_i A_ij`` on random, causal and banded attention."""
    rows = []
    for n in sizes:
        A = softmax_family("random", n, batch, seed=n)
        ref = principal_cofactors(A, "minors")
        pi, bound, iters = power_stationary(A, tol=tol)
        err = (pi - ref / ref.sum(-1, keepdim=True)).abs().sum(-1)
        delta = {k: float((1 - a.amin(-2).sum(-1)).max()) for k, a in [
            ("random", A), ("causal", softmax_matrices(batch, n, n, mask="causal", seed=n)),
            ("banded", softmax_matrices(batch, n, n, mask="banded", seed=n))]}  # fmt: skip
        rows.append({"n": n, "power ||pi - pi_ref||_1": float(err.max()),
                     "power bound": float(bound.max()), "power iterations": iters,
                     "err - bound (max)": float((err - bound).max()),
                     **{f"delta ({k})": v for k, v in delta.items()}})  # fmt: skip
    t = pd.DataFrame(rows)
    worst = float(t["power ||pi - pi_ref||_1"].max())
    held = bool((t["err - bound (max)"] <= 1e-14).all())
    return t, outcome_from_check(
        worst < TOL["power"] and held,
        f"to a stopping tolerance of {tol:g} the power iteration's pi is within {worst:.1e} (l1) "
        f"of the minors' for n = {min(sizes)} to {max(sizes)}, inside its stated bound",
        f"the power iteration's pi misses the minors' by {worst:.1e} (l1) or breaks its bound",
    )


def math_outcomes(smoke: bool = False) -> dict[str, Outcome]:
    """The outcomes of every mathematical cofactor claim (seconds; toy sizes when ``smoke``)."""
    n, count = (6, 4) if smoke else (12, 16)
    sizes = (4, 8, 16) if smoke else (4, 8, 16, 32, 64)
    out: dict[str, Any] = dict(identity_outcomes(n, count)[1])
    out["cofactor/decoder"] = causal_check(n, count)[1]
    out["cofactor/reducible"] = reducible_check()[1]
    out["cofactor/margin-rewards-mixing"] = mixing_check(n)[1]
    out["cofactor/power"] = power_check(sizes, 4)[1]
    return out
