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
# # 4. The Fiber Bundle Transformer in training
#
# Chapters 1 to 3 studied Riemannian attention as a formula. This chapter trains the whole
# architecture that Section 5 of {cite}`song2026riemannian` proposes, the *Fiber Bundle
# Transformer*, on character-level Penn Treebank, and puts the paper's six empirical
# predictions (its Section 8.2, P1 to P6) to a first test. The paper reports no experiment; as
# far as we know these are the first measurements of this architecture.
#
# Every block of the model composes the paper's phases on the residual stream, with the
# geometry made afresh from the block's normalised input $h_t$:
#
# | phase | what it does | equation |
# | --- | --- | --- |
# | A | MetricNet: $U_t = \mathrm{MLP}(h_t) \in \mathbb{R}^{d \times r}$ per head, $g_t = I + U_t U_t^\top$ | (19) |
# | A++ | metric-aware projection $q \mapsto q + \gamma\, U U^\top q / \sqrt d$, gated | (20) |
# | B | curvature proxy $\Omega_t = \mathrm{softplus}(\beta) \lVert U_t \rVert_F^2$ in the score | (21), (23) |
# | C | torsion $T_t = L_t R_t^\top - R_t L_t^\top$ added to the transport | (22) |
# | D | geodesic scores $-(d_{g_{ij}}^2(q_i, k_j) + \Omega_i + \Omega_j)/\tau$, value transport $P_t = I + \Delta_t$ | (23)-(25) |
# | E | metric-preconditioned feed-forward step $x_t + g_t^{-1}\,\mathrm{FFN}(x_t)$ (Woodbury) | (26) |
# | blend | $s = s_\text{base} + \alpha\,(s_\text{Riem} - s_\text{base})$ | (27) |
#
# The model is `attention_atlas.models.FiberBundleConfig` (the block with Phase E) on top of the
# geometry core `attention_atlas.attention.riemannian` (phases A to D, the regularisers and their
# schedule, the diagnostics); every phase can be switched off alone
# (`FiberBundleConfig(phase_c=False)`, ...), and the model trains through the same `train.train`
# loop as every other chapter. Two choices the paper leaves open:
# the blending baseline is the *distance* form $s_\text{base} = -\lVert q_i - k_j\rVert^2/\tau$
# (the paper's own Section 5.8 remark: with the dot-product form, $\alpha$ would also change a
# key-norm bias and the temperature), and $\tau = \sqrt{2 d_\text{head}}$, the temperature at which
# distance scores at $g = I$ have the scale of dot-product scores.
#
# **Regularisers** (Section 6.4): anti-flatness (31) with floor $\kappa_\min$, diversity (32) over all
# pairs of positions, smoothness (33), and the cap (34) at $\kappa_\max$, where
# $\kappa_t = \lVert U_t \rVert_F^2$ per head. The paper says to put $\kappa_\max$ near the critical
# strength $\bar U^2_\text{crit} = \Theta(\tau / L)$ of Proposition 3.5; our default is
# $\kappa_\max = \tau / L$, $\kappa_\min = \kappa_\max / 2$. Anti-flatness and diversity are
# "strong early, relaxed later": full weight for the first 30% of training, then a half cosine
# down to 10% of it by 70%. Diversity and smoothness grow like $\kappa^2$, so their weights are
# divided by $\kappa_\max$; the cap is ten times stronger than the diversity push, so the band
# $[\kappa_\min, \kappa_\max]$ holds whatever its level.
#
# **Runs.** One grid of configurations (`attention_atlas.experiments.fiber_bundle.chapter_grid`),
# each trained from scratch at every seed under identical conditions (width, depth, heads, steps,
# batch, learning-rate schedule, data order per seed) and shared across predictions where that is
# honest: the default model is also the "three regularisers" arm of P3, the $\alpha = 1$ arm of
# P2, the $r = 4$ arm of P6 and the $\kappa_\max = \tau/L$ level of P1. Every number below is a
# mean over seeds with a 95% Student-$t$ interval; comparisons between configurations are paired
# by seed. The book's models are deliberately tiny (this chapter must run on two shared CPU
# cores): the answers are answers *at this scale*, and the command printed beside each figure
# reruns the grid larger.

