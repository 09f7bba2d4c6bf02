"""Statistics shared by the chapters: intervals over seeds, paired differences, and the
library's one verdict rule.

* :func:`interval` / :func:`mean_interval`: mean and Student-t interval of independent runs.
* :func:`paired_difference`: the interval of ``a - b`` over the seeds both arms share (pairing
  by seed cancels the seed-to-seed variation of data order and initialisation).
* :class:`Interval`: the result, with one text form (:meth:`Interval.format`) for every chapter.
* :func:`decide`: the rule, by the claim's declared form (:data:`FORMS`): *superiority*
  (:func:`verdict` with a direction), *non-inferiority* (:func:`non_inferiority`: a margin, and
  which side is better) or *equivalence* (:func:`equivalence`: a margin either way). A claim is
  tested against a smallest effect of interest (the margin) declared before the run; the outcome
  is *supported*, *contradicted*, *not resolved* (with the smallest effect the run could have
  detected) or *not tested* (with the reason, one of :data:`NOT_TESTED`). Absence of a
  difference is never "holds": it is *not resolved* unless the interval shows the effect is
  smaller than the margin. No verdict rests on fewer than :data:`MIN_RUNS` runs or on a
  zero-width interval (every run gave the same difference: the measure could not have told the
  arms apart, so the test could not have failed).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats as _st

__all__ = [
    "FORMS",
    "NOT_TESTED",
    "OUTCOMES",
    "Interval",
    "Verdict",
    "interval",
    "mean_ci",
    "mean_interval",
    "paired_difference",
    "seed_range",
    "summarise",
    "decide",
    "equivalence",
    "non_inferiority",
    "not_tested_category",
    "verdict",
]

#: the four outcomes of :func:`verdict`
OUTCOMES = ("supported", "contradicted", "not resolved", "not tested")
#: fewest runs (seeds) a verdict may rest on
MIN_RUNS = 3
#: the forms a claim declares before data: *exact* (a float64 identity or bound within a stated
#: tolerance), *superiority* (an effect in a stated direction of at least the margin),
#: *non-inferiority* (no worse than a margin; which side is better is stated), *equivalence*
#: (within a margin either way), *ill-posed* (cannot be tested as written; the register says why)
FORMS = ("exact", "superiority", "non-inferiority", "equivalence", "ill-posed")
#: why an outcome is *not tested* (the ``reason`` of a verdict that could not be made)
NOT_TESTED = (
    "measure saturated",  # every run gave the same value: the arms could not have differed
    "no events",  # nothing to count in any arm (no non-finite value, no spike)
    "baseline not trained",  # the control has barely left the bigram regime
    "arm diverged",  # a run the comparison needs did not finish
    "too few runs",  # fewer than MIN_RUNS, or no interval
    "geometry inert",  # removing the geometry at evaluation changes nothing measurable
    "not run",  # the experiment that decides it has not been run (its cost is stated)
    "no measurement",
    "ill-posed",  # the claim cannot be tested as written (the register says why)
)


def interval(
    samples: Any, axis: int = 0, level: float = 0.95
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean and two-sided Student-t confidence interval of independent runs along ``axis``.

    Args:
        samples: array-like, ``(n_runs, ...)`` with the runs (e.g. seeds) along ``axis``.
        level: coverage of the interval, in (0, 1).

    Returns:
        ``(mean, low, high)``, each shaped like ``samples`` without ``axis``. With one run the
        interval is NaN: one seed gives no interval, and the function says so rather than
        inventing one.
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    x = np.asarray(samples, dtype=float)
    if x.ndim == 0 or x.shape[axis] == 0:
        raise ValueError(f"samples need at least one run along axis {axis}, got shape {x.shape}")
    n = x.shape[axis]
    mean = x.mean(axis=axis)
    if n < 2:
        nan = np.full_like(mean, np.nan)
        return mean, nan, nan.copy()
    half = _st.t.ppf(0.5 + level / 2, df=n - 1) * x.std(axis=axis, ddof=1) / math.sqrt(n)
    return mean, mean - half, mean + half


def mean_ci(
    values: Sequence[float] | np.ndarray, level: float = 0.95
) -> tuple[float, float, float]:
    """:func:`interval` of a 1-D sequence of runs, as floats ``(mean, low, high)``."""
    x = np.asarray(values, dtype=float)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"values must be a non-empty 1-D sequence, got shape {x.shape}")
    m, lo, hi = interval(x, 0, level)
    return float(m), float(lo), float(hi)


def summarise(
    df: pd.DataFrame, by: str | list[str], value: str, level: float = 0.95
) -> pd.DataFrame:
    """Group ``df`` by ``by`` and report ``n, mean, low, high`` of column ``value`` per group."""
    rows = []
    for key, g in df.groupby(by, sort=False):
        m, lo, hi = mean_ci(g[value].to_numpy(), level)
        keys = key if isinstance(key, tuple) else (key,)
        names = [by] if isinstance(by, str) else list(by)
        rows.append({**dict(zip(names, keys)), "n": len(g), "mean": m, "low": lo, "high": hi})
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class Interval:
    """A mean over ``n`` runs with its two-sided ``level`` interval (NaN bounds when ``n < 2``)."""

    mean: float
    low: float
    high: float
    n: int
    level: float = 0.95

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    @property
    def resolved(self) -> bool:
        """True when the interval exists (two runs or more, finite bounds)."""
        return math.isfinite(self.low) and math.isfinite(self.high)

    def excludes(self, value: float = 0.0) -> bool:
        return self.resolved and (self.low > value or self.high < value)

    def format(self, digits: int = 3, *, signed: bool = False, spec: str | None = None) -> str:
        """``"m [low, high]"``: ``digits`` decimals (or a format ``spec`` such as ``".4g"``),
        with a leading sign when ``signed`` (for differences); ``"m (one run)"`` without an
        interval."""
        f = spec if spec is not None else f"{'+' if signed else ''}.{digits}f"
        if not self.resolved:
            return f"{self.mean:{f}} (n={self.n}, no interval)"
        return f"{self.mean:{f}} [{self.low:{f}}, {self.high:{f}}]"

    def __str__(self) -> str:
        return self.format()

    def as_tuple(self) -> tuple[float, float, float]:
        return self.mean, self.low, self.high


def mean_interval(values: Any, level: float = 0.95) -> Interval:
    """:class:`Interval` of a 1-D sequence of runs (NaN runs are an error, not dropped)."""
    x = np.asarray(values, dtype=float)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"values must be a non-empty 1-D sequence, got shape {x.shape}")
    if not np.isfinite(x).all():
        raise ValueError(f"values must be finite, got {x.tolist()}")
    m, lo, hi = interval(x, 0, level)
    return Interval(float(m), float(lo), float(hi), int(x.size), level)


def seed_range(values: Any, digits: int = 3) -> str:
    """``"mean (min to max over n seeds)"`` of a 1-D sequence of runs: how a quantity that no
    claim rests on came out, where a t-interval would mislead (a norm over three seeds whose
    interval reaches below zero, say)."""
    x = np.asarray(values, dtype=float)
    if x.ndim != 1 or x.size == 0 or not np.isfinite(x).all():
        raise ValueError(f"values must be a non-empty 1-D sequence of finite numbers, got {x!r}")
    f = f".{digits}f"
    if x.size == 1:
        return f"{x[0]:{f}} (one seed)"
    return f"{x.mean():{f}} ({x.min():{f}} to {x.max():{f}} over {x.size} seeds)"


def paired_difference(a: Any, b: Any, level: float = 0.95) -> Interval:
    """Interval of ``a - b`` paired by run.

    ``a`` and ``b`` are either 1-D arrays of the same length (run ``i`` of one is paired with run
    ``i`` of the other) or :class:`pandas.Series` indexed by seed (paired on the seeds both have;
    no shared seed is an error).
    """
    if isinstance(a, pd.Series) and isinstance(b, pd.Series):
        shared = a.index.intersection(b.index)
        if len(shared) == 0:
            raise ValueError(f"no seed in common: a has {sorted(a.index)}, b has {sorted(b.index)}")
        return mean_interval((a.loc[shared] - b.loc[shared]).to_numpy(dtype=float), level)
    xa, xb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if xa.shape != xb.shape or xa.ndim != 1:
        raise ValueError(f"a and b must be 1-D of the same length, got {xa.shape} and {xb.shape}")
    return mean_interval(xa - xb, level)


@dataclass(frozen=True)
class Verdict:
    """The outcome of :func:`verdict`, with what it rests on."""

    outcome: str  # one of OUTCOMES
    effect: Interval | None
    sesoi: float
    direction: int  # +1: the claim predicts an increase, -1 a decrease, 0 no effect
    reason: str  # one sentence: why this outcome
    detectable: float | None = None  # for "not resolved": the smallest effect the run resolves
    form: str = "superiority"  # the claim's form (FORMS) this rule decided
    category: str | None = None  # for "not tested": one of NOT_TESTED

    def __str__(self) -> str:
        return f"{self.outcome}: {self.reason}"


#: the verdict rule of :func:`verdict` in words, for the chapters (one home: they render it)
RULE_TEXT = (
    "Each claim declares its form before the runs: *exact* (a float64 identity or bound, with "
    "its tolerance), *superiority* (an effect in a stated direction), *non-inferiority* (no "
    "worse than a margin; a better result never contradicts it), *equivalence* (within a "
    "margin either way) or *ill-posed* (it cannot be tested as written, and the register says "
    "why). An empirical claim is decided by the library's one rule "
    "(`attention_atlas.stats.decide`) against its margin, the smallest effect of interest "
    "(SESOI) declared before the runs, from the 95% interval of the effect over at least "
    f"{MIN_RUNS} seeds. Superiority: *contradicted* when the interval rules out a predicted "
    "effect as large as the SESOI, *supported* when it is not contradicted and the interval "
    "excludes zero on the predicted side. Non-inferiority: *supported* when the whole interval "
    "is better than minus the margin, *contradicted* when it is wholly worse. Equivalence: "
    "*supported* when the whole interval lies within the margin, *contradicted* when it lies "
    "wholly beyond it. Otherwise *not resolved* (with the smallest effect the runs could have "
    "told from zero). *Not tested*, with its reason, when the comparison could not be made or "
    "could not have failed: too few runs, a zero-width interval (a saturated measure), no "
    "events to count, a baseline not trained past the bigram regime, an arm that diverged."
)


def verdict(
    effect: Interval | None,
    *,
    sesoi: float,
    direction: int = 1,
    not_tested: str | None = None,
    min_runs: int = MIN_RUNS,
) -> Verdict:
    """The library's one rule for a claim about an effect.

    Args:
        effect: the measured effect (usually a :func:`paired_difference` against the control),
            signed so that ``direction`` is what the claim predicts.
        sesoi: the smallest effect of interest (> 0), declared before the run, in the units of
            ``effect``.
        direction: ``+1`` the claim predicts ``effect >= sesoi``; ``-1`` it predicts
            ``effect <= -sesoi``; ``0`` it predicts no effect (``|effect| < sesoi``).
        not_tested: a reason the claim could not be tested (then the outcome is "not tested").
        min_runs: fewest runs the verdict may rest on (default 3).

    Outcomes (``s = direction * effect`` for a directional claim):

    * *contradicted*: the interval shows the predicted effect is smaller than ``sesoi``
      (``s.high < sesoi``: opposite, or too small to matter);
    * *supported*: not contradicted, and the interval excludes zero on the predicted side
      (``s.low > 0``);
    * *not resolved*: otherwise; ``detectable`` is the interval's half-width, about the smallest
      effect this many runs could have told from zero.

    ``direction=0`` is :func:`equivalence` with margin ``sesoi``. Every form is *not tested*
    (``category`` says why) on fewer than ``min_runs`` runs and on a zero-width interval.
    """
    if not (isinstance(sesoi, int | float) and math.isfinite(sesoi) and sesoi > 0):
        raise ValueError(f"sesoi must be a positive finite number, got {sesoi!r}")
    if direction not in (-1, 0, 1):
        raise ValueError(f"direction must be -1, 0 or +1, got {direction!r}")
    if direction == 0:
        return equivalence(effect, margin=sesoi, not_tested=not_tested, min_runs=min_runs)
    early = _untestable(effect, sesoi, direction, "superiority", not_tested, min_runs)
    if early is not None:
        return early
    assert effect is not None
    text = effect.format(3, signed=True, spec=".3g")
    lo, hi = sorted((direction * effect.low, direction * effect.high))
    side = "an increase" if direction > 0 else "a decrease"
    if hi < sesoi:
        return Verdict(
            "contradicted", effect, sesoi, direction,
            f"{text} rules out {side} of {sesoi:.3g} or more",
        )  # fmt: skip
    if lo > 0:
        return Verdict(
            "supported", effect, sesoi, direction,
            f"{text} excludes zero on the predicted side ({side})",
        )  # fmt: skip
    return Verdict(
        "not resolved", effect, sesoi, direction,
        f"{text} includes zero and {side} of {sesoi:.3g}", effect.half_width,
    )  # fmt: skip


def not_tested_category(reason: str) -> str:
    """The :data:`NOT_TESTED` category a caller's reason falls under."""
    words = reason.lower()
    for key, category in (("diverg", "arm diverged"), ("not finite", "arm diverged"),
                          ("bigram", "baseline not trained"), ("saturat", "measure saturated"),
                          ("no event", "no events"), ("inert", "geometry inert"),
                          ("run(s)", "too few runs"), ("seed", "too few runs")):  # fmt: skip
        if key in words:
            return category
    return "not run"


