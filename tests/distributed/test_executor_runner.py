"""`meshplan run` path: torchrun on 2 CPU ranks, results.json, and a rank failing mid-run."""

import json

import pytest

pytest.importorskip("torch")

from meshplan.spec import Job, Layout, ModelSpec  # noqa: E402
from meshplan.errors import ExecutorError  # noqa: E402
from meshplan.executor.launch import run_local  # noqa: E402
from meshplan.executor.planfiles import write_plan_for_layout  # noqa: E402

M = ModelSpec(name="tiny", num_layers=4, hidden_size=32, num_heads=4, vocab_size=64,
              max_seq_len=16)
JOB = Job(global_batch=8, seq_len=16, precision="fp32")
CPU = ["--device", "cpu"]


@pytest.fixture
def plan(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return write_plan_for_layout(tmp_path / "plan.json", M, JOB,
                                 Layout(pp=2, micro_batch=2, schedule="1f1b"))


@pytest.mark.distributed
def test_run_local_measures_and_refuses_to_overwrite(plan, tmp_path):
    out = tmp_path / "results.json"
    assert run_local(plan, steps=3, warmup=1, out=out, extra_args=CPU) == 0
    doc = json.loads(out.read_text())
    assert doc["status"] == "ok"
    ranks = doc["measured"]["memory_per_rank"]
    assert sorted((r["rank"], r["pp"]) for r in ranks) == [(0, 0), (1, 1)]
    assert doc["prediction"] and doc["errors_pct"]["step_time_s"] is not None
    with pytest.raises(ExecutorError, match="refusing to overwrite"):
        run_local(plan, out=out, extra_args=CPU)
    with pytest.raises(ExecutorError, match="needs 2 processes"):
        run_local(plan, nproc=4, out=tmp_path / "other.json", extra_args=CPU)


@pytest.mark.distributed
def test_a_failing_rank_is_named_in_results(plan, tmp_path, monkeypatch):
    monkeypatch.setenv("MESHPLAN_EXECUTOR_INJECT", "1:2:oom")
    out = tmp_path / "results.json"
    rc = run_local(plan, steps=3, warmup=1, out=out, extra_args=CPU)
    assert rc != 0
    doc = json.loads(out.read_text())
    assert doc["status"] == "failed"
    first = doc["error"]["ranks"][0]
    assert (first["rank"], first["kind"], first["step"]) == (1, "out_of_memory", 2)
    assert "pipeline stage 1" in first["where"] and "predicted peak" in first["message"]

# --cpu-affinity split (ranks pinned to their own cores) is checked in the MoE run of
# test_cli_run.py, through `meshplan run`'s option, to start one torchrun less.
