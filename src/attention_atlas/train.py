"""Training: one loop for every chapter's experiments.

``train(model_cfg, train_cfg, data) -> TrainResult`` trains a :class:`~attention_atlas.models.Transformer`
with AdamW (no weight decay on norms, biases and embeddings), linear warm-up then cosine decay,
gradient clipping and deterministic seeding, and logs every ``log_every`` steps:

* ``train_loss`` (mean over the interval) and ``val_loss``; ``*_bpc`` (loss / ln 2) for character
  corpora, ``*_ppl`` for word corpora, ``val_acc`` for classification and synthetic tasks;
* ``grad_norm_mean`` / ``grad_norm_var``: the global gradient norm (before clipping) over the interval;
* ``nonfinite_logits``: non-finite attention logits over all layers, from one ``need_weights``
  forward on a few validation sequences (the explicit path of every variant);
* ``erank_<l>``: entropy effective rank of the hidden states after block ``l`` (``erank_0`` is the
  embedding), averaged over those sequences (:func:`attention_atlas.linalg.effective_rank`);
* ``tokens_per_s`` (training tokens, all ranks, per second of training time), ``lr``;
* ``reg/<name>`` for each regulariser and ``<name>/<key>`` for each diagnostic.

Attention FLOPs are measured once per run with :class:`torch.utils.flop_counter.FlopCounterMode`
and stored in the run record (see :func:`measure_flops`).

Extension points (for the chapters)::

    @register_regularizer("cofactor", needs_weights=True)
    def cofactor_reg(model, output, batch, *, margin=0.1) -> Tensor: ...   # scalar, added to loss
    TrainConfig(regularizers=[{"name": "cofactor", "weight": 0.01, "margin": 0.1}])

    @register_diagnostic("spectral_gap")
    def gap(model, output, batch, **options) -> dict[str, float]: ...      # logged at log steps
    TrainConfig(diagnostics=[{"name": "spectral_gap"}])

Checkpoints (``checkpoint_every`` steps, atomic) hold the model, optimiser, scheduler, the RNG
states of torch/numpy/python (every rank's), the sampler position and the history so far;
``train(..., resume=True)`` continues from the last one and ends bitwise where an uninterrupted
run ends (on CPU). Under ``torchrun`` the run is data parallel (gloo on CPU, nccl on CUDA): the
global batch ``batch_size`` is split across ranks, so results match a single process.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from .attention.base import Attention
from .attention.registry import (
    available_diagnostics,
    available_regularizers,
    get_diagnostic,
    get_regularizer,
    register_diagnostic,
    register_regularizer,
)
from .data import IGNORE_INDEX, ArrayTask, TextCorpus, eval_windows, load_task, make_sampler
from .linalg import effective_rank
from .models import ModelConfig, ModelOutput, Transformer, attention_modules, param_counts

__all__ = [
    "TrainConfig",
    "TrainResult",
    "available_diagnostics",
    "available_regularizers",
    "evaluate",
    "measure_flops",
    "register_diagnostic",
    "register_regularizer",
    "seed_everything",
    "train",
]

# -- extension points: the registry (attention_atlas.attention.registry) ------------------------

# -- configuration ---------------------------------------------------------------------------


@dataclass
class TrainConfig:
    """Everything about a training run except the model and the data."""

    steps: int = 1000  # optimiser steps
    batch_size: int = 32  # global batch (sequences), split across DDP ranks
    seq_len: int = 128  # context length for token streams (arrays keep their own length)
    lr: float = 3e-3  # peak learning rate
    min_lr_ratio: float = 0.1  # final lr = min_lr_ratio * lr (cosine decay)
    warmup_steps: int = 100  # linear warm-up steps
    weight_decay: float = 0.1  # AdamW decay on matrices (not on norms, biases, embeddings)
    beta1: float = 0.9  # AdamW beta1
    beta2: float = 0.95  # AdamW beta2
    grad_clip: float = 1.0  # clip the global gradient norm (0 = off)
    seed: int = 0  # seeds torch, numpy, python and the data sampler
    log_every: int = 100  # steps between log rows (and evaluations)
    eval_batches: int | None = 8  # validation batches per log step (None = whole split)
    final_eval_batches: int | None = None  # validation batches at the end (None = whole split)
    eval_batch_size: int = 32  # sequences per evaluation batch
    eval_test: bool = False  # also evaluate on the test split at the end (corpora only)
    weights_batch: int = 2  # sequences used for the need_weights diagnostics at log steps
    checkpoint_every: int = 0  # steps between checkpoints (0 = none); needs out_dir
    out_dir: str | None = None  # where history.csv, run.json and checkpoint.pt go
    max_time_s: float | None = None  # stop early after this much training wall time
    schedule: str = "steps"  # cosine over `steps`, or over max_time_s of training ("time")
    deterministic: bool = True  # torch.use_deterministic_algorithms (warn only) during the run
    device: str | None = None  # default: cuda if available, else cpu
    num_threads: int | None = None  # torch CPU threads during the run (None = leave as is)
    progress: bool = True  # tqdm progress bar (rank 0)
    measure_flops: bool = True  # count FLOPs once (FlopCounterMode) and record them
    effective_rank: bool = True  # log the effective rank of each layer's hidden states
    regularizers: list[dict[str, Any]] = field(default_factory=list)  # [{"name", "weight", **opts}]
    diagnostics: list[dict[str, Any]] = field(default_factory=list)  # [{"name", **opts}]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class TrainResult:
    """What :func:`train` returns."""

    history: pd.DataFrame  # one row per log step
    final: dict[str, float]  # final metrics (full validation, test if asked)
    model: Transformer  # the trained model (bare, not DDP-wrapped)
    record: dict[str, Any]  # the run record (also run.json in out_dir)
    out_dir: Path | None = None


# -- helpers ---------------------------------------------------------------------------------


def _spec_name(kind: str, spec: dict[str, Any]) -> str:
    if not isinstance(spec, dict) or "name" not in spec:
        raise ValueError(f"a {kind} spec needs a 'name', got {spec!r}")
    return str(spec["name"])


def seed_everything(seed: int) -> None:
    """Seed python's ``random``, numpy's global RNG and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed % (2**32))  # noqa: NPY002 (seed the legacy global RNG on purpose)
    torch.manual_seed(seed)


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),  # noqa: NPY002
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])  # noqa: NPY002
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _atomic_save(obj: Any, path: Path) -> None:
    """Write ``obj`` with :func:`torch.save` to a temporary file, fsync, then rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with tmp.open("wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _atomic_write_text(text: str, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def _git_commit() -> dict[str, Any]:
    root = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root, capture_output=True, text=True, timeout=10,
        ).stdout.strip()  # fmt: skip
        return {"commit": commit or None, "dirty": bool(dirty)}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def _versions() -> dict[str, str]:
    from . import __version__

    return {
        "attention_atlas": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "pandas": pd.__version__,
        "platform": platform.platform(),
    }


def _set_deterministic(mode: bool, warn_only: bool) -> None:
    """``torch.use_deterministic_algorithms`` without its import of torch._inductor (seconds),
    unless inductor is already loaded (then its config flag is set too)."""
    if "torch._inductor" in sys.modules:
        torch.use_deterministic_algorithms(mode, warn_only=warn_only)
    else:
        torch._C._set_deterministic_algorithms(mode, warn_only=warn_only)


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate multiplier at optimiser step ``step`` (0-based): linear warm-up over
    ``warmup_steps`` then cosine decay to ``min_lr_ratio`` at ``steps``."""
    if cfg.warmup_steps > 0 and step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    span = max(1, cfg.steps - cfg.warmup_steps)
    t = min(1.0, (step - cfg.warmup_steps) / span)
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t))


