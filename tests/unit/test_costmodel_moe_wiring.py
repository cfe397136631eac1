"""Mixture of experts wired into estimate() and the planner: the routed part, the experts'
states over edp, dense layers, multi-token prediction, MLA, the imbalance correction."""

import random
from dataclasses import replace

import pytest

import meshplan as mp
from meshplan.costmodel import comm, estimate, mla, moe
from meshplan.costmodel.compute import gemm_s
from meshplan.costmodel.memory import stage_params, state_bytes_per_param
from meshplan.costmodel.moe_tables import expert_links
from meshplan.costmodel.tables import layer_tables
from meshplan.hardware_profiles.curve import Curve
from meshplan.planner import Constraints
from meshplan.planner.search import partition_candidates
from meshplan.planner.space import enumerate_configs, expert_options
from meshplan.planner.tables import build_tables

# a small DeepSeek-like model: MLA, 16 routed + 1 shared expert, the first 2 layers dense, MTP;
# a 32k context like the long-context cases below
MINI_V3 = mp.ModelSpec(name="mini-v3", num_layers=8, hidden_size=256, num_heads=8,
                       vocab_size=1024, max_seq_len=32768, activation="swiglu", norm="rmsnorm",
                       position_embedding="rope", tied_embeddings=False, bias=False,
                       ffn_hidden_size=768, num_experts=16, experts_per_token=4,
                       moe_ffn_hidden_size=128, num_shared_experts=1, dense_layers=(0, 1),
                       router="sigmoid", mtp_layers=1, q_lora_rank=96, kv_lora_rank=64,
                       qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32)
MIXTRAL = mp.ModelSpec.preset("mixtral-8x7b")
H100 = mp.Cluster.preset("dgx-h100", nodes=2)
JOB = mp.Job(global_batch=32, seq_len=1024)


def _numbers(cluster, **kw):
    gpu = cluster.gpu
    return cluster.replace(gpu=replace(gpu, corrections=replace(gpu.corrections, **kw)))


def _random_partition(rng, layers, stages):
    cuts = sorted(rng.sample(range(1, layers), stages - 1))
    return [b - a for a, b in zip([0, *cuts], [*cuts, layers])]


@pytest.mark.parametrize("model,seq", [(MINI_V3, 1024), (MINI_V3, 32768),
                                       (mp.ModelSpec.preset("olmoe-1b-7b"), 4096)])
def test_tables_match_estimate_with_experts_dense_layers_and_cp(model, seq):
    """The planner's tables, with each rank's dense layers counted, are estimate()."""
    rng = random.Random(3)
    job = mp.Job(global_batch=32, seq_len=seq)
    cons = Constraints(cp=(1, 4) if seq > 4096 else None, max_micro_batch=2)
    configs = list(enumerate_configs(model, H100, job, [16], cons))
    assert any(c.ep > 1 for c in configs) and (seq <= 4096 or any(c.cp > 1 for c in configs))
    for cfg in rng.sample(configs, 25):
        t = build_tables(model, H100, job, cfg)
        # a random partition where every stage can hold a layer, else the planner's own
        parts = (_random_partition(rng, model.num_layers, cfg.stages)
                 if cfg.stages <= model.num_layers
                 else list(partition_candidates(cfg, model.num_layers, None)[0]))
        est = estimate(model, H100, job, cfg.layout(parts))
        assert t.step_time_s(parts) == pytest.approx(est.step_time_s, rel=1e-9)
        dense = t.rank_dense_counts(parts)
        for r, n in enumerate(t.rank_layers(parts)):
            exact = t.rank_memory_bytes(r, n, dense[r])
            assert exact == pytest.approx(est.memory[r].total_bytes, rel=1e-9)
            assert t.rank_memory_bytes(r, n) >= exact * (1 - 1e-12)   # the planner's caps
        assert t.peak_memory_bytes(parts) == pytest.approx(est.memory_peak_bytes, rel=1e-9)


