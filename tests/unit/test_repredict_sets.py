"""benchmarks/repredict_sets.py: every measured set re-predicted on its own profile."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import repredict_sets as rs  # noqa: E402


def test_repredicts_a_set_as_validate_device_does():
    """holdout22 on round 22's profile gives what ``validate_device.py --repredict`` wrote."""
    rows = rs.repredict(("holdout22",))
    assert len(rows) == 16 and {n for n, _ in rows} == {"holdout22"}
    saved = json.loads((rs.BENCH / "accuracy_holdout22_repredicted.json").read_text())
    want = {r["name"]: r["step_time_error_pct"] for r in saved["records"]}
    for _, x in rows:
        assert x["step_time_error_pct"] == pytest.approx(want[x["name"]], abs=1e-9)


def test_shapes_and_summary(capsys):
    base = dict(dp=1, pp=1, tp=1, zero=0, schedule="1f1b")
    assert rs.shape({**base, "dp": 4, "zero": 3}) == "FSDP2 over dp alone"
    assert rs.shape({**base, "dp": 2, "pp": 2, "zero": 2, "schedule": "zero-bubble"}) \
        == "zero-bubble FSDP2"
    assert rs.shape({**base, "dp": 2, "pp": 2, "zero": 2}) == "pipelined FSDP2"
    assert rs.shape({**base, "pp": 2, "schedule": "interleaved-1f1b"}) == "interleaved"
    assert rs.shape({**base, "tp": 4}) == "other"
    line = rs.summary_line("x", [-2.0, 4.0, 10.0])
    assert "n=  3" in line and "mean abs  5.33 %" in line and "beyond 8 %: 1" in line
    with pytest.raises(SystemExit):
        rs.main(["--only", "("])
    assert "not a regular expression" in capsys.readouterr().err