# %% tags=["parameters"]
steps = 200  # optimiser steps per run
dim = 64  # model width D
n_layers = 2  # blocks
n_heads = 4  # attention heads, head width 16
seq_len = 64  # context L (and training window)
batch_size = 8  # sequences per step
ranks = [1, 2, 4, 8]  # metric ranks r (P6); 4 is the default model
alphas = [0.0, 0.5, 1.0]  # training alphas (P2); 1 is the default model
kappa_factors = [0.1, 1.0, 10.0]  # kappa_max in units of tau / L (P1); 1 is the default model
analyse_seqs = 32  # validation windows for the post-training measurements
final_eval_batches = 8  # validation batches (of 32 windows) for the final bits per character
log_every = 25  # steps between log rows (metric trajectories of P3)
ablations = False  # also train each phase switched off alone, and the Cayley transport
time_reps = 5  # interleaved timing rounds of one training step per configuration
seeds = [0, 1, 2]  # every configuration at every seed
results_dir = (
    "artifacts/fiber-bundle/book"  # sweep folder under the repository, empty for a temporary one
)

# %% tags=["smoke"]
SMOKE = {
    "steps": 6,
    "dim": 32,
    "n_heads": 2,
    "seq_len": 32,
    "batch_size": 4,
    "ranks": [1, 4],
    "alphas": [0.0, 1.0],
    "kappa_factors": [1.0, 10.0],
    "analyse_seqs": 8,
    "final_eval_batches": 2,
    "log_every": 3,
    "seeds": [0, 1],
    "results_dir": "",
    "time_reps": 2,
}

# %%
import time
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from IPython.display import display
from plotly.subplots import make_subplots

import attention_atlas
from attention_atlas import viz
from attention_atlas.experiments import fiber_bundle as fb
from attention_atlas.experiments.fiber_bundle_analysis import TYPE_NAMES, verdict
from attention_atlas.models import PHASES
from attention_atlas.stats import mean_interval, paired_difference

t_chapter = time.perf_counter()
grid_kwargs = {
    "steps": steps, "dim": dim, "n_layers": n_layers, "n_heads": n_heads, "seq_len": seq_len,
    "batch_size": batch_size, "ranks": ranks, "alphas": alphas, "kappa_factors": kappa_factors,
    "analyse_seqs": analyse_seqs, "final_eval_batches": final_eval_batches, "log_every": log_every,
    "ablations": ablations,
}  # fmt: skip
repo = Path(attention_atlas.__file__).resolve().parents[2]
runs = fb.run_chapter(grid_kwargs, seeds, results_dir, repo)  # trains every missing cell
grid, df, COMMAND = runs.grid, runs.df, runs.command
assert np.isfinite(df["val_bpc"]).all(), "a run diverged"

# %% [markdown]
# ## Helpers: per-seed values, paired differences, verdicts
#
# `runs.per_seed(config, column)` gives one value per seed; `runs.paired(a, b, column)` the mean
# and 95% interval of the per-seed difference `a - b` (same seeds, so the seed-to-seed variation
# of the data order cancels). A prediction is *supported* when the interval of the effect it
# predicts excludes zero in the predicted direction, *contradicted* when it excludes zero in the
# other direction, and *inconclusive at this scale* otherwise (`verdict`). Two small plotting
# helpers draw means over seeds with their intervals (`viz.mean_interval`) and the dot-product
# model's mean as a reference line.

# %%
LAST = n_layers  # index of the last block's hidden state (0 = embedding)
tau_over_L = fb.kappa_scale(dim, n_heads, seq_len)
per_seed, paired = runs.per_seed, runs.paired
VERDICTS: dict[str, str] = {}


def with_interval(fig, groups, x, name, color, col=None, legend=True, **marker):
    """Means over seeds with 95% intervals, as a coloured line (subplot ``col`` of row 1)."""
    viz.mean_interval(groups, x=x, fig=fig, row=1 if col else None, col=col, name=name,
                      mode=marker.pop("mode", "lines+markers"), color=color)  # fmt: skip
    fig.data[-1].update(showlegend=legend, line={"color": color}, marker=marker)


def reference_line(fig, xs, value, col):
    """The dot-product model's mean over seeds as a dashed line across ``xs``."""
    fig.add_trace(go.Scatter(x=[min(xs), max(xs)], y=[value, value], mode="lines",
                             name="dot product (mean)", showlegend=col == 1,
                             line={"dash": "dash", "color": viz.COLORS[1]}), row=1, col=col)  # fmt: skip


