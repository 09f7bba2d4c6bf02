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
# # 8. Performance
#
# Every chapter so far asked what an attention variant computes. This one asks what it costs:
# how long its kernel takes against scaled dot-product attention (SDPA,
# {cite}`vaswani2017attention`, through PyTorch's fused kernel) as the sequence grows, how much
# memory it holds, how close it runs to the arithmetic floor of its own FLOPs, and what one
# training step of a whole model costs against a dot-product model of the same width, depth and
# data. Training cost is what limits every experiment of this book: each factor saved buys the
# science more steps, seeds and width.
#
# Three rules make the numbers worth reading on a shared machine:
#
# * **Ratios, side by side.** Every time is taken in one process, interleaved with the
#   baseline's (`attention_atlas.bench.timing.compare`: rounds in which every function runs once, in a
#   rotating order), and the ratio is taken within each round. On one CPU thread the clock is the
#   thread's CPU time, which other processes on the machine do not inflate.
# * **Floors, not only ratios.** A ratio to SDPA moves when either side gets faster. The *floor
#   ratio* does not: the measured time divided by the time this machine's matrix products would
#   take for the variant's counted FLOPs (`bench.count_flops`, $2mnk$ per product, the
#   convention of `torch.utils.flop_counter`, which counts SDPA's full square of scores even
#   when causal kernels skip half of it), the compute roof of a roofline model
#   {cite}`williams2009roofline`. A floor ratio of 1 is a kernel that does nothing but matrix
#   products at the machine's peak rate.
# * **Stored records with their provenance.** The long measurements are command-line runs
#   whose records (command, commit, machine) live in `results/bench/<cpu|cuda>/`; the page
#   plots them and prints where each came from, and adds a small live measurement of its own.

# %% tags=["parameters"]
live_variants = [
    "dot",
    "euclidean",
    "matroidal",
    "mahalanobis",
    "riemannian",
    "fiber_bundle",
    "ssm",
]
live_lengths = [256, 1024]  # lengths of the live kernel exploration
live_dtypes = ["float32", "float64"]  # dtypes of the live kernel exploration
fallback_lengths = [128, 256, 512]  # kernel lengths measured here when no record is stored
live_train_variants = ["dot", "riemannian", "fiber_bundle"]  # the live training-step run
live_train_shape = {"dim": 32, "n_layers": 2, "n_heads": 2, "batch_size": 4, "seq_len": 32}
reps = 3  # interleaved rounds of the live measurements

# %% tags=["smoke"]
SMOKE = {"live_variants": ["dot", "euclidean", "fiber_bundle"], "live_lengths": [64],
         "live_dtypes": ["float32"], "fallback_lengths": [32, 64], "reps": 1,
         "live_train_variants": ["dot", "fiber_bundle"],
         "live_train_shape": {"dim": 16, "n_layers": 1, "n_heads": 2, "batch_size": 2, "seq_len": 16}}  # fmt: skip
from attention_atlas.notebooks.lab import apply_smoke  # with ATTENTION_ATLAS_SMOKE=1 in JupyterLab

apply_smoke(SMOKE, globals())

# %%
import math

import torch
from IPython.display import display

from attention_atlas import viz
from attention_atlas.bench.scaling import matmul_rate
from attention_atlas.experiments.performance import kernels as perf
from attention_atlas.experiments.performance import steps

torch.set_num_threads(1)  # every measurement of this chapter is on one thread
records = perf.load_records()
print({name: sorted(kinds) or "none stored" for name, kinds in records.items()})

# %% [markdown]
# ## The machine's floor
#
# The floor of every ratio below is this machine's rate for a square float32 matrix product on
# one thread, measured by the benchmark that made each record; the page measures it again now.

# %%
rate_now = matmul_rate(torch.float32, "cpu", n=256, reps=3)
kernels, kernels_source = perf.stored_or_live_kernels(
    records, live_variants, fallback_lengths, reps
)
viz.markdown(
    f"Matrix products run at **{kernels['matmul_flops_per_s'] / 1e9:.1f} GFLOP/s** in the run "
    f"that made the kernel record ({kernels_source}) and at {rate_now / 1e9:.1f} GFLOP/s in this "
    f"one (one thread, float32)."
)

# %% [markdown]
# ## Kernels against SDPA
#
# Each variant's `attend` (its score, softmax and value mixing, without the projections that
# every variant shares) on the same random causal $q, k, v$ (sizes below, from the record), at
# lengths doubling up to the longest the record holds. A variant stops where its next length would take
# longer than the run allows per call, or where its memory estimate is too large: the
# materialised scores of the Fiber Bundle Transformer {cite}`song2026riemannian` (chapter 4)
# hold $(L, r, 2L)$ products, while SDPA and the blocked Riemannian path keep memory linear in
# $L$ as FlashAttention does {cite}`dao2022flashattention`, and the chunked SSM
# {cite}`dao2024transformers` is linear in time too.

