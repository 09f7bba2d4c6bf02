"""The measurements of chapter 4's models: what :func:`analyse` reads off a model on the first
validation windows of char-PTB (effective ranks, the attention's second singular value and
entropy, the metric strength ``kappa_t`` per token and its relation to the token type and to the
surprisal, the perturbation scale of Proposition 3.5), the small record of one text that the
chapter's exploration shows (:func:`explore_window`), and the per-seed views of a finished grid
(:class:`Runs`). The verdicts are :mod:`attention_atlas.experiments.fiber_bundle.verdicts`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from scipy.stats import spearmanr
from torch import Tensor

from attention_atlas.attention.riemannian.diagnostics import perturbation_entry_scale
from attention_atlas.attention.riemannian.geometry import metric_strength
from attention_atlas.data import eval_windows
from attention_atlas.linalg import effective_rank
from attention_atlas.models import Transformer, fbt_attentions
from attention_atlas.stats import Interval, mean_ci, mean_interval, paired_difference

__all__ = [
    "TYPE_NAMES",
    "Runs",
    "analyse",
    "attention_entropy",
    "char_classes",
    "explore_window",
    "token_types",
]

#: token types of :func:`token_types`, by code
TYPE_NAMES = ["word_initial", "word_internal", "space", "newline", "digit_or_N", "punct"]
#: quantiles of ``kappa_t`` per token type kept in a cell's record (the chapter's box plots)
QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)


def char_classes(itos: list[str]) -> dict[str, list[int]]:
    """Token ids of char-PTB by type: ``letter`` (a-z), ``space`` (``_``), ``newline``,
    ``digit_or_N`` (digits and the number token ``N``), ``punct`` (everything else)."""
    out: dict[str, list[int]] = {"letter": [], "space": [], "newline": [], "digit_or_N": [],
                                 "punct": []}  # fmt: skip
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


def attention_entropy(probs: Tensor) -> Tensor:
    """Mean row entropy (nats) of attention matrices ``probs (..., L, L)``, ``(...)``: each row
    ``-sum_j A_ij log A_ij`` (``0 log 0 = 0``, so the masked keys of a causal row count for
    nothing), averaged over the rows. Between 0 (every row one key) and the mean of ``log`` of
    the number of keys each row sees."""
    p = probs.double()
    h = -torch.where(p > 0, p * p.log(), torch.zeros_like(p)).sum(-1)  # (..., L)
    return h.mean(-1)


@torch.no_grad()
def analyse(
    model: Transformer,
    data: Any,
    *,
    seq_len: int,
    n_seqs: int = 64,
    batch_size: int = 32,
    initial: Transformer | None = None,
) -> dict[str, Any]:
    """Measurements on the first ``n_seqs`` validation windows.

    Returns ``erank_<l>`` (mean effective rank of each layer's hidden states, ``l = 0`` the
    embedding), ``sigma2_<l>`` (mean second singular value of the attention matrices) and
    ``entropy_<l>`` (mean row entropy of the attention, :func:`attention_entropy`), and for a
    Fiber Bundle model per layer: ``entry_scale_<l>`` (mean over windows and heads of
    ``U-bar^2 M / tau``, Proposition 3.5's bound on one score change), ``kappa_<l>_{mean,max,var,
    cv}``, ``kappa_<l>_<type>`` (mean ``kappa_t`` over heads and positions of each token type of
    :func:`token_types`) and ``kappa_<l>_spearman_surprisal`` (rank correlation of ``kappa_t``
    with the surprisal ``-log2 p(x_t | x_<t)``, positions 1..L-1); ``kappa_quantiles`` (per layer
    and type, the :data:`QUANTILES` of ``kappa_t``); and ``tokens`` (a DataFrame, one row per
    position: ``type``, ``surprisal``, ``kappa_<l>``).

    ``initial``: the same model at initialisation. Then also ``init_kappa_<l>_{mean,max,var,cv,
    spearman_surprisal,...}``: the initial model's ``kappa_t`` on the same windows, correlated
    with the *trained* model's surprisal (one measure of how hard a character is, for both).
    """
    m = _measure(model, data, seq_len, n_seqs, batch_size)
    res: dict[str, Any] = {}
    for key in ("erank", "sigma2", "entropy", "entry_scale"):
        for i, v in m[key].items():
            res[f"{key}_{i}"] = float(np.mean(v))
    t_all = torch.cat(m["types"]).reshape(-1).numpy()
    s_all = torch.cat(m["surprisal"]).reshape(-1).numpy()
    tok = pd.DataFrame({"type": t_all, "surprisal": s_all})
    quantiles: dict[str, dict[str, list[float]]] = {}
    for i, parts in m["kappa"].items():
        kk = torch.cat(parts).reshape(-1).numpy()
        tok[f"kappa_{i}"] = kk
        res.update(_kappa_summary(kk, t_all, s_all, f"kappa_{i}_"))
        quantiles[f"kappa_{i}"] = {
            name: np.quantile(kk[t_all == code], QUANTILES).round(7).tolist()
            for code, name in enumerate(TYPE_NAMES)
            if (t_all == code).any()
        }
    if quantiles:
        res["kappa_quantiles"] = quantiles
    if initial is not None:
        m0 = _measure(initial, data, seq_len, n_seqs, batch_size)
        for i, parts in m0["kappa"].items():
            kk = torch.cat(parts).reshape(-1).numpy()
            res.update(_kappa_summary(kk, t_all, s_all, f"init_kappa_{i}_"))
    res["tokens"] = tok
    return res


def _measure(
    model: Transformer, data: Any, seq_len: int, n_seqs: int, batch_size: int
) -> dict[str, Any]:
    """Per window: effective ranks, attention sigma_2 and entropy, Prop. 3.5's entry scale,
    ``kappa_t`` (mean over heads), token types and surprisals (the forward passes of
    :func:`analyse`), in eval mode."""
    was = model.training
    model.eval()
    device = next(model.parameters()).device
    taus = [m.tau for m in fbt_attentions(model)]
    out_: dict[str, Any] = {k: {} for k in ("erank", "sigma2", "entropy", "entry_scale", "kappa")}
    out_.update(types=[], surprisal=[])
    n = 0
    try:
        for x, y in eval_windows(data.valid, batch_size, seq_len):
            if n >= n_seqs:
                break
            x, y = x[: n_seqs - n].to(device), y[: n_seqs - n].to(device)
            n += x.shape[0]
            out = model(x, need_weights=True)
            for i, h in enumerate(out.hidden):
                out_["erank"].setdefault(i, []).extend(effective_rank(h.double()).tolist())
            for i, res in enumerate(out.attentions):
                _layer_measures(out_, i + 1, res, taus[i] if i < len(taus) else None)
            logp = torch.log_softmax(out.logits.double(), -1)  # (B, L, V)
            nll = -logp.gather(-1, y.unsqueeze(-1)).squeeze(-1) / math.log(2)  # of x_{t+1}
            s = torch.full(x.shape, math.nan, dtype=torch.float64)
            s[:, 1:] = nll[:, :-1].cpu()  # surprisal of x_t given x_<t
            out_["surprisal"].append(s)
            out_["types"].append(token_types(x, data.vocab.itos))
    finally:
        model.train(was)
    return out_


def _layer_measures(acc: dict[str, Any], layer: int, res: Any, tau: float | None) -> None:
    """Add one layer's sigma_2, entropy, entry scale and ``kappa_t`` of a batch to ``acc``."""
    if res.probs is not None:
        probs = res.probs.double()
        acc["sigma2"].setdefault(layer, []).extend(
            torch.linalg.svdvals(probs)[..., 1].mean(-1).tolist()  # (B,): mean over heads
        )
        acc["entropy"].setdefault(layer, []).extend(attention_entropy(probs).mean(-1).tolist())
    if "metric_factor" in res.extras:
        U = res.extras["metric_factor"].double()  # (B, H, L, d, r)
        acc["kappa"].setdefault(layer, []).append(metric_strength(U).mean(1).cpu())  # (B, L)
        if tau is not None and "query" in res.extras:
            q, k = res.extras["query"].double(), res.extras["key"].double()
            scale = perturbation_entry_scale(q, k, U, tau)  # (B, H)
            acc["entry_scale"].setdefault(layer, []).extend(scale.mean(-1).tolist())


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


