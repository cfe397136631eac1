"""The CP-SAT search: the layers of every stage, and the choice among configurations.

:func:`solve` gives every surviving configuration of :mod:`meshplan.planner.search` whose
partition is free its own model (layer counts, memory caps, pipeline closed form, per-rank
tails: :mod:`meshplan.planner.cpsat_partition`), then solves the selection model over the
configurations (their layout fields under DESIGN.md's rules:
:mod:`meshplan.planner.cpsat_fields`). Objective: ``w·step`` (w = 1 for throughput and time
to train, GPUs for cost).

ortools is imported only by the CP-SAT modules, inside their functions (GPU machines have
no ortools).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Callable, Sequence

from meshplan.spec import Job, ModelSpec
from meshplan.errors import MeshplanError
from meshplan.hardware_profiles import Cluster
from meshplan.planner.bounds import Ticker
from meshplan.planner.cpsat_fields import _field_constraints
from meshplan.planner.cpsat_partition import UNITS_PER_S, _config_model, _u, pipeline_units
from meshplan.planner.search import Survivor, objective_weight


@dataclass(frozen=True)
class Solution:
    survivor: int                 # index into the survivor list
    partition: tuple[int, ...]
    objective_units: int
    optimal: bool


def solve(model: ModelSpec, cluster: Cluster, job: Job, survivors: Sequence[Survivor], *,
          objective: str, top_k: int, gpu_counts: Sequence[int], min_layers: int,
          tp_within_node: bool, fixed_partition: tuple[int, ...] | None = None,
          time_limit_s: float = 30.0, workers: int = 2,
          progress: Callable[[str], None] | None = None) -> tuple[list[Solution], dict]:
    """Best ``top_k`` distinct configurations with their solver-chosen partitions, best first.

    Phase 1 visits the survivors best lower bound first; a configuration whose partition
    is fixed costs its cost-model value, the others get their own CP-SAT model (layer
    counts, memory caps, pipeline closed form, per-rank tails) with ``step ≤ k-th best so
    far`` as a cut; visiting stops once a lower bound exceeds the k-th best value (nothing
    later can enter the top k). Phase 2 is the selection model over those configurations
    (the layout fields as variables under DESIGN.md's rules), solved ``top_k`` times, each
    solve forbidding the configurations already returned. One global model with every
    survivor's partition variables is the same optimisation, but CP-SAT needed minutes to
    prove it optimal on large cases where the decomposed one needs a fraction of a second.
    """
    from ortools.sat.python import cp_model

    lo = max(1, min_layers)
    stats = {"variables": 0, "constraints": 0, "solves": 0, "wall_s": 0.0,
             "partition_models": 0, "all_optimal": True}
    found: dict[int, tuple[int, tuple[int, ...], bool]] = {}   # survivor -> (value, part, opt)
    # Best value known per configuration: its incumbent partition's (the pre-pass upper
    # bound), replaced by the solver's optimum once solved; the k-th smallest is a cutoff.
    known = {i: s.upper_bound for i, s in enumerate(survivors)}
    order = sorted(range(len(survivors)), key=lambda i: survivors[i].lower_bound)
    tick = Ticker(progress)
    for visited, i in enumerate(order):
        # before the solve, not after it: an infeasible model skips the loop's end
        tick(lambda: f"CP-SAT partitions: {visited + 1}/{len(survivors)} candidate "
                     f"configurations, {stats['partition_models']} partition models")
        s = survivors[i]
        kth = heapq.nsmallest(top_k, known.values())[-1] if len(known) >= top_k else None
        if kth == math.inf:
            kth = None
        if kth is not None and s.lower_bound > kth * (1 + 1e-9):
            break
        w = objective_weight(s.tables.config, objective)
        if s.forced is not None:
            value, part, opt = w * _u(s.tables.step_time_s(s.forced)), s.forced, True
        else:
            M = cp_model.CpModel()
            x, step, n = _config_model(M, s, "", lo)
            M.Add(x == 1)
            if kth is not None:   # slack: integer rounding of the stage times
                M.Add(w * step <= int(kth * UNITS_PER_S * (1 + 1e-6)) + 1)
            for nv, v in zip(n, s.partition):
                M.AddHint(nv, v)
            # ties in step time (a stage that sets it, the others free to shift) go to the
            # partition whose fullest pipeline rank holds the fewest layers
            L, pp = s.tables.num_layers, s.tables.config.pp
            fullest = M.NewIntVar(0, L, "fullest")
            for r in range(pp):
                M.Add(fullest >= sum(n[r::pp]))
            M.Minimize(step * (L + 1) + fullest)
            solver = cp_model.CpSolver()
            solver.parameters.max_time_in_seconds = time_limit_s
            solver.parameters.num_workers = workers
            status = solver.Solve(M)
            stats["partition_models"] += 1
            stats["solves"] += 1
            stats["wall_s"] += solver.WallTime()
            stats["variables"] += len(M.Proto().variables)
            stats["constraints"] += len(M.Proto().constraints)
            if status == cp_model.INFEASIBLE:
                known[i] = math.inf           # cannot beat the k-th best
                continue
            if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
                raise MeshplanError(f"CP-SAT found no partition for {s.tables.config} "
                                    f"({solver.StatusName(status)}) within {time_limit_s} s")
            opt = status == cp_model.OPTIMAL
            stats["all_optimal"] &= opt
            value = w * int(solver.Value(step))
            part = tuple(int(solver.Value(nv)) for nv in n)
        found[i] = (value, part, opt)
        known[i] = value / UNITS_PER_S
    if not found:
        raise MeshplanError(f"CP-SAT found no solution among {len(survivors)} candidate "
                            f"configurations")

    # ---- phase 2: the selection model
    idx = sorted(found)
    M = cp_model.CpModel()
    xs = [M.NewBoolVar(f"x{i}") for i in idx]
    M.AddExactlyOne(xs)
    _field_constraints(M, model, cluster, job, [survivors[i] for i in idx], xs, gpu_counts,
                       tp_within_node)
    M.Minimize(sum(found[i][0] * x for i, x in zip(idx, xs)))
    stats["variables"] += len(M.Proto().variables)
    stats["constraints"] += len(M.Proto().constraints)
    out: list[Solution] = []
    for rank in range(min(top_k, len(idx))):
        solver = cp_model.CpSolver()
        solver.parameters.num_workers = workers
        status = solver.Solve(M)
        stats["solves"] += 1
        stats["wall_s"] += solver.WallTime()
        if status != cp_model.OPTIMAL:
            if rank == 0:
                raise MeshplanError(f"CP-SAT selection failed ({solver.StatusName(status)})")
            break
        j = next(q for q, x in enumerate(xs) if solver.Value(x))
        value, part, opt = found[idx[j]]
        out.append(Solution(idx[j], part, value, opt))
        if progress is not None:
            progress(f"CP-SAT: candidate {rank + 1}/{top_k} "
                     f"({survivors[idx[j]].tables.config.num_gpus} GPUs)")
        M.Add(xs[j] == 0)
    return out, stats


__all__ = ["solve", "Solution", "UNITS_PER_S", "pipeline_units"]
