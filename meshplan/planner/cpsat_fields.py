"""The selection model's layout fields: integer variables tied to the configuration booleans.

The selection model (:func:`meshplan.planner.cpsat.solve`, phase 2) has one boolean per
configuration, exactly one true, the layout fields ``dp, pp, tp, micro_batch, vpp,
schedule, recompute, zero, sequence_parallel`` as integer variables tied to them, and the
rules of DESIGN.md as constraints: ``dp·pp·tp·cp = GPUs`` (one of the allowed counts; with
cp > 1 also ``2·cp·c = seq_len``; with experts ``ep·q = experts`` and ``ep·etp·edp·pp =
GPUs``), ``global_batch = dp·micro_batch·m``, ``tp·a = heads``, ``tp·b = kv heads``,
``tp·q = ffn``, ``tp·c = GPUs per node`` (tp inside one NVLink domain) where asked.
"""

from __future__ import annotations

from typing import Sequence

from meshplan.spec import RECOMPUTE, SCHEDULES, Job, ModelSpec
from meshplan.spec.choices import CP_STYLES
from meshplan.hardware_profiles import Cluster
from meshplan.planner.search import Survivor


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
