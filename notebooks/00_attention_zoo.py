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
# # 0. The attention zoo
#
# Attention turns a sequence of hidden states $x_1, \dots, x_L \in \mathbb{R}^D$ into a new
# sequence in which every position is a weighted average of (projections of) all the others.
# Each head projects the states to queries $q_i$, keys $k_j$ and values $v_j$, scores every
# pair $(i, j)$, turns each row of scores into weights, and averages the values:
#
# $$
# y_i = \sum_j A_{ij} v_j, \qquad A_{ij} = \frac{\exp S_{ij}}{\sum_{j'} \exp S_{ij'}} .
# $$
#
# The variants in this book differ only in the score $S_{ij}$ (and, for the state-space
# models of chapter 7, in how the weights are normalised). Scaled dot-product attention
# {cite}`vaswani2017attention` uses $S_{ij} = q_i \cdot k_j / \sqrt{d}$; distance-based variants
# use $S_{ij} = -\lVert q_i - k_j \rVert_M^2 / \tau$ for some metric $M$; a *causal* layer sets
# $S_{ij} = -\infty$ for $j > i$, so the weight matrix $A$ is lower-triangular.
#
# Every variant in `attention_atlas.attention` has the same interface: it is built by name
# with `build_attention(name, dim=..., n_heads=...)`, owns its projections, and returns the
# weights when asked (`need_weights=True`). This chapter builds **every registered variant**
# with its default options on the same inputs and shows their weights side by side; a
# variant added to the library joins this page without any change to it.

# %% tags=["parameters"]
dim = 32  # model width D of every variant
n_heads = 2  # heads (the figures show head 0)
text = "attention is all you need"  # the input sequence: one token per character
temperatures = [0.03, 0.1, 0.3, 1.0, 3.0]  # temperature sweep of dot-product attention
seed = 0  # seeds the embedding and every variant's initial weights
check_length = 128  # sequence length of the float64 checks
tol_sdpa = 1e-12  # SDPA fast path vs explicit softmax, float64
tol_paths = 1e-9  # each variant: fast path vs its materialised weights, float64

# %% tags=["smoke"]
SMOKE = {"text": "attend here", "temperatures": [0.1, 1.0], "check_length": 32}
from attention_atlas.notebooks.lab import apply_smoke  # with ATTENTION_ATLAS_SMOKE=1 in JupyterLab

apply_smoke(SMOKE, globals())

# %%
import inspect
import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch
from IPython.display import display
from plotly.subplots import make_subplots

from attention_atlas import available_attention, build_attention, viz
from attention_atlas.attention.dot import explicit_attention, sdpa

torch.manual_seed(seed)
print("registered attention variants:", ", ".join(available_attention()))

# %% [markdown]
# ## The inputs
#
# The input is a short string, one token per character. Each character gets a fixed random
# embedding (seeded), plus the sinusoidal position code of {cite}`vaswani2017attention`, so
# that equal characters at different places are different states. Everything runs in float64
# so that the checks below can use tight tolerances.

# %%
gen = torch.Generator().manual_seed(seed)
embedding = torch.randn(256, dim, generator=gen, dtype=torch.float64)
freq = torch.exp(-math.log(10_000.0) * torch.arange(0, dim, 2, dtype=torch.float64) / dim)


def states(tokens):
    """Hidden states (1, L, D): each character's embedding plus its sinusoidal position code."""
    codes = torch.tensor([min(ord(c), 255) for c in tokens])
    pos = torch.arange(len(tokens), dtype=torch.float64)[:, None]
    pe = torch.zeros(len(tokens), dim, dtype=torch.float64)
    pe[:, 0::2], pe[:, 1::2] = torch.sin(pos * freq), torch.cos(pos * freq)
    return (embedding[codes] + pe)[None]


tokens = list(text)
L = len(tokens)
x = states(tokens)  # (1, L, D)
print(f"{L} tokens, hidden states x: {tuple(x.shape)} {x.dtype}")

# %% [markdown]
# ## Every variant, the same inputs
#
# Each variant is built with its default options (a variant that cannot be built without
# extra options, such as a per-head mixture, is listed but not drawn). We ask each one for
# its weights, non-causal and causal, and check two things that any attention layer must
# satisfy:
#
# * its fast path (the one used in training, `need_weights=False`) gives the same output as
#   the materialised weights, $y = A v$, to float64 precision;
# * its weights are **row-stochastic** ($A_{ij} \ge 0$, $\sum_j A_{ij} = 1$) when it is a
#   softmax attention, and **lower-triangular** when causal. A variant whose weights are not
#   a softmax (the state-space models of chapter 7) says so in its diagnostics
#   (`row_stochastic = 0`) and is exempt from the first property only.


# %%
def weights(attn, causal):
    """Output of the fast path, and (out, probs, diagnostics) of the materialised path."""
    fast = attn(x, causal=causal).out
    res = attn(x, causal=causal, need_weights=True)
    return fast, res


