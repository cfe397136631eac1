"""benchmarks/compare_runs.py (repeatability across validate runs), benchmarks/trace_cpu.py
(CPU-side CUDA calls of a trace) and benchmarks/step_phases.py (a step's phases beside the
model's)."""

import json

import pytest

from meshplan.errors import ConfigError


def _accuracy(path, steps):
    recs = [{"name": n, "status": "ok", "measured": {"step_time_s": s, "step_time_spread": sp}}
            for n, (s, sp) in steps.items()]
    recs.append({"name": "x", "status": "timeout", "measured": {}})
    path.write_text(json.dumps({"records": recs}))
    return str(path)


def test_compare_runs_spreads_and_run_to_run_changes(load_benchmark, tmp_path):
    tool = load_benchmark("compare_runs")
    a1 = _accuracy(tmp_path / "a1.json", {"s1": (1.0, 10.0), "s2": (2.0, 20.0)})
    b1 = _accuracy(tmp_path / "b1.json", {"s1": (1.1, 2.0)})
    a2 = _accuracy(tmp_path / "a2.json", {"s1": (1.2, 30.0), "s2": (2.0, 0.0)})
    out = tool.compare(tool.load_runs([f"none={a1}", f"split={b1}", f"none={a2}"]))
    assert out["layouts"]["s1"] == [("none", 1.0, 10.0), ("split", 1.1, 2.0),
                                    ("none", 1.2, 30.0)]
    assert "x" not in out["layouts"]                                # not measured
    assert out["labels"]["none"]["mean_spread_pct"] == pytest.approx(15.0)
    assert out["labels"]["none"]["mean_run_to_run_pct"] == pytest.approx((20.0 + 0.0) / 2)
    assert out["labels"]["split"]["mean_run_to_run_pct"] is None    # one run
    assert out["mean_range_pct"] == pytest.approx((20.0 + 0.0) / 2)
    with pytest.raises(ConfigError, match="expected LABEL=path"):
        tool.load_runs(["a1.json"])
    with pytest.raises(ConfigError, match="not a readable accuracy.json"):
        tool.load_runs([f"a={tmp_path / 'missing.json'}"])


def test_trace_cpu_sums_runtime_calls_per_step_and_finds_gaps(load_benchmark, tmp_path):
    tool = load_benchmark("trace_cpu")
    ev = [{"name": "ProfilerStep#1", "cat": "user_annotation", "ts": 0, "dur": 1000},
          {"name": "ProfilerStep#2", "cat": "user_annotation", "ts": 1000, "dur": 1000},
          {"name": "cudaLaunchKernel", "cat": "cuda_runtime", "ts": 10, "dur": 4},
          {"name": "cudaStreamSynchronize", "cat": "cuda_runtime", "ts": 20, "dur": 600},
          {"name": "cudaLaunchKernel", "cat": "cuda_runtime", "ts": 1500, "dur": 4},
          {"name": "aten::mm", "cat": "cpu_op", "ts": 30, "dur": 50}]
    p = tmp_path / "trace_rank0.json"
    p.write_text(json.dumps({"traceEvents": ev}))
    s = tool.summarize(p, top=2)
    assert s["steps"] == 2 and s["step_span_s"] == pytest.approx(1e-3)
    assert list(s["runtime_per_step"]) == ["cudaStreamSynchronize", "cudaLaunchKernel"]
    assert s["runtime_per_step"]["cudaStreamSynchronize"] == {"s": pytest.approx(300e-6),
                                                              "calls": 0.5}
    assert s["longest_gaps_s"] == [pytest.approx(880e-6), pytest.approx(6e-6)]
    # no step marks: the caller's count of traced steps
    p.write_text(json.dumps({"traceEvents": ev[2:]}))
    assert tool.summarize(p, top=2, steps_in_window=4)["steps"] == 0


