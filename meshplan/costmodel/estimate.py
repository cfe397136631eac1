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
from meshplan.costmodel.result import Estimate, StageMemories, TimeBreakdown
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
    mb, sp, zero = layout.micro_batch, layout.sequence_parallel, layout.zero
    m = layout.num_microbatches(job.global_batch)
    nstages = pp * v
    links = group_links(cluster, layout)
    layer, (emb_f, emb_b), (log_f, log_b, log_w), acts, msg, p2p = _layer_parts(
        model, cluster, job, mb, tp, sp, layout.recompute, links.tp, links.pp)

    # ---- ZeRO-3: parameters gathered per layer per micro-batch, gradients reduce-scattered.
    per = state_bytes_per_param(job)
    layer_param_bytes = stage_params(model, 1, tp, first=False, last=False, pp=pp) * per.weights
    z3_fwd = z3_bwd = z3_wire_layer = 0.0
    if zero == 3 and dp > 1:
        ag = comm.all_gather_s(links.dp, layer_param_bytes)
        rs = comm.reduce_scatter_s(links.dp, layer_param_bytes)
        # FSDP prefetches the next layer's gather behind this layer's compute (Zhao et al. 2023,
        # arXiv 2304.11277 §3.3): only what compute cannot cover is exposed.
        z3_fwd = max(0.0, ag - layer.forward.total_s)
        z3_bwd = max(0.0, ag + rs - layer.backward.total_s)
        z3_wire_layer = 3 * comm.wire_bytes_gather(dp, layer_param_bytes)

    # ---- per virtual stage, per micro-batch (plain floats: this is the planner's hot path)
    lf = layer.forward.total_s + z3_fwd
    lb = layer.backward.total_s + z3_bwd
    lw = layer.wgrad_s
    mbo = gpu.microbatch_overhead_s / (2 * v)
    f_s = [n * lf + mbo for n in stage_layers]
    b_s = [n * lb + mbo for n in stage_layers]
    w_s = [n * lw for n in stage_layers]
    f_s[0] += emb_f.total_s
    b_s[0] += emb_b.total_s
    f_s[-1] += log_f.total_s
    b_s[-1] += log_b.total_s
    w_s[-1] += log_w
    pipe_s, pipe_no_p2p = _pipeline_time(layout.schedule, tuple(f_s), tuple(b_s), tuple(w_s),
                                         m, pp, v, p2p if pp > 1 else 0.0)

    # ---- per pipeline rank. Ranks with the same (layers, first, last) share model-state and
    # data-parallel figures; only the in-flight activations differ.
    e = activation_bytes_per_element(job)
    stored = acts.stored(layout.recompute)
    emb_act = job.seq_len * mb * model.hidden_size * e / (tp if sp else 1)
    logits_b = logits_bytes(model, job, mb, tp)
    gpipe = layout.schedule == "gpipe"
    last_rank = (nstages - 1) % pp
    base_buf = (2 * msg if pp > 1 else 0.0) + (2 * DP_BUCKET_BYTES if dp > 1 and zero < 3 else 0.0) \
        + (2 * layer_param_bytes if zero == 3 and dp > 1 else 0.0)
    shared: dict[tuple[int, bool, bool], tuple] = {}
    tails: dict[tuple, float] = {}
    inflight_all = _inflight_table(layout.schedule, pp, v, m)
    rows: list[tuple] = []
    worst_tail = -1.0
    dp_total = dp_wire_worst = 0.0
    dp_exposed_worst = opt_worst = 0.0
    recompute_buf = acts.full_bytes if layout.recompute != "none" else 0.0
    if v == 1:
        layers_all, fwd_all, bwd_all = stage_layers, f_s, b_s
    else:
        layers_all = [sum(stage_layers[r::pp]) for r in range(pp)]
        fwd_all = [sum(f_s[r::pp]) for r in range(pp)]
        bwd_all = [sum(b_s[r::pp]) for r in range(pp)]
    fb_all = [x + y for x, y in zip(fwd_all, bwd_all)]
    busy_best = max(fb_all)
    br = fb_all.index(busy_best)
    for r in range(pp):
        layers_r, fwd_r, bwd_r = layers_all[r], fwd_all[r], bwd_all[r]
        first, last = r == 0, r == last_rank
        key = (layers_r, first, last)
        sh = shared.get(key)
        if sh is None:
            params_r = stage_params(model, layers_r, tp, first=first, last=last, pp=pp)
            states = model_state_bytes(params_r, job, zero, dp)
            dp_s, rs_or_ar, ag, wire = _dp_comm(links.dp, dp, zero, params_r, per, m, layers_r,
                                                z3_fwd + z3_bwd, z3_wire_layer)
            local = params_r / dp if zero >= 1 else params_r
            opt_s = hbm_s(gpu, local * OPTIMIZER_BYTES_PER_PARAM)
            tail_bucket = (comm.all_reduce_s(links.dp, min(params_r * per.grads, DP_BUCKET_BYTES))
                           if job.overlap_dp_comm and dp > 1 else 0.0)
            sh = shared[key] = (states, dp_s, rs_or_ar, ag, wire, opt_s, tail_bucket)
            dp_total = max(dp_total, dp_s)
            dp_wire_worst = max(dp_wire_worst, wire)
        states, dp_s, rs_or_ar, ag, wire, opt_s, tail_bucket = sh
        tkey = (key, fwd_r, bwd_r)
        if tkey not in tails:
            # Exposed data-parallel time: the gradient reduction can hide behind the last
            # micro-batch's backward on this rank, the ZeRO-1/2 parameter all-gather behind
            # the next step's first forward; the last bucket is always exposed (PyTorch DDP,
            # Li et al. 2020, arXiv 2006.15704 §3.2.3; Megatron-Core overlap_grad_reduce and
            # overlap_param_gather).
            if zero == 3 or dp == 1:
                exposed = 0.0
            elif job.overlap_dp_comm:
                exposed = max(tail_bucket, rs_or_ar - bwd_r) + max(0.0, ag - fwd_r)
            else:
                exposed = dp_s
            tails[tkey] = exposed
            if exposed + opt_s > worst_tail:
                worst_tail, dp_exposed_worst, opt_worst = exposed + opt_s, exposed, opt_s
        inflight = inflight_all[r]
        act_b = inflight * layers_r * stored + (inflight * emb_act if first else 0.0)
        logit_b = logits_b * (inflight if gpipe else 1.0) if last else 0.0
        buf = base_buf + (recompute_buf if layers_r else 0.0)
        rows.append((r, layers_r, states[0], states[1], states[2], act_b, logit_b, buf, inflight))

    step = pipe_s + worst_tail
    busy = m * busy_best

    # ---- breakdown on the busiest rank (component sums, computed once)
    chunks_br = range(br, nstages, pp)
    layers_br = sum(stage_layers[c] for c in chunks_br)
    tot = (layer.forward + layer.backward).scaled(layers_br) + PassCost(
        overhead_s=2 * v * mbo, zero3_s=layers_br * (z3_fwd + z3_bwd))
    if br == 0:
        tot = tot + emb_f + emb_b
    if br == last_rank:
        tot = tot + log_f + log_b
    tot = tot.scaled(m)
    time = TimeBreakdown(
        gemm_s=tot.gemm_s, attention_s=tot.attention_s, memory_bound_s=tot.memory_bound_s,
        overhead_s=tot.overhead_s, tp_comm_s=tot.tp_comm_s,
        pp_comm_s=pipe_s - pipe_no_p2p, bubble_s=max(0.0, pipe_no_p2p - busy),
        dp_comm_exposed_s=dp_exposed_worst, dp_comm_total_s=dp_total,
        zero3_gather_s=tot.zero3_s, optimizer_s=opt_worst)

    # ---- communication volume per GPU per step (busiest rank)
    z3_wire = m * layers_br * z3_wire_layer
    comm_bytes = {"tp": m * layers_br * layer.tp_wire_bytes,
                  "pp": m * v * 2 * msg if pp > 1 else 0.0,
                  "dp": dp_wire_worst if zero < 3 else 0.0, "zero3": z3_wire}
    by_link = {"nvlink": 0.0, "network": 0.0}
    for k, link in (("tp", links.tp), ("pp", links.pp), ("dp", links.dp), ("zero3", links.dp)):
        by_link[link.link_class] += comm_bytes[k]

    stage_mem = StageMemories(rows)
    peak_mem = max(w + g + o + a + lg + bu for _, _, w, g, o, a, lg, bu, _ in rows)
    n_gpus = layout.num_gpus
    model_flops = model_flops_per_step(model, job.global_batch, job.seq_len)
    hw_flops = hardware_flops_per_step(model, job.global_batch, job.seq_len, layout.recompute)
    peak_flops = gpu.peak_flops(job.precision)
    usable = cluster.usable_memory_bytes
    return Estimate(
        step_time_s=step,
        tokens_per_s=job.tokens_per_step / step,
        model_tflops_per_gpu=model_flops / step / n_gpus / 1e12,
        hardware_tflops_per_gpu=hw_flops / step / n_gpus / 1e12,
        mfu=model_flops / step / n_gpus / peak_flops,
        hfu=hw_flops / step / n_gpus / peak_flops,
        memory_peak_bytes=peak_mem, usable_memory_bytes=usable, fits=peak_mem <= usable,
        memory=stage_mem, time=time, comm_bytes=comm_bytes, comm_bytes_by_link=by_link,
        num_microbatches=m, num_gpus=n_gpus, stage_forward_s=tuple(f_s),
        stage_backward_s=tuple(b_s), model_flops_per_step=model_flops,
        hardware_flops_per_step=hw_flops)


