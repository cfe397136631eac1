"""Context parallelism in a layout's tables: a cp layout priced as its per-rank equivalent.

A cp rank holds ``s/cp`` tokens of each of its dp rank's sequences and the parameters of a
dp replica, and reduces gradients with every rank holding the same parameters (Megatron-Core's
data-parallel group "with context parallel"). So, for every term except attention, a layout
``(dp, cp, pp, tp)`` at ``s`` tokens per sequence and batch ``B`` costs what the layout
``(dp·cp, 1, pp, tp)`` costs at ``s/cp`` tokens and batch ``B·cp`` (:func:`cp_equivalent`):
the same micro-batches per step ``B/(dp·b)``, every per-token tensor, GEMM, memory-bound op,
tensor-parallel (SP) collective, pipeline message, logits and embedding at ``s/cp`` tokens
(:mod:`meshplan.costmodel.context` eq. 1), gradient reduction and ZeRO over ``dp·cp`` ranks
(eq. 6). What differs is attention (:func:`cp_layer_parts`):

* **ring**: cp steps per pass, each a block of 2c² query-key pairs (c = s/(2·cp); step 0
  the causal local block, steps ≥ 1 half blocks, eq. 2), each priced by the attention
  efficiency curve at the block's own FLOPs (small blocks run less efficiently); the K/V
  exchanges overlap the steps, exposed only where a transfer outlasts its step plus the
  profile's ``cp_ring_interference`` of what it hides (eq. 4, the correction
  :func:`meshplan.costmodel.corrections.ring_interference`); backward 2.5× each block
  (flash, Dao 2022 §3.1) with the dK/dV ring;
* **all-to-all** (Ulysses): one causal kernel over the whole sequence for heads/cp (a
  sliding-window layer's band only: :mod:`meshplan.costmodel.window`), and the 4
  all-to-alls of each pass exposed (eq. 5) on the cp group's link. The ring style of a
  sliding-window model is not priced (``spec.validate.check_modelled`` refuses it).

Selective recomputation re-runs the attention core, so with cp its exchanges too (the
executor's ring and all-to-all cores sit inside the recomputed core, as Megatron-Core's
core-attention recomputation does with TransformerEngine's context parallelism); full
recomputation re-runs the whole forward. The ring keeps two K/V blocks in flight (and the
dK/dV accumulators in backward), the all-to-all its gathered q, k, v and output: working
memory of a layer's pass.

Links (:func:`cp_group_links`): Megatron-Core's rank order ``tp-cp-dp-pp`` (or
``tp-cp-pp-dp``): the cp group's ranks are tp apart, dp's tp·cp, pp's tp·cp·dp
(:func:`meshplan.costmodel.context.rank_strides`); the gradient group of ``dp·cp`` ranks is
one regular ring of stride tp in ``tp-dp-pp``; in ``tp-pp-dp`` it is not regular, and its
link is taken as the dp group's (the narrowest hop its ring crosses) over ``dp·cp`` ranks.

Under runtime "torch" the ring's block attention also carries the executor's own copies,
casts and merges around its kernels (:mod:`meshplan.costmodel.ring_memory`, eq. 7-8), the
all-to-all core its copies and GQA repeat (:mod:`meshplan.costmodel.a2a_memory`, eq. 9-10),
and both the output's layout copy (eq. 11).

Measured error. GPU check, 4 × H200, torch 2.11, the 1.26B model at 16k-64k tokens, 10
layouts (docs/benchmarks/cp_checks.md): first run (data cp_gpu_h200.json), datasheet, step time
15.6 % mean / 33.3 % max, ring layouts −21..−33 % (the ring ran flash-attention 2, SDPA
cuDNN); second run of the five ring layouts with eq. 7-8 priced and the ring on SDPA's
kernel choice (now the default; cp_gpu_h200_ring_sdpa_20261128.json), as run: all ten
7.8 % mean / 17.8 % max, every 64k row +15..+18 % (the datasheet attention curve was then
clamped at 0.375 of peak beyond 1e11 FLOPs); memory within 3 % everywhere. POST HOC, with
the Hopper attention curve from the FlashAttention-3 paper's cuDNN bars (0.49 at 1.1e12
FLOPs and beyond; hardware_profiles/attention_published.py): 9.3 % mean / 16.2 % max, all
ten too fast (64k rows −3..−6 %, 16k-32k rows −7..−16 %); POST HOC with the executor's
eager memory-bound ops counted (:mod:`meshplan.costmodel.torch_membound`) and the
all-to-all core's copies (eq. 9-11): 2.0 % mean / 4.3 % max. Published runs, datasheet
profiles, layouts partly published (docs/benchmarks/published.md): the Llama 3 405B row at
131k tokens, cp 16, ring (Llama 3 report, arXiv 2407.21783, Table 4) −7.8 %; NeMo 24.07's
two cp 2 FP8 rows (Llama 3 8B and 70B at 8k tokens) −2.3 % and +4.1 % (post hoc: −13.8
and −5.0 % while the cp attention of an fp8 job was priced at the fp8 peak). Calibrated
profiles' measured layer rows are for cp = 1: a cp layout is priced from the datasheet curves of its
profile (a caveat says so). Held-out sets as run on 4 × H200 (2026-11-29): cp41 16.6 % mean /
54.5 % max (two CPU-bound cp 4 layouts at 4,096 tokens a rank, −51 / −55 %; since priced by
:mod:`meshplan.costmodel.cp_host`, which explains about a third of them), cp42 14.1 / 24.0 %
(head dim 80, all too fast; POST HOC with the measured head-dim ratio: 4.5 / 17.7 %). On
2 × H200 (cp 1/2, 2026-11-29/30): cp44 5.1 / 9.7 %, cp45 3.2 / 4.4 %, cp46 4.6 / 8.5 %; over
their seventeen cp 2 layouts the error orders by the tokens a rank (8,192: −4.2..−9.7 %,
16,384: −0.9..−4.8 %, 32,768: +2.2..+3.9 %), not priced.
"""

