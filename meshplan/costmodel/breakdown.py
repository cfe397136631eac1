"""The steps of :func:`meshplan.costmodel.estimate.estimate` past the tables: the schedule's
time, each rank's tail and memory, where the step's time goes, and the bytes it sends.

* Pipeline: the schedule's closed form on the stage times (:mod:`meshplan.costmodel.
  pipeline`), plus the FSDP2 correction's per-step time; where torch's p2p order holds the
  step longer (:mod:`meshplan.costmodel.torch_p2p`), that, with the compute unslowed.
* Breakdown on the busiest rank: its compute categories scaled to its stage times, the
  bubble = pipeline − busy time, the p2p slowdown's share as ``pp_interference_s``.
* Volume per GPU per step: tp collectives (:func:`meshplan.costmodel.compute.layer_cost`'s
  wire bytes), p2p sends, data-parallel and ZeRO-3 traffic, by link class.

No formula of its own beyond these sums and differences (the sources are the modules named).
Measured error: the categories are not measured one by one; their sum is the step time,
whose errors :mod:`meshplan.costmodel.estimate` lists. The data-parallel tail alone matched
the executor's step phases within the run-to-run spread (:mod:`.data_parallel`).
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.costmodel.caveats import P2P_ORDER_CAVEAT
from meshplan.costmodel.compute import PassCost
from meshplan.costmodel.data_parallel import exposed_dp_s
from meshplan.costmodel.result import TimeBreakdown
from meshplan.costmodel.stage_tables import _pipeline_time


@dataclass(frozen=True)
class Pipe:
    total_s: float        # first forward to last backward (with the FSDP2 step term)
    no_p2p_s: float       # the same without point-to-point transfers
    order_bound: bool     # torch's p2p order set it


def pipeline(t, f_s, b_s, w_s) -> Pipe:
    lay = t.layout
    pipe_s, pipe_no_p2p = _pipeline_time(lay.schedule, tuple(f_s), tuple(b_s), tuple(w_s),
                                         t.num_microbatches, lay.pp, lay.vpp, t.p2p_s)
    pipe_s, pipe_no_p2p = pipe_s + t.fsdp_step_s, pipe_no_p2p + t.fsdp_step_s
    # torch's p2p order (torch_p2p) can hold the step longer than the slowed closed form;
    # then its waits are the bubble and the compute runs unslowed
    order_s = t.p2p_order_s(f_s, b_s)
    order_bound = order_s > pipe_s
    if order_bound:
        pipe_s, pipe_no_p2p = order_s, t.p2p_order_s(f_s, b_s, p2p=False)
    return Pipe(pipe_s, pipe_no_p2p, order_bound)


def pipeline_caveats(pipe: Pipe) -> tuple[str, ...]:
    return (P2P_ORDER_CAVEAT,) if pipe.order_bound else ()


@dataclass(frozen=True)
class Ranks:
    rows: list              # StageMemory rows, one per pipeline rank
    worst_tail_s: float     # the slowest rank's exposed dp communication + optimizer
    dp_exposed_s: float     # ... its exposed dp part
    optimizer_s: float      # ... its optimizer part
    dp_total_s: float       # the largest dp communication of any rank
    dp_wire_bytes: float    # ... and bytes sent
    busiest: int            # the rank with the most forward + backward per micro-batch
    busy_s: float           # its forward + backward per micro-batch
    layers: list            # layers per rank


def ranks(t, stage_layers, f_s, b_s) -> Ranks:
    """Per pipeline rank. Ranks with the same (layers, first, last) share model-state and
    data-parallel figures; only the in-flight activations differ."""
    lay, job = t.layout, t.job
    pp, v, last_rank = lay.pp, lay.vpp, t.last_rank
    if v == 1:
        layers_all, fwd_all, bwd_all = stage_layers, f_s, b_s
    else:
        layers_all = [sum(stage_layers[r::pp]) for r in range(pp)]
        fwd_all = [sum(f_s[r::pp]) for r in range(pp)]
        bwd_all = [sum(b_s[r::pp]) for r in range(pp)]
    fb_all = [x + y for x, y in zip(fwd_all, bwd_all)]
    busy_best = max(fb_all)
    br = fb_all.index(busy_best)
    seen: set[tuple] = set()
    rows: list[tuple] = []
    worst_tail = -1.0
    dp_total = dp_wire_worst = dp_exposed_worst = opt_worst = 0.0
    interference = t.cluster.gpu.dp_overlap_interference
    dense_all = t.rank_dense_counts(stage_layers)     # an MoE model's dense layers (or 0)
    for r in range(pp):
        layers_r, dense_r = layers_all[r], dense_all[r]
        st = t.rank_state(r, layers_r, dense_r)   # memoized per (layers, first, last, dense)
        dp_total = max(dp_total, st.dp_total_s)
        dp_wire_worst = max(dp_wire_worst, st.dp_wire_bytes)
        sig = (layers_r, r == 0, r == last_rank, fwd_all[r], bwd_all[r], dense_r)
        if sig not in seen:
            seen.add(sig)
            exposed = exposed_dp_s(st, lay, job, fwd_all[r], bwd_all[r], interference)
            if exposed + st.optimizer_s > worst_tail:
                worst_tail, dp_exposed_worst, opt_worst = exposed + st.optimizer_s, exposed, \
                    st.optimizer_s
        act_b, logit_b, buf = t.rank_variable_bytes(r, layers_r, dense_r)
        rows.append((r, layers_r, st.weights_bytes, st.grads_bytes, st.optimizer_bytes, act_b,
                     logit_b, buf, t.inflight[r]))
    return Ranks(rows, worst_tail, dp_exposed_worst, opt_worst, dp_total, dp_wire_worst, br,
                 busy_best, list(layers_all))


def time_breakdown(t, pipe: Pipe, rk: Ranks, host_s: float) -> TimeBreakdown:
    """Where the step's time goes, on the busiest rank (component sums, computed once)."""
    lay, parts, z3 = t.layout, t.parts, t.zero3
    v, m, br = lay.vpp, t.num_microbatches, rk.busiest
    layer = parts.layer
    (emb_f, emb_b), (log_f, log_b, _) = parts.embedding, parts.logits
    layers_br = rk.layers[br]
    # A measured FSDP2 row can be faster than the plain one (FSDP2 runs bf16 without
    # autocast's cast kernels): that part is memory-bound work saved, not a negative gather
    z3_pos = max(0.0, z3.forward_s) + max(0.0, z3.backward_s)
    z3_neg = min(0.0, z3.forward_s) + min(0.0, z3.backward_s)
    tot = (layer.forward + layer.backward).scaled(layers_br) + PassCost(
        overhead_s=2 * v * t.overhead_s, zero3_s=layers_br * z3_pos,
        memory_bound_s=layers_br * z3_neg)
    if br == 0:
        tot = tot + emb_f + emb_b
    if br == t.last_rank:
        tot = tot + log_f + log_b
    # the busiest rank's p2p slowdown (stage_slowdown) is a line of its own; what else its
    # stage times hold beyond these parts (zero-bubble's split backward costing more than
    # the fused one) stretches each part in proportion, so the breakdown adds up to the step
    k_br = t.slowdown[br] if t.slowdown else 1.0
    whole = tot.total_s
    busy = m * rk.busy_s
    tot = tot.scaled(m * (rk.busy_s / k_br / whole if whole > 0 else 1.0))
    if pipe.order_bound:
        busy, k_br = busy / k_br, 1.0
    return TimeBreakdown(
        gemm_s=tot.gemm_s, attention_s=tot.attention_s, memory_bound_s=tot.memory_bound_s,
        overhead_s=tot.overhead_s, tp_comm_s=tot.tp_comm_s,
        pp_comm_s=pipe.total_s - pipe.no_p2p_s,
        bubble_s=max(0.0, pipe.no_p2p_s - t.fsdp_step_s - busy), fsdp_step_s=t.fsdp_step_s,
        dp_comm_exposed_s=rk.dp_exposed_s, dp_comm_total_s=rk.dp_total_s,
        zero3_gather_s=tot.zero3_s, optimizer_s=rk.optimizer_s,
        host_wait_s=max(0.0, host_s - pipe.total_s), pp_interference_s=busy - busy / k_br,
        cp_comm_s=tot.cp_comm_s, ep_comm_s=tot.ep_comm_s)


