"""The benchmark harness: interleaved timing, ratios against a baseline, peak memory, JSON.

The arithmetic of :func:`compare` is checked on a scripted clock; claims about how long real
kernels take belong in ``benchmarks/`` (``benchmarks/bench_compare.py`` for this harness)."""

from __future__ import annotations

import json

import pytest
import torch

from attention_atlas.bench import timing as bench
from attention_atlas.bench.timing import bench_attention, compare, format_table, peak_memory

torch.set_num_threads(1)  # tiny ops on a shared 2-core machine: threads only contend


def test_compare_reports_medians_quartiles_and_per_round_ratios_of_its_samples(
    monkeypatch, tmp_path
):
    # A scripted clock instead of the machine's: "three" costs 3x "one", forward+backward 2x
    # forward, and every round is slower than the last by the same factor for both (a load
    # that grows between rounds: 2, 5, 10 times the warm-up), so each round's ratio is exactly 3 while medians move.
    cost = {"one": 1e-3, "three": 3e-3}
    calls: list[tuple[str, bool]] = []

    def make(name):
        def fn(x):
            calls.append((name, torch.is_grad_enabled()))
            return x * 1.0

        return fn

    def scripted_time(step, number, device, clock="wall"):
        step()
        name, grad = calls[-1]
        k = calls.count(calls[-1]) - 1  # 0: the warm-up call, then rounds 1, 2, 3
        return cost[name] * (2.0 if grad else 1.0) * (1 + k * k)

    monkeypatch.setattr(bench, "time_steps", scripted_time)
    x = torch.randn(4, requires_grad=True)
    res = compare(
        {"one": make("one"), "three": make("three")}, "one", (x,), reps=3, warmup=1,
        min_sample_s=0.01, memory=False, json_path=tmp_path / "r.json",
    )  # fmt: skip
    r = res["results"]
    # calls per sample: ceil(min_sample_s / warm-up time)
    assert [r[n][m]["number"] for n in cost for m in ("forward", "forward_backward")] == [
        10, 5, 4, 2,
    ]  # fmt: skip
    one = r["one"]["forward"]
    assert one["samples_s"] == pytest.approx([2e-3, 5e-3, 10e-3])
    assert (one["median_s"], one["q25_s"], one["q75_s"]) == pytest.approx((5e-3, 3.5e-3, 7.5e-3))
    assert r["three"]["forward_backward"]["median_s"] == pytest.approx(2 * 3 * 5e-3)
    for m in ("forward", "forward_backward"):
        assert r["one"][m]["ratio_median"] == r["one"][m]["ratio_q25"] == 1.0
        three = r["three"][m]
        assert (three["ratio_q25"], three["ratio_median"], three["ratio_q75"]) == pytest.approx(
            (3.0, 3.0, 3.0)
        )
    # rounds are interleaved, the order rotating: one three | three one | one three
    timed = [n for n, grad in calls if not grad][2:]  # forward calls after the warm-up
    assert timed == ["one", "three", "three", "one", "one", "three"]
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["baseline"] == "one" and set(saved["results"]) == {"one", "three"}
    assert saved["results"]["three"]["forward"]["ratio_median"] == pytest.approx(3.0)
    assert "three" in format_table(res)


def test_compare_settles_each_function_right_before_each_of_its_samples(monkeypatch):
    """``settle``: untimed calls of the same function just before each timed sample (so no
    sample pays for the caches the function before it left), none of them timed."""
    calls: list[str] = []
    timed: list[str] = []

    def make(name):
        def fn(x):
            calls.append(name)
            return x * 1.0

        return fn

    def scripted_time(step, number, device, clock="wall"):
        step()
        timed.append(calls[-1])
        return 1e-3

    monkeypatch.setattr(bench, "time_steps", scripted_time)
    x = torch.randn(4)
    compare({"a": make("a"), "b": make("b")}, "a", (x,), reps=2, warmup=1, backward=False,
            memory=False, settle=2)  # fmt: skip
    # warm-up a, b; then per round and function two untimed calls and the timed one
    assert calls == ["a", "b"] + ["a"] * 3 + ["b"] * 3 + ["b"] * 3 + ["a"] * 3
    assert timed == ["a", "b", "a", "b", "b", "a"]


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
