"""Named corrections: effects measured on GPUs that no first-principles term explains (yet).

Each correction is one :class:`Correction`: a predicate saying where it applies, the
mechanism (what was measured, on which machine, how well the number holds), and the
profile keys that carry its numbers (:class:`meshplan.hardware_profiles.corrections.
CorrectionNumbers`; built-in defaults with machine and date in
``hardware_profiles/data/corrections.toml``, replaced by a calibrated profile's
``[corrections]`` table). The cost model never holds a fitted number itself: it asks the
GPU profile. :func:`meshplan.costmodel.estimate` reports which corrections applied and how
much each moved the step time and the peak memory (``Estimate.corrections``), by
re-estimating with that correction switched off (``CorrectionNumbers.without``).

Memory corrections read from torch's source but placed by measurement (which ranks, which
schedules) are registered here too, with no number: their terms live in
:mod:`meshplan.costmodel.memory_reliefs` and this registry only names them, so that an
estimate can show what each moved.

Adding one: write its predicate and effect here (numbers from ``gpu.corrections``), add its
keys to ``CorrectionNumbers`` and the data file, call the effect from the term it corrects,
append it to :data:`CORRECTIONS`, and test its predicate and its effect.

Each correction's formula, source (the measurement) and measured error are in the docstring
of its effect function (``Correction.mechanism``); their numbers' provenance (machine and
date) is in ``hardware_profiles/data/corrections.toml``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from meshplan.costmodel import first_backward, torch_p2p
from meshplan.costmodel.clock import (SUSTAINED_CLOCK, SUSTAINED_DUTY, duty_scale,
                                      sustained_clock, sustained_duty_applies, sustained_rows)
from meshplan.costmodel.runtime import (fsdp_accumulates_unsharded, p2p_ops_per_microbatch,
                                        torch_pipelined)
from meshplan.hardware_profiles.corrections import CorrectionNumbers
from meshplan.spec import Job, Layout

# names (the registry's keys, the profile's ``disabled`` entries)
P2P_SLOWDOWN = "torch_p2p_slowdown"
P2P_ORDER = "torch_p2p_order"
ZB_FULL_SETS = "zero_bubble_full_recompute_sets"
ZB_FULL_W = "zero_bubble_full_recompute_w"
FSDP2_STEP = "fsdp2_dp_only_step"
CAST_CACHE = "cast_cache_relief"
FIRST_BACKWARD = "first_backward_relief"
Z3_RESIDENT = "zero3_resident_weights"
END_OF_STEP = "end_of_step_merge"
OUTPUT_PEAK = "pipelined_output_peak"
CP_RING = "cp_ring_interference"
MOE_IMBALANCE = "moe_load_imbalance"
MOE_HOST = "megatron_moe_host"

# GPipe and 1F1B ranks that run every forward before their first backward get the
# cast-cache relief; interleaved and zero-bubble ranks do not (see cast_cache_ranks). A
# rule read off measurements (rounds 21-24), not a number.
CAST_CACHE_SCHEDULES = ("gpipe", "1f1b")


# ---- torch p2p slowdown ------------------------------------------------------------------
def stage_slowdown(numbers: CorrectionNumbers, job: Job, layout: Layout) -> tuple[float, ...]:
    """Runtime "torch", pp > 1: per virtual stage, the factor its compute is slowed by,
    ``1 + per_op · ops(rank) / vpp^exponent``, at most ``1 + max``; () where none.

    torch.distributed.pipelining posts every SEND/RECV as its own NCCL group on the rank's
    communicator stream; the kernel is resident, spinning on SMs, from its launch until the
    peer's matching kernel arrives, and the compute kernels it overlaps run 25-60 % slower
    (profiler traces, benchmarks/trace_overlap.py: n06, n12, p02, p08, p14). So a rank is
    slowed in proportion to the p2p operations it runs per micro-batch
    (:func:`~meshplan.costmodel.runtime.p2p_ops_per_microbatch`). ``per_op`` (0.012) was
    fitted on the 32 pipelined layouts of holdout3-6 (4 × H200 and 2 × H200, torch 2.11,
    round 7); held out on holdout8 its 10 pipelined layouts came out at 5.4 % mean error
    (9.7 % without). Interleaving divides by √vpp (``exponent`` 0.5, round 16, post hoc: a
    chunk's passes are 1/vpp of the stage's; 190 GPU-bound layouts 2.89 → 2.77 %). The cap
    ``max`` is the largest the fit saw (pp 4 vpp 3, 12 operations: 0.012 · 12 / √3); round
    22's vpp 6 and 12 layouts were +2.8 / +7.2 % without it, +0.5 / +0.2 % with it (post
    hoc). Not applied to Megatron, which overlaps p2p differently.

    Example: pp = 2, vpp = 3 → 10 operations per rank, 1 + 0.012 · 10 / √3 ≈ 1.069."""
    if not torch_pipelined(job, layout.pp) or not numbers.enabled(P2P_SLOWDOWN):
        return ()
    ops = p2p_ops_per_microbatch(layout.pp, layout.vpp)
    exponent = numbers.torch_p2p_slowdown_vpp_exponent
    per_op = numbers.torch_p2p_slowdown_per_op / layout.vpp ** exponent
    cap = numbers.torch_p2p_slowdown_max
    return tuple(1.0 + min(cap, per_op * ops[c % layout.pp])
                 for c in range(layout.pp * layout.vpp))


# ---- torch p2p order ---------------------------------------------------------------------
def p2p_order_applies(numbers: CorrectionNumbers, job: Job, layout: Layout, m: int) -> bool:
    """Interleaved 1F1B under torch's runtime, pp ≥ 3: the step may be held by the order in
    which torch posts its sends and receives (:mod:`meshplan.costmodel.torch_p2p`: a replay
    with no fitted number) rather than by the closed form. Its waits come once a step, the
    slowdown's with every micro-batch: with the stage times of the eight pp 4 layouts
    measured, the order binds up to m = 4·pp and never from m = 8·pp on, so it is applied
    up to ``torch_p2p_order_max_microbatches_per_rank``·pp micro-batches (round 11)."""
    return numbers.enabled(P2P_ORDER) and torch_p2p.applies(
        job.runtime, layout.schedule, layout.pp, layout.vpp, m,
        max_microbatches_per_rank=numbers.torch_p2p_order_max_microbatches_per_rank)


# ---- zero-bubble with full recomputation --------------------------------------------------
def zb_full_sets(numbers: CorrectionNumbers) -> tuple[float, float] | None:
    """Zero-bubble with full recomputation, runtime "torch", where the profile has no
    measured split-memory row (:mod:`meshplan.calibrate.split_memory` measures these per
    model shape; that row wins): (pending, transient) in non-recomputed activation sets per
    layer, or None when switched off.

    After a micro-batch's input-gradient pass the rank keeps 0.42 of the layers'
    non-recomputed activations until its W (the recomputed tensors that pass did not
    consume, and the output gradients W needs: 4.4-4.6 GiB per I on 10.7 GiB sets), and
    while a deferred W runs it holds 4.1 such sets more (+43.4-44.0 GiB):
    ``stage_backward_weight`` runs one autograd.grad per parameter group, and
    non-reentrant checkpointing re-runs a layer's forward for every such graph task.
    Measured with benchmarks/diag_stage_memory.py on 4 × H200, torch 2.11, Llama 1.64B
    (holdout6 j15 pp 2, holdout4 n16 pp 4, every rank r > 0 alike; round 6): read off those
    two layouts, so not a held-out result."""
    if not numbers.enabled(ZB_FULL_SETS):
        return None
    return numbers.zb_full_pending_sets, numbers.zb_full_w_transient_sets


def zb_full_w_passes(numbers: CorrectionNumbers, job: Job, layout: Layout,
                     split_measured: bool) -> float:
    """Zero-bubble with full recomputation under the torch runtime, where the layer's split
    backward was not measured: how many forwards of a layer its weight pass runs again
    (0 where it does not apply).

    torch.distributed.pipelining's ``stage_backward_weight`` computes the weight gradients
    with one ``torch.autograd.grad`` per parameter group, and non-reentrant checkpointing
    re-runs the layer's forward for each graph task that reaches it (stopping early once the
    tensors that task needs exist). The measured split rows hold it: with full recompute
    their W is their W without it plus 4.4-5.5 forwards of the layer, on GPT- and
    Llama-style layers at tp 1 and 2, 4 × H200 and 4 × H100
    (``zb_full_w_forward_passes``, data/corrections.toml). Without it the analytical split
    put zero-bubble full-recompute layouts 47-62 % under their measured steps when their
    model's rows were left out (benchmarks/transfer_analysis.py; post hoc)."""
    if (job.runtime != "torch" or layout.schedule != "zero-bubble"
            or layout.recompute != "full" or split_measured or not numbers.enabled(ZB_FULL_W)):
        return 0.0
    return numbers.zb_full_w_forward_passes


