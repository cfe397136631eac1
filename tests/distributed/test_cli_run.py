"""`meshplan run plan.json` end to end on CPU: 2 gloo ranks, tiny model; --gc auto,
--cpu-affinity split (each rank pinned to its own cores), --seed and --lr reach the ranks."""

from __future__ import annotations

import json

import pytest

import meshplan as mp
from meshplan.cli import main

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

TINY = mp.ModelSpec(name="tiny", num_layers=2, hidden_size=32, num_heads=4, vocab_size=64,
                    max_seq_len=16, activation="swiglu", norm="rmsnorm",
                    position_embedding="rope", tied_embeddings=False, bias=False)


def _affinity_split_checkable() -> bool:
    import os

    from meshplan.executor.affinity import linux_siblings, physical_cores
    return hasattr(os, "sched_getaffinity") and len(
        physical_cores(os.sched_getaffinity(0), linux_siblings)) >= 2   # else not checkable


@pytest.fixture(scope="module")
def moe_run(tmp_path_factory) -> dict:
    """The results of `meshplan run` of a dp 2 · ep 2 MoE plan with --gc auto and (where
    this machine has two physical cores) --cpu-affinity split: one torchrun for the MoE
    test and the options' test (a torchrun start is most of a run's time on CPU)."""
    pytest.importorskip("torch")
    from dataclasses import replace

    from meshplan.executor.planfiles import write_plan_for_layout
    tmp_path = tmp_path_factory.mktemp("moe_run")
    moe = replace(TINY, name="tiny-moe", num_experts=4, experts_per_token=2,
                  moe_ffn_hidden_size=32)
    plan = tmp_path / "plan.json"
    job = mp.Job(global_batch=4, seq_len=16, precision="fp32")
    write_plan_for_layout(plan, moe, job, mp.Layout(dp=2, ep=2, micro_batch=1),
                          mp.Cluster.preset("dgx-h100", nodes=1))
    out = tmp_path / "results.json"
    split = _affinity_split_checkable()
    assert main(["run", str(plan), "--device", "cpu", "--steps", "2", "--warmup", "1",
                 "--out", str(out), "--gc", "auto", "--seed", "3", "--lr", "0.001",
                 *(["--cpu-affinity", "split"] if split else [])]) == 0
    return json.loads(out.read_text())


def test_meshplan_run_writes_results_and_refuses_overwrite(tmp_path, capsys, moe_run):
    pytest.importorskip("torch")
    from meshplan.executor.planfiles import write_plan_for_layout
    plan = tmp_path / "plan.json"
    cluster = mp.Cluster.preset("dgx-h100", nodes=1)
    write_plan_for_layout(plan, TINY, mp.Job(global_batch=4, seq_len=16, precision="fp32"),
                          mp.Layout(dp=2), cluster)
    out = tmp_path / "results.json"
    rc = main(["run", str(plan), "--device", "cpu", "--steps", "2", "--warmup", "1",
               "--out", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["measured"]["step_time_s"] > 0 and doc["status"] == "ok"
    assert doc["measured"]["gc"]["mode"] == "manual"           # the default
    assert doc["measured"]["moe_routing"] is None               # a dense model
    # --gc auto and --cpu-affinity split reach the ranks: checked on the MoE run (moe_run),
    # one torchrun for both options and the MoE test
    import os

    from meshplan.executor.affinity import linux_siblings, rank_cpus
    doc = moe_run
    assert doc["status"] == "ok" and doc["measured"]["gc"]["mode"] == "auto"
    assert "--seed 3" in doc["command"] and "--lr 0.001" in doc["command"]
    if _affinity_split_checkable():
        rank0 = rank_cpus(os.sched_getaffinity(0), 0, 2, linux_siblings)   # what rank 0 recorded
        assert doc["environment"]["cpu_affinity"] == f"split: {len(rank0)} CPUs per rank"
    # a second run without --force must not touch the file
    before = out.read_text()
    rc = main(["run", str(plan), "--device", "cpu", "--steps", "2", "--warmup", "1",
               "--out", str(out)])
    assert rc == 2 and "refusing to overwrite" in capsys.readouterr().err
    assert out.read_text() == before


def test_moe_run_records_the_load_imbalance_it_ran_at(moe_run):
    """dp 2 · ep 2: every MoE call of the timed steps recorded on both ranks, ρ ≥ 1."""
    doc = moe_run
    r = doc["measured"]["moe_routing"]
    # 2 MoE layers × 2 micro-batches a rank × 2 timed steps, no recomputation
    assert r["calls"] == 2 * 2 * 2 and r["ep"] == 2 and r["groups"] == 1
    assert 1.0 <= r["busiest_over_mean"] <= r["max"] <= 2.0
    assert all("routed" not in rank for rank in doc["measured"]["memory_per_rank"])
