"""Build a layout's :class:`~meshplan.costmodel.tables.LayerTables`, one step at a time.

:func:`build_tables` is an ordered list of steps, each a function below:

1. process groups and their links (:func:`~meshplan.costmodel.data_parallel.group_links`);
2. per-layer costs of one micro-batch (:func:`~meshplan.costmodel.parts.layer_parts`);
3. a layer's pass times as the layout runs them (:func:`layer_times`: ZeRO-3 / FSDP2
   gathers, measured FSDP2 and pipelined ZeRO-2 rows, zero-bubble's split backward);
4. the CPU's dispatch per micro-batch (:func:`host_dispatch`);
5. the first and last stage's extra work (:func:`end_stage_times`), and each backward's
   share of the step's gradient accumulation
   (:func:`~meshplan.costmodel.grad_accumulation.accumulation_terms`);
6. memory: base terms, then the runtime's terms and memory corrections (:func:`memory_terms`);
7. the named time corrections (:func:`time_corrections`) and the caveats.

A new term (another parallelism's collective, an extra per-layer time, a memory term) is a
step of its own: a function here or in its own module, its result one more field of the
tables, composed where :mod:`meshplan.costmodel.stage_tables` or
:mod:`meshplan.costmodel.rank_memory` sums the fields (docs/costmodel.md, "Adding a term").

No formula of its own: each step's formula, source and measured error are in the module it
calls; the measured error of the result is the estimate's (:mod:`meshplan.costmodel.estimate`).
"""

from __future__ import annotations

from meshplan.costmodel import caveats as cav
from meshplan.costmodel import corrections as corr
from meshplan.costmodel.autocast_cast import head_cast_s, layer_cast_s
from meshplan.costmodel.compiled_rows import compiled_layout_rows, derived_caveat
from meshplan.costmodel.data_parallel import (DP_BUCKET_BYTES, Zero3Layer, root_gather_s,
                                              root_reduce_s, zero3_layer)
from meshplan.costmodel.fp8_caveats import fp8_caveats
from meshplan.costmodel.fp8_cost import fp8_gathered_params
from meshplan.costmodel.grad_accumulation import accumulation_terms
from meshplan.costmodel.measured import split_backward_at
from meshplan.costmodel.memory import (compute_weight_bytes_per_param, stage_params,
                                       state_bytes_per_param)
from meshplan.costmodel.parts import LayerParts, pipelined_zero2_row, ratio, stage_split
from meshplan.costmodel.runtime import ddp_accumulates, fsdp_per_microbatch, torch_pipelined
from meshplan.costmodel.stage_tables import inflight_table
from meshplan.costmodel.moe_layer import shared_width
from meshplan.costmodel.moe_rows import fsdp_kept_bytes
from meshplan.costmodel.torch_activations import torch_layer_activations
from meshplan.costmodel.torch_memory import (compute_copy_bytes, first_backward_relief_fields,
                                             fsdp_plain_row_kept_bytes, logits_chunk_bytes,
                                             pipeline_kept_outputs, pipeline_recv_buffers,
                                             pipelined_output_peak_bytes, state_bytes_at_peak,
                                             wgrad_bytes, zero_bubble_pending_w)
from meshplan.hardware_profiles import Cluster
from meshplan.spec import Job, Layout, ModelSpec


def synchronized_split_gpu(split: tuple[float, float], fused_s: float
                           ) -> tuple[float, float]:
    """The GPU seconds of a zero-bubble layer's I and W from their synchronized timings
    (``meshplan calibrate``'s default split timing): scaled, in their measured proportion,
    to one fused backward where their sum exceeds it.

    A synchronized action's time runs from its launch to its end, CPU included, and torch's
    split backward walks the autograd graph on the CPU once per ``torch.autograd.grad``
    call (``stage_backward_input`` keeps the graph, ``stage_backward_weight`` makes one call
    per parameter group: :mod:`meshplan.calibrate.bench_split`); the GPU runs the same
    kernels as in one fused backward. Round 43's t43m06 at micro-batch 8: I 3.66 + W 2.41 =
    6.06 ms against a fused 4.94 ms, and W longer at micro-batch 2 (4.23 ms) than at 8 — CPU
    time. In a pipeline the CPU's walk overlaps the GPU's other actions, and the host bound
    (the synchronized times, kept as the CPU's) prices it where it does not. Priced as GPU
    time, every zero-bubble layout of rounds 38-43 calibrated this way was predicted slow
    (+1.6 to +8.0 %); scaled (post hoc, docs/benchmarks/transfer.md "Zero-bubble's
    synchronized split"): −3.8 to +3.3 %; the analytical weight-gradient share that
    :mod:`~meshplan.costmodel.nearest_rows` uses for transferred rows left them at −1.2 to
    +8.2 %. Weak where W's synchronized time is mostly the CPU's (small micro-batches: the
    proportion overstates W). Queued timings (``--split-timing queued``) are GPU-busy times
    and are used as they are."""
    total = split[0] + split[1]
    if total <= fused_s or fused_s <= 0:
        return split
    k = fused_s / total
    return split[0] * k, split[1] * k