# %% [markdown]
# ## Every configuration against the dot-product baseline
#
# Validation bits per character (on the first `final_eval_batches` x 32 windows of the
# validation split) and training wall time of every configuration, with the paired difference
# to the dot-product Transformer of the same width, depth, steps and data.

# %%
display(runs.overview(LAST))

fig = make_subplots(
    rows=1, cols=2, subplot_titles=("validation bits per character", "training time (s)")
)
for col, metric in enumerate(("val_bpc", "train_time_s"), start=1):
    viz.mean_interval({name: per_seed(name, metric) for name in grid}, fig=fig, row=1, col=col,
                      mode="bar")  # fmt: skip
fig.update_layout(
    title=f"All configurations, mean and 95% interval over {len(seeds)} seeds",
    height=440,
    margin={"t": 110},
)
viz.show(fig)
print("command:", COMMAND)
fbt_ratio = per_seed("fbt", "train_time_s").mean() / per_seed("dot", "train_time_s").mean()
d_bpc = paired("fbt", "dot", "val_bpc")
viz.markdown(
    f"After {steps} steps the dot-product baseline reaches {runs.interval('dot', 'val_bpc')} bits "
    f"per character and the default Fiber Bundle Transformer {runs.interval('fbt', 'val_bpc')} "
    f"(paired difference {d_bpc.format(signed=True)}), at {fbt_ratio:.1f} times the training time. "
    f"At this scale ({steps * batch_size * seq_len:,} training characters seen per run) both "
    "models are early in training; "
    "the bits-per-character comparisons below are about direction, not final quality."
)

# %% [markdown]
# ## P1: a transition at metric strength $\tau / L$?
#
# Proposition 3.5 bounds the change that the metric makes to the attention matrix by
# $L \bar U^2 M / \tau$ ($\bar U^2 = \max_t \lVert U_t\rVert_F^2$): below $\bar U^2 \sim \tau/L$
# the attention is provably a small perturbation of Euclidean attention, and Conjecture 3.6 says
# that above it the geometry should resist rank collapse. We train with the metric held in the
# band $[\kappa_\max/2, \kappa_\max]$ for $\kappa_\max$ across `kappa_factors` $\times\, \tau/L$ and
# measure what the trained model does: the effective rank of the last block's hidden states,
# the second singular value $\sigma_2$ of its attention matrices (the quantity of Conjecture 3.6),
# and bits per character. The x axis is the metric strength the trained model actually has,
# $\bar U^2$ in units of $\tau / L$.

# %%
p1_names = {c: ("fbt" if c == 1.0 else f"fbt_kappa-{c:g}") for c in kappa_factors}
p1_names = {c: n for c, n in p1_names.items() if n in grid}
# trained max_t |U_t|_F^2 (per head, the paper's U-bar^2) in units of tau / L
strength = {c: runs.last_logged(n, "kappa_max") / tau_over_L for c, n in p1_names.items()}
free_strength = runs.last_logged("fbt_reg-none", "kappa_max") / tau_over_L
panels = {
    f"effective rank, block {LAST}": lambda n: per_seed(n, f"erank_{LAST}"),
    "attention sigma_2 (mean over blocks)": lambda n: runs.mean_over_layers(n, "sigma2_{l}"),
    "validation bpc": lambda n: per_seed(n, "val_bpc"),
}
fig = make_subplots(rows=1, cols=3, subplot_titles=tuple(panels))
xs = [float(strength[c].mean()) for c in p1_names]
for col, measure in enumerate(panels.values(), start=1):
    with_interval(fig, {n: measure(n) for n in p1_names.values()}, xs, "Fiber Bundle",
                  viz.COLORS[0], col, legend=col == 1)  # fmt: skip
    reference_line(fig, xs, float(measure("dot").mean()), col)
    fig.add_vline(x=1.0, line_dash="dot", line_color="grey", row=1, col=col)
    # the model trained with no geometric regulariser (P3) sets its own strength: one more point
    with_interval(fig, {"fbt_reg-none": measure("fbt_reg-none")}, [float(free_strength.mean())],
                  "no regulariser (strength not imposed)", viz.COLORS[2], col, legend=col == 1,
                  mode="markers", symbol="diamond", size=11)  # fmt: skip
fig.update_xaxes(type="log", title_text="max_t |U_t|² / (τ/L)")
fig.update_layout(
    title="P1: metric strength across the critical scale τ/L", height=440, margin={"t": 110}
)
viz.show(fig)
print("command:", COMMAND)

