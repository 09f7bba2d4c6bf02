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
# # 3. Low-rank geometry and its real cost
#
# Section 4 of {cite}`song2026riemannian` argues that low-rank metrics $g_t = I + U_t U_t^\top$
# make Riemannian attention cheap:
#
# * **Proposition 4.1** (Woodbury): $g_t^{-1} = I - U_t (I_r + U_t^\top U_t)^{-1} U_t^\top$,
#   $O(d r^2)$ instead of $O(d^3)$ (eq. 14).
# * **Proposition 4.2**: the squared distance under $g_{ij}$ splits into a Euclidean part and
#   two metric parts (eq. 15), each of which splits further (eq. 16):
#   $\lVert U_i^\top(q_i - k_j)\rVert^2 = \lVert U_i^\top q_i\rVert^2 + \lVert U_i^\top k_j\rVert^2 -
#   2 (U_i^\top q_i)\cdot(U_i^\top k_j)$, with "the pairwise term requiring $O(r)$ per pair".
# * **Proposition 4.3**: score computation costs $O(BL^2 d) + O(BL^2 r)$, an overhead ratio
#   $O(r/d) \ll 1$ over dot-product attention.
#
# The identities are right; the cost claim is not. $U_i^\top k_j$ pairs token $i$'s metric with
# token $j$'s key, so it cannot be computed per token: it is an $r$-vector **per pair**, $O(d r)$
# work, and so is $U_j^\top q_i$. The honest count is $(2r + 1) d$ multiply-adds per pair
# against $d$ for a dot product: an overhead of about $2r$, not $r/d$. This chapter checks the
# identities in float64, then measures.

# %% tags=["parameters"]
lengths = [128, 256, 512]  # L of the cost-versus-length sweep (d 16, r 4)
head_dims = [8, 16, 32, 64]  # d of the cost-versus-width sweep (L 256, r 4)
metric_ranks = [1, 2, 4, 8, 16]  # r of the cost-versus-rank sweep (L 256, d 32)
marginal_dims = [16, 32, 64, 128]  # d at which the cost of one more metric rank is measured
reps = 5  # timing rounds (interleaved, medians; see attention_atlas.bench)
live_length = 512  # L of the live geodesic_attention vs SDPA measurement (B 1, H 4)
woodbury_tokens = 8  # tokens in the Woodbury vs dense solve comparison (d 1024, r 8)
threads = 1  # torch threads for the timings (one thread: stable ratios on a shared machine)
seed = 0

# %% tags=["smoke"]
SMOKE = {
    "lengths": [128, 256],
    "head_dims": [16, 32],
    "metric_ranks": [1, 16],
    "marginal_dims": [16, 128],
    "reps": 2,
    "live_length": 128,
    "woodbury_tokens": 1,
}

# %%
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch
import torch.nn.functional as F

from attention_atlas import viz
from attention_atlas.attention.riemannian import (
    augmented_dim,
    geodesic_attention,
    geodesic_scores,
    geodesic_scores_augmented,
    geodesic_scores_decomposed,
    geodesic_scores_dense,
)
from attention_atlas.bench import compare
from attention_atlas.linalg import (
    metric_dense,
    metric_inverse_apply,
    metric_inverse_dense,
    woodbury_inverse,
)
from attention_atlas.notebooks import repo_root

torch.set_num_threads(threads)
gen = torch.Generator().manual_seed(seed)
F64 = torch.float64


def rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


# %% [markdown]
# ## The identities, in float64
#
# Woodbury (eq. 14) against a dense inverse, and the distance decompositions (eqs. 15, 16, and
# the augmented factorisation of chapter 1) against the definition with every $g_{ij}$ formed.

# %%
rows = []
for d, r in [(4, 1), (16, 2), (64, 4), (256, 8), (512, 16)]:
    U = torch.randn(4, d, r, generator=gen, dtype=F64) / math.sqrt(d) * 2
    x = torch.randn(4, d, generator=gen, dtype=F64)
    dense_inv = metric_inverse_dense(U)
    rows.append(
        {
            "d": d, "r": r,
            "woodbury_matrix_vs_dense_inverse": rel(woodbury_inverse(U), dense_inv),
            "metric_inverse_apply_vs_dense_solve": rel(
                metric_inverse_apply(U, x), torch.linalg.solve(metric_dense(U), x.unsqueeze(-1)).squeeze(-1)
            ),
        }
    )  # fmt: skip
