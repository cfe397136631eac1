"""calibrate.timing.time_fn's queued mode and benchmarks/queued_microbench_gpu.py on CPU
(wiring: the spin exists on CUDA only, where a queued call is timed behind it)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from meshplan.calibrate import bench_compute  # noqa: E402
from meshplan.calibrate.shapes import GemmShape  # noqa: E402
from meshplan.calibrate.timing import time_fn  # noqa: E402


def test_queued_on_cpu_times_the_call_as_synchronized():
    calls = []
    t = time_fn(lambda: calls.append(1), device="cpu", warmup=2, iters=5, queued=True)
    assert t.iters == 5 and len(calls) == 7 and t.median_s >= 0.0


def test_benches_take_the_queued_switch():
    dev = torch.device("cpu")
    g = bench_compute.bench_gemm(GemmShape(label="t", m=32, k=16, n=8), dev, queued=True)
    assert g["seconds"] > 0 and (g["m"], g["k"], g["n"]) == (32, 16, 8)
    rows = bench_compute.bench_membound(2 ** 14, dev, queued=True)
    assert {r["op"] for r in rows} >= {"layernorm", "residual-add", "gelu", "swiglu", "adamw"}
    # calibrate's own set has no as-run ops (no profile key reads them)
    assert "rope" not in {r["op"] for r in rows}
    as_run = bench_compute.bench_membound(2 ** 14, dev, as_run=True)
    assert [r["op"] for r in as_run].count("layernorm") == 1 and "rope" in {
        r["op"] for r in as_run}
    assert all(r["seconds"] > 0 for r in rows)
    sized = bench_compute.bench_membound(2 ** 14, dev, optimizer_numel=2 ** 15)
    assert [r["elements"] for r in sized if r["op"] == "adamw"] == [2 ** 15]
    assert {r["elements"] for r in sized if r["op"] != "adamw"} == {2 ** 14}


def test_script_writes_both_modes(tmp_path):
    import queued_microbench_gpu as qm
    assert qm.main(["--out", str(tmp_path), "--device", "cpu", "--quick"]) == 0
    doc = json.loads((tmp_path / "queued_microbench.json").read_text())
    assert set(doc["modes"]) == {"sync", "queued"}
    for mode in doc["modes"].values():
        assert mode["rows"]["gemm"] and mode["rows"]["attention"] and mode["rows"]["membound"]
        # the executor's LayerNorm and RoPE as its step runs them
        ops = {r["op"] for r in mode["rows"]["membound"]}
        assert {"layernorm", "rope", "residual-add"} <= ops
    # the same shapes both ways, in the same order
    sync, queued = (doc["modes"][m]["rows"]["gemm"] for m in ("sync", "queued"))
    assert [(r["m"], r["k"], r["n"]) for r in sync] == [(r["m"], r["k"], r["n"]) for r in queued]


class _FakeEvent:
    """torch.cuda.Event stand-in: elapsed_time 2 ms; query() answers from a shared script
    (True: the GPU reached the start event before the CPU had queued everything)."""

    script: list[bool] = []

    def __init__(self, enable_timing=True):
        self.recorded = False

    def record(self):
        self.recorded = True

    def query(self):
        return _FakeEvent.script.pop(0) if _FakeEvent.script else False

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return 2.0


def _fake_cuda(monkeypatch, timing) -> list[int]:
    """torch.cuda without a GPU for ``timing``: events from :class:`_FakeEvent`, a spin
    rate of 1e9 cycles a second; returns the list each spin's cycles are appended to."""
    spins: list[int] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: spins.append(cycles),
                        raising=False)
    monkeypatch.setattr(timing, "spin_rate", lambda device: 1e9)
    return spins