lo_c, hi_c = min(p1_names), max(p1_names)
d_er = paired(p1_names[hi_c], p1_names[lo_c], f"erank_{LAST}")
d_s2 = paired_difference(
    runs.mean_over_layers(p1_names[hi_c], "sigma2_{l}"),
    runs.mean_over_layers(p1_names[lo_c], "sigma2_{l}"),
)
d_lo_dot = paired(p1_names[lo_c], "dot", f"erank_{LAST}")
VERDICTS["P1"] = verdict(d_er)
reached = ", ".join(f"{c:g}: {strength[c].mean():.2g}" for c in p1_names)
d_free = paired("fbt_reg-none", "dot", f"erank_{LAST}")
viz.markdown(
    f"**P1.** The cap held the metric where it was put (trained $\\bar U^2 / (\\tau/L)$ by cap level: "
    f"{reached}). From the weakest to the strongest metric ({lo_c:g} to {hi_c:g} times $\\tau/L$), the "
    f"last block's effective rank changes by {d_er.format(2, signed=True)} and the attention's "
    f"$\\sigma_2$ by {d_s2.format(signed=True)}; at the weakest level the effective rank differs "
    f"from the dot-product model's by {d_lo_dot.format(2, signed=True)}. The predicted rise in rank "
    f"above $\\tau / L$ is **{VERDICTS['P1']}** over the imposed levels. The model trained without "
    f"geometric regulariser chose its own strength, {free_strength.mean():.3g} times $\\tau / L$ "
    f"(deep in the super-critical regime), and its last block's effective rank exceeds the "
    f"dot-product model's by {d_free.format(2, signed=True)}."
)

# %% [markdown]
# ## P2: train at one $\alpha$, evaluate at another
#
# Proposition 6.2: parameters trained at $\alpha_\text{train}$ and evaluated at
# $\alpha_\text{infer} \ne \alpha_\text{train}$ do worse than parameters trained at
# $\alpha_\text{infer}$. Each model trained at one $\alpha$ is evaluated at every $\alpha$ of the grid;
# the diagonal is "retrained at the evaluation $\alpha$". The gap is the mismatched model's bits per
# character minus the matched model's, paired by seed. One expectation from the algebra: with the
# distance baseline, $\alpha$ scales only the metric terms, and
# $\lVert U_i^\top (q_i - k_j) \rVert^2 \le \kappa_i \lVert q_i - k_j \rVert^2$, so with the metric held
# near $\kappa \approx \tau / L$ (the default model) the metric moves each distance by a few percent
# at most: a small lever, whose mismatch may well be below what three seeds resolve.

# %%
p2_names = {a: ("fbt" if a == 1.0 else f"fbt_alpha-{a:g}") for a in alphas}
p2_names = {a: n for a, n in p2_names.items() if n in grid}
fig = go.Figure()
for k, (a_tr, n) in enumerate(p2_names.items()):
    bpc_at = {f"{a_ev:g}": per_seed(n, f"bpc_at_alpha_{a_ev:g}") for a_ev in p2_names}
    with_interval(fig, bpc_at, list(p2_names), f"trained at alpha={a_tr:g}",
                  viz.COLORS[k % len(viz.COLORS)])  # fmt: skip
diag = [float(per_seed(n, f"bpc_at_alpha_{a:g}").mean()) for a, n in p2_names.items()]
fig.add_trace(go.Scatter(x=list(p2_names), y=diag, mode="markers", name="retrained at that alpha",
                         marker={"size": 16, "symbol": "circle-open", "color": "black"}))  # fmt: skip
fig.update_layout(title="P2: validation bpc at every evaluation alpha", xaxis_title="evaluation alpha",
                  yaxis_title="bits per character", height=420)  # fmt: skip
viz.show(fig)
print("command:", COMMAND)