def test_routed_part_by_hand():
    lay = mp.Layout(dp=16, ep=8, zero=1)
    cl = _numbers(H100, moe_load_imbalance=1.0)
    t = layer_tables(MIXTRAL, cl, JOB, lay)
    gpu, peak = cl.gpu, cl.gpu.peak_flops("bf16")
    h, f, tokens = 4096, 14336, 1024
    rows = 2 * tokens                  # k·T, balanced
    per_expert = rows / 1              # 8 experts over ep 8: one each
    expert = gemm_s(gpu, peak, 2 * per_expert * h * 2 * f) + gemm_s(gpu, peak, 2 * per_expert * f * h)
    router = gemm_s(gpu, peak, 2 * tokens * h * 8)
    attn = sum(gemm_s(gpu, peak, 2.0 * m * k * n) for m, k, n in
               ((tokens, h, (4096 + 2 * 1024)), (tokens, 4096, h)))
    assert t.parts.layer.forward.gemm_s == pytest.approx(attn + expert + router, rel=1e-12)
    sent = moe.dispatch_bytes_per_rank(MIXTRAL, JOB, lay, tokens)
    assert sent == 2 * tokens * h * 2 * 7 / 8
    assert t.parts.layer.forward.ep_comm_s == pytest.approx(
        2 * moe.all_to_all_s(t.links.ep, sent, gpu.nvlink_gbps, gpu.nvlink_efficiency),
        rel=1e-12)
    assert t.links.ep.nodes_spanned == 1    # inside a node: the ring formula
    assert moe.all_to_all_s(t.links.ep, sent, gpu.nvlink_gbps) == \
        comm.all_to_all_s(t.links.ep, sent)
    assert t.parts.layer.backward.ep_comm_s == t.parts.layer.forward.ep_comm_s
    assert t.parts.layer.forward.tp_comm_s == 0.0     # tp 1


def test_cross_node_dispatch_uses_each_rank_nic_share():
    """ep 16 over the 2 nodes of 8 H100s: the layer's all-to-all time is the other node's
    8/15 of each rank's bytes at its NIC (50 GB/s NDR x the network curve), not at the
    node's summed NICs; the intra-node ep 8 layout is 4-5x cheaper per byte."""
    qwen = mp.ModelSpec.preset("qwen3-30b-a3b")
    cl = _numbers(H100, moe_load_imbalance=1.0)
    lay = mp.Layout(dp=16, ep=16, zero=1)
    t = layer_tables(qwen, cl, JOB, lay)
    link = t.links.ep
    assert (link.size, link.nodes_spanned, link.ranks_per_node) == (16, 2, 8)
    sent = moe.dispatch_bytes_per_rank(qwen, JOB, lay, 1024)
    total = sent * 16 / 15
    want = (sent * 8 / 15 / (50e9 * cl.network.efficiency(total))
            + comm.call_latency_s(link, "all_to_all"))
    assert t.parts.layer.forward.ep_comm_s == pytest.approx(2 * want, rel=1e-12)
    inside = layer_tables(qwen, cl, JOB, mp.Layout(dp=16, ep=8, zero=1))
    sent8 = moe.dispatch_bytes_per_rank(qwen, JOB, mp.Layout(dp=16, ep=8), 1024)
    assert (t.parts.layer.forward.ep_comm_s / sent
            > 4 * inside.parts.layer.forward.ep_comm_s / sent8)


def test_imbalance_is_a_profile_correction_with_ep():
    # micro-batch 2: a GPU-bound MoE layer (at 1,024 tokens the host's work per layer sets
    # its time and the routed load does not show: test_megatron_moe_host_*)
    lay = mp.Layout(dp=16, ep=8, zero=1, micro_batch=2)
    est = estimate(MIXTRAL, H100, JOB, lay)
    (c,) = [c for c in est.corrections if c.name == "moe_load_imbalance"]
    assert c.step_time_delta_s > 0 and c.memory_delta_bytes > 0
    flat = estimate(MIXTRAL, _numbers(H100, moe_load_imbalance=1.0), JOB, lay)
    assert flat.step_time_s == pytest.approx(est.step_time_s - c.step_time_delta_s)
    assert not [c for c in estimate(MIXTRAL, H100, JOB, lay.replace(ep=1)).corrections
                if c.name == "moe_load_imbalance"]


