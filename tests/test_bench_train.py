"""The step-cost profile (bench_train), the kernel benchmark across lengths (bench_scaling) and
their records (bench_records). Checked: what is measured and counted, and how it is
attributed and stored; never how long anything takes (that is what the benchmarks report)."""

from __future__ import annotations

import json
import statistics
from types import SimpleNamespace

import pytest
import torch
from data_helpers import toy_corpus

from attention_atlas.attention.riemannian.regularizers import TERMS
from attention_atlas.bench import records as bench_records
from attention_atlas.bench import scaling as bench_scaling
from attention_atlas.experiments.performance import train_steps as bench_train
from attention_atlas.train import measure_flops, step_callable
from attention_atlas.train.step import peek_batch

torch.set_num_threads(1)
TINY = {"dim": 16, "n_layers": 2, "n_heads": 2, "batch_size": 2, "seq_len": 16}


@pytest.mark.parametrize("variant", ["dot", "fiber_bundle", "cofactor"])
def test_phase_flops_add_up_to_the_model_flops_of_a_step(variant):
    # every matrix product of the model's forward and backward is charged to exactly one phase
    run = bench_train.variant_run(variant, TINY, toy_corpus(), seed=0)
    step = step_callable(run)
    phases = bench_train.profile_phases(step, run.model, steps=1)
    x, y = peek_batch(run.sampler)
    counted = measure_flops(run.model, x, y)
    model = {n: p for n, p in phases.items() if not n.startswith("regularizer/")}
    fwd = sum(p["forward_flops"] for p in model.values())
    bwd = sum(p["backward_flops"] for p in model.values())
    assert fwd == counted["forward_total"]
    if variant != "cofactor":  # its step takes the materialised path, measure_flops SDPA's
        assert fwd + bwd == counted["train_step_total"]
    assert sum(p["share"] for p in phases.values()) == pytest.approx(1.0)
    if variant == "fiber_bundle":  # each phase of the Fiber Bundle Transformer is named
        for name in ("metric_net", "metric_projection", "curvature", "geodesic_scores",
                     "transport", "torsion", "preconditioned_update", "regularizer/fiber_bundle"):  # fmt: skip
            assert name in phases, name
        assert phases["metric_net"]["forward_flops"] > 0
        assert phases["regularizer/fiber_bundle"]["backward_flops"] > 0


def test_cofactor_step_counts_the_products_of_its_closed_form_and_no_factorisation():
    """A decoder's regularised heads take the closed form: no LU estimate is added, and the
    regulariser's phase holds exactly its three products, the logits forward and two backward
    (2 n^2 d FLOPs each), for batch x layers x 1 head matrices."""
    run = bench_train.variant_run("cofactor", TINY, toy_corpus(), seed=0)
    assert bench_train._model_flops(run)["regularizer_estimate"] == 0
    phases = bench_train.profile_phases(step_callable(run), run.model, steps=1)
    n, d = TINY["seq_len"], TINY["dim"] // TINY["n_heads"]
    mats = TINY["batch_size"] * TINY["n_layers"]
    reg = phases["regularizer/cofactor"]
    assert (reg["forward_flops"], reg["backward_flops"]) == (
        mats * 2 * n * n * d,
        mats * 4 * n * n * d,
    )


def test_train_setup_is_chapter_4s_fbt_and_chapter_6s_regulariser():
    mcfg, tcfg = bench_train.train_setup("fiber_bundle", bench_train.SHAPES["book"])
    assert type(mcfg).__name__ == "FiberBundleConfig" and mcfg.dim == 64 and mcfg.n_heads == 4
    (reg,) = tcfg.regularizers
    assert reg["name"] == "fiber_bundle" and {"anti", "div", "smooth", "cap"} <= set(reg)
    assert set(reg) & set(TERMS) == {"anti", "div", "smooth", "cap"}
    mcfg, tcfg = bench_train.train_setup("cofactor", bench_train.SHAPES["long"])
    assert mcfg.attention == "dot" and mcfg.dim == 128 and tcfg.batch_size == 32
    assert tcfg.regularizers[0]["name"] == "cofactor"
    with pytest.raises(ValueError, match="unknown training variant 'flash'"):
        bench_train.train_setup("flash", TINY)


