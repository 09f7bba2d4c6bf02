"""Cofactor diagnostics of attention heads: normalised cofactors, margin, spectral gap.

:func:`cofactor_diagnostics` summarises chosen layers and heads of a model's attention
probabilities (how much stationary mass the least-reached token gets, how many tokens are
nearly unreachable, how close each head is to reducible); :func:`diagnostic` is the training
harness's ``"cofactor"`` entry (registered in :mod:`attention_atlas.attention.registry`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from .cofactors import lu_cofactors
from .heads import attention_probs, select_heads

__all__ = ["GAP_TOL", "cofactor_diagnostics", "diagnostic", "spectral_gap"]


#: spectral gap below which a head counts as nearly disconnected (``frac_disconnected``)
GAP_TOL = 0.05


def spectral_gap(A: Tensor) -> Tensor:
    """``1 - |lambda_2(A)|`` per matrix ``(...)``, eigenvalues sorted by modulus (float64, no grad).

    Zero when the chain has several closed classes or is periodic.
    """
    with torch.no_grad():
        ev = torch.linalg.eigvals(A.detach().to(torch.float64)).abs()  # (..., n)
        top2 = ev.topk(min(2, ev.shape[-1]), dim=-1).values
        if top2.shape[-1] < 2:
            return torch.ones(A.shape[:-2], dtype=torch.float64, device=A.device)
        return 1.0 - top2[..., 1]


def cofactor_diagnostics(
    probs: Sequence[Tensor | None],
    *,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | int | None = None,
    near_zero: float = 1e-2,
    gap_tol: float = GAP_TOL,
    max_items: int | None = 8,
) -> dict[str, float]:
    """Cofactor health of the selected heads, averaged over layers, heads and batch items.

    Per matrix, with ``pi = c / sum c`` (normalised exact cofactors, float64):

    - ``cofactor_min_prob``: ``min_i pi_i`` (``1 / n`` for a doubly stochastic matrix);
    - ``cofactor_min_prob_n``: ``n min_i pi_i`` (1 = uniform access, 0 = a token no one reaches);
    - ``cofactor_near_zero``: number of tokens with ``pi_i < near_zero / n``;
    - ``cofactor_log_margin``: ``log |m|``;
    - ``spectral_gap``: ``1 - |lambda_2(A)|``;
    - ``frac_disconnected``: fraction of matrices with ``spectral_gap < gap_tol`` (nearly
      reducible heads);
    - ``frac_with_near_zero``: fraction of matrices with at least one near-zero cofactor.

    Also returned per layer as ``..._layer{l}`` for the minimum probability and the gap.
    """
    sel_layers = list(range(len(probs))) if layers is None else list(layers)
    sel = select_heads(probs, sel_layers, heads)
    out: dict[str, float] = {}
    allmin, allnz, alllog, allgap = [], [], [], []
    with torch.no_grad():
        for li, p in zip(sel_layers, sel):
            if max_items is not None:
                p = p[:max_items]
            A = p.detach().to(torch.float64)
            n = A.shape[-1]
            res = lu_cofactors(A)
            pi = torch.where(res.singular.unsqueeze(-1), torch.zeros_like(res.x), res.x)
            mn = pi.amin(-1)
            nz = (pi < near_zero / n).sum(-1).to(torch.float64)
            lg = torch.where(res.singular, torch.full_like(res.logabsdet, -745.0), res.logabsdet)
            gap = spectral_gap(A)
            allmin.append(mn.reshape(-1))
            allnz.append(nz.reshape(-1))
            alllog.append(lg.reshape(-1))
            allgap.append(gap.reshape(-1))
            out[f"cofactor_min_prob_n_layer{li}"] = float((n * mn).mean())
            out[f"spectral_gap_layer{li}"] = float(gap.mean())
        mn_all, nz_all = torch.cat(allmin), torch.cat(allnz)
        gap_all, log_all = torch.cat(allgap), torch.cat(alllog)
        n = sel[0].shape[-1]
        out.update(
            cofactor_min_prob=float(mn_all.mean()),
            cofactor_min_prob_n=float((n * mn_all).mean()),
            cofactor_near_zero=float(nz_all.mean()),
            cofactor_log_margin=float(log_all.mean()),
            spectral_gap=float(gap_all.mean()),
            frac_disconnected=float((gap_all < gap_tol).to(torch.float64).mean()),
            frac_with_near_zero=float((nz_all > 0).to(torch.float64).mean()),
        )
    return out


def diagnostic(model: Any, output: Any, batch: Any, **options: Any) -> dict[str, float]:
    """Harness diagnostic ``"cofactor"``: :func:`cofactor_diagnostics` (all heads by default)."""
    return cofactor_diagnostics(attention_probs(output), **options)
