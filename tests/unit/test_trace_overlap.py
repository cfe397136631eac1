"""benchmarks/trace_overlap.py on a synthetic Chrome trace."""

import json

import pytest


@pytest.fixture(scope="module")
def tool(load_benchmark):
    return load_benchmark("trace_overlap")


def _k(name, ts, dur, cat="kernel"):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": 7}


def test_busy_idle_overlap_and_slowdown(tool, tmp_path):
    events = [
        _k("gemm", 0, 100), _k("gemm", 100, 100),          # alone: 100 µs each
        _k("gemm", 300, 120),                               # under NCCL: 20 % slower
        _k("ncclDevKernel_SendRecv", 250, 200),             # 250-450
        _k("Memcpy DtoD", 500, 50, cat="gpu_memcpy"),
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 999},   # not GPU
    ]
    trace = tmp_path / "trace_rank0.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    s = tool.summarize(tool.load_kernels(trace), steps=1)
    assert s["span_s"] == pytest.approx(550e-6)
    assert s["compute_busy_s"] == pytest.approx(370e-6)     # 0-200, 300-420, 500-550
    assert s["nccl_busy_s"] == pytest.approx(200e-6)
    assert s["overlap_s"] == pytest.approx(120e-6)
    assert s["compute_idle_s"] == pytest.approx(180e-6)
    assert s["slowdown_with_nccl"] == pytest.approx(1.2)
    # per step
    assert tool.summarize(tool.load_kernels(trace), steps=2)["span_s"] == pytest.approx(275e-6)


def test_a_trace_without_gpu_kernels_is_a_clear_error(tool, tmp_path):
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps([{"ph": "X", "cat": "cpu_op", "name": "x", "ts": 0, "dur": 1}]))
    with pytest.raises(ValueError, match="no GPU kernels"):
        tool.summarize(tool.load_kernels(trace))
