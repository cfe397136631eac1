"""Mixture-of-experts terms of the cost model: FLOPs, parameters and model states per rank,
routed-token activations, dispatch/combine all-to-all volume. Pure functions of the spec
and the parallel degrees; :mod:`meshplan.costmodel.moe_layer` and
:mod:`meshplan.costmodel.moe_tables` compose them into an estimate.

Notation: h hidden size, E routed experts, k experts per token, S shared experts, f_e / f_s
the routed / shared expert widths, m the matrices entering an MLP (2 for SwiGLU, 1 for
GELU), e bytes per activation element, T the tokens one rank routes in one micro-batch.

Parallel folding (Megatron-Core MoE docs, "MoE Parallel Folding"; Liu et al. 2025,
arXiv 2504.14960): inside a pipeline stage the tp·cp·dp ranks of the attention layers are
regrouped as ep·etp·edp for the experts. Each rank routes the T = b·s/(tp·cp) tokens of its
sequence-parallel slice (Megatron-Core requires sequence parallelism for MoE with tp > 1).

* FLOPs per token, forward (the 2mkn matmul convention of :mod:`meshplan.costmodel.flops`):
  router 2hE (Switch, Fedus et al. 2021, arXiv 2101.03961, eq. 1), routed experts
  k·2(m+1)h·f_e, shared experts S·2(m+1)h·f_s (DeepSeekMoE, arXiv 2401.06066 §3.2);
  backward twice forward. Megatron-LM's ``num_floating_point_operations`` counts the same
  routed and shared expert terms (``moe_router_topk``, ``moe_shared_expert_intermediate_size``).
  With a capacity factor and padding (GShard, Lepikhin et al. 2020, arXiv 2006.16668 §2.2;
  Megatron ``--moe-pad-expert-input-to-capacity``) the experts run on E·C tokens,
  C = ceil(cf·T·k/E) per expert.
* Tokens an expert rank computes: balanced routing gives k·T per rank (each of the ep ranks
  receives the k·T/ep copies of each of ep sources); with etp > 1 the etp ranks of an
  expert all see its tokens (each computing 1/etp of the width), so k·T·etp rows at width
  f_e/etp. Load imbalance is a factor ρ ≥ 1 on the busiest rank (``imbalance``, a measured
  profile parameter: no default here). Bounds: with a capacity factor a rank receives at
  most cf·k·T·etp; dropless, at most ep·T·min(k, E/ep)·etp (every token of the ep group sends
  all the copies it can to one rank) — the worst case a memory plan must fit unless it
  trusts the balancing (DeepSeek-V3, arXiv 2412.19437 §2.1.2; Megatron-LM issue 2439).
* Parameters per rank: each rank holds E/ep experts, each split over etp (column-parallel
  fc1 and its bias, row-parallel fc2; fc2's bias replicated); the router is replicated;
  shared experts are split over tp like a dense MLP (Megatron-Core's SharedExpertMLP).
  Model states follow ZeRO (Rajbhandari et al. 2019, arXiv 1910.02054, Table 1) over the
  expert data-parallel group edp = tp·cp·dp/(ep·etp) for expert parameters (Megatron-Core's
  distributed optimizer shards expert states over the expert-dp group) and over dp·cp for
  the rest.
* Activations kept for backward per MoE layer and micro-batch, per rank (Korthikanti et al.
  2022, arXiv 2205.05198, §4.1 bookkeeping applied to the expert MLP): router probabilities
  T·E fp32 (softmax/sigmoid backward) and the top-k gate values and indices T·k·(4 + 8);
  for R routed rows: the expert input R·h·e, fc1's output R·m·f_e/etp·e and the activation
  output R·f_e/etp·e, and the expert output R·h·e that the weighted combine keeps for the
  gate gradient. Transient during dispatch: the permuted send buffer and the receive buffer,
  2·R·h·e. Shared experts keep the dense MLP's T·(m+1)·f_s/tp·e·S (their input is the
  layer's MLP input, already counted by the dense bookkeeping).
* All-to-all: dispatch sends the k·T·h·e bytes of routed copies, of which (ep-1)/ep leave
  the rank under uniform routing; combine returns the same; the backward pass repeats both
  (4 all-to-alls per MoE layer and micro-batch). With etp > 1 the rows are then all-gathered
  over etp (and reduce-scattered after the experts). Time inside a node from the bus
  bandwidth of its links (nccl-tests doc/PERFORMANCE.md, alltoall busbw = algbw·(n-1)/n);
  across nodes the share for other nodes goes through the rank's share of its node's NICs
  (:func:`all_to_all_s`).

Measured error: these functions are checked against hand-computed numbers
(tests/unit/test_costmodel_moe.py). Against the executor on 2 × H200 the analytical layer on
a calibrated profile's curves misses far more than the profile's timed MoE rows
(:mod:`meshplan.costmodel.moe_rows`) — moeh14: 19.6 % mean, 82 % max from the curves against
5.4 / 15.6 % from the rows (docs/benchmarks/moe_checks.md, the "curves" column of each set). Whole
estimates of published BF16 MoE runs (datasheet profiles, docs/benchmarks/published.md): 20.5 % mean
/ 39.1 % max over 8 runs; the four rows with 16 local experts 23-39 % fast (GPT-OSS-120B ep 8
on H100 and B200, Qwen3-235B ep 8 at tp 2 and 4), not for their expert count: GPT-OSS misses
as much time per layer and micro-batch at 2 experts a rank once the ep 64 all-to-all latency
is set aside, and Qwen3's tp 4 row is the one with the least work per rank (published.md,
"What limits these numbers").
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import NamedTuple

from meshplan.costmodel import comm
from meshplan.costmodel.memory import (activation_bytes_per_element, model_state_bytes,
                                       state_bytes_per_param)
from meshplan.costmodel.window import keys_per_query
from meshplan.errors import ConfigError
from meshplan.hardware_profiles.topology import GroupLink
from meshplan.spec import Job, Layout, ModelSpec

GATE_INDEX_BYTES = 8     # torch.topk returns int64 indices
ROUTER_PROB_BYTES = 4    # router logits and probabilities in fp32 (Megatron-Core's default)


def shared_width(model: ModelSpec) -> int:
    """The shared experts' total width: the dense MLP an MoE layer keeps (0 without)."""
    return model.num_shared_experts * (model.shared_expert_ffn_hidden_size or 0)


