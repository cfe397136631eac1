"""Reference search: every configuration of the space × every allowed stage partition, each
evaluated with :func:`meshplan.costmodel.estimate` itself. Exponential in the stages; meant
for small cases, where the CP-SAT planner must find the same optimum (a property test)."""

from __future__ import annotations

import heapq
from math import comb
from typing import Callable, Iterable, Iterator, Sequence

from meshplan.costmodel import estimate
from meshplan.spec import Job, ModelSpec
from meshplan.errors import ConfigError
from meshplan.hardware_profiles import Cluster
from meshplan.planner.bounds import Ticker
from meshplan.planner.constraints import end_stage_min_layers
from meshplan.planner.search import partition_candidates, objective_weight
from meshplan.planner.space import Config

MAX_EVALUATIONS = 2_000_000


def compositions(total: int, parts: int, lo: int,
                 end_lo: int | None = None) -> Iterator[tuple[int, ...]]:
    """Every way to write ``total`` as ``parts`` ordered integers, each ≥ ``lo`` and the
    first and last ≥ ``end_lo`` (default ``lo``), in lexicographic order."""
    mins = _minimums(parts, lo, end_lo)
    for spare in _spread(total - sum(mins), parts):
        yield tuple(m + s for m, s in zip(mins, spare))


def _minimums(parts: int, lo: int, end_lo: int | None) -> tuple[int, ...]:
    ends = lo if end_lo is None else end_lo
    return (min(lo, ends),) if parts == 1 else (ends, *(lo,) * (parts - 2), ends)


def _spread(total: int, parts: int) -> Iterator[tuple[int, ...]]:
    """Every way to write ``total`` as ``parts`` ordered integers ≥ 0 (none if negative)."""
    if total < 0:
        return
    if parts == 1:
        yield (total,)
        return
    for first in range(total + 1):
        for rest in _spread(total - first, parts - 1):
            yield (first, *rest)


def count_compositions(total: int, parts: int, lo: int, end_lo: int | None = None) -> int:
    free = total - sum(_minimums(parts, lo, end_lo))
    return comb(free + parts - 1, parts - 1) if free >= 0 else 0


def search(model: ModelSpec, cluster: Cluster, job: Job, configs: Iterable[Config], *,
           objective: str, top_k: int, capacity_bytes: float, min_layers: int,
           fixed_partition: tuple[int, ...] | None = None,
           progress: Callable[[str], None] | None = None):
    """Top ``top_k`` (weighted step time, config, partition, estimate), best first; one entry
    per configuration (its best partition); ties keep the earlier configuration."""
    configs = list(configs)
    lo = max(1, min_layers)
    L = model.num_layers
    work = sum(len(cands) if (cands := partition_candidates(c, L, fixed_partition, lo))
               is not None else count_compositions(L, c.stages, lo,
                                                   end_stage_min_layers(c.stages, lo))
               for c in configs)
    if work > MAX_EVALUATIONS:
        raise ConfigError(f"exhaustive search would evaluate {work:,} layouts (limit "
                          f"{MAX_EVALUATIONS:,}); use solver='cp-sat' or fix more fields")
    heap: list = []   # max-heap (negated) of the best top_k
    tick = Ticker(progress)
    evaluated = 0
    for i, cfg in enumerate(configs):
        w = objective_weight(cfg, objective)
        best = None
        cands = partition_candidates(cfg, L, fixed_partition, lo)
        parts: Sequence = cands if cands is not None else compositions(
            L, cfg.stages, lo, end_stage_min_layers(cfg.stages, lo))
        for p in parts:
            if len(p) != cfg.stages:
                continue
            est = estimate(model, cluster, job, cfg.layout(p))
            evaluated += 1
            if est.memory_peak_bytes > capacity_bytes:
                continue
            value = w * est.step_time_s
            if best is None or value < best[0]:
                best = (value, p, est)
        if best is not None:
            item = (-best[0], -i, cfg, best[1], best[2])
            if len(heap) < top_k:
                heapq.heappush(heap, item)
            elif item > heap[0]:
                heapq.heapreplace(heap, item)
        tick(lambda: f"exhaustive: {i + 1:,}/{len(configs):,} configurations, "
                     f"{evaluated:,} layouts")
    ranked = sorted(heap, key=lambda it: (-it[0], -it[1]))
    return [(-v, cfg, p, est) for v, _, cfg, p, est in ranked], evaluated
