"""``estimate(model, cluster, job, layout) -> Estimate``: the single source of predictions.

Step time = pipeline time (per-stage forward/backward per micro-batch through the schedule's
closed form, :mod:`meshplan.costmodel.pipeline`) + the slowest rank's exposed data-parallel
communication and optimizer step. Memory = model states + in-flight activations + buffers
per pipeline rank; the peak is the worst rank. Sources are cited in the modules each term
comes from (compute, memory, comm, pipeline, flops).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from meshplan.costmodel import comm
from meshplan.costmodel.compute import (PassCost, embedding_cost, hbm_s, layer_cost,
                                        logits_cost)
from meshplan.costmodel.flops import hardware_flops_per_step, model_flops_per_step
from meshplan.costmodel.memory import (activation_bytes_per_element, layer_activations,
                                       logits_bytes, model_state_bytes, stage_params,
                                       state_bytes_per_param)
from meshplan.costmodel.pipeline import closed_form_step_time, inflight_microbatches
from meshplan.costmodel.result import Estimate, StageMemory, TimeBreakdown
from meshplan.costmodel.specs import Job, Layout, ModelSpec
from meshplan.costmodel.validate import check_layout
from meshplan.hardware_profiles import Cluster

DP_BUCKET_BYTES = 25 * 2**20        # PyTorch DDP's default bucket (bucket_cap_mb=25)
OPTIMIZER_BYTES_PER_PARAM = 32.0    # fused Adam: read+write master, m, v; read grad, write weight


@dataclass(frozen=True)
class Groups:
    """Process-group links of a layout under the cluster's rank order (tp fastest)."""

    tp: object
    dp: object
    pp: object


def group_links(cluster: Cluster, layout: Layout) -> Groups:
    """Megatron's rank order: tp ranks adjacent, then dp, then pp (``tp-dp-pp``), or
    ``tp-pp-dp`` (Megatron-Core ``RankGenerator`` order strings)."""
    tp, dp, pp = layout.tp, layout.dp, layout.pp
    if cluster.rank_order == "tp-dp-pp":
        dp_stride, pp_stride = tp, tp * dp
    else:
        pp_stride, dp_stride = tp, tp * pp
    return Groups(cluster.group_link(tp, 1), cluster.group_link(dp, dp_stride),
                  cluster.group_link(pp, pp_stride))


def estimate(model: ModelSpec, cluster: Cluster, job: Job, layout: Layout) -> Estimate:
    """Predict memory and step time of one layout. Raises ConfigError for invalid layouts;
    a layout that does not fit in memory is not an error (``fits=False``)."""
    stage_layers = check_layout(model, cluster, job, layout)
    return _estimate(model, cluster, job, layout, stage_layers)


@lru_cache(maxsize=8192)
def _layer_parts(model, cluster, job, mb, tp, sp, recompute, tp_link, pp_link):
    layer = layer_cost(model, cluster, job, micro_batch=mb, tp=tp, sequence_parallel=sp,
                       recompute=recompute, tp_link=tp_link)
    emb = embedding_cost(model, cluster, job, micro_batch=mb, tp=tp, sequence_parallel=sp,
                         tp_link=tp_link)
    logit = logits_cost(model, cluster, job, micro_batch=mb, tp=tp, sequence_parallel=sp,
                        tp_link=tp_link)
    acts = layer_activations(model, job, mb, tp, sp)
    e = activation_bytes_per_element(job)
    # Activation sent between stages; scatter/gather over tp (Narayanan et al. 2021 §4.1).
    msg = job.seq_len * mb * model.hidden_size * e / tp
    p2p = comm.p2p_s(pp_link, msg)
    return layer, emb, logit, acts, msg, p2p


