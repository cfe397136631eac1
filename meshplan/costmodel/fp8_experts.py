"""FP8 routed experts: what ``Job(precision="fp8")`` changes in an MoE layer's routed part.

Runtime "megatron" (TransformerEngine): Megatron-Core's grouped experts are TE
``GroupedLinear`` modules, which run under the same fp8 autocast and recipe as the dense
linears (TE ``transformer_engine/pytorch/module/grouped_linear.py``: per-expert quantizers,
``is_first_microbatch`` weight caching; Megatron-Core ``TEGroupedMLP``). So each local
expert's fc1 (h → m·f_e/etp) and fc2 (f_e/etp → h) is priced as
:mod:`meshplan.costmodel.fp8_cost` prices a dense linear, at the per-expert shape
(R·ep/E rows):

* **GEMMs**: the experts' bf16 time (grouped curve, or the dense curve at one expert's
  GEMM) × r_e = Σ fp8 time / Σ bf16 time over the two GEMMs at one expert's FLOPs on the
  dense curves (the profile's ``fp8_gemm_efficiency`` and ``gemm_efficiency``), as the
  dense layer's ratio r;
* **casts** per micro-batch (:func:`meshplan.costmodel.fp8.linear_cast_traffic` at TE's
  fused cast-transpose rate, :func:`meshplan.costmodel.fp8_cost.cast_rate`): the rows'
  and gradients' casts of both GEMMs of every local expert; the weights' casts once a step
  (TE's cache) unless ``Job.fp8_param_gather`` keeps them in fp8;
* **memory**: TE's fp8 weight + transpose cache of the local experts (+2 B a parameter;
  none with ``fp8_param_gather``, whose fp8 weight replaces the 16-bit one), and the
  saved fc1 / fc2 inputs in fp8 (1 B instead of 2) — as for the dense linears
  (:func:`meshplan.costmodel.fp8_cost.te_memory`).

The router's GEMM stays 16-bit (Megatron-Core's ``TopKRouter`` is not a TE linear).

Runtime "torch": meshplan's executor converts ``nn.Linear`` modules to fp8
(:mod:`meshplan.executor.fp8`); its experts are grouped weight tensors run by a grouped
GEMM in 16 bits, so they stay bf16-priced (:func:`fp8_experts` returns None).

Measured error: none of its own. The published FP8 / MXFP8 MoE rows
(docs/benchmarks/published.md) were priced before 2026-12-01 with the experts at the fp8
peak on the bf16 curve and no casts; the change is reported there as post hoc.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.costmodel import fp8
from meshplan.costmodel.compute import gemm_s, sixteen_bit_precision
from meshplan.costmodel.fp8_cost import cast_rate, check_fp8_supported
from meshplan.costmodel.runtime import fp8_transformer_engine, fp8_weight_source_bytes
from meshplan.hardware_profiles import Cluster
from meshplan.spec import Job


@dataclass(frozen=True)
class Fp8Experts:
    """fp8's terms for the routed experts of one MoE layer on one rank (module docstring)."""

    gemm_ratio: float            # fp8 / bf16 time of one expert's fc1 + fc2 GEMMs
    forward_cast_s: float        # per micro-batch: the rows' casts
    backward_cast_s: float       # per micro-batch: dy's, x's re-casts, transposes
    weight_cast_step_s: float    # once a step: the local experts' weights (TE's cache)
    weight_copy_bytes: float     # per layer: TE's fp8 weight + transpose of the local experts
    fc1_input_delta_bytes: float  # per micro-batch: fc1's saved input at 1 B instead of 2
    fc2_input_delta_bytes: float  # ... fc2's (the activation output)


def fp8_experts(cluster: Cluster, job: Job, *, rows_per_expert: float, local_experts: float,
                hidden: int, fc1_width: float, fc2_width: float) -> Fp8Experts | None:
    """The routed experts' fp8 terms (module docstring); None where they stay 16-bit
    (not fp8, or runtime "torch"). ``fc1_width``: fc1's output width on this rank
    (m·f_e/etp), ``fc2_width``: fc2's input width (f_e/etp)."""
    if job.precision != "fp8" or not fp8_transformer_engine(job):
        return None
    gpu = cluster.gpu
    check_fp8_supported(job, gpu)
    rate = cast_rate(gpu, job, False)
    peak16, peak8 = gpu.peak_flops(sixteen_bit_precision(job)), gpu.peak_flops("fp8")
    wbytes = fp8_weight_source_bytes(job, 1, 1)
    m, h = int(round(rows_per_expert)), hidden
    bf16_s = fp8_s = cast_f = cast_b = cast_w = 0.0
    for k, n in ((h, int(fc1_width)), (int(fc2_width), h)):
        flops = 2.0 * m * k * n
        bf16_s += gemm_s(gpu, peak16, flops)
        fp8_s += fp8.fp8_gemm_time_s(flops, peak8, gpu.fp8_gemm_efficiency)
        c = fp8.linear_cast_traffic(m, k, n, job.fp8_recipe, act_bytes=2, weight_bytes=wbytes,
                                    fused_cast_transpose=rate.fused)
        cast_f += rate.seconds(c.forward_passes, c.forward_bytes)
        cast_b += rate.seconds(c.backward_passes, c.backward_bytes)
        cast_w += rate.seconds(c.weight_passes, c.weight_bytes)
    params = local_experts * hidden * (fc1_width + fc2_width)
    gathered = job.fp8_param_gather
    return Fp8Experts(
        gemm_ratio=fp8_s / bf16_s if bf16_s > 0 else 1.0,
        forward_cast_s=local_experts * cast_f, backward_cast_s=local_experts * cast_b,
        weight_cast_step_s=0.0 if gathered else local_experts * cast_w,
        weight_copy_bytes=0.0 if gathered else 2.0 * params,
        fc1_input_delta_bytes=-local_experts * rows_per_expert * hidden,
        fc2_input_delta_bytes=-local_experts * rows_per_expert * fc2_width)


__all__ = ["Fp8Experts", "fp8_experts"]
