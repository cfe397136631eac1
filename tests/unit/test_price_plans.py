"""benchmarks/price_plans.py, and the committed fp8h24-fp8h28 draws it priced before their runs."""

import json
import random
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import draw_models as dm  # noqa: E402
import price_plans as pp  # noqa: E402
from meshplan.costmodel import estimate  # noqa: E402
from meshplan.hardware_profiles.calibrated import apply_profile  # noqa: E402
from meshplan.hardware_profiles.loader import builtin_gpu  # noqa: E402
from meshplan.spec import ModelSpec  # noqa: E402

SETS = ROOT / "benchmarks" / "sets"
PROFILES = ROOT / "docs" / "benchmarks" / "data" / "profiles"


def _draw(seed, i):
    """The i-th (0-based) model of ``draw_models.py --seed SEED --count 2 --min-params 1.2e9
    --max-params 4.0e9``."""
    rng = random.Random(seed)
    models = [dm.draw_model(rng, f"m{k + 1:02d}", min_params=1.2e9, max_params=4.0e9)
              for k in range(2)]
    return models[i]


@pytest.mark.parametrize("check, seed, i", [("fp8h24", 4126, 0), ("fp8h25", 4126, 1),
                                            ("fp8h26", 4128, 1), ("fp8h27", 4129, 0),
                                            ("fp8h28", 4129, 1)])
def test_the_committed_models_are_the_seeded_draws(check, seed, i):
    committed = ModelSpec(**json.loads((SETS / check / "m01.json").read_text()))
    assert committed == _draw(seed, i)


def test_fp8h26_is_the_first_llama_of_its_draw():
    assert _draw(4128, 0).activation == "gelu" and _draw(4128, 1).activation == "swiglu"


def test_measured_reads_steps_and_the_status_of_runs_that_did_not_finish(tmp_path):
    data = tmp_path / "d.json"
    data.write_text(json.dumps({
        "bf16": {"runs": {"a/current": {"status": "ok", "step_time_s": 1.5}}},
        "fp8": {"runs": {"a/current": {"status": "failed", "step_time_s": None}}}}))
    assert pp.measured([str(data)]) == {("bf16", "a"): 1.5, ("fp8", "a"): "failed"}