def comm_volume(t, rk: Ranks) -> tuple[dict[str, float], dict[str, float]]:
    """Bytes per GPU per step on the busiest rank, by collective and by link class."""
    lay, parts, links = t.layout, t.parts, t.links
    m, pp, v = t.num_microbatches, lay.pp, lay.vpp
    layers_br = rk.layers[rk.busiest]
    layer = parts.layer
    comm_bytes = {"tp": m * layers_br * (layer.tp_wire_bytes + layer.wgrad_gather_wire_bytes),
                  "pp": m * v * 2 * parts.p2p_bytes if pp > 1 else 0.0,
                  "dp": rk.dp_wire_bytes if lay.zero < 3 else 0.0,
                  "zero3": m * layers_br * t.zero3.wire_bytes}
    by_link = {"nvlink": 0.0, "network": 0.0}
    for k, link in (("tp", links.tp), ("pp", links.pp), ("dp", links.dp), ("zero3", links.dp)):
        by_link[link.link_class] += comm_bytes[k]
    # context and expert parallelism: keys only where they send (dense layouts unchanged)
    for k, wire in (("cp", layer.cp_wire_bytes), ("ep", layer.ep_wire_bytes)):
        if wire:
            comm_bytes[k] = m * layers_br * wire
            by_link[getattr(links, k).link_class] += comm_bytes[k]
    return comm_bytes, by_link


__all__ = ["Pipe", "Ranks", "pipeline", "pipeline_caveats", "ranks", "time_breakdown",
           "comm_volume"]
