"""Principal cofactors: one LU against n explicit minors, and the regulariser's cost per step.

1. ``principal_cofactors(A, "lu")`` against ``"minors"`` (batch 16, float64, forward; forward +
   backward with respect to A reported too) on softmax attention of Gaussian logits. Targets:
   40x at n = 64 and 100x at n = 128, most of the ratio of the arithmetic (about n).
2. ``--step``: whole training steps of the harness at chapter 6's shapes (the ``book`` preset)
   and at its ``long`` preset's, for each task: the baseline, the regularised arm (the fast path:
   the chosen heads' probabilities from the forward's queries and keys, the LU differentiated by
   hand, no LU for causal heads) and the reference
   path (every head's probabilities from the explicit path, torch's autograd through the LU: the
   implementation before the fast path), interleaved in one process
   (:func:`attention_atlas.experiments.cofactor.timing.step_overhead`). Target: the regulariser
   at most 5% of a step (its share of the FLOPs is below 1.2% at every shape).

3. ``--decompose``: where the regulariser's share of a step goes, at the same shapes. Every arm
   steps ONE run (one model, optimiser and sampler; only the regulariser differs from call to
   call), so the differences between separately built runs (about 2% of a step on this machine,
   either way) do not enter: ``zero`` (a constant regulariser: the harness's own cost), ``qk``
   (the chosen heads' queries and keys from the forward, a zero-weighted sum, so the backward
   runs through their slices and accumulates into the layers' gradients), ``probs`` (their
   probabilities, :func:`~attention_atlas.cofactor.heads.head_probs`) and ``cofactor`` (the
   whole term), each against ``off`` (no regulariser).

Ratios are medians of per-round ratios from :func:`attention_atlas.bench.timing.compare`, with the
CPU-time ratios (``time.thread_time``, unaffected by time-sharing) beside them.

Run (one to two minutes per part on 2 shared CPU cores, one thread)::

    python benchmarks/bench_cofactor.py --out artifacts/bench/cofactor.json
    python benchmarks/bench_cofactor.py --step --presets book long --out artifacts/bench/cofactor_step.json
    python benchmarks/bench_cofactor.py --decompose --presets book --reps 25 --out artifacts/bench/cofactor_parts.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from attention_atlas.bench.timing import compare
from attention_atlas.experiments.cofactor import run as experiment
from attention_atlas.experiments.cofactor.numerics import lu_vs_minors
from attention_atlas.experiments.cofactor.timing import step_overhead

TARGETS = {64: 40.0, 128: 100.0}
#: the regulariser's share of a training step the fast path aims at
STEP_TARGET = 0.05


def bench_minors(sizes: list[int], batch: int, reps: int) -> dict[str, Any]:
    methods = lu_vs_minors(sizes, batch, reps)
    summary = {}
    for n, res in methods.items():
        r = res["results"]["minors"]
        fwd, fb = r["forward"]["ratio_median"], r["forward_backward"]["ratio_median"]
        cpu = res["meta"]["cpu_time_speedup_forward"]
        target = TARGETS.get(n)
        summary[f"n={n}"] = {"speedup_forward": fwd, "speedup_forward_backward": fb,
                             "target": target, "speedup_forward_cpu_time": cpu,
                             "met_wall": None if target is None else fwd >= target,
                             "met_cpu": None if target is None else cpu >= target}  # fmt: skip
        print(f"n={n:4d} batch={batch}: lu vs minors forward {fwd:7.1f}x wall "
              f"(q25-q75 {r['forward']['ratio_q25']:.1f}-{r['forward']['ratio_q75']:.1f}), "
              f"{cpu:7.1f}x CPU time; forward+backward {fb:6.1f}x wall"
              + ("" if target is None else f"; target {target:g}x"))  # fmt: skip
    return {"summary": summary, "methods": {str(k): v for k, v in methods.items()}}


def bench_step(presets: list[str], reps: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for preset in presets:
        grid = experiment.chapter_grid(**experiment.PRESETS[preset])
        flops = experiment.flops_table(grid).set_index("task")["extra fraction"]
        for task in ("digits", "lm"):
            res = step_overhead(grid, task, reps=reps)
            r, cpu = res["results"], res["meta"]["cpu_time_ratio"]
            share = {k: r[k]["forward"]["ratio_median"] - 1 for k in ("cofactor", "reference")}
            out[f"{preset}/{task}"] = {
                "share_wall": share, "share_cpu": {k: v - 1 for k, v in cpu.items()},
                "flop_share": float(flops[task]), "target": STEP_TARGET,
                "met_wall": share["cofactor"] <= STEP_TARGET,
                "met_cpu": cpu["cofactor"] - 1 <= STEP_TARGET, "compare": res,
            }  # fmt: skip
            m = res["meta"]
            print(f"{preset:5s} {task:6s} (batch {m['batch']}, n {m['n']}, width {m['dim']}): "
                  f"baseline step {1e3 * r['baseline']['forward']['median_s']:.1f} ms; regulariser "
                  f"+{100 * share['cofactor']:.1f}% wall, +{100 * (cpu['cofactor'] - 1):.1f}% CPU; "
                  f"reference path +{100 * share['reference']:.1f}% wall, "
                  f"+{100 * (cpu['reference'] - 1):.1f}% CPU; FLOP share "
                  f"{100 * float(flops[task]):.2f}%; target {100 * STEP_TARGET:.0f}%", flush=True)  # fmt: skip
    return out


def _shared_steps(params: dict[str, Any], arms: dict[str, str | None]) -> dict[str, Any]:
    """One call = one optimiser step of ONE harness run of ``params`` (a configuration of
    :func:`~attention_atlas.experiments.cofactor.run.chapter_grid`), with regulariser ``arms[name]``
    (a registered name, None for none) and the chapter's options."""
    from dataclasses import replace

    from attention_atlas.models import ModelConfig
    from attention_atlas.train import TrainConfig, build_run, optimiser_step
    from attention_atlas.train.checkpoint import TrainClock

    reg = params["regularizer"]
    tcfg = TrainConfig(**params["train"], seed=0, progress=False, measure_flops=False,
                       effective_rank=False, regularizers=[reg])  # fmt: skip
    data = experiment.load_task(params["task"], params["lm_level"])
    run = build_run(ModelConfig(**params["model"]), tcfg, data, "cpu")
    clock = TrainClock(run.progress.timing)

    def step_of(name: str | None) -> Any:
        cfg = replace(tcfg, regularizers=[{**reg, "name": name}] if name else [])

        def step() -> torch.Tensor:
            run.cfg = cfg
            with torch.enable_grad():
                optimiser_step(run, run.model, False, clock)
            return torch.zeros(())

        return step

    return {arm: step_of(name) for arm, name in arms.items()}