def layer_times(model: ModelSpec, cluster: Cluster, job: Job, layout: Layout,
                parts: LayerParts, links) -> dict:
    """A layer's forward / backward / weight-gradient seconds as the layout runs them, the
    ZeRO-3 / FSDP2 terms, and the measured rows they came from."""
    dp, pp, tp, v = layout.dp, layout.pp, layout.tp, layout.vpp
    layer_params = stage_params(model, 1, tp, first=False, last=False, pp=pp)
    z3 = zero3_layer(parts.layer, layer_params, links.dp, dp, layout.zero, job, pp,
                     cluster.gpu.dp_overlap_interference, fp8_gathered_params(model, job, tp))
    layer_f, layer_b = parts.layer.forward.total_s, parts.layer.backward.total_s
    layer_w = parts.layer.wgrad_s
    fsdp = fsdp_per_microbatch(job, layout.zero, pp) and dp > 1
    tables = parts.tables
    measured_split = (parts.split_backward, parts.split_depth, parts.split_cpu)
    stage_row = pipelined_zero2_row(tables, model, job, layout)
    # the profile's rows measured with FSDP2 itself (ZeRO-2/3 over dp > 1), if it has them;
    # an MoE layer's at the layout's ep (calibrations before 2026-11-30 timed them at ep 1
    # only: an ep > 1 layout then has none, costmodel.moe_rows)
    fsdp_kw = dict(seq_len=job.seq_len, tp=tp, sequence_parallel=layout.sequence_parallel,
                   recompute=layout.recompute, micro_batch=layout.micro_batch,
                   zero=layout.zero, dp=dp, ep=layout.ep)
    use_fsdp = bool(tables) and layout.zero >= 2 and dp > 1 and not (model.is_moe
                                                                      and layout.etp > 1)
    fsdp_row, composed = tables.fsdp_layer(model, **fsdp_kw) if use_fsdp else (None, False)
    # Layout.compile: the FSDP2 row timed compiled where the profile has one (calibrations
    # since 2026-11-30, dense models), else the eager row with compile's change derived
    # from the plain pair (compiled_rows), as a pipelined ZeRO-2 stage's row always is
    timed_compiled = (tables.fsdp_layer(model, compile=True, **fsdp_kw)[0]
                      if use_fsdp and layout.compile else None)
    crows = compiled_layout_rows(tables, model, job, layout,
                                 fsdp_row if timed_compiled is None else None, stage_row)
    fsdp_row = crows.fsdp_row if timed_compiled is None else timed_compiled
    stage_row = crows.stage_row
    if timed_compiled is not None:
        composed = False
    d_f, d_b, d_w = parts.fp8_delta_s      # fp8's change, for the rows replacing the layer
    if stage_row is not None:
        k = ratio(stage_row.backward_s, layer_b - d_b)
        layer_f, layer_b = stage_row.forward_s + d_f, stage_row.backward_s + d_b
        layer_w = (layer_w - d_w) * k + d_w
        measured_split = stage_split(stage_row, *measured_split, k)
    split = split_cpu = None
    split_excess = 0.0     # what the split B + W cost beyond one fused backward, per layer
    if layout.schedule == "zero-bubble" and measured_split[0] is not None:
        # measured B and W actions (their sum can exceed one fused backward). What grows
        # with the stage's depth (at its mean; uneven partitions are off by second-order
        # terms) is the CPU's graph walk: the CPU times where they were timed apart, else
        # the synchronized ones, which then stand for the CPU and, scaled to the fused
        # backward, for the GPU
        depth = model.num_layers / (pp * v)
        measured_b, measured_depth, measured_cpu = measured_split
        if measured_cpu is not None:
            split = measured_b
            split_cpu = split_backward_at(measured_cpu, measured_depth, depth)
        else:
            split_cpu = split_backward_at(measured_b, measured_depth, depth)
            split = synchronized_split_gpu(split_cpu, layer_b)
        split_excess = sum(split) - layer_b
        layer_b, layer_w = sum(split), split[1]
    # zero-bubble with full recompute and no measured split: the weight pass's recomputes
    passes = corr.zb_full_w_passes(cluster.gpu.corrections, job, layout,
                                   split is not None)
    layer_b, layer_w = layer_b + passes * layer_f, layer_w + passes * layer_f
    split_excess += passes * layer_f
    fs = fsdp_row if fsdp else None
    act_bytes = parts.activation_bytes
    reread = job.runtime == "torch" and (fsdp_row is not None or layout.zero >= 2
                                         and "layer" not in parts.measured)
    if job.runtime == "torch" and layout.zero >= 2 and "layer" not in parts.measured:
        # the executor runs ZeRO-2/3 (FSDP2) in bf16 without autocast: a LayerNorm keeps
        # its 16-bit input, not autocast's fp32 copy
        # (an MoE layer: its shared experts as the MLP, its routed part's kept bytes kept)
        kw = dict(mlp_width=shared_width(model)) if model.is_moe else {}
        act_bytes = torch_layer_activations(
            model, job, layout.micro_batch, tp, layout.sequence_parallel,
            autocast=False, **kw).stored(layout.recompute)
        if model.is_moe:
            act_bytes += parts.activation_bytes - torch_layer_activations(
                model, job, layout.micro_batch, tp, layout.sequence_parallel,
                **kw).stored(layout.recompute)
    elif job.runtime == "torch" and layout.zero >= 2 and "ep" in parts.measured:
        # an MoE row timed at the layout's ep, run under FSDP2 (without an FSDP2 row at that
        # ep; with one, its kept bytes below)
        act_bytes = fsdp_kept_bytes(model, job, layout, act_bytes)
    elif (job.runtime == "torch" and layout.zero >= 2 and dp > 1 and fsdp_row is None
          and stage_row is None and not model.is_moe):
        # a dense plain row (autocast), run under FSDP2 without an FSDP2 row; an fp8 layer's
        # kept bytes hold no 16-bit weight copies (its row's linears read the fp32 weight,
        # its composition took the copies off: fp8_cost.torch_memory)
        act_bytes = fsdp_plain_row_kept_bytes(
            model, job, layout, act_bytes,
            copied_params=layer_params if parts.compiled and parts.fp8 is None else 0.0)
    if fsdp_row is not None and job.runtime == "torch":
        # the executor runs FSDP2 in bf16 without autocast (MixedPrecisionPolicy) and
        # ZeRO-0/1 under autocast, which keeps fp32 copies where it runs ops in fp32
        # (LayerNorm's input): GPT-0.54B's FSDP rows hold 13 % less than its plain ones
        act_bytes = fsdp_row.activation_bytes
    if parts.fp8 is not None and reread:
        # kept bytes re-read above (bf16 FSDP2 rows): fp8's change of what a layer keeps
        act_bytes = max(0.0, act_bytes + parts.fp8_delta_kept_bytes)
    if fs is not None and not composed:
        # measured with FSDP2 itself: what it adds to the plain layer is its gather/reduce
        z3 = Zero3Layer(fs.forward_s + d_f - layer_f, fs.backward_s + d_b - layer_b,
                        z3.wire_bytes, z3.total_s)
        split_excess = 0.0   # the FSDP2 row is a fused backward, used as it is
    if parts.fp8 is not None and parts.fp8.weight_cast_step_s:
        # TransformerEngine casts the weights on a step's first micro-batch (fp8_cost)
        layer_f += parts.fp8.weight_cast_step_s / layout.num_microbatches(job.global_batch)
    # autocast's once-per-step weight casts, which the rows time cached (autocast_cast)
    layer_f += (layer_cast_s(model, cluster.gpu, job, layout, compiled=parts.compiled)
                / layout.num_microbatches(job.global_batch))
    return dict(layer_f=layer_f, layer_b=layer_b, layer_w=layer_w, zb_w_passes=passes,
                split_excess=split_excess,
                z3=z3, fsdp=fsdp, fs=fs,
                composed=composed, stage_row=stage_row, split_cpu=split_cpu,
                act_bytes=act_bytes, layer_params=layer_params,
                compiled=(crows.stage_derived if stage_row is not None else
                          (crows.fsdp_derived or timed_compiled is not None) if fs is not None
                          else parts.compiled),
                compiled_from=crows.sources)


