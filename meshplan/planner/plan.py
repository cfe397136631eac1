"""``plan(model, cluster, job, ...) -> Plan``: the planner's entry point and its result."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from meshplan.costmodel import Estimate, estimate
from meshplan.costmodel.caveats import is_host_bound
from meshplan.spec import Job, Layout, ModelSpec
from meshplan.errors import ConfigError, MeshplanError, PlanFileError
from meshplan.hardware_profiles import Cluster
from meshplan.planner.constraints import OBJECTIVES, Constraints
from meshplan.planner.planfile import load_plan_file, save_plan_file
from meshplan.spec.validate import seq_len_warned

SOLVERS = ("cp-sat", "exhaustive")


@dataclass(frozen=True)
class Candidate:
    """One ranked layout with ``estimate``'s prediction for it."""

    layout: Layout
    estimate: Estimate
    rank: int = 1

    def objective_value(self, objective: str, cluster: Cluster, job: Job) -> float:
        """tokens/s (throughput), USD per million tokens (cost), seconds (time_to_train)."""
        e = self.estimate
        if objective == "cost":
            return cluster.price_per_gpu_hour * e.num_gpus * e.step_time_s / 3600 \
                / job.tokens_per_step * 1e6
        if objective == "time_to_train":
            return job.tokens / e.tokens_per_s
        return e.tokens_per_s


@dataclass(frozen=True)
class Plan:
    """The planner's answer: ranked candidates (best first) and how they were found."""

    model: ModelSpec
    cluster: Cluster
    job: Job
    objective: str
    candidates: tuple[Candidate, ...]
    constraints: Constraints = field(default_factory=Constraints)
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def best(self) -> Candidate:
        return self.candidates[0]

    @property
    def table(self):
        """A pandas DataFrame of the candidates, best first."""
        import pandas as pd
        rows = []
        for c in self.candidates:
            lay, e, t = c.layout, c.estimate, c.estimate.time
            row = {"rank": c.rank, "gpus": e.num_gpus}
            row.update({k: v for k, v in lay.to_dict().items() if k != "stage_layers"})
            row["stage_layers"] = ",".join(map(str, lay.stage_layers or ()))
            row.update(step_time_s=e.step_time_s, tokens_per_s=e.tokens_per_s, mfu=e.mfu,
                       memory_peak_gib=e.memory_peak_bytes / 2**30,
                       num_microbatches=e.num_microbatches)
            if self.objective == "cost":
                row["usd_per_million_tokens"] = c.objective_value("cost", self.cluster, self.job)
            if self.objective == "time_to_train":
                row["time_to_train_s"] = c.objective_value("time_to_train", self.cluster,
                                                           self.job)
            row.update(compute_s=t.compute_s, gemm_s=t.gemm_s, attention_s=t.attention_s,
                       memory_bound_s=t.memory_bound_s, overhead_s=t.overhead_s,
                       tp_comm_s=t.tp_comm_s, pp_comm_s=t.pp_comm_s, bubble_s=t.bubble_s,
                       dp_comm_exposed_s=t.dp_comm_exposed_s, zero3_gather_s=t.zero3_gather_s,
                       optimizer_s=t.optimizer_s, host_wait_s=t.host_wait_s,
                       pp_interference_s=t.pp_interference_s, fsdp_step_s=t.fsdp_step_s,
                       host_load=e.host_load)
            rows.append(row)
        return pd.DataFrame(rows).set_index("rank")

    # ---- files -----------------------------------------------------------------------
    def to_json(self, path: str | Path, *, overwrite: bool = False) -> Path:
        """Write the plan file (see :mod:`meshplan.planner.planfile`); an existing file is
        replaced only with ``overwrite=True`` (the CLI's ``--force``)."""
        cands = [{"layout": c.layout.to_dict(), "prediction": c.estimate.to_dict()}
                 for c in self.candidates]
        search = {"objective": self.objective, "constraints": _jsonable(self.constraints),
                  "stats": _jsonable(self.stats)}
        return save_plan_file(path, self.model, self.cluster, self.job, self.best.layout,
                              self.best.estimate.to_dict(), cands, overwrite=overwrite,
                              search=search)

    @classmethod
    def from_json(cls, path: str | Path) -> "Plan":
        """Rebuild a Plan from its file (candidates are re-estimated)."""
        rec = load_plan_file(path)
        objective = rec.search.get("objective", "throughput") if rec.search else "throughput"
        if objective not in OBJECTIVES:
            raise PlanFileError(f"{path}: field 'search.objective' is {objective!r}; expected "
                                f"one of {OBJECTIVES}")
        layouts = [rec.layout]
        for i, c in enumerate(rec.candidates):
            if not isinstance(c, dict) or "layout" not in c:
                raise PlanFileError(f"{path}: field 'candidates[{i}]' has no 'layout'")
            try:
                lay = Layout.from_dict(c["layout"])
            except (MeshplanError, TypeError) as exc:
                raise PlanFileError(f"{path}: field 'candidates[{i}].layout' is invalid: "
                                    f"{exc}") from None
            if lay != rec.layout:
                layouts.append(lay)
        cands = []
        for i, lay in enumerate(layouts):
            try:
                est = estimate(rec.model, rec.cluster, rec.job, lay)
            except MeshplanError as exc:
                what = "layout" if i == 0 else f"candidates[{i}].layout"
                raise PlanFileError(f"{path}: field {what!r} cannot run: {exc}") from None
            cands.append(Candidate(lay, est, i + 1))
        return cls(rec.model, rec.cluster, rec.job, objective, tuple(cands),
                   stats=dict(rec.search.get("stats", {})) if rec.search else {})

    def write_launch_script(self, directory: str | Path, launcher: str = "torchrun", *,
                            overwrite: bool = False) -> Path:
        from meshplan.planner.launch import write_launch_script
        return write_launch_script(self, directory, launcher, overwrite=overwrite)

    def summary(self) -> str:
        b = self.best
        return (f"{self.model.name} on {b.estimate.num_gpus} × {self.cluster.gpu.name}: "
                f"{b.layout.short()} — {b.estimate.tokens_per_s:,.0f} tokens/s, "
                f"MFU {b.estimate.mfu:.1%}, peak {b.estimate.memory_peak_bytes / 2**30:.1f} GiB")


