"""SSM attention (attention/sma/module.py): the weights it reports are the SSM's kernel written
out by hand, its diagnostics are measured on them, and its recurrent step equals the forward."""

from __future__ import annotations

import pytest
import torch
from sma_inputs import F64, close, gen, randn

from attention_atlas.attention import available_attention, build_attention
from attention_atlas.attention.sma import SSD_METHODS, SSMAttention, is_row_stochastic


def ssm_module(**kw) -> SSMAttention:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    mod = build_attention("ssm", dim=12, n_heads=3, **kw).double()
    assert isinstance(mod, SSMAttention)
    with torch.no_grad():  # larger weights than an init, so the check is not trivially small
        mod.qkv.weight.normal_(0, 0.5)
        mod.dt_proj.weight.normal_(0, 0.5)
    return mod


def test_ssm_attention_is_registered_and_builds_by_name() -> None:
    assert "ssm" in available_attention()
    mod = ssm_module(chunk_size=4)
    assert mod.chunk_size == 4 and len(mod.metric_parameters()) == 3


def ssm_kernel_by_hand(mod: SSMAttention, x: torch.Tensor) -> torch.Tensor:
    """``W_ts = scale (q_t . k_s) exp(A (dt_{s+1} + ... + dt_t)) dt_s`` for ``t >= s``, 0 above,
    with ``dt = softplus(w . x + b)`` and ``A = -exp(A_log)``: loops over (t, s), no segsum."""
    q, k, _ = mod.split_heads(x)  # (B, H, L, d)
    dt = torch.nn.functional.softplus(x @ mod.dt_proj.weight.T + mod.dt_proj.bias).mT  # (B, H, L)
    A = -torch.exp(mod.A_log)[None, :]  # (1, H)
    b, h, length, _ = q.shape
    W = torch.zeros(b, h, length, length, dtype=x.dtype)
    for t in range(length):
        for s in range(t + 1):
            decay = torch.exp(A * dt[..., s + 1 : t + 1].sum(-1))  # (B, H)
            W[..., t, s] = mod.scale * (q[..., t, :] * k[..., s, :]).sum(-1) * decay * dt[..., s]
    return W


def test_is_row_stochastic_accepts_exactly_the_rows_that_are_distributions() -> None:
    P = torch.softmax(randn(2, 3, 6, 6, g=gen(22)), -1)
    assert bool(is_row_stochastic(P))
    signed = P.clone()
    signed[0, 0, 0, :2] += torch.tensor([0.5, -0.5], dtype=F64)  # sums to one, one entry < 0
    assert float(signed.sum(-1)[0, 0, 0]) == pytest.approx(1.0) and float(signed.min()) < 0
    assert not bool(is_row_stochastic(signed))
    assert not bool(is_row_stochastic(P * 1.01))  # nonnegative, rows sum to 1.01


def test_ssm_attention_weights_are_the_ssm_kernel_and_are_not_row_stochastic() -> None:
    """The materialised weights equal the kernel written out by hand, reproduce the fast output,
    and every diagnostic is the same statistic measured on the hand-made kernel."""
    mod = ssm_module(chunk_size=4)
    x = randn(2, 11, 12, g=gen(18))
    fast = mod(x, causal=True)
    slow = mod(x, causal=True, need_weights=True)
    assert fast.probs is None and slow.probs is not None
    with torch.no_grad():
        W_ref = ssm_kernel_by_hand(mod, x)
    assert slow.probs.shape == (2, 3, 11, 11) and close(slow.probs, W_ref)
    assert close(fast.out, slow.out)
    causal = torch.ones(11, 11, dtype=torch.bool).tril()
    d = slow.diagnostics
    assert float(d["weights_row_sum_mean"]) == pytest.approx(float(W_ref.sum(-1).mean()), rel=1e-10)
    negative = float((W_ref[..., causal] < 0).double().mean())
    # a fraction of counts, reported in float32
    assert float(d["weights_negative_fraction"]) == pytest.approx(negative, rel=1e-6)
    assert 0.0 < negative < 1.0  # signed weights: not a softmax
    row_error = float((W_ref.sum(-1) - 1).abs().max())
    assert row_error > 0.1  # the SSM's rows are not distributions ...
    assert float(d["row_stochastic"]) == 0.0  # ... and the diagnostic measured it
    assert float(d["nonfinite_logits"]) == 0.0
    assert fast.extras["log_a"].shape == (2, 3, 11) and bool((fast.extras["log_a"] < 0).all())


def test_ssm_attention_reports_row_stochastic_weights_when_they_are() -> None:
    """One token whose weight ``scale (q . k) dt`` is set to exactly one in every head: the
    weights are then distributions, and the diagnostic says so (it is measured, not declared)."""
    mod = ssm_module()
    x = torch.zeros(1, 1, 12, dtype=F64)
    x[..., 0] = 1.0
    dt = mod.decay(x)[0][0, 0].detach()  # (H,)
    H, d = mod.n_heads, mod.head_dim
    with torch.no_grad():
        mod.qkv.weight.zero_()
        if mod.qkv.bias is not None:
            mod.qkv.bias.zero_()
        for h in range(H):  # q_h = e_0 / (scale dt_h), k_h = e_0
            mod.qkv.weight[h * d, 0] = 1.0 / (mod.scale * dt[h])
            mod.qkv.weight[H * d + h * d, 0] = 1.0
    res = mod(x, causal=True, need_weights=True)
    assert close(res.probs, torch.ones(1, H, 1, 1, dtype=F64))
    assert float(res.diagnostics["row_stochastic"]) == 1.0


@pytest.mark.parametrize("method", SSD_METHODS)
def test_ssm_attention_step_by_step_equals_the_forward_pass(method: str) -> None:
    mod = ssm_module(chunk_size=4, method=method)
    x = randn(2, 10, 12, g=gen(19))
    full = mod(x, causal=True).out
    state, outs = None, []
    for t in range(10):
        y, state = mod.step(x[:, t], state)
        outs.append(y)
    assert close(torch.stack(outs, 1), full)
    # prefill 6 tokens, then generate the rest step by step
    pre, state = mod.forward_with_state(x[:, :6])
    assert close(pre, full[:, :6])
    for t in range(6, 10):
        y, state = mod.step(x[:, t], state)
        assert close(y, full[:, t])


def test_ssm_attention_learns_its_decay_and_refuses_non_causal_use() -> None:
    mod = ssm_module(chunk_size=4)
    x = randn(1, 9, 12, g=gen(20))
    mod(x, causal=True).out.square().sum().backward()
    for p in mod.metric_parameters():
        assert p.grad is not None and float(p.grad.abs().sum()) > 0
    with pytest.raises(ValueError, match="causal by construction"):
        mod(x, causal=False)
    with pytest.raises(ValueError, match="takes no explicit mask"):
        mod(x, causal=True, mask=torch.ones(9, 9, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"state must have shape .*got \(1, 3, 4, 5\)"):
        mod.step(x[:, 0], torch.zeros(1, 3, 4, 5, dtype=F64))


def test_ssm_attention_runs_in_the_harness_transformer() -> None:
    from attention_atlas.models import ModelConfig, Transformer

    cfg = ModelConfig(
        task="lm",
        vocab_size=20,
        dim=16,
        n_layers=2,
        n_heads=2,
        max_len=40,
        attention="ssm",
        attention_options={"chunk_size": 8},
    )
    model = Transformer(cfg)
    tokens = torch.randint(0, 20, (2, 37))
    out = model(tokens)
    assert out.logits.shape == (2, 37, 20) and torch.isfinite(out.logits).all()
    out.logits.logsumexp(-1).mean().backward()
