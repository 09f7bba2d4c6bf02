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
# # 9. The zoo on equal footing
#
# Chapters 1 to 7 each took one idea on its own terms. A researcher choosing an attention
# variant asks two questions first: **can it recall**, and **what does it cost per unit of
# compute**? This chapter puts every trainable variant of the library through one protocol,
# with the same model, the same data, the same training and the same budget:
#
# * dot-product, Euclidean, Riemannian and Fiber Bundle (chapters 1-4), matroidal and dense
#   Mahalanobis (chapter 5), the SSM (chapter 7), and dot-product attention with the cofactor
#   regulariser (chapter 6);
# * recall measured by **multi-query associative recall** (MQAR), the small-scale test of
#   Zoology {cite}`arora2024zoology`: key-value pairs, then queries of earlier keys, each to be
#   answered with its value. Softmax attention solves it by looking the key up (an induction
#   head {cite}`olsson2022context`); a model with a fixed recurrent state must hold every pair
#   in that state, so its accuracy should fall as the pairs grow;
# * cost measured as time per training step (side by side against dot) and as char-PTB
#   validation bpc after the same wall-clock budget.
#
# Everything is computed by `attention_atlas.experiments.zoo.run` (grid and cells) and
# `zoo_analysis` (tables, figures, anchors, claims) through the sweep runner; the chapter loads
# the stored grid when it matches its parameters.

# %% tags=["parameters"]
variants = ["dot", "euclidean", "riemannian", "fiber_bundle", "matroidal", "mahalanobis", "ssm",
            "cofactor"]  # fmt: skip
widths = [64, 128]  # model widths D at centre_pairs
pairs = [4, 8]  # key-value pairs N at centre_width
centre_width = 64
centre_pairs = 4
centre_only = ["riemannian", "fiber_bundle"]  # arms the book runs at the centre cell only
seq_len = 32  # MQAR sequence length (max(seq_len, 4 N)); the long protocol: 64
vocab_size = 64  # keys 1..31, values 32..63 (the long protocol: 512)
steps = 300  # optimiser steps of every MQAR run
batch_size = 32
lrs = [1e-3, 3e-3, 1e-2]  # candidates, chosen per variant at the centre on select_seed
log_every = 50  # steps between points of the learning curves
ptb_budget_s = 8.0  # char-PTB wall-clock budget per run (seconds of training)
seeds = [0, 1, 2]
threads = 1
use_stored = True  # load the stored book results (results/zoo/book) when they match these

# %% tags=["smoke"]
SMOKE = {
    "widths": [16], "pairs": [2, 4], "centre_width": 16, "centre_pairs": 2, "seq_len": 16,
    "vocab_size": 16, "steps": 3, "batch_size": 8, "lrs": [1e-3, 3e-3], "log_every": 1,
    "ptb_budget_s": 0.5, "centre_only": [], "use_stored": False,
}  # fmt: skip
from attention_atlas.notebooks.lab import apply_smoke  # with ATTENTION_ATLAS_SMOKE=1 in JupyterLab

apply_smoke(SMOKE, globals())

# %%
import time

import pandas as pd
import torch
from IPython.display import display

from attention_atlas import experiments, viz
from attention_atlas.claims import claim
from attention_atlas.data import IGNORE_INDEX, mqar_task
from attention_atlas.data.mqar import chance_levels
from attention_atlas.experiments import atlas, sweep_command
from attention_atlas.experiments.zoo import analysis as za
from attention_atlas.experiments.zoo import run as zoo

torch.set_num_threads(threads)
t_chapter = time.perf_counter()
SMALL = use_stored is False  # the smoke run: toy sizes, nothing stored is read


def show_outcome(key, outcome):
    """A claim of the register and the outcome this chapter computes for it."""
    c = claim(key)
    viz.markdown(
        f"**Claim `{key}`** ({c.source} of the {c.seed} seed): {c.statement} "
        f"**Outcome: {outcome.outcome}**: {outcome.summary}. *Scale*: {outcome.scale}."
    )


# %% [markdown]
# ## 1. The task: multi-query associative recall
#
# A sequence of $N$ key-value pairs $k_1 v_1 \dots k_N v_N$ is followed by a stretch where
# every key comes back once, at a random place among noise tokens; at each query the model must
# emit the value paired with that key. Keys and values are drawn from two halves of the
# vocabulary, the queries' places from Zoology's power law (most queries soon after the pairs),
# and only the $N$ value positions are scored (loss and accuracy; every other target is
# `IGNORE_INDEX`). The format and a worked example are in `attention_atlas.data.mqar`. Here is
# one generated sequence (its vocabulary and key range are printed with it):