zoo = {}  # name -> {"module", "causal": probs, "noncausal": probs or None, ...}
rows = []
for name in available_attention():
    torch.manual_seed(seed)
    try:
        attn = build_attention(name, dim=dim, n_heads=n_heads).double().eval()
    except (ValueError, TypeError) as err:  # needs options beyond the defaults
        rows.append({"variant": name, "built": f"needs options: {str(err).split(';')[0]}"})
        continue
    entry = {"module": attn}
    with torch.no_grad():
        for causal in (False, True):
            key = "causal" if causal else "noncausal"
            try:
                fast, res = weights(attn, causal)
            except ValueError as err:  # e.g. a recurrence defined only causally
                entry[key] = None
                entry[f"{key}_note"] = str(err)
                continue
            assert res.probs is not None, f"{name}: need_weights=True returned no weights"
            gap = (fast - res.out).abs().max().item()
            assert gap <= tol_paths, f"{name} (causal={causal}): fast path differs by {gap:.2e}"
            entry[key] = res.probs[0].numpy()  # (H, L, L)
            entry[f"{key}_gap"] = gap
            entry["row_stochastic"] = bool(res.diagnostics.get("row_stochastic", 1))
    assert entry["causal"] is not None, f"{name}: causal attention must be defined"
    zoo[name] = entry
    counts = {
        "total": sum(p.numel() for p in attn.parameters()),
        "metric": sum(p.numel() for p in attn.metric_parameters()),
    }
    rows.append(
        {
            "variant": name,
            "class": type(attn).__name__,
            "built": "yes",
            "parameters": counts["total"],
            "metric parameters": counts["metric"],
            "softmax (row-stochastic)": entry["row_stochastic"],
            "non-causal": entry["noncausal"] is not None,
            "max |fast - explicit|": max(entry.get("causal_gap", 0), entry.get("noncausal_gap", 0)),
            "options": attn.extra_repr(),
        }
    )

table = pd.DataFrame(rows).set_index("variant")
table = table.astype({"parameters": "Int64", "metric parameters": "Int64"})
display(table.astype(object).where(table.notna(), "-"))

# %% [markdown]
# The checks: row sums, signs and the causal triangle, for every variant at once.

# %%
upper = np.triu(np.ones((L, L), dtype=bool), k=1)
for name, e in zoo.items():
    for key in ("noncausal", "causal"):
        A = e[key]
        if A is None:
            continue
        if e["row_stochastic"]:
            assert (A >= 0).all(), f"{name} {key}: negative weight {A.min():.3g}"
            dev = np.abs(A.sum(-1) - 1).max()
            assert dev < 1e-12, f"{name} {key}: rows sum to 1 only to {dev:.2e}"
    causal_upper = np.abs(e["causal"][:, upper]).max()
    assert causal_upper == 0.0, f"{name}: causal weights above the diagonal ({causal_upper:.2e})"
n_soft = sum(e["row_stochastic"] for e in zoo.values())
viz.markdown(
    f"All {len(zoo)} variants that build with default options passed: {n_soft} of them are "
    f"row-stochastic (rows sum to one within $10^{{-12}}$), every causal weight matrix is "
    f"exactly zero above the diagonal, and every fast path agrees with its materialised "
    f"weights to at most {table['max |fast - explicit|'].max():.1e}."
)

# %% [markdown]
# ## The weights, side by side
#
# Head 0 of each variant, non-causal on the left and causal on the right; the menu picks
# the variant. Softmax weights use one colour scale from 0; weights that can be negative use
# a diverging scale centred on 0.


# %%
def axis_ticks(tokens):
    """Axis ticks that name each position by its character."""
    return {
        "tickmode": "array",
        "tickvals": list(range(len(tokens))),
        "ticktext": tokens,
        "tickangle": 0,
    }


def variant_weights(variant):
    """Head 0 of a variant's weights, non-causal beside causal, on one colour scale."""
    e = zoo[variant]
    shown = [e[key][0] for key in ("noncausal", "causal") if e[key] is not None]
    top = float(max(np.nanmax(A) for A in shown))  # one scale for both panels of a variant
    fig = make_subplots(
        rows=1, cols=2, subplot_titles=("non-causal", "causal"), horizontal_spacing=0.1
    )
    for col, key in ((1, "noncausal"), (2, "causal")):
        A = e[key][0] if e[key] is not None else np.full((L, L), np.nan)
        style = (
            {"colorscale": "Viridis", "zmin": 0.0, "zmax": top}
            if e["row_stochastic"]
            else {"colorscale": "RdBu", "zmid": 0.0}
        )
        heat = go.Heatmap(z=A, name=f"{variant} {key}", showscale=(col == 2), **style)
        fig.add_trace(heat, row=1, col=col)
    fig.update_xaxes(title="key j", **axis_ticks(tokens))
    fig.update_yaxes(title="query i", autorange="reversed", scaleanchor="x", **axis_ticks(tokens))
    fig.update_yaxes(scaleanchor="x2", row=1, col=2)
    title = f"attention weights of '{variant}' (head 0)"
    return fig.update_layout(title=title, height=500, margin={"t": 130})


