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
# # An attention variant through the atlas
#
# This page is built by `python -m attention_atlas atlas report SPEC`: it takes one attention
# variant (a class of your own or one of the library's) through the analyses of the book's
# chapters and puts it beside the zoo. Every number on it is computed from the report's own
# cells, which the sweep runner stores and resumes; the zoo's numbers come from the stored
# results of chapter 9. A section the variant breaks says which check failed and why; the
# others are still built.

# %% tags=["parameters"]
variant = "dot"  # a registered name, package.module:Class or path/to/file.py:Class
preset = "book"  # smoke, book or long (attention_atlas.experiments.atlas.PRESETS)
options = {}  # the variant's constructor options (besides dim and n_heads)
params = {}  # report grid parameters over the preset's (rank_lengths, depth, cost_lengths, ...)
seeds = [0, 1, 2]
cells_dir = ""  # where the cells are stored and resumed ("": a temporary folder)
summary_path = ""  # where the JSON summary goes ("": not written)

# %% tags=["smoke"]
SMOKE = {"preset": "smoke"}
from attention_atlas.notebooks.lab import apply_smoke  # with ATTENTION_ATLAS_SMOKE=1 in JupyterLab

apply_smoke(SMOKE, globals())

# %%
import pandas as pd
from IPython.display import display

from attention_atlas import viz
from attention_atlas.experiments import atlas
from attention_atlas.experiments.atlas import probes
from attention_atlas.experiments.zoo import analysis as za
from attention_atlas.stats import RULE_TEXT

pd.set_option("display.max_colwidth", None)  # the checks' details and the verdicts' evidence
report = atlas.Report(variant, preset=preset, options=options, params=params, seeds=seeds,
                      cells_dir=cells_dir or None)  # fmt: skip
name = report.variant.name
viz.markdown(
    f"**Variant** `{name}`: {report.variant.source}; options {report.options or 'none'}; "
    f"preset `{preset}`, seeds {report.seeds}."
)

# %%
with report.section("cells") as s:
    grid = report.run(log=None)
    s["cells"] = len(grid.records)
    print(grid.provenance.text)

# %% [markdown]
# ## 1. The contract
#
# Every attention of the atlas is a module with one call, `attn(x, causal=..., mask=...,
# need_weights=...)`, returning outputs of the input's shape, dtype and device. The checks
# below hold it to that, at every seed: the shapes and dtypes, the device, a finite output,
# **causal masking** (with `causal=True`, perturbing token j must leave every output before
# j unchanged, checked in float64), a float64 gradient check, a sequence of length 1, and two
# behaviours that are reported rather than required (permutation equivariance without a mask,
# and what a non-finite token does to the others). A failed check that would make training
# results meaningless (a model that sees the future, or returns NaN) keeps the trained sections
# from running.

# %%
with report.section("contract") as s:
    contract = report.contract()
    display(contract)
    failed = atlas.summary.failed_checks(contract)
    s.update(checks=len(contract), failed=failed)
    viz.markdown(
        f"**Failed checks**: {'; '.join(failed)}."
        if failed
        else f"All {int((contract.passed == True).sum())} required checks passed "  # noqa: E712
        f"({int(contract.passed.isna().sum())} informational)."
    )

# %% [markdown]
# ## 2. Expressiveness: the rank of the score matrix
#
# Chapter 1 shows that a dot-product score matrix QKᵀ has rank at most the head width
# d, whatever the length, while a Riemannian score with per-token metrics does not. Here the
# rank is read from the variant's attention probabilities: the row-centred log-probabilities
# have the rank of the row-centred scores (the softmax's per-row shift cancels). Move the
# slider to change the head width.

# %%
with report.section("expressiveness") as s:
    ranks = report.probe("rank")
    viz.show(probes.rank_figure(ranks))
    top = ranks[ranks.length == ranks.length.max()]
    by = top.groupby(["variant", "d_head"])["rank"].mean().unstack("d_head")
    display(by)
    mine = top[top.variant == name]
    s["rank_at_longest"] = {
        int(d): float(r) for d, r in mine.groupby("d_head")["rank"].mean().items()
    }
    viz.markdown(
        f"At length {int(top.length.max())}, `{name}` reaches a mean rank of "
        + ", ".join(f"{r:g} at d = {d}" for d, r in s["rank_at_longest"].items())
        + "; dot is bounded by d."
    )

