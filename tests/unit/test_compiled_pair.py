"""A compiled layer whose recompute mode has no compiled row: its eager row moved by another
mode's compiled/eager pair (costmodel.compiled_rows.compiled_from_pair)."""

from dataclasses import replace

import pytest

from meshplan.costmodel import estimate
from meshplan.costmodel.caveats import COMPILE_AS_EAGER_CAVEAT
from meshplan.costmodel.compiled_rows import (PAIR_MODES, compiled_from_pair, copies_at,
                                              row_weight_copies)
from meshplan.costmodel.measured import MeasuredLayer, MeasuredTables, layer_shape_key
from meshplan.hardware_profiles import Cluster
from meshplan.spec import Job, Layout, ModelSpec

MODEL = ModelSpec(name="m", num_layers=8, hidden_size=1024, num_heads=16, vocab_size=32000,
                  max_seq_len=1024)
JOB = Job(global_batch=16, seq_len=1024, runtime="torch")
AT = dict(seq_len=1024, tp=1, sequence_parallel=False, micro_batch=1)


def _row(recompute, compile, fwd, bwd, act, **kw):
    return MeasuredLayer(**{**dict(
        shape=layer_shape_key(MODEL), seq_len=1024, tp=1, sequence_parallel=False,
        recompute=recompute, micro_batch=1, forward_s=fwd, backward_s=bwd,
        activation_bytes=act, backward_peak_bytes=4e7, compile=compile), **kw})


def _tables(*rows):
    return MeasuredTables(tuple(rows), ())


def _cluster(*rows):
    c = Cluster.preset("dgx-h100", nodes=1, gpus_per_node=4)
    return replace(c, gpu=replace(c.gpu, measured=_tables(*rows)))


W = row_weight_copies(MODEL, 1, "selective")     # a compiled selective block's weight copies
EAGER_NONE = _row("none", False, 2e-3, 4e-3, 3e8, forward_cpu_s=1e-3, backward_cpu_s=2e-3)
PAIR = (_row("selective", False, 2.2e-3, 5e-3, 2e8, forward_cpu_s=1.2e-3, backward_cpu_s=2e-3),
        _row("selective", True, 1.1e-3, 3e-3, 1e8 + W, forward_cpu_s=0.6e-3,
             backward_cpu_s=1e-3))


def test_the_eager_row_moves_by_the_other_modes_ratios():
    tables = _tables(EAGER_NONE, *PAIR)
    eager = tables.layer(MODEL, recompute="none", **AT)
    row, source = compiled_from_pair(tables, MODEL, eager, recompute="none", **AT)
    assert row.forward_s == pytest.approx(2e-3 * 1.1 / 2.2)
    assert row.backward_s == pytest.approx(4e-3 * 3 / 5)
    # the CPU dispatch stays the eager row's: no other mode's ratio carries it
    assert (row.forward_cpu_s, row.backward_cpu_s) == (1e-3, 2e-3)
    # kept: the eager row's bytes by the pair's ratio beside its weight copies, plus this
    # mode's copies (recompute none keeps them too)
    assert row.activation_bytes == pytest.approx(3e8 * 1e8 / 2e8 + copies_at(MODEL, 1, 1,
                                                                              "none"))
    assert "recompute none moved by the compiled/eager rows at recompute selective" in source


def test_the_nearest_mode_with_both_rows_is_taken_and_none_without():
    full = (_row("full", False, 3e-3, 8e-3, 1e7), _row("full", True, 1.5e-3, 4e-3, 1e7))
    tables = _tables(EAGER_NONE, *full)
    eager = tables.layer(MODEL, recompute="none", **AT)
    row, source = compiled_from_pair(tables, MODEL, eager, recompute="none", **AT)
    assert PAIR_MODES["none"] == ("selective", "full") and "recompute full" in source
    assert row.forward_s == pytest.approx(1e-3)
    # a mode with only its eager row is no pair
    assert compiled_from_pair(_tables(EAGER_NONE, PAIR[0]), MODEL, eager, recompute="none",
                              **AT) is None


def test_the_estimate_prices_the_derived_row_and_names_it():
    cl = _cluster(EAGER_NONE, *PAIR)
    lay = Layout(dp=4, micro_batch=1)
    eager = estimate(MODEL, cl, JOB, lay)
    comp = estimate(MODEL, cl, JOB, replace(lay, compile=True))
    assert comp.step_time_s < eager.step_time_s
    assert COMPILE_AS_EAGER_CAVEAT not in comp.caveats
    assert any(c.startswith("compile = True priced from the eager row at recompute none")
               for c in comp.caveats)
    # without the pair: priced as eager, as before, and said so
    alone = estimate(MODEL, _cluster(EAGER_NONE, PAIR[0]), JOB, replace(lay, compile=True))
    assert COMPILE_AS_EAGER_CAVEAT in alone.caveats
    # a timed compiled row at the mode wins over any derivation
    timed = _row("none", True, 0.5e-3, 1e-3, 1e8)
    own = estimate(MODEL, _cluster(EAGER_NONE, timed, *PAIR), JOB, replace(lay, compile=True))
    assert not any("moved by the compiled/eager rows" in c for c in own.caveats)


def test_the_planner_searches_compile_where_a_pair_carries_it():
    from meshplan.planner.space import compiled_settings
    # eager rows at none and selective, the pair at selective: none is searched compiled too
    cl = _cluster(EAGER_NONE, *PAIR)
    assert compiled_settings(cl, MODEL, 1024) == {(1, False, "selective"), (1, False, "none")}
    # a compiled row without its eager twin is no pair: only its own mode
    assert compiled_settings(_cluster(EAGER_NONE, PAIR[1]), MODEL, 1024) == {
        (1, False, "selective")}
    # no eager row at full: full is not searched compiled
    assert (1, False, "full") not in compiled_settings(cl, MODEL, 1024)