# %%
example = mqar_task(1, 1, 1, seq_len=16, n_pairs=3, vocab_size=16, seed=4)
x0, y0 = example.train_x[0].tolist(), example.train_y[0].tolist()
display(pd.DataFrame({"input": x0, "target": ["." if t == IGNORE_INDEX else t for t in y0]}).T)
V0 = example.vocab_size
print(f"vocabulary {V0}: keys 1..{V0 // 2 - 1}, values {V0 // 2}..{V0 - 1}; '.' is not scored")
chance = chance_levels(centre_pairs, vocab_size)
viz.markdown(
    f"Chance at the centre of the grid ({centre_pairs} pairs, vocabulary {vocab_size}): a value "
    f"guessed uniformly is right with probability {chance['uniform']:.3f}; a value copied from "
    f"the sequence's own pairs, {chance['context']:.3f} = 1/N. The second is the bar a model "
    "must clear to show recall: it is what a model that has learned *where* values are, but "
    "not *which* goes with the query, reaches."
)

# %% [markdown]
# ## 2. The protocol
#
# **One model.** Every arm is the library's `Transformer` with learned positions, untied input
# and output embeddings, and no MLP, as Zoology's MQAR models, plus a **token shift**: each
# embedding $h_t$ gets $W h_{t-1}$ added, a learned map of the previous position's embedding
# (`ModelConfig(token_shift=True)`), the short convolution of H3 {cite}`fu2023hungry` that
# Zoology's Based and Mamba also carry. With it, one attention layer can bind a key to the value
# that follows it; without it, the binding needs a previous-token head, which forms late and
# abruptly {cite}`olsson2022context`, so at this budget it measures the luck of that moment, not
# recall. The SSM arm starts from a recall initialisation (`zoo.SSM_RECALL_INIT`: state that
# decays over tens of positions rather than Mamba-2's few). All four choices are tested at the
# end of this section. A consequence: the Fiber Bundle arm's Phase E, which preconditions the
# MLP's update, has nothing to act on; its phases A to D are on. The arms differ only in the
# attention, and the cofactor arm in its regulariser (as in chapter 6).
#
# **The same data, the cross, one learning rate per arm.** The cell below states the sizes
# from the grid itself. Training sets are fixed arrays rather than sequences drawn on the fly:
# they take under a second to draw, keep the harness's resumable sampler, and no run sees its
# training set more than a few times, far too few to memorise the bindings of that many random
# sequences (section 3 shows the training-split accuracy beside the test accuracy). The
# learning rate of each arm is chosen from the candidates by validation accuracy at the centre
# cell on one seed (ties: the smaller), and every cell reports **test** accuracy over the seeds
# with 95% intervals.

# %%
params = {
    "variants": variants, "widths": widths, "pairs": pairs, "centre_width": centre_width,
    "centre_pairs": centre_pairs, "centre_only": centre_only, "seq_len": seq_len,
    "vocab_size": vocab_size, "steps": steps, "batch_size": batch_size, "lrs": lrs,
    "log_every": log_every, "ptb_budget_s": ptb_budget_s,
}  # fmt: skip
if SMALL:
    params = {**zoo.PRESETS["smoke"], **params}
grid = experiments.stored_or_run("zoo", params=params, seeds=seeds, use_stored=use_stored, log=None)
print(grid.provenance.text)
runs = za.mqar_frame(grid.frame)
viz.markdown(za.protocol_text(grid, zoo.PRESETS["long"]))
print("the long protocol:", sweep_command("zoo", "long", zoo.PRESETS["long"], seeds))
za.chosen_lrs(runs)

# %% [markdown]
# Why no MLP, untied embeddings, the token shift and the SSM's initialisation: the same
# dot-product model at the easiest cell with an MLP of width $4D$ in each block, with the output
# matrix tied to the input embedding (the library's default), or without the token shift; and
# the SSM at the centre with Mamba-2's initialisation; each trained identically, at its arm's
# chosen learning rate. A model that has not formed the recall circuit sits on a plateau where
# it has learned *where* the values are but not which one goes with the query (the chance level
# of copying a context value).

# %%
display(za.ablation_table(grid.frame))
print(grid.provenance.text)

# %% [markdown]
# ## 3. Recall against width, pairs and parameters
#
# The leaderboard: MQAR test accuracy, mean and 95% interval over the seeds, per arm and cell
# (`w<D>-p<N>`).

# %%
board = za.leaderboard(runs)
display(board)
print(grid.provenance.text)

# %%
for along in ("width", "pairs", "params"):
    viz.show(za.accuracy_figure(runs, along))
print(grid.provenance.text)

# %% [markdown]
# The SSM keeps a fixed state: per layer, one $d\times d$ matrix per head ($d = D/H$), whatever
# the number of pairs. Softmax attention keeps every key and value, so what it can look up
# grows with the sequence:

# %%
display(za.state_table(grid))

# %% [markdown]
# The anchors below are asserted: if dot-product attention does not reach the anchor accuracy
# on the easiest cell the set-up is broken; an SSM that learns must lose accuracy as the pairs
# grow at its fixed state (an SSM that does not learn at this budget is said to, and its fall
# is not counted as evidence); and every arm that is said to learn must beat the chance of
# copying a context value. "Falls" and "beats" are one-sided statements, so each is read off a
# one-sided 95% bound: the low end of a 90% interval (`za.ANCHOR_LEVEL`).

