"""Constraints.host_bound_margin: a host-bound layout ranks first only when predicted more
than the margin faster than a GPU-bound one (docs/planner.md, docs/benchmarks/host.md)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshplan import Cluster, Job, Layout, ModelSpec, estimate
from meshplan.costmodel.caveats import is_host_bound
from meshplan.errors import ConfigError
from meshplan.hardware_profiles.measured import (MeasuredEnd, MeasuredLayer, MeasuredTables,
                                                 ends_shape_key, layer_shape_key)
from meshplan.planner import Constraints, plan

MODEL = ModelSpec(name="m", num_layers=8, hidden_size=1024, num_heads=16, vocab_size=32000,
                  max_seq_len=1024)
JOB = Job(global_batch=16, seq_len=1024, runtime="torch")
FIXED = {"dp": 1, "pp": 1, "tp": 1, "recompute": "none", "zero": 0, "compile": False}


def _cluster(mb2_layer_s: float) -> Cluster:
    """Rows whose micro-batch 1 is host-bound (3.2 ms of CPU a layer against 2.8 ms of GPU)
    and micro-batch 2 GPU-bound (``mb2_layer_s`` of GPU, the same CPU)."""
    def layer(mb, gpu_s):
        return MeasuredLayer(shape=layer_shape_key(MODEL), seq_len=1024, tp=1,
                             sequence_parallel=False, recompute="none", micro_batch=mb,
                             forward_s=gpu_s / 3, backward_s=2 * gpu_s / 3,
                             activation_bytes=1e8, backward_peak_bytes=5e7,
                             forward_cpu_s=1.6e-3, backward_cpu_s=1.6e-3)

    def end(part, mb):
        return replace(MeasuredEnd(shape=ends_shape_key(MODEL), part=part, seq_len=1024, tp=1,
                                   sequence_parallel=False, micro_batch=mb, forward_s=1e-5,
                                   backward_s=1e-5, activation_bytes=1e6, peak_bytes=0.0),
                       forward_cpu_s=1e-5, backward_cpu_s=1e-5)
    tables = MeasuredTables((layer(1, 2.8e-3), layer(2, mb2_layer_s)),
                            tuple(end(p, mb) for p in ("embedding", "output") for mb in (1, 2)))
    c = Cluster.preset("dgx-h100", nodes=1, gpus_per_node=1)
    return replace(c, gpu=replace(c.gpu, measured=tables))


def _host_bound(c, mb) -> tuple[bool, float]:
    e = estimate(MODEL, c, JOB, Layout(micro_batch=mb))
    return is_host_bound(e.time.host_wait_s, e.step_time_s, c.gpu.corrections), e.step_time_s


@pytest.mark.parametrize("solver", ["cp-sat", "exhaustive"])
def test_a_gpu_bound_layout_within_the_margin_ranks_first(solver):
    c = _cluster(6.5e-3)
    (host1, step1), (host2, step2) = _host_bound(c, 1), _host_bound(c, 2)
    assert host1 and not host2 and step1 < step2 < step1 * 1.03   # the case: within 3 %
    cons = dict(fixed=FIXED, max_micro_batch=2)
    by_prediction = plan(MODEL, c, JOB, constraints=Constraints(host_bound_margin=0.0, **cons),
                         solver=solver)
    assert [x.layout.micro_batch for x in by_prediction.candidates] == [1, 2]
    assert "host_bound_preferred_over" not in by_prediction.stats
    robust = plan(MODEL, c, JOB, constraints=Constraints(**cons), solver=solver)   # 0.03
    assert [x.layout.micro_batch for x in robust.candidates] == [2, 1]
    assert robust.best.estimate.step_time_s == pytest.approx(step2)   # its own prediction
    assert robust.stats["host_bound_preferred_over"] == by_prediction.best.layout.short()
    assert [x.rank for x in robust.candidates] == [1, 2]


def test_a_host_bound_layout_faster_by_more_than_the_margin_stays_first():
    c = _cluster(7.0e-3)
    (host1, step1), (_, step2) = _host_bound(c, 1), _host_bound(c, 2)
    assert host1 and step2 > step1 * 1.03
    p = plan(MODEL, c, JOB, constraints=Constraints(fixed=FIXED, max_micro_batch=2))
    assert [x.layout.micro_batch for x in p.candidates] == [1, 2]


@pytest.mark.parametrize("bad", [-0.01, 1.0, True, "3 %"])
def test_the_margin_is_checked(bad):
    with pytest.raises(ConfigError, match="host_bound_margin must be a fraction in \\[0, 1\\)"):
        Constraints(host_bound_margin=bad)


def test_the_cli_passes_the_margin():
    import argparse

    from meshplan.commands.plan import add_arguments, constraints_from_args
    p = argparse.ArgumentParser()
    add_arguments(p)
    need = ["--model", "gpt3-1.3b", "--cluster", "dgx-h100", "--global-batch", "8",
            "--seq-len", "2048"]
    assert constraints_from_args(p.parse_args(need)).host_bound_margin == 0.03
    assert constraints_from_args(
        p.parse_args(need + ["--host-bound-margin", "0"])).host_bound_margin == 0.0