gaps = runs.alpha_gaps(p2_names)
within = runs.alpha_sensitivity(p2_names)
display(gaps)
gap_verdicts = list(gaps["verdict"]) if len(gaps) else []
n_sup = sum(v == "supported" for v in gap_verdicts)
n_con = sum(v == "contradicted" for v in gap_verdicts)
VERDICTS["P2"] = (
    "supported" if n_sup == len(gap_verdicts) and gap_verdicts else
    "contradicted" if n_con == len(gap_verdicts) and gap_verdicts else
    "inconclusive at this scale" if n_sup == n_con == 0 else
    f"supported for {n_sup} of {len(gap_verdicts)} mismatched pairs, contradicted for {n_con}"
)  # fmt: skip
viz.markdown(
    f"**P2.** Of {len(gap_verdicts)} mismatched (train, evaluate) pairs, the matched retrained model is "
    f"better with an interval excluding zero in {n_sup}, worse in {n_con}, and indistinguishable in "
    f"{len(gap_verdicts) - n_sup - n_con}. Prediction P2: **{VERDICTS['P2']}**. Within any one "
    f"trained model, moving $\\alpha$ across the grid changes bits per character by at most {within:.2g}: "
    "the metric these models carry is too weak for $\\alpha$ to matter, so the gaps above are the "
    "run-to-run differences between separately trained models, not an effect of $\\alpha$. Note what "
    "the proposition does and does not say: it compares with *retraining*, and it is local in $\\alpha$."
)

# %% [markdown]
# ## P3: does the metric collapse, $U_t \to 0$?
#
# Conjecture 6.3: with no geometric regulariser, or with only an $\ell_2$ penalty on
# $\lVert U_t \rVert$, the metric factors collapse to zero and the geometry dies; the three
# regularisers are the countermeasure. Note a fact of the architecture that makes collapse
# plausible: every place $U$ enters (the geodesic score, A++, the curvature proxy, the
# preconditioned step) is quadratic in $U$, so $U = 0$ is a stationary point of the loss and the
# gradient on a small $U$ is proportionally small. MetricNet starts near zero (its last layer at
# scale 0.02), AdamW's weight decay (0.1) acts on it in every arm. We log
# $\bar\kappa = \mathrm{mean}_t \lVert U_t \rVert_F^2$ during training, and compare the trained
# value with the initial one (same seed, same initial weights).

# %%
p3 = {
    "no geometric regulariser": "fbt_reg-none",
    "L2 only": "fbt_reg-l2",
    "three regularisers": "fbt",
}
fig = make_subplots(
    rows=1, cols=2, subplot_titles=("mean kappa_t = |U_t|_F^2", "cross-token variance of kappa_t")
)
for k, (label, n) in enumerate(p3.items()):
    for col, key in enumerate(("kappa_mean", "kappa_var"), start=1):
        x, values = runs.trajectory(n, key)  # kappa_mean starts at its value at initialisation
        per_step = {str(i): values[:, i] for i in range(values.shape[1])}
        with_interval(fig, per_step, x, label, viz.COLORS[k], col, legend=col == 1)
fig.add_hline(y=tau_over_L / 2, line_dash="dot", line_color="grey", row=1, col=1,
              annotation_text="kappa_min of the three-regulariser arm")  # fmt: skip
fig.update_yaxes(type="log")
fig.update_xaxes(title_text="step")
fig.update_layout(title="P3: metric strength during training", height=440, margin={"t": 110})
viz.show(fig)
print("command:", COMMAND)

ratios = {
    label: mean_interval(
        np.log10(
            runs.mean_over_layers(n, "kappa_{l}_mean") / runs.mean_over_layers(n, "kappa_init_{l}")
        )
    )
    for label, n in p3.items()
}
collapse = {lab: verdict(ratios[lab], sign=-1) for lab in ("no geometric regulariser", "L2 only")}
VERDICTS["P3"] = (
    "supported" if all(v == "supported" for v in collapse.values()) else
    "contradicted" if all(v == "contradicted" for v in collapse.values()) else
    "mixed: " + "; ".join(f"{k}: {v}" for k, v in collapse.items())
)  # fmt: skip
viz.markdown(
    "**P3.** Change of the mean metric strength over training, $\\log_{10}(\\bar\\kappa_\\text{final} / "
    "\\bar\\kappa_\\text{init})$: "
    + "; ".join(f"{lab}: {ratios[lab].format(2, signed=True)}" for lab in p3)
    + f". Collapse ($U \\to 0$, a negative change) without the geometric regularisers is "
    f"**{VERDICTS['P3']}**. Without them the metric is also far from homogeneous "
    f"(coefficient of variation of $\\kappa_t$ over tokens "
    f"{runs.layer_interval('fbt_reg-none', 'kappa_{l}_cv').format(2)}), and that model's bits "
    f"per character differ from the dot-product model's by "
    f"{paired('fbt_reg-none', 'dot', 'val_bpc').format(signed=True)} "
    f"(the capped default: {paired('fbt', 'dot', 'val_bpc').format(signed=True)})."
)

