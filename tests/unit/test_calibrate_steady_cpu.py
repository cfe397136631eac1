"""Calibrate's CPU dispatch read steady on a deep stack: passes back to back as a step runs
them, where a row is host-bound (docs/benchmarks/host.md, section 6), else queued on
CPU_DEEP_LAYERS blocks as before."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

from meshplan.calibrate import bench_layers, layer_run  # noqa: E402
from meshplan.calibrate.layer_grid import Config  # noqa: E402
from meshplan.calibrate.layer_rows import cpu_fixed  # noqa: E402
from meshplan.calibrate.layer_timing import steady_cpu  # noqa: E402
from meshplan.spec import ModelSpec  # noqa: E402

from conftest import TINY_LLAMA  # noqa: E402

DEEP8 = replace(ModelSpec(**TINY_LLAMA), num_layers=8)
CPU = torch.device("cpu")


class _Recorder:
    def __init__(self):
        self.messages: list[str] = []

    def step(self, message: str) -> None:
        self.messages.append(message)

    note = step


def _cfg(model=DEEP8, **kw) -> Config:
    return Config(model=model, seq_len=32, tp=1, sequence_parallel=False, micro_batch=1, **kw)


def test_steady_cpu_counts_every_pass_but_the_first():
    calls = []
    lin = torch.nn.Linear(8, 8)
    x = torch.randn(4, 8)

    def forward():
        calls.append("f")
        return lin(x).sum()

    f, b, ratio = steady_cpu(forward, lambda y: y.backward(), lambda: None, device=CPU,
                             barrier=lambda: calls.append("barrier"), micro_batches=4)
    assert calls == ["barrier", "f", "f", "f", "f"]
    assert f > 0 and b > 0 and ratio == 0.0      # no GPU to compare with
    calls.clear()                                # warm-up passes come before the barrier
    steady_cpu(forward, lambda y: y.backward(), lambda: None, device=CPU,
               barrier=lambda: calls.append("barrier"), micro_batches=2, warmup=2)
    assert calls == ["f", "f", "barrier", "f", "f"]
    with pytest.raises(ValueError, match="micro_batches=1, at least 2"):
        steady_cpu(forward, lambda y: y.backward(), lambda: None, device=CPU,
                   barrier=lambda: None, micro_batches=1)


class _Clock:
    """perf_counter and sleep for layer_timing: forward passes advance it by the current
    window's cost, sleeps by their seconds."""
    def __init__(self):
        self.now, self.slept = 0.0, []

    def perf_counter(self):
        return self.now

    def sleep(self, seconds):
        self.slept.append(seconds)
        self.now += seconds


def test_steady_cpu_averages_windows_spread_by_the_gap(monkeypatch):
    from meshplan.calibrate import layer_timing
    clock = _Clock()
    monkeypatch.setattr(layer_timing, "time", clock)
    costs = iter([1e-3] * 3 + [1e-3] * 3 + [7e-3] * 3)   # three windows of three passes
    barriers = []

    def forward():
        clock.now += next(costs)
        return None

    def backward(y):
        clock.now += 2e-3

    f, b, ratio = steady_cpu(forward, backward, lambda: None, device=CPU,
                             barrier=lambda: barriers.append(clock.now), micro_batches=3,
                             windows=3, gap_s=0.5)
    assert f == pytest.approx(3e-3)          # the windows' mean, not their median (1 ms)
    assert b == pytest.approx(2e-3) and ratio == 0.0
    assert clock.slept == [0.5, 0.5] and len(barriers) == 3   # a barrier a window
    with pytest.raises(ValueError, match="windows=0, at least 1"):
        steady_cpu(forward, backward, lambda: None, device=CPU, barrier=lambda: None,
                   micro_batches=2, windows=0)


DEEP8_MOE = replace(DEEP8, name="tiny-moe-8", num_experts=4, experts_per_token=2,
                    moe_ffn_hidden_size=64)


@pytest.mark.parametrize("model", [DEEP8, DEEP8_MOE], ids=["dense", "moe"])
def test_calibrate_reads_host_bound_rows_in_spread_windows(monkeypatch, model):
    # the MoE model's row builds its MoE layer (moeh22's calibration stopped here once)
    seen = {}
    real = layer_run.steady_cpu

    def spy(*a, **kw):
        seen.update(kw)
        return real(*a, **{**kw, "gap_s": 0.0})
    monkeypatch.setattr(layer_run, "steady_cpu", spy)
    from meshplan.calibrate.layer_ranks import _Groups
    got = layer_run._cpu_steady(_cfg(model), None, None, 8, CPU, _Groups(1, 0, "cpu"), iters=2,
                                barrier=lambda: None, world=1, activation_bytes=0.0)[2]
    assert got is not None and all(v > 0 for v in got)
    assert seen["windows"] == layer_run.STEADY_WINDOWS > 1
    assert seen["gap_s"] == layer_run.STEADY_GAP_S > 0


