"""The output layer with its loss compiled (Layout.compile at tp = 1): calibrate times it, the
tables keep it apart from the eager row, the cost model reads it for compiled layouts."""

from dataclasses import replace

import pytest

from meshplan.calibrate.bench_layers import plan_grid
from meshplan.calibrate.layer_rows import end_row
from meshplan.costmodel import estimate
from meshplan.costmodel.measured import (MeasuredEnd, MeasuredLayer, MeasuredTables,
                                         ends_shape_key, layer_shape_key, tables_from_rows)
from meshplan.hardware_profiles import Cluster
from meshplan.spec import Job, Layout, ModelSpec

MODEL = ModelSpec(name="m", num_layers=8, hidden_size=1024, num_heads=16, vocab_size=32000,
                  max_seq_len=1024)
JOB = Job(global_batch=16, seq_len=1024, runtime="torch")


def _end(compile, fwd, bwd, act, peak, tp=1):
    return MeasuredEnd(shape=ends_shape_key(MODEL), part="output", seq_len=1024, tp=tp,
                       sequence_parallel=False, micro_batch=1, forward_s=fwd, backward_s=bwd,
                       activation_bytes=act, peak_bytes=peak, compile=compile)


def _layer(compile, tp=1):
    return MeasuredLayer(shape=layer_shape_key(MODEL), seq_len=1024, tp=tp,
                         sequence_parallel=False, recompute="none", micro_batch=1,
                         forward_s=2e-3, backward_s=4e-3, activation_bytes=1e8,
                         backward_peak_bytes=1e7, compile=compile)


def _cluster(*rows):
    c = Cluster.preset("dgx-h100", nodes=1, gpus_per_node=4)
    layers = tuple(r for r in rows if isinstance(r, MeasuredLayer))
    ends = tuple(r for r in rows if isinstance(r, MeasuredEnd))
    return replace(c, gpu=replace(c.gpu, measured=MeasuredTables(layers, ends)))


def test_the_grid_times_the_compiled_loss_at_tp1_only_with_compile_rows():
    tiny = ModelSpec(name="t", num_layers=2, hidden_size=64, num_heads=4, vocab_size=128,
                     max_seq_len=32)
    assert not [c for c in plan_grid([tiny], 32, 2, quick=True) if c.part and c.compile]
    grid = plan_grid([tiny], 32, 2, quick=True, micro_batches=(1, 2), compile_rows=("none",))
    loss = [c for c in grid if c.part and c.compile]
    assert {(c.part, c.tp, c.sequence_parallel, c.micro_batch) for c in loss} == {
        ("output", 1, False, 1), ("output", 1, False, 2)}
    assert end_row(loss[0], (1e-3, 2e-3, 1e6, 2e6))["compile"] is True
    assert "compiled" in loss[0].label()


def test_tables_keep_the_compiled_loss_apart_and_fall_back_to_eager():
    t = MeasuredTables((), (_end(False, 2e-3, 4e-3, 9e8, 1.7e9), _end(True, 1e-3, 2e-3, 4e8, 2e8)))
    kw = dict(seq_len=1024, tp=1, sequence_parallel=False, micro_batch=1)
    assert t.end(MODEL, "output", **kw).peak_bytes == 1.7e9
    assert t.end(MODEL, "output", compile=True, **kw).peak_bytes == 2e8
    eager_only = MeasuredTables((), (_end(False, 2e-3, 4e-3, 9e8, 1.7e9),))
    assert eager_only.end(MODEL, "output", compile=True, **kw).peak_bytes == 1.7e9
    rows = [dict(shape="s", part="output", seq_len=8, tp=1, sequence_parallel=False,
                 micro_batch=1, forward_s=1.0, backward_s=2.0, activation_bytes=0.0,
                 peak_bytes=0.0, compile=c) for c in (False, True)]
    assert len({e.group for e in tables_from_rows([], rows, "p.toml").ends}) == 2


def test_a_compiled_layout_at_tp1_reads_the_compiled_loss():
    cl = _cluster(_layer(False), _layer(True), _end(False, 2e-3, 4e-3, 9e8, 1.7e9),
                  _end(True, 1e-3, 2e-3, 4e8, 2e8))
    lay = Layout(dp=4, micro_batch=1)
    eager = estimate(MODEL, cl, JOB, lay)
    comp = estimate(MODEL, cl, JOB, replace(lay, compile=True))
    both_eager_loss = estimate(MODEL, _cluster(_layer(False), _layer(True),
                                               _end(False, 2e-3, 4e-3, 9e8, 1.7e9)),
                               JOB, replace(lay, compile=True))
    # 4 micro-batches a rank, each output 1 + 2 ms faster compiled
    assert both_eager_loss.step_time_s - comp.step_time_s == pytest.approx(4 * 3e-3, rel=1e-6)
    # the peak: without a compiled output row, the eager row's bytes at the compiled loss's
    # share (kept e / 4 = 0.5 of 9e8, working e / 8 = 0.25 of 1.7e9: torch_output_bytes),
    # against the compiled row's 4e8 and 2e8
    assert both_eager_loss.memory_peak_bytes - comp.memory_peak_bytes == pytest.approx(
        (0.5 * 9e8 - 4e8) + (0.25 * 1.7e9 - 2e8), rel=1e-6)
    assert eager.step_time_s > comp.step_time_s


def test_at_tp2_the_loss_stays_eager():
    cl = _cluster(_layer(False, 2), _layer(True, 2), _end(False, 2e-3, 4e-3, 9e8, 1.7e9, 2),
                  _end(True, 1e-3, 2e-3, 4e8, 2e8, 2))
    lay = Layout(dp=2, tp=2, micro_batch=1, compile=True)
    with_row = estimate(MODEL, cl, JOB, lay)
    without = estimate(MODEL, _cluster(_layer(False, 2), _layer(True, 2),
                                       _end(False, 2e-3, 4e-3, 9e8, 1.7e9, 2)), JOB, lay)
    assert with_row.step_time_s == without.step_time_s
