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
# coefficients, the rank-one PSD decomposition, unimodular support); (ii) computes the attention
# at the cost of dot-product attention for every $m$, instead of the seed's $O(L^2 m)$
# pseudocode; (iii) shows two choices that can decide a comparison of metrics, which the seed
# leaves open: incidence columns never see the all-ones direction, and the seed scores one
# projection $z$ where attention layers score queries against keys; (iv) runs the seed's
# experiment with controls and states, claim by claim, what the runs support at their scale.

# %% tags=["parameters"]
threads = 1  # torch CPU threads (1 is fastest on a shared 2-core machine)
tu_dim = 5  # d of the exhaustive total-unimodularity checks
check_dim = 9  # d of the fast-path checks: 4d is 36, d(d-1)/2, so every family reaches 4d
check_len = 12  # sequence length of the fast-path checks
bench_length = 1024  # L of the in-chapter attention timing (B 4, H 8, d 16)
bench_repeats = 5
memory_lengths = [256, 512, 1024]  # L of the live peak-memory measurement
step_repeats = 9  # rounds of the side-by-side training-step timing
explore_dim = 8  # d of the exploration (graph family and m -> M, spectrum, attention)
datasets = ["digits", "ptb-char"]  # CIFAR-10 cannot be downloaded here (see the text)
fractions = [0.1, 0.3, 1.0]  # training-set fractions of the digits runs (low data)
lm_fractions = [1.0]  # ... and of the char-PTB runs (low data needs many epochs: the long preset)
seeds = [0, 1, 2]
steps = 400  # optimiser steps of the digits runs
lm_steps = 800  # ... and of the char-PTB runs (a verdict needs them out of the bigram regime)
batch_size = 32  # digits images per batch
lm_batch_size = 16  # char-PTB windows per batch
seq_len = 64  # characters per char-PTB window
dim = 64  # model width D (matched across arms)
n_heads = 8
head_dim = 16  # d; 16 so that 4d edges fit a simple graph on d nodes
lr = 3e-3
eval_batches = 4  # validation batches at each log step
final_eval_batches = 16  # validation batches at the end (char-PTB; digits use all 450 images)
main_m = 2  # m as a multiple of d for the matroidal arms of the main comparison
main_graph = "ring_chords"
slice_dataset = "digits"  # the m, family and steps slices run on this data set ...
slice_fraction = 1.0  # ... at this training fraction
m_multiples = [1, 2, 4]  # m in units of d: d (the ring), 2d, 4d
families = ["ring_chords", "knn", "random", "sparse_random", "unsigned"]
prune_fractions = [0.25, 0.5]  # share of each head's columns removed after training
steps_multiples = [0.25, 4.0]  # the steps slice: these multiples of `steps`

# %% tags=["smoke"]
SMOKE = {
    "datasets": ["digits"],
    "fractions": [1.0],
    "steps": 2,
    "bench_length": 128,
    "bench_repeats": 2,
    "memory_lengths": [64, 128],
    "step_repeats": 2,
    "explore_dim": 5,
    "final_eval_batches": 2,
    "m_multiples": [1, 2],
    "families": ["sparse_random"],
    "prune_fractions": [0.5],
    "steps_multiples": [2.0],
}
from attention_atlas.notebooks.lab import apply_smoke  # with ATTENTION_ATLAS_SMOKE=1 in JupyterLab

apply_smoke(SMOKE, globals())

# %%
import time
from pathlib import Path

import pandas as pd
import torch
from IPython.display import display

import attention_atlas
from attention_atlas import viz
from attention_atlas.attention.graphs import CONTRAST_FAMILIES, GRAPH_FAMILIES, covector_matrix
from attention_atlas.attention.matroidal import matroidal_coefficients
from attention_atlas.claims import CLAIMS
from attention_atlas.experiments.matroidal import analysis, checks
from attention_atlas.experiments.matroidal import run as experiment
from attention_atlas.experiments.matroidal import verdicts as verdicts_of

torch.set_num_threads(threads)
ROOT = Path(attention_atlas.__file__).resolve().parents[2]
smoke_mode = steps < 10  # the SMOKE values: run the tiny grid instead of loading stored results
t_chapter = time.perf_counter()
outcome = {}  # claim key -> Outcome, filled section by section (the register computes the same)

