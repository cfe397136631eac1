"""The MoE cost-model formulas (meshplan.costmodel.moe) against numbers worked by hand."""

from __future__ import annotations

import pytest

import meshplan as mp
from meshplan.costmodel import moe
from meshplan.hardware_profiles.curve import Curve
from meshplan.hardware_profiles.topology import GroupLink

MIXTRAL = mp.ModelSpec.preset("mixtral-8x7b")     # h 4096, f_e 14336, E 8, k 2, SwiGLU
DSV3 = mp.ModelSpec.preset("deepseek-v3")         # h 7168, f_e 2048, E 256, k 8, S 1
BF16 = mp.Job(global_batch=1024, seq_len=4096)


def test_flops_per_token_mixtral():
    f = moe.moe_forward_flops_per_token(MIXTRAL)
    assert f.router == 2 * 4096 * 8 == 65_536
    # two experts × 2 FLOPs × (gate + up + down = 3 matrices) × 4096 × 14336
    assert f.routed == 2 * 2 * 3 * 4096 * 14336 == 704_643_072
    assert f.shared == 0
    assert f.total == 704_708_608


def test_flops_per_token_deepseek_v3_with_shared_expert():
    f = moe.moe_forward_flops_per_token(DSV3)
    assert f.router == 2 * 7168 * 256 == 3_670_016
    assert f.routed == 8 * 2 * 3 * 7168 * 2048 == 704_643_072
    assert f.shared == 1 * 2 * 3 * 7168 * 2048 == 88_080_384


def test_mla_flops_per_token_deepseek_v3():
    proj, core = moe.mla_forward_flops_per_token(DSV3, seq_len=4096)
    weights = (7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 * 128 * 256 + 128 * 128 * 7168)
    assert proj == 2 * weights == 374_210_560
    assert core == 2 * 4096 * 128 * (128 + 64 + 128) == 335_544_320


def test_expert_capacity_rounds_up():
    m = MIXTRAL.__class__(**{**MIXTRAL.to_dict(), "capacity_factor": 1.25})
    # 1.25 · 4096 tokens · 2 / 8 = 1280 exactly; 1.25 · 1000 · 2 / 8 = 312.5 -> 313
    assert moe.expert_capacity(m, 4096) == 1280
    assert moe.expert_capacity(m, 1000) == 313
    assert moe.expert_capacity(MIXTRAL, 4096) is None


def test_routed_rows_balanced_imbalanced_and_bounds():
    lay = mp.Layout(dp=8, ep=8)
    # k·T·etp·ρ = 2 · 4096 · 1 · 1.0
    assert moe.routed_tokens_per_rank(MIXTRAL, lay, 4096, imbalance=1.0) == 8192
    assert moe.routed_tokens_per_rank(MIXTRAL, lay, 4096, imbalance=1.5) == 12288
    # dropless bound: ep · T · min(k, E/ep) = 8 · 4096 · min(2, 1) = 32768: one expert per
    # rank, so each token sends one copy at most to any rank
    assert moe.max_routed_rows(MIXTRAL, lay, 4096) == 32768
    assert moe.routed_tokens_per_rank(MIXTRAL, lay, 4096, imbalance=100.0) == 32768
    capped = MIXTRAL.__class__(**{**MIXTRAL.to_dict(), "capacity_factor": 1.25})
    # capacity bound: cf · k · T · etp = 1.25 · 2 · 4096 = 10240
    assert moe.max_routed_rows(capped, lay, 4096) == 10240
    assert moe.routed_tokens_per_rank(capped, lay, 4096, imbalance=1.5) == 10240
    # etp = 2 gathers the rows of the etp pair: ep 4 · T · min(2, 2) · 2
    lay2 = mp.Layout(dp=8, ep=4, etp=2)
    assert moe.routed_tokens_per_rank(MIXTRAL, lay2, 4096, imbalance=1.0) == 2 * 4096 * 2
    assert moe.max_routed_rows(MIXTRAL, lay2, 4096) == 4 * 4096 * 2 * 2
    with pytest.raises(mp.ConfigError, match="imbalance = 0.5 must be >= 1"):
        moe.routed_tokens_per_rank(MIXTRAL, lay, 4096, imbalance=0.5)


