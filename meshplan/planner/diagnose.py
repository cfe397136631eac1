"""Why no layout fits, and what would make one fit — the text of :class:`NoFeasiblePlan`."""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Sequence

from meshplan.spec import Job, ModelSpec
from meshplan.errors import NoFeasiblePlan
from meshplan.hardware_profiles import Cluster
from meshplan.planner.bounds import (Ticker, config_memory_lower_bound, size_text,
                                     state_bytes_total)
from meshplan.planner.constraints import Constraints
from meshplan.planner.search import rank_capacities, memory_feasible
from meshplan.planner.space import Config, cp_options, enumerate_configs, tp_options
from meshplan.planner.tables import build_tables

def least_memory(model: ModelSpec, cluster: Cluster, job: Job, counts: Sequence[int],
                 constraints: Constraints, limit: int = 50_000, tick: Ticker | None = None):
    """(peak bytes, config) of the layout needing the least memory per GPU (over every
    config of the space and every partition: bisection on the per-rank layer capacities).
    Configurations whose model states alone exceed the best so far are skipped unbuilt."""
    best = None
    lo_layers = max(1, constraints.min_layers_per_stage)
    for i, cfg in enumerate(enumerate_configs(model, cluster, job, counts, constraints)):
        if i >= limit:
            break
        if tick is not None:
            tick(lambda: f"diagnosing: {i:,} configurations priced for their least memory")
        if best is not None and config_memory_lower_bound(model, job, cfg, lo_layers) >= best[0]:
            continue
        t = build_tables(model, cluster, job, cfg)
        lo, hi = 0.0, max(t.rank_memory_bytes(r, model.num_layers) for r in range(cfg.pp))
        if best is not None and not memory_feasible(t, rank_capacities(t, best[0]), lo_layers):
            continue
        for _ in range(40):
            mid = (lo + hi) / 2
            if memory_feasible(t, rank_capacities(t, mid), lo_layers):
                hi = mid
            else:
                lo = mid
        if best is None or hi < best[0]:
            best = (hi, cfg)
    return best


def _where(model: ModelSpec, cluster: Cluster, counts: Sequence[int]) -> str:
    gpus = ", ".join(str(n) for n in counts[:6]) + (" ..." if len(counts) > 6 else "")
    return f"{model.name!r} on {gpus} GPU(s) of {cluster.name!r}"


def _relaxations(constraints: Constraints, cfg: Config, job: Job,
                 gpus: int) -> list[tuple[str, Constraints]]:
    """(what, constraints) pairs that allow more memory-saving layouts than ``constraints``."""
    relax = []
    if "full" not in constraints.recompute and "recompute" not in constraints.fixed:
        relax.append(("allow recompute='full'", dataclasses.replace(
            constraints, recompute=tuple(constraints.recompute) + ("full",))))
    if 3 not in constraints.zero and "zero" not in constraints.fixed:
        relax.append(("allow ZeRO stage 3", dataclasses.replace(
            constraints, zero=tuple(constraints.zero) + (3,))))
    more_cp = _more_cp(job, constraints, gpus)
    if more_cp is not None:
        relax.append(more_cp)
    for key, what in (("micro_batch", "a smaller micro-batch (unfix micro_batch)"),
                      ("pp", "a longer pipeline (unfix pp)"), ("tp", "another tp (unfix tp)"),
                      ("dp", "another dp (unfix dp)"),
                      ("recompute", "other recompute options (unfix recompute)"),
                      ("zero", "other ZeRO stages (unfix zero)"),
                      ("cp", "other context-parallel degrees (unfix cp)")):
        if key in constraints.fixed:
            fixed = {k: v for k, v in constraints.fixed.items() if k != key}
            relax.append((what, dataclasses.replace(constraints, fixed=fixed)))
    if constraints.max_micro_batch > 1 and cfg.micro_batch > 1:
        relax.append(("micro_batch 1", dataclasses.replace(constraints, max_micro_batch=1)))
    if constraints.memory_headroom > 0:
        relax.append((f"no memory headroom (now {constraints.memory_headroom:.0%})",
                      dataclasses.replace(constraints, memory_headroom=0.0)))
    return relax


def _least_states(model: ModelSpec, cluster: Cluster, job: Job, counts: Sequence[int],
                  constraints: Constraints, min_layers: int,
                  configs: Sequence[Config] | None = None) -> tuple[float, Config] | None:
    if configs is None:
        configs = list(enumerate_configs(model, cluster, job, counts, constraints))
    return min(((config_memory_lower_bound(model, job, c, min_layers), c) for c in configs),
               default=None, key=lambda bc: bc[0])


