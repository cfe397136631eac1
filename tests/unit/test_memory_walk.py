"""benchmarks/memory_walk.py's summary and validate_device.py --merge, on CPU."""

import json

import pytest


def _write_log(path, entries):
    path.write_text(json.dumps([{"stage": 1, "action": a, "mb": mb, "allocated": al * 2**30,
                                 "peak": pk * 2**30} for a, mb, al, pk in entries]))


def test_stage_memory_summary_keeps_the_measured_step_and_its_peak(load_benchmark, tmp_path):
    tool = load_benchmark("memory_walk")
    warm = [("F", 0, 1.0, 1.0), ("I", 0, 2.0, 99.0)]          # the warm-up step: dropped
    step = [("F", 0, 1.0, 1.5), ("I", 0, 2.0, 2.5), ("W", 0, 1.2, 9.0)]
    _write_log(tmp_path / "mem_rank1.json", warm + [("F", 1, 1.0, 1.0)] + step)
    out = tool.summarize(tmp_path, {"memory": [{"total_bytes": 2 * 2**30},
                                               {"total_bytes": 3 * 2**30}]})
    rank = out["ranks"][1]
    assert rank["peak_gib"] == pytest.approx(9.0)
    assert rank["peak_at"] == "W0"
    assert rank["actions"] == "F0:1.0/1.5 I0:2.0/2.5 W0:1.2/9.0"     # allocated/peak GiB
    assert out["predicted_gib"] == pytest.approx([2.0, 3.0])
    assert "live_at_peak" not in rank
    # --snapshot: the allocation sites alive at the peak join the rank's summary
    (tmp_path / "peak_rank1.json").write_text(json.dumps({
        "peak_bytes": 3 * 2**30, "complete": True, "events": 9,
        "sites": [{"bytes": 2**30, "blocks": 4, "site": "meshplan/executor/model.py:9 f"}]}))
    rank = tool.summarize(tmp_path, {})["ranks"][1]
    assert rank["live_at_peak"] == ["1.000 GiB x4 meshplan/executor/model.py:9 f"]
    assert rank["trace_complete"] is True


def test_stage_memory_summary_splits_steps_and_names_block_lifetimes(load_benchmark,
                                                                    tmp_path):
    tool = load_benchmark("memory_walk")
    step = [("L", -1, 5.0, 6.0), ("FB", -1, 4.0, 9.0), ("O", -1, 4.0, 5.0)]
    log = [("S", 0, 1.0, 1.0)] + step + [("S", 1, 4.0, 5.0)] + step[:1] + [
        ("FB", -1, 4.0, 12.0), ("O", -1, 4.0, 5.0), ("S", 2, 4.0, 5.0)] + step
    _write_log(tmp_path / "mem_rank0.json", log)
    (tmp_path / "peak_rank0.json").write_text(json.dumps({
        "peak_bytes": 1, "complete": True, "events": 3, "sites": [],
        "blocks": [{"bytes": 2**30, "site": "a.py:1 wrap", "alloc_mark": 0, "free_mark": 6,
                    "free_site": "(no Python frame)"},
                   {"bytes": 2**29, "site": "b.py:2 fwd", "alloc_mark": 5, "free_mark": None,
                    "free_site": None}]}))
    rank = tool.summarize(tmp_path, {})["ranks"][0]
    assert rank["actions"] == "L:5.0/6.0 FB:4.0/9.0 O:4.0/5.0"    # the last step only
    assert rank["peak_gib_by_step"] == pytest.approx([9.0, 12.0, 9.0])
    # marks count entries done: mark 0 = before step 0 began, 6 = before step 1's FB ended
    assert rank["large_blocks"] == [
        "1.000 GiB 0:S0..1:FB a.py:1 wrap / freed by (no Python frame)",
        "0.500 GiB 1:L..never b.py:2 fwd"]


def _accuracy_doc(names, **meta):
    base = {"gpu_name": "NVIDIA H200", "nproc": 4, "job": {"global_batch": 64},
            "profile": "p.toml", "device": "cuda", "date": "2026-11-26", "command": "run"}
    base.update(meta)
    records = [{"name": n, "model": "gpt-0.54b", "short": n, "status": "ok",
                "layout": {"dp": 4}, "predicted": {"step_time_s": 1.0 + i,
                                                   "memory_per_rank_bytes": [1.0] * 4},
                "measured": {"step_time_s": 1.1 + i, "memory_per_rank_bytes": [1.0] * 4},
                "step_time_error_pct": (1.0 + i - (1.1 + i)) / (1.1 + i) * 100,
                "memory_error_pct_per_rank": [0.0] * 4, "memory_peak_error_pct": 0.0}
               for i, n in enumerate(names)]
    return {**base, "records": records}


def test_stage_memory_summary_names_step_phases_without_a_micro_batch(load_benchmark,
                                                                     tmp_path):
    tool = load_benchmark("memory_walk")
    phases = [("FB", -1, 20.0, 30.0), ("G", -1, 20.0, 20.5), ("O", -1, 18.0, 36.0)]
    _write_log(tmp_path / "mem_rank0.json", phases + phases)
    rank = tool.summarize(tmp_path, {})["ranks"][0]
    assert rank["actions"] == "FB:20.0/30.0 G:20.0/20.5 O:18.0/36.0"
    assert rank["peak_at"] == "O" and rank["peak_gib"] == pytest.approx(36.0)


def test_merge_joins_runs_of_one_set_and_refuses_different_setups(load_benchmark, tmp_path):
    vd = load_benchmark("validate_device")
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_accuracy_doc(["n01", "n02"])))
    b.write_text(json.dumps(_accuracy_doc(["n02", "n03"], command="again")))
    assert vd.main(["--merge", f"{a},{b}", "--out", str(tmp_path / "m")]) == 0
    doc = json.loads((tmp_path / "m" / "accuracy.json").read_text())
    assert [r["name"] for r in doc["records"]] == ["n01", "n02", "n03"]
    assert doc["summary"]["layouts"] == 3
    assert doc["commands"] == ["run", "again"]
    # --median: a layout in both files is measured by the median of its runs
    assert vd.main(["--merge", f"{a},{b}", "--median", "--out", str(tmp_path / "med")]) == 0
    med = {r["name"]: r for r in json.loads((tmp_path / "med" / "accuracy.json").read_text()
                                            )["records"]}
    assert med["n02"]["measured"]["step_time_s"] == pytest.approx((2.1 + 1.1) / 2)
    assert [r["step_time_s"] for r in med["n02"]["runs"]] == [2.1, 1.1]
    assert "runs" not in med["n01"] and med["n01"]["measured"]["step_time_s"] == 1.1
    with pytest.raises(SystemExit):
        vd.main(["--median", "--out", str(tmp_path / "x")])
    c = tmp_path / "c.json"
    c.write_text(json.dumps(_accuracy_doc(["n04"], nproc=2)))
    with pytest.raises(SystemExit, match="nproc"):
        vd.main(["--merge", f"{a},{c}", "--out", str(tmp_path / "m2")])


def test_an_unknown_set_or_layout_is_named_before_anything_runs(load_benchmark, tmp_path):
    tool = load_benchmark("memory_walk")
    with pytest.raises(SystemExit, match="unknown set 'nope'"):
        tool.main(["--set", "nope", "--only", "a", "--out", str(tmp_path), "--cpu"])
    with pytest.raises(SystemExit, match="unknown layout 'zz' in set 'holdout25'"):
        tool.main(["--set", "holdout25", "--only", "zz", "--out", str(tmp_path), "--cpu"])