def test_params_per_rank_under_ep_and_etp():
    p = moe.moe_params_per_rank(MIXTRAL, mp.Layout(dp=8, ep=4, etp=2))
    # 8/4 = 2 experts, each 3 · 4096 · 14336 split over etp 2
    assert p.experts == 2 * 3 * 4096 * 14336 / 2 == 176_160_768
    assert p.router == 8 * 4096 and p.shared == 0
    q = moe.moe_params_per_rank(DSV3, mp.Layout(dp=8, tp=8, ep=64))
    assert q.experts == 4 * 3 * 7168 * 2048                 # 256 / 64 experts
    assert q.shared == 3 * 7168 * 2048 / 8                  # split over tp 8


def test_expert_states_shard_over_expert_data_parallel():
    # dp 8, tp 1, ep 4 -> edp 2; ZeRO-1 mixed-precision Adam: 2 + 2 + 12/edp bytes a param
    lay = mp.Layout(dp=8, ep=4, zero=1)
    w, g, o = moe.expert_state_bytes(MIXTRAL, BF16, lay, moe_layers=32)
    params = 32 * 2 * 3 * 4096 * 14336
    assert (w, g, o) == (2 * params, 2 * params, 12 * params / 2)
    assert moe.expert_grad_reduce_bytes(MIXTRAL, BF16, lay, 32) == 2 * params
    assert moe.expert_grad_reduce_bytes(MIXTRAL, BF16, mp.Layout(dp=8, ep=8), 32) == 0


def test_activation_bytes_mixtral_ep8():
    lay = mp.Layout(dp=8, ep=8)
    a = moe.moe_activation_bytes(MIXTRAL, BF16, lay, 4096, imbalance=1.0)
    rows = 8192
    assert a.router_bytes == 4096 * (8 * 4 + 2 * (4 + 8))
    # input + output (2h) + gate, up (2f) + activation output (f), 2 bytes each
    assert a.expert_bytes == rows * 2 * (2 * 4096 + 3 * 14336)
    assert a.dispatch_bytes == 2 * rows * 4096 * 2
    assert a.kept_bytes == a.router_bytes + a.expert_bytes
    worst = moe.moe_activation_bytes(MIXTRAL, BF16, lay, 4096, imbalance=1.0, worst_case=True)
    assert worst.expert_bytes == 32768 * 2 * (2 * 4096 + 3 * 14336)


def test_activation_bytes_shared_expert_deepseek_v3():
    lay = mp.Layout(dp=8, tp=8, ep=64, sequence_parallel=True)
    a = moe.moe_activation_bytes(DSV3, BF16, lay, 512, imbalance=1.0)
    assert a.shared_bytes == 512 * 3 * 2048 * 2


def test_dispatch_volume_and_all_to_all_time():
    lay = mp.Layout(dp=8, ep=8)
    sent = moe.dispatch_bytes_per_rank(MIXTRAL, BF16, lay, 4096)
    assert sent == 2 * 4096 * 4096 * 2 * 7 / 8 == 58_720_256
    assert moe.etp_gather_bytes_per_rank(MIXTRAL, BF16, mp.Layout(dp=8, ep=4, etp=2), 4096) == \
        2 * 4096 * 4096 * 2
    link = GroupLink(size=8, link_class="nvlink", busbw_gbps=400.0, hop_latency_s=1e-6,
                     efficiency=Curve(((1.0, 0.5),)), nodes_spanned=1, ranks_per_node=8)
    # 58.7 MB at 400 GB/s · 0.5 plus 7 hops of 1 µs
    assert moe.all_to_all_s(link, sent, 900.0) == pytest.approx(sent / 200e9 + 7e-6)
    assert moe.all_to_all_s(link, 0, 900.0) == 0
    assert moe.all_to_alls_per_layer("none") == 4 and moe.all_to_alls_per_layer("full") == 6


