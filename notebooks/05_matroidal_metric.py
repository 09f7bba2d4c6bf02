# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 5. Matroidal Mahalanobis attention
#
# The seed (`matroidal-mahalanobis-attention.txt`) replaces the dot-product score by a
# Mahalanobis distance whose metric is built from a fixed sparse *covector matrix*
# $A = [a_1,\dots,a_m] \in \mathbb R^{d\times m}$ and learned nonnegative weights
# $\ell_e = \operatorname{softplus}(\theta_e)$:
#
# $$S_{ij} = -\frac{1}{2\tau}\Big(\sum_{e=1}^m \ell_e\,\big(a_e^\top(z_i - z_j)\big)^2
#   + \varepsilon\,\|z_i - z_j\|^2\Big) = -\frac{(z_i-z_j)^\top M (z_i-z_j)}{2\tau},
# \qquad M = A\,\mathrm{diag}(\ell)\,A^\top + \varepsilon I .$$
#
# $M$ is a sum of rank-one positive semidefinite terms plus a ridge, so it is positive
# definite for any $\theta$: a *metric* by construction, unlike a learned bilinear form
# {cite}`vaswani2017attention`. The seed restricts the columns to graph incidence vectors
# $a_e = e_i - e_j$, whose matrices are totally unimodular {cite}`schrijver1998theory`
# (every square submatrix has determinant $0$ or $\pm 1$), learns only $\theta$, and asks
# whether this structured metric beats a dense learned Mahalanobis metric
# {cite}`weinberger2009distance` and plain dot products in low-data or low-parameter settings.
#
# This chapter (i) checks the three claims that follow from the construction (nonnegative
# coefficients, the rank-one PSD decomposition, unimodular support); (ii) shows that the seed's
# pseudocode, which costs $O(L^2 m)$ memory, is not how the attention should be computed: $M$
# is only $d\times d$, and with a factor $R^\top R = M$ the score is a Euclidean distance between
# $Rz_i$ and $Rz_j$, which the fused SDPA kernel {cite}`dao2022flashattention` computes at the
# cost of dot-product attention, for every $m$; (iii) runs the seed's experiment at the scale
# this machine allows and states whether the hypothesis holds.

# %% tags=["parameters"]
threads = 1  # torch CPU threads (1 is fastest on a shared 2-core machine)
tu_dim = 5  # d of the exhaustive total-unimodularity checks
check_dim = 9  # d of the fast-path checks: 4d is 36, d(d-1)/2, so every family reaches 4d
check_len = 12  # sequence length of the fast-path checks
bench_length = 1024  # L of the in-chapter timing (the shape: B 4, H 8, d 16)
bench_repeats = 5
datasets = ["digits", "ptb-char"]  # CIFAR-10 cannot be downloaded here (see the text)
fractions = [0.01, 0.1, 1.0]  # training-set fractions of the low-data test
seeds = [0, 1, 2]
steps = 80  # optimiser steps per run
batch_size = 32  # digits images per batch
lm_batch_size = 16  # char-PTB windows per batch
seq_len = 64  # characters per char-PTB window
dim = 64  # model width D (matched across variants)
n_heads = 8
head_dim = 16  # d; 16 so that 4d edges fit a simple graph on d nodes
lr = 3e-3
eval_batches = 4  # validation batches at each log step
final_eval_batches = 16  # validation batches at the end (char-PTB; digits use all 450 images)
main_m = 2  # m as a multiple of d for the matroidal model of the main comparison
main_graph = "ring_chords"
slice_dataset = "digits"  # the m, family and pruning slices run on this data set ...
slice_fraction = 0.1  # ... at this training fraction
m_multiples = [1, 2, 4]  # m in units of d: d (the ring), 2d, 4d
families = ["ring_chords", "knn", "random", "sparse_random", "unsigned"]
prune_deltas = [0.5, 0.9, 1.0, 1.1]  # delta as a multiple of the initial weight d / (2m)
sweep_dir = ""  # keep (and reuse) finished runs in this folder; "" runs in a temporary one

# %% tags=["smoke"]
SMOKE = {
    "datasets": ["digits"],
    "fractions": [1.0],
    "seeds": [0, 1],
    "steps": 2,
    "bench_length": 128,
    "bench_repeats": 2,
    "final_eval_batches": 2,
    "m_multiples": [1, 2],
    "families": ["sparse_random"],
    "slice_fraction": 1.0,
    "prune_deltas": [1.0],
}

# %%
import copy
import math
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch
import torch.nn.functional as F
from IPython.display import display

