"""FLOP counting of a model: the attention core, the whole model, nothing disturbed."""

from __future__ import annotations

import torch

from attention_atlas.models import ModelConfig, Transformer
from attention_atlas.train import measure_flops

torch.set_num_threads(1)  # tiny ops on a shared 2-core machine: threads only contend


def test_flop_counter_sees_the_cpu_sdpa_kernel():
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=7, dim=16, n_layers=2, n_heads=2, max_len=32)
    model = Transformer(cfg)
    x = torch.randint(0, 7, (3, 32))
    before = [p.detach().clone() for p in model.parameters()]
    f = measure_flops(model, x, x)
    b, h, length, d = 3, 2, 32, 8
    # q k^T and p v: 2 matmuls of 2 b h L^2 d flops, per layer
    assert f["forward_attention_core"] == 2 * (2 * 2 * b * h * length * length * d)
    assert f["forward_attention"] == f["forward_attention_core"] + 2 * (2 * b * length * 16 * 64)
    assert f["train_step_attention_core"] > 2 * f["forward_attention_core"]
    assert f["train_step_total"] > f["forward_total"] > f["forward_attention"]
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
    assert all(p.grad is None for p in model.parameters())
