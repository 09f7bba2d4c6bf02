"""Chapter 8's analysis of benchmark records (experiments/performance.py), on records written
here: the tables, floors, slopes and goals they compute, and the loader's machine kinds."""

from __future__ import annotations

import math

import pytest

from attention_atlas.bench import records as bench_records
from attention_atlas.experiments.performance import kernels as perf
from attention_atlas.experiments.performance import steps


def _kernels(device: str = "cpu") -> dict:
    # dot: time 1 ms * (L/256)^2; euclidean twice that; ssm linear in L
    res: dict = {"dot": {}, "euclidean": {}, "ssm": {}}
    for n in (256, 512, 1024):
        q = (n / 256) ** 2
        for v, t, f in (("dot", 1e-3 * q, 1e9 * q), ("euclidean", 2e-3 * q, 1e9 * q),
                        ("ssm", 1e-3 * n / 256, 1e8 * n / 256)):  # fmt: skip
            res[v][str(n)] = {"forward_s": t / 3, "forward_backward_s": t,
                              "forward_ratio": t / (1e-3 * q), "forward_backward_ratio": t / (1e-3 * q),
                              "peak_memory_bytes": 2**20 * n, "forward_flops": f / 3,
                              "forward_backward_flops": f}  # fmt: skip
    return {"name": perf.KERNEL_RECORD, "device": device, "matmul_flops_per_s": 1e12,
            "results": res}  # fmt: skip


def test_kernel_frame_floor_ratio_is_time_over_the_matmul_time_of_the_flops():
    kf = perf.kernel_frame(_kernels())
    row = kf[(kf["variant"] == "euclidean") & (kf["L"] == 512)].iloc[0]
    # 8 ms against 4e9 FLOPs at 1e12 FLOP/s (4 ms): twice the floor
    assert row["forward+backward floor ratio"] == pytest.approx(2.0)
    assert row["forward+backward / SDPA"] == pytest.approx(2.0)
    assert row["peak MiB"] == pytest.approx(512)


def test_slopes_are_the_exponents_of_the_power_laws():
    s = perf.slope_frame(_kernels())
    assert s.loc["dot", "forward+backward slope"] == pytest.approx(2.0)
    assert s.loc["ssm", "forward+backward slope"] == pytest.approx(1.0)
    assert s.loc["ssm", "memory slope"] == pytest.approx(1.0)
    assert s.loc["euclidean", "longest L"] == 1024
    text = perf.kernel_summary(perf.kernel_frame(_kernels()), s)
    assert (
        "Within twice SDPA's forward+backward time at every length they ran: euclidean, ssm" in text
    )
    assert "Growing slower than $L^{1.5}$: ssm" in text


def _train(ratios: dict[str, float], flop_ratios: dict[str, float]) -> dict:
    res = {}
    for v, r in ratios.items():
        res[v] = {
            "step": {"median_s": 0.01 * r, "ratio_median": r, "ratio_q25": r, "ratio_q75": r},
            "flops": {"step_counted": int(1e9 * flop_ratios[v])},
            "phases": {"attention": {"share": 1.0, "forward_flops": 1, "backward_flops": 2}},
        }
    return {"name": "train-book", "device": "cpu", "results": res}


def test_goals_say_which_steps_are_within_budget_and_why_not():
    rec = _train({"dot": 1.0, "euclidean": 1.2, "riemannian": 2.5, "fiber_bundle": 3.5, "ssm": 1.6},
                 {"dot": 1.0, "euclidean": 1.0, "riemannian": 1.9, "fiber_bundle": 2.6, "ssm": 1.0})  # fmt: skip
    g = perf.goals(rec)
    assert list(g.index) == ["euclidean", "riemannian", "fiber_bundle", "ssm"]
    assert g.loc["fiber_bundle", "goal"] == 3.0 and g.loc["ssm", "goal"] == 1.5
    assert g["met"].tolist() == [True, False, False, False]
    assert g["FLOP floor above goal"].tolist() == [False, True, False, False]
    text = perf.goal_sentence(g, "book")
    assert "met by euclidean (1.20x" in text
    assert (
        "already above the goal (its floor at dot's FLOP rate): riemannian (2.50x, FLOPs 1.90x"
        in text
    )
    assert "within the goal (many small operators" in text and "fiber_bundle (3.50x" in text
    assert math.isnan(perf.train_frame(rec).loc["dot", "goal"])


