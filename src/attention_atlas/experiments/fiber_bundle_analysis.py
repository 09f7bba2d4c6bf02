"""The analysis of chapter 4's runs: post-training measurements of a trained model
(:func:`analyse`, char-PTB token types), and the per-seed views, paired differences and tables
the chapter shows (:class:`Runs`).

The verdict words of this chapter (:func:`verdict`): a prediction is *supported* when the
interval of the effect it predicts excludes zero in the predicted direction, *contradicted* when
it excludes zero in the other direction, and *inconclusive at this scale* otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from scipy.stats import spearmanr
from torch import Tensor

from ..attention.riemannian.geometry import metric_strength
from ..data import eval_windows
from ..linalg import effective_rank
from ..models import Transformer
from ..stats import Interval, mean_ci, mean_interval, paired_difference

__all__ = [
    "TYPE_NAMES",
    "Runs",
    "analyse",
    "char_classes",
    "history_frame",
    "token_types",
    "verdict",
]


def char_classes(itos: list[str]) -> dict[str, list[int]]:
    """Token ids of char-PTB by type: ``letter`` (a-z), ``space`` (``_``), ``newline``,
    ``digit_or_N`` (digits and the number token ``N``), ``punct`` (everything else)."""
    out: dict[str, list[int]] = {
        "letter": [],
        "space": [],
        "newline": [],
        "digit_or_N": [],
        "punct": [],
    }
    for i, s in enumerate(itos):
        if len(s) == 1 and "a" <= s <= "z":
            out["letter"].append(i)
        elif s == "_":
            out["space"].append(i)
        elif s == "\n":
            out["newline"].append(i)
        elif s.isdigit() or s == "N":
            out["digit_or_N"].append(i)
        else:
            out["punct"].append(i)
    return out


def token_types(x: Tensor, itos: list[str]) -> Tensor:
    """Type code per position of ``x (B, L)`` (ids): 0 word-initial letter, 1 word-internal
    letter, 2 space ``_``, 3 newline, 4 digit or ``N``, 5 punctuation/other. A letter is
    word-initial when the previous character is a space or newline (or it starts the window:
    the window's first position is then excluded, code -1)."""
    cls = char_classes(itos)
    lut = torch.full((len(itos),), 5, dtype=torch.int64)
    for name, c in (("letter", 1), ("space", 2), ("newline", 3), ("digit_or_N", 4)):
        lut[cls[name]] = c
    code = lut[x.cpu()]
    prev = torch.full_like(code, -1)
    prev[:, 1:] = code[:, :-1]
    initial = (code == 1) & ((prev == 2) | (prev == 3))
    code = torch.where(initial, torch.zeros_like(code), code)
    code[:, 0] = -1
    return code


TYPE_NAMES = ["word_initial", "word_internal", "space", "newline", "digit_or_N", "punct"]


@torch.no_grad()
def analyse(
    model: Transformer,
    data: Any,
    *,
    seq_len: int,
    n_seqs: int = 64,
    batch_size: int = 32,
) -> dict[str, Any]:
    """Post-training measurements on the first ``n_seqs`` validation windows.

    Returns ``erank_<l>`` (mean effective rank of each layer's hidden states, ``l = 0`` the
    embedding), ``sigma2_<l>`` (mean second singular value of the attention matrices), and for a
    Fiber Bundle model per layer ``kappa_<l>_{mean,max,var,cv}``, ``kappa_<l>_<type>`` (mean
    ``kappa_t`` over heads and positions of each token type of :func:`token_types`) and
    ``kappa_<l>_spearman_surprisal`` (rank correlation of ``kappa_t`` with the surprisal
    ``-log2 p(x_t | x_<t)``, positions 1..L-1); plus ``tokens`` (a DataFrame, one row per
    position with ``type``, ``surprisal`` and ``kappa_<l>``) for plotting.
    """
    was = model.training
    model.eval()
    try:
        m = _measure(model, data, seq_len, n_seqs, batch_size)
    finally:
        model.train(was)
    res: dict[str, Any] = {}
    for i, v in m["erank"].items():
        res[f"erank_{i}"] = float(np.mean(v))
    for i, v in m["sigma2"].items():
        res[f"sigma2_{i}"] = float(np.mean(v))
    t_all = torch.cat(m["types"]).reshape(-1).numpy()
    s_all = torch.cat(m["surprisal"]).reshape(-1).numpy()
    tok = pd.DataFrame({"type": t_all, "surprisal": s_all})
    for i, parts in m["kappa"].items():
        kk = torch.cat(parts).reshape(-1).numpy()
        tok[f"kappa_{i}"] = kk
        res.update(_kappa_summary(kk, t_all, s_all, f"kappa_{i}_"))
    res["tokens"] = tok
    return res


def _measure(
    model: Transformer, data: Any, seq_len: int, n_seqs: int, batch_size: int
) -> dict[str, Any]:
    """Per window: effective ranks, attention sigma_2, ``kappa_t`` (mean over heads), token
    types and surprisals (the forward passes of :func:`analyse`)."""
    device = next(model.parameters()).device
    erank: dict[int, list[float]] = {}
    sig2: dict[int, list[float]] = {}
    kap: dict[int, list[Tensor]] = {}
    types, surpr = [], []
    n = 0
    for x, y in eval_windows(data.valid, batch_size, seq_len):
        if n >= n_seqs:
            break
        x, y = x[: n_seqs - n].to(device), y[: n_seqs - n].to(device)
        n += x.shape[0]
        out = model(x, need_weights=True)
        for i, h in enumerate(out.hidden):
            erank.setdefault(i, []).extend(effective_rank(h.double()).tolist())
        for i, res in enumerate(out.attentions):
            if res.probs is not None:
                s = torch.linalg.svdvals(res.probs.double())[..., 1]  # (B, H)
                sig2.setdefault(i + 1, []).extend(s.mean(-1).tolist())
            if "metric_factor" in res.extras:
                k = metric_strength(res.extras["metric_factor"].double()).mean(1)  # (B, L)
                kap.setdefault(i + 1, []).append(k.cpu())
        logp = torch.log_softmax(out.logits.double(), -1)  # (B, L, V)
        nll = -logp.gather(-1, y.unsqueeze(-1)).squeeze(-1) / math.log(2)  # surprisal of x_{t+1}
        s = torch.full(x.shape, math.nan, dtype=torch.float64)
        s[:, 1:] = nll[:, :-1].cpu()  # surprisal of x_t given x_<t
        surpr.append(s)
        types.append(token_types(x, data.vocab.itos))
    return {"erank": erank, "sigma2": sig2, "kappa": kap, "types": types, "surprisal": surpr}


def _kappa_summary(
    kk: np.ndarray, types: np.ndarray, surprisal: np.ndarray, p: str
) -> dict[str, float]:
    """Mean, max, variance, CV of one layer's ``kappa_t``, its mean per token type, and its rank
    correlation with the surprisal (NaN when ``kappa`` is constant, as with Phase A off)."""
    res = {p + "mean": float(kk.mean()), p + "max": float(kk.max()), p + "var": float(kk.var()),
           p + "cv": float(kk.std() / max(kk.mean(), 1e-30))}  # fmt: skip
    for code, name in enumerate(TYPE_NAMES):
        sel = types == code
        res[p + name] = float(kk[sel].mean()) if sel.any() else math.nan
    ok = np.isfinite(surprisal) & (types >= 0)
    varies = ok.sum() > 2 and kk[ok].std() > 0
    rho = spearmanr(kk[ok], surprisal[ok]).statistic if varies else math.nan
    res[p + "spearman_surprisal"] = float(rho)
    return res


def history_frame(cell: dict[str, Any]) -> pd.DataFrame:
    """The training history stored in a cell's JSON as a DataFrame."""
    return pd.DataFrame(cell["history"])


# ----------------------------------------------------------------------------------------
# the chapter's views of the finished runs
# ----------------------------------------------------------------------------------------


def _interval(values: Any) -> Interval:
    """:func:`attention_atlas.stats.mean_interval` over seeds, or NaN (no interval) when a seed's
    value is missing (a token type absent from the analysed windows, a constant ``kappa``)."""
    x = np.asarray(values, dtype=float)
    if np.isfinite(x).all():
        return mean_interval(x)
    m, lo, hi = mean_ci(x)
    return Interval(m, lo, hi, int(x.size))


def verdict(effect: Interval, sign: int = 1) -> str:
    """This chapter's verdict on a predicted effect (``sign = +1``: an increase, ``-1``: a
    decrease): supported / contradicted / inconclusive at this scale (see the module docstring)."""
    if not effect.resolved:
        return "inconclusive at this scale (one seed)"
    lo, hi = sign * effect.low, sign * effect.high
    if lo > 0 and hi > 0:
        return "supported"
    if lo < 0 and hi < 0:
        return "contradicted"
    return "inconclusive at this scale"


@dataclass
class Runs:
    """The finished cells of chapter 4's grid.

    Attributes:
        grid: configuration name -> parameters (:func:`attention_atlas.experiments.fiber_bundle.chapter_grid`).
        seeds: the seeds every configuration ran at.
        df: one row per cell, scalar metrics (``config``, ``seed``, ``val_bpc``, ...).
        cells: ``(config, seed)`` -> the cell's full record (training ``history``, ``tokens``).
        n_layers: blocks of every model.
        command: the command line that reruns the grid.
    """

    grid: dict[str, dict[str, Any]]
    seeds: list[int]
    df: pd.DataFrame
    cells: dict[tuple[str, int], dict[str, Any]]
    n_layers: int
    command: str

    def per_seed(self, config: str, column: str) -> np.ndarray:
        """One value of ``column`` per seed (in seed order)."""
        g = self.df[self.df.config == config].sort_values("seed")
        return g[column].to_numpy(dtype=float)

    def interval(self, config: str, column: str) -> Interval:
        """Mean of ``column`` over seeds with its 95% interval."""
        return _interval(self.per_seed(config, column))

    def paired(self, a: str, b: str, column: str) -> Interval:
        """Interval of ``a - b`` paired by seed (:func:`attention_atlas.stats.paired_difference`)."""
        return paired_difference(self.per_seed(a, column), self.per_seed(b, column))

    def mean_over_layers(self, config: str, stem: str) -> np.ndarray:
        """Per seed: the mean over blocks ``l = 1..n_layers`` of column ``stem.format(l=l)``."""
        cols = [stem.format(l=l) for l in range(1, self.n_layers + 1)]
        return np.mean([self.per_seed(config, c) for c in cols], axis=0)

    def layer_interval(self, config: str, stem: str) -> Interval:
        """Interval over seeds of :meth:`mean_over_layers` (NaN, no interval, if a seed lacks it)."""
        return _interval(self.mean_over_layers(config, stem))

    def history(self, config: str, seed: int) -> pd.DataFrame:
        return history_frame(self.cells[(config, seed)])

    def last_logged(self, config: str, key: str) -> np.ndarray:
        """Per seed: the last logged value of diagnostic ``fiber_bundle/l<l>/<key>``, averaged
        over blocks."""
        return np.array([np.mean([self.history(config, s)[f"fiber_bundle/l{l}/{key}"].iloc[-1]
                                  for l in range(self.n_layers)]) for s in self.seeds])  # fmt: skip

    def trajectory(self, config: str, key: str) -> tuple[list[float], np.ndarray]:
        """``(steps, values (n_seeds, n_steps))`` of a logged diagnostic averaged over blocks;
        for ``kappa_mean`` the value at initialisation (``kappa_init_<l>``) comes first, at step 0."""
        series = []
        for s in self.seeds:
            h = self.history(config, s)
            vals = np.mean([h[f"fiber_bundle/l{l}/{key}"].to_numpy() for l in range(self.n_layers)],
                           axis=0)  # fmt: skip
            if key == "kappa_mean":
                init = np.mean([self.cells[(config, s)][f"kappa_init_{l}"]
                                for l in range(1, self.n_layers + 1)])  # fmt: skip
                vals = np.concatenate([[init], vals])
            series.append(vals)
        steps = list(self.history(config, self.seeds[0])["step"])
        return ([0.0] if key == "kappa_mean" else []) + steps, np.array(series)

    def tokens(self, config: str) -> pd.DataFrame:
        """The per-position token records (``type``, ``surprisal``, ``kappa_<l>``) of every seed."""
        return pd.concat([pd.DataFrame(self.cells[(config, s)]["tokens"]) for s in self.seeds],
                         ignore_index=True)  # fmt: skip

    def overview(self, last: int) -> pd.DataFrame:
        """Every configuration: validation bpc, training time, the paired bpc difference and the
        time ratio to ``dot``, and the effective rank of block ``last``."""
        rows = []
        dot_time = self.per_seed("dot", "train_time_s").mean()
        for name in self.grid:
            tt = self.per_seed(name, "train_time_s")
            row = {"configuration": name, "val bpc": self.interval(name, "val_bpc").format(3),
                   "train s": _interval(tt).format(1)}  # fmt: skip
            if name != "dot":
                row["bpc - dot"] = self.paired(name, "dot", "val_bpc").format(3, signed=True)
                row["time / dot"] = f"{tt.mean() / dot_time:.1f}x"
            row[f"erank L{last}"] = self.interval(name, f"erank_{last}").format(2)
            rows.append(row)
        return pd.DataFrame(rows).set_index("configuration")

    def alpha_gaps(self, names: Mapping[float, str]) -> pd.DataFrame:
        """Prediction P2: for each model trained at one alpha and evaluated at another, its bpc
        minus that of the model trained at the evaluation alpha, paired by seed, and the verdict."""
        rows = []
        for a_tr, n_tr in names.items():
            for a_ev, n_ev in names.items():
                if a_tr == a_ev:
                    continue
                gap = self.paired(n_tr, n_ev, f"bpc_at_alpha_{a_ev:g}")
                rows.append({"alpha_train": a_tr, "alpha_eval": a_ev,
                             "gap (bpc)": gap.format(3, signed=True), "verdict": verdict(gap)})  # fmt: skip
        return pd.DataFrame(rows)

    def alpha_sensitivity(self, names: Mapping[float, str]) -> float:
        """Largest change of any seed's bpc when one trained model is evaluated at another alpha."""
        return max(
            float(np.abs(self.per_seed(n, f"bpc_at_alpha_{a_ev:g}")
                         - self.per_seed(n, f"bpc_at_alpha_{a_tr:g}")).max())
            for a_tr, n in names.items() for a_ev in names
        )  # fmt: skip

    def kappa_by_type(self, models: Mapping[str, str]) -> pd.DataFrame:
        """Prediction P4 per model and block: CV of ``kappa_t``, token-type differences of
        ``kappa_t`` relative to its mean, and its rank correlation with the surprisal."""
        rows = []
        for model, label in models.items():
            for l in range(1, self.n_layers + 1):
                rel = {t: self.per_seed(model, f"kappa_{l}_{t}") / self.per_seed(model, f"kappa_{l}_mean")
                       for t in ("word_initial", "word_internal", "space", "punct")}  # fmt: skip
                letters = (rel["word_initial"] + rel["word_internal"]) / 2
                rows.append({
                    "model": label, "block": l,
                    "CV of kappa_t": self.interval(model, f"kappa_{l}_cv").format(3),
                    "(initial - internal) / mean":
                        _interval(rel["word_initial"] - rel["word_internal"]).format(3, signed=True),
                    "(letters - space) / mean": _interval(letters - rel["space"]).format(3, signed=True),
                    "(punct - letters) / mean": _interval(rel["punct"] - letters).format(3, signed=True),
                    "Spearman(kappa, surprisal)":
                        self.interval(model, f"kappa_{l}_spearman_surprisal").format(3),
                })  # fmt: skip
        return pd.DataFrame(rows).set_index(["model", "block"])