# %%
kf = perf.kernel_frame(kernels)
print(perf.provenance_text(kernels, kernels_source))
viz.markdown(perf.kernel_sizes_sentence(kernels))
viz.show(
    perf.kernel_figure(kf, "forward+backward ms", title="Forward+backward time of each kernel")
)
viz.show(
    perf.kernel_figure(
        kf, "forward+backward / SDPA", title="Forward+backward time over SDPA's, same run"
    )
)

# %% [markdown]
# How close each kernel runs to the matrix-product floor of its own FLOPs, and its memory (the
# high-water mark of live tensor bytes of one forward+backward):

# %%
viz.show(perf.kernel_figure(kf, "forward+backward floor ratio",
                            title="Time over the matrix-product time of its counted FLOPs"))  # fmt: skip
if kf["peak MiB"].notna().any():
    viz.show(perf.kernel_figure(kf, "peak MiB", title="Peak tensor memory of one forward+backward"))
slopes = perf.slope_frame(kernels)
display(slopes.round(2))

# %%
longest = int(kf["L"].max())
at = perf.at_longest(kf)
quad = slopes.drop(index=["ssm"], errors="ignore")["forward+backward slope"]
viz.markdown(
    perf.longest_sentence(kf) + " The quadratic kernels' time grows with slopes "
    f"{quad.min():.2f} to {quad.max():.2f} in $L$ (2 is quadratic)"
    + (
        f"; the chunked SSM's slope is {slopes.loc['ssm', 'forward+backward slope']:.2f}"
        if "ssm" in slopes.index
        else ""
    )
    + f". SDPA itself runs at {at.loc['dot', 'forward+backward floor ratio']:.1f}x its matrix-product "
    f"floor at L = {int(at.loc['dot', 'L'])}; the longest length measured is {longest:,}."
)

# %% [markdown]
# ### On a GPU
#
# The same commands on a CUDA machine store their records beside the CPU ones
# (`results/bench/cuda/`; `benchmarks/gpu_run.sh` runs them on your GPU machine); this section
# shows them when they exist: the kernels against SDPA here, the training steps after the CPU's
# below. On a GPU the clock is the wall clock with the device synchronised, and a kernel of a
# few small operators is bound by the host's launches, not by arithmetic.

# %%
gpu = records[perf.KERNEL_RECORD].get("cuda")
if gpu is None:
    print(
        "No GPU record is stored yet: no GPU has run `python -m attention_atlas bench --lengths "
        "256 512 1024 2048 4096 8192 16384 --device cuda --store`."
    )
else:
    print(perf.provenance_text(gpu))
    gkf = perf.kernel_frame(gpu)
    viz.markdown(perf.kernel_sizes_sentence(gpu))
    viz.show(perf.kernel_figure(gkf, "forward+backward / SDPA",
                                title="GPU: forward+backward time over SDPA's"))  # fmt: skip
    viz.markdown(perf.longest_sentence(gkf, "On the GPU: "))

# %% [markdown]
# ## Exploration: one kernel, live
#
# Pick a variant, a length and a dtype: the page measures that kernel against SDPA now (one
# causal sequence, `perf.LIVE_SIZES`), forward and forward+backward, beside the floor of each
# (its counted FLOPs at this machine's matrix-product rate).

# %%
viz.explore(
    perf.live_kernel_figure,
    {
        "variant": viz.dropdown([v for v in live_variants if v != "dot"]),
        "length": viz.dropdown(live_lengths),
        "dtype": viz.dropdown(live_dtypes),
    },
    main=True,
)

# %% [markdown]
# ## One training step against a dot-product model
#
# Each variant is trained as the harness trains it (the same `train` step: forward, loss,
# regularisers, backward, gradient clipping, AdamW) at chapter 4's shapes, **book** and **long**
# (the sizes are printed below from the records). `fiber_bundle` is the Fiber Bundle
# Transformer of chapter 4 with its three regularisers;
# `cofactor` is the dot-product model with chapter 6's cofactor regulariser. The bars are each
# step's time over the dot-product step's in the same round (median and quartiles); the
# diamonds are the ratio of their counted FLOPs, the floor if a variant ran at dot's FLOP rate.

# %%
found = {
    shape: perf.stored_or_live_train(records, shape, live_train_variants, live_train_shape, reps)
    for shape in ("book", "long")
}
train = {shape: rec for shape, (rec, _) in found.items() if rec is not None}
frames = {shape: perf.train_frame(rec) for shape, rec in train.items()}
for shape, rec in train.items():
    print(f"{shape} {rec['sizes']}: {perf.provenance_text(rec, found[shape][1])}")