@lru_cache(maxsize=65536)
def _pipeline_time(schedule: str, f_s: tuple, b_s: tuple, w_s: tuple, m: int, pp: int, v: int,
                   p2p: float) -> tuple[float, float]:
    """Pipeline time with and without point-to-point transfers (cached: ZeRO 0-2 layouts
    of the same shape share it)."""
    with_p2p = closed_form_step_time(schedule, f_s, b_s, m, pp=pp, vpp=v, wgrad_s=w_s, p2p_s=p2p)
    without = (closed_form_step_time(schedule, f_s, b_s, m, pp=pp, vpp=v, wgrad_s=w_s, p2p_s=0.0)
               if p2p else with_p2p)
    return with_p2p, without


@lru_cache(maxsize=4096)
def _inflight_table(schedule: str, pp: int, v: int, m: int) -> tuple[float, ...]:
    return tuple(inflight_microbatches(schedule, pp, v, m, r) for r in range(pp))


def _dp_comm(link, dp: int, zero: int, params_r: float, per, m: int, layers_r: int,
             z3_layer_s: float, z3_wire_layer: float) -> tuple[float, float, float, float]:
    """Data-parallel communication of one pipeline rank per step.

    Returns (total seconds, gradient all-reduce / reduce-scatter seconds, parameter
    all-gather seconds, bytes sent). ZeRO-0 all-reduces gradients; ZeRO-1/2 reduce-scatter
    gradients and all-gather updated parameters (the same volume, Rajbhandari et al. 2019
    §7); ZeRO-3's per-layer traffic is inside the stage times (its exposed part) and counted
    here for the totals.
    """
    if dp == 1:
        return 0.0, 0.0, 0.0, 0.0
    grad_bytes = params_r * per.grads
    if zero == 0:
        ar = comm.all_reduce_s(link, grad_bytes)
        return ar, ar, 0.0, comm.wire_bytes_all_reduce(dp, grad_bytes)
    if zero in (1, 2):
        rs = comm.reduce_scatter_s(link, grad_bytes)
        ag = comm.all_gather_s(link, params_r * per.weights)
        wire = comm.wire_bytes_gather(dp, grad_bytes) + comm.wire_bytes_gather(
            dp, params_r * per.weights)
        return rs + ag, rs, ag, wire
    return m * layers_r * z3_layer_s, 0.0, 0.0, m * layers_r * z3_wire_layer


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
