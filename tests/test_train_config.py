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
