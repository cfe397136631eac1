"""Dispatch and combine with de-duplicating dispatchers (``Job.moe_dispatcher = "deepep"``):
the bytes one rank sends and the time, beside the all-to-all of :mod:`meshplan.costmodel.moe`.

Megatron-Core's all-to-all dispatcher permutes a token once per routed expert and sends every
copy, k per token (``MoEAlltoAllTokenDispatcher``; :func:`meshplan.costmodel.moe.
dispatch_bytes_per_rank`). DeepEP (github.com/deepseek-ai/DeepEP, README: "normal kernels"
dispatch with ``num_tokens_per_rank`` / ``is_token_in_rank`` and, across nodes,
``num_tokens_per_rdma_rank``) and NVIDIA's HybridEP — Megatron-Core's flex dispatcher — send
a token once to each rank that holds any of its experts, and across nodes once to each node,
to the GPU of the same local index, which forwards it over NVLink to the ranks of its node
that need it (DeepSeek-V3, arXiv 2412.19437 §3.2.2: "first transmitted via IB to the GPUs
with the same in-node index on their target nodes … then immediately forwarded via NVLink");
the receiving rank then copies the token once per local expert. Combine reverses the path
with the same bytes (the forwarding GPU sums its node's expert outputs before sending back).

Bytes, for T tokens a rank routes, h·e bytes a token, E routed experts of which each of the
ep ranks holds E/ep and each of the N nodes the group spans E·r/ep (r group members a node),
k distinct experts a token, under balanced routing (every k-subset of the experts alike —
Megatron's forced balancing draws the routing at random):

    P(a block of g experts holds one of the token's k) = 1 − C(E − g, k) / C(E, k)
    over NVLink:  T·h·e · (ep − 1) · P(g = E/ep)        (each other rank that needs it,
                                                          directly or by the forward)
    over the NIC: T·h·e · (N − 1) · P(g = E·r/ep)       (each other node, once)

against k·T·h·e·(ep − 1)/ep for the all-to-all. E.g. Qwen3-235B-A22B (E 128, k 8) over 8
ranks of one node: 4.7 copies a token leave the rank instead of 7; over 32 ranks on 4 nodes
2.7 cross the network instead of 6 (:func:`dedup_copies`). The busiest rank receives ρ times the mean, as with the
all-to-all. Time: inside a node at the link's bus bandwidth (NVSwitch carries every pair at
once); across nodes each rank's network share goes through its 1/r share of its node's NICs
while the NVLink share (its own node's ranks and the forwards, counted whole: an upper
bound by the relay's own share) crosses NVLink at the same time, the slower setting the
time (:func:`meshplan.costmodel.moe.all_to_all_s` for the bandwidth reasoning); one kernel,
so one step of the link's latency, not the n − 1 of NCCL's ring-step count.

Not priced: the SMs the dispatch kernels occupy (they run alone here: no overlap is
modelled), FP8 dispatch. Measured error: the Qwen3-235B H100 rows of
docs/benchmarks/published.md.
"""

from __future__ import annotations

import math

from meshplan.costmodel.memory import activation_bytes_per_element
from meshplan.hardware_profiles.topology import GroupLink
from meshplan.spec import Job, ModelSpec


def block_hit_probability(experts: int, block: int, k: int) -> float:
    """P(a block of ``block`` of the ``experts`` holds at least one of k distinct experts
    drawn uniformly): 1 − C(E − g, k) / C(E, k)."""
    if block >= experts or k <= 0:
        return 1.0 if k > 0 else 0.0
    return 1.0 - math.comb(experts - block, k) / math.comb(experts, k)


def dedup_copies(model: ModelSpec, ep: int, nodes: int) -> tuple[float, float]:
    """(copies a token sends over NVLink, copies over the network) with a de-duplicating
    dispatcher over ``ep`` ranks on ``nodes`` nodes (module docstring)."""
    e, k = model.num_experts, model.experts_per_token
    per_rank = e // ep
    nvlink = (ep - 1) * block_hit_probability(e, per_rank, k)
    if nodes <= 1:
        return nvlink, 0.0
    network = (nodes - 1) * block_hit_probability(e, per_rank * ep // nodes, k)
    return nvlink, network


def dedup_dispatch_bytes(model: ModelSpec, job: Job, link: GroupLink,
                         tokens: float) -> tuple[float, float]:
    """(NVLink bytes, network bytes) one rank sends in one dispatch (and one combine)."""
    per_token = model.hidden_size * activation_bytes_per_element(job)
    nvlink, network = dedup_copies(model, link.size, link.nodes_spanned)
    return tokens * per_token * nvlink, tokens * per_token * network


def dedup_dispatch_s(link: GroupLink, nvlink_bytes: float, network_bytes: float,
                     nvlink_gbps: float, nvlink_efficiency=None) -> float:
    """One de-duplicated dispatch (or combine) on the ep group's link (module docstring)."""
    n = link.size
    if n <= 1 or nvlink_bytes + network_bytes <= 0:
        return 0.0
    if link.nodes_spanned <= 1:
        return (nvlink_bytes / link.bandwidth_bytes_per_s(nvlink_bytes * n / (n - 1))
                + link.latency_s(1))
    total = nvlink_bytes + network_bytes
    net_s = network_bytes / (link.bandwidth_bytes_per_s(total) / link.ranks_per_node)
    nvl_eff = nvlink_efficiency(total) if nvlink_efficiency is not None else 1.0
    nvl_s = nvlink_bytes / (nvlink_gbps * 1e9 * nvl_eff)
    return max(net_s, nvl_s) + link.latency_s(1, 1)


__all__ = ["block_hit_probability", "dedup_copies", "dedup_dispatch_bytes", "dedup_dispatch_s"]
