"""The book's analyses on any variant (issue 54): each probe against an independent reference on
dot-product attention, and a broken variant giving an error row instead of a traceback."""

from __future__ import annotations

import math
from collections.abc import Iterator

import atlas_variants
import numpy as np
import pandas as pd
import pytest
import torch
from torch import Tensor

from attention_atlas.attention import AttentionResult, register_attention
from attention_atlas.attention.dot import DotProductAttention
from attention_atlas.experiments.atlas.contract import build_seeded, gaussian_input
from attention_atlas.experiments.atlas.probes import (
    COST_COLUMNS,
    DEPTH_COLUMNS,
    RANK_COLUMNS,
    attention_stack,
    collapse_depth,
    cost_figure,
    cost_frame,
    cost_slope,
    cost_table,
    depth_figure,
    depth_frame,
    rank_figure,
    score_rank_frame,
    seed_medians,
)
from attention_atlas.validate import ConfigError

pytestmark = pytest.mark.usefixtures("one_thread")
F64 = torch.float64


@register_attention("test_atlas_probes_raises")
class RaisingAttention(DotProductAttention):
    def attend(self, q: Tensor, k: Tensor, v: Tensor, **kw: object) -> AttentionResult:
        raise RuntimeError("boom\nsecond line")


register_attention("test_atlas_probes_nan")(type("ProbesNaN", (atlas_variants.NaNAttention,), {}))


@register_attention("test_atlas_probes_noweights")
class NoWeightsAttention(DotProductAttention):
    def attend(self, q: Tensor, k: Tensor, v: Tensor, **kw: object) -> AttentionResult:
        return super().attend(q, k, v, **{**kw, "need_weights": False})  # type: ignore[arg-type]


def reference_rank(S: np.ndarray, rtol: float = 1e-9) -> int:
    """Singular values above ``rtol`` times the largest, by numpy's SVD."""
    s = np.linalg.svd(S, compute_uv=False)
    return int((s > rtol * s[0]).sum())


# -- score rank -----------------------------------------------------------------------------


def test_dot_score_rank_is_the_rank_of_the_row_centred_qk_from_its_weights() -> None:
    lengths, dims = [3, 6, 12], [2, 4]
    frame = score_rank_frame("dot", lengths=lengths, head_dims=dims, seed=3)
    assert list(frame.columns) == RANK_COLUMNS and len(frame) == 6
    assert (frame["error"] == "").all() and (frame["note"] == "").all()
    for L, d, rank, full in (
        frame[["length", "d_head", "rank", "full"]].astype(int).to_numpy().tolist()
    ):
        layer = build_seeded("dot", None, dim=d, n_heads=1, seed=3, dtype=F64)
        x = gaussian_input(1, L, d, seed=3, dtype=F64)[0].numpy()
        w = layer.qkv.weight.detach().numpy()  # (3 d, d): rows of W_q, W_k, W_v
        q, k = x @ w[:d].T, x @ w[d : 2 * d].T
        S = q @ k.T / math.sqrt(d)
        expected = reference_rank(S - S.mean(1, keepdims=True))
        assert rank == expected == min(d, L - 1), (L, d, rank, expected)
        assert full == L - 1


def test_riemannian_score_rank_grows_past_the_head_width() -> None:
    """Chapter 1: per-token metrics make the scores non-Gram; dot stays at d_head."""
    geo = score_rank_frame("riemannian", lengths=[16, 32], head_dims=[2], seed=0)
    dot = score_rank_frame("dot", lengths=[16, 32], head_dims=[2], seed=0)
    assert (dot["rank"] == 2).all()
    assert (geo["rank"] > 2 + 1).all(), geo  # past Euclidean's d + 1 after centring too


def test_score_rank_of_a_variant_without_weights_or_that_raises_is_a_row_not_a_crash() -> None:
    none = score_rank_frame("test_atlas_probes_noweights", lengths=[4], head_dims=[2])
    assert math.isnan(none["rank"][0]) and "probs is None" in none["note"][0]
    bad = score_rank_frame("test_atlas_probes_raises", lengths=[4, 8], head_dims=[2])
    assert bad["rank"].isna().all()
    assert (bad["error"] == "RuntimeError: boom second line").all()
    unknown = score_rank_frame("no_such_variant", lengths=[4], head_dims=[2])
    assert unknown["error"][0].startswith("ValueError: unknown attention variant 'no_such_variant'")


def test_a_causal_only_variant_has_no_unmasked_scores_and_says_so() -> None:
    ssm = score_rank_frame("ssm", lengths=[4], head_dims=[2])
    assert math.isnan(ssm["rank"][0]) and ssm["error"][0] == ""
    assert ssm["note"][0].startswith("causal-only variant: no unmasked scores")
    stack = depth_frame("ssm", depth=2, width=8, length=4, residual=True)
    assert (stack["note"] == "causal-only variant: causal stacks").all()
    assert (stack["error"] == "").all() and stack["rel_residual"].notna().all()


# -- depth ----------------------------------------------------------------------------------