def _register_parts() -> dict[str, str | None]:
    """The arms of part 3, their regularisers registered under ``bench_cofactor_*``."""
    from attention_atlas.cofactor.heads import forward_qk, head_probs
    from attention_atlas.models.hooks import available_regularizers, register_regularizer

    def zero(model: Any, output: Any, batch: Any, **kw: Any) -> torch.Tensor:
        return torch.zeros((), dtype=torch.float64)

    def qk(model: Any, output: Any, batch: Any, **kw: Any) -> torch.Tensor:
        layers, heads = list(range(len(model.blocks))), list(range(kw.get("heads", 1)))
        got = forward_qk(output, layers, heads, None)
        assert got is not None, "part 3 needs a forward that returned its queries and keys"
        return (got[0].sum() + got[1].sum()) * 0.0

    def probs(model: Any, output: Any, batch: Any, **kw: Any) -> torch.Tensor:
        return head_probs(model, output, heads=kw.get("heads", 1)).sum() * 0.0

    for name, fn in (("zero", zero), ("qk", qk), ("probs", probs)):
        if f"bench_cofactor_{name}" not in available_regularizers():
            register_regularizer(f"bench_cofactor_{name}", needs_weights=False)(fn)
    return {"off": None, "zero": "bench_cofactor_zero", "qk": "bench_cofactor_qk",
            "probs": "bench_cofactor_probs", "cofactor": "cofactor"}  # fmt: skip


def bench_parts(presets: list[str], reps: int) -> dict[str, Any]:
    arms = _register_parts()
    out: dict[str, Any] = {}
    for preset in presets:
        grid = experiment.chapter_grid(**experiment.PRESETS[preset])
        for task in ("digits", "lm"):
            with torch.random.fork_rng(devices=[]):
                fns = _shared_steps(grid[f"{task}_cofactor"], arms)
            res = compare(fns, "off", (), backward=False, warmup=2, reps=reps, min_sample_s=0.1,
                          memory=False, clock="cpu")  # fmt: skip
            r = res["results"]
            share = {a: [r[a]["forward"][f"ratio_{q}"] - 1 for q in ("median", "q25", "q75")]
                     for a in arms if a != "off"}  # fmt: skip
            out[f"{preset}/{task}"] = {"share_cpu": share, "compare": res}
            print(f"{preset:5s} {task:6s}: step without the regulariser "
                  f"{1e3 * r['off']['forward']['median_s']:.1f} ms; share of it (CPU time, median "
                  "[q25, q75]): " + "  ".join(f"{a} {100 * v[0]:+.1f}% [{100 * v[1]:+.1f}, "
                                              f"{100 * v[2]:+.1f}]" for a, v in share.items()),
                  flush=True)  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="*", default=[64, 128])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--step", action="store_true", help="time training steps (part 2) instead")
    ap.add_argument("--decompose", action="store_true", help="the step's parts (part 3) instead")
    ap.add_argument("--presets", nargs="*", default=["book", "long"])
    ap.add_argument("--out", type=Path, default=Path("artifacts/bench/cofactor.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    payload: dict[str, Any] = {"threads": args.threads}
    if args.step:
        payload["step"] = bench_step(args.presets, args.reps)
    elif args.decompose:
        payload["parts"] = bench_parts(args.presets, args.reps)
    else:
        payload.update(bench_minors(args.sizes, args.batch, args.reps))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=2, default=str))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