@pytest.mark.parametrize("layers,cpu_s,gpu_s,zero,want", [
    (36, 4.5e-3, 2.1e-3, 0, 16),     # fp8h20's compiled fp8 row at micro-batch 1
    (10, 4.5e-3, 2.1e-3, 0, 10),     # fewer layers than CPU_STEADY_LAYERS: all of them
    (36, 2.2e-3, 2.1e-3, 0, 0),      # not host-bound by the margin: the GPU would pace it
    (4, 4.5e-3, 2.1e-3, 0, 0),       # no deeper than the queued stack
    (36, 4.5e-3, 2.1e-3, 3, 0),      # FSDP2 rows stay queued
    (36, 4.5e-3, 0.0, 0, 0),         # no GPU time measured
])
def test_which_rows_are_read_steady(layers, cpu_s, gpu_s, zero, want):
    cfg = _cfg(replace(DEEP8, num_layers=layers), zero=zero)
    assert layer_run.steady_cpu_layers(cfg, row_cpu_s=cpu_s, row_gpu_s=gpu_s) == want


def test_steady_stack_fits_counts_parameters_state_and_activations():
    cfg = _cfg()
    per_layer = layer_run.STACK_STATE_BYTES_PER_PARAM * DEEP8.layer_params() + 1000.0
    assert layer_run.steady_stack_fits(cfg, 8, 1000.0, 8 * per_layer)
    assert not layer_run.steady_stack_fits(cfg, 8, 1000.0, 8 * per_layer - 1)
    tp2 = replace(cfg, tp=2)           # a tp rank holds its share of the parameters
    assert layer_run.steady_stack_fits(tp2, 8, 1000.0, 8 * (per_layer + 1000.0) / 2)


def test_steady_stack_of_an_moe_row_counts_its_moe_layer():
    # an MoE model's rows build its MoE layer: the experts whole at ep 1, over ep at ep 2
    moe = ModelSpec.preset("mixtral-8x7b")
    cfg = replace(_cfg(), model=moe)
    layer = next(i for i in range(moe.num_layers) if moe.is_moe_layer(i))
    assert layer_run.rank_layer_params(cfg) == moe.layer_params(layer)
    ep2 = replace(cfg, ep=2)
    experts = moe.moe_mlp_params()
    assert layer_run.rank_layer_params(ep2) == moe.layer_params(layer) - experts / 2
    per_layer = layer_run.STACK_STATE_BYTES_PER_PARAM * moe.layer_params(layer) + 1000.0
    assert layer_run.steady_stack_fits(cfg, 8, 1000.0, 8 * per_layer)
    assert not layer_run.steady_stack_fits(cfg, 8, 1000.0, 8 * per_layer - 1)


def test_cpu_fixed_fits_each_sample_at_its_own_depth():
    # 1 ms a call + 1.5 ms a layer: 2.0 ms a layer on 2 blocks, 1.5625 on 16, 1.75 on 4
    steady = (2e-3, 2e-3, 1.5625e-3, 1.5625e-3, 16)
    queued = (2e-3, 2e-3, 1.75e-3, 1.75e-3)
    for samples in ([steady], [queued], [steady, queued, steady]):
        per_layer, per_call = cpu_fixed(samples, (2e-3, 2e-3), 2, 4)
        assert per_layer == pytest.approx((1.5e-3, 1.5e-3))
        assert per_call == pytest.approx((1e-3, 1e-3))


def test_the_stored_deep_reading_is_the_median_on_the_deepest_stack_read():
    """``cpu_deep_reading``: the samples read on the deepest stack (a steady 16-block one over
    the queued 4-block default), their median, and that depth; 4 where none names one."""
    from meshplan.calibrate.layer_rows import cpu_deep_reading
    steady = [(2e-3, 3e-3, 1.5e-3, 2.5e-3, 16), (2e-3, 3e-3, 1.7e-3, 2.9e-3, 16),
              (2e-3, 3e-3, 1.6e-3, 2.6e-3, 16)]
    queued = (2e-3, 3e-3, 1.75e-3, 2.75e-3)
    assert cpu_deep_reading([queued, *steady], 4) == pytest.approx((1.6e-3, 2.6e-3, 16))
    assert cpu_deep_reading([queued], 4) == pytest.approx((1.75e-3, 2.75e-3, 4))