wood = pd.DataFrame(rows)
assert (wood.drop(columns=["d", "r"]) < 1e-10).all().all()
wood

# %%
rows = []
for L, d, r in [(8, 3, 1), (16, 8, 2), (24, 16, 4)]:
    q, k = (torch.randn(2, L, d, generator=gen, dtype=F64) for _ in range(2))
    U = torch.randn(2, L, d, r, generator=gen, dtype=F64) * 0.7
    ref = geodesic_scores_dense(q, k, U, 1.3)  # every g_ij formed: the definition
    rows.append(
        {
            "L": L, "d": d, "r": r,
            "eq15_vs_definition": rel(geodesic_scores(q, k, U, 1.3), ref),
            "eq16_vs_definition": rel(geodesic_scores_decomposed(q, k, U, 1.3), ref),
            "augmented_vs_definition": rel(geodesic_scores_augmented(q, k, U, 1.3), ref),
        }
    )  # fmt: skip
ident = pd.DataFrame(rows)
assert (ident.drop(columns=["L", "d", "r"]) < 1e-10).all().all()
ident

# %% [markdown]
# ## Counting the work per pair
#
# | way to compute $S_{ij}$ | work per pair (multiply-adds) | memory |
# | --- | --- | --- |
# | dot product $q_i \cdot k_j$ | $d$ | $L^2$ |
# | eq. (15), differences materialised | $d + 2 r d$ (project every $q_i - k_j$) | $L^2 (d + 2r)$ |
# | eq. (16), per-token parts precomputed | $d + 2 r d$ ($U_i^\top k_j$, $U_j^\top q_i$) $+\,4r$ | $L^2 \cdot 2r$ |
# | augmented features (chapter 1) | $d^2 + 3d + 1$, one GEMM | $L (d^2 + 3d + 1)$ |
# | paper's claim (Prop. 4.3) | $d + r$ | |
#
# Eq. (16) removes nothing that grows with $L^2$: its "pairwise term"
# $(U_i^\top q_i)\cdot(U_i^\top k_j)$ is $O(r)$ only once $U_i^\top k_j$ is known, and that vector
# is itself a pair quantity costing $O(d r)$. The term $\lVert U_i^\top k_j\rVert^2$ needs the same
# vector. The theorem of chapter 1 says why no per-token precomputation can remove it: a
# separable form needs $d(d+1)/2$ dimensions for each of the two quadratic terms.

# %%
for_table = []
for d in (16, 64, 128):
    for r in (4, 8):
        for_table.append(
            {
                "d": d, "r": r, "dot": d, "paper_claim_d_plus_r": d + r,
                "direct_2rd_plus_d": (2 * r + 1) * d, "augmented": augmented_dim(d),
                "direct_over_dot": 2 * r + 1, "paper_over_dot": round(1 + r / d, 3),
            }
        )  # fmt: skip
pd.DataFrame(for_table)

# %% [markdown]
# The arithmetic itself can be measured exactly: PyTorch's FLOP counter
# (`torch.utils.flop_counter.FlopCounterMode`) counts the multiply-adds of every matrix
# product an implementation runs (elementwise work is not counted). Per pair, relative to a
# dot-product score:

# %%
from torch.utils.flop_counter import FlopCounterMode


def matmul_flops(fn, *args):
    with FlopCounterMode(display=False) as counter:
        fn(*args)
    return counter.get_total_flops()


flop_rows = []
L_count = 256
for d in (16, 32, 64, 128):
    for r in (1, 4, 8, 16):
        q, k = (torch.randn(1, 1, L_count, d, generator=gen) for _ in range(2))
        U = torch.randn(1, 1, L_count, d, r, generator=gen)
        dot_flops = matmul_flops(lambda q, k: q @ k.transpose(-1, -2), q, k)
        eq16 = matmul_flops(lambda q, k, U: geodesic_scores_decomposed(q, k, U, 1.0), q, k, U)
        flop_rows.append(
            {
                "d": d, "r": r, "eq16_over_dot": eq16 / dot_flops,
                "count_2r_plus_1": 2 * r + 1, "paper_1_plus_r_over_d": 1 + r / d,
            }
        )  # fmt: skip
