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
# # 1. Non-Gram scores
#
# Dot-product attention scores a query against a key with $S_{ij} = q_i \cdot k_j / \sqrt d$:
# the score matrix is a product $Q K^\top$ of two $L \times d$ factors, a *Gram* matrix of rank
# at most $d$, however long the sequence. Riemannian attention {cite}`song2026riemannian` gives
# every token $t$ its own metric $g_t = I + U_t U_t^\top$ ($U_t \in \mathbb{R}^{d \times r}$,
# eq. 4), compares a pair under the average $g_{ij} = (g_i + g_j)/2$ (eq. 5) and scores with the
# negative squared distance (eq. 6):
#
# $$
# S_{ij} = -\frac{1}{\tau}\Big(\lVert q_i - k_j\rVert^2
#   + \tfrac12 \lVert U_i^\top (q_i - k_j)\rVert^2 + \tfrac12 \lVert U_j^\top (q_i - k_j)\rVert^2\Big).
# $$
#
# **Theorem 3.2** of the paper says that with heterogeneous metrics no fixed maps
# $\phi_i = \Phi(q_i, U_i)$, $\psi_j = \Psi(k_j, U_j)$ of dimension $d' = O(d)$ give
# $S_{ij} = \phi_i \cdot \psi_j$; the minimum is at least $\min\{\dim \mathrm{span}\{U_t U_t^\top\},
# d(d+1)/2\}$ (eq. 7). The reason is the term $k_j^\top (U_i U_i^\top) k_j$: token $i$'s metric
# applied to token $j$'s key. It separates only as $\langle \mathrm{vec}(U_i U_i^\top),
# \mathrm{vec}(k_j k_j^\top)\rangle$, an inner product in the $d(d+1)/2$-dimensional space of
# symmetric matrices.
#
# The theorem is about functional forms; its finite-sample face is the **rank of the
# $L \times L$ score matrix** once $L$ is large. This chapter measures that rank for
# dot-product, Euclidean-distance, homogeneous-metric and heterogeneous-metric scores as $L$
# grows past $d(d+1)/2$, finds the exact generic rank, and checks it over many random draws.

# %% tags=["parameters"]
dims = [2, 3, 4, 5, 6]  # head widths d of the sweep
ranks = [1, 2, 3]  # metric ranks r of the sweep
n_draws = 20  # random draws per (d, r) for the rank asserts
rtol = 1e-9  # numerical rank: singular values above rtol * sigma_max
focus_d = 4  # the d of the rank-versus-L figure
seed = 0

# %% tags=["smoke"]
SMOKE = {"dims": [2, 3, 4], "ranks": [1, 2], "n_draws": 3, "focus_d": 3}
from attention_atlas.notebooks.lab import apply_smoke  # with ATTENTION_ATLAS_SMOKE=1 in JupyterLab

apply_smoke(SMOKE, globals())

# %%
import numpy as np
import plotly.graph_objects as go
import torch

from attention_atlas import claims, viz
from attention_atlas.attention.riemannian import augmented_dim
from attention_atlas.experiments import non_gram as ng

gen = torch.Generator().manual_seed(seed)  # the figures' draws, in order


def fresh():
    """A generator for one of the claims' checks (the register draws the same)."""
    return torch.Generator().manual_seed(seed)


# %% [markdown]
# ## What rank should we expect?
#
# Expanding the score (the proof of Theorem 3.2 does this) writes $S_{ij}$ as a sum of
# products $f_m(q_i, U_i)\, g_m(k_j, U_j)$. The rank of $S$ is at most the number of
# linearly independent functions on either side. With $A_t = U_t U_t^\top$, the query side
# carries
#
# | function of token $i$ | count | pairs with, on the key side |
# | --- | --- | --- |
# | $1$ | 1 | $\lVert k_j \rVert^2 + \tfrac12 k_j^\top A_j k_j$ |
# | $q_i$ | $d$ | $k_j$ and $A_j k_j$ |
# | $A_i q_i$ | $d$ | $k_j$ |
# | $A_i$ (upper triangle) | $d(d+1)/2$ | $k_j k_j^\top$ |
# | $q_i q_i^\top$ (upper triangle) | $d(d+1)/2$ | $A_j$ |
# | $\lVert q_i\rVert^2 + \tfrac12 q_i^\top A_i q_i$ | 1 | $1$ |
#
# These $(d+1)(d+2) = d^2 + 3d + 2$ functions have different degrees in $(q, U)$, so they are
# linearly independent for every $r \ge 1$, and the coupling between the two sides is
# invertible. So we expect the generic rank of a heterogeneous score matrix to be
# $\min(L, (d+1)(d+2))$: **about twice the theorem's lower bound $d(d+1)/2$**, with no
# dependence on $r$. For comparison: dot-product scores have rank $\min(L, d)$; Euclidean
# distance $-\lVert q_i - k_j\rVert^2$ adds two rank-one terms ($\lVert q_i\rVert^2$, $\lVert
# k_j\rVert^2$), rank $\min(L, d + 2)$; a homogeneous metric $G$ is a Euclidean distance after
# the change of variables $x \mapsto G^{1/2} x$, also $d + 2$.
#
# A softmax ignores anything constant along a row, so the part that matters to the attention
# weights drops the first row of the table's last line: rank $d^2 + 3d + 1$. That is exactly the
# width of the augmented features the fast path of chapter 3 uses
# (`attention_atlas.attention.riemannian.geodesic_features`).

