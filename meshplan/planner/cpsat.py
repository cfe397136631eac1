"""The CP-SAT models: the layers of every stage, and the choice among configurations.

Per surviving configuration of :mod:`meshplan.planner.search` whose partition is free
(``_config_model``):

* ``n_c`` (int): transformer layers of virtual stage ``c`` (``Σ_c n_c = L``, each ≥ the
  minimum) — the uneven partition is the solver's choice;
* ``N_r = Σ_{c≡r} n_c``: layers of pipeline rank ``r``, with ``N_r ≤ cap_r``, the most
  layers rank ``r`` holds within usable memory × (1 − headroom) (the per-rank memory is
  linear in ``N``; ``LayerTables.max_rank_layers`` computes the cap with the cost model's
  own floating-point formula so it agrees with ``estimate``'s comparison exactly);
* the pipeline time: the closed form of
  :func:`meshplan.costmodel.pipeline.closed_form_step_time` written with max-variables
  (:func:`pipeline_units`); the per-rank exposed data-parallel + optimizer tail as a table
  over the rank's layer count (``AddElement`` on ``LayerTables.rank_tail_s``).

Costs are integers in units of 0.1 ns. The selection model (:func:`solve`, phase 2) has
one boolean per configuration, exactly one true, the layout fields ``dp, pp, tp,
micro_batch, vpp, schedule, recompute, zero, sequence_parallel`` as integer variables tied
to them, and the rules of DESIGN.md as constraints: ``dp·pp·tp·cp = GPUs`` (one of the
allowed counts; with cp > 1 also ``2·cp·c = seq_len``; with experts ``ep·q = experts`` and
``ep·etp·edp·pp = GPUs``), ``global_batch = dp·micro_batch·m``, ``tp·a = heads``, ``tp·b = kv
heads``, ``tp·q = ffn``, ``tp·c = GPUs per node`` (tp inside one NVLink domain) where
asked. Objective: ``w·step`` (w = 1 for throughput and time to train, GPUs for cost).

ortools is imported here only, inside the functions (GPU machines have no ortools).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Callable, Sequence

from meshplan.spec import RECOMPUTE, SCHEDULES, Job, ModelSpec
from meshplan.spec.choices import CP_STYLES
from meshplan.errors import MeshplanError
from meshplan.hardware_profiles import Cluster
from meshplan.planner.bounds import Ticker
from meshplan.planner.search import Survivor, objective_weight

UNITS_PER_S = 10**10  # 0.1 ns: rounding stays ~1e-9 of a step


def _u(seconds: float) -> int:
    return int(round(seconds * UNITS_PER_S))


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
            M.Minimize(step)
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
        tick(lambda: f"CP-SAT partitions: {visited + 1}/{len(survivors)} candidate "
                     f"configurations, {stats['partition_models']} partition models")
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


def _config_model(M, s: Survivor, tag: str, lo: int):
    """One configuration's variables: layer counts per virtual stage, per-rank layers within
    the memory caps, the pipeline time and the per-rank tail (both from the cost model's
    tables). Returns (x, step, n): ``step ≥ pipeline + max tail`` when ``x``."""
    t = s.tables
    cfg = t.config
    L = t.num_layers
    S, pp, v = cfg.stages, cfg.pp, cfg.vpp
    x = M.NewBoolVar(f"x{tag}")
    n = [M.NewIntVar(0, L, f"n{tag}_{c}") for c in range(S)]
    M.Add(sum(n) == L * x)
    forced = s.forced
    for c in range(S):
        if forced is not None:
            M.Add(n[c] == forced[c] * x)
        else:
            M.Add(n[c] >= lo * x)
    N = []
    for r in range(pp):
        Nr = M.NewIntVar(0, s.rank_capacity[r], f"N{tag}_{r}")
        M.Add(Nr == sum(n[r::pp]))
        N.append(Nr)
    # ---- pipeline time: the cost model's own number when the partition is fixed,
    # else its closed form written with max-variables (see pipeline_units)
    big = _u(1e4)
    if forced is not None:
        pipe = _u(max(t.pipeline_s(forced), t.host_bound_s(forced))) * x
    else:
        pipe = pipeline_units(M, t, n, tag)
        if t.cpu_known:
            pipe = _host_bound_units(M, t, n, N, x, pipe, tag)
    # ---- data-parallel + optimizer tail per rank (tables over the rank's layers)
    tm = M.NewIntVar(0, big, f"tail{tag}")
    cache: dict[tuple, list[int]] = {}
    for r in range(pp):
        rlo = v * lo if forced is None else sum(forced[r::pp])
        cap = s.rank_capacity[r]
        key = (r == 0, r == t.last_rank, rlo)
        if key not in cache:
            hi = max(s.rank_capacity[q] for q in range(pp)
                     if (q == 0, q == t.last_rank) == key[:2])
            cache[key] = [_u(t.rank_tail_s(r, nn)) for nn in range(rlo, hi + 1)]
        table = cache[key][: cap - rlo + 1]
        idx = M.NewIntVar(0, cap - rlo, f"i{tag}_{r}")
        M.Add(idx == N[r] - rlo * x)
        tr = M.NewIntVar(min(table), max(table), f"t{tag}_{r}")
        M.AddElement(idx, table, tr)
        M.Add(tm >= tr)
    step = M.NewIntVar(0, big, f"step{tag}")
    M.Add(step >= pipe + tm).OnlyEnforceIf(x)
    return x, step, n


def _stage_units(t, n) -> tuple[list, list]:
    """Per-micro-batch forward and backward time of each stage as CP-SAT expressions of its
    layer count (``LayerTables.stage_times`` in integer units)."""
    S = t.config.stages
    # stage i scaled by its rank's p2p slowdown, as LayerTables.stage_times does
    k = t.slowdown or (1.0,) * S

    def stage(i: int, layer_s: float, first_s: float, last_s: float):
        return (_u(k[i] * layer_s) * n[i] + _u(k[i] * t.overhead_s)
                + (_u(k[i] * first_s) if i == 0 else 0) + (_u(k[i] * last_s) if i == S - 1 else 0))
    return ([stage(i, t.layer_forward_s, t.first_forward_s, t.last_forward_s) for i in range(S)],
            [stage(i, t.layer_backward_s, t.first_backward_s, t.last_backward_s)
             for i in range(S)])


def _host_bound_units(M, t, n, N, x, pipe, tag: str):
    """max(GPU pipeline, :meth:`LayerTables.host_bound_s`) for free 1F1B/GPipe partitions:
    rank r's CPU total (linear in its layers N_r) plus the backward path of the stages
    before it (linear in their layers); a variable bounded below by each, and by ``pipe``,
    equals their max at the optimum (it enters the minimised step with weight 1)."""
    cfg = t.config
    pp, m = cfg.pp, t.num_microbatches
    c = _u(t.p2p_s) if pp > 1 else 0
    _, b = _stage_units(t, n)
    per_layer = _u(m * t.cpu_layer_s)
    top = M.NewIntVar(0, _u(1e4), f"host{tag}")
    M.Add(top >= pipe).OnlyEnforceIf(x)
    path = 0
    for r in range(pp):
        const = t.rank_cpu_s(r, 0)
        M.Add(top >= per_layer * N[r] + _u(const) + path).OnlyEnforceIf(x)
        path = path + b[r] + c
    return top


def pipeline_units(M, t, n, tag: str):
    """The pipeline time of :func:`meshplan.costmodel.pipeline.closed_form_step_time` as a
    CP-SAT expression of the layer counts ``n`` (integer units of 0.1 ns).

    Only the schedules whose closed form is a max-plus expression of the stage times with
    non-negative weights on every max are encoded here (``gpipe``, ``1f1b``); the planner
    fixes the partition of the others (see ``space.EVEN_PARTITION_SCHEDULES``) and takes
    their time from the cost model as a constant. Each ``max`` becomes a variable bounded
    below by its arguments; since every such variable enters the minimised step time with
    a non-negative weight, at the optimum it equals the max, so the solver's minimum is the
    closed form's minimum over partitions. The 1F1B form follows
    ``pipeline_1f1b._one_f_one_b`` (Narayanan et al. 2021 §2.2.1, longest path through a
    home rank with first/last round trips and p2p detours); the GPipe form
    ``pipeline_1f1b._gpipe``
    (Huang et al. 2019). ``tests/unit/test_planner_cpsat.py`` checks this expression
    against ``LayerTables.pipeline_s`` on fixed partitions, so a change of the closed form
    in the cost model cannot silently diverge from the solver.
    """
    cfg = t.config
    S, p, m = cfg.stages, cfg.pp, t.num_microbatches
    if cfg.vpp != 1 or cfg.schedule not in ("gpipe", "1f1b"):
        raise MeshplanError(f"schedule {cfg.schedule!r} with vpp={cfg.vpp}: the CP-SAT model "
                            f"encodes free partitions for gpipe and 1f1b only")
    c = _u(t.p2p_s) if p > 1 else 0
    f, b = _stage_units(t, n)
    big = _u(1e4)

    def var(name):
        return M.NewIntVar(0, big, f"{name}{tag}")

    if cfg.schedule == "gpipe":
        mf, mb = var("gmf"), var("gmb")
        for i in range(S):
            M.Add(mf >= f[i])
            M.Add(mb >= b[i])
        return sum(f) + sum(b) + (m - 1) * (mf + mb) + 2 * (p - 1) * c

    # prefix sums (linear) and prefix maxima (variables)
    fp, bp, mf, mb = [], [], [], []
    for e in range(p):
        fp.append(f[e] + (fp[-1] if e else 0))
        bp.append(b[e] + (bp[-1] if e else 0))
        xf, xb = var(f"mf{e}_"), var(f"mb{e}_")
        M.Add(xf >= f[e])
        M.Add(xb >= b[e])
        if e:
            M.Add(xf >= mf[-1])
            M.Add(xb >= mb[-1])
        mf.append(xf)
        mb.append(xb)
    # suffix maxima of the first / last round trips
    sphi: list = [None] * p
    spsi: list = [None] * p
    for e in range(p - 1, -1, -1):
        x_e = min(p - 1 - e, m - 1)
        base = fp[e] + bp[e] + 2 * c * e
        a, z = var(f"sphi{e}_"), var(f"spsi{e}_")
        M.Add(a >= base + x_e * mf[e])
        M.Add(z >= base + x_e * mb[e])
        if e < p - 1:
            M.Add(a >= sphi[e + 1])
            M.Add(z >= spsi[e + 1])
        sphi[e], spsi[e] = a, z
    pipe = var("pipe")
    for k in range(p):
        nf = m - 1 - min(p - 1 - k, m)
        if nf >= 1:
            g = f[k] + b[k]
            expr = sphi[k] + spsi[k] - fp[k] - bp[k] - 2 * c * k + nf * g
            if c > 0 and nf >= 3 and k < p - 1:
                expr += _detour_units(M, fp, bp, g, c, nf - 1, k, p - 1 - k, var)
            M.Add(pipe >= expr)
        else:
            M.Add(pipe >= sphi[k] + (m - 1) * mb[k])
            M.Add(pipe >= spsi[k] + (m - 1) * mf[k])
    return pipe


def _detour_units(M, fp, bp, g_home, c, slots, k, depth, var):
    """``pipeline_1f1b._detours`` (home rank ``k``, no deferred weight gradients) as a variable:
    max over detour depths of repeated positive gains, each gain a max with 0."""
    best = var(f"det{k}_")
    for d in (depth, 1) if depth > 1 else (1,):
        reps, rest = divmod(slots, d + 1)
        gain = fp[k + d] - fp[k] + bp[k + d] - bp[k] + 2 * d * c - d * g_home
        tot = 0
        if reps:
            gp = var(f"gain{k}_{d}_")
            M.Add(gp >= gain)
            tot += reps * gp
        if rest >= 2 and d == depth:
            r = rest - 1
            pg = var(f"part{k}_{d}_")
            M.Add(pg >= fp[k + r] - fp[k] + bp[k + r] - bp[k] + 2 * r * c - r * g_home)
            tot += pg
        M.Add(best >= tot)
    return best

def _field_constraints(M, model: ModelSpec, cluster: Cluster, job: Job,
                       survivors: Sequence[Survivor], xs, gpu_counts: Sequence[int],
                       tp_within_node: bool) -> None:
    """Layout fields as solver variables, with DESIGN.md's rules as constraints on them."""
    from ortools.sat.python import cp_model

    cfgs = [s.tables.config for s in survivors]

    def field(name, values):
        lo_, hi_ = min(values), max(values)
        var = M.NewIntVar(lo_, hi_, name)
        M.Add(var == sum(v * x for v, x in zip(values, xs)))
        return var

    dp = field("dp", [c.dp for c in cfgs])
    pp = field("pp", [c.pp for c in cfgs])
    tp = field("tp", [c.tp for c in cfgs])
    mb = field("micro_batch", [c.micro_batch for c in cfgs])
    field("vpp", [c.vpp for c in cfgs])
    field("schedule", [SCHEDULES.index(c.schedule) for c in cfgs])
    field("recompute", [RECOMPUTE.index(c.recompute) for c in cfgs])
    field("zero", [c.zero for c in cfgs])
    field("sequence_parallel", [int(c.sequence_parallel) for c in cfgs])
    gpus = M.NewIntVarFromDomain(cp_model.Domain.FromValues(list(gpu_counts)), "gpus")
    dp_pp = M.NewIntVar(1, max(gpu_counts), "dp_pp")
    M.AddMultiplicationEquality(dp_pp, [dp, pp])
    if all(c.cp == 1 for c in cfgs):
        M.AddMultiplicationEquality(gpus, [dp_pp, tp])
    else:
        # context parallelism: dp·pp·tp·cp = GPUs, 2·cp divides the sequence
        cp = field("cp", [c.cp for c in cfgs])
        field("cp_style", [CP_STYLES.index(c.cp_style) for c in cfgs])
        dp_pp_tp = M.NewIntVar(1, max(gpu_counts), "dp_pp_tp")
        M.AddMultiplicationEquality(dp_pp_tp, [dp_pp, tp])
        M.AddMultiplicationEquality(gpus, [dp_pp_tp, cp])
        two_cp = M.NewIntVar(2, 2 * max(c.cp for c in cfgs), "two_cp")
        M.Add(two_cp == 2 * cp)
        chunk = M.NewIntVar(1, job.seq_len, "tokens_per_cp_chunk")
        M.AddMultiplicationEquality(job.seq_len, [two_cp, chunk])
    dp_mb = M.NewIntVar(1, job.global_batch, "dp_mb")
    M.AddMultiplicationEquality(dp_mb, [dp, mb])
    m = M.NewIntVar(1, job.global_batch, "microbatches")
    M.AddMultiplicationEquality(job.global_batch, [dp_mb, m])
    if any(c.ep > 1 or c.etp > 1 for c in cfgs):
        # expert parallelism: ep divides the routed experts, ep·etp·edp = tp·cp·dp
        ep = field("ep", [c.ep for c in cfgs])
        etp = field("etp", [c.etp for c in cfgs])
        edp = field("edp", [c.tp * c.cp * c.dp // (c.ep * c.etp) for c in cfgs])
        q = M.NewIntVar(1, model.num_experts, "experts_per_ep_rank")
        M.AddMultiplicationEquality(model.num_experts, [ep, q])
        ep_etp = M.NewIntVar(1, max(gpu_counts), "ep_etp")
        M.AddMultiplicationEquality(ep_etp, [ep, etp])
        stage = M.NewIntVar(1, max(gpu_counts), "stage_ranks")
        M.AddMultiplicationEquality(stage, [ep_etp, edp])
        pp_stage = M.NewIntVar(1, max(gpu_counts), "pp_stage_ranks")
        M.AddMultiplicationEquality(pp_stage, [stage, pp])
        M.Add(pp_stage == gpus)
    for name, whole in (("heads", model.num_heads), ("kv_heads", model.num_kv_heads),
                        ("ffn", model.ffn_hidden_size)):
        q = M.NewIntVar(1, whole, f"{name}_per_tp")
        M.AddMultiplicationEquality(whole, [tp, q])
    if tp_within_node:
        q = M.NewIntVar(1, cluster.gpus_per_node, "tp_groups_per_node")
        M.AddMultiplicationEquality(cluster.gpus_per_node, [tp, q])


__all__ = ["solve", "Solution", "UNITS_PER_S", "pipeline_units"]