def test_step_phases_puts_the_slowest_ranks_tail_beside_the_models(load_benchmark, tmp_path,
                                                                   capsys):
    tool = load_benchmark("step_phases")

    def ph(passes, grads, opt, loss):
        return {k: {"device_ms": v, "host_ms": v / 2} for k, v in
                (("passes", passes), ("grads", grads), ("optimizer", opt), ("loss", loss))}
    recs = [{"name": "d01", "status": "ok", "model": "gpt", "short": "dp2 z2",
             "predicted": {"step_time_s": 0.400, "tail_s": 0.005},
             "measured": {"step_time_s": 0.420, "phase_median_ms_per_rank": [
                 ph(390.0, 1.0, 20.0, 2.0), ph(395.0, 1.0, 15.0, 1.0)]}},
            {"name": "old", "status": "ok", "model": "gpt", "short": "dp4",
             "predicted": {"step_time_s": 0.3}, "measured": {"step_time_s": 0.3}},
            {"name": "oom", "status": "out_of_memory", "measured": {}}]
    path = tmp_path / "acc.json"
    path.write_text(json.dumps({"records": recs}))
    rows = tool.phase_rows(json.loads(path.read_text()))
    assert [r["name"] for r in rows] == ["d01"]          # runs before round 19 lack phases
    r = rows[0]
    assert r["passes_ms"] == 395.0 and r["tail_ms"] == pytest.approx(23.0)
    assert r["host_tail_ms"] == pytest.approx(11.5)
    assert r["pred_tail_ms"] == pytest.approx(5.0) and r["pred_passes_ms"] == pytest.approx(395.0)
    assert tool.main([str(path)]) == 0
    assert "| d01 | gpt | dp2 z2 | 420.0 (400.0) | 395.0 (395.0) | 23.0 (5.0) | 11.5 | – / – " \
        "| – |" in capsys.readouterr().out
    assert tool.phase_rows(json.loads(path.read_text()), only="llama") == []
    assert tool.main([str(path), "--only", "(["]) == 2
    assert "is not a regular expression" in capsys.readouterr().err
    # since round 20 a pp-1 run marks each micro-batch; those phases count as passes
    mb = {k: {"device_ms": v, "host_ms": v} for k, v in (
        ("forward 0", 120.0), ("backward 0", 200.0), ("forward 1", 100.0),
        ("backward 1", 180.0), ("passes", 0.5), ("grads", 0.1), ("optimizer", 2.0),
        ("loss", 0.2))}
    recs[0]["measured"]["phase_median_ms_per_rank"] = [mb]
    r = tool.phase_rows({"records": recs[:1]})[0]
    assert r["passes_ms"] == pytest.approx(600.5) and r["tail_ms"] == pytest.approx(2.3)
    assert (r["forward0_ms"], r["forward_later_ms"], r["backward_ms"]) == (120.0, 100.0, 190.0)
    assert tool.main([str(path), "--only", "llama"]) == 1
    assert tool.main([str(tmp_path / "missing.json")]) == 2