# %%
ranks_df = ng.rank_table(dims, generator=gen, rtol=rtol)
mismatch = ranks_df[ranks_df["rank"] != ranks_df["expected"]]
assert mismatch.empty, f"ranks differ from min(L, expected):\n{mismatch}"
print(f"{len(ranks_df)} score matrices, every rank equals min(L, expected rank of its kind)")
ranks_df.pivot_table(index=["d", "L"], columns="kind", values="rank").astype(int)

# %% [markdown]
# ## Rank against sequence length
#
# For one width $d$, the rank of each kind of score matrix as $L$ grows. The dotted lines mark
# the theorem's lower bound $d(d+1)/2$ and the measured generic rank $(d+1)(d+2)$.

# %%
d = focus_d
top = ng.generic_rank("heterogeneous", d)
Ls, ranks_by_kind = ng.rank_against_length(d, generator=gen, rtol=rtol)
fig = go.Figure()
for kind, ys in ranks_by_kind.items():
    fig.add_trace(go.Scatter(x=Ls, y=ys, mode="lines+markers", name=kind))
fig.add_hline(y=d * (d + 1) / 2, line_dash="dot", annotation_text="Theorem 3.2 bound d(d+1)/2")
fig.add_hline(y=top, line_dash="dash", annotation_text="(d+1)(d+2)")
fig.update_layout(
    title=f"Numerical rank of the L x L score matrix, d = {d}, r = 2",
    xaxis_title="sequence length L",
    yaxis_title="numerical rank",
)
viz.show(fig)

# %% [markdown]
# **Explore.** Choose the head width $d$ and the metric rank $r$: the ranks are recomputed
# (one draw per length, seeded by $d$ and $r$) against the theorem's bound $d(d+1)/2$ and the
# generic rank $(d+1)(d+2)$. Watch where the heterogeneous curve bends as $d$ moves, and whether
# $r$ moves it.


# %%
def rank_view(d, r):
    """Numerical rank of each kind of score matrix against L for width d and metric rank r."""
    g = torch.Generator().manual_seed(100 * d + r)
    Ls, by_kind = ng.rank_against_length(d, generator=g, rtol=rtol, r=r)
    fig = viz.lines(by_kind, x=Ls, xlabel="sequence length L", ylabel="numerical rank")
    fig.add_hline(y=d * (d + 1) / 2, line_dash="dot", annotation_text="d(d+1)/2 (Theorem 3.2)")
    fig.add_hline(y=(d + 1) * (d + 2), line_dash="dash", annotation_text="(d+1)(d+2)")
    return fig.update_layout(title=f"Rank of the score matrix, d = {d}, r = {r}")


controls = {
    "d": viz.slider(dims, focus_d, live_range=(2, 8)),
    "r": viz.slider(ranks, ranks[0], live_range=(1, 6)),
}
viz.explore(rank_view, controls, main=True)

# %% [markdown]
# The rank is not a tolerance artefact: the singular values fall off a cliff right after the
# predicted rank. Below, the spectrum of one heterogeneous score matrix with $L = 2 (d+1)(d+2)$.

