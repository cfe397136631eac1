"""meshplan.report(...) and `meshplan report`: bad input, and a whole small report end to end."""

from __future__ import annotations

import base64
import json
import re
import time

import pandas as pd
import pytest

import meshplan as mp
from meshplan.cli import main as cli_main
from meshplan.errors import ConfigError, MeshplanError, UnknownPresetError
from meshplan.report.collect import cluster_for

SMALL = dict(model="gpt-1.7b", cluster="dgx-a100-80gb", global_batch=64, seq_len=2048)


def needs_planner():
    from meshplan import planner
    if not hasattr(planner, "plan"):
        pytest.skip("meshplan.planner.plan is not in this checkout yet")


# ---------------------------------------------------------------- bad input (before planning)

@pytest.mark.parametrize("kwargs, exc, msg", [
    (dict(compare_gpus="a100-80gb,h1000"), UnknownPresetError, r"'h1000'.*Did you mean"),
    (dict(objective="fastest"), UnknownPresetError, r"unknown objective 'fastest'"),
    (dict(objective="time_to_train"), ConfigError, r"needs the run's token count"),
    (dict(gpus=[8, 0]), ConfigError, r"GPU count 0"),
    (dict(gpus=[]), ConfigError, r"empty"),
    (dict(main_gpus=32), ConfigError, r"main_gpus = 32 is not one of the GPU counts \[8, 16\]"),
    (dict(top_k=0), ConfigError, r"top_k must be"),
    (dict(price_per_gpu_hour=-1.0), ConfigError, r"price_per_gpu_hour must be"),
    (dict(model="gpt-1.8b"), UnknownPresetError, r"Did you mean 'gpt-1.7b'"),
    (dict(cluster="dgx-h1000"), UnknownPresetError, r"Did you mean 'dgx-h100'"),
])
def test_bad_input_is_a_meshplan_error(kwargs, exc, msg):
    args = {**SMALL, "gpus": [8, 16], "progress": False, **kwargs}
    with pytest.raises(exc, match=msg):
        mp.report(args.pop("model"), args.pop("cluster"), **args)


def test_previous_report_dir_is_refused_before_any_planning(tmp_path, monkeypatch):
    (tmp_path / "report.html").write_text("old")
    import meshplan.planner

    def no_planning(*args, **kwargs):
        raise AssertionError("the planner ran before the output directory was checked")
    monkeypatch.setattr(meshplan.planner, "plan", no_planning)
    with pytest.raises(MeshplanError, match="not empty.*--force"):
        mp.report(SMALL["model"], SMALL["cluster"], gpus=[8], global_batch=64, seq_len=2048,
                  out_dir=tmp_path, progress=False)
    assert (tmp_path / "report.html").read_text() == "old"


def test_measurement_of_another_model_is_refused(tmp_path):
    p = tmp_path / "results.json"
    p.write_text(json.dumps({"model": mp.ModelSpec.preset("llama3-8b").to_dict(),
                             "measured": {"step_time_s": 1.0}}))
    with pytest.raises(MeshplanError, match=r"another model.*model\.num_layers"):
        mp.report(SMALL["model"], SMALL["cluster"], gpus=[8], global_batch=64, seq_len=2048,
                  measurements=[p], progress=False)


