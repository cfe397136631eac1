"""Mixture of experts in a layout's tables: MoE layers, the dense ones beside them, experts'
states over the expert data-parallel group.

The tables (:mod:`meshplan.costmodel.tables`) price one layer kind per stage, linear in its
layer count. For an MoE model that kind is the MoE layer: the attention, norms and shared
experts (:func:`meshplan.costmodel.compute.layer_cost` with the shared width as its MLP;
the per-layer parameters of :func:`meshplan.costmodel.memory.stage_params` are those of an
MoE layer without its routed experts: ZeRO over dp·cp, as every dense parameter) plus the
routed part (:mod:`meshplan.costmodel.moe_layer`). On top (:func:`moe_fields`):

* **experts' states** (``ExpertTerms``): E/ep experts at 1/etp width per MoE layer
  (:func:`meshplan.costmodel.moe.moe_params_per_rank`), weights, gradients and optimizer
  states ZeRO-sharded over the expert data-parallel group edp = tp·cp·dp/(ep·etp)
  (Megatron-Core's distributed optimizer over the expert-dp group; the executor's ZeRO-1
  and FSDP2 over edp); their gradients reduced over edp on its link
  (:func:`meshplan.costmodel.data_parallel.params_state`, after the dense ones:
  :func:`meshplan.costmodel.data_parallel.combined_state`) — under runtime "torch" at
  ZeRO-0/1 after the backward, none of it overlapped (the executor leaves the experts out of
  DDP: :func:`~meshplan.costmodel.data_parallel.reduced_after_backward`; post hoc, moeh7's
  and moeh8's ep 1 DDP layouts −8.0 / −6.2 % → −3.4 / −4.6 %); ZeRO-3 (and FSDP2's per
  micro-batch ZeRO-2) gathers them per layer over edp like the dense parameters over dp·cp;
* **dense layers** (``ModelSpec.dense_layers``, DeepSeek's first k): per dense layer the
  difference to an MoE layer in time (forward, backward, weight gradient), kept
  activations and states — :meth:`~meshplan.costmodel.stage_tables.TablesBase.dense_counts`
  places them by the partition, exactly in ``estimate``; the planner's per-rank memory caps
  count them where they cost more, and its partition model (CP-SAT) prices every layer as
  an MoE layer (``estimate`` re-prices what it returns);
* **multi-token prediction** (DeepSeek-V3 §2.2): each module as one more MoE layer and one
  more output layer on the last stage (time; its states, one micro-batch's activations and
  logits counted with the output layer's bytes); its parameters' gradient reduction is left
  out (under 2 % of a 61-layer model's);
* **host synchronisations** (:mod:`meshplan.costmodel.moe_host`): what the MoE layer's
  device-to-host syncs, and under runtime "megatron" its eager host work
  (:func:`meshplan.costmodel.corrections.megatron_moe_host_s`), add to its forward and
  backward (the passes' ``overhead_s``).

Process groups (Megatron-Core "MoE parallel folding", Liu et al. 2025, arXiv 2504.14960):
the expert mesh etp × ep × edp is laid over a stage's tp·cp·dp ranks in that order, etp
fastest: etp's ranks 1 apart, ep's etp apart, edp's ep·etp apart (:func:`expert_links`);
under ``rank_order = "tp-pp-dp"`` a group reaching past the stage's tp·cp block takes the
block's outer stride.

The first-backward relief (:mod:`meshplan.costmodel.memory_reliefs`, runtime torch) counts
the experts' gradients with the layer's: moeh3 (1 × H200, 2026-11-29, post hoc) ran its two
one-micro-batch layouts 7-13 % under the prediction that left them out, −1.3 / +0.1 % with them.

Measured error: whole estimates only (published MoE runs: docs/benchmarks/published.md,
20.5 % mean over 8 runs on datasheet profiles, 2026-12-04; calibrated never-run models on
2 × H200 as run: moeh6 8.0 %, moeh7 16.0 %, moeh8 6.9 % mean; moeh1-3 on one GPU 4.7-5.6 %:
docs/benchmarks/moe_checks.md, docs/benchmarks/gpu_checks.md).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from meshplan.costmodel import moe
from meshplan.costmodel.corrections import load_imbalance
from meshplan.costmodel.compute import hbm_s
from meshplan.costmodel.data_parallel import Zero3Layer, zero3_layer
from meshplan.costmodel.memory import (compute_weight_bytes_per_param, dense_layer_extra_params,
                                       state_bytes_per_param)
from meshplan.costmodel.moe_host import host_terms
from meshplan.costmodel.moe_layer import (routed_mlp, shared_width, with_cached_expert_weights,
                                          with_routed_mlp)
from meshplan.costmodel.moe_overlap import a2a_overlapped, paired_share, with_a2a_overlap
from meshplan.costmodel.parts import LayerParts
from meshplan.costmodel.runtime import expert_grad_copies, fsdp_per_microbatch
from meshplan.costmodel.torch_memory import state_bytes_at_peak
from meshplan.hardware_profiles import Cluster
from meshplan.spec import Job, Layout, ModelSpec

MOE_CAVEAT = (
    "mixture of experts: measured runs of meshplan's executor came out 4-20 % from their "
    "calibrated predictions (docs/benchmarks/moe_checks.md, GPU check); the routed load of "
    "the busiest expert rank (moe_load_imbalance) is assumed and the grouped expert GEMMs "
    "use the dense GEMM curve unless the profile has a grouped_gemm_efficiency curve")

# Published Megatron-Core / Megatron-Bridge MoE runs against datasheet predictions
# (docs/benchmarks/published.md's summary; tests/unit/test_moe_caveat_figures.py keeps the
# caveat's figures equal to it): with Megatron's host work per MoE layer (fitted post hoc on
# them) and B200's attention from NVIDIA's published cuDNN sweep, BF16 8 rows 14.1 % mean,
# FP8 / MXFP8 18 rows 13.2 %, MLPerf v6.0 GPT-OSS-20B on one B200 node 3 rows 17.7 %,
# NeMo / DGX Cloud Mixtral and DeepSeek-V3 4 rows 8.1 %; 21 of the 33 ran slower than
# predicted; held out, GPT-OSS-120B 5 rows 29.5 %, user-reported single-node runs 3 rows 18.6 %.
MOE_DATASHEET_CAVEAT = (
    "mixture of experts on a profile without measured rows: published Megatron MoE runs took "
    "longer than such predictions in 21 of 33 cases (BF16: 14.1 % mean error; FP8 / MXFP8: "
    "13.2 %; 17.7 % on one B200 node with CUDA graphs and no all-to-all; GPT-OSS-120B held "
    "out: 29.5 %; docs/benchmarks/published.md), with Megatron's host work per eager MoE "
    "layer priced as one number fitted on those runs: small expert GEMMs, permutation, "
    "the router and host launches cost more than their FLOPs and bytes say. Read this step "
    "as optimistic; `meshplan calibrate --model` times the model's MoE layer")


@dataclass(frozen=True)
class ExpertTerms:
    """What the tables need about an MoE model's experts and dense layers."""

    params_per_layer: float        # routed-expert parameters of one MoE layer on one rank
    edp: int
    edp_link: object
    zero3: Zero3Layer              # per-layer gathers of the experts (ZeRO-3 / FSDP2)
    dense_layers: tuple[int, ...]  # ModelSpec.dense_layers
    dense_extra_params: float      # a dense layer's non-expert params less an MoE layer's
    # the layer comes from a measured MoE row (costmodel.moe_rows), whose kept bytes hold the
    # experts' 16-bit copies per micro-batch: the executor casts them at every call
    copies_in_rows: bool = False

    def copy_bytes(self, params: float, job: Job, zero: int) -> float:
        """16-bit compute copies of ``params`` expert parameters (runtime "torch"): autocast
        or FSDP2's ZeRO-2 keep them, ZeRO-3 gathers two layers (a buffer) — at edp = 1 too,
        since the executor shards the experts with FSDP2 over edp whatever its size
        (``expert_parallel.prepare_data_parallel``: a one-rank mesh that still frees the
        gathered copy after forward; moeh6, 2 × H200: its two ZeRO-3 layouts at ep 2 = dp,
        priced with a copy kept, held 3.2 GiB less than predicted); none beside a measured
        row that holds them."""
        if zero == 3 or (self.copies_in_rows and zero < 2):
            return 0.0
        return params * compute_weight_bytes_per_param(job)