def _require_moe(model: ModelSpec) -> None:
    if not model.is_moe:
        raise ConfigError(f"{model.name!r} is a dense model (num_experts = 0); the MoE cost "
                          f"terms need num_experts > 0")


# ---- FLOPs ---------------------------------------------------------------------------------
class MoEFlops(NamedTuple):
    """Forward FLOPs of one MoE layer's MLP part, per token."""

    router: float
    routed: float
    shared: float

    @property
    def total(self) -> float:
        return self.router + self.routed + self.shared


def moe_forward_flops_per_token(model: ModelSpec) -> MoEFlops:
    """Router 2hE, routed experts k·2(m+1)h·f_e, shared experts S·2(m+1)h·f_s."""
    _require_moe(model)
    h, m = model.hidden_size, model.ffn_matrices
    return MoEFlops(router=2.0 * h * model.num_experts,
                    routed=model.experts_per_token * 2.0 * (m + 1) * h * model.moe_ffn_hidden_size,
                    shared=(model.num_shared_experts * 2.0 * (m + 1) * h
                            * (model.shared_expert_ffn_hidden_size or 0)))


def expert_capacity(model: ModelSpec, tokens: int) -> int | None:
    """Tokens one expert takes from a group of ``tokens`` (GShard §2.2; Switch eq. 3):
    ceil(cf · tokens · k / E); None when dropless."""
    _require_moe(model)
    if model.capacity_factor is None:
        return None
    return math.ceil(model.capacity_factor * tokens * model.experts_per_token / model.num_experts)