def test_the_table_prices_every_plan_and_reports_each_columns_error(capsys):
    profile = PROFILES / "profile_h200x1_fp8h18_20261201.toml"
    results = ROOT / "docs" / "benchmarks" / "data" / "fp8_h200x1_fp8h26_20261203.json"
    plans = ROOT / "benchmarks" / "plans" / "fp8h26_bf16_h200x1"
    assert pp.main([str(plans), "--profile", f"own={profile}", "--all", str(profile),
                    "--results", str(results)]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| `")]
    assert len(rows) == 3                                  # the set's three bf16 plans
    measured = {("bf16", k.split("/")[0]): v["step_time_s"] for k, v in
                json.loads(results.read_text())["bf16"]["runs"].items()}
    for line in rows:
        cells = [c.strip() for c in line.strip("|").split("|")]
        meas = measured["bf16", cells[0].strip("`")]
        assert cells[2] == f"{meas:.3f}"
        # own, datasheet and the mean: each a price with its error against the measured step
        for cell in cells[3:]:
            price, err = cell.split(" (")
            assert float(err.split(" %")[0]) == pytest.approx(
                (float(price) / meas - 1) * 100, abs=0.1)
    assert "bf16 own:" in out and "bf16 datasheet:" in out


def test_speed_up_errors_pair_the_arms_that_both_ran():
    prices = {("own", "bf16", "a"): 2.0, ("own", "fp8", "a"): 1.0,
              ("own", "bf16", "b"): 3.0, ("own", "fp8", "b"): 2.0}
    meas = {("bf16", "a"): 1.6, ("fp8", "a"): 1.0, ("bf16", "b"): 3.0, ("fp8", "b"): "failed"}
    (line,) = pp.speedup_lines(prices, meas)
    # a: predicted 2.0x, measured 1.6x -> +25 %; b: its fp8 arm did not run, left out
    assert line == "fp8/bf16 speed-up own: 25.0 % mean, 25.0 % max (1 pairs; +25.0 %)"


def test_a_profile_column_must_name_an_existing_file():
    with pytest.raises(SystemExit, match="use NAME=PATH"):
        pp.main([str(ROOT / "benchmarks" / "plans" / "fp8h26_bf16_h200x1"),
                 "--profile", "own=/no/such.toml"])


def test_memory_mode_prices_peak_gib_against_the_runs_peak(capsys):
    profile = PROFILES / "profile_h200x1_fp8h18_20261201.toml"
    results = ROOT / "docs" / "benchmarks" / "data" / "fp8_h200x1_fp8h26_20261203.json"
    plans = ROOT / "benchmarks" / "plans" / "fp8h26_bf16_h200x1"
    assert pp.main([str(plans), "--profile", f"own={profile}", "--all", str(profile),
                    "--results", str(results), "--memory"]) == 0
    out = capsys.readouterr().out
    assert "measured GiB" in out and "speed-up" not in out
    peak = {k.split("/")[0]: v["memory_peak_bytes"] / 2**30 for k, v in
            json.loads(results.read_text())["bf16"]["runs"].items()}
    rows = [line for line in out.splitlines() if line.startswith("| `")]
    assert len(rows) == 3
    for line in rows:
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[2] == f"{peak[cells[0].strip('`')]:.3f}"
        own = float(cells[3].split(" (")[0])
        assert 10 < own < 141                             # GiB on one H200, not seconds


def test_another_gpu_prices_the_same_plans_on_its_datasheet(capsys):
    plans = ROOT / "benchmarks" / "plans" / "moeh61_bf16_h200x1"
    with pytest.raises(SystemExit, match="--gpu: unknown GPU 'H101'"):
        pp.main([str(plans), "--gpu", "H101"])
    rec = pp.load_plan_file(plans / "mb4-compiled.json")
    h200, h100 = pp.price(rec, None), pp.price(rec, None, gpu="H100-SXM5-80GB")
    assert h100 > h200          # the same layout, less HBM bandwidth: slower, not refused


def test_host_load_is_shown_beside_each_profiles_price(capsys):
    """``--host-load``: each named profile's cell carries the estimate's host load; the
    datasheet's (no measured CPU) does not, and the prices themselves do not change."""
    profile = PROFILES / "profile_h100x1_fp8h59h100_20261206.toml"
    plans = ROOT / "benchmarks" / "plans" / "fp8h59h100_bf16_h100x1"
    args = [str(plans), "--gpu", "H100-SXM5-80GB", "--profile", f"own={profile}",
            "--all", str(profile)]
    assert pp.main(args) == 0
    plain = capsys.readouterr().out
    assert pp.main([*args, "--host-load"]) == 0
    loaded = capsys.readouterr().out
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.strip("|").split("|")]
            for line in loaded.splitlines() if line.startswith("| `")}
    gpu = builtin_gpu("H100-SXM5-80GB")
    recs = {p.stem: pp.load_plan_file(p) for p in pp.plan_files([str(plans)])}
    for name, cells in rows.items():
        rec = recs[name.strip("`")]
        load = estimate(rec.model, apply_profile(rec.cluster.replace(gpu=gpu), str(profile)),
                        rec.job, rec.layout).host_load
        assert load > 0 and cells[2].endswith(f"(host {load:.2f})")
        assert "host" not in cells[3]                      # the datasheet times no CPU
    # the host-bound micro-batch-1 plan reads as such
    assert float(rows["`mb1-compiled`"][2].split("host ")[1].rstrip(")")) >= 1.0
    assert re.sub(r" \(host [\d.]+\)", "", loaded) == plain   # the same prices
