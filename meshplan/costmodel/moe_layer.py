"""The routed part of one MoE layer on one rank, per micro-batch: time, bytes sent, memory.

An MoE layer is priced as the dense layer of :func:`meshplan.costmodel.compute.layer_cost`
with its MLP replaced: the attention, the norms and the shared experts (a dense MLP of the
shared experts' total width, with its tensor-parallel collectives) come from there
(``mlp_width``), the routed experts from here (:func:`routed_mlp`). Per micro-batch each
rank routes T = b·s/(tp·cp) tokens (its sequence-parallel slice; :mod:`meshplan.costmodel.moe`
has the formulas and their sources) and the busiest expert rank computes
R = ρ·k·T·etp rows (``routed_tokens_per_rank``), ρ the profile's ``moe_load_imbalance``
(:func:`meshplan.costmodel.corrections.load_imbalance`; 1 with ep = 1).

* **Router**: the h × E gate GEMM; softmax/sigmoid and top-k over T·E fp32 scores,
  memory-bound (read logits, write probabilities, read them for the top-k: 12 bytes each).
* **Permutation** (memory-bound, Megatron-Core's ``permute`` / ``unpermute`` and the
  executor's sort): the k·T routed copies gathered into expert order (read + write
  k·T·h·e), the received rows regrouped by local expert before and after the experts
  (2 × read + write R·h·e; the executor's grouped GEMM pads each group in and out, and
  with ep > 1 it also regroups the received rows by expert and back: twice that), and the
  combine's weighted sum (read k copies, write the token:
  (k + 1)·T·h·e), at the profile's ``membound_efficiency["moe-permute"]`` (``meshplan
  calibrate --model`` times the executor's gather, padding copies and combine, forward and
  backward, at the model's shapes: ``calibrate/bench_moe.py``), else its rate at the model's
  top-k (``moe_permute_efficiency_by_top_k``: the H200 datasheet's, 0.274 at top-2 and
  0.373 at top-8, the medians of calibrate's rows; post hoc after moeh48, whose top-8
  what-if was fixed before it ran: docs/benchmarks/moe_checks.md), else its pooled
  ``hbm_efficiency``.
* **Grouped expert GEMMs**: E/ep local experts, each on R·ep/E rows: fc1 (h → m·f_e/etp) and
  fc2 (f_e/etp → h), each at the profile's ``grouped_gemm_efficiency`` curve by one
  expert's GEMM FLOPs, or where the profile has none, the dense GEMM curve at that
  per-expert shape (a grouped GEMM runs the experts' GEMMs one after another on the GPU:
  many small GEMMs at a small GEMM's efficiency); the activation function memory-bound on
  R·(m + 1)·f_e/etp elements (at the dense activation's measured efficiency where the
  profile has one). ``meshplan calibrate --model`` with an MoE model times the grouped
  GEMMs at the model's expert shapes and writes the curve. Backward 2× the GEMMs
  (Narayanan et al. 2021 §5.1) and the memory traffic; the weight-gradient GEMMs
  (zero-bubble's W) one forward's worth. The experts and the router are priced at the
  16-bit peak; an fp8 job moves the experts to fp8 (:mod:`meshplan.costmodel.fp8_experts`:
  TransformerEngine's grouped linears under runtime "megatron", the executor's fp8 grouped
  GEMMs under "torch" with recipe ``rowwise``).
* **Dispatch and combine**: 2 all-to-alls per pass on the ep group's link
  (:func:`meshplan.costmodel.moe.all_to_all_s`: inside a node at NVLink's bus bandwidth,
  across nodes the other nodes' share at the rank's share of its node's NICs), each moving
  k·T·h·e·(ep−1)/ep per rank;
  the busiest rank receives ρ times that, which sets the collective's time; with
  ``Job.moe_dispatcher = "deepep"`` a token crosses once per rank (and once per node) that
  holds any of its experts instead (:mod:`meshplan.costmodel.moe_dispatch`). With etp > 1
  the rows are all-gathered over etp after the dispatch and reduce-scattered before the
  combine. Exposed: neither runtime overlaps them by default
  (:func:`meshplan.costmodel.runtime.moe_dispatch_overlapped`). tp > 1 without sequence
  parallelism: the executor all-gathers the layer's output over tp in forward
  (:func:`meshplan.costmodel.runtime.moe_tokens_sliced_over_tp`).
* **Memory** (:func:`meshplan.costmodel.moe.moe_activation_bytes`; runtime "torch": the
  executor's own tensors, :mod:`meshplan.costmodel.moe_torch_memory`): kept for backward
  the router's probabilities and gates and the R rows' expert input, fc1 output, activation
  output and expert output; the send and receive buffers of the dispatch (2·R·h·e) are
  working memory of the layer's passes.

Named correction, :func:`with_cached_expert_weights`: the executor's fp8 routed experts cast
their weights once a step where :func:`meshplan.costmodel.fp8_experts.expert_weights_cached`
says so, else in every pass; a layer composed here casts them in every pass, a calibration
row as it says (``MeasuredLayer.fp8_weights_cached``), and the correction moves the casts to
where the layout runs them.

Full recomputation re-runs the forward (its all-to-alls too: 6 per layer and micro-batch,
:func:`meshplan.costmodel.moe.all_to_alls_per_layer`), except, in a compiled block, the
executor's fp8 expert GEMMs and their rows' casts, whose outputs Inductor keeps
(:func:`meshplan.costmodel.fp8_experts.recompute_keeps_expert_outputs`) — and the layer
then keeps those outputs, fc1's and fc2's (``RoutedMlp.kept_output_bytes``); selective
recomputation re-runs what ``Job.recompute_modules`` names: the attention core (default), the
norms (:func:`meshplan.costmodel.compute.layer_cost`) and, with "moe_act", the routed
experts' activation function, whose output (R·f_e/etp elements) is then not kept.

Measured error: docs/benchmarks/moe_checks.md "GPU check" (4 × H200, 8 layouts of a 1.9B MoE: saved
profile 23.6 % mean step-time error post hoc, datasheet 53.9 %); on one H200 from profiles with
MoE layer rows, never-run models as run: moeh1 5.6 % mean / 8.0 % max (compiled layouts
6 % fast: the executor's skew-sensitive count, since removed; post hoc 1.7 / 3.6 %), moeh2
4.7 % / 17.3 % (the max host-bound), memory within 0.4 %; moeh3 at drawn layouts 4.7 % /
11.4 % (the two host-bound layouts 9-11 % slow), memory within 0.3 % on 4 of 6 (post hoc 6 of
6 within 1.3 %: the experts' gradients in the first-backward relief); and
docs/benchmarks/published.md.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, NamedTuple

from meshplan.costmodel import comm, moe, moe_dispatch, moe_torch_memory
from meshplan.costmodel.moe import shared_width
from meshplan.costmodel.compute import (LayerCost, PassCost, gemm_s, hbm_s,
                                        sixteen_bit_precision)
from meshplan.costmodel.fp8_experts import (Fp8Experts, expert_weights_cached, fp8_experts,
                                            keeps_fc1_cast, recompute_keeps_expert_outputs,
                                            torch_experts_fp8)
from meshplan.costmodel.memory import activation_bytes_per_element
from meshplan.costmodel.runtime import moe_dispatch_overlapped, moe_tokens_sliced_over_tp
from meshplan.hardware_profiles import Cluster, GPUSpec
from meshplan.hardware_profiles.curve import op_curve
from meshplan.hardware_profiles.grouped_gemm import grouped_call_s
from meshplan.spec import Job, Layout, ModelSpec

if TYPE_CHECKING:      # parts reads the measured rows, whose scaling prices routed_mlp
    from meshplan.costmodel.parts import LayerParts

ROUTER_SCORE_BYTES = 12   # fp32 logits read, probabilities written, read again for top-k
PERMUTE_OP = "moe-permute"   # the permutation's entry in the profile's membound_efficiency


@dataclass(frozen=True)
class RoutedMlp:
    """The routed part of one MoE layer, one micro-batch, one rank (module docstring)."""

    forward: PassCost
    backward: PassCost        # without recomputation
    wgrad_s: float            # weight-gradient GEMMs inside ``backward``
    pass_wire_bytes: float    # bytes each rank sends in one pass (all-to-alls, etp gathers)
    kept_bytes: float         # router and routed-row activations kept for backward
    work_bytes: float         # dispatch send + receive buffers while the layer runs
    rows: float               # routed rows the busiest expert rank computes
    act_out_bytes: float = 0.0   # the activation function's output, within kept_bytes
    act_s: float = 0.0           # the activation function's forward (memory-bound)
    fp8: Fp8Experts | None = None   # fp8 experts' per-step and per-layer terms (TE)
    # within ``forward``: what full recomputation does not re-run (the executor's compiled
    # fp8 experts' GEMMs and their rows' casts: :func:`~meshplan.costmodel.fp8_experts.
    # recompute_keeps_expert_outputs`)
    not_rerun: PassCost = PassCost()
    # what that recomputation keeps instead: the fp8 grouped GEMMs' 16-bit outputs, fc1's
    # (R·m·f_e/etp) and fc2's (R·h) — measured: moeh33's compiled fp8 block at 64 k tokens kept
    # [131,200 × 10,240] and [131,200 × 2,048] bf16 besides its input
    # (benchmarks/moe_recompute_memory_gpu.py --fp8 rowwise)
    kept_output_bytes: float = 0.0


def permute_efficiency(gpu: GPUSpec, top_k: int) -> float:
    """HBM efficiency of the permutation: the profile's measured ``membound_efficiency
    ["moe-permute"]``, else its rate at the model's top-k
    (``moe_permute_efficiency_by_top_k``: the H200 datasheet's, from calibrate's rows at
    top-2 and top-8 — the bytes of k copies move faster per byte at larger k), else the
    pooled ``hbm_efficiency``."""
    if PERMUTE_OP in gpu.membound_efficiency:
        return gpu.op_hbm_efficiency(PERMUTE_OP)
    if gpu.moe_permute_efficiency_by_top_k is not None:
        return gpu.moe_permute_efficiency_by_top_k(top_k)
    return gpu.hbm_efficiency


def expert_gemm_s(cluster: Cluster, peak: float, groups: float, rows: float, k: float,
                  n: float) -> float:
    """The forward of one grouped GEMM of ``groups`` local experts, ``rows`` rows each
    (k → n): the profile's grouped curve by the whole call's tile-padded FLOPs
    (:mod:`meshplan.hardware_profiles.grouped_gemm`; by one expert's FLOPs where the profile
    says ``grouped_gemm_key = "expert"``), or, where the profile has none, each expert's GEMM
    on the dense curve at its own shape (module docstring)."""
    gpu = cluster.gpu
    if groups <= 0 or rows <= 0:
        return 0.0
    curve, one = gpu.grouped_gemm_efficiency, 2.0 * rows * k * n
    if curve is None:
        return groups * gemm_s(gpu, peak, one)
    if gpu.grouped_gemm_key == "expert":
        return groups * one / (peak * curve(one))
    return grouped_call_s(gpu.grouped_gemm_efficiency, peak, groups, rows, k, n)


def routed_mlp(model: ModelSpec, cluster: Cluster, job: Job, layout: Layout, links,
               imbalance: float) -> RoutedMlp:
    """The routed experts of one MoE layer; ``job`` holds the rank's tokens per sequence
    (s/cp under context parallelism), ``links`` the tp, ep and etp groups."""
    gpu = cluster.gpu
    peak = gpu.peak_flops(sixteen_bit_precision(job))
    e = activation_bytes_per_element(job)
    h, k, n_exp = model.hidden_size, model.experts_per_token, model.num_experts
    tp, ep, etp = layout.tp, layout.ep, layout.etp
    tokens = layout.micro_batch * job.seq_len / tp
    rows = moe.routed_tokens_per_rank(model, layout, tokens, imbalance=imbalance)
    local = n_exp / ep
    f_loc = model.moe_ffn_hidden_size / etp
    per_expert = rows / local
    experts_s = (expert_gemm_s(cluster, peak, local, per_expert, h, model.ffn_matrices * f_loc)
                 + expert_gemm_s(cluster, peak, local, per_expert, f_loc, h))
    f8 = fp8_experts(cluster, job, rows_per_expert=per_expert, local_experts=local, hidden=h,
                     fc1_width=model.ffn_matrices * f_loc, fc2_width=f_loc,
                     compile=layout.compile, zero=layout.zero,
                     fc1_cast_kept=keeps_fc1_cast(layout))
    if f8 is not None:
        experts_s *= f8.gemm_ratio
    router_s = gemm_s(gpu, peak, 2.0 * tokens * h * n_exp)
    # runtime "torch" with ep > 1 regroups the received rows by expert and back, besides
    # the grouped GEMM's padding copies (executor/moe.py ``_run_experts``)
    regroups = 2 if ep > 1 and job.runtime == "torch" else 1
    permute_bytes = (2 * k * tokens * h * e + 4 * regroups * rows * h * e
                     + (k + 1) * tokens * h * e)
    act_s = hbm_s(gpu, rows * (model.ffn_matrices + 1) * f_loc * e, model.activation)
    fwd_mb = (hbm_s(gpu, tokens * n_exp * ROUTER_SCORE_BYTES)
              + permute_bytes / (gpu.hbm_gbps * 1e9 * permute_efficiency(gpu, k)) + act_s)
    if ep > 1 and job.moe_dispatcher == "deepep":
        nvl_b, net_b = moe_dispatch.dedup_dispatch_bytes(model, job, links.ep, tokens)
        sent = nvl_b + net_b
        a2a = 2 * moe_dispatch.dedup_dispatch_s(links.ep, nvl_b * imbalance, net_b * imbalance,
                                                gpu.nvlink_gbps, gpu.nvlink_efficiency)
    else:
        sent = moe.dispatch_bytes_per_rank(model, job, layout, tokens)
        # the node's share of a cross-node all-to-all over NVLink, priced from the GPU: its
        # measured all-to-all curve, else its collectives' curve (as a link chooses)
        a2a_eff = op_curve(gpu.nvlink_all_to_all_efficiency, gpu.nvlink_efficiency)
        a2a = 2 * moe.all_to_all_s(links.ep, sent * imbalance, gpu.nvlink_gbps,
                                   a2a_eff) if ep > 1 else 0.0
    etp_s = 2 * comm.all_gather_s(links.etp, rows * h * e) if etp > 1 else 0.0
    ep_s = a2a + etp_s
    if moe_dispatch_overlapped(job):
        ep_s = comm.exposed(ep_s, experts_s, gpu.overlap_interference)
    tp_gather = (comm.all_gather_s(links.tp, tokens * tp * h * e)
                 if tp > 1 and moe_tokens_sliced_over_tp(job, layout.sequence_parallel)
                 else 0.0)
    wire = 2 * (sent if ep > 1 else 0.0) + 2 * comm.wire_bytes_gather(etp, rows * h * e)
    cast_f, cast_b = (f8.forward_cast_s, f8.backward_cast_s) if f8 is not None else (0.0, 0.0)
    fwd = PassCost(gemm_s=experts_s + router_s, memory_bound_s=fwd_mb + cast_f,
                   tp_comm_s=tp_gather, ep_comm_s=ep_s)
    kept_outputs = f8 is not None and recompute_keeps_expert_outputs(job, layout)
    # the rows' casts go with the GEMMs; the weights' casts are re-run (their input, the
    # parameter, is at hand: the partitioner recomputes such a cast rather than keep it)
    not_rerun = (PassCost(gemm_s=experts_s, memory_bound_s=cast_f - f8.weight_forward_cast_s)
                 if kept_outputs else PassCost())
    kept_outputs_b = rows * (model.ffn_matrices * f_loc + h) * e if kept_outputs else 0.0
    bwd = PassCost(gemm_s=2 * (experts_s + router_s), memory_bound_s=2 * fwd_mb + cast_b,
                   ep_comm_s=ep_s)
    acts = (moe_torch_memory.routed_activations(model, job, layout, tokens, rows)
            if job.runtime == "torch" else
            moe.moe_activation_bytes(model, job, layout, tokens, imbalance=imbalance))
    kept, act_out = acts.router_bytes + acts.expert_bytes, rows * f_loc * e
    if f8 is not None:      # TE saves the two GEMMs' inputs in fp8
        kept += f8.fc1_input_delta_bytes + f8.fc2_input_delta_bytes
        act_out += f8.fc2_input_delta_bytes
    return RoutedMlp(fwd, bwd, experts_s + router_s, wire, kept, acts.dispatch_bytes, rows,
                     act_out_bytes=act_out, act_s=act_s, fp8=f8, not_rerun=not_rerun,
                     kept_output_bytes=kept_outputs_b)


class RoutedAdded(NamedTuple):
    """What the routed part adds to one layer beyond its forward and backward passes."""

    rerun: PassCost           # its work re-run in backward (the recomputed forward's part)
    kept_bytes: float         # kept for backward
    work_bytes: float         # the backward's working memory


def routed_added(routed: RoutedMlp, recompute: str,
                 selective_modules: tuple[str, ...] = ("core_attn",)) -> RoutedAdded:
    """Full recomputation re-runs the routed forward, less what it keeps
    (``routed.not_rerun``), and keeps none of its activations but those outputs
    (``routed.kept_output_bytes``; the rest are rebuilt as backward working memory); selective
    recomputation with "moe_act" among
    ``selective_modules`` (``Job.recompute_modules``, Megatron-Core's ``--recompute-modules
    moe_act``) keeps no activation output and re-runs the activation in backward."""
    full = recompute == "full"
    act_rc = recompute == "selective" and "moe_act" in selective_modules
    rerun = (routed.forward - routed.not_rerun if full
             else PassCost(memory_bound_s=routed.act_s) if act_rc else PassCost())
    kept = (routed.kept_output_bytes if full
            else routed.kept_bytes - (routed.act_out_bytes if act_rc else 0.0))
    # the recomputed layer rebuilds its activations as working memory, less the outputs it
    # kept (already counted in ``kept``)
    rebuilt = routed.kept_bytes - routed.kept_output_bytes if full else 0.0
    return RoutedAdded(rerun, kept, routed.work_bytes + rebuilt)


def with_routed_mlp(parts: LayerParts, routed: RoutedMlp, recompute: str,
                    selective_modules: tuple[str, ...] = ("core_attn",)) -> LayerParts:
    """``parts`` (a layer with the shared experts as its MLP) with the routed part added:
    time in forward, backward (and what recomputation re-runs: :func:`routed_added`), bytes
    sent, kept activations and working memory."""
    lay = parts.layer
    add = routed_added(routed, recompute, selective_modules)
    layer = LayerCost(lay.forward + routed.forward,
                      lay.backward + routed.backward + add.rerun,
                      lay.recompute + add.rerun, lay.wgrad_s + routed.wgrad_s,
                      lay.tp_wire_bytes, lay.wgrad_gather_s, lay.wgrad_gather_wire_bytes,
                      cp_wire_bytes=lay.cp_wire_bytes,
                      ep_wire_bytes=routed.pass_wire_bytes * (3 if recompute == "full" else 2))
    if routed.fp8 is not None and parts.fp8 is not None:
        parts = replace(parts, fp8=replace(
            parts.fp8, weight_cast_step_s=parts.fp8.weight_cast_step_s
            + routed.fp8.weight_cast_step_s,
            expert_weight_copy_bytes=routed.fp8.weight_copy_bytes))
    return replace(parts, layer=layer,
                   activation_bytes=parts.activation_bytes + add.kept_bytes,
                   full_act_bytes=parts.full_act_bytes + routed.kept_bytes,
                   backward_buf_bytes=parts.backward_buf_bytes + add.work_bytes)


def with_cached_expert_weights(parts: LayerParts, model: ModelSpec, job: Job, layout: Layout,
                               f8: Fp8Experts | None) -> LayerParts:
    """``parts`` as the executor runs fp8 routed experts, whose weights it casts once a step
    where :func:`~meshplan.costmodel.fp8_experts.expert_weights_cached` says, else in every
    pass. ``parts`` is composed or from a row that cast them in every pass, or from a row
    timed with them cast beforehand (``parts.fp8.row_expert_weights_cached``):

    * cast once a step, from a row that cast in every pass (or composed): ``f8``'s weight
      casts come off each forward (and full recompute's second one) and each backward;
    * cast in every pass, from a row timed with them cast beforehand: they go on there;
    * cast once a step either way: ``weight_cast_step_s`` goes on (spread over the
      micro-batches by the build) and the two fp8 copies' bytes are held with the weights.

    Unchanged where the experts do not run the executor's fp8 or the row timed as it runs."""
    if f8 is None or parts.fp8 is None or not torch_experts_fp8(model, job):
        return parts
    cached = expert_weights_cached(layout.zero, layout.num_microbatches(job.global_batch),
                                   layout.recompute)
    row_cached = parts.fp8.row_expert_weights_cached
    lay = parts.layer
    if cached != row_cached:
        sign = -1.0 if cached else 1.0
        fwd = PassCost(memory_bound_s=sign * f8.weight_forward_cast_s)
        rerun = fwd if layout.recompute == "full" else PassCost()
        lay = replace(lay, forward=lay.forward + fwd, backward=lay.backward + rerun
                      + PassCost(memory_bound_s=sign * f8.weight_backward_cast_s),
                      recompute=lay.recompute + rerun)
    if not cached:
        return replace(parts, layer=lay)
    fp8 = replace(parts.fp8, weight_cast_step_s=parts.fp8.weight_cast_step_s
                  + f8.weight_forward_cast_s + f8.weight_backward_cast_s,
                  expert_weight_copy_bytes=parts.fp8.expert_weight_copy_bytes
                  + f8.weight_cache_bytes)
    return replace(parts, layer=lay, fp8=fp8)


__all__ = ["RoutedMlp", "routed_mlp", "with_routed_mlp", "with_cached_expert_weights",
           "shared_width", "expert_gemm_s", "permute_efficiency"]
