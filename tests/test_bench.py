"""The benchmark harness: interleaved timing, ratios against a baseline, peak memory, JSON."""

from __future__ import annotations

import json

import pytest
import torch

from attention_atlas.bench import bench_attention, compare, format_table, peak_memory

torch.set_num_threads(1)  # tiny ops on a shared 2-core machine: threads only contend


def test_compare_reports_medians_and_ratios_against_the_baseline(tmp_path):
    x = torch.randn(64, 64, requires_grad=True)
    fns = {"one": lambda x: x @ x, "three": lambda x: x @ x @ x @ x}
    res = compare(
        fns, "one", (x,), reps=3, warmup=1, min_sample_s=0.002, json_path=tmp_path / "r.json"
    )
    for name in fns:
        for mode in ("forward", "forward_backward"):
            r = res["results"][name][mode]
            assert len(r["samples_s"]) == 3 and r["median_s"] > 0
            assert r["ratio_q25"] <= r["ratio_median"] <= r["ratio_q75"]
    assert res["results"]["one"]["forward"]["ratio_median"] == 1.0
    # three matmuls cost more than one (a loose bound: the machine is shared)
    assert res["results"]["three"]["forward"]["ratio_median"] > 1.2
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["baseline"] == "one" and set(saved["results"]) == {"one", "three"}
    assert "three" in format_table(res)


def test_compare_errors_are_clear():
    x = torch.randn(4, requires_grad=True)
    with pytest.raises(ValueError, match="baseline 'b' is not one of the functions: a"):
        compare({"a": lambda x: x}, "b", (x,))
    with pytest.raises(TypeError, match="must return a Tensor"):
        compare({"a": lambda x: "no"}, "a", (x,), reps=1, memory=False)


def test_peak_memory_sees_a_large_temporary():
    n = 1 << 20  # 4 MiB of float32

    def step() -> None:
        a = torch.ones(n)
        b = a * 2  # a and b live together: 8 MiB
        del a, b

    peak = peak_memory(step, torch.device("cpu"))
    assert 8 * 2**20 <= peak < 16 * 2**20


def test_bench_attention_times_registered_variants_and_explicit_paths():
    res = bench_attention(
        ["euclidean", "euclidean@explicit"], "dot", batch=1, heads=2, length=32, head_dim=8,
        reps=2, warmup=1, min_sample_s=0.001,
    )  # fmt: skip
    assert set(res["results"]) == {"dot", "euclidean", "euclidean@explicit"}
    assert res["meta"]["length"] == 32
    explicit = res["results"]["euclidean@explicit"]["peak_memory_bytes"]
    assert explicit > res["results"]["euclidean"]["peak_memory_bytes"]  # it materialises (L, L, d)
    with pytest.raises(ValueError, match="only path suffix"):
        bench_attention(["dot@fast"], "dot", length=8, reps=1)


def test_command_line_bench_writes_json(tmp_path, capsys):
    from attention_atlas.__main__ import main

    out = tmp_path / "b.json"
    rc = main(["bench", "euclidean", "-B", "1", "-H", "2", "-L", "16", "-d", "4", "--reps", "2",
               "--no-memory", "--json", str(out)])  # fmt: skip
    assert rc == 0
    assert "euclidean" in capsys.readouterr().out
    assert json.loads(out.read_text())["meta"]["heads"] == 2