# %% [markdown]
# ## 1. Covector matrices and their unimodular support
#
# Five graph families give $A$ with exactly $m$ columns $e_i - e_j$ on $d$ nodes: the ring
# ($m = d$), the ring plus random chords, the circulant $k$-nearest-neighbour graph ($m = kd$),
# the complete graph ($m = d(d-1)/2$) and $m$ random edges. A family that cannot have $m$ edges
# on $d$ nodes is an error, not a silent substitute. Two sparse families that are *not*
# incidence matrices serve as contrast: `unsigned` ($e_i + e_j$ over the ring-plus-chords edges)
# and `sparse_random` (three random $\pm 1$ entries per column). A *grounded* graph family
# appends one unit column $e_r$ per connected component (section 4 says why); a unit column is
# a column of a signed incidence matrix too, so grounding keeps total unimodularity.
#
# The checker `is_totally_unimodular` enumerates every square submatrix (after removing
# repeated columns); `is_signed_incidence` is the structural certificate (each column has at
# most one $+1$ and one $-1$), which implies total unimodularity (Poincaré; Heller and
# Tompkins). Below: every family at $d$ = `tu_dim` for every feasible $m$, bare and grounded.

# %%
tu = checks.unimodularity_survey(tu_dim, seed=1)  # every family, every feasible m, both checks
outcome["matroidal/unimodular"] = checks.unimodular_outcome(tu)
assert outcome["matroidal/unimodular"].outcome == "supported", outcome["matroidal/unimodular"]
assert set(tu[tu.family.isin(GRAPH_FAMILIES)].family) == set(GRAPH_FAMILIES)
assert not tu[tu.family.isin(CONTRAST_FAMILIES)]["signed incidence"].any()
viz.markdown(f"**Total unimodularity** ({outcome['matroidal/unimodular'].outcome}): "
             f"{outcome['matroidal/unimodular'].summary}.")  # fmt: skip
checks.unimodularity_summary(tu)

# %% [markdown]
# The contrast matrices that pass are the bipartite cases of `unsigned` (no odd cycle among the
# chosen edges). The figure shows the covector matrices at the head dimension of the training
# runs ($d$ = `head_dim`, $m = 2d$).

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
# the identity with random $x$ for every family and $m \in \{d, 2d, 4d\}$ at $d$ = `check_dim`,
# the spectrum bound $\lambda_{\min}(M) \ge \varepsilon$, and that the factor used by the fast
# path reproduces $M$: $R$ is the triangular factor of a QR decomposition of
# $[\mathrm{diag}(\sqrt{\ell})A^\top;\ \sqrt\varepsilon I]$, so $R^\top R = M$ without ever forming
# $M$ (its condition number enters only as a square root).

# %%
eps = 1e-4
gen = torch.Generator().manual_seed(0)
cases = checks.metric_cases(
    check_dim
)  # (family, m), m in {d, 2d, 4d}, where the family has m edges
theta_extreme = torch.tensor([-1e3, -50.0, 0.0, 50.0, 1e3], dtype=torch.float64)
assert (matroidal_coefficients(theta_extreme) >= 0).all()
worst = checks.decomposition_errors(cases, check_dim, eps, generator=gen)
assert worst["factor"] < 1e-12, worst
outcome["matroidal/psd"] = checks.psd_outcome(worst, len(cases))
assert outcome["matroidal/psd"].outcome == "supported", outcome["matroidal/psd"]
viz.markdown(f"**Rank-one decomposition** ({outcome['matroidal/psd'].outcome}): "
             f"{outcome['matroidal/psd'].summary}; $R^\\top R = M$ to {worst['factor']:.1e}.")  # fmt: skip

# %% [markdown]
# ## 3. The fast path is the pseudocode
#
# The seed's pseudocode builds $u = A^\top z$, then the $(L, L, m)$ tensor of differences:
# memory quadratic in $L$ times $m$. Since $S_{ij} = -\|Rz_i - Rz_j\|^2/(2\tau)$ and
# $\|y_i\|^2$ is constant along a softmax row,
# $\mathrm{softmax}_j S_{ij} = \mathrm{softmax}_j\big((y_i\cdot y_j - \tfrac12\|y_j\|^2)/\tau\big)$
# with $y = zR^\top$: a dot product plus a per-key bias, which the fused SDPA kernel
# {cite}`dao2022flashattention` computes (the backward pass runs the flash backward on the
# augmented vectors $[y, 1]\cdot[y, -\tfrac12\|y\|^2]$, which also returns the bias's gradient).
# In a model, $y = x\,(R W_z)^\top$: the $d\times d$ map is folded into the projection's
# weights, so a training step runs the token-side products of dot-product attention, for every
# $m$.
#
# Check: for every family and $m\in\{d,2d,4d\}$, causal and not, the fast path equals the
# pseudocode in float64, and so do the gradients with respect to $z$, $v$ and $\theta$
# (`torch.autograd.gradcheck` on the fast path and on the folded module is in
# `tests/test_matroidal.py`).

