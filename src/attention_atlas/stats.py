"""Small statistics shared by the chapters: means with confidence intervals over seeds."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats as _st

__all__ = ["interval", "mean_ci", "summarise"]


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