def _untestable(
    effect: Interval | None, margin: float, direction: int, form: str, not_tested: str | None,
    min_runs: int,
) -> Verdict | None:  # fmt: skip
    """The *not tested* verdict when ``effect`` cannot decide anything, else None: a reason
    given, no measurement, too few runs, or a zero-width interval (every run gave the same
    value: the measure is saturated, and the test could not have failed)."""
    if not (isinstance(margin, int | float) and math.isfinite(margin) and margin > 0):
        raise ValueError(f"the margin (sesoi) must be a positive finite number, got {margin!r}")

    def no(reason: str, category: str) -> Verdict:
        return Verdict("not tested", effect, margin, direction, reason, form=form,
                       category=category)  # fmt: skip

    if not_tested is not None:
        return no(not_tested, not_tested_category(not_tested))
    if effect is None:
        return no("no measurement", "no measurement")
    if effect.n < min_runs or not effect.resolved:
        return no(f"{effect.n} run(s); a verdict needs at least {min_runs}", "too few runs")
    if effect.high - effect.low <= 1e-12 * max(1.0, abs(effect.mean)):
        return no(
            f"every one of the {effect.n} runs gave the same value ({effect.mean:.4g}): a "
            "zero-width interval, the measure could not have told the arms apart",
            "measure saturated",
        )
    return None