# %%
err_out, err_grad = checks.fast_path_errors(
    cases, check_dim, check_len, eps, tau=0.5, generator=gen
)
outcome["matroidal/fast-path"] = checks.fast_path_outcome(err_out, err_grad, len(cases))
assert outcome["matroidal/fast-path"].outcome == "supported", outcome["matroidal/fast-path"]
viz.markdown(f"**Fast path** ({outcome['matroidal/fast-path'].outcome}): "
             f"{outcome['matroidal/fast-path'].summary}.")  # fmt: skip

# %% [markdown]
# **Cost of the attention.** A short timing at $L$ = `bench_length` (B = 4, H = 8, d = 16),
# interleaved with SDPA (medians of `bench_repeats` rounds; this machine is shared, so the
# ratios are noisy). `benchmarks/bench_matroidal.py` repeats it with more rounds and the
# pseudocode reference; the chapter shows its stored JSON when it exists.

# %%
bench_here = checks.time_against_sdpa(
    bench_length, head_dim, m_multiples, reps=bench_repeats, eps=eps
)
bench = checks.stored_benchmark(ROOT / "artifacts" / "bench_matroidal.json")
if bench is not None:
    viz.markdown(bench["text"])
    display(bench["ratios"])
bench_here

# %% [markdown]
# **Memory.** Peak memory of one forward+backward (live tensor bytes,
# `attention_atlas.bench.timing.peak_memory`) at each $L$ of `memory_lengths`, measured now, against
# the $(L, L, m)$ tensor the pseudocode would hold ($m = 4d$). The fast path must grow linearly
# in $L$ (log-log slope near 1), as SDPA does; stored measurements at larger $L$ follow when
# `artifacts/bench_matroidal.json` exists.

# %%
memory = checks.memory_growth(memory_lengths, head_dim=head_dim, m=4 * head_dim)
slope = checks.loglog_slope(memory)
assert slope["matroidal"] < 1.2, f"the fast path's memory grows faster than L: {slope.to_dict()}"
viz.markdown(
    f"Log-log slope of peak memory over the two largest $L$: matroidal {slope['matroidal']:.2f}, "
    f"SDPA {slope['dot SDPA']:.2f}, the pseudocode's tensor {slope.iloc[-1]:.2f}; at "
    f"$L$ = {memory.index.max()} the fast path holds {memory['matroidal'].iloc[-1]:.2f} MiB "
    f"where the pseudocode's tensor alone would take {memory.iloc[-1, -1]:.0f} MiB."
)
if bench is not None:
    assert (bench["growth"] < 1.2).all(), f"stored memory grows faster than L: {bench['growth']}"
    display(bench["memory"])
memory

# %% [markdown]
# **Cost of a training step.** What limits the experiments below is the whole step (forward,
# backward and AdamW update of the 2-layer model), not the attention kernel. Each arm's step
# against a dot-product step of the same model, side by side in one process
# (`attention_atlas.bench.timing.compare`, `step_repeats` interleaved rounds) at the char-PTB runs'
# shape, with the ratio of counted FLOPs (forward and backward), the arithmetic floor of the
# time ratio.

# %%
step_cost = checks.step_costs("ptb-char", ["dense", "matroidal", "dense-qk", "matroidal-qk"],
                              dim=dim, m=main_m * head_dim, reps=step_repeats)  # fmt: skip
cost = {a: (f"{r['ratio to dot']:.2f}x (quartiles {r['ratio q25']:.2f} to {r['ratio q75']:.2f}) "
            f"for {r['FLOP ratio']:.2f}x the FLOPs") for a, r in step_cost.iterrows()}  # fmt: skip
viz.markdown(
    f"Training step against a dot-product step: matroidal (one $z$) {cost['matroidal']}; "
    f"matroidal on $q_i - k_j$ {cost['matroidal-qk']}; dense (one $z$) {cost['dense']}. The "
    "FLOP ratio is the arithmetic floor; time above it is memory traffic of the attention core "
    "(the $(d+1)$-wide augmented keys and values written for the flash backward)."
)
step_cost

