"""The cost of one training step of every trainable variant, against a dot-product model.

:func:`bench_train` builds, for each variant, the training run chapter 4 would build at the
same width, depth, batch and length (:data:`SHAPES`, from
:data:`attention_atlas.experiments.fiber_bundle.run.PRESETS`) and times the harness's own
optimiser step (forward, loss, regularisers, backward, clipping, AdamW:
:func:`attention_atlas.train.step_callable` over :func:`~attention_atlas.train.optimiser_step`,
so nothing here re-implements it):

1. **time**: every variant's step against the dot-product model's, interleaved in one process
   (:func:`attention_atlas.bench.timing.compare`): the median step time and the median and quartiles
   of the per-round ratio to ``dot``. Each timed sample follows :data:`SETTLE` untimed steps
   of the same model, as in training, where a step follows a step of the same model: without
   them each sample's first step pays for the caches the previous variant of the round left;
2. **phases**: where a step's time goes, from :mod:`torch.profiler` traces of a few steps.
   Each operator goes to the innermost named range around it (the ranges of
   :func:`attention_atlas.profiling.phase` in the library: ``metric_net``, ``geodesic_scores``,
   ``transport``, ``regularizer/<name>``, ... and one per module kind opened by hooks here:
   ``embedding``, ``layernorm``, ``qkv_proj``, ``attention`` (the rest of the attention
   module: the variant's own core), ``mlp``, ``lm_head``), and each backward operator to the
   range of the forward operator it differentiates (autograd's sequence numbers link them).
   The profiler's own cost (measured per recorded operator on tiny additions) is taken off
   each phase in proportion to its operators, so phases of many small operators are not
   inflated; each phase's time is its least over the profiled
   steps (interruptions of a shared machine only add time); shares are of what remains, and a phase's
   milliseconds are its share of the unprofiled median step (approximate: the step's ratio to
   dot is the measured number, the split of it an estimate); on a GPU a step is timed by the
   wall clock (synchronised), an operator by the kernels it launched;
3. **FLOPs** per phase, forward and backward, from the same attribution with the matrix-product
   FLOPs of each operator (``2 m n k`` per product, as
   :class:`torch.utils.flop_counter.FlopCounterMode` counts, SDPA included), and the model's
   totals from :func:`attention_atlas.train.measure_flops`. The cofactor regulariser's LU
   factorisations have no FLOP formula; their estimate
   (:func:`attention_atlas.cofactor.penalty.cofactor_flops`) is reported beside.

``python -m attention_atlas bench --train [VARIANT ...] --shape book --store`` runs it and
stores the record in ``results/bench/<cpu|cuda>/train-<shape>.json`` (:mod:`attention_atlas.bench.records`).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from attention_atlas.bench.tables import format_train_table, phase_table, step_flops
from attention_atlas.bench.timing import compare
from attention_atlas.data import TextCorpus, load_char_ptb
from attention_atlas.models import FiberBundleConfig, ModelConfig
from attention_atlas.profiling import PREFIX
from attention_atlas.train import TrainConfig, build_run, measure_flops, step_callable
from attention_atlas.train.step import peek_batch

__all__ = [
    "SHAPES",
    "TRAIN_VARIANTS",
    "bench_train",
    "format_train_table",
    "phase_table",
    "profile_phases",
    "step_flops",
    "train_setup",
    "variant_run",
]

#: untimed steps of a model right before each of its timed samples (see the module docstring)
SETTLE = 1

#: the variants whose training step is profiled; "cofactor" is dot-product attention with the
#: cofactor regulariser of chapter 6, "fiber_bundle" the Fiber Bundle Transformer of chapter 4
TRAIN_VARIANTS = (
    "dot", "euclidean", "riemannian", "fiber_bundle", "matroidal", "mahalanobis", "ssm",
    "cofactor",
)  # fmt: skip

_SHAPE_KEYS = ("dim", "n_layers", "n_heads", "batch_size", "seq_len")
#: suffix of a variant's compiled run among :func:`bench_train`'s timed steps
COMPILED = "@compiled"
#: suffix of a variant's run with the native kernels (:mod:`attention_atlas.native`)
NATIVE = "@native"
#: the variants whose steps the native kernels change (the others run the same operators)
NATIVE_VARIANTS = ("riemannian", "fiber_bundle", "cofactor", "ssm")


def _shape(preset: str) -> dict[str, int]:
    from attention_atlas.experiments.fiber_bundle.run import PRESETS, chapter_grid

    defaults = {k: p.default for k, p in inspect.signature(chapter_grid).parameters.items()}
    merged = {**defaults, **PRESETS[preset]}
    return {k: int(merged[k]) for k in _SHAPE_KEYS}


#: chapter 4's shapes: ``book`` (its book preset) and ``long`` (its long preset)
SHAPES: dict[str, dict[str, int]] = {name: _shape(name) for name in ("book", "long")}


def train_setup(
    variant: str, shape: dict[str, int], seed: int = 0
) -> tuple[ModelConfig, TrainConfig]:
    """The model and training configuration of ``variant`` at ``shape`` (chapter 4's run for
    ``fiber_bundle``, with its three regularisers and cap; chapter 6's regulariser settings for
    ``cofactor``; the registry's defaults for the others)."""
    if variant not in TRAIN_VARIANTS:
        raise ValueError(
            f"unknown training variant {variant!r}; known: {', '.join(TRAIN_VARIANTS)}"
        )
    model: dict[str, Any] = {"dim": shape["dim"], "n_layers": shape["n_layers"], "n_heads": shape["n_heads"],
             "max_len": shape["seq_len"]}  # fmt: skip
    train = TrainConfig(
        steps=100, batch_size=shape["batch_size"], seq_len=shape["seq_len"], seed=seed,
        progress=False, measure_flops=False, warmup_steps=10, log_every=10**9,
    )  # fmt: skip
    if variant == "fiber_bundle":
        from attention_atlas.experiments.fiber_bundle import run as fb

        params = fb.chapter_grid(**dict[str, Any](shape))["fbt"]
        tcfg = fb.train_config(params, seed)  # chapter 4's regularisers and diagnostics
        return FiberBundleConfig(**params["model"]), replace(tcfg, log_every=10**9)
    if variant == "cofactor":
        from attention_atlas.experiments.cofactor import run as cof

        d = {k: p.default for k, p in inspect.signature(cof.chapter_grid).parameters.items()}
        reg = {"name": "cofactor", "weight": d["alpha"], "heads": d["reg_heads"], "beta": d["beta"]}
        return ModelConfig(**model), replace(train, regularizers=[reg])
    return ModelConfig(**model, attention=variant), train


def variant_run(
    variant: str, shape: dict[str, int], data: TextCorpus, seed: int, device: Any = "cpu"
) -> Any:
    """The training run (:func:`attention_atlas.train.build_run`) of ``variant`` at ``shape``
    (:func:`train_setup`) on ``data``; time its steps with
    :func:`attention_atlas.train.step_callable`."""
    mcfg, tcfg = train_setup(variant, shape, seed)
    return build_run(mcfg, tcfg, data, device)


# -- phases ------------------------------------------------------------------------------------

#: module attribute -> phase name, for the ranges opened by forward hooks
_MODULE_PHASES = {"tok_emb": "embedding", "patch_emb": "embedding", "head": "lm_head",
                  "ln_1": "layernorm", "ln_2": "layernorm", "ln_f": "layernorm",
                  "qkv": "qkv_proj", "proj": "qkv_proj", "attn": "attention", "mlp": "mlp"}  # fmt: skip
_MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")
_SDPA_OPS = ("aten::_scaled_dot_product_flash_attention_for_cpu",
             "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
             "aten::_scaled_dot_product_flash_attention",
             "aten::_scaled_dot_product_efficient_attention")  # fmt: skip
_BACKWARD = "autograd::engine::evaluate_function: "


@contextlib.contextmanager
def _module_ranges(model: nn.Module) -> Iterator[None]:
    """Profiler ranges around the forward of the model's standard modules (see
    :data:`_MODULE_PHASES`); the attention and block modules of any variant keep their names."""
    stack: list[Any] = []
    handles = []

    def pre(name: str) -> Callable[..., None]:
        def hook(mod: nn.Module, args: Any) -> None:
            rf = torch.profiler.record_function(PREFIX + name)
            rf.__enter__()
            stack.append(rf)

        return hook

    def post(mod: nn.Module, args: Any, out: Any) -> None:
        stack.pop().__exit__(None, None, None)

    for parent_name, mod in model.named_modules():
        for attr, child in mod.named_children():
            name = _MODULE_PHASES.get(attr)
            if name is None or (attr in ("qkv", "proj") and not parent_name.endswith("attn")):
                continue
            handles.append(child.register_forward_pre_hook(pre(name)))
            handles.append(child.register_forward_hook(post))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _sdpa_flops(shapes: list[Any], backward: bool) -> int:
    """``4 B H Lq Lk d`` (forward; the backward 2.5 times it), as FlopCounterMode counts SDPA."""
    q, k = shapes[0], shapes[1]
    if len(q) != 4 or len(k) != 4:
        return 0
    b, h, lq, d = q
    n = 4 * b * h * lq * k[2] * d
    return int(2.5 * n) if backward else n


def _op_flops(e: Any) -> int:
    if e.name in _MATMUL_OPS:
        return int(e.flops or 0)
    if e.name in _SDPA_OPS:
        shapes = e.input_shapes[1:3] if e.name.endswith("backward") else e.input_shapes[:2]
        return _sdpa_flops(shapes, e.name.endswith("backward"))
    return 0


def _attribute(
    events: list[Any], with_flops: bool, device_time: bool = False
) -> dict[str, dict[str, float]]:
    """Self time (s) and matrix-product FLOPs of every event, by phase and part: its CPU time,
    or with ``device_time`` the time of the GPU kernels it launched (``self_device_time_total``)."""
    ranges: dict[int, str] = {}  # sequence number -> phase of its forward operator
    out: dict[str, dict[str, float]] = {}

    def phase_of(e: Any) -> tuple[str, str, Any]:
        part, seq_event = "forward", None
        p = e
        name = "other"
        while p is not None:
            if p.name.startswith(_BACKWARD):
                part, seq_event = "backward", p
                break
            if p.name.startswith("Optimizer."):
                return "optimizer", "optimizer", None
            if name == "other" and p.name.startswith(PREFIX):
                name = p.name[len(PREFIX) :]
            p = p.cpu_parent
        return part, name, seq_event

    pending = []
    for e in sorted(events, key=lambda ev: ev.time_range.start):
        part, name, seq_event = phase_of(e)
        if part == "forward" and e.sequence_nr >= 0 and not e.name.startswith(PREFIX):
            ranges.setdefault(e.sequence_nr, name)
        pending.append((e, part, name, seq_event))
    for e, part, name, seq_event in pending:
        if part == "backward":
            name = ranges.get(seq_event.sequence_nr, "other")
        key = "optimizer" if part == "optimizer" else name
        row = out.setdefault(key, {"forward_s": 0.0, "backward_s": 0.0, "forward_flops": 0.0,
                                   "backward_flops": 0.0, "forward_events": 0.0,
                                   "backward_events": 0.0})  # fmt: skip
        col = "backward" if part == "backward" else "forward"
        us = e.self_device_time_total if device_time else e.self_cpu_time_total
        row[f"{col}_s"] += us * 1e-6
        row[f"{col}_events"] += 1
        if with_flops:
            row[f"{col}_flops"] += _op_flops(e)
    return out


@functools.lru_cache(maxsize=1)
def _profiler_cost_per_event(n: int = 2000) -> float:
    """Seconds the CPU profiler adds per recorded operator on this machine: ``n`` tiny
    additions with and without it (the least of three tries each, this thread's CPU time)."""
    from torch.profiler import ProfilerActivity, profile

    a = torch.zeros(1)

    def run() -> float:
        t0 = time.thread_time()
        for _ in range(n):
            torch.add(a, a)
        return time.thread_time() - t0

    plain = min(run() for _ in range(3))
    costs = []
    for _ in range(3):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            t = run()
        costs.append((t - plain) / max(1, len(prof.events())))
    return max(0.0, min(costs))


def profile_phases(
    step: Callable[[], Any], model: nn.Module, steps: int = 3, device: Any = "cpu"
) -> dict[str, Any]:
    """Where one call of ``step`` (an optimiser step of ``model``) spends its time and FLOPs:
    ``{phase: {"forward_s", "backward_s", "forward_flops", "backward_flops", "share"}}``.

    Each of ``steps`` steps is profiled on its own (without shapes) and corrected for the
    profiler's cost (:func:`_profiler_cost_per_event` per recorded operator); a phase's time is
    the least over the steps: the profiler's clock is wall time, and the machine's interruptions
    (an operator descheduled for milliseconds) only ever add to it. FLOPs come from one more
    step profiled with shapes. On a GPU (``device``) a phase's time is that of the kernels its
    operators launched (the profiler's CUDA activity; the CPU's launch overhead, which the GPU
    overlaps, is not counted and no correction is needed)."""
    from torch.profiler import ProfilerActivity, profile

    from attention_atlas.bench.timing import quiet_stderr_fd

    per_step: list[dict[str, dict[str, float]]] = []
    gpu = torch.device(device).type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    with _module_ranges(model), quiet_stderr_fd():
        per_event = 0.0 if gpu else _profiler_cost_per_event()
        for _ in range(steps):
            with profile(activities=activities) as prof:
                step()
                if gpu:
                    torch.cuda.synchronize(device)
            one = _attribute(list(prof.events()), with_flops=False, device_time=gpu)
            for r in one.values():
                for part in ("forward", "backward"):
                    r[f"{part}_s"] = max(0.0, r[f"{part}_s"] - per_event * r[f"{part}_events"])
            per_step.append(one)
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_flops=True) as pf:
            step()
        counted = _attribute(list(pf.events()), with_flops=True)
    names = sorted(set(counted).union(*per_step))
    med = {
        n: {part: min(s.get(n, {}).get(part, 0.0) for s in per_step)
            for part in ("forward_s", "backward_s")}
        for n in names
    }  # fmt: skip
    total = sum(m["forward_s"] + m["backward_s"] for m in med.values())
    phases: dict[str, Any] = {}
    for name in names:
        c = counted.get(name, {"forward_flops": 0.0, "backward_flops": 0.0})
        t = med[name]
        phases[name] = {
            **t, "share": (t["forward_s"] + t["backward_s"]) / total if total else math.nan,
            "forward_flops": int(c["forward_flops"]), "backward_flops": int(c["backward_flops"]),
        }  # fmt: skip
    return phases