def mla_forward_flops_per_token(model: ModelSpec, seq_len: int) -> tuple[float, float]:
    """(projection FLOPs, attention-core FLOPs) of one multi-head latent attention layer,
    per token: 2 × the projection weights (DeepSeek-V2 eqs. 9-19), scores 2·s·n_h·(d_nope +
    d_rope) and weighted sum 2·s·n_h·d_v (no causal halving, as flops.py counts attention)."""
    if not model.is_mla:
        raise ConfigError(f"{model.name!r} has no multi-head latent attention (kv_lora_rank)")
    nh = model.num_heads
    core = 2.0 * seq_len * nh * (model.qk_nope_head_dim + model.qk_rope_head_dim
                                 + model.v_head_dim)
    return 2.0 * model.attention_matmul_params(), core


def _layer_forward_flops_per_token(model: ModelSpec, layer: int, seq_len: int) -> float:
    return (_attention_forward_flops_per_token(model, layer, seq_len)
            + _core_forward_flops_per_token(model, layer, seq_len)
            + _mlp_forward_flops_per_token(model, layer))


def _attention_forward_flops_per_token(model: ModelSpec, layer: int, seq_len: int) -> float:
    """The attention projections of ``layer`` (MLA's, or Q, K, V and the output)."""
    if model.is_mla:
        return mla_forward_flops_per_token(model, seq_len)[0]
    return 2.0 * model.attention_matmul_params()


def _core_forward_flops_per_token(model: ModelSpec, layer: int, seq_len: int) -> float:
    """Scores and weighted sum of ``layer`` over its keys (s, or a sliding window's)."""
    keys = keys_per_query(model, layer, seq_len)
    if model.is_mla:
        return mla_forward_flops_per_token(model, keys)[1]
    return 4.0 * keys * model.q_dim


def _mlp_forward_flops_per_token(model: ModelSpec, layer: int) -> float:
    h, m = model.hidden_size, model.ffn_matrices
    if model.is_moe_layer(layer):
        return moe_forward_flops_per_token(model).total
    return 2.0 * (m + 1) * h * model.ffn_hidden_size


def moe_model_flops_per_step(model: ModelSpec, global_batch: int, seq_len: int, *,
                             recompute: str = "none") -> float:
    """Model FLOPs of one step (forward + 2 × backward) of an MoE model, or with
    ``recompute`` the hardware FLOPs (full: every layer's forward again; selective: the
    attention cores), in :mod:`meshplan.costmodel.flops`' conventions; the logits cost
    2hV per token; each multi-token-prediction module adds a layer like the last, its 2h → h
    projection and its own logits (DeepSeek-V3 §2.2)."""
    if not (model.is_moe or model.is_mla):
        _require_moe(model)
    tokens = global_batch * seq_len
    layers = [_layer_forward_flops_per_token(model, i, seq_len) for i in range(model.num_layers)]
    logits = 2.0 * model.hidden_size * model.vocab_size
    mtp = model.mtp_layers * (layers[-1] + 2.0 * 2 * model.hidden_size ** 2 + logits)
    flops = 3.0 * tokens * (sum(layers) + logits + mtp)
    if recompute == "full":
        flops += tokens * sum(layers)
    elif recompute == "selective":
        flops += tokens * sum(_core_forward_flops_per_token(model, i, seq_len)
                              for i in range(model.num_layers))
    return flops


# ---- tokens per expert rank ------------------------------------------------------------------
def routed_tokens_per_rank(model: ModelSpec, layout: Layout, tokens: float, *,
                           imbalance: float) -> float:
    """Rows the busiest expert rank computes for ``tokens`` routed by each rank.

    k·T·etp·ρ, capped by the capacity bound cf·k·T·etp and by the dropless worst case
    ep·T·min(k, E/ep)·etp.
    """
    _require_moe(model)
    if imbalance < 1:
        raise ConfigError(f"imbalance = {imbalance} must be >= 1 (busiest rank / mean)")
    return min(model.experts_per_token * tokens * layout.etp * imbalance,
               max_routed_rows(model, layout, tokens))


