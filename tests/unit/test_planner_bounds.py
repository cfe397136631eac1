"""Table-free bounds reject impossible problems before any table is built, and never reject a
layout the cost model would fit."""

import math
import random
import time

import pytest

import meshplan as mp
from meshplan.errors import NoFeasiblePlan
from meshplan.planner import bounds
from meshplan.planner.constraints import Constraints
from meshplan.planner.search import partition_candidates
from meshplan.planner.space import enumerate_configs
from meshplan.planner.tables import build_tables


def _random_partition(rng, layers, stages):
    cuts = sorted(rng.sample(range(1, layers), stages - 1)) if stages > 1 else []
    return [b - a for a, b in zip([0, *cuts], [*cuts, layers])]


@pytest.mark.parametrize("runtime", ["megatron", "torch"])
@pytest.mark.parametrize("name", ["gpt-1.7b", "llama3-8b"])
def test_bounds_never_exceed_the_cost_models_peak(name, runtime):
    rng = random.Random(3)
    model = mp.ModelSpec.preset(name)
    cluster = mp.Cluster.preset("dgx-h100", nodes=2)
    job = mp.Job(global_batch=32, seq_len=2048, runtime=runtime)
    configs = list(enumerate_configs(model, cluster, job, [8, 16], Constraints()))
    floor = bounds.state_bytes_total(model, job) / 16
    picked = rng.sample(configs, 40)
    assert {c.zero for c in picked} == {0, 1, 2, 3} and {c.pp for c in picked} > {1, 2}
    for cfg in picked:
        t = build_tables(model, cluster, job, cfg)
        lb = bounds.config_memory_lower_bound(model, job, cfg)
        # random partitions where every stage can hold a layer, and the planner's own
        # candidates (interleaved ends may hold none)
        parts = [_random_partition(rng, model.num_layers, cfg.stages)
                 for _ in range(3 if cfg.stages <= model.num_layers else 0)]
        for part in parts + list(partition_candidates(cfg, model.num_layers, None) or ()):
            peak = t.peak_memory_bytes(part)
            assert lb <= peak, (cfg, part)
            assert floor <= peak * cfg.num_gpus / 16, (cfg, part)


