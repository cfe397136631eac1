"""Context parallelism (cp): memory, attention work and communication of a sequence split
over cp ranks, as pure functions; :mod:`meshplan.costmodel.context_tables` composes them into
a layout's tables. No term here is fitted: how much the ring's transfers slow the block
attention they overlap is the GPU profile's ``cp_ring_interference``.

Notation: s tokens per sequence, b sequences per micro-batch, t = tp, e bytes per
activation element, q_dim = heads·d, kv_dim = kv_heads·d (GQA, Ainslie et al. 2023).

**Sharding** (Megatron-Core context parallelism, developer guide "context parallel";
TransformerEngine's load balancing; the Llama 3 report, arXiv 2407.21783 §3.3.2, and torch's
head-tail balancer do the same): each sequence is cut into 2·cp chunks of c = s/(2·cp)
tokens and cp rank r holds chunks r and 2·cp−1−r. Every per-token tensor of a rank covers
s/cp tokens, so

    (1) activations per rank = A(s)/cp,  logits per rank = L(s)/cp

where A and L are :func:`memory.layer_activations` / :func:`memory.logits_bytes` at the full
s. Both styles keep no s² term: the ring keeps its local q, k, v, output and fp32
log-sum-exp (even without a fused kernel; the executor's ring is an autograd function of its
own), all-to-all keeps heads/cp of the full sequence — the same element count as 1/cp of the
tokens. With sequence parallelism each cp rank's s/cp tokens are split again over tp.

**Attention work.** Causal attention over s tokens computes s(s+1)/2 query-key pairs. Under
the load-balanced sharding rank r's local queries see (by position) r·c + c(c+1)/2 pairs in
its first chunk and (2·cp−1−r)·c + c(c+1)/2 in its second:

    (2) pairs per rank = 2·cp·c² + c = s²/(2·cp) + s/(2·cp)          (the same on every rank)

Contiguous sharding would give rank r (2r+1)·(s/cp)²/2 (+ s/(2cp)): the last rank does
(2·cp−1)/cp times the mean (:func:`causal_imbalance`). A pair costs 4·d FLOPs per head in
forward (QKᵀ and PV, 2 FLOPs a multiply-add; Narayanan et al. 2021, arXiv 2104.04473
eq. 3), i.e. 4·q_dim/t per pair on a tp rank. :mod:`flops` counts attention without the
causal halving (4·s·q_dim per token, the papers' convention); per cp rank that count is
exactly 1/cp of it (``causal_skip=False``).

**Ring** (Liu, Zaharia & Abbeel 2023, "Ring Attention", arXiv 2310.01889): per pass each
rank passes its K/V block to the next rank cp−1 times; at step i ≥ 1 it computes half a
block against the K/V it holds (c queries × 2c keys or 2c queries × c keys: 2c² pairs);
step 0 is the causal local block (2c² + c pairs). Bytes per exchange (K and V of the local
tokens, key/value heads only):

    (3) kv_bytes = b · (s/cp) · (kv_dim + v_dim)/t · e

(v_dim = kv_dim but for multi-head latent attention, whose values are d_v wide a head
where its keys are d_n + d_r: DeepSeek-V3 128 against 192.)

Backward runs the ring again: cp−1 K/V exchanges and cp exchanges of the dK/dV
accumulators (same element count, at the accumulation width: fp32 in torch's ring and
meshplan's executor), the last one returning each rank's gradients to their owner. A
transfer overlaps one step's block attention (issued before it, waited on after it), so

    (4) exposed forward  = (cp−1) · max(0, t_kv − t_step)
        exposed backward = max(0, t_kv − t_step) + (cp−2)·max(0, t_kv + t_dkv − t_step)
                           + max(0, t_dkv − t_step) + t_dkv                  (cp ≥ 2)

with t_x = x_bytes / bandwidth + latency on the links the cp group crosses (NVLink inside a
node, the network across: the cp group's ranks are tp apart in Megatron's order) and t_step
the block attention time of one step (compute-bound, from the GPU profile). In the
backward the K/V of the next step and the dK/dV of the previous step share the link to the
next rank.

**All-to-all** (DeepSpeed-Ulysses, Jacobs et al. 2023, arXiv 2309.14509 §3): 4 all-to-alls
per attention per pass — forward q, k, v to (all tokens, heads/cp) and the output back;
backward the adjoints (dO to heads, dQ, dK, dV back). Each rank's buffer:

    (5) q: b·(s/cp)·q_dim/t·e;  k: b·(s/cp)·kv_dim/t·e;  v: b·(s/cp)·v_dim/t·e;
        output: b·(s/cp)·attn_out_dim/t·e      (q_dim and kv_dim but for MLA, as in (3))

of which it sends (cp−1)/cp. The attention needs the exchanged tensors, so they are not
overlapped: all four are exposed per pass. Requires (heads and kv heads) divisible by t·cp.

**Gradients** (Megatron-Core's data-parallel group "with context parallel"): cp ranks hold
the same parameters and see different tokens of the same sequences, so

    (6) gradient reduction and ZeRO sharding span dp·cp ranks.

Rank order: Megatron-Core places cp between tp and dp ("tp-cp-ep-dp-pp"): a cp group's
ranks are tp apart, dp's tp·cp apart (:func:`rank_strides`).

Measured error: see :mod:`meshplan.costmodel.context_tables` (one GPU check on 4 × H200 and
the published runs).
"""