def test_bench_train_record_times_every_variant_against_dot():
    rec = bench_train.bench_train(["euclidean"], TINY, reps=2, warmup=1, profile_steps=1,
                                  min_sample_s=0.001, data=toy_corpus())  # fmt: skip
    assert list(rec["results"]) == ["dot", "euclidean"]
    dot, euc = rec["results"]["dot"]["step"], rec["results"]["euclidean"]["step"]
    assert dot["ratio_median"] == 1.0
    ratios = [a / b for a, b in zip(euc["samples_s"], dot["samples_s"])]  # one per round
    assert euc["ratio_median"] == pytest.approx(statistics.median(ratios))
    assert rec["clock"] == "cpu" and rec["sizes"] == TINY
    rows = bench_train.phase_table(rec, "euclidean")
    assert sum(r["ms"] for r in rows) == pytest.approx(1e3 * euc["median_s"])
    assert "euclidean" in bench_train.format_train_table(rec)


def test_kernel_scaling_records_ratios_flops_and_skips_what_does_not_fit():
    rec = bench_scaling.kernel_scaling(
        ["euclidean", "fiber_bundle"], [16, 32], batch=1, heads=2, head_dim=8, reps=1,
        warmup=1, memory=False, max_memory_bytes=1 * 2 * 32 * 32 * 48 - 1,
    )  # fmt: skip
    res = rec["results"]
    assert set(res["dot"]) == {"16", "32"} and set(res["euclidean"]) == {"16", "32"}
    assert set(res["fiber_bundle"]) == {"16"}  # its memory estimate at L = 32 is one byte over
    assert "estimated memory" in rec["skipped"]["fiber_bundle"]["32"]
    r = res["euclidean"]["32"]
    assert r["forward_backward_flops"] > r["forward_flops"] > 0
    # SDPA's counted forward FLOPs: 4 B H L^2 d (FlopCounterMode counts the full square)
    assert res["dot"]["32"]["forward_flops"] == 4 * 1 * 2 * 32 * 32 * 8
    assert bench_scaling.floor_ratio(2.0, 4e9, 1e9) == pytest.approx(0.5)
    assert set(bench_scaling.slopes(rec)) == {"dot", "euclidean", "fiber_bundle"}


def test_kernel_scaling_skips_a_length_whose_extrapolated_time_is_too_long():
    last = {"x": (100, 1.0)}
    results = {"x": {"50": {"forward_backward_s": 0.25}, "100": {"forward_backward_s": 1.0}}}
    reason = bench_scaling._skip_reason("x", 400, last, 1, 1, 4, 10.0, 2**40, results)
    assert reason.startswith("estimated 16 s")  # slope 2 from the two points: 1 s x 4^2
    assert bench_scaling._skip_reason("x", 300, last, 1, 1, 4, 10.0, 2**40, results) == ""


def test_kernel_scaling_skips_a_length_whose_measured_memory_would_pass_the_cap():
    results = {"x": {"100": {"forward_backward_s": 1e-3, "peak_memory_bytes": 1000},
                     "200": {"forward_backward_s": 1e-3, "peak_memory_bytes": 4000}}}  # fmt: skip
    last = {"x": (200, 1e-3)}
    # slope 2 from the measured peaks: 4000 x 2^2 = 16000 bytes at L = 400
    assert "estimated memory" in bench_scaling._skip_reason("x", 400, last, 1, 1, 4, 10.0,
                                                             15999, results)  # fmt: skip
    assert bench_scaling._skip_reason("x", 400, last, 1, 1, 4, 10.0, 16001, results) == ""


def test_kernel_scaling_drops_the_variant_that_ran_out_of_memory_and_reports_each_length(
    monkeypatch,
):
    real = bench_scaling.bench_attention

    def short_of_memory(run, *args, length, **kw):
        if length == 32 and "matroidal" in run:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 32.00 GiB.")
        return real(run, *args, length=length, **kw)

    monkeypatch.setattr(bench_scaling, "bench_attention", short_of_memory)
    seen = []
    rec = bench_scaling.kernel_scaling(
        ["euclidean", "matroidal"], [16, 32], batch=1, heads=2, head_dim=8, reps=1, warmup=0,
        on_length=lambda r: seen.append({v: sorted(by) for v, by in r["results"].items()}),
    )  # fmt: skip
    # matroidal's peak at L = 16 is the largest (a metric factor beside the scores), so it goes
    assert rec["skipped"]["matroidal"]["32"].startswith("out of memory (CUDA out of memory.")
    assert set(rec["results"]["euclidean"]) == {"16", "32"}
    assert set(rec["results"]["matroidal"]) == {"16"}
    assert seen == [{"dot": ["16"], "euclidean": ["16"], "matroidal": ["16"]},
                    {"dot": ["16", "32"], "euclidean": ["16", "32"], "matroidal": ["16"]}]  # fmt: skip


