"""Garbage-collection control around the timed steps (meshplan/executor/gc_control.py)."""

import gc

import pytest

from meshplan.errors import ExecutorError
from meshplan.executor.gc_control import GcPolicy, GcWatch, gc_across_ranks

# the freeze counts checked here are the library's own: nothing frozen by tests/conftest.py
pytestmark = pytest.mark.gc_unfrozen


def _cycle():
    a: list = []
    a.append(a)   # a reference cycle: only the collector frees it


def test_watch_counts_collections_only_while_on():
    w = GcWatch()
    gc.collect(0)          # before start: not counted
    w.start()
    gc.collect(0)
    gc.collect(2)
    w.stop()
    gc.collect(1)          # after stop: not counted
    s = w.summary()
    assert [s[g]["count"] for g in ("gen0", "gen1", "gen2")] == [1, 0, 1]
    assert s["gen2"]["max_ms"] >= 0 and s["gen2"]["total_ms"] >= s["gen2"]["max_ms"]
    assert w._callback not in gc.callbacks


def test_manual_mode_disables_collector_and_collects_on_period():
    assert gc.isenabled()
    p = GcPolicy("manual", period_steps=3)
    p.begin_measure()
    try:
        assert not gc.isenabled() and gc.get_freeze_count() > 0
        for _ in range(7):
            p.in_step()
            for _ in range(2000):
                _cycle()      # would trigger automatic gen-0 collections if it were on
    finally:
        p.end()
    s = p.summary()
    assert s["mode"] == "manual" and s["gen1"]["count"] == 2 and s["gen0"]["count"] == 0
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_auto_mode_leaves_collector_on():
    p = GcPolicy("auto")
    p.begin_measure()
    try:
        assert gc.isenabled()
        for _ in range(5000):
            _cycle()
    finally:
        p.end()
    assert p.summary()["gen0"]["count"] >= 1


def test_bad_mode_and_period_are_named():
    with pytest.raises(ExecutorError, match="--gc 'off'.*auto, manual"):
        GcPolicy("off")
    with pytest.raises(ExecutorError, match="--gc-period 0"):
        GcPolicy("manual", period_steps=0)


def test_across_ranks_takes_the_busiest_rank():
    a, b = GcPolicy("auto"), GcPolicy("auto")
    a.watch.counts[2], a.watch.max_s[2] = 1, 0.1
    b.watch.counts[0], b.watch.total_s[0] = 5, 0.002
    out = gc_across_ranks([a.summary(), b.summary()])
    assert out["mode"] == "auto" and out["gen2"]["count"] == 1
    assert out["gen2"]["max_ms"] == pytest.approx(100) and out["gen0"]["count"] == 5
    assert gc_across_ranks([]) == {}


def test_gc_paused_block_restores_collector():
    from meshplan.executor.gc_control import gc_paused
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled() and gc.get_freeze_count() > 0
        gc.collect()     # explicit collections still allowed
    assert gc.isenabled() and gc.get_freeze_count() == 0
    with pytest.raises(RuntimeError):
        with gc_paused():
            raise RuntimeError("boom")
    assert gc.isenabled() and gc.get_freeze_count() == 0
