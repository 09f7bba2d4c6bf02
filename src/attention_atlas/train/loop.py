"""The training loop: :func:`train` (set-up, optimiser steps, logging, checkpoints, the run
record)."""

from __future__ import annotations

import json
import math
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist
from torch import Tensor, nn

from .. import native
from ..atomic import atomic_path, atomic_write_text
from ..attention.registry import get_regularizer
from ..cofactor.native_heads import inplace_grads
from ..data import ArrayTask, TextCorpus, make_sampler
from ..models import ModelConfig, Transformer, param_counts
from ..profiling import phase
from ..threads import intra_op_threads
from ..validate import ConfigError
from .checkpoint import (
    Progress,
    TrainClock,
    load_checkpoint,
    new_interval,
    save_checkpoint,
    seed_everything,
)
from .compiled import CompiledSteps, compiling
from .config import TrainConfig, check_model, check_run
from .ddp import init_process_group, rank_world
from .evaluate import cross_entropy, diagnostics, eval_batches, evaluate
from .flops import measure_flops
from .optim import lr_at, lr_at_time, param_groups
from .provenance import git_commit, versions
from .resumable import Slot, claim_slot

__all__ = ["TrainResult", "train"]

Callback = Callable[[int, dict[str, Any]], None]


@dataclass
class TrainResult:
    """What :func:`train` returns."""

    history: pd.DataFrame  # one row per log step
    final: dict[str, float]  # final metrics (full validation, test if asked)
    model: Transformer  # the trained model (bare, not DDP-wrapped)
    record: dict[str, Any]  # the run record (also run.json in out_dir)
    out_dir: Path | None = None

    @property
    def diverged(self) -> dict[str, Any] | None:
        """``{"step", "quantity", "value", "message"}`` if the run stopped on a non-finite loss
        or gradient norm, else None."""
        return self.record.get("diverged")


def train(
    model_cfg: ModelConfig,
    train_cfg: TrainConfig,
    data: TextCorpus | ArrayTask,
    *,
    resume: bool = False,
    callbacks: list[Callback] | None = None,
) -> TrainResult:
    """Train a :class:`Transformer` on ``data`` and return its history, final metrics and model.

    Args:
        model_cfg: the model; its data-dependent fields (``task``, ``vocab_size`` /
            ``n_classes`` / ``patch_dim``, ``max_len``) are filled in from ``data``.
        train_cfg: the run.
        data: a :class:`~attention_atlas.data.TextCorpus` or :class:`~attention_atlas.data.ArrayTask`.
        resume: continue from ``out_dir/checkpoint.pt`` if it exists (a fresh run if not).
            Inside :func:`~attention_atlas.train.resumable.resumable_training`, a run with no
            ``out_dir`` and no callbacks checkpoints to the block's folder and resumes from it.
        callbacks: ``fn(step, info)`` called after each optimiser step (``step`` counts from 1;
            ``info`` has ``loss`` and ``grad_norm``), before that step's logging and checkpoint.

    A non-finite loss or gradient norm stops the run before that step's update: the weights
    (and the last checkpoint) stay those of the step before, a :class:`RuntimeWarning` names
    the step, the final metrics are NaN and the record says ``"status": "diverged"`` (see
    :attr:`TrainResult.diverged`).

    Under ``torchrun`` (``WORLD_SIZE > 1``) the process group is set up here (gloo on CPU,
    nccl on CUDA) and torn down at the end.

    Raises:
        ConfigError: a setting out of range, an unknown name, or a resume from a checkpoint
            written under other settings (the message lists the differences); nothing has run.
    """
    cfg = train_cfg
    if resume and not cfg.out_dir:
        raise ConfigError("resume=True needs out_dir")
    check_model(model_cfg)
    check_run(cfg)
    device, own_group = init_process_group(cfg.device)  # 1. processes and devices
    det_before = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    if cfg.deterministic:
        _set_deterministic(True, warn_only=True)
    try:
        with intra_op_threads(cfg.num_threads):
            run = _build(model_cfg, cfg, data, device, callbacks or [])
            if (resume or run.slot) and run.ckpt_path is not None and run.ckpt_path.exists():
                run.progress = load_checkpoint(
                    run.ckpt_path, device, run.model, run.opt, run.sched, run.sampler, run.configs()
                )
                if run.slot is not None:  # a resumable_training block's run, resumed
                    t = run.progress.timing  # the training time before, to the checkpoint
                    run.slot.resumed_at(run.progress.step, t["t_train"] + t["interval_elapsed"])
            use_native = (
                native.level() or cfg.native
            )  # an enclosing block's level (a record's) wins
            if use_native and native.library() is None:
                warnings.warn(
                    f"{native.status()}; the PyTorch paths run", RuntimeWarning, stacklevel=2
                )
            with native.enabled(use_native):
                return _train(run)
    finally:
        _set_deterministic(*det_before)
        if own_group:
            dist.destroy_process_group()


