"""Chapter 9's experiment: every trainable variant on equal footing.

Eight arms (:data:`VARIANTS`): dot-product, Euclidean, Riemannian, the Fiber Bundle Transformer
(:class:`~attention_atlas.models.FiberBundleConfig`), matroidal, dense Mahalanobis, the SSM, and
dot-product attention with the seed's ``"cofactor"`` regulariser. Each is the same 2-layer
Transformer (:class:`~attention_atlas.models.ModelConfig`, untied embeddings) trained by the one
harness (:func:`attention_atlas.train.train`) on the same data:

1. **MQAR** (:func:`attention_atlas.data.mqar_task`), on a cross rather than a full grid: widths
   ``widths`` at ``centre_pairs`` pairs, and pairs ``pairs`` at ``centre_width``; sequence
   length ``max(seq_len, 4 * pairs)`` (64, and 128 for 32 pairs). A cell ``mqar/<variant>/w<W>-
   p<N>`` trains at the variant's learning rate, chosen from ``lrs`` by validation accuracy at
   the centre cell on seed ``select_seed`` (:func:`select_lr`, run inside the cells that need it
   and memoised, on disk too, so it runs once per variant) and reports test accuracy.
2. **char-PTB at a fixed wall-clock budget** (``ptb/<variant>``): ``schedule="time"`` with
   ``max_time_s = ptb_budget_s``, validation bpc at the end. A wall-clock budget is not
   reproducible bit for bit (the steps done depend on the machine and its load): the record
   stores the steps and the machine (the record's provenance names the CPU).
3. **Time per step** (``time/w<W>-p<N>``): one training step of every variant at the centre cell,
   timed side by side against dot by :func:`attention_atlas.bench.timing.compare` (one cell per seed,
   so the ratios get intervals over seeds).

``python -m attention_atlas sweep zoo --preset book`` runs the book's grid (stored under
``results/zoo/book``); ``--preset long`` the full protocol. The chapter's analysis is in
:mod:`attention_atlas.experiments.zoo.analysis`.

One idea: the cells of chapter 9's grid, each built from its parameters by the same helpers
(:func:`mqar_configs`, :func:`ptb_configs`, :func:`time_arm_model`) whether it is checked before
any work (:func:`check_cell`) or run (:func:`run_cell`).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from attention_atlas.validate import ConfigError, check_count, check_number, one_line

if TYPE_CHECKING:
    from attention_atlas.models import ModelConfig
    from attention_atlas.train import TrainConfig

__all__ = [
    "CONTROL",
    "PRESETS",
    "SESOI",
    "VARIANTS",
    "VOLATILE_METRICS",
    "chapter_grid",
    "check_cell",
    "is_arm",
    "known_arms",
    "model_config",
    "mqar_configs",
    "ptb_configs",
    "time_arm_model",
    "time_cell",
    "training_step",
    "NO_MLP",
    "SSM_RECALL_INIT",
    "quiet_no_mlp",
    "run_cell",
    "select_lr",
    "ssm_state_size",
]

#: the arms, in the order the chapter shows them; "cofactor" is dot with the cofactor regulariser
VARIANTS = (
    "dot", "euclidean", "riemannian", "fiber_bundle", "matroidal", "mahalanobis", "ssm", "cofactor",
)  # fmt: skip
#: the control every claim is measured against
CONTROL = "dot"

#: smallest effects of interest, fixed before any result was read (one line of reason each)
SESOI: dict[str, float] = {
    # two points of MQAR accuracy: below that, the order of a leaderboard is noise at 3 seeds
    "test_acc": 0.02,
    # the learning curve's mean accuracy (data efficiency): two points, as for accuracy
    "learning_auc": 0.02,
    # log10 of the gradient-norm variance after warm-up: a factor of two (0.3) in variance
    "log10_grad_var": 0.3,
    # gradient-norm spikes (a step above twice the median of the previous 20) per run: one
    "grad_spikes": 1.0,
    # char-PTB bits per character at the same wall-clock budget: 0.02 bpc
    "val_bpc": 0.02,
}

#: record metrics that are timings or depend on the machine's load (not compared by verify)
VOLATILE_METRICS = ("*_ms", "ratio_*", "steps_done", "val_bpc", "val_loss_ptb", "tokens_seen")

#: the SSM arm's initialisation for recall (:class:`~attention_atlas.attention.sma.SSMAttention`
#: options): steps ``dt`` log-uniform in [0.1, 1] and rates ``-A`` in [0.01, 0.1], so that the
#: state decays over tens of positions, the length of an MQAR sequence. Mamba-2's defaults
#: (``dt`` in [1e-3, 0.1], ``-A`` in [1, 16]), made for long language contexts, shrink the
#: output by ``dt`` and forget within a few positions: measured here (width 64, 8 pairs,
#: length 64, vocabulary 128, token shift, lr 1e-3, seed 0), test accuracy 0.34 after 3,000
#: steps with them against 1.00 after 1,000 with these. The grid's ``ablation/ssm-init`` cell
#: measures the difference at every seed.
SSM_RECALL_INIT: dict[str, Any] = {"dt_min": 0.1, "dt_max": 1.0, "a_init_range": [0.01, 0.1]}

#: ``mlp_ratio`` of a block without MLP: ``int(ratio * D) = 0`` hidden units for any D < 10,000
NO_MLP = 1e-4

#: the experiment's name on the command line and in the results store
NAME = "zoo"

#: parameter sets of ``python -m attention_atlas sweep zoo --preset NAME``; "book" is the
#: defaults of :func:`chapter_grid` (chapter 9's parameters)
PRESETS: dict[str, dict[str, Any]] = {
    "smoke": {
        "widths": [16], "pairs": [2, 4], "centre_width": 16, "centre_pairs": 2, "seq_len": 16,
        "vocab_size": 16, "steps": 3, "batch_size": 8, "lrs": [1e-3, 3e-3], "n_train": 64,
        "n_val": 16, "n_test": 16, "log_every": 1, "ptb_budget_s": 0.5, "ptb_dim": 16,
        "ptb_seq_len": 16, "ptb_batch": 4, "ptb_eval_batches": 1, "time_batch": 4, "time_reps": 1,
        "centre_only": [],
    },
    "book": {},
    "long": {
        "widths": [32, 64, 128], "pairs": [4, 8, 16, 32], "centre_width": 64, "centre_pairs": 8,
        "seq_len": 64, "vocab_size": 512, "steps": 1000, "batch_size": 32, "log_every": 100,
        "centre_only": [], "ptb_budget_s": 120.0, "time_batch": 32,
    },
}  # fmt: skip


@contextlib.contextmanager
def quiet_no_mlp() -> Iterator[None]:
    """Building a block without MLP (:data:`NO_MLP`) initialises zero-element weights, which
    torch warns about; nothing is wrong, so that warning is silenced here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Initializing zero-element tensors is a no-op")
        yield


