"""Plan files keep the calibrated profile's measured rows and correction numbers, so a plan
re-predicted from its file (meshplan run's comparison, a plan written for another layout of
the same cluster) gets the estimate the plan was chosen by."""

import json
from dataclasses import replace

import pytest

from meshplan.costmodel import estimate
from meshplan.costmodel.measured import (MeasuredEnd, MeasuredLayer, MeasuredTables,
                                         ends_shape_key, layer_shape_key)
from meshplan.errors import PlanFileError
from meshplan.executor.planfiles import write_plan_for_layout
from meshplan.hardware_profiles import Cluster
from meshplan.planner.planfile import load_plan_file, save_plan_file
from meshplan.spec import Job, Layout, ModelSpec

MODEL = ModelSpec(name="m", num_layers=8, hidden_size=1024, num_heads=16, vocab_size=32000,
                  max_seq_len=1024)
JOB = Job(global_batch=16, seq_len=1024, runtime="torch")
FSDP = Layout(dp=4, micro_batch=4, zero=2)


def _layer(mb, fwd, bwd, **kw):
    return MeasuredLayer(shape=layer_shape_key(MODEL), seq_len=1024, tp=1,
                         sequence_parallel=False, recompute="none", micro_batch=mb,
                         forward_s=fwd, backward_s=bwd, activation_bytes=100e6 * mb,
                         backward_peak_bytes=50e6 * mb, **kw)


def _end(part, mb, fwd, bwd):
    return MeasuredEnd(shape=ends_shape_key(MODEL), part=part, seq_len=1024, tp=1,
                       sequence_parallel=False, micro_batch=mb, forward_s=fwd,
                       backward_s=bwd, activation_bytes=1e6, peak_bytes=2e6)


TABLES = MeasuredTables(
    (_layer(2, 0.4e-3, 0.9e-3), _layer(4, 0.7e-3, 1.6e-3),
     _layer(2, 0.45e-3, 1.0e-3, zero=2, dp=4), _layer(4, 0.75e-3, 1.7e-3, zero=2, dp=4)),
    (_end("embedding", 4, 1e-4, 2e-4), _end("output", 4, 9e-4, 1.5e-3)))


def _calibrated() -> Cluster:
    c = Cluster.preset("dgx-h100", nodes=1, gpus_per_node=4)
    numbers = replace(c.gpu.corrections, fsdp2_dp_only_step_s=0.005, source="test profile")
    return c.with_gpu(replace(c.gpu, measured=TABLES, corrections=numbers))


def test_a_plan_file_re_predicts_as_the_plan_was_made(tmp_path):
    cluster = _calibrated()
    made = estimate(MODEL, cluster, JOB, FSDP)
    path = save_plan_file(tmp_path / "p.json", MODEL, cluster, JOB, FSDP, made.to_dict())
    rec = load_plan_file(path)
    assert rec.cluster.gpu.measured.layers == TABLES.layers
    assert rec.cluster.gpu.measured.ends == TABLES.ends
    assert rec.cluster.gpu.corrections.fsdp2_dp_only_step_s == 0.005
    again = estimate(rec.model, rec.cluster, rec.job, rec.layout)
    assert again.step_time_s == made.step_time_s
    assert again.memory_peak_bytes == made.memory_peak_bytes
    # what a file without them re-predicted (the analytical layer and the built-in numbers)
    bare = Cluster.preset("dgx-h100", nodes=1, gpus_per_node=4)
    assert estimate(MODEL, bare, JOB, FSDP).step_time_s != pytest.approx(made.step_time_s,
                                                                         rel=0.05)


def test_a_plan_written_for_another_layout_of_a_loaded_cluster_keeps_the_rows(tmp_path):
    cluster = _calibrated()
    first = save_plan_file(tmp_path / "a.json", MODEL, cluster, JOB, Layout(dp=4, micro_batch=2,
                                                                             zero=2))
    other = write_plan_for_layout(tmp_path / "b.json", MODEL, JOB, FSDP,
                                  load_plan_file(first).cluster)
    rec = load_plan_file(other)
    assert rec.prediction["step_time_s"] == estimate(MODEL, cluster, JOB, FSDP).step_time_s


def test_a_datasheet_plan_has_no_profile_field_and_rows_leave_defaults_out(tmp_path):
    bare = Cluster.preset("dgx-h100", nodes=1, gpus_per_node=4)
    doc = json.loads(save_plan_file(tmp_path / "p.json", MODEL, bare, JOB, FSDP).read_text())
    assert "gpu_profile" not in doc
    assert load_plan_file(tmp_path / "p.json").cluster.gpu.measured is None
    doc = json.loads(save_plan_file(tmp_path / "q.json", MODEL, _calibrated(), JOB,
                                    FSDP).read_text())
    plain, fsdp = doc["gpu_profile"]["measured"]["layers"][0], \
        doc["gpu_profile"]["measured"]["layers"][2]
    assert "zero" not in plain and fsdp["zero"] == 2 and fsdp["dp"] == 4


@pytest.mark.parametrize("bad, match", [
    ([], "must be an object"),
    ({"rows": {}}, "must be an object with keys"),
    ({"measured": {"layers": {}}}, "'measured' must hold lists"),
    ({"measured": {"layers": [{"shape": "x"}]}}, r"\[\[layers\]\] #1"),
    ({"corrections": {"fsdp2_dp_only_step_s": -1}}, "fsdp2_dp_only_step_s"),
])
def test_a_malformed_profile_field_is_named(tmp_path, bad, match):
    path = save_plan_file(tmp_path / "p.json", MODEL, _calibrated(), JOB, FSDP)
    doc = json.loads(path.read_text())
    doc["gpu_profile"] = bad
    path.write_text(json.dumps(doc))
    with pytest.raises(PlanFileError, match=match) as err:
        load_plan_file(path)
    assert "gpu_profile" in str(err.value)
