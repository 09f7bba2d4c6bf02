"""Chapter 7's scaling experiment (experiments/ssd_scaling.py): counted FLOPs against their
closed forms, the sweep's skipping rules and memory modes, the analysis on rows with known
exponents, and tiny grids through the sweep runner. No timing value is asserted here (timing
claims belong to benchmarks/bench_ssd.py)."""

from __future__ import annotations

import math

import pytest

from attention_atlas.experiments import EXPERIMENTS, experiment
from attention_atlas.experiments.sma.scaling import (
    PARTS,
    PRESETS,
    chapter_grid,
    crossover,
    flop_growth,
    make_inputs,
    quadratic_bytes,
    run_cell,
    sweep_summary,
    sweep_table,
    time_memory_sweep,
)
from attention_atlas.sweep.runner import make_cells, run_sweep

TINY = {"heads": 2, "head_dim": 4, "state": 4}


def test_ssd_scaling_is_a_registered_experiment_with_the_runner_interface() -> None:
    mod = experiment("ssd-scaling")
    assert EXPERIMENTS["ssd-scaling"] == mod.__name__
    assert {"smoke", "book", "long"} <= set(mod.PRESETS)
    assert set(chapter_grid(**PRESETS["long"])) == set(PARTS)
    assert set(chapter_grid(**PRESETS["book"])) == {"sweep", "flops"}
    with pytest.raises(ValueError, match="unknown part"):
        chapter_grid(parts=["sweep", "fft"])


@pytest.mark.parametrize("chunk", [16, 64])
def test_flops_are_the_closed_forms_and_grow_2x_chunked_4x_quadratic_per_doubling(
    chunk: int,
) -> None:
    """Matrix products only: quadratic ``2 h L^2 (n + p)`` (scores, then M x); chunked
    ``2 h L (Q (n + p) + 2 n p)`` (intra-chunk scores and outputs, chunk states, state to
    output), for L a multiple of the chunk length Q; a single chunk from a zero state has no
    state work, ``2 h L Q (n + p)``."""
    lengths = [64, 128, 256, 512]
    h, p, n = 2, 8, 4
    res = flop_growth(lengths, chunk_size=chunk, heads=h, head_dim=p, state=n)
    for L, fc, fq in zip(lengths, res["flops"]["chunked"], res["flops"]["quadratic"]):
        assert fq == 2 * h * L**2 * (n + p)
        states = 2 * n * p if L > chunk else 0
        assert fc == 2 * h * L * (chunk * (n + p) + states)
    growth = res["growth"]["chunked"]
    assert growth[1:] == [2.0, 2.0]
    assert growth[0] == (
        2.0 if chunk < 64 else 2 * (chunk * (n + p) + 2 * n * p) / (chunk * (n + p))
    )
    assert res["growth"]["quadratic"] == [4.0, 4.0, 4.0]


def test_sweep_measures_every_method_at_every_length_within_its_caps() -> None:
    rows = time_memory_sweep([32, 64], reps=1, max_seconds=60.0, **TINY)
    table = sweep_table(rows)
    assert len(table) == 8 and len(rows) == 8  # 4 methods x 2 lengths, nothing skipped
    assert sorted(set(table.method)) == ["chunked", "quadratic", "recurrent", "sdpa"]
    assert (table.median_s > 0).all() and (table.peak_bytes > 0).all()
    assert (table[table.method == "chunked"].ratio_to_chunked == 1.0).all()
    quad = table[table.method == "quadratic"].set_index("length")
    for L in (32, 64):  # the quadratic form holds at least M (heads, L, L) in float32
        assert quad.loc[L, "peak_bytes"] >= TINY["heads"] * L * L * 4
        assert quad.loc[L, "note"] == "all heads" and not quad.loc[L, "peak_predicted"]


def test_sweep_drops_a_method_from_the_length_where_its_predicted_time_exceeds_the_cap() -> None:
    rows = time_memory_sweep([32, 64], reps=1, max_seconds=0.0, memory=False, **TINY)
    measured = [r for r in rows if r["length"]]
    assert {(r["method"], r["length"]) for r in measured} == {
        (m, 32) for m in ("chunked", "quadratic", "recurrent", "sdpa")
    }
    skips = {r["method"]: r["note"] for r in rows if not r["length"]}
    assert set(skips) == {"chunked", "quadratic", "recurrent", "sdpa"}
    assert all(note.startswith("skipped from L=64: predicted") for note in skips.values())
    with pytest.raises(ValueError, match="needs the chunked method"):
        time_memory_sweep([32], methods=("quadratic",), reps=1, **TINY)


