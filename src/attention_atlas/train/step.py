"""One training step, in one place: :func:`take_step` (forward, loss, the weighted
regularisers, finite checks, backward, clipping, the optimiser's update) and the run it belongs
to (:func:`build_run`, :func:`optimiser_step`: the step the training loop takes, with its batch
sampler, schedule and accounting).

Every timing of a training step (the benchmarks, chapters 4, 5, 6, 8 and 9) and every
experiment that trains takes its steps through these functions: :func:`step_callable` times a
run's own steps, :func:`batch_step` a fresh model's steps on one fixed batch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from attention_atlas import native as native_kernels
from attention_atlas.cofactor.native_heads import inplace_grads
from attention_atlas.data import ArrayTask, TextCorpus, make_sampler
from attention_atlas.models import ModelConfig, Transformer
from attention_atlas.models.hooks import get_regularizer
from attention_atlas.profiling import phase

from .checkpoint import Progress, TrainClock, seed_everything
from .compiled import CompiledSteps
from .config import TrainConfig
from .ddp import rank_world
from .evaluate import cross_entropy
from .optim import adamw_implementation, lr_at, lr_at_time, param_groups
from .resumable import Slot, claim_slot

__all__ = [
    "NonFinite",
    "Run",
    "StepResult",
    "batch_step",
    "build_run",
    "check_finite",
    "global_mean",
    "model_config_for",
    "optimiser_step",
    "peek_batch",
    "step_callable",
    "take_step",
]

Callback = Callable[[int, dict[str, Any]], None]


@dataclass
class StepResult:
    """What :func:`take_step` did: the objective's ``loss`` (without the regularisers) and the
    ``total`` minimised (both detached), the gradient norm before clipping, each regulariser's
    value, and the forward's output (None with an ``objective``)."""

    loss: Tensor
    total: Tensor
    grad_norm: Tensor
    regularizers: dict[str, float]
    output: Any


def take_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Any,
    *,
    forward: nn.Module | CompiledSteps | None = None,
    objective: Callable[[Any, Any], Tensor] | None = None,
    regularizers: Sequence[dict[str, Any]] = (),
    need_weights: bool | None = None,
    grad_clip: float = 0.0,
    step: int = 0,
    device: torch.device | None = None,
) -> StepResult:
    """One optimiser step of ``model`` on ``batch = (x, y)``.

    The loss is the cross-entropy of ``forward(x).logits`` (``forward`` defaults to ``model``:
    pass a DDP wrapper or compiled steps of it) against ``y``, or ``objective(forward, batch)``
    for a model of your own (a scalar). Each regulariser spec ``{"name", "weight", **options}``
    (:mod:`attention_atlas.models.hooks`) adds ``weight * fn(model, output, batch, **options)``;
    ``need_weights`` asks the forward for the attention probabilities (default: when a
    regulariser needs them). Then: the total must be finite, gradients are zeroed, the total
    back-propagated, the global gradient norm clipped to ``grad_clip`` (``<= 0``: measured, not
    clipped) and must be finite, and the optimiser updates. A non-finite loss or gradient norm
    raises :class:`NonFinite` (``step + 1`` names the step) before any update.

    Shapes: ``batch = (x, y)`` with ``x`` ``(batch, length)`` token ids (or ``(batch, length,
    patch_dim)`` patches) and ``y`` ``(batch, length)`` or ``(batch,)`` targets; with an
    ``objective``, whatever it takes.
    """
    fwd = forward if forward is not None else model
    specs = list(regularizers)
    if need_weights is None:
        need_weights = any(get_regularizer(s["name"])[1] for s in specs)
    if objective is None:
        x, y = batch
        out = fwd(x, need_weights=need_weights)
        with phase("loss"):
            loss = cross_entropy(out.logits, y)
    else:
        out = None
        loss = objective(fwd, batch)
    total = loss
    values: dict[str, float] = {}
    for spec in specs:
        fn = get_regularizer(spec["name"])[0]
        opts = {k: v for k, v in spec.items() if k not in ("name", "weight")}
        eager = not isinstance(fwd, CompiledSteps)  # then the logits' loss gives each head's
        # queries and keys a gradient the cofactor regulariser adds its own into (inplace_grads)
        with phase(f"regularizer/{spec['name']}"), inplace_grads(eager):
            r = fn(model, out, batch, **opts)
        total = total + float(spec.get("weight", 1.0)) * r
        values[spec["name"]] = float(r.detach())
    check_finite("loss", total, step + 1, device)
    optimizer.zero_grad(set_to_none=True)
    total.backward()
    gnorm = torch.nn.utils.clip_grad_norm_(
        model.parameters(), grad_clip if grad_clip > 0 else float("inf")
    )
    check_finite("gradient norm", gnorm, step + 1, device)
    optimizer.step()
    return StepResult(loss.detach(), total.detach(), gnorm, values, out)


def batch_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, batch: tuple[Tensor, Tensor],
    **options: Any,
) -> Callable[[], Tensor]:  # fmt: skip
    """One call = one :func:`take_step` of ``model`` on the same ``batch`` (``options`` as
    there), gradients on even under a caller's ``no_grad``; returns the loss. For timing a
    training step side by side (:func:`attention_atlas.bench.timing.compare`)."""

    def step() -> Tensor:
        with torch.enable_grad():
            return take_step(model, optimizer, batch, **options).loss

    return step


@dataclass
class Run:
    """One run's objects and its progress: what :func:`build_run` makes and :func:`optimiser_step`
    advances."""

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


