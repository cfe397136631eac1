"""Job.recompute_modules: what Layout.recompute = "selective" re-runs (Megatron-Core's
--recompute-modules core_attn / layernorm / moe_act) — memory dropped, time added, FLOPs."""

import json
from dataclasses import replace

import pytest

import meshplan as mp
from meshplan.costmodel import estimate
from meshplan.costmodel.compute import hbm_s, layer_cost
from meshplan.costmodel.memory import activation_bytes_per_element, layer_activations
from meshplan.costmodel.moe_layer import routed_mlp, with_routed_mlp
from meshplan.costmodel.parts import layer_parts
from meshplan.costmodel.inputs import table_inputs

LLAMA = mp.ModelSpec.preset("llama3-8b")
MIXTRAL = mp.ModelSpec.preset("mixtral-8x7b")
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
