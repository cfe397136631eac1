"""The planner searches context parallelism jointly with dp, pp and tp."""

from dataclasses import replace

import pytest

import meshplan as mp
from meshplan.planner import Constraints
from meshplan.planner.space import cp_options, enumerate_configs

# Llama 3.1's 128k context (RoPE-scaled): LONG is within the models' maximum
LLAMA = replace(mp.ModelSpec.preset("llama3-8b"), max_seq_len=131072)
CLUSTER = mp.Cluster.preset("dgx-h100", nodes=2)
LONG = mp.Job(global_batch=8, seq_len=131072)
FAST = Constraints(schedules=("1f1b",), recompute=("none", "selective"), zero=(1, 3),
                   max_micro_batch=1)


def test_cp_options_automatic_from_16k_tokens():
    assert cp_options(mp.Job(global_batch=8, seq_len=8192), Constraints()) == [1]
    assert cp_options(LONG, Constraints())[:4] == [1, 2, 4, 8]
    assert cp_options(mp.Job(global_batch=8, seq_len=8192), Constraints(cp=(1, 2, 3))) == [1, 2]
    assert cp_options(LONG, Constraints(fixed={"cp": 4})) == [4]
    short = list(enumerate_configs(LLAMA, CLUSTER, mp.Job(global_batch=16, seq_len=4096),
                                   [16], Constraints()))
    assert short and all(c.cp == 1 for c in short)


def test_all_to_all_only_where_heads_divide():
    cfgs = list(enumerate_configs(LLAMA, CLUSTER, LONG, [16], FAST))
    a2a = {(c.tp, c.cp) for c in cfgs if c.cp_style == "all-to-all"}
    assert a2a and all(8 % (tp * cp) == 0 for tp, cp in a2a)     # 8 kv heads
    assert any(c.cp_style == "ring" and c.tp * c.cp == 16 for c in cfgs)


def test_long_context_plan_uses_cp_and_shows_it():
    p = mp.plan(LLAMA, CLUSTER, LONG, top_k=3, constraints=FAST)
    assert p.best.layout.cp > 1 and p.best.estimate.fits
    assert "cp" in p.best.layout.short() and "cp" in p.summary()
    assert list(p.table["cp"]) == [c.layout.cp for c in p.candidates]
    assert p.best.layout.num_gpus == CLUSTER.num_gpus


def test_no_plan_without_cp_names_cp():
    with pytest.raises(mp.NoFeasiblePlan, match=r"context parallelism \(cp up to 16"):
        mp.plan(replace(mp.ModelSpec.preset("llama3-70b"), max_seq_len=131072), CLUSTER, LONG,
                top_k=1,
                constraints=Constraints(cp=(1,), recompute=("none",), max_micro_batch=1,
                                        schedules=("1f1b",)))


def test_constraints_check_cp_values():
    with pytest.raises(mp.ConfigError, match="Constraints.cp"):
        Constraints(cp=(0,))
    with pytest.raises(mp.ConfigError, match="cp_styles"):
        Constraints(cp_styles=("ulysses",))
    with pytest.raises(mp.ConfigError, match="contradictory"):
        Constraints(cp=(1, 2), fixed={"cp": 4})
    assert Constraints(fixed={"ep": 8}).fixed["ep"] == 8
    assert Constraints(cp=(1, 4)).allows(mp.Layout(cp=2)) == "cp 2 not in [1, 4]"


def _dense_mla():
    return replace(mp.ModelSpec.preset("deepseek-v3"), max_seq_len=131072, num_experts=0,
                   experts_per_token=0, moe_ffn_hidden_size=None, num_shared_experts=0,
                   shared_expert_ffn_hidden_size=None, dense_layers=(), mtp_layers=0)


@pytest.mark.parametrize("runtime", ["torch", "megatron"])
def test_mla_models_search_cp_under_either_runtime(runtime):
    """The executor runs multi-head latent attention with cp > 1 (since 2026-12-01), so
    runtime "torch" plans search cp as Megatron's do."""
    dense_mla = _dense_mla()
    assert dense_mla.is_mla and not dense_mla.is_moe
    job = replace(LONG, runtime=runtime)
    assert cp_options(job, Constraints())[:4] == [1, 2, 4, 8]
    plan = mp.plan(dense_mla, mp.Cluster.preset("dgx-h100", nodes=2), job,
                   constraints=Constraints(cp=(2, 4), schedules=("1f1b",)))
    assert plan.best.layout.cp in (2, 4)


def test_moe_models_with_a_capacity_run_cp_except_at_an_odd_tp():
    """The executor runs MoE layers with cp > 1, dropless or with a capacity (each rank
    counts the copies of every earlier piece of the sequence); with a capacity an odd tp > 1
    would cut a cp chunk, which it refuses, and so the planner leaves that out under runtime
    "torch"."""
    from meshplan.planner.space import cp_runs, enumerate_configs
    moe = replace(mp.ModelSpec.preset("mixtral-8x7b"), max_seq_len=131072)
    capped = replace(moe, capacity_factor=1.25)
    job = replace(LONG, runtime="torch")
    assert cp_runs(moe, job, 3) and cp_runs(capped, job, 2) and cp_runs(capped, job, 1)
    assert not cp_runs(capped, job, 3) and cp_runs(capped, replace(job, runtime="megatron"), 3)
    tiny = replace(capped, num_heads=6, num_kv_heads=6, hidden_size=384, ffn_hidden_size=768,
                   moe_ffn_hidden_size=768, num_layers=6, vocab_size=1024)
    cluster = mp.Cluster.preset("dgx-h100", nodes=1, gpus_per_node=6)
    six = replace(job, global_batch=12)      # dp 3 divides it: tp 1 · cp 2 and tp 2 · cp 1
    seen = {(c.tp, c.cp) for c in enumerate_configs(tiny, cluster, six, [6], Constraints())}
    assert (3, 2) not in seen and {(1, 2), (2, 1), (3, 1)} <= seen
    megatron = replace(six, runtime="megatron")
    assert (3, 2) in {(c.tp, c.cp) for c in enumerate_configs(tiny, cluster, megatron, [6],
                                                              Constraints())}


def test_constraints_cp_the_sequence_cannot_take_are_named():
    """A cp option the sequence cannot be cut into is named, for every model and runtime."""
    from meshplan.planner.space import check_options
    odd = replace(LONG, seq_len=4100)
    for runtime in ("torch", "megatron"):
        with pytest.raises(mp.ConfigError, match="not divisible by 2·cp"):
            check_options(_dense_mla(), replace(odd, runtime=runtime), Constraints(cp=(4,)))