flops = pd.DataFrame(flop_rows)
# per pair: d for q.k, r d for U_i^T k_j, r d for U_j^T q_i (+ per-token terms, O(1/L))
assert np.allclose(flops["eq16_over_dot"], flops["count_2r_plus_1"], rtol=0.05)
flops.pivot_table(index="d", columns="r", values="eq16_over_dot").round(2)

# %%
viz.markdown(
    f"The counted matrix-product work of the eq. (16) scores is "
    f"{flops['eq16_over_dot'].min():.2f} to {flops['eq16_over_dot'].max():.2f} times that of the "
    f"dot product over this grid, equal to $2r + 1$ within "
    f"{100 * float(((flops['eq16_over_dot'] - flops['count_2r_plus_1']).abs() / flops['count_2r_plus_1']).max()):.1f}% "
    f"for every $d$; Proposition 4.3's count $1 + r/d$ would give "
    f"{flops['paper_1_plus_r_over_d'].min():.2f} to {flops['paper_1_plus_r_over_d'].max():.2f}."
)

# %% [markdown]
# ## Measured cost of the scores
#
# Score matrices only (no softmax), float32, `threads` torch threads; every time is an
# interleaved median against the dot product `q @ k.T` on the same inputs
# (`attention_atlas.bench.compare`, forward only). Batch 1, 4 heads.


# %%
def score_fns(tau):
    return {
        "dot": lambda q, k, U: q @ k.transpose(-1, -2),
        "eq15_materialised": lambda q, k, U: geodesic_scores(q, k, U, tau),
        "eq16_decomposed": lambda q, k, U: geodesic_scores_decomposed(q, k, U, tau),
        "augmented_gemm": lambda q, k, U: geodesic_scores_augmented(q, k, U, tau),
    }


def score_inputs(L, d, r):
    q, k = (torch.randn(1, 4, L, d, generator=gen) for _ in range(2))
    U = torch.randn(1, 4, L, d, r, generator=gen) / math.sqrt(d)
    return q, k, U


def measure(L, d, r):
    res = compare(score_fns(math.sqrt(2 * d)), "dot", score_inputs(L, d, r), reps=reps, backward=False, memory=False)  # fmt: skip
    return {
        name: {"ms": 1e3 * v["forward"]["median_s"], "ratio": v["forward"]["ratio_median"]}
        for name, v in res["results"].items()
    }


cost_rows = []
for L in lengths:
    for name, v in measure(L, 16, 4).items():
        cost_rows.append({"sweep": "L", "L": L, "d": 16, "r": 4, "path": name, **v})
for d in head_dims:
    for name, v in measure(256, d, 4).items():
        cost_rows.append({"sweep": "d", "L": 256, "d": d, "r": 4, "path": name, **v})
for r in metric_ranks:
    for name, v in measure(256, 32, r).items():
        cost_rows.append({"sweep": "r", "L": 256, "d": 32, "r": r, "path": name, **v})
cost = pd.DataFrame(cost_rows)
cost.pivot_table(index=["sweep", "L", "d", "r"], columns="path", values="ratio").round(2)

# %%
figs = {}
for sweep, col, title in [
    ("L", "L", "time against L (d = 16, r = 4)"),
    ("d", "d", "time against d (L = 256, r = 4)"),
    ("r", "r", "time against r (L = 256, d = 32)"),
]:
    part = cost[cost["sweep"] == sweep]
    series = {name: g.sort_values(col)["ms"].to_numpy() for name, g in part.groupby("path")}
    xs = np.sort(part[col].unique())
    fig = viz.loglog(xs, series, title=title, xlabel=col, ylabel="median ms")
    viz.show(fig)
    figs[sweep] = {name: viz.loglog_slope(xs, ys) for name, ys in series.items()}
