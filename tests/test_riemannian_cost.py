"""Chapter 3's experiments: identities in float64, FLOP counts against the count by hand, the
score and attention paths against references, and the tables built from timings. No test asserts
a timing (timing claims belong in benchmarks)."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

from attention_atlas.attention.riemannian import geodesic_attention_reference
from attention_atlas.bench.timing import count_flops
from attention_atlas.experiments.low_rank import bench as rb
from attention_atlas.experiments.low_rank import cost as rc

DT = torch.float64


def test_identities_hold_to_round_off():
    g = torch.Generator().manual_seed(0)
    wood = rc.woodbury_identities(generator=g, shapes=[(4, 1), (32, 3)])
    assert list(wood["d"]) == [4, 32]
    assert (wood.drop(columns=["d", "r"]) < 1e-12).all().all()
    ident = rc.score_identities(generator=g, shapes=[(6, 3, 1), (9, 4, 2)])
    assert (ident.drop(columns=["L", "d", "r"]) < 1e-12).all().all()


def test_dense_solve_inverts_the_metric():
    g = torch.Generator().manual_seed(1)
    U = torch.randn(3, 7, 2, generator=g, dtype=DT)
    x = torch.randn(3, 7, generator=g, dtype=DT)
    y = rc.dense_solve(U, x)
    gx = y + torch.einsum("tdr,ter,te->td", U, U, y)  # (I + U U^T) y, written out
    assert float((gx - x).abs().max()) < 1e-12
    assert rc.rel_error(x, x) == 0.0


def test_work_per_pair_counts():
    table = rc.work_per_pair(dims=(16, 64), ranks=(4,))
    row = table[table["d"] == 64].iloc[0]
    assert row["direct_2rd_plus_d"] == 9 * 64 and row["paper_claim_d_plus_r"] == 68
    assert row["augmented"] == 64 * 64 + 3 * 64 + 1
    assert row["direct_over_dot"] == row["direct_2rd_plus_d"] / row["dot"]


def test_eq16_flops_are_2r_plus_1_dot_products_per_pair():
    # counted: q.k (2 L^2 d), U_i^T k_j and U_j^T q_i (2 L^2 d r each); the per-token U^T q,
    # U^T k are elementwise products (not matrix products, so not counted): a ratio of exactly
    # 2r + 1, far from Proposition 4.3's 1 + r / d
    L = 64
    flops = rc.flop_ratios(dims=(8, 32), ranks=(1, 4), length=L)
    assert len(flops) == 4
    r = flops["r"]
    assert np.allclose(flops["eq16_over_dot"], 2 * r + 1, rtol=0, atol=1e-12)
    assert np.allclose(flops["paper_1_plus_r_over_d"], 1 + r / flops["d"])
    # the metric terms: 2 r d multiply-adds per pair (4 r d FLOPs)
    assert np.allclose(flops["metric_per_pair"], 4 * r * flops["d"], rtol=0, atol=1e-12)


def test_path_flops_count_every_product_by_hand_on_shape_only_tensors():
    for d, r, L in ((4, 1, 16), (16, 4, 100), (64, 8, 4096)):
        f = rc.path_flops(d, r, L)
        assert f["dot"] == 2 * L * L * d
        # q.k, U_i^T k_j and U_j^T q_i as matrix products; the per-token U^T q, U^T k elementwise
        assert f["eq16_decomposed"] == 2 * L * L * d * (2 * r + 1)
        # the same count as real tensors (checked at the small sizes)
        if L <= 100:
            q, k = torch.randn(1, 1, L, d), torch.randn(1, 1, L, d)
            U = torch.randn(1, 1, L, d, r)
            real = {n: count_flops(fn, q, k, U) for n, fn in rc.score_paths(1.0).items()}
            assert real == f
    with pytest.raises(ValueError, match="d must be a positive integer"):
        rc.path_flops(0, 1, 8)


def test_woodbury_flops_are_2d_r2_plus_2r_per_token():
    w = rc.woodbury_flops(dims=(8, 100), ranks=(1, 5))
    assert list(w["flops"]) == [2 * d * (r * r + 2 * r) for d in (8, 100) for r in (1, 5)]
    assert (w["flops"] == w["count"]).all()
    with pytest.raises(ValueError, match="dims and ranks"):
        rc.woodbury_flops(dims=(0,))


def test_score_paths_agree_with_the_definition():
    q, k, U = rc.score_inputs(10, 4, 2, generator=torch.Generator().manual_seed(3), heads=2)
    assert q.shape == (1, 2, 10, 4) and U.shape == (1, 2, 10, 4, 2)
    q, k, U = q.double(), k.double(), U.double()
    paths = rc.score_paths(1.7)
    diff = q[..., :, None, :] - k[..., None, :, :]
    A = U @ U.transpose(-1, -2)
    g = torch.eye(4, dtype=DT) + (A[..., :, None, :, :] + A[..., None, :, :, :]) / 2
    ref = -torch.einsum("...a,...ab,...b->...", diff, g, diff) / 1.7
    for name in ("eq15_materialised", "eq16_decomposed", "augmented_gemm"):
        assert float((paths[name](q, k, U) - ref).abs().max() / ref.abs().max()) < 1e-12, name
    assert torch.equal(paths["dot"](q, k, U), q @ k.transpose(-1, -2))


def test_score_cost_tables_every_path_against_dot():
    cost = rc.score_cost([32], [4], [1, 2], reps=1, generator=torch.Generator().manual_seed(4))
    assert len(cost) == (1 + 1 + 2) * 4  # settings x paths
    assert list(cost["sweep"].unique()) == ["L", "d", "r"]
    assert (cost[cost["path"] == "dot"]["ratio"] == 1.0).all()  # each round against itself
    assert (cost["ms"] > 0).all()
    xs, series = rc.cost_series(cost, "r")
    assert list(xs) == [1, 2] and set(series) == set(rc.score_paths(1.0))
    assert list(series["dot"]) == list(cost[(cost["sweep"] == "r") & (cost["path"] == "dot")]["ms"])


def test_marginal_fit_recovers_a_line():
    marginal = pd.DataFrame({"d": [16, 32, 64], "marginal_ms_per_r": [0.5 + 0.01 * d for d in (16, 32, 64)]})  # fmt: skip
    a, b = rc.marginal_fit(marginal)
    assert a == pytest.approx(0.5, abs=1e-12) and b == pytest.approx(0.01, abs=1e-12)
    m = rc.marginal_rank_cost([4], reps=1, generator=torch.Generator().manual_seed(5), length=16)
    assert m.iloc[0]["marginal_ms_per_r"] == pytest.approx((m.iloc[0]["ms_r16"] - m.iloc[0]["ms_r1"]) / 15)  # fmt: skip


def test_attention_paths_match_the_reference_in_float64():
    q, k, v, U = rb.attention_inputs(1, 2, 24, 4, 2, dtype=DT, seed=7)
    assert all(t.requires_grad for t in (q, k, v, U))
    tau = math.sqrt(8)
    for causal in (False, True):
        ref = geodesic_attention_reference(q, k, v, U, tau, causal)[0].detach()
        paths = rb.attention_paths(tau, causal)
        for name in ("geodesic_augmented", "geodesic_sdpa_padded", "geodesic_lowrank"):
            out = paths[name](q, k, v, U).detach()
            assert float((out - ref).abs().max()) < 1e-10, (name, causal)


def test_live_attention_and_woodbury_measurements_report_their_errors():
    live = rb.live_attention(32, reps=1, generator=torch.Generator().manual_seed(8))
    assert live["max_abs_diff"] < 1e-4 and live["peak_MiB"] > 0
    assert set(live) == {"forward_ratio", "fwd_bwd_ratio", "threads", "peak_MiB", "max_abs_diff"}
    wood = rc.woodbury_vs_dense(2, reps=1, generator=torch.Generator().manual_seed(9), d=48, r=3)
    assert wood["rel_err"] < 1e-12
    res = wood["compare"]["results"]
    assert wood["speedup"] == 1 / res["woodbury"]["forward"]["ratio_median"]
    assert rb.peak_memory_at(64, d=4, r=2, heads=1).keys() == {
        "sdpa", "geodesic_augmented", "geodesic_sdpa_padded",
    }  # fmt: skip


def test_memory_scaling_sees_the_references_quadratic_memory():
    # the instrument's positive control: the materialised reference stores (L, L) and (L, L, r)
    # tensors, so its peak memory grows as L^2, and the fast path's linearly
    frame, slopes = rb.memory_scaling([64, 128, 256], d=4, r=2)
    assert set(frame["path"]) == {"sdpa", "geodesic_augmented", "geodesic_sdpa_padded", "reference"}
    ref = frame[frame["path"] == "reference"].sort_values("L")["MiB"].to_numpy()
    assert slopes["reference"] == pytest.approx(np.polyfit(np.log([64, 128, 256]), np.log(ref), 1)[0])  # fmt: skip
    assert slopes["reference"] > 1.8 and slopes["geodesic_augmented"] < 1.2
    with pytest.raises(ValueError, match="at least two lengths"):
        rb.memory_scaling([64])


def test_outcomes_cover_every_cost_claim_and_fail_on_broken_inputs():
    from attention_atlas import claims

    mine = {c.key for c in claims.CLAIMS if c.module.endswith(".low_rank")}
    found = rc.outcomes(smoke=True)
    assert set(found) == mine and all(isinstance(o, claims.Outcome) for o in found.values())
    assert found["riemannian/prop-4.1"].outcome == "supported"
    assert found["riemannian/prop-4.3"].outcome == "contradicted"  # 2r + 1, not 1 + r/d
    from attention_atlas.notebooks.chapters import repo_root

    headings = (repo_root() / "notebooks" / "03_low_rank_geometry_cost.py").read_text()
    for c in claims.CLAIMS:
        if c.key in mine:  # the claim's section is a heading of its chapter
            assert f"# ## {c.section}\n" in headings, c.section
    g = torch.Generator().manual_seed(0)
    wood, ident = rc.woodbury_identities(generator=g), rc.score_identities(generator=g)
    flops, wflops = rc.flop_ratios(), rc.woodbury_flops()
    broken = rc.chapter_outcomes(wood + 1e-6, ident + 1e-6, flops, wflops.assign(flops=wflops["flops"] + 1))  # fmt: skip
    assert broken["riemannian/prop-4.1"].outcome == "contradicted"
    assert broken["riemannian/prop-4.2"].outcome == "contradicted"
    # a count that did match 1 + r/d (and did not grow with d) would support 4.2-cost and 4.3
    paper = flops.assign(eq16_over_dot=flops["paper_1_plus_r_over_d"], metric_per_pair=2.0 * flops["r"])  # fmt: skip
    fake = rc.chapter_outcomes(wood, ident, paper, wflops)
    assert fake["riemannian/prop-4.3"].outcome == "supported"
    assert fake["riemannian/prop-4.2-cost"].outcome == "supported"


def test_benchmark_artifact_is_read_into_tables(tmp_path):
    def timing(fwd, both):
        return {"forward": {"ratio_median": fwd}, "forward_backward": {"ratio_median": both}}

    bench = {
        "threads": 1,
        "vs_sdpa_causal=False": {"results": {"sdpa": {**timing(1.0, 1.0), "peak_memory_bytes": 2**20}}},
        "vs_sdpa_causal=True": {"results": {"geodesic_augmented": timing(9.5, 11.0)}},
        "peak_memory_bytes_fwd_bwd_B1_H2": {"2048": {"sdpa": 2 * 2**20}, "1024": {"sdpa": 2**20}},
    }  # fmt: skip
    path = tmp_path / "riemannian.json"
    assert rb.load_benchmark(path) is None  # no file
    path.write_text(json.dumps({"threads": 1}))
    assert rb.load_benchmark(path) is None  # no SDPA comparison in it
    path.write_text(json.dumps(bench))
    loaded = rb.load_benchmark(path)
    assert loaded is not None
    table = rb.benchmark_table(loaded)
    assert list(table["causal"]) == [False, True]
    assert table.iloc[0]["peak_MiB"] == 1.0 and math.isnan(table.iloc[1]["peak_MiB"])
    assert table.iloc[1]["fwd_bwd_ratio"] == 11.0
    assert rb.benchmark_memory(loaded) == ([1024, 2048], {"sdpa": [1.0, 2.0]})
    assert rb.benchmark_memory({"threads": 1}) == ([], {})
