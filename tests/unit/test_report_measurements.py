"""Reading executor results.json files for the measured-vs-predicted section."""

from __future__ import annotations

import json

import pytest

import meshplan as mp
from meshplan.errors import MeshplanError, PlanFileError
from meshplan.report import figures_sweep, tables
from meshplan.report.measurements import load_measurement, measurements_table

MODEL = mp.ModelSpec.preset("llama3-8b")
CLUSTER = mp.Cluster.preset("dgx-h100", nodes=1)
JOB = mp.Job(global_batch=16, seq_len=2048)
LAYOUT = mp.Layout(dp=2, pp=2, tp=2, zero=1)


def results_doc(**over):
    est = mp.estimate(MODEL, CLUSTER, JOB, LAYOUT)
    doc = {"model": MODEL.to_dict(), "cluster": CLUSTER.to_dict(), "job": JOB.to_dict(),
           "layout": LAYOUT.to_dict(), "prediction": est.to_dict(),
           "measured": {"step_time_s": est.step_time_s * 1.25, "tokens_per_s": 1000.0,
                        "mfu": 0.4, "memory_peak_bytes": 30 * 2**30},
           "errors_pct": {}, "environment": {"gpu_name": "NVIDIA H100 80GB HBM3"}}
    doc.update(over)
    return doc


def write(tmp_path, doc, name="results.json"):
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    return p


def test_reads_and_reestimates(tmp_path):
    m = load_measurement(write(tmp_path, results_doc()), MODEL, CLUSTER)
    est = mp.estimate(MODEL, CLUSTER, JOB, LAYOUT)
    assert m.source == "re-estimated" and m.num_gpus == 8
    assert m.predicted["step_time_s"] == est.step_time_s
    assert m.measured["memory_peak_bytes"] == 30 * 2**30
    df = measurements_table([m])
    assert df.loc[0, "error_pct_step_time_s"] == pytest.approx(100 * (1 / 1.25 - 1))
    shown = tables.display_measurements(df)
    assert shown.loc[0, "step err."] == "-20.0%"
    fig = figures_sweep.measured_vs_predicted(df)
    assert len(fig.axes) == 2


def test_falls_back_to_the_files_prediction(tmp_path):
    doc = results_doc()
    del doc["job"]
    doc["prediction"]["step_time_s"] = 1.5
    m = load_measurement(write(tmp_path, doc), MODEL, CLUSTER)
    assert m.source == "file" and m.predicted["step_time_s"] == 1.5


def test_median_dicts_and_per_rank_memory(tmp_path):
    doc = results_doc(measured={"step_time_s": {"median": 2.0, "spread": 0.1},
                                "per_rank": [{"memory_peak_bytes": 5.0},
                                             {"memory_peak_bytes": 7.0}]})
    m = load_measurement(write(tmp_path, doc), MODEL, CLUSTER)
    assert m.measured["step_time_s"] == 2.0 and m.measured["memory_peak_bytes"] == 7.0
    assert m.measured["mfu"] is None


def test_per_rank_memory_as_numbers_or_top_level_ranks(tmp_path):
    doc = results_doc(measured={"step_time": {"median_s": 3.0},
                                "memory_per_rank_bytes": [1.0, 9.0, 4.0]})
    m = load_measurement(write(tmp_path, doc), MODEL, CLUSTER)
    assert m.measured["step_time_s"] == 3.0 and m.measured["memory_peak_bytes"] == 9.0
    doc = results_doc(measured={"step_time_s": 1.0},
                      ranks=[{"peak_allocated_bytes": 2.0}, {"peak_allocated_bytes": 6.0}])
    assert load_measurement(write(tmp_path, doc), MODEL, CLUSTER).measured[
        "memory_peak_bytes"] == 6.0


def test_other_model_names_the_field(tmp_path):
    other = mp.ModelSpec.preset("llama3-70b").to_dict()
    with pytest.raises(MeshplanError, match=r"another model \('llama3-70b'.*model\.num_layers: "
                                            r"report has 32, file has 80"):
        load_measurement(write(tmp_path, results_doc(model=other)), MODEL, CLUSTER)


def test_other_gpu_names_the_field(tmp_path):
    a100 = mp.Cluster.preset("dgx-a100-80gb").to_dict()
    with pytest.raises(MeshplanError, match=r"cluster\.gpu\.name: report has 'H100-SXM5-80GB', "
                                            r"file has 'A100-SXM4-80GB'"):
        load_measurement(write(tmp_path, results_doc(cluster=a100)), MODEL, CLUSTER)


def test_a_smaller_cluster_of_the_same_gpu_is_fine(tmp_path):
    small = mp.Cluster.preset("dgx-h100", nodes=1, gpus_per_node=4).to_dict()
    doc = results_doc(cluster=small, layout=mp.Layout(dp=2, tp=2).to_dict())
    m = load_measurement(write(tmp_path, doc), MODEL, mp.Cluster.preset("dgx-h100", nodes=64))
    assert m.num_gpus == 4 and m.source == "re-estimated"


@pytest.mark.parametrize("content, msg", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "must hold a JSON object"),
    (json.dumps({"model": MODEL.to_dict()}), "no 'measured' object"),
    (json.dumps({"measured": {"foo": 1}}), "holds none of"),
    (json.dumps({"measured": {"mfu": 0.3}}), "neither a 'prediction'"),
])
def test_bad_files(tmp_path, content, msg):
    p = tmp_path / "r.json"
    p.write_text(content)
    with pytest.raises(PlanFileError, match=msg):
        load_measurement(p, MODEL, CLUSTER)


def test_failed_run_says_why(tmp_path):
    doc = results_doc(measured={}, status="oom", error="rank 1 (stage 1) ran out of memory")
    with pytest.raises(PlanFileError, match=r"failed run \(status 'oom'\): rank 1"):
        load_measurement(write(tmp_path, doc), MODEL, CLUSTER)


def test_cpu_runs_are_labelled_cpu(tmp_path):
    doc = results_doc(environment={"device": "cpu", "gpu_name": None})
    assert load_measurement(write(tmp_path, doc), MODEL, CLUSTER).gpu == "cpu"


def test_missing_file(tmp_path):
    with pytest.raises(PlanFileError, match="does not exist"):
        load_measurement(tmp_path / "nope.json", MODEL, CLUSTER)