slopes = pd.DataFrame(figs).T
slopes

# %% [markdown]
# Growth with $r$ alone cannot separate "$O(r)$ per pair with a large constant" from
# "$O(d r)$ per pair": both grow linearly in $r$. What separates them is how the cost of **one
# more unit of metric rank** depends on $d$. Under Proposition 4.3 it does not depend on $d$
# (the pairwise metric work is $O(r)$); under the $(2r + 1) d$ count it grows in proportion to
# $d$. We time the eq. (16) scores at $r = 1$ and $r = 16$ for each $d$ (same $L = 256$,
# interleaved in one comparison) and take the marginal cost $(t_{16} - t_1) / 15$.

# %%
marg_rows = []
for d in marginal_dims:
    q, k = (torch.randn(1, 4, 256, d, generator=gen) for _ in range(2))
    u1, u16 = (torch.randn(1, 4, 256, d, r, generator=gen) / math.sqrt(d) for r in (1, 16))
    res = compare(
        {
            "dot": lambda q=q, k=k: q @ k.transpose(-1, -2),
            "r=1": lambda q=q, k=k, u=u1: geodesic_scores_decomposed(q, k, u, 1.0),
            "r=16": lambda q=q, k=k, u=u16: geodesic_scores_decomposed(q, k, u, 1.0),
        },
        "dot", (), reps=reps, backward=False, memory=False,
    )  # fmt: skip
    t = {n: 1e3 * v["forward"]["median_s"] for n, v in res["results"].items()}
    marg_rows.append({"d": d, "ms_r1": t["r=1"], "ms_r16": t["r=16"], "marginal_ms_per_r": (t["r=16"] - t["r=1"]) / 15})  # fmt: skip
marginal = pd.DataFrame(marg_rows)
b, a = np.polyfit(marginal["d"], marginal["marginal_ms_per_r"], 1)  # marginal = a + b d
print(marginal.round(3).to_string(index=False))
growth_d = marginal["marginal_ms_per_r"].iloc[-1] / marginal["marginal_ms_per_r"].iloc[0]
d_ratio = marginal["d"].iloc[-1] / marginal["d"].iloc[0]
crossover = a / b if b > 0 else float("inf")
fig = go.Figure(
    go.Scatter(x=marginal["d"], y=marginal["marginal_ms_per_r"], mode="markers", name="measured")
)
xs = np.linspace(0, marginal["d"].max(), 50)
fig.add_trace(go.Scatter(x=xs, y=a + b * xs, mode="lines", name=f"fit {a:.2f} + {b:.3f} d ms"))
fig.update_layout(
    title="Cost of one more unit of metric rank (eq. 16 scores, L = 256, B*H = 4)",
    xaxis_title="head width d", yaxis_title="ms per unit of r",
)  # fmt: skip
viz.show(fig)
rpart = cost[(cost["sweep"] == "r") & (cost["path"] == "eq16_decomposed")].sort_values("r")
r_growth = rpart["ratio"].iloc[-1] / rpart["ratio"].iloc[0]
dsweep = cost[(cost["sweep"] == "d") & (cost["path"] == "eq16_decomposed")].sort_values("d")
viz.markdown(
    f"**Timings.** One more unit of metric rank costs {marginal['marginal_ms_per_r'].iloc[0]:.2f} ms "
    f"at $d = {int(marginal['d'].iloc[0])}$ and {marginal['marginal_ms_per_r'].iloc[-1]:.2f} ms at "
    f"$d = {int(marginal['d'].iloc[-1])}$ ({growth_d:.1f}x for {d_ratio:.0f}x the width; fit "
    f"{a:.2f} + {b:.3f} $d$ ms). "
    + (
        f"Both parts are there: a $d$-independent one (the $O(r)$ elementwise passes over the "
        f"$(L, L, r)$ tensors, which Proposition 4.3 counts) and one proportional to $d$ (forming "
        f"$U_i^\\top k_j$ and $U_j^\\top q_i$ for every pair, which it omits), which dominates "
        f"beyond $d \\approx {crossover:.0f}$ in eager PyTorch on this CPU, where an elementwise "
        f"pass costs far more per number than a matrix-product flop. "
        if b > 0
        else "In this run the timing noise hides the $d$-proportional part; the FLOP count "
        "above is exact. "
    )
    + f"From $r = {int(rpart['r'].iloc[0])}$ to ${int(rpart['r'].iloc[-1])}$ at $d = 32$ the "
    f"scores took {r_growth:.1f}x longer, and the overhead over the dot product at $r = 4$ is "
    + ", ".join(f"{x:.0f}x at d={int(dd)}" for dd, x in dsweep[["d", "ratio"]].values)
    + f" (score matrices only, against a bare `q @ k.T`): far above the $1 + r/d \\le "
    f"{1 + 4 / min(head_dims):.2f}$ of Proposition 4.3 at every width. So the metric terms cost "
    "$O(d r)$ per pair and the overhead over dot-product attention is $\\Theta(r)$, not $O(r/d)$."
)


