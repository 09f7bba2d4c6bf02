"""The Fiber Bundle Transformer (phases A to E), its regulariser schedule, diagnostics, and the
resumable sweep runner."""

from __future__ import annotations

import math

import pytest
import torch

from attention_atlas.attention.riemannian import geodesic_scores, hybrid_scores, transport_dense
from attention_atlas.data import TextCorpus, Vocab
from attention_atlas.fiber_bundle import (
    PHASES,
    FiberBundleConfig,
    RegularizerSchedule,
    evaluated_at_alpha,
    fbt_attentions,
    fiber_bundle_diagnostic,
    fiber_bundle_regularizers,
    geodesic_distance_sq,
    isometry_errors,
    token_types,
)
from attention_atlas.linalg import metric_inverse_dense
from attention_atlas.sweep import Cell, load_results, run_sweep


@pytest.fixture(autouse=True)
def _one_thread():
    """Small tensors: one intra-op thread is faster, and much faster on a loaded machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


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


def test_scores_equal_the_riemannian_hybrid_reference_in_float64() -> None:
    torch.manual_seed(0)
    model = _tiny(tau=1.7).build().double()
    attn = fbt_attentions(model)[0]
    q, k = (
        torch.randn(2, 2, 12, 8, dtype=torch.float64),
        torch.randn(2, 2, 12, 8, dtype=torch.float64),
    )
    U = 0.5 * torch.randn(2, 2, 12, 8, 4, dtype=torch.float64)
    om = torch.rand(2, 2, 12, dtype=torch.float64)
    for alpha in (1.0, 0.3):
        for base in ("distance", "dot"):
            attn.alpha, attn.baseline = alpha, base
            ref = hybrid_scores(q, k, U, 1.7, alpha, baseline=base, curvature=om)  # type: ignore[arg-type]
            torch.testing.assert_close(attn.scores(q, k, U, om), ref, rtol=1e-10, atol=1e-10)


def test_geodesic_distance_sq_equals_reference_and_passes_gradcheck() -> None:
    torch.manual_seed(0)
    q, k = torch.randn(2, 5, 3, dtype=torch.float64), torch.randn(2, 5, 3, dtype=torch.float64)
    U = torch.randn(2, 5, 3, 2, dtype=torch.float64)
    torch.testing.assert_close(
        geodesic_distance_sq(q, k, U), -geodesic_scores(q, k, U, 1.0), rtol=1e-12, atol=1e-12
    )
    args = tuple(t.clone().requires_grad_() for t in (q, k, U))
    assert torch.autograd.gradcheck(geodesic_distance_sq, args)


def test_phase_e_adds_the_inverse_metric_times_the_ffn_output() -> None:
    torch.manual_seed(0)
    model = _tiny().build().double()
    _grow_metric(model)
    block = model.blocks[0]
    x = torch.randn(2, 12, 16, dtype=torch.float64)
    y, res = block(x, causal=True, mask=None, need_weights=False)
    h = x + res.out
    m = block.mlp(block.ln_2(h)).view(2, 12, 2, 8)
    U = res.extras["metric_factor"].permute(0, 2, 1, 3, 4)  # (B, L, H, d, r)
    ref = h + (metric_inverse_dense(U) @ m.unsqueeze(-1)).squeeze(-1).reshape(2, 12, 16)
    torch.testing.assert_close(y, ref, rtol=1e-10, atol=1e-10)


def test_regularizer_schedule_is_strong_early_and_relaxed_later() -> None:
    s = RegularizerSchedule(steps=100, anti=2.0, div=1.0, smooth=0.5, cap=3.0, l2=0.0,
                            relax_start=0.2, relax_end=0.6, relax_to=0.1)  # fmt: skip
    assert s.factor(0) == 1.0 and s.factor(20) == 1.0
    assert s.factor(40) == pytest.approx(0.55)  # half-way down the half cosine
    assert s.factor(60) == pytest.approx(0.1) and s.factor(99) == pytest.approx(0.1)
    assert all(s.factor(t) >= s.factor(t + 1) for t in range(100))
    w0, w1 = s.weights(0), s.weights(99)
    assert w0 == {"anti": 2.0, "div": 1.0, "smooth": 0.5, "cap": 3.0, "l2": 0.0}
    assert w1["anti"] == pytest.approx(0.2) and w1["div"] == pytest.approx(0.1)
    assert w1["smooth"] == 0.5 and w1["cap"] == 3.0
    with pytest.raises(ValueError, match="relax_start"):
        RegularizerSchedule(relax_start=0.8, relax_end=0.2).factor(1)


def test_regularizer_kinds_and_clear_errors() -> None:
    assert fiber_bundle_regularizers("none", steps=5, kappa_min=0.1, kappa_max=1.0) == []
    (l2,) = fiber_bundle_regularizers("l2", steps=5, kappa_min=0.1, kappa_max=1.0)
    assert l2["l2"] == 1.0 and "anti" not in l2
    (three,) = fiber_bundle_regularizers("three", steps=5, kappa_min=0.1, kappa_max=1.0)
    assert {"anti", "div", "smooth", "cap"} <= set(three) and "l2" not in three
    with pytest.raises(ValueError, match="kind"):
        fiber_bundle_regularizers("four", steps=5, kappa_min=0.1, kappa_max=1.0)
    with pytest.raises(ValueError, match="transport_kind"):
        _tiny(transport_kind="exp")


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
    assert row["l0/kappa_max"] >= row["l0/kappa_mean"] > 0
    assert row["l0/iso_cayley"] < 1e-10 < row["l0/iso_linear"]


def test_isometry_error_of_linear_transport_is_delta_t_delta() -> None:
    torch.manual_seed(0)
    a, b = torch.randn(5, 6, 2, dtype=torch.float64), torch.randn(5, 6, 2, dtype=torch.float64)
    err = isometry_errors(a, b)
    delta = transport_dense(a, b) - torch.eye(6, dtype=torch.float64)
    expect = (delta.transpose(-1, -2) @ delta).pow(2).sum((-1, -2)).sqrt().mean()  # eq. (25)
    assert err["iso_linear"] == pytest.approx(float(expect), rel=1e-10)
    assert err["iso_cayley"] < 1e-12


def test_alpha_is_set_for_evaluation_and_restored() -> None:
    model = _tiny(alpha=0.5).build()
    with evaluated_at_alpha(model, 0.0):
        assert all(m.alpha == 0.0 for m in fbt_attentions(model))
    assert all(m.alpha == 0.5 for m in fbt_attentions(model))


def test_token_types_split_letters_into_word_initial_and_internal() -> None:
    itos = ["\n", "N", "_", "a", "b", "."]
    x = torch.tensor([[3, 4, 2, 3, 4, 5, 0, 3, 1]])  # "ab_ab.\naN"
    codes = token_types(x, itos).tolist()[0]
    assert codes == [-1, 1, 2, 0, 1, 5, 3, 0, 4]


def _toy_corpus() -> TextCorpus:
    text = ("the_cat_sat_on_the_mat_" * 200).replace("", " ").split()
    vocab = Vocab(sorted(set(text)))
    ids = vocab.encode(text)
    return TextCorpus("toy", ids[:3000], ids[3000:3800], ids[3800:], vocab)


def test_fiber_bundle_transformer_trains_through_the_harness_and_loss_decreases() -> None:
    from attention_atlas.train import TrainConfig, train

    data = _toy_corpus()
    regs = fiber_bundle_regularizers("three", steps=30, kappa_min=0.05, kappa_max=0.5)
    tcfg = TrainConfig(steps=30, batch_size=8, seq_len=16, lr=1e-2, warmup_steps=3, log_every=10,
                       eval_batches=2, final_eval_batches=2, progress=False, measure_flops=False,
                       regularizers=regs, diagnostics=[{"name": "fiber_bundle"}])  # fmt: skip
    res = train(FiberBundleConfig(dim=16, n_layers=1, n_heads=2, max_len=16), tcfg, data)
    h = res.history
    assert h["train_loss"].iloc[-1] < h["train_loss"].iloc[0]
    assert res.final["val_bpc"] < math.log2(data.vocab_size)
    assert int(res.model.train_step) == 30
    for col in ("reg/fiber_bundle", "fiber_bundle/l0/kappa_mean", "fiber_bundle/l0/iso_linear",
                "fiber_bundle/alpha"):  # fmt: skip
        assert col in h.columns
    # the anti-flatness floor lifted the metric from its near-zero start
    assert h["fiber_bundle/l0/kappa_mean"].iloc[-1] > 0.01


def test_sweep_skips_finished_cells_and_reruns_changed_parameters(tmp_path) -> None:
    calls: list[tuple[str, int]] = []

    def run(params: dict, seed: int) -> dict:
        calls.append((str(params["x"]), seed))
        return {"value": params["x"] * 10 + seed, "history": {"step": [1, 2]}}

    cells = [Cell("a", s, {"x": 1}) for s in (0, 1)] + [Cell("b", 0, {"x": 2})]
    df = run_sweep(cells, run, tmp_path, log=None)
    assert len(calls) == 3 and sorted(df["value"]) == [10, 11, 20]
    assert "history" not in df.columns
    run_sweep(cells, run, tmp_path, log=None)
    assert len(calls) == 3  # all reused
    run_sweep([Cell("a", 0, {"x": 3})], run, tmp_path, log=None)
    assert len(calls) == 4  # new parameters -> new cell
    assert len(load_results(tmp_path)) == 4
    assert (tmp_path / "results.csv").exists()
    with pytest.raises(ValueError, match="duplicate"):
        run_sweep([cells[0], cells[0]], run, tmp_path, log=None)


def test_regularizer_terms_equal_the_riemannian_regularisers() -> None:
    from attention_atlas.attention import riemannian as rm
    from attention_atlas.fiber_bundle import regularizer_terms

    torch.manual_seed(0)
    U = torch.randn(2, 3, 7, 5, 2, dtype=torch.float64)
    got = regularizer_terms(U, kappa_min=9.0, kappa_max=11.0)
    ref = {
        "anti": rm.anti_flatness_loss(U, 9.0),
        "div": rm.metric_diversity_loss(U),
        "smooth": rm.curvature_smoothness_loss(U),
        "cap": rm.metric_cap_loss(U, 11.0),
        "l2": (U * U).sum((-1, -2)).mean(),
    }
    for k, v in ref.items():
        torch.testing.assert_close(got[k], v, rtol=1e-10, atol=1e-10)
    assert float(got["anti"]) > 0 and float(got["cap"]) > 0


def test_materialised_path_equals_the_riemannian_fast_path() -> None:
    torch.manual_seed(0)
    fast = _tiny(method="lowrank", alpha=0.7).build().double()
    slow = _tiny(method="decomposed", alpha=0.7).build().double()
    _grow_metric(fast)
    slow.load_state_dict(fast.state_dict())
    x = torch.randint(0, 11, (2, 12))
    torch.testing.assert_close(fast(x).logits, slow(x).logits, rtol=1e-9, atol=1e-9)
