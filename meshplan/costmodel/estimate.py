"""``estimate(model, cluster, job, layout) -> Estimate``: the single source of predictions.

Step time = max(pipeline time, host bound) + the slowest rank's exposed data-parallel
communication and optimizer step. The pipeline time puts per-stage forward/backward per
micro-batch through the schedule's closed form (:mod:`meshplan.costmodel.pipeline`). The
host bound applies where the profile has measured CPU dispatch times (``meshplan
calibrate`` layer tables): PyTorch's CPU queues kernels ahead of the GPU, so a rank cannot
finish before its CPU has dispatched all its work (:meth:`LayerTables.host_bound_s`); for
small layers on fast GPUs this, not the GPU, sets the step time. Memory = model states +
in-flight activations + buffers per pipeline rank; the peak is the worst rank. Sources are cited in the modules each term
comes from (compute, memory, comm, pipeline, flops).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from meshplan.costmodel import comm, first_backward, torch_p2p
from meshplan.costmodel.compute import (LayerCost, PassCost, embedding_cost, hbm_s, layer_cost,
                                        logits_cost)
from meshplan.costmodel.flops import hardware_flops_per_step, model_flops_per_step
from meshplan.costmodel.measured import Interpolated, split_backward_at, wgrad_bytes_at
from meshplan.costmodel.memory import (activation_bytes_per_element,
                                       compute_weight_bytes_per_param, layer_activations,
                                       logits_bytes, model_state_bytes,
                                       split_backward_kept_grad_bytes, stage_params,
                                       state_bytes_per_param)
from meshplan.costmodel.pipeline import closed_form_unchecked, inflight_microbatches
from meshplan.costmodel.result import Estimate, StageMemories, TimeBreakdown
from meshplan.spec import Job, Layout, ModelSpec
from meshplan.spec.validate import check_layout
from meshplan.hardware_profiles import Cluster
from meshplan.hardware_profiles.gpu import DEFAULT_OVERLAP_INTERFERENCE

DP_BUCKET_BYTES = 25 * 2**20        # PyTorch DDP's default bucket (bucket_cap_mb=25)
OPTIMIZER_BYTES_PER_PARAM = 32.0    # fused Adam: read+write master, m, v; read grad, write weight
# runtime "torch", pipelined: gradients are averaged after the schedule through a flat
# buffer (executor.data_parallel.allreduce_grads): cat (read + write), div_ (read + write),
# copy back (read + write) = 6 passes over the fp32 gradients.
GRAD_FLATTEN_PASSES = 6.0


def fsdp_per_microbatch(job: Job, zero: int, pp: int = 1) -> bool:
    """ZeRO stages whose communication happens per layer and per micro-batch: ZeRO-3, and
    ZeRO-2 as FSDP2 runs it without a pipeline (runtime "torch": gradients are
    reduce-scattered after every micro-batch's backward and the weights re-gathered for the
    next forward). Under torch.distributed.pipelining, FSDP2's ZeRO-2 is gathered once and
    reduced once per step: the stage turns off gradient sync and resharding after backward
    for every micro-batch but the last (``_PipelineStageBase.backward_maybe_with_nosync``)."""
    return zero == 3 or (zero == 2 and job.runtime == "torch" and pp == 1)


@dataclass(frozen=True)
class Groups:
    """Process-group links of a layout under the cluster's rank order (tp fastest)."""

    tp: object
    dp: object
    pp: object


def torch_pipelined(job: Job, pp: int) -> bool:
    """torch.distributed.pipelining runs the pipeline (runtime "torch", pp > 1): it holds
    receive buffers and stage outputs, its ranks reduce gradients after the schedule, and
    its p2p kernels slow the compute beside them."""
    return job.runtime == "torch" and pp > 1


def fsdp_accumulates_unsharded(job: Job, zero: int, dp: int, pp: int) -> bool:
    """FSDP2 (ZeRO-2/3, dp > 1) under torch.distributed.pipelining keeps each rank's
    gradients unsharded in fp32 through the step: the stage runs every micro-batch's backward
    with gradient sync off (``_PipelineStageBase.backward_maybe_with_nosync``:
    ``set_requires_gradient_sync(False)``), FSDP2 then upcasts each unsharded gradient to the
    reduce dtype and accumulates it (``FSDPParam.to_accumulated_grad_if_needed``), and only
    ``perform_reduce_grad`` after the schedule reduce-scatters. At the peak a rank holds
    params × 4 bytes of gradients, not params × 4 / dp (read in torch 2.13's source; the
    measurements below ran torch 2.11).

    Measured: Llama dp2 pp2 1F1B ZeRO-2 peaked 1.22-1.44 GiB (q16, 4 × H200, round 7; u10,
    4 × H100, round 11) and GPT's interleaved k06 0.60-0.64 GiB above the model that had
    the gradients sharded: params × 4 × (1 − 1/dp) is 1.53 and 0.56 GiB."""
    return job.runtime == "torch" and pp > 1 and zero >= 2 and dp > 1


def state_bytes_at_peak(params: float, job: Job, zero: int, dp: int,
                        pp: int) -> tuple[float, float, float]:
    """:func:`model_state_bytes`, with the gradients unsharded where FSDP2 accumulates them
    so under a pipeline (:func:`fsdp_accumulates_unsharded`)."""
    w, g, o = model_state_bytes(params, job, zero, dp)
    if fsdp_accumulates_unsharded(job, zero, dp, pp):
        g = params * state_bytes_per_param(job).grads
    return w, g, o


def torch_ddp(job: Job, layout: Layout) -> bool:
    """The executor wraps the model in DistributedDataParallel: runtime "torch", ZeRO-0/1,
    no pipeline, dp > 1 (``executor.data_parallel.wrap_data_parallel``)."""
    return job.runtime == "torch" and layout.pp == 1 and layout.dp > 1 and layout.zero < 2


def ddp_accumulates(job: Job, layout: Layout, microbatches: int) -> bool:
    """Runtime "torch" with DDP (:func:`torch_ddp`) and several micro-batches:
    the first m − 1 backward passes run under ``no_sync``, so their gradients accumulate in
    ordinary ``.grad`` tensors beside DDP's bucket storage, and both exist until the last
    micro-batch's backward copies them into the buckets — one more fp32 gradient copy
    (torch.nn.parallel.DistributedDataParallel with gradient_as_bucket_view=True)."""
    return torch_ddp(job, layout) and microbatches > 1


def pipeline_recv_buffers(job: Job, layout: Layout, microbatches: int, hidden_size: int,
                          inflight: tuple[float, ...]) -> tuple[float, ...]:
    """Per pipeline rank (runtime "torch"): the receive buffers torch.distributed.pipelining
    allocates when it sets a stage up — one activation buffer per micro-batch for every
    stage but the first, one gradient buffer per micro-batch for every stage but the last
    (``_setup_forward_recv_info`` / ``_setup_backward_recv_info``), each the size of the
    stage's input, (micro-batch, sequence / tp with SP, hidden) in 16 bits. Held for the
    whole run; rank r holds the stages r, r + pp, ... . A received activation is also the
    first layer's input, which the per-layer activation bytes already count for the
    ``inflight`` micro-batches: those are not counted twice."""
    io = _stage_io_bytes(job, layout, hidden_size)
    if io is None:
        return ()
    out = []
    for r in range(layout.pp):
        receiving, sending = _chunks_receiving_sending(layout.pp, layout.vpp, r)
        out.append(((receiving + sending) * microbatches - receiving * inflight[r]) * io)
    return tuple(out)


def _stage_io_bytes(job: Job, layout: Layout, hidden_size: int) -> float | None:
    """One stage input / output, (micro-batch, sequence / tp with SP, hidden) in 16 bits,
    where torch.distributed.pipelining runs the pipeline (runtime "torch", pp > 1); else
    None."""
    if not torch_pipelined(job, layout.pp):
        return None
    seq = job.seq_len // layout.tp if layout.sequence_parallel else job.seq_len
    return layout.micro_batch * seq * hidden_size * activation_bytes_per_element(job)


def _chunks_receiving_sending(pp: int, vpp: int, rank: int) -> tuple[int, int]:
    """How many of ``rank``'s chunks (stages rank, rank + pp, ...) receive an activation
    (all but the first stage) and send one on (all but the last)."""
    chunks = range(rank, pp * vpp, pp)
    return sum(c != 0 for c in chunks), sum(c != pp * vpp - 1 for c in chunks)


def pipeline_kept_outputs(job: Job, layout: Layout, hidden_size: int,
                          inflight: tuple[float, ...]) -> tuple[float, ...]:
    """Per pipeline rank (runtime "torch"): the stage outputs kept for backward. A stage
    keeps each micro-batch's output until that micro-batch's backward
    (``_PipelineStageBase.fwd_cache``, popped by ``backward_one_chunk``); the output of a
    stage's last layer is no layer's saved tensor, so the per-layer activation bytes do not
    hold it. Every stage but the last (whose output is the logits, counted apart) keeps one
    (micro-batch, sequence / tp with SP, hidden) 16-bit tensor per micro-batch in flight;
    rank r's ``inflight[r]`` micro-batches are spread over its chunks, so its non-last chunks
    hold ``inflight[r]`` × (their number) of them."""
    io = _stage_io_bytes(job, layout, hidden_size)
    if io is None:
        return ()
    return tuple(inflight[r] * _chunks_receiving_sending(layout.pp, layout.vpp, r)[1] * io
                 for r in range(layout.pp))


def pipelined_output_peak_bytes(job: Job, layout: Layout, model: ModelSpec,
                                output_peak_bytes: float) -> float:
    """The output layer's working memory (the calibrated end row's peak beyond its kept
    bytes) on a torch-pipelined last stage with tensor parallelism: one micro-batch's
    16-bit logits less than the row's.

    With tp > 1 the executor's vocabulary-parallel cross-entropy runs its backward in place
    (the saved softmax becomes the gradient), so the row's peak is in its forward: the
    16-bit logits, their fp32 copy and the shifted fp32 logits alive together, 3 logits'
    worth above what the forward keeps (GPT-0.54B tp 2, micro-batch 8: 2.34 GiB = 3 × 0.78).
    A pipelined last stage keeps those 16-bit logits anyway, as its output chunk until the
    step ends (``last_chunks_bytes``), so the row's peak counts them a second time. With
    tp = 1 the row's peak is in ``F.cross_entropy``'s backward (two dense fp32 gradients,
    4 logits' worth at micro-batch 8: 6.25 GiB), after the row has freed its 16-bit logits,
    so nothing is counted twice.

    Round 21, post hoc from holdout21 e07's snapshot (GPT pp 2 tp 2, 1F1B, micro-batch 16):
    the last stage peaked in its last micro-batch's loss forward, 6.2 GiB above the memory
    after that micro-batch's stage forward, which already held its 1.56 GiB logits chunk;
    the model had counted the row's 3.44 GiB kept and 4.69 GiB peak there (less the 1.16
    GiB a layer's backward shares with it), 8.8 % over the stage's peak. Over the 19
    torch-pipelined tp > 1 layouts measured (not zero-bubble), the last stages' mean error
    went from +2.4 % to 0.0 % (mean absolute 2.8 → 1.3 %, e07 +8.8 → −0.6 %); the 4
    zero-bubble ones, already under-predicted for
    a reason of their own, from −4.7 % to −5.8 %. So it is not applied to zero-bubble
    (round 22, post hoc on those 4: their last stages' peaks are not where this rule puts
    them), whose last stages keep the −4.7 %."""
    if not (torch_pipelined(job, layout.pp) and layout.tp > 1) \
            or layout.schedule == "zero-bubble":
        return output_peak_bytes
    return max(0.0, output_peak_bytes - logits_chunk_bytes(job, layout, model))


def logits_chunk_bytes(job: Job, layout: Layout, model: ModelSpec) -> float:
    """One micro-batch's 16-bit logits on one tensor-parallel rank: the output chunk a
    torch-pipelined last stage keeps until the step ends."""
    return (layout.micro_batch * job.seq_len * model.vocab_size / layout.tp
            * activation_bytes_per_element(job))


