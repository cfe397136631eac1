"""benchmarks/validate_device.py --repredict --cpu-scale-by-probe: the calibrated CPU dispatch
times scaled by a run's host probe over the calibration's (a post-hoc test, issue 5)."""

import json
import tomllib
from pathlib import Path

import pytest

from meshplan.calibrate.tomlfile import dumps

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT / "docs/benchmarks/data/profiles/profile_h100x2_round12.toml"


def test_cpu_scaled_profile_scales_only_the_cpu_times(load_benchmark, tmp_path):
    vd = load_benchmark("validate_device")
    before = PROFILE.read_text()
    out = vd.cpu_scaled_profile(PROFILE, 2.0, tmp_path)
    a, b = (tomllib.loads(p.read_text()) for p in (PROFILE, out))
    for table in ("layers", "ends"):
        for ra, rb in zip(a[table], b[table]):
            assert rb["forward_cpu_s"] == pytest.approx(2 * ra["forward_cpu_s"])
            assert rb["backward_cpu_s"] == pytest.approx(2 * ra["backward_cpu_s"])
            assert rb["forward_s"] == ra["forward_s"] and rb["backward_s"] == ra["backward_s"]
    assert b["provenance"]["cpu_scaled_by"] == 2.0
    assert PROFILE.read_text() == before and out.parent == tmp_path    # a copy, not an edit
    with pytest.raises(SystemExit, match="must be > 0"):
        vd.cpu_scaled_profile(PROFILE, 0.0, tmp_path)


def _inputs(tmp_path, run_probe_us, load_benchmark):
    """round 13's ddp13 run (2 x H100, round 12's profile) as an accuracy.json."""
    prof = tomllib.loads(PROFILE.read_text())
    prof["provenance"]["host_probe_us"] = [10.0, 10.0]
    profile = tmp_path / "p.toml"
    profile.write_text(dumps(prof))
    doc = load_benchmark("repredict_sets").accuracy_doc("ddp13")
    doc["records"] = [r for r in doc["records"] if r["name"] in ("d06", "d07")]
    for r in doc["records"]:
        r["measured"]["host_probe_us_per_rank"] = run_probe_us
    acc = tmp_path / "acc.json"
    acc.write_text(json.dumps(doc))
    return profile, acc


def test_a_slower_host_at_run_time_raises_a_host_bound_prediction(load_benchmark, tmp_path):
    vd = load_benchmark("validate_device")
    profile, acc = _inputs(tmp_path, [14.0, 16.0], load_benchmark)            # 1.5 x the calibration's 10 us
    for flag, out in (([], "plain"), (["--cpu-scale-by-probe"], "scaled")):
        assert vd.main(["--repredict", str(acc), "--profile", str(profile),
                        "--out", str(tmp_path / out), *flag]) == 0
    plain, scaled = ({r["name"]: r for r in json.loads(
        (tmp_path / d / "accuracy.json").read_text())["records"]} for d in ("plain", "scaled"))
    assert scaled["d06"]["cpu_scale"] == pytest.approx(1.5)
    # d06 (Llama, micro-batch 1) is host-bound: its step follows the CPU; d07 (micro-batch
    # 16) is GPU-bound and barely moves
    step = {n: (scaled[n]["predicted"]["step_time_s"], plain[n]["predicted"]["step_time_s"])
            for n in ("d06", "d07")}
    assert step["d06"][0] > 1.3 * step["d06"][1]
    assert step["d07"][0] < 1.05 * step["d07"][1]


def test_records_or_profiles_without_probes_are_refused(load_benchmark, tmp_path):
    vd = load_benchmark("validate_device")
    profile, acc = _inputs(tmp_path, [None, None], load_benchmark)
    with pytest.raises(SystemExit, match="record 'd06' has no host probe"):
        vd.main(["--repredict", str(acc), "--profile", str(profile), "--out",
                 str(tmp_path / "o"), "--cpu-scale-by-probe"])
    _, acc = _inputs(tmp_path, [9.0, 9.0], load_benchmark)
    with pytest.raises(SystemExit, match="provenance has no host_probe_us"):
        vd.main(["--repredict", str(acc), "--profile", str(PROFILE), "--out",
                 str(tmp_path / "o"), "--cpu-scale-by-probe"])
