"""Autocast's once-per-step weight casts (meshplan.costmodel.autocast_cast): where the term
applies, its size from the profile's numbers, and what it adds to a layout's step."""

from dataclasses import replace

import pytest

from meshplan.costmodel import autocast_cast as ac, build, estimate
from meshplan.costmodel.memory import stage_params
from meshplan.costmodel.tables import _layer_tables, layer_tables
from meshplan.hardware_profiles import Cluster
from meshplan.spec import Job, Layout, ModelSpec

MODEL = ModelSpec(name="m", num_layers=8, hidden_size=1024, num_heads=16, vocab_size=32000,
                  max_seq_len=1024)
TORCH = Job(global_batch=8, seq_len=1024, runtime="torch")
CLUSTER = Cluster.preset("dgx-h100", nodes=1, gpus_per_node=4)
DDP = Layout(dp=2, micro_batch=4)


@pytest.mark.parametrize("job, layout, applies", [
    (TORCH, DDP, True),
    (TORCH, Layout(dp=2, micro_batch=4, zero=1), True),
    (TORCH, Layout(dp=2, micro_batch=4, recompute="selective"), True),
    (TORCH, Layout(tp=2, pp=2, micro_batch=1), True),
    # FSDP2 gathers bf16 parameters: no autocast
    (TORCH, Layout(dp=2, micro_batch=4, zero=2), False),
    (TORCH, Layout(dp=2, micro_batch=4, zero=3), False),
    # full recomputation clears the cache every backward: the rows re-cast too
    (TORCH, Layout(dp=2, micro_batch=4, recompute="full"), False),
    (replace(TORCH, precision="fp32"), DDP, False),
    (replace(TORCH, precision="fp8"), DDP, False),
    (Job(global_batch=8, seq_len=1024), DDP, False),       # runtime "megatron"
])
def test_predicate(job, layout, applies):
    assert ac.autocast_casts(MODEL, job, layout) is applies
    assert (ac.layer_cast_s(MODEL, CLUSTER.gpu, job, layout) > 0) is applies
    assert (ac.head_cast_s(MODEL, CLUSTER.gpu, job, layout) > 0) is applies


def test_compiled_rows_hold_their_cast_but_the_head_still_caches():
    layout = replace(DDP, compile=True)
    eager = ac.layer_cast_s(MODEL, CLUSTER.gpu, TORCH, DDP)
    # layers priced from compiled rows: the cast is inside each call's graph, in the row
    assert ac.layer_cast_s(MODEL, CLUSTER.gpu, TORCH, layout, compiled=True) == 0.0
    # Layout.compile priced from eager rows (no compiled row): the eager cast
    assert ac.layer_cast_s(MODEL, CLUSTER.gpu, TORCH, layout) == eager > 0.0
    assert ac.head_cast_s(MODEL, CLUSTER.gpu, TORCH, layout) > 0.0


def test_size_is_six_bytes_per_cast_parameter_at_the_residual_add_rate():
    gpu = replace(CLUSTER.gpu, membound_efficiency={"residual-add": 0.8})
    layout = Layout(tp=2, micro_batch=4)
    rate = gpu.hbm_gbps * 1e9 * 0.8
    params = stage_params(MODEL, 1, 2, first=False, last=False, pp=1)
    assert ac.layer_cast_s(MODEL, gpu, TORCH, layout) == pytest.approx(params * 6 / rate)
    assert ac.head_cast_s(MODEL, gpu, TORCH, layout) == pytest.approx(
        MODEL.vocab_size * MODEL.hidden_size / 2 * 6 / rate)
    # twice the rate, half the time: the number is the profile's
    faster = replace(gpu, membound_efficiency={"residual-add": 1.6})
    assert ac.layer_cast_s(MODEL, faster, TORCH, layout) == pytest.approx(
        ac.layer_cast_s(MODEL, gpu, TORCH, layout) / 2)


@pytest.fixture(autouse=True)
def _fresh_tables():
    # the tables are cached per (model, cluster, job, layout): a patched term needs new ones
    _layer_tables.cache_clear()
    yield
    _layer_tables.cache_clear()


def _tables(monkeypatch, layout, off: bool):
    _layer_tables.cache_clear()
    if off:
        monkeypatch.setattr(build, "layer_cast_s", lambda *a, **k: 0.0)
        monkeypatch.setattr(build, "head_cast_s", lambda *a, **k: 0.0)
    return layer_tables(MODEL, CLUSTER, TORCH, layout)


@pytest.mark.parametrize("micro_batch", [4, 2, 1])
def test_effect_one_cast_per_step_spread_over_the_micro_batches(monkeypatch, micro_batch):
    layout = Layout(dp=2, micro_batch=micro_batch)
    m = layout.num_microbatches(TORCH.global_batch)
    with_cast = _tables(monkeypatch, layout, off=False)
    without = _tables(monkeypatch, layout, off=True)
    layer = ac.layer_cast_s(MODEL, CLUSTER.gpu, TORCH, layout)
    head = ac.head_cast_s(MODEL, CLUSTER.gpu, TORCH, layout)
    assert with_cast.layer_forward_s - without.layer_forward_s == pytest.approx(layer / m)
    assert with_cast.last_forward_s - without.last_forward_s == pytest.approx(head / m)
    assert with_cast.layer_backward_s == without.layer_backward_s


def test_effect_on_a_ddp_step_is_the_whole_model_cast_once(monkeypatch):
    # no pipeline: every forward is on the critical path, so the step grows by one cast of
    # every layer and the output layer, whatever the number of micro-batches
    layout = Layout(dp=2, micro_batch=2)
    after = estimate(MODEL, CLUSTER, TORCH, layout)
    monkeypatch.setattr(build, "layer_cast_s", lambda *a, **k: 0.0)
    monkeypatch.setattr(build, "head_cast_s", lambda *a, **k: 0.0)
    _layer_tables.cache_clear()
    before = estimate(MODEL, CLUSTER, TORCH, layout)
    cast = (MODEL.num_layers * ac.layer_cast_s(MODEL, CLUSTER.gpu, TORCH, layout)
            + ac.head_cast_s(MODEL, CLUSTER.gpu, TORCH, layout))
    assert after.step_time_s - before.step_time_s == pytest.approx(cast, rel=1e-6)