def composite_relative_residual(X: np.ndarray) -> float:
    """Dong et al.'s ``||X - 1 xbar^T||_{1,inf} / ||X||_{1,inf}``, by hand:
    ``||A||_{1,inf} = sqrt(max column abs sum * max row abs sum)``."""

    def norm(A: np.ndarray) -> float:
        return math.sqrt(np.abs(A).sum(0).max() * np.abs(A).sum(1).max())

    return norm(X - X.mean(0, keepdims=True)) / norm(X)


@pytest.mark.parametrize("residual", [False, True])
def test_depth_frame_is_the_hand_computed_relative_residual_of_the_stack(residual: bool) -> None:
    depth, width, length = 5, 8, 6
    frame = depth_frame("dot", depth=depth, width=width, length=length, seed=1, residual=residual)
    assert list(frame.columns) == DEPTH_COLUMNS and frame["layer"].tolist() == list(range(6))
    x = gaussian_input(1, length, width, seed=1, dtype=F64)
    expected = [composite_relative_residual(x[0].numpy())]
    with torch.no_grad():
        for layer in attention_stack("dot", None, depth=depth, width=width, n_heads=1, seed=1):
            out = layer(x).out
            x = x + out if residual else out
            expected.append(composite_relative_residual(x[0].numpy()))
    np.testing.assert_allclose(frame["rel_residual"], expected, rtol=1e-9, atol=1e-14)  # round-off


def test_pure_attention_collapses_and_residual_connections_prevent_it() -> None:
    frames = [depth_frame("dot", depth=6, width=8, length=6, seed=s, residual=r)
              for s in (0, 1) for r in (False, True)]  # fmt: skip
    depths = collapse_depth(pd.concat(frames))
    assert list(depths.columns) == ["variant", "residual", "seed", "collapse_layer"]
    pure = depths[~depths["residual"]]["collapse_layer"]
    assert (pure <= 6).all(), depths
    assert depths[depths["residual"]]["collapse_layer"].isna().all(), depths


def test_collapse_depth_reads_the_first_layer_below_the_floor() -> None:
    rows = [(0, 0.9), (1, 1e-3), (2, 1e-13), (3, 0.0)]
    frame = pd.DataFrame([{"variant": "v", "residual": False, "seed": 0, "layer": i,
                           "rel_residual": r} for i, r in rows])  # fmt: skip
    assert collapse_depth(frame)["collapse_layer"].tolist() == [2.0]
    frame["rel_residual"] = 0.5
    assert math.isnan(collapse_depth(frame)["collapse_layer"][0])


def test_depth_frame_of_a_broken_variant_is_rows_with_the_error() -> None:
    bad = depth_frame("test_atlas_probes_raises", depth=3, width=8, length=4, residual=False)
    assert len(bad) == 4 and bad["rel_residual"][1:].isna().all()
    assert (bad["error"] == "RuntimeError: boom second line").all()
    nan = depth_frame("test_atlas_probes_nan", depth=3, width=8, length=4, residual=True)
    assert (nan["error"] == "non-finite output at layer 1").all()
    assert nan["rel_residual"][0] > 0 and nan["rel_residual"][1:].isna().all()


