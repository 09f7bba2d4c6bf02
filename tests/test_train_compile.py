"""``TrainConfig(compile=True)``: the models trace into one graph, a compiled run computes what
the eager run computes (to float32 rounding), and a compiler failure falls back to eager steps
with a warning while the module's own errors still surface."""

from __future__ import annotations

import warnings
from dataclasses import replace

import pytest
import torch
import torch._dynamo
from data_helpers import toy_corpus
from torch import nn

from attention_atlas.experiments.performance import train_steps as bench_train
from attention_atlas.models import FiberBundleConfig, ModelConfig
from attention_atlas.train import TrainConfig, train
from attention_atlas.train.checkpoint import RESUMABLE_CHANGES
from attention_atlas.train.compiled import CompiledSteps, compiled_training, compiling

torch.set_num_threads(1)
TINY = {"dim": 16, "n_layers": 2, "n_heads": 2, "batch_size": 2, "seq_len": 16}


def _quiet(cfg: TrainConfig, **changes: object) -> TrainConfig:
    return replace(cfg, progress=False, measure_flops=False, log_every=1, eval_batches=1,
                   final_eval_batches=2, **changes)  # fmt: skip


@pytest.mark.parametrize("variant", ["dot", "euclidean", "riemannian", "fiber_bundle",
                                     "matroidal", "mahalanobis", "ssm"])  # fmt: skip
def test_every_trainable_model_traces_into_one_graph(variant):
    # the profiler's phases and the embedding's id check used to cut the graph (4 graphs for
    # dot, 17 for the Fiber Bundle Transformer); a break costs torch.compile its fusion
    base = {"dim": 16, "n_layers": 2, "n_heads": 2, "max_len": 16, "vocab_size": 20}
    cfg = (
        FiberBundleConfig(**base)
        if variant == "fiber_bundle"
        else ModelConfig(**base, attention=variant)
    )
    model = cfg.build()
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model)(torch.randint(0, 20, (2, 16)))
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons


def test_a_compiled_fiber_bundle_run_computes_what_the_eager_run_computes():
    # chapter 4's Fiber Bundle model with its three regularisers: custom autograd nodes, the
    # regularisers reading the forward's metric factors, the step counter the schedule reads
    data = toy_corpus(20)
    mcfg, tcfg = bench_train.train_setup("fiber_bundle", {**TINY, "n_layers": 1})
    eager = train(mcfg, _quiet(tcfg, steps=3), data)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", "torch.compile failed", RuntimeWarning)
        compiled = train(mcfg, _quiet(tcfg, steps=3, compile=True), data)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # it did compile
    assert compiled.record["train_config"]["compile"] is True
    for col in ("train_loss", "val_loss"):
        assert compiled.history[col].tolist() == pytest.approx(
            eager.history[col].tolist(), rel=1e-4
        )
    for (name, a), (_, b) in zip(
        eager.model.state_dict().items(), compiled.model.state_dict().items()
    ):
        assert torch.allclose(a.float(), b.float(), rtol=1e-4, atol=1e-6), name


def test_a_compiled_cofactor_run_with_the_native_kernels_computes_what_the_eager_run_computes():
    # chapter 6's regulariser on the native kernels reads the forward's queries and keys in
    # place; a compiled forward hands them out as outputs of its graph, which the logits give
    # no gradient: the eager step's in-place gradients (inplace_grads) would find none to add
    # into, so the compiled step keeps the dense ones
    data = toy_corpus(20)
    mcfg, tcfg = bench_train.train_setup("cofactor", TINY)
    eager = train(mcfg, _quiet(tcfg, steps=3, native=True), data)
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", "torch.compile failed", RuntimeWarning)
        compiled = train(mcfg, _quiet(tcfg, steps=3, compile=True, native=True), data)
    assert compiled.record["train_config"]["compile"] is True
    for col in ("train_loss", "val_loss"):
        assert compiled.history[col].tolist() == pytest.approx(
            eager.history[col].tolist(), rel=1e-4
        )


def _no_compiler(module, **kwargs):
    """A stand-in for ``torch.compile`` on a machine without a C++ compiler: the compiled
    module raises inductor's error (its first line is what a fallback reports) when called."""

    def call(*a, **k):
        raise RuntimeError("InductorError: no working C++ compiler found\nmore lines")

    return call


def test_a_compiler_failure_warns_once_and_the_run_goes_on_eagerly(monkeypatch):
    data = toy_corpus(20)
    cfg = _quiet(TrainConfig(steps=3, batch_size=2, seq_len=16, seed=1))
    mcfg = ModelConfig(dim=16, n_layers=1, n_heads=2, max_len=16)
    eager = train(mcfg, cfg, data)

    monkeypatch.setattr(torch, "compile", _no_compiler)
    with pytest.warns(
        RuntimeWarning, match="torch.compile failed .*no working C.. compiler"
    ) as rec:
        fallen = train(mcfg, replace(cfg, compile=True), data)
    assert sum("torch.compile failed" in str(w.message) for w in rec) == 1
    assert fallen.history["train_loss"].tolist() == eager.history["train_loss"].tolist()  # exact