# %% [markdown]
# ## 4. Two choices that decide a comparison
#
# ### The all-ones direction
#
# Every incidence column $e_i - e_j$ is orthogonal to $\mathbf 1$, so $A^\top \mathbf 1 = 0$ and
# $M\mathbf 1 = \varepsilon\mathbf 1$: whatever the weights, the matroidal metric on graph
# columns gives the direction $\mathbf 1/\sqrt d$ the eigenvalue $\varepsilon$ only (one such
# direction per connected component). The logits cannot see how $z_i - z_j$ differs along it.
# The contrast families and the dense metric have no such null direction, so a comparison
# between them and a graph family also compares a metric of rank $d-1$ with one of rank $d$.
# Grounding (one unit column per component) restores rank $d$ and keeps total unimodularity.
# The table: every family at $m = 2d$, $d$ = `head_dim`, at the initial weights (float64).

# %%
null = checks.null_directions(head_dim, main_m * head_dim, eps)
bare = null[null.family.isin(GRAPH_FAMILIES) & ~null.grounded]
grounded = null[null.grounded]
others = null[~null.family.isin(GRAPH_FAMILIES)]
assert (bare["lambda_min / eps"].sub(1).abs() < 1e-6).all() and (
    bare["|<v_min, 1>|"] > 1 - 1e-9
).all()
assert (grounded["rank"] == head_dim).all() and (grounded["lambda_min / eps"] > 1).all()
viz.markdown(
    f"Every bare graph family has $\\lambda_{{\\min}}(M) = {bare['lambda_min / eps'].min():.4f}\\,\\varepsilon$ "
    f"with eigenvector $\\mathbf 1/\\sqrt d$ (|cosine| {bare['|<v_min, 1>|'].min():.6f}); grounded, "
    f"$\\lambda_{{\\min}} \\ge {grounded['lambda_min / eps'].min():.0f}\\,\\varepsilon$ and the all-ones "
    f"direction gets {grounded['ones Rayleigh'].min():.3f} of the mean eigenvalue at initialisation "
    f"(a learnable weight); the contrasts and the dense metric give it "
    f"{others['ones Rayleigh'].min():.2f} to {others['ones Rayleigh'].max():.2f}."
)
null

# %% [markdown]
# **Explore** the metric: pick $m$, the covector family and whether it is grounded; the figure
# recomputes $M$ at its initial weights on $d$ = `explore_dim` nodes, its eigenvalues (red: the
# eigenvector nearest $\mathbf 1$) and the attention it gives on twelve fixed random tokens in
# the seed's form (one $z$; the diagonal is each row's largest logit).