from __future__ import annotations

from dataclasses import replace

from meshplan.costmodel import comm, context, window
from meshplan.costmodel.a2a_memory import all_to_all_memory_bytes, cp_output_copy_bytes
from meshplan.costmodel.compute import (FLASH_BACKWARD_FACTOR, LayerCost, gemm_s, hbm_s,
                                       kernel_head_dim, sixteen_bit_precision)
from meshplan.costmodel.corrections import ring_interference
from meshplan.costmodel.cp_host import cp_host_terms
from meshplan.costmodel.data_parallel import Groups
from meshplan.costmodel.memory import activation_bytes_per_element, recomputes_core_attention
from meshplan.costmodel.parts import LayerParts
from meshplan.costmodel.ring_memory import ring_memory_bytes
from meshplan.hardware_profiles import Cluster
from meshplan.hardware_profiles.topology import GroupLink
from meshplan.spec import Job, Layout, ModelSpec

CP_UNCHECKED_CAVEAT = (
    "context parallelism was compared on 2 and 4 x H200 only (58 layouts of seven models at "
    "16k-64k tokens on the datasheet profile; held-out sets as run: 4 GPUs 11.2, 16.6 and "
    "14.1 % mean step-time error, misses at head dims outside 64/128 and CPU-bound cp 4 "
    "layouts at 4k tokens a rank; 2 GPUs (cp 2) 5.1, 3.2 and 4.6 %, cp layouts at 8k tokens "
    "a rank 4-10 % slower than predicted, at 32k 2-4 % faster; docs/benchmarks/cp_checks.md); "
    "how much the ring's transfers slow the block attention they overlap "
    "(cp_ring_interference) is assumed")
CP_ANALYTICAL_CAVEAT = (
    "context parallelism is priced from the profile's datasheet curves: its measured layer "
    "rows are for cp = 1")


