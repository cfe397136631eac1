"""Issue 37 item 6: short layout labels, stage splits in footnotes only where uneven, tables
with units and without always-zero columns, figures whose legends, labels and titles do not
collide or get cut, and consistent scaling axes."""

from __future__ import annotations

import pytest

import meshplan as mp
from meshplan.report import figures_plan, figures_sweep, tables
from meshplan.report.collect import PlanOutcome, cluster_for
from meshplan.report.labels import label_with_split, layout_label
from meshplan.report.render import Section, Table, render_html, render_markdown
from meshplan.report.style import seconds

GPT = mp.ModelSpec(name="tiny-gpt", num_layers=8, hidden_size=1024, num_heads=16,
                   vocab_size=32000, max_seq_len=2048)
JOB = mp.Job(global_batch=64, seq_len=1024, tokens=1e10)
UNEVEN = mp.Layout(dp=2, pp=4, tp=2, stage_layers=(1, 3, 3, 1))
EVEN = mp.Layout(dp=1, pp=2, tp=2, schedule="interleaved-1f1b", vpp=4, micro_batch=2,
                 zero=1, sequence_parallel=True, stage_layers=(1,) * 8)


def outcome(layout: mp.Layout, gpus: int = 16) -> PlanOutcome:
    cl = cluster_for(mp.Cluster.preset("dgx-a100-80gb"), gpus)
    return PlanOutcome(gpus=gpus, cluster=cl, job=JOB,
                       candidates=((layout, mp.estimate(GPT, cl, JOB, layout)),))


@pytest.mark.parametrize("lay,label", [
    (mp.Layout(dp=64, pp=4, tp=4, schedule="interleaved-1f1b", vpp=24, micro_batch=2, zero=2,
               sequence_parallel=True), "dp64 pp4 tp4 v24 mb2 z2 sp"),
    (mp.Layout(dp=8, pp=2, schedule="gpipe", recompute="full"), "dp8 pp2 tp1 gpipe mb1 rc-full z0"),
    (mp.Layout(pp=2, schedule="zero-bubble", recompute="selective", zero=1),
     "dp1 pp2 tp1 zb mb1 rc-sel z1"),
    (mp.Layout(dp=4, tp=2, cp=2, cp_style="all-to-all", ep=4, etp=2, compile=True),
     "dp4 pp1 tp2 cp2-a2a ep4 etp2 mb1 z0 compiled"),
])
def test_layout_label_names_what_differs_from_the_defaults(lay, label):
    assert layout_label(lay) == label


def test_stage_split_only_where_uneven():
    assert label_with_split(UNEVEN) == "dp2 pp4 tp2 mb1 z0 (layers per stage 1/3/3/1)"
    assert label_with_split(EVEN) == layout_label(EVEN)
    # forty equal chunks no longer spell "layers 2/2/2/…" anywhere
    assert "/" not in label_with_split(EVEN)


def test_tables_footnote_uneven_splits_in_html_and_markdown():
    df = tables.summary_table([outcome(UNEVEN), outcome(EVEN, gpus=4)])
    shown = tables.display_plans(df)
    assert list(shown["layout"]) == ["dp2 pp4 tp2 mb1 z0 [1]", layout_label(EVEN)]
    assert "stage_layers" not in shown and list(df["stage_layers"]) == ["1/3/3/1",
                                                                      "1/1/1/1/1/1/1/1"]
    notes = tables.stage_notes(df)
    assert notes == ("[1] layers per pipeline stage: 1/3/3/1",)
    sec = Section(anchor="s", title="S", tables=(Table(name="t", title="", raw=df,
                                                       display=shown, notes=notes),))
    assert '<p class="note">[1] layers per pipeline stage: 1/3/3/1</p>' in \
        render_html("T", "m", [sec], {})
    assert "[1] layers per pipeline stage: 1/3/3/1" in render_markdown("T", "m", [sec])


def test_plan_tables_drop_columns_that_repeat_every_row():
    df = tables.gpu_table([outcome(UNEVEN), outcome(UNEVEN)])
    shown = tables.display_plans(df)
    assert "gpus" not in shown and "GPUs used" not in shown   # 16 everywhere: in the text
    df = tables.summary_table([outcome(UNEVEN), outcome(EVEN, gpus=8)])
    shown = tables.display_plans(df)
    assert list(shown["GPUs used"]) == ["16", "4"]   # 4 of 8 used: shown


def test_breakdown_has_units_and_no_always_zero_parts():
    top = tables.topk_table(outcome(UNEVEN))
    raw = tables.breakdown_table(top, 1)
    zero = [c for c in raw.columns if c.endswith("_s") and (raw[c] == 0).all()]
    assert zero, "the case should have parts that are zero (ZeRO-3 gathers, FSDP2, ...)"
    shown = tables.display_breakdown(raw)
    for c in zero:
        assert c[:-2].replace("_", " ") not in shown.columns
    assert "ZeRO-3 gathers" not in shown.columns and "step time" in shown.columns
    for c in shown.columns[2:]:
        assert all(v.endswith((" s", " ms", " µs")) for v in shown[c]), c
    assert set(raw.columns) >= {f"{c}" for c in zero}   # the CSV keeps them


def test_seconds_format():
    assert [seconds(v) for v in (7.706, 0.3782, 0.0008227, 0.0, 120.79, 1234.5)] == \
        ["7.71 s", "378 ms", "823 µs", "0", "121 s", "1,234 s"]
    assert seconds(7.8) == "7.80 s" and seconds(0.024) == "24.0 ms"


def test_memory_table_has_no_count_column():
    shown = tables.display_memory(tables.memory_table(outcome(UNEVEN)))
    assert not [c for c in shown.columns if "flight" in c]
    assert list(shown.columns) == ["stage", "layers", "weights", "grads", "optimizer",
                                   "activations", "other", "total", "usable"]


def _inside(fig, artist) -> bool:
    box = artist.get_window_extent()
    figbox = fig.bbox
    return box.x0 >= figbox.x0 - 1 and box.x1 <= figbox.x1 + 1 and \
        box.y0 >= figbox.y0 - 1 and box.y1 <= figbox.y1 + 1


def test_breakdown_legend_labels_and_title_fit():
    top = outcome(UNEVEN)
    labeled = [(f"#{i} {layout_label(lay)}", e) for i, (lay, e) in
               enumerate([top.candidates[0]] * 8, start=1)]
    fig = figures_plan.step_time_breakdown(labeled, title="Where the step time goes")
    fig.canvas.draw()
    ax = fig.axes[0]
    legend = fig.legends[0].get_window_extent()
    assert not legend.overlaps(ax.xaxis.label.get_window_extent())
    assert not legend.overlaps(ax.get_window_extent())
    for t in ax.get_yticklabels():
        assert _inside(fig, t) and t.get_text().startswith("#")
    assert _inside(fig, ax.title)


def test_memory_title_with_a_long_layout_is_not_clipped():
    title = "Memory per GPU by pipeline stage — " + label_with_split(UNEVEN) * 4
    fig = figures_plan.memory_per_stage(outcome(UNEVEN).estimate, title=title)
    fig.canvas.draw()
    assert _inside(fig, fig.axes[0].title)


def test_scaling_axes():
    df = tables.summary_table([outcome(UNEVEN, gpus=g) for g in (16, 32, 64)])
    fig = figures_sweep.scaling(df)
    axs = fig.axes
    assert all(a.get_xscale() == "log" for a in axs)
    assert [a.get_yscale() for a in axs] == ["log", "linear", "log", "linear"]
    assert axs[0].get_ylabel() == "throughput (M tokens/s)"