# -- the benchmark -----------------------------------------------------------------------------


def _model_flops(run: Any) -> dict[str, int]:
    x, y = peek_batch(run.sampler)
    flops = measure_flops(run.model, x.to(run.device), y.to(run.device))
    if any(s["name"] == "cofactor" for s in run.cfg.regularizers):
        from attention_atlas.cofactor.penalty import cofactor_flops

        spec = next(s for s in run.cfg.regularizers if s["name"] == "cofactor")
        heads = spec.get("heads", 1)
        mats = x.shape[0] * run.mcfg.n_layers * (heads if isinstance(heads, int) else len(heads))
        # a causal model's heads take the closed form (no factorisation: its products, the
        # logits and their two backward products, are in the profile's count already)
        closed_form = bool(run.model.cfg.is_causal) and spec.get("method", "lu") == "lu"
        flops["regularizer_estimate"] = 0 if closed_form else mats * cofactor_flops(x.shape[1])
    return flops


def bench_train(
    variants: list[str] | tuple[str, ...] = TRAIN_VARIANTS,
    shape: str | dict[str, int] = "book",
    *,
    reps: int = 10,
    warmup: int = 3,
    profile_steps: int = 5,
    min_sample_s: float = 0.05,
    seed: int = 0,
    data: TextCorpus | None = None,
    compiled: bool = False,
    device: torch.device | str = "cpu",
    native: bool = False,
) -> dict[str, Any]:
    """Time, profile and count one training step of each of ``variants`` against ``dot``.

    Args:
        variants: names of :data:`TRAIN_VARIANTS` (``dot`` is added if missing: the baseline).
        shape: a key of :data:`SHAPES` or ``{dim, n_layers, n_heads, batch_size, seq_len}``.
        reps: interleaved timing rounds; warmup: untimed steps of each run first.
        profile_steps: steps profiled per variant for the phase breakdown.
        data: the corpus (default char-PTB, chapter 4's).
        compiled: also time each variant's step with its forward through ``torch.compile``
            (``TrainConfig(compile=True)``), in the same interleaved rounds: a second run of
            each variant from the same seed (record name ``train-<shape>-compiled``).
        device: where the models train (``"cuda"``: timed by the wall clock with the GPU
            synchronised, phases by the GPU time of their kernels; the record's ``device``).
        native: also time (and profile) the step of each of :data:`NATIVE_VARIANTS` with the
            native kernels (``TrainConfig(native=True)``), in the same interleaved rounds: a
            second run from the same seed (record name ``train-<shape>-native``).

    Returns:
        ``{"name", "kind": "train_step", "shape", "sizes", "baseline": "dot", "device",
        "threads", "reps", "seconds", "results": {variant: {"step": {median_s, q25_s, q75_s,
        ratio_median, ratio_q25, ratio_q75, samples_s}, "phases": {...}, "flops": {...},
        "params": int}}}``; ``flops`` holds :func:`attention_atlas.train.measure_flops`'s counts
        of the model (its fast path), ``step_counted`` (every matrix product the profiled step
        ran, regularisers included) and for ``cofactor`` the ``regularizer_estimate``; with
        ``compiled`` also ``"compiled": {median_s, q25_s, q75_s, ratio_median, ...}`` (ratios
        to the eager dot step), ``"compile_speedup"`` (eager median over compiled median) and
        ``"compile_error"`` (None, or the error that sent the steps back to eager); with
        ``native``, for :data:`NATIVE_VARIANTS`, ``"native"`` (timing as ``compiled``'s),
        ``"native_speedup"``, ``"native_phases"``, ``"native_status"`` and ``"native_level"``.
    """
    from attention_atlas import native as native_kernels

    t0 = time.time()
    sizes = SHAPES[shape] if isinstance(shape, str) else {k: int(shape[k]) for k in _SHAPE_KEYS}
    names = ["dot", *[v for v in variants if v != "dot"]]
    bad = [v for v in names if v not in TRAIN_VARIANTS]
    if bad:
        raise ValueError(f"unknown training variant {bad[0]!r}; known: {', '.join(TRAIN_VARIANTS)}")
    corpus = data if data is not None else load_char_ptb()
    dev = torch.device(device)
    runs = {v: variant_run(v, sizes, corpus, seed, dev) for v in names}
    steps = {v: step_callable(r) for v, r in runs.items()}
    if compiled:  # a second run of each, from the same seed, its forward compiled
        for v in names:
            steps[v + COMPILED] = step_callable(
                variant_run(v, sizes, corpus, seed, dev), compiled=True
            )
    native_runs = {}
    if native:  # a second run of each variant the kernels change, from the same seed
        for v in names:
            if v in NATIVE_VARIANTS:
                native_runs[v] = variant_run(v, sizes, corpus, seed, dev)
                steps[v + NATIVE] = step_callable(native_runs[v], native=True)
    clock = "cpu" if dev.type == "cpu" and torch.get_num_threads() == 1 else "wall"
    timing = compare(steps, "dot", (), backward=False, warmup=warmup, reps=reps,
                     min_sample_s=min_sample_s, memory=False, clock=clock, device=dev,
                     settle=SETTLE)  # fmt: skip
    results: dict[str, Any] = {}
    for v, run in runs.items():
        t = dict(timing["results"][v]["forward"])
        phases = profile_phases(steps[v], run.model, profile_steps, dev)
        flops = _model_flops(run)
        flops["step_counted"] = sum(
            p["forward_flops"] + p["backward_flops"] for p in phases.values()
        )
        results[v] = {
            "step": t, "phases": phases, "flops": flops,
            "params": sum(p.numel() for p in run.model.parameters() if p.requires_grad),
        }  # fmt: skip
        if compiled:
            c = dict(timing["results"][v + COMPILED]["forward"])
            results[v]["compiled"] = c
            results[v]["compile_speedup"] = t["median_s"] / c["median_s"]
            results[v]["compile_error"] = steps[v + COMPILED].compiled.error  # type: ignore[attr-defined]
        if v in native_runs:
            nt = dict(timing["results"][v + NATIVE]["forward"])
            results[v]["native"] = nt
            results[v]["native_speedup"] = t["median_s"] / nt["median_s"]
            results[v]["native_phases"] = profile_phases(
                steps[v + NATIVE], native_runs[v].model, profile_steps, dev
            )
            results[v]["native_status"] = native_kernels.status()
            results[v]["native_level"] = native_kernels.LEVEL
    name = f"train-{shape}" if isinstance(shape, str) else "train-custom"
    return {
        "name": name + ("-compiled" if compiled else "") + ("-native" if native else ""),
        "kind": "train_step", "shape": shape if isinstance(shape, str) else "custom",
        "sizes": sizes, "baseline": "dot", "device": dev.type, "threads": torch.get_num_threads(),
        "reps": reps, "settle": SETTLE, "clock": clock, "seconds": time.time() - t0,
        "results": results,
    }  # fmt: skip