viz.show(perf.train_figure(frames))
display(frames["book"].round(2))

# %% [markdown]
# The goals (`perf.GOALS`: a bound on the Fiber Bundle Transformer's step and one on every
# other variant's, in dot-product steps), or, where a goal is out of reach, a count of FLOPs that
# shows why (a variant whose counted FLOPs already exceed its goal cannot meet it at dot's FLOP
# rate). The cofactor regulariser has a goal of its own, a share of the step
# (`perf.REGULARIZER_SHARE_GOAL`), read two ways from the same records: the step's excess over
# the dot-product step timed beside it, and the regulariser's phase in the profile. Its FLOPs are
# the products it runs (the heads' logits and their two backward products: a decoder's heads
# take chapter 6's closed form, with no factorisation). Chapter 6 times it again at its own
# shapes.

# %%
print("goals, in dot-product steps:", perf.GOALS)
for shape, rec in train.items():
    g = perf.goals(rec)
    display(g.round(2).rename_axis(f"{shape} shape"))
    viz.markdown(perf.goal_sentence(g, shape))
viz.markdown(steps.regularizer_sentence({s: steps.regularizer_share(r) for s, r in train.items()}))

# %% [markdown]
# ### Training steps on a GPU
#
# The same training-step benchmark on a GPU (`bench --train --device cuda`), where one has run
# it: each step timed by the wall clock with the device synchronised, its phases split by the
# GPU time of their kernels.

# %%
gpu_train = steps.stored_train(records, kind="cuda")
gframes = {shape: perf.train_frame(rec) for shape, rec in gpu_train.items()}
for shape, rec in gpu_train.items():
    print(steps.record_caption(rec))
    display(gframes[shape].round(2).rename_axis(f"{shape} shape, GPU"))
if gframes:
    viz.show(perf.train_figure(gframes).update_layout(title="GPU: one training step against dot"))
viz.markdown(steps.device_step_sentence(gpu_train, train))

# %% [markdown]
# ## Compiled steps
#
# `TrainConfig(compile=True)` (or `-o compile=true` on the command line) sends each training
# step's forward, and with it the backward, through `torch.compile`; on a CPU its backend
# writes and compiles C++ for the elementwise work between the matrix products, and where it
# cannot (no compiler on the machine) the steps run eagerly after a warning. It is the same
# arithmetic in another order, so a compiled run is not bit-identical to an eager one (it is to
# another compiled run on the same machine and versions). The book's book-sized runs are eager;
# a long grid may be swept with `sweep ... --compile`, which compiles every cell's training
# steps without changing the cells' keys: each record says so, the chapter's provenance line
# reads "compiled steps", and `results verify` re-runs such a cell compiled. The records below
# time every variant's compiled step beside its eager step, in the same interleaved rounds
# (`bench --train --compile`), where they are stored.

# %%
compiled = steps.stored_train(records, "compiled")
cframes = {shape: steps.compile_frame(rec) for shape, rec in compiled.items()}
for shape, rec in compiled.items():
    print(steps.record_caption(rec))
    display(cframes[shape].round(2).rename_axis(f"{shape} shape"))
if cframes:
    viz.show(steps.compile_figure(cframes))
viz.markdown(steps.compile_sentence(cframes))

# %% [markdown]
# ## Native CPU kernels
#
# `TrainConfig(native=True)` (`-o native=true`, `sweep ... --native`) runs the steps of the
# Riemannian attention, the Fiber Bundle Transformer, the cofactor regulariser's causal heads
# and the SSM's intra-chunk decay mask through the library's own C kernels
# (`attention_atlas.native`: compiled on first use with the system's compiler, equal to the
# PyTorch path in float64 and gradchecked, the PyTorch path wherever they do not apply). A
# kernel that changes a run's rounding comes at a new level (`native.LEVEL`, recorded with each
# run as `native_level`), so that a record re-runs exactly at the level that made it: level 1
# holds the attention, projection, transport and Gram kernels and the cofactor heads; level 2
# adds the Fiber Bundle regularisers (eqs. (31) to (34)) in one kernel per layer, which forms
# their gradient while the Gram matrices are in cache, the metric strength of the curvature
# (eq. (21)) in one pass, and the base of the causal scores (the dot-product, norm and curvature
# terms of eq. (16)) inside the pairwise kernels; level 3 forms the cofactor regulariser's fused
# causal heads with fused multiply-adds. (No stored record made with the kernels yet carries its
# processor's `cpu_id`, which exact re-runs need, so kernels have also changed their rounding
# within a level: the transport kernels' sums, the row softmax and the scores' gradient formed
# inside the pairwise kernels. Once such a record is stored, that takes a new level.) The SSM's
# kernels need no level: they form each chunk's
# decay mask in cache and never write it out, but compute every entry by the same float
# operations in the same order as the PyTorch path, so a run gives the same bits with them as
# without (a test holds them to it). The records below time each such step, at the level they
# name, beside its eager step and the eager dot-product step, in the same interleaved rounds
# (`bench --train --native`), where they are stored; the quartiles are those of the per-round
# ratios.

