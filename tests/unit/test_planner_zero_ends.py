"""Free (gpipe / 1F1B) partitions may give the first or last stage one layer fewer than the
others — none at the minimum of 1: a stage of only the embedding or only the loss, Megatron's
account-for-embedding/loss split. The solver and the exhaustive search both search it."""

import pytest

import meshplan as mp
from meshplan.planner.constraints import Constraints
from meshplan.planner.constraints import end_stage_min_layers
from meshplan.planner.exhaustive import compositions, count_compositions
from meshplan.planner.space import Config

# a 256k vocabulary on 6 narrow layers: the output layer costs more than a stage of layers
MODEL = mp.ModelSpec(name="bigvocab", num_layers=6, hidden_size=512, num_heads=8,
                     vocab_size=256000, max_seq_len=2048, tied_embeddings=False)
CLUSTER = mp.Cluster.preset("dgx-h100", nodes=1, gpus_per_node=4)
JOB = mp.Job(global_batch=64, seq_len=2048)
FIXED = {"pp": 4, "tp": 1, "dp": 1, "schedule": "1f1b", "micro_batch": 1,
         "recompute": "none", "zero": 0}


def test_the_ends_may_hold_one_layer_fewer_with_more_than_two_stages():
    cfg = Config(dp=1, pp=4, tp=1, micro_batch=1, schedule="1f1b", vpp=1, recompute="none",
                 zero=0, sequence_parallel=False)
    assert end_stage_min_layers(cfg.stages, 1) == 0 and end_stage_min_layers(cfg.stages, 2) == 1
    assert end_stage_min_layers(cfg._replace(pp=2).stages, 1) == 1   # two stages: as many
    parts = list(compositions(6, 4, 1, 0))
    assert (0, 3, 3, 0) in parts and (1, 0, 4, 1) not in parts
    assert len(parts) == count_compositions(6, 4, 1, 0) == len(set(parts))


@pytest.mark.parametrize("solver", ["cp-sat", "exhaustive"])
def test_a_heavy_loss_gets_a_stage_of_its_own(solver):
    p = mp.plan(MODEL, CLUSTER, JOB, constraints=Constraints(fixed=FIXED), top_k=1,
                solver=solver)
    sl = p.best.layout.stage_layers
    assert sl[-1] == 0 and sum(sl) == 6
    if solver == "cp-sat":   # of the tied partitions (0/1/5/0 ...), the most even
        assert sl == (0, 3, 3, 0)
    # strictly faster than every partition that keeps a layer on both ends
    best_with_layers = min(
        mp.estimate(MODEL, CLUSTER, JOB, mp.Layout(pp=4, micro_batch=1, schedule="1f1b",
                                                   stage_layers=part)).step_time_s
        for part in compositions(6, 4, 1))
    assert p.best.estimate.step_time_s < best_with_layers * (1 - 1e-3)


def test_a_minimum_of_two_keeps_a_layer_on_the_ends():
    from dataclasses import replace
    eight = replace(MODEL, num_layers=8)          # the space needs pp · minimum <= layers
    for solver in ("cp-sat", "exhaustive"):
        p = mp.plan(eight, CLUSTER, JOB, top_k=1, solver=solver,
                    constraints=Constraints(fixed=FIXED, min_layers_per_stage=2))
        sl = p.best.layout.stage_layers
        assert min(sl[0], sl[-1]) == 1 and min(sl[1:-1]) >= 2 and sum(sl) == 8
