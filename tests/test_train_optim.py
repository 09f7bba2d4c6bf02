"""The optimiser's groups and the learning-rate schedule."""

from __future__ import annotations

import pytest
import torch

from attention_atlas.models import FiberBundleConfig, ModelConfig, Transformer
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


def test_adamw_is_fused_on_a_gpu_and_the_multi_tensor_form_on_a_cpu():
    from attention_atlas.train.optim import adamw_implementation

    assert adamw_implementation(torch.device("cuda")) == {"fused": True}
    assert adamw_implementation(torch.device("cpu")) == {"foreach": True}
    # one step of the CPU's choice equals a hand-written AdamW step in float64
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


def test_adamw_on_a_cpu_gives_the_bits_of_the_single_tensor_loop_stored_results_were_made_with():
    """Three training steps of a small Fiber Bundle model (float32, weight decay on some groups,
    a warm-up schedule) with the CPU's AdamW and with ``foreach=False``: the same parameters and
    optimiser state, bit for bit."""
    from attention_atlas.train.optim import adamw_implementation

    states = []
    for kw in ({"foreach": False}, adamw_implementation(torch.device("cpu"))):
        torch.manual_seed(3)
        model = FiberBundleConfig(vocab_size=11, dim=32, n_layers=1, n_heads=2, max_len=12).build()
        opt = torch.optim.AdamW(param_groups(model, 0.1), lr=3e-3, betas=(0.9, 0.95), **kw)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: (s + 1) / 4)
        g = torch.Generator().manual_seed(4)
        for _ in range(3):
            x = torch.randint(0, 11, (2, 12), generator=g)
            loss = model(x).logits.float().logsumexp(-1).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
        states.append((model.state_dict(), opt.state_dict()["state"]))
    (pa, oa), (pb, ob) = states
    assert len(pa) > 20 and all(torch.equal(pa[k], pb[k]) for k in pa)
    assert all(torch.equal(oa[i][k], ob[i][k]) for i in oa for k in oa[i])