def _jsonable(obj: Any) -> Any:
    if hasattr(obj, "to_dict"):
        obj = obj.to_dict()
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return obj


def plan(model: ModelSpec, cluster: Cluster, job: Job, *, gpus: int | Iterable[int] | None = None,
         objective: str = "throughput", top_k: int = 10, constraints: Constraints | None = None,
         solver: str = "cp-sat", progress: Callable[[str], None] | None = None) -> Plan:
    """Search the layout space and return the best ``top_k`` layouts (raises NoFeasiblePlan).

    ``gpus``: None = every GPU of the cluster (or, with ``allow_idle_gpus``, any whole number
    of nodes); an int; or a range/list of counts to choose from. See docs/planner.md.
    """
    from meshplan.planner import diagnose
    from meshplan.planner.bounds import check_memory_floor, config_memory_lower_bound
    from meshplan.planner.search import prune
    from meshplan.planner.space import (check_global, check_options, enumerate_configs,
                                        gpu_counts)

    if not isinstance(model, ModelSpec) or not isinstance(cluster, Cluster) or \
            not isinstance(job, Job):
        raise ConfigError("plan() needs a ModelSpec, a Cluster and a Job, got "
                          f"{type(model).__name__}, {type(cluster).__name__}, "
                          f"{type(job).__name__}")
    if objective not in OBJECTIVES:
        raise ConfigError(f"objective {objective!r} is not valid; choose one of "
                          f"{', '.join(OBJECTIVES)}")
    if objective == "time_to_train" and job.tokens is None:
        raise ConfigError("objective 'time_to_train' needs Job.tokens (the run's total tokens)")
    if objective == "cost" and cluster.price_per_gpu_hour <= 0:
        raise ConfigError(f"objective 'cost' needs a price: cluster {cluster.name!r} has "
                          f"price_per_gpu_hour = {cluster.price_per_gpu_hour}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ConfigError(f"top_k must be a positive integer, got {top_k!r}")
    if solver not in SOLVERS:
        raise ConfigError(f"solver {solver!r} is not valid; choose one of {', '.join(SOLVERS)}")
    constraints = constraints if constraints is not None else Constraints()
    if not isinstance(constraints, Constraints):
        raise ConfigError(f"constraints must be a meshplan.planner.Constraints, got "
                          f"{type(constraints).__name__}")
    check_global(model, cluster, job)
    check_options(model, job, constraints)
    counts = gpu_counts(cluster, gpus, objective, constraints)
    capacity = cluster.usable_memory_bytes * (1 - constraints.memory_headroom)
    fixed_partition = constraints.fixed.get("stage_layers")
    if fixed_partition is not None and sum(fixed_partition) != model.num_layers:
        raise ConfigError(f"fixed stage_layers {list(fixed_partition)} sum to "
                          f"{sum(fixed_partition)}; {model.name!r} has {model.num_layers} layers")
    min_layers = constraints.min_layers_per_stage
    if fixed_partition is not None:
        min_layers = min(min_layers, min(fixed_partition))
    t0 = time.perf_counter()
    check_memory_floor(model, cluster, job, counts, capacity, constraints.memory_headroom)
    all_configs = list(enumerate_configs(model, cluster, job, counts, constraints))
    configs = [c for c in all_configs
               if config_memory_lower_bound(model, job, c, min_layers) <= capacity]
    if all_configs and not configs:
        raise diagnose.states_exceed(model, cluster, job, counts, constraints, capacity,
                                     all_configs, min_layers)
    stats: dict[str, Any] = {"solver": solver, "gpu_counts": counts[:50],
                             "configurations": len(all_configs),
                             "rejected_by_state_bound": len(all_configs) - len(configs)}
    results = []   # (config, partition)
    if solver == "exhaustive":
        from meshplan.planner import exhaustive
        with seq_len_warned():          # check_global warned for a long sequence once
            ranked, evaluated = exhaustive.search(
                model, cluster, job, configs, objective=objective, top_k=top_k,
                capacity_bytes=capacity, min_layers=min_layers,
                fixed_partition=fixed_partition, progress=progress)
        stats["layouts_evaluated"] = evaluated
        results = [(cfg, p) for _, cfg, p, _ in ranked]
    else:
        from meshplan.planner import cpsat
        pr = prune(model, cluster, job, configs, objective=objective, top_k=top_k,
                   capacity_bytes=capacity, min_layers=min_layers,
                   fixed_partition=fixed_partition, progress=progress)
        stats.update(tables_built=pr.tables_built, memory_infeasible=pr.memory_infeasible,
                     pruned_by_bound=pr.pruned_by_bound, survivors=len(pr.survivors))
        stats["bound_s"] = time.perf_counter() - t0
        if pr.survivors:
            sols, st = cpsat.solve(model, cluster, job, pr.survivors, objective=objective,
                                   top_k=top_k, gpu_counts=counts, min_layers=min_layers,
                                   tp_within_node=constraints.tp_within_node,
                                   fixed_partition=fixed_partition, progress=progress)
            stats.update(cpsat_variables=st["variables"], cpsat_constraints=st["constraints"],
                         cpsat_solves=st["solves"], cpsat_wall_s=st["wall_s"],
                         cpsat_partition_models=st["partition_models"],
                         all_optimal=st["all_optimal"] and all(s.optimal for s in sols))
            results = [(pr.survivors[s.survivor].tables.config, s.partition) for s in sols]
    stats["space_layouts"] = _space_size(model, all_configs, min_layers, fixed_partition)
    if not results:
        raise diagnose.explain(model, cluster, job, counts, constraints, capacity,
                               len(all_configs), progress=progress)
    cands = []
    for cfg, part in results:
        lay = cfg.layout(part)
        with seq_len_warned():          # check_global warned for a long sequence once
            est = estimate(model, cluster, job, lay)   # the Plan reports estimate's numbers
        if est.memory_peak_bytes > capacity * (1 + 1e-12) or constraints.allows(lay):
            raise MeshplanError(f"internal planner error: {lay.short()} {part} violates the "
                                f"constraints ({constraints.allows(lay) or 'memory'})")
        cands.append((lay, est))
    weight = (lambda e: e.num_gpus * e.step_time_s) if objective == "cost" else \
        (lambda e: e.step_time_s)
    fastest = min(cands, key=lambda le: weight(le[1]))[0]
    cands = rank_candidates(cands, weight, cluster, constraints.host_bound_margin)
    if cands[0][0] != fastest:
        stats["host_bound_preferred_over"] = fastest.short()
    stats["wall_s"] = time.perf_counter() - t0
    return Plan(model, cluster, job, objective,
                tuple(Candidate(lay, est, i + 1) for i, (lay, est) in enumerate(cands)),
                constraints, stats)


def rank_candidates(cands: list, weight: Callable[[Estimate], float], cluster: Cluster,
                    margin: float) -> list:
    """(layout, estimate) pairs best first: by ``weight`` (lower is better), a host-bound
    estimate's weight taken ``1 + margin`` times larger (:attr:`Constraints.host_bound_margin`).

    Worked example, margin 0.03: a host-bound layout predicted at 1.00 s ranks as 1.03 s,
    so a GPU-bound one predicted at 1.02 s comes first and one at 1.04 s second; with
    margin 0 the order is the prediction's. Ties keep the solver's order (stable sort)."""
    numbers = cluster.gpu.corrections

    def key(le) -> float:
        e = le[1]
        host = is_host_bound(e.time.host_wait_s, e.step_time_s, numbers)
        return weight(e) * (1 + margin if host else 1.0)
    return sorted(cands, key=key)


def _space_size(model, configs, min_layers, fixed_partition) -> int:
    """Layouts in the space: configurations × their allowed stage partitions."""
    if fixed_partition is not None:
        return len(configs)
    from meshplan.planner.constraints import end_stage_min_layers
    from meshplan.planner.exhaustive import count_compositions
    from meshplan.planner.search import partition_candidates
    lo = max(1, min_layers)
    memo: dict[int, int] = {}
    total = 0
    for c in configs:
        cands = partition_candidates(c, model.num_layers, None, lo)
        if cands is not None:
            total += len(cands)
            continue
        key = (c.stages, end_stage_min_layers(c.stages, lo))
        if key not in memo:
            memo[key] = count_compositions(model.num_layers, c.stages, lo, key[1])
        total += memo[key]
    return total