def non_inferiority(
    effect: Interval | None,
    *,
    margin: float,
    better: int = 1,
    not_tested: str | None = None,
    min_runs: int = MIN_RUNS,
) -> Verdict:
    """The rule for a claim that an arm is *no worse* than its control by more than ``margin``.

    ``effect`` is the arm minus the control; ``better`` says which sign is better for the arm
    (+1: higher is better, such as accuracy; -1: lower is better, such as bpc). With ``g =
    better * effect`` (the arm's gain): *supported* when the whole interval lies above
    ``-margin`` (at worst ``margin`` worse); *contradicted* when it lies below ``-margin`` (worse
    by more than the margin); *not resolved* otherwise. A result better than the margin never
    contradicts the claim."""
    if better not in (-1, 1):
        raise ValueError(f"better must be -1 or +1, got {better!r}")
    early = _untestable(effect, margin, better, "non-inferiority", not_tested, min_runs)
    if early is not None:
        return early
    assert effect is not None
    text = effect.format(3, signed=True, spec=".3g")
    lo, hi = sorted((better * effect.low, better * effect.high))
    side = "higher" if better > 0 else "lower"
    if lo > -margin:
        return Verdict(
            "supported", effect, margin, better,
            f"{text} ({side} is better): at worst {-lo:.3g} worse, within the margin {margin:.3g}"
            if lo < 0 else f"{text} ({side} is better): no worse at all (margin {margin:.3g})",
            form="non-inferiority",
        )  # fmt: skip
    if hi < -margin:
        return Verdict(
            "contradicted", effect, margin, better,
            f"{text} ({side} is better): worse by more than the margin {margin:.3g}",
            form="non-inferiority",
        )  # fmt: skip
    return Verdict(
        "not resolved", effect, margin, better,
        f"{text} ({side} is better) reaches past the margin -{margin:.3g}", effect.half_width,
        form="non-inferiority",
    )  # fmt: skip