def cp_equivalent(job: Job, layout: Layout) -> tuple[Job, Layout]:
    """The per-rank equivalent (module docstring): ``s/cp`` tokens, batch ·cp, dp·cp."""
    cp = layout.cp
    return (replace(job, seq_len=job.seq_len // cp, global_batch=job.global_batch * cp),
            layout.replace(dp=layout.dp * cp, cp=1, cp_style="ring"))


def cp_group_links(cluster: Cluster, layout: Layout) -> Groups:
    """tp, the dp·cp gradient group, pp and cp links in Megatron-Core's order (docstring)."""
    tp, cp, dp, pp = layout.tp, layout.cp, layout.dp, layout.pp
    strides = context.rank_strides(tp, cp, dp, pp, cluster.rank_order)
    cp_link = cluster.group_link(cp, strides["cp"])
    if cluster.rank_order == "tp-dp-pp" or dp == 1:
        grad = cluster.group_link(dp * cp, tp)
    else:
        grad = replace(cluster.group_link(dp, strides["dp"]), size=dp * cp)
    return Groups(cluster.group_link(tp, 1), grad, cluster.group_link(pp, strides["pp"]),
                  cp=cp_link)


def _block_s(cluster: Cluster, job: Job, flops: float, head_dim: int | None) -> float:
    """One attention kernel of ``flops`` executed FLOPs (forward): flash at the attention
    curve of its head dim (``GPUSpec.attention_efficiency_at``); unfused as two batched
    GEMMs (QKᵀ, PV). At the 16-bit peak under fp8 too: fp8 training leaves attention in
    bf16 (TransformerEngine's fp8 attention is opt-in), as the layer without cp is priced
    (:func:`meshplan.costmodel.compute.sixteen_bit_precision`)."""
    gpu = cluster.gpu
    peak = gpu.peak_flops(sixteen_bit_precision(job))
    if job.flash_attention:
        return (flops / (peak * gpu.attention_efficiency_at(flops, head_dim)) if flops > 0
                else 0.0)
    return 2 * gemm_s(gpu, peak, flops / 2)


def cp_attention(model: ModelSpec, cluster: Cluster, job: Job, layout: Layout,
                 cp_link: GroupLink) -> tuple[float, ...]:
    """(forward attention s, backward attention s, forward exposed cp s, backward exposed
    cp s, bytes sent forward, bytes sent backward, working-memory bytes) of one layer and
    micro-batch on one rank; ``job`` at the full sequence (see the module docstring)."""
    s, b, tp, cp = job.seq_len, layout.micro_batch, layout.tp, layout.cp
    e = activation_bytes_per_element(job)
    per_pair = 4.0 * model.q_dim / tp
    bwd_k = FLASH_BACKWARD_FACTOR if job.flash_attention else 2.0
    if layout.cp_style == "ring":
        step_flops = b * context.ring_step_pairs(s, cp) * per_pair
        step_s = _block_s(cluster, job, step_flops, kernel_head_dim(model))
        fwd_attn, bwd_attn = cp * step_s, bwd_k * cp * step_s
        if job.runtime == "torch":         # the executor's own ring: its copies and merges
            mem_f, mem_b = ring_memory_bytes(model, s, b, tp, cp, e)
            fwd_attn += hbm_s(cluster.gpu, mem_f + cp_output_copy_bytes(model, s, b, tp, cp, e))
            bwd_attn += hbm_s(cluster.gpu, mem_b)
        kv = context.ring_kv_bytes(model, s, b, tp, cp, e)
        dkv = context.ring_dkv_bytes(model, s, b, tp, cp)
        bw = cp_link.bandwidth_bytes_per_s(kv)
        k = ring_interference(cluster.gpu.corrections)
        lat = comm.call_latency_s(cp_link, "p2p")   # each ring step is one p2p call
        fwd_cp = context.ring_exposed_forward_s(cp, step_compute_s=step_s, kv_bytes=kv,
                                                bandwidth_bytes_per_s=bw, latency_s=lat,
                                                interference=k)
        bwd_cp = context.ring_exposed_backward_s(cp, step_compute_s=bwd_k * step_s,
                                                 kv_bytes=kv, dkv_bytes=dkv,
                                                 bandwidth_bytes_per_s=bw, latency_s=lat,
                                                 interference=k)
        ex = context.ring_exchanges(cp)
        wire_f = ex["forward_kv"] * kv
        wire_b = ex["backward_kv"] * kv + ex["backward_dkv"] * dkv
        work = 2 * (kv + dkv)
    else:
        # one causal kernel over the whole sequence for heads/cp (masked half skipped; a
        # sliding-window layer's band only, each kind at its own FLOPs' efficiency:
        # meshplan.costmodel.window, as compute.layer_cost prices cp = 1)
        fwd_attn = sum(share * _block_s(cluster, job, b * s * s * frac * per_pair / cp,
                                        kernel_head_dim(model))
                       for share, frac in window.layer_mix(model, s))
        bwd_attn = bwd_k * fwd_attn
        if job.runtime == "torch":         # the executor's core: its copies and GQA repeat
            mem_f, mem_b = all_to_all_memory_bytes(model, s, b, tp, cp, e)
            fwd_attn += hbm_s(cluster.gpu, mem_f + cp_output_copy_bytes(model, s, b, tp, cp, e))
            bwd_attn += hbm_s(cluster.gpu, mem_b)
        bufs = context.all_to_all_buffers_bytes(model, s, b, tp, cp, e)
        sent = [context.all_to_all_sent_bytes(x, cp) for x in bufs]
        fwd_cp = bwd_cp = sum(comm.all_to_all_s(cp_link, x) for x in sent)
        wire_f = wire_b = sum(sent)
        work = sum(bufs)
    return fwd_attn, bwd_attn, fwd_cp, bwd_cp, wire_f, wire_b, work


def with_cp_attention(base: LayerParts, model: ModelSpec, cluster: Cluster, job: Job,
                      layout: Layout, cp_link: GroupLink) -> LayerParts:
    """``base`` (the parts at ``s/cp`` tokens) with the layer's attention replaced by the
    ring's or the all-to-all's (:func:`cp_attention`; ``job`` at the full sequence)."""
    fa, ba, fc, bc, wire_f, wire_b, work = cp_attention(model, cluster, job, layout, cp_link)
    lay = base.layer
    # full, and selective with the attention core among job.recompute_modules, re-run it
    rerun = layout.recompute == "full" or (layout.recompute == "selective"
                                           and recomputes_core_attention(job))
    rc = replace(lay.recompute, attention_s=fa if rerun else 0.0,
                 cp_comm_s=fc if rerun else 0.0)
    fwd = replace(lay.forward, attention_s=fa, cp_comm_s=fc)
    # the backward holds the recomputed forward: swap both attention parts
    bwd = replace(lay.backward, attention_s=ba + rc.attention_s, cp_comm_s=bc + rc.cp_comm_s)
    # the executor's eager core dispatches more than its GPU work at few tokens per rank
    host = cp_host_terms(model, job, layout, cluster.gpu, forward_s=fwd.total_s,
                         backward_s=bwd.total_s, rerun_s=rc.total_s)
    fwd = replace(fwd, overhead_s=fwd.overhead_s + host.forward_s)
    bwd = replace(bwd, overhead_s=bwd.overhead_s + host.backward_s)
    layer = LayerCost(fwd, bwd, rc, lay.wgrad_s, lay.tp_wire_bytes, lay.wgrad_gather_s,
                      lay.wgrad_gather_wire_bytes,
                      cp_wire_bytes=wire_f + wire_b + (wire_f if rerun else 0.0),
                      ep_wire_bytes=lay.ep_wire_bytes)
    return replace(base, layer=layer, backward_buf_bytes=base.backward_buf_bytes + work)


__all__ = ["CP_ANALYTICAL_CAVEAT", "CP_UNCHECKED_CAVEAT", "cp_attention", "cp_equivalent",
           "cp_group_links", "with_cp_attention"]
