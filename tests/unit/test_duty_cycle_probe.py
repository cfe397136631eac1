"""benchmarks/duty_cycle_clock_gpu.py on CPU (wiring only): every phase of both kinds of
work runs at its duty cycle and lands in the JSON the doc's table is read from."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import duty_cycle_clock_gpu as probe  # noqa: E402


def test_the_probe_runs_each_work_at_each_duty_on_cpu(tmp_path):
    assert probe.main(["--out", str(tmp_path), "--device", "cpu", "--tiny", "--seconds", "0.05",
                       "--duties", "1.0", "0.5", "--chunk-ms", "10",
                       "--set", str(ROOT / "benchmarks/sets/transfer43")]) == 0
    doc = json.loads((tmp_path / "duty_cycle.json").read_text())
    assert [w["work"] for w in doc["works"]] == ["gemm256", "t43m01-gpt-mqa-2.45b"]
    for w in doc["works"]:
        assert [(p["duty"], p["chunk_s"]) for p in w["phases"]] == [(1.0, 0.01), (0.5, 0.01)]
        assert all(p["units"] > 0 and p["median_unit_s"] > 0 for p in w["phases"])
    assert len(doc["marks"]) == 8


def test_a_phase_idles_for_its_duty(monkeypatch):
    """Each busy chunk is followed by an idle gap of busy × (1 − duty) / duty."""
    import torch
    slept = []
    real_sleep = time.sleep
    monkeypatch.setattr(probe.time, "sleep", lambda s: (slept.append(s), real_sleep(s)))
    out = probe.run_phase(lambda: None, torch.device("cpu"), 0.25, 0.02, 0.2)
    assert out["duty"] == 0.25 and out["units"] > 0 and slept
    # a chunk is at least its 20 ms, so each gap at least 3 × 20 ms
    assert all(s >= 3 * 0.02 for s in slept)
    n = len(slept)
    assert probe.run_phase(lambda: None, torch.device("cpu"), 1.0, 0.02, 0.05)["units"] > 0
    assert len(slept) == n          # duty 1.0: no gap


def test_bad_duties_and_chunks_are_refused(tmp_path, capsys):
    import pytest
    for bad in (["--duties", "0"], ["--duties", "1.5"], ["--chunk-ms", "0"], ["--seconds", "-1"]):
        with pytest.raises(SystemExit) as exc:
            probe.main(["--out", str(tmp_path), "--device", "cpu", *bad])
        assert exc.value.code == 2
    assert "(0, 1]" in capsys.readouterr().err


def test_sustained_probe_refuses_a_phase_too_short_to_read(tmp_path, capsys):
    """benchmarks/sustained_clock_gpu.py reads each phase after its first second: --seconds
    at or below 1 is refused up front (it used to crash on its summary)."""
    import pytest
    import sustained_clock_gpu as sustained
    for bad in (["--seconds", "0.5"], ["--seconds", "1"], ["--cool-s", "-1"], ["--gemm", "-8"]):
        with pytest.raises(SystemExit) as exc:
            sustained.main(["--out", str(tmp_path), "--device", "cpu", "--set", "x", *bad])
        assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--seconds 0.5" in err and "more than 1" in err and "--cool-s -1" in err