# %% [markdown]
# ## The fast path against SDPA
#
# `geodesic_attention` never forms an $(L, L, r)$ tensor: it builds the augmented features of
# chapter 1 (width $d^2 + 3d + 1$), runs one GEMM per score tile and an online softmax over
# key blocks, and recomputes tiles in the backward (a custom autograd function), so memory is
# linear in $L$. For $d > 16$ or so, where $d^2$ outgrows $2rd$, it switches to a query-blocked
# path that computes $U_i^\top k_j$ tile by tile ($O(dr)$ per pair, checkpointed).
#
# The full benchmark (B = 2, H = 8, L = 1024, d = 16, r = 4, and memory up to L = 8192) is a
# command-line run; its results are loaded from `artifacts/bench/riemannian.json` when present:
#
# ```
# python benchmarks/riemannian_attention.py --threads 1
# ```

# %%
artifact = repo_root(Path.cwd()) / "artifacts" / "bench" / "riemannian.json"
bench = json.loads(artifact.read_text()) if artifact.exists() else None
if bench is not None and "vs_sdpa_causal=False" in bench:
    table = []
    for key in ("vs_sdpa_causal=False", "vs_sdpa_causal=True"):
        for name, v in bench[key]["results"].items():
            table.append(
                {
                    "causal": key.endswith("True"), "path": name,
                    "forward_ratio": v["forward"]["ratio_median"],
                    "fwd_bwd_ratio": v["forward_backward"]["ratio_median"],
                    "peak_MiB": v.get("peak_memory_bytes", float("nan")) / 2**20,
                }
            )  # fmt: skip
    bench_table = pd.DataFrame(table)
    display_table = bench_table.round(2)
    aug = bench_table[
        (bench_table["path"] == "geodesic_augmented") & (~bench_table["causal"])
    ].iloc[0]
    ref = bench.get("reference_vs_sdpa", {}).get("results", {}).get("reference")
    viz.markdown(
        f"From the artifact ({bench['threads']} thread(s)): at B=2, H=8, L=1024, d=16, r=4 the "
        f"fast path runs at **{aug['forward_ratio']:.1f}x** SDPA forward and "
        f"**{aug['fwd_bwd_ratio']:.1f}x** forward+backward (the arithmetic floor is about "
        f"$2r + 1 = 9$x); the materialised reference at "
        + (f"{ref['forward']['ratio_median']:.0f}x" if ref else "n/a")
        + " (batch 1)."
    )
    print(display_table.to_string(index=False))
    mem = bench.get("peak_memory_bytes_fwd_bwd_B1_H2", {})
    if mem:
        Ls = sorted(int(x) for x in mem)
        fig = go.Figure()
        for name in mem[str(Ls[0])]:
            fig.add_trace(
                go.Scatter(
                    x=Ls, y=[mem[str(L)][name] / 2**20 for L in Ls], mode="lines+markers", name=name
                )
            )
        fig.update_layout(
            title="Peak tensor memory of one causal forward+backward (B=1, H=2, d=16, r=4)",
            xaxis_title="L", yaxis_title="MiB", xaxis_type="log", yaxis_type="log",
        )  # fmt: skip
        viz.show(fig)
        aug_mem = [mem[str(L)]["geodesic_augmented"] for L in Ls]
        mem_slope = viz.loglog_slope(Ls, aug_mem)
        print(f"log-log slope of the fast path's peak memory against L: {mem_slope:.2f}")
        assert mem_slope < 1.2, "fast-path memory grows faster than linearly in L"