def _no_tables(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a cost table was built")
    monkeypatch.setattr("meshplan.planner.search.build_tables", refuse)
    monkeypatch.setattr("meshplan.planner.search._pass_times", refuse)
    monkeypatch.setattr("meshplan.planner.diagnose.build_tables", refuse)


def test_a_1e16_parameter_model_is_rejected_before_any_table(monkeypatch):
    _no_tables(monkeypatch)
    model = mp.ModelSpec(name="huge", num_layers=2000, hidden_size=655360, num_heads=512,
                         vocab_size=50000)
    assert model.num_params() > 1e16
    cluster = mp.Cluster.preset("dgx-h100", nodes=32)
    t0 = time.perf_counter()
    with pytest.raises(NoFeasiblePlan) as err:
        mp.plan(model, cluster, mp.Job(global_batch=1024, seq_len=2048))
    print(f"rejected in {time.perf_counter() - t0:.3f} s")
    e, msg = err.value, str(err.value)
    assert e.binding == "memory" and e.min_memory_bytes > e.usable_memory_bytes
    assert "256 GPU(s)" in msg and "16 bytes per parameter" in msg and "PiB" in msg
    assert "per GPU even with ZeRO-3" in msg and "74.7 GiB is usable" in msg
    need = math.ceil(bounds.state_bytes_total(model, mp.Job(global_batch=1, seq_len=1))
                     / e.usable_memory_bytes)
    assert f"at least {need:,} GPUs" in msg
    assert "days" in msg or "years" in msg


def test_a_hf_config_of_1_2e15_parameters_is_rejected_before_any_table(monkeypatch):
    _no_tables(monkeypatch)
    cfg = {"model_type": "llama", "num_hidden_layers": 800, "hidden_size": 327680,
           "num_attention_heads": 2560, "num_key_value_heads": 256,
           "intermediate_size": 4 * 327680, "vocab_size": 128256,
           "max_position_embeddings": 8192}
    model = mp.ModelSpec.from_hf_config(cfg, name="big-hf")
    assert 1.1e15 < model.num_params() < 1.4e15
    with pytest.raises(NoFeasiblePlan) as err:
        mp.plan(model, mp.Cluster.preset("dgx-h100", nodes=32),
                mp.Job(global_batch=1024, seq_len=8192), solver="exhaustive")
    assert "on 256 GPU(s) of 'dgx-h100' fits in memory" in str(err.value)


def test_every_configuration_over_memory_by_states_alone(monkeypatch):
    """The model fits four GPUs fully sharded, but ZeRO-3 is not allowed and no layout
    without it keeps the embedding's states (8 MiB, and 1 MiB of positions) within 7.7 MiB,
    not even on a first stage of the embedding alone."""
    _no_tables(monkeypatch)
    model = mp.ModelSpec(name="tiny", num_layers=6, hidden_size=128, num_heads=4,
                         vocab_size=4096, max_seq_len=512)
    c = mp.Cluster.preset("dgx-a100-80gb").replace(nodes=1, gpus_per_node=4)
    import dataclasses
    c = c.replace(gpu=dataclasses.replace(c.gpu, memory_bytes=int(8.5 * 2**20)),
                  memory_reserve_bytes=0, memory_reserve_fraction=0.0)
    cons = Constraints(zero=(0,), max_tp=1, memory_headroom=0.1)
    with pytest.raises(NoFeasiblePlan) as err:
        mp.plan(model, c, mp.Job(global_batch=16, seq_len=256), constraints=cons)
    e, msg = err.value, str(err.value)
    assert "some GPU holds more weights, gradients and optimizer state" in msg
    assert "7.7 MiB is usable" in msg and e.min_memory_bytes > e.usable_memory_bytes
    assert any(s.startswith("allow ZeRO stage 3") and "may fit" in s for s in e.suggestions)
    # rank 0 keeps the whole embedding whatever the GPU count: more GPUs do not help
    assert "more GPUs: no whole-node count up to 256 GPUs holds the model states" in msg


def test_progress_moves_through_every_phase(monkeypatch):
    monkeypatch.setattr(bounds, "PROGRESS_EVERY_S", 0.0)
    seen = []
    mp.plan(mp.ModelSpec.preset("gpt-1.7b"), mp.Cluster.preset("dgx-a100-80gb", nodes=2),
            mp.Job(global_batch=64, seq_len=2048), top_k=2, progress=seen.append)
    timed = [s for s in seen if s.startswith("bounding: time bounds of")]
    priced = [s for s in seen if s.startswith("bounding:") and "priced" in s]
    assert len(timed) > 1000 and len(priced) > 1
    for phase in (timed, priced):
        counts = [int(s.split("/")[0].split()[-1].replace(",", "")) for s in phase]
        assert counts == sorted(counts) and counts[-1] > counts[0]
    assert any(s.startswith("CP-SAT") for s in seen)


def test_progress_moves_while_diagnosing(monkeypatch):
    monkeypatch.setattr(bounds, "PROGRESS_EVERY_S", 0.0)
    import dataclasses
    c = mp.Cluster.preset("dgx-a100-80gb").replace(nodes=1, gpus_per_node=2)
    c = c.replace(gpu=dataclasses.replace(c.gpu, memory_bytes=16 * 2**20),
                  memory_reserve_bytes=0, memory_reserve_fraction=0.0)
    model = mp.ModelSpec(name="tiny", num_layers=6, hidden_size=128, num_heads=4,
                         vocab_size=4096, max_seq_len=512)
    seen = []
    with pytest.raises(NoFeasiblePlan):
        mp.plan(model, c, mp.Job(global_batch=16, seq_len=256), progress=seen.append,
                constraints=Constraints(recompute=("none",), zero=(0,), max_micro_batch=4,
                                        memory_headroom=0.1))
    diag = [s for s in seen if s.startswith("diagnosing")]
    assert len(diag) > 5 and any("trying 4 GPUs" in s for s in diag)
