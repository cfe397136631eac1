"""Megatron-Core's combined 1F1B: one micro-batch's expert-parallel all-to-alls beside another
micro-batch's compute (``Job.moe_a2a_overlap``, runtime "megatron").

With ``--overlap-moe-expert-parallel-comm`` Megatron-Core runs the forward of one
micro-batch and the backward of another as one merged step, layer by layer, so that "EP A2A
in forward step is hidden by the attention/mlp computation in the backward step, and vice
versa" (Megatron-Core API docs, ``core.pipeline_parallel.combined_1f1b``; user guide,
"Combined 1F1B: Expert-Parallel All-to-All Overlap"). It runs with ep > 1 and, with pp > 1,
only under the interleaved schedule (Megatron-Bridge's overlap validation). Per MoE layer
and paired micro-batch:

* the forward's dispatch runs beside the paired backward's expert (MLP) compute, its
  combine beside the paired backward's attention compute; the backward's combine gradient
  beside the paired forward's attention compute, its dispatch gradient beside the paired
  forward's expert compute — each all-to-all is half of its pass's ``ep_comm_s``;
* each costs :func:`meshplan.costmodel.comm.exposed`: what does not fit behind its compute,
  plus the profile's ``overlap_interference`` of what does;
* only the steady state pairs: a rank's warm-up forwards and cool-down backwards run alone
  (Megatron's interleaved warm-up on the first pipeline rank, 2·(pp − 1) + (vpp − 1)·pp
  of its m·vpp chunk passes; 1 of m at pp = 1: ``combined_1f1b_schedule_for_no_pipelining``
  runs the first forward and the last backward alone), their all-to-alls exposed.

"Compute" is a pass's GEMM, attention and memory-bound time (not its host time, nor its
tensor-parallel collectives, which contend for the same links). Not modelled apart:
``--delay-wgrad-compute`` (the expert weight gradients moved later: more cover), the
recomputed forward's all-to-alls under full recomputation (left exposed), and the SMs the
overlapped kernels share beyond the interference number.

"Attention" is the layer without its routed experts (attention, norms, shared experts).

Measured error, as first run on the six published rows that ran it (datasheet profiles;
docs/benchmarks/published.md, "Combined 1F1B"; the rule committed before they were
predicted: benchmarks/sets/moe_a2a_overlap/README.md): 10.5 % mean step-time error, 37.4 %
priced without the overlap — Megatron-Bridge's four Qwen3-235B-A22B FP8 H100 rows +1.7 to
+8.0 % (+39 to +48 % without), the Model Zoo's Qwen3-235B-A22B row −3.4 % (+10.1 %), and
Qwen3-30B-A3B −40.2 % either way (host-bound as priced: the overlap moves nothing there).
"""

from __future__ import annotations

from dataclasses import replace

from meshplan.costmodel.comm import exposed
from meshplan.costmodel.compute import PassCost
from meshplan.costmodel.pipeline_sim import interleaved_warmup
from meshplan.spec import Job, Layout


def a2a_overlapped(job: Job, layout: Layout) -> bool:
    """Whether the layout runs Megatron's combined 1F1B: asked for, ep > 1, and at pp > 1
    the interleaved schedule (Megatron refuses it otherwise; here it changes nothing)."""
    return (job.moe_a2a_overlap and layout.ep > 1   # Job allows it under "megatron" only
            and (layout.pp == 1 or layout.schedule == "interleaved-1f1b"))


def overlap_caveats(model, job: Job, layout: Layout) -> tuple[str, ...]:
    """What an estimate says of ``Job.moe_a2a_overlap``: where it applies, that it is priced
    and how far it was checked; where it was asked for and does not apply, why not."""
    if not job.moe_a2a_overlap:
        return ()
    if a2a_overlapped(job, layout) and model.is_moe:
        return (OVERLAP_CAVEAT,)
    why = ("the model has no routed experts" if not model.is_moe
           else f"Layout.ep = {layout.ep}: there is no all-to-all" if layout.ep == 1
           else f"pp = {layout.pp} without the interleaved schedule (Megatron runs it at "
                f"pp > 1 only with virtual stages: schedule='interleaved-1f1b', vpp > 1)")
    return (f"Job.moe_a2a_overlap has no effect on this layout: {why}",)


OVERLAP_CAVEAT = (
    "Megatron's combined 1F1B (Job.moe_a2a_overlap): each all-to-all priced behind the paired "
    "micro-batch's compute at the profile's overlap_interference (the datasheet's 0.15 an "
    "assumption); first run on six published runs, 10.5 % mean step-time error "
    "(docs/benchmarks/published.md, \"Combined 1F1B\")")


def paired_share(layout: Layout, num_microbatches: int) -> float:
    """The share of a rank's chunk passes that run paired: all but the first pipeline
    rank's warm-up forwards (and as many cool-down backwards)."""
    passes = num_microbatches * layout.vpp
    alone = 1 if layout.pp == 1 else interleaved_warmup(layout.pp, layout.vpp,
                                                         num_microbatches, 0)
    return max(0.0, 1.0 - alone / passes) if passes else 0.0


def _compute_s(p: PassCost) -> float:
    return p.gemm_s + p.attention_s + p.memory_bound_s


def overlapped_ep_s(attention_fwd: PassCost, experts_fwd: PassCost, attention_bwd: PassCost,
                    experts_bwd: PassCost, a2a_fwd_s: float, a2a_bwd_s: float, share: float,
                    interference: float) -> tuple[float, float]:
    """Exposed all-to-all seconds of the forward and of the backward of one MoE layer:
    ``share`` of the passes paired (module docstring), the rest alone."""
    fwd = (exposed(a2a_fwd_s / 2, _compute_s(experts_bwd), interference)
           + exposed(a2a_fwd_s / 2, _compute_s(attention_bwd), interference))
    bwd = (exposed(a2a_bwd_s / 2, _compute_s(attention_fwd), interference)
           + exposed(a2a_bwd_s / 2, _compute_s(experts_fwd), interference))
    return (share * fwd + (1 - share) * a2a_fwd_s, share * bwd + (1 - share) * a2a_bwd_s)


def with_a2a_overlap(forward: PassCost, backward: PassCost, attention_fwd: PassCost,
                     attention_bwd: PassCost, experts_fwd: PassCost, experts_bwd: PassCost,
                     share: float, interference: float) -> tuple[PassCost, PassCost]:
    """A layer's forward and backward passes with the routed experts' all-to-alls
    overlapped as the combined 1F1B schedule runs them; ``attention_*`` the layer without
    its routed experts, ``experts_*`` the routed experts' passes (their ``ep_comm_s`` the
    all-to-alls). Any other ``ep_comm_s`` of the passes (the recomputed forward's, under
    full recomputation) stays exposed."""
    f, b = overlapped_ep_s(attention_fwd, experts_fwd, attention_bwd, experts_bwd,
                           experts_fwd.ep_comm_s, experts_bwd.ep_comm_s, share, interference)
    return (replace(forward, ep_comm_s=forward.ep_comm_s - experts_fwd.ep_comm_s + f),
            replace(backward, ep_comm_s=backward.ep_comm_s - experts_bwd.ep_comm_s + b))


__all__ = ["OVERLAP_CAVEAT", "a2a_overlapped", "overlap_caveats", "paired_share",
           "overlapped_ep_s", "with_a2a_overlap"]
