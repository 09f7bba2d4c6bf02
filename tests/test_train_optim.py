"""The optimiser's groups and the learning-rate schedule."""

from __future__ import annotations

import pytest
import torch

from attention_atlas.models import ModelConfig, Transformer
from attention_atlas.train import TrainConfig, lr_at, param_groups

torch.set_num_threads(1)  # tiny ops on a shared 2-core machine: threads only contend


def test_learning_rate_warms_up_linearly_then_decays_by_cosine_to_the_floor():
    cfg = TrainConfig(steps=110, warmup_steps=10, min_lr_ratio=0.1)
    assert lr_at(0, cfg) == pytest.approx(0.1) and lr_at(9, cfg) == pytest.approx(1.0)
    assert lr_at(10, cfg) == pytest.approx(1.0)
    assert lr_at(60, cfg) == pytest.approx(0.55)  # half-way: (1 + 0.1) / 2
    assert lr_at(110, cfg) == pytest.approx(0.1)


def test_no_weight_decay_on_norms_biases_and_embeddings():
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=7, dim=8, n_layers=1, n_heads=2, bias=True))
    decay, rest = param_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    assert decayed == {
        "blocks.0.attn.qkv.weight",
        "blocks.0.attn.proj.weight",
        "blocks.0.mlp.fc.weight",
        "blocks.0.mlp.proj.weight",
    }
    assert decay["weight_decay"] == 0.1 and rest["weight_decay"] == 0.0
    assert len(decay["params"]) + len(rest["params"]) == len(list(model.parameters()))


def test_metric_parameters_of_attention_variants_are_not_decayed():
    model = Transformer(ModelConfig(dim=32, n_layers=1, n_heads=2, attention="matroidal"))
    groups = param_groups(model, 0.1)
    no_decay = {id(p) for p in groups[1]["params"]}
    metric = [
        p for m in model.modules() if hasattr(m, "metric_parameters") for p in m.metric_parameters()
    ]
    assert metric and all(id(p) in no_decay for p in metric)


def test_adamw_is_fused_on_a_gpu_and_the_single_tensor_loop_on_a_cpu():
    from attention_atlas.train.loop import adamw_implementation

    assert adamw_implementation(torch.device("cuda")) == {"fused": True}
    assert adamw_implementation(torch.device("cpu")) == {"foreach": False}
    # the CPU's choice is the one every stored CPU result was made with: one step of it equals
    # a hand-written AdamW step in float64
    w = torch.nn.Parameter(torch.tensor([1.0, -2.0], dtype=torch.float64))
    opt = torch.optim.AdamW([w], lr=0.1, betas=(0.9, 0.99), weight_decay=0.01,
                            **adamw_implementation(torch.device("cpu")))  # fmt: skip
    g = torch.tensor([0.5, -0.25], dtype=torch.float64)
    w.grad = g.clone()
    opt.step()
    m, v = 0.1 * g, 0.01 * g * g
    want = torch.tensor([1.0, -2.0], dtype=torch.float64) * (1 - 0.1 * 0.01)
    want -= 0.1 * (m / 0.1) / ((v / 0.01).sqrt() + 1e-8)
    assert torch.allclose(w.detach(), want, rtol=0, atol=1e-15)