# %% [markdown]
# ## 3. Depth: rank collapse in a deep stack
#
# Chapter 2's question (Dong et al. 2021): does a stack of attention layers, freshly
# initialised, drive every token to the same vector? The relative residual
# ‖X − 1x̄ᵀ‖ / ‖X‖ after each layer, without and with
# the residual connection.

# %%
with report.section("depth") as s:
    depth = report.probe("depth")
    viz.show(probes.depth_figure(depth))
    collapse = probes.collapse_depth(depth)
    layers = collapse.groupby(["variant", "residual"], sort=False)["collapse_layer"]
    table = layers.agg(["mean", "min", "max"]).join(layers.apply(lambda c: int(c.isna().sum()))
                                                    .rename("seeds never collapsed"))  # fmt: skip
    display(table)
    s["collapse_layer"] = {f"{v} residual={r}": row["mean"] for (v, r), row in table.iterrows()}

# %% [markdown]
# ## 4. Cost against SDPA
#
# One layer's forward, and forward plus backward, timed side by side with PyTorch's
# `scaled_dot_product_attention` on the same shapes, over lengths; the slope of time against
# length on log-log axes, and the FLOPs counted. The machine is shared and noisy: only ratios
# measured in one run are compared.

# %%
with report.section("cost") as s:
    cost = report.probe("cost")
    viz.show(probes.cost_figure(cost))
    slopes = probes.cost_slope(cost)
    display(slopes)
    table = probes.cost_table(cost)
    display(table)
    s["slopes"] = slopes.to_dict(orient="records")
    s["at_longest"] = table.to_dict(orient="records")
    mine = table[table.variant == name].set_index("pass")
    beside, where = report.cost_beside_zoo(table)
    viz.markdown(f"Beside the zoo's kernels, {where}")
    display(beside)
    viz.markdown(
        "At the longest length, "
        + "; ".join(
            f"{p}: {r['ratio to SDPA']} times SDPA's time, {r['FLOPs ratio to SDPA']:.2f} times its "
            f"counted FLOPs"
            for p, r in mine.iterrows()
        )
        + "."
    )

# %% [markdown]
# ## 5. Recall and language, beside the zoo
#
# Chapter 9's protocol for the variant and the dot control: multi-query associative recall on
# a cross of widths and pairs (the learning rate chosen from the same candidates at the centre
# cell), and char-PTB at the same wall-clock budget. The zoo's other arms come from the stored
# chapter-9 grid when it ran the same protocol.

# %%
with report.section("recall and language") as s:
    why = report.not_run()
    if why:
        viz.markdown(f"**Not trained**: {why}.")
    errors = report.training_errors()
    if errors:
        viz.markdown("**Failed in training**: " + "; ".join(errors))
    rows, where = report.beside_zoo()
    viz.markdown(f"Beside: {where}.")
    if len(rows):
        display(za.leaderboard(rows))
        viz.show(za.accuracy_figure(rows, "width"))
    viz.markdown(
        "char-PTB at the same wall-clock budget and one training step timed side by side, "
        "the variant and dot on this machine (a wall-clock budget is compared on one machine "
        "only):"
    )
    display(za.ptb_table(grid.frame))
    display(za.timing_table(grid.frame))
    recall = report.recall()
    viz.markdown(atlas.recall_text(recall))
    s["recall"] = recall

# %% [markdown]
# ## 6. Verdicts against dot
#
# The comparisons are declared with their form and margin before the runs (chapter 9's smallest
# effects of interest), and decided by the library's one rule:

# %%
viz.markdown(RULE_TEXT)
with report.section("verdicts") as s:
    outcomes = report.verdicts()
    display(atlas.verdict_table(outcomes))
    s["outcomes"] = {k: o.outcome for k, o in outcomes.items()}

# %% [markdown]
# ## Summary

# %%
summary = report.write_summary(summary_path) if summary_path else report.summary()
broken = summary["failed_checks"] + [f"{k}: {e}" for k, e in summary["failed_sections"].items()]
viz.markdown(
    f"**`{name}`: {'every check passed and every section was built' if summary['ok'] else 'broken'}"
    f"**{': ' + '; '.join(broken) if broken else ''}. Report built in {summary['seconds']:.0f} s."
)
