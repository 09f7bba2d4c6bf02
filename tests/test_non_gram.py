"""Chapter 1's experiments: the rank of geodesic score matrices (Theorem 3.2), against an
explicit separable expansion of the score and numpy's rank."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attention_atlas.attention.riemannian import augmented_dim
from attention_atlas.experiments import non_gram as ng

DT = torch.float64
RTOL = 1e-9


def upper(M: torch.Tensor, off_diagonal_weight: float) -> torch.Tensor:
    """Upper triangle of symmetric ``M (..., d, d)`` as a vector, off-diagonal entries times
    ``off_diagonal_weight`` (so ``<A, B>_F = upper(A, 2) . upper(B, 1)``)."""
    d = M.shape[-1]
    i, j = torch.triu_indices(d, d)
    w = torch.where(i == j, 1.0, off_diagonal_weight).to(M.dtype)
    return M[..., i, j] * w


def separable_factors(q, k, U, tau):
    """``Phi (L, (d+1)(d+2))``, ``Psi (L, (d+1)(d+2))`` with ``S = Phi Psi^T``: the expansion of
    the heterogeneous score into functions of token i times functions of token j."""
    A = U @ U.transpose(-1, -2)  # A_t = U_t U_t^T
    qAq = torch.einsum("ia,iab,ib->i", q, A, q)
    kAk = torch.einsum("ja,jab,jb->j", k, A, k)
    one = torch.ones(q.shape[0], 1, dtype=q.dtype)
    phi = torch.cat(
        [
            ((q * q).sum(-1) + qAq / 2)[:, None],  # pairs with 1
            one,  # pairs with |k_j|^2 + k_j^T A_j k_j / 2
            q,  # pairs with -2 k_j - A_j k_j
            torch.einsum("iab,ib->ia", A, q),  # A_i q_i, pairs with -k_j
            upper(A, 2.0),  # A_i, pairs with k_j k_j^T / 2
            upper(q[:, :, None] * q[:, None, :], 1.0),  # q_i q_i^T, pairs with A_j / 2
        ],
        1,
    )
    psi = torch.cat(
        [
            one,
            ((k * k).sum(-1) + kAk / 2)[:, None],
            -2 * k - torch.einsum("jab,jb->ja", A, k),
            -k,
            upper(k[:, :, None] * k[:, None, :], 1.0) / 2,
            upper(A, 2.0) / 2,
        ],
        1,
    )
    return -phi / tau, psi


def test_heterogeneous_scores_factor_through_d_plus_1_times_d_plus_2_functions():
    # the expansion of chapter 1's table reproduces S, so rank S <= (d+1)(d+2); numpy's rank of
    # a long score matrix then shows the bound is attained
    for d, r in ((2, 1), (3, 2), (4, 3)):
        g = torch.Generator().manual_seed(d)
        L = 2 * ng.generic_rank("heterogeneous", d)
        q, k, U = ng.score_inputs(L, d, r, "heterogeneous", g)
        phi, psi = separable_factors(q, k, U, 1.7)
        S = ng.score_matrix(q, k, U, "heterogeneous", 1.7)
        assert phi.shape[1] == ng.generic_rank("heterogeneous", d) == (d + 1) * (d + 2)
        assert float((S - phi @ psi.T).abs().max() / S.abs().max()) < 1e-12
        assert np.linalg.matrix_rank(S.numpy()) == ng.score_rank(S, RTOL) == (d + 1) * (d + 2)


@pytest.mark.parametrize("kind", ng.KINDS)
def test_generic_rank_is_numpys_rank_of_a_long_score_matrix(kind):
    for d in (2, 3, 5):
        q, k, U = ng.score_inputs(60, d, 2, kind, torch.Generator().manual_seed(d))
        S = ng.score_matrix(q, k, U, kind).numpy()
        assert np.linalg.matrix_rank(S) == ng.generic_rank(kind, d), (kind, d)


def test_score_inputs_kinds_and_errors():
    g = torch.Generator().manual_seed(0)
    _, _, U = ng.score_inputs(5, 3, 2, "homogeneous", g)
    assert torch.equal(U[0], U[4])
    _, _, U = ng.score_inputs(5, 3, 2, "heterogeneous", g)
    assert not torch.equal(U[0], U[4])
    q, k, U = ng.score_inputs(5, 3, 2, "dot", g)
    assert float(U.abs().max()) == 0.0
    assert torch.allclose(ng.score_matrix(q, k, U, "dot"), q @ k.T)
    with pytest.raises(ValueError, match="kind must be one of"):
        ng.score_inputs(5, 3, 2, "cosine", g)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="kind must be one of"):
        ng.generic_rank("cosine", 3)  # type: ignore[arg-type]


def test_probe_lengths_bracket_the_generic_rank():
    assert ng.probe_lengths(3) == [2, 3, 6, 19, 20, 21, 30]


def test_rank_table_and_rank_against_length_find_min_L_generic_rank():
    df = ng.rank_table([2, 3], generator=torch.Generator().manual_seed(0), rtol=RTOL)
    assert len(df) == 4 * (len(ng.probe_lengths(2)) + len(ng.probe_lengths(3)))
    expected = [min(L, ng.generic_rank(kind, d)) for L, kind, d in df[["L", "kind", "d"]].values]
    assert list(df["expected"]) == expected
    assert (df["rank"] == df["expected"]).all()
    Ls, ranks = ng.rank_against_length(3, generator=torch.Generator().manual_seed(1), rtol=RTOL)
    assert Ls[0] == 2 and Ls[-1] <= 1.6 * 20
    for kind, ys in ranks.items():
        assert ys == [min(L, ng.generic_rank(kind, 3)) for L in Ls], kind  # type: ignore[arg-type]


def test_heterogeneous_spectrum_falls_off_a_cliff_after_the_generic_rank():
    s = ng.heterogeneous_spectrum(3, generator=torch.Generator().manual_seed(2))
    assert len(s) == 40 and (np.diff(s) <= 0).all()
    assert s[19] / s[20] > 1e6


def test_rank_draws_row_centred_rank_is_the_augmented_width():
    draws = ng.rank_draws([2, 3], [1, 3], 2, generator=torch.Generator().manual_seed(3), rtol=RTOL)
    assert len(draws) == 2 * 2 * 2
    assert (draws["rank"] == (draws["d"] + 1) * (draws["d"] + 2)).all()
    assert (draws["rank_row_centred"] == [augmented_dim(d) for d in draws["d"]]).all()
    assert (draws["rank_below"] == draws["observed_generic"] - 1).all()
    assert (draws["theorem_bound"] == draws["d"] * (draws["d"] + 1) // 2).all()


def test_rank_grows_with_the_number_of_distinct_metrics():
    by_m = ng.rank_by_distinct_metrics(3, generator=torch.Generator().manual_seed(4), rtol=RTOL)
    assert list(by_m["m"]) == list(range(1, 21))
    assert by_m["rank"].iloc[0] == 3 + 2  # one shared metric: a Euclidean distance in disguise
    assert by_m["rank"].is_monotonic_increasing
    assert by_m["rank"].max() <= ng.generic_rank("heterogeneous", 3)


def test_one_shared_metric_is_a_gram_matrix_plus_a_row_constant():
    form = ng.homogeneous_gram_form(4, 30, 1.3, generator=torch.Generator().manual_seed(5), rtol=RTOL)  # fmt: skip
    assert form["rel_error"] < 1e-12
    assert form["rank"] == 4 + 2 and form["rank_row_centred"] == 4 + 1


def test_softmax_gram_dim_is_the_inner_dimension_of_a_softmax_of_a_gram_form():
    # A = softmax(Q K^T + row constants) with Q, K (L, m): the smallest d' is m (for m < L - 1);
    # a different row constant per row changes nothing, as softmax ignores it
    g = torch.Generator().manual_seed(7)
    L = 30
    for m in (1, 3, 8):
        Q, K = torch.randn(L, m, generator=g, dtype=DT), torch.randn(L, m, generator=g, dtype=DT)
        c = torch.randn(L, 1, generator=g, dtype=DT) * 5
        A = torch.softmax(Q @ K.T + c, -1)
        assert ng.softmax_gram_dim(A, RTOL) == m
    # a generic positive row-stochastic matrix needs the full L - 1
    A = torch.softmax(torch.randn(L, L, generator=g, dtype=DT), -1)
    assert ng.softmax_gram_dim(A, RTOL) == L - 1
    with pytest.raises(ValueError, match="positive entries"):
        ng.softmax_gram_dim(torch.tril(A), RTOL)
    with pytest.raises(ValueError, match="square"):
        ng.softmax_gram_dim(A[:, :5], RTOL)


def test_corollary_3_3_rows_sum_to_one_and_heterogeneous_softmax_needs_d2_3d_1():
    check = ng.corollary_check(generator=torch.Generator().manual_seed(6), rtol=RTOL, L=48, d=3)
    assert list(zip(check["kind"], check["causal"])) == [
        ("homogeneous", False), ("homogeneous", True),
        ("heterogeneous", False), ("heterogeneous", True),
    ]  # fmt: skip
    assert (check["row_error"] <= 48 * 2.0**-52).all() and (check["min_entry"] >= 0).all()
    assert (check[check["causal"]]["above_diagonal"] == 0).all()
    assert (check[~check["causal"]]["above_diagonal"] > 0).all()  # full attention looks ahead
    full = check[~check["causal"]].set_index("kind")["softmax_dim"]
    assert full["homogeneous"] == 3 + 1 and full["heterogeneous"] == augmented_dim(3) == 19
    assert ng.corollary_holds(check)
    with pytest.raises(ValueError, match="L must exceed"):
        ng.corollary_check(generator=torch.Generator().manual_seed(6), rtol=RTOL, L=20, d=3)


@pytest.mark.parametrize(
    "broken",
    [
        {"row_error": 1e-9},  # a row off 1 beyond the rounding of L terms
        {"min_entry": -1e-3},
        {"softmax_dim": 5.0},  # heterogeneous softmax of an O(d) Gram form
    ],
)
def test_corollary_holds_fails_on_a_broken_check(broken):
    check = ng.corollary_check(generator=torch.Generator().manual_seed(6), rtol=RTOL, L=48, d=3)
    row = (check["kind"] == "heterogeneous") & ~check["causal"]
    for col, value in broken.items():
        check.loc[row, col] = value
    assert not ng.corollary_holds(check)


def test_outcomes_cover_every_non_gram_claim_and_match_the_chapter():
    from attention_atlas import claims
    from attention_atlas.notebooks.chapters import chapter_parameters, chapter_smoke, repo_root

    mine = {c.key for c in claims.CLAIMS if c.module.endswith(".non_gram")}
    found = ng.outcomes(smoke=True)
    assert set(found) == mine and all(isinstance(o, claims.Outcome) for o in found.values())
    assert all(o.outcome == "supported" for o in found.values()), found
    chapter = repo_root() / "notebooks" / "01_non_gram_scores.py"
    assert chapter_parameters(chapter) == ng.BOOK  # the register runs the chapter's sizes
    assert chapter_smoke(chapter) == ng.SMOKE
    headings = chapter.read_text()
    for c in claims.CLAIMS:
        if c.key in mine:  # the claim's section is a heading of its chapter
            assert f"# ## {c.section}\n" in headings, c.section


def test_chapter_outcomes_contradict_a_rank_below_the_bound():
    draws = ng.rank_draws([3], [1], 2, generator=torch.Generator().manual_seed(3), rtol=RTOL)
    form = ng.homogeneous_gram_form(4, 30, 1.3, generator=torch.Generator().manual_seed(5), rtol=RTOL)  # fmt: skip
    check = ng.corollary_check(generator=torch.Generator().manual_seed(6), rtol=RTOL)
    assert ng.chapter_outcomes(draws, form, check, d_gram=4)["riemannian/thm-3.2"].outcome == "supported"  # fmt: skip
    low = draws.assign(rank=draws["theorem_bound"] - 1)
    found = ng.chapter_outcomes(low, {**form, "rank": 5.0}, check, d_gram=4)
    assert found["riemannian/thm-3.2"].outcome == "contradicted"
    assert found["riemannian/thm-3.2-homogeneous"].outcome == "contradicted"