# ---- FSDP2 over data parallelism alone ----------------------------------------------------
def fsdp_dp_only(job: Job, layout: Layout) -> bool:
    """FSDP2 (ZeRO-2/3) over data parallelism alone under the torch runtime: dp > 1, no
    pipeline, no tensor parallelism — the layouts ``fsdp2_dp_only_step_s`` is measured on."""
    return (job.runtime == "torch" and layout.pp == 1 and layout.tp == 1 and layout.dp > 1
            and layout.zero >= 2)


def fsdp2_step_s(numbers: CorrectionNumbers, job: Job, layout: Layout) -> float:
    """GPU time a step beyond what the layer rows and the tail price, for FSDP2 over dp
    alone (:func:`fsdp_dp_only`): the profile's ``fsdp2_dp_only_step_s``, 0 by default.

    Measured on the executor before its explicit FSDP2 forward prefetch (bc12f8f), not
    explained: of the GPU-bound such layouts since holdout7 nearly all ran slower than
    predicted by about the same time a step (GPT-0.54B 13-27 ms, Llama-1.64B 0-42 ms,
    median about 20 ms), inside the passes (holdout20-24, pair16: measured forward +
    backward 15-38 ms over the rows'), not in proportion to compute or micro-batches; a
    constant fitted on 19 of them (round 22, post hoc) took GPT's 7.20 % mean error to
    1.48 %. The executor since starts each block's all-gather one block early
    (``executor.data_parallel.set_forward_prefetch``); its first such runs (round 38, 2 ×
    H200, t38m05 v19 ZeRO-2 and v20 ZeRO-3) measured their passes within 2 % of the rows
    and their steps equal to their phases, so the constant over-predicted them by 4-5 %
    (9-11 % on the generic profile) and the built-in number is 0 (data/corrections.toml).
    A profile of the old executor keeps 0.020 in its ``[corrections]`` table. Not applied
    to pipelined FSDP2 (the constant made it worse) nor over tp > 1."""
    if not fsdp_dp_only(job, layout) or not numbers.enabled(FSDP2_STEP):
        return 0.0
    return numbers.fsdp2_dp_only_step_s