def max_routed_rows(model: ModelSpec, layout: Layout, tokens: float) -> float:
    """The most rows one expert rank can receive: dropless, ep·T·min(k, E/ep)·etp (all
    copies the ep group can send to one rank); with a capacity factor at most cf·k·T·etp."""
    _require_moe(model)
    k, ep, etp = model.experts_per_token, layout.ep, layout.etp
    rows = ep * tokens * min(k, model.num_experts // ep) * etp
    if model.capacity_factor is not None:
        rows = min(rows, model.capacity_factor * k * tokens * etp)
    return rows


# ---- parameters and model states ----------------------------------------------------------
class MoEParams(NamedTuple):
    """Parameters of one MoE layer's MLP part held by one rank."""

    experts: float      # routed experts (sharded by ep·etp)
    shared: float       # shared experts (split over tp)
    router: float       # replicated


def moe_params_per_rank(model: ModelSpec, layout: Layout) -> MoEParams:
    """E/ep experts at 1/etp width (row-parallel bias replicated), tp-split shared experts,
    the replicated router."""
    return _moe_params(model, layout.ep, layout.etp, layout.tp)


@lru_cache(maxsize=4096)
def _moe_params(model: ModelSpec, ep: int, etp: int, tp: int) -> MoEParams:
    _require_moe(model)
    h, m, f = model.hidden_size, model.ffn_matrices, model.moe_ffn_hidden_size
    per_expert = ((m + 1) * h * f + (m * f if model.bias else 0)) / etp + (h if model.bias else 0)
    shared = 0.0
    if model.num_shared_experts:
        fs = model.shared_expert_ffn_hidden_size
        shared = model.num_shared_experts * (((m + 1) * h * fs + (m * fs if model.bias else 0)) / tp
                                             + (h if model.bias else 0))
    return MoEParams(experts=model.num_experts / ep * per_expert, shared=shared,
                     router=float(model.router_params()))


def expert_state_bytes(model: ModelSpec, job: Job, layout: Layout,
                       moe_layers: int) -> tuple[float, float, float]:
    """(weights, grads, optimizer) bytes of the routed experts of ``moe_layers`` MoE layers
    on one rank, ZeRO-sharded over the expert data-parallel group edp."""
    params = moe_layers * moe_params_per_rank(model, layout).experts
    return model_state_bytes(params, job, layout.zero, layout.edp)


def expert_grad_reduce_bytes(model: ModelSpec, job: Job, layout: Layout, moe_layers: int) -> float:
    """Gradient bytes each rank reduces over edp for its experts (all-reduce with ZeRO 0,
    reduce-scatter from ZeRO 1 on — the caller picks the collective); 0 when edp = 1."""
    if layout.edp == 1:
        return 0.0
    return moe_layers * moe_params_per_rank(model, layout).experts * state_bytes_per_param(job).grads


# ---- activations ---------------------------------------------------------------------------
class MoEActivations(NamedTuple):
    """Bytes of one MoE layer for one micro-batch on one rank."""

    router_bytes: float        # probabilities, gate values and indices (kept)
    expert_bytes: float        # routed rows: input, fc1 output, activation, output (kept)
    shared_bytes: float        # shared experts' ffn-wide tensors (kept)
    dispatch_bytes: float      # send + receive buffers of the all-to-all (transient)

    @property
    def kept_bytes(self) -> float:
        return self.router_bytes + self.expert_bytes + self.shared_bytes


def moe_activation_bytes(model: ModelSpec, job: Job, layout: Layout, tokens: float, *,
                         imbalance: float, worst_case: bool = False) -> MoEActivations:
    """Activations of one MoE layer; ``tokens`` = T routed by this rank (b·s/(tp·cp)).

    ``worst_case``: size the routed rows for :func:`max_routed_rows` instead of ρ·k·T·etp.
    """
    _require_moe(model)
    e = activation_bytes_per_element(job)
    h, m, k = model.hidden_size, model.ffn_matrices, model.experts_per_token
    rows = (max_routed_rows(model, layout, tokens) if worst_case
            else routed_tokens_per_rank(model, layout, tokens, imbalance=imbalance))
    f_local = model.moe_ffn_hidden_size / layout.etp
    router = tokens * (model.num_experts * ROUTER_PROB_BYTES + k * (4 + GATE_INDEX_BYTES))
    expert = rows * e * (2 * h + (m + 1) * f_local)
    shared = 0.0
    if model.num_shared_experts:
        # the tp group's T·tp gathered tokens at 1/tp of the width
        shared = model.num_shared_experts * tokens * (m + 1) * model.shared_expert_ffn_hidden_size * e
    dispatch = 2 * rows * h * e
    return MoEActivations(router, expert, shared, dispatch)


# ---- communication -------------------------------------------------------------------------
def dispatch_bytes_per_rank(model: ModelSpec, job: Job, layout: Layout, tokens: float) -> float:
    """Bytes one rank sends to other ep ranks in one dispatch all-to-all (uniform routing):
    k·T·h·e·(ep-1)/ep. Combine moves the same back; backward repeats both."""
    _require_moe(model)
    e = activation_bytes_per_element(job)
    ep = layout.ep
    return model.experts_per_token * tokens * model.hidden_size * e * (ep - 1) / ep


def etp_gather_bytes_per_rank(model: ModelSpec, job: Job, layout: Layout,
                              tokens: float) -> float:
    """Bytes each rank receives when the routed rows are all-gathered over etp after the
    dispatch (k·T·h·e·(etp-1)); the reduce-scatter after the experts moves the same."""
    _require_moe(model)
    e = activation_bytes_per_element(job)
    return model.experts_per_token * tokens * model.hidden_size * e * (layout.etp - 1)


def all_to_all_s(link: GroupLink, bytes_leaving: float, nvlink_gbps: float,
                 nvlink_efficiency=None) -> float:
    """One all-to-all on the ep group's link, ``bytes_leaving`` each rank sends to its n − 1
    peers under uniform routing.

    Inside one node: :func:`meshplan.costmodel.comm.all_to_all_s` (NVSwitch carries every
    pair at once). Across nodes an all-to-all is not a ring: each rank sends the
    (n − r)/(n − 1) share of its bytes addressed to the other nodes' ranks through its node's
    NICs, which all r members (and the node's other groups, all sending at once) share —
    per rank the link's network bandwidth over r (``busbw_gbps`` sums the members' NICs for
    a ring) — while the (r − 1)/(n − 1) share for its own node's ranks crosses NVLink
    concurrently; the slower of the two sets the time. DeepSeek-V3 (arXiv 2412.19437
    §3.2.2) prices its cross-node dispatch the same way (IB 50 GB/s per GPU against NVLink
    160 GB/s, hence node-limited routing), and DeepEP's README measures its internode
    kernels at the RDMA NIC's rate (~40-46 GB/s per H800 on CX7 400 Gb/s), not at the
    node's aggregate. Latency: the link's all-to-all call latency."""
    n, r = link.size, link.ranks_per_node
    if n <= 1 or bytes_leaving <= 0:
        return 0.0
    if link.nodes_spanned <= 1:
        return comm.all_to_all_s(link, bytes_leaving)
    total = bytes_leaving * n / (n - 1)              # the rank's whole send buffer
    inter = bytes_leaving * (n - r) / (n - 1)
    intra = bytes_leaving * (r - 1) / (n - 1)
    net_s = inter / (link.bandwidth_bytes_per_s(total) / r)
    nvl_eff = nvlink_efficiency(total) if nvlink_efficiency is not None else 1.0
    nvl_s = intra / (nvlink_gbps * 1e9 * nvl_eff) if intra > 0 else 0.0
    return max(net_s, nvl_s) + comm.call_latency_s(link, "all_to_all")


def all_to_alls_per_layer(recompute: str) -> int:
    """Dispatch and combine in forward and backward (4); full recomputation re-runs the
    forward pair (6)."""
    return 6 if recompute == "full" else 4


__all__ = ["shared_width", "MoEFlops", "MoEParams", "MoEActivations",
           "moe_forward_flops_per_token", "moe_model_flops_per_step",
           "mla_forward_flops_per_token", "expert_capacity", "routed_tokens_per_rank",
           "max_routed_rows", "moe_params_per_rank", "expert_state_bytes",
           "expert_grad_reduce_bytes", "moe_activation_bytes", "dispatch_bytes_per_rank",
           "etp_gather_bytes_per_rank", "all_to_all_s", "all_to_alls_per_layer"]