def states_exceed(model: ModelSpec, cluster: Cluster, job: Job, counts: Sequence[int],
                  constraints: Constraints, capacity_bytes: float, configs: Sequence[Config],
                  min_layers: int) -> NoFeasiblePlan:
    """Every configuration keeps more model states on some GPU than it can hold (found by
    :func:`meshplan.planner.bounds.config_memory_lower_bound`, before any table is built)."""
    need_b, cfg = _least_states(model, cluster, job, counts, constraints, min_layers, configs)
    ways = []
    for what, c2 in _relaxations(constraints, cfg, job, max(counts)):
        cap2 = cluster.usable_memory_bytes * (1 - c2.memory_headroom)
        r = _least_states(model, cluster, job, counts, c2, min_layers)
        if r is not None and r[0] < need_b:
            verdict = "may fit" if r[0] <= cap2 else "still too much"
            ways.append(f"{what}: model states {size_text(r[0])} per GPU ({verdict}; e.g. "
                        f"{r[1].layout().short()})")
    ways.append(_more_gpus_for_states(model, cluster, job, constraints, max(counts),
                                      capacity_bytes, min_layers))
    msg = (f"no layout of {_where(model, cluster, counts)} fits in memory: in each of the "
           f"{len(configs):,} configurations some GPU holds more weights, gradients and "
           f"optimizer state than it can; the least is {size_text(need_b)} "
           f"({cfg.layout().short()}), before activations, but {size_text(capacity_bytes)} is "
           f"usable ({cluster.gpu.name}, after the reserve and "
           f"{constraints.memory_headroom:.0%} headroom). Binding constraint: GPU memory. "
           f"Ways out: " + "; ".join(ways))
    return NoFeasiblePlan(msg, min_memory_bytes=need_b, usable_memory_bytes=capacity_bytes,
                          binding="memory", suggestions=tuple(ways))