# ---- memory: rules read from torch, placed by measurement ---------------------------------
def cast_cache_ranks(numbers: CorrectionNumbers, job: Job, layout: Layout, m: int,
                     cleared: bool) -> tuple[bool, ...]:
    """Per rank: whether its peak gets the cast-cache relief (``LayerTables.
    cast_cache_relief_bytes``): runtime "torch", full recomputation under autocast
    (``cleared``), a schedule of :data:`CAST_CACHE_SCHEDULES`, and a rank that runs every
    forward before its first backward (GPipe; 1F1B where the warm-up covers all m).
    holdout23 f13's first stage went from −5.7 % to +0.9 % with it, holdout16 z13's rank 0
    +2.6 → −0.6 %; applied to interleaved ranks it took the four measured from −0.5..+1.7 %
    to −1.4..−4.5 %, so they are left out (rounds 21-24, post hoc)."""
    if not (job.runtime == "torch" and cleared and layout.schedule in CAST_CACHE_SCHEDULES
            and numbers.enabled(CAST_CACHE)):
        return ()
    return tuple(first_backward.forwards_first(layout.schedule, layout.pp, layout.vpp, m, r)
                 for r in range(layout.pp))


# ---- context parallelism's ring ------------------------------------------------------------
def ring_interference(numbers: CorrectionNumbers) -> float:
    """Context parallelism, ring style (both runtimes): the share of each K/V or dK/dV
    transfer hidden behind a ring step's block attention that still costs time, as the
    overlap interference of other collectives (Rashidi et al. 2021, ISCA §3): the NCCL p2p
    kernels take SMs and HBM bandwidth from the flash kernel they run beside. Its number is
    the profile's ``cp_ring_interference``; the built-in value is an assumption (the
    datasheet overlap share) until the ring has been measured beside the block attention
    (benchmarks/context_parallel_gpu.py). 0 where switched off."""
    return numbers.cp_ring_interference if numbers.enabled(CP_RING) else 0.0


