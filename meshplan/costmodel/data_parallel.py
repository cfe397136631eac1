"""Data-parallel costs of one pipeline rank: model states, gradient reduction, ZeRO, optimizer.

* Process groups: Megatron's rank order, tp fastest then dp then pp (``tp-dp-pp``) or
  ``tp-pp-dp`` (Megatron-Core ``RankGenerator`` order strings); each group's link from the
  cluster's topology (:func:`group_links`).
* ZeRO-0 all-reduces gradients; ZeRO-1/2 reduce-scatter them and all-gather the updated
  parameters, the same volume (Rajbhandari et al. 2019, arXiv 1910.02054 §7); ZeRO-3
  gathers per layer and micro-batch, prefetching the next layer's gather behind this
  layer's compute (Zhao et al. 2023, arXiv 2304.11277 §3.3): :func:`zero3_layer`.
  Runtime "torch" ZeRO-1 (``ZeroRedundancyOptimizer``) syncs the updated parameters with
  one broadcast of each rank's fp32 shard in turn on one communicator (``_sync_params``,
  torch 2.11 / 2.13 source): dp · S/dp at the bus bandwidth (nccl-tests: broadcast busbw =
  algbw), dp / (dp − 1) times an all-gather's time. Round 38 (2 × H200, dp 2): the
  optimizer phase less half of ZeRO-0's AdamW measured 15.0 / 22.3 ms (t38m01 / t38m04)
  against 9.0 / 13.3 ms as an all-gather and 18.1 / 26.7 ms as broadcasts (they ran at
  ~370 GB/s of bus bandwidth where the profile's curve, from all-reduces, gives ~310).
* Overlap: the gradient reduction hides behind the last micro-batch's backward, the
  parameter all-gather behind the next forward; DDP's last bucket is always exposed (Li et
  al. 2020, arXiv 2006.15704 §3.2.3); the hidden part still costs the profile's
  ``overlap_interference`` (Rashidi et al. 2021, ISCA §3), or for DDP's gradient all-reduce
  and FSDP2's per-layer collectives ``GPUSpec.dp_overlap_interference`` (calibrate's probe
  on the executor's blocks, ``calibrate/bench_ddp_overlap.py``; round 41 of issue 36):
  :func:`exposed_dp_s`, :func:`zero3_layer`. Square GEMMs beside an all-gather (the
  ``overlap_interference`` probe) leave NCCL no SMs and read 1.0-1.3 on H200; the blocks,
  with their memory-bound kernels and attention, 0.2-0.5. FSDP2 layouts composed from plain
  rows with the GEMM probe's share: rounds 41/43 +6.6..+14.8 % slow; with the blocks' share
  −2.8..+3.3 % (post hoc, 2026-11-29; docs/benchmarks/transfer.md "FSDP2's overlap").
  An MoE rank's experts under runtime "torch" at ZeRO-0/1 are reduced after the backward,
  outside DDP, none of it hidden (:func:`reduced_after_backward`; moeh8's ep 1 DDP run:
  41 ms a step in its gradient phase after the backward, now priced 31 ms + DDP's last
  bucket, where the overlapped pricing exposed 22 ms of the reduction; docs/benchmarks/moe_checks.md
  "moeh8").
* Optimizer: fused Adam is memory-bound, 32 bytes per local parameter, at the calibrated
  optimizer bandwidth or the HBM model: :func:`rank_state`.

Measured error: the tail (exposed dp + optimizer) matched the executor's step phases within
the run-to-run spread on the measured sets (docs/benchmarks/accuracy.md, round 21).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from meshplan.costmodel import comm
from meshplan.costmodel.comm import exposed
from meshplan.costmodel.compute import hbm_s
from meshplan.costmodel.fp8_cost import fp8_gathered_params
from meshplan.costmodel.memory import (compute_weight_bytes_per_param, param_gather_bytes,
                                       stage_params, state_bytes_per_param)
from meshplan.costmodel.runtime import fsdp_per_microbatch, torch_pipelined
from meshplan.costmodel.torch_memory import compute_copy_bytes, state_bytes_at_peak
from meshplan.hardware_profiles import Cluster
from meshplan.spec import Job, Layout, ModelSpec

DP_BUCKET_BYTES = 25 * 2**20        # PyTorch DDP's default bucket (bucket_cap_mb=25)
OPTIMIZER_BYTES_PER_PARAM = 32.0    # fused Adam: read+write master, m, v; read grad, write weight
# runtime "torch", pipelined: gradients are averaged after the schedule through a flat
# buffer (executor.data_parallel.allreduce_grads): cat (read + write), div_ (read + write),
# copy back (read + write) = 6 passes over the fp32 gradients.
GRAD_FLATTEN_PASSES = 6.0


@dataclass(frozen=True)
class Groups:
    """Process-group links of a layout under the cluster's rank order (tp fastest)."""

    tp: object
    dp: object      # the gradient group: dp·cp ranks with context parallelism
    pp: object
    cp: object = None    # context parallelism's ring / all-to-all group (cp > 1)
    ep: object = None    # expert parallelism's all-to-all group (MoE)
    etp: object = None   # expert tensor parallelism
    edp: object = None   # the experts' gradient group (expert data parallelism)


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