# %%
explore_families = ["ring_chords", "knn", "random", "complete", "ring", "sparse_random", "unsigned"]
viz.explore(
    lambda m, family, grounded: checks.metric_view(m, family, grounded, d=explore_dim),
    {
        "m": viz.slider([explore_dim, 2 * explore_dim, 3 * explore_dim],
                        live_range=(explore_dim, explore_dim * (explore_dim - 1) // 2)),
        "family": viz.dropdown(explore_families),
        "grounded": viz.dropdown({"bare": False, "grounded": True}),
    },
    main=True,
)  # fmt: skip

# %% [markdown]
# ### One $z$, or queries against keys
#
# The seed's pseudocode scores differences of *one* projected representation per token,
# $z_i - z_j$. Then $S_{ii} = 0$ is the largest logit of every row: each token attends most to
# itself, and the pre-softmax scores are symmetric. Attention layers score a query against a
# key, $q_i - k_j$, with separate projections; nothing then favours the diagonal. Which form a
# comparison uses can decide it, so the experiment below runs both: the seed's arms (`dense`,
# `matroidal`, one $z$) and the query-key arms (`dense-qk`, `matroidal-qk`). The one-$z$ form
# also drops the key projection ($HdD$ parameters per layer).
#
# ### The metric and the projections
#
# The fold in section 3 is also a statement about learning: a model with metric $M = R^\top R$
# and projection $W$ computes exactly what a model with metric $I$ and projection $RW$ computes.
# The projections are learned too, so any metric can be absorbed by them: the metric's
# parameters change how training moves through the same functions, not which functions the
# model can express (up to the null direction above, which $RW$ cannot undo without weights
# growing against weight decay). Section 6 measures how far training moves the metrics.

# %% [markdown]
# ## 5. The seed's experiment
#
# A 2-layer, 8-head pre-norm Transformer from the harness (`attention_atlas.models`), width
# $D$ = `dim`, head dimension $d$ = `head_dim`, trained with AdamW on
#
# * **character-level Penn Treebank** (causal LM, bits per character, `seq_len`-character
#   windows, `lm_steps` steps), and
# * **scikit-learn's 8x8 digits as 2x2 patch tokens** (16 tokens, 10 classes, accuracy,
#   `steps` steps). The seed names CIFAR-10; it cannot be downloaded on this machine, and the
#   patch-token path is generic (`ArrayTask` with `(N, P, patch_dim)` arrays), so CIFAR-10
#   drops in where it exists.
#
# The arms, at matched width and head dimension (dense $M_h = W_hW_h^\top + \varepsilon I$,
# $W_h$ initialised to $I$, $Hd^2$ metric parameters per layer; matroidal
# $M_h = A\,\mathrm{diag}(\ell_h)A^\top + \varepsilon I$ with $\ell_h$ initialised so that
# $\mathrm{tr}\,M_h = d$, $Hm$ parameters per layer; all with $\tau = \sqrt d$):
#
# * `dot`: dot-product attention, the control that sets each verdict's scale;
# * `dense` and `matroidal`: **the seed's experiment**: one $z$, the dense metric against the
#   matroidal metric on graph-incidence columns (ring plus chords, $m = $ `main_m` $d$), as the
#   seed restricts them;
# * `matroidal-grounded`: the same with ground columns, so that $A$ spans $\mathbb R^d$;
# * `dense-qk` and `matroidal-qk`: both metrics on $q_i - k_j$.
#
# Slices: **main** (every arm, every data set and fraction), **m** (the seed's arm with
# $m \in \{d, 2d, 4d\}$ on `slice_dataset`), **family** (every covector family at $m = 2d$, the
# graph families grounded so that every family spans $\mathbb R^d$), **steps** (the seed's arm
# and the dense one trained for `steps_multiples` times `steps`); every matroidal model is also
# evaluated after removing the smallest-weight share `prune_fractions` of each head's columns,
# and, as the control, as many random columns.
#
# Each comparison is a paired difference over seeds of the task metric, signed as a gain
# (positive: the arm is better than its control), judged by the library's verdict rule against
# a smallest effect of interest declared in `attention_atlas.experiments.matroidal.run.SESOI`, and
# stated with its scale: the dot-product arm at the same budget must have left the bigram
# regime (at most 3 bpc on char-PTB) or be at least halfway from chance to perfect accuracy on
# digits, or the outcome is *not tested*. The grid comes from the results store: the `long`
# preset's grid of section 6 once all its cells are stored, else the book grid
# (`python -m attention_atlas sweep matroidal --preset book`). The provenance line under each
# result names the command, commits and machines that made the grid shown.

# %%
grid_params = {
    "datasets": datasets, "fractions": fractions, "lm_fractions": lm_fractions, "steps": steps,
    "lm_steps": lm_steps, "batch_size": batch_size, "lm_batch_size": lm_batch_size,
    "seq_len": seq_len, "dim": dim, "n_heads": n_heads, "head_dim": head_dim, "lr": lr,
    "eval_batches": eval_batches, "final_eval_batches": final_eval_batches, "main_m": main_m,
    "main_graph": main_graph, "slice_dataset": slice_dataset, "slice_fraction": slice_fraction,
    "m_multiples": m_multiples, "families": families, "prune_fractions": prune_fractions,
    "steps_multiples": steps_multiples,
}  # fmt: skip
runs, grid = experiment.load_runs(grid_params, seeds, smoke=smoke_mode)
provenance = grid.provenance.text
assert runs[["val_loss", "grad_norm_var"]].notna().all().all()
print(f"{len(runs)} runs ({len(grid.frame)} distinct cells); {provenance}")

# %% [markdown]
# ### Parameters and attention FLOPs
#
# Metric parameters per model (two layers): dense $2Hd^2$, matroidal $2Hm$ (plus one weight per
# ground column). The attention FLOPs (attention core, forward and train step) are those of the
# kernels run.

# %%
params_table = analysis.parameter_table(runs)
mat_p, den_p = (int(params_table.loc[a, "params_metric"]) for a in ("matroidal", "dense"))
assert mat_p == 2 * n_heads * main_m * head_dim and den_p == 2 * n_heads * head_dim**2
spread = params_table.params_total.max() / params_table.params_total.min() - 1
viz.markdown(
    f"Total parameters differ by at most {100 * spread:.1f}% between the arms (the one-$z$ arms "
    f"have no key projection); the matroidal metric has {mat_p} parameters against {den_p} for "
    f"the dense one ({den_p / mat_p:.0f}x fewer)."
)
params_table

# %% [markdown]
# ### Main comparison

# %%
for ds in runs[runs.slice == "main"].dataset.unique():
    viz.show(analysis.metric_against_fraction(runs, ds))
    viz.markdown(f"*Evidence:* {provenance}.")
viz.markdown(verdicts_of.scale_summary(runs))
analysis.main_table(runs)

# %% [markdown]
# Every comparison in every (data set, fraction) cell, with its verdict at that cell's scale
# (two-sided: better or worse when the interval excludes zero, equivalent when it lies inside
# the smallest effect of interest, else not resolved with the smallest effect the seeds could
# have detected):

# %%
comparisons = verdicts_of.comparison_table(runs)
viz.markdown(verdicts_of.comparison_summary(comparisons) + f" *Evidence:* {provenance}.")
comparisons

# %% [markdown]
# What the two choices of section 4 did here: the all-ones weight of the trained metrics
# (`ones Rayleigh`: $\mathbf 1^\top M\mathbf 1 / \mathrm{tr}\,M$, median over heads) and the
# mean attention weight of a token on itself, against dot-product attention's.

# %%
choice_text, choice = analysis.choices_summary(runs)
viz.markdown(choice_text)
choice

# %% [markdown]
# ### Slices: the number of columns $m$ and the covector family

# %%
m_table = analysis.slice_table(runs, "m", by="m")
fam_table = analysis.slice_table(runs, "family", by="graph")
flops_by_m = runs[runs.slice == "m"].groupby("m").attn_flops_fwd.first()
assert flops_by_m.nunique() == 1  # the fast path's attention FLOPs do not depend on m
display(m_table)
fam_table

# %% [markdown]
# ### Pruning (after training, no retraining)
#
# In each head the share `prune_fractions` of columns with the smallest weights is removed
# (`MatroidalAttention.keep_columns`, exact for the kept columns: `tests/test_matroidal.py`),
# and, as the control, the same number of random columns. Gains are pruned minus unpruned in
# the task metric (negative: lost).

# %%
viz.markdown(analysis.prune_summary(runs))
analysis.prune_table(runs)

# %% [markdown]
# ## 6. How long is long enough
#
# The metrics must move for the comparison to be about learned metrics rather than their
# initial values. The steps slice trains the seed's arm and the dense arm for several budgets on
# `slice_dataset`; a metric has moved materially when its median relative change
# $\|M - M_0\|_F / \|M_0\|_F$ reaches `MATERIAL_CHANGE`.

# %%
movement = analysis.movement_table(runs)
viz.markdown(analysis.movement_summary(runs) + f" *Evidence:* {provenance}.")
movement

# %% [markdown]
# The `long` preset (`python -m attention_atlas sweep matroidal --preset long`), sized from
# these measurements: its parameters, and its cost estimated from the measured time per
# training step of each arm in the grid above (one CPU thread; a GPU runs the same cells).

# %%
viz.markdown(
    analysis.long_preset_text(
        runs, experiment.PRESETS["long"], experiment.PRESET_SEEDS["long"], shown=grid.provenance
    )
)

# %% [markdown]
# ## 7. Verdicts at this scale
#
# Every claim of the seed this chapter tests, with the outcome the claims register
# (`python -m attention_atlas claims`) computes from the same functions: the mathematical ones
# from the float64 checks of sections 1 to 3, the hypotheses from the stored grid's verdicts.

# %%
outcome.update(verdicts_of.empirical_outcomes(runs, evidence=provenance))
mine = [c for c in CLAIMS if c.module.endswith("experiments.matroidal")]
assert {c.key for c in mine} == set(outcome), sorted(set(outcome) ^ {c.key for c in mine})
verdicts = pd.DataFrame([{"claim": c.key, "statement": c.statement, "outcome": outcome[c.key].outcome,
                          "evidence": outcome[c.key].summary, "scale": outcome[c.key].scale or ""}
                         for c in mine]).set_index("claim")  # fmt: skip
n_bad = (runs.nonfinite_logits + runs.nonfinite_out).groupby(runs.arm).sum().astype(int).to_dict()
viz.markdown(
    verdicts_of.verdict_summary(outcome, provenance)
    + f" Non-finite logits or outputs over all runs, by arm: {n_bad}"
    + ("; with none anywhere, stability does not tell the arms apart at this scale."
       if not any(n_bad.values()) else ".")
)  # fmt: skip
verdicts

# %%
print(f"chapter time: {time.perf_counter() - t_chapter:.0f} s")