def _more_gpus_for_states(model, cluster, job, constraints, n_now: int, capacity_bytes: float,
                          min_layers: int) -> str:
    """The smallest whole-node GPU count (growing by a quarter, up to 64×) at which some
    configuration's model states fit, from the state bounds alone (no table)."""
    g = cluster.gpus_per_node
    nodes = max(-(-n_now // g) + 1,
                math.ceil(state_bytes_total(model, job) / capacity_bytes / g))
    while nodes * g <= 64 * n_now:
        big = dataclasses.replace(cluster, nodes=nodes)
        r = _least_states(model, big, job, [nodes * g], constraints, min_layers)
        if r is not None and r[0] <= capacity_bytes:
            return (f"more GPUs: {nodes * g:,} GPUs ({nodes:,} nodes of {g}) hold the model "
                    f"states, e.g. {r[1].layout().short()} ({size_text(r[0])} per GPU before "
                    f"activations)")
        nodes = max(nodes + 1, math.ceil(nodes * 1.25))
    return (f"more GPUs: no whole-node count up to {64 * n_now:,} GPUs holds the model states "
            f"with these options")


def explain(model: ModelSpec, cluster: Cluster, job: Job, counts: Sequence[int],
            constraints: Constraints, capacity_bytes: float, num_configs: int,
            progress: Callable[[str], None] | None = None) -> NoFeasiblePlan:
    where = _where(model, cluster, counts)
    if num_configs == 0:
        return _empty_space(model, cluster, job, counts, constraints, where)
    tick = Ticker(progress)
    need = least_memory(model, cluster, job, counts, constraints, tick=tick)
    need_b, cfg = need
    ways: list[str] = []
    for what, c2 in _relaxations(constraints, cfg, job, max(counts)):
        cap2 = cluster.usable_memory_bytes * (1 - c2.memory_headroom)
        r = least_memory(model, cluster, job, counts, c2, limit=20_000, tick=tick)
        if r is not None:
            verdict = "fits" if r[0] <= cap2 else "still too much"
            ways.append(f"{what}: least memory {size_text(r[0])} per GPU ({verdict}; "
                        f"e.g. {r[1].layout().short()})")
    more = _more_gpus(model, cluster, job, constraints, max(counts), tick)
    ways.append(more or f"more GPUs: no count up to {64 * max(counts)} GPUs fits with these "
                        f"options (the per-GPU part that no split shrinks is too large)")
    msg = (f"no layout of {where} fits in memory: the least any of the {num_configs:,} "
           f"configurations needs is {size_text(need_b)} per GPU "
           f"({cfg.layout().short()}), but {size_text(capacity_bytes)} is usable "
           f"({cluster.gpu.name}, after the reserve and "
           f"{constraints.memory_headroom:.0%} headroom). Binding constraint: GPU memory. "
           f"Ways out: " + ("; ".join(ways) if ways else "a GPU with more memory"))
    return NoFeasiblePlan(msg, min_memory_bytes=need_b, usable_memory_bytes=capacity_bytes,
                          binding="memory", suggestions=tuple(ways))


def _more_cp(job: Job, constraints: Constraints, gpus: int):
    """Context parallelism the constraints leave out but the sequence allows (each cp rank
    then holds seq_len/cp tokens' activations): (text, relaxed constraints) or None."""
    if "cp" in constraints.fixed:
        return None
    now = set(cp_options(job, constraints))
    every = cp_options(job, dataclasses.replace(constraints, cp=None, cp_min_seq_len=1))
    extra = [c for c in every if c not in now and c <= gpus]
    if not extra:
        return None
    return (f"context parallelism (cp up to {max(extra)}: each rank keeps seq_len/cp of "
            f"the activations; Constraints(cp=...))",
            dataclasses.replace(constraints, cp=tuple(sorted(now | set(extra)))))


def _more_gpus(model, cluster, job, constraints, n_now: int, tick: Ticker) -> str | None:
    """The smallest GPU count (doubling, up to 64×) at which some layout fits."""
    g = cluster.gpus_per_node
    cap = cluster.usable_memory_bytes * (1 - constraints.memory_headroom)
    lo_layers = max(1, constraints.min_layers_per_stage)
    n = n_now
    for _ in range(6):
        n *= 2
        nodes = -(-n // g)
        big = dataclasses.replace(cluster, nodes=max(cluster.nodes, nodes))
        if state_bytes_total(model, job) / n > cap:
            continue
        for i, cfg in enumerate(enumerate_configs(model, big, job, [n], constraints)):
            if i > 20_000:
                break
            tick(lambda: f"diagnosing: trying {n:,} GPUs ({i:,} configurations)")
            if config_memory_lower_bound(model, job, cfg, lo_layers) > cap:
                continue
            t = build_tables(model, big, job, cfg)
            if memory_feasible(t, rank_capacities(t, cap), lo_layers):
                return (f"more GPUs: {n} GPUs ({nodes} nodes of {g}) fit, e.g. "
                        f"{cfg.layout().short()}")
    return None


def _order(value) -> tuple:
    """Numbers in numeric order, before anything else (booleans, names) in text order."""
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    return (0, value, "") if numeric else (1, 0, str(value))


def _empty_space(model, cluster, job, counts, constraints, where) -> NoFeasiblePlan:
    reasons = []
    tps = tp_options(model, cluster, constraints)
    if not tps:
        reasons.append(f"no tp divides the heads ({model.num_heads}), kv heads "
                       f"({model.num_kv_heads}) and ffn ({model.ffn_hidden_size}) within "
                       f"max_tp={constraints.max_tp} and the node size {cluster.gpus_per_node}")
    if constraints.fixed:
        free = dataclasses.replace(constraints, fixed={})
        seen: dict[str, set] = {k: set() for k in constraints.fixed}
        for i, cfg in enumerate(enumerate_configs(model, cluster, job, counts, free)):
            if i > 50_000:
                break
            lay = cfg.layout()
            for k in seen:
                seen[k].add(getattr(lay, k, None))
        if any(seen.values()):
            valid = "; ".join(f"{k}: {', '.join(map(str, sorted(v, key=_order)))}"
                              for k, v in seen.items() if v)
            reasons.append(f"the fixed values {dict(constraints.fixed)} rule out every layout "
                           f"(values the layouts here take, each alone — {valid})")
    if not reasons:
        reasons.append(f"for every tp in {tps} and pp ≤ {model.num_layers} layers, dp = GPUs/"
                       f"(tp·pp) must divide global_batch = {job.global_batch} and "
                       f"micro_batch ≤ {constraints.max_micro_batch} divide global_batch/dp; "
                       f"try a GPU count or global batch with more common factors")
    msg = f"no layout of {where} satisfies the constraints: " + "; ".join(reasons)
    return NoFeasiblePlan(msg, binding="constraints", suggestions=tuple(reasons))


__all__ = ["explain", "states_exceed", "least_memory", "Config"]