def host_dispatch(cluster: Cluster, layout: Layout, parts: LayerParts, lt: dict) -> dict:
    """The CPU's dispatch per micro-batch (measured profiles only), and the per-stage
    overhead that goes on the GPU's timeline where the CPU is not measured."""
    pp, v = layout.pp, layout.vpp
    fs, stage_row, split_cpu = lt["fs"], lt["stage_row"], lt["split_cpu"]
    cpu, cpu_fixed = parts.cpu, parts.cpu_fixed
    if cpu is not None and lt["fsdp"]:
        cpu = ((fs.forward_cpu_s, fs.backward_cpu_s, *cpu[2:])
               if fs is not None and fs.cpu_measured else None)
        cpu_fixed = (fs.forward_cpu_fixed_s, fs.backward_cpu_fixed_s) if cpu else (0.0, 0.0)
    if cpu is not None and stage_row is not None and stage_row.cpu_measured:
        cpu = (stage_row.forward_cpu_s, stage_row.backward_cpu_s, *cpu[2:])
        cpu_fixed = (stage_row.forward_cpu_fixed_s, stage_row.backward_cpu_fixed_s)
    # an eager fp8 layer's casts dispatch on top of its bf16 row's (fp8_cost, "Eager casts")
    cpu_layer = (cpu[0] + cpu[1] + sum(parts.fp8_cpu_s)) if cpu else 0.0
    # the weight pass's recomputes (corrections.zb_full_w_passes) dispatch the forward again
    cpu_w_extra = lt["zb_w_passes"] * cpu[0] if cpu else 0.0
    cpu_layer += cpu_w_extra
    # once per chunk's forward and backward call of a micro-batch (see rank_cpu_s)
    cpu_call = sum(cpu_fixed) if cpu else 0.0
    if cpu and split_cpu is not None:
        # two autograd passes per layer cost the CPU more than one fused backward (timed
        # apart, or bounded by the synchronized timing); the split's timings hold their own
        # per-call part, so only the forward's is added
        cpu_layer = cpu[0] + (sum(split_cpu) if parts.split_cpu is not None
                              else max(cpu[1], sum(split_cpu)))
        cpu_call = cpu_fixed[0]
    gpu = cluster.gpu
    action_cpu = 0.0
    if cpu is not None:
        # GPU-busy rows: the schedule's per-action cost is CPU time, on the CPU's timeline
        overhead = 0.0
        action_cpu = gpu.pipeline_action_s if pp > 1 else 0.0
    elif pp > 1 and gpu.pipeline_action_s > 0:
        overhead = gpu.pipeline_action_s
    elif "output" in parts.measured and pp == 1:
        overhead = 0.0   # the measured ends hold the per-micro-batch work
    else:
        overhead = gpu.microbatch_overhead_s / (2 * v)
    return dict(
        overhead_s=overhead, cpu_layer_s=cpu_layer, cpu_call_s=cpu_call,
        cpu_wgrad_layer_s=(split_cpu[1] if cpu and split_cpu is not None else cpu_w_extra),
        cpu_first_s=(cpu[2] + cpu[3]) if cpu else 0.0,
        cpu_last_s=(cpu[4] + cpu[5]) if cpu else 0.0,
        cpu_action_s=action_cpu, cpu_known=cpu is not None)


