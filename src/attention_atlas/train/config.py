"""The configuration of a training run: :class:`TrainConfig`, config files and ``key=value``
overrides (the command line's ``-o``)."""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from attention_atlas.models import ModelConfig
from attention_atlas.validate import (
    ConfigError,
    Fraction,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Probability,
    check_device,
    check_fields,
    close_matches,
    from_mapping,
    one_line,
)

__all__ = [
    "TrainConfig",
    "build_configs",
    "check_model",
    "check_run",
    "load_config_file",
    "parse_value",
    "spec_name",
]


@dataclass
class TrainConfig:
    """Everything about a training run except the model and the data.

    The annotations state each setting's range (:mod:`attention_atlas.validate`);
    :func:`check_run` checks them, and the relations between settings, before a run starts.
    """

    steps: PositiveInt = 1000  # optimiser steps
    batch_size: PositiveInt = 32  # global batch (sequences), split across DDP ranks
    seq_len: PositiveInt = 128  # context length for token streams (arrays keep their own length)
    lr: PositiveFloat = 3e-3  # peak learning rate
    min_lr_ratio: Probability = 0.1  # final lr = min_lr_ratio * lr (cosine decay)
    warmup_steps: NonNegativeInt = 100  # linear warm-up steps
    weight_decay: NonNegativeFloat = (
        0.1  # AdamW decay on matrices (not on norms, biases, embeddings)
    )
    beta1: Fraction = 0.9  # AdamW beta1
    beta2: Fraction = 0.95  # AdamW beta2
    grad_clip: NonNegativeFloat = 1.0  # clip the global gradient norm (0 = off)
    seed: NonNegativeInt = 0  # seeds torch, numpy, python and the data sampler
    log_every: PositiveInt = 100  # steps between log rows (and evaluations)
    eval_batches: PositiveInt | None = 8  # validation batches per log step (None = whole split)
    final_eval_batches: PositiveInt | None = (
        None  # validation batches at the end (None = whole split)
    )
    eval_batch_size: PositiveInt = 32  # sequences per evaluation batch
    eval_test: bool = False  # also evaluate on the test split at the end (where there is one)
    weights_batch: PositiveInt = 2  # sequences used for the need_weights diagnostics at log steps
    checkpoint_every: NonNegativeInt = 0  # steps between checkpoints (0 = none); needs out_dir
    out_dir: str | None = None  # where history.csv, run.json and checkpoint.pt go
    max_time_s: PositiveFloat | None = None  # stop early after this much training wall time
    schedule: str = "steps"  # cosine over `steps`, or over max_time_s of training ("time")
    deterministic: bool = True  # torch.use_deterministic_algorithms (warn only) during the run
    device: str | None = None  # default: cuda if available, else cpu
    num_threads: PositiveInt | None = None  # torch CPU threads during the run (None = leave as is)
    progress: bool = True  # tqdm progress bar (rank 0)
    measure_flops: bool = True  # count FLOPs once (FlopCounterMode) and record them
    # the training steps' forward (and so their backward) through torch.compile (inductor; on
    # CPU it needs a C++ compiler); where compiling fails, a warning and eager steps. Same
    # maths, other rounding: a compiled run is not bit-identical to an eager one
    compile: bool = False
    # the native CPU kernels of the Fiber Bundle Transformer's hot paths (attention_atlas.native;
    # built with the system's C compiler, else the PyTorch paths run). Same maths, other rounding
    native: bool = False
    effective_rank: bool = True  # log the effective rank of each layer's hidden states
    regularizers: list[dict[str, Any]] = field(default_factory=list)  # [{"name", "weight", **opts}]
    diagnostics: list[dict[str, Any]] = field(default_factory=list)  # [{"name", **opts}]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def spec_name(kind: str, spec: dict[str, Any]) -> str:
    """The ``name`` of a regulariser or diagnostic spec ``{"name": ..., **options}``."""
    if not isinstance(spec, dict) or "name" not in spec:
        raise ConfigError(f"a {kind} spec needs a 'name', got {spec!r}")
    return str(spec["name"])


def check_run(cfg: TrainConfig) -> None:
    """Every setting in its range (the annotations of :class:`TrainConfig`), the relations
    between settings, and the names of regularisers and diagnostics; before any work starts.

    Raises:
        ConfigError: one line naming the setting, what was expected and what was given.
    """
    from attention_atlas.models.hooks import available_diagnostics, available_regularizers

    check_fields(cfg, "train", TrainConfig)
    if cfg.checkpoint_every and not cfg.out_dir:
        raise ConfigError("train setting checkpoint_every needs out_dir (where checkpoints go)")
    if cfg.schedule not in ("steps", "time"):
        raise ConfigError(
            f"train setting schedule: expected 'steps' or 'time', got {cfg.schedule!r}"
        )
    if cfg.schedule == "time" and not cfg.max_time_s:
        raise ConfigError("schedule='time' needs max_time_s (the budget the cosine spans)")
    for kind, specs, known in (
        ("regularizer", cfg.regularizers, available_regularizers()),
        ("diagnostic", cfg.diagnostics, available_diagnostics()),
    ):
        for spec in specs:
            name = spec_name(kind, spec)
            if name not in known:
                raise ConfigError(
                    f"unknown {kind} {name!r}{close_matches(name, known)}; known: {', '.join(known)}"
                )
            weight = spec.get("weight", 1.0) if kind == "regularizer" else 0.0
            if isinstance(weight, bool) or not isinstance(weight, int | float):
                raise ConfigError(f"{kind} {name!r}: weight must be a number, got {weight!r}")
            if not math.isfinite(weight):
                raise ConfigError(f"{kind} {name!r}: weight must be finite, got {weight!r}")
    check_device(cfg.device, "train setting device")


