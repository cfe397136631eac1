"""Interleaved 1F1B partitions the planner prices: the even split and Megatron's
account-for-embedding/loss split (search.partition_candidates)."""

from dataclasses import replace

import pytest

import meshplan as mp
from meshplan.costmodel.pipeline import simulate
from meshplan.planner import Constraints
from meshplan.planner.search import partition_candidates
from meshplan.planner.space import Config
from meshplan.spec import embedding_loss_stage_layers

H100 = mp.Cluster.preset("dgx-h100", nodes=2)


def _cfg(pp, vpp, schedule="interleaved-1f1b"):
    return Config(dp=1, pp=pp, tp=1, micro_batch=1, schedule=schedule, vpp=vpp,
                  recompute="none", zero=0, sequence_parallel=False)


def test_megatrons_split_by_hand():
    assert embedding_loss_stage_layers(94, 32) == (2,) + (3,) * 30 + (2,)
    assert embedding_loss_stage_layers(94, 96) == (0,) + (1,) * 94 + (0,)
    assert embedding_loss_stage_layers(32, 16) == (1, 3, 3) + (2,) * 12 + (1,)
    assert embedding_loss_stage_layers(5, 2) is None          # fewer than three chunks
    assert embedding_loss_stage_layers(10, 13) is None        # a middle chunk would be empty


def test_candidates_per_schedule():
    assert partition_candidates(_cfg(4, 4), 32, None) == ((2,) * 16,)
    # 34 units do not divide 16 chunks: no account-for split (its middles would be uneven)
    assert partition_candidates(_cfg(4, 5), 32, None) is None
    # Llama 3 405B: 126 layers, 128 chunks (the report's pp 16, one layer fewer at the ends)
    assert partition_candidates(_cfg(16, 8), 126, None) == ((0,) + (1,) * 126 + (0,),)
    # 94 layers do not divide 32 chunks: only the account-for split (the Model Zoo's layout)
    assert partition_candidates(_cfg(8, 4), 94, None) == (embedding_loss_stage_layers(94, 32),)
    assert partition_candidates(_cfg(32, 3), 94, None) == (embedding_loss_stage_layers(94, 96),)
    # with two layers a stage at least, ends may hold one
    assert partition_candidates(_cfg(32, 3), 94, None, min_layers=2) is None
    assert partition_candidates(_cfg(4, 1, "1f1b"), 32, None) is None          # CP-SAT's
    assert partition_candidates(_cfg(4, 1, "zero-bubble"), 30, None) == ((7, 8, 8, 7),)
    assert partition_candidates(_cfg(4, 4), 32, (8, 8, 8, 8)) == ((8, 8, 8, 8),)


@pytest.mark.parametrize("name,cluster,nodes,batch,seq,kw", [
    ("llama3-405b", "dgx-h100", 2048, 2048, 8192, dict(dp=128, pp=16, tp=8, vpp=8)),
    ("qwen3-235b-a22b", "dgx-h100", 32, 2048, 4096, dict(dp=16, pp=8, tp=2, ep=32, vpp=4)),
    ("gpt3-175b", "dgx-a100-80gb", 14, 1568, 2048, dict(dp=2, pp=7, tp=8, vpp=7)),
])
def test_closed_form_and_simulation_agree_on_the_account_for_split(name, cluster, nodes, batch,
                                                                   seq, kw):
    """The interleaved closed form is exact for uniform chunks and can be far off for others
    (space.py); the account-for split keeps its middle chunks uniform, and the two agree."""
    model = mp.ModelSpec.preset(name)
    lay = mp.Layout(micro_batch=1, schedule="interleaved-1f1b", sequence_parallel=True,
                    zero=1, **kw)
    split = embedding_loss_stage_layers(model.num_layers, lay.pp * lay.vpp)
    assert (model.num_layers + 2) % (lay.pp * lay.vpp) == 0
    e = mp.estimate(model, mp.Cluster.preset(cluster, nodes=nodes),
                    mp.Job(global_batch=batch, seq_len=seq), replace(lay, stage_layers=split))
    sim = simulate(lay.schedule, e.stage_forward_s, e.stage_backward_s, e.num_microbatches,
                   pp=lay.pp, vpp=lay.vpp, wgrad_s=e.stage_wgrad_s, p2p_s=e.p2p_s)
    assert e.pipeline_s == pytest.approx(sim.step_time_s, rel=0.012)


def test_llama3_405b_gets_the_reports_interleaved_layout():
    """126 layers over pp 16 · vpp 8 (the Llama 3 report: one layer fewer on the first and last
    stage) was outside the planner's space, which required equal chunks."""
    model, job = mp.ModelSpec.preset("llama3-405b"), mp.Job(global_batch=2048, seq_len=8192)
    cluster = mp.Cluster.preset("dgx-h100", nodes=2048)
    best = mp.plan(model, cluster, job, top_k=1, constraints=Constraints(
        fixed={"pp": 16, "vpp": 8, "tp": 8, "schedule": "interleaved-1f1b"})).best
    assert best.layout.stage_layers == (0,) + (1,) * 126 + (0,)


def test_a_94_layer_model_gets_its_interleaved_layouts():
    """Qwen3-235B-A22B: the Model Zoo runs pp 8 · vpp 4, which no even split allows."""
    model = mp.ModelSpec.preset("qwen3-235b-a22b")
    cluster = mp.Cluster.preset("dgx-h100", nodes=32)
    job = mp.Job(global_batch=2048, seq_len=4096)
    best = mp.plan(model, cluster, job, top_k=1, constraints=Constraints(
        fixed={"pp": 8, "vpp": 4, "tp": 2, "ep": 32, "schedule": "interleaved-1f1b"})).best
    assert best.layout.stage_layers == embedding_loss_stage_layers(94, 32)