def test_expert_states_shard_over_edp_and_dense_ones_over_dp_cp():
    lay = mp.Layout(dp=4, tp=2, ep=4, zero=1, sequence_parallel=True)   # edp = 2
    est = estimate(MIXTRAL, H100, JOB, lay)
    per = state_bytes_per_param(JOB)
    dense = stage_params(MIXTRAL, 32, 2, first=True, last=True, pp=1)
    experts = 32 * moe.moe_params_per_rank(MIXTRAL, lay).experts
    assert lay.edp == 2
    assert est.memory[0].optimizer_bytes == pytest.approx(
        dense * per.optimizer / 4 + experts * per.optimizer / 2, rel=1e-12)
    assert est.memory[0].weights_bytes == pytest.approx((dense + experts) * per.weights)


def test_torch_reduces_the_experts_gradients_after_the_backward_megatron_overlaps_them():
    """The executor leaves an MoE rank's experts out of DDP and all-reduces their gradients
    over edp once the backward is done (ZeRO-0/1): none of it hides behind a backward, so
    the exposed data-parallel time holds all of it; Megatron's overlapped buckets keep it
    overlappable; at edp 1 there is nothing to reduce."""
    from meshplan.costmodel import data_parallel as dpm
    lay = mp.Layout(dp=4, tp=2, ep=4, zero=1, sequence_parallel=True)   # edp = 2
    torch_job = replace(JOB, runtime="torch")
    t = layer_tables(MIXTRAL, H100, torch_job, lay)
    st = t.rank_state(0, 32)
    experts = 32 * moe.moe_params_per_rank(MIXTRAL, lay).experts
    reduce_s = comm.all_reduce_s(expert_links(H100, lay)["edp"],
                                 experts * state_bytes_per_param(torch_job).grads)
    assert st.after_backward_s == pytest.approx(reduce_s, rel=1e-9) and reduce_s > 0
    # whatever the backward hides of the dense reduction, the experts' all of it stays
    assert dpm.exposed_dp_s(st, lay, torch_job, 1.0, 1.0, 0.0) == pytest.approx(
        st.last_bucket_s + reduce_s + st.param_gather_s, rel=1e-9)
    mega = layer_tables(MIXTRAL, H100, JOB, lay).rank_state(0, 32)
    assert mega.after_backward_s == 0.0
    ep8 = layer_tables(MIXTRAL, H100, torch_job, lay.replace(ep=8))    # edp 1
    assert ep8.rank_state(0, 32).after_backward_s == 0.0


def test_one_micro_batch_relief_counts_the_experts_gradients():
    """Runtime torch, one micro-batch a step: every gradient, the routed experts' included,
    appears in the only backward (moeh3, 2026-11-29: the relief had left the experts out)."""
    spec = replace(MIXTRAL, num_layers=2, hidden_size=512, num_heads=8, num_kv_heads=8,
                   ffn_hidden_size=1024, moe_ffn_hidden_size=1024, vocab_size=1024)
    cl = mp.Cluster.preset("dgx-h200", nodes=1, gpus_per_node=1)
    job = mp.Job(global_batch=8, seq_len=1024, runtime="torch")
    lay = mp.Layout(micro_batch=8)                      # m = 1
    est = estimate(spec, cl, job, lay)
    relief = -next(c.memory_delta_bytes for c in est.corrections
                   if c.name == "first_backward_relief")
    grads = est.memory[0].grads_bytes
    experts = 2 * moe.moe_params_per_rank(spec, lay).experts * state_bytes_per_param(job).grads
    # one micro-batch's activations exceed the gradients here: the relief is all of them
    assert est.memory[0].activations_bytes > grads
    assert relief == pytest.approx(grads, rel=1e-9) and relief > experts
    # two micro-batches: the second forward runs with every gradient allocated
    two = estimate(spec, cl, job, lay.replace(micro_batch=4))
    assert not [c for c in two.corrections
                if c.name == "first_backward_relief" and c.memory_delta_bytes]


