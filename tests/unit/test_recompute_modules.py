"""Job.recompute_modules: what Layout.recompute = "selective" re-runs (Megatron-Core's
--recompute-modules core_attn / layernorm / moe_act / mla_up_proj) — memory dropped, time
added, FLOPs."""

import json
from dataclasses import replace

import pytest

import meshplan as mp
from meshplan.costmodel import estimate
from meshplan.costmodel import mla
from meshplan.costmodel.compute import gemm_s, hbm_s, layer_cost
from meshplan.costmodel.memory import activation_bytes_per_element, layer_activations
from meshplan.costmodel.moe_layer import routed_mlp, with_routed_mlp
from meshplan.costmodel.parts import layer_parts
from meshplan.costmodel.inputs import table_inputs

LLAMA = mp.ModelSpec.preset("llama3-8b")
MIXTRAL = mp.ModelSpec.preset("mixtral-8x7b")
DSV3 = mp.ModelSpec.preset("deepseek-v3")
H100 = mp.Cluster.preset("dgx-h100", nodes=2)
JOB = mp.Job(global_batch=32, seq_len=4096)
NORMS = mp.Job(global_batch=32, seq_len=4096, recompute_modules=("core_attn", "layernorm"))
ONLY_NORMS = mp.Job(global_batch=32, seq_len=4096, recompute_modules=("layernorm",))


def test_default_is_the_attention_core_and_nothing_moves():
    assert JOB.selective_modules == ("core_attn",)
    same = mp.Job(global_batch=32, seq_len=4096, recompute_modules=["core_attn"])
    lay = mp.Layout(dp=2, pp=2, tp=4, sequence_parallel=True, recompute="selective")
    assert estimate(LLAMA, H100, same, lay).step_time_s == estimate(LLAMA, H100, JOB,
                                                                   lay).step_time_s


@pytest.mark.parametrize("sp", [False, True])
def test_layernorm_drops_the_two_norm_outputs(sp):
    """Korthikanti et al. 2022 Table 2's QKV and MLP inputs, 2·e·s·b·h (over tp with SP)."""
    tp, mb = 4, 2
    e = activation_bytes_per_element(JOB)
    base = layer_activations(LLAMA, JOB, mb, tp, sp)
    norms = layer_activations(LLAMA, NORMS, mb, tp, sp)
    want = 2 * e * JOB.seq_len * mb * LLAMA.hidden_size / (tp if sp else 1)
    assert base.stored("selective") - norms.stored("selective") == pytest.approx(want)
    for mode in ("none", "full"):                 # only "selective" reads the modules
        assert norms.stored(mode) == base.stored(mode)
    # without the core among them, the core's bytes stay
    only = layer_activations(LLAMA, ONLY_NORMS, mb, tp, sp)
    assert only.stored("selective") == pytest.approx(
        norms.stored("selective") + base.attention_core_bytes)


def test_layernorm_reruns_the_norms_and_core_attn_the_attention():
    link = table_inputs(LLAMA, H100, JOB, mp.Layout(tp=4)).links.tp
    kw = dict(micro_batch=1, tp=4, sequence_parallel=True, recompute="selective", tp_link=link)
    core = layer_cost(LLAMA, H100, JOB, **kw)
    both = layer_cost(LLAMA, H100, NORMS, **kw)
    norms = layer_cost(LLAMA, H100, ONLY_NORMS, **kw)
    e = activation_bytes_per_element(JOB)
    norm_fwd = hbm_s(H100.gpu, JOB.seq_len * LLAMA.hidden_size / 4 * e * 4, LLAMA.norm)
    assert both.recompute.total_s == pytest.approx(core.recompute.total_s + norm_fwd)
    assert norms.recompute.attention_s == 0 and norms.recompute.total_s == pytest.approx(norm_fwd)
    assert both.backward.total_s - core.backward.total_s == pytest.approx(norm_fwd)


def test_without_the_attention_core_no_recompute_flops():
    lay = mp.Layout(dp=2, pp=2, tp=4, sequence_parallel=True, recompute="selective")
    none = estimate(LLAMA, H100, JOB, replace(lay, recompute="none"))
    assert estimate(LLAMA, H100, ONLY_NORMS, lay).hardware_flops_per_step == \
        none.hardware_flops_per_step
    assert estimate(LLAMA, H100, JOB, lay).hardware_flops_per_step > \
        none.hardware_flops_per_step