def equivalence(
    effect: Interval | None,
    *,
    margin: float,
    not_tested: str | None = None,
    min_runs: int = MIN_RUNS,
) -> Verdict:
    """The rule for a claim of *no difference* beyond ``margin`` either way: *supported* when the
    whole interval lies inside ``(-margin, margin)``; *contradicted* when it lies wholly beyond
    the margin on one side (a difference of at least the margin is shown; the reason names the
    side); *not resolved* otherwise."""
    early = _untestable(effect, margin, 0, "equivalence", not_tested, min_runs)
    if early is not None:
        return early
    assert effect is not None
    text = effect.format(3, signed=True, spec=".3g")
    if -margin < effect.low and effect.high < margin:
        return Verdict("supported", effect, margin, 0, f"{text} lies inside +-{margin:.3g}",
                       form="equivalence")  # fmt: skip
    if effect.low >= margin or effect.high <= -margin:
        way = "an increase" if effect.low >= margin else "a decrease"
        return Verdict(
            "contradicted", effect, margin, 0,
            f"{text} lies wholly beyond the margin +-{margin:.3g} ({way})",
            form="equivalence",
        )  # fmt: skip
    return Verdict(
        "not resolved", effect, margin, 0, f"{text} cannot decide against +-{margin:.3g}",
        effect.half_width, form="equivalence",
    )  # fmt: skip


def decide(
    form: str,
    effect: Interval | None,
    *,
    margin: float,
    direction: int = 1,
    not_tested: str | None = None,
    min_runs: int = MIN_RUNS,
) -> Verdict:
    """The one rule by the claim's declared ``form``: ``superiority`` (:func:`verdict`,
    ``direction`` +1 or -1), ``non-inferiority`` (:func:`non_inferiority`, ``direction`` is the
    better side), ``equivalence`` (:func:`equivalence`)."""
    if form == "superiority":
        if direction not in (-1, 1):
            raise ValueError(f"a superiority claim needs direction +1 or -1, got {direction!r}")
        return verdict(effect, sesoi=margin, direction=direction, not_tested=not_tested,
                       min_runs=min_runs)  # fmt: skip
    if form == "non-inferiority":
        return non_inferiority(effect, margin=margin, better=direction, not_tested=not_tested,
                               min_runs=min_runs)  # fmt: skip
    if form == "equivalence":
        return equivalence(effect, margin=margin, not_tested=not_tested, min_runs=min_runs)
    raise ValueError(
        f"form must be superiority, non-inferiority or equivalence (an interval's forms), got "
        f"{form!r}; exact claims are checks, ill-posed ones are not decided"
    )