def test_cli_bad_gpu_name(capsys, tmp_path):
    rc = cli_main(["report", "--model", "gpt-1.7b", "--cluster", "dgx-h100", "--gpus", "8",
                   "--global-batch", "64", "--seq-len", "2048", "--compare-gpus", "h100,a10",
                   "-o", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert rc == 2 and "unknown GPU 'a10'" in err and "Did you mean" in err
    assert not (tmp_path / "r").exists()


def test_cli_bad_gpu_count(capsys):
    with pytest.raises(SystemExit) as ei:
        cli_main(["report", "--model", "gpt-1.7b", "--cluster", "dgx-h100", "--gpus", "8,x",
                  "--global-batch", "64", "--seq-len", "2048", "-o", "r"])
    assert ei.value.code == 2
    assert "GPU count 'x' is not an integer" in capsys.readouterr().err


# ---------------------------------------------------------------- end to end (planner)

def synthetic_results(path, layout, factor):
    """A results.json in the executor's shape; the "measurement" is the prediction × factor
    (these tests check the report's plumbing, not the cost model's accuracy)."""
    model, cluster = mp.ModelSpec.preset("gpt-1.7b"), mp.Cluster.preset("dgx-a100-80gb")
    job = mp.Job(global_batch=16, seq_len=2048)
    est = mp.estimate(model, cluster, job, layout)
    path.write_text(json.dumps({
        "model": model.to_dict(), "cluster": cluster.to_dict(), "job": job.to_dict(),
        "layout": layout.to_dict(), "prediction": est.to_dict(),
        "measured": {"step_time_s": {"median": est.step_time_s * factor, "spread": 0.01},
                     "tokens_per_s": est.tokens_per_s / factor, "mfu": est.mfu / factor,
                     "memory_per_rank_bytes": [est.memory_peak_bytes * 0.9] * layout.num_gpus}}))
    return path


@pytest.fixture(scope="module")
def small_report(tmp_path_factory):
    needs_planner()
    base = tmp_path_factory.mktemp("rep")
    out = base / "report"
    results = [synthetic_results(base / "r1.json", mp.Layout(dp=2, tp=2), 1.1),
               synthetic_results(base / "r2.json", mp.Layout(pp=2, tp=2), 0.95)]
    lines: list[str] = []
    t0 = time.perf_counter()
    r = mp.report(SMALL["model"], SMALL["cluster"], gpus=[8, 16], global_batch=64,
                  seq_len=2048, tokens=3e10, top_k=5, compare_gpus="a100-80gb,h100",
                  what_if_global_batch=[128], what_if_seq_len=[1024], measurements=results,
                  out_dir=out, progress=lines.append)
    return r, out, lines, time.perf_counter() - t0


def test_report_writes_every_output(small_report):
    r, out, lines, seconds = small_report
    names = {p.name for p in out.iterdir()}
    for f in ("report.html", "report.md", "summary.csv", "top_plans.csv", "memory_per_stage.csv",
              "step_time_breakdown.csv", "gpu_comparison.csv", "sensitivity_global_batch.csv",
              "sensitivity_seq_len.csv", "measurements.csv", "measured_vs_predicted.png",
              "memory_per_stage.png", "step_time_breakdown.png",
              "pipeline_timeline.png", "scaling.png", "gpu_comparison.png", "sensitivity.png"):
        assert f in names, f
    assert any("planning 16 GPUs" in ln for ln in lines) and "wrote" in lines[-1]
    assert seconds < 60, f"small report took {seconds:.1f} s"


def test_html_is_self_contained_and_md_links_exist(small_report):
    r, out, _, _ = small_report
    html = (out / "report.html").read_text()
    srcs = re.findall(r'<img [^>]*src="([^"]+)"', html)
    assert len(srcs) == len(r.figures) >= 6
    for src in srcs:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    assert "http://" not in html and "https://" not in html
    md = (out / "report.md").read_text()
    for link in re.findall(r"\]\(([^)#]+)\)", md):
        assert (out / link).is_file(), link
    for section in ("Summary", "Top plans on", "Memory per pipeline stage", "Step-time breakdown",
                    "Pipeline timeline", "Scaling", "GPU types compared", "Sensitivity",
                    "Measured vs predicted"):
        assert section in html and section in md


def test_numbers_are_the_cost_models(small_report):
    r, out, _, _ = small_report
    summary = pd.read_csv(out / "summary.csv")
    model, cluster = mp.ModelSpec.preset("gpt-1.7b"), mp.Cluster.preset("dgx-a100-80gb")
    job = mp.Job(global_batch=64, seq_len=2048, tokens=3e10)
    for o in r.outcomes:
        row = summary[summary["gpus"] == o.gpus].iloc[0]
        est = mp.estimate(model, cluster_for(cluster, o.gpus), job, o.layout)
        assert row["tokens_per_s"] == pytest.approx(est.tokens_per_s, rel=1e-9)
        assert row["mfu"] == pytest.approx(est.mfu, rel=1e-9)
        assert row["time_to_train_s"] == pytest.approx(3e10 / est.tokens_per_s, rel=1e-9)
        assert o.layout.num_gpus <= o.gpus and est.fits
    top = pd.read_csv(out / "top_plans.csv")
    assert list(top["rank"]) == list(range(1, len(top) + 1)) and len(top) <= 5
    # the detailed sections show the recommended count's best plan
    main = max((o for o in r.outcomes if o.feasible), key=lambda o: o.estimate.tokens_per_s)
    from meshplan.report.labels import label_with_split
    assert f"Recommendation (objective: throughput): {main.gpus} GPUs as " \
        f"{label_with_split(main.layout)} — " in r.recommendation
    assert (top.iloc[0]["dp"], top.iloc[0]["pp"], top.iloc[0]["tp"]) == \
        (main.layout.dp, main.layout.pp, main.layout.tp)
    mem = pd.read_csv(out / "memory_per_stage.csv")
    assert list(mem["total_gib"]) == pytest.approx(
        [m.total_bytes / 2**30 for m in main.estimate.memory], rel=1e-9)
    assert (mem["total_gib"] <= mem["usable_gib"] + 1e-9).all()


def test_measured_vs_predicted_table(small_report):
    r, out, _, _ = small_report
    df = pd.read_csv(out / "measurements.csv")
    assert list(df["prediction"]) == ["re-estimated", "re-estimated"]
    assert list(df["error_pct_step_time_s"]) == pytest.approx([100 * (1 / 1.1 - 1),
                                                              100 * (1 / 0.95 - 1)])
    assert list(df["gpus"]) == [4, 4]


def test_force_rewrites_but_keeps_foreign_files(small_report, tmp_path):
    r, out, _, _ = small_report
    (out / "my_notes.txt").write_text("keep me")
    r2 = mp.report(SMALL["model"], SMALL["cluster"], gpus=[8], global_batch=64, seq_len=2048,
                   sensitivity=False, out_dir=out, force=True, progress=False)
    names = {p.name for p in out.iterdir()}
    assert "my_notes.txt" in names and (out / "my_notes.txt").read_text() == "keep me"
    # files only the first report had (no scaling with one count, no GPU comparison) are gone
    assert "scaling.png" not in names and "gpu_comparison.csv" not in names
    assert set(r2.paths) <= names


def test_gpu_count_where_nothing_fits_is_a_row_with_the_reason(tmp_path):
    needs_planner()
    r = mp.report("gpt-7.5b", "dgx-a100-80gb", gpus=[1, 8], global_batch=32, seq_len=2048,
                  top_k=3, sensitivity=False, out_dir=tmp_path / "r", progress=False)
    df = r.tables["summary"]
    assert list(df["feasible"]) == [False, True]
    assert "fits in memory" in df.iloc[0]["note"] and "Recommendation" in r.recommendation
    assert "no layout of 'gpt-7.5b' on 1 GPU" in (tmp_path / "r" / "report.html").read_text()
    assert "scaling" not in r.figures   # one feasible count: nothing to draw a line through
    with pytest.raises(mp.NoFeasiblePlan, match=r"no GPU count in \[1\] has a layout"):
        mp.report("gpt-7.5b", "dgx-a100-80gb", gpus=[1], global_batch=32, seq_len=2048,
                  sensitivity=False, progress=False)


def test_cli_end_to_end(tmp_path, capsys):
    needs_planner()
    out = tmp_path / "cli"
    rc = cli_main(["report", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb", "--gpus", "8",
                   "--global-batch", "64", "--seq-len", "2048", "--no-sensitivity",
                   "--price-per-gpu-hour", "2.5", "-o", str(out)])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert "Recommendation" in cap.out and "planning 8 GPUs" in cap.err
    assert "$2.50/GPU-hour" in (out / "report.md").read_text()
    rc = cli_main(["report", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb", "--gpus", "8",
                   "--global-batch", "64", "--seq-len", "2048", "-o", str(out)])
    assert rc == 2 and "--force" in capsys.readouterr().err


def test_cautions_section_names_the_corrections_that_moved_the_plan():
    """A host-bound eager MoE plan (runtime megatron, 1,024 tokens a micro-batch): the
    report's "Cautions and corrections" section carries its caveats and a table with the
    host-work correction's share; a plan with neither gets no section."""
    from types import SimpleNamespace

    from meshplan.report.build import _cautions_section
    model = mp.ModelSpec.preset("mixtral-8x7b")
    cluster = mp.Cluster.preset("dgx-h100", nodes=2)
    job = mp.Job(global_batch=32, seq_len=1024)
    lay = mp.Layout(dp=16, ep=8, zero=1)
    est = mp.estimate(model, cluster, job, lay)
    sec = _cautions_section(SimpleNamespace(estimate=est, layout=lay), 16)
    assert sec is not None and sec.anchor == "cautions"
    assert all(f"Caution: {c}" in sec.text for c in est.caveats) and est.caveats
    (table,) = sec.tables
    row = table.raw.set_index("correction").loc["megatron_moe_host"]
    assert row["step_time_delta_s"] > 0
    dense = mp.ModelSpec.preset("gpt-1.7b")
    plain = SimpleNamespace(estimate=mp.estimate(dense, cluster, job, mp.Layout(dp=16)),
                            layout=mp.Layout(dp=16))
    assert not plain.estimate.caveats and _cautions_section(plain, 16) is None