def known_arms() -> list[str]:
    """The zoo's arms (:data:`VARIANTS`), then every other registered attention variant (one of
    your own, registered by :func:`~attention_atlas.attention.register_attention` or loaded by
    :func:`attention_atlas.experiments.atlas.load_variant`): any of them can be an arm."""
    from attention_atlas.attention import available_attention

    return [*VARIANTS, *(v for v in available_attention() if v not in VARIANTS)]


def is_arm(variant: object) -> bool:
    """``variant`` names an arm of :func:`known_arms`."""
    return isinstance(variant, str) and variant in known_arms()


def ssm_state_size(width: int, n_heads: int, n_layers: int = 1) -> int:
    """Floats of recurrent state of the SSM arm: ``n_heads`` heads of ``d x d`` (value by state
    dimension, ``d = width / n_heads``) per layer, times ``n_layers``."""
    d = width // n_heads
    return n_layers * n_heads * d * d


def model_config(variant: str, model: dict[str, Any]) -> Any:
    """The model of an arm: :class:`~attention_atlas.models.FiberBundleConfig` for
    ``"fiber_bundle"``, else a :class:`~attention_atlas.models.ModelConfig` with that attention
    (``"cofactor"`` is dot: its regulariser is a training setting)."""
    from attention_atlas.models import FiberBundleConfig, ModelConfig

    if not is_arm(variant):
        raise ValueError(f"unknown arm {variant!r}; known: {', '.join(known_arms())}")
    if variant == "fiber_bundle":
        return FiberBundleConfig(**model)
    attention = "dot" if variant == "cofactor" else variant
    return ModelConfig(**model, attention=attention)