def test_records_are_stored_with_provenance_and_loaded_by_machine_kind(tmp_path):
    rec = bench_records.stamp({"name": "train-book", "device": "cpu", "results": {}},
                              started=0.0, command="python -m attention_atlas bench --train")  # fmt: skip
    path = bench_records.store_bench(rec, "train-book", root=tmp_path)
    assert path == tmp_path / "bench" / "cpu" / "train-book.json"
    assert json.loads(path.read_text())["provenance"]["command"].endswith("--train")
    assert bench_records.load_bench_kinds("train-book", root=tmp_path) == {"cpu": rec}
    assert bench_records.load_bench("train-book", "cuda", root=tmp_path) is None
    assert "`python -m attention_atlas bench --train`" in bench_records.provenance_text(rec)
    assert bench_records.machine_kind("cuda:1") == "cuda"
    with pytest.raises(ValueError, match="needs its provenance"):
        bench_records.store_bench({"name": "x"}, "x", root=tmp_path)
    # another machine's record goes one folder down, beside the reference one, not over it
    other = {**rec, "results": {"dot": {}}}
    at = bench_records.store_bench(other, "train-book", root=tmp_path, machine="intel-xeon")
    assert at == tmp_path / "bench" / "cpu" / "intel-xeon" / "train-book.json"
    assert bench_records.load_bench("train-book", root=tmp_path) == rec
    assert bench_records.load_bench("train-book", root=tmp_path, machine="intel-xeon") == other
    assert bench_records.other_machines("cpu", root=tmp_path) == ["intel-xeon"]
    assert bench_records.other_machines("cuda", root=tmp_path) == []
    for bad in ("Intel Xeon", "../up", "-x", ""):
        with pytest.raises(ValueError, match="a machine label is lower-case"):
            bench_records.store_bench(rec, "train-book", root=tmp_path, machine=bad)


def test_command_line_bench_lengths_writes_a_record_and_rejects_bad_train_variants(
    tmp_path, capsys
):
    from attention_atlas.__main__ import main

    out = tmp_path / "k.json"
    rc = main(["bench", "euclidean", "--lengths", "16", "-B", "1", "-H", "2", "-d", "4",
               "--reps", "1", "--no-memory", "--json", str(out)])  # fmt: skip
    assert rc == 0
    rec = json.loads(out.read_text())
    assert rec["kind"] == "kernel_scaling" and set(rec["results"]) == {"dot", "euclidean"}
    assert rec["provenance"]["command"].startswith("python -m attention_atlas")
    assert main(["bench", "--train", "flash"]) == 2
    assert "unknown variant 'flash'" in capsys.readouterr().err


def _event(name, start, parent=None, seq=-1, cpu_us=0.0, device_us=0.0):
    """A stand-in for a profiler event: what :func:`bench_train._attribute` reads of one."""
    return SimpleNamespace(name=name, time_range=SimpleNamespace(start=start), cpu_parent=parent,
                           sequence_nr=seq, self_cpu_time_total=cpu_us,
                           self_device_time_total=device_us, flops=0, input_shapes=[])  # fmt: skip


def test_phases_on_a_gpu_take_the_time_of_the_kernels_each_operator_launched():
    rng = _event("atlas:geodesic_scores", 0)
    fwd = _event("aten::bmm", 1, parent=rng, seq=7, cpu_us=100.0, device_us=40.0)
    engine = _event("autograd::engine::evaluate_function: BmmBackward0", 2)
    bwd = _event("aten::bmm", 3, parent=engine, seq=-1, cpu_us=200.0, device_us=70.0)
    engine.sequence_nr = 7  # the backward node of the forward bmm
    events = [rng, fwd, engine, bwd]
    on_gpu = bench_train._attribute(events, with_flops=False, device_time=True)
    on_cpu = bench_train._attribute(events, with_flops=False)
    assert on_gpu["geodesic_scores"]["forward_s"] == pytest.approx(40e-6, rel=1e-12)
    assert on_gpu["geodesic_scores"]["backward_s"] == pytest.approx(70e-6, rel=1e-12)
    assert on_cpu["geodesic_scores"]["forward_s"] == pytest.approx(100e-6, rel=1e-12)
    assert on_cpu["geodesic_scores"]["backward_s"] == pytest.approx(200e-6, rel=1e-12)
