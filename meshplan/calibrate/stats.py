"""Accuracy statistics of predicted against measured values (pure Python, no scipy)."""

from __future__ import annotations

import math
from typing import Sequence

from meshplan.errors import ConfigError

# a layout's measured steps are "steady" when their spread (p90 − p10) is within this share of
# the median step
STEADY_SPREAD_PCT = 5.0


def two_depth_fit(n1: float, t1: float, n2: float, t2: float) -> tuple[float, float]:
    """(per-call, per-layer) seconds of a call timed at ``t1`` on ``n1`` layers and ``t2``
    on ``n2``, for t(n) = per_call + n · per_layer: the line through the two points.
    Calibration separates fixed costs from per-layer ones this way (tiny-model overheads,
    the pipeline action, a layer row's CPU dispatch)."""
    if n1 == n2:
        raise ValueError(f"two different depths are needed, got {n1} and {n2}")
    per_layer = (t2 - t1) / (n2 - n1)
    return t1 - n1 * per_layer, per_layer


def pct_error(predicted: float, measured: float) -> float:
    """Signed error of a prediction in percent of the measurement."""
    if not measured > 0:
        raise ConfigError(f"a measured value must be positive to compare against, got {measured!r}")
    return (predicted - measured) / measured * 100.0


def ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks; ties get the mean of the ranks they span."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    n = len(x)
    mx, my = sum(x) / n, sum(y) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
    sxx = sum((a - mx) ** 2 for a in x)
    syy = sum((b - my) ** 2 for b in y)
    if sxx == 0 or syy == 0:
        return float("nan")
    return sxy / math.sqrt(sxx * syy)


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation: Pearson's r of the (tie-averaged) ranks
    (Spearman 1904; the tie handling of e.g. Kendall & Gibbons, Rank Correlation Methods)."""
    if len(x) != len(y):
        raise ConfigError(f"spearman needs equal-length sequences, got {len(x)} and {len(y)}")
    if len(x) < 2:
        return float("nan")
    return pearson(ranks(x), ranks(y))
