"""Report building blocks on hand-picked layouts (no planner): figures, tables, names, output dir."""

from __future__ import annotations

import json

import pytest

import meshplan as mp
from meshplan.errors import ConfigError, MeshplanError, UnknownPresetError
from meshplan.report import figures_plan, figures_sweep, tables
from meshplan.report.collect import PlanOutcome, check_gpu_counts, cluster_for, sensitivity_values
from meshplan.report.gpu_names import cluster_preset_for, parse_gpu_list
from meshplan.report.render import MANIFEST, prepare_output_dir
from meshplan.report.timeline import pipeline_seconds, simulate_plan

GPT = mp.ModelSpec(name="tiny-gpt", num_layers=8, hidden_size=1024, num_heads=16,
                   vocab_size=32000, max_seq_len=2048)
JOB = mp.Job(global_batch=64, seq_len=1024, tokens=1e10)


def outcome(layout: mp.Layout, gpus: int = 16, cluster: str = "dgx-a100-80gb",
            job: mp.Job = JOB) -> PlanOutcome:
    cl = cluster_for(mp.Cluster.preset(cluster), gpus)
    return PlanOutcome(gpus=gpus, cluster=cl, job=job,
                       candidates=((layout, mp.estimate(GPT, cl, job, layout)),))


PP4 = mp.Layout(dp=2, pp=4, tp=2, schedule="1f1b")


def test_memory_parts_sum_to_stage_totals():
    est = outcome(PP4).estimate
    parts = figures_plan.memory_parts(est)
    for i, m in enumerate(est.memory):
        assert sum(v[i] for v in parts.values()) == pytest.approx(m.total_bytes / 2**30, rel=1e-12)


def test_time_parts_are_the_cost_models_breakdown():
    est = outcome(PP4).estimate
    parts = figures_plan.time_parts(est)
    assert sum(parts.values()) == pytest.approx(est.time.total_s, rel=1e-12)
    assert parts["bubble"] == est.time.bubble_s and parts["TP comm"] == est.time.tp_comm_s


@pytest.mark.parametrize("layout", [
    mp.Layout(dp=2, pp=4, tp=2, schedule="1f1b"),
    mp.Layout(dp=4, pp=4, tp=1, schedule="gpipe"),
    mp.Layout(dp=4, pp=2, tp=2, schedule="zero-bubble"),
    mp.Layout(dp=2, pp=4, tp=2, schedule="interleaved-1f1b", vpp=2),
    mp.Layout(dp=8, pp=1, tp=2),
])
def test_timeline_simulation_has_every_pass_and_matches_the_estimate(layout):
    o = outcome(layout)
    est = o.estimate
    sim = simulate_plan(GPT, o.cluster, JOB, layout, est)
    m = est.num_microbatches
    kinds = {"F", "B", "W"} if layout.schedule == "zero-bubble" else {"F", "B"}
    assert {e.kind for e in sim.events} == kinds
    assert len(sim.events) == len(kinds) * m * layout.pp * layout.vpp
    # every rank's busy time equals the sum of its stages' per-micro-batch times
    for r in range(layout.pp):
        stages = range(r, layout.pp * layout.vpp, layout.pp)
        busy = m * sum(est.stage_forward_s[c] + est.stage_backward_s[c] for c in stages)
        assert sim.busy_s[r] == pytest.approx(busy, rel=1e-9)
    assert sim.step_time_s >= max(sim.busy_s) - 1e-12
    # the cost model's closed form and the simulator agree, though the stages are not
    # uniform (the last carries the logits): this also checks that the timeline is fed the
    # same p2p and weight-gradient times as the estimate. The interleaved closed form is
    # documented as close, not exact, when the first/last chunks differ
    # (meshplan/costmodel/pipeline_interleaved.py), hence its looser tolerance.
    rel = 0.01 if layout.vpp > 1 else 1e-9
    assert sim.step_time_s == pytest.approx(pipeline_seconds(est), rel=rel)


def test_figures_are_agg_figures_with_labeled_axes():
    from matplotlib.figure import Figure
    a, b = outcome(PP4), outcome(mp.Layout(dp=4, pp=2, tp=2, schedule="1f1b"))
    sim = simulate_plan(GPT, a.cluster, JOB, PP4, a.estimate)
    figs = [figures_plan.memory_per_stage(a.estimate, gpu_memory_bytes=a.cluster.gpu.memory_bytes),
            figures_plan.step_time_breakdown([("a", a.estimate), ("b", b.estimate)]),
            figures_plan.pipeline_timeline(sim, pp=4)]
    summary = tables.summary_table([b, a])
    figs.append(figures_sweep.scaling(summary))
    figs.append(figures_sweep.gpu_comparison(tables.gpu_table([a, b])))
    sens = tables.sensitivity_table([a], "global_batch")
    figs.append(figures_sweep.sensitivity(sens, tables.sensitivity_table([a], "seq_len"),
                                          baseline_batch=64, baseline_seq=1024))
    for fig in figs:
        assert isinstance(fig, Figure)
        assert type(fig.canvas).__name__ == "FigureCanvasAgg"
        for ax in fig.axes:
            if ax.has_data():
                assert ax.get_xlabel() and ax.get_ylabel(), ax.get_title()
        from meshplan.report.style import png_bytes
        png = png_bytes(fig)
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