def _estimate(model: ModelSpec, cluster: Cluster, job: Job, layout: Layout,
              stage_layers: tuple[int, ...]) -> Estimate:
    gpu = cluster.gpu
    dp, pp, tp, v = layout.dp, layout.pp, layout.tp, layout.vpp
    mb, sp = layout.micro_batch, layout.sequence_parallel
    m = layout.num_microbatches(job.global_batch)
    nstages = pp * v
    links = group_links(cluster, layout)
    layer, (emb_f, emb_b), (log_f, log_b, log_w), acts, msg, p2p = _layer_parts(
        model, cluster, job, mb, tp, sp, layout.recompute, links.tp, links.pp)

    # ---- ZeRO-3: parameters gathered per layer per micro-batch, gradients reduce-scattered.
    per = state_bytes_per_param(job)
    layer_param_bytes = stage_params(model, 1, tp, first=False, last=False, pp=pp) * per.weights
    z3_fwd = z3_bwd = 0.0
    z3_wire_layer = 0.0
    if layout.zero == 3 and dp > 1:
        ag = comm.all_gather_s(links.dp, layer_param_bytes)
        rs = comm.reduce_scatter_s(links.dp, layer_param_bytes)
        # FSDP prefetches the next layer's gather behind this layer's compute (Zhao et al. 2023,
        # arXiv 2304.11277 §3.3): only what compute cannot cover is exposed.
        z3_fwd = max(0.0, ag - layer.forward.total_s)
        z3_bwd = max(0.0, ag + rs - layer.backward.total_s)
        z3_wire_layer = 3 * comm.wire_bytes_gather(dp, layer_param_bytes)
    fwd_layer = layer.forward + PassCost(zero3_s=z3_fwd)
    bwd_layer = layer.backward + PassCost(zero3_s=z3_bwd)
    mb_overhead = PassCost(overhead_s=gpu.microbatch_overhead_s / (2 * v))

    # ---- per virtual stage, per micro-batch
    fwd: list[PassCost] = []
    bwd: list[PassCost] = []
    wgrad: list[float] = []
    for c, n in enumerate(stage_layers):
        f = fwd_layer.scaled(n) + mb_overhead
        b = bwd_layer.scaled(n) + mb_overhead
        w = n * layer.wgrad_s
        if c == 0:
            f, b = f + emb_f, b + emb_b
        if c == nstages - 1:
            f, b, w = f + log_f, b + log_b, w + log_w
        fwd.append(f)
        bwd.append(b)
        wgrad.append(w)
    f_s = tuple(x.total_s for x in fwd)
    b_s = tuple(x.total_s for x in bwd)
    pipe_s = closed_form_step_time(layout.schedule, f_s, b_s, m, pp=pp, vpp=v,
                                   wgrad_s=tuple(wgrad), p2p_s=p2p if pp > 1 else 0.0)
    pipe_no_p2p = (closed_form_step_time(layout.schedule, f_s, b_s, m, pp=pp, vpp=v,
                                         wgrad_s=tuple(wgrad), p2p_s=0.0) if pp > 1 else pipe_s)

    # ---- per pipeline rank: busy time, parameters, DP communication, optimizer, memory
    e = activation_bytes_per_element(job)
    usable = cluster.usable_memory_bytes
    stage_mem: list[StageMemory] = []
    rank_tail: list[float] = []
    rank_busy: list[float] = []
    dp_total = dp_exposed_worst = 0.0
    dp_wire_worst = 0.0
    for r in range(pp):
        chunks = range(r, nstages, pp)
        layers_r = sum(stage_layers[c] for c in chunks)
        first, last = r == 0, r == (nstages - 1) % pp
        params_r = stage_params(model, layers_r, tp, first=first, last=last, pp=pp)
        busy = m * sum(f_s[c] + b_s[c] for c in chunks)
        rank_busy.append(busy)

        # Data-parallel gradient reduction (and ZeRO-1/2 parameter all-gather).
        grad_bytes = params_r * per.grads
        dp_s = exposed = wire = 0.0
        if dp > 1:
            last_bwd = sum(b_s[c] for c in chunks)
            first_fwd = sum(f_s[c] for c in chunks)
            tail = comm.all_reduce_s(links.dp, min(grad_bytes, DP_BUCKET_BYTES)) \
                if job.overlap_dp_comm else 0.0
            if layout.zero == 0:
                dp_s = comm.all_reduce_s(links.dp, grad_bytes)
                wire = comm.wire_bytes_all_reduce(dp, grad_bytes)
                exposed = (max(tail, dp_s - last_bwd) if job.overlap_dp_comm else dp_s)
            elif layout.zero in (1, 2):
                rs = comm.reduce_scatter_s(links.dp, grad_bytes)
                ag = comm.all_gather_s(links.dp, params_r * per.weights)
                dp_s = rs + ag
                wire = comm.wire_bytes_gather(dp, grad_bytes) + comm.wire_bytes_gather(
                    dp, params_r * per.weights)
                if job.overlap_dp_comm:
                    exposed = max(tail, rs - last_bwd) + max(0.0, ag - first_fwd)
                else:
                    exposed = dp_s
            else:  # ZeRO-3: per-layer traffic is in the stage times; count its volume here
                dp_s = m * layers_r * (z3_fwd + z3_bwd)
                wire = m * layers_r * z3_wire_layer
        dp_total = max(dp_total, dp_s)
        dp_wire_worst = max(dp_wire_worst, wire)
        local_params = params_r / dp if layout.zero >= 1 else params_r
        opt_s = hbm_s(gpu, local_params * OPTIMIZER_BYTES_PER_PARAM)
        rank_tail.append(exposed + opt_s)
        if exposed + opt_s >= max(rank_tail):
            dp_exposed_worst, opt_worst = exposed, opt_s

        # Memory.
        w_b, g_b, o_b = model_state_bytes(params_r, job, layout.zero, dp)
        inflight = inflight_microbatches(layout.schedule, pp, v, m, r)
        act_b = inflight * layers_r * acts.stored(layout.recompute)
        if first:  # embedding output (kept as the first layer's input / dropout mask)
            act_b += inflight * job.seq_len * mb * model.hidden_size * e / (tp if sp else 1)
        logit_b = logits_bytes(model, job, mb, tp) * (inflight if layout.schedule == "gpipe"
                                                      else 1.0) if last else 0.0
        buf = 2 * msg if pp > 1 else 0.0                       # p2p send/recv buffers
        if dp > 1 and layout.zero < 3:
            buf += 2 * DP_BUCKET_BYTES                        # buckets in flight
        if layout.zero == 3 and dp > 1:
            buf += 2 * layer_param_bytes                      # current + prefetched layer
        if layout.recompute != "none" and layers_r:
            buf += acts.full_bytes                            # one layer re-materialized
        stage_mem.append(StageMemory(
            stage=r, layers=layers_r, weights_bytes=w_b, grads_bytes=g_b, optimizer_bytes=o_b,
            activations_bytes=act_b, embedding_logits_bytes=logit_b, buffers_bytes=buf,
            inflight_microbatches=inflight))

    worst = max(range(pp), key=lambda r: rank_tail[r])
    tail_s = rank_tail[worst]
    step = pipe_s + tail_s

    # ---- breakdown on the busiest rank
    br = max(range(pp), key=lambda r: rank_busy[r])
    tot = PassCost()
    for c in range(br, nstages, pp):
        tot = tot + fwd[c] + bwd[c]
    tot = tot.scaled(m)
    time = TimeBreakdown(
        gemm_s=tot.gemm_s, attention_s=tot.attention_s, memory_bound_s=tot.memory_bound_s,
        overhead_s=tot.overhead_s, tp_comm_s=tot.tp_comm_s,
        pp_comm_s=pipe_s - pipe_no_p2p, bubble_s=max(0.0, pipe_no_p2p - rank_busy[br]),
        dp_comm_exposed_s=dp_exposed_worst, dp_comm_total_s=dp_total,
        zero3_gather_s=tot.zero3_s, optimizer_s=opt_worst)

    # ---- communication volume per GPU per step (busiest rank)
    layers_br = sum(stage_layers[c] for c in range(br, nstages, pp))
    tp_wire = m * layers_br * layer.tp_wire_bytes
    pp_wire = m * v * 2 * msg if pp > 1 else 0.0
    z3_wire = m * layers_br * z3_wire_layer
    dp_wire = dp_wire_worst - (z3_wire if layout.zero == 3 else 0.0)
    comm_bytes = {"tp": tp_wire, "pp": pp_wire, "dp": max(0.0, dp_wire), "zero3": z3_wire}
    by_link = {"nvlink": 0.0, "network": 0.0}
    for key, link in (("tp", links.tp), ("pp", links.pp), ("dp", links.dp), ("zero3", links.dp)):
        by_link[link.link_class] += comm_bytes[key]

    peak_mem = max(sm.total_bytes for sm in stage_mem)
    n_gpus = layout.num_gpus
    model_flops = model_flops_per_step(model, job.global_batch, job.seq_len)
    hw_flops = hardware_flops_per_step(model, job.global_batch, job.seq_len, layout.recompute)
    peak_flops = gpu.peak_flops(job.precision)
    return Estimate(
        step_time_s=step,
        tokens_per_s=job.tokens_per_step / step,
        model_tflops_per_gpu=model_flops / step / n_gpus / 1e12,
        hardware_tflops_per_gpu=hw_flops / step / n_gpus / 1e12,
        mfu=model_flops / step / n_gpus / peak_flops,
        hfu=hw_flops / step / n_gpus / peak_flops,
        memory_peak_bytes=peak_mem, usable_memory_bytes=usable, fits=peak_mem <= usable,
        memory=tuple(stage_mem), time=time, comm_bytes=comm_bytes, comm_bytes_by_link=by_link,
        num_microbatches=m, num_gpus=n_gpus, stage_forward_s=f_s, stage_backward_s=b_s,
        model_flops_per_step=model_flops, hardware_flops_per_step=hw_flops)