def chapter_grid(
    *,
    variants: Sequence[str] = VARIANTS,
    widths: Sequence[int] = (64, 128),
    pairs: Sequence[int] = (4, 8),
    centre_width: int = 64,
    centre_pairs: int = 4,
    centre_only: Sequence[str] = ("riemannian", "fiber_bundle"),
    seq_len: int = 32,
    vocab_size: int = 64,
    n_heads: int = 1,
    n_layers: int = 2,
    steps: int = 300,
    batch_size: int = 32,
    lrs: Sequence[float] = (1e-3, 3e-3, 1e-2),
    select_seed: int = 0,
    n_train: int = 50_000,
    n_val: int = 1_000,
    n_test: int = 1_000,
    query_dist: str = "power",
    log_every: int = 50,
    cofactor_weight: float = 1e-3,
    cofactor_beta: float = 0.1,
    ptb_budget_s: float = 8.0,
    ptb_dim: int = 64,
    ptb_seq_len: int = 64,
    ptb_batch: int = 32,
    ptb_lr: float = 3e-3,
    ptb_eval_batches: int = 16,
    time_batch: int = 32,
    time_reps: int = 5,
    ablations: bool = True,
    token_shift: bool = True,
    ssm_recall_init: bool = True,
) -> dict[str, dict[str, Any]]:
    """The cross of MQAR cells (``mqar/<variant>/w<W>-p<N>``), one char-PTB cell per variant
    (``ptb/<variant>``) and one timing cell (``time/w<W>-p<N>``), by name.

    The cross is ``widths`` at ``centre_pairs`` and ``pairs`` at ``centre_width``; the centre is
    in both. Arms in ``centre_only`` run the centre cell only (the book's grid leaves the two
    slowest arms out of the other cells). Every cell carries its learning-rate selection (the
    centre cell's model, task and training at each of ``lrs`` on ``select_seed``), so a cell is
    self-contained. The blocks have no MLP (:data:`NO_MLP`), as Zoology's MQAR models; with
    ``token_shift`` every model adds a learned map of the previous position's embedding to each
    embedding (:class:`~attention_atlas.models.ModelConfig`), the short convolution of H3 and
    Zoology's Based, so that one attention layer can bind a key to the value that follows it;
    with ``ssm_recall_init`` the SSM arm starts from :data:`SSM_RECALL_INIT`. With
    ``ablations``, dot-product cells at the easiest setting (fewest pairs, widest) test those
    choices at dot's chosen learning rate: ``ablation/mlp/...`` (an MLP of 4 D),
    ``ablation/tied/...`` (tied embeddings) and ``ablation/noshift/...`` (no token shift); and
    ``ablation/ssm-init/<centre>`` is the SSM arm with Mamba-2's initialisation.
    """
    bad = sorted(v for v in set(variants) if not is_arm(v))
    if bad:
        raise ValueError(f"unknown arm(s) {bad}; known: {', '.join(known_arms())}")
    if CONTROL not in variants:  # the timing cell's ratios and every claim are to the control
        raise ValueError(f"variants must include the control {CONTROL!r}, got {list(variants)}")
    if centre_width not in widths or centre_pairs not in pairs:
        raise ValueError(
            f"the centre (width {centre_width}, {centre_pairs} pairs) must be in widths "
            f"{list(widths)} and pairs {list(pairs)}"
        )

    def cell(variant: str, width: int, n_pairs: int) -> dict[str, Any]:
        length = max(seq_len, 4 * n_pairs)
        model = {"dim": int(width), "n_layers": n_layers, "n_heads": n_heads,
                 "tie_embeddings": False, "mlp_ratio": NO_MLP, **arm_model[variant]}  # fmt: skip
        task = {"seq_len": length, "n_pairs": int(n_pairs), "vocab_size": vocab_size,
                "query_dist": query_dist, "n_train": n_train, "n_val": n_val, "n_test": n_test}  # fmt: skip
        train = {"steps": steps, "batch_size": batch_size, "warmup_steps": max(1, steps // 10),
                 "log_every": log_every, "eval_batches": 2, "eval_batch_size": 250}  # fmt: skip
        reg = (
            {"name": "cofactor", "weight": cofactor_weight, "heads": 1, "beta": cofactor_beta}
            if variant == "cofactor" else None
        )  # fmt: skip
        return {"kind": "mqar", "variant": variant, "width": int(width), "pairs": int(n_pairs),
                "model": model, "task": task, "train": train, "regularizer": reg}  # fmt: skip

    arm_model: dict[str, dict[str, Any]] = {v: {"token_shift": token_shift} for v in variants}
    if ssm_recall_init and "ssm" in arm_model:
        arm_model["ssm"]["attention_options"] = dict(SSM_RECALL_INIT)
    configs: dict[str, dict[str, Any]] = {}
    cross = [(w, centre_pairs) for w in widths] + [(centre_width, p) for p in pairs]
    cross = list(dict.fromkeys(cross))
    for v in variants:
        centre = cell(v, centre_width, centre_pairs)
        selection = {"lrs": [float(x) for x in lrs], "seed": select_seed,
                     **{k: centre[k] for k in ("model", "task", "train")}}  # fmt: skip
        for w, p in cross if v not in centre_only else [(centre_width, centre_pairs)]:
            configs[f"mqar/{v}/w{w}-p{p}"] = {**cell(v, w, p), "selection": selection}
    if ablations and CONTROL in variants:
        p = min(q for _, q in cross)
        w = max(v for v, q in cross if q == p)  # the easiest cell: fewest pairs, then widest
        base = {
            **cell(CONTROL, w, p),
            "selection": configs[f"mqar/{CONTROL}/w{w}-p{p}"]["selection"],
        }
        changes: list[tuple[str, dict[str, Any]]] = [
            ("mlp", {"mlp_ratio": 4.0}),
            ("tied", {"tie_embeddings": True}),
        ]
        changes += [("noshift", {"token_shift": False})] if token_shift else []
        for name, change in changes:
            configs[f"ablation/{name}/w{w}-p{p}"] = {**base, "model": {**base["model"], **change}}
    if ablations and "ssm" in variants and ssm_recall_init:
        ssm = configs[f"mqar/ssm/w{centre_width}-p{centre_pairs}"]
        default = {k: v for k, v in ssm["model"].items() if k != "attention_options"}
        configs[f"ablation/ssm-init/w{centre_width}-p{centre_pairs}"] = {**ssm, "model": default}
    for v in variants:
        model = {"dim": ptb_dim, "n_layers": n_layers, "n_heads": n_heads, "max_len": ptb_seq_len,
                 "tie_embeddings": False, "mlp_ratio": NO_MLP, **arm_model[v]}  # fmt: skip
        reg = (
            {"name": "cofactor", "weight": cofactor_weight, "heads": 1, "beta": cofactor_beta}
            if v == "cofactor" else None
        )  # fmt: skip
        configs[f"ptb/{v}"] = {
            "kind": "ptb", "variant": v, "model": model, "regularizer": reg,
            "train": {"budget_s": float(ptb_budget_s), "batch_size": ptb_batch,
                      "seq_len": ptb_seq_len, "lr": ptb_lr, "eval_batches": ptb_eval_batches},
        }  # fmt: skip
    centre = cell(CONTROL, centre_width, centre_pairs)
    configs[f"time/w{centre_width}-p{centre_pairs}"] = {
        "kind": "time", "variants": list(variants), "model": centre["model"],
        "arm_model": {v: m for v, m in arm_model.items() if v != CONTROL},
        "task": {**centre["task"], "n_train": time_batch, "n_val": 1, "n_test": 1},
        "batch_size": time_batch, "reps": time_reps,
        "cofactor": {"weight": cofactor_weight, "heads": 1, "beta": cofactor_beta},
    }  # fmt: skip
    return configs


# ----------------------------------------------------------------------------------------
# cells
# ----------------------------------------------------------------------------------------


def run_cell(params: dict[str, Any], seed: int) -> dict[str, Any]:
    """One cell of :func:`chapter_grid` at ``seed``: an MQAR run, a char-PTB run at a fixed
    wall-clock budget, or the side-by-side timing of one training step of every arm."""
    kind = params["kind"]
    if kind == "mqar":
        return _mqar_cell(params, seed)
    if kind == "ptb":
        return _ptb_cell(params, seed)
    if kind == "time":
        return time_cell(params, seed)
    raise ValueError(f"unknown cell kind {kind!r}; expected mqar, ptb or time")


def check_cell(params: dict[str, Any]) -> None:
    """Check one configuration's parameters before any work: its arms (the timing cell's with
    the control), MQAR tasks (:func:`~attention_atlas.data.mqar.check_mqar`, split sizes),
    ``lrs``, ``budget_s``, the timing cell's ``batch_size`` and ``reps``; the models and runs
    it trains (:func:`mqar_configs` for the cell and its selection at every lr,
    :func:`ptb_configs`, each timed arm's model) through
    :func:`~attention_atlas.train.config.check_model` and
    :func:`~attention_atlas.train.config.check_run`; the cofactor regulariser (weight > 0,
    ``beta`` >= 0, heads from 1 to ``n_heads``). Nothing is drawn or trained. Raises
    ConfigError (one line)."""
    from attention_atlas.data.mqar import check_mqar
    from attention_atlas.train.config import check_model, check_run

    kind = params.get("kind")
    if kind not in ("mqar", "ptb", "time"):
        raise ConfigError(f"kind: expected mqar, ptb or time, got {kind!r}")
    arms = params["variants"] if kind == "time" else [params["variant"]]
    if not isinstance(arms, list) or any(not is_arm(v) for v in arms):
        raise ConfigError(f"variants: expected names from {', '.join(known_arms())}, got {arms!r}")
    if kind == "time" and CONTROL not in arms:
        raise ConfigError(f"variants: the timing cell needs the control {CONTROL!r}, got {arms}")
    if kind == "time":
        check_count("time_batch", params["batch_size"])
        check_count("time_reps", params["reps"])
    parts = [params, params["selection"]] if kind == "mqar" else [params]  # and the lr selection
    for task in (part["task"] for part in parts if "task" in part):
        check_mqar(task["seq_len"], task["n_pairs"], task["vocab_size"], task["query_dist"], 0.01)
        for key in ("n_train", "n_val", "n_test"):
            check_count(key, task[key])
    lrs = params["selection"]["lrs"] if kind == "mqar" else []
    if kind == "mqar" and (not isinstance(lrs, list) or not lrs):
        raise ConfigError(f"lrs: expected a non-empty list, got {lrs!r}")
    for lr in lrs:
        check_number("lrs", lr)
    if kind == "ptb":
        check_number("ptb_budget_s", params["train"]["budget_s"])
    reg = params["cofactor"] if kind == "time" else params["regularizer"]
    configs: list[tuple[ModelConfig, TrainConfig | None]]
    try:
        if kind == "mqar":
            configs = [mqar_configs(arms[0], p["model"], p["task"], p["train"], reg, lr, 0)
                       for p in parts for lr in lrs]  # fmt: skip
        elif kind == "ptb":
            configs = [ptb_configs(params, 0)]
        else:
            length = params["task"]["seq_len"]
            configs = [(model_config(v, {**time_arm_model(params, v), "max_len": length}), None)
                       for v in arms]  # fmt: skip
    except (TypeError, ValueError) as err:
        raise ConfigError(f"model settings: {one_line(err)}") from None
    models: list[Any] = []
    for mcfg, tcfg in configs:
        if mcfg not in models:  # the same model at every learning rate: checked once
            models.append(mcfg)
            with quiet_no_mlp():  # a block without MLP, built on the meta device
                check_model(mcfg)
        if tcfg is not None:
            check_run(tcfg)
    if kind != "time" and (reg is not None) != (arms[0] == "cofactor"):
        raise ConfigError(f"regularizer: the {arms[0]} arm does not take {reg!r}")
    if reg is not None and "cofactor" in arms:
        check_number("cofactor_weight", reg.get("weight"))
        check_number("cofactor_beta", reg.get("beta", 0.0), zero=True)
        heads, n_heads = reg.get("heads", 1), params["model"]["n_heads"]
        if isinstance(heads, bool) or not isinstance(heads, int) or not 1 <= heads <= n_heads:
            raise ConfigError(f"cofactor heads: expected 1 to n_heads={n_heads}, got {heads!r}")


def _mqar_cell(params: dict[str, Any], seed: int) -> dict[str, Any]:
    """Select the arm's learning rate (memoised), train the cell at it, and measure it."""
    sel = params["selection"]
    scores = select_lr(params["variant"], sel, params["regularizer"])
    lr = max(sel["lrs"], key=lambda x: (scores[_lr_key(x)], -x))  # ties: the smaller lr
    out = _mqar_run(params["variant"], params["model"], params["task"], params["train"],
                    params["regularizer"], lr, seed)  # fmt: skip
    return {
        "variant": params["variant"], "width": params["width"], "pairs": params["pairs"],
        "centre_width": sel["model"]["dim"], "centre_pairs": sel["task"]["n_pairs"],
        "lr": lr, **{f"select_val_acc@{k}": v for k, v in scores.items()}, **out,
    }  # fmt: skip


def _lr_key(lr: float) -> str:
    return f"{lr:g}"


def select_lr(
    variant: str, selection: dict[str, Any], regularizer: dict[str, Any] | None
) -> dict[str, float]:
    """Validation accuracy of ``variant`` at the centre cell for each learning rate of
    ``selection["lrs"]``, on seed ``selection["seed"]``: ``{"1e-3": acc, ...}``. Each run is
    memoised (:func:`_mqar_run`), so the selection costs one set of runs per variant."""
    return {
        _lr_key(lr): _mqar_run(variant, selection["model"], selection["task"],
                               selection["train"], regularizer, lr, selection["seed"])["val_acc"]
        for lr in selection["lrs"]
    }  # fmt: skip


def _cache_dir() -> Path | None:
    """Where finished MQAR runs are memoised across processes: ``$ATTENTION_ATLAS_CACHE/zoo``
    (default ``~/.cache/attention_atlas/zoo``); ``ATTENTION_ATLAS_CACHE=off`` turns it off. A
    cached run is keyed by its arguments and a hash of the library's source code."""
    root = os.environ.get("ATTENTION_ATLAS_CACHE")
    if root == "off":
        return None
    base = Path(root) if root else Path.home() / ".cache" / "attention_atlas"
    return base / "zoo"


def _mqar_run(
    variant: str, model: dict[str, Any], task: dict[str, Any], train: dict[str, Any],
    regularizer: dict[str, Any] | None, lr: float, seed: int,
) -> dict[str, Any]:  # fmt: skip
    """One MQAR training run's metrics, memoised in this process and on disk (a run is
    deterministic on the CPU at one thread: the same arguments give the same numbers)."""
    from attention_atlas.attention import variant_fingerprint

    arm = "dot" if variant == "cofactor" else variant
    code = variant_fingerprint(arm)  # "" for the library's own variants
    key = json.dumps([variant, model, task, train, regularizer, lr, seed, *([code] if code else [])],
                     sort_keys=True)  # fmt: skip
    return dict(_memo(key))


@functools.cache
def _code_hash() -> str:
    """A hash of the library's source: a cached run is reused only by the code that made it."""
    h = hashlib.sha256()
    for path in sorted(Path(__file__).resolve().parents[2].rglob("*.py")):
        h.update(path.read_bytes())
    return h.hexdigest()


@functools.lru_cache(maxsize=256)
def _memo(key: str) -> dict[str, Any]:
    """The run of ``key``: from this process's memory, else the disk cache, else trained here.
    A lock file (:class:`~attention_atlas.store.records.CellLocks`) makes another process that needs
    the same run (a second sweep worker) wait for it instead of training it twice."""
    import time

    from attention_atlas.atomic import atomic_write_text
    from attention_atlas.store.records import CellLocks

    digest = hashlib.sha256(f"{_code_hash()} {key}".encode()).hexdigest()[:24]
    folder = _cache_dir()
    if folder is None:
        return _train_mqar(*json.loads(key)[:7])
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{digest}.json"
    locks = CellLocks(folder, stale_after=120.0, heartbeat=20.0)
    try:
        while not path.exists() and not locks.try_acquire(digest):
            time.sleep(1.0)  # another process trains this run: wait for its result
        if not path.exists():
            atomic_write_text(json.dumps(_train_mqar(*json.loads(key)[:7])), path)
    finally:
        locks.close()
    return dict(json.loads(path.read_text()))


@functools.lru_cache(maxsize=4)
def _mqar_data(task_json: str, seed: int) -> Any:
    from attention_atlas.data import mqar_task

    return mqar_task(**json.loads(task_json), seed=seed)


def mqar_configs(
    variant: str, model: dict[str, Any], task: dict[str, Any], train: dict[str, Any],
    regularizer: dict[str, Any] | None, lr: float, seed: int,
) -> tuple[ModelConfig, TrainConfig]:  # fmt: skip
    """The model (as long as the task's sequences) and training run of an MQAR run at ``lr``."""
    from attention_atlas.train import TrainConfig

    tcfg = TrainConfig(**train, lr=lr, seed=seed, eval_test=True, progress=False,
                       measure_flops=False, effective_rank=False,
                       regularizers=[regularizer] if regularizer else [])  # fmt: skip
    return model_config(variant, {**model, "max_len": task["seq_len"]}), tcfg


def _train_mqar(
    variant: str, model: dict[str, Any], task: dict[str, Any], train: dict[str, Any],
    regularizer: dict[str, Any] | None, lr: float, seed: int,
) -> dict[str, Any]:  # fmt: skip
    """Train one arm on MQAR (data drawn from ``seed``, initialised from ``seed``) and measure:
    validation and test accuracy and loss (value positions only), training-split accuracy on
    as many rows as the validation split (the memorisation gap), the learning curve, gradient
    statistics, non-finite logits, parameters and the SSM's state size."""
    from dataclasses import replace

    from attention_atlas.experiments.cofactor.run import grad_stats
    from attention_atlas.train import evaluate
    from attention_atlas.train import train as train_model

    data = _mqar_data(json.dumps(task, sort_keys=True), seed)
    mcfg, tcfg = mqar_configs(variant, model, task, train, regularizer, lr, seed)
    norms: list[float] = []
    with quiet_no_mlp():
        res = train_model(mcfg, tcfg, data,
                          callbacks=[lambda step, info: norms.append(info["grad_norm"])])  # fmt: skip
    n = data.val_x.shape[0]
    seen = replace(data, val_x=data.train_x[:n], val_y=data.train_y[:n])
    train_acc = evaluate(res.model, seen, batch_size=tcfg.eval_batch_size)["acc"]
    hist = res.history
    acc_curve = hist["val_acc"].to_numpy(dtype=float)
    g = grad_stats(norms, tcfg.warmup_steps, 2.0)
    counts = res.record["param_counts"]
    reached = np.nonzero(acc_curve >= 0.9)[0]
    return {
        "val_acc": res.final["val_acc"], "val_loss": res.final["val_loss"],
        "test_acc": res.final["test_acc"], "test_loss": res.final["test_loss"],
        "train_acc": train_acc, "diverged": float(res.diverged is not None),
        "learning_auc": float(acc_curve.mean()) if acc_curve.size else math.nan,
        "steps_to_90": float(hist["step"].iloc[reached[0]]) if reached.size else math.nan,
        "grad_norm_var": g["grad_norm_var"], "grad_spikes": g["grad_spikes"],
        "log10_grad_var": math.log10(max(g["grad_norm_var"], 1e-30)),
        "nonfinite_logits": float(hist["nonfinite_logits"].sum()),
        "params_total": counts["total"], "params_attention": counts["attention"],
        "state_size": ssm_state_size(model["dim"], model["n_heads"], model["n_layers"])
        if variant == "ssm" else 0,
        "steps": res.final["steps"], "train_time_s": res.final["train_time_s"],
        "train_cpu_s": res.final["train_cpu_s"],
        "step_ms": 1e3 * res.final["train_time_s"] / max(res.final["steps"], 1.0),
        "history": {"step": hist["step"].tolist(), "val_acc": acc_curve.tolist(),
                    "train_loss": hist["train_loss"].tolist()},
    }  # fmt: skip


def _ptb_cell(params: dict[str, Any], seed: int) -> dict[str, Any]:
    """Train one arm on char-PTB for a fixed wall-clock budget (``schedule="time"``) and report
    validation bpc, the steps done and the time per step."""
    from attention_atlas.train import train

    tp = params["train"]
    corpus = _char_ptb()
    mcfg, tcfg = ptb_configs(params, seed)
    with quiet_no_mlp():
        res = train(mcfg, tcfg, corpus)
    steps = res.final["steps"]
    return {
        "variant": params["variant"], "val_bpc": res.final["val_bpc"],
        "steps_done": steps, "tokens_seen": steps * tp["batch_size"] * tp["seq_len"],
        "ptb_step_ms": 1e3 * res.final["train_time_s"] / max(steps, 1.0),
        "budget_s": tp["budget_s"], "diverged": float(res.diverged is not None),
    }  # fmt: skip


def ptb_configs(params: dict[str, Any], seed: int) -> tuple[ModelConfig, TrainConfig]:
    """The model and training run of a char-PTB cell: a cosine over the budget ``budget_s``."""
    from attention_atlas.train import TrainConfig

    tp = params["train"]
    reg = params["regularizer"]
    tcfg = TrainConfig(
        steps=10**7, max_time_s=tp["budget_s"], schedule="time", batch_size=tp["batch_size"],
        seq_len=tp["seq_len"], lr=tp["lr"], warmup_steps=20, log_every=10**7, seed=seed,
        eval_batches=1, final_eval_batches=tp["eval_batches"], progress=False,
        measure_flops=False, effective_rank=False, regularizers=[reg] if reg else [],
    )  # fmt: skip
    return model_config(params["variant"], params["model"]), tcfg


@functools.lru_cache(maxsize=1)
def _char_ptb() -> Any:
    from attention_atlas.data import load_char_ptb

    return load_char_ptb()


# -- the timing cell: one training step of every arm, side by side against dot --------------


def training_step(
    variant: str, model: dict[str, Any], x: Tensor, y: Tensor, cofactor: dict[str, Any], seed: int
) -> Callable[[], Tensor]:
    """One AdamW step (forward, loss, backward, update) of a fresh ``variant`` model on the batch
    ``(x, y)``, as a callable for :func:`~attention_atlas.bench.timing.compare` (gradients on even under
    its ``no_grad``). The ``"cofactor"`` arm adds its regulariser (with the probabilities)."""
    from attention_atlas.train import batch_step

    with torch.random.fork_rng(devices=[]), quiet_no_mlp():
        torch.manual_seed(seed)
        net = model_config(variant, {**model, "max_len": x.shape[1]}).build()
    regs = [{"name": "cofactor", **cofactor}] if variant == "cofactor" else []
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    return batch_step(net, opt, (x, y), regularizers=regs, need_weights=bool(regs))


def time_arm_model(params: dict[str, Any], variant: str) -> dict[str, Any]:
    """Arm ``variant``'s model in a timing cell (the task's vocabulary, the arm's own settings)."""
    model = {**params["model"], "vocab_size": int(params["task"]["vocab_size"])}
    arm = params.get("arm_model", {})
    return {**model, **arm.get(variant, {})}


def time_cell(params: dict[str, Any], seed: int) -> dict[str, Any]:
    """Median milliseconds of one training step of each arm (``<variant>_ms``) and its ratio to
    dot's (``ratio_<variant>``), timed in interleaved rounds on one MQAR batch drawn from
    ``seed``."""
    from attention_atlas.bench.timing import compare
    from attention_atlas.data import mqar_task

    task = mqar_task(**params["task"], seed=seed)
    x, y = task.train_x[: params["batch_size"]], task.train_y[: params["batch_size"]]
    fns = {v: training_step(v, time_arm_model(params, v), x, y, params["cofactor"], seed)
           for v in params["variants"]}  # fmt: skip
    res = compare(fns, "dot", (), backward=False, warmup=1, reps=params["reps"], memory=False)
    out: dict[str, Any] = {"batch_size": params["batch_size"], "seq_len": x.shape[1]}
    for v, r in res["results"].items():
        out[f"{v}_ms"] = 1e3 * r["forward"]["median_s"]
        out[f"ratio_{v}"] = r["forward"]["ratio_median"]
    return out
