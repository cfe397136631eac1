"""CP-SAT's optimum equals the exhaustive reference's on random small models and clusters,
and every returned layout satisfies the constraints and fits."""

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import meshplan as mp
from meshplan.spec.validate import check_layout
from meshplan.planner import Constraints


@st.composite
def cases(draw):
    heads = draw(st.sampled_from([2, 4, 8]))
    kv = draw(st.sampled_from([d for d in (1, 2, 4, 8) if heads % d == 0]))
    llama = draw(st.booleans())
    model = mp.ModelSpec(
        name="tiny", num_layers=draw(st.integers(2, 8)), hidden_size=heads * 32,
        num_heads=heads, num_kv_heads=kv if llama else heads,
        vocab_size=draw(st.sampled_from([512, 4096])), max_seq_len=512,
        activation="swiglu" if llama else "gelu", norm="rmsnorm" if llama else "layernorm",
        position_embedding="rope" if llama else "learned", tied_embeddings=not llama,
        bias=not llama)
    gpn = draw(st.sampled_from([2, 4]))
    base = mp.Cluster.preset(draw(st.sampled_from(["dgx-a100-80gb", "dgx-h100"])))
    # tiny GPUs so that memory binds: between 4 and 64 MiB
    gpu = dataclasses.replace(base.gpu, memory_bytes=draw(st.integers(4, 64)) * 2**20)
    cluster = base.replace(gpu=gpu, gpus_per_node=gpn, nodes=draw(st.sampled_from([1, 2])),
                           memory_reserve_bytes=0, memory_reserve_fraction=0.0)
    job = mp.Job(global_batch=draw(st.sampled_from([4, 8, 16])), seq_len=draw(
        st.sampled_from([64, 256])), overlap_dp_comm=draw(st.booleans()))
    cons = Constraints(
        schedules=tuple(draw(st.lists(st.sampled_from(
            ["gpipe", "1f1b", "interleaved-1f1b", "zero-bubble"]), min_size=1, max_size=2,
            unique=True))),
        recompute=tuple(draw(st.lists(st.sampled_from(["none", "selective", "full"]),
                                      min_size=1, max_size=2, unique=True))),
        zero=tuple(draw(st.lists(st.sampled_from([0, 1, 2, 3]), min_size=1, max_size=2,
                                 unique=True))),
        max_micro_batch=draw(st.sampled_from([1, 2, 4])),
        memory_headroom=draw(st.sampled_from([0.0, 0.1])),
        max_vpp=3)
    objective = draw(st.sampled_from(["throughput", "cost"]))
    gpus = draw(st.sampled_from([None, "range"]))
    gpus = range(1, cluster.num_gpus + 1) if gpus == "range" else None
    return model, cluster, job, cons, objective, gpus


def _value(c, objective):
    e = c.estimate
    return e.step_time_s * (e.num_gpus if objective == "cost" else 1)


@settings(max_examples=80, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_cpsat_matches_exhaustive(case):
    model, cluster, job, cons, objective, gpus = case
    try:
        ref = mp.plan(model, cluster, job, gpus=gpus, objective=objective, top_k=3,
                      constraints=cons, solver="exhaustive")
    except mp.NoFeasiblePlan:
        with pytest.raises(mp.NoFeasiblePlan):
            mp.plan(model, cluster, job, gpus=gpus, objective=objective, top_k=3,
                    constraints=cons)
        return
    got = mp.plan(model, cluster, job, gpus=gpus, objective=objective, top_k=3,
                  constraints=cons)
    assert _value(got.best, objective) == pytest.approx(_value(ref.best, objective), rel=1e-6)
    cap = cluster.usable_memory_bytes * (1 - cons.memory_headroom)
    values = [_value(c, objective) for c in got.candidates]
    assert values == sorted(values)
    for c in got.candidates:
        assert cons.allows(c.layout) is None
        assert c.estimate.memory_peak_bytes <= cap
        assert c.estimate.fits
        check_layout(model, cluster, job, c.layout)
        assert c.layout.num_gpus <= cluster.num_gpus
        if gpus is None:
            assert c.layout.num_gpus == cluster.num_gpus


@st.composite
def cp_cases(draw):
    """Small long-context cases: context parallelism (both styles) searched jointly with
    dp, pp and tp; tiny GPUs so that memory binds and cp is needed to fit."""
    model, cluster, job, cons, objective, gpus = draw(cases())
    gpu = dataclasses.replace(cluster.gpu, memory_bytes=draw(st.integers(16, 256)) * 2**20)
    cluster = cluster.replace(gpu=gpu)
    job = dataclasses.replace(job, seq_len=draw(st.sampled_from([512, 2048])))
    model = dataclasses.replace(model, max_seq_len=2048)
    cons = dataclasses.replace(cons, cp=tuple(draw(st.lists(st.sampled_from([1, 2, 4]),
                                                            min_size=1, max_size=3,
                                                            unique=True))),
                               cp_styles=tuple(draw(st.lists(st.sampled_from(
                                   ["ring", "all-to-all"]), min_size=1, max_size=2,
                                   unique=True))))
    return model, cluster, job, cons, objective, gpus


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(cp_cases())
def test_cpsat_matches_exhaustive_with_context_parallelism(case):
    test_cpsat_matches_exhaustive.hypothesis.inner_test(case)


@st.composite
def moe_cases(draw):
    """Small MoE models (every layer an MoE layer: the partition model prices one layer
    kind) with ep and etp searched jointly with dp, pp and tp."""
    model, cluster, job, cons, objective, gpus = draw(cases())
    experts = draw(st.sampled_from([2, 4, 8]))
    model = dataclasses.replace(
        model, num_experts=experts, experts_per_token=draw(st.integers(1, 2)),
        moe_ffn_hidden_size=model.hidden_size * 2,
        num_shared_experts=draw(st.sampled_from([0, 1])))
    gpu = dataclasses.replace(cluster.gpu, memory_bytes=draw(st.integers(8, 128)) * 2**20)
    return model, cluster.replace(gpu=gpu), job, cons, objective, gpus


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(moe_cases())
def test_cpsat_matches_exhaustive_with_experts(case):
    test_cpsat_matches_exhaustive.hypothesis.inner_test(case)
