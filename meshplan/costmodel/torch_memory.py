"""Memory terms of meshplan's own executor (runtime "torch"), read from torch's source.

Each function is one term a rank holds because of how torch runs the step (FSDP2's
unsharded accumulation, torch.distributed.pipelining's receive buffers and kept outputs,
autocast's cast cache, zero-bubble's split backward), with the torch function it comes
from and the measurement that checked it. Megatron's runtime has none of them: every
function returns 0 / () / its input unchanged there.

Measured error: per-rank memory of the measured sets (docs/benchmarks/accuracy.md rounds
20-26) within 5 % on 64 of 64 ranks in round 26 (max 3.18 %).
"""

from __future__ import annotations

from meshplan.costmodel import first_backward
from meshplan.costmodel.corrections import FIRST_BACKWARD, OUTPUT_PEAK, zb_full_sets
from meshplan.costmodel.measured import Interpolated, wgrad_bytes_at
from meshplan.costmodel.memory import (activation_bytes_per_element,
                                       compute_weight_bytes_per_param, model_state_bytes,
                                       split_backward_kept_grad_bytes, stage_params,
                                       state_bytes_per_param)
from meshplan.costmodel.torch_activations import torch_layer_activations
from meshplan.costmodel.runtime import (chunks_receiving_sending, fsdp_accumulates_unsharded,
                                        split_backward_rule, torch_ddp, torch_pipelined)
from meshplan.hardware_profiles.corrections import CorrectionNumbers
from meshplan.spec import Job, Layout, ModelSpec


def state_bytes_at_peak(params: float, job: Job, zero: int, dp: int,
                        pp: int) -> tuple[float, float, float]:
    """:func:`model_state_bytes`, with the gradients unsharded where FSDP2 accumulates them
    so under a pipeline (:func:`fsdp_accumulates_unsharded`)."""
    w, g, o = model_state_bytes(params, job, zero, dp)
    if fsdp_accumulates_unsharded(job, zero, dp, pp):
        g = params * state_bytes_per_param(job).grads
    return w, g, o


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
    io = stage_io_bytes(job, layout, hidden_size)
    if io is None:
        return ()
    out = []
    for r in range(layout.pp):
        receiving, sending = chunks_receiving_sending(layout.pp, layout.vpp, r)
        out.append(((receiving + sending) * microbatches - receiving * inflight[r]) * io)
    return tuple(out)


def stage_io_bytes(job: Job, layout: Layout, hidden_size: int) -> float | None:
    """One stage input / output, (micro-batch, sequence / tp with SP, hidden) in 16 bits,
    where torch.distributed.pipelining runs the pipeline (runtime "torch", pp > 1); else
    None."""
    if not torch_pipelined(job, layout.pp):
        return None
    seq = job.seq_len // layout.tp if layout.sequence_parallel else job.seq_len
    return layout.micro_batch * seq * hidden_size * activation_bytes_per_element(job)


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
    io = stage_io_bytes(job, layout, hidden_size)
    if io is None:
        return ()
    return tuple(inflight[r] * chunks_receiving_sending(layout.pp, layout.vpp, r)[1] * io
                 for r in range(layout.pp))


