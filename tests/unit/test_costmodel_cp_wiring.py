"""Context parallelism wired into estimate(): the per-rank equivalent, the ring's and the
all-to-all's attention and exchanges, the links the cp group crosses, ZeRO over dp·cp."""

from dataclasses import replace

import pytest

import meshplan as mp
from meshplan.costmodel import comm, context
from meshplan.costmodel.context_tables import (CP_UNCHECKED_CAVEAT, cp_equivalent,
                                               cp_group_links)
from meshplan.costmodel.tables import layer_tables
from meshplan.hardware_profiles.curve import Curve

# Llama 3.1's 128k context (RoPE-scaled): within the model's maximum, so no
# past-the-maximum warning for the long sequences these tests are about
LLAMA = replace(mp.ModelSpec.preset("llama3-8b"), max_seq_len=131072)
CLUSTER = mp.Cluster.preset("dgx-h100", nodes=4)
JOB = mp.Job(global_batch=16, seq_len=32768)


def _flat(cluster, eff=0.5):
    """The cluster with a flat attention efficiency (attention time ∝ FLOPs)."""
    return cluster.replace(gpu=replace(cluster.gpu, attention_efficiency=Curve(
        ((1.0, eff), (1e18, eff)))))


def test_non_attention_terms_equal_the_per_rank_equivalent():
    lay = mp.Layout(dp=2, cp=4, tp=4, sequence_parallel=True, zero=1)
    job2, lay2 = cp_equivalent(JOB, lay)
    assert (job2.seq_len, job2.global_batch, lay2.dp, lay2.cp) == (8192, 64, 8, 1)
    assert lay2.num_microbatches(job2.global_batch) == lay.num_microbatches(JOB.global_batch)
    t, t2 = layer_tables(LLAMA, CLUSTER, JOB, lay), layer_tables(LLAMA, CLUSTER, job2, lay2)
    f, f2 = t.parts.layer.forward, t2.parts.layer.forward
    # GEMMs, memory-bound ops and SP collectives at s/cp tokens; states over dp·cp
    assert (f.gemm_s, f.memory_bound_s) == (f2.gemm_s, f2.memory_bound_s)
    assert t.layer_activation_bytes == t2.layer_activation_bytes
    assert t.layer_state_bytes == t2.layer_state_bytes
    assert t.parts.logits_bytes == t2.parts.logits_bytes
    assert t.given_layout == lay and t.layout == lay2
    est = mp.estimate(LLAMA, CLUSTER, JOB, lay)
    assert est.num_gpus == 32 and CP_UNCHECKED_CAVEAT in est.caveats


def test_zero_shards_over_dp_times_cp():
    one = mp.estimate(LLAMA, CLUSTER, JOB, mp.Layout(dp=1, cp=8, tp=4, zero=1))
    plain = mp.estimate(LLAMA, CLUSTER, JOB, mp.Layout(dp=1, cp=8, tp=4, zero=0))
    assert one.memory[0].optimizer_bytes == pytest.approx(plain.memory[0].optimizer_bytes / 8)


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_ring_attention_is_one_cpth_of_the_causal_work_at_flat_efficiency(cp):
    cl = _flat(CLUSTER)
    base = layer_tables(LLAMA, cl, JOB, mp.Layout(tp=4)).parts.layer
    ring = layer_tables(LLAMA, cl, JOB, mp.Layout(tp=4, cp=cp)).parts.layer
    # eq. 2: s²/(2cp) + s/(2cp) pairs; the flash kernel at cp = 1 executes s²/2
    assert ring.forward.attention_s == pytest.approx(base.forward.attention_s / cp, rel=1e-9)
    assert ring.backward.attention_s == pytest.approx(2.5 * ring.forward.attention_s)


def test_ring_blocks_run_at_their_own_efficiency():
    """With the datasheet curve, cp small blocks run less efficiently than one big kernel."""
    big = mp.Cluster.preset("dgx-h100", nodes=32)
    base = layer_tables(LLAMA, big, JOB, mp.Layout(tp=8)).parts.layer
    ring = layer_tables(LLAMA, big, JOB, mp.Layout(tp=8, cp=32)).parts.layer
    assert ring.forward.attention_s > base.forward.attention_s / 32


def test_ring_exposed_time_by_hand():
    lay = mp.Layout(tp=8, cp=4)          # cp ranks 8 apart: one per node, over the NICs
    t = layer_tables(LLAMA, CLUSTER, JOB, lay)
    link = t.links.cp
    assert link.size == 4 and link.link_class == "network"
    s, e = JOB.seq_len, 2
    kv = 2 * (s / 4) * LLAMA.kv_dim / 8 * e
    assert context.ring_kv_bytes(LLAMA, s, 1, 8, 4, e) == kv
    flops = context.ring_step_pairs(s, 4) * 4.0 * LLAMA.q_dim / 8
    gpu = CLUSTER.gpu
    step = flops / (gpu.peak_flops("bf16") * gpu.attention_efficiency(flops))
    # one p2p call per ring step: α_base + one step
    t_kv = kv / link.bandwidth_bytes_per_s(kv) + link.base_latency_s + link.hop_latency_s
    k = gpu.corrections.cp_ring_interference
    hidden = min(t_kv, step)
    assert t.parts.layer.forward.cp_comm_s == pytest.approx(3 * (t_kv - hidden + k * hidden))
    assert t.parts.layer.forward.attention_s == pytest.approx(4 * step)


