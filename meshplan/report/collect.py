"""Run the planner for every question a report asks (GPU counts, GPU types, what-ifs).

Every number a report shows comes from here: :func:`meshplan.plan` picks the layouts and
:func:`meshplan.costmodel.estimate` (inside the planner) predicts them. Nothing is re-derived.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from meshplan.costmodel.result import Estimate
from meshplan.spec import Job, Layout, ModelSpec
from meshplan.errors import ConfigError, NoFeasiblePlan
from meshplan.hardware_profiles import Cluster

OBJECTIVES = ("throughput", "cost", "time_to_train")


@dataclass(frozen=True, kw_only=True)
class PlanOutcome:
    """The planner's answer for one (cluster, GPU count, job): ranked candidates, or why none."""

    gpus: int
    cluster: Cluster
    job: Job
    candidates: tuple[tuple[Layout, Estimate], ...] = ()
    error: str | None = None

    @property
    def feasible(self) -> bool:
        return bool(self.candidates)

    @property
    def layout(self) -> Layout:
        return self.candidates[0][0]

    @property
    def estimate(self) -> Estimate:
        return self.candidates[0][1]


def cluster_for(cluster: Cluster, gpus: int) -> Cluster:
    """``cluster`` resized to the fewest whole nodes that hold ``gpus`` GPUs."""
    return cluster.replace(nodes=max(1, math.ceil(gpus / cluster.gpus_per_node)))


def check_gpu_counts(gpus: Any) -> tuple[int, ...]:
    """Validate GPU counts: positive integers, sorted, without repeats."""
    if isinstance(gpus, int) and not isinstance(gpus, bool):
        gpus = (gpus,)
    try:
        items = list(gpus)
    except TypeError:
        raise ConfigError(f"gpus must be a GPU count or a list of counts, got {gpus!r}") from None
    if not items:
        raise ConfigError("gpus is empty; give at least one GPU count, e.g. gpus=[64, 128]")
    for g in items:
        if isinstance(g, bool) or not isinstance(g, int) or g < 1:
            raise ConfigError(f"GPU count {g!r} is not valid; GPU counts are integers >= 1")
    return tuple(sorted(set(items)))


def _candidates(plan_obj) -> tuple[tuple[Layout, Estimate], ...]:
    """(layout, estimate) pairs of a :class:`meshplan.Plan`, best first, fitting ones only."""
    cands = getattr(plan_obj, "candidates", None) or [plan_obj.best]
    out = [(c.layout, c.estimate) for c in cands if c.estimate.fits]
    return tuple(out)


def plan_outcome(model: ModelSpec, cluster: Cluster, job: Job, gpus: int, *,
                 objective: str, top_k: int, constraints=None) -> PlanOutcome:
    """Plan ``gpus`` GPUs of ``cluster``; a count no layout can use becomes an outcome with
    the planner's explanation instead of an exception, so one bad count does not end a report."""
    from meshplan.planner import plan
    sized = cluster_for(cluster, gpus)
    kwargs: dict[str, Any] = {"gpus": gpus, "objective": objective, "top_k": top_k}
    if constraints is not None:
        kwargs["constraints"] = constraints
    try:
        p = plan(model, sized, job, **kwargs)
    except NoFeasiblePlan as exc:
        return PlanOutcome(gpus=gpus, cluster=sized, job=job, error=str(exc))
    cands = _candidates(p)
    if not cands:
        return PlanOutcome(gpus=gpus, cluster=sized, job=job,
                           error="the planner returned no layout that fits in memory")
    return PlanOutcome(gpus=gpus, cluster=sized, job=job, candidates=cands)


def sensitivity_values(baseline: int, factors: tuple[float, ...], *, low: int = 1,
                       high: int | None = None) -> tuple[int, ...]:
    """``baseline`` scaled by ``factors``, kept as integers within [low, high], sorted."""
    vals = {baseline}
    for f in factors:
        v = int(round(baseline * f))
        if v >= low and (high is None or v <= high):
            vals.add(v)
    return tuple(sorted(vals))


def price_of(outcome: PlanOutcome) -> float:
    return outcome.cluster.price_per_gpu_hour


Progress = Callable[[str], None]