@dataclass(frozen=True)
class Zero3Layer:
    """ZeRO-3 per layer and micro-batch: exposed gather time and bytes sent."""

    forward_s: float = 0.0    # exposed in forward
    backward_s: float = 0.0   # exposed in backward
    wire_bytes: float = 0.0
    total_s: float = 0.0      # all of it: two all-gathers and one reduce-scatter


def zero3_layer(layer, layer_params: float, dp_link, dp: int, zero: int, job: Job,
                pp: int, interference: float, fp8_params: float = 0.0) -> Zero3Layer:
    """Parameters gathered per layer per micro-batch (forward and backward), gradients
    reduce-scattered; FSDP prefetches the next layer's gather behind this layer's compute
    (Zhao et al. 2023, arXiv 2304.11277 §3.3), so only what compute cannot cover is exposed.

    Runtime "torch" (FSDP2 with bf16 compute and fp32 reduction): 16-bit weights are
    gathered and fp32 gradients reduce-scattered; its ZeRO-2 gathers once per micro-batch
    (kept from forward to backward) instead of twice. ``interference``: the share of the
    hidden part that still costs (callers pass ``GPUSpec.dp_overlap_interference``).
    ``fp8_params``: those of ``layer_params`` that are fp8 linears' weights, gathered at 1
    byte where ``Job.fp8_param_gather`` is set (runtime "megatron":
    :func:`~meshplan.costmodel.memory.param_gather_bytes`).
    """
    if not fsdp_per_microbatch(job, zero, pp) or dp == 1:
        return Zero3Layer()
    per = state_bytes_per_param(job)
    cw = compute_weight_bytes_per_param(job)
    gather_b = layer_params * cw if cw else param_gather_bytes(job, layer_params, fp8_params)
    reduce_b = layer_params * per.grads
    ag = comm.all_gather_s(dp_link, gather_b)
    rs = comm.reduce_scatter_s(dp_link, reduce_b)
    gathers = 2 if zero == 3 else 1
    f, b = layer.forward.total_s, layer.backward.total_s
    bwd = (ag if zero == 3 else 0.0) + rs
    k = interference
    return Zero3Layer(exposed(ag, f, k), exposed(bwd, b, k),
                      gathers * comm.wire_bytes_gather(dp, gather_b)
                      + comm.wire_bytes_gather(dp, reduce_b), gathers * ag + rs)


@dataclass(frozen=True)
class RankState:
    """What one pipeline rank's parameters cost, independent of the schedule."""

    weights_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    dp_total_s: float        # all data-parallel communication of a step
    grad_reduce_s: float     # gradient all-reduce (ZeRO-0) or reduce-scatter (ZeRO-1/2)
    param_gather_s: float    # ZeRO-1/2 parameter all-gather
    dp_wire_bytes: float
    optimizer_s: float
    last_bucket_s: float     # the gradient bucket that can never overlap
    grad_copy_s: float = 0.0  # runtime "torch", pipelined: flattening the gradients to reduce
    # reduced after the backward, outside DDP's overlapped buckets (runtime "torch": an MoE
    # rank's experts under ZeRO-0/1, executor.expert_parallel.reduce_expert_grads)
    after_backward_s: float = 0.0