def end_stage_times(model: ModelSpec, job: Job, layout: Layout, parts: LayerParts, links,
                    fsdp: bool, gpu) -> dict:
    """The embedding's and the output layer's seconds per micro-batch; under FSDP2 the root
    unit (embedding, final norm, output layer) gathers before the first layer and
    reduce-scatters after the last backward, with nothing to hide behind; under autocast the
    output layer's per-step weight cast (:mod:`meshplan.costmodel.autocast_cast`)."""
    pp, tp = layout.pp, layout.tp
    first_f, first_b = parts.embedding[0].total_s, parts.embedding[1].total_s
    last_f, last_b = parts.logits[0].total_s, parts.logits[1].total_s
    last_f += head_cast_s(model, gpu, job, layout) / layout.num_microbatches(job.global_batch)
    if fsdp and job.runtime == "torch":
        copy_b = compute_weight_bytes_per_param(job)
        grads_b = state_bytes_per_param(job).grads
        first_params = stage_params(model, 0, tp, first=True, last=pp == 1, pp=pp)
        first_f += root_gather_s(first_params, copy_b, links.dp)
        first_b += root_reduce_s(first_params, grads_b, links.dp)
        if pp > 1:
            last_params = stage_params(model, 0, tp, first=False, last=True, pp=pp)
            last_f += root_gather_s(last_params, copy_b, links.dp)
            last_b += root_reduce_s(last_params, grads_b, links.dp)
    return dict(first_forward_s=first_f, first_backward_s=first_b, last_forward_s=last_f,
                last_backward_s=last_b, last_wgrad_s=parts.logits[2])


