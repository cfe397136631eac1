"""What each runtime runs: predicates the cost model branches on, read from the frameworks.

Every function here is a fact about how a framework executes a layout (read in its source,
cited per function), not a fitted number:

* ``"megatron"``: Megatron-LM / Megatron-Core conventions (ZeRO-1/2 reduce once a step).
* ``"torch"``: meshplan's executor — DDP for ZeRO-0/1 without a pipeline, FSDP2 for
  ZeRO-2/3, ``torch.distributed.pipelining`` for pp > 1 (torch 2.11 / 2.13 source).

Keeping them in one place is what makes a new runtime (or a new parallelism's process
group) a local change: a term asks "does this runtime do X here", never ``job.runtime ==``
directly. No number here, so no measured error of its own: the terms that branch on these
predicates carry theirs.
"""

from __future__ import annotations

from meshplan.spec import Job, Layout


def fsdp_per_microbatch(job: Job, zero: int, pp: int = 1) -> bool:
    """ZeRO stages whose communication happens per layer and per micro-batch: ZeRO-3, and
    ZeRO-2 as FSDP2 runs it without a pipeline (runtime "torch": gradients are
    reduce-scattered after every micro-batch's backward and the weights re-gathered for the
    next forward). Under torch.distributed.pipelining, FSDP2's ZeRO-2 is gathered once and
    reduced once per step: the stage turns off gradient sync and resharding after backward
    for every micro-batch but the last (``_PipelineStageBase.backward_maybe_with_nosync``)."""
    return zero == 3 or (zero == 2 and job.runtime == "torch" and pp == 1)


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


def fsdp_active(job: Job, layout: Layout) -> bool:
    """FSDP-style per-layer, per-micro-batch communication runs at all (dp > 1)."""
    return fsdp_per_microbatch(job, layout.zero, layout.pp) and layout.dp > 1


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


def expert_grad_copies(job: Job, grad_copies: int) -> int:
    """fp32 gradient copies of an MoE model's routed-expert parameters, where the dense ones
    have ``grad_copies``: runtime "torch" leaves the experts out of DDP
    (``executor.expert_parallel.prepare_data_parallel``) and all-reduces their ``.grad`` in
    place (``reduce_expert_grads``), so DDP's accumulation copy (:func:`ddp_accumulates`)
    is not theirs — one copy; other runtimes as the dense parameters. moeh7 (2 × H200, post
    hoc): its two DDP layouts with 4 micro-batches held 7.8 and 3.5 GiB less than priced
    with the copy (+19.6 / +14.7 %), −0.1 / −2.1 % without it."""
    return 1 if job.runtime == "torch" else grad_copies


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
    own working memory at the start of an I (``LayerTables.output_split_extra_bytes``).
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


def zb_first_stage_fused(job: Job, layout: Layout) -> bool:
    """Whether the first stage of a zero-bubble pipeline runs one fused backward in its W
    action instead of a split I + W (runtime "torch", pp > 1).

    torch's ``_PipelineStageBase.backward_weight_one_chunk`` (torch 2.11-2.13) runs stage
    0's W as a ``"full"`` backward: its input (token ids) has no gradient, so
    ``stage_backward_input`` captures no parameter groups and its I computes nothing. So
    stage 0 costs one fused backward, all of it in its W, not the measured split's B + W
    (which costs more: the hooks, the retained graph, the second graph walk;
    :mod:`meshplan.calibrate.bench_split`). Measured error (post hoc): round 41's zero-bubble
    layouts +1.6 / +2.7 / +4.5 % with it, +3.1 / +7.8 / +7.6 % without (x12's stage 0:
    121.7 ms fused against 140.6 split; docs/benchmarks/transfer.md)."""
    return (job.runtime == "torch" and layout.schedule == "zero-bubble" and layout.pp > 1
            and layout.vpp == 1)


def fp8_transformer_engine(job: Job) -> bool:
    """fp8 linears as TransformerEngine runs them (runtime "megatron"; Megatron-Core's
    ``TELinear`` / ``TELayerNormColumnParallelLinear``): fused cast-transpose(-amax) kernels
    (TE docs, "Using FP8 with Transformer Engine"; TE issue 1261: "Our default behavior when
    casting to FP8 is to use a fused cast-transpose kernel"), fp8 weights cast on a step's
    first micro-batch and cached for the rest (``is_first_microbatch``; TE PR 500:
    ``weight.transpose(update_cache=ctx.is_first_microbatch)``), and the quantized linear
    inputs saved for backward (TE PR 1865: "the modules always save the casted/quantized
    input tensors"). Runtime "torch" (meshplan's executor, :mod:`meshplan.executor.fp8`)
    casts in separate passes, re-casts weights per use and saves 16-bit inputs."""
    return job.precision == "fp8" and job.runtime != "torch"


def fp8_weight_source_bytes(job: Job, zero: int, dp: int) -> int:
    """Bytes per element of the weight an fp8 cast reads: the executor's ZeRO-0/1 linears
    receive the fp32 parameter (autocast does not reach ``torch._scaled_mm``), FSDP2
    (ZeRO-2/3 over dp > 1) hands them its gathered bf16 weight; Megatron keeps bf16
    weights beside the optimizer's fp32 master copy."""
    return 4 if job.runtime == "torch" and not (zero >= 2 and dp > 1) else 2


def chunks_receiving_sending(pp: int, vpp: int, rank: int) -> tuple[int, int]:
    """How many of ``rank``'s chunks (stages rank, rank + pp, ...) receive an activation
    (all but the first stage) and send one on (all but the last)."""
    chunks = range(rank, pp * vpp, pp)
    return sum(c != 0 for c in chunks), sum(c != pp * vpp - 1 for c in chunks)


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
    return tuple(2 * sum(chunks_receiving_sending(pp, vpp, r)) for r in range(pp))


def moe_dispatch_overlapped(job: Job) -> bool:
    """Whether the MoE dispatch/combine all-to-alls run beside compute. Neither runtime does
    by default: meshplan's executor waits on each ``all_to_all_single`` (executor/moe.py);
    Megatron-Core's ``MoEAlltoAllTokenDispatcher`` runs them on the compute stream, and its
    overlap of one micro-batch's all-to-alls with another's compute
    (``--overlap-moe-expert-parallel-comm``, the DeepSeek-V3 "DualPipe"-style 1F1B
    combination: ``Job.moe_a2a_overlap``, priced across micro-batches by
    :mod:`meshplan.costmodel.moe_overlap`, not here) and of the shared experts
    (``--moe-shared-expert-overlap``, which the Job does not describe) are opt-in. So
    within a layer every all-to-all is exposed."""
    return False


def moe_tokens_sliced_over_tp(job: Job, sequence_parallel: bool) -> bool:
    """An MoE layer with tp > 1 routes 1/tp of the tokens on each tp rank: with sequence
    parallelism its slice; without, meshplan's executor cuts the sequence over tp before the
    router and all-gathers the layer's output after the combine (executor/moe.py
    ``scatter_to_sp`` / ``gather_from_slices``; Megatron-Core requires sequence parallelism
    for MoE with tp > 1). Returns whether that extra all-gather runs."""
    return not sequence_parallel


__all__ = ["expert_grad_copies", "moe_dispatch_overlapped", "moe_tokens_sliced_over_tp", "fsdp_per_microbatch", "torch_pipelined", "fsdp_accumulates_unsharded",
           "fsdp_active", "torch_ddp", "ddp_accumulates", "split_backward_rule",
           "chunks_receiving_sending", "p2p_ops_per_microbatch"]