@lru_cache(maxsize=65536)
def rank_state(model: ModelSpec, cluster: Cluster, job: Job, dp: int, pp: int, tp: int,
               zero: int, num_microbatches: int, dp_link, layers: int, first: bool, last: bool,
               z3: Zero3Layer, grad_copies: int = 1, extra_params: float = 0.0, *,
               compiled: bool = False) -> RankState:
    """Model states, data-parallel communication and optimizer time of one pipeline rank.

    ZeRO-0 all-reduces gradients; ZeRO-1/2 reduce-scatter gradients and all-gather updated
    parameters (the same volume, Rajbhandari et al. 2019 §7); ZeRO-3's per-layer traffic is
    inside the stage times and counted here for the totals. The optimizer step is
    memory-bound (fused Adam reads and writes master weights, m, v and gradients), at the
    calibrated optimizer bandwidth when the profile has one.

    Runtime "torch": ZeRO-1 is DDP's all-reduce of the fp32 gradients followed by
    ``ZeroRedundancyOptimizer``'s broadcast of each rank's updated fp32 shard, one rank
    after the other (dp broadcasts, see the module docstring); ZeRO-2 is FSDP2, per layer
    like ZeRO-3. ``grad_copies``: fp32
    gradient copies (:func:`ddp_accumulates`). ``extra_params``: parameters beyond
    ``layers`` equal layers (an MoE model's dense layers, :mod:`meshplan.costmodel.
    moe_tables`), with their compute copies. ``compiled``: the layers are priced from compiled
    rows, which hold their weights' 16-bit copies (:func:`compute_copy_bytes`). With
    ``Job.fp8_param_gather`` the layers' linears and the extra (MLP) parameters are gathered
    in fp8 (:func:`~meshplan.costmodel.fp8_cost.fp8_gathered_params`).
    """
    params = stage_params(model, layers, tp, first=first, last=last, pp=pp) + extra_params
    fp8_params = layers * fp8_gathered_params(model, job, tp) + extra_params
    copies = (compute_copy_bytes(model, job, zero, dp, tp, pp, layers, first=first, last=last,
                                 compiled=compiled)
              + (extra_params * compute_weight_bytes_per_param(job)
                 if extra_params and not (zero == 3 and dp > 1) else 0.0))
    return params_state(cluster, job, params, dp, pp, zero, num_microbatches, dp_link,
                        layers, z3, grad_copies, copies, fp8_params)


def params_state(cluster: Cluster, job: Job, params: float, dp: int, pp: int, zero: int,
                 num_microbatches: int, dp_link, layers: int, z3: Zero3Layer,
                 grad_copies: int, copy_bytes: float, fp8_params: float = 0.0) -> RankState:
    """:func:`rank_state` for ``params`` parameters reduced over ``dp`` ranks on ``dp_link``
    (``layers`` of them per ZeRO-3 gather ``z3``), ``copy_bytes`` of 16-bit compute copies
    counted with the weights, ``fp8_params`` of them fp8 linears' weights (all-gathered in
    fp8 where ``Job.fp8_param_gather`` is set); MoE experts use it with their own group
    (edp)."""
    m = num_microbatches
    per = state_bytes_per_param(job)
    w, g, o = state_bytes_at_peak(params, job, zero, dp, pp)
    g *= grad_copies
    w += copy_bytes
    grad_bytes = params * per.grads
    dp_s = red = gat = wire = bucket = copy = 0.0
    torch_rt = job.runtime == "torch"
    if dp > 1:
        if zero == 0 or (zero == 1 and torch_rt):
            dp_s = red = comm.all_reduce_s(dp_link, grad_bytes)
            wire = comm.wire_bytes_all_reduce(dp, grad_bytes)
            if zero == 1:
                # ZeroRedundancyOptimizer._sync_params: one broadcast of its shard from
                # each rank in turn on one communicator (torch 2.11 / 2.13 source), not an
                # all-gather: dp × shard at the bus bandwidth, against (dp − 1) / dp of it
                gat = dp * comm.broadcast_s(dp_link, params * per.weights / dp)
                dp_s += gat
                wire += comm.wire_bytes_gather(dp, params * per.weights)
            if torch_pipelined(job, pp):
                copy = hbm_s(cluster.gpu, GRAD_FLATTEN_PASSES * grad_bytes)
        elif zero in (1, 2) and not fsdp_per_microbatch(job, zero, pp):
            # runtime "torch" (FSDP2 ZeRO-2 under a pipeline): the 16-bit compute weights
            # are gathered, the fp32 gradients reduce-scattered, once per step
            gather_b = (params * (compute_weight_bytes_per_param(job) or per.weights)
                        if torch_rt else param_gather_bytes(job, params, fp8_params))
            red = comm.reduce_scatter_s(dp_link, grad_bytes)
            gat = comm.all_gather_s(dp_link, gather_b)
            dp_s = red + gat
            wire = comm.wire_bytes_gather(dp, grad_bytes) + comm.wire_bytes_gather(
                dp, gather_b)
        else:
            dp_s = m * layers * z3.total_s
            wire = m * layers * z3.wire_bytes
        if job.overlap_dp_comm and not fsdp_per_microbatch(job, zero, pp):
            bucket = comm.all_reduce_s(dp_link, min(grad_bytes, DP_BUCKET_BYTES))
    local = params / dp if zero >= 1 else params
    gpu = cluster.gpu
    opt_s = (local * OPTIMIZER_BYTES_PER_PARAM / (gpu.optimizer_gbps * 1e9)
             if gpu.optimizer_gbps > 0 else hbm_s(gpu, local * OPTIMIZER_BYTES_PER_PARAM))
    return RankState(w, g, o, dp_s, red, gat, wire, opt_s, bucket, copy)