def _set_deterministic(mode: bool, warn_only: bool) -> None:
    """``torch.use_deterministic_algorithms`` without its import of torch._inductor (seconds),
    unless inductor is already loaded (then its config flag is set too)."""
    if "torch._inductor" in sys.modules:
        torch.use_deterministic_algorithms(mode, warn_only=warn_only)
    else:
        torch._C._set_deterministic_algorithms(mode, warn_only=warn_only)


# -- set-up ------------------------------------------------------------------------------------


@dataclass
class _Run:
    """One run's objects and its progress."""

    cfg: TrainConfig
    mcfg: ModelConfig  # the model config with the data-dependent fields filled in
    data: TextCorpus | ArrayTask
    device: torch.device
    model: Transformer  # bare (not DDP-wrapped)
    opt: torch.optim.Optimizer
    sched: Any
    sampler: Any
    frac: list[float]  # fraction of max_time_s used so far (schedule="time")
    callbacks: list[Callback]
    out_dir: Path | None
    ckpt_path: Path | None
    progress: Progress = field(default_factory=Progress)
    t_start: float = field(default_factory=time.time)
    diverged: dict[str, Any] | None = None  # set when a non-finite loss stops the run
    slot: Slot | None = None  # where a resumable_training block checkpoints this run

    def configs(self) -> dict[str, dict[str, Any]]:
        """The configs a checkpoint and the run record store."""
        return {"train_config": self.cfg.to_dict(), "model_config": self.mcfg.to_dict()}


def _model_cfg_for(
    model_cfg: ModelConfig, data: TextCorpus | ArrayTask, seq_len: int
) -> ModelConfig:
    """Fill the data-dependent fields (vocabulary, classes, patch size, length)."""
    if isinstance(data, TextCorpus) or data.kind == "lm":
        length = seq_len if isinstance(data, TextCorpus) else data.seq_len
        return replace(
            model_cfg, task="lm", vocab_size=int(data.vocab_size),
            max_len=max(model_cfg.max_len, length),
        )  # fmt: skip
    return replace(
        model_cfg, task="classify", n_classes=int(data.n_classes), patch_dim=int(data.patch_dim),
        max_len=max(model_cfg.max_len, int(data.train_x.shape[1])),
    )  # fmt: skip


def adamw_implementation(device: torch.device) -> dict[str, bool]:
    """AdamW's implementation on ``device``: on a GPU one fused kernel for every parameter (the
    per-parameter loop, a few launches per tensor, took 28% of the Fiber Bundle Transformer's
    book-shape step on an H200); on a CPU the multi-tensor ("foreach") form, whose CPU ops loop
    over the tensors in C++ calling the same per-tensor kernels as the single-tensor loop every
    stored CPU result was made with: the same bits (tested over training steps of a Fiber
    Bundle model, so ``results verify`` still reproduces them), with one Python call per op
    instead of one per parameter (47 tensors in the Fiber Bundle model at chapter 4's shape)."""
    return {"fused": True} if device.type == "cuda" else {"foreach": True}