# ---- mixture of experts: the busiest expert rank --------------------------------------------
def load_imbalance(numbers: CorrectionNumbers, ep: int) -> float:
    """Mixture of experts with ep > 1 (both runtimes): the routed rows the busiest expert
    rank computes and receives over the mean, ρ ≥ 1. The all-to-alls make every rank of the
    ep group wait for the busiest, so its grouped GEMMs, its receive and its routed-token
    activations set the layer's time and memory (:mod:`meshplan.costmodel.moe_layer`).
    Routing depends on the model and the data, not the GPU: the built-in ρ = 1.25 is the
    Switch Transformer's training capacity factor (Fedus et al. 2021 §2.2), the profile's
    ``moe_load_imbalance`` replaces it. 1 where switched off or with ep = 1 (every routed
    row stays on its rank, only the total counts)."""
    if ep == 1 or not numbers.enabled(MOE_IMBALANCE):
        return 1.0
    return max(1.0, numbers.moe_load_imbalance)


def megatron_moe_host_s(numbers: CorrectionNumbers, gpu) -> float:
    """Runtime "megatron", an MoE layer: the host's seconds per micro-batch (forward +
    backward, half each), ``megatron_moe_layer_host_ops · host_op_dispatch_s``; 0 where
    switched off or the profile has no host numbers. Not applied to a run that replays CUDA
    graphs (``Job.cuda_graphs``: :func:`meshplan.costmodel.moe_host.host_terms`).

    Megatron-Core runs its MoE layers eagerly unless the run captures CUDA graphs (MLPerf's
    runs and NeMo's Mixtral 8x7B on B200 did; Megatron-Bridge's recipes graph attention and
    the router at most): router, permutation, the dispatcher's token counts read on the host, and
    TransformerEngine's per-expert GEMM sequence with its Python and C++ launch path
    (TE issue 1499: ``torch.split`` and 2 · num_gemms ``torch.empty`` calls a grouped
    linear). The host cannot run ahead past the dispatcher's synchronisation, so where its
    work exceeds the GPU's a pass costs the host's time
    (:func:`meshplan.costmodel.moe_host.host_terms`). Megatron-Core's MoE report names
    this host-boundedness the compute wall of fine-grained MoE (arXiv 2603.07685, §1).

    The operator count is not read from Megatron's code: it is fitted on published
    Megatron-Core / Megatron-Bridge MoE runs, and the host's speed is the profile's
    ``host_op_dispatch_s`` (measured by ``meshplan calibrate``); its fit and its held-out
    check: benchmarks/sets/megatron_moe_host/README.md."""
    if not numbers.enabled(MOE_HOST):
        return 0.0
    return numbers.megatron_moe_layer_host_ops * gpu.host_op_dispatch_s


def _megatron_moe_host(t) -> bool:
    return (t.model.is_moe and t.job.runtime == "megatron" and not t.job.cuda_graphs
            and megatron_moe_host_s(t.cluster.gpu.corrections, t.cluster.gpu) > 0)