def memory_terms(model: ModelSpec, cluster: Cluster, job: Job, layout: Layout,
                 parts: LayerParts, lt: dict, m: int, inflight: tuple, last_rank: int) -> dict:
    """Memory: base terms (states after ZeRO, activations, buffers, the ends' extras), the
    runtime's terms (:mod:`meshplan.costmodel.torch_memory`) and the memory corrections'
    inputs (:mod:`meshplan.costmodel.memory_reliefs`)."""
    numbers = cluster.gpu.corrections
    dp, pp, tp, v = layout.dp, layout.pp, layout.tp, layout.vpp
    layer_params = lt["layer_params"]
    grad_copies = 1 + ddp_accumulates(job, layout, m)
    pending = zero_bubble_pending_w(job, layout, m)
    copy_b = compute_weight_bytes_per_param(job)    # 16-bit compute copies (runtime torch)
    per = state_bytes_per_param(job)
    out_peak = pipelined_output_peak_bytes(job, layout, model, parts.output_peak_bytes, numbers)
    logits_b = parts.logits_bytes * (inflight[last_rank] if layout.schedule == "gpipe"
                                     else 1.0) + out_peak
    if job.runtime == "torch":
        # FSDP2's ZeRO-3 holds about two gathered 16-bit layers (this one and the prefetched
        # next); the other copies are counted with the weights (compute_copy_bytes)
        gathered = 2 * layer_params * copy_b if layout.zero == 3 and dp > 1 else 0.0
        dp_buf = 0.0     # DDP reduces in place (gradient_as_bucket_view); FSDP2 per layer
    else:
        gathered = 2 * layer_params * per.weights if layout.zero == 3 and dp > 1 else 0.0
        dp_buf = 2 * DP_BUCKET_BYTES if dp > 1 and layout.zero < 3 else 0.0
    # a compiled layer's 16-bit copies are in its kept bytes: its row's, or the compiled
    # MoE block's (moe_torch_memory.with_compiled_block_memory)
    copies_kept = lt["compiled"] or parts.kept_weight_copies
    copy_kw = dict(job=job, zero=layout.zero, dp=dp, tp=tp, pp=pp, compiled=copies_kept)
    recv = tuple(a + b for a, b in zip(
        pipeline_recv_buffers(job, layout, m, model.hidden_size, inflight),
        pipeline_kept_outputs(job, layout, model.hidden_size, inflight)))
    f8 = parts.fp8
    base_buf = ((2 * parts.p2p_bytes if pp > 1 and not recv else 0.0) + dp_buf + gathered
                + parts.backward_buf_bytes + (f8.working_bytes if f8 is not None else 0.0))
    emb_act = parts.embedding_act_bytes
    first_params = stage_params(model, 0, tp, first=True, last=pp == 1, pp=pp)
    first_extra = (sum(state_bytes_at_peak(first_params, job, layout.zero, dp, pp))
                   + (grad_copies - 1) * first_params * per.grads
                   + inflight[0] * emb_act + (logits_b if pp == 1 else 0.0)
                   + compute_copy_bytes(model, layers=0, first=True, last=pp == 1, **copy_kw))
    last_extra = last_params = 0.0
    if pp > 1:
        last_params = stage_params(model, 0, tp, first=False, last=True, pp=pp)
        last_extra = (sum(state_bytes_at_peak(last_params, job, layout.zero, dp, pp))
                      + logits_b
                      + compute_copy_bytes(model, layers=0, first=False, last=True, **copy_kw))
    # runtime "torch", pipelined: torch.distributed.pipelining keeps every micro-batch's
    # stage output (the 16-bit logits) of the last stage until the step ends, then
    # concatenates them (PipelineSchedule*.step → _merge_outputs(stage.output_chunks))
    chunks = merge = 0.0
    if torch_pipelined(job, pp):
        chunk = logits_chunk_bytes(job, layout, model)
        chunks = m * chunk
        merge = 2 * m * chunk if numbers.enabled(corr.END_OF_STEP) else 0.0
    last_states = last_extra - logits_b if pp > 1 else 0.0
    # full recomputation under autocast: each backward's recompute clears the weight-cast
    # cache (end_of_step_bytes, cast_cache_relief_bytes); one layer's copies and the last
    # rank's output-layer copies
    cleared = layout.recompute == "full" and not (layout.zero >= 2 and dp > 1)
    layer_copy = (compute_copy_bytes(model, layers=1, first=False, last=False, **copy_kw)
                  if cleared else 0.0)
    last_copy = (compute_copy_bytes(model, layers=0, first=last_rank == 0, last=True,
                                    **copy_kw) if cleared else 0.0)
    end_recv = end_layer = end_const = 0.0
    if merge:
        end_recv = pipeline_recv_buffers(job, layout, m, model.hidden_size,
                                         (0.0,) * pp)[last_rank]
        end_layer, end_const = layer_copy, last_copy
    cache_layer = cache_last = recomputed = 0.0
    cache_ranks = corr.cast_cache_ranks(numbers, job, layout, m, cleared)
    if any(cache_ranks):
        cache_layer, cache_last = layer_copy, last_copy
        recomputed = max(0.0, parts.full_act_bytes - parts.activation_bytes)
    z3_resident = (layer_params * copy_b if torch_pipelined(job, pp) and layout.zero == 3
                   and dp > 1 and numbers.enabled(corr.Z3_RESIDENT) else 0.0)
    return dict(
        grad_copies=grad_copies, compiled_layers=copies_kept, recv_buffers=recv,
        wgrad_pending=pending,
        microbatches=float(m),
        **wgrad_bytes(model, job, layout, parts.full_act_bytes if any(pending) else 0.0,
                      numbers, parts.wgrad_measured, model.num_layers / (pp * v)),
        layer_state_bytes=(sum(state_bytes_at_peak(layer_params, job, layout.zero, dp, pp))
                           + (grad_copies - 1) * layer_params * per.grads
                           + compute_copy_bytes(model, layers=1, first=False, last=False,
                                                **copy_kw)
                           + (f8.weight_copy_bytes + f8.expert_weight_copy_bytes
                              if f8 is not None else 0.0)),
        layer_activation_bytes=lt["act_bytes"], buffer_bytes=base_buf,
        first_extra_bytes=first_extra, last_extra_bytes=last_extra,
        embedding_act_bytes=emb_act, logits_bytes=logits_b,
        recompute_buf_bytes=parts.backward_buf_bytes, output_peak_bytes=out_peak,
        last_chunks_bytes=chunks, last_merge_bytes=merge, last_states_bytes=last_states,
        end_recv_bytes=end_recv, end_uncached_layer_bytes=end_layer,
        end_uncached_const_bytes=end_const,
        cache_layer_copy_bytes=cache_layer, cache_last_copy_bytes=cache_last,
        cache_cleared_ranks=cache_ranks, recomputed_layer_bytes=recomputed,
        z3_resident_layer_bytes=z3_resident,
        **first_backward_relief_fields(job, layout, m, grad_copies, layer_params,
                                       first_params, last_params, numbers))