@torch.no_grad()
def explore_window(model: Transformer, data: Any, length: int = 32) -> dict[str, Any]:
    """What the chapter's exploration shows of one trained model, kept small for the record: the
    first ``length`` characters of the validation split (``text``), and per block ``l`` the
    attention averaged over heads (``attention_<l>``, ``length x length``, causal) and, for a
    Fiber Bundle model, ``kappa_t`` averaged over heads (``kappa_<l>``), rounded to 4 digits."""
    was = model.training
    model.eval()
    try:
        x = data.valid[:length].reshape(1, -1).to(next(model.parameters()).device)
        out = model(x, need_weights=True)
    finally:
        model.train(was)
    rec: dict[str, Any] = {"text": "".join(data.vocab.itos[int(i)] for i in x[0])}
    for i, res in enumerate(out.attentions, start=1):
        if res.probs is not None:
            rec[f"attention_{i}"] = res.probs[0].double().mean(0).round(decimals=4).tolist()
        if "metric_factor" in res.extras:
            kappa = metric_strength(res.extras["metric_factor"][0].double()).mean(0)
            rec[f"kappa_{i}"] = [float(f"{v:.4g}") for v in kappa.tolist()]
    return rec


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


@dataclass
class Runs:
    """The finished cells of chapter 4's grid.

    Attributes:
        grid: configuration name -> parameters (:func:`attention_atlas.experiments.fiber_bundle.run.chapter_grid`).
        seeds: the seeds every configuration ran at.
        df: one row per cell, scalar metrics (``config``, ``seed``, ``val_bpc``, ...).
        cells: ``(config, seed)`` -> the cell's full record (training ``history``, ...).
        n_layers: blocks of every model.
        command: the command line that reruns the grid.
    """

    grid: dict[str, dict[str, Any]]
    seeds: list[int]
    df: pd.DataFrame
    cells: dict[tuple[str, int], dict[str, Any]]
    n_layers: int
    command: str

    @classmethod
    def from_records(
        cls, records: Mapping[tuple[str, int], Mapping[str, Any]], command: str
    ) -> Runs:
        """The runs of a stored or computed grid (:attr:`attention_atlas.store.results.Grid.records`):
        configurations and shapes are read from the records themselves."""
        from attention_atlas.store.records import records_frame

        grid = {c: dict(r["params"]) for (c, _), r in records.items()}
        seeds = sorted({s for _, s in records})
        missing = [(c, s) for c in grid for s in seeds if (c, s) not in records]
        if missing:
            raise ValueError(f"every configuration needs every seed; missing {missing[:3]}")
        n_layers = int(next(iter(grid.values()))["model"]["n_layers"])
        cells = {k: dict(v) for k, v in records.items()}
        return cls(grid, seeds, records_frame(cells.values()), cells, n_layers, command)

    @property
    def params(self) -> dict[str, Any]:
        """The shared shape and training of the grid: ``dim``, ``n_heads``, ``seq_len``,
        ``steps``, ``batch_size`` (from the dot-product baseline's record)."""
        p = self.grid["dot"]
        return {**{k: p["model"][k] for k in ("dim", "n_heads", "n_layers")},
                **{k: p["train"][k] for k in ("seq_len", "steps", "batch_size")}}  # fmt: skip

    @property
    def time(self) -> tuple[str, str]:
        """The column training costs are compared by, and its label
        (:func:`~attention_atlas.store.records.time_column`: CPU time where every cell has it)."""
        from attention_atlas.store.records import time_column

        return time_column(self.df)

    def per_seed(self, config: str, column: str) -> np.ndarray:
        """One value of ``column`` per seed (in seed order)."""
        g = self.df[self.df.config == config].sort_values("seed")
        return g[column].to_numpy(dtype=float)

    def diverged(self, config: str) -> dict[int, int]:
        """Seed -> the step at which ``config``'s training diverged (non-finite loss or
        gradient; the cell's ``diverged_step``), for the seeds where it did; empty when none."""
        if "diverged_step" not in self.df:
            return {}
        g = self.df[(self.df.config == config) & self.df.diverged_step.notna()]
        return {int(s): int(t) for s, t in zip(g.seed, g.diverged_step)}

    def finished(self, configs: Sequence[str] | None = None) -> list[str]:
        """Those of ``configs`` (default: every configuration, in grid order) that finished at
        every seed: the arms a figure or an interval over seeds can show."""
        return [c for c in (self.grid if configs is None else configs) if not self.diverged(c)]

    def divergence_table(self) -> pd.DataFrame:
        """Every run that diverged, at its last log step before the divergence: ``config``,
        ``seed``, ``diverged_step``, ``last_log_step``, the largest mean ``kappa_t`` over
        blocks (``kappa_mean``, from the log's ``fiber_bundle/l<l>/kappa_mean``) and it over the
        run's ``kappa_max`` (``kappa / kappa_max``), and the weighted geometric regulariser
        (``regularizer``, the log's ``reg/fiber_bundle``); NaN where the run diverged before
        its first log. Empty (with those columns) when every run finished."""
        rows = []
        for config in self.grid:
            for seed, step in sorted(self.diverged(config).items()):
                h = self.history(config, seed)
                kappas = [
                    c
                    for c in h.columns
                    if c.startswith("fiber_bundle/l") and c.endswith("/kappa_mean")
                ]
                last = h.iloc[-1] if len(h) else pd.Series(dtype=float)
                kappa = float(max(last[c] for c in kappas)) if len(h) and kappas else math.nan
                kappa_max = float(self.grid[config].get("reg", {}).get("kappa_max", math.nan))
                rows.append({"config": config, "seed": seed, "diverged_step": step,
                             "last_log_step": float(last.get("step", math.nan)),
                             "kappa_mean": kappa, "kappa / kappa_max": kappa / kappa_max,
                             "regularizer": float(last.get("reg/fiber_bundle", math.nan))})  # fmt: skip
        cols = ["config", "seed", "diverged_step", "last_log_step", "kappa_mean",
                "kappa / kappa_max", "regularizer"]  # fmt: skip
        return pd.DataFrame(rows, columns=cols)

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
        """The training log of one cell (a row per log step)."""
        return pd.DataFrame(self.cells[(config, seed)]["history"])

    def last_logged(self, config: str, key: str) -> np.ndarray:
        """Per seed: the last logged value of diagnostic ``fiber_bundle/l<l>/<key>``, averaged
        over blocks."""
        return np.array([np.mean([self.history(config, s)[f"fiber_bundle/l{l}/{key}"].iloc[-1]
                                  for l in range(self.n_layers)]) for s in self.seeds])  # fmt: skip

    def trajectory(self, config: str, key: str) -> tuple[list[float], np.ndarray]:
        """``(steps, values (n_seeds, n_steps))`` of a logged diagnostic averaged over blocks;
        for ``kappa_mean`` the value at initialisation (``init_kappa_<l>_mean``) comes first, at
        step 0."""
        series = []
        for s in self.seeds:
            h = self.history(config, s)
            vals = np.mean([h[f"fiber_bundle/l{l}/{key}"].to_numpy() for l in range(self.n_layers)],
                           axis=0)  # fmt: skip
            if key == "kappa_mean":
                init = np.mean([self.cells[(config, s)][f"init_kappa_{l}_mean"]
                                for l in range(1, self.n_layers + 1)])  # fmt: skip
                vals = np.concatenate([[init], vals])
            series.append(vals)
        steps = list(self.history(config, self.seeds[0])["step"])
        return ([0.0] if key == "kappa_mean" else []) + steps, np.array(series)

    def overview(self) -> pd.DataFrame:
        """Every configuration: validation bpc, training time, the paired bpc difference and the
        time ratio to ``dot``, the last block's effective rank and the attention entropy. A
        configuration that diverged at some seed has no interval (its row says ``diverged``, and
        a ``diverged`` column gives the seeds and steps): its seeds cannot be paired."""
        rows, last = [], self.n_layers
        tcol, tname = self.time
        dot_time = self.per_seed("dot", tcol).mean()
        any_diverged = any(self.diverged(c) for c in self.grid)
        for name in self.grid:
            row: dict[str, str] = {"configuration": name}
            d = self.diverged(name)
            if d:
                row.update({k: "diverged" for k in ("val bpc", tname, "bpc - dot", "time / dot",
                                                    f"erank L{last}", "attention entropy")})  # fmt: skip
                row["diverged"] = f"{len(d)} of {len(self.seeds)} seeds: " + ", ".join(
                    f"seed {s} at step {t}" for s, t in sorted(d.items())
                )
                rows.append(row)
                continue
            tt = self.per_seed(name, tcol)
            row.update({"val bpc": self.interval(name, "val_bpc").format(3),
                        tname: _interval(tt).format(1)})  # fmt: skip
            if name != "dot":
                row["bpc - dot"] = self.paired(name, "dot", "val_bpc").format(3, signed=True)
                row["time / dot"] = f"{tt.mean() / dot_time:.1f}x"
            row[f"erank L{last}"] = self.interval(name, f"erank_{last}").format(2)
            row["attention entropy"] = self.layer_interval(name, "entropy_{l}").format(2)
            if any_diverged:
                row["diverged"] = ""
            rows.append(row)
        return pd.DataFrame(rows).set_index("configuration")

    def kappa_by_type(self, models: Mapping[str, str]) -> pd.DataFrame:
        """Prediction P4 per model and block: CV of ``kappa_t`` after training and at
        initialisation, token-type differences of ``kappa_t`` relative to its mean, and its rank
        correlation with the surprisal, after training and at initialisation."""
        rows = []
        for model, label in models.items():
            for l in range(1, self.n_layers + 1):
                p = f"kappa_{l}_"
                rel = {t: self.per_seed(model, p + t) / self.per_seed(model, p + "mean")
                       for t in ("word_initial", "word_internal", "space")}  # fmt: skip
                rows.append({
                    "model": label, "block": l,
                    "CV trained": self.interval(model, p + "cv").format(3),
                    "CV at init": self.interval(model, "init_" + p + "cv").format(3),
                    "(initial - internal) / mean":
                        _interval(rel["word_initial"] - rel["word_internal"]).format(3, signed=True),
                    "(letters - space) / mean": _interval(
                        (rel["word_initial"] + rel["word_internal"]) / 2 - rel["space"]
                    ).format(3, signed=True),
                    "Spearman trained": self.interval(model, p + "spearman_surprisal").format(3, signed=True),
                    "Spearman at init":
                        self.interval(model, "init_" + p + "spearman_surprisal").format(3, signed=True),
                })  # fmt: skip
        return pd.DataFrame(rows).set_index(["model", "block"])