def zero_bubble_pending_w(job: Job, layout: Layout, microbatches: int) -> tuple[float, ...]:
    """Per pipeline rank: micro-batches whose input-gradient pass (I) has run but whose
    weight-gradient pass (W) has not, at the rank's activation peak — each keeps, besides
    its activations, the output gradients W needs (``stage_backward_input`` keeps them for
    ``stage_backward_weight``), about one more non-recomputed activation set per layer.

    torch.distributed.pipelining's ``ScheduleInterleavedZeroBubble`` (ZB1P, Qi et al. 2023,
    arXiv 2401.10241) with one stage per rank runs pp − r forwards ahead of rank r's first
    I and defers its Ws until pp forwards are alive, so rank r holds r such micro-batches
    (counted from the schedule's own action order, torch 2.13, pp 2 and 4, 8-32
    micro-batches). Runtime "torch" and vpp = 1 only; elsewhere 0.

    With full recomputation a middle rank (0 < r < pp − 1) holds r + 1: its peak is inside
    its first W, which the calibration prices as a transient above the live memory *with*
    that micro-batch's pending set in it (:mod:`meshplan.calibrate.split_memory`), and by
    then r + 1 micro-batches have run their I. Round 20's memory snapshot of holdout20 d03
    (GPT, pp 4, m 4, torch 2.11) shows the order and the sets: rank 1 runs F0 F1 F2 I0 F3
    I1 W0, rank 2 F0 F1 I0 F2 I1 F3 I2 W0; each I adds 5.9-6.3 GiB (6 layers × 0.97
    predicted) and each W peaks 19.8 GiB above its start (19.4 predicted). With r sets
    rank 1 and 2 of d03, t04 (holdout11, GPT mb 8) and q15 (holdout8, Llama) came out
    2.1-4.8 GiB (6-13 %) low, about one set, on round 20's profile; with r + 1, within
    −2.6..+3.6 %. Post hoc (d03's own miss among them). The last rank runs its W after all
    its I as well, but counting r + 1 there over-predicts it by 6.6-9.2 % (t04, d03): its
    output-layer terms hold about one set more than it keeps, not resolved, so it keeps r.
    Without recomputation the peak is at the end of an I, where the micro-batch that just
    ran it holds its kept gradients too (:func:`split_backward_rule` counts r + 1 sets of
    kept output gradients, not of activations, on ranks r > 0; round 25)."""
    pp = layout.pp
    if job.runtime != "torch" or layout.schedule != "zero-bubble" or layout.vpp != 1:
        return ()
    middle_extra = 1 if layout.recompute == "full" else 0
    return tuple(float(min(r + (middle_extra if 0 < r < pp - 1 else 0), microbatches))
                 for r in range(pp))


# Zero-bubble with full recomputation, runtime "torch" (measured with
# benchmarks/diag_stage_memory.py on 4 × H200, torch 2.11, Llama 1.64B: holdout6 j15 pp 2
# and holdout4 n16 pp 4, every rank r > 0 alike): after a micro-batch's input-gradient pass
# the rank keeps 0.42 of the layers' non-recomputed activations until its W (the
# recomputed tensors that pass did not consume, and the output gradients W needs: 4.4-4.6
# GiB per I on 10.7 GiB sets), and while a deferred W runs it holds 4.1 such sets more
# (+43.4-44.0 GiB). torch.distributed.pipelining's stage_backward_weight runs one
# autograd.grad per parameter group, and non-reentrant checkpointing re-runs a layer's
# forward for every such graph task, keeping what that task does not consume until the
# graph is freed. Sets in profile-version-2 units (input counted once). Read off those two
# layouts, so not a held-out result. Without full recomputation a pending W keeps its
# output gradients instead (split_backward_rule, round 25; j07 had read one set).
ZB_FULL_PENDING_SETS = 0.42
ZB_FULL_W_TRANSIENT_SETS = 4.1

# Runtime "torch", pp > 1: how much slower a pipeline rank computes, per point-to-point
# operation (send or receive of an activation or gradient) it runs per micro-batch, as a
# fraction of its compute. torch.distributed.pipelining posts every SEND/RECV as its own
# NCCL group on the rank's communicator stream; the kernel is resident, spinning on SMs,
# from its launch until the peer's matching kernel arrives, and the compute kernels it
# overlaps run 25-60 % slower (profiler traces, benchmarks/trace_overlap.py: n06, n12,
# p02, p08, p14). Interleaving multiplies these operations (2 per stage boundary and
# direction, pp·vpp − 1 boundaries), so GPU-bound tp = 1 pipelines were under-predicted in
# proportion to them: 1F1B/GPipe pp 2 (2 per rank) ≈ 2-3 %, pp 4 ≈ 3-4 %, interleaved pp 2
# vpp 2 (4-6) ≈ 5-8 %, pp 4 vpp 2 (6-8) ≈ 9-12 %, pp 4 vpp 3 (up to 12) 17 %. Fitted
# (least mean absolute error) on the 32 pipelined layouts of holdout3-6 (4 × H200 and
# 2 × H200, torch 2.11, two calibrations; the three with known profile artefacts, k06 k08
# h07, left out); holdout7 was not used: its 10 pipelined layouts go from 4.35 % / 17.4 %
# to 3.2 % / 7.4 % mean / max error, and held out on holdout8 (run after the fit) its 10
# pipelined layouts were predicted at 5.4 % mean error (9.7 % without the term; round 7 of
# docs/benchmarks/accuracy.md). The compute it slows is measured per layer, so the
# term only scales it; it is not applied to other runtimes (Megatron overlaps p2p
# differently, and the published-runs validation keeps its documented model). Interleaved
# over pp ≥ 3 takes the longer of this and torch's own p2p order (torch_p2p.fifo_step_s),
# whose waits bind at a few micro-batches per rank.
# Interleaving divides the per-operation term by √vpp (stage_slowdown): a chunk's passes
# are 1/vpp of the stage's, so each operation spins behind less compute. Found after
# holdout16 (round 16, post hoc): with the plain count every interleaved pp 2 layout of the
# 16 measured sets was over-predicted (vpp 2: 18 layouts, +1.5 % mean signed; vpp 3: 5 of
# 5, +3.4 to +7.5 %); with √vpp they centre (−0.4 %, +0.8 %) and the 190 GPU-bound
# layouts of all sets go from 2.89 % to 2.77 % mean error. The exponent is fitted (1, the
# residency argument taken literally, over-corrects: −1.8 % / −2.0 %); not held out yet.
TORCH_P2P_SLOWDOWN_PER_OP = 0.012
# The slowdown stops growing past the largest the fit saw (pp 4, vpp 3: 12 operations a
# micro-batch on a middle rank, 1 + 0.012 · 12 / √3 ≈ 1.083): √vpp lets it grow without
# bound as vpp rises, but the p2p kernels cannot be resident for more than the whole of a
# rank's compute. Found after holdout22 (round 22, post hoc, not held out): its two layouts
# beyond the fitted range, Llama pp 2 vpp 6 (o13, 22 operations, 1.108) and vpp 12 (o11,
# 46, 1.159), were over-predicted by +2.8 % and +7.2 % (+2.8 / +7.3 % in the repeat run);
# at the cap they are +0.5 % and +0.2 %. No layout of the earlier sets exceeds the cap.
TORCH_P2P_SLOWDOWN_MAX = TORCH_P2P_SLOWDOWN_PER_OP * 12 / math.sqrt(3)

# Schedules whose ranks get the cast-cache relief (LayerTables.cast_cache_relief_bytes) when
# they run every forward before their first backward (first_backward.forwards_first): GPipe,
# and 1F1B where the warm-up covers all m micro-batches (rank 0 of pp 2 at m 2, F0 F1 B0 B1,
# the same order as GPipe). Until round 23 the rule was GPipe's alone; holdout23 f13 (Llama
# dp 2 pp 2 1F1B, full, ZeRO-0, mb 16, m 2) measured its first stage 5.7 % under the
# prediction without it, 0.9 % over with it (post hoc), and holdout16 z13's rank 0 (pp 4,
# m 4) goes from +2.6 to −0.6 %. Interleaved ranks with all forwards first are left out:
# the rule takes the four measured (v01, v09, z03, z09) from −0.5..+1.7 % to −1.4..−4.5 %.
CAST_CACHE_SCHEDULES = ("gpipe", "1f1b")

FSDP_OVER_TP_CAVEAT = (
    "ZeRO-2/3 over tensor-parallel layers is priced from rows composed out of tp = 1 FSDP2 "
    "measurements (this profile has no FSDP2 rows at this tp): such layouts ran 22-48 % "
    "slower than predicted on 4 x H200 (docs/benchmarks/accuracy.md, holdout8); re-run "
    "`meshplan calibrate`, which now measures them")

# FSDP2 over data parallelism alone (ZeRO-2/3, dp > 1, pp 1, tp 1, runtime "torch"): GPU
# time a step beyond what the layer rows and the tail price, measured and not explained.
# Of the GPU-bound such layouts in the measured sets since holdout7, nearly all ran slower
# than predicted, by about the same time a step for either model: GPT-0.54B's by 13-27 ms
# (4-10 %), Llama-1.64B's by 0-42 ms (0-4 %), the median about 20 ms — not in proportion to
# the compute (Llama's is 3-4 × GPT's), nor to the micro-batches a step (1-8). The tail is
# priced right (the executor's step phases); round 21's traces of GPT at micro-batch 16
# (e02, e03) put the GPU's compute kernels 5-10 % above the calibration's FSDP2 rows, the
# kernels beside FSDP2's all-gathers and reduce-scatters 16-55 % slower than alone. Why the
# calibration's layer stack sees less of it than a step is not found. Round 22 (post hoc):
# a constant a step, fitted on the 19 layouts with CPU < 80 % of the GPU (least mean
# absolute error over 0-25 ms in 5 ms steps), takes GPT's 7 from 7.20 % mean absolute
# error (-7.20 % signed, 10.0 % max) to 1.48 % (-0.64, 3.6) and Llama's 12 from 1.86 %
# (-1.85, 3.7) to 0.79 % (+0.05, 1.9). Both models have 24 layers, so a cost per FSDP2
# unit (~0.8 ms) fits as well; the constant is the simpler reading. The same constant makes
# pipelined FSDP2 worse (GPT +3.8 % signed), so it is not applied there; nor over tp > 1,
# measured too rarely to tell. Held out next on holdout23's f02.
FSDP2_DP_ONLY_STEP_S = 0.020

FSDP_DP_ONLY_CAVEAT = (
    "FSDP2 over data parallelism alone: such layouts measured on 2-4 H100/H200 ran about "
    "20 ms a step slower than their layers and tail predict (GPT-0.54B 4-10 %, Llama-1.64B "
    "0-4 %), for a reason not found; the estimate adds that 20 ms as an empirical term "
    "(docs/benchmarks/accuracy.md, rounds 20-22), so compare it with the best ZeRO-0/1 or "
    "pipelined layout on a measured run")


def fsdp_dp_only(job: Job, layout: Layout) -> bool:
    """FSDP2 (ZeRO-2/3) over data parallelism alone under the torch runtime: dp > 1, no
    pipeline, no tensor parallelism — the layouts FSDP2_DP_ONLY_STEP_S is measured on."""
    return (job.runtime == "torch" and layout.pp == 1 and layout.tp == 1 and layout.dp > 1
            and layout.zero >= 2)


# Measured, not priced (docs/benchmarks/accuracy.md, round 22): the eight zero-bubble
# layouts with FSDP2's ZeRO-2 (dp 2, pp 2, runtime "torch") in the measured sets, on their
# own profiles, missed by -26 % to +17 %: GPT-0.54B's five by +3.7 (v07), +17.0 (b04),
# -4.9 (c02), -1.9 (c04) and -26.4 % (o05; -20.9 % in its repeat), Llama-1.64B's three by
# -2.0, +0.8 and +8.1 % (host-bound). In o05 (micro-batch 8, no recomputation) the last
# stage's passes took 416-456 ms against the first's 352-367 ms and its ZeRO-0 twin's
# (o04) 365-371 ms, and its steps ran 379-485 ms within one run; its gradients match
# 1F1B's and its kernels are the same ones (CPU, gloo, bf16 FSDP2). Not found, so not priced.
ZB_FSDP2_CAVEAT = (
    "zero-bubble with FSDP2 (ZeRO-2): the 8 such layouts measured on 4 x H100/H200 missed "
    "their predictions by -26 % to +17 % (GPT-0.54B dp 2 pp 2 micro-batch 8: -26 % and -21 % in "
    "two runs, its last stage 80 ms a step slower than its first; -5 % on a host with a "
    "faster CPU, round 23), which the model does not price: it dispatches more CPU work than "
    "the model counts and binds on slower hosts (docs/benchmarks/accuracy.md, rounds 22-23); "
    "compare it with the same layout at ZeRO-0/1 or 1F1B on a measured run")

P2P_ORDER_CAVEAT = (
    "pipeline bubble: set by the order in which torch.distributed.pipelining posts its sends "
    "and receives (one NCCL stream per rank; an early receive holds back later sends), "
    "not by the schedule alone; more micro-batches per step amortise it "
    "(meshplan/costmodel/torch_p2p.py)")

# Estimate.caveats carries host_bound_caveat where the CPU's wait is at least this share of
# the step (below it the two sides are within calibration noise of each other).
HOST_BOUND_CAVEAT_SHARE = 0.05


def is_host_bound(host_wait_s: float, step_s: float) -> bool:
    """Whether the CPU's dispatch sets the step: its wait is at least
    ``HOST_BOUND_CAVEAT_SHARE`` of it (the layouts :func:`host_bound_caveat` warns about)."""
    return host_wait_s > 0 and host_wait_s >= HOST_BOUND_CAVEAT_SHARE * step_s