def test_step_phases_blocks_put_each_blocks_time_beside_the_models_layer(load_benchmark,
                                                                        tmp_path, capsys):
    tool = load_benchmark("step_phases")
    from pathlib import Path
    profile = (Path(__file__).resolve().parents[2] / "docs" / "benchmarks" / "data"
               / "profiles" / "profile_h200x4_round21.toml")

    def ms(v):
        return {"device_ms": v, "host_ms": v}
    # two blocks, two micro-batches (the second micro-batch's block phases are numbered)
    phases = {"before block 0 forward": ms(5.0), "block 0 forward": ms(3.0),
              "before block 1 forward": ms(0.1), "block 1 forward": ms(2.5),
              "forward 0": ms(8.0), "before block 1 backward": ms(9.0),
              "block 1 backward": ms(6.0), "before block 0 backward": ms(0.2),
              "block 0 backward": ms(6.5), "backward 0": ms(1.0),
              "before block 0 forward #2": ms(0.3), "block 0 forward #2": ms(2.7),
              "before block 1 forward #2": ms(0.1), "block 1 forward #2": ms(2.6),
              "forward 1": ms(8.0), "before block 1 backward #2": ms(9.0),
              "block 1 backward #2": ms(6.1), "before block 0 backward #2": ms(0.2),
              "block 0 backward #2": ms(6.2), "backward 1": ms(1.0), "optimizer": ms(1.0)}
    blocks = tool.block_times(phases)
    assert blocks[0]["forward"] == [3.0, 2.7] and blocks[1]["backward"] == [6.0, 6.1]
    assert blocks[0]["before forward"] == [5.0, 0.3]
    lay = {"dp": 4, "pp": 1, "tp": 1, "micro_batch": 16, "schedule": "1f1b", "vpp": 1,
           "recompute": "none", "zero": 3, "sequence_parallel": False, "stage_layers": None}
    doc = {"gpu_name": "NVIDIA H200",
           "job": {"global_batch": 64, "seq_len": 2048, "runtime": "torch"},
           "records": [{"name": "e03", "status": "ok", "model": "gpt-0.54b", "short": "z3",
                        "layout": lay, "predicted": {"step_time_s": 0.26},
                        "measured": {"step_time_s": 0.28,
                                     "phase_median_ms_per_rank": [phases]}}]}
    path = tmp_path / "acc.json"
    path.write_text(json.dumps(doc))
    assert tool.main([str(path), "--blocks"]) == 0
    out = capsys.readouterr().out
    assert "| 0 | 3.00 / 2.70 | 6.50 / 6.20 | 5.00 / 0.30 | 0.20 / 0.20 |" in out
    assert "forward 10.8 ms, backward 24.8 ms" in out
    assert tool.main([str(path), "--blocks", "--profile", str(profile)]) == 0
    out = capsys.readouterr().out
    f, b = tool.predicted_layer_ms(doc["records"][0], doc["job"], "NVIDIA H200", profile)
    assert 2.0 < f < 3.5 and 5.0 < b < 7.5          # GPT's FSDP2 rows at micro-batch 16
    assert f"model per layer: forward {f:.1f}, backward {b:.1f}" in out
    pf, pb = tool.predicted_layer_ms(doc["records"][0], doc["job"], "NVIDIA H200", profile,
                                     plain=True)
    assert pf > f and pb > b        # GPT's plain (autocast) rows cost more than FSDP2's
    assert f"(plain rows at ZeRO-0: {pf:.1f}, {pb:.1f})" in out
    # a run without block marks, and a profile that is not there
    doc["records"][0]["measured"]["phase_median_ms_per_rank"] = [{"forward 0": ms(1.0)}]
    path.write_text(json.dumps(doc))
    assert tool.main([str(path), "--blocks"]) == 1
    assert "--block-marks" in capsys.readouterr().err
    assert tool.main([str(path), "--blocks", "--profile", str(tmp_path / "no.toml")]) == 2
    bad = tmp_path / "bad.toml"
    bad.write_text("not = [toml\n")
    doc["records"][0]["measured"]["phase_median_ms_per_rank"] = [phases]
    path.write_text(json.dumps(doc))
    assert tool.main([str(path), "--blocks", "--profile", str(bad)]) == 2
    assert "not valid TOML" in capsys.readouterr().err


def test_repredict_moe1gpu_reprices_a_committed_check(load_benchmark):
    tool = load_benchmark("repredict_moe1gpu")
    rows = tool.arms("moeh37")
    assert {(r["precision"], r["layout"], r["microbatches"]) for r in rows} == {
        ("bf16", "mb16-full-compiled", 1), ("fp8", "mb16-full-compiled", 1)}
    for r in rows:       # measured as committed, re-priced within reach of them
        assert r["step_s"] > 0 and 0.5 < r["priced_s"] / r["step_s"] < 2
        assert 0.5 < r["priced_bytes"] / r["peak_bytes"] < 2
    lines = tool.summary(rows)
    assert lines[0].startswith("all: step") and "of 2 within 5 %" in lines[0]
    assert lines[-1].startswith("fp8/bf16 speed-up") and "(1)" in lines[-1]
    assert tool.main(["--only", "no-such-check"]) == 1


def test_repredict_moe1gpu_reads_the_earlier_checks_one_record_files(load_benchmark):
    """fp8h16-fp8h30 keep one record a precision whose runs are keyed LAYOUT/current: their
    arms are re-priced too (fp8h29's were missing when a rule regressed them)."""
    tool = load_benchmark("repredict_moe1gpu")
    rows = tool.arms("fp8h29")
    assert {(r["precision"], r["layout"]) for r in rows} == {
        (p, lay) for p in ("bf16", "fp8")
        for lay in ("mb16-compiled", "mb4-compiled", "mb4-full-compiled")}
    for r in rows:
        assert 0.8 < r["priced_s"] / r["step_s"] < 1.2
        assert 0.9 < r["priced_bytes"] / r["peak_bytes"] < 1.1
