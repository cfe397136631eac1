"""Efficiency curves from measured points: merge close sizes, extend with the datasheet shape.

Used by ``meshplan calibrate`` (every measured curve of a profile) and by
:mod:`meshplan.hardware_profiles.collective_latency` (re-deriving an old profile's NVLink
curve from its stored rows); it lives here, below both, so that loading a profile does not
import the calibration package.
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

from meshplan.errors import ProfileError
from meshplan.hardware_profiles.curve import Curve

MERGE_DECADES = 0.05       # points closer than this in log10(size) are averaged
MAX_EFFICIENCY = 1.0
MIN_EFFICIENCY = 1e-4


def merge_points(points: Iterable[tuple[float, float]],
                 decades: float = MERGE_DECADES) -> list[tuple[float, float]]:
    """Sort by size and average runs of points closer than ``decades`` in log10(size)
    (geometric mean of sizes, arithmetic mean of efficiencies); clip to (0, 1]."""
    pts = sorted((float(x), float(y)) for x, y in points if x > 0 and math.isfinite(y))
    out: list[tuple[float, float]] = []
    group: list[tuple[float, float]] = []

    def flush():
        if group:
            lx = sum(math.log10(x) for x, _ in group) / len(group)
            y = sum(y for _, y in group) / len(group)
            out.append((sig(10 ** lx), sig(min(MAX_EFFICIENCY, max(MIN_EFFICIENCY, y)))))

    for p in pts:
        if group and math.log10(p[0]) - math.log10(group[0][0]) > decades:
            flush()
            group = []
        group.append(p)
    flush()
    return out


def sig(x: float, digits: int = 5) -> float:
    """Round to significant digits: profiles are read by people too."""
    return float(f"{x:.{digits}g}")


def extend_with_base(measured: Sequence[tuple[float, float]], base: Curve | None) -> Curve:
    """Measured points, plus the base curve's points outside the measured range scaled so
    they meet the first / last measured point (datasheet shape as the fallback)."""
    if not measured:
        raise ProfileError("no measured points for an efficiency curve")
    pts = list(measured)
    if base is not None:
        (x0, y0), (x1, y1) = pts[0], pts[-1]
        lo_scale = y0 / base(x0) if base(x0) > 0 else 1.0
        hi_scale = y1 / base(x1) if base(x1) > 0 else 1.0
        margin = 10 ** MERGE_DECADES
        below = [(x, min(MAX_EFFICIENCY, max(MIN_EFFICIENCY, y * lo_scale)))
                 for x, y in base.points if x < x0 / margin]
        above = [(x, min(MAX_EFFICIENCY, max(MIN_EFFICIENCY, y * hi_scale)))
                 for x, y in base.points if x > x1 * margin]
        pts = below + pts + above
    return Curve(tuple(pts))


__all__ = ["MERGE_DECADES", "MAX_EFFICIENCY", "MIN_EFFICIENCY", "merge_points",
           "extend_with_base", "sig"]
