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

Runtime "torch": meshplan's executor runs the local experts' stacked weights as fp8 grouped
GEMMs under recipe ``rowwise`` (:mod:`meshplan.executor.fp8_grouped`,
:data:`meshplan.spec.choices.TORCH_FP8_EXPERT_RECIPES`; other recipes keep them 16-bit and
:func:`fp8_experts` returns None). Per micro-batch:

* **GEMMs**: the experts' bf16 time × r_e, here over one grouped call of all local experts:
  the profile's grouped fp8 curve over its grouped bf16 curve at the call
  (``grouped_fp8_gemm_efficiency``, :mod:`meshplan.hardware_profiles.grouped_gemm`) where
  calibrate timed the fp8 grouped GEMMs in the layer, else the dense curves at the call's
  FLOPs (at one expert's under a ``grouped_gemm_key = "expert"`` profile). The dense ratio
  is optimistic for the grouped kernel: in the layer on one H200 the fp8 grouped calls
  took 0.58-0.94 of bf16's time at 256-16,384 rows a group where the dense curves say 0.58
  (docs/benchmarks/moe_checks.md "Grouped GEMMs keyed by the call");
* **casts**, at the executor's cast rate (eager, or compiled under ``Layout.compile``:
  :func:`meshplan.costmodel.fp8_cost.cast_rate`), each over all local experts at once (one
  pass, not one per expert): the rows' and gradients' casts of fc1 and fc2
  (:func:`meshplan.costmodel.fp8.linear_cast_traffic` at the rank's R rows) and the
  stacked weights' casts — forward along the input, backward along the output — in every
  pass, from the fp32 master under ZeRO-0/1 or FSDP2's bf16 copy (compiled, at the
  profile's ``fp8_cast_weight_gbps`` where calibrate measured it: the compiled cast of a
  large stacked weight, which the cast rate of activation-sized tensors and the block share
  price 3× low — moeh24, docs/fp8.md); where the executor casts
  them once a step instead (:func:`expert_weights_cached`: ZeRO-0/1 and more than one
  forward a step), :func:`meshplan.costmodel.moe_layer.with_cached_expert_weights` moves
  them from every pass to once a step (``weight_cast_step_s``, as TE's cache) and adds the
  two fp8 copies' 2 B a parameter (``weight_cache_bytes``), on a layer composed or timed;
* **memory**: the 16-bit inputs are saved as in bf16, except that compiled (Layout.compile)
  fc2's input, the activation's output, is not kept: Inductor's partitioner recomputes it
  from fc1's output, which the activation's backward keeps anyway (the dense fp8 linear's
  MLP-down input the same way: :mod:`meshplan.costmodel.fp8_cost`); and where the block is
  one graph with its activations kept (:func:`keeps_fc1_cast`), fc1's input — the padded
  rows, made by the executor's permutation ops, which the partitioner cannot re-run —
  is kept as its weight-gradient cast (fp8 with per-group scales, 1 B an element) instead
  of in 16 bits: the partitioner moves that cast into the forward, since the backward
  reads the rows only through it (−R·h B a layer; found post hoc 2026-12-05 on the moeh
  checks' compiled fp8 arms, which kept k·h B a token and layer less than priced, and read
  off a compiled CPU block: docs/benchmarks/moe_checks.md "Compiled fp8 MoE blocks keep
  less"); the autocast copies of
  the experts' weights that the 16-bit grouped GEMM makes (and keeps for its backward) are
  not made —
  under ZeRO-0/1 the per-layer copy :class:`meshplan.costmodel.moe_tables.ExpertTerms`
  counts comes off (``weight_copy_bytes`` < 0), and a layer priced from a bf16 MoE row,
  whose kept bytes hold the copies per micro-batch, loses them there
  (:func:`meshplan.costmodel.moe_rows.fp8_experts_on_bf16_row`).

A GPU before Hopper runs the experts in 16 bits (no grouped fp8 kernel); the cost model does
not know the GPU's generation and prices them fp8.

Measured (1 × H200, 2026-12-02, docs/fp8.md "FP8 routed experts in the executor"): at
moeh23's experts (8 of width 6400, 65,536 rows) the fp8 grouped GEMMs took 11.6 ms against
bf16's 20.6 (1.77×), the casts about 9.5 ms, the compiled experts 25.2 ms against 25.9; the
model's step 0.692 s against 0.754 (bf16) and 0.736 (fp8 with 16-bit experts), priced post
hoc from its bf16 rows +21.7 % (−1.8 % with the block share re-fitted on the MoE rows),
memory +0.5 %; no held-out check yet (benchmarks/sets/moeh24). Published
FP8 / MXFP8 MoE rows (docs/benchmarks/published.md) were priced before 2026-12-01 with the
experts at the fp8 peak on the bf16 curve and no casts; the change is reported there as post
hoc.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.costmodel import fp8
from meshplan.costmodel.compute import gemm_s, sixteen_bit_precision
from meshplan.costmodel.fp8_cost import cast_rate, check_fp8_supported
from meshplan.costmodel.runtime import fp8_transformer_engine, fp8_weight_source_bytes
from meshplan.hardware_profiles import Cluster
from meshplan.hardware_profiles.grouped_gemm import grouped_call_flops, grouped_call_s
from meshplan.hardware_profiles.measured_rows import ran_fp8_experts
from meshplan.spec import Job, Layout, ModelSpec
from meshplan.spec.choices import TORCH_FP8_EXPERT_RECIPES


def torch_experts_fp8(model: ModelSpec, job: Job) -> bool:
    """Whether meshplan's executor runs ``model``'s routed experts in fp8 for ``job``."""
    return job.runtime == "torch" and ran_fp8_experts(model, job.precision, job.fp8_recipe)


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
    # per micro-batch (runtime "torch", ZeRO-0/1): the 16-bit expert weight copies a bf16
    # grouped GEMM saves for its backward, which a bf16 MoE row's kept bytes hold and the
    # fp8 experts do not make
    saved_copy_bytes: float = 0.0
    # runtime "torch", per micro-batch and within forward_ / backward_cast_s: the stacked
    # weights' casts (forward; backward's dgrad layout), which a step casts once instead
    # where expert_weights_cached (with_cached_expert_weights); and the bytes per layer its
    # two fp8 copies hold then
    weight_forward_cast_s: float = 0.0
    weight_backward_cast_s: float = 0.0
    weight_cache_bytes: float = 0.0


def expert_weights_cached(zero: int, num_microbatches: int, recompute: str) -> bool:
    """Whether meshplan's executor casts its fp8 routed experts' weights once a step rather
    than in every pass (:class:`meshplan.executor.fp8_grouped.Fp8ExpertWeights`): where a
    step would cast them more than once — several micro-batches, or full recompute's second
    forward — and they are plain parameters (ZeRO-0/1; FSDP2 gathers them for each pass).
    The executor and the cost model both ask this function."""
    return zero < 2 and (num_microbatches > 1 or recompute == "full")


def keeps_fc1_cast(layout: Layout) -> bool:
    """Whether the executor's fp8 routed experts keep fc1's input as its 1-byte
    weight-gradient cast rather than in 16 bits (module docstring, "memory"): the block
    compiled as one graph (``Layout.compile`` at ep = etp = 1) with its activations kept
    (no full recomputation)."""
    return (layout.compile and layout.ep == 1 and layout.etp == 1
            and layout.recompute != "full")


def recompute_keeps_expert_outputs(job: Job, layout: Layout) -> bool:
    """Whether full recomputation re-runs none of the executor's fp8 routed experts' GEMMs
    and their rows' casts (it re-runs their weights' casts, whose input, the parameter, is
    at hand): the block compiled as one graph (``Layout.compile`` at ep = etp = 1;
    with ep > 1 the all-to-all's host reads split it), where Inductor's partitioner keeps
    the outputs of the fp8 grouped GEMMs' autograd Functions rather than re-running them,
    as it keeps the dense fp8 linears' (:attr:`meshplan.costmodel.fp8_cost.Fp8Layer.
    recompute_keeps_gemm_outputs`). Measured on the compiled rows of the 1-GPU checks with
    fp8 experts (docs/fp8.md): the recomputation of an fp8 block re-ran 0.15-0.46 of what its
    bf16 twin's re-ran (moeh24-26, moeh28); with 16-bit experts (moeh23's rows) 0.89-0.96.
    Which casts are re-run was read post hoc off the same checks' full-recompute arms
    (docs/benchmarks/moe_checks.md "Compiled fp8 full recomputation")."""
    return (job.runtime == "torch" and layout.compile and layout.recompute == "full"
            and layout.ep == 1 and layout.etp == 1)


def _gemm_pair_s(gpu, te: bool, peak16: float, peak8: float, groups: float, m: int, k: int,
                 n: int) -> tuple[float, float]:
    """(16-bit, fp8) seconds of one expert GEMM (k → n, m rows an expert) whose ratio
    prices the fp8 experts: TE's one GEMM per expert, or the executor's grouped call over
    ``groups`` experts — on the profile's grouped curves where it measured the fp8 one, else
    on the dense curves at the curve's key (module docstring)."""
    if not te and gpu.grouped_fp8_gemm_efficiency is not None:
        g16 = gpu.grouped_gemm_efficiency
        flops = grouped_call_flops(groups, m, k, n)
        return ((grouped_call_s(g16, peak16, groups, m, k, n) if g16 is not None
                 else gemm_s(gpu, peak16, flops)),
                grouped_call_s(gpu.grouped_fp8_gemm_efficiency, peak8, groups, m, k, n))
    by_call = not te and gpu.grouped_gemm_key == "call"
    flops = grouped_call_flops(groups, m, k, n) if by_call else 2.0 * m * k * n
    return (gemm_s(gpu, peak16, flops),
            fp8.fp8_gemm_time_s(flops, peak8, gpu.fp8_gemm_efficiency))


def fp8_experts(cluster: Cluster, job: Job, *, rows_per_expert: float, local_experts: float,
                hidden: int, fc1_width: float, fc2_width: float, compile: bool = False,
                zero: int = 0, fc1_cast_kept: bool = False) -> Fp8Experts | None:
    """The routed experts' fp8 terms (module docstring); None where they stay 16-bit (not
    fp8, or runtime "torch" under a recipe its grouped kernel does not take).
    ``fc1_width``: fc1's output width on this rank (m·f_e/etp), ``fc2_width``: fc2's input
    width (f_e/etp); ``compile`` (Layout.compile), ``zero`` and ``fc1_cast_kept`` (the
    block compiled as one graph and its activations kept: :func:`keeps_fc1_cast`): runtime
    "torch" only."""
    te = fp8_transformer_engine(job)
    if job.precision != "fp8" or not (te or job.fp8_recipe in TORCH_FP8_EXPERT_RECIPES):
        return None
    gpu = cluster.gpu
    check_fp8_supported(job, gpu)
    rate = cast_rate(gpu, job, compile and not te)
    peak16, peak8 = gpu.peak_flops(sixteen_bit_precision(job)), gpu.peak_flops("fp8")
    # the executor's experts: FSDP2's bf16 weights at ZeRO-2/3 (over edp, one rank included)
    wbytes = fp8_weight_source_bytes(job, 1, 1) if te or zero < 2 else 2
    m, h = int(round(rows_per_expert)), hidden
    # TE casts per expert; the executor casts all local experts' rows and weights at once
    rows, per_cast = (m, local_experts) if te else (int(round(m * local_experts)), 1.0)
    bf16_s = fp8_s = cast_f = cast_b = cast_w = weight_f = weight_b = 0.0
    for k, n in ((h, int(fc1_width)), (int(fc2_width), h)):
        b, f = _gemm_pair_s(gpu, te, peak16, peak8, local_experts, m, k, n)
        bf16_s, fp8_s = bf16_s + b, fp8_s + f
        c = fp8.linear_cast_traffic(rows, k, n, job.fp8_recipe, act_bytes=2,
                                    weight_bytes=wbytes, fused_cast_transpose=rate.fused)
        cast_f += rate.seconds(c.forward_passes, c.forward_bytes)
        cast_b += rate.seconds(c.backward_passes, c.backward_bytes)
        if te:
            cast_w += rate.seconds(c.weight_passes, c.weight_bytes)
        else:       # every pass: the stacked weights, forward and backward casts
            f_bytes = local_experts * c.weight_forward_bytes
            b_bytes = local_experts * (c.weight_bytes - c.weight_forward_bytes)
            if compile and gpu.fp8_cast_weight_gbps > 0:
                weight_f += f_bytes / (gpu.fp8_cast_weight_gbps * 1e9)
                weight_b += b_bytes / (gpu.fp8_cast_weight_gbps * 1e9)
            else:
                weight_f += rate.seconds(c.weight_forward_passes, f_bytes)
                weight_b += rate.seconds(c.weight_passes - c.weight_forward_passes, b_bytes)
    params = local_experts * hidden * (fc1_width + fc2_width)
    ratio = fp8_s / bf16_s if bf16_s > 0 else 1.0
    if not te:
        copies = 2.0 * params if zero < 2 else 0.0    # the autocast copies not made
        # compiled, fc2's input (the activation's output) is recomputed from fc1's output,
        # which the activation's backward keeps anyway
        act_out = -rows * fc2_width * 2.0 if compile else 0.0
        # ... and fc1's 16-bit input gives way to its 1-byte weight-gradient cast
        fc1_in = -rows * hidden * 1.0 if fc1_cast_kept else 0.0
        return Fp8Experts(gemm_ratio=ratio, forward_cast_s=cast_f + weight_f,
                          backward_cast_s=cast_b + weight_b,
                          weight_cast_step_s=0.0, weight_copy_bytes=-copies,
                          fc1_input_delta_bytes=fc1_in, fc2_input_delta_bytes=act_out,
                          saved_copy_bytes=copies, weight_forward_cast_s=weight_f,
                          weight_backward_cast_s=weight_b, weight_cache_bytes=2.0 * params)
    gathered = job.fp8_param_gather
    return Fp8Experts(
        gemm_ratio=ratio,
        forward_cast_s=per_cast * cast_f, backward_cast_s=per_cast * cast_b,
        weight_cast_step_s=0.0 if gathered else local_experts * cast_w,
        weight_copy_bytes=0.0 if gathered else 2.0 * params,
        fc1_input_delta_bytes=-local_experts * rows_per_expert * hidden,
        fc2_input_delta_bytes=-local_experts * rows_per_expert * fc2_width)


__all__ = ["Fp8Experts", "expert_weights_cached", "fp8_experts", "keeps_fc1_cast",
           "recompute_keeps_expert_outputs", "torch_experts_fp8"]