def test_queued_timing_spins_and_retries_behind_a_longer_spin(monkeypatch):
    """The queued path without a GPU: a spin before each timed call, sized from the
    warm-up; a call the GPU caught up with is timed again behind a spin three times as
    long; the samples are the events' times."""
    import meshplan.calibrate.timing as timing
    spins: list[int] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: spins.append(cycles),
                        raising=False)
    monkeypatch.setattr(timing, "spin_rate", lambda device: 1e9)     # cycles per second
    _FakeEvent.script = [False, True, False, False]                  # the 2nd call caught up
    calls = []
    t = timing.time_fn(lambda: calls.append(1), device="cuda", warmup=2, iters=3, queued=True)
    assert t.iters == 3 and t.median_s == pytest.approx(2e-3)
    assert len(calls) == 2 + 4                   # warm-up, three samples and one retry
    assert len(spins) == 4
    # the spin after the caught-up call is three times the one before it
    assert spins[2] == pytest.approx(3 * spins[1], rel=1e-6)
    # sized from the warm-up's synchronized wall time: at least 1 ms at 1e9 cycles/s
    assert spins[0] >= 1e6
    _FakeEvent.script = []


def test_queued_split_retries_behind_longer_spins_and_keeps_the_cpu_seconds(monkeypatch):
    """time_queued_split shares time_fn's queued call: a call the GPU caught up with is
    timed again behind a spin three times as long (until SPIN_MAX_S, where it is kept and
    marked not queued); each sample has the events' GPU time and the call's own CPU time."""
    import meshplan.calibrate.timing as timing
    spins = _fake_cuda(monkeypatch, timing)
    _FakeEvent.script = [True, False, False, False]                  # the first caught up
    calls = []
    gpu_s, cpu_s = timing.time_queued_split(lambda: calls.append(1), device="cuda", iters=3)
    assert gpu_s == pytest.approx(2e-3) and 0 <= cpu_s < 0.05
    assert len(calls) == 1 + 4 and len(spins) == 4  # the sizing call, one retry, 3 samples
    assert spins[1] == pytest.approx(3 * spins[0], rel=1e-6)
    # never queued, even behind the longest spin: kept, and split_medians leaves it out
    # only where another sample queued
    _FakeEvent.script = [True] * 40
    spins.clear()
    gpu_s, _ = timing.time_queued_split(lambda: None, device="cuda", iters=2)
    assert gpu_s == pytest.approx(2e-3)
    assert max(spins) == pytest.approx(timing.SPIN_MAX_S * 1e9, rel=1e-6)
    _FakeEvent.script = []


def test_queued_spin_is_sized_from_the_last_warm_up_call(monkeypatch):
    """A first call that does one-time work (kernel loading: 60 s once on an H200 in
    `calibrate --quick --queued-microbench`) must not size the spin: every sample used to
    wait behind SPIN_MAX_S, 50 samples × 2 s for one attention size."""
    import time as _time

    import meshplan.calibrate.timing as timing
    spins = _fake_cuda(monkeypatch, timing)
    _FakeEvent.script = []
    calls = []

    def fn():
        if not calls:
            _time.sleep(0.2)                      # the one-time first call
        calls.append(1)

    timing.time_fn(fn, device="cuda", warmup=3, iters=3, queued=True)
    assert len(spins) == 3
    # 1.5 × a fast call + 1 ms, not 1.5 × 0.2 s
    assert max(spins) < 0.05e9


def test_queued_sampling_stops_at_its_wall_bound(monkeypatch):
    """With spins far longer than the timed calls, sampling stops after its wall bound
    (WALL_BUDGET_FACTOR × budget_s), not after max_iters spins."""
    import meshplan.calibrate.timing as timing
    clock = [0.0]
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)

    def sleep(cycles):                            # the spin advances the fake clock
        clock[0] += cycles / 1e9
    monkeypatch.setattr(torch.cuda, "_sleep", sleep, raising=False)
    monkeypatch.setattr(timing, "spin_rate", lambda device: 1e9)
    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock[0])

    def fn():
        clock[0] += 0.1                           # a 0.1 s dispatch: a 0.151 s spin
    _FakeEvent.script = []
    t = timing.time_fn(fn, device="cuda", warmup=2, budget_s=0.05, max_iters=50, queued=True)
    # each sample's events read 2 ms (the fake); wall per sample ≈ 0.25 s: 1 s bound
    assert 3 <= t.iters <= 5
