"""``estimate(model, cluster, job, layout) -> Estimate``: the single source of predictions.

It only composes, in this order (each step's formulas and sources are in its module):

1. per-layer costs of one micro-batch, analytical or measured (:mod:`.parts`, from
   :mod:`.compute`, :mod:`.memory`, :mod:`.comm`), arranged as the layout's linear tables
   (:mod:`.tables`, built step by step in :mod:`.build`);
2. per stage: forward / backward / weight-gradient seconds of each virtual stage
   (:meth:`~.stage_tables.StageTimes.stage_times`, with the named time corrections);
3. schedule: the pipeline's closed form (:mod:`.pipeline`), or torch's p2p order where it
   binds (:mod:`.torch_p2p`);
4. per rank: model states, exposed data-parallel communication and the optimizer step
   (:mod:`.data_parallel`), memory as base terms plus named corrections (:mod:`.rank_memory`);
5. the host bound: the CPU's dispatch where the profile measured it (:mod:`.host`);
6. step = max(pipeline, host bound) + the slowest rank's tail; the breakdown and the
   communication volume (:mod:`.breakdown`); caveats (:mod:`.caveats`);
   where measured rows carry sustained ratios and the step idles its GPU part of the time,
   1-6 once more at the clock that duty allows (:func:`.clock.duty_scale`);
7. which named corrections applied and how much each moved the step time and the peak
   memory (:mod:`.corrections`): ``Estimate.corrections``.

Measured error of the whole (step time, mean / max absolute; each figure with its machine,
date and command in the file named):

* published runs on datasheet profiles, nothing tuned per row (docs/benchmarks/published.md):
  Narayanan et al. 2021 Table 1 3.4 % / 6.3 % (10 runs); Korthikanti et al. 2022 Table 5
  4.2 % / 7.9 % (8); Megatron-Core H100 2024 6.2 % / 14.1 % (9, layout partly published);
  Llama 3 405B Table 4 8.1 % / 12.3 % (3, one at cp 16); NeMo H100 FP8 2.2 % / 5.9 % (7,
  two at cp 2); MLPerf GPT-3 175B FP8 v3.1 2.3 % / 4.1 % (7, 512-10,752 H100), v4.0 2.7 % /
  6.3 % (3); MLPerf v5.0 Llama 3.1 405B FP8 2.3 % / 3.5 % (5, cp 2) and DGX Cloud Llama 3.1
  8B-405B BF16 / FP8 5.8 % / 9.8 % (28), the held-out test of the H100 curves' derating 0.80
  (7.2 % and 10.2 % at 0.75); MoE at BF16 20.5 % / 39.1 % (8). Calculon on the same 33 runs
  it can express: 18.0 % / 39.5 % against 4.0 % / 14.1 % here (the 23 fp16/bf16 ones:
  11.3 % / 33.5 % against 4.8 % / 14.1 %);
* held out on GPUs, calibrated on the same machine and models (docs/benchmarks/accuracy.md,
  round 26, 4 × H200, 16 layouts): 1.51 % / 4.78 %, memory within 5 % on 64 of 64 ranks;
* held out on models never run before (docs/benchmarks/transfer.md, round 43, 2 × H200, 24
  layouts as run): 3.87 % / 13.83 % calibrated on those models (1.76 % / 4.12 % post hoc with
  the duty cycle's clock, ``sustained_clock_duty``, and zero-bubble's synchronized split at
  the fused backward), memory within 5 % on 48 of 48 ranks;
  4.81 % / 16.26 % on a calibration that timed none of them (3.92 % / 10.57 % post hoc).
"""

from __future__ import annotations

from dataclasses import replace

from meshplan.costmodel import breakdown
# Names other packages, benchmarks and tests import from here (one place to look up).
from meshplan.costmodel.caveats import (FSDP_DP_ONLY_CAVEAT, FSDP_OVER_TP_CAVEAT,  # noqa: F401
                                        ZB_FSDP2_CAVEAT,
                                        HOST_BOUND_CAVEAT_SHARE, HOST_NEAR_LOAD,
                                        HOST_NEAR_LOAD_TEXT, host_caveats, is_host_bound)
from meshplan.costmodel.clock import SUSTAINED_CLOCK, SUSTAINED_DUTY, at_duty, step_duty
from meshplan.costmodel.corrections import CAST_CACHE_SCHEDULES, stage_slowdown  # noqa: F401
from meshplan.costmodel.data_parallel import (OPTIMIZER_BYTES_PER_PARAM,  # noqa: F401
                                              rank_state)
from meshplan.costmodel.compute import sixteen_bit_precision
from meshplan.costmodel.flops import flops_recompute, hardware_flops_per_step, model_flops_per_step
from meshplan.costmodel.fp8_caveats import composed_compiled_host_caveats
from meshplan.costmodel.parts import layer_parts  # noqa: F401
from meshplan.costmodel.result import AppliedCorrection, Estimate, StageMemories
from meshplan.costmodel.runtime import (fsdp_accumulates_unsharded,  # noqa: F401
                                        fsdp_per_microbatch, p2p_ops_per_microbatch)
from meshplan.costmodel.stage_tables import _pipeline_time  # noqa: F401
from meshplan.costmodel.tables import LayerTables, _layer_tables, layer_tables  # noqa: F401
from meshplan.costmodel.torch_memory import (compute_copy_bytes,  # noqa: F401
                                             pipeline_kept_outputs, pipeline_recv_buffers,
                                             pipelined_output_peak_bytes, stage_io_bytes,
                                             zero_bubble_pending_w)