# %% [markdown]
# ## P4: is curvature heterogeneous, and does it follow the text?
#
# Conjecture 6.1: the trained $\kappa_t$ should vary across tokens, and vary with "semantic
# complexity". At the character level we use two proxies: the kind of character (letters at the
# start of a word, which are the hardest to predict, against letters inside a word, word
# boundaries `_` and punctuation), and the surprisal $-\log_2 p(x_t \mid x_{<t})$ of the character
# under the trained model. $\kappa_t$ is averaged over the heads of a block.

# %%
fig = make_subplots(
    rows=1, cols=n_layers, subplot_titles=[f"block {l}" for l in range(1, n_layers + 1)]
)
tok = runs.tokens("fbt")
for l in range(1, n_layers + 1):
    for code, name in enumerate(TYPE_NAMES):
        vals = tok.loc[tok["type"] == code, f"kappa_{l}"].to_numpy()
        if len(vals):
            fig.add_trace(go.Box(y=vals, name=name, showlegend=False, boxpoints=False,
                                 marker_color=viz.COLORS[code % len(viz.COLORS)]), row=1, col=l)  # fmt: skip
fig.update_yaxes(title_text="κ_t = |U_t|²_F (mean over heads)", col=1)
fig.update_layout(
    title="P4: distribution of κ_t by token type (default model, all seeds)",
    height=460,
    margin={"t": 110},
)
viz.show(fig)
print("command:", COMMAND)

display(runs.kappa_by_type({"fbt": "default (capped)", "fbt_reg-none": "no regulariser"}))
hetero = runs.layer_interval("fbt", "kappa_{l}_cv")
rho = runs.layer_interval("fbt", "kappa_{l}_spearman_surprisal")
het_verdict = "supported" if hetero.resolved and hetero.low > 0.1 else "inconclusive at this scale"
VERDICTS["P4"] = f"heterogeneity {het_verdict}; correlation with surprisal {verdict(rho)}"
viz.markdown(
    f"**P4.** The trained curvatures vary across tokens: the coefficient of variation of $\\kappa_t$ "
    f"(mean over blocks) is {hetero.format(3)}, where we call heterogeneous a CV above 0.1 "
    f"(note that the regularisers hold $\\kappa_t$ in a band of a factor 2). Their rank correlation with "
    f"the surprisal of the character is {rho.format(signed=True)}. Prediction P4: **{VERDICTS['P4']}**. "
    f"For the model trained without regulariser, where nothing holds $\\kappa_t$ in a band, the CV is "
    f"{runs.layer_interval('fbt_reg-none', 'kappa_{l}_cv').format(3)} and the rank correlation with "
    f"surprisal {runs.layer_interval('fbt_reg-none', 'kappa_{l}_spearman_surprisal').format(signed=True)}. "
    "The token-type differences are in the table, relative to the mean $\\kappa$; a positive "
    "word-initial minus word-internal difference is what 'more curvature where prediction is "
    "harder' would look like."
)

# %% [markdown]
# ## P5: effective rank per layer against a matched dot-product Transformer
#
# The paper (P5) asks that rank be compared with a full residual Transformer trained under the
# same conditions, not with the pure-attention limit of {cite}`dong2021attention`. We compute the
# entropy effective rank {cite}`roy2007effective` of each block's hidden states $(L \times D)$ per
# validation window, averaged over windows, for the default Fiber Bundle model (metric capped at
# $\tau / L$), the Fiber Bundle model trained without geometric regulariser (whose metric grows
# freely, see P3), and the dot-product model with the same width, depth, heads, steps and data.

# %%
layers_x = list(range(0, n_layers + 1))
er = {name: np.array([[runs.cells[(name, s)][f"erank_{l}"] for l in layers_x] for s in seeds])
      for name in ("dot", "fbt", "fbt_reg-none")}  # fmt: skip
fig = viz.line_band(layers_x, {"dot product": er["dot"], "Fiber Bundle (capped at tau/L)": er["fbt"],
                               "Fiber Bundle (no regulariser)": er["fbt_reg-none"]},
                    title="P5: effective rank of the hidden states per block",
                    xlabel="block (0 = embedding)", ylabel="effective rank")  # fmt: skip
