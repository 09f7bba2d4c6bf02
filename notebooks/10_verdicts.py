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
# # 10. Verdicts
#
# Four documents seeded this book: a paper on Riemannian attention and the Fiber Bundle
# Transformer {cite}`song2026riemannian`, a research card on matroidal Mahalanobis attention,
# a card on cofactor-stable attention {cite}`cofactor2026stable`, and a note deriving state-space
# models as structured masked attention {cite}`paltorp2025structuredmaskedattention`. Each makes claims: theorems,
# identities, costs, conjectures, predictions about training. The chapters test them; this
# chapter gathers every claim and what the book found, from the library's claims register
# (`attention_atlas.claims`), so no verdict on this page is typed by hand.
#
# **The rule.** Every claim declares its form in the register before any data: *exact* (a
# float64 identity, bound or cost count, with its tolerance), *superiority*, *non-inferiority*,
# *equivalence* (empirical, with the smallest effect of interest as the margin), or
# *ill-posed* (it cannot be tested as written, and the register says why). An exact claim is
# decided by a float64 check: *supported* if it holds, *contradicted* if it fails, on every
# case its words cover. An empirical claim is decided by the one rule of its form, measured
# against a control (printed below from `attention_atlas.stats.RULE_TEXT`, with the
# training-scale gate of `attention_atlas.claims`), and only when the test could have failed:
# a saturated measure, no events to count, an untrained baseline or a diverged arm make it
# *not tested*, with that reason. Absence of a difference is never a "holds".
#
# The checks are stored with their provenance (`results/claims/book`, made by
# `python -m attention_atlas claims --recompute`) and read from there while the sources and
# stored results they rest on are unchanged; otherwise this page computes them when it is
# built.


# %% tags=["parameters"]
smoke_checks = False  # toy sizes for the computed checks (the tests' smoke run)
min_claims = 120  # the register must hold at least this many claims

# %% tags=["smoke"]
SMOKE = {"smoke_checks": True}
from attention_atlas.notebooks.lab import apply_smoke  # with ATTENTION_ATLAS_SMOKE=1 in JupyterLab

apply_smoke(SMOKE, globals())

# %%
import plotly.graph_objects as go
from IPython.display import display

from attention_atlas import claims, stats, viz
from attention_atlas.notebooks import chapters, repo_root
from attention_atlas.stats import OUTCOMES

register = claims.register(smoke=smoke_checks)
chapter_stems = {p.stem for p in chapters(repo_root() / "notebooks")}
assert len(register) >= min_claims, f"only {len(register)} claims in the register"
assert set(register["seed"]) == set(claims.SEEDS), "every seed must have claims"
assert register["outcome"].isin(OUTCOMES).all()
assert register["form"].isin(stats.FORMS).all(), "every claim declares its form"
assert register["chapter"].isin(chapter_stems).all(), "a claim names a chapter that does not exist"
assert register["key"].is_unique
counts = register.groupby(["seed", "outcome"]).size().unstack(fill_value=0)
counts = counts.reindex(columns=list(OUTCOMES), fill_value=0)
viz.markdown(
    f"The register holds **{len(register)} claims** from {len(claims.SEEDS)} seeds: "
    + ", ".join(f"{int(counts[o].sum())} {o}" for o in OUTCOMES)
    + "."
)

# %%
viz.markdown(
    stats.RULE_TEXT + " A training verdict states its scale (steps, tokens, the dot-product "
    "baseline at the same budget), and models that have not left the bigram regime (a "
    f"dot-product baseline above {claims.BIGRAM_BPC:g} bits per character) cannot support or "
    "contradict anything."
)

# %% [markdown]
# ## Outcomes by seed
#
# Each bar counts the claims of one seed by outcome. The tables below give every claim: its
# place in the seed, what it states (in our words), the outcome with the evidence behind it,
# the scale of a training verdict, and the chapter and section where the book tests it.

# %%
COLORS = dict(zip(OUTCOMES, ("#009E73", "#D55E00", "#E69F00", "#999999"), strict=True))
fig = go.Figure()
for outcome in OUTCOMES:
    fig.add_trace(go.Bar(x=[claims.SEEDS[s][0] for s in counts.index], y=counts[outcome],
                         name=outcome, marker_color=COLORS[outcome]))  # fmt: skip