def test_moe_act_drops_the_activation_output_and_reruns_the_activation():
    lay = mp.Layout(dp=8, tp=1, ep=8, micro_batch=1, recompute="selective")
    act = mp.Job(global_batch=32, seq_len=4096, recompute_modules=("moe_act",))
    tl = table_inputs(MIXTRAL, H100, act, lay).links
    routed = routed_mlp(MIXTRAL, H100, act, lay, tl, 1.0)
    e = activation_bytes_per_element(act)
    assert routed.act_out_bytes == pytest.approx(routed.rows * MIXTRAL.moe_ffn_hidden_size * e)
    shared = layer_parts(MIXTRAL, H100, act, 1, 1, False, "selective", tl.tp, tl.pp,
                         mlp_width=0)
    plain = with_routed_mlp(shared, routed, "selective")
    with_act = with_routed_mlp(shared, routed, "selective", ("moe_act",))
    assert plain.activation_bytes - with_act.activation_bytes == pytest.approx(
        routed.act_out_bytes)
    assert with_act.layer.backward.total_s - plain.layer.backward.total_s == pytest.approx(
        routed.act_s)
    assert with_act.full_act_bytes == plain.full_act_bytes     # the recompute working set
    # no moe_act: nothing moves; full recomputation is unaffected by the list
    assert with_routed_mlp(shared, routed, "full", ("moe_act",)).activation_bytes == \
        with_routed_mlp(shared, routed, "full").activation_bytes


def test_megatron_moe_recipe_needs_less_memory_end_to_end():
    lay = mp.Layout(dp=4, pp=1, tp=2, ep=8, sequence_parallel=True, recompute="selective",
                    zero=1)
    recipe = mp.Job(global_batch=32, seq_len=4096, recompute_modules=("layernorm", "moe_act"))
    a, b = estimate(MIXTRAL, H100, JOB, lay), estimate(MIXTRAL, H100, recipe, lay)
    assert b.memory_peak_bytes < a.memory_peak_bytes
    # it re-runs memory-bound work only: slower than no recompute, by little
    none = estimate(MIXTRAL, H100, recipe, replace(lay, recompute="none")).step_time_s
    assert none < b.step_time_s < 1.02 * none


@pytest.mark.parametrize("bad,words", [
    ("layernorm", "non-empty list"), ([], "non-empty list"), (["mlp"], "'mlp' is not valid"),
    (["layernorm", "layernorm"], "twice"),
])
def test_bad_modules_are_named(bad, words):
    with pytest.raises(mp.ConfigError, match=words):
        mp.Job(global_batch=8, seq_len=128, recompute_modules=bad)


def test_the_executor_runtime_recomputes_the_core_only():
    with pytest.raises(mp.ConfigError, match="runtime = 'megatron'"):
        mp.Job(global_batch=8, seq_len=128, runtime="torch", recompute_modules=["layernorm"])
    assert mp.Job(global_batch=8, seq_len=128, runtime="torch",
                  recompute_modules=["core_attn"]).selective_modules == ("core_attn",)


def test_round_trips_through_a_plan_file_dict():
    job = mp.Job(global_batch=8, seq_len=128, recompute_modules=["layernorm", "moe_act"])
    back = mp.Job.from_dict(json.loads(json.dumps(job.to_dict())))
    assert back == job and back.recompute_modules == ("layernorm", "moe_act")
    assert hash(back) == hash(job)


def test_cli_takes_the_modules_and_the_expert_and_context_degrees(capsys):
    from meshplan.cli import main
    argv = ["estimate", "--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--nodes", "2",
            "--global-batch", "32", "--seq-len", "4096", "--dp", "8", "--tp", "2", "--ep", "8",
            "--sequence-parallel", "--zero", "1", "--recompute", "selective"]
    assert main(argv) == 0
    default = capsys.readouterr().out
    assert "ep8" in default and "rc=selective" in default
    assert main([*argv, "--recompute-modules", "layernorm,moe_act"]) == 0
    assert "(selective re-runs layernorm+moe_act)" in capsys.readouterr().out
    assert main([*argv, "--recompute-modules", "layernorm,mlp"]) == 2
    assert "'mlp' is not valid" in capsys.readouterr().err
    assert main(["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--nodes", "2",
                 "--global-batch", "8", "--seq-len", "8192", "--dp", "2", "--tp", "2",
                 "--cp", "4", "--cp-style", "all-to-all", "--sequence-parallel"]) == 0
    assert "cp4" in capsys.readouterr().out


def test_the_executor_refuses_a_plan_whose_selective_recompute_it_cannot_run():
    pytest.importorskip("torch")
    from meshplan.errors import ExecutorError
    from meshplan.executor.parallelize import check_layout_runnable
    tiny = replace(LLAMA, num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2,
                   ffn_hidden_size=128, vocab_size=256, max_seq_len=64)
    megatron = mp.Job(global_batch=2, seq_len=64, recompute_modules=("layernorm", "moe_act"))
    with pytest.raises(ExecutorError, match=r"\['layernorm', 'moe_act'\].*attention core only"):
        check_layout_runnable(tiny, megatron, mp.Layout(recompute="selective"))
    # the modules only matter to selective recompute
    assert check_layout_runnable(tiny, megatron, mp.Layout(recompute="full")) == 2
    assert check_layout_runnable(tiny, mp.Job(global_batch=2, seq_len=64),
                                 mp.Layout(recompute="selective")) == 2


UP = mp.Job(global_batch=32, seq_len=4096, recompute_modules=("mla_up_proj",))