def test_ring_interference_is_a_named_correction_from_the_profile():
    lay = mp.Layout(tp=4, cp=2, dp=4)
    est = mp.estimate(LLAMA, CLUSTER, JOB, lay)
    names = [c.name for c in est.corrections]
    assert names == ["cp_ring_interference"] and est.corrections[0].step_time_delta_s > 0
    gpu = CLUSTER.gpu
    none = CLUSTER.replace(gpu=replace(gpu, corrections=replace(gpu.corrections,
                                                                 cp_ring_interference=0.0)))
    assert mp.estimate(LLAMA, none, JOB, lay).step_time_s == pytest.approx(
        est.step_time_s - est.corrections[0].step_time_delta_s)
    a2a = mp.estimate(LLAMA, CLUSTER, JOB, lay.replace(cp_style="all-to-all"))
    assert a2a.corrections == ()


def test_all_to_all_four_exchanges_per_pass_exposed():
    lay = mp.Layout(tp=2, cp=4, cp_style="all-to-all")
    t = layer_tables(LLAMA, CLUSTER, JOB, lay)
    bufs = context.all_to_all_buffers_bytes(LLAMA, JOB.seq_len, 1, 2, 4, 2)
    want = sum(comm.all_to_all_s(t.links.cp, context.all_to_all_sent_bytes(b, 4))
               for b in bufs)
    assert len(bufs) == 4
    assert t.parts.layer.forward.cp_comm_s == pytest.approx(want)
    assert t.parts.layer.backward.cp_comm_s == pytest.approx(want)
    assert t.links.cp.link_class == "nvlink"       # tp·cp = 8: one node


@pytest.mark.parametrize("style", ["ring", "all-to-all"])
def test_recompute_reruns_the_exchanges(style):
    lay = mp.Layout(tp=2, cp=4, cp_style=style)
    none = layer_tables(LLAMA, CLUSTER, JOB, lay).parts.layer
    for rc in ("selective", "full"):
        layer = layer_tables(LLAMA, CLUSTER, JOB, lay.replace(recompute=rc)).parts.layer
        assert layer.recompute.cp_comm_s == pytest.approx(none.forward.cp_comm_s)
        assert layer.backward.cp_comm_s == pytest.approx(
            none.backward.cp_comm_s + none.forward.cp_comm_s)


def test_links_follow_megatron_order_tp_cp_dp_pp():
    lay = mp.Layout(tp=2, cp=4, dp=2, pp=2)
    g = cp_group_links(CLUSTER, lay)
    assert (g.tp.size, g.cp.size, g.dp.size, g.pp.size) == (2, 4, 8, 2)
    assert g.cp == CLUSTER.group_link(4, 2)          # ranks 2 apart
    assert g.dp == CLUSTER.group_link(8, 2)          # dp·cp ranks, stride tp
    assert g.pp == CLUSTER.group_link(2, 16)         # stride tp·cp·dp


def test_breakdown_and_volume_show_cp():
    est = mp.estimate(LLAMA, CLUSTER, JOB, mp.Layout(tp=8, cp=4))
    assert est.time.cp_comm_s > 0 and est.comm_bytes["cp"] > 0
    assert est.time.total_s == pytest.approx(est.step_time_s, rel=1e-6)
    dense = mp.estimate(LLAMA, CLUSTER, mp.Job(global_batch=16, seq_len=4096),
                        mp.Layout(tp=8, dp=4))
    assert "cp" not in dense.comm_bytes and dense.time.cp_comm_s == 0.0


def test_cp_makes_long_sequences_fit():
    job = mp.Job(global_batch=8, seq_len=131072)
    plain = mp.estimate(LLAMA, CLUSTER, job, mp.Layout(tp=8, dp=4, sequence_parallel=True))
    cp = mp.estimate(LLAMA, CLUSTER, job, mp.Layout(tp=8, cp=4, sequence_parallel=True))
    assert not plain.fits and cp.fits


@pytest.mark.parametrize("style", ["ring", "all-to-all"])
def test_fp8_leaves_cp_attention_in_16_bits(style):
    """fp8 training runs the linears in fp8 and attention in bf16 (TransformerEngine's fp8
    attention is opt-in): a cp layout's attention costs the same in an fp8 and a bf16 job,
    as a cp = 1 layout's does (the ring's blocks were once priced at the fp8 peak)."""
    fp8 = replace(JOB, precision="fp8")
    for lay in (mp.Layout(dp=4, cp=2, tp=4, sequence_parallel=True, zero=1, cp_style=style),
                mp.Layout(dp=8, tp=4, sequence_parallel=True, zero=1)):
        a16 = layer_tables(LLAMA, CLUSTER, JOB, lay).parts.layer.forward.attention_s
        a8 = layer_tables(LLAMA, CLUSTER, fp8, lay).parts.layer.forward.attention_s
        assert a8 == pytest.approx(a16, rel=1e-12) and a16 > 0
