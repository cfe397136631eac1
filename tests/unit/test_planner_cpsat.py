"""The CP-SAT model's pipeline expression equals the cost model's closed form on fixed
partitions, and the search's lower bounds never exceed a partition's true step time."""

import random

import pytest

import meshplan as mp
from meshplan.planner.constraints import Constraints
from meshplan.planner.search import busy_lower_bound, time_lower_bound
from meshplan.planner.space import enumerate_configs
from meshplan.planner.tables import build_tables

CASES = [
    ("gpt-1.7b", "dgx-a100-80gb", 4, 64, 2048),
    ("llama3-8b", "dgx-h100", 2, 32, 4096),
]


def _random_partition(rng, layers, stages):
    cuts = sorted(rng.sample(range(1, layers), stages - 1))
    return [b - a for a, b in zip([0, *cuts], [*cuts, layers])]


def _zero_end_partition(rng, layers, stages):
    """A random partition whose first or last stage (or both) holds no layer (more than
    two stages: the solver's free partitions may, constraints.end_stage_min_layers)."""
    inner = _random_partition(rng, layers, stages - 1)
    return [0, *inner] if rng.random() < 0.5 else [*inner, 0]


@pytest.mark.parametrize("name,cluster_name,nodes,batch,seq", CASES)
def test_pipeline_expression_matches_cost_model(name, cluster_name, nodes, batch, seq,
                                                 solve_fixed_partition):
    rng = random.Random(3)
    model = mp.ModelSpec.preset(name)
    cluster = mp.Cluster.preset(cluster_name, nodes=nodes)
    job = mp.Job(global_batch=batch, seq_len=seq)
    cons = Constraints(schedules=("gpipe", "1f1b"), zero=(0, 3), recompute=("none", "full"))
    configs = [c for c in enumerate_configs(model, cluster, job, [cluster.num_gpus], cons)
               if c.pp > 1]
    assert {c.schedule for c in configs} == {"gpipe", "1f1b"}
    for cfg in rng.sample(configs, 25):
        t = build_tables(model, cluster, job, cfg)
        parts = [_random_partition(rng, model.num_layers, cfg.stages),
                 _random_partition(rng, model.num_layers, cfg.stages)]
        if cfg.stages > 2:
            parts.append(_zero_end_partition(rng, model.num_layers, cfg.stages))
        for part in parts:
            assert solve_fixed_partition(t, part) == pytest.approx(t.pipeline_s(part), rel=1e-7), \
                (cfg, part)


@pytest.mark.parametrize("name,cluster_name,nodes,batch,seq", CASES)
def test_lower_bound_below_every_partition(name, cluster_name, nodes, batch, seq):
    rng = random.Random(5)
    model = mp.ModelSpec.preset(name)
    cluster = mp.Cluster.preset(cluster_name, nodes=nodes)
    job = mp.Job(global_batch=batch, seq_len=seq)
    configs = list(enumerate_configs(model, cluster, job, [cluster.num_gpus], Constraints()))
    from meshplan.planner.search import partition_candidates
    for cfg in rng.sample(configs, 150):
        t = build_tables(model, cluster, job, cfg)
        lb = max(time_lower_bound(model, cluster, job, cfg, 1),
                 busy_lower_bound(model, cluster, job, cfg))
        cands = partition_candidates(cfg, model.num_layers, None)
        parts = list(cands) if cands else [_random_partition(rng, model.num_layers, cfg.stages)
                                           for _ in range(5)] + [
            tuple(model.num_layers // cfg.stages + (i < model.num_layers % cfg.stages)
                  for i in range(cfg.stages))] + (
            [_zero_end_partition(rng, model.num_layers, cfg.stages) for _ in range(3)]
            if cfg.stages > 2 else [])
        for part in parts:
            assert lb <= t.step_time_s(part) * (1 + 1e-12), (cfg, part)
