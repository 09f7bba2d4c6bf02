"""The configuration of a training run: :class:`TrainConfig`, config files and ``key=value``
overrides (the command line's ``-o``)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from ..models import ModelConfig

__all__ = ["TrainConfig", "build_configs", "load_config_file", "parse_value", "spec_name"]


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


def spec_name(kind: str, spec: dict[str, Any]) -> str:
    """The ``name`` of a regulariser or diagnostic spec ``{"name": ..., **options}``."""
    if not isinstance(spec, dict) or "name" not in spec:
        raise ValueError(f"a {kind} spec needs a 'name', got {spec!r}")
    return str(spec["name"])


def check_run(cfg: TrainConfig) -> None:
    """The relations between settings that :func:`~attention_atlas.train.train` needs, and the
    names of the regularisers and diagnostics (all before any work starts)."""
    from ..attention.registry import get_diagnostic, get_regularizer

    if cfg.checkpoint_every and not cfg.out_dir:
        raise ValueError("checkpoint_every needs out_dir")
    if cfg.schedule not in ("steps", "time"):
        raise ValueError(f"schedule must be 'steps' or 'time', got {cfg.schedule!r}")
    if cfg.schedule == "time" and not cfg.max_time_s:
        raise ValueError("schedule='time' needs max_time_s (the budget the cosine spans)")
    for spec in cfg.regularizers:
        get_regularizer(spec_name("regularizer", spec))
    for spec in cfg.diagnostics:
        get_diagnostic(spec_name("diagnostic", spec))


# -- configs from files and the command line ------------------------------------------------------


def parse_value(text: str) -> Any:
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
        value = parse_value(val)
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