viz.show(fig)
print("command:", COMMAND)
word = {"supported": "higher", "contradicted": "lower"}
p5 = paired("fbt", "dot", f"erank_{LAST}")
p5_free = paired("fbt_reg-none", "dot", f"erank_{LAST}")
VERDICTS["P5"] = (
    f"capped model: {word.get(verdict(p5), 'no difference detectable')}; "
    f"unregularised model: {word.get(verdict(p5_free), 'no difference detectable')} than dot product"
)
viz.markdown(
    f"**P5.** Effective rank of the last block (of at most {min(seq_len, dim)}): dot product "
    f"{runs.interval('dot', f'erank_{LAST}').format(2)}, Fiber Bundle capped at $\\tau/L$ "
    f"{runs.interval('fbt', f'erank_{LAST}').format(2)} (paired difference {p5.format(2, signed=True)}), "
    f"Fiber Bundle without regulariser {runs.interval('fbt_reg-none', f'erank_{LAST}').format(2)} "
    f"(difference {p5_free.format(2, signed=True)}): **{VERDICTS['P5']}**. Effective rank is not "
    "quality by itself; the bits per character of both are in the overview table."
)

# %% [markdown]
# ## P6: metric rank ablation
#
# Conjecture 6.4: the anti-collapse benefit grows with the metric rank $r$, with a threshold
# $r_\min$ below which the correction is too weak. We train $r \in$ `ranks` (all else as the
# default model) and plot the last block's effective rank, bits per character and training time.

# %%
p6_names = {r: ("fbt" if r == 4 else f"fbt_rank-{r}") for r in ranks}
p6_names = {r: n for r, n in p6_names.items() if n in grid}
columns = (f"erank_{LAST}", "val_bpc", "train_time_s")
fig = make_subplots(
    rows=1,
    cols=3,
    subplot_titles=(f"effective rank, block {LAST}", "validation bpc", "training time (s)"),
)
for col, column in enumerate(columns, start=1):
    with_interval(fig, {n: per_seed(n, column) for n in p6_names.values()}, list(p6_names),
                  "Fiber Bundle", viz.COLORS[0], col, legend=col == 1)  # fmt: skip
    reference_line(fig, list(p6_names), float(per_seed("dot", column).mean()), col)
fig.update_xaxes(type="log", title_text="metric rank r")
fig.update_layout(title="P6: metric rank ablation", height=440, margin={"t": 110})
viz.show(fig)
print("command:", COMMAND)
r_lo, r_hi = min(p6_names), max(p6_names)
p6 = paired(p6_names[r_hi], p6_names[r_lo], f"erank_{LAST}")
p6_bpc = paired(p6_names[r_hi], p6_names[r_lo], "val_bpc")
VERDICTS["P6"] = verdict(p6)
viz.markdown(
    f"**P6.** From $r = {r_lo}$ to $r = {r_hi}$ the last block's effective rank changes by "
    f"{p6.format(2, signed=True)} and bits per character by {p6_bpc.format(signed=True)}. The "
    f"predicted increase of rank with $r$ is **{VERDICTS['P6']}**."
)

# %% [markdown]
# ## Transport: how far is $P = I + \Delta$ from an isometry?
#
# Eq. (25): $P^\top P = I + \Delta^\top \Delta$, so the linear transport is an isometry only to
# second order; the Cayley form is exactly orthogonal. The diagnostic logged during training
# measures both on the same trained $\Delta_t$ (mean over tokens of $\lVert P^\top P - I\rVert_F$).

# %%
iso = {kind: runs.last_logged("fbt", f"iso_{kind}") for kind in ("linear", "cayley")}
dfro = runs.last_logged("fbt", "delta_fro")
assert iso["cayley"].max() < 1e-6, "the Cayley transport must be orthogonal to rounding"
if float(np.mean(dfro)) < 0.3:
    iso_text = (
        "The transport the models learn is small, so the linear form's defect, second order in "
        "$\\lVert\\Delta\\rVert$, is negligible here."
    )
else:
    iso_text = (
        "The transport the models learn is *not* small: with $\\lVert\\Delta_t\\rVert_F$ of order one, "
        "the defect of eq. (25) is of order one too, and $P = I + \\Delta$ is not close to an isometry; "
        "only the Cayley form deserves the name of a metric-preserving transport at this size."
    )
viz.markdown(
    f"After training, $\\lVert\\Delta_t\\rVert_F$ = {mean_interval(dfro).format(3)} and the isometry "
    f"error $\\lVert P^\\top P - I\\rVert_F$ is {mean_interval(iso['linear']).format(3)} for "
    f"$P = I + \\Delta$ against {iso['cayley'].max():.1e} (at most) for the Cayley form. "
    + iso_text
)