def time_corrections(cluster: Cluster, job: Job, layout: Layout, m: int) -> dict:
    """The named corrections that act on time (:mod:`meshplan.costmodel.corrections`)."""
    numbers = cluster.gpu.corrections
    return dict(slowdown=corr.stage_slowdown(numbers, job, layout),
                fsdp_step_s=corr.fsdp2_step_s(numbers, job, layout),
                p2p_order=corr.p2p_order_applies(numbers, job, layout, m))


def table_caveats(model: ModelSpec, cluster: Cluster, job: Job, layout: Layout, lt: dict,
                  parts: LayerParts) -> tuple[str, ...]:
    numbers = cluster.gpu.corrections    # the FSDP2 caveat names the profile's per-step term
    # a compiled layer priced from the analytical layer (no row applies: datasheet profiles)
    analytical = (layout.compile and not lt["compiled"] and job.runtime == "torch"
                  and lt["fs"] is None and "layer" not in parts.measured)
    return (((cav.nearest_shape_caveat(parts.transferred_from),) if parts.transferred_from
             else ())
            + ((cav.stretched_rows_caveat(*parts.transferred_stretch),)
               if parts.transferred_stretch else ())
            + ((cav.FSDP_OVER_TP_CAVEAT,) if lt["composed"] and lt["fs"] is not None else ())
            + ((cav.FSDP_DP_ONLY_CAVEAT,) if corr.fsdp2_step_s(numbers, job, layout) else ())
            # an MoE layer at ep > 1 never reads the (ep 1) FSDP2 rows: its caveat says so
            + ((cav.FSDP_UNMEASURED_CAVEAT,) if lt["fsdp"] and lt["fs"] is None
               and job.runtime == "torch" and "layer" in parts.measured
               and not (model.is_moe and layout.ep > 1) else ())
            + ((cav.ZB_FSDP2_CAVEAT,) if corr.unsharded_zb(job, layout) else ())
            + (((cav.COMPILE_ANALYTICAL_CAVEAT if analytical else cav.COMPILE_AS_EAGER_CAVEAT),)
               if layout.compile and not lt["compiled"] else ())
            + ((cav.COMPILE_ANALYTICAL_FP8_CAVEAT,) if analytical and job.precision == "fp8"
               else ())
            + ((cav.compiled_pair_caveat(parts.compiled_from_mode),)
               if layout.compile and lt["compiled"] and parts.compiled_from_mode else ())
            + ((cav.COMPILE_MOE_CAVEAT,) if layout.compile and model.is_moe
               and job.runtime == "torch" and not lt["compiled"] else ())
            # compute.layer_cost prices MLA's memory-bound work as Megatron's fused kernels
            # under every runtime; a measured layer row already holds the executor's
            + ((cav.MLA_TORCH_CAVEAT,) if model.is_mla and job.runtime == "torch"
               and "layer" not in parts.measured else ())
            + ((cav.MTP_TORCH_CAVEAT,) if model.mtp_layers and job.runtime == "torch" else ())
            + ((derived_caveat(lt["compiled_from"]),) if lt["compiled_from"] else ())
            # a transferred row extended past its source's sizes: the stretch caveat says so
            # in the source's micro-batches
            + ((cav.extended_rows_caveat(parts.extended_from, layout.micro_batch),)
               if parts.extended_from and not parts.transferred_from else ())
            + ((cav.UNCLOCKED_ROWS_CAVEAT,) if parts.clock_unmeasured
               and job.runtime == "torch" else ())
            + fp8_caveats(parts.fp8, job))