@dataclass(frozen=True)
class LayerTables:
    """Per-layer and per-stage-extra costs of a layout, for deciding the stage partition.

    For pipeline rank r holding ``n`` layers (virtual stage c holding ``n_c``):
    forward time of c = n_c·layer_forward_s + (c == 0)·first_forward_s
    + (c == last)·last_forward_s (+ microbatch overhead), same for backward; memory of
    rank r = n·(layer_state_bytes + layer_activation_bytes·inflight[r])
    + (r == 0)·first_extra_bytes + (r == last rank)·last_extra_bytes + fixed_bytes[r].
    :func:`estimate` with the same ``stage_layers`` gives the same numbers (a test checks it).
    """

    layer_forward_s: float
    layer_backward_s: float
    layer_wgrad_s: float
    first_forward_s: float
    first_backward_s: float
    last_forward_s: float
    last_backward_s: float
    last_wgrad_s: float
    microbatch_overhead_s: float   # added to each virtual stage's forward and backward
    p2p_s: float
    layer_state_bytes: float       # weights + grads + optimizer of one layer, after ZeRO
    layer_activation_bytes: float  # stored activations of one layer, one micro-batch
    inflight: tuple[float, ...]    # per pipeline rank
    first_extra_bytes: float       # embedding states + embedding activations (rank 0)
    last_extra_bytes: float        # output layer states + logits (last rank)
    fixed_bytes: tuple[float, ...]  # buffers per rank (independent of its layer count)
    num_microbatches: int