def lr_at_time(step: int, frac: float, cfg: TrainConfig) -> float:
    """``schedule="time"``: linear warm-up over ``warmup_steps`` times a cosine over the fraction
    ``frac`` of the time budget ``max_time_s`` used so far (not reproducible: it follows the
    machine's speed)."""
    warm = min(1.0, (step + 1) / cfg.warmup_steps) if cfg.warmup_steps > 0 else 1.0
    t = min(1.0, max(0.0, frac))
    return warm * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups: decay on matrices; none on biases, norms, embeddings (token tables,
    learned positions, CLS token) and the metric parameters of attention variants."""
    no_decay: set[int] = set()
    for m in model.modules():
        if isinstance(m, nn.Embedding | nn.LayerNorm | nn.RMSNorm):
            no_decay.update(id(p) for p in m.parameters(recurse=False))
    for name, p in model.named_parameters():
        if p.dim() < 2 or name.split(".")[-1] in ("pos_emb", "cls") or name.endswith(".bias"):
            no_decay.add(id(p))
    for m in model.modules():  # a variant's geometry is shaped by its own regularisers, not decay
        if isinstance(m, Attention):
            no_decay.update(id(p) for p in m.metric_parameters())
    uniq = {id(p): p for p in model.parameters() if p.requires_grad}
    decay = [p for i, p in uniq.items() if i not in no_decay]
    rest = [p for i, p in uniq.items() if i in no_decay]
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": rest, "weight_decay": 0.0},
    ]


def _loss(logits: Tensor, y: Tensor, reduction: str = "mean") -> Tensor:
    if logits.dim() == 3:  # (B, L, V) against (B, L)
        return F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1),
            ignore_index=IGNORE_INDEX, reduction=reduction,
        )  # fmt: skip
    return F.cross_entropy(logits.float(), y, reduction=reduction)  # (B, C) against (B,)


# -- FLOPs -------------------------------------------------------------------------------------


def _register_cpu_sdpa_flops() -> None:
    """FlopCounterMode counts the CUDA SDPA kernels but not the CPU flash kernel: add it."""
    from torch.utils import flop_counter as fc

    ops = torch.ops.aten
    pairs = [
        ("_scaled_dot_product_flash_attention_for_cpu", fc.sdpa_flop),
        ("_scaled_dot_product_flash_attention_for_cpu_backward", fc.sdpa_backward_flop),
    ]
    for name, formula in pairs:
        op = getattr(ops, name, None)
        if op is not None and op not in fc.flop_registry:
            # the formula is already shape-wrapped, hence get_raw
            fc.register_flop_formula(op, get_raw=True)(formula)  # type: ignore[arg-type]


_register_cpu_sdpa_flops()


def measure_flops(model: Transformer, x: Tensor, y: Tensor) -> dict[str, int]:
    """FLOPs of one forward and one forward+backward on ``(x, y)``, and the attention share.

    * ``forward_total``, ``train_step_total``: the whole model (loss included);
    * ``forward_attention``: the attention modules (projections included), attributed through
      FlopCounterMode's module hierarchy; ``forward_attention_core``: the same without the
      q/k/v and output projections (the score, softmax and value mixing of each variant);
    * ``train_step_attention`` / ``train_step_attention_core``: forward+backward of each
      attention module (resp. its :meth:`attend` alone) run in isolation on inputs of the same
      shape, summed over layers (FlopCounterMode's module attribution is unreliable in backward).

    Parameters, gradients and the RNG states are left as they were.
    """
    from torch.utils.flop_counter import FlopCounterMode

    def total(counts: dict[str, dict[Any, int]], key: str) -> int:
        return int(sum(counts.get(key, {}).values()))

    prefix = type(model).__name__
    names = {id(m): n for n, m in model.named_modules()}
    attn = attention_modules(model)
    out: dict[str, int] = {}
    was_training = model.training
    with torch.random.fork_rng(devices=[]):
        model.eval()
        with FlopCounterMode(display=False) as fcm, torch.no_grad():
            model(x)
        counts = fcm.get_flop_counts()
        out["forward_total"] = total(counts, "Global")
        fa = fc = 0
        for m in attn:
            key = f"{prefix}.{names[id(m)]}"
            t = total(counts, key)
            fa += t
            fc += t - total(counts, f"{key}.qkv") - total(counts, f"{key}.proj")
        out["forward_attention"], out["forward_attention_core"] = fa, fc
        params = [p for p in model.parameters() if p.requires_grad]
        saved = [p.grad for p in params]  # backward() (autograd.grad breaks the module tracker)
        for p in params:
            p.grad = None
        with FlopCounterMode(display=False) as fcm:
            _loss(model(x).logits, y).backward()
        out["train_step_total"] = total(fcm.get_flop_counts(), "Global")
        # attention modules in isolation (inputs of the shape they see in the model)
        b, length = (
            x.shape[0],
            (x.shape[1] + (1 if model.cfg.pool == "cls" and model.cfg.task == "classify" else 0)),
        )
        ta = tc = 0
        for m in attn:
            h = torch.randn(b, length, m.dim, device=x.device, requires_grad=True)
            with FlopCounterMode(display=False) as fcm:
                m(h, causal=model.cfg.is_causal).out.sum().backward()
            ta += total(fcm.get_flop_counts(), "Global")
            with torch.no_grad():
                q, k, v = (t.detach().requires_grad_() for t in m.split_heads(h))
            with FlopCounterMode(display=False) as fcm:
                r = m.attend(
                    q, k, v, x=h, causal=model.cfg.is_causal, mask=None, need_weights=False
                )
                r.out.sum().backward()
            tc += total(fcm.get_flop_counts(), "Global")
        out["train_step_attention"], out["train_step_attention_core"] = ta, tc
        for p, g in zip(params, saved):
            p.grad = g
    model.train(was_training)
    return out


# -- evaluation --------------------------------------------------------------------------------


def _eval_batches(
    data: TextCorpus | ArrayTask, split: str, batch_size: int, seq_len: int, max_batches: int | None
) -> Iterator[tuple[Tensor, Tensor]]:
    if isinstance(data, TextCorpus):
        tokens = {"val": data.valid, "valid": data.valid, "test": data.test}[split]
        yield from eval_windows(tokens, batch_size, seq_len, max_batches)
        return
    if split == "test":
        raise ValueError(f"{data.name} has no test split")
    n = data.val_x.shape[0]
    for bi, i in enumerate(range(0, n, batch_size)):
        if max_batches is not None and bi >= max_batches:
            break
        yield data.val_x[i : i + batch_size], data.val_y[i : i + batch_size]


@torch.no_grad()
def evaluate(
    model: Transformer,
    data: TextCorpus | ArrayTask,
    *,
    split: str = "val",
    batch_size: int = 32,
    seq_len: int = 128,
    max_batches: int | None = None,
    device: torch.device | None = None,
) -> dict[str, float]:
    """Mean loss (per scored token or example), accuracy, and bpc/ppl for corpora.

    Under DDP the batches are shared out across ranks and the sums all-reduced.
    """
    device = device or next(model.parameters()).device
    was_training = model.training
    model.eval()
    rank, world = _rank_world()
    sums = torch.zeros(3, dtype=torch.float64, device=device)  # loss sum, correct, count
    for bi, (x, y) in enumerate(_eval_batches(data, split, batch_size, seq_len, max_batches)):
        if bi % world != rank:
            continue
        x, y = x.to(device), y.to(device)
        logits = model(x).logits
        sums[0] += _loss(logits, y, reduction="sum").double()
        valid = y != IGNORE_INDEX
        sums[1] += ((logits.argmax(-1) == y) & valid).sum()
        sums[2] += valid.sum()
    if world > 1:
        dist.all_reduce(sums)
    model.train(was_training)
    loss = float(sums[0] / sums[2].clamp_min(1))
    out = {"loss": loss, "acc": float(sums[1] / sums[2].clamp_min(1)), "n": float(sums[2])}
    if isinstance(data, TextCorpus):
        if data.level == "char":
            out["bpc"] = loss / math.log(2)
        else:
            out["ppl"] = math.exp(min(loss, 700.0))
    return out


def _rank_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


@torch.no_grad()
def _diagnostics(
    model: Transformer, batch: tuple[Tensor, Tensor], cfg: TrainConfig
) -> dict[str, float]:
    """need_weights forward on a few sequences: non-finite logits, effective ranks, diagnostics."""
    was_training = model.training
    model.eval()
    x, y = batch
    out: ModelOutput = model(x, need_weights=True)
    row: dict[str, float] = {}
    row["nonfinite_logits"] = float(
        sum(float(r.diagnostics.get("nonfinite_logits", torch.tensor(0))) for r in out.attentions)
    )
    row["nonfinite_out"] = float(
        sum(float(r.diagnostics.get("nonfinite_out", torch.tensor(0))) for r in out.attentions)
    )
    if cfg.effective_rank:
        for i, h in enumerate(out.hidden):
            row[f"erank_{i}"] = float(effective_rank(h.float()).mean())
    for spec in cfg.diagnostics:
        fn = get_diagnostic(_spec_name("diagnostic", spec))
        opts = {k: v for k, v in spec.items() if k != "name"}
        for k, v in fn(model, out, batch, **opts).items():
            row[f"{spec['name']}/{k}"] = float(v)
    model.train(was_training)
    return row


# -- the loop ----------------------------------------------------------------------------------


def _default_device(cfg: TrainConfig, local_rank: int) -> torch.device:
    if cfg.device is not None:
        return torch.device(cfg.device)
    if torch.cuda.is_available():
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


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


def train(
    model_cfg: ModelConfig,
    train_cfg: TrainConfig,
    data: TextCorpus | ArrayTask,
    *,
    resume: bool = False,
    callbacks: list[Callable[[int, dict[str, Any]], None]] | None = None,
) -> TrainResult:
    """Train a :class:`Transformer` on ``data`` and return its history, final metrics and model.

    Args:
        model_cfg: the model; its data-dependent fields (``task``, ``vocab_size`` /
            ``n_classes`` / ``patch_dim``, ``max_len``) are filled in from ``data``.
        train_cfg: the run.
        data: a :class:`~attention_atlas.data.TextCorpus` or :class:`~attention_atlas.data.ArrayTask`.
        resume: continue from ``out_dir/checkpoint.pt`` if it exists.
        callbacks: ``fn(step, info)`` called after each optimiser step (``step`` counts from 1;
            ``info`` has ``loss`` and ``grad_norm``), before that step's logging and checkpoint.

    Under ``torchrun`` (``WORLD_SIZE > 1``) the process group is set up here (gloo on CPU,
    nccl on CUDA) and torn down at the end.
    """
    cfg = train_cfg
    if cfg.checkpoint_every and not cfg.out_dir:
        raise ValueError("checkpoint_every needs out_dir")
    if resume and not cfg.out_dir:
        raise ValueError("resume=True needs out_dir")
    if cfg.schedule not in ("steps", "time"):
        raise ValueError(f"schedule must be 'steps' or 'time', got {cfg.schedule!r}")
    if cfg.schedule == "time" and not cfg.max_time_s:
        raise ValueError("schedule='time' needs max_time_s (the budget the cosine spans)")
    for spec in cfg.regularizers:
        get_regularizer(_spec_name("regularizer", spec))
    for spec in cfg.diagnostics:
        get_diagnostic(_spec_name("diagnostic", spec))

    # 1. processes and devices
    world_env = int(os.environ.get("WORLD_SIZE", "1"))
    own_group = False
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = _default_device(cfg, local_rank)
    if world_env > 1 and not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
        own_group = True
    rank, world = _rank_world()
    out_dir = Path(cfg.out_dir) if cfg.out_dir else None
    ckpt_path = out_dir / "checkpoint.pt" if out_dir else None

    det_before = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    if cfg.deterministic:
        _set_deterministic(True, warn_only=True)
    threads_before = torch.get_num_threads()
    if cfg.num_threads is not None:
        torch.set_num_threads(cfg.num_threads)
    try:
        return _train(
            model_cfg, cfg, data, device, rank, world, out_dir, ckpt_path, resume, callbacks or []
        )
    finally:
        _set_deterministic(*det_before)
        torch.set_num_threads(threads_before)
        if own_group:
            dist.destroy_process_group()


def _train(
    model_cfg: ModelConfig,
    cfg: TrainConfig,
    data: TextCorpus | ArrayTask,
    device: torch.device,
    rank: int,
    world: int,
    out_dir: Path | None,
    ckpt_path: Path | None,
    resume: bool,
    callbacks: list[Callable[[int, dict[str, Any]], None]],
) -> TrainResult:
    t_start = time.time()
    # 2. model (same initial weights on every rank), optimiser, schedule, sampler
    mcfg = _model_cfg_for(model_cfg, data, cfg.seq_len)
    seed_everything(cfg.seed)
    model = mcfg.build().to(device)  # a Transformer, or the subclass a config subclass names
    opt = torch.optim.AdamW(
        param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
        foreach=False,
    )  # fmt: skip
    frac = [0.0]  # fraction of max_time_s used (schedule="time")
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: lr_at_time(s, frac[0], cfg) if cfg.schedule == "time" else lr_at(s, cfg)
    )
    sampler = make_sampler(data, cfg.batch_size, cfg.seq_len, cfg.seed, rank, world)
    seed_everything(cfg.seed + 7919 * rank)  # training-time randomness (dropout), per rank

    step = 0
    timing = {"t_train": 0.0, "interval_elapsed": 0.0}  # training time so far, in this interval
    history: list[dict[str, float]] = []
    acc: dict[str, Any] = _new_interval()
    flops: dict[str, int] = {}
    if resume and ckpt_path is not None and ckpt_path.exists():
        state = torch.load(ckpt_path, map_location=device, weights_only=False)
        if state["world_size"] != world:
            raise ValueError(
                f"checkpoint {ckpt_path} was written by {state['world_size']} processes, "
                f"resuming with {world}"
            )
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        sampler.load_state_dict(state["sampler"][rank])
        _set_rng_state(state["rng"][rank])
        step, history, acc, flops = (
            state["step"],
            state["history"],
            state["interval"],
            state["flops"],
        )
        timing = state.get("timing", timing)

    bare = model
    ddp: nn.Module = model
    if world > 1:
        ddp = nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    needs_w = any(get_regularizer(s["name"])[1] for s in cfg.regularizers)
    diag_batch = next(_eval_batches(data, "val", cfg.weights_batch, cfg.seq_len, 1))
    diag_batch = (diag_batch[0].to(device), diag_batch[1].to(device))

    if cfg.measure_flops and not flops:
        x0, y0 = _peek(sampler)
        flops = measure_flops(bare, x0.to(device), y0.to(device))

    from tqdm.auto import tqdm

    bar = tqdm(
        total=cfg.steps, initial=step, disable=not cfg.progress or rank != 0,
        desc=f"{mcfg.attention if mcfg.layers is None else 'layers'} {getattr(data, 'name', '')}",
        dynamic_ncols=True,
    )  # fmt: skip
    model.train()
    t_interval = time.perf_counter() - timing["interval_elapsed"]
    t_train = timing["t_train"]
    stop = False
    while step < cfg.steps and not stop:
        # 3. one optimiser step on this rank's share of the global batch
        x, y = sampler.next()
        x, y = x.to(device), y.to(device)
        out = ddp(x, need_weights=needs_w)
        loss = _loss(out.logits, y)
        total = loss
        for spec in cfg.regularizers:
            fn = get_regularizer(spec["name"])[0]
            opts = {k: v for k, v in spec.items() if k not in ("name", "weight")}
            r = fn(bare, out, (x, y), **opts)
            total = total + float(spec.get("weight", 1.0)) * r
            acc["reg"][spec["name"]] = acc["reg"].get(spec["name"], 0.0) + float(r.detach())
        opt.zero_grad(set_to_none=True)
        total.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(
            model.parameters(), cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
        )
        opt.step()
        if cfg.max_time_s is not None:  # one clock for every rank (rank 0's)
            elapsed = t_train + (time.perf_counter() - t_interval)
            ft = torch.tensor([elapsed / cfg.max_time_s], dtype=torch.float64, device=device)
            if world > 1:
                dist.broadcast(ft, 0)
            frac[0] = float(ft)
            stop = frac[0] >= 1.0
        sched.step()
        step += 1
        loss_f = float(loss.detach())
        if world > 1:  # the global-batch mean loss, for the log
            lt = torch.tensor([loss_f], dtype=torch.float64, device=device)
            dist.all_reduce(lt)
            loss_f = float(lt) / world
        acc["loss"] += loss_f
        acc["gnorms"].append(float(gnorm))
        acc["tokens"] += int(y.numel()) * world
        acc["n"] += 1
        for cb in callbacks:
            cb(step, {"loss": loss_f, "grad_norm": float(gnorm)})
        bar.update(1)

        # 4. log (and evaluate) every log_every steps and at the end
        if step % cfg.log_every == 0 or step == cfg.steps or stop:
            dt = time.perf_counter() - t_interval
            t_train += dt
            row = _log_row(step, acc, dt, opt, data)
            val = evaluate(
                bare, data, split="val", batch_size=cfg.eval_batch_size, seq_len=cfg.seq_len,
                max_batches=cfg.eval_batches, device=device,
            )  # fmt: skip
            row.update({f"val_{k}": v for k, v in val.items() if k != "n"})
            row.update(_diagnostics(bare, diag_batch, cfg))
            row["time_s"] = t_train
            history.append(row)
            acc = _new_interval()
            bar.set_postfix(
                loss=f"{row['train_loss']:.3f}", val=f"{row['val_loss']:.3f}", refresh=False
            )
            t_interval = time.perf_counter()

        # 5. checkpoint
        if ckpt_path is not None and cfg.checkpoint_every and step % cfg.checkpoint_every == 0:
            t_ck = time.perf_counter()
            timing = {"t_train": t_train, "interval_elapsed": t_ck - t_interval}
            _checkpoint(
                ckpt_path, bare, opt, sched, sampler, step, history, acc, flops, timing, cfg, mcfg
            )
            t_interval += time.perf_counter() - t_ck  # checkpoint time is not training time
    bar.close()

    # 6. final evaluation, history and run record
    final = {
        f"val_{k}": v
        for k, v in evaluate(
            bare, data, split="val", batch_size=cfg.eval_batch_size, seq_len=cfg.seq_len,
            max_batches=cfg.final_eval_batches, device=device,
        ).items()
        if k != "n"
    }  # fmt: skip
    if cfg.eval_test and isinstance(data, TextCorpus):
        test = evaluate(
            bare, data, split="test", batch_size=cfg.eval_batch_size, seq_len=cfg.seq_len,
            device=device,
        )  # fmt: skip
        final.update({f"test_{k}": v for k, v in test.items() if k != "n"})
    final["steps"] = float(step)
    final["train_time_s"] = t_train
    if history:
        tok = sum(h["tokens_per_s"] * h["interval_s"] for h in history)
        final["tokens_per_s"] = tok / max(1e-9, sum(h["interval_s"] for h in history))
    hist = pd.DataFrame(history)
    record = {
        "model_config": mcfg.to_dict(),
        "train_config": cfg.to_dict(),
        "data": {
            "name": getattr(data, "name", type(data).__name__),
            "kind": "lm" if isinstance(data, TextCorpus) else data.kind,
        },
        "seed": cfg.seed,
        "git": _git_commit(),
        "versions": _versions(),
        "device": str(device),
        "world_size": world,
        "param_counts": param_counts(bare),
        "flops": flops,
        "final": final,
        "wall_time_s": time.time() - t_start,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if out_dir is not None and rank == 0:
        out_dir.mkdir(parents=True, exist_ok=True)
        hist.to_csv(out_dir / "history.csv", index=False)
        _atomic_write_text(json.dumps(record, indent=2, default=str), out_dir / "run.json")
    return TrainResult(hist, final, bare, record, out_dir)


def _new_interval() -> dict[str, Any]:
    return {"loss": 0.0, "gnorms": [], "tokens": 0, "n": 0, "reg": {}}


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


def _checkpoint(
    path: Path,
    model: Transformer,
    opt: torch.optim.Optimizer,
    sched: Any,
    sampler: Any,
    step: int,
    history: list[dict[str, float]],
    acc: dict[str, Any],
    flops: dict[str, int],
    timing: dict[str, float],
    cfg: TrainConfig,
    mcfg: ModelConfig,
) -> None:
    """Every rank's RNG and sampler state are gathered; rank 0 writes the file atomically."""
    rank, world = _rank_world()
    rng, samp = _rng_state(), sampler.state_dict()
    if world > 1:
        rngs: list[Any] = [None] * world
        samps: list[Any] = [None] * world
        dist.all_gather_object(rngs, rng)
        dist.all_gather_object(samps, samp)
    else:
        rngs, samps = [rng], [samp]
    if rank == 0:
        _atomic_save(
            {
                "step": step,
                "model": model.state_dict(),
                "optimizer": opt.state_dict(),
                "scheduler": sched.state_dict(),
                "sampler": samps,
                "rng": rngs,
                "history": history,
                "interval": acc,
                "flops": flops,
                "timing": timing,
                "world_size": world,
                "train_config": cfg.to_dict(),
                "model_config": mcfg.to_dict(),
            },
            path,
        )
    if world > 1:
        dist.barrier()


# -- configs from files and the command line ------------------------------------------------------


def _parse_value(text: str) -> Any:
    """``key=value`` values: JSON when it parses (numbers, true/false/null, lists, dicts), else str."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        low = text.lower()
        if low in ("true", "false"):
            return low == "true"
        if low in ("none", "null"):
            return None
        return text


def load_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A JSON or YAML file with optional sections ``model``, ``train``, ``task``, ``task_options``."""
    p = Path(path)
    text = p.read_text()
    if p.suffix in (".yaml", ".yml"):
        import yaml

        cfg = yaml.safe_load(text) or {}
    else:
        cfg = json.loads(text)
    if not isinstance(cfg, dict):
        raise ValueError(f"config file {p} must hold a mapping, got {type(cfg).__name__}")
    unknown = set(cfg) - {"model", "train", "task", "task_options"}
    if unknown:
        raise ValueError(
            f"config file {p}: unknown section(s) {sorted(unknown)}; "
            "expected model, train, task, task_options"
        )
    return cfg


def build_configs(
    config: dict[str, Any], overrides: list[str]
) -> tuple[ModelConfig, TrainConfig, dict[str, Any]]:
    """Model and train configs from a config mapping plus ``key=value`` overrides; a key names a
    field of :class:`ModelConfig` or :class:`TrainConfig` (or ``model.key`` / ``train.key`` /
    ``task.key`` to be explicit)."""
    m = dict(config.get("model", {}))
    t = dict(config.get("train", {}))
    task_opts = dict(config.get("task_options", {}))
    mf = {f.name for f in fields(ModelConfig)}
    tf = {f.name for f in fields(TrainConfig)}
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"override {item!r} must look like key=value")
        key, val = item.split("=", 1)
        value = _parse_value(val)
        section, _, name = key.rpartition(".")
        if section == "model" or (not section and name in mf and name not in tf):
            m[name] = value
        elif section == "train" or (not section and name in tf):
            t[name] = value
        elif section == "task":
            task_opts[name] = value
        else:
            raise ValueError(
                f"unknown setting {key!r}; model settings: {', '.join(sorted(mf))}; "
                f"train settings: {', '.join(sorted(tf))}; task options as task.NAME=VALUE"
            )
    for given, known, section in ((m, mf, "model"), (t, tf, "train")):
        bad = set(given) - known
        if bad:
            raise ValueError(f"unknown {section} setting(s) {sorted(bad)}; known: {sorted(known)}")
    return ModelConfig(**m), TrainConfig(**t), task_opts


