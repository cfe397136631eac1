"""A grouped GEMM's efficiency curve, keyed by the whole call's tile-padded FLOPs.

The executor runs an MoE layer's local experts as one ``torch._grouped_mm`` call per expert
matrix (``executor/moe.py``). On Hopper that is one persistent CUTLASS kernel over all the
groups (torch ``aten/src/ATen/native/cuda/GroupMM.cu``: tile 128 × 256 × 64 with a 2 × 1 × 1
cluster; 64 × 128 × 128 where a group averages ≤ 128 rows), so its tiles from every group
share the SMs: what sets its efficiency is the call's whole work, like a dense GEMM of that
many FLOPs, not one expert's GEMM. The curve's x is

    x = 2 · G · ⌈r / 256⌉ · 256 · k · n        (G groups of r rows, k → n)

and a call's forward takes x / (peak · eff(x)), whatever its group count; its backward (the
input gradient and the weight gradient) twice that (Narayanan et al. 2021 §5.1).

Measured on 1 × H200 (docs/benchmarks/moe_checks.md, "Grouped GEMMs keyed by the call"):
one calibration's rows price the grouped GEMMs of the other checks' models 22.5 % off on
average keyed by one expert's FLOPs, 7.5 % keyed by the call's (256-row groups).
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

from meshplan.hardware_profiles.curve import Curve
from meshplan.hardware_profiles.curve_fit import extend_with_base, merge_points

GROUP_TILE_ROWS = 256     # rows a cluster of torch's sm90 grouped kernel covers (docstring)
# a profile's grouped_gemm_key: "call" (this module's x) or "expert" (one expert's GEMM FLOPs,
# 2·r·k·n: profiles and plan files written before 2026-12-03, which carry no key)
GROUPED_GEMM_KEYS = ("call", "expert")
PASSES = 3                # forward, input gradient, weight gradient


def grouped_call_flops(groups: float, rows: float, k: float, n: float) -> float:
    """The curve's x: one grouped call of ``groups`` groups of ``rows`` rows (k → n), each
    group's rows rounded up to :data:`GROUP_TILE_ROWS`."""
    if groups <= 0 or rows <= 0:
        return 0.0
    padded = math.ceil(rows / GROUP_TILE_ROWS - 1e-9) * GROUP_TILE_ROWS
    return 2.0 * groups * padded * k * n


def grouped_call_s(curve: Curve, peak_flops: float, groups: float, rows: float, k: float,
                   n: float) -> float:
    """Forward time of one grouped call on ``curve`` (module docstring)."""
    x = grouped_call_flops(groups, rows, k, n)
    return x / (peak_flops * curve(x)) if x > 0 else 0.0


def grouped_points(rows: Iterable[Mapping[str, Any]], peak_flops: float
                   ) -> list[tuple[float, float]]:
    """(x, efficiency) of every timed grouped-GEMM row (groups, rows a group, k, n and the
    forward + backward seconds); rows without a time skipped."""
    pts = []
    for r in rows:
        if not isinstance(r, Mapping) or not r.get("seconds", 0) > 0:
            continue
        x = grouped_call_flops(r["groups"], r["rows"], r["k"], r["n"])
        pts.append((x, PASSES * x / (peak_flops * r["seconds"])))
    return pts


def grouped_curve(rows: Iterable[Mapping[str, Any]], peak_flops: float,
                  base: Curve | None) -> Curve | None:
    """The curve through the rows' points, continued outside them by ``base``'s shape (the
    dense GEMM curve); None without rows."""
    pts = grouped_points(rows, peak_flops)
    return extend_with_base(merge_points(pts), base) if pts else None


__all__ = ["GROUP_TILE_ROWS", "GROUPED_GEMM_KEYS", "grouped_call_flops", "grouped_call_s", "grouped_points",
           "grouped_curve"]