# Estimate.caveats carries near_host_bound_caveat where the CPU's dispatch is at least this
# share of the GPU's time without setting the step. Over the 16 measured sets (round 16 of
# docs/benchmarks/accuracy.md; 190 layouts the model has GPU-bound, each with its own
# profile) the error grows with this load: below 0.8, 146 layouts missed by 2.3 % mean
# (median 1.4 %) and 81 % were within 3 %; at 0.8 or more, 44 layouts missed by 4.3 %
# (median 3.2 %) and 45 % were within 3 %, and their steps spread more within a run (median
# p90 − p10 4.0 % against 0.9 %). Post hoc: chosen on these sets, not held out. The CPU's
# dispatch time varies by ±15 % from run to run on the lent hosts, enough to make it set the
# step now and then.
HOST_NEAR_LOAD = 0.8
HOST_NEAR_LOAD_TEXT = f"{HOST_NEAR_LOAD * 100:g} %"     # as reports and caveats print it


def near_host_bound_caveat(host_load: float) -> str:
    """The caution for a layout whose CPU dispatch takes ``host_load`` (≥ HOST_NEAR_LOAD, < 1
    or within the host-bound share) of its GPU time: predicted GPU-bound, but with little
    CPU headroom."""
    return (f"near host-bound: the CPU needs {host_load:.0%} of the GPU's time to dispatch "
            f"the step; measured layouts with {HOST_NEAR_LOAD_TEXT} or more missed their "
            f"predictions by 4.3 % mean (2.3 % below {HOST_NEAR_LOAD_TEXT}) and varied more "
            "from step to step, because the CPU's dispatch time varies between runs "
            "(docs/benchmarks/accuracy.md, round 16); where a layout with more CPU headroom "
            "is within a few percent, prefer it")


def host_bound_caveat(host_wait_s: float, step_s: float) -> str:
    """The caution for a layout whose step the CPU's dispatch sets (``host_wait_s`` > 0).

    Such layouts are the least repeatable we have measured (docs/benchmarks/accuracy.md,
    rounds 8-11, 4 × H100 and 4 × H200 VMs): one ran 0.385-0.575 s over six runs on one
    machine (t05), and the 29 runs of 21 host-bound layouts missed their predictions by
    −24 % to +36 %, while GPU-bound layouts repeated within 1.6 %. The planner still ranks
    them by the prediction; this says how far to trust it."""
    share = host_wait_s / step_s if step_s > 0 else 0.0
    return (f"host-bound: the GPUs wait {host_wait_s * 1e3:.0f} ms ({share:.0%} of the step) "
            "for the CPU's kernel launches; measured host-bound layouts missed their "
            "predictions by -24 % to +36 % and ran up to 49 % apart between runs "
            "(docs/benchmarks/accuracy.md; GPU-bound ones repeated within 2 %). Calibrate on "
            "the training host, and where a GPU-bound layout is within a few percent, "
            "prefer it")


def p2p_ops_per_microbatch(pp: int, vpp: int) -> tuple[int, ...]:
    """Per pipeline rank: sends + receives it runs per micro-batch (forward activations and
    backward gradients across each boundary between consecutive virtual stages, which
    always lie on different ranks when pp > 1).

    Example: pp = 4, vpp = 1 → (2, 4, 4, 2). pp = 2, vpp = 2 puts stages 0, 2 on rank 0 and
    1, 3 on rank 1; stages 0 and 3 have one boundary, 1 and 2 two → (2 + 4, 4 + 2) = (6, 6).
    pp = 4, vpp = 2 → (6, 8, 8, 6)."""
    if pp <= 1:
        return (0,) * max(pp, 1)
    # a chunk that receives an activation sends its gradient back, one that sends an
    # activation on receives a gradient: two operations per boundary it touches
    return tuple(2 * sum(_chunks_receiving_sending(pp, vpp, r)) for r in range(pp))


def stage_slowdown(job: Job, layout: Layout) -> tuple[float, ...]:
    """Per virtual stage: the factor its compute is slowed by, ``1 + TORCH_P2P_SLOWDOWN_PER_OP
    · ops(rank) / √vpp``, at most ``1 + TORCH_P2P_SLOWDOWN_MAX``; () where there is none.

    Example: pp = 2, vpp = 3 → 10 operations per rank, 1 + 0.012 · 10 / √3 ≈ 1.069 on
    every stage (the plain count would say 1.12); pp = 2, vpp = 12 → 46 operations,
    1 + 0.012 · 46 / √12 ≈ 1.159, capped at 1.083."""
    if not torch_pipelined(job, layout.pp):
        return ()
    ops = p2p_ops_per_microbatch(layout.pp, layout.vpp)
    per_op = TORCH_P2P_SLOWDOWN_PER_OP / math.sqrt(layout.vpp)
    return tuple(1.0 + min(TORCH_P2P_SLOWDOWN_MAX, per_op * ops[c % layout.pp])
                 for c in range(layout.pp * layout.vpp))


def split_backward_rule(job: Job, layout: Layout) -> bool:
    """Whether a zero-bubble stage's memory follows torch's split backward pass by pass:
    runtime "torch", zero-bubble, no full recomputation (whose W re-runs the forwards and
    is priced by the calibration's measured pending / transient sets instead).

    ``stage_backward_input`` (I) keeps the whole graph (``retain_graph=True``) and, for W,
    the output gradients of every node where a weight's gradient path meets the input's
    (:func:`meshplan.costmodel.memory.split_backward_kept_grad_bytes`); the loss's graph
    (the fp32 softmax the cross-entropy saved) goes only when I returns. So a rank r > 0
    peaks at the end of an I: its in-flight micro-batches' activations, the kept gradients
    of its pending micro-batches and of the one whose I just ran, and a layer's backward
    working memory; the last rank adds what the loss forward kept and the 16-bit logits'
    gradient of each of those micro-batches, or, where that is larger, the output layer's
    own working memory at the start of an I (:meth:`LayerTables.output_split_extra_bytes`).
    Rank 0's I has no input gradient to compute (token ids): its peak is in a W, as before.

    Round 25, from round 24's memory walk of holdout9 r08 (GPT pp 2 tp 2 SP, mb 4; last
    stage 19.56 GiB measured, 18.14 predicted with one activation set per pending
    micro-batch instead, 19.45 with this rule) and checked post hoc on every earlier
    measured zero-bubble layout without full recomputation (27 last stages, 8 middle
    ranks): the last stages' mean absolute error went from 2.3 to 1.4 % (the 10 since
    holdout16: 1.2 to 0.7 %, max 2.5 to 1.5 %), the 8 middle ranks' (four pp 4 layouts)
    from 4.9 to 1.8 %. Held out in round 25: pair16's y05 and y13 last stages (−0.2 /
    −1.0 %); a walk of holdout23 f14 (Llama pp 2 tp 2) matched it pass by pass."""
    return (job.runtime == "torch" and layout.schedule == "zero-bubble" and layout.pp > 1
            and layout.vpp == 1 and layout.recompute != "full")


def _wgrad_bytes(model: ModelSpec, job: Job, layout: Layout, full_act_bytes: float,
                 measured: Interpolated | None = None, stage_layers: float = 0.0
                 ) -> dict[str, float]:
    """Per layer: what a pending zero-bubble W keeps (``wgrad_pending_bytes``) and the
    transient of running one (``wgrad_transient_bytes``). With full recomputation these
    depend on the block (one recomputation per parameter group): the profile's measured
    pair where the calibration has one (``measured``, :mod:`meshplan.calibrate.split_memory`;
    at the mean stage depth ``stage_layers``, :func:`measured.wgrad_bytes_at`), else
    ZB_FULL_PENDING_SETS and ZB_FULL_W_TRANSIENT_SETS sets, read off Llama stages. Without
    it (:func:`split_backward_rule`) the kept output gradients, and the logits' gradient
    (``split_backward``, ``logits_grad_bytes``). ``full_act_bytes`` = 0: no pending W on any
    rank (nothing is added)."""
    if full_act_bytes > 0 and layout.recompute == "full":
        if measured is not None:
            pending, transient = wgrad_bytes_at(measured, stage_layers)
            return {"wgrad_pending_bytes": pending, "wgrad_transient_bytes": transient}
        return {"wgrad_pending_bytes": ZB_FULL_PENDING_SETS * full_act_bytes,
                "wgrad_transient_bytes": ZB_FULL_W_TRANSIENT_SETS * full_act_bytes}
    # zero_bubble_pending_w counts a pending W only under runtime "torch", zero-bubble and
    # vpp 1, which without full recomputation is split_backward_rule: no third case
    if full_act_bytes > 0 and split_backward_rule(job, layout):
        kept = split_backward_kept_grad_bytes(
            model, job, layout.micro_batch, layout.tp, layout.sequence_parallel,
            fp32_norm_output=job.precision != "fp32" and layout.zero < 2)
        return {"wgrad_pending_bytes": kept, "wgrad_transient_bytes": 0.0,
                "split_backward": True,
                "logits_grad_bytes": logits_chunk_bytes(job, layout, model)}
    return {"wgrad_pending_bytes": 0.0, "wgrad_transient_bytes": 0.0}


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



@dataclass(frozen=True)
class LayerParts:
    """Per-micro-batch pieces shared by every layout with the same (tp, micro-batch, sp,
    recompute) and process-group links: one layer, embedding, logits, activations, p2p."""

    layer: LayerCost
    embedding: tuple       # (forward PassCost, backward PassCost)
    logits: tuple          # (forward PassCost, backward PassCost, wgrad seconds)
    activation_bytes: float     # kept by one layer for one micro-batch (this recompute mode)
    backward_buf_bytes: float   # working memory of one layer's backward beyond that
    embedding_act_bytes: float  # kept per micro-batch by the embedding (first stage)
    logits_bytes: float         # kept per micro-batch by the output layer (last stage)
    output_peak_bytes: float    # working memory of the output layer beyond that
    p2p_bytes: float       # activation sent between pipeline stages
    p2p_s: float
    measured: tuple[str, ...] = ()   # parts taken from the profile's measured tables
    split_backward: tuple[float, float] | None = None  # measured zero-bubble B, W of a layer
    # measured CPU dispatch seconds (layer f, b, embedding f, b, output f, b); None: unknown
    cpu: tuple[float, ...] | None = None
    full_act_bytes: float = 0.0   # one layer's activations without recomputation
    split_depth: tuple[float, float, float] | None = None  # split_backward's growth with depth
    split_cpu: tuple[float, float] | None = None  # its B, W CPU dispatch (then B, W: GPU-busy)
    # CPU dispatch of one forward / backward call not growing with its layers (cpu's layer
    # values are then the per-layer rest)
    cpu_fixed: tuple[float, float] = (0.0, 0.0)
    # zero-bubble with full recomputation: the measured row holding the (pending,
    # W transient) bytes per layer (measured.wgrad_bytes_at gives them at a stage's depth)
    wgrad_measured: Interpolated | None = None


@lru_cache(maxsize=8192)
def layer_parts(model: ModelSpec, cluster: Cluster, job: Job, micro_batch: int, tp: int,
                sequence_parallel: bool, recompute: str, tp_link, pp_link) -> LayerParts:
    """Analytical pieces (compute.py, memory.py), replaced by the profile's measured layer
    and ends where it has them (:mod:`meshplan.costmodel.measured`): the measured time is
    split over the analytical categories in their proportions, so breakdowns stay readable."""
    mb, sp = micro_batch, sequence_parallel
    layer = layer_cost(model, cluster, job, micro_batch=mb, tp=tp, sequence_parallel=sp,
                       recompute=recompute, tp_link=tp_link)
    emb = embedding_cost(model, cluster, job, micro_batch=mb, tp=tp, sequence_parallel=sp,
                         tp_link=tp_link)
    logit = logits_cost(model, cluster, job, micro_batch=mb, tp=tp, sequence_parallel=sp,
                        tp_link=tp_link)
    acts = layer_activations(model, job, mb, tp, sp)
    e = activation_bytes_per_element(job)
    act_b = acts.stored(recompute)
    bwd_buf = acts.full_bytes if recompute != "none" else 0.0
    emb_act = job.seq_len * mb * model.hidden_size * e / (tp if sp else 1)
    logit_b, out_peak = logits_bytes(model, job, mb, tp), 0.0
    measured: list[str] = []
    split = split_depth = split_cpu = wgrad = None
    cpu, cpu_fixed = None, (0.0, 0.0)
    full_act = acts.full_bytes
    tables = cluster.gpu.measured
    if tables:
        kw = dict(seq_len=job.seq_len, tp=tp, sequence_parallel=sp, micro_batch=mb)
        ml = tables.layer(model, recompute=recompute, **kw)
        if ml is not None:
            layer = _scaled_layer(layer, ml.forward_s, ml.backward_s)
            act_b, bwd_buf = ml.activation_bytes, ml.peak_bytes
            split, split_depth, split_cpu = ml.split_backward, ml.split_depth, ml.split_cpu
            if recompute == "full" and ml.wgrad_transient_bytes > 0:
                wgrad = ml
            measured.append("layer")
        me = tables.end(model, "embedding", **kw)
        if me is not None:
            emb = (_scaled(emb[0], me.forward_s), _scaled(emb[1], me.backward_s))
            emb_act = me.activation_bytes
            measured.append("embedding")
        mo = tables.end(model, "output", **kw)
        if mo is not None:
            kb = _ratio(mo.backward_s, logit[1].total_s)
            logit = (_scaled(logit[0], mo.forward_s), logit[1].scaled(kb), logit[2] * kb)
            logit_b, out_peak = mo.activation_bytes, mo.peak_bytes
            measured.append("output")
        plain = ml if recompute == "none" else tables.layer(model, recompute="none", **kw)
        if plain is not None:
            full_act = plain.activation_bytes
        if ml is not None and me is not None and mo is not None and all(
                r.cpu_measured for r in (ml, me, mo)):
            cpu = (ml.forward_cpu_s, ml.backward_cpu_s, me.forward_cpu_s, me.backward_cpu_s,
                   mo.forward_cpu_s, mo.backward_cpu_s)
            cpu_fixed = (ml.forward_cpu_fixed_s, ml.backward_cpu_fixed_s)
    # Activation sent between stages; scatter/gather over tp (Narayanan et al. 2021 §4.1).
    msg = job.seq_len * mb * model.hidden_size * e / tp
    return LayerParts(layer, emb, logit, act_b, bwd_buf, emb_act, logit_b, out_peak, msg,
                      comm.p2p_s(pp_link, msg), tuple(measured), split, cpu, full_act,
                      split_depth=split_depth, split_cpu=split_cpu, cpu_fixed=cpu_fixed,
                      wgrad_measured=wgrad)