else:
    print(f"no benchmark artifact at {artifact}; run the command above to produce it")

# %% [markdown]
# And a small live measurement in this run (B = 1, H = 4, d = 16, r = 4, causal), so that the
# page always shows numbers from its own execution:

# %%
d, r = 16, 4
tau = math.sqrt(2 * d)
q, k, v = (torch.randn(1, 4, live_length, d, generator=gen).requires_grad_() for _ in range(3))
U = (0.3 * torch.randn(1, 4, live_length, d, r, generator=gen) / math.sqrt(d)).requires_grad_()
live = compare(
    {
        "sdpa": lambda q, k, v, U: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "geodesic_attention": lambda q, k, v, U: geodesic_attention(q, k, v, U, tau, causal=True),
    },
    "sdpa", (q, k, v, U), reps=reps,
)  # fmt: skip
g = live["results"]["geodesic_attention"]
print(
    f"L={live_length}: geodesic_attention / SDPA = {g['forward']['ratio_median']:.1f}x forward, "
    f"{g['forward_backward']['ratio_median']:.1f}x forward+backward "
    f"({live['threads']} threads; peak {g['peak_memory_bytes'] / 2**20:.1f} MiB)"
)
with torch.no_grad():
    from attention_atlas.attention.riemannian import geodesic_attention_reference

    err = float(
        (
            geodesic_attention(q, k, v, U, tau, causal=True)
            - geodesic_attention_reference(q, k, v, U, tau, True)[0]
        )
        .abs()
        .max()
    )
print(f"float32 fast path vs reference: max abs difference {err:.1e}")
assert err < 1e-4

# %% [markdown]
# ## Woodbury against a dense solve at d = 1024, r = 8
#
# Proposition 4.1's claim, measured: applying $g^{-1}$ by Woodbury versus building the dense
# $I + U U^\top$ and calling `torch.linalg.solve` (float64).

# %%
U = torch.randn(woodbury_tokens, 1024, 8, generator=gen, dtype=F64) / 32
x = torch.randn(woodbury_tokens, 1024, generator=gen, dtype=F64)
dense_solve = lambda U, x: torch.linalg.solve(metric_dense(U), x.unsqueeze(-1)).squeeze(-1)  # noqa: E731
err = rel(metric_inverse_apply(U, x), dense_solve(U, x))
assert err < 1e-10
wres = compare(
    {"dense_solve": dense_solve, "woodbury": metric_inverse_apply},
    "dense_solve", (U, x), reps=reps, backward=False, memory=False,
)  # fmt: skip
speedup = 1 / wres["results"]["woodbury"]["forward"]["ratio_median"]
viz.markdown(
    f"Woodbury is **{speedup:.0f}x** faster than the dense solve for {woodbury_tokens} token(s) "
    f"at $d = 1024$, $r = 8$ (relative difference {err:.1e}). The flop ratio is "
    f"$d^3 / (d r^2) = {1024**2 // 64}$; the measured speedup is smaller because the $r \\times r$ "
    f"work is tiny and overheads dominate, but the claim of Proposition 4.1 stands."
)

# %% [markdown]
# ## Verdict
#
# * Woodbury (Prop. 4.1) and the decompositions (Prop. 4.2) are exact: float64 agreement to
#   round-off, and Woodbury is orders of magnitude faster than a dense solve.
# * The complexity claim (Prop. 4.3) undercounts by a factor of about $d$: the metric terms pair
#   one token's metric with another token's vector, costing $O(d r)$ per pair, and the
#   measured cost of one more unit of $r$ grows with $d$. Riemannian attention costs at least
#   about $2r + 1$ times dot-product attention, not $1 + r/d$.
# * That overhead is paid efficiently: the separable form of chapter 1 turns the whole score
#   into one GEMM, and the blocked fast path stays within a small factor of the $2r+1$ floor
#   with memory linear in $L$.
