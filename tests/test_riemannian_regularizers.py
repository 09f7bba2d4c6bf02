"""The regularisers of Section 6.4 (eqs. (31) to (34)) against dense d x d formulas, their
schedule, and the harness regulariser that adds them to the loss."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from riemannian_inputs import DT, TOL, inputs, rel

from attention_atlas.attention import riemannian as R
from attention_atlas.attention.base import AttentionResult
from attention_atlas.attention.riemannian.regularizers import (
    RegularizerSchedule,
    fiber_bundle_regularizers,
    gram_sums,
    regularizer_terms,
)
from attention_atlas.models.fiber_bundle import fiber_bundle_regularizer


def dense_distances(U):
    """``|A_i - A_j|_F^2`` for all pairs with the d x d matrices ``A_t = U_t U_t^T`` formed."""
    A = U @ U.mT  # (..., L, d, d)
    return ((A.unsqueeze(-3) - A.unsqueeze(-4)) ** 2).sum((-1, -2))


def test_metric_distances_equal_the_dense_frobenius_distances():
    *_, U = inputs(L=6, seed=24)
    assert rel(R.metric_distances(U), dense_distances(U)) < TOL


def test_anti_flatness_and_cap_match_their_definitions():
    *_, U = inputs(seed=23)
    kappa = (U**2).sum((-1, -2))
    assert rel(R.anti_flatness_loss(U, 2.0), torch.relu(2.0 - kappa).mean()) < TOL
    assert rel(R.metric_cap_loss(U, 1.0), torch.relu(kappa - 1.0).mean()) < TOL


def test_metric_diversity_all_pairs_matches_dense_pairwise_distances():
    *_, U = inputs(L=6, seed=24)
    expected = -(dense_distances(U).sum((-1, -2)) / (6 * 5)).mean()
    assert rel(R.metric_diversity_loss(U), expected) < TOL


def test_metric_diversity_on_given_pairs_matches_dense():
    *_, U = inputs(L=6, seed=25)
    pairs = torch.tensor([[0, 1], [2, 5], [4, 3]])
    A = U @ U.mT
    expected = -torch.stack(
        [((A[..., i, :, :] - A[..., j, :, :]) ** 2).sum((-1, -2)) for i, j in pairs.tolist()]
    ).mean()
    assert rel(R.metric_diversity_loss(U, pairs=pairs), expected) < TOL
    # sampled pairs: the same generator draws the same pairs, never i = j
    g1, g2 = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    i = torch.randint(0, 6, (50,), generator=g1)
    j = (i + torch.randint(1, 6, (50,), generator=g1)) % 6
    sampled = R.metric_diversity_loss(U, n_pairs=50, generator=g2)
    assert bool((i != j).all())
    assert rel(sampled, R.metric_diversity_loss(U, pairs=torch.stack([i, j], -1))) < TOL


def test_curvature_smoothness_matches_dense_adjacent_differences():
    *_, U = inputs(L=6, seed=26)
    A = U @ U.mT
    expected = ((A[..., 1:, :, :] - A[..., :-1, :, :]) ** 2).sum((-1, -2)).mean()
    assert rel(R.curvature_smoothness_loss(U), expected) < TOL
    assert rel(R.curvature_smoothness_loss(U, distances=dense_distances(U)), expected) < TOL


def test_regularizer_terms_equal_the_dense_definitions():
    U = torch.randn(2, 3, 7, 5, 2, generator=torch.Generator().manual_seed(0), dtype=DT)
    D = dense_distances(U)
    kappa = (U**2).sum((-1, -2))
    got = regularizer_terms(U, kappa_min=9.0, kappa_max=11.0)
    ref = {
        "anti": torch.relu(9.0 - kappa).mean(),
        "div": -(D.sum((-1, -2)) / (7 * 6)).mean(),
        "smooth": D.diagonal(offset=1, dim1=-2, dim2=-1).mean(),
        "cap": torch.relu(kappa - 11.0).mean(),
        "l2": kappa.mean(),
    }
    assert set(got) == set(ref)
    for k, v in ref.items():
        assert rel(got[k], v) < TOL, k
    assert float(got["anti"]) > 0 and float(got["cap"]) > 0  # both hinges are active here


def test_all_pairs_diversity_identity_needs_no_pairwise_matrix():
    # sum_{i != j} |A_i - A_j|^2 = 2 L sum_t |A_t|^2 - 2 |sum_t A_t|^2: the fast path of
    # metric_diversity_loss, on factors stored r-major (as the factor networks store them)
    *_, U = inputs(L=9, seed=27, r=3)
    U = U.transpose(-1, -2).contiguous().transpose(-1, -2)
    D = dense_distances(U)
    assert rel(R.metric_diversity_loss(U), -(D.sum((-1, -2)) / (9 * 8)).mean()) < TOL


def test_gram_sums_equal_their_dense_definitions_and_pass_gradcheck():
    *_, U = inputs(shape=(2,), L=5, d=4, r=2, seed=28, grad=True)
    self_sq, cross, total = gram_sums(U)
    A = U @ U.mT
    assert rel(self_sq, (A * A).sum((-1, -2))) < TOL
    assert rel(cross, ((U[..., :-1, :, :].mT @ U[..., 1:, :, :]) ** 2).sum((-1, -2))) < TOL
    assert rel(total, (A.sum(-3) ** 2).sum((-1, -2))) < TOL
    assert torch.autograd.gradcheck(lambda u: gram_sums(u), (U,))


@pytest.mark.parametrize("terms", [("div",), ("smooth", "cap"), ("anti", "l2")])
def test_regularizer_terms_computes_only_the_terms_asked_for(terms):
    U = torch.randn(2, 3, 7, 5, 2, generator=torch.Generator().manual_seed(1), dtype=DT)
    every = regularizer_terms(U, kappa_min=9.0, kappa_max=11.0)
    got = regularizer_terms(U, kappa_min=9.0, kappa_max=11.0, terms=terms)
    assert tuple(got) == terms
    for k in terms:
        assert rel(got[k], every[k]) < TOL
    with pytest.raises(ValueError, match="unknown regulariser term 'diversity'"):
        regularizer_terms(U, kappa_min=9.0, kappa_max=11.0, terms=("diversity",))


def test_regularisers_reject_too_short_sequences():
    U = torch.zeros(2, 1, 4, 2)
    with pytest.raises(ValueError, match="at least 2 positions"):
        R.metric_diversity_loss(U)
    with pytest.raises(ValueError, match="at least 2 positions"):
        R.curvature_smoothness_loss(U)
    with pytest.raises(ValueError, match="at least 2 positions"):
        regularizer_terms(U, kappa_min=0.0, kappa_max=1.0)


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


def test_harness_regulariser_is_the_scheduled_sum_averaged_over_layers() -> None:
    g = torch.Generator().manual_seed(5)
    Us = [torch.randn(2, 2, 6, 4, 2, generator=g, dtype=DT) for _ in range(2)]
    output = SimpleNamespace(
        logits=torch.zeros(2, 6, 3, dtype=DT),
        attentions=[AttentionResult(torch.zeros(1), extras={"metric_factor": U}) for U in Us],
    )
    model = SimpleNamespace(train_step=torch.tensor(61))  # step 60 of 100: relaxed weights
    opts = dict(steps=100, kappa_min=5.0, kappa_max=9.0, anti=2.0, div=1.0, smooth=0.5, cap=3.0)
    got = fiber_bundle_regularizer(model, output, None, **opts)  # type: ignore[arg-type]
    w = RegularizerSchedule(100, 2.0, 1.0, 0.5, 3.0).weights(60)
    expected = (
        sum(
            sum(w[k] * v for k, v in regularizer_terms(U, kappa_min=5.0, kappa_max=9.0).items())
            for U in Us
        )
        / 2
    )
    assert w["anti"] < 2.0  # the schedule did relax
    assert rel(got, expected) < TOL