def _build(
    model_cfg: ModelConfig,
    cfg: TrainConfig,
    data: TextCorpus | ArrayTask,
    device: torch.device,
    callbacks: list[Callback],
) -> _Run:
    """2. model (same initial weights on every rank), optimiser, schedule, sampler."""
    t_start = time.time()
    rank, world = rank_world()
    mcfg = _model_cfg_for(model_cfg, data, cfg.seq_len)
    seed_everything(cfg.seed)
    model = mcfg.build().to(device)  # a Transformer, or the subclass a config subclass names
    opt = torch.optim.AdamW(
        param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
        **adamw_implementation(device),
    )  # fmt: skip
    frac = [0.0]
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: lr_at_time(s, frac[0], cfg) if cfg.schedule == "time" else lr_at(s, cfg)
    )
    sampler = make_sampler(data, cfg.batch_size, cfg.seq_len, cfg.seed, rank, world)
    seed_everything(cfg.seed + 7919 * rank)  # training-time randomness (dropout), per rank
    out_dir = Path(cfg.out_dir) if cfg.out_dir else None
    slot = claim_slot(writes_itself=out_dir is not None, has_callbacks=bool(callbacks))
    ckpt = out_dir / "checkpoint.pt" if out_dir else (slot.path if slot else None)
    return _Run(
        cfg, mcfg, data, device, model, opt, sched, sampler, frac, callbacks,
        out_dir=out_dir, ckpt_path=ckpt, t_start=t_start, slot=slot,
    )  # fmt: skip


# -- the loop ----------------------------------------------------------------------------------


def _train(run: _Run) -> TrainResult:
    """3. to 6.: optimiser steps, log rows, checkpoints, then the final evaluation and record."""
    cfg, p = run.cfg, run.progress
    rank, world = rank_world()
    ddp: nn.Module = run.model
    if world > 1:
        ddp = nn.parallel.DistributedDataParallel(
            run.model, device_ids=[run.device.index] if run.device.type == "cuda" else None
        )
    step_model = CompiledSteps(ddp) if cfg.compile or compiling() is not None else ddp
    needs_w = any(get_regularizer(s["name"])[1] for s in cfg.regularizers)
    diag_batch = next(eval_batches(run.data, "val", cfg.weights_batch, cfg.seq_len, 1))
    diag_batch = (diag_batch[0].to(run.device), diag_batch[1].to(run.device))
    if cfg.measure_flops and not p.flops:
        x0, y0 = _peek(run.sampler)
        p.flops = measure_flops(run.model, x0.to(run.device), y0.to(run.device))

    from tqdm.auto import tqdm

    name = run.mcfg.attention if run.mcfg.layers is None else "layers"
    bar = tqdm(
        total=cfg.steps, initial=p.step, disable=not cfg.progress or rank != 0,
        desc=f"{name} {getattr(run.data, 'name', '')}", dynamic_ncols=True,
    )  # fmt: skip
    run.model.train()
    clock = TrainClock(p.timing)
    stop = False
    every = run.slot.every if run.slot is not None else cfg.checkpoint_every
    while p.step < cfg.steps and not stop:
        try:
            stop = _optimiser_step(run, step_model, needs_w, clock)
        except _NonFinite as err:
            run.diverged = _diverged(run, err)
            break
        bar.update(1)
        if p.step % cfg.log_every == 0 or p.step == cfg.steps or stop:  # 4. log and evaluate
            dt = clock.close_interval()
            row = _log(run, diag_batch, dt, clock.t_train)
            bar.set_postfix(
                loss=f"{row['train_loss']:.3f}", val=f"{row['val_loss']:.3f}", refresh=False
            )
            clock.open_interval()
        if run.ckpt_path is not None and every and p.step % every == 0:
            t_ck, c_ck = time.perf_counter(), time.process_time()  # 5. checkpoint
            p.timing = clock.state()
            save_checkpoint(
                run.ckpt_path, run.model, run.opt, run.sched, run.sampler, p, run.configs()
            )
            clock.t_interval += time.perf_counter() - t_ck
            clock.cpu_start += time.process_time() - c_ck
    bar.close()
    return _finish(run, clock.t_train, clock.cpu_s())