def test_dense_layers_sit_on_the_first_stages():
    t = layer_tables(MINI_V3, H100, JOB, mp.Layout(dp=4, pp=4, ep=4, zero=1))
    assert t.dense_counts([2, 2, 2, 2]) == [2, 0, 0, 0]
    assert t.dense_counts([1, 3, 2, 2]) == [1, 1, 0, 0]
    f, _, _ = t.stage_times([2, 2, 2, 2])
    f1, _, _ = t.stage_times([1, 3, 2, 2])
    assert f[0] - t.first_forward_s == pytest.approx(
        2 * t.layer_forward_s + 2 * t.dense_delta_forward_s + t.overhead_s)
    assert t.dense_delta_forward_s != 0 and f1[1] != f[1]


def test_mfu_counts_active_experts_and_mla():
    est = estimate(MINI_V3, H100, JOB, mp.Layout(dp=16, ep=16))
    assert est.model_flops_per_step == moe.moe_model_flops_per_step(MINI_V3, 32, 1024)
    proj, core = moe.mla_forward_flops_per_token(MINI_V3, 1024)
    shapes = mla.gemm_shapes(MINI_V3, 1.0, 1)
    assert sum(2 * m * k * n for m, k, n in shapes) == proj       # one token, tp 1
    assert mla.pair_flops(MINI_V3, 1) * 1024 == core


def test_multi_token_prediction_on_the_last_stage():
    lay = mp.Layout(dp=4, pp=4, ep=4, zero=1)
    with_mtp = layer_tables(MINI_V3, H100, JOB, lay)
    without = layer_tables(replace(MINI_V3, mtp_layers=0), H100, JOB, lay)
    assert with_mtp.last_forward_s - without.last_forward_s == pytest.approx(
        without.layer_forward_s + without.parts.logits[0].total_s)
    assert with_mtp.last_extra_bytes > without.last_extra_bytes
    assert with_mtp.first_forward_s == without.first_forward_s


def test_expert_links_fold_over_the_stage():
    links = expert_links(H100, mp.Layout(dp=4, tp=2, ep=4, etp=2))
    assert links["etp"] == H100.group_link(2, 1)
    assert links["ep"] == H100.group_link(4, 2)
    assert links["edp"].size == 1
    wide = expert_links(H100, mp.Layout(dp=16, ep=16))
    assert wide["ep"].link_class == "network" and wide["ep"].size == 16


def test_grouped_gemm_curve_prices_the_experts():
    lay = mp.Layout(dp=16, ep=8, zero=1)
    base = layer_tables(MIXTRAL, H100, JOB, lay).parts.layer.forward.gemm_s
    slow = H100.replace(gpu=replace(H100.gpu, grouped_gemm_efficiency=Curve(
        ((1.0, 0.1), (1e15, 0.1)))))
    assert layer_tables(MIXTRAL, slow, JOB, lay).parts.layer.forward.gemm_s > 2 * base
    assert "grouped_gemm_efficiency" in slow.gpu.to_dict()
    assert "grouped_gemm_efficiency" not in H100.gpu.to_dict()