def pipelined_output_peak_bytes(job: Job, layout: Layout, model: ModelSpec,
                                output_peak_bytes: float,
                                numbers: CorrectionNumbers | None = None) -> float:
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
            or layout.schedule == "zero-bubble" \
            or (numbers is not None and not numbers.enabled(OUTPUT_PEAK)):
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
    kept output gradients, not of activations, on ranks r > 0; round 25). Those sets
    are capped by the step's micro-batches (``LayerTables._split_sets``): with one
    micro-batch rank 1 runs F0 I0 W0 and the pending W is the micro-batch whose I just
    ended; counting both over-predicted round 39's w18 stage 1 by 21.8 % (3.5 % capped,
    post hoc, docs/benchmarks/transfer.md)."""
    pp = layout.pp
    if job.runtime != "torch" or layout.schedule != "zero-bubble" or layout.vpp != 1:
        return ()
    middle_extra = 1 if layout.recompute == "full" else 0
    return tuple(float(min(r + (middle_extra if 0 < r < pp - 1 else 0), microbatches))
                 for r in range(pp))


def wgrad_bytes(model: ModelSpec, job: Job, layout: Layout, full_act_bytes: float,
                numbers: CorrectionNumbers, measured: Interpolated | None = None,
                stage_layers: float = 0.0) -> dict[str, float]:
    """Per layer: what a pending zero-bubble W keeps (``wgrad_pending_bytes``) and the
    transient of running one (``wgrad_transient_bytes``). With full recomputation these
    depend on the block (one recomputation per parameter group): the profile's measured
    pair where the calibration has one (``measured``, :mod:`meshplan.calibrate.split_memory`;
    at the mean stage depth ``stage_layers``, :func:`measured.wgrad_bytes_at`), else
    the profile's ``zb_full_pending_sets`` and ``zb_full_w_transient_sets``
    (:func:`meshplan.costmodel.corrections.zb_full_sets`). Without
    it (:func:`split_backward_rule`) the kept output gradients, and the logits' gradient
    (``split_backward``, ``logits_grad_bytes``). ``full_act_bytes`` = 0: no pending W on any
    rank (nothing is added)."""
    if full_act_bytes > 0 and layout.recompute == "full":
        if measured is not None:
            pending, transient = wgrad_bytes_at(measured, stage_layers)
            return {"wgrad_pending_bytes": pending, "wgrad_transient_bytes": transient}
        sets = zb_full_sets(numbers)
        if sets is None:
            return {"wgrad_pending_bytes": 0.0, "wgrad_transient_bytes": 0.0}
        return {"wgrad_pending_bytes": sets[0] * full_act_bytes,
                "wgrad_transient_bytes": sets[1] * full_act_bytes}
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


def first_backward_relief_fields(job: Job, layout: Layout, microbatches: int,
                                 grad_copies: int, layer_params: float, first_params: float,
                                 last_params: float, numbers: CorrectionNumbers) -> dict:
    """LayerTables' relief fields (:meth:`LayerTables.first_backward_relief_bytes`): runtime
    "torch", gradients allocated by each chunk's first backward, not kept in DDP buckets
    (:func:`torch_ddp`, :func:`ddp_accumulates`), and a schedule whose backward allocates
    them (:data:`first_backward.WALKED_SCHEDULES`), or zero-bubble under
    :func:`split_backward_rule`, whose first W allocates them
    (:func:`first_backward.zero_bubble_events`). Under a pipeline, FSDP2 counts only
    where it accumulates unsharded (:func:`fsdp_accumulates_unsharded`); without one, its
    per-micro-batch gradient shards do too: with one micro-batch per step they appear in
    its only backward (round 17, post hoc: holdout17's a12, Llama dp 4 ZeRO-3 mb 16,
    19.89 GiB measured, 21.96 predicted with the 1.53 GiB of shards counted, 20.43 without).
    ``first_params`` / ``last_params``: the first / last rank's non-layer parameters."""
    pp, dp, zero = layout.pp, layout.dp, layout.zero
    zero_bubble = split_backward_rule(job, layout)
    if job.runtime != "torch" or grad_copies != 1 or not numbers.enabled(FIRST_BACKWARD) \
            or (layout.schedule not in first_backward.WALKED_SCHEDULES and not zero_bubble) \
            or (pp == 1 and torch_ddp(job, layout)) \
            or (pp > 1 and zero >= 2 and not fsdp_accumulates_unsharded(job, zero, dp, pp)):
        return {}

    def grads(params: float) -> float:
        return state_bytes_at_peak(params, job, zero, dp, pp)[1]
    if zero_bubble:
        events = tuple(first_backward.zero_bubble_events(pp, microbatches, r)
                       for r in range(pp))
    else:
        events = tuple(first_backward.backward_event_sums(layout.schedule, pp, layout.vpp,
                                                          microbatches, r) for r in range(pp))
    return {"relief_layer_grad_bytes": grads(layer_params),
            "relief_first_grad_bytes": grads(first_params),
            "relief_last_grad_bytes": grads(last_params), "relief_events": events}


