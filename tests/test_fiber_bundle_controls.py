"""The controls of chapter 4, each doing what it says: the dot-product model at another attention
temperature (P5), MetricNet trained on noise instead of the task gradient (P3), the l2 penalty
matched to the task gradient (P3), the query and key a Riemannian layer reports for Proposition
3.5's scale (P1), and the attention entropy the P5 control is matched on."""

from __future__ import annotations

import math

import pytest
import torch
from riemannian_inputs import DT, TOL, eq27_reference, rel

from attention_atlas.attention import build_attention
from attention_atlas.attention.dot import explicit_attention
from attention_atlas.attention.riemannian.diagnostics import perturbation_entry_scale
from attention_atlas.data import TextCorpus, Vocab
from attention_atlas.experiments.fiber_bundle import run as fb
from attention_atlas.experiments.fiber_bundle.analysis import attention_entropy
from attention_atlas.models import FiberBundleConfig, ModelConfig, metric_factors
from attention_atlas.train import TrainConfig, train

pytestmark = pytest.mark.usefixtures("one_thread")


# -- the dot-product model at temperature T (P5) ---------------------------------------------


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("temperature", [0.25, 1.0, 3.0])
def test_dot_attention_at_temperature_t_is_softmax_of_qk_over_sqrt_d_t(need_weights, temperature):
    torch.manual_seed(0)
    attn = build_attention("dot", dim=12, n_heads=3, temperature=temperature).double()
    x = torch.randn(2, 9, 12, dtype=DT)
    res = attn(x, causal=True, need_weights=need_weights)
    q, k, v = attn.split_heads(x)
    ref, probs, _ = explicit_attention(q, k, v, scale=1 / (2.0 * temperature), causal=True)  # d = 4
    expected = attn.proj(ref.transpose(1, 2).reshape(2, 9, 12))
    assert rel(res.out, expected) < TOL
    if need_weights:
        assert rel(res.probs, probs) < TOL


def test_dot_attention_at_temperature_one_is_the_standard_model_bit_for_bit():
    torch.manual_seed(1)
    plain = build_attention("dot", dim=16, n_heads=2)
    torch.manual_seed(1)
    tempered = build_attention("dot", dim=16, n_heads=2, temperature=1.0)
    x = torch.randn(3, 10, 16)
    for w in (False, True):
        assert torch.equal(plain(x, causal=True, need_weights=w).out,
                           tempered(x, causal=True, need_weights=w).out)  # fmt: skip


def test_lower_temperature_gives_lower_attention_entropy():
    torch.manual_seed(2)
    x = torch.randn(2, 12, 16, dtype=DT)
    ents = []
    for t in (4.0, 1.0, 0.5, 0.25):
        torch.manual_seed(3)  # the same weights at every temperature
        attn = build_attention("dot", dim=16, n_heads=2, temperature=t).double()
        probs = attn(x, causal=True, need_weights=True).probs.detach()
        ents.append(float(attention_entropy(probs).mean()))
    assert all(a > b for a, b in zip(ents, ents[1:])), ents


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan])
def test_dot_attention_rejects_a_temperature_that_is_not_positive_and_finite(bad):
    with pytest.raises(ValueError, match="temperature must be a positive finite number"):
        build_attention("dot", dim=8, n_heads=2, temperature=bad)


def test_attention_entropy_of_uniform_causal_rows_and_of_one_hot_rows():
    L = 6
    uniform = torch.tril(torch.ones(L, L, dtype=DT))
    uniform = uniform / uniform.sum(-1, keepdim=True)
    expected = sum(math.log(i + 1) for i in range(L)) / L
    assert float(attention_entropy(uniform)) == pytest.approx(expected, rel=1e-14)
    assert float(attention_entropy(torch.eye(L, dtype=DT))) == 0.0


# -- MetricNet trained on noise (P3's control) -------------------------------------------------

TINY = {"vocab_size": 11, "dim": 16, "n_layers": 2, "n_heads": 2, "max_len": 12,
        "metric_init_std": 0.5}  # fmt: skip