def model_config_for(
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


def build_run(
    model_cfg: ModelConfig,
    cfg: TrainConfig,
    data: TextCorpus | ArrayTask,
    device: torch.device | str = "cpu",
    callbacks: Sequence[Callback] = (),
) -> Run:
    """A run of ``model_cfg`` on ``data`` as ``cfg`` sets it up: the model (same initial
    weights on every rank), AdamW over its parameter groups, the schedule, the batch sampler,
    and the checkpoint slot. Take its steps with :func:`optimiser_step` (as :func:`train` does),
    or time them with :func:`step_callable`."""
    t_start = time.time()
    device = torch.device(device)
    callbacks = list(callbacks)
    rank, world = rank_world()
    mcfg = model_config_for(model_cfg, data, cfg.seq_len)
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
    return Run(
        cfg, mcfg, data, device, model, opt, sched, sampler, frac, callbacks,
        out_dir=out_dir, ckpt_path=ckpt, t_start=t_start, slot=slot,
    )  # fmt: skip


def optimiser_step(
    run: Run,
    module: nn.Module | CompiledSteps | None = None,
    needs_weights: bool | None = None,
    clock: TrainClock | None = None,
) -> bool:
    """One optimiser step of ``run`` on this rank's share of the next global batch
    (:func:`take_step` with the run's regularisers and clipping, then the schedule, the interval's
    accounting and the callbacks); whether the time budget (``max_time_s``) is spent.

    ``module`` is what runs the forward (the DDP wrapper or :class:`~.compiled.CompiledSteps` of
    ``run.model``; default the model itself); ``needs_weights`` whether the regularisers need the
    attention probabilities (default: asked of the registry); ``clock`` the run's training clock
    (a new one when None). Raises :class:`NonFinite` before the update when the loss or the
    gradient norm is not finite."""
    cfg, p, acc = run.cfg, run.progress, run.progress.interval
    rank, world = rank_world()
    x, y = run.sampler.next()
    x, y = x.to(run.device), y.to(run.device)
    res = take_step(
        run.model, run.opt, (x, y), forward=module, regularizers=cfg.regularizers,
        need_weights=needs_weights, grad_clip=cfg.grad_clip, step=p.step, device=run.device,
    )  # fmt: skip
    for name, value in res.regularizers.items():
        acc["reg"][name] = acc["reg"].get(name, 0.0) + value
    gnorm = res.grad_norm
    stop = False
    if cfg.max_time_s is not None:  # one clock for every rank (rank 0's)
        clock = clock if clock is not None else TrainClock(p.timing)
        ft = torch.tensor(
            [clock.elapsed() / cfg.max_time_s], dtype=torch.float64, device=run.device
        )
        if world > 1:
            dist.broadcast(ft, 0)
        run.frac[0] = float(ft)
        stop = run.frac[0] >= 1.0
    run.sched.step()
    p.step += 1
    loss_f = global_mean(float(res.loss), run.device)
    acc["loss"] += loss_f
    acc["gnorms"].append(float(gnorm))
    acc["tokens"] += int(y.numel()) * world
    acc["n"] += 1
    for cb in run.callbacks:
        cb(p.step, {"loss": loss_f, "grad_norm": float(gnorm)})
    return stop


class NonFinite(Exception):
    """A non-finite loss or gradient norm at an optimiser step (before its update)."""

    def __init__(self, quantity: str, step: int, value: float) -> None:
        super().__init__(quantity, step, value)
        self.quantity, self.step, self.value = quantity, step, value


def check_finite(
    quantity: str, value: Tensor, step: int, device: torch.device | None = None
) -> None:
    """Raise :class:`NonFinite` if ``value`` is NaN or infinite on any rank."""
    _, world = rank_world()
    device = value.device if device is None else device
    bad = torch.tensor([0.0 if bool(torch.isfinite(value.detach())) else 1.0], device=device)
    if world > 1:  # every rank stops at the same step
        dist.all_reduce(bad, op=dist.ReduceOp.MAX)
    if float(bad) > 0:
        raise NonFinite(quantity, step, float(value.detach()))


def global_mean(value: float, device: torch.device) -> float:
    """The mean of ``value`` over ranks (the global-batch mean loss, for the log)."""
    _, world = rank_world()
    if world == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return float(t) / world


def peek_batch(sampler: Any) -> tuple[Tensor, Tensor]:
    """The sampler's next batch, without moving it."""
    state = sampler.state_dict()
    batch = sampler.next()
    sampler.load_state_dict(state)
    return batch


def step_callable(
    run: Run, *, compiled: bool = False, native: bool = False
) -> Callable[[], Tensor]:
    """One call = one :func:`optimiser_step` of ``run`` (gradients on even under a caller's
    ``no_grad``); with ``compiled``, its forward through :class:`~.compiled.CompiledSteps`, as a
    run with ``TrainConfig(compile=True)`` takes it; with ``native``, the native kernels on
    (:func:`attention_atlas.native.enabled`), as ``TrainConfig(native=True)``. The callable's
    ``compiled`` attribute is the compiled module (or None)."""
    needs_w = any(get_regularizer(s["name"])[1] for s in run.cfg.regularizers)
    clock = TrainClock(run.progress.timing)
    module = CompiledSteps(run.model) if compiled else run.model

    def step() -> Tensor:
        with torch.enable_grad(), native_kernels.enabled(native):
            optimiser_step(run, module, needs_w, clock)
        return torch.zeros(())

    step.compiled = module if compiled else None  # type: ignore[attr-defined]
    return step