def compute_copy_bytes(model: ModelSpec, job: Job, zero: int, dp: int, tp: int, pp: int,
                       layers: int, *, first: bool, last: bool, compiled: bool = False) -> float:
    """Runtime "torch": the 16-bit copies of fp32 weights that compute uses, counted with the
    weights. ZeRO-0/1: autocast caches one cast per weight for the step (the embedding table
    is indexed in fp32, not cast); FSDP2's ZeRO-2 keeps every layer's gathered weights from
    forward to backward, with the root unit (embedding, norm, output); ZeRO-3's two gathered
    layers are a buffer (see :func:`meshplan.costmodel.build.memory_terms`), its root unit is counted here.

    ``compiled``: the layers are priced from compiled rows (Layout.compile). A compiled block
    casts its weights inside its graph and saves the copies for its backward once per
    micro-batch, not in autocast's cache, and a compiled row's kept activation bytes hold
    them (:mod:`meshplan.costmodel.compiled_rows`: the rows' intercept is the layer's 16-bit
    weights), so ZeRO-0/1 count no layer copies here; the ends run eager and keep theirs."""
    copy_b = compute_weight_bytes_per_param(job)
    if not copy_b:
        return 0.0
    fsdp = zero >= 2 and dp > 1
    ends = stage_params(model, 0, tp, first=first, last=last, pp=pp) if (first or last) else 0.0
    if fsdp:
        layer_part = 0.0 if zero == 3 else layers * stage_params(model, 1, tp, first=False,
                                                                 last=False, pp=pp)
        return (layer_part + ends) * copy_b
    layer_part = 0.0 if compiled else layers * stage_params(model, 1, tp, first=False,
                                                             last=False, pp=pp)
    head = model.vocab_size * model.hidden_size / tp if last else 0.0
    return (layer_part + head) * copy_b


def fsdp_plain_row_kept_bytes(model: ModelSpec, job: Job, layout: Layout, row_bytes: float,
                              *, copied_params: float, mlp_width: int | None = None) -> float:
    """A layer's kept bytes under FSDP2 (ZeRO-2/3) priced from a plain row — the profile
    timed no FSDP2 row of this layer at this setting — which was timed under autocast:
    FSDP2 runs the block in bf16 without autocast (``MixedPrecisionPolicy``), so its
    LayerNorms keep their 16-bit inputs, not autocast's fp32 copies (the analytical
    difference, :mod:`meshplan.costmodel.torch_activations`; ``mlp_width``: an MoE layer's
    dense MLP, its shared experts), and the 16-bit weight copies the row saved for its
    backward are not made — ``copied_params`` of them: a compiled row's layer weights (the
    rows' intercept, :mod:`meshplan.costmodel.compiled_rows`), an MoE row's per-call expert
    casts (:func:`meshplan.costmodel.moe_rows.fsdp_kept_bytes`); none under full
    recomputation, which keeps the block input only. The FSDP2 rows that measure this
    directly: GPT-0.54B's held 13 % less than its plain ones.

    fp8h7's p04 (2 × H200, ZeRO-3 compiled, recompute selective, no FSDP2 rows): the
    bf16 arm priced from the plain compiled row peaked 5.2 GiB (+14.4 %) under the
    prediction; with both terms −1.6 % (post hoc, docs/benchmarks/fp8_checks.md "fp8h7")."""
    kw = dict(model=model, job=job, micro_batch=layout.micro_batch, tp=layout.tp,
              sequence_parallel=layout.sequence_parallel, mlp_width=mlp_width)
    norms = (torch_layer_activations(**kw, autocast=False).stored(layout.recompute)
             - torch_layer_activations(**kw).stored(layout.recompute))
    copies = (0.0 if layout.recompute == "full"
              else copied_params * compute_weight_bytes_per_param(job))
    return max(0.0, row_bytes + norms - copies)