# %%
s = ng.heterogeneous_spectrum(d, generator=gen)
cliff = s[top - 1] / s[top]
fig = go.Figure(go.Scatter(x=np.arange(1, len(s) + 1), y=s, mode="markers"))
fig.add_vline(x=top + 0.5, line_dash="dash", annotation_text=f"(d+1)(d+2) = {top}")
fig.update_layout(
    title=f"Singular values, heterogeneous metrics, d = {d}, L = {2 * top}",
    xaxis_title="index",
    yaxis_title="singular value",
    yaxis_type="log",
)
viz.show(fig)
print(f"sigma_{top} / sigma_{top + 1} = {cliff:.2e}")
assert cliff > 1e6, "no clear gap after the predicted rank"

# %% [markdown]
# ## Many draws, every metric rank
#
# The observation, checked for every $d$ in the sweep, every metric rank $r$ and
# `n_draws` random draws each: with heterogeneous Gaussian metric factors and
# $L = \lceil 1.5\,(d+1)(d+2) \rceil$, the score matrix has rank exactly $(d+1)(d+2)$, and the
# row-centred score matrix (what the softmax sees) has rank exactly $d^2 + 3d + 1$. Below
# $(d+1)(d+2)$ tokens the matrix has full rank $L$.

# %%
draws = ng.rank_draws(dims, ranks, n_draws, generator=fresh(), rtol=rtol)
assert (draws["rank"] >= draws["theorem_bound"]).all(), "a draw has rank below d(d+1)/2"
assert (draws["rank"] == draws["observed_generic"]).all()
assert (draws["rank_row_centred"] == [augmented_dim(d) for d in draws["d"]]).all()
assert (draws["rank_below"] == draws["observed_generic"] - 1).all()
summary = draws.groupby(["d", "r"]).agg(
    draws=("rank", "size"),
    rank_min=("rank", "min"),
    rank_max=("rank", "max"),
    theorem_bound=("theorem_bound", "first"),
    observed_generic=("observed_generic", "first"),
)
summary

# %%
ratio = draws["rank"] / draws["theorem_bound"]
generic = bool((draws["rank"] == draws["observed_generic"]).all())
by_r = bool(draws.groupby("d")["rank"].nunique().max() == 1)  # one rank per d, whatever r
viz.markdown(
    f"**Observation.** In all {len(draws)} draws ($d \\in \\{{{', '.join(map(str, dims))}\\}}$, "
    f"$r \\in \\{{{', '.join(map(str, ranks))}\\}}$) the heterogeneous score matrix has rank "
    + ("exactly $(d+1)(d+2)$ once $L$ exceeds it" if generic else "not always $(d+1)(d+2)$")
    + (", the same for every $r$" if by_r else ", varying with $r$")
    + f"; the measured rank is {ratio.min():.2f} to {ratio.max():.2f} times the theorem's lower "
    "bound $d(d+1)/2$. "
    + (
        "The bound counts one of the two quadratic obstructions; the data show both, "
        "$k_j^\\top A_i k_j$ and $q_i^\\top A_j q_i$, each worth $d(d+1)/2$, plus $2d + 2$ from "
        "the linear and constant terms: $(d+1)(d+2) = d(d+1) + 2d + 2$."
        if generic
        else ""
    )
)

# %% [markdown]
# ## How much heterogeneity does it take?
#
# Between one shared metric (rank $d+2$) and a different metric for every token, let the $L$
# tokens share $m$ distinct rank-one metric factors (assigned at random): how fast does the rank
# grow with $m$, and where does it stop?

# %%
d = focus_d
top = ng.generic_rank("heterogeneous", d)
by_m = ng.rank_by_distinct_metrics(d, generator=gen, rtol=rtol)
assert by_m["rank"].iloc[0] == d + 2
assert by_m["rank"].is_monotonic_increasing
fig = go.Figure(go.Scatter(x=by_m["m"], y=by_m["rank"], mode="lines+markers", name="rank"))
fig.add_hline(y=top, line_dash="dash", annotation_text="(d+1)(d+2)")
fig.add_hline(y=d + 2, line_dash="dot", annotation_text="d + 2 (one shared metric)")
fig.update_layout(
    title=f"Rank against the number m of distinct metrics (d = {d}, r = 1, L = {2 * top})",
    xaxis_title="distinct metrics m",
    yaxis_title="numerical rank",
)
viz.show(fig)
print(by_m.set_index("m")["rank"].to_dict())
full = by_m[by_m["rank"] == top]
viz.markdown(
    f"With rank-one metrics, $m = 1$ gives rank {by_m['rank'].iloc[0]} ($d + 2$) and the rank "
    + (
        f"reaches $(d+1)(d+2) = {top}$ at $m = {int(full['m'].iloc[0])}$ distinct metrics."
        if len(full)
        else f"is still {by_m['rank'].iloc[-1]} < {top} at $m = {int(by_m['m'].iloc[-1])}$."
    )
)