from __future__ import annotations

from meshplan.spec import ModelSpec

#: bytes per element of the dK/dV accumulators the ring backward passes (fp32)
DKV_ACCUM_BYTES = 4


def tokens_per_rank(seq_len: int, micro_batch: int, cp: int) -> float:
    """Tokens of one micro-batch on one cp rank: b·s/cp."""
    return micro_batch * seq_len / cp


def per_rank_bytes(full_sequence_bytes: float, cp: int) -> float:
    """Eq. (1): activations or logits of one rank, from their size at the full sequence."""
    return full_sequence_bytes / cp


def attention_pairs_per_rank(seq_len: int, cp: int, *, balanced: bool = True) -> float:
    """Eq. (2): causal query-key pairs per sequence of the busiest cp rank.

    ``balanced``: the 2·cp-chunk sharding (every rank alike); else contiguous s/cp slices,
    where the last rank sees the most keys.
    """
    if balanced:
        if seq_len % (2 * cp):
            raise ValueError(f"seq_len {seq_len} is not divisible by 2·cp = {2 * cp}")
        c = seq_len // (2 * cp)
        return 2 * cp * c * c + c
    n = seq_len / cp
    return (2 * (cp - 1) + 1) * n * n / 2 + n / 2


def causal_imbalance(cp: int, *, balanced: bool) -> float:
    """Busiest rank's attention work over the mean, for long sequences (s² terms only)."""
    return 1.0 if balanced else (2 * cp - 1) / cp


def attention_flops_per_rank(model: ModelSpec, seq_len: int, micro_batch: int, tp: int,
                             cp: int, *, causal_skip: bool = True) -> float:
    """Forward attention-core FLOPs of one layer on one rank (backward: 2× by the papers'
    convention, 2.5× for a flash kernel that recomputes QKᵀ).

    ``causal_skip``: only the pairs the causal mask keeps, as the ring's block kernels
    compute them (eq. 2); else the papers' convention of :mod:`flops` (4·s·q_dim per token),
    which per rank is 1/cp of the whole.
    """
    per_pair = 4.0 * model.q_dim / tp
    if causal_skip:
        return micro_batch * attention_pairs_per_rank(seq_len, cp) * per_pair
    return micro_batch * (seq_len / cp) * seq_len * per_pair


def ring_step_pairs(seq_len: int, cp: int) -> float:
    """Query-key pairs of one ring step after the first (half a block: c × 2c)."""
    c = seq_len / (2 * cp)
    return 2 * c * c


def ring_kv_bytes(model: ModelSpec, seq_len: int, micro_batch: int, tp: int, cp: int,
                  bytes_per_element: float) -> float:
    """Eq. (3): K and V of one rank's tokens, key/value heads only — one ring exchange."""
    return (micro_batch * (seq_len / cp) * (model.kv_dim + model.v_dim) / tp
            * bytes_per_element)


def ring_dkv_bytes(model: ModelSpec, seq_len: int, micro_batch: int, tp: int, cp: int,
                   accum_bytes: float = DKV_ACCUM_BYTES) -> float:
    """dK and dV accumulators passed in the ring backward (one exchange)."""
    return ring_kv_bytes(model, seq_len, micro_batch, tp, cp, accum_bytes)


def ring_exchanges(cp: int) -> dict[str, int]:
    """Exchanges per attention: forward K/V, backward K/V and dK/dV."""
    if cp == 1:
        return {"forward_kv": 0, "backward_kv": 0, "backward_dkv": 0}
    return {"forward_kv": cp - 1, "backward_kv": cp - 1, "backward_dkv": cp}


def transfer_s(nbytes: float, bandwidth_bytes_per_s: float, latency_s: float = 0.0) -> float:
    """One point-to-point transfer: bytes over the link's bandwidth plus its latency."""
    return nbytes / bandwidth_bytes_per_s + latency_s if nbytes > 0 else 0.0


