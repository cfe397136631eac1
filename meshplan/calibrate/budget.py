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

#: ``meshplan calibrate --nproc N`` puts its own start (``time.time()``) here for the
#: torchrun children, so that their budget counts torchrun's start-up and the imports
#: (20-40 s on the lent GPU hosts) as the job's time limit does
LAUNCHED_AT_ENV = "MESHPLAN_CALIBRATE_LAUNCHED_AT"


def started_perf_counter(environ, now_perf_s: float, now_wall_s: float) -> float:
    """The ``time.perf_counter()`` value of the calibration's start: the launcher's start
    where ``environ`` carries it (:data:`LAUNCHED_AT_ENV`, a wall-clock time not in the
    future), else now. A value that does not parse is ignored (the budget then starts
    here, as before the launcher recorded it)."""
    raw = environ.get(LAUNCHED_AT_ENV)
    try:
        launched = float(raw) if raw is not None else now_wall_s
    except ValueError:
        launched = now_wall_s
    if not math.isfinite(launched):
        launched = now_wall_s
    return now_perf_s - min(max(now_wall_s - launched, 0.0), 3600.0)


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


__all__ = ["AFTER_LAYERS_ALLOWANCE_S", "LAUNCHED_AT_ENV", "RoundBudget", "RoundDecision",
           "next_round", "check_time_budget", "started_perf_counter"]
