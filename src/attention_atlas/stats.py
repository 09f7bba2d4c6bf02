"""Small statistics shared by the chapters: means with confidence intervals over seeds."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
from scipy import stats as _st

__all__ = ["mean_ci", "summarise"]


def mean_ci(
    values: Sequence[float] | np.ndarray, level: float = 0.95
) -> tuple[float, float, float]:
    """Mean and two-sided Student-t confidence interval of independent runs (e.g. seeds).

    Returns ``(mean, low, high)``. With one value the interval is ``(nan, nan)`` around it:
    one seed gives no interval, and the function says so rather than inventing one.
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    x = np.asarray(values, dtype=float)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"values must be a non-empty 1-D sequence, got shape {x.shape}")
    m = float(x.mean())
    if x.size < 2:
        return m, math.nan, math.nan
    half = float(_st.t.ppf(0.5 + level / 2, df=x.size - 1) * x.std(ddof=1) / math.sqrt(x.size))
    return m, m - half, m + half


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