def test_all_to_all_across_nodes_by_hand():
    """ep 16 over 2 nodes of 8: the 8/15 of each rank's bytes for the other node leave
    through the rank's share of the node's NICs (400 GB/s summed over 8 members: 50 GB/s
    each), the 7/15 for its own node cross NVLink at the same time."""
    link = GroupLink(size=16, link_class="network", busbw_gbps=400.0, hop_latency_s=0.0,
                     efficiency=Curve(((1.0, 1.0),)), nodes_spanned=2, ranks_per_node=8)
    sent = 150e6
    net_s = sent * 8 / 15 / 50e9
    assert moe.all_to_all_s(link, sent, 900.0) == pytest.approx(net_s)
    # the NVLink share binds only where NVLink is slower than the NIC share
    assert moe.all_to_all_s(link, sent, 10.0) == pytest.approx(sent * 7 / 15 / 10e9)
    # one rank per node (ep spread over nodes): everything crosses the NIC, which it owns
    spread = GroupLink(size=4, link_class="network", busbw_gbps=50.0, hop_latency_s=0.0,
                       efficiency=Curve(((1.0, 1.0),)), nodes_spanned=4, ranks_per_node=1)
    assert moe.all_to_all_s(spread, sent, 900.0) == pytest.approx(sent / 50e9)
    # 8 times slower than the ring's summed-NIC bus bandwidth (the pricing before)
    assert moe.all_to_all_s(link, sent, 900.0) > 4 * sent / 400e9


def test_dense_models_are_refused():
    with pytest.raises(mp.ConfigError, match="dense model"):
        moe.moe_forward_flops_per_token(mp.ModelSpec.preset("llama3-8b"))


def test_model_flops_per_step_mixtral():
    """Per token forward, one layer: attention projections 2·(4096·(4096 + 2·1024) + 4096²)
    = 83,886,080; attention core 4·4096·4096 = 67,108,864; MoE 704,708,608 (above); 32
    layers plus logits 2·4096·32000 = 262,144,000; forward + backward = 3 × forward."""
    per_token = 32 * (83_886_080 + 67_108_864 + 704_708_608) + 262_144_000
    assert per_token == 27_644_657_664
    assert moe.moe_model_flops_per_step(MIXTRAL, 1, 4096) == 3 * 4096 * per_token
    full = moe.moe_model_flops_per_step(MIXTRAL, 1, 4096, recompute="full")
    assert full - 3 * 4096 * per_token == 4096 * 32 * (83_886_080 + 67_108_864 + 704_708_608)
    sel = moe.moe_model_flops_per_step(MIXTRAL, 1, 4096, recompute="selective")
    assert sel - 3 * 4096 * per_token == 4096 * 32 * 67_108_864


def test_model_flops_per_step_deepseek_v3_dense_layers_mla_and_mtp():
    s = 4096
    attn = 374_210_560 + 2 * s * 128 * 320                # MLA projections + core (above)
    dense = attn + 2 * 3 * 7168 * 18432
    moe_layer = attn + 3_670_016 + 704_643_072 + 88_080_384
    logits = 2 * 7168 * 129280
    mtp = moe_layer + 2 * 2 * 7168 ** 2 + logits
    per_token = 3 * dense + 58 * moe_layer + logits + mtp
    assert moe.moe_model_flops_per_step(DSV3, 2, s) == 3 * 2 * s * per_token


def test_compiled_moe_layouts_say_their_compile_speed_up_is_not_priced():
    from meshplan.costmodel.caveats import COMPILE_MOE_CAVEAT
    moe = mp.ModelSpec(name="moe", num_layers=4, hidden_size=1024, num_heads=8,
                       vocab_size=32000, max_seq_len=2048, activation="swiglu", norm="rmsnorm",
                       position_embedding="rope", tied_embeddings=False, bias=False,
                       num_experts=8, experts_per_token=2, moe_ffn_hidden_size=704)
    dense = mp.ModelSpec(name="dense", num_layers=4, hidden_size=1024, num_heads=8,
                         vocab_size=32000, max_seq_len=2048)
    job = mp.Job(global_batch=8, seq_len=2048, runtime="torch")
    cl = mp.Cluster.preset("dgx-h200", nodes=1, gpus_per_node=1)
    compiled = mp.Layout(micro_batch=2, compile=True)
    assert COMPILE_MOE_CAVEAT in mp.estimate(moe, cl, job, compiled).caveats
    assert COMPILE_MOE_CAVEAT not in mp.estimate(moe, cl, job, mp.Layout(micro_batch=2)).caveats
    assert COMPILE_MOE_CAVEAT not in mp.estimate(dense, cl, job, compiled).caveats
