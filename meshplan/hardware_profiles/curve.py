"""Efficiency curves: measured or datasheet points, interpolated in log10 of the size."""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from meshplan.errors import ProfileError


@dataclass(frozen=True)
class Curve:
    """Piecewise-linear in log10(x); clamped to the end points outside the measured range.

    >>> c = Curve(((1e6, 0.5), (1e8, 0.9)))
    >>> round(c(1e7), 3), c(1.0), c(1e12)
    (0.7, 0.5, 0.9)
    """

    points: tuple[tuple[float, float], ...]

    def __post_init__(self) -> None:
        pts = tuple((float(x), float(y)) for x, y in self.points)
        if not pts:
            raise ProfileError("an efficiency curve needs at least one [size, value] point")
        xs = [x for x, _ in pts]
        if any(x <= 0 for x in xs) or xs != sorted(xs) or len(set(xs)) != len(xs):
            raise ProfileError(f"efficiency curve sizes must be positive and strictly "
                               f"increasing, got {xs}")
        object.__setattr__(self, "points", pts)
        object.__setattr__(self, "_lx", tuple(math.log10(x) for x in xs))
        object.__setattr__(self, "_ys", tuple(y for _, y in pts))
        object.__setattr__(self, "_hash", hash(pts))

    def __hash__(self) -> int:
        return self._hash  # type: ignore[attr-defined]

    def __call__(self, x: float) -> float:
        lx, ys = self._lx, self._ys  # type: ignore[attr-defined]
        if x <= 0:
            return ys[0]
        l = math.log10(x)
        if l <= lx[0]:
            return ys[0]
        if l >= lx[-1]:
            return ys[-1]
        i = bisect.bisect_right(lx, l)
        x0, x1, y0, y1 = lx[i - 1], lx[i], ys[i - 1], ys[i]
        return y0 + (y1 - y0) * (l - x0) / (x1 - x0)

    def scaled(self, factor: float) -> "Curve":
        return Curve(tuple((x, y * factor) for x, y in self.points))

    def to_list(self) -> list[list[float]]:
        return [[x, y] for x, y in self.points]


def op_curve(measured: "Curve | None", collectives: "Curve") -> "Curve":
    """The efficiency curve an op runs at: its own ``measured`` curve where ``meshplan
    calibrate`` timed that op (broadcast, all-to-all), else the ``collectives`` curve. The
    one place this choice is made: a process group's link
    (:meth:`~meshplan.hardware_profiles.topology.GroupLink.bandwidth_bytes_per_s`) and the
    MoE dispatch's NVLink share of a cross-node all-to-all, priced from the GPU's curves
    because the ep group's link across nodes carries only the network's
    (:func:`meshplan.costmodel.moe_layer.routed_mlp`)."""
    return collectives if measured is None else measured