def test_compiled_training_compiles_every_run_inside_it_and_collects_fallbacks(monkeypatch):
    # what `sweep --compile` wraps each cell in: runs whose config says compile=False compile
    data = toy_corpus(20)
    cfg = _quiet(TrainConfig(steps=2, batch_size=2, seq_len=16, seed=3))
    mcfg = ModelConfig(dim=16, n_layers=1, n_heads=2, max_len=16)
    assert compiling() is None
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    with compiled_training() as state:
        assert compiling() is state
        inside = train(mcfg, cfg, data)
    assert compiling() is None and state is not None and state.fallbacks == []
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # it did compile
    assert inside.record["train_config"]["compile"] is True
    with compiled_training(False) as off:  # off: nothing changes
        assert off is None and compiling() is None
        assert train(mcfg, cfg, data).record["train_config"]["compile"] is False

    monkeypatch.setattr(torch, "compile", _no_compiler)
    with pytest.warns(RuntimeWarning, match="torch.compile failed"):
        with compiled_training() as state:
            train(mcfg, cfg, data)
            train(mcfg, cfg, data)
    assert state is not None and len(state.fallbacks) == 2
    assert all("no working C++ compiler" in f for f in state.fallbacks)


def test_an_error_of_the_module_itself_is_raised_not_taken_for_a_compiler_failure():
    class Refuses(nn.Module):
        def forward(self, x):
            raise ValueError("inputs must be token ids")

    steps = CompiledSteps(Refuses())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="inputs must be token ids"):
            steps(torch.zeros(2))
    assert steps.error is None and steps.compiled is not None


def test_compile_is_a_setting_a_resumed_run_may_change():
    assert "compile" in RESUMABLE_CHANGES and TrainConfig().compile is False


def test_bench_train_times_compiled_steps_beside_the_eager_ones():
    rec = bench_train.bench_train(["euclidean"], TINY, reps=2, warmup=1, profile_steps=1,
                                  min_sample_s=0.001, data=toy_corpus(20), compiled=True)  # fmt: skip
    assert rec["name"] == "train-custom-compiled"
    for v in ("dot", "euclidean"):
        r = rec["results"][v]
        assert r["compile_error"] is None
        assert r["compile_speedup"] == pytest.approx(
            r["step"]["median_s"] / r["compiled"]["median_s"]
        )
    table = bench_train.format_train_table(rec)
    assert "compiled forward" in table and table.count("\n") == 7


def _pairwise_inputs(n: int = 3, seq: int = 40, r: int = 2, d: int = 5):
    g = torch.Generator().manual_seed(3)
    ut = torch.randn(n, seq, r, d, dtype=torch.float64, generator=g, requires_grad=True)
    x = torch.randn(n, 2 * seq, d, dtype=torch.float64, generator=g, requires_grad=True)
    base = torch.randn(n, seq, seq, dtype=torch.float64, generator=g)
    return base, ut, x


@pytest.mark.parametrize("softmax", [False, True])
def test_the_causal_pairwise_operator_is_the_eager_node_exactly(softmax):
    # the custom operator compiled graphs call past the kept size: same forward, same backward
    # (it recomputes the tiles' products; the node keeps them at this size)
    from attention_atlas.attention.riemannian import pairwise as pw

    base, ut, x = _pairwise_inputs()
    a = pw._CausalPairwiseMetricTerms.apply(base.clone(), ut, x, -0.3, 16, softmax)
    b = pw.causal_pairwise_op(base.clone(), ut, x, -0.3, 16, softmax)
    assert torch.equal(a, b)
    g = torch.randn(a.shape, dtype=a.dtype, generator=torch.Generator().manual_seed(4))
    g = g if softmax else g.masked_fill(~torch.isfinite(a), 0.0)
    for ga, gb in zip(torch.autograd.grad(a, (ut, x), g), torch.autograd.grad(b, (ut, x), g)):
        assert torch.equal(ga, gb)
    base_in = base.clone().requires_grad_(True)
    checks = torch.library.opcheck(pw.causal_pairwise_op, (base_in, ut, x, -0.3, 16, softmax))
    assert set(checks.values()) == {"SUCCESS"}
    small = _pairwise_inputs(2, 7, 2, 3)
    inputs = (small[0].requires_grad_(True), small[1], small[2])
    assert torch.autograd.gradcheck(
        lambda b_, u_, x_: pw.causal_pairwise_op(b_, u_, x_, 0.7, 4, True), inputs
    )


def test_compiled_scores_past_the_kept_size_take_the_operator_in_one_graph(monkeypatch):
    from attention_atlas.attention.riemannian import pairwise as pw

    monkeypatch.setattr(pw, "PAIRWISE_CHUNK", 1)  # no size keeps its products: the operator
    g = torch.Generator().manual_seed(5)
    U = torch.randn(2, 12, 4, 2, generator=g, requires_grad=True)
    q, k = (torch.randn(2, 12, 4, generator=g, requires_grad=True) for _ in range(2))

    def scores(U, q, k):
        base = torch.zeros(2, 12, 12)
        return pw.pairwise_metric_terms(U, q, k, scale=-0.5, causal=True, base=base, softmax=True)

    torch._dynamo.reset()
    explained = torch._dynamo.explain(scores)(U, q, k)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)
    eager = scores(U, q, k)
    compiled = torch.compile(scores, dynamic=False)(U, q, k)
    assert torch.allclose(compiled, eager, atol=1e-6)
    w = torch.randn(eager.shape, generator=g)
    for a, b in zip(torch.autograd.grad(eager, (U, q, k), w),
                    torch.autograd.grad(compiled, (U, q, k), w)):  # fmt: skip
        assert torch.allclose(a, b, atol=1e-5)