def expert_links(cluster: Cluster, layout: Layout) -> dict:
    """ep, etp and edp links of the folded expert mesh (module docstring)."""
    tp, cp, dp, pp = layout.tp, layout.cp, layout.dp, layout.pp
    ep, etp = layout.ep, layout.etp
    edp = tp * cp * dp // (ep * etp)
    block = tp * cp

    def link(size: int, stride: int):
        if size == 1 or cluster.rank_order == "tp-dp-pp" or size * stride <= block:
            return cluster.group_link(size, stride)
        if stride % block == 0:          # whole blocks: the stage's dp stride is tp·cp·pp
            return cluster.group_link(size, stride * pp)
        return replace(cluster.group_link(size * stride // block, block * pp), size=size)

    return dict(etp=link(etp, 1), ep=link(ep, etp), edp=link(edp, ep * etp))


def moe_parts(model: ModelSpec, cluster: Cluster, job: Job, layout: Layout, links,
              shared: LayerParts) -> LayerParts:
    """An MoE layer's parts: ``shared`` (the layer with its shared experts as MLP) plus the
    routed experts (:mod:`meshplan.costmodel.moe_layer`)."""
    rho = load_imbalance(cluster.gpu.corrections, layout.ep)
    routed = routed_mlp(model, cluster, job, layout, links, rho)
    parts = with_routed_mlp(shared, routed, layout.recompute, job.selective_modules)
    parts = with_cached_expert_weights(parts, model, job, layout, routed.fp8)
    if a2a_overlapped(job, layout):
        share = paired_share(layout, layout.num_microbatches(job.global_batch))
        fwd, bwd = with_a2a_overlap(parts.layer.forward, parts.layer.backward,
                                    shared.layer.forward, shared.layer.backward,
                                    routed.forward, routed.backward, share,
                                    cluster.gpu.overlap_interference)
        parts = replace(parts, layer=replace(parts.layer, forward=fwd, backward=bwd))
    lay = parts.layer
    host = host_terms(model, job, layout, cluster.gpu, links, forward_s=lay.forward.total_s,
                      backward_s=lay.backward.total_s)
    if not (host.forward_s or host.backward_s):
        return parts
    fwd = replace(lay.forward, overhead_s=lay.forward.overhead_s + host.forward_s)
    bwd = replace(lay.backward, overhead_s=lay.backward.overhead_s + host.backward_s)
    rc = (replace(lay.recompute, overhead_s=lay.recompute.overhead_s + host.forward_s)
          if layout.recompute == "full" else lay.recompute)
    return replace(parts, layer=replace(lay, forward=fwd, backward=bwd, recompute=rc))


def moe_mlp_width(model: ModelSpec) -> int | None:
    """The dense MLP width an MoE model's table layer keeps (None: a dense model's own)."""
    return shared_width(model) if model.is_moe else None


def expert_terms(model: ModelSpec, cluster: Cluster, job: Job, layout: Layout, links,
                 moe_layer, *, copies_in_rows: bool = False,
                 fsdp_measured: bool = False) -> ExpertTerms:
    """``layout``: as the tables see it (dp·cp as dp); ``moe_layer``: its LayerCost. The
    experts' ZeRO-3 gathers overlap the same layer compute as the dense ones (each priced
    as if alone: optimistic where both are large). ``fsdp_measured``: the layer's FSDP2 row
    at the layout's ep holds the experts' gathers and copies (the build reads it), so none
    are priced here (:func:`meshplan.costmodel.moe_rows.fsdp_row_at_ep`)."""
    params = moe.moe_params_per_rank(model, layout).experts
    edp = layout.tp * layout.dp // (layout.ep * layout.etp)
    z3 = (Zero3Layer() if fsdp_measured else
          zero3_layer(moe_layer, params, links.edp, edp, layout.zero, job, layout.pp,
                      cluster.gpu.dp_overlap_interference, params) if edp > 1
          else one_rank_fsdp_copies(cluster, job, layout, params))
    return ExpertTerms(params, edp, links.edp, z3, tuple(model.dense_layers),
                       dense_layer_extra_params(model, layout.tp), copies_in_rows)


#: bytes per expert parameter FSDP2 moves on the compute stream at each unshard over a
#: 1-rank mesh: the fp32 shard cast to the bf16 all-gather input (4 read + 2 written) and
#: copied into the unsharded parameter (2 + 2)
ONE_RANK_UNSHARD_BYTES = 10.0
#: and at each reduction, before its stream takes over: the bf16 gradient cast into the fp32
#: reduce-scatter input (2 + 4)
ONE_RANK_REDUCE_COPY_IN_BYTES = 6.0


def one_rank_fsdp_copies(cluster: Cluster, job: Job, layout: Layout,
                         params: float) -> Zero3Layer:
    """What FSDP2 costs an MoE layer's experts per micro-batch where the executor shards them
    over an expert data-parallel group of one rank (ZeRO-2/3 with edp = 1: it applies
    ``fully_shard`` over edp whatever its size, ``executor.expert_parallel.
    prepare_data_parallel``). No collective runs, but the bytes still move: torch's
    ``FSDPParamGroup.unshard`` / ``wait_for_unshard`` on one rank cast the fp32 shard to the
    bf16 all-gather input and copy it into the unsharded parameter, on the compute stream,
    at each forward (and, ZeRO-3, again in the backward); ``foreach_reduce`` casts the bf16
    gradients into its fp32 input on the compute stream before its own stream copies and
    accumulates them (torch 2.13's ``_fsdp_param_group.py`` one-rank path and
    ``_fsdp_collectives.py``; a torch without that path moves the same bytes through its
    all-gather copy-in and copy-out; the reduce stream's part is taken as hidden behind the
    next layer's backward). Memory-bound,
    at the profile's HBM rate. Runtime "torch" only; nothing where FSDP2 is not per
    micro-batch.

    Measured error (2 × H200, post hoc, docs/benchmarks/moe_checks.md "moeh8"): the ZeRO-2/3 ep 2
    layouts of moeh8 −7.1 / −15.9 % → −1.5 / −4.4 %, of moeh7 −14.1 / −38.3 / −11.7 % → −7.6 / −21.9
    / +3.4 %, but of moeh6 −5.1 / −3.8 / −0.9 / +4.4 % → +1.6 / +5.7 / +15.2 / +21.1 % (its
    ZeRO-3 layouts ran faster than its ZeRO-2 one; whether its GPU hid the copies is not
    known). As run on moeh9 (drawn before the term): +12.0 / +22.1 / +7.8 / +14.1 %, without
    it +2.6 / +14.8 / −10.4 / +7.3 %; over the 13 ZeRO-2/3 ep 2 layouts of moeh6-moeh9,
    10.6 % mean error with it, 10.5 % without — what it prices does not separate them."""
    if job.runtime != "torch" or not fsdp_per_microbatch(job, layout.zero, layout.pp):
        return Zero3Layer()
    gpu = cluster.gpu
    unshard = hbm_s(gpu, params * ONE_RANK_UNSHARD_BYTES)
    copy_in = hbm_s(gpu, params * ONE_RANK_REDUCE_COPY_IN_BYTES)
    backward = copy_in + (unshard if layout.zero == 3 else 0.0)
    return Zero3Layer(unshard, backward, 0.0, unshard + backward)


def moe_fields(model: ModelSpec, cluster: Cluster, job: Job, layout: Layout, fields: dict,
               dense: LayerParts | None, terms: ExpertTerms) -> dict:
    """``fields`` of :func:`meshplan.costmodel.build.build_fields` priced with the MoE
    layer, completed with the experts, the dense layers and multi-token prediction (module
    docstring). ``layout`` as the tables see it."""
    f = dict(fields)
    per = state_bytes_per_param(job)
    zero, pp, copies = layout.zero, layout.pp, f["grad_copies"]

    def states(params: float, group: int, grad_copies: int = copies) -> float:
        return (sum(state_bytes_at_peak(params, job, zero, group, pp))
                + (grad_copies - 1) * params * per.grads)

    expert_state = states(terms.params_per_layer, terms.edp,
                          expert_grad_copies(job, copies)) + terms.copy_bytes(
        terms.params_per_layer, job, zero)
    z3e = terms.zero3
    if f.get("relief_layer_grad_bytes"):
        # a layer's gradients appear in its first backward of the step, its experts' too
        # (zero_grad(set_to_none=True) covers every parameter: memory_reliefs)
        f["relief_layer_grad_bytes"] += state_bytes_at_peak(
            terms.params_per_layer, job, zero, terms.edp, pp)[1]
    f.update(experts=terms, layer_state_bytes=f["layer_state_bytes"] + expert_state,
             layer_forward_s=f["layer_forward_s"] + z3e.forward_s,
             layer_backward_s=f["layer_backward_s"] + z3e.backward_s)
    if zero == 3:   # two gathered layers' experts (FSDP2 over edp, one rank included)
        f["buffer_bytes"] += 2 * terms.params_per_layer * (
            compute_weight_bytes_per_param(job) or per.weights)
    if dense is not None and terms.dense_layers:
        moe_layer = f["parts"].layer
        extra = terms.dense_extra_params
        copy_b = compute_weight_bytes_per_param(job) if not (zero == 3 and layout.dp > 1) \
            else 0.0
        f.update(
            dense_delta_forward_s=dense.layer.forward.total_s - moe_layer.forward.total_s,
            dense_delta_backward_s=dense.layer.backward.total_s - moe_layer.backward.total_s,
            dense_delta_wgrad_s=dense.layer.wgrad_s - moe_layer.wgrad_s,
            dense_delta_activation_bytes=dense.activation_bytes - f["parts"].activation_bytes,
            # a dense layer has no routed experts, nor their fp8 weight cache
            dense_delta_state_bytes=states(extra, layout.dp) + extra * copy_b - expert_state
            - (f["parts"].fp8.expert_weight_copy_bytes if f["parts"].fp8 is not None else 0.0))
    if model.mtp_layers:
        n, parts = model.mtp_layers, f["parts"]
        lf, lb, lw = parts.logits
        last = f["last_rank"]
        mtp_bytes = n * (f["layer_state_bytes"] + f["inflight"][last] * f["layer_activation_bytes"]
                         + parts.logits_bytes)
        f.update(last_forward_s=f["last_forward_s"] + n * (f["layer_forward_s"] + lf.total_s),
                 last_backward_s=f["last_backward_s"] + n * (f["layer_backward_s"] + lb.total_s),
                 last_wgrad_s=f["last_wgrad_s"] + n * (f["layer_wgrad_s"] + lw))
        # counted with the output layer's bytes (the last rank's logits column), which
        # both the per-rank tables and estimate's rows read
        f["logits_bytes"] += mtp_bytes
        f["first_extra_bytes" if pp == 1 else "last_extra_bytes"] += mtp_bytes
    return f


__all__ = ["ExpertTerms", "MOE_CAVEAT", "MOE_DATASHEET_CAVEAT", "expert_links", "expert_terms",
           "moe_fields", "moe_mlp_width", "moe_parts"]