fig.update_layout(barmode="stack", title="Claims of each seed by outcome", yaxis_title="claims")
viz.show(fig)


# %%
def cell(text: object) -> str:
    """Text for one cell of a Markdown table (pipes escaped, one line)."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def tested_in(chapter: str, section: str) -> str:
    number = int(chapter.split("_", 1)[0])
    return f"{{doc}}`chapter {number} <{chapter}>`, *{cell(section)}*"


for seed, (title, source) in claims.SEEDS.items():
    lines = [f"**{title}** ({source})", "",
             "| claim | source | form | outcome | evidence | tested in |", "|---|---|---|---|---|---|"]  # fmt: skip
    for r in register[register["seed"] == seed].itertuples():
        scale = f" *Scale: {cell(r.scale)}.*" if isinstance(r.scale, str) and r.scale else ""
        why = f" ({r.reason})" if r.outcome == "not tested" and r.reason else ""
        lines.append(
            f"| {cell(r.statement)} | {cell(r.source)} | {r.form} | **{r.outcome}**{why} | "
            f"{cell(r.summary)}.{scale} | {tested_in(r.chapter, r.section)} |"
        )
    viz.markdown("\n".join(lines))

# %% [markdown]
# ## A referee report per seed
#
# Read as a referee would: the errata (each contradicted or ill-posed claim with its
# counterexample or measurement), what holds and at what scale, and what is open with what
# deciding it would take. Every line is written from the register above.

# %%
for seed in claims.SEEDS:
    viz.markdown(claims.referee_report(register, seed))

# %% [markdown]
# ## Explore the register
#
# Pick a seed and an outcome; the table lists the matching claims with their evidence. In
# JupyterLab the same control filters the register live.


# %%
def claims_table(seed: str, outcome: str) -> go.Figure:
    """The claims of ``seed`` (or all) with ``outcome`` (or all), as a table figure."""
    rows = register
    if seed != "all":
        rows = rows[rows["seed"] == seed]
    if outcome != "all":
        rows = rows[rows["outcome"] == outcome]
    cells = [rows["key"], rows["outcome"], rows["summary"], rows["chapter"]]
    table = go.Table(
        header={"values": ["claim", "outcome", "evidence", "chapter"]},
        cells={"values": [list(c) for c in cells], "align": "left"},
        columnwidth=[2, 1, 6, 2],
    )
    return go.Figure(table, layout={"title": f"{len(rows)} claim(s): seed {seed}, {outcome}"})


viz.explore(
    claims_table,
    {
        "seed": viz.dropdown(["all", *claims.SEEDS]),
        "outcome": viz.dropdown(["all", *OUTCOMES]),
    },
    main=True,
)

# %% [markdown]
# ## What is known, what is contradicted, what is open


# %%
def listing(outcome: str) -> str:
    rows = register[register["outcome"] == outcome]
    if rows.empty:
        return "none."
    return "; ".join(f"{r.key} ({r.source})" for r in rows.itertuples()) + "."


supported, contradicted = (register["outcome"] == o for o in ("supported", "contradicted"))
open_ = register["outcome"].isin(["not resolved", "not tested"])
kinds = register[supported]["kind"].value_counts()
viz.markdown(
    f"**Known.** {int(supported.sum())} claims hold up, "
    + ", ".join(f"{n} of kind {k}" for k, n in kinds.items())
    + f": {listing('supported')}\n\n"
    f"**Contradicted.** {int(contradicted.sum())} claims fail their test: "
    f"{listing('contradicted')}\n\n"
    f"**Open.** {int(open_.sum())} claims are not decided: "
    f"{int((register['outcome'] == 'not resolved').sum())} not resolved by the runs at their "
    f"scale ({listing('not resolved')}) and "
    f"{int((register['outcome'] == 'not tested').sum())} not tested ({listing('not tested')})"
)
display(
    register[["key", "kind", "form", "outcome", "reason", "effect", "sesoi", "scale", "evidence"]]
)
