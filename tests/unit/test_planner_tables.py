"""The planner's per-configuration tables reproduce estimate() on arbitrary stage partitions."""

import random

import pytest

import meshplan as mp
from meshplan.costmodel import estimate
from meshplan.planner.constraints import Constraints
from meshplan.planner.search import partition_candidates
from meshplan.planner.space import enumerate_configs
from meshplan.planner.tables import build_tables


def _random_partition(rng, layers, stages):
    cuts = sorted(rng.sample(range(1, layers), stages - 1))
    return [b - a for a, b in zip([0, *cuts], [*cuts, layers])]


CASES = [
    ("gpt-1.7b", "dgx-a100-80gb", 4, 64, 2048, {}),
    ("llama3-8b", "dgx-h100", 2, 32, 4096, {"overlap_dp_comm": False}),
    ("gpt-7.5b", "dgx-a100-40gb", 2, 64, 2048, {"flash_attention": False}),
]


@pytest.mark.parametrize("name,cluster_name,nodes,batch,seq,jobkw", CASES)
def test_tables_match_estimate(name, cluster_name, nodes, batch, seq, jobkw):
    rng = random.Random(7)
    model = mp.ModelSpec.preset(name)
    cluster = mp.Cluster.preset(cluster_name, nodes=nodes)
    job = mp.Job(global_batch=batch, seq_len=seq, **jobkw)
    configs = list(enumerate_configs(model, cluster, job, [cluster.num_gpus], Constraints()))
    assert len(configs) > 100
    checked = 0
    for cfg in rng.sample(configs, 60):
        t = build_tables(model, cluster, job, cfg)
        cands = partition_candidates(cfg, model.num_layers, None)
        for i in range(2):
            # a random partition where every stage can hold a layer, else the planner's own
            # candidates (interleaved ends may hold none)
            parts = (_random_partition(rng, model.num_layers, cfg.stages)
                     if cfg.stages <= model.num_layers else list(cands[i % len(cands)]))
            est = estimate(model, cluster, job, cfg.layout(parts))
            assert t.step_time_s(parts) == pytest.approx(est.step_time_s, rel=1e-9)
            for r, n in enumerate(t.rank_layers(parts)):
                assert t.rank_memory_bytes(r, n) == pytest.approx(est.memory[r].total_bytes,
                                                                  rel=1e-9)
            assert t.peak_memory_bytes(parts) == pytest.approx(est.memory_peak_bytes, rel=1e-9)
            checked += 1
    assert checked == 120