def _pair(**kw):
    """The same Fiber Bundle weights with the task's gradient and with the noise control."""
    torch.manual_seed(0)
    task = FiberBundleConfig(**TINY, **kw).build().double()
    torch.manual_seed(0)
    noise = FiberBundleConfig(**TINY, metric_gradient="noise", **kw).build().double()
    return task, noise


def _metric_grads(model, block=None):
    blocks = model.blocks if block is None else [model.blocks[block]]
    return torch.cat([p.grad.reshape(-1) for b in blocks for p in b.attn.metric_net.parameters()])


def test_noise_control_computes_the_same_function_in_float64():
    task, noise = _pair()
    x = torch.randint(0, 11, (2, 12))
    a, b = task(x, need_weights=True), noise(x, need_weights=True)
    assert torch.equal(a.logits, b.logits)
    assert all(torch.equal(p, q) for p, q in zip(a.attentions[0].probs, b.attentions[0].probs))


def test_noise_control_gives_metricnet_no_task_information_and_the_rest_the_task_gradient():
    """Two unrelated losses, the same noise draws: each block's MetricNet gradient points the
    same way (only its size follows the task gradient); every other parameter gets the task
    gradient."""
    task, noise = _pair()
    x = torch.randint(0, 11, (3, 12))
    grads = []
    for loss_fn in (lambda o: o.logits.sum(), lambda o: (o.logits[:, 3:] ** 3).mean()):
        noise.zero_grad()
        torch.manual_seed(5)
        loss_fn(noise(x)).backward()
        grads.append([_metric_grads(noise, b) for b in range(2)])
    for g0, g1 in zip(*grads):
        assert float(g0 @ g1 / (g0.norm() * g1.norm())) == pytest.approx(1.0, abs=1e-12)
    task.zero_grad()
    noise.zero_grad()
    task(x).logits.sum().backward()
    noise(x).logits.sum().backward()
    cos_task = float(_metric_grads(task) @ _metric_grads(noise)
                     / (_metric_grads(task).norm() * _metric_grads(noise).norm()))  # fmt: skip
    assert abs(cos_task) < 0.5  # the noise is not the task's direction
    metric_ids = {id(p) for b in task.blocks for p in b.attn.metric_net.parameters()}
    for (name, p), q in zip(task.named_parameters(), noise.parameters()):
        if id(p) not in metric_ids and p.grad is not None:
            assert rel(q.grad, p.grad) < TOL, name


def test_noise_reaching_u_has_zero_mean_and_the_task_gradients_size():
    torch.manual_seed(0)
    attn = build_attention("riemannian", dim=16, n_heads=2, rank=4, metric_init_std=0.5,
                           metric_gradient="noise").double()  # fmt: skip
    x = torch.randn(4, 32, 16, dtype=DT)
    seen = {}

    def keep(name):
        return lambda g: seen.__setitem__(name, g)

    outputs = []
    attn.metric_net.register_forward_hook(lambda m, i, o: outputs.append(o))
    res = attn(x, causal=True)
    outputs[0].register_hook(keep("noise"))  # what MetricNet's weights receive (its first call)
    res.extras["metric_factor"].register_hook(keep("task"))  # the task's, before the noise
    res.out.pow(2).sum().backward()
    task, noisy = seen["task"], seen["noise"]
    assert float(noisy.pow(2).mean().sqrt()) == pytest.approx(
        float(task.pow(2).mean().sqrt()), rel=1e-12
    )
    z = float(noisy.mean() / (noisy.std() / math.sqrt(noisy.numel())))
    assert abs(z) < 4.0  # the mean of n standard normals is within 4 / sqrt(n) of zero
    assert abs(float((task * noisy).sum() / (task.norm() * noisy.norm()))) < 0.2


def test_metric_gradient_must_be_task_or_noise():
    with pytest.raises(ValueError, match="metric_gradient must be one of"):
        build_attention("riemannian", dim=8, n_heads=2, metric_gradient="detached")


# -- the task-matched l2 weight (P3) -----------------------------------------------------------