def test_planner_searches_ep_and_etp():
    assert expert_options(MIXTRAL, JOB, Constraints(), 2, 1, 8) == [
        (1, 1), (1, 2), (2, 1), (2, 2), (4, 1), (4, 2), (8, 1), (8, 2)]
    assert expert_options(MIXTRAL, mp.Job(global_batch=8, seq_len=64, runtime="torch"),
                          Constraints(), 2, 1, 8) == [(1, 1), (2, 1), (4, 1), (8, 1)]
    assert expert_options(mp.ModelSpec.preset("llama3-8b"), JOB, Constraints(), 2, 1, 8) == \
        [(1, 1)]
    # runtime torch runs etp > 1 where asked: by the options, or pinned with --fix etp=2
    torch_job = mp.Job(global_batch=8, seq_len=64, runtime="torch")
    assert expert_options(MIXTRAL, torch_job, Constraints(etp=(2,)), 2, 1, 8) == [
        (1, 2), (2, 2), (4, 2), (8, 2)]
    assert expert_options(MIXTRAL, torch_job, Constraints(fixed={"etp": 2}), 2, 1, 8) == [
        (1, 2), (2, 2), (4, 2), (8, 2)]
    from meshplan.planner.space import check_options
    with pytest.raises(mp.ConfigError, match=r"Constraints.etp \[3\]: none divides the expert "
                                             r"widths \[14336\]"):
        check_options(MIXTRAL, torch_job, Constraints(etp=(3,)))
    check_options(MIXTRAL, torch_job, Constraints(etp=(3, 2)))
    p = mp.plan(MINI_V3, H100, JOB, top_k=3, constraints=Constraints(
        ep=(4, 8), schedules=("1f1b",), recompute=("none",), max_micro_batch=1))
    assert all(c.layout.ep in (4, 8) for c in p.candidates)
    assert list(p.table["ep"]) == [c.layout.ep for c in p.candidates]
    assert "ep" in p.best.layout.short() and p.best.estimate.fits


def test_mtp_under_runtime_torch_says_the_executor_does_not_run_it():
    from meshplan.costmodel.caveats import MTP_TORCH_CAVEAT
    lay = mp.Layout(dp=8, ep=8, micro_batch=1)
    torch_job = mp.Job(global_batch=16, seq_len=1024, runtime="torch")
    assert MTP_TORCH_CAVEAT in estimate(MINI_V3, H100, torch_job, lay).caveats
    assert MTP_TORCH_CAVEAT not in estimate(replace(MINI_V3, mtp_layers=0), H100, torch_job,
                                            lay).caveats
    assert MTP_TORCH_CAVEAT not in estimate(MINI_V3, H100, replace(torch_job,
                                                                   runtime="megatron"),
                                            lay).caveats


def _host_delta(est) -> float:
    return sum(c.step_time_delta_s for c in est.corrections if c.name == "megatron_moe_host")


def test_megatron_moe_host_bounds_a_small_eager_moe_layer():
    """Runtime "megatron", eager: an MoE layer whose GPU work is below the host's
    megatron_moe_layer_host_ops · host_op_dispatch_s costs the host's time; a GPU-bound one,
    CUDA graphs, or the correction switched off cost the GPU's."""
    lay = mp.Layout(dp=16, ep=8, zero=1)                     # 1,024 tokens a micro-batch
    est = estimate(MIXTRAL, H100, JOB, lay)
    gpu = H100.gpu
    host_s = gpu.corrections.megatron_moe_layer_host_ops * gpu.host_op_dispatch_s
    layer = est.stage_forward_s[0] + est.stage_backward_s[0]
    per_layer = layer / MIXTRAL.num_layers
    assert per_layer == pytest.approx(host_s, rel=0.05)
    assert _host_delta(est) > 0
    off = estimate(MIXTRAL, _numbers(H100, megatron_moe_layer_host_ops=0.0), JOB, lay)
    assert off.step_time_s == pytest.approx(est.step_time_s - _host_delta(est))
    # CUDA graphs: neither the host's work nor the dispatcher's sync (which ``off`` keeps)
    graphs = estimate(MIXTRAL, H100, replace(JOB, cuda_graphs=True), lay)
    assert graphs.step_time_s < off.step_time_s
    assert not [c for c in graphs.corrections if c.name == "megatron_moe_host"]
    big = lay.replace(micro_batch=8)                         # GPU-bound: nothing added
    assert _host_delta(estimate(MIXTRAL, H100, replace(JOB, global_batch=128), big)) == 0


def test_cuda_graphs_needs_runtime_megatron():
    with pytest.raises(mp.ConfigError, match="cuda_graphs"):
        mp.Job(global_batch=8, seq_len=1024, runtime="torch", cuda_graphs=True)