def build_fields(model: ModelSpec, cluster: Cluster, job: Job, layout: Layout,
                 links, parts: LayerParts) -> dict:
    """Every field of a layout's tables, step by step (the module docstring's list)."""
    pp, v = layout.pp, layout.vpp
    m = layout.num_microbatches(job.global_batch)
    last_rank = (pp * v - 1) % pp
    inflight = inflight_table(layout.schedule, pp, v, m)
    lt = layer_times(model, cluster, job, layout, parts, links)
    z3 = lt["z3"]
    acc = accumulation_terms(model, cluster, job, layout, m, parts.measured)
    ends = end_stage_times(model, job, layout, parts, links, lt["fsdp"], cluster.gpu)
    ends["first_backward_s"] += acc.embedding_s
    ends["last_backward_s"] += acc.output_s
    return dict(
        model=model, cluster=cluster, job=job, layout=layout, links=links, parts=parts,
        zero3=z3, num_layers=model.num_layers, num_microbatches=m, last_rank=last_rank,
        inflight=inflight,
        layer_forward_s=lt["layer_f"] + z3.forward_s,
        layer_backward_s=lt["layer_b"] + z3.backward_s + acc.layer_s,
        layer_wgrad_s=lt["layer_w"], zb_w_recompute_passes=lt["zb_w_passes"],
        zb_split_excess_s=lt["split_excess"],
        p2p_s=parts.p2p_s if pp > 1 else 0.0,
        **ends,
        **host_dispatch(cluster, layout, parts, lt),
        **memory_terms(model, cluster, job, layout, parts, lt, m, inflight, last_rank),
        **time_corrections(cluster, job, layout, m),
        caveats=table_caveats(model, cluster, job, layout, lt, parts))


__all__ = ["build_fields", "layer_times", "host_dispatch", "end_stage_times", "memory_terms",
           "time_corrections"]
