"""benchmarks/dispatch_depth_gpu.py on CPU (``--tiny``): every (setting, depth) is read in
each round, and both splits of the per-layer dispatch come out."""

import json

import pytest

pytest.importorskip("torch")


def test_dispatch_depth_reads_every_depth_each_round(load_benchmark, tmp_path):
    tool = load_benchmark("dispatch_depth_gpu")
    out = tmp_path / "dd.json"
    model = tool.ROOT / "benchmarks" / "sets" / "fp8h20" / "m01.json"
    assert tool.main(["--model", f"{model}:2048", "--tiny",
                      "--settings", "bf16:none", "--rounds", "2", "--deep", "6",
                      "--mbs", "3", "--iters", "2", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    modes = [(r["round"], r["mode"]) for r in doc["readings"]]
    assert modes == [(0, "q2"), (0, "q4"), (0, "s6"), (1, "q2"), (1, "q4"), (1, "s6")]
    s = doc["summary"]["bf16:none"]
    assert {"q2", "q4", "s6", "calibrate_split", "deep_split"} <= set(s)
    assert s["s6"]["n"] == 2 and s["q2"]["f_ms"] > 0 and s["s6"]["b_ms"] > 0
    per, call = s["deep_split"]["per_layer_ms"], s["deep_split"]["per_call_ms"]
    assert all(p > 0 for p in per) and all(c >= 0 for c in call)