def add_subcommand(subparsers: Any) -> None:
    """Register ``train`` on the command line (see :mod:`attention_atlas.__main__`)."""
    p = subparsers.add_parser(
        "train",
        help="train a Transformer on a task",
        description=(
            "Train a Transformer with a chosen attention on a task; prints progress and the final "
            "metrics, writes history.csv and run.json to --out. Example: python -m attention_atlas "
            "train --task ptb-char --attention dot -o steps=2000 -o dim=128 -o n_layers=2"
        ),
    )
    p.add_argument(
        "--task",
        default=None,
        help="ptb-char, ptb-word, wikitext2, wikitext2-char, digits, copy, recall",
    )
    p.add_argument("--attention", default=None, help="registered attention variant (default dot)")
    p.add_argument(
        "--config", default=None, help="JSON or YAML file with model/train/task sections"
    )
    p.add_argument(
        "-o", "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override a model or train setting (repeatable), e.g. -o lr=1e-3 -o n_heads=4",
    )  # fmt: skip
    p.add_argument(
        "--out", default=None, help="output folder (default runs/<task>-<attention>-<time>)"
    )
    p.add_argument(
        "--data-dir", default=None, help="data directory (default $ATTENTION_ATLAS_DATA)"
    )
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    p.set_defaults(func=_cli_train)


def _cli_train(args: argparse.Namespace) -> int:
    config = load_config_file(args.config) if args.config else {}
    task = args.task or config.get("task") or "ptb-char"
    overrides = list(args.overrides)
    if args.attention:
        overrides.insert(0, f"model.attention={args.attention}")
    mcfg, tcfg, task_opts = build_configs(config, overrides)
    out = (
        args.out
        or tcfg.out_dir
        or str(Path("runs") / f"{task}-{mcfg.attention}-{time.strftime('%Y%m%d-%H%M%S')}")
    )
    tcfg = replace(tcfg, out_dir=out)
    data = load_task(task, args.data_dir, **task_opts)
    rank, _ = int(os.environ.get("RANK", "0")), None
    if rank == 0:
        print(f"task {task}: {data!r}", file=sys.stderr)
    res = train(mcfg, tcfg, data, resume=args.resume)
    if rank == 0:
        pc = res.record["param_counts"]
        print(f"parameters: {pc}")
        if res.record["flops"]:
            print(f"flops: {res.record['flops']}")
        print("final: " + ", ".join(f"{k}={v:.4g}" for k, v in res.final.items()))
        print(f"history and run record in {out}")
    return 0
