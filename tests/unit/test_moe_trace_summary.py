"""benchmarks/moe_trace_summary.py on a hand-made chrome trace."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import moe_trace_summary as ts  # noqa: E402


def test_self_time_nesting_busy_time_and_categories(tmp_path):
    ev = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "ts": 0, "dur": 100,
           "pid": 1, "tid": 1},
          {"ph": "X", "cat": "cpu_op", "name": "aten::linear", "ts": 10, "dur": 30, "pid": 1, "tid": 1},
          {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 12, "dur": 20, "pid": 1, "tid": 1},
          {"ph": "X", "cat": "cpu_op", "name": "aten::item", "ts": 50, "dur": 40, "pid": 1, "tid": 1},
          {"ph": "X", "cat": "kernel", "name": "nvjet_tst_128x256", "ts": 20, "dur": 30, "pid": 0, "tid": 7},
          {"ph": "X", "cat": "kernel", "name": "void at::native::indexSelectLargeIndex", "ts": 40,
           "dur": 20, "pid": 0, "tid": 7},
          {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "ts": 55, "dur": 30,
           "pid": 1, "tid": 1}]
    ops = [e for e in ev if e["cat"] == "cpu_op"]
    assert sorted(ts.self_times(ops).values()) == [10.0, 20.0, 40.0]   # linear 30 - mm 20
    assert ts.union_us([(20, 50), (40, 60)]) == 40
    assert ts.category("nvjet_tst_128x256") == "GEMM"
    assert ts.category("ncclDevKernel_SendRecv") == "nccl"
    path = tmp_path / "trace_rank0.json"
    path.write_text(json.dumps({"traceEvents": ev}))
    text = ts.summarise(path, top=5)
    assert "ProfilerStep#3: wall 0.1 ms, GPU busy 0.0 ms (40 %)" in text
    assert "cudaStreamSynchronize" in text