def test_quadratic_form_runs_head_by_head_when_all_heads_exceed_the_budget() -> None:
    inputs = make_inputs(32, **TINY)
    one, all_heads = quadratic_bytes(inputs, per_head=True), quadratic_bytes(inputs)
    assert all_heads == TINY["heads"] * one == 3 * TINY["heads"] * 32 * 32 * 4
    rows = time_memory_sweep(
        [32], methods=("chunked", "quadratic"), reps=1, budget_bytes=(one + all_heads) / 2, **TINY
    )
    (quad,) = [r for r in rows if r["method"] == "quadratic"]
    assert quad["note"] == f"one head timed x {TINY['heads']} (head by head)"
    assert quad["peak_predicted"] and quad["peak_bytes"] == all_heads
    rows = time_memory_sweep(
        [32], methods=("chunked", "quadratic"), reps=1, budget_bytes=one / 2, **TINY
    )
    assert rows[-1] == {
        "method": "quadratic",
        "length": None,
        "note": "skipped from L=32: skipped: one head exceeds the memory budget",
    }


def synthetic_rows(exponents: dict[str, float], scale: dict[str, float]) -> list[dict]:
    """Rows with ``median_s = scale L^exponent`` and ``peak_bytes = 2^20 L^exponent``."""
    return [
        {"method": m, "length": L, "note": "", "median_s": scale[m] * L**e,
         "peak_bytes": 2**20 * L**e, "ratio_to_chunked": scale[m] * L**e / (scale["chunked"] * L)}
        for L in (64, 128, 256, 512) for m, e in exponents.items()
    ]  # fmt: skip


def test_summary_recovers_known_exponents_crossovers_and_the_last_quadratic_length() -> None:
    """chunked ``t = L / 100``, quadratic ``t = L^2 / 10^4``: the times cross at L = 100."""
    rows = synthetic_rows({"chunked": 1.0, "quadratic": 2.0}, {"chunked": 1e-2, "quadratic": 1e-4})
    rows.append({"method": "quadratic", "length": None, "note": "skipped from L=1024: (why)"})
    s = sweep_summary(rows)
    assert s["slope"] == pytest.approx({"chunked": 1.0, "quadratic": 2.0}, rel=1e-12)
    assert s["memory_slope"] == pytest.approx({"chunked": 1.0, "quadratic": 2.0}, rel=1e-12)
    assert s["crossover"]["quadratic"] == pytest.approx(100.0, rel=1e-12)  # log-log interpolated
    assert s["crossover"]["sdpa"] is None and s["crossover"]["recurrent"] is None  # not measured
    assert crossover(rows, "quadratic", "chunked") == 64.0  # faster at the smallest L measured
    assert s["quadratic_last"] == (512, pytest.approx(512 / 100))
    assert s["skips"] == ["quadratic (skipped from L=1024: (why))"]
    later = synthetic_rows({"chunked": 1.0, "quadratic": 2.0}, {"chunked": 1.0, "quadratic": 1e-3})
    assert crossover(later, "chunked", "quadratic") is None  # they cross at L = 1000 > 512


def test_crossover_is_none_when_the_curves_never_cross() -> None:
    rows = synthetic_rows({"chunked": 1.0, "quadratic": 1.0}, {"chunked": 2.0, "quadratic": 1.0})
    assert crossover(rows, "chunked", "quadratic") is None
    assert math.isclose(crossover(rows, "quadratic", "chunked") or 0.0, 64.0)


def test_a_tiny_grid_runs_through_the_sweep_runner_and_resumes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    grid = chapter_grid(
        parts=["sweep", "flops", "ratio", "accuracy"], lengths=[32, 64], flop_lengths=[64, 128],
        ratio_lengths=[64], accuracy_length=40, reps=1, ratio_reps=1, chunk_size=16, **TINY,
    )  # fmt: skip
    df = run_sweep(make_cells(grid, [0]), run_cell, tmp_path, log=None)
    assert sorted(df.config) == ["accuracy", "flops", "ratio", "sweep"]
    row = df.set_index("config")
    assert row.loc["flops", "growth_chunked_max"] == row.loc["flops", "growth_chunked_min"] == 2.0
    assert row.loc["flops", "growth_quadratic_max"] == 4.0
    assert {"slope_chunked", "crossover_quadratic", "speedup_64", "rel_fro_weak"} <= set(df)
    assert 0.0 < row.loc["accuracy", "rel_fro_strong"] < 1e-4  # float32 rounding, not zero
    again = run_sweep(make_cells(grid, [0]), run_cell, tmp_path, log=None)
    assert list(again.cell_seconds) == list(df.cell_seconds)  # finished cells are reused
