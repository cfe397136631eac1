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


@pytest.mark.parametrize("runtime,want_cp", [("torch", [1]), ("megatron", [1, 2, 4, 8])])
def test_mla_models_search_cp_only_where_the_runtime_runs_it(runtime, want_cp):
    """The executor refuses cp > 1 for multi-head latent attention (executor/mla.py), so
    runtime "torch" plans keep cp = 1; Megatron's runs search it."""
    mla = replace(mp.ModelSpec.preset("deepseek-v3"), max_seq_len=131072)
    dense_mla = replace(mla, num_experts=0, experts_per_token=0, moe_ffn_hidden_size=None,
                        num_shared_experts=0, shared_expert_ffn_hidden_size=None,
                        dense_layers=(), mtp_layers=0)
    assert dense_mla.is_mla and not dense_mla.is_moe
    job = replace(LONG, runtime=runtime)
    assert cp_options(job, Constraints(), dense_mla)[:len(want_cp)] == want_cp


def test_dropless_moe_models_search_cp_under_the_executor_capacity_ones_do_not():
    """The executor runs a dropless MoE model with cp > 1 (each cp rank routes its chunks,
    the balance loss adds the counts up over cp), not one with a capacity: which copies an
    expert drops depends on their positions across the chunks."""
    from meshplan.planner.space import cp_runs
    moe = replace(mp.ModelSpec.preset("mixtral-8x7b"), max_seq_len=131072)
    assert moe.is_moe and moe.capacity_factor is None
    job = replace(LONG, runtime="torch")
    assert cp_runs(moe, job) and len(cp_options(job, Constraints(), moe)) > 1
    capped = replace(moe, capacity_factor=1.25)
    assert not cp_runs(capped, job) and cp_options(job, Constraints(), capped) == [1]
    assert cp_runs(capped, replace(job, runtime="megatron"))


def test_cp_options_no_runtime_runs_are_not_refused_for_the_sequence():
    """Under runtime "torch" an MLA model (or an MoE one with a capacity) plans at cp = 1
    whatever the cp options say, so options the sequence cannot take are no error there
    (check_options and cp_options read the same rule, space.cp_runs); elsewhere they are
    named."""
    from meshplan.planner.space import check_options
    mla = replace(mp.ModelSpec.preset("deepseek-v3"), num_experts=0, experts_per_token=0,
                  moe_ffn_hidden_size=None, num_shared_experts=0,
                  shared_expert_ffn_hidden_size=None, dense_layers=(), mtp_layers=0)
    odd = replace(LONG, seq_len=4100)
    check_options(mla, replace(odd, runtime="torch"), Constraints(cp=(4,)))
    assert cp_options(replace(odd, runtime="torch"), Constraints(cp=(4,)), mla) == [1]
    with pytest.raises(mp.ConfigError, match="not divisible by 2·cp"):
        check_options(mla, odd, Constraints(cp=(4,)))