def test_memory_figure_draws_usable_memory_line():
    est = outcome(PP4).estimate
    fig = figures_plan.memory_per_stage(est)
    ax = fig.axes[0]
    ys = [line.get_ydata()[0] for line in ax.get_lines()]
    assert est.usable_memory_bytes / 2**30 in ys
    assert len(ax.patches) == 4 * sum(1 for v in figures_plan.memory_parts(est).values()
                                      if any(x > 0 for x in v))


def test_summary_table_cost_and_time_to_train():
    o = outcome(PP4)
    df = tables.summary_table([o])
    r = df.iloc[0]
    est = o.estimate
    assert r["tokens_per_s"] == est.tokens_per_s and r["mfu"] == est.mfu
    assert r["time_to_train_s"] == pytest.approx(JOB.tokens / est.tokens_per_s)
    price = o.cluster.price_per_gpu_hour
    assert r["cost_usd"] == pytest.approx(price * 16 * r["time_to_train_s"] / 3600)
    assert r["usd_per_million_tokens"] == pytest.approx(
        price * 16 * est.step_time_s / 3600 / JOB.tokens_per_step * 1e6)
    assert r["scaling_efficiency"] == pytest.approx(1.0)


def test_infeasible_outcome_is_a_row_with_its_reason():
    bad = PlanOutcome(gpus=3, cluster=mp.Cluster.preset("dgx-h100"), job=JOB,
                      error="needs 90 GiB, 74.7 GiB usable\nmore text")
    df = tables.summary_table([outcome(PP4), bad])
    assert list(df["feasible"]) == [True, False]
    assert df.iloc[1]["note"] == "needs 90 GiB, 74.7 GiB usable more text"
    shown = tables.display_plans(df)
    assert "note" in shown.columns and "–" in list(shown["throughput"])


def test_topk_table_has_every_layout_field_and_time_parts():
    df = tables.topk_table(outcome(PP4))
    for col in ("dp", "pp", "tp", "micro_batch", "schedule", "vpp", "recompute", "zero",
                "sequence_parallel", "step_time_s", "tokens_per_s", "mfu", "memory_peak_gib",
                "compute_s", "tp_comm_s", "pp_comm_s", "bubble_s", "dp_exposed_s",
                "zero3_gathers_s", "optimizer_s"):
        assert col in df.columns
    md = tables.to_markdown(tables.display_topk(df))
    assert md.count("\n") == 2 and md.startswith("| rank |")


def test_to_markdown_escapes_pipes():
    import pandas as pd
    md = tables.to_markdown(pd.DataFrame({"a|b": ["x|y"]}))
    assert md.splitlines()[0] == "| a\\|b |" and md.splitlines()[2] == "| x\\|y |"


def test_gpu_names():
    assert cluster_preset_for("H100") == "dgx-h100"
    assert parse_gpu_list("a100-80gb, h100,h200,h100") == ("dgx-a100-80gb", "dgx-h100", "dgx-h200")
    assert parse_gpu_list(["dgx-b200"]) == ("dgx-b200",)
    with pytest.raises(UnknownPresetError, match="'h10'.*Did you mean.*'h100'"):
        parse_gpu_list("a100-80gb,h10")
    with pytest.raises(ConfigError, match="empty GPU name"):
        parse_gpu_list("h100,,h200")


def test_gpu_counts_validation():
    assert check_gpu_counts([128, 64, 64]) == (64, 128)
    assert check_gpu_counts(8) == (8,)
    for bad, msg in (([], "empty"), ([0], "GPU count 0"), ([4.5], "4.5"), ("64", "'6'")):
        with pytest.raises(ConfigError, match=msg):
            check_gpu_counts(bad)


def test_sensitivity_values():
    assert sensitivity_values(1024, (0.25, 0.5, 2, 4)) == (256, 512, 1024, 2048, 4096)
    assert sensitivity_values(2048, (0.5, 2), high=2048) == (1024, 2048)
    assert sensitivity_values(2, (0.25, 0.5)) == (1, 2)


def test_output_dir_refuses_non_empty_and_force_keeps_foreign_files(tmp_path):
    out = tmp_path / "rep"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(MeshplanError, match=r"not empty \(notes.txt\).*--force"):
        prepare_output_dir(out, force=False)
    (out / "old.png").write_bytes(b"x")
    (out / MANIFEST).write_text(json.dumps({"files": ["old.png", "../escape.txt", ".hidden"]}))
    (tmp_path / "escape.txt").write_text("outside")
    prepare_output_dir(out, force=True)
    assert (out / "notes.txt").read_text() == "mine"
    assert not (out / "old.png").exists() and not (out / MANIFEST).exists()
    assert (tmp_path / "escape.txt").exists()
    f = tmp_path / "file"
    f.write_text("")
    with pytest.raises(MeshplanError, match="not a directory"):
        prepare_output_dir(f, force=True)