def test_compile_frame_and_sentence_read_eager_and_compiled_steps_of_one_record():
    rec = _train({"dot": 1.0, "matroidal": 1.3, "fiber_bundle": 4.0},
                 {"dot": 1.0, "matroidal": 1.0, "fiber_bundle": 2.5})  # fmt: skip
    compiled = {"dot": 0.9, "matroidal": 1.0, "fiber_bundle": 3.6}  # over the eager dot step
    for v, r in rec["results"].items():
        r["compiled"] = {"median_s": 0.01 * compiled[v], "ratio_median": compiled[v]}
        r["compile_speedup"] = r["step"]["median_s"] / r["compiled"]["median_s"]
        r["compile_error"] = "InductorError: no compiler" if v == "matroidal" else None
    f = steps.compile_frame(rec)
    assert f.loc["fiber_bundle", "speed-up"] == pytest.approx(4.0 / 3.6)
    assert f.loc["fiber_bundle", "compiled / compiled dot"] == pytest.approx(4.0)
    assert f.loc["matroidal", "compiled ms"] == pytest.approx(10.0)
    text = steps.compile_sentence({"book": f})
    assert "by 1.11x (dot) to 1.30x (matroidal)" in text
    assert "matroidal fell back to eager steps" in text
    assert "4.00 eager dot steps eagerly, 3.60 compiled, and 4.00 compiled dot steps" in text
    assert "goal (3) not met" in text
    assert "No compiled" in steps.compile_sentence({})
    assert len(steps.compile_figure({"book": f}).data) == 3


def test_regularizer_share_is_the_step_excess_over_dot_and_the_profiled_phase():
    """1 - 1 / ratio from the timing (quartiles too), the phase's share from the profile, its
    counted FLOPs over the step's, against the 5% goal; None without a cofactor step."""
    rec = _train({"dot": 1.0, "cofactor": 1.1}, {"dot": 1.0, "cofactor": 1.02})
    res = rec["results"]["cofactor"]
    res["step"].update(ratio_q25=1.05, ratio_q75=1.25)
    res["phases"]["regularizer/cofactor"] = {
        "share": 0.08,
        "forward_flops": 5e6,
        "backward_flops": 1.5e7,
    }
    got = steps.regularizer_share(rec)
    assert got == pytest.approx({"timed": 1 - 1 / 1.1, "timed_low": 1 - 1 / 1.05,
                                 "timed_high": 1 - 1 / 1.25, "profiled": 0.08,
                                 "flops": 2e7 / 1.02e9, "goal": 0.05})  # fmt: skip
    assert steps.regularizer_share(_train({"dot": 1.0}, {"dot": 1.0})) is None
    long = _train({"dot": 1.0, "cofactor": 1.04}, {"dot": 1.0, "cofactor": 1.01})
    long["results"]["cofactor"]["phases"]["regularizer/cofactor"] = {
        "share": 0.03, "forward_flops": 1, "backward_flops": 1}  # fmt: skip
    text = steps.regularizer_sentence({"book": got, "long": steps.regularizer_share(long)})
    assert "at the book shape 9.1% of a step" in text and "(quartiles 4.8% to 20.0%)" in text
    assert "8.0% by the profile, for 2.0% of the step's FLOPs: goal not met" in text
    assert "at the long shape 3.8% of a step" in text and text.endswith("goal met.")
    assert "No record" in steps.regularizer_sentence({"book": None})