@pytest.mark.parametrize("tp", [1, 4])
def test_mla_up_proj_drops_q_k_v(tp):
    """MLA's up-projection outputs q, k (heads·(d_n + d_r) each) and v (heads·d_v) are not
    kept (Megatron-Core's CheckpointWithoutOutput around the up-projections and RoPE)."""
    e, mb = activation_bytes_per_element(UP), 1
    plain = layer_activations(DSV3, JOB, mb, tp, True)
    up = layer_activations(DSV3, UP, mb, tp, True)
    nh = DSV3.num_heads
    per_token = (2 * nh * (DSV3.qk_nope_head_dim + DSV3.qk_rope_head_dim)
                 + nh * DSV3.v_head_dim) / tp
    assert per_token == 2 * 128 * 192 / tp + 128 * 128 / tp
    want = e * UP.seq_len * mb * per_token
    # the attention core's bytes stay (core_attn is not among the modules)
    assert (plain.stored("selective") + plain.attention_core_bytes
            - up.stored("selective")) == pytest.approx(want)
    assert up.stored("none") == plain.stored("none")


def test_mla_up_proj_reruns_the_two_up_projections_and_rope():
    tp = 2
    link = table_inputs(DSV3, H100, UP, mp.Layout(tp=tp, ep=8, dp=8)).links.tp
    kw = dict(micro_batch=1, tp=tp, sequence_parallel=True, tp_link=link, mlp_width=0)
    up = layer_cost(DSV3, H100, UP, recompute="selective", **kw)
    none = layer_cost(DSV3, H100, UP, recompute="none", **kw)
    gpu, tokens = H100.gpu, UP.seq_len
    peak = gpu.peak_flops("bf16")
    (mq, kq, nq), (mkv, kkv, nkv) = mla.up_proj_shapes(DSV3, tokens, tp)
    assert (kq, nq) == (DSV3.q_lora_rank, 128 * 192 / tp)
    assert (kkv, nkv) == (DSV3.kv_lora_rank, 128 * (128 + 128) / tp)
    gemms = gemm_s(gpu, peak, 2.0 * mq * kq * nq) + gemm_s(gpu, peak, 2.0 * mkv * kkv * nkv)
    rope = hbm_s(gpu, tokens * mla.rope_elements(DSV3, tp) * 2)
    assert up.recompute.gemm_s == pytest.approx(gemms) and up.recompute.attention_s == 0
    assert up.recompute.total_s == pytest.approx(gemms + rope)
    assert up.backward.total_s - none.backward.total_s == pytest.approx(gemms + rope)


def test_mla_up_proj_in_fp8_reruns_its_gemms_in_fp8():
    from meshplan.costmodel.fp8_cost import fp8_layer
    b200 = mp.Cluster.preset("dgx-b200", nodes=1)
    fp8 = mp.Job(global_batch=32, seq_len=4096, precision="fp8", fp8_recipe="mxfp8",
                 recompute_modules=("mla_up_proj",))
    lay = mp.Layout(dp=8, ep=8, recompute="selective")
    link = table_inputs(DSV3, b200, fp8, lay).links.tp
    kw = dict(micro_batch=1, tp=1, sequence_parallel=False, tp_link=link, mlp_width=0)
    bf = layer_cost(DSV3, b200, fp8, recompute="selective", **kw)
    f = fp8_layer(DSV3, b200, fp8, micro_batch=1, tp=1, sequence_parallel=False,
                  recompute="selective", compile=False, fsdp=False)
    moved = f.apply(bf, "selective")
    assert 0 < f.gemm_ratio < 1
    assert moved.recompute.gemm_s == pytest.approx(bf.recompute.gemm_s * f.gemm_ratio)


def test_mla_up_proj_needs_latent_attention():
    lay = mp.Layout(dp=2, pp=2, tp=4, recompute="selective")
    with pytest.raises(mp.ConfigError, match="'mla_up_proj'.*no multi-head latent"):
        estimate(LLAMA, H100, UP, lay)


def test_deepseek_recipe_fits_where_plain_selective_does_not():
    """DeepSeek-V3 at Megatron-Bridge's B200 layout (pp 16, ep 8, the recipe's 4-layer
    chunks): mla_up_proj keeps ~29 GiB fewer activations on the first stage."""
    b200 = mp.Cluster.preset("dgx-b200", nodes=32)
    lay = mp.Layout(dp=16, pp=16, ep=8, recompute="selective", zero=1,
                    stage_layers=(4,) * 15 + (1,))
    core = mp.Job(global_batch=4096, seq_len=4096)
    a, b = estimate(DSV3, b200, core, lay), estimate(DSV3, b200, replace(
        core, recompute_modules=("mla_up_proj",)), lay)
    assert a.memory_peak_bytes - b.memory_peak_bytes > 20 * 2**30
    assert b.step_time_s > estimate(DSV3, b200, core, replace(lay, recompute="none")).step_time_s
