"""The Fiber Bundle Transformer (phases A to E): the scores it trains on are the tested eq. (16)
function, equal to the definition for every phase combination; Phase E; training, diagnostics."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from riemannian_inputs import eq27_reference

from attention_atlas.attention import riemannian as R
from attention_atlas.attention.riemannian import modules
from attention_atlas.attention.riemannian.diagnostics import isometry_errors
from attention_atlas.attention.riemannian.regularizers import fiber_bundle_regularizers
from attention_atlas.data import TextCorpus, Vocab
from attention_atlas.linalg import metric_inverse_dense
from attention_atlas.models import PHASES, FiberBundleConfig, evaluated_at_alpha, fbt_attentions
from attention_atlas.models.fiber_bundle import fiber_bundle_diagnostic

DT = torch.float64


pytestmark = pytest.mark.usefixtures("one_thread")


TINY = {"vocab_size": 11, "dim": 16, "n_layers": 2, "n_heads": 2, "max_len": 12}


def _tiny(**kw: object) -> FiberBundleConfig:
    return FiberBundleConfig(**{**TINY, **kw})  # type: ignore[arg-type]


def _grow_metric(model: torch.nn.Module, std: float = 0.3) -> None:
    """Make every metric, transport and torsion factor clearly non-zero (init makes them ~0)."""
    g = torch.Generator().manual_seed(1)
    for m in fbt_attentions(model):
        for net in (m.metric_net, m.transport, m.torsion):
            if net is not None:
                with torch.no_grad():
                    net.fc2.weight.copy_(std * torch.randn(net.fc2.weight.shape, generator=g))
        if m.curvature is not None:
            m.curvature.beta.data.fill_(0.4)
        if m.projection is not None:
            m.projection.gamma_param.data.fill_(0.5)


@pytest.mark.parametrize("off", [None, *PHASES])
def test_every_phase_switched_off_alone_trains_with_finite_gradients(off: str | None) -> None:
    torch.manual_seed(0)
    cfg = _tiny(**({f"phase_{off}": False} if off else {}))
    model = cfg.build()
    _grow_metric(model)
    x = torch.randint(0, 11, (3, 12))
    out = model(x)
    assert out.logits.shape == (3, 12, 11)
    out.logits.logsumexp(-1).mean().backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    U = out.attentions[0].extras["metric_factor"]
    assert U.shape == (3, 2, 12, 8, 4)
    if off == "a":
        assert torch.count_nonzero(U) == 0
    else:
        assert U.abs().max() > 1e-3
    assert ("transport_a" in out.attentions[0].extras) == (off != "d")
    assert ("torsion_l" in out.attentions[0].extras) == (off != "c")
    assert ("curvature" in out.attentions[0].extras) == (off != "b")


def test_each_phase_changes_the_function_when_switched_off() -> None:
    x = torch.randint(0, 11, (2, 12), generator=torch.Generator().manual_seed(3))
    outs = {}
    for off in [None, *PHASES]:
        torch.manual_seed(0)
        model = _tiny(**({f"phase_{off}": False} if off else {})).build().double()
        _grow_metric(model)
        outs[off] = model(x).logits
    for off in PHASES:
        assert (outs[off] - outs[None]).abs().max() > 1e-6, f"phase {off} had no effect"


def _model_probs(model, x, monkeypatch) -> torch.Tensor:
    """The attention probabilities of the first block during a forward pass (the causal
    softmax the attention computes with its scores, eq. (16))."""
    seen: list[torch.Tensor] = []
    inner = modules.geodesic_scores_decomposed

    def spy(*args, **kwargs):
        out = inner(*args, **kwargs)
        assert kwargs["causal"] and kwargs["softmax"]
        seen.append(out)
        return out

    monkeypatch.setattr(modules, "geodesic_scores_decomposed", spy)
    model(x)
    monkeypatch.undo()
    return seen[0]


def _reference_logits(model, x, cfg: FiberBundleConfig) -> torch.Tensor:
    """The first block's scores from the definitions: eq. (19) MetricNet, eq. (20) projection
    (dense), eq. (21) curvature, eq. (6) dense g_ij, eq. (27) blending as printed."""
    block, attn = model.blocks[0], fbt_attentions(model)[0]
    h = block.ln_1(model.embed(x))
    q, k, _ = attn.split_heads(h)
    U = attn.metric_net(h) if cfg.phase_a else torch.zeros_like(attn.metric_net(h))
    if cfg.phase_a_plus:
        gamma = torch.sigmoid(attn.projection.gamma_param) / math.sqrt(q.shape[-1])
        q, k = (t + gamma * (U @ U.mT @ t.unsqueeze(-1)).squeeze(-1) for t in (q, k))
    omega = None
    if cfg.phase_b:
        omega = torch.nn.functional.softplus(attn.curvature.beta) * (U**2).sum((-1, -2))
    if not cfg.phase_d:  # no metric in the scores: U = 0, no curvature
        U, omega = torch.zeros_like(U), None
    return eq27_reference(q, k, U, attn.tau, attn.alpha, attn.baseline, omega)


BLENDS = [(1.0, "distance"), (0.3, "distance"), (0.3, "dot")]


@pytest.mark.parametrize(("alpha", "baseline"), BLENDS)
def test_model_attention_equals_the_definition_for_every_phase_combination(
    alpha, baseline, monkeypatch
) -> None:
    x = torch.randint(0, 11, (2, 12), generator=torch.Generator().manual_seed(4))
    for on in itertools.product([True, False], repeat=len(PHASES)):
        phases = {f"phase_{p}": flag for p, flag in zip(PHASES, on)}
        cfg = _tiny(alpha=alpha, blend_baseline=baseline, **phases)
        torch.manual_seed(0)
        model = cfg.build().double()
        _grow_metric(model)
        assert fbt_attentions(model)[0].method == "decomposed"
        got = _model_probs(model, x, monkeypatch)
        ref = _reference_logits(model, x, cfg).detach()  # the model is causal: j > i masked
        ref = ref.masked_fill(torch.ones(12, 12, dtype=torch.bool).triu(1), float("-inf"))
        torch.testing.assert_close(got, ref.softmax(-1), rtol=1e-10, atol=1e-12, msg=f"{phases}")


def test_phase_e_adds_the_inverse_metric_times_the_ffn_output() -> None:
    torch.manual_seed(0)
    model = _tiny().build().double()
    _grow_metric(model)
    block = model.blocks[0]
    x = torch.randn(2, 12, 16, dtype=DT)
    y, res = block(x, causal=True, mask=None, need_weights=False)
    h = x + res.out
    m = block.mlp(block.ln_2(h)).view(2, 12, 2, 8)
    U = res.extras["metric_factor"].permute(0, 2, 1, 3, 4)  # (B, L, H, d, r)
    ref = h + (metric_inverse_dense(U) @ m.unsqueeze(-1)).squeeze(-1).reshape(2, 12, 16)
    torch.testing.assert_close(y, ref, rtol=1e-10, atol=1e-10)


def test_materialised_path_equals_the_riemannian_fast_path() -> None:
    torch.manual_seed(0)
    fast = _tiny(method="lowrank", alpha=0.7).build().double()
    slow = _tiny(method="decomposed", alpha=0.7).build().double()
    _grow_metric(fast)
    slow.load_state_dict(fast.state_dict())
    x = torch.randint(0, 11, (2, 12))
    torch.testing.assert_close(fast(x).logits, slow(x).logits, rtol=1e-9, atol=1e-9)


def test_alpha_is_set_for_evaluation_and_restored() -> None:
    model = _tiny(alpha=0.5).build()
    with evaluated_at_alpha(model, 0.0):
        assert all(m.alpha == 0.0 for m in fbt_attentions(model))
    assert all(m.alpha == 0.5 for m in fbt_attentions(model))


def test_diagnostic_logs_metric_curvature_transport_and_alpha() -> None:
    torch.manual_seed(0)
    model = _tiny().build()
    _grow_metric(model)
    model.eval()
    out = model(torch.randint(0, 11, (2, 12)), need_weights=True)
    row = fiber_bundle_diagnostic(model, out, None, kappa_min=0.1, kappa_max=1.0)
    for layer in ("l0", "l1"):
        for key in ("kappa_mean", "kappa_max", "kappa_var", "omega_mean", "omega_max", "omega_std",
                    "iso_linear", "iso_cayley", "delta_fro", "sigma2", "anti", "div", "smooth", "cap",
                    "l2", "gamma", "gamma_T", "beta_scale", "kappa_max_over_tau_L"):  # fmt: skip
            assert f"{layer}/{key}" in row, key
            assert math.isfinite(row[f"{layer}/{key}"]), key
    assert row["alpha"] == 1.0
    U = out.attentions[1].extras["metric_factor"].detach().double()
    kappa = (U**2).sum((-1, -2))  # (B, H, L)
    assert row["l1/kappa_mean"] == pytest.approx(float(kappa.mean()), rel=1e-5)
    assert row["l1/kappa_max"] == pytest.approx(float(kappa.max()), rel=1e-5)
    assert row["l1/kappa_var"] == pytest.approx(
        float(kappa.var(-1, unbiased=False).mean()), rel=1e-4
    )
    tau = fbt_attentions(model)[1].tau
    assert row["l1/kappa_max_over_tau_L"] == pytest.approx(row["l1/kappa_max"] * 12 / tau)
    sigma = torch.linalg.svdvals(out.attentions[1].probs.detach().double())[..., 1].mean()
    assert row["l1/sigma2"] == pytest.approx(float(sigma))
    assert row["l0/iso_cayley"] < 1e-10 < row["l0/iso_linear"]


def test_isometry_error_of_linear_transport_is_delta_t_delta() -> None:
    torch.manual_seed(0)
    a, b = torch.randn(5, 6, 2, dtype=DT), torch.randn(5, 6, 2, dtype=DT)
    err = isometry_errors(a, b)
    delta = R.transport_dense(a, b) - torch.eye(6, dtype=DT)
    expect = (delta.transpose(-1, -2) @ delta).pow(2).sum((-1, -2)).sqrt().mean()  # eq. (25)
    assert err["iso_linear"] == pytest.approx(float(expect), rel=1e-10)
    assert err["iso_cayley"] < 1e-12
    assert err["delta_fro"] == pytest.approx(float(delta.pow(2).sum((-1, -2)).sqrt().mean()))


def _toy_corpus() -> TextCorpus:
    text = ("the_cat_sat_on_the_mat_" * 200).replace("", " ").split()
    vocab = Vocab(sorted(set(text)))
    ids = vocab.encode(text)
    return TextCorpus("toy", ids[:3000], ids[3000:3800], ids[3800:], vocab)


def test_fiber_bundle_transformer_trains_through_the_harness_and_learns_context() -> None:
    from attention_atlas.train import TrainConfig, train

    data = _toy_corpus()
    regs = fiber_bundle_regularizers("three", steps=30, kappa_min=0.05, kappa_max=0.5)
    tcfg = TrainConfig(steps=30, batch_size=8, seq_len=16, lr=1e-2, warmup_steps=3, log_every=10,
                       eval_batches=2, final_eval_batches=2, progress=False, measure_flops=False,
                       regularizers=regs, diagnostics=[{"name": "fiber_bundle"}])  # fmt: skip
    res = train(FiberBundleConfig(dim=16, n_layers=1, n_heads=2, max_len=16), tcfg, data)
    h = res.history
    assert h["train_loss"].iloc[-1] < h["train_loss"].iloc[0]
    # better than the unigram entropy of the text (what a model ignoring context can reach)
    counts = torch.bincount(torch.as_tensor(data.valid), minlength=data.vocab_size).double()
    p = counts[counts > 0] / counts.sum()
    unigram_bits = float(-(p * p.log2()).sum())
    assert res.final["val_bpc"] < unigram_bits - 0.25
    assert int(res.model.train_step) == 30
    for col in ("reg/fiber_bundle", "fiber_bundle/l0/kappa_mean", "fiber_bundle/l0/iso_linear",
                "fiber_bundle/alpha"):  # fmt: skip
        assert col in h.columns
    # the anti-flatness floor lifted the metric from its near-zero start
    assert h["fiber_bundle/l0/kappa_mean"].iloc[-1] > 0.01


@pytest.mark.parametrize("phases", [{}, {"phase_c": False}, {"phase_d": False}])
def test_transport_and_torsion_in_one_pass_equal_them_one_at_a_time(phases, monkeypatch) -> None:
    # the fused path (skew_factors_apply) against transport_apply then torsion_apply: the
    # model's loss, every parameter's gradient and the factors in the extras, in float64
    x = torch.randint(0, 11, (2, 12), generator=torch.Generator().manual_seed(5))
    runs = []
    for separate in (False, True):
        torch.manual_seed(0)
        model = _tiny(**phases).build().double()
        _grow_metric(model)
        with torch.no_grad():
            for m in fbt_attentions(model):
                if m.torsion_gate is not None:
                    m.torsion_gate.fill_(0.8)  # a gate far from its initial value
        if separate:
            monkeypatch.setattr(modules.RiemannianAttention, "_transport",
                                modules.RiemannianAttention._transport_separately)  # fmt: skip
        out = model(x)
        out.logits.logsumexp(-1).mean().backward()
        monkeypatch.undo()
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        runs.append((out, grads))
    (fused, g_fused), (sep, g_sep) = runs
    torch.testing.assert_close(fused.logits, sep.logits, rtol=1e-12, atol=1e-12)
    assert g_fused.keys() == g_sep.keys() and any("torsion" in n or "transport" in n for n in g_sep)
    for name in g_sep:
        torch.testing.assert_close(g_fused[name], g_sep[name], rtol=1e-10, atol=1e-12, msg=name)
    extras_f, extras_s = fused.attentions[0].extras, sep.attentions[0].extras
    assert extras_f.keys() == extras_s.keys()
    for key in extras_s:
        torch.testing.assert_close(extras_f[key], extras_s[key], rtol=0, atol=0, msg=key)
