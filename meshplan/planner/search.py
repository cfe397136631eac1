"""Bounds and pruning before the solver: which configurations can possibly be in the top k.

Every configuration gets a lower bound on its step time that holds for *every* stage
partition (:func:`time_lower_bound`); configurations are then visited best bound first,
each one's tables built, its memory feasibility decided exactly and a feasible partition's
true step time taken as an upper bound. Once ``k`` feasible configurations have upper bounds
below the next lower bound, no configuration left can enter the top ``k``: it is pruned
(provably: its best possible value exceeds ``k`` values already achieved). What is left —
the *survivors* — goes to the CP-SAT model, which decides among them and their partitions.

Lower bounds (:func:`time_lower_bound`): the cost model's own pipeline time where the
partition is fixed (one stage, or the even split of interleaved-1f1b / zero-bubble), else a
bound read off the gpipe / 1f1b closed forms of :mod:`meshplan.costmodel.pipeline` (see the
function). After the tables are built, the data-parallel/optimizer tail's bound
(``LayerTables.tail_lower_bound_s``) is added.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Iterable, Sequence

from meshplan.costmodel.estimate import layer_tables
from meshplan.spec import Job, ModelSpec, default_stage_layers
from meshplan.hardware_profiles import Cluster
from meshplan.planner.bounds import Ticker
from meshplan.planner.constraints import end_stage_min_layers
from meshplan.planner.space import Config
from meshplan.planner.tables import ConfigTables, bound_cluster, build_tables

from meshplan.planner.space import (EVEN_PARTITION_SCHEDULES,  # noqa: E402  (see space.py)
                                    interleaved_partitions)


def partition_candidates(cfg: Config, num_layers: int,
                         fixed_partition: tuple[int, ...] | None, min_layers: int = 1
                         ) -> tuple[tuple[int, ...], ...] | None:
    """The partitions the planner prices for ``cfg`` (it keeps the fastest that fits), or
    None when the CP-SAT solver chooses it (gpipe, 1f1b). Interleaved 1F1B: the even split
    where the layers divide the chunks (Megatron-LM's rule) and Megatron's
    account-for-embedding/loss split where L + 2 does (:func:`space.interleaved_partitions`:
    uniform middle chunks, the ends a layer short), which gives Llama 3 405B (126 layers)
    the report's pp 16 · vpp 8 layout and 94-layer Qwen3-235B its pp 8 · vpp 4 and
    pp 32 · vpp 3 ones; zero-bubble: the near-even split (see
    ``space.EVEN_PARTITION_SCHEDULES``)."""
    if fixed_partition is not None:
        return (fixed_partition,)
    if cfg.stages == 1:
        return ((num_layers,),)
    if cfg.schedule not in EVEN_PARTITION_SCHEDULES:
        return None
    if cfg.schedule != "interleaved-1f1b":
        return (default_stage_layers(num_layers, cfg.stages),)
    return interleaved_partitions(num_layers, cfg.stages, min_layers) or None


def objective_weight(cfg: Config, objective: str) -> int:
    """Minimized value = weight · step time. Throughput and time-to-train minimize the step
    time (tokens per step are fixed by the job); cost minimizes GPU-seconds per step."""
    return cfg.num_gpus if objective == "cost" else 1


def _time_zero(job: Job, zero: int) -> int:
    """The ZeRO stage a configuration's pass times are priced at: under Megatron's runtime
    ZeRO 0-2 differ in memory and the data-parallel tail, not in a layer's or an end's
    seconds (only ZeRO-3 gathers per layer), so they share one table for the bounds — except
    in fp8 (the casts read FSDP2's weights under ZeRO-2)."""
    return 0 if job.runtime == "megatron" and job.precision != "fp8" and zero < 3 else zero


@lru_cache(maxsize=65536)
def _pass_times(model: ModelSpec, cluster: Cluster, job: Job, dp: int, pp: int, tp: int,
                mb: int, sp: bool, rc: str, zero: int, compile: bool = False, cp: int = 1,
                cp_style: str = "ring", ep: int = 1, etp: int = 1):
    t = layer_tables(model, cluster, job,
                     Config(dp, pp, tp, mb, "1f1b", 1, rc, zero, sp, compile, cp, cp_style,
                            ep, etp).layout(), checked=True)
    # an MoE model's dense layers may be cheaper than its MoE layers: the bounds take the
    # cheaper kind per layer (stage_sum_s counts each exactly)
    lf = t.layer_forward_s + min(0.0, t.dense_delta_forward_s)
    lb = t.layer_backward_s + min(0.0, t.dense_delta_backward_s)
    return (lf, lb, t.layer_wgrad_s, t.first_forward_s,
            t.first_backward_s, t.last_forward_s, t.last_backward_s, t.last_wgrad_s, t.p2p_s,
            t.overhead_s, t.stage_sum_s())


def time_lower_bound(model: ModelSpec, cluster: Cluster, job: Job, cfg: Config,
                     min_layers: int, fixed_partition: tuple[int, ...] | None = None) -> float:
    """A step time no stage partition of ``cfg`` (≥ ``min_layers`` per stage) beats.

    Schedules whose partition the planner fixes (:func:`partition_candidates`): the cost
    model's own pipeline time of that partition (``LayerTables.pipeline_s``, without
    torch's p2p order, which only lengthens it). Otherwise,
    with ``g_c = f_c + b_c`` and Σ = Σ_c g_c (the same for every partition):

    * gpipe: ``Σ + (m-1)(max f + max b) + 2(p-1)c`` (``pipeline_1f1b._gpipe``) and
      ``max f + max b ≥ max g ≥ G* = max(Σ/S, ⌈L/S⌉·(f+b per layer) + 2·overhead)``;
    * 1f1b: the longest path through the last rank is ``Σ + 2(p-1)c + (m-1)·g_last``,
      and the one through the busiest rank ``k`` is at least ``m·g_k`` (its m forwards and
      backwards all lie on it; ``pipeline_1f1b._one_f_one_b``), so
      ``max(Σ + 2(p-1)c + (m-1)·g_last_min, m·G*)`` with ``g_last_min`` the last stage
      holding the fewest layers it may (one fewer than the others: 0 with the minimum 1);
      and a water-filling relaxation over the home-rank paths (in the code).

    ``tests/unit/test_planner_cpsat.py`` checks the bound against ``LayerTables.step_time_s``
    on random partitions.
    """
    L, S, pp = model.num_layers, cfg.stages, cfg.pp
    cands = partition_candidates(cfg, L, fixed_partition, min_layers)
    if cands is not None and any(len(p) != S for p in cands):
        return 0.0      # the fixed partition does not fit this configuration: infeasible
    if cands is not None:
        # ZeRO 0-2 differ in memory and in the data-parallel tail, not in stage times
        # (only ZeRO-3 adds per-layer gathers: LayerTables.layer_forward_s), so they share
        # one pipeline time — except in fp8, whose weight casts read FSDP2's bf16 weights
        # under ZeRO-2 (fp8_cost.fp8_layer)
        shared = cfg if job.precision == "fp8" else cfg._replace(zero=0 if cfg.zero < 3
                                                                 else 3)
        return min(_forced_pipeline_s(model, cluster, job, shared, p) for p in cands)
    lf, lb, lw, ef, eb, gf, gb, gw, c, ovh, total = _pass_times(
        model, cluster, job, cfg.dp, cfg.pp, cfg.tp, cfg.micro_batch, cfg.sequence_parallel,
        cfg.recompute, _time_zero(job, cfg.zero), *cfg[9:])   # gpipe, 1f1b: vpp = 1
    m = job.global_batch // (cfg.dp * cfg.micro_batch)
    lo = max(1, min_layers)
    g_star = max(total / S, -(-L // S) * (lf + lb) + 2 * ovh)
    if cfg.schedule == "gpipe":
        return total + (m - 1) * g_star + 2 * (pp - 1) * c
    g_last = end_stage_min_layers(S, lo) * (lf + lb) + 2 * ovh + gf + gb
    bound = max(total + 2 * (pp - 1) * c + (m - 1) * g_last, m * g_star)
    if m < 2:
        return bound
    # The path through home rank k is at least Σ + 2(p-1)c + x_k·b_k + nf_k·g_k (first
    # trip to the last stage, last trip from k), or Σ + 2(p-1)c + (m-1)·b_k when rank k
    # never reaches a steady state (nf_k < 1). Each is affine in n_k, α_k·n_k + β_k, so the
    # smallest max over k subject to Σ n_k = L (n real: a relaxation) is the T with
    # Σ_k (T - β_k)/α_k = L.
    inv = rhs = 0.0
    for k in range(pp):
        eb_k = (eb if k == 0 else 0.0) + (gb if k == pp - 1 else 0.0)
        e_k = (ef + eb if k == 0 else 0.0) + (gf + gb if k == pp - 1 else 0.0)
        x = min(pp - 1 - k, m - 1)
        nf = m - 1 - min(pp - 1 - k, m)
        if nf >= 1:
            alpha, beta = x * lb + nf * (lf + lb), x * (ovh + eb_k) + nf * (2 * ovh + e_k)
        else:
            alpha, beta = (m - 1) * lb, (m - 1) * (ovh + eb_k)
        inv += 1 / alpha
        rhs += beta / alpha
    return max(bound, total + 2 * (pp - 1) * c + (L + rhs) / inv)


@lru_cache(maxsize=65536)
def _forced_pipeline_s(model: ModelSpec, cluster: Cluster, job: Job, cfg: Config,
                       forced: tuple[int, ...]) -> float:
    t = layer_tables(model, cluster, job, cfg.layout(), checked=True)
    # without torch's p2p order, which can only lengthen the step: still a lower bound,
    # and the search does not replay every interleaved candidate
    return max(t.pipeline_s(forced, torch_order=False), t.host_bound_s(forced))


def busy_lower_bound(model: ModelSpec, cluster: Cluster, job: Job, cfg: Config) -> float:
    """A cheap bound for every schedule: the busiest pipeline rank runs at least its share
    of the layers' forward and backward passes for each of the m micro-batches (every
    closed form of :mod:`meshplan.costmodel.pipeline` contains some rank's whole busy
    time; checked against ``LayerTables.step_time_s`` in the tests)."""
    lf, lb = _pass_times(model, cluster, job, cfg.dp, cfg.pp, cfg.tp, cfg.micro_batch,
                         cfg.sequence_parallel, cfg.recompute, _time_zero(job, cfg.zero),
                         *cfg[9:])[:2]
    m = job.global_batch // (cfg.dp * cfg.micro_batch)
    return m * model.num_layers * (lf + lb) / cfg.pp


def tail_lower_bound(model: ModelSpec, cluster: Cluster, job: Job, t: ConfigTables) -> float:
    """A bound on the data-parallel/optimizer tail every partition pays (see
    :meth:`meshplan.costmodel.estimate.LayerTables.tail_lower_bound_s`)."""
    return t.tail_lower_bound_s()


def candidate_partitions(t: ConfigTables, min_layers: int) -> list[tuple[int, ...]]:
    """A few cheap starting partitions: even; fewer layers on the first/last stage (they
    carry the embedding and the logits); the smallest first stage."""
    L, S = t.num_layers, t.config.stages
    lo = max(1, min_layers)
    even = list(default_stage_layers(L, S))
    out = [tuple(even)]
    if S > 2:
        for cut_first, cut_last in ((1, 0), (0, 1), (1, 1), (2, 1), (1, 2), (2, 2)):
            if even[0] - cut_first < lo or even[-1] - cut_last < lo:
                continue
            p = even[:]
            p[0] -= cut_first
            p[-1] -= cut_last
            extra = cut_first + cut_last
            mids = sorted(range(1, S - 1), key=lambda i: p[i])
            for i in range(extra):
                p[mids[i % len(mids)]] += 1
            out.append(tuple(p))
    if S > 1 and even[0] > lo:
        rest = default_stage_layers(L - lo, S - 1)
        out.append((lo, *rest))
    return out


@dataclass
class Survivor:
    """A configuration that may be in the top k, with what the solver needs about it."""

    tables: ConfigTables
    lower_bound: float           # weighted objective
    upper_bound: float           # weighted objective of ``partition``
    partition: tuple[int, ...]   # a memory-feasible partition (the incumbent)
    rank_capacity: tuple[int, ...]  # most layers each pipeline rank can hold in memory
    forced: tuple[int, ...] | None = None  # the partition, when the planner does not choose it


@dataclass
class Pruning:
    """What the pre-pass did (reported in Plan.stats)."""

    configs: int = 0
    tables_built: int = 0
    memory_infeasible: int = 0
    pruned_by_bound: int = 0
    survivors: list[Survivor] = field(default_factory=list)
    least_memory: tuple[float, Config] | None = None   # smallest peak over infeasible configs


def rank_capacities(t: ConfigTables, capacity_bytes: float) -> tuple[int, ...]:
    return tuple(t.max_rank_layers(r, capacity_bytes) for r in range(t.config.pp))


def memory_feasible(t: ConfigTables, caps: Sequence[int], min_layers: int) -> bool:
    need = t.config.vpp * max(1, min_layers)
    return min(caps) >= need and sum(caps) >= t.num_layers


def repair_partition(t: ConfigTables, caps: Sequence[int], min_layers: int,
                     start: Sequence[int] | None = None) -> tuple[int, ...] | None:
    """A partition near ``start`` (default: even) that respects every rank's capacity."""
    cfg = t.config
    pp, S = cfg.pp, cfg.stages
    lo = max(1, min_layers)
    parts = list(start or default_stage_layers(t.num_layers, S))
    ranks = [sum(parts[r::pp]) for r in range(pp)]
    for r in range(pp):
        while ranks[r] > caps[r]:
            c = max(range(r, S, pp), key=lambda i: parts[i])
            if parts[c] <= lo:
                return None
            # give the layer to the least loaded rank with room
            dst = min((q for q in range(pp) if ranks[q] < caps[q]), default=None,
                      key=lambda q: ranks[q])
            if dst is None:
                return None
            d = min(range(dst, S, pp), key=lambda i: parts[i])
            parts[c] -= 1
            parts[d] += 1
            ranks[r] -= 1
            ranks[dst] += 1
    return tuple(parts)


def prune(model: ModelSpec, cluster: Cluster, job: Job, configs: Iterable[Config], *,
          objective: str, top_k: int, capacity_bytes: float, min_layers: int,
          fixed_partition: tuple[int, ...] | None = None, progress=None) -> Pruning:
    """Best-bound-first pre-pass (see the module docstring)."""
    out = Pruning()
    configs = list(configs)
    tick = Ticker(progress)
    lo = bound_cluster(cluster)     # rows at their burst clock: bounds for any step's duty
    # (bound, exact?, order, config): configurations whose partition is fixed start with the
    # cheap busy-time bound and get their exact one (a pipeline evaluation) only when they
    # reach the front of the queue.
    queue = []
    for i, cfg in enumerate(configs):
        tick(lambda: f"bounding: time bounds of {i:,}/{len(configs):,} configurations")
        w = objective_weight(cfg, objective)
        if partition_candidates(cfg, model.num_layers, fixed_partition,
                                min_layers) is not None and cfg.stages > 1:
            queue.append((w * busy_lower_bound(model, lo, job, cfg), False, i, cfg))
        else:
            queue.append((w * time_lower_bound(model, lo, job, cfg, min_layers,
                                               fixed_partition), True, i, cfg))
    out.configs = len(queue)
    heapq.heapify(queue)
    best_ubs: list[float] = []       # max-heap (negated) of the k smallest upper bounds
    visited = refined = 0
    while queue:
        lb, exact, i, cfg = queue[0]
        if len(best_ubs) >= top_k and lb > -best_ubs[0] * (1 + 1e-9):
            out.pruned_by_bound += len(queue)
            break
        if not exact:
            refined += 1     # a pipeline evaluation each: seconds in all for large spaces
            tick(lambda: f"bounding: exact time bounds of {refined:,} pipelined "
                         f"configurations, {visited:,}/{out.configs:,} priced")
            w = objective_weight(cfg, objective)
            heapq.heapreplace(queue, (max(lb, w * time_lower_bound(
                model, lo, job, cfg, min_layers, fixed_partition)), True, i, cfg))
            continue
        heapq.heappop(queue)
        tick(lambda: f"bounding: {visited:,}/{out.configs:,} configurations priced, "
                     f"{len(out.survivors):,} candidates, {out.memory_infeasible:,} "
                     f"out of memory")
        visited += 1
        t = build_tables(model, cluster, job, cfg)
        out.tables_built += 1
        caps = rank_capacities(t, capacity_bytes)
        cands = partition_candidates(cfg, model.num_layers, fixed_partition, min_layers)
        forced = None
        if cands is not None:
            fitting = [p for p in cands if len(p) == cfg.stages and all(
                n <= cap for n, cap in zip(t.rank_layers(p), caps))]
            part = min(fitting, key=t.step_time_s) if fitting else None
            forced = part or cands[0]
        else:
            part = None
            if memory_feasible(t, caps, min_layers):
                best = math.inf
                for start in candidate_partitions(t, min_layers):
                    p = repair_partition(t, caps, min_layers, start)
                    if p is not None:
                        v = t.step_time_s(p)
                        if v < best:
                            best, part = v, p
        if part is None:
            out.memory_infeasible += 1
            peak = t.peak_memory_bytes(forced if forced is not None and
                                       len(forced) == cfg.stages else
                                       default_stage_layers(t.num_layers, cfg.stages))
            if out.least_memory is None or peak < out.least_memory[0]:
                out.least_memory = (peak, cfg)
            continue
        w = objective_weight(cfg, objective)
        lb = max(lb, w * (lb / w + tail_lower_bound(model, lo, job, t)))
        ub = w * t.step_time_s(part)
        if len(best_ubs) < top_k:
            heapq.heappush(best_ubs, -ub)
        elif ub < -best_ubs[0]:
            heapq.heapreplace(best_ubs, -ub)
        out.survivors.append(Survivor(t, lb, ub, part, caps, forced))
    if best_ubs and len(best_ubs) >= top_k:
        kth = -best_ubs[0]
        before = len(out.survivors)
        out.survivors = [s for s in out.survivors if s.lower_bound <= kth * (1 + 1e-9)]
        out.pruned_by_bound += before - len(out.survivors)
    return out


__all__ = ["objective_weight", "time_lower_bound", "prune", "Pruning", "Survivor",
           "repair_partition", "memory_feasible", "rank_capacities", "math"]