import attention_atlas
from attention_atlas import viz
from attention_atlas.attention.dot import masked_softmax
from attention_atlas.attention.graphs import (
    CONTRAST_FAMILIES,
    GRAPH_FAMILIES,
    covector_matrix,
    graph_edges,
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
from attention_atlas.data import load_char_ptb, load_digits_patches, subset
from attention_atlas.models import ModelConfig, attention_modules
from attention_atlas.stats import mean_ci
from attention_atlas.sweep import make_cells, run_sweep
from attention_atlas.train import TrainConfig, evaluate, train

torch.set_num_threads(threads)
ROOT = Path(attention_atlas.__file__).resolve().parents[2]
t_chapter = time.perf_counter()

# %% [markdown]
# ## 1. Covector matrices and their unimodular support
#
# Five graph families give $A$ with exactly $m$ columns $e_i - e_j$ on $d$ nodes: the ring
# ($m = d$), the ring plus random chords, the circulant $k$-nearest-neighbour graph ($m = kd$),
# the complete graph ($m = d(d-1)/2$) and $m$ random edges. A family that cannot have $m$ edges
# on $d$ nodes is an error, not a silent substitute. Two sparse families that are *not*
# incidence matrices serve as contrast: `unsigned` ($e_i + e_j$ over the ring-plus-chords edges)
# and `sparse_random` (three random $\pm 1$ entries per column).
#
# The checker `is_totally_unimodular` enumerates every square submatrix (after removing
# repeated columns); `is_signed_incidence` is the structural certificate (each column has at
# most one $+1$ and one $-1$), which implies total unimodularity (Poincaré; Heller and
# Tompkins). Below, every incidence family at $d = 5$ for every feasible $m$ passes both,
# and the contrast families fail (an odd cycle of `unsigned` columns has a minor of
# determinant 2).

# %%
rows = []
for family in GRAPH_FAMILIES + CONTRAST_FAMILIES:
    for m in range(tu_dim, tu_dim * (tu_dim - 1) // 2 + 1):
        try:
            A = covector_matrix(family, tu_dim, m, seed=1)
        except ValueError:
            continue
        rows.append(
            {
                "family": family,
                "m": m,
                "signed incidence": is_signed_incidence(A),
                "totally unimodular (exhaustive)": is_totally_unimodular(A),
            }
        )
tu = pd.DataFrame(rows)
incidence = tu[tu.family.isin(GRAPH_FAMILIES)]
contrast = tu[tu.family.isin(CONTRAST_FAMILIES)]
assert incidence["totally unimodular (exhaustive)"].all() and incidence["signed incidence"].all()
assert set(incidence.family) == set(GRAPH_FAMILIES)
assert not contrast["signed incidence"].any()
assert (~contrast["totally unimodular (exhaustive)"]).sum() >= len(contrast) - 1
summary_tu = (
    tu.groupby("family", sort=False)
    .agg(
        m_values=("m", lambda s: f"{s.min()}..{s.max()} ({len(s)})"),
        tu_pass=("totally unimodular (exhaustive)", "sum"),
        certified=("signed incidence", "sum"),
    )
    .reset_index()
)
summary_tu

# %% [markdown]
# The counts of `unsigned` that pass are the bipartite cases (no odd cycle among the chosen
# edges); on five nodes the ring itself is an odd cycle, so it fails. The figure shows the
# covector matrices at the head dimension used later ($d = 16$, $m = 2d$).

# %%
mats = {
    f: covector_matrix(f, head_dim, 2 * head_dim, seed=0)
    for f in ("ring_chords", "knn", "random", "sparse_random")
}
viz.show(
    viz.heatmap_grid(
        mats,
        cols=4,
        colorscale="RdBu",
        title=f"covector matrices A (d={head_dim}, m={2 * head_dim})",
    )
)

# %% [markdown]
# ## 2. The paper's side: nonnegative weights and the rank-one decomposition
#
# $\ell_e = \operatorname{softplus}(\theta_e) \ge 0$ for every $\theta$, so
# $x^\top M x = \sum_e \ell_e (a_e^\top x)^2 + \varepsilon\|x\|^2 \ge \varepsilon \|x\|^2$. We check
# the identity with random $x$ for every family and $m \in \{d, 2d, 4d\}$ at $d = 9$, the
# spectrum bound $\lambda_{\min}(M) \ge \varepsilon$, and that the factor used by the fast path
# reproduces $M$: $R$ is the triangular factor of a QR decomposition of
# $[\mathrm{diag}(\sqrt{\ell})A^\top;\ \sqrt\varepsilon I]$, so $R^\top R = M$ without ever forming
# $M$ (its condition number enters only as a square root).

# %%
torch.manual_seed(0)
D64 = torch.float64
eps = 1e-4


cases = [
    (f, k * check_dim)
    for f in GRAPH_FAMILIES
    for k in (1, 2, 4)
    if graph_family_admits(f, check_dim, k * check_dim)
]
worst = {"decomposition": 0.0, "factor": 0.0, "min_eig_minus_eps": math.inf}
theta_extreme = torch.tensor([-1e3, -50.0, 0.0, 50.0, 1e3], dtype=D64)
assert (matroidal_coefficients(theta_extreme) >= 0).all()
for family, m in cases:
    A = covector_matrix(family, check_dim, m, seed=2, dtype=D64)
    theta = 2 * torch.randn(m, dtype=D64)
    x = torch.randn(64, check_dim, dtype=D64)
    M = matroidal_metric(A, theta, eps)
    quad = torch.einsum("nd,de,ne->n", x, M, x)
    rank_one = ((x @ A) ** 2 * matroidal_coefficients(theta)).sum(-1) + eps * (x * x).sum(-1)
    R = matroidal_factor(A, theta, eps)
    worst["decomposition"] = max(
        worst["decomposition"], float(((quad - rank_one) / quad).abs().max())
    )
    worst["factor"] = max(worst["factor"], float((R.T @ R - M).abs().max() / M.abs().max()))
    worst["min_eig_minus_eps"] = min(
        worst["min_eig_minus_eps"], float(torch.linalg.eigvalsh(M).min()) - eps
    )
assert {f for f, _ in cases} == set(GRAPH_FAMILIES)
assert worst["decomposition"] < 1e-12 and worst["factor"] < 1e-12
assert worst["min_eig_minus_eps"] > -1e-12
viz.markdown(
    f"Over {len(cases)} (family, m) cases: largest relative error of the rank-one decomposition "
    f"{worst['decomposition']:.1e}, of $R^\\top R = M$ {worst['factor']:.1e}; "
    f"$\\lambda_{{\\min}}(M) - \\varepsilon \\ge$ {worst['min_eig_minus_eps']:.1e}."
)

# %% [markdown]
# ## 3. The fast path is the pseudocode
#
# The seed's pseudocode builds $u = A^\top z$, then the $(L, L, m)$ tensor of differences:
# memory quadratic in $L$ times $m$. Since $S_{ij} = -\|Rz_i - Rz_j\|^2/(2\tau)$ and
# $\|y_i\|^2$ is constant along a softmax row,
# $\mathrm{softmax}_j S_{ij} = \mathrm{softmax}_j\big((y_i\cdot y_j - \tfrac12\|y_j\|^2)/\tau\big)$
# with $y = zR^\top$: a dot product plus a per-key bias. On the CPU the bias is passed to the
# flash kernel as a broadcast $(B, H, 1, L)$ additive mask (head dimension stays $d$; the
# textbook alternative, the augmented vectors $[y, 1]\cdot[y, -\tfrac12\|y\|^2]$, make the
# head dimension $d + 1$, which the kernel pays for in full). The backward pass runs the flash
# backward on those augmented vectors, which also returns the gradient of the bias. The cost
# per token is one $d\times d$ map plus SDPA: it does not depend on $m$.
#
# Check: for every family and $m\in\{d,2d,4d\}$ (d = 9), causal and not, the fast path equals
# the pseudocode in float64, and so do the gradients with respect to $z$, $v$ and $\theta$
# (`torch.autograd.gradcheck` on the fast path is in `tests/test_matroidal.py`).

# %%
err_out = err_grad = 0.0
for family, m in cases:
    A = covector_matrix(family, check_dim, m, seed=5, dtype=D64)
    theta = torch.randn(m, dtype=D64, requires_grad=True)
    z = torch.randn(2, check_len, check_dim, dtype=D64, requires_grad=True)
    v = torch.randn(2, check_len, check_dim, dtype=D64, requires_grad=True)
    w = torch.randn(2, check_len, check_dim, dtype=D64)
    for causal in (False, True):
        logits = matroidal_logits(z, A, theta, eps, 0.5)  # the seed's pseudocode
        keep = torch.ones(check_len, check_len, dtype=torch.bool).tril() if causal else None
        ref = masked_softmax(logits, keep) @ v
        fast = matroidal_attention(z, v, A, theta, eps, 0.5, causal=causal)
        err_out = max(err_out, float((fast - ref).detach().abs().max()))
        g_ref = torch.autograd.grad((ref * w).sum(), (z, v, theta))
        g_fast = torch.autograd.grad((fast * w).sum(), (z, v, theta))
        err_grad = max(err_grad, max(float((a - b).abs().max()) for a, b in zip(g_ref, g_fast)))
assert err_out < 1e-10 and err_grad < 1e-10
viz.markdown(
    f"Largest difference between the fast path and the pseudocode over {len(cases)} cases x "
    f"(causal, non-causal): outputs {err_out:.1e}, gradients {err_grad:.1e} (float64)."
)

# %% [markdown]
# **Cost.** A short timing at $L$ = `bench_length` (B = 4, H = 8, d = 16), interleaved with
# SDPA (medians of `bench_repeats` rounds; this machine is shared, so the ratios are noisy).
# The goal is at most 1.35x SDPA forward and 1.6x forward+backward for every $m$.
# `benchmarks/bench_matroidal.py` repeats the measurement with more rounds, the pseudocode
# reference and peak memory against $L$; the chapter shows its JSON when it exists.


# %%
def timed(fn, repeats):
    fn()
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


B, H, d = 4, 8, head_dim
zq, kk, vv = (torch.randn(B, H, bench_length, d, requires_grad=True) for _ in range(3))
forward = {"dot SDPA": lambda: F.scaled_dot_product_attention(zq, kk, vv)}
for k in m_multiples:
    A_b = covector_matrix("ring" if k == 1 else "ring_chords", d, k * d)
    th_b = torch.zeros(k * d, requires_grad=True)
    forward[f"matroidal m={k}d"] = lambda A_b=A_b, th_b=th_b: matroidal_attention(
        zq, vv, A_b, th_b, eps, d**0.5 / 2
    )
fns = {(n, "forward"): f for n, f in forward.items()}
fns.update(
    {(n, "forward+backward"): (lambda f=f: f().sum().backward()) for n, f in forward.items()}
)
samples = {key: [] for key in fns}
for f in fns.values():
    f()
for _ in range(bench_repeats):
    for key, f in fns.items():
        samples[key] += timed(f, 1)
med = {key: statistics.median(t) for key, t in samples.items()}
bench_here = pd.DataFrame(
    {
        f"{kind} ratio": {n: med[(n, kind)] / med[("dot SDPA", kind)] for n in forward}
        for kind in ("forward", "forward+backward")
    }
    | {
        f"{kind} ms": {n: 1e3 * med[(n, kind)] for n in forward}
        for kind in ("forward", "forward+backward")
    }
)
bench_file = ROOT / "artifacts" / "bench_matroidal.json"
if bench_file.exists():
    import json

    bench = json.loads(bench_file.read_text())
    bench_table = pd.DataFrame(
        {
            "forward": bench["ratio_forward"],
            "forward (no grad)": bench["ratio_forward_no_grad"],
            "forward+backward": bench["ratio_forward_backward"],
        }
    )
    viz.markdown(
        f"From `{bench['command']}` (threads={bench['threads']}, torch {bench['torch']}): "
        f"ratios to SDPA at B=4, H=8, L={bench['shape']['L']}, d={bench['shape']['d']}; "
        f"the seed's pseudocode took {bench.get('ratio_reference_forward', float('nan')):.0f}x "
        "SDPA's forward time there."
    )
    display(bench_table)
    mem = pd.DataFrame(bench["peak_bytes_forward_backward"]) / 2**20
    mem.index = mem.index.astype(int)
    mem.index.name = "L"
    top = mem.sort_index().iloc[-2:]
    growth = np.log(top.iloc[1] / top.iloc[0]) / np.log(top.index[1] / top.index[0])
    assert (growth < 1.2).all(), f"memory grows faster than linearly in L: {growth.to_dict()}"
    viz.markdown(
        "Peak memory growth (MiB) of one forward+backward against $L$ (fresh process each): "
        "both grow linearly in $L$; the pseudocode's $(L, L, m)$ tensor alone would take "
        f"{4 * 8 * 1024**2 * 64 * 4 / 2**30:.0f} GiB in float32 at L = 1024, m = 64."
    )
    display(mem)
else:
    viz.markdown(
        "No `artifacts/bench_matroidal.json` yet: run "
        "`python benchmarks/bench_matroidal.py --out artifacts/bench_matroidal.json`."
    )
bench_here

# %% [markdown]
# ## 4. The seed's experiment
#
# A 2-layer, 8-head pre-norm Transformer from the harness (`attention_atlas.models`), width
# $D$ = `dim`, head dimension $d$ = `head_dim`, trained with AdamW for `steps` steps on
#
# * **character-level Penn Treebank** (causal LM, bits per character, `seq_len`-character
#   windows), and
# * **scikit-learn's 8x8 digits as 2x2 patch tokens** (16 tokens, 10 classes, accuracy). The
#   seed names CIFAR-10; it cannot be downloaded on this machine, and the patch-token path is
#   generic (`ArrayTask` with `(N, P, patch_dim)` arrays), so CIFAR-10 drops in where it exists.
#
# Variants at matched width and head dimension: `dot` (SDPA), `mahalanobis` (dense
# $M_h = W_hW_h^\top + \varepsilon I$ per head, $W_h$ initialised to $I$: $Hd^2$ metric
# parameters per layer) and `matroidal` ($M_h = A\,\mathrm{diag}(\ell_h)A^\top + \varepsilon I$,
# $\ell_h$ initialised to $d/(2m)$ so that $\mathrm{tr}\,M_h \approx d$: $Hm$ parameters per
# layer). All distance variants use $\tau = \sqrt d$, the dot-product scale when $M = I$. The
# metric parameters are a tiny share of each model, so parameter counts match to within a few
# percent (the table reports them).
#
# The full cross-product (3 variants x 2 data sets x 3 fractions x 3 values of m x 5 families
# x pruning x 3 seeds) is several hundred runs; on two shared cores this chapter runs these
# slices instead, each with every seed:
#
# 1. **main**: dot vs dense vs matroidal ($m = 2d$, ring plus chords) on both data sets at
#    every training fraction;
# 2. **m**: matroidal with $m \in \{d, 2d, 4d\}$ on the slice data set and fraction;
# 3. **family**: the graph family at $m = 2d$, including the two non-incidence contrasts;
# 4. **pruning**: each trained matroidal model of slices 2 and 3, evaluated after removing
#    columns with $\ell_e < \delta$ (no retraining), $\delta$ a multiple of the initial weight.
#
# Measured per run: validation loss (and bpc or accuracy), the variance and coefficient of
# variation of the gradient norm after warm-up (smoothness), non-finite attention logits
# (from the explicit path on validation sequences at each log step) and outputs, parameter
# counts (total and metric), attention FLOPs (FlopCounterMode, the attention core without
# projections) and training wall time.

# %%
DATA = {}
for name in datasets:
    DATA[name] = load_digits_patches() if name == "digits" else load_char_ptb()
grad_norms: dict[tuple, list[float]] = {}
prune_records: list[dict] = []


def run_cell(params: dict, seed: int) -> dict:
    data = DATA[params["dataset"]]
    if params["fraction"] < 1:
        data = subset(data, params["fraction"], seed=seed)
    mcfg = ModelConfig(
        dim=dim,
        n_layers=2,
        n_heads=n_heads,
        head_dim=head_dim,
        attention=params["attention"],
        attention_options=dict(params["options"]),
    )
    warm = max(1, steps // 10)
    tcfg = TrainConfig(
        steps=steps,
        batch_size=batch_size if params["dataset"] == "digits" else lm_batch_size,
        seq_len=seq_len,
        lr=lr,
        warmup_steps=warm,
        log_every=max(1, steps // 3),
        eval_batches=eval_batches,
        final_eval_batches=final_eval_batches if params["dataset"] != "digits" else None,
        seed=seed,
        progress=False,
        effective_rank=False,
    )
    norms: list[float] = []
    res = train(mcfg, tcfg, data, callbacks=[lambda step, info: norms.append(info["grad_norm"])])
    after = np.array(norms[warm:] or norms)
    counts = res.record["param_counts"]
    out = {
        "val_loss": res.final["val_loss"],
        "val_acc": res.final["val_acc"],
        "val_bpc": res.final.get("val_bpc", math.nan),
        "grad_norm_var": float(after.var()),
        "grad_norm_cv": float(after.std() / max(after.mean(), 1e-12)),
        "nonfinite_logits": float(res.history["nonfinite_logits"].sum()),
        "nonfinite_out": float(res.history["nonfinite_out"].sum()),
        "params_total": counts["total"],
        "params_metric": counts["metric"],
        "attn_flops_fwd": res.record["flops"]["forward_attention_core"],
        "attn_flops_train": res.record["flops"]["train_step_attention_core"],
        "train_time_s": res.final["train_time_s"],
    }
    mods = attention_modules(res.model)
    with torch.no_grad():  # how far training moved the metric from its initial value
        if params["attention"] == "matroidal":
            w0 = head_dim / (2 * params["options"]["m"])
            ratio = torch.cat([a.coefficients().flatten() for a in mods]) / w0
            out["metric_drift"] = float((ratio - 1).abs().max())  # max |l_e / l_e(0) - 1|
        elif params["attention"] == "mahalanobis":
            eye = torch.eye(head_dim)
            out["metric_drift"] = max(float((a.W - eye).abs().max()) for a in mods)
    if params["attention"] == "matroidal" and params.get("prune"):
        m = params["options"]["m"]
        w0 = head_dim / (2 * m)
        for rel in prune_deltas:
            model = copy.deepcopy(res.model)
            for block in model.blocks:
                block.attn = block.attn.pruned(rel * w0)
            ev = evaluate(
                model, data, batch_size=32, seq_len=seq_len,
                max_batches=final_eval_batches if params["dataset"] != "digits" else None,
            )  # fmt: skip
            kept = sum(a.active_columns() for a in attention_modules(model))
            out[f"pruned_val_loss@{rel:g}"] = ev["loss"]
            out[f"pruned_kept@{rel:g}"] = kept / (2 * n_heads * m)
    return out


def matroidal(m_mult: int, graph: str) -> dict:
    m = m_mult * head_dim
    return {"m": m, "graph": "ring" if m_mult == 1 else graph}


configs: dict[str, dict] = {}
for ds in datasets:
    for frac in fractions:
        for att, opts in (
            ("dot", {}),
            ("mahalanobis", {}),
            ("matroidal", matroidal(main_m, main_graph)),
        ):
            configs[f"main/{ds}/{frac:g}/{att}"] = {
                "slice": "main", "dataset": ds, "fraction": frac, "attention": att,
                "options": opts, "prune": att == "matroidal",
            }  # fmt: skip
for k in m_multiples:
    configs[f"m/{k}d"] = {
        "slice": "m", "dataset": slice_dataset, "fraction": slice_fraction,
        "attention": "matroidal", "options": matroidal(k, main_graph), "prune": True,
    }  # fmt: skip
for fam in families:
    configs[f"family/{fam}"] = {
        "slice": "family", "dataset": slice_dataset, "fraction": slice_fraction,
        "attention": "matroidal", "options": matroidal(main_m, fam), "prune": True,
    }  # fmt: skip
# identical configurations (e.g. the main matroidal model on the slice data) run once
unique: dict[str, dict] = {}
alias: dict[str, str] = {}
for name, p in configs.items():
    key = repr(sorted((k, repr(v)) for k, v in p.items() if k != "slice"))
    alias[name] = unique.setdefault(key, {"name": name, "params": p})["name"]
to_run = {v["name"]: v["params"] for v in unique.values()}
cells = make_cells(to_run, seeds)
print(
    f"{len(configs)} configurations ({len(to_run)} distinct) x {len(seeds)} seeds = {len(cells)} runs"
)
out_dir = Path(sweep_dir) if sweep_dir else Path(tempfile.mkdtemp(prefix="ch05_sweep_"))
t0 = time.perf_counter()
raw = run_sweep(cells, run_cell, out_dir, log=None)
sweep_s = time.perf_counter() - t0
if not sweep_dir:
    shutil.rmtree(out_dir)
print(f"sweep: {len(cells)} runs in {sweep_s:.0f} s")
frames = []
for name, p in configs.items():
    rows = raw[raw.config == alias[name]].copy()
    rows["config"] = name
    for k in ("slice", "dataset", "fraction", "attention"):
        rows[k] = p[k]
    rows["m"] = p["options"].get("m", 0)
    rows["graph"] = p["options"].get("graph", "")
    frames.append(rows)
runs = pd.concat(frames, ignore_index=True)
assert len(runs) == len(configs) * len(seeds)
assert runs[["val_loss", "grad_norm_var"]].notna().all().all()

# %% [markdown]
# ### Parameters and attention FLOPs
#
# Metric parameters per model (two layers): dense $2Hd^2$, matroidal $2Hm$. The attention
# FLOPs (forward, attention core) are those of the kernels actually run.


# %%
def ci_text(values) -> str:
    m, lo, hi = mean_ci(np.asarray(values, dtype=float))
    if math.isnan(lo):
        return f"{m:.4g}"
    return f"{m:.4g} [{lo:.4g}, {hi:.4g}]"


first = runs[runs.slice == "main"].drop_duplicates("attention")
params_table = first.set_index("attention")[
    ["params_total", "params_metric", "attn_flops_fwd", "attn_flops_train", "m"]
]
mat_p = int(params_table.loc["matroidal", "params_metric"])
den_p = int(params_table.loc["mahalanobis", "params_metric"])
assert mat_p == 2 * n_heads * main_m * head_dim and den_p == 2 * n_heads * head_dim**2
spread = params_table.params_total.max() / params_table.params_total.min() - 1
assert spread < 0.05  # "approximately matched parameter count"
viz.markdown(
    f"Total parameters differ by at most {100 * spread:.1f}% between the variants; the "
    f"matroidal metric has {mat_p} parameters against {den_p} for the dense one "
    f"({den_p / mat_p:.0f}x fewer)."
)
params_table

# %% [markdown]
# ### Main comparison: validation loss across training fractions

# %%
main = runs[runs.slice == "main"]
metric_col = {"digits": "val_acc", "ptb-char": "val_bpc"}
rows = []
for (ds, frac, att), g in main.groupby(["dataset", "fraction", "attention"], sort=False):
    rows.append(
        {
            "dataset": ds,
            "fraction": frac,
            "attention": att,
            "val_loss": ci_text(g.val_loss),
            metric_col[ds]: ci_text(g[metric_col[ds]]),
            "grad-norm CV": ci_text(g.grad_norm_cv),
            "grad-norm var": ci_text(g.grad_norm_var),
            "nonfinite": int(g.nonfinite_logits.sum() + g.nonfinite_out.sum()),
            "train s": f"{g.train_time_s.mean():.1f}",
        }
    )
main_table = pd.DataFrame(rows)
colors = {"dot": "#636efa", "mahalanobis": "#ef553b", "matroidal": "#00cc96"}
fig = go.Figure()
for ds in datasets:
    for att in ("dot", "mahalanobis", "matroidal"):
        g = main[(main.dataset == ds) & (main.attention == att)]
        stats = [mean_ci(g[g.fraction == f].val_loss.to_numpy()) for f in fractions]
        mean = [s[0] for s in stats]
        err = [0 if math.isnan(s[2]) else s[2] - s[0] for s in stats]
        fig.add_trace(
            go.Scatter(
                x=fractions, y=mean, error_y={"type": "data", "array": err},
                name=f"{att} ({ds})", line={"color": colors[att], "dash": "solid" if ds == datasets[0] else "dot"},
            )
        )  # fmt: skip
fig.update_xaxes(type="log", title="training fraction")
fig.update_yaxes(title="validation loss (nats), mean and 95% interval over seeds")
fig.update_layout(title="Validation loss against training-set fraction")
viz.show(fig)
main_table

# %% [markdown]
# ### Sweeps: number of columns m and graph family (slice data set and fraction)


# %%
def slice_table(df, by):
    rows = []
    for key, g in df.groupby(by, sort=False):
        rows.append(
            {
                by: key,
                "val_loss": ci_text(g.val_loss),
                "val_acc": ci_text(g.val_acc),
                "grad-norm CV": ci_text(g.grad_norm_cv),
                "metric params": int(g.params_metric.iloc[0]),
                "attn FLOPs (fwd)": int(g.attn_flops_fwd.iloc[0]),
                "train s": f"{g.train_time_s.mean():.1f}",
            }
        )
    return pd.DataFrame(rows)


m_table = slice_table(runs[runs.slice == "m"], "m")
fam_table = slice_table(runs[runs.slice == "family"], "graph")
flops_by_m = runs[runs.slice == "m"].groupby("m").attn_flops_fwd.first()
assert flops_by_m.nunique() == 1  # the fast path's attention FLOPs do not depend on m
display(m_table)
fam_table

# %% [markdown]
# ### Pruning (after training, no retraining)
#
# Columns with $\ell_e < \delta$ are removed per head (`MatroidalAttention.pruned`); the pruned
# model is exact for the kept columns (`tests/test_matroidal.py` checks it to 1e-10). With
# $\delta$ below the initial weight, the question is whether training pushed some weights down.

# %%
prune_cols = [c for c in runs.columns if c.startswith("pruned_val_loss@")]
prows = []
for name, g in runs[runs.slice.isin(["m", "family"])].groupby("config", sort=False):
    for c in prune_cols:
        rel = c.split("@")[1]
        if g[c].isna().all():
            continue
        prows.append(
            {
                "config": name,
                "delta / initial weight": float(rel),
                "kept columns": ci_text(g[f"pruned_kept@{rel}"]),
                "val_loss unpruned": ci_text(g.val_loss),
                "val_loss pruned": ci_text(g[c]),
                "change": ci_text(g[c] - g.val_loss),
            }
        )
prune_table = pd.DataFrame(prows)
viz.markdown(
    "Pruning removes the columns whose weight is below $\\delta$: below the initial weight, "
    "only columns that training pushed down; above it, every column that training did not "
    "push up (with all columns gone, only the ridge $\\varepsilon I$ is left and the logits "
    "are nearly uniform). Mean kept fraction and mean loss change, by $\\delta$ / initial "
    "weight, over all pruned models: "
    + "; ".join(
        f"{rel}: kept {runs[f'pruned_kept@{rel}'].mean():.2f}, "
        f"change {(runs[f'pruned_val_loss@{rel}'] - runs.val_loss).mean():+.3f} nats"
        for rel in [c.split("@")[1] for c in prune_cols]
    )
    + "."
)
prune_table

# %% [markdown]
# ## 5. Verdict at this scale
#
# The seed's success criterion, cell by cell against the dense Mahalanobis baseline:
# (a) equal or better validation loss; (b) fewer metric parameters; (c) smoother training
# (gradient-norm coefficient of variation after warm-up); (d) no loss of stability (no
# non-finite logit or output). Runs with the same seed see the same data subset and batch
# order, so each comparison uses the *paired* difference over seeds (matroidal minus dense)
# with its 95% interval: "better" or "worse" when the interval excludes zero, "equal within
# +-h" when it contains zero, where h is the interval's half-width (the resolution of the
# test). The hypothesis also says the benefit should be largest in the low-data regime.


# %%
def paired(a: pd.DataFrame, b: pd.DataFrame, col: str) -> tuple[float, float, float]:
    """Mean and 95% interval of a[col] - b[col] over the seeds both have."""
    both = a[["seed", col]].merge(b[["seed", col]], on="seed", suffixes=("_a", "_b"))
    return mean_ci((both[f"{col}_a"] - both[f"{col}_b"]).to_numpy())


def call(mean: float, lo: float, hi: float) -> str:
    """Lower is better for every quantity compared here."""
    if math.isnan(lo):
        return f"{mean:+.3f} (one seed)"
    if hi < 0:
        return f"better ({mean:+.3f})"
    if lo > 0:
        return f"worse ({mean:+.3f})"
    return f"equal within +-{(hi - lo) / 2:.3f}"


verdict_rows = []
for (ds, frac), g in main.groupby(["dataset", "fraction"], sort=False):
    mat, den, dot = (g[g.attention == a] for a in ("matroidal", "mahalanobis", "dot"))
    dl = paired(mat, den, "val_loss")
    dc = paired(mat, den, "grad_norm_cv")
    dd = paired(mat, dot, "val_loss")
    stable = int(mat.nonfinite_logits.sum() + mat.nonfinite_out.sum()) == 0
    fewer = int(mat.params_metric.iloc[0]) < int(den.params_metric.iloc[0])
    loss_call, cv_call = call(*dl), call(*dc)
    fails = loss_call.startswith("worse") or cv_call.startswith("worse") or not stable
    verdict_rows.append(
        {
            "dataset": ds,
            "fraction": frac,
            "(a) loss vs dense": loss_call,
            "(b) metric params": f"{int(mat.params_metric.iloc[0])} vs {int(den.params_metric.iloc[0])}",
            "(c) grad-norm CV vs dense": cv_call,
            "(d) stable": stable,
            "criterion": "fails" if fails or not fewer else "holds",
            "loss vs dot": call(*dd),
            "_dloss": dl[0],
            "_better": loss_call.startswith("better"),
            "_half": (dl[2] - dl[1]) / 2 if not math.isnan(dl[1]) else math.nan,
        }
    )
verdict = pd.DataFrame(verdict_rows)
assert (verdict["(b) metric params"].str.split(" vs ").map(lambda t: int(t[0]) < int(t[1]))).all()
n_hold = int((verdict.criterion == "holds").sum())
n_better = int(verdict._better.sum())
gap = verdict.groupby("fraction")["_dloss"].mean()
low, high = min(fractions), max(fractions)
drift = runs.groupby("attention").metric_drift.max()
viz.markdown(
    f"The criterion holds in **{n_hold} of {len(verdict)}** (data set, fraction) cells, but the "
    f"matroidal metric is detectably *better* than the dense one in **{n_better}**: in the "
    'others "equal" means only that the difference is smaller than the test\'s resolution '
    f"(median half-width {np.nanmedian(verdict._half):.3f} nats). Mean paired loss gap "
    f"matroidal - dense: {gap.loc[low]:+.3f} nats at fraction {low:g} and "
    f"{gap.loc[high]:+.3f} at {high:g}. Training moved the metrics little: the largest "
    f"relative change of a matroidal weight $\\ell_e$ was {drift.get('matroidal', math.nan):.2f}, "
    f"the largest change of a dense $W$ entry {drift.get('mahalanobis', math.nan):.2f}. "
    f"Runs: {len(runs)} ({len(cells)} distinct), {steps} steps each, {len(seeds)} seeds, "
    f"sweep time {sweep_s:.0f} s."
)
verdict.drop(columns=[c for c in verdict.columns if c.startswith("_")])

# %%
n_bad = {
    a: int(g.nonfinite_logits.sum() + g.nonfinite_out.sum()) for a, g in runs.groupby("attention")
}
share = mat_p / int(params_table.loc["matroidal", "params_total"])
failed = verdict[verdict.criterion == "fails"]
low_better = verdict[(verdict.fraction == low) & verdict._better]
if len(failed):
    status = "contradicted in " + ", ".join(
        f"{r.dataset} at {r.fraction:g}" for r in failed.itertuples()
    )
elif n_better == 0:
    status = (
        "neither supported nor contradicted: the structured metric matches the dense one "
        "within the resolution of the test everywhere, with fewer metric parameters, and "
        "shows no detectable advantage in the low-data regime"
    )
else:
    status = f"supported in {n_better} cell(s) ({len(low_better)} of them at fraction {low:g})"
viz.markdown(
    f"**Verdict.** At this scale the seed's hypothesis is {status}. "
    f"The matroidal metric has {mat_p} parameters ({100 * share:.2f}% of the model) against "
    f"{den_p} for the dense one. Non-finite logits or outputs over all runs, by variant: "
    f"{n_bad}; with none anywhere, stability does not discriminate between the variants here.\n\n"
    f"**What this does and does not show.** Two layers, $D$ = {dim}, {steps} steps: runs this "
    "short leave the learned metric weights close to their initial values (see the drift "
    "above), so the comparison is mostly between fixed metrics of the same scale, and it can "
    "detect a large effect of the structure, not a small one. Longer runs are one command "
    "away, e.g. `python -m attention_atlas notebooks run 05_matroidal_metric -p steps 1000`. "
    "The fast path makes the structured metric cost about what dot-product attention costs "
    "(section 3), so that larger experiment is affordable; the seed's pseudocode is not."
)

# %%
print(f"chapter time: {time.perf_counter() - t_chapter:.0f} s")
