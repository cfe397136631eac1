"""`meshplan run` compares a run with the cost model under the executor's runtime ("torch"),
whatever runtime the plan was made for (issue 37 item 4)."""

import dataclasses

import pytest

import meshplan as mp
from meshplan.costmodel import estimate
from meshplan.planner.planfile import PlanRecord

pytest.importorskip("torch")
from meshplan.executor.run import prediction_of  # noqa: E402

MODEL = mp.ModelSpec.preset("gpt-1.7b")
CLUSTER = mp.Cluster.preset("dgx-h100", nodes=1, gpus_per_node=4)
LAYOUT = mp.Layout(dp=4, micro_batch=2, zero=1)


def _record(runtime: str, with_prediction: bool) -> PlanRecord:
    job = mp.Job(global_batch=16, seq_len=2048, runtime=runtime)
    pred = estimate(MODEL, CLUSTER, job, LAYOUT).to_dict() if with_prediction else {}
    return PlanRecord(model=MODEL, cluster=CLUSTER, job=job, layout=LAYOUT, prediction=pred)


def test_a_megatron_plan_is_repredicted_with_the_torch_runtime():
    rec = _record("megatron", with_prediction=True)
    torch_job = dataclasses.replace(rec.job, runtime="torch")
    want = estimate(MODEL, CLUSTER, torch_job, LAYOUT).to_dict()
    got = prediction_of(rec)
    assert got["step_time_s"] == pytest.approx(want["step_time_s"])
    assert got["memory_peak_bytes"] == pytest.approx(want["memory_peak_bytes"])
    # the two runtimes differ on this layout (ZeRO-1 states, activations), so the check bites
    assert got["memory_peak_bytes"] != pytest.approx(rec.prediction["memory_peak_bytes"])
    assert "runtime 'megatron'" in got["runtime_note"]


def test_a_torch_plan_keeps_its_own_prediction():
    rec = _record("torch", with_prediction=True)
    marked = {**rec.prediction, "marker": 1}
    got = prediction_of(dataclasses.replace(rec, prediction=marked))
    assert got["marker"] == 1 and "runtime_note" not in got


def test_a_plan_without_prediction_gets_the_torch_one():
    rec = _record("torch", with_prediction=False)
    assert prediction_of(rec)["step_time_s"] == pytest.approx(
        estimate(MODEL, CLUSTER, rec.job, LAYOUT).step_time_s)
