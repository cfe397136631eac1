"""benchmarks/repredict_sets.py: every measured set re-predicted on its own profile, from the
consolidated data in docs/benchmarks/data/."""

import json
import re
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import layout_sets  # noqa: E402
import repredict_sets as rs  # noqa: E402


def test_repredicts_a_set_as_validate_device_does(load_benchmark, tmp_path):
    """holdout22 on round 22's profile gives what ``validate_device.py --repredict`` gives
    for the same records and profile."""
    rows = rs.repredict(("holdout22",))
    assert len(rows) == 16 and {n for n, _ in rows} == {"holdout22"}
    doc = rs.accuracy_doc("holdout22")
    acc = tmp_path / "accuracy.json"
    acc.write_text(json.dumps(doc))
    vd = load_benchmark("validate_device")
    assert vd.main(["--repredict", str(acc), "--profile", doc["profile"],
                    "--out", str(tmp_path / "r")]) == 0
    saved = json.loads((tmp_path / "r" / "accuracy.json").read_text())
    want = {r["name"]: r["step_time_error_pct"] for r in saved["records"]}
    assert set(want) == {x["name"] for _, x in rows}
    for _, x in rows:
        assert x["step_time_error_pct"] == pytest.approx(want[x["name"]], abs=1e-9)


def test_measured_data_matches_its_sets_and_profiles():
    """Every measured set names the profile its run used (the provenance date its record
    names), and every measured layout is the layout of that name in layout_sets.toml."""
    measured = rs.load_measured()
    assert set(rs.SETS) <= set(measured)
    for name, doc in measured.items():
        profile = rs.DATA / doc["profile"]
        date = tomllib.loads(profile.read_text())["provenance"]["date"]
        assert re.search(re.escape(date), doc["gpu_profile"]), name
        assert doc["nproc"] == layout_sets.SET_NPROC[name]
        assert doc["job"]["global_batch"] == layout_sets.SET_JOBS[name].global_batch
        defined = {n: (m.name, lay) for n, m, lay in layout_sets.SETS[name]}
        for r in doc["records"]:
            model, lay = defined[r["name"]]
            assert r["model"] == model
            assert layout_sets.Layout.from_dict(r["layout"]) == lay, (name, r["name"])


def test_an_unknown_set_is_named():
    with pytest.raises(SystemExit, match="no measured set 'holdout99'"):
        list(rs.measured_records(("holdout99",)))


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


def test_datasheet_reprices_on_the_gpus_datasheet_keeping_the_calibrated_load():
    """``--datasheet``: the same records on the GPU's datasheet profile (no measured rows, so
    no CPU priced), each with its calibrated estimate's CPU load for the grouping."""
    own = [x for _, x in rs.repredict(("holdout22",))]
    sheet = [x for _, x in rs.repredict(("holdout22",), datasheet=True)]
    assert len(sheet) == len(own) == 16
    assert [x["name"] for x in sheet] == [x["name"] for x in own]
    assert all(x["predicted"]["host_load"] == 0.0 for x in sheet)
    loads = [x["calibrated_host_load"] for x in sheet]
    assert loads == [x["predicted"]["host_load"] for x in own] and any(x > 0 for x in loads)
    assert ([x["step_time_error_pct"] for x in sheet]
            != [x["step_time_error_pct"] for x in own])