from meshplan.hardware_profiles import Cluster
from meshplan.spec import Job, Layout, ModelSpec
from meshplan.spec.validate import check_layout


def estimate(model: ModelSpec, cluster: Cluster, job: Job, layout: Layout) -> Estimate:
    """Predict memory and step time of one layout. Raises ConfigError for invalid layouts;
    a layout that does not fit in memory is not an error (``fits=False``)."""
    stage_layers = check_layout(model, cluster, job, layout)
    est, applied = _estimate(model, cluster, job, layout, stage_layers)
    if not applied:
        return est
    return replace(est, corrections=tuple(
        _effect(name, est, model, cluster, job, layout, stage_layers) for name in applied))


def _effect(name: str, est: Estimate, model: ModelSpec, cluster: Cluster, job: Job,
            layout: Layout, stage_layers) -> AppliedCorrection:
    """How much correction ``name`` moved ``est``: the estimate less the one without it."""
    gpu = cluster.gpu
    off = cluster.replace(gpu=replace(gpu, corrections=gpu.corrections.without(name)))
    base, _ = _estimate(model, off, job, layout, stage_layers)
    return AppliedCorrection(name, est.step_time_s - base.step_time_s,
                             est.memory_peak_bytes - base.memory_peak_bytes)


def _estimate(model: ModelSpec, cluster: Cluster, job: Job, layout: Layout,
              stage_layers: tuple[int, ...]) -> tuple[Estimate, tuple[str, ...]]:
    est, applied = _compose(model, cluster, job, layout, stage_layers)
    numbers = cluster.gpu.corrections
    if SUSTAINED_CLOCK not in applied or not numbers.enabled(SUSTAINED_DUTY):
        return est, applied
    # the clock a step that idles part of the time keeps: priced once more at its duty
    duty = step_duty(est.stage_forward_s, est.stage_backward_s, est.num_microbatches,
                     layout.pp, est.step_time_s)
    if duty >= 1.0:
        return est, applied
    return _compose(model, at_duty(cluster, duty), job, layout, stage_layers)


def _compose(model: ModelSpec, cluster: Cluster, job: Job, layout: Layout,
             stage_layers: tuple[int, ...]) -> tuple[Estimate, tuple[str, ...]]:
    # 1. per-layer costs, as the layout's tables
    t = layer_tables(model, cluster, job, layout, checked=True)
    # 2. per stage
    f_s, b_s, w_s = t.stage_times(stage_layers)
    # 3. schedule
    pipe = breakdown.pipeline(t, f_s, b_s, w_s)
    # 4. per rank: states, data-parallel tail, memory
    ranks = breakdown.ranks(t, stage_layers, f_s, b_s)
    # 5. host bound
    host_s = t.host_bound_s(stage_layers, (f_s, b_s, w_s))
    # 6. step, breakdown, volume
    step = max(pipe.total_s, host_s) + ranks.worst_tail_s
    time = breakdown.time_breakdown(t, pipe, ranks, host_s)
    comm_bytes, by_link = breakdown.comm_volume(t, ranks)
    gpu = cluster.gpu
    peak_mem = max(w + g + o + a + lg + bu for _, _, w, g, o, a, lg, bu, _ in ranks.rows)
    n_gpus = layout.num_gpus
    model_flops = model_flops_per_step(model, job.global_batch, job.seq_len)
    hw_flops = hardware_flops_per_step(model, job.global_batch, job.seq_len,
                                       flops_recompute(job, layout.recompute))
    # MFU against the 16-bit peak for fp8 jobs too (one yardstick, as the executor reports)
    peak_flops = gpu.peak_flops(sixteen_bit_precision(job))
    usable = cluster.usable_memory_bytes
    host = host_caveats(time.host_wait_s, step, host_s, pipe.total_s, gpu.corrections)
    est = Estimate(
        step_time_s=step,
        tokens_per_s=job.tokens_per_step / step,
        model_tflops_per_gpu=model_flops / step / n_gpus / 1e12,
        hardware_tflops_per_gpu=hw_flops / step / n_gpus / 1e12,
        mfu=model_flops / step / n_gpus / peak_flops,
        hfu=hw_flops / step / n_gpus / peak_flops,
        memory_peak_bytes=peak_mem, usable_memory_bytes=usable, fits=peak_mem <= usable,
        memory=StageMemories(ranks.rows), time=time, comm_bytes=comm_bytes,
        comm_bytes_by_link=by_link, num_microbatches=t.num_microbatches, num_gpus=n_gpus,
        stage_forward_s=tuple(f_s), stage_backward_s=tuple(b_s), stage_wgrad_s=tuple(w_s),
        p2p_s=t.p2p_s, pipeline_s=pipe.total_s,
        model_flops_per_step=model_flops, hardware_flops_per_step=hw_flops,
        host_dispatch_s=host_s,
        caveats=t.caveats + host + composed_compiled_host_caveats(t.parts.fp8, job, host)
        + breakdown.pipeline_caveats(pipe))
    # 7. the named corrections that applied (their effects: estimate())
    return est, t.corrections


__all__ = ["estimate", "layer_tables", "LayerTables"]
