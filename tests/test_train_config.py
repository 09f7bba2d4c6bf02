"""Training configurations: ``key=value`` overrides, config files, the ``train`` command."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from attention_atlas.train import build_configs

torch.set_num_threads(1)  # tiny ops on a shared 2-core machine: threads only contend


def test_overrides_route_to_model_and_train_configs():
    m, t, task = build_configs(
        {"model": {"dim": 32}, "train": {"steps": 5}},
        ["n_heads=4", "lr=1e-3", "model.attention=euclidean", "attention_options={\"tau\": 2}",
         "task.length=4", "out_dir=x", "eval_batches=null"],
    )  # fmt: skip
    assert (m.dim, m.n_heads, m.attention, m.attention_options) == (32, 4, "euclidean", {"tau": 2})
    assert (t.steps, t.lr, t.out_dir, t.eval_batches) == (5, 1e-3, "x", None)
    assert task == {"length": 4}
    with pytest.raises(ValueError, match="unknown setting 'width'"):
        build_configs({}, ["width=3"])
    with pytest.raises(ValueError, match="must look like key=value"):
        build_configs({}, ["dim"])


def test_command_line_train_prints_final_metrics_and_writes_history(tmp_path, capsys):
    from attention_atlas.__main__ import main

    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("task: copy\ntask_options: {n_train: 64, n_val: 32, length: 4}\n"
                   "model: {dim: 16, n_layers: 1, n_heads: 2}\n"
                   "train: {steps: 4, batch_size: 8, log_every: 2, progress: false, measure_flops: false}\n")  # fmt: skip
    rc = main(
        ["train", "--config", str(cfg), "--attention", "euclidean", "-o", "lr=1e-3"]
        + ["--out", str(tmp_path / "run")]
    )
    assert rc == 0
    assert "final: val_loss=" in capsys.readouterr().out
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert (
        record["model_config"]["attention"] == "euclidean" and record["train_config"]["lr"] == 1e-3
    )
    assert len(pd.read_csv(tmp_path / "run" / "history.csv")) == 2


@pytest.mark.parametrize(
    "setting,value,fragment",
    [
        ("batch_size", 0, "train setting batch_size: expected a value >= 1, got 0"),
        ("lr", float("nan"), "train setting lr: expected a finite number"),
        ("lr", 0.0, "train setting lr: expected a value > 0"),
        ("warmup_steps", -1, "train setting warmup_steps: expected a value >= 0"),
        ("eval_batches", 0, "train setting eval_batches"),
        ("grad_clip", float("inf"), "train setting grad_clip: expected a finite number"),
        ("checkpoint_every", 5, "checkpoint_every needs out_dir"),
        ("diagnostics", [{"nme": "x"}], "a diagnostic spec needs a 'name'"),
    ],
)
def test_train_refuses_a_bad_setting_before_anything_runs(setting, value, fragment):
    from attention_atlas.data import copy_task
    from attention_atlas.models import ModelConfig
    from attention_atlas.train import TrainConfig, train
    from attention_atlas.validate import ConfigError

    cfg = TrainConfig(steps=1, progress=False, **{setting: value})
    with pytest.raises(ConfigError) as err:
        train(ModelConfig(dim=8, n_layers=1, n_heads=2), cfg, copy_task(8, 8, length=2))
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_a_model_config_states_its_relations():
    from attention_atlas.models import ModelConfig

    with pytest.raises(ValueError, match="dim=10 is not divisible by n_heads=3"):
        ModelConfig(dim=10, n_heads=3)
    assert ModelConfig(dim=10, n_heads=3, head_dim=4).head_dim == 4  # explicit head width


def test_a_variant_constructor_check_is_a_config_error_before_any_work():
    from attention_atlas.attention.dot import DotProductAttention
    from attention_atlas.attention.registry import register_attention
    from attention_atlas.models import ModelConfig
    from attention_atlas.train.config import check_model
    from attention_atlas.validate import ConfigError

    @register_attention("_test_picky")
    class Picky(DotProductAttention):
        def __init__(self, dim: int, n_heads: int, width: int = 1, **kw) -> None:
            if width < 1:
                raise ValueError(f"width must be >= 1, got {width}")
            super().__init__(dim, n_heads, **kw)

    check_model(ModelConfig(dim=8, n_heads=2, attention="_test_picky"))
    bad = ModelConfig(dim=8, n_heads=2, attention="_test_picky", attention_options={"width": 0})
    with pytest.raises(ConfigError, match="model settings: width must be >= 1, got 0"):
        check_model(bad)
