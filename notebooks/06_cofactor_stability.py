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
# # 6. Cofactor-stable attention
#
# The seed (`cofactor-stable-attention.txt`) reads an attention matrix $A$ as the transition
# matrix of a Markov chain on the tokens and looks at its Laplacian $L = I - A$. Because every
# row of a softmax sums to one, $L\mathbf 1 = 0$: zero is always an eigenvalue. The seed proposes
# to watch the *principal cofactors* $c_i = \det L_{\hat i\hat i}$ (the determinant of $L$ with
# row and column $i$ deleted) and the *stability margin* $m = \sum_i c_i$, and to add the
# regulariser
#
# $$\mathcal L_{\text{cofactor}} = -\log\big(|m| + \epsilon\big) + \beta\,\mathrm{KL}(u\,\|\,\pi),
# \qquad \pi_i = \frac{\max(c_i,0)+\epsilon}{\sum_j (\max(c_j,0)+\epsilon)},$$
#
# so that heads do not become reducible (token groups that never exchange information) or
# nearly singular. This chapter checks the linear algebra, builds an exact $O(n^3)$ algorithm
# for all $n$ cofactors at once, measures it, and then runs the seed's experiment at a scale
# this book can afford.
#
# **The maths in one paragraph.** If $\operatorname{rank} L = n-1$, the adjugate satisfies
# $\operatorname{adj}(L)\,L = L\,\operatorname{adj}(L) = \det(L)\,I = 0$, so its columns lie in
# $\ker L = \operatorname{span}(\mathbf 1)$ and its rows in the left kernel:
# $\operatorname{adj}(L) = \mathbf 1 c^\top$ with $c^\top L = 0$. The diagonal of the adjugate is
# the principal cofactors, so that $c$ is the seed's vector. The characteristic polynomial's
# linear coefficient is the sum of the principal $(n-1)$-minors, hence
# $\sum_i c_i = \prod_{k\ge 2}\lambda_k(L)$. For an irreducible chain the Markov chain tree
# theorem {cite}`leighton1986estimating` says $c_i$ is a sum over spanning trees directed into
# $i$ of products of transition probabilities: positive, and proportional to the stationary
# distribution.
#
# **One factorisation for all cofactors.** Take any $w$ with $w^\top\mathbf 1 = 1$ (we use
# $w = \mathbf 1/n$) and $M = L + \mathbf 1 w^\top$. The matrix determinant lemma gives
# $\det M = \det L + w^\top\operatorname{adj}(L)\mathbf 1 = (w^\top\mathbf 1)(c^\top\mathbf 1) = m$,
# and $c^\top M = c^\top L + (c^\top\mathbf 1)w^\top = m\,w^\top$, so
# $c = m\,M^{-\top} w$. One LU of $M$ gives $\det M$ (pivots) and the solve; the eigenvalues of
# $M$ are those of $L$ with the zero replaced by $1$, so $M$ is exactly as well conditioned as
# the nonzero spectrum of $L$. The normalised vector $x = M^{-\top}w$ sums to one and is the
# stationary distribution (the Kemeny-Snell fundamental-matrix formula {cite}`kemeny1960finite`).
# This is `principal_cofactors(A, method="lu")` in `attention_atlas.cofactor`; `"minors"` is the
# $O(n^4)$ reference and `"power"` a power iteration on $A^\top$ for $\pi$ (scaled by $m$).

# %% tags=["parameters"]
n_identity = 12  # size of the matrices in the identity checks
n_matrices = 16  # matrices per family
couplings = [0.3, 0.1, 1e-2, 1e-3, 1e-4, 1e-5, 1e-6, 1e-8, 1e-10, 1e-12]
sizes = [4, 8, 16, 32, 64, 128]  # n for the error/time sweep
time_batch = 4  # matrices per timed call in the sweep
repeats = 5  # timing repeats (median, interleaved)
bench_sizes = [64, 128]  # the benchmark
bench_batch = 16
bench_repeats = 5
step_time_steps = 6  # steps timed to choose word- or char-level WikiText-2
train_steps = 200  # training steps of the baseline (the regularised run gets fewer: equal FLOPs)
seeds = [0, 1, 2]
lm_seq_len = 32
lm_batch = 16
lm_dim = 48
digits_batch = 32
digits_dim = 48
n_layers = 6
n_heads = 4
reg_heads = 1  # regularised heads per layer
alpha = 1e-3  # weight of the regulariser in the loss (the seed's range is 1e-4 to 1e-3)
beta = 0.1  # weight of the KL term
lm_budget_s = 240.0  # wall-time budget for all WikiText-2 runs; decides word vs char level
eval_batches = 4  # validation batches at each log step
final_eval_batches = 16  # validation batches at the end (LM; digits use the whole split)
log_every = 50
spike_ratio = 2.0  # spike: grad norm > spike_ratio x trailing median
overhead_repeats = 5

# %% tags=["smoke"]
SMOKE = {
    "n_identity": 6,
    "n_matrices": 4,
    "couplings": [0.3, 1e-3, 1e-8],
    "sizes": [4, 8, 16],
    "repeats": 2,
    "bench_sizes": [16],
    "bench_batch": 4,
    "bench_repeats": 2,
    "step_time_steps": 2,
    "train_steps": 4,
    "seeds": [0],
    "lm_seq_len": 16,
    "lm_batch": 4,
    "lm_dim": 16,
    "digits_batch": 16,
    "digits_dim": 16,
    "n_layers": 2,
    "n_heads": 2,
    "lm_budget_s": 5.0,
    "eval_batches": 1,
    "final_eval_batches": 1,
    "log_every": 3,
    "overhead_repeats": 2,
}

# %%
import functools
import math
import time

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch

from attention_atlas import viz
from attention_atlas.bench import compare, cpu_time_ratio
from attention_atlas.cofactor import (
    cofactor_diagnostics,
    cofactor_flops,
    cofactor_penalty,
    cofactor_regularizer_from_probs,
    exact_cofactors,
    power_stationary,
    principal_cofactors,
    spectral_gap,
    stability_margin,
    stationary_distribution,
)
from attention_atlas.data import load_digits_patches, load_wikitext2
from attention_atlas.models import ModelConfig, Transformer
from attention_atlas.stats import mean_ci
from attention_atlas.train import TrainConfig, measure_flops, train