def layer_tables(model: ModelSpec, cluster: Cluster, job: Job, layout: Layout) -> LayerTables:
    """The linear pieces :func:`estimate` is built from (stage_layers of ``layout`` ignored)."""
    check_layout(model, cluster, job, layout.replace(stage_layers=None)
                 if model.num_layers >= layout.pp * layout.vpp else layout)
    est = _estimate(model, cluster, job, layout.replace(stage_layers=None),
                    _uniform_probe(model, layout))
    dp, pp, tp, v = layout.dp, layout.pp, layout.tp, layout.vpp
    mb, sp = layout.micro_batch, layout.sequence_parallel
    links = group_links(cluster, layout)
    layer, (emb_f, emb_b), (log_f, log_b, log_w), acts, msg, p2p = _layer_parts(
        model, cluster, job, mb, tp, sp, layout.recompute, links.tp, links.pp)
    per = state_bytes_per_param(job)
    layer_param_bytes = stage_params(model, 1, tp, first=False, last=False, pp=pp) * per.weights
    z3_fwd = z3_bwd = 0.0
    if layout.zero == 3 and dp > 1:
        ag = comm.all_gather_s(links.dp, layer_param_bytes)
        rs = comm.reduce_scatter_s(links.dp, layer_param_bytes)
        z3_fwd = max(0.0, ag - layer.forward.total_s)
        z3_bwd = max(0.0, ag + rs - layer.backward.total_s)
    e = activation_bytes_per_element(job)
    one_layer = sum(model_state_bytes(stage_params(model, 1, tp, first=False, last=False, pp=pp),
                                      job, layout.zero, dp))
    first_params = (stage_params(model, 0, tp, first=True, last=False, pp=pp))
    last_params = (stage_params(model, 0, tp, first=False, last=True, pp=pp))
    m = layout.num_microbatches(job.global_batch)
    inflight = tuple(sm.inflight_microbatches for sm in est.memory)
    first_extra = sum(model_state_bytes(first_params, job, layout.zero, dp)) + \
        inflight[0] * job.seq_len * mb * model.hidden_size * e / (tp if sp else 1)
    last_rank = (pp * v - 1) % pp
    last_extra = sum(model_state_bytes(last_params, job, layout.zero, dp)) + \
        logits_bytes(model, job, mb, tp) * (inflight[last_rank] if layout.schedule == "gpipe"
                                            else 1.0)
    fixed = tuple(sm.buffers_bytes for sm in est.memory)
    return LayerTables(
        layer_forward_s=layer.forward.total_s + z3_fwd,
        layer_backward_s=layer.backward.total_s + z3_bwd,
        layer_wgrad_s=layer.wgrad_s,
        first_forward_s=emb_f.total_s, first_backward_s=emb_b.total_s,
        last_forward_s=log_f.total_s, last_backward_s=log_b.total_s, last_wgrad_s=log_w,
        microbatch_overhead_s=cluster.gpu.microbatch_overhead_s / (2 * v),
        p2p_s=p2p if pp > 1 else 0.0,
        layer_state_bytes=one_layer, layer_activation_bytes=acts.stored(layout.recompute),
        inflight=inflight, first_extra_bytes=first_extra, last_extra_bytes=last_extra,
        fixed_bytes=fixed, num_microbatches=m)


def _uniform_probe(model: ModelSpec, layout: Layout) -> tuple[int, ...]:
    from meshplan.costmodel.specs import default_stage_layers
    n = layout.pp * layout.vpp
    return default_stage_layers(max(model.num_layers, n), n)