def _moe_layout(t) -> bool:
    return t.model.is_moe and (t.given_layout or t.layout).ep > 1


def _ring_layout(t) -> bool:
    lay = t.given_layout
    return lay is not None and lay.cp > 1 and lay.cp_style == "ring"


@dataclass(frozen=True)
class Correction:
    """One named correction: where it applies (``applies(tables)`` on a built
    :class:`~meshplan.costmodel.tables.LayerTables`), what it moves, the profile keys of
    its numbers, and its mechanism (the docstring of the function that computes it)."""

    name: str
    moves: str                              # "step time" | "memory" | "step time and memory"
    profile_keys: tuple[str, ...]
    applies: Callable[[object], bool]
    effect: Callable
    runtimes: tuple[str, ...] = ("torch",)  # the runtimes it can apply to (a fast filter)

    @property
    def mechanism(self) -> str:
        return (self.effect.__doc__ or "").strip()


def _torch_zb_full(t) -> bool:
    return bool(t.wgrad_pending) and t.layout.recompute == "full" \
        and t.parts.wgrad_measured is None and any(t.wgrad_pending)


CORRECTIONS: tuple[Correction, ...] = (
    Correction(P2P_SLOWDOWN, "step time",
               ("torch_p2p_slowdown_per_op", "torch_p2p_slowdown_vpp_exponent",
                "torch_p2p_slowdown_max"),
               lambda t: torch_pipelined(t.job, t.layout.pp), stage_slowdown),
    Correction(P2P_ORDER, "step time", ("torch_p2p_order_max_microbatches_per_rank",),
               lambda t: p2p_order_applies(t.cluster.gpu.corrections, t.job, t.layout,
                                           t.num_microbatches), p2p_order_applies),
    Correction(ZB_FULL_SETS, "memory", ("zb_full_pending_sets", "zb_full_w_transient_sets"),
               _torch_zb_full, zb_full_sets),
    Correction(ZB_FULL_W, "step time", ("zb_full_w_forward_passes",),
               lambda t: t.zb_w_recompute_passes > 0, zb_full_w_passes),
    Correction(FSDP2_STEP, "step time", ("fsdp2_dp_only_step_s",),
               lambda t: fsdp_dp_only(t.job, t.layout), fsdp2_step_s),
    Correction(CAST_CACHE, "memory", (), lambda t: any(t.cache_cleared_ranks),
               cast_cache_ranks),
    Correction(CP_RING, "step time", ("cp_ring_interference",), _ring_layout,
               ring_interference, runtimes=("torch", "megatron")),
    Correction(MOE_IMBALANCE, "step time and memory", ("moe_load_imbalance",), _moe_layout,
               load_imbalance, runtimes=("torch", "megatron")),
    Correction(MOE_HOST, "step time", ("megatron_moe_layer_host_ops",), _megatron_moe_host,
               megatron_moe_host_s, runtimes=("megatron",)),
    # and each row's own sustained_ratio ([[layers]] / [[ends]])
    Correction(SUSTAINED_CLOCK, "step time", ("sustained_clock_share",), sustained_rows,
               sustained_clock),
    Correction(SUSTAINED_DUTY, "step time",
               ("sustained_power_exponent", "sustained_idle_power_share"),
               sustained_duty_applies, duty_scale),
)


def memory_rule(name: str, applies: Callable[[object], bool], effect: Callable) -> Correction:
    return Correction(name, "memory", (), applies, effect)


def unsharded_zb(job: Job, layout: Layout) -> bool:
    """Zero-bubble over FSDP2 accumulating unsharded gradients (a caveat, not priced)."""
    return layout.schedule == "zero-bubble" and fsdp_accumulates_unsharded(
        job, layout.zero, layout.dp, layout.pp)


__all__ = ["Correction", "CORRECTIONS", "CAST_CACHE_SCHEDULES",
           "stage_slowdown", "p2p_order_applies", "zb_full_sets", "zb_full_w_passes",
           "fsdp_dp_only", "fsdp2_step_s", "cast_cache_ranks", "memory_rule",
           "ring_interference", "load_imbalance"]