def _toy_corpus() -> TextCorpus:
    text = list("ab_ab._abba_\n" * 40)
    vocab = Vocab(sorted(set(text)))
    ids = vocab.encode(text)
    return TextCorpus("toy", ids[:300], ids[300:], ids[300:], vocab)


def test_matched_l2_weight_equates_the_penalty_and_task_gradient_norms_on_u():
    """One block, so that the penalty's gradient on U is its own, 2 U / (number of tokens and
    heads) (with more blocks U of one block also moves the next block's U)."""
    data = _toy_corpus()
    torch.manual_seed(0)
    model = FiberBundleConfig(**{**TINY, "vocab_size": data.vocab_size, "n_layers": 1}).build()
    model = model.double()
    lam = fb.matched_l2_weight(model, data, seq_len=12, batch_size=4)
    x = torch.as_tensor(data.train[:48]).view(4, 12)
    y = torch.as_tensor(data.train[1:49]).view(4, 12)
    out = model(x)
    Us = metric_factors(out)
    loss = torch.nn.functional.cross_entropy(out.logits.reshape(-1, data.vocab_size), y.reshape(-1))
    task = torch.autograd.grad(loss, Us)
    # d/dU of (1/n_layers) sum_l mean_t |U_t|_F^2 is 2 U / (n_layers * number of tokens and heads)
    analytic = [2 * U / (len(Us) * U.shape[:3].numel()) for U in Us]
    norm = lambda gs: math.sqrt(sum(float(g.detach().pow(2).sum()) for g in gs))  # noqa: E731
    assert lam * norm(analytic) == pytest.approx(norm(task), rel=1e-6)  # the loss is float32


# -- what a Riemannian layer reports for P1 -----------------------------------------------------


def test_query_and_key_reported_with_weights_are_those_of_the_scores():
    torch.manual_seed(4)
    attn = build_attention("fiber_bundle", dim=16, n_heads=2, rank=2, metric_init_std=0.7,
                           metric_projection=True, curvature=True).double()  # fmt: skip
    with torch.no_grad():
        attn.projection.gamma_param.fill_(1.0)  # A++ changes q and k visibly
    x = torch.randn(2, 8, 16, dtype=DT)
    res = attn(x, causal=False, need_weights=True)
    q, k, U, om = (res.extras[n] for n in ("query", "key", "metric_factor", "curvature"))
    logits = eq27_reference(q, k, U, attn.tau, 1.0, "distance", om)
    assert rel(res.probs, torch.softmax(logits, -1)) < TOL
    assert "query" not in attn(x, causal=False).extras  # only when the weights are asked for
    scale = perturbation_entry_scale(q, k, U, attn.tau)
    assert scale.shape == (2, 2) and bool((scale > 0).all())


# -- the initial model of a cell is the one training starts from ------------------------------


def test_initial_model_is_the_model_train_starts_from():
    data = _toy_corpus()
    cfg = FiberBundleConfig(**{**TINY, "vocab_size": data.vocab_size})
    initial = fb._initial_model(cfg, data, seed=3, seq_len=12)
    tc = TrainConfig(steps=1, batch_size=2, seq_len=12, lr=1e-12, warmup_steps=0, log_every=1,
                     eval_batches=1, final_eval_batches=1, seed=3, progress=False,
                     measure_flops=False, weight_decay=0.0)  # fmt: skip
    trained = train(cfg, tc, data).model
    for (name, p), q in zip(initial.named_parameters(), trained.parameters()):
        assert torch.allclose(q, p, rtol=1e-8, atol=1e-10), name  # one step of lr 1e-12
    torch.manual_seed(99)  # another seed gives other weights
    other = fb._initial_model(cfg, data, seed=4, seq_len=12)
    assert rel(next(other.parameters()), next(initial.parameters())) > 1e-3


def test_dot_temperature_arm_builds_the_tempered_dot_model():
    grid = fb.chapter_grid(dot_temperatures=(0.5,))
    cfg = ModelConfig(**grid["dot_temp-0.5"]["model"])
    assert cfg.build().blocks[0].attn.temperature == 0.5
    assert grid["dot_temp-0.5"]["train"] == grid["dot"]["train"]