# %%
anchor = za.anchors(runs)
if not SMALL:
    assert anchor["dot_ok"], f"dot at the easiest cell: {anchor['dot_easiest']}"
    # the fall is a statement about recall only for an SSM that learns (see the text below)
    assert anchor.get("ssm_ok") or not anchor.get("ssm_learns"), anchor.get("ssm_fall")
    assert anchor["chance_ok"], f"a learner is not above chance: {anchor['chance_bounds']}"
viz.markdown(za.anchor_text(anchor))

# %% [markdown]
# An SSM needs more steps than attention to learn recall (the chosen learning rates above show
# it at the book's budget), so the anchor on its fixed state is asked again of the long
# protocol's stored dot and SSM cells (vocabulary 512, so that keys outnumber the SSM's state
# dimension; 1,000 steps), when all of them are stored; there it must hold outright: the SSM
# learns at the fewest pairs and its accuracy falls as the pairs grow.

# %%
stored_long = None if SMALL else za.long_anchors()
if stored_long is None:
    viz.markdown("The long protocol's dot and SSM cells are not all stored: run the command "
                 "printed in section 2 to decide this anchor.")  # fmt: skip
else:
    long_anchor, long_grid = stored_long
    assert long_anchor["dot_ok"] and long_anchor["chance_ok"], long_anchor
    assert long_anchor["ssm_learns"] and long_anchor["ssm_ok"], long_anchor.get("ssm_fall")
    viz.markdown("**The long protocol** (dot and SSM cells): " + za.anchor_text(long_anchor))
    print(long_grid.provenance.text)

# %% [markdown]
# **Explore** the learning curves: pick an arm, a width and a pair count (cells outside the
# cross say so). Each line is one seed's validation accuracy during training; the dotted line
# is the chance of copying a context value.

# %%
explore_controls = {
    "variant": viz.dropdown(variants, variants[0], label="arm"),
    "width": viz.slider(sorted(set(runs.width)), centre_width, label="width D"),
    "pairs": viz.slider(sorted(set(runs.pairs)), centre_pairs, label="pairs N"),
}
viz.explore(
    lambda variant, width, pairs: za.learning_curves(grid.records, variant, width, pairs),
    explore_controls,
    main=True,
)

# %% [markdown]
# Memorisation check: training-split accuracy (on as many training rows as the validation
# split) against test accuracy, averaged over the cells and seeds of each arm.

# %%
runs.groupby("variant", sort=False)[["train_acc", "val_acc", "test_acc"]].mean().round(3)

# %% [markdown]
# ## 4. Cost: time per step, and char-PTB at the same wall-clock budget
#
# One training step (forward, loss, backward, AdamW update) of every arm at the centre cell,
# timed in interleaved rounds in one process against dot (`bench.compare`), once per seed:

# %%
display(za.timing_table(grid.frame))
print(grid.provenance.text)

# %% [markdown]
# Char-PTB: every arm trains for the same wall-clock budget (`schedule="time"`: the cosine
# schedule spans the budget; sizes in section 2), then its validation bpc is measured. A
# wall-clock budget is **not reproducible bit for bit**: the steps an arm completes depend on
# the machine and its load (the provenance line names the machine). A slower arm gets fewer
# steps: that is the point of the comparison.

# %%
display(za.ptb_table(grid.frame))
print(grid.provenance.text)

# %% [markdown]
# ## 5. Stability and data efficiency against the dot control
#
# Two seeds make claims this grid can test beside recall. The matroidal card claims *no loss
# of stability* and usefulness *in the low-data regime*; the cofactor card claims *lower
# gradient spikes* and *equal or better accuracy*. Each is decided by `stats.verdict` on the
# paired difference (arm minus dot, each seed's mean over the cells) against a smallest effect
# of interest declared in `zoo.SESOI` before the runs; "no loss"/"equal" claims are two-sided
# (an effect beyond the SESOI in either direction is a difference). The same function fills the
# claims register (`python -m attention_atlas claims`).

# %%
register = za.outcomes(grid=grid)
for key, outcome in register.items():
    show_outcome(key, outcome)

# %% [markdown]
# ## 6. Summary
#
# Per arm, the summary below is the one the variant report prints
# (`attention_atlas.experiments.atlas.recall_summary`): `python -m attention_atlas atlas report
# SPEC` runs the same cells for any attention, one of your own included, and places it on this
# leaderboard (README: "Your own attention").

# %%
for v in variants:
    viz.markdown(atlas.recall_text(atlas.recall_summary(grid.frame, v)))

# %%
summary = za.summary(runs, grid.frame, anchor, register)
viz.markdown(summary)
print(grid.provenance.text)
print(f"chapter time: {time.perf_counter() - t_chapter:.0f} s")
