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
run ends (on CPU). :func:`~.resumable.resumable_training` checkpoints and resumes the runs of one
piece of work (a sweep cell) the same way without their configs naming a folder. Under ``torchrun`` the run is data parallel (gloo on CPU, nccl on CUDA): the
global batch ``batch_size`` is split across ranks, so results match a single process.

One training step has one home, :mod:`.step`: :func:`take_step` (forward, loss, regularisers,
finite checks, backward, clipping, update), :func:`build_run` and :func:`optimiser_step` (the
loop's step of a run), :func:`step_callable` and :func:`batch_step` (a step to time). Nothing
outside this package takes an optimiser step by hand.

Modules: :mod:`.config` (TrainConfig, config files, ``key=value`` overrides), :mod:`.step` (one
training step), :mod:`.loop` (:func:`train`), :mod:`.optim` (parameter groups, schedules), :mod:`.evaluate` (loss,
evaluation, diagnostics), :mod:`.flops` (:func:`measure_flops`), :mod:`.checkpoint` (seeds, RNG
states, atomic checkpoints), :mod:`.resumable` (checkpoints of a sweep cell's runs), :mod:`.ddp` (process group, rank, device). The ``train`` command is
:mod:`attention_atlas.cli.train`; provenance (git state, versions) is
:mod:`attention_atlas.provenance`.
"""

from __future__ import annotations

from attention_atlas.models.hooks import (
    available_diagnostics,
    available_regularizers,
    register_diagnostic,
    register_regularizer,
)

from .checkpoint import seed_everything
from .config import TrainConfig, build_configs, load_config_file
from .evaluate import evaluate
from .flops import measure_flops
from .loop import TrainResult, train
from .optim import lr_at, lr_at_time, param_groups
from .step import (
    NonFinite,
    Run,
    StepResult,
    batch_step,
    build_run,
    optimiser_step,
    step_callable,
    take_step,
)

__all__ = [
    "NonFinite",
    "Run",
    "StepResult",
    "TrainConfig",
    "TrainResult",
    "available_diagnostics",
    "available_regularizers",
    "batch_step",
    "build_run",
    "build_configs",
    "evaluate",
    "load_config_file",
    "lr_at",
    "lr_at_time",
    "measure_flops",
    "optimiser_step",
    "param_groups",
    "register_diagnostic",
    "register_regularizer",
    "seed_everything",
    "step_callable",
    "take_step",
    "train",
]