def _host_bound_rows(monkeypatch):
    """CPU rows with CPU fields twice their (wall) time: host-bound, as queued CUDA rows of
    a small model at micro-batch 1 read."""
    real = layer_run._measure

    def measure(*a, **kw):
        samples, out = real(*a, **kw)
        return [replace(s, forward_cpu_s=2 * s.forward_s, backward_cpu_s=2 * s.backward_s)
                for s in samples], out
    monkeypatch.setattr(layer_run, "_measure", measure)
    monkeypatch.setattr(layer_run, "STEADY_GAP_S", 0.0)     # the windows, without the waits


def test_host_bound_rows_are_read_steady_on_the_deep_stack(monkeypatch):
    _host_bound_rows(monkeypatch)
    prog = _Recorder()
    layers = bench_layers.bench_layer_rows([DEEP8], None, CPU, 1, 0, quick=False,
                                           progress=prog, micro_batches=(1, 2)).layers
    steady = [m for m in prog.messages if "cpu steady on 8 blocks" in m]
    assert len(steady) == 3 and all("mb1" in m for m in steady)   # one per recompute mode
    assert all(re.search(r"cpu steady on 8 blocks [\d.]+ / [\d.]+ ms", m) for m in steady)
    assert not any("cpu on 4 blocks" in m for m in prog.messages)
    fields = ("forward_cpu_s", "backward_cpu_s", "forward_cpu_fixed_s", "backward_cpu_fixed_s")
    assert all(r[k] >= 0 for r in layers for k in fields)
    for rc in ("none", "selective", "full"):   # the 2-block call's total is unchanged
        rows = [r for r in layers if r["recompute"] == rc]
        totals = {round(2 * r["forward_cpu_s"] + r["forward_cpu_fixed_s"], 12) for r in rows}
        assert len(totals) == 1 and totals.pop() > 0


def test_no_room_for_the_deep_stack_falls_back_to_the_queued_one(monkeypatch):
    _host_bound_rows(monkeypatch)
    monkeypatch.setattr(layer_run, "allocatable_bytes", lambda device: 0.0)
    built = []
    real = layer_run._build
    monkeypatch.setattr(layer_run, "_build",
                        lambda cfg, n, *a: built.append(n) or real(cfg, n, *a))
    prog = _Recorder()
    bench_layers.bench_layer_rows([DEEP8], None, CPU, 1, 0, quick=False, progress=prog,
                                  micro_batches=(1,))
    fell_back = [m for m in prog.messages if "cpu on 4 blocks" in m]
    assert len(fell_back) == 3
    assert all("(not steady on 8: GPU-paced or no room)" in m for m in fell_back)
    assert 8 not in built                    # nothing was built that could not fit


# ---- two tensor-parallel ranks (gloo): every rank takes the same steady decisions -----------
def _steady_tp_worker(rank: int, world: int, init: str, out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    from meshplan.calibrate import layer_run
    from meshplan.calibrate.layer_ranks import _Groups
    from _gloo import write_rank_result
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    cfg = Config(model=DEEP8, seq_len=32, tp=2, sequence_parallel=False, micro_batch=1)
    groups = _Groups(world, rank, "cpu")
    cpu = torch.device("cpu")
    layer_run.STEADY_GAP_S = 0.0          # a spawned process: its own module, nothing shared
    out = {}
    for case, room in (("room", float("inf")), ("rank1_full", 0.0 if rank == 1 else 1e18)):
        layer_run.allocatable_bytes = lambda device, room=room: room
        key, module, got = layer_run._cpu_steady(cfg, None, None, 8, cpu, groups, iters=2,
                                                 barrier=dist.barrier, world=world,
                                                 activation_bytes=0.0)
        out[case] = {"got": got, "built": module is not None, "key": list(map(str, key or ()))}
    write_rank_result(out_dir, rank, out)


@pytest.mark.distributed
def test_steady_reading_agrees_over_tensor_parallel_ranks(tmp_path):
    from _gloo import run_gloo_ranks
    got = run_gloo_ranks(_steady_tp_worker, 2, tmp_path)
    # with room: both ranks read (averaged over ranks: the same values on each)
    assert got[0]["room"]["got"] == got[1]["room"]["got"]
    assert all(v > 0 for v in got[0]["room"]["got"])
    # one rank without room: neither builds nor reads (no rank left in a collective alone)
    assert got[0]["rank1_full"] == got[1]["rank1_full"] == {"got": None, "built": False,
                                                            "key": []}