# %% [markdown]
# ## The edge case: identical metrics are a Gram matrix in disguise
#
# When every token carries the same $U$, the metric is global, $G = I + U U^\top$, and
# $S_{ij} = -(\lVert q_i\rVert_G^2 + \lVert k_j\rVert_G^2 - 2\, q_i^\top G k_j)/\tau$: a Gram
# matrix $Q G K^\top$ plus a row and a column term. Row-centring removes the row term, and the
# column term is one extra dimension: the whole score is the Gram matrix of the augmented
# vectors $[G^{1/2} q_i, 1]$ and $[2 G^{1/2} k_j, -\lVert k_j\rVert_G^2]$ (over $\tau$).

# %%
d = ng.GRAM_D
gram_form = ng.homogeneous_gram_form(d, 40, 1.7, generator=fresh(), rtol=rtol)
print(
    "identical metrics: score = Gram of (d+1)-dimensional vectors + row constant, "
    f"rel. error {gram_form['rel_error']:.1e}"
)
assert gram_form["rel_error"] < 1e-12
assert gram_form["rank"] == d + 2 and gram_form["rank_row_centred"] == d + 1

# %% [markdown]
# ## Corollary 3.3: row-stochastic, but not a softmax of a Gram form
#
# Corollary 3.3 says two things about $A = \mathrm{softmax}(S)$. It is not
# $\mathrm{softmax}(Q' K'^\top)$ for any factors of dimension $d' = O(d)$ when the metrics are
# heterogeneous; and it is still row-stochastic, so the product of such matrices, which drives
# rank collapse (chapter 2), is untouched by the non-Gram scores.
#
# Both can be measured on $A$ itself. Two score matrices give the same softmax exactly when they
# differ by a constant along each row, so the smallest $d'$ with $A = \mathrm{softmax}(Q'
# K'^\top)$ is the rank of $\log A$ once each row's mean is removed (`ng.softmax_gram_dim`).
# The checks: every row sums to 1 within the rounding of a float64 sum of $L$ terms
# ($L\,\varepsilon$), no entry is negative, causal rows are exactly zero above the diagonal, and
# the softmax dimension is $d + 1$ for one shared metric but $d^2 + 3d + 1$ for heterogeneous
# metrics ($L = 64$, $d = 4$, $r = 2$).

# %%
check = ng.corollary_check(generator=fresh(), rtol=rtol)
assert ng.corollary_holds(check), f"Corollary 3.3 fails:\n{check}"
check

# %%
found = ng.chapter_outcomes(draws, gram_form, check, d_gram=ng.GRAM_D)
cor = found["riemannian/cor-3.3"]
viz.markdown(f"**Corollary 3.3: {cor.outcome}** — {cor.summary}.")

# %% [markdown]
# ## What this chapter shows
#
# Computed from the checks above (the same function the claims register calls,
# `attention_atlas.experiments.non_gram.outcomes`), and from the measurements of each section:

# %%
full = by_m[by_m["rank"] == top]
lines = [
    f"* **{claims.claim(key).source}** ({claims.claim(key).statement}) **{o.outcome}**: "
    f"{o.summary}."
    for key, o in found.items()
]
lines.append(
    f"* The generic rank of heterogeneous scores is $(d+1)(d+2)$ in "
    f"{int((draws['rank'] == draws['observed_generic']).sum())} of {len(draws)} draws "
    f"(row-centred: $d^2 + 3d + 1$ in "
    f"{int((draws['rank_row_centred'] == draws['d'].map(augmented_dim)).sum())}): about "
    f"{ratio.median():.1f} times the theorem's bound."
)
lines.append(
    f"* With $m$ distinct rank-one metrics ($d = {focus_d}$) the rank rises from "
    f"{by_m['rank'].iloc[0]} at $m = 1$ to {by_m['rank'].iloc[-1]} at $m = {by_m['m'].iloc[-1]}$"
    + (f", saturating at $m = {int(full['m'].iloc[0])}$." if len(full) else ".")
)
viz.markdown("\n".join(lines))

# %% [markdown]
# The separable form is also a recipe: chapter 3 computes geodesic attention as one dot-product
# attention of width $d^2 + 3d + 1$.