# Two CPU cores shared with other jobs: one intra-op thread per process is both faster and far
# less noisy here than two threads competing for the same cores.
torch.set_num_threads(1)
torch.manual_seed(0)
F64 = torch.float64


# %% [markdown]
# ## 1. The identities, over four families of attention matrices
#
# * **random**: softmax of Gaussian logits at three temperatures (irreducible, every entry positive);
# * **banded**: each token attends within a window of $\pm 2$ (irreducible, sparse);
# * **causal**: softmax with the causal mask, the attention of a decoder LM (lower triangular);
# * **nearly reducible**: two softmax blocks whose rows send a fraction $\varepsilon$ of their
#   mass to the other block.
#
# For each we assert $c^\top L = 0$, $\sum c = \prod_{k\ge2}\lambda_k(L)$ (eigenvalues from
# `torch.linalg.eigvals`), and that $c/\sum c$ is the stationary distribution (the left
# eigenvector of $A$ for eigenvalue 1), with both the reference and the LU method.


# %%
def softmax_family(kind: str, n: int, count: int, seed: int = 0, coupling: float = 1e-3):
    g = torch.Generator().manual_seed(seed)
    if kind == "random":
        scale = torch.tensor([0.5, 2.0, 5.0]).repeat(count)[:count].view(count, 1, 1)
        return torch.softmax(scale.double() * torch.randn(count, n, n, generator=g, dtype=F64), -1)
    z = torch.randn(count, n, n, generator=g, dtype=F64)
    i = torch.arange(n)
    if kind == "banded":
        return torch.softmax(z.masked_fill((i[:, None] - i[None, :]).abs() > 2, -math.inf), -1)
    if kind == "causal":
        return torch.softmax(z.masked_fill(i[None, :] > i[:, None], -math.inf), -1)
    if kind == "nearly_reducible":
        return coupled_blocks(n // 2, n - n // 2, coupling, count, seed)
    raise ValueError(kind)


def coupled_blocks(n1: int, n2: int, coupling: float, count: int = 1, seed: int = 0):
    """Two softmax blocks; every row sends ``coupling`` of its mass uniformly to the other."""
    g = torch.Generator().manual_seed(seed)
    a = torch.softmax(torch.randn(count, n1, n1, generator=g, dtype=F64), -1)
    b = torch.softmax(torch.randn(count, n2, n2, generator=g, dtype=F64), -1)
    A = torch.zeros(count, n1 + n2, n1 + n2, dtype=F64)
    A[:, :n1, :n1] = (1 - coupling) * a
    A[:, n1:, n1:] = (1 - coupling) * b
    A[:, :n1, n1:] = coupling / n2
    A[:, n1:, :n1] = coupling / n1
    return A


def eigen_margin(A):
    ev = torch.linalg.eigvals(torch.eye(A.shape[-1], dtype=F64) - A)
    ev = torch.gather(ev, -1, ev.abs().argsort(-1))  # the zero eigenvalue first
    return ev[..., 1:].prod(-1).real


def perron_left(A):
    """Stationary distribution from a dense eigen-decomposition of A^T (numpy)."""
    out = []
    for a in A.numpy():
        w, v = np.linalg.eig(a.T)
        p = np.real(v[:, np.argmin(np.abs(w - 1))])
        out.append(p / p.sum())
    return torch.tensor(np.array(out))


rows = []
for kind in ["random", "banded", "causal", "nearly_reducible"]:
    A = softmax_family(kind, n_identity, n_matrices)
    L = torch.eye(n_identity, dtype=F64) - A
    m_eig = eigen_margin(A)
    pi_eig = perron_left(A)
    for method in ["minors", "lu"]:
        c = principal_cofactors(A, method)
        null_res = float(((c.unsqueeze(-2) @ L).squeeze(-2)).abs().max() / c.abs().max())
        margin_err = float(((c.sum(-1) - m_eig).abs() / m_eig.abs()).max())
        pi_err = float((c / c.sum(-1, keepdim=True) - pi_eig).abs().sum(-1).max())
        rows.append(
            {
                "family": kind,
                "method": method,
                "max |c^T L| / max|c|": null_res,
                "max rel. err of sum c vs prod lambda": margin_err,
                "max ||c/sum c - pi||_1": pi_err,
                "min c_i": float(c.min()),
            }
        )
        assert null_res < 1e-12, (kind, method, null_res)
        assert margin_err < 1e-9, (kind, method, margin_err)
        assert pi_err < 1e-8, (kind, method, pi_err)
identities = pd.DataFrame(rows)
identities

# %% [markdown]
# The causal family passes the same checks, but look at what its cofactors *are*. A causal $A$
# is lower triangular and token 0 can only attend to itself, so $A_{00}=1$: the first row of $L$
# is zero, token 0 is an absorbing state, and every minor that keeps row 0 vanishes. The minor
# without row and column 0 is triangular, so
#
# $$c = \Big(\prod_{j\ge1}(1-A_{jj})\Big)\,e_0,\qquad \pi = e_0,\qquad
# \lambda(A) = \{A_{jj}\},\qquad 1-|\lambda_2(A)| = 1-\max_{j\ge1}A_{jj}.$$
#
# The chain is reducible by construction: all stationary mass sits on the first token whatever
# the attention does. Every cofactor quantity of a causal head is a function of its *diagonal*
# (how much each token attends to itself) and nothing else.

# %%
A = softmax_family("causal", n_identity, n_matrices, seed=1)
c = principal_cofactors(A, "lu")
diag = A.diagonal(dim1=-2, dim2=-1)
expected = torch.zeros_like(c)
expected[:, 0] = (1 - diag[:, 1:]).prod(-1)
assert torch.allclose(c, expected, rtol=1e-12, atol=1e-15)
assert torch.allclose(spectral_gap(A), 1 - diag[:, 1:].amax(-1), atol=1e-10)
# the seed's penalty on a causal head, beta = 0: minus the sum of log(1 - A_jj), a diagonal penalty
pen = cofactor_penalty(A, beta=0.0, reduce="none")
assert torch.allclose(
    pen, -torch.logaddexp((1 - diag[:, 1:]).log().sum(-1), torch.tensor(math.log(1e-8), dtype=F64))
)
viz.markdown(
    f"On {n_matrices} random causal matrices ($n = {n_identity}$): the largest cofactor off token 0 is "
    f"{float(c[:, 1:].abs().max()):.1e} and $c_0 = \\prod_{{j\\ge1}}(1-A_{{jj}})$ to "
    f"{float((c[:, 0] / expected[:, 0] - 1).abs().max()):.1e} relative. With $\\beta = 0$ the "
    "seed's penalty on a causal head is exactly $-\\sum_{j\\ge1}\\log(1-A_{jj})$: it discourages "
    "tokens from attending to themselves, and that is all it can do. With $\\beta > 0$ the KL term "
    "is $\\mathrm{KL}(u\\,\\|\\,\\pi)$ with $\\pi \\approx e_0$ whatever the weights, a constant up to "
    "the $\\epsilon$ terms, whose gradient pushes $c_0$ (so the same diagonal) the other way."
)

# %% [markdown]
# ## 2. Nearly reducible attention: what happens as the coupling goes to zero
#
# Two blocks of $n/2$ tokens each send a fraction $\varepsilon$ of their attention to the other
# block. At $\varepsilon = 0$ the chain has two closed classes, $\operatorname{rank} L = n-2$, and
# every cofactor is zero. We follow the margin, the smallest normalised cofactor
# $n\min_i\pi_i$, the spectral gap, the residual of $c^\top L = 0$, and the error of the LU
# method and of the minors against cofactors computed with 50 significant digits, as
# $\varepsilon\to0$.

# %%
nb = n_identity
u64 = torch.finfo(F64).eps
rows = []
for eps in couplings:
    A = coupled_blocks(nb // 2, nb - nb // 2, eps, count=n_matrices, seed=3)
    exact = torch.stack([exact_cofactors(a) for a in A[:2]])  # 50-digit reference, 2 matrices
    c_ref = principal_cofactors(A[:2], "minors")
    c_lu = principal_cofactors(A[:2], "lu")
    c_32 = principal_cofactors(A[:2].float(), "lu").double()
    pi = stationary_distribution(A, "lu")
    L = torch.eye(nb, dtype=F64) - A[:2]
    rel = lambda c, exact=exact: float(((c - exact).abs().amax(-1) / exact.abs().amax(-1)).max())
    rows.append(
        {
            "coupling": eps,
            "margin": float(stability_margin(A).mean()),
            "n min pi": float((nb * pi.amin(-1)).mean()),
            "spectral gap": float(spectral_gap(A).mean()),
            "lu error (float64)": rel(c_lu),
            "minors error (float64)": rel(c_ref),
            "lu error (float32)": rel(c_32),
            "|c^T L| / |c| (lu)": float(
                ((c_lu.unsqueeze(-2) @ L).abs().amax((-1, -2)) / c_lu.abs().amax(-1)).max()
            ),
        }
    )
coupling_df = pd.DataFrame(rows)
fig = viz.loglog(
    coupling_df["coupling"],
    {
        k: coupling_df[k].clip(lower=1e-18)
        for k in [
            "margin",
            "spectral gap",
            "n min pi",
            "lu error (float64)",
            "minors error (float64)",
            "lu error (float32)",
        ]
    },
    title=f"Two blocks of {nb // 2} tokens coupled by epsilon (errors against 50-digit cofactors)",
    xlabel="coupling epsilon",
    ylabel="value",
    slopes_in_legend=False,
)
viz.show(fig)
coupling_df

# %%
small = coupling_df[coupling_df["coupling"] <= 1e-3]
f32_good = coupling_df[coupling_df["lu error (float32)"] < 1e-2]["coupling"]
f32_ok = float(f32_good.min()) if len(f32_good) else float("nan")
slope_m = viz.loglog_slope(small["coupling"], small["margin"])
slope_g = viz.loglog_slope(small["coupling"], small["spectral gap"])
assert 0.9 < slope_m < 1.1 and 0.9 < slope_g < 1.1, (slope_m, slope_g)
assert coupling_df["n min pi"].min() > 0.05  # the normalised cofactors do not collapse
# forward error of a backward-stable method: round-off times the condition number ~ 1 / gap
assert (coupling_df["lu error (float64)"] <= 10 * nb * u64 / coupling_df["coupling"]).all()
assert (
    coupling_df["lu error (float64)"] <= 10 * coupling_df["minors error (float64)"] + 1e-14
).all()
worst = coupling_df.iloc[-1]
viz.markdown(
    f"As $\\varepsilon\\to0$ the margin and the spectral gap both vanish linearly (fitted log-log "
    f"slopes {slope_m:.2f} and {slope_g:.2f} for $\\varepsilon\\le10^{{-3}}$), while the normalised "
    f"cofactors do **not** degenerate: $n\\min_i\\pi_i$ stays between "
    f"{coupling_df['n min pi'].min():.2f} and {coupling_df['n min pi'].max():.2f}, because $\\pi$ "
    "tends to a mixture of the two blocks' stationary distributions weighted by the coupling "
    "rates. So the margin term of the seed's regulariser sees near-reducibility and the KL term "
    "does not; the KL term instead sees *sinks* (tokens that receive no stationary mass)"
    " {cite}`xiao2024efficient`.\n\n"
    "Against 50-digit cofactors (`exact_cofactors`, mpmath) both float64 methods lose accuracy at "
    "the rate round-off / spectral gap, as a backward-stable method must when the problem's "
    f"condition number grows like $1/\\varepsilon$: at $\\varepsilon = {worst['coupling']:g}$ the LU "
    f"error is {worst['lu error (float64)']:.1e} and the minors' {worst['minors error (float64)']:.1e}; "
    "the LU method is never worse than the reference by more than a factor 10 (asserted). Float32 "
    f"resolves the cofactors (relative error below $10^{{-2}}$) only down to "
    f"$\\varepsilon = {f32_ok:g}$; below its round-off the two blocks are numerically disconnected "
    "and the float32 cofactors are noise (hence the seed's advice to compute them in float64)."
)

# %% [markdown]
# ### What the margin term rewards
#
# The penalty $-\log|m|$ decreases as $m$ grows. But $m = \prod_{k\ge2}(1-\lambda_k(A))$ is *not*
# largest for well-mixing attention. Every rank-one $A = \mathbf 1 p^\top$ (all tokens attend
# with the same distribution $p$: one step mixes perfectly) has $m = 1$; a deterministic
# cycle (each token attends to exactly one other, period $n$) has $m = \prod_k(1-\omega^k) = n$;
# uniform attention to the *other* tokens has $m = (n/(n-1))^{n-1}\to e$. The term prefers
# eigenvalues of $A$ near $-1$ and on the unit circle away from 1, i.e. oscillating, slowly
# mixing chains, over fast mixing ones.

# %%
n = n_identity
p = torch.softmax(torch.randn(n, dtype=F64), -1)
rank_one = p.expand(n, n).contiguous()
cycle = torch.roll(torch.eye(n, dtype=F64), 1, dims=1)
others = (torch.ones(n, n, dtype=F64) - torch.eye(n, dtype=F64)) / (n - 1)
m_rank_one, m_cycle, m_others = (float(stability_margin(M)) for M in (rank_one, cycle, others))
assert abs(m_rank_one - 1) < 1e-12 and abs(m_cycle - n) < 1e-9
assert abs(m_others - (n / (n - 1)) ** (n - 1)) < 1e-9
viz.markdown(
    f"$n = {n}$: rank-one (perfect mixing) $m = {m_rank_one:.3f}$, penalty {-math.log(m_rank_one):.3f}; "
    f"uniform over the others $m = {m_others:.3f}$, penalty {-math.log(m_others):.3f}; "
    f"a deterministic {n}-cycle $m = {m_cycle:.3f}$, penalty {-math.log(m_cycle):.3f}."
)

# %% [markdown]
# ## 3. Three methods: error and time against $n$
#
# Error is measured against the float64 minors on softmax matrices with Gaussian logits. Time is
# measured by `attention_atlas.bench.compare` (rounds in which every method runs once, in rotated
# order; each sample repeats a call until it lasts 20 ms; median over rounds) on batches of
# `time_batch` matrices. `"power"` runs to a tolerance of $10^{-10}$ in $\ell_1$; its a-posteriori bound
# $\frac{\delta}{1-\delta}\|\pi_k-\pi_{k-1}\|_1$ with $\delta = 1-\sum_j\min_i A_{ij}$ (an upper
# bound on Dobrushin's ergodicity coefficient, the $\ell_1$ contraction factor of $A^\top$ on
# vectors summing to zero {cite}`seneta2006nonnegative`) is printed beside its measured error.


# %%
def cofactors_of(A, method):
    return principal_cofactors(A, method, check=False, power_tol=1e-10)


rows = []
for n in sizes:
    A = softmax_family("random", n, time_batch, seed=n)
    ref = principal_cofactors(A, "minors")
    pi_ref = ref / ref.sum(-1, keepdim=True)
    c_lu = principal_cofactors(A, "lu")
    c_pw = principal_cofactors(A, "power", power_tol=1e-10)
    pi_pw, bound, iters = power_stationary(A, tol=1e-10)
    rel = lambda c, ref=ref: float(((c - ref).abs().amax(-1) / ref.abs().amax(-1)).max())
    err_pw = (pi_pw - pi_ref).abs().sum(-1)
    assert (err_pw <= bound + 1e-14).all(), (n, err_pw, bound)  # the stated bound holds
    assert rel(c_lu) < 1e-10, (n, rel(c_lu))
    res = compare(
        {m: functools.partial(cofactors_of, method=m) for m in ["minors", "lu", "power"]},
        "lu",
        (A,),
        backward=False,
        warmup=1,
        reps=repeats,
        memory=False,
    )["results"]
    t = {m: res[m]["forward"]["median_s"] for m in res}
    rows.append(
        {
            "n": n,
            "lu rel. err": rel(c_lu),
            "power rel. err": rel(c_pw),
            "power ||pi - pi_ref||_1": float(err_pw.max()),
            "power bound": float(bound.max()),
            "power iterations": iters,
            **{f"time {k} (ms)": 1e3 * v for k, v in t.items()},
        }
    )
methods_df = pd.DataFrame(rows)
viz.show(
    viz.loglog(
        methods_df["n"],
        {k: methods_df[f"time {k} (ms)"] for k in ["minors", "lu", "power"]},
        title=f"Time for {time_batch} matrices (float64, median of {repeats})",
        xlabel="n",
        ylabel="ms",
    )
)
viz.show(
    viz.loglog(
        methods_df["n"],
        {
            "lu vs minors": methods_df["lu rel. err"].clip(lower=1e-17),
            "power vs minors": methods_df["power rel. err"].clip(lower=1e-17),
            "power: stated bound on ||pi - pi_ref||_1": methods_df["power bound"].clip(lower=1e-17),
        },
        title="Error against the float64 minors",
        xlabel="n",
        ylabel="relative error",
        slopes_in_legend=False,
    )
)
methods_df

# %% [markdown]
# `"power"` needs a determinant for the scale $m$ anyway, so for the cofactors it cannot beat
# `"lu"`; its use is $\pi$ alone (`stationary_distribution(A, "power")`, $O(kn^2)$) on long
# sequences, where $k$ is set by the spectral gap. Its stated bound needs $\delta<1$, i.e. a
# column that every row attends to: true for dense softmax attention, false for causal or banded
# attention, where the bound is infinite (it still converges, but nothing is guaranteed).

# %% [markdown]
# ## 4. Benchmark: one LU against $n$ explicit minors
#
# The goals: `"lu"` at least 40 times faster than `"minors"` at $n = 64$ and at least
# 100 times at $n = 128$ (batch 16, float64), forward; forward + backward (gradient with respect
# to $A$) reported too. Ratios are measured side by side in one process by `attention_atlas.bench.compare`
# (median of per-round ratios; peak memory of one forward + backward from the profiler).
# `python benchmarks/bench_cofactor.py` runs the same measurement from the command line and
# writes JSON.


# %%
def cofactors_of_probs(A, method):
    return principal_cofactors(A, method, check=False)


bench_rows, bench_json = [], {}
for n in bench_sizes:
    z = torch.softmax(torch.randn(bench_batch, n, n, dtype=F64), -1).requires_grad_(True)
    res = compare(
        {m: functools.partial(cofactors_of_probs, method=m) for m in ["minors", "lu"]},
        "lu",
        (z,),
        warmup=1,
        reps=bench_repeats,
        meta={"n": n, "batch": bench_batch, "dtype": "float64"},
    )
    bench_json[n] = res
    r = res["results"]
    bench_rows.append(
        {
            "n": n,
            "batch": bench_batch,
            "minors fwd (ms)": 1e3 * r["minors"]["forward"]["median_s"],
            "lu fwd (ms)": 1e3 * r["lu"]["forward"]["median_s"],
            "minors fwd+bwd (ms)": 1e3 * r["minors"]["forward_backward"]["median_s"],
            "lu fwd+bwd (ms)": 1e3 * r["lu"]["forward_backward"]["median_s"],
            "speed-up fwd": r["minors"]["forward"]["ratio_median"],
            "speed-up fwd (q25-q75)": f"{r['minors']['forward']['ratio_q25']:.0f}-{r['minors']['forward']['ratio_q75']:.0f}",
            "speed-up fwd+bwd": r["minors"]["forward_backward"]["ratio_median"],
            "speed-up fwd (CPU time)": cpu_time_ratio(
                functools.partial(cofactors_of_probs, method="minors"),
                functools.partial(cofactors_of_probs, method="lu"),
                (z,),
                bench_repeats,
            ),
            "peak MB minors": r["minors"]["peak_memory_bytes"] / 2**20,
            "peak MB lu": r["lu"]["peak_memory_bytes"] / 2**20,
        }
    )
bench_df = pd.DataFrame(bench_rows)
goals = {64: 40.0, 128: 100.0}
lines = []
for r in bench_rows:
    goal = goals.get(r["n"])
    met = lambda x, goal=goal: (
        "" if goal is None else (" (goal met)" if x >= goal else f" (goal {goal:g}x NOT met)")
    )
    lines.append(
        f"* $n = {r['n']}$: forward **{r['speed-up fwd']:.0f}x** in wall time{met(r['speed-up fwd'])}, "
        f"**{r['speed-up fwd (CPU time)']:.0f}x** in CPU time{met(r['speed-up fwd (CPU time)'])}; "
        f"forward+backward {r['speed-up fwd+bwd']:.0f}x (wall); peak memory of a forward+backward "
        f"{r['peak MB minors']:.0f} MB (minors) against {r['peak MB lu']:.1f} MB (lu)"
    )
viz.markdown(
    f"`lu` against `minors`, batch {bench_batch}, float64, median of {bench_repeats} rounds:\n\n"
    + "\n".join(lines)
    + "\n\nOn this shared machine every process gets a varying fraction of a core, so wall-time "
    "samples are inflated by a factor that changes from one sample to the next and the wall-time "
    "ratio moves between runs; the CPU-time ratio (`time.thread_time`, this thread's CPU time) is "
    "not affected by time-sharing. Both are reported; the goals are judged on each."
)
bench_df

# %% [markdown]
# ## 5. The seed's experiment: set-up
#
# A 6-layer pre-norm Transformer (`attention_atlas.models.Transformer`, dot-product attention)
# trained by the harness (`attention_atlas.train.train`) on two tasks:
#
# * **WikiText-2 language modelling** (causal). Word level is the seed's suggestion, but its
#   33,278-word softmax dominates the step of a model this small; the cell below times a training
#   step at both levels and picks word level only if all runs fit in `lm_budget_s`.
# * **digits patch tokens**: scikit-learn's 8x8 digits cut into sixteen 2x2 patches, mean-pooled,
#   bidirectional attention (so here the chains are irreducible and the cofactors informative).
#
# The **regularised** runs add `alpha * cofactor` (the harness regulariser registered by
# `attention_atlas.cofactor`: the seed's penalty, float64, on the first `reg_heads` head(s) of
# every layer) to the loss. **Equal training FLOPs**: the harness counts the FLOPs of a training
# step (`measure_flops`, FlopCounterMode); the LU behind the penalty is invisible to that counter,
# so its cost is added from `cofactor_flops(n) = 2n^3 + 6n^2` per matrix (LU, solve, and a backward
# at twice the forward), and the regularised runs get correspondingly fewer steps.

# %%
corpus_word = load_wikitext2(mode="word", download=False)
corpus_char = load_wikitext2(mode="char", download=False)
digits = load_digits_patches(2)


def lm_config(vocab: int) -> ModelConfig:
    return ModelConfig(
        task="lm",
        vocab_size=vocab,
        dim=lm_dim,
        n_layers=n_layers,
        n_heads=n_heads,
        max_len=lm_seq_len,
    )


def interleaved_median(fns: dict, repeats: int) -> dict:
    """Median wall time of each callable, with the calls interleaved across repeats."""
    times: dict = {k: [] for k in fns}
    for f in fns.values():
        f()  # warm-up
    for _ in range(repeats):
        for k, f in fns.items():
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
    return {k: float(np.median(v)) for k, v in times.items()}


def step_timer(corpus) -> float:
    """Median seconds of one AdamW training step on a random batch (1 thread)."""
    torch.manual_seed(0)
    model = Transformer(lm_config(corpus.vocab_size))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    starts = torch.randint(0, corpus.train.numel() - lm_seq_len - 1, (lm_batch,))
    win = corpus.train[starts[:, None] + torch.arange(lm_seq_len + 1)]
    x, y = win[:, :-1], win[:, 1:]

    def step():
        loss = torch.nn.functional.cross_entropy(model(x).logits.flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()

    return interleaved_median({"step": step}, step_time_steps)["step"]


t_word, t_char = step_timer(corpus_word), step_timer(corpus_char)
n_lm_runs = 2 * len(seeds)
lm_level = "word" if t_word * train_steps * n_lm_runs <= lm_budget_s else "char"
corpus = corpus_word if lm_level == "word" else corpus_char
viz.markdown(
    f"One training step (batch {lm_batch} x {lm_seq_len} tokens, width {lm_dim}, {n_layers} layers): "
    f"**word level {1e3 * t_word:.0f} ms** (vocabulary {corpus_word.vocab_size:,}), "
    f"**character level {1e3 * t_char:.0f} ms** (vocabulary {corpus_char.vocab_size}), a ratio of "
    f"{t_word / t_char:.1f}. {n_lm_runs} runs of {train_steps} steps would take about "
    f"{t_word * train_steps * n_lm_runs:.0f} s at word level against a budget of {lm_budget_s:g} s, "
    f"so this chapter uses the **{lm_level} level**"
    + (
        " (the output softmax, not attention, would dominate the step at word level)."
        if lm_level == "char"
        else "."
    )
)


# %%
def gather_probs(model, x):
    model.eval()
    with torch.no_grad():
        out = model(x, need_weights=True)
    return [a.probs for a in out.attentions]


def train_flops(task: str) -> tuple[float, float, int]:
    """(FLOPs of a baseline step, extra FLOPs of the regulariser, matrices per step)."""
    if task == "lm":
        cfg, batch, n = lm_config(corpus.vocab_size), lm_batch, lm_seq_len
        win = corpus.train[torch.arange(batch)[:, None] * n + torch.arange(n + 1)]
        x, y = win[:, :-1], win[:, 1:]
    else:
        cfg = ModelConfig(task="classify", patch_dim=digits.patch_dim, n_classes=10, dim=digits_dim,
                          n_layers=n_layers, n_heads=n_heads, max_len=digits.seq_len)  # fmt: skip
        batch, n = digits_batch, digits.seq_len
        x, y = digits.train_x[:batch], digits.train_y[:batch]
    base = measure_flops(Transformer(cfg), x, y)["train_step_total"]
    mats = batch * n_layers * reg_heads
    return float(base), float(mats * cofactor_flops(n)), mats


flop_rows, steps_for = [], {}
for task in ["lm", "digits"]:
    base, extra, mats = train_flops(task)
    steps_for[(task, "baseline")] = train_steps
    steps_for[(task, "cofactor")] = int(round(train_steps * base / (base + extra)))
    flop_rows.append({"task": task, "baseline step FLOPs": base, "regulariser FLOPs": extra,
                      "matrices per step": mats, "extra fraction": extra / base,
                      "baseline steps": train_steps, "regularised steps": steps_for[(task, "cofactor")]})  # fmt: skip
flops_df = pd.DataFrame(flop_rows)
flops_df

# %% [markdown]
# ### What the regulariser costs in time
#
# FLOPs hide most of the real cost: asking for the probabilities moves every layer off the fused
# SDPA kernel onto the explicit path, and a batched LU of many small float64 matrices is
# latency-bound. The cell times forward + backward of the digits model three ways with
# `attention_atlas.bench.compare`: the baseline (SDPA), the same step with `need_weights=True`,
# and with the regulariser (the optimiser update, the same in all three, is left out).

# %%
ov_cfg = ModelConfig(task="classify", patch_dim=digits.patch_dim, n_classes=10, dim=digits_dim,
                     n_layers=n_layers, n_heads=n_heads, max_len=digits.seq_len)  # fmt: skip
torch.manual_seed(0)
ov_model = Transformer(ov_cfg)
xb, yb = digits.train_x[:digits_batch], digits.train_y[:digits_batch]


def ov_loss(x, weights: bool, reg: bool):
    out = ov_model(x, need_weights=weights)
    loss = torch.nn.functional.cross_entropy(out.logits, yb)
    if reg:
        probs = [a.probs for a in out.attentions]
        loss = loss + alpha * cofactor_regularizer_from_probs(probs, heads=reg_heads, beta=beta)
    return loss


ov_fns = {
    "baseline": functools.partial(ov_loss, weights=False, reg=False),
    "need_weights": functools.partial(ov_loss, weights=True, reg=False),
    "cofactor": functools.partial(ov_loss, weights=True, reg=True),
}
for f in ov_fns.values():
    f.bench_params = list(ov_model.parameters())  # backward w.r.t. the model's parameters
ov_res = compare(ov_fns, "baseline", (xb,), warmup=1, reps=overhead_repeats, memory=False)[
    "results"
]
ov = {k: v["forward_backward"]["median_s"] for k, v in ov_res.items()}
ov_ratio = {k: v["forward_backward"]["ratio_median"] for k, v in ov_res.items()}
overhead = ov_ratio["cofactor"] - 1
viz.markdown(
    f"Digits model, batch {digits_batch}, forward + backward, median of {overhead_repeats} rounds: baseline step "
    f"{1e3 * ov['baseline']:.1f} ms, with probabilities {1e3 * ov['need_weights']:.1f} ms, with the "
    f"regulariser {1e3 * ov['cofactor']:.1f} ms: the regulariser (probabilities included) costs "
    f"**{100 * overhead:.0f}% of a baseline step** in wall time, against "
    f"{100 * flops_df.loc[flops_df.task == 'digits', 'extra fraction'].item():.2f}% in FLOPs."
)

# %% [markdown]
# ## 6. The seed's experiment: runs
#
# Per-step gradient norms (before clipping) come from the harness's callback; a *spike* is a
# step whose norm exceeds `spike_ratio` times the median of the previous 20 steps (after the
# warm-up). The cofactor diagnostics are measured at the end on 32 validation sequences, for the
# regularised heads and for all heads.


# %%
def grad_stats(gn: list[float], warmup: int) -> dict:
    g = np.asarray(gn[warmup:], dtype=float)
    spikes = sum(1 for t in range(20, len(g)) if g[t] > spike_ratio * np.median(g[t - 20 : t]))
    return {"grad_norm_var": float(g.var()) if g.size else math.nan,
            "grad_norm_mean": float(g.mean()) if g.size else math.nan,
            "grad_spikes": float(spikes)}  # fmt: skip


def run(task: str, config: str, seed: int) -> dict:
    if task == "lm":
        data, mcfg = corpus, lm_config(corpus.vocab_size)
        batch, fe = lm_batch, final_eval_batches
    else:
        data, mcfg, batch, fe = digits, ov_cfg, digits_batch, None
    steps = steps_for[(task, config)]
    regs = (
        [{"name": "cofactor", "weight": alpha, "heads": reg_heads, "beta": beta}]
        if config == "cofactor"
        else []
    )
    gnorms: list[float] = []
    tcfg = TrainConfig(
        steps=steps, batch_size=batch, seq_len=lm_seq_len, lr=3e-3, warmup_steps=max(1, steps // 10),
        seed=seed, log_every=log_every, eval_batches=eval_batches, final_eval_batches=fe,
        eval_batch_size=32, progress=False, measure_flops=False, effective_rank=False,
        regularizers=regs, diagnostics=[{"name": "cofactor", "heads": reg_heads}],
    )  # fmt: skip
    t0 = time.perf_counter()
    res = train(mcfg, tcfg, data, callbacks=[lambda s, info: gnorms.append(info["grad_norm"])])
    wall = time.perf_counter() - t0
    xv = (
        data.val_x[:32]
        if task == "digits"
        else corpus.valid[: 32 * lm_seq_len].view(32, lm_seq_len)
    )
    probs = gather_probs(res.model, xv)
    d_reg = cofactor_diagnostics(probs, heads=reg_heads, max_items=None)
    d_all = cofactor_diagnostics(probs, heads=None, max_items=None)
    diag_self = float(
        torch.stack([p[:, :reg_heads].diagonal(dim1=-2, dim2=-1).mean() for p in probs]).mean()
    )
    row = {"task": task, "config": config, "seed": seed, "steps": steps, "wall_s": wall,
           "val_loss": res.final["val_loss"], "val_acc": res.final["val_acc"],
           **grad_stats(gnorms, tcfg.warmup_steps),
           "self_attention (reg heads)": diag_self}  # fmt: skip
    for k in ["cofactor_min_prob_n", "cofactor_near_zero", "spectral_gap", "frac_disconnected",
              "frac_with_near_zero", "cofactor_log_margin"]:  # fmt: skip
        row[f"{k} (reg heads)"] = d_reg[k]
        row[f"{k} (all heads)"] = d_all[k]
    row["_gnorms"] = gnorms
    return row


runs = [
    run(task, config, seed)
    for task in ["lm", "digits"]
    for config in ["baseline", "cofactor"]
    for seed in seeds
]
runs_df = pd.DataFrame([{k: v for k, v in r.items() if k != "_gnorms"} for r in runs])
viz.markdown(
    f"{len(runs)} runs in {runs_df['wall_s'].sum():.0f} s of training wall time ({lm_level}-level WikiText-2 and digits)."
)

# %%
metrics = ["val_loss", "val_acc", "grad_norm_var", "grad_spikes", "self_attention (reg heads)",
           "cofactor_min_prob_n (reg heads)", "cofactor_near_zero (reg heads)",
           "spectral_gap (reg heads)", "frac_disconnected (reg heads)", "cofactor_log_margin (reg heads)",
           "spectral_gap (all heads)", "frac_disconnected (all heads)"]  # fmt: skip


def fmt(values) -> str:
    m, lo, hi = mean_ci(np.asarray(values, dtype=float))
    return f"{m:.4g} [{lo:.3g}, {hi:.3g}]" if np.isfinite(lo) else f"{m:.4g}"


table = []
for task in ["lm", "digits"]:
    for config in ["baseline", "cofactor"]:
        g = runs_df[(runs_df.task == task) & (runs_df.config == config)]
        table.append({"task": task, "config": config, "steps": int(g.steps.iloc[0]),
                      **{m: fmt(g[m]) for m in metrics}})  # fmt: skip
summary = pd.DataFrame(table).set_index(["task", "config"]).T
summary

# %%
fig = go.Figure()
for task in ["lm", "digits"]:
    for config in ["baseline", "cofactor"]:
        gs = [r["_gnorms"] for r in runs if r["task"] == task and r["config"] == config]
        k = min(len(g) for g in gs)
        viz.line_band(
            np.arange(1, k + 1), {f"{task} {config}": np.array([g[:k] for g in gs])}, fig=fig
        )
fig.update_layout(title="Gradient norm before clipping (mean and 95% interval over seeds)",
                  xaxis_title="step", yaxis_title="||grad||", yaxis_type="log")  # fmt: skip
viz.show(fig)

# %% [markdown]
# ### Do the seed's success criteria hold at this scale?
#
# The seed's criteria: *fewer nearly disconnected heads, lower gradient spikes, and equal or
# better validation accuracy*. Each comparison below pairs the regularised and baseline runs of
# the same seed (same initialisation and data order) and gives the mean difference with its 95%
# interval; a criterion is *met* when the interval lies on the favourable side of zero,
# *contradicted* when it lies on the other side, and *not resolved* otherwise. "Equal or better"
# accuracy is met unless the interval lies below zero.


# %%
def paired(task: str, metric: str) -> tuple[float, float, float]:
    a = (
        runs_df[(runs_df.task == task) & (runs_df.config == "cofactor")]
        .sort_values("seed")[metric]
        .to_numpy()
    )
    b = (
        runs_df[(runs_df.task == task) & (runs_df.config == "baseline")]
        .sort_values("seed")[metric]
        .to_numpy()
    )
    return mean_ci(a - b)


def verdict(lo: float, hi: float, better: str) -> str:
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return "not resolved (one seed)"
    good, bad = (hi < 0, lo > 0) if better == "lower" else (lo > 0, hi < 0)
    return "met" if good else ("contradicted" if bad else "not resolved")


criteria = [
    (
        "nearly disconnected heads (fraction, gap < 0.05, reg heads)",
        "frac_disconnected (reg heads)",
        "lower",
    ),
    ("near-zero cofactors per head (reg heads)", "cofactor_near_zero (reg heads)", "lower"),
    ("spectral gap (reg heads)", "spectral_gap (reg heads)", "higher"),
    ("gradient spikes", "grad_spikes", "lower"),
    ("gradient-norm variance", "grad_norm_var", "lower"),
    ("validation accuracy", "val_acc", "higher"),
    ("validation loss", "val_loss", "lower"),
]
vrows = []
for task in ["lm", "digits"]:
    for name, metric, better in criteria:
        m, lo, hi = paired(task, metric)
        v = verdict(lo, hi, better)
        if metric in ("val_acc", "val_loss") and v == "not resolved":
            v = "met (no significant difference)"
        both = runs_df[runs_df.task == task][metric]
        if (
            metric in ("frac_disconnected (reg heads)", "cofactor_near_zero (reg heads)")
            and (both == 0).all()
        ):
            v = "vacuous (none in any run)"
        elif metric == "cofactor_near_zero (reg heads)" and both.nunique() == 1:
            v = f"degenerate ({both.iloc[0]:g} in every run)"
        vrows.append(
            {
                "task": task,
                "criterion": name,
                "cofactor - baseline": m,
                "95% low": lo,
                "95% high": hi,
                "verdict": v,
            }
        )
verdicts = pd.DataFrame(vrows)
verdicts

# %%
lm_nz = runs_df[runs_df.task == "lm"]["cofactor_near_zero (reg heads)"]
lm_minp = runs_df[runs_df.task == "lm"]["cofactor_min_prob_n (reg heads)"]
assert (lm_minp.abs() < 1e-9).all(), "a causal head's stationary distribution must sit on token 0"
assert (lm_nz == lm_seq_len - 1).all()
dself = paired("lm", "self_attention (reg heads)")
dgap = paired("digits", "spectral_gap (reg heads)")
dlm = paired("lm", "spectral_gap (reg heads)")
viz.markdown(
    f"**Causal LM ({lm_level}-level WikiText-2).** As derived in section 1, every causal head has "
    f"$n\\min_i\\pi_i = 0$ and {lm_seq_len - 1} near-zero cofactors out of {lm_seq_len} in *every* run "
    "(asserted above): the cofactor diagnostics carry no information about a decoder's heads, and "
    "the regulariser reduces to a penalty on self-attention. Its measured effect is just that: the "
    f"mean self-attention weight of the regularised heads changed by {dself[0]:+.4f} "
    f"[{dself[1]:.4f}, {dself[2]:.4f}] and their spectral gap $1-\\max_j A_{{jj}}$ by "
    f"{dlm[0]:+.4f} [{dlm[1]:.4f}, {dlm[2]:.4f}].\n\n"
    f"**Digits (bidirectional).** The regularised heads' spectral gap changed by {dgap[0]:+.4f} "
    f"[{dgap[1]:.4f}, {dgap[2]:.4f}]. The verdict table above gives every criterion with its "
    f"interval; at this scale ({len(seeds)} seeds, {train_steps} steps, width {digits_dim}) the "
    "criteria read as follows:\n\n"
    + "\n".join(
        f"* {r['task']}: {r['criterion']}: **{r['verdict']}** ({r['cofactor - baseline']:+.3g} "
        f"[{r['95% low']:.3g}, {r['95% high']:.3g}])"
        for _, r in verdicts.iterrows()
    )
)

# %% [markdown]
# ## 7. What this chapter found
#
# * The identities hold as stated for any row-stochastic $A$ with $\operatorname{rank}(I-A) = n-1$,
#   and one LU of $I - A + \mathbf 1\mathbf 1^\top/n$ gives the margin (its determinant) and every
#   cofactor (one solve), exactly, in $O(n^3)$; the speed-ups over explicit minors are in section 4.
# * Near-reducibility is seen by the margin and the spectral gap (both vanish linearly in the
#   coupling) but not by the normalised cofactors, which converge to a mixture; the KL term
#   detects sinks, not weak coupling.
# * The margin term $-\log|m|$ does not reward mixing: a perfectly mixing rank-one head has
#   $m = 1$ while a deterministic cycle has $m = n$; $m$ grows as eigenvalues of $A$ move away from
#   1 around the unit circle (towards $-1$), so lowering the penalty can mean slower mixing.
# * For causal (decoder) attention the construction degenerates: token 0 is absorbing, $\pi = e_0$,
#   and the regulariser is a penalty on the diagonal of $A$.
# * The seed's experiment at this scale (tiny models, a few hundred steps, three seeds): the
#   verdict table in section 6 gives each criterion with its paired 95% interval; the cell below
#   counts them for this run. Criteria that are "not resolved" are neither supported nor refuted
#   here; larger models, longer runs and more seeds are the way to resolve them.

# %%
closing = [
    f"* `lu` against `minors` (batch {bench_batch}, float64, forward): "
    + "; ".join(
        f"$n = {r['n']}$: {r['speed-up fwd']:.0f}x wall, {r['speed-up fwd (CPU time)']:.0f}x CPU time"
        f" (forward+backward {r['speed-up fwd+bwd']:.0f}x wall)"
        for r in bench_rows
    ),
    f"* regulariser overhead on a digits training step: {100 * overhead:.0f}% wall time, "
    f"{100 * flops_df.loc[flops_df.task == 'digits', 'extra fraction'].item():.2f}% FLOPs",
    f"* seed's success criteria at this scale ({len(seeds)} seeds): "
    + ", ".join(f"{k}: {v}" for k, v in verdicts["verdict"].value_counts().items()),
]
viz.markdown("**In numbers (this run).**\n\n" + "\n".join(closing))
