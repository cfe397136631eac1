"""Every configuration the planner enumerates is a layout the cost model accepts.

The planner prices configurations through tables built with ``checked=True`` (validation
skipped for speed), so a layout ``check_layout`` refuses must never enter its space: it
would be priced by rules that do not hold for it (a sliding-window model's ring context
parallelism was, as full causal attention, until 2026-11-29)."""

import random

import pytest

import meshplan as mp
from meshplan.planner import Constraints
from meshplan.planner.search import partition_candidates
from meshplan.planner.space import enumerate_configs
from meshplan.spec.validate import check_layout

CASES = [
    ("gpt-oss-120b", "dgx-h100", 8, mp.Job(global_batch=64, seq_len=32768)),   # windows + cp
    ("mixtral-8x7b", "dgx-h100", 8, mp.Job(global_batch=256, seq_len=4096)),
    ("deepseek-v3", "dgx-h100", 32, mp.Job(global_batch=1024, seq_len=4096)),  # MLA, MTP
    ("mixtral-8x7b", "dgx-h100", 2, mp.Job(global_batch=64, seq_len=8192, runtime="torch")),
    ("llama3-8b", "dgx-h100", 2, mp.Job(global_batch=64, seq_len=8192, precision="fp8")),
    ("llama3-8b", "dgx-h100", 2, mp.Job(global_batch=64, seq_len=8192, runtime="torch")),
]


@pytest.mark.parametrize("name,cluster,nodes,job", CASES, ids=lambda x: getattr(x, "runtime", x))
def test_the_planner_space_holds_only_valid_layouts(name, cluster, nodes, job):
    model = mp.ModelSpec.preset(name)
    cl = mp.Cluster.preset(cluster, nodes=nodes)
    configs = list(enumerate_configs(model, cl, job, [nodes * cl.gpus_per_node], Constraints()))
    assert configs
    for cfg in random.Random(0).sample(configs, min(400, len(configs))):
        for part in partition_candidates(cfg, model.num_layers, None) or (None,):
            check_layout(model, cl, job, cfg.layout(part))