def combined_state(a: RankState, b: RankState) -> RankState:
    """Two parameter groups of one rank reduced on their own groups one after the other
    (an MoE rank's dense parameters over dp·cp and its experts over edp): bytes, seconds
    and optimizer time add; the bucket that never overlaps is the larger last bucket."""
    return RankState(a.weights_bytes + b.weights_bytes, a.grads_bytes + b.grads_bytes,
                     a.optimizer_bytes + b.optimizer_bytes, a.dp_total_s + b.dp_total_s,
                     a.grad_reduce_s + b.grad_reduce_s, a.param_gather_s + b.param_gather_s,
                     a.dp_wire_bytes + b.dp_wire_bytes, a.optimizer_s + b.optimizer_s,
                     max(a.last_bucket_s, b.last_bucket_s), a.grad_copy_s + b.grad_copy_s,
                     a.after_backward_s + b.after_backward_s)


def reduced_after_backward(st: RankState) -> RankState:
    """``st`` with its gradient reduction run after the backward rather than in overlapped
    buckets: the executor's ZeRO-0/1 all-reduce of an MoE rank's expert gradients over
    edp, which it leaves out of DDP (``expert_parallel.prepare_data_parallel``) and reduces
    once the step's backward is done (``reduce_expert_grads``), so none of it hides behind
    a backward."""
    return replace(st, grad_reduce_s=0.0, last_bucket_s=0.0,
                   after_backward_s=st.after_backward_s + st.grad_reduce_s)


def exposed_dp_s(st: RankState, layout: Layout, job: Job, forward_s: float,
                 backward_s: float, interference: float) -> float:
    """Data-parallel time left on the critical path of a rank whose forward and backward of
    one micro-batch (all its chunks) take ``forward_s`` and ``backward_s``.

    The gradient reduction hides behind the last micro-batch's backward, the ZeRO-1/2
    parameter all-gather behind the next step's first forward; the last bucket is always
    exposed (PyTorch DDP, Li et al. 2020, arXiv 2006.15704 §3.2.3; Megatron-Core
    overlap_grad_reduce / overlap_param_gather). Without overlap everything is exposed.

    Runtime "torch": pipelined layouts reduce after the schedule (nothing overlaps), and
    ZeroRedundancyOptimizer's broadcast follows the optimizer step (exposed).
    ``interference``: the profile's ``GPUSpec.dp_overlap_interference`` (see :func:`exposed`).
    """
    # (dp 1: nothing to reduce, unless an MoE rank's experts reduce over edp > 1)
    if fsdp_per_microbatch(job, layout.zero, layout.pp) or (layout.dp == 1
                                                            and not st.dp_total_s):
        return 0.0
    if torch_pipelined(job, layout.pp):
        return st.dp_total_s + st.grad_copy_s
    if not job.overlap_dp_comm:
        return st.dp_total_s
    k = interference
    if job.runtime == "torch":
        return max(st.last_bucket_s, exposed(st.grad_reduce_s, backward_s, k)) \
            + st.after_backward_s + st.param_gather_s
    reduce = max(st.last_bucket_s, exposed(st.grad_reduce_s, backward_s, k))
    return reduce + exposed(st.param_gather_s, forward_s, k)


def root_gather_s(params: float, bytes_per_param: float, dp_link) -> float:
    return comm.all_gather_s(dp_link, params * bytes_per_param) if params else 0.0


def root_reduce_s(params: float, bytes_per_param: float, dp_link) -> float:
    return comm.reduce_scatter_s(dp_link, params * bytes_per_param) if params else 0.0


__all__ = ["DP_BUCKET_BYTES", "OPTIMIZER_BYTES_PER_PARAM", "GRAD_FLATTEN_PASSES", "Groups",
           "group_links", "Zero3Layer", "zero3_layer", "RankState", "rank_state", "params_state",
           "combined_state", "reduced_after_backward",
           "exposed_dp_s", "exposed", "root_gather_s", "root_reduce_s"]
