"""The sustained clock at a step's duty cycle: ``clock.duty_scale`` (the power
limiter's average, P ∝ f^k) and the estimate's second pass that prices a step which idles
its GPU part of the time at the clock that leaves it."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from meshplan.costmodel import estimate
from meshplan.costmodel.clock import SUSTAINED_CLOCK, SUSTAINED_DUTY, duty_scale
from meshplan.costmodel.measured import MeasuredTables
from meshplan.hardware_profiles import Cluster
from meshplan.hardware_profiles.calibrated import apply_profile
from meshplan.hardware_profiles.corrections import NUMBER_KEYS, builtin_corrections
from meshplan.spec import Job, Layout, ModelSpec, default_stage_layers

from test_sustained_clock import MODEL, _tables

ROOT = Path(__file__).resolve().parents[2]


def test_duty_scale_is_the_power_limiters_average():
    n = builtin_corrections()
    k, p = n.sustained_power_exponent, n.sustained_idle_power_share
    assert (k, p) == (2.5, 0.116)          # the probe's, in data/corrections.toml
    assert duty_scale(n) == 1.0            # a GPU busy back to back: the ratio as measured
    at = replace(n, step_duty=0.67)
    # P(f) = (cap − 0.33 · P_idle) / 0.67 while busy, P ∝ f^k
    assert duty_scale(at) == pytest.approx((0.67 / (1 - 0.33 * 0.116)) ** (1 / 2.5))
    assert duty_scale(replace(n, step_duty=0.9)) > duty_scale(at)
    assert duty_scale(at.without(SUSTAINED_DUTY)) == 1.0
    # an estimate's state, not a number a profile holds or writes
    assert "step_duty" not in NUMBER_KEYS and "step_duty" not in n.to_table()


def test_rows_read_their_ratio_times_the_scale_never_below_the_burst():
    t = _tables(1.1)
    kw = dict(seq_len=1024, tp=1, sequence_parallel=False, recompute="none", micro_batch=2)
    burst = t.at_share(0.0).layer(MODEL, **kw).forward_s
    assert t.at_share(1.0, 0.95).layer(MODEL, **kw).forward_s == pytest.approx(
        burst * 1.1 * 0.95)
    assert t.at_share(0.6, 0.95).layer(MODEL, **kw).forward_s == pytest.approx(
        burst * (1 + 0.6 * (1.1 * 0.95 - 1)))
    # a scale that leaves less than the burst clock: the rows as timed
    assert t.at_share(1.0, 0.85).layer(MODEL, **kw).forward_s == pytest.approx(burst)
    assert t.at_share(1.0, 0.85).without_shape("x").duty_scale == 0.85
    assert isinstance(t.at_share(1.0, 0.85), MeasuredTables)


def _round43(name: str):
    doc = json.loads((ROOT / "docs/benchmarks/data/transfer43_accuracy.json").read_text())
    r = next(r for r in doc["records"] if r["name"] == name)
    model = ModelSpec.from_dict(json.loads(
        (ROOT / "benchmarks/sets/transfer43/models" / f"{r['model']}.json").read_text()))
    cluster = apply_profile(Cluster.preset("dgx-h200", nodes=1, gpus_per_node=2),
                            str(ROOT / doc["profiles"][r["model"]]))
    return model, cluster, Job.from_dict(doc["jobs"][r["model"]]), Layout(**r["layout"])


def _without(cluster, name):
    g = cluster.gpu
    return cluster.replace(gpu=replace(g, corrections=g.corrections.without(name)))


def test_a_pipelined_step_is_priced_nearer_the_burst_clock_than_a_busy_one():
    """Round 43 (2 × H200, rows with sustained ratios): y06 (t43m01, pp 2 interleaved, two
    micro-batches: the GPU idles through the bubble, its busiest rank busy ~76 % of the
    step) loses most of the sustained clock's excess, y03 (the same model at dp 2, busy
    ~93 %) under a third of it."""
    moved = {}
    for name in ("y06", "y03"):
        model, cluster, job, lay = _round43(name)
        est = estimate(model, cluster, job, lay)
        full = estimate(model, _without(cluster, SUSTAINED_DUTY), job, lay)
        burst = estimate(model, _without(cluster, SUSTAINED_CLOCK), job, lay)
        assert burst.step_time_s <= est.step_time_s < full.step_time_s
        names = [c.name for c in est.corrections]
        assert SUSTAINED_CLOCK in names and SUSTAINED_DUTY in names
        duty = next(c for c in est.corrections if c.name == SUSTAINED_DUTY)
        assert duty.step_time_delta_s == pytest.approx(est.step_time_s - full.step_time_s,
                                                       rel=1e-6)
        assert duty.memory_delta_bytes == 0.0
        moved[name] = (full.step_time_s - est.step_time_s) / (full.step_time_s
                                                             - burst.step_time_s)
    assert moved["y06"] > 0.8 and 0.0 < moved["y03"] < 0.4


def test_profiles_without_ratios_are_priced_once_and_unchanged():
    model, _, job, lay = _round43("y10")
    c = Cluster.preset("dgx-h200", nodes=1, gpus_per_node=2)
    est = estimate(model, c, job, lay)
    assert est.step_time_s == estimate(model, _without(c, SUSTAINED_DUTY), job, lay).step_time_s
    assert SUSTAINED_DUTY not in [x.name for x in est.corrections]


@pytest.mark.parametrize("name", ["y06", "y10", "y12", "y22", "y23", "y01", "y09", "y13"])
def test_the_planner_prices_a_configuration_at_its_duty_and_bounds_it_at_the_burst(name):
    """The search's tables price the step as ``estimate`` does (the even partition's duty;
    round 43's layouts run the even one) and its lower bounds stay under it."""
    from meshplan.planner.search import time_lower_bound
    from meshplan.planner.tables import bound_cluster, build_tables
    model, cluster, job, lay = _round43(name)
    from meshplan.planner.space import Config
    cfg = Config.of(lay)
    est = estimate(model, cluster, job, lay)
    t = build_tables(model, cluster, job, cfg)
    part = default_stage_layers(model.num_layers, cfg.stages)
    assert t.step_time_s(part) == pytest.approx(est.step_time_s, rel=2e-3)
    full = estimate(model, _without(cluster, SUSTAINED_DUTY), job, lay)
    assert time_lower_bound(model, bound_cluster(cluster), job, cfg, 1) <= est.step_time_s
    assert time_lower_bound(model, bound_cluster(cluster), job, cfg, 1) <= \
        time_lower_bound(model, cluster, job, cfg, 1) <= full.step_time_s * (1 + 1e-9)