def _step_exposed(t_comm: float, step_compute_s: float, interference: float) -> float:
    """One ring step: what the step's block attention does not hide, plus ``interference``
    of what it does (the p2p kernels slow the block kernel they overlap; the profile's
    ``cp_ring_interference``, :func:`meshplan.costmodel.comm.exposed`)."""
    hidden = min(t_comm, step_compute_s)
    return t_comm - hidden + interference * hidden


def ring_exposed_forward_s(cp: int, *, step_compute_s: float, kv_bytes: float,
                           bandwidth_bytes_per_s: float, latency_s: float = 0.0,
                           interference: float = 0.0) -> float:
    """Eq. (4), forward: the part of the cp−1 K/V transfers their steps' compute does not
    hide (plus ``interference`` of the hidden part)."""
    if cp == 1:
        return 0.0
    t_kv = transfer_s(kv_bytes, bandwidth_bytes_per_s, latency_s)
    return (cp - 1) * _step_exposed(t_kv, step_compute_s, interference)


def ring_exposed_backward_s(cp: int, *, step_compute_s: float, kv_bytes: float,
                            dkv_bytes: float, bandwidth_bytes_per_s: float,
                            latency_s: float = 0.0, interference: float = 0.0) -> float:
    """Eq. (4), backward: step 0 hides the next K/V, steps 1..cp−2 the next K/V and the
    previous dK/dV together, step cp−1 the previous dK/dV; the final dK/dV transfer home
    is exposed whole."""
    if cp == 1:
        return 0.0
    t_kv = transfer_s(kv_bytes, bandwidth_bytes_per_s, latency_s)
    t_dkv = transfer_s(dkv_bytes, bandwidth_bytes_per_s, latency_s)
    both = t_kv + t_dkv
    k = interference
    return (_step_exposed(t_kv, step_compute_s, k)
            + (cp - 2) * _step_exposed(both, step_compute_s, k)
            + _step_exposed(t_dkv, step_compute_s, k) + t_dkv)


def all_to_all_buffers_bytes(model: ModelSpec, seq_len: int, micro_batch: int, tp: int,
                             cp: int, bytes_per_element: float) -> tuple[float, ...]:
    """Eq. (5): each rank's buffer of the 4 all-to-alls of one attention pass, in the order
    q, k, v, output (forward) — the backward's adjoints move the same bytes."""
    per_width = micro_batch * seq_len / cp / tp * bytes_per_element
    return tuple(per_width * w for w in (model.q_dim, model.kv_dim, model.v_dim,
                                         model.attn_out_dim))


def all_to_all_sent_bytes(buffer_bytes: float, cp: int) -> float:
    """Bytes one rank sends in an all-to-all of its ``buffer_bytes``: all but its own part."""
    return buffer_bytes * (cp - 1) / cp


def all_to_all_s(buffer_bytes: float, cp: int, *, bandwidth_bytes_per_s: float,
                 latency_s: float = 0.0) -> float:
    """One all-to-all, exposed: the bytes a rank sends over its bandwidth plus a latency."""
    if cp == 1:
        return 0.0
    return all_to_all_sent_bytes(buffer_bytes, cp) / bandwidth_bytes_per_s + latency_s


def gradient_reduction_ranks(dp: int, cp: int) -> int:
    """Eq. (6): the ranks that average gradients and share ZeRO shards."""
    return dp * cp


def rank_strides(tp: int, cp: int, dp: int, pp: int, rank_order: str) -> dict[str, int]:
    """Distance between neighbouring ranks of each group, cp next to tp (Megatron-Core).

    ``rank_order`` as :class:`Cluster.rank_order`: "tp-dp-pp" (cp, then dp, then pp) or
    "tp-pp-dp" (cp, then pp, then dp). In "tp-dp-pp" the dp × cp gradient group is one
    regular ring of dp·cp ranks, stride tp; in "tp-pp-dp" it is not (pp sits between).
    """
    if rank_order == "tp-dp-pp":
        return {"tp": 1, "cp": tp, "dp": tp * cp, "pp": tp * cp * dp}
    if rank_order == "tp-pp-dp":
        return {"tp": 1, "cp": tp, "pp": tp * cp, "dp": tp * cp * pp}
    raise ValueError(f"unknown rank order {rank_order!r}; use 'tp-dp-pp' or 'tp-pp-dp'")


__all__ = ["DKV_ACCUM_BYTES", "all_to_all_buffers_bytes", "all_to_all_s",
           "all_to_all_sent_bytes", "attention_flops_per_rank", "attention_pairs_per_rank",
           "causal_imbalance", "gradient_reduction_ranks", "per_rank_bytes", "rank_strides",
           "ring_dkv_bytes", "ring_exchanges", "ring_exposed_backward_s",
           "ring_exposed_forward_s", "ring_kv_bytes", "ring_step_pairs", "tokens_per_rank",
           "transfer_s"]