# %% [markdown]
# ## Cost of one training step, side by side
#
# Wall times of separate runs on a shared machine mix the model's cost with the machine's load.
# Here one forward and one forward+backward of each model on the same batch are timed in one
# process, interleaved, with the median ratio to the dot-product model
# (`fiber_bundle.step_cost`, through `attention_atlas.bench.compare`): the default model, the
# metric ranks of P6, and the default with each phase switched off alone.

# %%
cost = fb.step_cost(dim=dim, n_layers=n_layers, n_heads=n_heads, seq_len=seq_len,
                    batch_size=batch_size, ranks=ranks, reps=time_reps)  # fmt: skip
display(cost.round(2))
fig = go.Figure(go.Bar(x=list(cost.index), y=cost["forward+backward ratio"]))
fig.update_layout(title="Forward+backward time relative to the dot-product model (median, interleaved)",
                  yaxis_title="ratio to dot product", height=400)  # fmt: skip
viz.show(fig)
PHASE_LABEL = {"a": "A", "a_plus": "A++", "b": "B", "c": "C", "d": "D", "e": "E"}
saved = {ph: 1 - cost.loc[f"fbt_no-{ph}", "forward+backward ratio"] / cost.loc["fbt", "forward+backward ratio"]
         for ph in PHASES}  # fmt: skip
viz.markdown(
    f"One training step of the default Fiber Bundle Transformer costs "
    f"{cost.loc['fbt', 'forward+backward ratio']:.1f} times the dot-product model's at this size. "
    "Switching one phase off saves: "
    + ", ".join(f"{PHASE_LABEL[ph]} {100 * s:.0f}%" for ph, s in saved.items())
    + ". No single phase dominates: the cost is the many small per-token, per-head operations "
    "(factor networks, projections, transport, the Woodbury solve of Phase E), each cheap in "
    "arithmetic but each a separate pass over the activations."
)

# %% [markdown]
# ## Closing note: the six predictions at this scale

# %%
summary = pd.DataFrame(
    {"prediction": ["P1 transition at tau/L", "P2 alpha consistency", "P3 metric collapse without regularisers",
                    "P4 curvature heterogeneity", "P5 rank vs matched dot product", "P6 rank grows with r"],
     "result": [VERDICTS[k] for k in ("P1", "P2", "P3", "P4", "P5", "P6")]}
)  # fmt: skip
display(summary.set_index("prediction"))
elapsed = time.perf_counter() - t_chapter
compute = float(df["cell_seconds"].sum())
viz.markdown(
    f"All numbers come from {len(df)} training runs ({len(grid)} configurations x {len(seeds)} seeds) of "
    f"{steps} steps on {batch_size} x {seq_len} characters, width {dim}, {n_layers} blocks, {n_heads} heads. "
    f"The runs took {compute:.0f} s of wall time when they were made (training, evaluation and "
    f"measurements, on this machine as loaded then); this execution of the chapter took {elapsed:.0f} s "
    f"(runs already present in the results folder are reused). To rerun it larger: `python -m attention_atlas sweep fiber-bundle --preset long` "
    "and point `results_dir` at its output with the same grid parameters."
)
free_grows = verdict(ratios["no geometric regulariser"]) == "supported"  # log-ratio > 0
free_rank = verdict(p5_free) == "supported"
capped_inert = VERDICTS["P2"].startswith("inconclusive") and not verdict(p5).startswith("supported")
if free_grows and free_rank and capped_inert:
    viz.markdown(
        "**What this says at this scale.** The clearest signal is the opposite of the collapse "
        "conjecture: left without geometric regulariser, the metric grows by orders of magnitude, far "
        "into the super-critical regime, and that model keeps more rank than the dot-product model. "
        "Held near $\\tau / L$, as Section 6.4 recommends for $\\kappa_\\max$, the geometry is too weak "
        "to change anything we can measure (P2, P5). Only $\\ell_2$ regularisation collapses it."
    )
else:
    viz.markdown(
        "**What this says at this scale.** See the verdicts above; the pattern of the book run "
        "(unregularised metric growing, capped metric inert) did not hold in this execution."
    )
assert set(VERDICTS) == {"P1", "P2", "P3", "P4", "P5", "P6"}
