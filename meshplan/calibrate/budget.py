"""``meshplan calibrate --time-budget``: how many layer-table rounds a calibration can afford.

The layer tables are measured in rounds, each the whole grid (a row is the median over
rounds, :func:`meshplan.calibrate.bench_layers.combine_rounds`). On 4 × H200 with two models
and ``--micro-batches 2,4,8`` a round takes about 180 s and three rounds with the rest about
600 s: past a 10-minute job limit, and the profile is written only at the end (atomically,
so a killed calibration leaves none). With a budget, round 1 always runs (a profile from one
round is better than none) and each further round only if it is projected to end, with what
still follows the layer tables, within the budget.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from meshplan.errors import ConfigError

# What follows the layer tables: the pipeline-action and overlap benchmarks (world > 1) and
# writing the profile. About 3 s on 2 x H200 (round 5: layer tables end at 166.7 s, profile
# written at 169.5 s); 15 s leaves room for a slower machine or a bigger world.
AFTER_LAYERS_ALLOWANCE_S = 15.0


@dataclass(frozen=True, kw_only=True)
class RoundDecision:
    """Whether the next layer round runs, and the end of the calibration it projects."""

    run: bool
    projected_end_s: float   # seconds since the calibration started


def next_round(*, elapsed_s: float, last_round_s: float, budget_s: float,
               allowance_s: float = AFTER_LAYERS_ALLOWANCE_S) -> RoundDecision:
    """Run another round if, taking as long as the last one, it and the ``allowance_s``
    after the layer tables still end within ``budget_s`` of the calibration's start
    (``elapsed_s`` is the time since then). Pure: every rank must take the same decision,
    so callers pass values already agreed over ranks."""
    projected = elapsed_s + last_round_s + allowance_s
    return RoundDecision(run=projected <= budget_s, projected_end_s=projected)


@dataclass(frozen=True, kw_only=True)
class RoundBudget:
    """A wall-clock budget for the whole calibration, as the layer rounds see it."""

    budget_s: float
    started_s: float        # time.perf_counter() when this process's calibration started
    allowance_s: float = AFTER_LAYERS_ALLOWANCE_S

    def __post_init__(self) -> None:
        check_time_budget("RoundBudget.budget_s", self.budget_s)

    def elapsed_s(self) -> float:
        return time.perf_counter() - self.started_s


def check_time_budget(name: str, value: object) -> None:
    """Raise :class:`ConfigError` unless ``value`` is a finite number of seconds > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name} must be a finite number of seconds > 0, got {value!r}")


__all__ = ["AFTER_LAYERS_ALLOWANCE_S", "RoundBudget", "RoundDecision", "next_round",
           "check_time_budget"]
