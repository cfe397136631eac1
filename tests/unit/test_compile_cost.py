"""Layout.compile in the cost model, the planner and calibrate's compiled rows."""

import argparse
from dataclasses import replace

import pytest

from meshplan.calibrate.bench_layers import Config, layer_row, plan_grid
from meshplan.commands.calibrate import add_arguments, child_argv
from meshplan.costmodel import estimate
from meshplan.costmodel.caveats import COMPILE_AS_EAGER_CAVEAT
from meshplan.costmodel.measured import (MeasuredLayer, MeasuredTables, layer_shape_key,
                                         tables_from_rows)
from meshplan.errors import ProfileError
from meshplan.hardware_profiles import Cluster
from meshplan.hardware_profiles.calibrated import pool_cpu_fixed
from meshplan.planner.space import compile_options
from meshplan.spec import Job, Layout, ModelSpec

MODEL = ModelSpec(name="m", num_layers=8, hidden_size=1024, num_heads=16, vocab_size=32000,
                  max_seq_len=1024)
JOB = Job(global_batch=16, seq_len=1024, runtime="torch")


def _row(compile, fwd, bwd, **kw):
    return MeasuredLayer(**{**dict(
        shape=layer_shape_key(MODEL), seq_len=1024, tp=1, sequence_parallel=False,
        recompute="none", micro_batch=1, forward_s=fwd, backward_s=bwd,
        activation_bytes=1e8, backward_peak_bytes=1e7, compile=compile), **kw})


def _cluster(*rows):
    c = Cluster.preset("dgx-h100", nodes=1, gpus_per_node=4)
    return replace(c, gpu=replace(c.gpu, measured=MeasuredTables(tuple(rows), ())))


def test_compiled_rows_price_compiled_layouts_eager_rows_the_rest():
    cl = _cluster(_row(False, 2e-3, 4e-3), _row(True, 1.5e-3, 3e-3, activation_bytes=9e7))
    eager = estimate(MODEL, cl, JOB, Layout(dp=4, micro_batch=1))
    comp = estimate(MODEL, cl, JOB, Layout(dp=4, micro_batch=1, compile=True))
    m = 16 // 4
    # 8 layers × 4 micro-batches × (fwd + bwd) saved, nothing else moves
    assert eager.step_time_s - comp.step_time_s == pytest.approx(8 * m * 1.5e-3, rel=1e-6)
    assert COMPILE_AS_EAGER_CAVEAT not in comp.caveats
    assert comp.memory[0].activations_bytes < eager.memory[0].activations_bytes   # the row's own bytes


def test_without_a_compiled_row_compile_is_priced_as_eager_and_says_so():
    cl = _cluster(_row(False, 2e-3, 4e-3))
    eager = estimate(MODEL, cl, JOB, Layout(dp=4, micro_batch=1))
    comp = estimate(MODEL, cl, JOB, Layout(dp=4, micro_batch=1, compile=True))
    assert comp.step_time_s == eager.step_time_s and COMPILE_AS_EAGER_CAVEAT in comp.caveats
    datasheet = Cluster.preset("dgx-h100", nodes=1, gpus_per_node=4)
    assert COMPILE_AS_EAGER_CAVEAT in estimate(MODEL, datasheet, JOB,
                                               Layout(dp=4, compile=True)).caveats
    # FSDP2 layers come from eager FSDP rows even where a compiled plain row exists
    fsdp = _cluster(_row(False, 2e-3, 4e-3), _row(True, 1e-3, 2e-3),
                    _row(False, 2.5e-3, 5e-3, zero=3, dp=4))
    assert COMPILE_AS_EAGER_CAVEAT in estimate(MODEL, fsdp, JOB, Layout(
        dp=4, micro_batch=1, zero=3, compile=True)).caveats


def test_compile_is_part_of_a_rows_key_and_checked():
    rows = [dict(shape="s", seq_len=8, tp=1, sequence_parallel=False, recompute="none",
                 micro_batch=1, forward_s=1.0, backward_s=2.0, activation_bytes=0.0,
                 backward_peak_bytes=0.0, compile=c) for c in (False, True)]
    t = tables_from_rows(rows, [], "p.toml")
    assert t.has_compiled and len({r.group for r in t.layers}) == 2
    assert not tables_from_rows(rows[:1], [], "p.toml").has_compiled
    with pytest.raises(ProfileError, match="compile must be true or false, got 'yes'"):
        tables_from_rows([{**rows[0], "compile": "yes"}], [], "p.toml")


def test_planner_searches_compile_only_with_compiled_rows():
    assert compile_options(_cluster(_row(False, 1e-3, 2e-3)), {}) == [False]
    assert compile_options(_cluster(_row(True, 1e-3, 2e-3)), {}) == [False, True]
    assert compile_options(Cluster.preset("dgx-h100", nodes=1), {"compile": True}) == [True]
    from meshplan.planner.plan import plan
    cl = _cluster(_row(False, 2e-3, 4e-3), _row(True, 1e-3, 2e-3))
    p = plan(MODEL, cl, JOB, top_k=3)
    assert p.best.layout.compile                    # the faster rows win where they apply


def test_calibrate_grid_adds_compiled_plain_rows_for_the_chosen_modes():
    tiny = ModelSpec(name="t", num_layers=2, hidden_size=64, num_heads=4, vocab_size=128,
                     max_seq_len=32)
    base = plan_grid([tiny], 32, 2, quick=True)
    grid = plan_grid([tiny], 32, 2, quick=True, compile_rows=("none",))
    extra = [c for c in grid if c.compile]
    assert len(grid) - len(base) == len(extra) > 0
    assert {(c.recompute, c.zero, c.part) for c in extra} == {("none", 0, "")}
    assert {(c.tp, c.sequence_parallel, c.micro_batch) for c in extra} == {
        (c.tp, c.sequence_parallel, c.micro_batch) for c in base
        if not c.part and c.zero == 0 and c.recompute == "none"}
    cfg = extra[0]
    assert cfg.build_key != replace(cfg, compile=False).build_key and "compiled" in cfg.label()
    assert layer_row(cfg, (1e-3, 2e-3, 1e6, 2e6))["compile"] is True


def test_compiled_rows_pool_their_cpu_part_apart():
    row = dict(shape="s", forward_cpu_s=1e-3, backward_cpu_s=2e-3, forward_cpu_fixed_s=0.0,
               backward_cpu_fixed_s=0.0)
    eager = [{**row, "tp": 1, "forward_cpu_fixed_s": 1e-3}, {**row, "tp": 2,
                                                               "forward_cpu_fixed_s": 1e-3}]
    comp = {**row, "tp": 1, "compile": True}
    pooled = pool_cpu_fixed([*eager, comp])
    assert pooled[2]["forward_cpu_fixed_s"] == 0.0      # not the eager rows' median


def test_calibrate_cli_compile_rows_and_no_fp8_reach_the_children():
    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(["--compile-rows", "--no-fp8", "--nproc", "4"])
    assert args.compile_rows == ("none",)
    again = p.parse_args(child_argv(args)[1:])
    assert again.compile_rows == ("none",) and again.no_fp8
    assert p.parse_args(["--compile-rows", "none,full"]).compile_rows == ("none", "full")
    with pytest.raises(SystemExit):
        p.parse_args(["--compile-rows", "some"])
    assert "--compile-rows" not in child_argv(p.parse_args([]))