# %%
natives = steps.stored_train(records, "native")
nframes = {shape: steps.native_frame(rec) for shape, rec in natives.items()}
for shape, rec in natives.items():
    print(steps.record_caption(rec))
    display(nframes[shape].round(2).rename_axis(f"{shape} shape"))
if nframes:
    viz.show(steps.native_figure(nframes))
viz.markdown(steps.native_sentence(nframes))
native_shares = {s: steps.regularizer_share(r, native=True) for s, r in natives.items()}
viz.markdown(
    steps.regularizer_sentence(native_shares, "With the native kernels, the cofactor regulariser")
)

# %% [markdown]
# ### The same steps on other machines
#
# A ratio to the dot-product step is a property of the machine as well as of the code. The
# dot-product step is mostly matrix products, which a library runs near the peak of the vector
# units; the native kernels, the small operators around them and the Python of a step do not
# scale with that peak in the same way, so the same code can meet a goal on one processor and
# miss it on another. Records made on other CPUs (`bench --train --native --store --machine
# LABEL`) are stored beside the reference records above, not over them, and read here the same
# way; the sentence under each says which goals it meets that the reference does not, and the
# other way round.

# %%
other_cpus = steps.other_machine_records("native")
for label, recs in other_cpus.items():
    for shape, rec in recs.items():
        print(f"{label}, {shape}: " + steps.record_caption(rec))
    viz.show(steps.native_figure({s: steps.native_frame(r) for s, r in recs.items()}))
    viz.markdown(steps.machine_sentence(label, recs, natives))
if not other_cpus:
    viz.markdown("No training-step record from another CPU is stored.")

# %% [markdown]
# ## Where a step goes
#
# A profile of a few steps of each variant (`torch.profiler`) splits its time into phases:
# ranges the library opens around each part of a model (`attention_atlas.profiling.phase`: the
# Fiber Bundle Transformer's MetricNet, metric-aware projection (A++), curvature, geodesic
# scores, transport, torsion, preconditioned update (Phase E), and each regulariser) and one per
# kind of module (embedding, layer norms, the q/k/v and output projections, the MLP, the output
# head; what is left inside an attention module is the variant's own core). Backward work is
# charged to the phase whose forward operator it differentiates. The bars are in units of the
# dot-product step, so they add up to the variant's ratio. The split is an estimate (the least
# time of each phase over a few profiled steps on a shared machine, less the profiler's own
# cost); the step's ratio to dot above is the measured number.

# %%
book = train["book"]
viz.show(perf.phase_figure(book, list(book["results"])))
fbt = perf.phase_frame(book, "fiber_bundle") if "fiber_bundle" in book["results"] else None
if fbt is not None:
    display(fbt.round(3))

# %%
if fbt is not None:
    top = fbt.index[:3]
    viz.markdown(
        "In the Fiber Bundle Transformer's step the largest phases are "
        + ", ".join(
            f"{p} ({fbt.loc[p, 'of dot step']:.2f} dot steps, "
            f"{fbt.loc[p, 'forward MFLOP'] + fbt.loc[p, 'backward MFLOP']:.0f} MFLOP)"
            for p in top
        )
        + f"; the whole step counts {frames['book'].loc['fiber_bundle', 'FLOP ratio']:.2f}x the "
        f"dot-product step's FLOPs and takes {frames['book'].loc['fiber_bundle', 'ratio to dot']:.2f}x its time."
    )

# %% [markdown]
# ## A live training step
#
# The same benchmark, small enough to run while the page builds (one thread, a few rounds):

# %%
live = perf.live_train(live_train_variants, live_train_shape, reps=reps)
display(perf.train_frame(live).round(2))
ratio = perf.train_frame(live)["ratio to dot"]
assert (ratio > 0).all() and math.isfinite(float(ratio.max()))

# %% [markdown]
# ## What the numbers say
#
# The kernels, from the stored record: how far each stays from SDPA, how its time grows with
# $L$, and how close it runs to the floor of its own FLOPs (chapter 3 derived the Riemannian
# kernel's $2r + 1$; chapter 7 the chunked SSM's linear time). Training steps add what the
# kernels leave out (factor networks, per-token geometry, regularisers), which at chapter 4's
# shapes are many small operators; the goals above say which steps are within budget and, for
# the others, whether their FLOPs or their efficiency stand in the way.

# %%
viz.markdown(perf.kernel_summary(kf, slopes))
