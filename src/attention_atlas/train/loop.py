"""The training loop: :func:`train` (set-up, optimiser steps, logging, checkpoints, the run
record)."""

from __future__ import annotations

import contextlib
import json
import math
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist
from torch import Tensor, nn

from attention_atlas import native
from attention_atlas.atomic import FolderInUse, atomic_path, atomic_write_text, folder_lock
from attention_atlas.data import ArrayTask, TextCorpus
from attention_atlas.models import ModelConfig, Transformer, param_counts
from attention_atlas.models.hooks import get_regularizer
from attention_atlas.provenance import git_state, versions
from attention_atlas.threads import intra_op_threads
from attention_atlas.validate import ConfigError

from .checkpoint import TrainClock, load_checkpoint, new_interval, save_checkpoint
from .compiled import CompiledSteps, compiling
from .config import TrainConfig, check_model, check_run
from .ddp import init_process_group, rank_world
from .evaluate import diagnostics, eval_batches, evaluate
from .flops import measure_flops
from .step import NonFinite, Run, build_run, optimiser_step, peek_batch

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
    writer = (  # one writer per out_dir (rank 0 writes it): a second run into it is refused
        folder_lock(cfg.out_dir, "train")
        if cfg.out_dir and rank_world()[0] == 0
        else contextlib.nullcontext()
    )
    try:
        with _out_dir_held(writer), intra_op_threads(cfg.num_threads):
            run = build_run(model_cfg, cfg, data, device, callbacks or [])
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


@contextlib.contextmanager
def _out_dir_held(writer: Any) -> Any:
    """Enter ``writer`` (a :func:`~attention_atlas.atomic.folder_lock`), a folder held by another
    run becoming a :class:`ConfigError` (one line, exit 2 on the command line)."""
    try:
        held = writer.__enter__()
    except FolderInUse as err:
        raise ConfigError(f"out_dir: {err}") from None
    try:
        yield held
    except BaseException:
        if not writer.__exit__(*sys.exc_info()):
            raise
    else:
        writer.__exit__(None, None, None)


def _set_deterministic(mode: bool, warn_only: bool) -> None:
    """``torch.use_deterministic_algorithms`` without its import of torch._inductor (seconds),
    unless inductor is already loaded (then its config flag is set too)."""
    if "torch._inductor" in sys.modules:
        torch.use_deterministic_algorithms(mode, warn_only=warn_only)
    else:
        torch._C._set_deterministic_algorithms(mode, warn_only=warn_only)


# -- set-up ------------------------------------------------------------------------------------


# -- the loop ----------------------------------------------------------------------------------


def _train(run: Run) -> TrainResult:
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
        x0, y0 = peek_batch(run.sampler)
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
            stop = optimiser_step(run, step_model, needs_w, clock)
        except NonFinite as err:
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


def _diverged(run: Run, err: NonFinite) -> dict[str, Any]:
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


def _log(
    run: Run, diag_batch: tuple[Tensor, Tensor], dt: float, t_train: float
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


# -- the end -----------------------------------------------------------------------------------


def _finish(run: Run, t_train: float, cpu_s: float) -> TrainResult:
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
        "git": {"commit": (g := git_state())["git_commit"], "dirty": g["git_dirty"]},
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


def _final_metrics(run: Run) -> dict[str, float]:
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
