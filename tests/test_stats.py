"""Means and confidence intervals over seeds, against scipy's own t interval."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as st

from attention_atlas.stats import interval, mean_ci, summarise


def test_interval_is_the_student_t_interval_along_the_seed_axis() -> None:
    rng = np.random.default_rng(0)
    samples = rng.normal(size=(5, 7))
    mean, lo, hi = interval(samples)
    for j in range(7):
        ref = st.t.interval(0.95, df=4, loc=samples[:, j].mean(), scale=st.sem(samples[:, j]))
        assert lo[j] == pytest.approx(ref[0], abs=1e-12)
        assert hi[j] == pytest.approx(ref[1], abs=1e-12)
    np.testing.assert_allclose(mean, samples.mean(0), atol=1e-15)
    m1, lo1, hi1 = interval(samples.T, axis=1, level=0.9)
    ref = st.t.interval(0.9, df=4, loc=samples[:, 2].mean(), scale=st.sem(samples[:, 2]))
    assert (lo1[2], hi1[2]) == pytest.approx(ref, abs=1e-12)


def test_mean_ci_of_a_list_matches_scipy_and_one_seed_gives_no_interval() -> None:
    values = [1.0, 2.5, 2.0, 4.0]
    m, lo, hi = mean_ci(values)
    ref = st.t.interval(0.95, df=3, loc=np.mean(values), scale=st.sem(values))
    assert m == pytest.approx(2.375) and (lo, hi) == pytest.approx(ref, abs=1e-12)
    m1, lo1, hi1 = mean_ci([3.0])
    assert m1 == 3.0 and math.isnan(lo1) and math.isnan(hi1)


def test_bad_input_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="level"):
        mean_ci([1.0, 2.0], level=1.5)
    with pytest.raises(ValueError, match="non-empty 1-D"):
        mean_ci([])


def test_summarise_groups_and_reports_n_mean_and_interval() -> None:
    df = pd.DataFrame({"cfg": ["a", "a", "a", "b", "b"], "loss": [1.0, 2.0, 3.0, 5.0, 7.0]})
    out = summarise(df, "cfg", "loss").set_index("cfg")
    assert out.loc["a", "n"] == 3 and out.loc["a", "mean"] == pytest.approx(2.0)
    assert out.loc["b", "low"] == pytest.approx(st.t.interval(0.95, 1, 6.0, 1.0)[0])


# -- Interval, paired differences and the verdict rule ----------------------------------------

from attention_atlas.stats import (  # noqa: E402
    Interval,
    mean_interval,
    paired_difference,
    verdict,
)


def test_paired_difference_equals_the_interval_of_the_per_seed_differences() -> None:
    a = np.array([1.0, 2.0, 4.0, 3.0])
    b = np.array([0.5, 1.0, 3.0, 3.5])
    iv = paired_difference(a, b)
    ref = st.t.interval(0.95, 3, loc=np.mean(a - b), scale=st.sem(a - b))
    assert iv.n == 4 and iv.mean == pytest.approx(np.mean(a - b), abs=1e-15)
    assert (iv.low, iv.high) == pytest.approx(ref, abs=1e-12)


def test_paired_difference_of_series_pairs_on_shared_seeds_only() -> None:
    a = pd.Series([1.0, 2.0, 3.0, 9.0], index=[0, 1, 2, 3])
    b = pd.Series([0.0, 0.0, 1.0], index=[2, 1, 0])
    iv = paired_difference(a, b)
    assert iv.n == 3 and iv.mean == pytest.approx(np.mean([0.0, 2.0, 3.0]))
    with pytest.raises(ValueError, match="no seed in common"):
        paired_difference(a, pd.Series([1.0], index=[7]))


def test_interval_format_is_mean_then_bounds_and_says_when_there_is_none() -> None:
    assert Interval(0.5, 0.25, 0.75, 3).format(2, signed=True) == "+0.50 [+0.25, +0.75]"
    assert "no interval" in mean_interval([1.0]).format()


@pytest.mark.parametrize(
    ("low", "high", "direction", "outcome"),
    [
        (0.2, 0.9, 1, "supported"),  # excludes zero on the predicted side
        (-0.9, -0.2, 1, "contradicted"),  # the other side
        (0.01, 0.05, 1, "contradicted"),  # significant but smaller than the sesoi (0.1)
        (-0.3, 0.4, 1, "not resolved"),  # includes zero and the sesoi
        (-0.9, -0.2, -1, "supported"),
        (-0.05, 0.05, 0, "supported"),  # equivalence: inside +-sesoi
        (0.2, 0.9, 0, "contradicted"),
        (-0.05, 0.3, 0, "not resolved"),
    ],
)
def test_verdict_rule(low: float, high: float, direction: int, outcome: str) -> None:
    v = verdict(Interval((low + high) / 2, low, high, 3), sesoi=0.1, direction=direction)
    assert v.outcome == outcome
    if outcome == "not resolved":
        assert v.detectable == pytest.approx((high - low) / 2)


def test_an_equivalence_claim_contradicted_names_the_side_it_fails_on() -> None:
    up = verdict(Interval(0.5, 0.2, 0.9, 3), sesoi=0.1, direction=0)
    down = verdict(Interval(-0.5, -0.9, -0.2, 3), sesoi=0.1, direction=0)
    assert up.outcome == down.outcome == "contradicted"
    assert up.reason.endswith("(an increase)") and down.reason.endswith("(a decrease)")


def test_verdict_needs_three_runs_and_a_positive_sesoi() -> None:
    assert verdict(Interval(1.0, 0.5, 1.5, 2), sesoi=0.1).outcome == "not tested"
    assert verdict(None, sesoi=0.1).outcome == "not tested"
    with pytest.raises(ValueError, match="sesoi"):
        verdict(Interval(1.0, 0.5, 1.5, 3), sesoi=0.0)


def test_seed_range_describes_runs_by_their_mean_and_extremes() -> None:
    from attention_atlas.stats import seed_range

    assert seed_range([2.0, 1.0, 6.0]) == "3.000 (1.000 to 6.000 over 3 seeds)"
    assert seed_range([0.5], digits=1) == "0.5 (one seed)"
    with pytest.raises(ValueError, match="finite numbers"):
        seed_range([1.0, float("nan")])


@pytest.mark.parametrize(
    ("low", "high", "better", "outcome"),
    [
        (0.05, 0.11, 1, "supported"),  # better than the control: never a contradiction
        (-0.015, 0.02, 1, "supported"),  # at worst 0.015 worse: within the margin 0.02
        (-0.05, 0.01, 1, "not resolved"),  # reaches past the margin
        (-0.09, -0.03, 1, "contradicted"),  # wholly worse than the margin
        (0.03, 0.09, -1, "contradicted"),  # lower is better: 0.03 to 0.09 higher is worse
        (-0.09, 0.01, -1, "supported"),  # lower is better, at worst 0.01 worse
    ],
)
def test_non_inferiority_rule(low: float, high: float, better: int, outcome: str) -> None:
    from attention_atlas.stats import non_inferiority

    v = non_inferiority(Interval((low + high) / 2, low, high, 5), margin=0.02, better=better)
    assert (v.outcome, v.form) == (outcome, "non-inferiority")


def test_the_zoo_accuracy_case_is_supported_by_non_inferiority_and_contradicted_by_equivalence():
    """Issue 52's first case: the regularised arm 0.080 [0.048, 0.111] MQAR accuracy *better*
    than dot. A no-loss claim must not be contradicted by a gain; an equivalence claim is."""
    from attention_atlas.stats import decide

    gain = Interval(0.0795, 0.0484, 0.111, 5)
    assert decide("non-inferiority", gain, margin=0.02, direction=1).outcome == "supported"
    assert decide("equivalence", gain, margin=0.02).outcome == "contradicted"
    assert decide("superiority", gain, margin=0.02, direction=1).outcome == "supported"
    with pytest.raises(ValueError, match="exact claims are checks"):
        decide("exact", gain, margin=0.02)


@pytest.mark.parametrize("form", ["superiority", "non-inferiority", "equivalence"])
def test_no_verdict_rests_on_a_zero_width_interval(form: str) -> None:
    """0 [0, 0] (no events in either arm) and 1.0 against 1.0 (a saturated measure): every
    form says *not tested*, measure saturated; a width of one part in 1e9 is decided."""
    from attention_atlas.stats import decide

    for mean in (0.0, 1.0, 5e-15):
        v = decide(form, Interval(mean, mean, mean, 5), margin=0.5, direction=1)
        assert (v.outcome, v.category) == ("not tested", "measure saturated"), (form, mean)
    assert decide(form, Interval(2.0, 1.0, 3.0, 5), margin=0.5, direction=1).outcome != "not tested"


def test_a_reason_given_is_filed_under_its_category() -> None:
    from attention_atlas.stats import NOT_TESTED, non_inferiority, not_tested_category

    v = non_inferiority(None, margin=1.0, not_tested="no events: no non-finite value in any run")
    assert (v.outcome, v.category) == ("not tested", "no events")
    assert not_tested_category("fbt_kappa-0.1 diverged in 5 of 5 seeds") == "arm diverged"
    assert not_tested_category("the baseline is above 3 bpc (the bigram regime)") in NOT_TESTED
    assert verdict(Interval(1.0, 0.5, 1.5, 2), sesoi=0.1).category == "too few runs"