def test_loader_shows_gpu_records_beside_cpu_ones(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTENTION_ATLAS_RESULTS", str(tmp_path))
    names = [perf.KERNEL_RECORD, "train-book", "train-long", "train-book-compiled",
             "train-long-compiled", "train-book-native", "train-long-native"]  # fmt: skip
    assert perf.load_records() == {name: {} for name in names}
    for device in ("cpu", "cuda"):
        rec = bench_records.stamp(_kernels(device), started=0.0, command="bench --lengths")
        bench_records.store_bench(rec, perf.KERNEL_RECORD)
    records = perf.load_records()
    assert perf.stored_kinds(records, perf.KERNEL_RECORD) == ["cpu", "cuda"]
    assert records[perf.KERNEL_RECORD]["cuda"]["device"] == "cuda"


def test_native_frame_and_sentence_read_the_native_steps_and_their_regularizer_share():
    rec = _train({"dot": 1.0, "matroidal": 1.2, "fiber_bundle": 4.0, "cofactor": 1.1},
                 {"dot": 1.0, "matroidal": 1.0, "fiber_bundle": 2.5, "cofactor": 1.02})  # fmt: skip
    native = {"fiber_bundle": (2.9, 2.7, 3.2), "cofactor": (1.04, 1.02, 1.08)}
    for v, (med, lo, hi) in native.items():
        r = rec["results"][v]
        r["native"] = {
            "median_s": 0.01 * med,
            "ratio_median": med,
            "ratio_q25": lo,
            "ratio_q75": hi,
        }
        r["native_speedup"] = r["step"]["median_s"] / r["native"]["median_s"]
        r["native_phases"] = {"regularizer/cofactor": {"share": 0.03, "forward_flops": 1,
                                                       "backward_flops": 1}}  # fmt: skip
    f = steps.native_frame(rec)
    assert list(f.index) == ["fiber_bundle", "cofactor"]  # only the variants run natively
    assert f.loc["fiber_bundle", "speed-up"] == pytest.approx(4.0 / 2.9)
    assert f.loc["fiber_bundle", "FLOP ratio"] == pytest.approx(2.5)
    assert f["met"].tolist() == [True, True]
    text = steps.native_sentence({"book": f})
    assert (
        "fiber_bundle 2.90x (quartiles 2.70 to 3.20; eager 4.00x; FLOPs 2.50x): goal (3) met"
        in text
    )
    assert "No training-step record" in steps.native_sentence({})
    assert len(steps.native_figure({"book": f}).data) == 3
    share = steps.regularizer_share(rec, native=True)
    assert share is not None and share["timed"] == pytest.approx(1 - 1 / 1.04)
    assert share["timed_high"] == pytest.approx(1 - 1 / 1.08) and share["profiled"] == 0.03
    assert steps.regularizer_sentence({"book": share}, "Natively, it").startswith(
        "Natively, it (goal: at most 5% of a step): at the book shape 3.8% of a step"
    )
    assert steps.stored_train({"train-long-native": {"cpu": rec}, "train-book-native": {}},
                             "native") == {"long": rec}  # fmt: skip
    assert steps.regularizer_share(rec) is None  # the eager profile has no regulariser phase here
    assert share["flops"] == pytest.approx(2 / 1.02e9)  # no eager phase: the native one's count
    rec["results"]["cofactor"]["phases"]["regularizer/cofactor"] = {
        "share": 0.07, "forward_flops": 4e6, "backward_flops": 6e6}  # fmt: skip
    assert steps.regularizer_share(rec, native=True)["flops"] == pytest.approx(1e7 / 1.02e9)
    del rec["results"]["cofactor"]["native"]
    assert steps.regularizer_share(rec, native=True) is None


def test_device_step_sentence_reads_gpu_steps_beside_cpu_ones_and_the_costliest_phases():
    gpu = _train(
        {"dot": 1.0, "riemannian": 16.0, "ssm": 2.0}, {"dot": 1, "riemannian": 2, "ssm": 1}
    )
    gpu["device"] = "cuda"
    gpu["results"]["riemannian"]["phases"] = {
        "geodesic_scores": {"share": 0.75, "forward_flops": 1, "backward_flops": 1},
        "optimizer": {"share": 0.05, "forward_flops": 0, "backward_flops": 0},
        "other": {"share": 0.2, "forward_flops": 0, "backward_flops": 0},
    }
    cpu = _train({"dot": 1.0, "riemannian": 2.4}, {"dot": 1, "riemannian": 2})
    records = {"train-long": {"cuda": gpu, "cpu": cpu}, "train-book": {"cpu": cpu}}
    assert steps.stored_train(records, kind="cuda") == {"long": gpu}
    assert steps.stored_train(records) == {"long": cpu, "book": cpu}
    text = steps.device_step_sentence({"long": gpu}, {"long": cpu})
    assert text == (
        "On the GPU, in dot-product steps: at the long shape (dot step 10.00 ms) riemannian "
        "16.00x (2.40x on the CPU), ssm 2.00x; the largest phases of riemannian's step there "
        "are geodesic_scores 75% and other 20%."
    )
    assert steps.device_step_sentence({}, {}) == "No GPU training-step record is stored yet."


def test_longest_sentence_reads_each_kernel_at_its_own_longest_length():
    rec = _kernels()
    del rec["results"]["euclidean"]["1024"]  # stopped one length earlier
    kf = perf.kernel_frame(rec)
    assert perf.at_longest(kf)["L"].to_dict() == {"dot": 1024, "euclidean": 512, "ssm": 1024}
    assert perf.longest_sentence(kf, "On the GPU: ") == (
        "On the GPU: At the longest length each reached, the kernels run at dot 1.0x (L = 1024), "
        "euclidean 2.0x (L = 512), ssm 0.2x (L = 1024) SDPA's forward+backward time."
    )


def test_other_machines_records_are_read_beside_the_reference_ones(tmp_path):
    """Records stored with ``--machine`` are found by label and told beside the reference
    machine's: each processor and dot-product step, the native steps against their goals and
    the cofactor regulariser's share there."""

    def native_record(dot_s: float, fbt: float, cof: float, cpu: str) -> dict:
        rec = _train({"dot": 1.0, "fiber_bundle": 4.0, "cofactor": 1.1},
                     {"dot": 1.0, "fiber_bundle": 2.5, "cofactor": 1.02})  # fmt: skip
        rec["results"]["dot"]["step"]["median_s"] = dot_s
        for v, med in (("fiber_bundle", fbt), ("cofactor", cof)):
            r = rec["results"][v]
            r["native"] = {"median_s": dot_s * med, "ratio_median": med, "ratio_q25": med,
                           "ratio_q75": med}  # fmt: skip
            r["native_speedup"] = r["step"]["median_s"] / r["native"]["median_s"]
            r["native_phases"] = {"regularizer/cofactor": {"share": 0.05, "forward_flops": 1,
                                                           "backward_flops": 1}}  # fmt: skip
        rec["name"] = "train-book-native"
        return bench_records.stamp(rec, started=0.0, command="bench --train --native")

    ref = native_record(0.006, 2.8, 1.04, "AMD EPYC")
    ref["provenance"]["cpu"] = "AMD EPYC"
    del ref["provenance"]["cpu_id"]  # a record made before cpu_id was stored: the name alone
    other = native_record(0.008, 3.5, 1.08, "Intel Xeon")
    other["provenance"]["cpu"] = "Intel Xeon"
    other["provenance"]["cpu_id"] = "GenuineIntel 6/106/6 avx avx2 avx512f fma"
    bench_records.store_bench(ref, "train-book-native", root=tmp_path)
    bench_records.store_bench(other, "train-book-native", root=tmp_path, machine="intel-xeon")
    found = steps.other_machine_records("native", root=str(tmp_path))
    assert list(found) == ["intel-xeon"] and list(found["intel-xeon"]) == ["book"]
    assert found["intel-xeon"]["book"]["provenance"]["cpu"] == "Intel Xeon"
    assert steps.other_machine_records("compiled", root=str(tmp_path)) == {}
    text = steps.machine_sentence("intel-xeon", found["intel-xeon"], {"book": ref})
    assert text.startswith(
        "Machine intel-xeon: at the book shape its dot-product step takes 8.00 ms (Intel Xeon; "
        "GenuineIntel 6/106/6 avx avx2 avx512f fma) against 6.00 ms on the reference machine "
        "(AMD EPYC)."
    )
    assert "fiber_bundle 3.50x" in text and "goal (3) not met" in text
    assert "the cofactor regulariser (goal: at most 5% of a step): at the book shape 7.4%" in text
    assert "goal not met" in text
    assert text.endswith(
        "Of the 3 goals measured on both machines, met on the reference machine and not on this "
        "one: fiber_bundle's step (book shape), the cofactor regulariser's share (book shape); "
        "met on this one and not on the reference: none."
    )
    assert steps.machine_sentence("intel-xeon", found["intel-xeon"], {}).endswith(
        "No goal was measured on both machines."
    )
    assert "No training-step record of machine 'x'" in steps.machine_sentence("x", {}, {})