def _optimiser_step(
    run: _Run, ddp: nn.Module | CompiledSteps, needs_w: bool, clock: TrainClock
) -> bool:
    """3. one optimiser step on this rank's share of the global batch; whether the time budget
    is spent."""
    cfg, p, acc = run.cfg, run.progress, run.progress.interval
    rank, world = rank_world()
    x, y = run.sampler.next()
    x, y = x.to(run.device), y.to(run.device)
    out = ddp(x, need_weights=needs_w)
    with phase("loss"):
        loss = cross_entropy(out.logits, y)
    total = loss
    for spec in cfg.regularizers:
        fn = get_regularizer(spec["name"])[0]
        opts = {k: v for k, v in spec.items() if k not in ("name", "weight")}
        eager = not isinstance(ddp, CompiledSteps)  # then the logits' loss gives each head's
        # queries and keys a gradient the cofactor regulariser adds its own into (inplace_grads)
        with phase(f"regularizer/{spec['name']}"), inplace_grads(eager):
            r = fn(run.model, out, (x, y), **opts)
        total = total + float(spec.get("weight", 1.0)) * r
        acc["reg"][spec["name"]] = acc["reg"].get(spec["name"], 0.0) + float(r.detach())
    _check_finite("loss", total, p.step + 1, run.device)
    run.opt.zero_grad(set_to_none=True)
    total.backward()
    gnorm = torch.nn.utils.clip_grad_norm_(
        run.model.parameters(), cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
    )
    _check_finite("gradient norm", gnorm, p.step + 1, run.device)
    run.opt.step()
    stop = False
    if cfg.max_time_s is not None:  # one clock for every rank (rank 0's)
        ft = torch.tensor(
            [clock.elapsed() / cfg.max_time_s], dtype=torch.float64, device=run.device
        )
        if world > 1:
            dist.broadcast(ft, 0)
        run.frac[0] = float(ft)
        stop = run.frac[0] >= 1.0
    run.sched.step()
    p.step += 1
    loss_f = _global_mean(float(loss.detach()), run.device)
    acc["loss"] += loss_f
    acc["gnorms"].append(float(gnorm))
    acc["tokens"] += int(y.numel()) * world
    acc["n"] += 1
    for cb in run.callbacks:
        cb(p.step, {"loss": loss_f, "grad_norm": float(gnorm)})
    return stop


class _NonFinite(Exception):
    """A non-finite loss or gradient norm at an optimiser step (before its update)."""

    def __init__(self, quantity: str, step: int, value: float) -> None:
        super().__init__(quantity, step, value)
        self.quantity, self.step, self.value = quantity, step, value


def _check_finite(quantity: str, value: Tensor, step: int, device: torch.device) -> None:
    """Raise :class:`_NonFinite` if ``value`` is NaN or infinite on any rank."""
    _, world = rank_world()
    bad = torch.tensor([0.0 if bool(torch.isfinite(value.detach())) else 1.0], device=device)
    if world > 1:  # every rank stops at the same step
        dist.all_reduce(bad, op=dist.ReduceOp.MAX)
    if float(bad) > 0:
        raise _NonFinite(quantity, step, float(value.detach()))


def _diverged(run: _Run, err: _NonFinite) -> dict[str, Any]:
    """The divergence record, and a warning naming the step and what is kept."""
    kept = f"the weights of step {run.progress.step} are kept"
    if run.ckpt_path is not None and run.ckpt_path.exists():
        kept += f", and the last checkpoint {run.ckpt_path}"
    message = (
        f"training diverged at step {err.step}: the {err.quantity} is {err.value} "
        f"(lr {run.opt.param_groups[0]['lr']:.3g}); the run stopped before that update and {kept}"
    )
    if rank_world()[0] == 0:
        warnings.warn(message, RuntimeWarning, stacklevel=4)
    return {"step": err.step, "quantity": err.quantity, "value": err.value, "message": message}


def _global_mean(value: float, device: torch.device) -> float:
    """The mean of ``value`` over ranks (the global-batch mean loss, for the log)."""
    _, world = rank_world()
    if world == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return float(t) / world


def _log(
    run: _Run, diag_batch: tuple[Tensor, Tensor], dt: float, t_train: float
) -> dict[str, float]:
    """4. a log row: the interval's training metrics (``dt`` seconds long), validation,
    diagnostics, the training time so far; appended to the history, and a new interval begun."""
    cfg, p = run.cfg, run.progress
    row = _log_row(p.step, p.interval, dt, run.opt, run.data)
    val = evaluate(
        run.model, run.data, split="val", batch_size=cfg.eval_batch_size, seq_len=cfg.seq_len,
        max_batches=cfg.eval_batches, device=run.device,
    )  # fmt: skip
    row.update({f"val_{k}": v for k, v in val.items() if k != "n"})
    row.update(diagnostics(run.model, diag_batch, cfg))
    row["time_s"] = t_train
    p.history.append(row)
    p.interval = new_interval()
    return row