# -- cost -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dot_cost() -> Iterator[pd.DataFrame]:
    """One cost frame of dot-product attention, on one thread (timed by its CPU time)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield cost_frame("dot", lengths=[8, 16], dim=16, n_heads=2, batch=2, reps=2, seed=0,
                     warmup=1, min_sample_s=0.002)  # fmt: skip
    torch.set_num_threads(before)


def test_cost_frame_times_the_variant_beside_sdpa(dot_cost: pd.DataFrame) -> None:
    f = dot_cost
    assert list(f.columns) == COST_COLUMNS and len(f) == 4
    assert f["pass"].tolist() == ["forward", "forward+backward"] * 2
    assert (f["error"] == "").all()
    assert (f["ms"] > 0).all() and (f["ms_sdpa"] > 0).all()
    assert (f["ratio"] == f["ms"] / f["ms_sdpa"]).all()
    assert (f["peak_mb"] >= 0).all() and (f["floor_ratio"] > 0).all()
    assert (f["clock"] == "cpu").all() and (f["memory_method"] == "torch.profiler live tensor bytes").all()  # fmt: skip


def test_cost_frame_counts_the_flops_of_sdpa_exactly(dot_cost: pd.DataFrame) -> None:
    """SDPA: q k^T and P v, 2 B H L^2 d each forward; backward recomputes q k^T and takes four
    more products (dv, dP, dq, dk): 14 B H L^2 d in all."""
    B, H, d = 2, 2, 8
    for row in dot_cost.to_dict("records"):
        per = B * H * row["length"] ** 2 * d
        assert row["flops_sdpa"] == (4 if row["pass"] == "forward" else 14) * per, row
        assert row["flops"] == row["flops_sdpa"]  # dot's attend is SDPA
        assert row["gflops_per_s"] == pytest.approx(row["flops"] / (row["ms"] * 1e-3) / 1e9)


def test_cost_slope_fits_each_pass(dot_cost: pd.DataFrame) -> None:
    slopes = cost_slope(dot_cost)
    assert slopes["pass"].tolist() == ["forward", "forward+backward"]
    assert np.isfinite(slopes[["slope", "slope_sdpa"]].to_numpy()).all()
    assert (slopes["n_lengths"] == 2).all()


def test_cost_frame_of_a_variant_that_raises_is_error_rows() -> None:
    f = cost_frame("test_atlas_probes_raises", lengths=[8, 16], dim=8, n_heads=2, reps=1,
                   min_sample_s=0.001)  # fmt: skip
    assert len(f) == 4 and f["ms"].isna().all()
    assert f["error"].tolist()[:2] == ["RuntimeError: boom second line"] * 2
    assert f["error"].tolist()[2:] == ["not run: length 8 failed"] * 2


# -- figures --------------------------------------------------------------------------------


def test_rank_figure_has_a_slider_over_head_widths_that_changes_the_traces() -> None:
    frame = pd.concat([score_rank_frame(v, lengths=[4, 8], head_dims=[2, 3], seed=0)
                       for v in ("dot", "euclidean")])  # fmt: skip
    fig = rank_figure(frame)
    steps = fig.layout.sliders[0].steps
    assert [s.label for s in steps] == ["2", "3"]
    assert steps[0].args[0]["visible"] != steps[1].args[0]["visible"]
    assert {t.name for t in fig.data} >= {"dot", "euclidean", "full (L - 1)", "d_head = 3"}


def test_depth_figure_draws_log10_residuals_with_and_without_residuals() -> None:
    frame = pd.concat([depth_frame("dot", depth=3, width=8, length=4, seed=s, residual=r)
                       for s in (0, 1) for r in (False, True)])  # fmt: skip
    fig = depth_figure(frame)
    names = {t.name for t in fig.data}
    assert {"dot, no residual (n=2)", "dot, with residual (n=2)"} <= names
    line = next(t for t in fig.data if t.name == "dot, no residual (n=2)")
    wide = frame[~frame.residual].pivot_table(index="seed", columns="layer", values="rel_residual")
    expected = np.log10(np.clip(wide.to_numpy(), 1e-18, None)).mean(axis=0)  # mean of the logs
    np.testing.assert_allclose(np.asarray(line.y, dtype=float), expected, rtol=1e-12)


def test_cost_figure_switches_between_passes(dot_cost: pd.DataFrame) -> None:
    fig = cost_figure(dot_cost)
    buttons = fig.layout.updatemenus[0].buttons
    assert [b.label for b in buttons] == ["forward", "forward+backward"]
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"
    assert sum(buttons[0].args[0]["visible"]) == 2  # the variant and SDPA


# -- bad arguments --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: score_rank_frame("dot", lengths=[], head_dims=[2]),
         "score_rank_frame lengths: expected a non-empty list of integers >= 1, got \\[\\]"),
        (lambda: score_rank_frame("dot", lengths=[4], head_dims=[0]),
         "score_rank_frame head_dims: expected a non-empty list of integers >= 1, got \\[0\\]"),
        (lambda: depth_frame("dot", depth=0, width=8, length=4, residual=False),
         "depth_frame depth: expected an integer >= 1, got 0"),
        (lambda: cost_frame("dot", lengths=[8], dim=10, n_heads=4),
         "cost_frame dim: expected a multiple of n_heads=4, got 10"),
        (lambda: cost_frame("dot", lengths=[8], dim=8, n_heads=2, batch=0),
         "cost_frame batch: expected an integer >= 1, got 0"),
    ],
)  # fmt: skip
def test_bad_arguments_are_refused_in_one_line_before_any_work(call: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        call()  # type: ignore[operator]


def test_seeds_are_summarised_by_medians_and_geometric_ratios(dot_cost: pd.DataFrame) -> None:
    """Three seeds of made-up timings: seed_medians takes the median per length and pass, and
    cost_table's ratio at the longest length is the geometric mean of the seeds' ratios."""
    frames = []
    for seed, factor in enumerate((1.0, 2.0, 4.0)):
        f = dot_cost.copy()
        f["seed"], f["ms"] = seed, f["ms"] * factor
        f["ratio"] = f["ms"] / f["ms_sdpa"]
        frames.append(f)
    three = pd.concat(frames, ignore_index=True)
    med = seed_medians(three).set_index(["pass", "length"])
    one = dot_cost.set_index(["pass", "length"])
    np.testing.assert_allclose(med["ms"], 2.0 * one.loc[med.index, "ms"], rtol=1e-12)
    table = cost_table(three).set_index("pass")
    top = three[three.length == 16].set_index(["pass", "seed"])["ratio"]
    for p in ("forward", "forward+backward"):
        geo = math.exp(np.log(top.loc[p].to_numpy()).mean())
        assert table.loc[p, "ratio to SDPA"].startswith(f"{geo:.2f} [")
        assert table.loc[p, "length"] == 16
