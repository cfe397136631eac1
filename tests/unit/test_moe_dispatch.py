"""De-duplicating MoE dispatchers (Job.moe_dispatcher = "deepep",
meshplan.costmodel.moe_dispatch): copies per token by hand, where they equal the all-to-all's,
and what they change in an estimate."""

from __future__ import annotations

import dataclasses
from math import comb

import pytest

import meshplan as mp
from meshplan.costmodel import estimate, moe_dispatch
from meshplan.costmodel.inputs import table_inputs
from meshplan.errors import ConfigError

QWEN = mp.ModelSpec.preset("qwen3-235b-a22b")     # E 128, k 8, h 4096
MIXTRAL = mp.ModelSpec.preset("mixtral-8x7b")     # E 8, k 2


def test_block_hit_probability_by_hand():
    assert moe_dispatch.block_hit_probability(8, 1, 2) == pytest.approx(1 - 21 / 28)
    assert moe_dispatch.block_hit_probability(8, 8, 2) == 1.0
    assert moe_dispatch.block_hit_probability(128, 16, 8) == pytest.approx(
        1 - comb(112, 8) / comb(128, 8))


def test_copies_per_token_by_hand():
    nvl, net = moe_dispatch.dedup_copies(QWEN, 8, 1)              # 16 experts a rank
    assert nvl == pytest.approx(7 * (1 - comb(112, 8) / comb(128, 8)))   # 4.67, not 7
    assert net == 0.0
    nvl, net = moe_dispatch.dedup_copies(QWEN, 32, 4)             # 32 experts a node
    assert net == pytest.approx(3 * (1 - comb(96, 8) / comb(128, 8)))    # 2.72, not 6
    assert nvl == pytest.approx(31 * (1 - comb(124, 8) / comb(128, 8)))


def test_one_expert_a_rank_sends_what_the_all_to_all_sends():
    """With one expert per rank a token's k experts sit on k distinct ranks: nothing to
    de-duplicate, k·(ep − 1)/ep copies leave the rank either way."""
    nvl, _ = moe_dispatch.dedup_copies(MIXTRAL, 8, 1)
    assert nvl == pytest.approx(2 * 7 / 8)


def test_intra_node_time_by_hand():
    link = mp.Cluster.preset("dgx-h100").group_link(8, 1)
    nbytes = 100e6
    want = nbytes / link.bandwidth_bytes_per_s(nbytes * 8 / 7) + link.latency_s(1)
    assert moe_dispatch.dedup_dispatch_s(link, nbytes, 0.0, 450.0) == pytest.approx(want)


def test_deepep_needs_megatron():
    with pytest.raises(ConfigError, match="moe_dispatcher"):
        mp.Job(global_batch=8, seq_len=16, runtime="torch", moe_dispatcher="deepep")
    with pytest.raises(ConfigError, match="moe_dispatcher"):
        mp.Job(global_batch=8, seq_len=16, moe_dispatcher="flex")


def _balanced(cluster):
    gpu = cluster.gpu
    return cluster.replace(gpu=dataclasses.replace(gpu, corrections=dataclasses.replace(
        gpu.corrections, moe_load_imbalance=1.0)))


def _ep_comm(model, cluster, layout, dispatcher):
    job = mp.Job(global_batch=512, seq_len=4096, moe_dispatcher=dispatcher)
    t = table_inputs(model, cluster, job, layout)
    return t.parts.layer.forward.ep_comm_s, estimate(model, cluster, job, layout)


def test_cross_node_dispatch_sends_each_node_once():
    """Qwen3-235B over ep 32 on 4 DGX-H100: the network carries 2.72 copies a token
    instead of 6, so the dispatch is priced 6/2.72 cheaper (the NIC sets its time)."""
    cluster = _balanced(mp.Cluster.preset("dgx-h100", nodes=4))
    lay = mp.Layout(dp=32, ep=32, micro_batch=1, zero=1)
    a2a, est_a2a = _ep_comm(QWEN, cluster, lay, "alltoall")
    dee, est_dee = _ep_comm(QWEN, cluster, lay, "deepep")
    link = table_inputs(QWEN, cluster, mp.Job(global_batch=512, seq_len=4096), lay).links.ep
    nvl, net = moe_dispatch.dedup_copies(QWEN, 32, 4)
    token_bytes = 4096 * 4096 * 2                  # the rank's 4096 tokens, h 4096, bf16
    net_s = net * token_bytes / (link.bandwidth_bytes_per_s((net + nvl) * token_bytes) / 8)
    assert dee == pytest.approx(2 * (net_s + link.latency_s(1, 1)), rel=1e-9)
    assert dee < a2a
    assert est_dee.step_time_s < est_a2a.step_time_s
    # the forwards inside the receiving node add NVLink bytes (7.1 copies a token against
    # the all-to-all's 1.75 inside the node): more bytes in all, fewer on the network
    assert est_dee.comm_bytes["ep"] > est_a2a.comm_bytes["ep"]


def test_no_dedup_effect_with_one_expert_a_rank():
    cluster = mp.Cluster.preset("dgx-h100")
    lay = mp.Layout(dp=8, ep=8, micro_batch=1, zero=1)
    _, a2a = _ep_comm(MIXTRAL, cluster, lay, "alltoall")
    _, dee = _ep_comm(MIXTRAL, cluster, lay, "deepep")
    assert dee.comm_bytes["ep"] == pytest.approx(a2a.comm_bytes["ep"], rel=1e-12)


def test_dense_model_ignores_the_dispatcher():
    m = mp.ModelSpec.preset("llama3-8b")
    cluster = mp.Cluster.preset("dgx-h100")
    lay = mp.Layout(dp=8, zero=1)
    a = estimate(m, cluster, mp.Job(global_batch=64, seq_len=4096), lay)
    b = estimate(m, cluster, dataclasses.replace(mp.Job(global_batch=64, seq_len=4096),
                                                 moe_dispatcher="deepep"), lay)
    assert a.step_time_s == b.step_time_s