def _log_row(
    step: int, acc: dict[str, Any], dt: float, opt: torch.optim.Optimizer, data: Any
) -> dict[str, float]:
    n = max(1, acc["n"])
    g = np.asarray(acc["gnorms"], dtype=np.float64)
    row: dict[str, float] = {
        "step": float(step),
        "train_loss": acc["loss"] / n,
        "grad_norm_mean": float(g.mean()) if g.size else math.nan,
        "grad_norm_var": float(g.var()) if g.size else math.nan,
        "lr": float(opt.param_groups[0]["lr"]),
        "tokens_per_s": acc["tokens"] / max(dt, 1e-9),
        "interval_s": dt,
    }
    if isinstance(data, TextCorpus) and data.level == "char":
        row["train_bpc"] = row["train_loss"] / math.log(2)
    for k, v in acc["reg"].items():
        row[f"reg/{k}"] = v / n
    return row


def _peek(sampler: Any) -> tuple[Tensor, Tensor]:
    """The sampler's next batch, without moving it."""
    state = sampler.state_dict()
    batch = sampler.next()
    sampler.load_state_dict(state)
    return batch


# -- the end -----------------------------------------------------------------------------------


def _finish(run: _Run, t_train: float, cpu_s: float) -> TrainResult:
    """6. final evaluation, history and run record (written to ``out_dir`` by rank 0)."""
    cfg, p = run.cfg, run.progress
    rank, world = rank_world()
    final = _final_metrics(run)
    final["steps"] = float(p.step)
    final["train_time_s"], final["train_cpu_s"] = t_train, cpu_s
    if p.history:
        tok = sum(h["tokens_per_s"] * h["interval_s"] for h in p.history)
        final["tokens_per_s"] = tok / max(1e-9, sum(h["interval_s"] for h in p.history))
    hist = pd.DataFrame(p.history)
    record = {
        "status": "diverged" if run.diverged else "finished",
        "model_config": run.mcfg.to_dict(),
        "train_config": {
            **cfg.to_dict(),
            "compile": cfg.compile or compiling() is not None,
            "native": cfg.native or native.is_enabled(),
            "native_level": native.level(),  # 0: off (attention_atlas.native.LEVEL)
        },
        "data": {
            "name": getattr(run.data, "name", type(run.data).__name__),
            "kind": "lm" if isinstance(run.data, TextCorpus) else run.data.kind,
        },
        "seed": cfg.seed,
        "git": git_commit(),
        "versions": versions(),
        "device": str(run.device),
        "world_size": world,
        "param_counts": param_counts(run.model),
        "flops": p.flops,
        "final": final,
        "wall_time_s": time.time() - run.t_start,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if run.diverged:
        record["diverged"] = run.diverged
    if run.out_dir is not None and rank == 0:
        with atomic_path(run.out_dir / "history.csv") as tmp:
            hist.to_csv(tmp, index=False)
        atomic_write_text(json.dumps(record, indent=2, default=str), run.out_dir / "run.json")
    return TrainResult(hist, final, run.model, record, run.out_dir)


def _final_metrics(run: _Run) -> dict[str, float]:
    """Validation (and test, if asked) metrics of the trained model; NaN for a diverged run,
    whose weights would have been non-finite after the update it stopped before."""
    cfg = run.cfg
    val = evaluate(
        run.model, run.data, split="val", batch_size=cfg.eval_batch_size, seq_len=cfg.seq_len,
        max_batches=cfg.final_eval_batches, device=run.device,
    )  # fmt: skip
    final = {f"val_{k}": v for k, v in val.items() if k != "n"}
    has_test = isinstance(run.data, TextCorpus) or run.data.test_x is not None
    if cfg.eval_test and has_test:
        test = evaluate(
            run.model, run.data, split="test", batch_size=cfg.eval_batch_size,
            seq_len=cfg.seq_len, device=run.device,
        )  # fmt: skip
        final.update({f"test_{k}": v for k, v in test.items() if k != "n"})
    if run.diverged:
        final = dict.fromkeys(final, math.nan)
    return final