viz.explore(variant_weights, {"variant": viz.dropdown(list(zoo))})

# %% [markdown]
# ## Temperature
#
# Dividing the scores by a temperature $T$ interpolates between two extremes: as $T \to 0$
# each row of $A$ puts all its weight on the best-scoring key (hard attention), and as
# $T \to \infty$ it spreads evenly over all visible keys (a plain average). A convenient
# number is the mean entropy of a row, between 0 (one key) and $\log L$ (all keys).
#
# The slider below steps through the temperatures computed when the book was built. In
# JupyterLab (`make lab`) the same figure is live: the temperature slides continuously and you
# can type any sequence; each move recomputes the weights with the library.

# %%
dot = zoo["dot"]["module"]
with torch.no_grad():
    q, k, v = dot.split_heads(x)  # (1, H, L, d) each
d_head = q.shape[-1]


def dot_weights(q, k, v, temperature):
    """Head-0 weights of dot-product attention at a temperature: softmax(q k^T / (T sqrt d))."""
    _, probs, _ = explicit_attention(q, k, v, scale=1.0 / (temperature * math.sqrt(d_head)))
    return probs[0, 0].numpy()


def mean_entropy(A):
    return float(-(A * np.log(np.clip(A, 1e-300, None))).sum(-1).mean())


sweep = {t: dot_weights(q, k, v, t) for t in temperatures}
entropies = {t: mean_entropy(A) for t, A in sweep.items()}


def attention_map(temperature, sequence):
    """Head-0 dot-product weights of `sequence` at `temperature`, recomputed by the library."""
    toks = list(sequence) or [" "]
    with torch.no_grad():
        A = dot_weights(*dot.split_heads(states(toks)), temperature)
    title = (
        f"dot-product attention, T = {temperature:.3g}: mean row entropy {mean_entropy(A):.2f} "
        f"(log L = {math.log(len(toks)):.2f})"
    )
    fig = viz.heatmap(A, zmin=0.0, zmax=1.0, title=title, height=560)
    fig.update_xaxes(**axis_ticks(toks))
    return fig.update_yaxes(scaleanchor="x", **axis_ticks(toks))


controls = {
    "temperature": viz.slider(
        temperatures, live_range=(0.03, 30.0), log=True, label="temperature T"
    ),
    "sequence": viz.text(text),  # typed freely in JupyterLab; the book shows `text`
}
viz.explore(attention_map, controls, main=True)
ents = [entropies[t] for t in temperatures]
assert all(a < b for a, b in zip(ents, ents[1:], strict=False)), (
    f"row entropy must grow with temperature, got {ents}"
)
summary = (
    f"Over $T \\in [{min(temperatures):g}, {max(temperatures):g}]$ the mean row entropy "
    f"grows from {ents[0]:.2f} to {ents[-1]:.2f} nats (the maximum, uniform weights, is "
    f"$\\log L$ = {math.log(L):.2f})."
)
if 1.0 in entropies:
    share = entropies[1.0] / math.log(L)
    summary += (
        f" At $T = 1$, the layer as initialised, the entropy is {share:.0%} of the maximum"
        + (": an untrained layer attends almost uniformly." if share > 0.8 else ".")
    )
viz.markdown(summary)

# %% [markdown]
# ## The fast path computes what it says
#
# Training never materialises the $L \times L$ weights: it calls PyTorch's fused
# `scaled_dot_product_attention` {cite}`dao2022flashattention`. The explicit formula a reader
# would write, `softmax(q @ k.T / sqrt(d)) @ v`, must give the same numbers. In float64 the two
# agree to rounding error, with and without the causal mask.

# %%
g = torch.Generator().manual_seed(seed + 1)
qc, kc, vc = (
    torch.randn(2, 3, check_length, 16, generator=g, dtype=torch.float64) for _ in range(3)
)
for causal in (False, True):
    fast = sdpa(qc, kc, vc, causal=causal)
    reference, _, _ = explicit_attention(qc, kc, vc, causal=causal)
    scores = qc @ kc.transpose(-2, -1) / math.sqrt(qc.shape[-1])  # the formula, written out
    if causal:
        scores = scores.masked_fill(torch.ones_like(scores, dtype=torch.bool).triu(1), -math.inf)
    by_hand = torch.softmax(scores, dim=-1) @ vc
    err_ref = (fast - reference).abs().max().item()
    err_hand = (fast - by_hand).abs().max().item()
    print(f"causal={causal}: |sdpa - explicit| = {err_ref:.2e}, |sdpa - by hand| = {err_hand:.2e}")
    assert err_ref <= tol_sdpa and err_hand <= tol_sdpa, (
        f"SDPA differs from softmax(q k^T / sqrt d) v by {max(err_ref, err_hand):.2e} > {tol_sdpa:g}"
    )

# %% [markdown]
# The chapters that follow change the score. Chapter 1 asks what scores a Riemannian metric
# can express that a dot product cannot; chapters 5 to 7 take the matroidal metric, the
# cofactor view of the weight matrix and the state-space models in turn.