def check_model(cfg: ModelConfig) -> None:
    """Every model setting in its range, the attention variant of each layer known, and its
    options ones it takes (see :func:`~attention_atlas.attention.registry.attention_options`).

    Raises:
        ConfigError: one line naming the setting, what was expected and what was given.
    """
    import inspect

    from attention_atlas.attention.registry import attention_options, available_attention

    check_fields(cfg, "model", ModelConfig)
    known = available_attention()
    for i in range(cfg.n_layers):
        name, opts = cfg.layer_spec(i)
        where = "model setting attention" if cfg.layers is None else f"model setting layers[{i}]"
        if name not in known:
            raise ConfigError(
                f"{where}: unknown attention variant {name!r}{close_matches(name, known)}; "
                f"known: {', '.join(known)}"
            )
        takes = attention_options(name)
        shared = {"dim", "n_heads", "head_dim", "bias", "dropout"}  # set from the model config
        for opt in opts:
            if opt not in takes or opt in shared:
                allowed = sorted(set(takes) - shared)
                raise ConfigError(
                    f"{where}: attention variant {name!r} does not take option {opt!r}"
                    f"{close_matches(opt, allowed)}; it takes: {', '.join(allowed) or '(none)'}"
                )
        missing = [
            n for n, p in takes.items()
            if p.default is inspect.Parameter.empty and n not in opts and n not in shared
        ]  # fmt: skip
        if missing:
            raise ConfigError(f"{where}: attention variant {name!r} needs option(s) {missing}")
    _check_builds(cfg)


def _check_builds(cfg: ModelConfig) -> None:
    """Build the model on the meta device (no memory, no data): the checks in the variants'
    constructors (an option out of range, a rank above the head width) run before any work."""
    import torch

    try:
        with torch.device("meta"):
            cfg.build()
    except (ValueError, TypeError) as err:
        raise ConfigError(f"model settings: {one_line(err)}") from None
    except Exception:  # noqa: BLE001, S110 (an op the meta device lacks: the real build reports)
        pass


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


SECTIONS = ("model", "train", "task", "task_options")


def load_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A JSON or YAML file with optional sections ``model``, ``train``, ``task``, ``task_options``.

    Raises:
        ConfigError: the file is missing, not a regular file, unreadable, not valid JSON/YAML, not a mapping, or has
            an unknown section or a section that is not a mapping (one line).
    """
    p = Path(path)
    if p.exists() and not p.is_file():  # a folder, a named pipe (reading one would wait forever)
        raise ConfigError(f"config file {p} is not a regular file")
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise ConfigError(f"config file {p} does not exist") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"config file {p} cannot be read: {err}") from None
    if p.suffix in (".yaml", ".yml"):
        import yaml

        try:
            cfg = yaml.safe_load(text) or {}
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            what = getattr(err, "problem", None) or str(err)
            raise ConfigError(f"config file {p} is not valid YAML{at}: {what}") from None
    else:
        try:
            cfg = json.loads(text)
        except json.JSONDecodeError as err:
            raise ConfigError(
                f"config file {p} is not valid JSON at line {err.lineno}, column {err.colno}: "
                f"{err.msg} (YAML files need a .yaml or .yml suffix)"
            ) from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"config file {p} must hold a mapping, got {type(cfg).__name__}")
    unknown = [k for k in cfg if k not in SECTIONS]
    if unknown:
        raise ConfigError(
            f"config file {p}: unknown section {unknown[0]!r}{close_matches(str(unknown[0]), SECTIONS)}; "
            f"expected {', '.join(SECTIONS)}"
        )
    for section in ("model", "train", "task_options"):
        if not isinstance(cfg.get(section, {}), dict):
            raise ConfigError(
                f"config file {p}: section {section!r} must be a mapping, "
                f"got {type(cfg[section]).__name__}"
            )
    if "task" in cfg and not isinstance(cfg["task"], str):
        raise ConfigError(f"config file {p}: task must be a name, got {cfg['task']!r}")
    return cfg


def build_configs(
    config: dict[str, Any], overrides: list[str]
) -> tuple[ModelConfig, TrainConfig, dict[str, Any]]:
    """Model and train configs from a config mapping plus ``key=value`` overrides; a key names a
    field of :class:`ModelConfig` or :class:`TrainConfig` (or ``model.key`` / ``train.key`` /
    ``task.key`` to be explicit). Every value is checked against its field's type and range.

    Raises:
        ConfigError: a malformed override, an unknown setting or a bad value (one line).
    """
    m = dict(config.get("model", {}))
    t = dict(config.get("train", {}))
    task_opts = dict(config.get("task_options", {}))
    mf = [f.name for f in fields(ModelConfig)]
    tf = [f.name for f in fields(TrainConfig)]
    for item in overrides:
        key, sep, val = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r} must look like key=value (e.g. -o lr=1e-3)")
        value = parse_value(val)
        section, _, name = key.strip().rpartition(".")
        if section == "model" or (not section and name in mf and name not in tf):
            m[name] = value
        elif section == "train" or (not section and name in tf):
            t[name] = value
        elif section == "task":
            task_opts[name] = value
        else:
            hint = close_matches(name, mf + tf) or (
                f"; model settings: {', '.join(mf)}; train settings: {', '.join(tf)}"
            )
            raise ConfigError(f"unknown setting {key!r}{hint}; task options as task.NAME=VALUE")
    return from_mapping(ModelConfig, m, "model"), from_mapping(TrainConfig, t, "train"), task_opts