def _ratio(measured_s: float, analytical_s: float) -> float:
    return measured_s / analytical_s if analytical_s > 0 else 0.0


def _scaled(p: PassCost, measured_s: float) -> PassCost:
    """``p`` rescaled to total ``measured_s`` (all of it overhead if ``p`` is empty)."""
    if p.total_s <= 0:
        return PassCost(overhead_s=measured_s)
    return p.scaled(measured_s / p.total_s)


def _scaled_layer(an: LayerCost, forward_s: float, backward_s: float) -> LayerCost:
    kb = _ratio(backward_s, an.backward.total_s)
    return LayerCost(_scaled(an.forward, forward_s), _scaled(an.backward, backward_s),
                     an.recompute.scaled(kb), an.wgrad_s * kb, an.tp_wire_bytes)


@dataclass(frozen=True)
class Zero3Layer:
    """ZeRO-3 per layer and micro-batch: exposed gather time and bytes sent."""

    forward_s: float = 0.0    # exposed in forward
    backward_s: float = 0.0   # exposed in backward
    wire_bytes: float = 0.0
    total_s: float = 0.0      # all of it: two all-gathers and one reduce-scatter


def zero3_layer(layer, layer_params: float, dp_link, dp: int, zero: int, job: Job,
                pp: int = 1, interference: float = DEFAULT_OVERLAP_INTERFERENCE) -> Zero3Layer:
    """Parameters gathered per layer per micro-batch (forward and backward), gradients
    reduce-scattered; FSDP prefetches the next layer's gather behind this layer's compute
    (Zhao et al. 2023, arXiv 2304.11277 §3.3), so only what compute cannot cover is exposed.

    Runtime "torch" (FSDP2 with bf16 compute and fp32 reduction): 16-bit weights are
    gathered and fp32 gradients reduce-scattered; its ZeRO-2 gathers once per micro-batch
    (kept from forward to backward) instead of twice.
    """
    if not fsdp_per_microbatch(job, zero, pp) or dp == 1:
        return Zero3Layer()
    per = state_bytes_per_param(job)
    gather_b = layer_params * (compute_weight_bytes_per_param(job) or per.weights)
    reduce_b = layer_params * per.grads
    ag = comm.all_gather_s(dp_link, gather_b)
    rs = comm.reduce_scatter_s(dp_link, reduce_b)
    gathers = 2 if zero == 3 else 1
    f, b = layer.forward.total_s, layer.backward.total_s
    bwd = (ag if zero == 3 else 0.0) + rs
    k = interference
    return Zero3Layer(_exposed(ag, f, k), _exposed(bwd, b, k),
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


@lru_cache(maxsize=65536)
def rank_state(model: ModelSpec, cluster: Cluster, job: Job, dp: int, pp: int, tp: int,
               zero: int, num_microbatches: int, dp_link, layers: int, first: bool, last: bool,
               z3: Zero3Layer, grad_copies: int = 1) -> RankState:
    """Model states, data-parallel communication and optimizer time of one pipeline rank.

    ZeRO-0 all-reduces gradients; ZeRO-1/2 reduce-scatter gradients and all-gather updated
    parameters (the same volume, Rajbhandari et al. 2019 §7); ZeRO-3's per-layer traffic is
    inside the stage times and counted here for the totals. The optimizer step is
    memory-bound (fused Adam reads and writes master weights, m, v and gradients), at the
    calibrated optimizer bandwidth when the profile has one.

    Runtime "torch": ZeRO-1 is DDP's all-reduce of the fp32 gradients followed by
    ``ZeroRedundancyOptimizer``'s broadcast of each rank's updated fp32 shard (an
    all-gather's volume); ZeRO-2 is FSDP2, per layer like ZeRO-3. ``grad_copies``: fp32
    gradient copies (:func:`ddp_accumulates`).
    """
    m = num_microbatches
    per = state_bytes_per_param(job)
    params = stage_params(model, layers, tp, first=first, last=last, pp=pp)
    w, g, o = state_bytes_at_peak(params, job, zero, dp, pp)
    g *= grad_copies
    w += compute_copy_bytes(model, job, zero, dp, tp, pp, layers, first=first, last=last)
    grad_bytes = params * per.grads
    dp_s = red = gat = wire = bucket = copy = 0.0
    torch_rt = job.runtime == "torch"
    if dp > 1:
        if zero == 0 or (zero == 1 and torch_rt):
            dp_s = red = comm.all_reduce_s(dp_link, grad_bytes)
            wire = comm.wire_bytes_all_reduce(dp, grad_bytes)
            if zero == 1:
                gat = comm.all_gather_s(dp_link, params * per.weights)
                dp_s += gat
                wire += comm.wire_bytes_gather(dp, params * per.weights)
            if torch_pipelined(job, pp):
                copy = hbm_s(cluster.gpu, GRAD_FLATTEN_PASSES * grad_bytes)
        elif zero in (1, 2) and not fsdp_per_microbatch(job, zero, pp):
            # runtime "torch" (FSDP2 ZeRO-2 under a pipeline): the 16-bit compute weights
            # are gathered, the fp32 gradients reduce-scattered, once per step
            gather_bpp = (compute_weight_bytes_per_param(job) or per.weights) if torch_rt \
                else per.weights
            red = comm.reduce_scatter_s(dp_link, grad_bytes)
            gat = comm.all_gather_s(dp_link, params * gather_bpp)
            dp_s = red + gat
            wire = comm.wire_bytes_gather(dp, grad_bytes) + comm.wire_bytes_gather(
                dp, params * gather_bpp)
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
    ``interference``: the profile's ``overlap_interference`` (see :func:`_exposed`).
    """
    if fsdp_per_microbatch(job, layout.zero, layout.pp) or layout.dp == 1:
        return 0.0
    if torch_pipelined(job, layout.pp):
        return st.dp_total_s + st.grad_copy_s
    if not job.overlap_dp_comm:
        return st.dp_total_s
    k = interference
    if job.runtime == "torch":
        return max(st.last_bucket_s, _exposed(st.grad_reduce_s, backward_s, k)) \
            + st.param_gather_s
    reduce = max(st.last_bucket_s, _exposed(st.grad_reduce_s, backward_s, k))
    return reduce + _exposed(st.param_gather_s, forward_s, k)


def _exposed(comm_s: float, compute_s: float, interference: float) -> float:
    """Time communication overlapped with ``compute_s`` adds to the critical path: what does
    not fit behind the compute, plus ``interference`` (the GPU profile's
    ``overlap_interference``: NCCL kernels slow the GEMMs they overlap) of what does."""
    hidden = min(comm_s, compute_s)
    return comm_s - hidden + interference * hidden


def _estimate(model: ModelSpec, cluster: Cluster, job: Job, layout: Layout,
              stage_layers: tuple[int, ...]) -> Estimate:
    t = layer_tables(model, cluster, job, layout, checked=True)
    gpu = cluster.gpu
    pp, v = layout.pp, layout.vpp
    m, last_rank = t.num_microbatches, t.last_rank
    parts, z3 = t.parts, t.zero3
    layer = parts.layer
    (emb_f, emb_b), (log_f, log_b, _) = parts.embedding, parts.logits

    f_s, b_s, w_s = t.stage_times(stage_layers)
    pipe_s, pipe_no_p2p = _pipeline_time(layout.schedule, tuple(f_s), tuple(b_s), tuple(w_s),
                                         m, pp, v, t.p2p_s)
    pipe_s, pipe_no_p2p = pipe_s + t.fsdp_step_s, pipe_no_p2p + t.fsdp_step_s
    # torch's p2p order (torch_p2p) can hold the step longer than the slowed closed form;
    # then its waits are the bubble and the compute runs unslowed
    order_s = t.p2p_order_s(f_s, b_s)
    order_bound = order_s > pipe_s
    if order_bound:
        pipe_s, pipe_no_p2p = order_s, t.p2p_order_s(f_s, b_s, p2p=False)

    # ---- per pipeline rank. Ranks with the same (layers, first, last) share model-state and
    # data-parallel figures; only the in-flight activations differ.
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
    for r in range(pp):
        layers_r = layers_all[r]
        st = t.rank_state(r, layers_r)   # memoized per (layers, first, last)
        dp_total = max(dp_total, st.dp_total_s)
        dp_wire_worst = max(dp_wire_worst, st.dp_wire_bytes)
        sig = (layers_r, r == 0, r == last_rank, fwd_all[r], bwd_all[r])
        if sig not in seen:
            seen.add(sig)
            exposed = exposed_dp_s(st, layout, job, fwd_all[r], bwd_all[r],
                                   gpu.overlap_interference)
            if exposed + st.optimizer_s > worst_tail:
                worst_tail, dp_exposed_worst, opt_worst = exposed + st.optimizer_s, exposed, \
                    st.optimizer_s
        act_b, logit_b, buf = t.rank_variable_bytes(r, layers_r)
        rows.append((r, layers_r, st.weights_bytes, st.grads_bytes, st.optimizer_bytes, act_b,
                     logit_b, buf, t.inflight[r]))

    host_s = t.host_bound_s(stage_layers, (f_s, b_s, w_s))
    step = max(pipe_s, host_s) + worst_tail
    busy = m * busy_best

    # ---- breakdown on the busiest rank (component sums, computed once)
    layers_br = layers_all[br]
    # A measured FSDP2 row can be faster than the plain one (FSDP2 runs bf16 without
    # autocast's cast kernels): that part is memory-bound work saved, not a negative gather
    z3_pos = max(0.0, z3.forward_s) + max(0.0, z3.backward_s)
    z3_neg = min(0.0, z3.forward_s) + min(0.0, z3.backward_s)
    tot = (layer.forward + layer.backward).scaled(layers_br) + PassCost(
        overhead_s=2 * v * t.overhead_s, zero3_s=layers_br * z3_pos,
        memory_bound_s=layers_br * z3_neg)
    if br == 0:
        tot = tot + emb_f + emb_b
    if br == last_rank:
        tot = tot + log_f + log_b
    # the busiest rank's p2p slowdown (stage_slowdown) is a line of its own; what else its
    # stage times hold beyond these parts (zero-bubble's split backward costing more than
    # the fused one) stretches each part in proportion, so the breakdown adds up to the step
    k_br = t.slowdown[br] if t.slowdown else 1.0
    whole = tot.total_s
    tot = tot.scaled(m * (busy_best / k_br / whole if whole > 0 else 1.0))
    if order_bound:
        busy, k_br = busy / k_br, 1.0
    time = TimeBreakdown(
        gemm_s=tot.gemm_s, attention_s=tot.attention_s, memory_bound_s=tot.memory_bound_s,
        overhead_s=tot.overhead_s, tp_comm_s=tot.tp_comm_s,
        pp_comm_s=pipe_s - pipe_no_p2p,
        bubble_s=max(0.0, pipe_no_p2p - t.fsdp_step_s - busy), fsdp_step_s=t.fsdp_step_s,
        dp_comm_exposed_s=dp_exposed_worst, dp_comm_total_s=dp_total,
        zero3_gather_s=tot.zero3_s, optimizer_s=opt_worst, host_wait_s=max(0.0, host_s - pipe_s),
        pp_interference_s=busy - busy / k_br)

    # ---- communication volume per GPU per step (busiest rank)
    links = t.links
    z3_wire = m * layers_br * z3.wire_bytes
    comm_bytes = {"tp": m * layers_br * layer.tp_wire_bytes,
                  "pp": m * v * 2 * parts.p2p_bytes if pp > 1 else 0.0,
                  "dp": dp_wire_worst if layout.zero < 3 else 0.0, "zero3": z3_wire}
    by_link = {"nvlink": 0.0, "network": 0.0}
    for k, link in (("tp", links.tp), ("pp", links.pp), ("dp", links.dp), ("zero3", links.dp)):
        by_link[link.link_class] += comm_bytes[k]

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
        memory=StageMemories(rows), time=time, comm_bytes=comm_bytes,
        comm_bytes_by_link=by_link, num_microbatches=m, num_gpus=n_gpus,
        stage_forward_s=tuple(f_s), stage_backward_s=tuple(b_s), stage_wgrad_s=tuple(w_s),
        p2p_s=t.p2p_s, pipeline_s=pipe_s,
        model_flops_per_step=model_flops, hardware_flops_per_step=hw_flops,
        host_dispatch_s=host_s,
        caveats=t.caveats + _host_caveats(time.host_wait_s, step, host_s, pipe_s)
        + ((P2P_ORDER_CAVEAT,) if order_bound else ()))


def _host_caveats(host_wait_s: float, step_s: float, host_s: float, pipe_s: float
                  ) -> tuple[str, ...]:
    if is_host_bound(host_wait_s, step_s):
        return (host_bound_caveat(host_wait_s, step_s),)
    if pipe_s > 0 and host_s >= HOST_NEAR_LOAD * pipe_s:
        return (near_host_bound_caveat(host_s / pipe_s),)
    return ()


@lru_cache(maxsize=65536)
def _pipeline_time(schedule: str, f_s: tuple, b_s: tuple, w_s: tuple, m: int, pp: int, v: int,
                   p2p: float) -> tuple[float, float]:
    """Pipeline time with and without point-to-point transfers (cached: ZeRO 0-2 layouts
    of the same shape share it)."""
    with_p2p = closed_form_unchecked(schedule, f_s, b_s, w_s, m, pp, v, p2p)
    without = closed_form_unchecked(schedule, f_s, b_s, w_s, m, pp, v, 0.0) if p2p else with_p2p
    return with_p2p, without


@lru_cache(maxsize=4096)
def _inflight_table(schedule: str, pp: int, v: int, m: int) -> tuple[float, ...]:
    return tuple(inflight_microbatches(schedule, pp, v, m, r) for r in range(pp))


@dataclass(frozen=True, eq=False)
class LayerTables:
    """A layout's costs as functions of the layers each (virtual) stage holds.

    Virtual stage c (chunk c lives on rank c % pp) holding n_c layers runs, per micro-batch,
    forward f_c = n_c·layer_forward_s + overhead_s + [c = 0]·first_forward_s
    + [c = last]·last_forward_s (backward and weight-gradient alike). Pipeline rank r holding
    N_r layers needs N_r·(layer_state_bytes + inflight[r]·layer_activation_bytes)
    + const_bytes[r] of memory. :func:`estimate` is built from exactly these pieces, and the
    planner's CP-SAT model uses them to choose the stage partition.
    """

    model: ModelSpec
    cluster: Cluster
    job: Job
    layout: Layout
    links: Groups
    parts: LayerParts
    zero3: Zero3Layer
    num_layers: int
    num_microbatches: int
    last_rank: int
    layer_forward_s: float
    layer_backward_s: float
    layer_wgrad_s: float
    first_forward_s: float
    first_backward_s: float
    last_forward_s: float
    last_backward_s: float
    last_wgrad_s: float
    overhead_s: float              # per virtual stage, added to its forward and its backward
    p2p_s: float
    # CPU dispatch per micro-batch (measured profiles): a layer's forward + backward, the
    # embedding's, the output's, and the pipeline schedule's cost per action
    cpu_layer_s: float
    cpu_call_s: float             # per chunk and micro-batch, whatever its layers
    cpu_first_s: float
    cpu_last_s: float
    cpu_action_s: float
    cpu_known: bool
    layer_state_bytes: float       # weights + grads + optimizer of one layer, after ZeRO
    layer_activation_bytes: float  # stored activations of one layer, one micro-batch
    inflight: tuple[float, ...]    # per pipeline rank
    buffer_bytes: float            # buffers of a rank holding at least one layer
    first_extra_bytes: float       # embedding states + embedding activations (rank 0)
    last_extra_bytes: float        # output layer states + logits (last rank)
    embedding_act_bytes: float     # one micro-batch's embedding output (rank 0)
    logits_bytes: float            # logits held on the last rank (all in-flight ones for GPipe)
    recompute_buf_bytes: float     # working memory of a layer's backward (re-materialized layer)
    output_peak_bytes: float = 0.0  # the output layer's working memory (part of logits_bytes)
    grad_copies: int = 1            # + 1 where ddp_accumulates
    # zero-bubble: a layer's weight-pass CPU dispatch (part of cpu_layer_s; 0: not timed apart)
    cpu_wgrad_layer_s: float = 0.0
    recv_buffers: tuple[float, ...] = ()   # per rank: receive buffers + kept stage outputs
    wgrad_pending: tuple[float, ...] = ()  # per rank: zero-bubble_pending_w
    wgrad_pending_bytes: float = 0.0       # per layer and pending micro-batch
    # split_backward_rule applies (zero-bubble without full recomputation, runtime "torch"),
    # and then the 16-bit logits' gradient the last rank keeps for its output layer's W
    split_backward: bool = False
    logits_grad_bytes: float = 0.0
    wgrad_transient_bytes: float = 0.0     # per layer, while a deferred W runs (ranks r > 0)
    last_chunks_bytes: float = 0.0  # last stage: every micro-batch's output kept (runtime torch)
    last_merge_bytes: float = 0.0   # ... and concatenated at the end of the step
    last_states_bytes: float = 0.0  # last rank's non-layer model states (for the end-of-step peak)
    # ... and at that peak (see end_of_step_bytes): the receive buffers, which torch keeps for
    # the whole run, and the autocast weight copies already gone (full recompute)
    end_recv_bytes: float = 0.0
    end_uncached_layer_bytes: float = 0.0
    end_uncached_const_bytes: float = 0.0
    # GPipe or 1F1B, full recomputation under autocast (see cast_cache_relief_bytes): one
    # layer's 16-bit weight copies, the last rank's output-layer copies, and what a layer's
    # recompute allocates beyond its saved input; 0 where that does not apply
    cache_layer_copy_bytes: float = 0.0
    cache_last_copy_bytes: float = 0.0
    cache_cleared_ranks: tuple[bool, ...] = ()  # per rank: every forward before any backward
    recomputed_layer_bytes: float = 0.0
    # runtime "torch": a chunk's gradients are None until its first backward of the step
    # (see first_backward_relief_bytes); gradient bytes per layer, of the first rank's and
    # the last rank's non-layer parameters, and per rank the schedule's memory events
    # (first_backward.backward_events); 0 / () where that does not apply
    relief_layer_grad_bytes: float = 0.0
    relief_first_grad_bytes: float = 0.0
    relief_last_grad_bytes: float = 0.0
    relief_events: tuple = ()
    # ZeRO-3 under torch's pipeline: a layer's gathered 16-bit weights, which stay
    # from its backward to its next forward (see z3_resident_bytes); 0 where that does not apply
    z3_resident_layer_bytes: float = 0.0
    # per virtual stage: compute slowed by the rank's p2p kernels (stage_slowdown); () = none
    slowdown: tuple[float, ...] = ()
    # GPU time a step beyond the passes (FSDP2_DP_ONLY_STEP_S where fsdp_dp_only), on the
    # GPU's side of the pipeline-or-CPU maximum
    fsdp_step_s: float = 0.0
    caveats: tuple[str, ...] = ()   # Estimate.caveats

    def __post_init__(self) -> None:
        # memo of rank_state by (layers, first, last): the planner prices many partitions
        object.__setattr__(self, "_states", {})
        object.__setattr__(self, "_relief", {})

    @property
    def const_bytes(self) -> tuple[float, ...]:
        """Per rank: memory that does not grow with its layer count."""
        return tuple(self.buffer_bytes + (self.first_extra_bytes if r == 0 else 0.0)
                     + (self.last_extra_bytes - self.logits_bytes + self._output_const_bytes
                        if r == self.last_rank else 0.0)
                     + (self.recv_buffers[r] if self.recv_buffers else 0.0)
                     for r in range(self.layout.pp))

    @property
    def _output_const_bytes(self) -> float:
        """The last rank's output-layer memory at its peak that does not grow with its layers
        (the rest: :meth:`output_split_extra_bytes`)."""
        if self.split_backward:     # zero-bubble: output_kept_bytes is one micro-batch's
            return (self.output_kept_bytes
                    + self._split_sets(self.last_rank) * self.logits_grad_bytes)
        return self.logits_bytes - self.output_overlap_bytes - self.output_kept_overlap_bytes

    def _split_sets(self, rank: int) -> float:
        """Micro-batches whose W-pass gradients ``rank`` holds at its peak: its pending
        ones, and under :func:`split_backward_rule` (ranks r > 0) the one whose I just ended."""
        pending = self.wgrad_pending[rank] if self.wgrad_pending else 0.0
        return pending + (1.0 if self.split_backward and rank > 0 else 0.0)

    def output_split_extra_bytes(self, layers: int) -> float:
        """Under :func:`split_backward_rule`, the last rank's peak is the larger of the end
        of an I pass (all its layers' kept gradients and the logits' gradient, counted in the
        activations and :attr:`_output_const_bytes`) and the start of one (the output
        layer's working memory, before any layer's gradient exists): this is the part of
        the second beyond the first, 0 when the layers' gradients outweigh it."""
        if not self.split_backward:
            return 0.0
        return max(0.0, self.output_peak_bytes - self.output_overlap_bytes
                   - layers * self.wgrad_pending_bytes - self.logits_grad_bytes)

    @property
    def output_overlap_bytes(self) -> float:
        """The output layer's working memory (loss forward and backward) and a layer's
        backward working memory never coexist — a rank runs one of them at a time, and the
        output's backward ends before its layers' begin — so the last rank holds the larger
        of the two, not their sum."""
        return min(self.output_peak_bytes, self.recompute_buf_bytes)

    @property
    def output_kept_bytes(self) -> float:
        """What the output layer keeps from one micro-batch's loss forward to its backward
        (``logits_bytes`` less the working memory; GPipe's counts every micro-batch's)."""
        kept = self.logits_bytes - self.output_peak_bytes
        if self.layout.schedule == "gpipe":
            kept /= max(self.inflight[self.last_rank], 1.0)
        return kept

    @property
    def output_kept_overlap_bytes(self) -> float:
        """What the output layer keeps for its backward never coexists with a layer's
        backward working memory either: a micro-batch's output backward (which frees what
        its loss forward kept) runs right before its layers' backward on the same rank (1F1B
        and interleaved run a last-chunk forward, its loss and its backward back to back;
        GPipe's other kept micro-batches stay, counted in ``logits_bytes``). So the last rank
        holds max(kept + output working memory, layer backward working memory), not the
        kept bytes on top of the larger; this is the part of ``recompute_buf_bytes`` beyond
        :attr:`output_overlap_bytes` that the kept bytes cover. It matters where a layer's
        backward needs more than the output layer (full recomputation with tp > 1, whose
        output working memory :func:`pipelined_output_peak_bytes` lowers).

        Round 24, post hoc from holdout24 g15 (Llama dp 1 pp 2 tp 2, interleaved v 3, full,
        mb 16): its last stage peaked in its last loss forward at 19.67 GiB
        (``diag_stage_memory``: 15.8 before, 1.9 kept after), predicted 20.83 (+5.9 %) with
        the kept 2.58 GiB on top of the 2.68 GiB recompute buffer; 20.11 (+2.2 %) without.
        Over every measured 4-GPU set it moves five last stages, all Llama pp 2 tp 2 full
        (GPipe q12 +3.2 → +3.0, a15 +2.1 → +0.9, e13 +0.8 → −0.6, o14 +2.5 → −0.2 %), and
        no other rank."""
        return max(0.0, min(self.output_kept_bytes,
                            self.recompute_buf_bytes - self.output_overlap_bytes))

    # ---- time ---------------------------------------------------------------------
    def stage_times(self, stage_layers) -> tuple[list[float], list[float], list[float]]:
        """Per-micro-batch forward, backward and weight-gradient seconds of each virtual stage."""
        f = [n * self.layer_forward_s + self.overhead_s for n in stage_layers]
        b = [n * self.layer_backward_s + self.overhead_s for n in stage_layers]
        w = [n * self.layer_wgrad_s for n in stage_layers]
        f[0] += self.first_forward_s
        b[0] += self.first_backward_s
        f[-1] += self.last_forward_s
        b[-1] += self.last_backward_s
        w[-1] += self.last_wgrad_s
        if self.slowdown:
            k = self.slowdown
            f = [x * y for x, y in zip(f, k)]
            b = [x * y for x, y in zip(b, k)]
            w = [x * y for x, y in zip(w, k)]
        return f, b, w

    def pipeline_s(self, stage_layers, *, torch_order: bool = True) -> float:
        """The pipeline's time for ``stage_layers``: the schedule's closed form, or where
        torch's p2p order holds it longer, that (:meth:`p2p_order_s`). ``torch_order=False``
        leaves the order out — a lower bound, cheap enough for the search's pruning."""
        f, b, w = self.stage_times(stage_layers)
        lay = self.layout
        closed = _pipeline_time(lay.schedule, tuple(f), tuple(b), tuple(w),
                                self.num_microbatches, lay.pp, lay.vpp, self.p2p_s)[0]
        closed += self.fsdp_step_s
        return max(closed, self.p2p_order_s(f, b)) if torch_order else closed

    def p2p_order_s(self, f_s, b_s, *, p2p: bool = True) -> float:
        """Interleaved 1F1B under torch's runtime: the step as torch orders its sends and
        receives on one NCCL stream per rank (:func:`meshplan.costmodel.torch_p2p.
        fifo_step_s`), with the compute unslowed — where the order holds the pipeline
        longer than the per-operation slowdown does, the p2p kernels wait while the GPU
        idles rather than overlap compute. 0.0 where it does not apply
        (:func:`meshplan.costmodel.torch_p2p.applies`). ``f_s``/``b_s``: stage times as
        :meth:`stage_times` returns them."""
        lay = self.layout
        if not torch_p2p.applies(self.job.runtime, lay.schedule, lay.pp, lay.vpp,
                                 self.num_microbatches):
            return 0.0
        k = self.slowdown or (1.0,) * len(f_s)
        return torch_p2p.fifo_step_s(tuple(x / y for x, y in zip(f_s, k)),
                                     tuple(x / y for x, y in zip(b_s, k)),
                                     self.num_microbatches, lay.pp, lay.vpp,
                                     self.p2p_s if p2p else 0.0)

    def rank_layers(self, stage_layers) -> list[int]:
        pp = self.layout.pp
        return [sum(stage_layers[r::pp]) for r in range(pp)]

    def rank_state(self, rank: int, layers: int) -> RankState:
        key = (layers, rank == 0, rank == self.last_rank)
        st = self._states.get(key)  # type: ignore[attr-defined]
        if st is None:
            lay = self.layout
            # Only these layout fields matter (m only through ZeRO-3's per-layer traffic), so
            # layouts differing in schedule, recompute or micro-batch share the result.
            st = self._states[key] = rank_state(  # type: ignore[attr-defined]
                self.model, self.cluster, self.job, lay.dp, lay.pp, lay.tp, lay.zero,
                self._fsdp_microbatches, self.links.dp, layers,
                key[1], key[2], self.zero3, self.grad_copies)
        return st

    def rank_pass_s(self, rank: int, layers: int) -> tuple[float, float]:
        """(forward, backward) seconds of one micro-batch through all of a rank's chunks."""
        v = self.layout.vpp
        f = layers * self.layer_forward_s + v * self.overhead_s
        b = layers * self.layer_backward_s + v * self.overhead_s
        if rank == 0:
            f, b = f + self.first_forward_s, b + self.first_backward_s
        if rank == self.last_rank:
            f, b = f + self.last_forward_s, b + self.last_backward_s
        if self.slowdown:   # every chunk of a rank runs as many p2p operations
            f, b = f * self.slowdown[rank], b * self.slowdown[rank]
        return f, b

    def rank_tail_s(self, rank: int, layers: int) -> float:
        """Exposed data-parallel communication + optimizer step of a rank holding ``layers``."""
        st = self.rank_state(rank, layers)
        f, b = self.rank_pass_s(rank, layers)
        return exposed_dp_s(st, self.layout, self.job, f, b,
                            self.cluster.gpu.overlap_interference) + st.optimizer_s

    def tail_lower_bound_s(self) -> float:
        """No partition's tail is smaller: some rank holds ⌈L/pp⌉ layers; a middle rank with
        that many, with unlimited room to overlap, pays at least this."""
        n = -(-self.num_layers // self.layout.pp)
        lay = self.layout
        st = rank_state(self.model, self.cluster, self.job, lay.dp, lay.pp, lay.tp, lay.zero,
                        self._fsdp_microbatches, self.links.dp, n,
                        False, False, self.zero3, self.grad_copies)
        return exposed_dp_s(st, self.layout, self.job, float("inf"), float("inf"),
                            self.cluster.gpu.overlap_interference) + st.optimizer_s

    @property
    def _fsdp_microbatches(self) -> int:
        """rank_state's micro-batch count: only per-micro-batch FSDP traffic depends on it,
        so other layouts share one memoized result."""
        lay = self.layout
        return self.num_microbatches if fsdp_per_microbatch(self.job, lay.zero, lay.pp) else 0

    def rank_cpu_s(self, rank: int, layers: int) -> float:
        """CPU seconds to dispatch a rank's share of one step's forward and backward (and,
        zero-bubble, weight-gradient) actions: per micro-batch, its layers' per-layer part,
        each chunk's per-call part (measured on two stack depths, else 0) and the
        schedule's per-action cost."""
        lay = self.layout
        actions = 3 if lay.schedule == "zero-bubble" else 2
        per_mb = (layers * self.cpu_layer_s + lay.vpp * self.cpu_call_s
                  + actions * lay.vpp * self.cpu_action_s)
        if rank == 0:
            per_mb += self.cpu_first_s
        if rank == self.last_rank:
            per_mb += self.cpu_last_s
        return self.num_microbatches * per_mb

    def host_bound_s(self, stage_layers, times: tuple | None = None) -> float:
        """When the CPU, not the GPU, sets the pace (0 without measured CPU times).

        The CPU runs ahead of its GPU (kernel launches and NCCL waits do not block it), so a
        rank's GPU finishes about when its CPU has dispatched everything — except that the
        last micro-batch's backward still has to travel from the last stage to rank r:
        rank r ends no earlier than its CPU total plus the backward (input-gradient) time
        and p2p of every stage before it on that path. With ``v`` chunks per rank only the
        first chunk's path is counted (an approximation). Zero-bubble: the path is the input-
        gradient passes, the weight passes a rank dispatches after its last B are not on it
        (round 10 of docs/benchmarks/accuracy.md; post hoc). ``times``:
        :meth:`stage_times` of ``stage_layers`` where the caller has them already."""
        if not self.cpu_known:
            return 0.0
        _, b, w = times or self.stage_times(stage_layers)
        zb = self.layout.schedule == "zero-bubble"
        out, path = 0.0, 0.0
        for r, n in enumerate(self.rank_layers(stage_layers)):
            cpu = self.rank_cpu_s(r, n)
            # zero-bubble rank r dispatches r + 1 deferred weight passes after its last
            # input-gradient pass (pipeline_sim.rank_order): the last micro-batch's B
            # travels on while they are dispatched, so they do not lengthen that path,
            # which ends with rank 0's own last weight pass
            trail = (r + 1) * n * self.cpu_wgrad_layer_s if zb and self.layout.vpp == 1 else 0.0
            end = w[0] if zb and r > 0 else 0.0
            out = max(out, cpu, cpu - min(trail, cpu) + path + end)
            path += (b[r] - w[r] if zb else b[r]) + self.p2p_s
        return out

    def step_time_s(self, stage_layers) -> float:
        return max(self.pipeline_s(stage_layers), self.host_bound_s(stage_layers)) + max(
            self.rank_tail_s(r, n) for r, n in enumerate(self.rank_layers(stage_layers)))

    # ---- memory -------------------------------------------------------------------
    def first_backward_relief_bytes(self, rank: int, layers: int) -> float:
        """Bytes of a rank's gradients and activations that never coexist, because a
        chunk's gradients appear only in its first backward of the step.

        The executor sets gradients to None at each step's start (``zero_grad(set_to_none=
        True)``; pipelined layouts average them after the schedule, without DDP's persistent
        buckets). Walking the rank's operations in the schedule's order
        (:mod:`meshplan.costmodel.first_backward`) gives its true peak; this is how far that
        lies below "most activations in flight + all gradients", which the other terms
        count. The rank's layers are split evenly over its chunks; rank 0's embedding and
        the last rank's output layer go with the chunk that holds them (its first / last).

        GPipe, and 1F1B on a rank whose warm-up covers all m micro-batches, give
        ``min(G, A1)`` (G: the rank's gradients, A1: one micro-batch's activations; on the
        last rank A1 includes the logits the output layer kept, its backward runs first),
        elsewhere 0 under 1F1B. (Until round 8 the logits share was left out; every Llama
        GPipe last stage measured then was over-predicted by 5-9 %. 1F1B: pair14 p05,
        round 14, rank 0 of pp 2 with m = 2 at +5.4 %, its trace peaking at the first
        backward with no gradient allocated.) Interleaved: a chunk whose first backward
        comes after others freed activations adds its gradients on a lower level (round
        15, post hoc: holdout13 v09's ranks 0-2, pp 4, v 2, m 4, measured 1.3, 1.3 and
        1.0 GiB under the prediction without this)."""
        if not self.relief_events or not self.relief_events[rank]:
            return 0.0
        key = (rank, layers)
        out = self._relief.get(key)  # type: ignore[attr-defined]
        if out is None:
            v = self.layout.vpp if self.layout.schedule == "interleaved-1f1b" else 1
            act = [layers / v * self.layer_activation_bytes] * v
            grads = [layers / v * self.relief_layer_grad_bytes] * v
            if rank == 0:
                act[0] += self.embedding_act_bytes
                grads[0] += self.relief_first_grad_bytes
            if rank == self.last_rank:
                # one micro-batch's kept logits (GPipe keeps every micro-batch's)
                act[-1] += self.output_kept_bytes
                grads[-1] += self.relief_last_grad_bytes
            out = self._relief[key] = first_backward.relief_bytes(  # type: ignore[attr-defined]
                self.relief_events[rank], act, grads)
        return out

    def z3_resident_bytes(self, rank: int, layers: int) -> float:
        """ZeRO-3 under torch.distributed.pipelining (GPipe, 1F1B, interleaved; zero-bubble
        under ZeRO-3 is refused, :data:`meshplan.spec.validate.ZB_ZERO3_UNSUPPORTED`): the
        stage turns FSDP2's resharding after backward off for every micro-batch but the
        last (``set_reshard_after_backward(False)``), so a layer's gathered 16-bit weights
        stay from its backward until its next forward reshards them. Right after a
        backward the rank holds all its layers' weights W and one micro-batch's
        activations A1 less; the next forward gives the activations back as it reshards
        the weights layer by layer. The peak gains max(0, W − A1) over the two gathered
        layers the buffers already count. Read from torch's source (2.13).

        Where two backwards follow each other (GPipe; 1F1B's cool-down) the second starts
        with W resident and every gradient allocated, so the peak is W − A1 above "most
        activations in flight + all gradients" — and W − A1 + R above the counted peak when
        the first-backward relief R (:meth:`first_backward_relief_bytes`) lowered that.
        Until round 23 GPipe was left out (its backwards were thought to reshard);
        ``ScheduleGPipe`` passes ``last_backward`` like the others. holdout23 f12 (Llama dp
        2 pp 2 GPipe, full, ZeRO-3, mb 16, post hoc) measured its first stage at 15.66 GiB,
        the same as its ZeRO-2 twins d10 and o12: 14.37 predicted without the term (−8.2 %),
        15.54 with it (−0.8 %). No other measured layout's prediction changes.

        The last rank peaks in its output layer's backward, before its layers' backward
        gathers them: there the weights coexist only with what remains once the output's
        working memory (``output_peak_bytes`` beyond the part shared with a layer's
        backward, :attr:`output_overlap_bytes`) is freed. Measured in round 15 (holdout13,
        post hoc for the last rank): v13's rank 0 (Llama, pp 2, mb 4) 11.19 GiB against
        10.85 predicted with this term (10.05 without), its last rank 15.31 against 16.38
        with the full term and 15.59 with this rule (15.83 in all: with the end-of-step
        receive buffers, :meth:`end_of_step_bytes`, the merge now sets that rank's peak)."""
        if not self.z3_resident_layer_bytes or layers <= 2:
            return 0.0
        extra = max(0.0, (layers - 2) * self.z3_resident_layer_bytes
                    - self._one_microbatch_act_bytes(rank, layers)
                    + self.first_backward_relief_bytes(rank, layers))
        if rank == self.last_rank:
            extra = max(0.0, extra - (self.output_peak_bytes - self.output_overlap_bytes))
        return extra

    def _one_microbatch_act_bytes(self, rank: int, layers: int) -> float:
        """One micro-batch's activations on ``rank``'s layers (and the embedding's on rank
        0): what its backward frees."""
        return layers * self.layer_activation_bytes + (self.embedding_act_bytes
                                                       if rank == 0 else 0.0)

    def rank_variable_bytes(self, rank: int, layers: int) -> tuple[float, float, float]:
        """(activations, embedding/logits, buffers) of a rank holding ``layers``; the
        activations are those coexisting with the gradients at the rank's peak
        (:meth:`first_backward_relief_bytes`)."""
        inflight = self.inflight[rank]
        act = layers * self._layer_act_bytes(rank)
        if rank == 0:
            act += inflight * self.embedding_act_bytes
        act -= self.first_backward_relief_bytes(rank, layers)
        logit = (self._output_const_bytes + self.last_chunks_bytes
                 + self.output_split_extra_bytes(layers)
                 if rank == self.last_rank else 0.0)
        buf = (self.buffer_bytes - (0.0 if layers else self.recompute_buf_bytes)
               + self.z3_resident_bytes(rank, layers)
               - self.cast_cache_relief_bytes(rank, layers))
        if self.recv_buffers:
            buf += self.recv_buffers[rank]
        end = self.end_of_step_bytes(layers) if rank == self.last_rank else 0.0
        if end > act + logit + buf:
            # the end-of-step concatenation of the kept outputs is this rank's peak: count it
            # as the output part so that states + act + logit + buf is still the peak
            logit = end - act - buf
        return act, logit, buf

    def end_of_step_bytes(self, layers: int) -> float:
        """The last rank's memory beyond its model states when torch concatenates the kept
        stage outputs at the end of the step (``last_merge_bytes``; 0 where that does not
        apply). Then the rank holds no activations but still its receive buffers
        (``pipeline_recv_buffers``: allocated once, kept for the run; round 15's v09 snapshot
        held all of them, 1.5 GiB, at the step's end). Under full recompute it no longer holds
        autocast's 16-bit weight copies: every layer's recompute (``torch.utils.checkpoint``)
        leaves autocast on the autograd thread, which clears the cast cache (the mechanism of
        round 12), and after the last backward nothing casts again. Round 15: v10/v11 (Llama,
        full) measured 23.80/24.80 GiB at that peak, copies counted 24.55/25.55, without
        23.73/24.73; v02 (GPT, selective: copies kept) 29.10 vs 29.02 with them."""
        if not self.last_merge_bytes:
            return 0.0
        return (self.last_merge_bytes + self.end_recv_bytes
                - layers * self.end_uncached_layer_bytes - self.end_uncached_const_bytes)

    def cast_cache_relief_bytes(self, rank: int, layers: int) -> float:
        """GPipe (or a 1F1B rank that runs every forward first, :data:`CAST_CACHE_SCHEDULES`)
        with full recomputation under autocast (runtime "torch", ZeRO-0/1): what a
        rank's peak inside a layer's backward holds less than its model states and buffers
        say.

        The first recompute of a backward (``torch.utils.checkpoint``, on the autograd
        engine's thread) leaves ``torch.autocast`` at nesting 0 there, which clears the
        weight-cast cache every thread shares (the mechanism of round 12 and of
        :meth:`end_of_step_bytes`): from then on only the layer being recomputed holds its
        16-bit copies. The calibrated row's backward working memory (``recompute_buf``,
        peak − allocated after a 2-layer forward, so net of one layer's copies freed) then
        gives the peak after the clear as states + activations + recompute_buf + 2 copies
        of one layer, against states (with every copy) + activations + recompute_buf
        counted; and the peak *before* the clear — every copy alive, the first recomputed
        layer's activations (the layer's saved tensors without recomputation, less its
        input) allocated — bounds the relief from below. The last rank's output layer runs
        its backward before any recompute, with every copy alive: its relief stops where
        the output's working memory sets the peak.

        Both bounds describe the rank's first backward, before which none of its gradients
        exists. A last rank holding two or more micro-batches (GPipe) peaks instead in its
        second backward, with every gradient allocated and the copies already cleared by
        the first's recompute, so on that rank both bounds rise by the gradients the first
        backward had not allocated yet (its gradients less the first-backward relief).
        Round 24, post hoc: the Llama GPipe full-recompute last stages that held 1.3-1.5 GiB
        above their measured peaks (round 19's b14 snapshot: peak in B1) move holdout18 b14
        +6.0 → +0.9 %, holdout20 d09 +5.3 → +0.8, pair12 x16 +5.3 → +0.8, holdout12 u09
        +4.0 → −0.5, holdout8 q12 +3.0 → +0.3 % (and p13, x05, r14, s11 by under a point
        toward 0); no rank moves away from its measurement. The same rise on the other
        ranks (whose first backward is also gradient-free) took eight GPipe first stages at
        micro-batch 4-8 (b14, d09, u09, r14, s11, q12, x05, x16) from −1.2..+0.6 % to
        −3.9..−7.2 %, so it is the last rank's alone, for a reason not found.

        Read from the round-21 snapshot of holdout21 e11 (Llama dp 2 pp 2 GPipe, full,
        ZeRO-1, micro-batch 16; docs/benchmarks/accuracy.md round 21): its first stage
        held 11.1 GiB after both forwards and still 11.1 after the first backward, which
        allocated the fp32 gradients (3.1 GiB) and freed one micro-batch's inputs (1.5):
        the stage's copies (1.4 GiB) went in that backward. Under GPipe nothing casts again
        before the next step. 1F1B and interleaved clear the cache in every backward too,
        but a forward after a backward casts again (e07's first stage re-casts in each
        forward): applied to every 1F1B rank the rule took the measured stages 2-4 % under
        (e09, s13, q05, z13), so it applies only to ranks that run every forward first
        (round 23, :data:`CAST_CACHE_SCHEDULES`: f13, z13's rank 0), not to interleaved
        ones (for a reason not found it over-relieves them), nor to zero-bubble, whose
        W-pass terms (``ZB_FULL_W_TRANSIENT_SETS``) were read off runs with the copies
        counted."""
        c = self.cache_layer_copy_bytes
        if not c or layers < 1 or not (self.cache_cleared_ranks
                                       and self.cache_cleared_ranks[rank]):
            return 0.0
        copies = layers * c + (self.cache_last_copy_bytes if rank == self.last_rank else 0.0)
        before = self.recompute_buf_bytes - self.recomputed_layer_bytes
        output = self.recompute_buf_bytes - self.output_peak_bytes
        if rank == self.last_rank and self.inflight[rank] >= 2:
            grads = layers * self.relief_layer_grad_bytes + self.relief_last_grad_bytes
            unallocated = grads - self.first_backward_relief_bytes(rank, layers)
            before += unallocated
            output = max(0.0, output) + unallocated
        relief = min(before, copies - 2 * c)
        if rank == self.last_rank:
            relief = min(relief, output)
        return max(0.0, relief)

    def _layer_act_bytes(self, rank: int) -> float:
        """Activation memory one layer of ``rank`` holds at the rank's peak."""
        pending = self.wgrad_pending[rank] if self.wgrad_pending else 0.0
        return (self.inflight[rank] * self.layer_activation_bytes
                + self._split_sets(rank) * self.wgrad_pending_bytes
                + (self.wgrad_transient_bytes if pending else 0.0))

    def rank_memory_bytes(self, rank: int, layers: int) -> float:
        mem = layers * (self.layer_state_bytes + self._layer_act_bytes(rank)) \
            + self.const_bytes[rank] - self.first_backward_relief_bytes(rank, layers) \
            + self.z3_resident_bytes(rank, layers) \
            - self.cast_cache_relief_bytes(rank, layers)
        if rank == self.last_rank:
            mem += self.output_split_extra_bytes(layers)
            mem = max(mem + self.last_chunks_bytes, layers * self.layer_state_bytes
                      + self.last_states_bytes + self.end_of_step_bytes(layers))
        return mem

    def peak_memory_bytes(self, stage_layers) -> float:
        return max(self.rank_memory_bytes(r, n) for r, n in enumerate(self.rank_layers(stage_layers)))

    def max_rank_layers(self, rank: int, capacity_bytes: float) -> int:
        """The most layers ``rank`` can hold within ``capacity_bytes`` (-1: not even 0)."""
        per = self.layer_state_bytes + self._layer_act_bytes(rank)
        const = self.const_bytes[rank]
        if self.rank_memory_bytes(rank, 0) > capacity_bytes:
            return -1
        n = min(self.num_layers, int((capacity_bytes - const) // per) if per > 0
                else self.num_layers)
        while n > 0 and self.rank_memory_bytes(rank, n) > capacity_bytes:
            n -= 1
        while n < self.num_layers and self.rank_memory_bytes(rank, n + 1) <= capacity_bytes:
            n += 1
        return n

    def stage_sum_s(self) -> float:
        """Σ_c (f_c + b_c) without the p2p slowdown (``slowdown``, ≥ 1 per stage): the same
        for every partition (every layer runs once per pass), and a lower bound of the
        slowed sum."""
        return (self.num_layers * (self.layer_forward_s + self.layer_backward_s)
                + 2 * self.layout.pp * self.layout.vpp * self.overhead_s + self.first_forward_s
                + self.first_backward_s + self.last_forward_s + self.last_backward_s)


def layer_tables(model: ModelSpec, cluster: Cluster, job: Job, layout: Layout, *,
                 checked: bool = False) -> LayerTables:
    """The linear pieces :func:`estimate` is built from (``layout.stage_layers`` ignored)."""
    if not checked:
        check_layout(model, cluster, job, layout.replace(stage_layers=None)
                     if model.num_layers >= layout.pp * layout.vpp else layout)
    return _layer_tables(model, cluster, job, layout.replace(stage_layers=None)
                         if layout.stage_layers is not None else layout)


@lru_cache(maxsize=65536)
def _layer_tables(model: ModelSpec, cluster: Cluster, job: Job, layout: Layout) -> LayerTables:
    dp, pp, tp, v = layout.dp, layout.pp, layout.tp, layout.vpp
    links = group_links(cluster, layout)
    parts = layer_parts(model, cluster, job, layout.micro_batch, tp, layout.sequence_parallel,
                        layout.recompute, links.tp, links.pp)
    layer_params = stage_params(model, 1, tp, first=False, last=False, pp=pp)
    z3 = zero3_layer(parts.layer, layer_params, links.dp, dp, layout.zero, job, pp,
                     cluster.gpu.overlap_interference)
    layer_f, layer_b = parts.layer.forward.total_s, parts.layer.backward.total_s
    layer_w = parts.layer.wgrad_s
    fsdp = fsdp_per_microbatch(job, layout.zero, pp) and dp > 1
    tables = cluster.gpu.measured
    measured_split = (parts.split_backward, parts.split_depth, parts.split_cpu)
    stage_row = pipelined_zero2_row(tables, model, job, layout)
    if stage_row is not None:
        k = _ratio(stage_row.backward_s, layer_b)
        layer_f, layer_b, layer_w = stage_row.forward_s, stage_row.backward_s, layer_w * k
        measured_split = _stage_split(stage_row, *measured_split, k)
    split = split_cpu = None
    if layout.schedule == "zero-bubble" and measured_split[0] is not None:
        # measured B and W actions (their sum can exceed one fused backward). What grows
        # with the stage's depth (at its mean; uneven partitions are off by second-order
        # terms) is the CPU's graph walk: the CPU times where they were timed apart, else
        # the synchronized ones, which then stand for both GPU and CPU
        depth = model.num_layers / (pp * v)
        measured_b, measured_depth, measured_cpu = measured_split
        if measured_cpu is not None:
            split = measured_b
            split_cpu = split_backward_at(measured_cpu, measured_depth, depth)
        else:
            split = split_cpu = split_backward_at(measured_b, measured_depth, depth)
        layer_b, layer_w = sum(split), split[1]
    # the profile's rows measured with FSDP2 itself (ZeRO-2/3 over dp > 1), if it has them
    fsdp_row, composed = (tables.fsdp_layer(
        model, seq_len=job.seq_len, tp=tp, sequence_parallel=layout.sequence_parallel,
        recompute=layout.recompute, micro_batch=layout.micro_batch, zero=layout.zero, dp=dp)
        if tables and layout.zero >= 2 and dp > 1 else (None, False))
    fs = fsdp_row if fsdp else None
    act_bytes = parts.activation_bytes
    if fsdp_row is not None and job.runtime == "torch":
        # the executor runs FSDP2 in bf16 without autocast (MixedPrecisionPolicy) and
        # ZeRO-0/1 under autocast, which keeps fp32 copies where it runs ops in fp32
        # (LayerNorm's input): GPT-0.54B's FSDP rows hold 13 % less than its plain ones
        act_bytes = fsdp_row.activation_bytes
    if fs is not None and not composed:
        # measured with FSDP2 itself: what it adds to the plain layer is its gather/reduce
        z3 = Zero3Layer(fs.forward_s - layer_f, fs.backward_s - layer_b, z3.wire_bytes,
                        z3.total_s)
    cpu, cpu_fixed = parts.cpu, parts.cpu_fixed
    if cpu is not None and fsdp:
        cpu = ((fs.forward_cpu_s, fs.backward_cpu_s, *cpu[2:])
               if fs is not None and fs.cpu_measured else None)
        cpu_fixed = (fs.forward_cpu_fixed_s, fs.backward_cpu_fixed_s) if cpu else (0.0, 0.0)
    if cpu is not None and stage_row is not None and stage_row.cpu_measured:
        cpu = (stage_row.forward_cpu_s, stage_row.backward_cpu_s, *cpu[2:])
        cpu_fixed = (stage_row.forward_cpu_fixed_s, stage_row.backward_cpu_fixed_s)
    cpu_layer = (cpu[0] + cpu[1]) if cpu else 0.0
    # once per chunk's forward and backward call of a micro-batch (see rank_cpu_s)
    cpu_call = sum(cpu_fixed) if cpu else 0.0
    if cpu and split_cpu is not None:
        # two autograd passes per layer cost the CPU more than one fused backward (timed
        # apart, or bounded by the synchronized timing); the split's timings hold their own
        # per-call part, so only the forward's is added
        cpu_layer = cpu[0] + (sum(split_cpu) if parts.split_cpu is not None
                              else max(cpu[1], sum(split_cpu)))
        cpu_call = cpu_fixed[0]
    m = layout.num_microbatches(job.global_batch)
    last_rank = (pp * v - 1) % pp
    inflight = _inflight_table(layout.schedule, pp, v, m)
    grad_copies = 1 + ddp_accumulates(job, layout, m)
    pending = zero_bubble_pending_w(job, layout, m)
    copy_b = compute_weight_bytes_per_param(job)    # 16-bit compute copies (runtime torch)
    per = state_bytes_per_param(job)
    out_peak = pipelined_output_peak_bytes(job, layout, model, parts.output_peak_bytes)
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
    copy_kw = dict(job=job, zero=layout.zero, dp=dp, tp=tp, pp=pp)
    recv = tuple(a + b for a, b in zip(
        pipeline_recv_buffers(job, layout, m, model.hidden_size, inflight),
        pipeline_kept_outputs(job, layout, model.hidden_size, inflight)))
    base_buf = ((2 * parts.p2p_bytes if pp > 1 and not recv else 0.0) + dp_buf + gathered
                + parts.backward_buf_bytes)
    emb_act = parts.embedding_act_bytes
    first_params = stage_params(model, 0, tp, first=True, last=pp == 1, pp=pp)
    first_extra = (sum(state_bytes_at_peak(first_params, job, layout.zero, dp, pp))
                   + (grad_copies - 1) * first_params * per.grads
                   + inflight[0] * emb_act + (logits_b if pp == 1 else 0.0)
                   + compute_copy_bytes(model, layers=0, first=True, last=pp == 1, **copy_kw))
    last_extra = 0.0
    if pp > 1:
        last_params = stage_params(model, 0, tp, first=False, last=True, pp=pp)
        last_extra = (sum(state_bytes_at_peak(last_params, job, layout.zero, dp, pp))
                      + logits_b
                      + compute_copy_bytes(model, layers=0, first=False, last=True, **copy_kw))
    first_f, first_b = parts.embedding[0].total_s, parts.embedding[1].total_s
    last_f, last_b = parts.logits[0].total_s, parts.logits[1].total_s
    if fsdp and job.runtime == "torch":
        # the root FSDP2 unit (embedding, final norm, output layer) gathers before the first
        # layer and reduce-scatters after the last backward: nothing to hide behind
        first_f += _root_gather_s(first_params, copy_b, links.dp)
        first_b += _root_reduce_s(first_params, per.grads, links.dp)
        if pp > 1:
            last_f += _root_gather_s(last_params, copy_b, links.dp)
            last_b += _root_reduce_s(last_params, per.grads, links.dp)
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
    # runtime "torch", pipelined: torch.distributed.pipelining keeps every micro-batch's
    # stage output (the 16-bit logits) of the last stage until the step ends, then
    # concatenates them (PipelineSchedule*.step → _merge_outputs(stage.output_chunks))
    chunks = merge = 0.0
    if torch_pipelined(job, pp):
        chunk = logits_chunk_bytes(job, layout, model)
        chunks, merge = m * chunk, 2 * m * chunk
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
    dp_only_fsdp = fsdp_dp_only(job, layout)
    cache_layer = cache_last = recomputed = 0.0
    cache_ranks: tuple[bool, ...] = ()
    if job.runtime == "torch" and cleared \
            and layout.schedule in CAST_CACHE_SCHEDULES:
        cache_ranks = tuple(first_backward.forwards_first(layout.schedule, pp, v, m, r)
                            for r in range(pp))
    if any(cache_ranks):
        cache_layer, cache_last = layer_copy, last_copy
        recomputed = max(0.0, parts.full_act_bytes - parts.activation_bytes)
    return LayerTables(
        model=model, cluster=cluster, job=job, layout=layout, links=links, parts=parts, zero3=z3,
        num_layers=model.num_layers, num_microbatches=m, last_rank=last_rank,
        layer_forward_s=layer_f + z3.forward_s,
        layer_backward_s=layer_b + z3.backward_s,
        layer_wgrad_s=layer_w,
        first_forward_s=first_f, first_backward_s=first_b,
        last_forward_s=last_f, last_backward_s=last_b,
        last_wgrad_s=parts.logits[2],
        overhead_s=overhead,
        cpu_layer_s=cpu_layer, cpu_call_s=cpu_call,
        cpu_wgrad_layer_s=split_cpu[1] if cpu and split_cpu is not None else 0.0,
        cpu_first_s=(cpu[2] + cpu[3]) if cpu else 0.0,
        cpu_last_s=(cpu[4] + cpu[5]) if cpu else 0.0,
        cpu_action_s=action_cpu, cpu_known=cpu is not None,
        last_chunks_bytes=chunks, last_merge_bytes=merge, last_states_bytes=last_states,
        end_recv_bytes=end_recv, end_uncached_layer_bytes=end_layer,
        end_uncached_const_bytes=end_const,
        cache_layer_copy_bytes=cache_layer, cache_last_copy_bytes=cache_last,
        cache_cleared_ranks=cache_ranks, recomputed_layer_bytes=recomputed,
        p2p_s=parts.p2p_s if pp > 1 else 0.0,
        grad_copies=grad_copies, recv_buffers=recv,
        wgrad_pending=pending,
        **_wgrad_bytes(model, job, layout, parts.full_act_bytes if any(pending) else 0.0,
                       parts.wgrad_measured, model.num_layers / (pp * v)),
        layer_state_bytes=(sum(state_bytes_at_peak(layer_params, job, layout.zero, dp, pp))
                           + (grad_copies - 1) * layer_params * per.grads
                           + compute_copy_bytes(model, layers=1, first=False, last=False,
                                                **copy_kw)),
        layer_activation_bytes=act_bytes,
        inflight=inflight, buffer_bytes=base_buf,
        first_extra_bytes=first_extra, last_extra_bytes=last_extra,
        embedding_act_bytes=emb_act, logits_bytes=logits_b,
        recompute_buf_bytes=parts.backward_buf_bytes, output_peak_bytes=out_peak,
        slowdown=stage_slowdown(job, layout),
        fsdp_step_s=FSDP2_DP_ONLY_STEP_S if dp_only_fsdp else 0.0,
        caveats=(((FSDP_OVER_TP_CAVEAT,) if composed and fs is not None else ())
                 + ((FSDP_DP_ONLY_CAVEAT,) if dp_only_fsdp else ())
                 + ((ZB_FSDP2_CAVEAT,) if layout.schedule == "zero-bubble"
                    and fsdp_accumulates_unsharded(job, layout.zero, dp, pp) else ())),
        z3_resident_layer_bytes=(layer_params * copy_b
                                 if torch_pipelined(job, pp) and layout.zero == 3 and dp > 1
                                 else 0.0),
        **_first_backward_relief(job, layout, m, grad_copies, layer_params, first_params,
                                  last_params if pp > 1 else 0.0))


def pipelined_zero2_row(tables, model: ModelSpec, job: Job, layout: Layout):
    """The measured layer a pipeline's FSDP2 ZeRO-2 stage runs at, or None.

    Under torch.distributed.pipelining FSDP2's ZeRO-2 gathers once per step and reduces
    once (:func:`fsdp_per_microbatch`), so a micro-batch's layers cost FSDP2's compute
    alone: bf16 parameters without autocast, which the plain rows (autocast) do not time —
    GPT-0.54B's FSDP2 rows ran 6-12 % faster than its plain ones even with their
    communication, and round 18's two pipelined ZeRO-2 GPT layouts came out +7 % and
    +10..+17 % (docs/benchmarks/accuracy.md) — nor the FSDP rows, whose per-micro-batch
    gather and reduce-scatter a pipeline does not pay. The profile's 1-rank FSDP2 row
    (:meth:`~meshplan.costmodel.measured.MeasuredTables.fsdp_compute_layer`) times exactly
    that; profiles without it keep the plain row."""
    if not tables or not (fsdp_accumulates_unsharded(job, layout.zero, layout.dp, layout.pp)
                          and layout.zero == 2):
        return None
    return tables.fsdp_compute_layer(
        model, seq_len=job.seq_len, tp=layout.tp, sequence_parallel=layout.sequence_parallel,
        recompute=layout.recompute, micro_batch=layout.micro_batch)


def _stage_split(row, split, depth, split_cpu, k: float):
    """Zero-bubble's (B and W, their depth growth, their CPU) for a pipelined ZeRO-2 stage:
    ``row``'s own split where it was timed (FSDP2 held unsharded, as the stage holds it;
    the growth with depth, the CPU's graph walk, stays the plain row's), else the plain
    ``split`` scaled by the two backwards' ratio ``k``."""
    if row.split_backward is not None:
        grow = (depth[0], depth[1], row.split_layers) if depth is not None else None
        return row.split_backward, grow, row.split_cpu
    if split is None:
        return split, depth, split_cpu
    return (split[0] * k, split[1] * k), depth, split_cpu


def _first_backward_relief(job: Job, layout: Layout, microbatches: int, grad_copies: int,
                           layer_params: float, first_params: float, last_params: float
                           ) -> dict:
    """LayerTables' relief fields (:meth:`LayerTables.first_backward_relief_bytes`): runtime
    "torch", gradients allocated by each chunk's first backward, not kept in DDP buckets
    (:func:`torch_ddp`, :func:`ddp_accumulates`), and a schedule whose backward allocates
    them (:data:`first_backward.WALKED_SCHEDULES`). Under a pipeline, FSDP2 counts only
    where it accumulates unsharded (:func:`fsdp_accumulates_unsharded`); without one, its
    per-micro-batch gradient shards do too: with one micro-batch per step they appear in
    its only backward (round 17, post hoc: holdout17's a12, Llama dp 4 ZeRO-3 mb 16,
    19.89 GiB measured, 21.96 predicted with the 1.53 GiB of shards counted, 20.43 without).
    ``first_params`` / ``last_params``: the first / last rank's non-layer parameters."""
    pp, dp, zero = layout.pp, layout.dp, layout.zero
    if job.runtime != "torch" or grad_copies != 1 \
            or layout.schedule not in first_backward.WALKED_SCHEDULES \
            or (pp == 1 and torch_ddp(job, layout)) \
            or (pp > 1 and zero >= 2 and not fsdp_accumulates_unsharded(job, zero, dp, pp)):
        return {}

    def grads(params: float) -> float:
        return state_bytes_at_peak(params, job, zero, dp, pp)[1]
    events = tuple(first_backward.backward_events(layout.schedule, pp, layout.vpp,
                                                  microbatches, r) for r in range(pp))
    return {"relief_layer_grad_bytes": grads(layer_params),
            "relief_first_grad_bytes": grads(first_params),
            "relief_last_grad_bytes": grads(last_params), "relief_events": events}


def _root_gather_s(params: float, bytes_per_param: float, dp_link) -> float:
    return comm.all_gather_s(dp_link, params * bytes_per_param) if params else 0.0


def _root_reduce_s(params: float, bytes_per_param: float, dp_link) -> float:
    return comm.reduce_scatter_s(dp_link, params * bytes_per_param) if params else 0.0


def compute_copy_bytes(model: ModelSpec, job: Job, zero: int, dp: int, tp: int, pp: int,
                       layers: int, *, first: bool, last: bool) -> float:
    """Runtime "torch": the 16-bit copies of fp32 weights that compute uses, counted with the
    weights. ZeRO-0/1: autocast caches one cast per weight for the step (the embedding table
    is indexed in fp32, not cast); FSDP2's ZeRO-2 keeps every layer's gathered weights from
    forward to backward, with the root unit (embedding, norm, output); ZeRO-3's two gathered
    layers are a buffer (see :func:`_layer_tables`), its root unit is counted here."""
    copy_b = compute_weight_bytes_per_param(job)
    if not copy_b:
        return 0.0
    fsdp = zero >= 2 and dp > 1
    ends = stage_params(model, 0, tp, first=first, last=last, pp=pp) if (first or last) else 0.0
    if fsdp:
        layer_part = 0.0 if zero == 3 else layers * stage_params(model, 1, tp, first=False,
                                                                 last=False, pp=pp)
        return (layer_part + ends) * copy_b
    layer_part = layers * stage_params(model, 1, tp, first=False, last=False, pp=pp)
    head = model.vocab_size * model.hidden_size / tp if last else 0.0
    return (layer_part + head) * copy_b
