"""The Transformer: heads, shapes, per-layer and per-head attention, parameter counts."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attention_atlas.attention import Attention, register_attention
from attention_atlas.attention.dot import DotProductAttention
from attention_atlas.attention.euclidean import EuclideanAttention
from attention_atlas.attention.mixed import MixedHeadAttention
from attention_atlas.models import ModelConfig, Transformer, attention_modules, param_counts

torch.set_num_threads(1)  # tiny ops on a shared 2-core machine: threads only contend


@register_attention("_test_scaled_dot")
class ScaledDot(DotProductAttention):
    """Dot product with a learned per-head scale: a stand-in for a variant with geometry."""

    def __init__(self, dim: int, n_heads: int, **kwargs) -> None:
        super().__init__(dim, n_heads, **kwargs)
        self.log_scale = nn.Parameter(torch.zeros(n_heads))

    def attend(self, q, k, v, **kw):
        return super().attend(q * self.log_scale.exp()[:, None, None], k, v, **kw)

    def metric_parameters(self) -> list[nn.Parameter]:
        return [self.log_scale]


def lm(**kw) -> Transformer:
    torch.manual_seed(0)
    cfg = dict(vocab_size=11, dim=16, n_layers=2, n_heads=4, max_len=12)
    cfg.update(kw)
    return Transformer(ModelConfig(**cfg))


def test_lm_output_shapes_and_hidden_states():
    model = lm()
    x = torch.randint(0, 11, (3, 9))
    out = model(x)
    assert out.logits.shape == (3, 9, 11)
    assert len(out.hidden) == 3 and all(h.shape == (3, 9, 16) for h in out.hidden)
    assert len(out.attentions) == 2 and all(a.probs is None for a in out.attentions)
    out = model(x, need_weights=True)
    assert all(a.probs is not None and a.probs.shape == (3, 4, 9, 9) for a in out.attentions)


def test_lm_is_causal_a_future_token_does_not_change_past_logits():
    model = lm()
    x = torch.randint(0, 11, (1, 9))
    y = x.clone()
    y[0, 6] = (y[0, 6] + 1) % 11
    a, b = model(x).logits, model(y).logits
    torch.testing.assert_close(a[:, :6], b[:, :6], atol=0, rtol=0)
    assert not torch.allclose(a[:, 6:], b[:, 6:])


def test_token_shift_adds_the_previous_positions_embedding_through_a_learned_map():
    model = lm(token_shift=True).double()
    x = torch.randint(0, 11, (2, 7))
    e = model.tok_emb.weight[x] + model.pos_emb[0, :7]  # (B, L, D)
    W = model.shift.weight
    expect = e.clone()
    for t in range(1, 7):  # h_t = e_t + W e_{t-1}; h_0 = e_0
        expect[:, t] += e[:, t - 1] @ W.T
    torch.testing.assert_close(model.embed(x), expect, atol=1e-12, rtol=0)
    y = x.clone()  # still causal: a change at position 4 moves logits from 4 on only
    y[0, 4] = (y[0, 4] + 1) % 11
    a, b = model(x).logits, model(y).logits
    torch.testing.assert_close(a[:, :4], b[:, :4], atol=0, rtol=0)
    assert not torch.allclose(a[0, 5], b[0, 5])  # position 5 sees 4 through the shift too
    plain = param_counts(lm())["total"]
    assert param_counts(lm(token_shift=True))["total"] == plain + 16 * 16
    assert lm(token_shift=False).shift is None


@pytest.mark.parametrize("pool", ["mean", "cls"])
def test_classifier_output_shapes(pool):
    torch.manual_seed(0)
    cfg = ModelConfig(
        task="classify", n_classes=10, patch_dim=4, dim=16, n_heads=2, max_len=16, pool=pool
    )
    model = Transformer(cfg)
    out = model(torch.randn(5, 16, 4), need_weights=True)
    assert out.logits.shape == (5, 10)
    n_tok = 17 if pool == "cls" else 16
    assert out.hidden[-1].shape == (5, n_tok, 16)
    assert out.attentions[0].probs is not None and out.attentions[0].probs.shape == (
        5,
        2,
        n_tok,
        n_tok,
    )
    # bidirectional: the first token attends to the last
    assert float(out.attentions[0].probs[0, 0, 0, -1].detach()) > 0


def test_tied_embeddings_share_one_matrix_and_count_once():
    tied, untied = lm(tie_embeddings=True), lm(tie_embeddings=False)
    assert tied.head.weight is tied.tok_emb.weight
    assert param_counts(untied)["total"] - param_counts(tied)["total"] == 11 * 16


def test_per_layer_attention_specs():
    model = lm(layers=[{"name": "dot"}, {"name": "euclidean", "tau": 3.0}])
    mods = attention_modules(model)
    assert isinstance(mods[0], DotProductAttention) and isinstance(mods[1], EuclideanAttention)
    assert mods[1].tau == 3.0
    assert model(torch.randint(0, 11, (2, 5))).logits.shape == (2, 5, 11)


def test_a_variant_in_some_heads_only():
    spec = {
        "name": "mixed",
        "groups": [{"name": "dot", "heads": 2}, {"name": "euclidean", "heads": 2}],
    }
    model = lm(layers=[{"name": "dot"}, spec])
    mods = attention_modules(model)
    assert isinstance(mods[1], MixedHeadAttention)
    out = model(torch.randint(0, 11, (2, 5)), need_weights=True)
    assert out.attentions[1].probs is not None and out.attentions[1].probs.shape == (2, 4, 5, 5)
    # same parameters as an all-dot model: mixing heads adds no projections
    assert param_counts(model) == param_counts(lm())


def test_param_counts_split_total_attention_metric():
    model = lm(attention="_test_scaled_dot")
    counts = param_counts(model)
    assert counts["total"] == sum(p.numel() for p in model.parameters())
    per_layer_attn = 3 * 16 * 16 + 16 * 16 + 4  # qkv, proj, log_scale
    assert counts["attention"] == 2 * per_layer_attn
    assert counts["metric"] == 2 * 4
    assert param_counts(lm())["metric"] == 0


def test_metric_parameters_of_mixed_layers_are_the_union_of_their_groups():
    spec = {
        "name": "mixed",
        "groups": [{"name": "_test_scaled_dot", "heads": 1}, {"name": "dot", "heads": 3}],
    }
    model = lm(layers=[spec, {"name": "dot"}])
    assert param_counts(model)["metric"] == 1


def test_attention_options_reach_the_variant():
    model = lm(attention="euclidean", attention_options={"tau": 7.0})
    assert all(isinstance(m, Attention) and m.tau == 7.0 for m in attention_modules(model))  # type: ignore[attr-defined]


def test_config_errors_are_clear():
    with pytest.raises(ValueError, match="task must be"):
        ModelConfig(task="seq2seq")
    with pytest.raises(ValueError, match="layers has 1 entries but n_layers=2"):
        ModelConfig(n_layers=2, layers=[{"name": "dot"}])
    with pytest.raises(ValueError, match=r"layers\[0\] must be a dict with a 'name'"):
        ModelConfig(n_layers=1, layers=[{"tau": 1.0}])
    with pytest.raises(ValueError, match="max_len=12"):
        lm()(torch.zeros(1, 13, dtype=torch.long))
    with pytest.raises(ValueError, match="integer token ids"):
        lm()(torch.zeros(1, 5))


def test_gradients_reach_every_parameter():
    model = lm(attention="_test_scaled_dot", dropout=0.1)
    x = torch.randint(0, 11, (2, 6))
    model(x).logits.sum().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
