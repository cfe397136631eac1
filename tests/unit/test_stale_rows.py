"""Compiled selective-recompute rows timed by the executor before it checkpointed the
attention core inside the compiled block (profiles without calibrate's 'compiled_selective'
mark) are left out at load, with a warning by name; the layout is then priced from the eager
selective row moved by the compiled/eager pair at recompute none
(meshplan.hardware_profiles.stale_rows)."""
import warnings
from dataclasses import replace
from pathlib import Path

import pytest

from meshplan.costmodel import estimate
from meshplan.errors import MeshplanWarning
from meshplan.hardware_profiles.calibrated import apply_profile, load_profile
from meshplan.hardware_profiles.stale_rows import without_stale_rows
from meshplan.planner.planfile import load_plan_file

ROOT = Path(__file__).resolve().parents[2]
BEFORE = {"device": "cuda", "date": "2026-11-29T06:47:37+00:00"}
SEL_C = {"compile": True, "recompute": "selective", "micro_batch": 1}
OTHERS = [{**SEL_C, "compile": False}, {**SEL_C, "recompute": "none"},
          {**SEL_C, "recompute": "full"}]


def test_compiled_selective_rows_timed_before_the_change_are_dropped_by_name():
    with pytest.warns(MeshplanWarning, match=r"p\.toml: 2 compiled layer row\(s\) at recompute "
                                             r"'selective' \(calibrated 2026-11-29T06:47:37"):
        kept = without_stale_rows(BEFORE, [SEL_C, {**SEL_C, "micro_batch": 2}, *OTHERS],
                                  "p.toml")
    assert kept == OTHERS
    none_c = {**SEL_C, "recompute": "none"}
    with pytest.warns(MeshplanWarning, match=r"'selective' were timed"):    # no date: no mark
        assert without_stale_rows({"device": "cuda"}, [SEL_C, none_c], "p.toml") == [none_c]


def test_a_modules_only_compiled_pair_is_kept():
    """A module timed compiled at selective and full only keeps its stale selective rows:
    without them its compiled recompute-none layouts read the full pair, which carries none
    of what compile keeps less (fp8h29 from fp8h18's rows: peak +12.8..+37.4 % so)."""
    full_c = {**SEL_C, "recompute": "full"}
    other = {**SEL_C, "shape": "h64-another", "recompute": "none"}   # another module's none
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # nothing left out: no warning
        assert without_stale_rows(BEFORE, [SEL_C, full_c, other], "p.toml") == [
            SEL_C, full_c, other]
    import json
    data = json.loads((ROOT / "docs/benchmarks/data/fp8_h200x1_fp8h29_20261203.json").read_text())
    profile = ROOT / "docs/benchmarks/data/profiles/profile_h200x1_fp8h18_20261201.toml"
    for prec in ("bf16", "fp8"):
        run = data[prec]["runs"]["mb16-compiled/current"]
        rec = load_plan_file(ROOT / f"benchmarks/plans/fp8h29_{prec}_h200x1/mb16-compiled.json")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est = estimate(rec.model, apply_profile(rec.cluster, profile), rec.job, rec.layout)
        # as run on 2026-12-03 (+1.1 % bf16, +3.3 % fp8), not +27.4 / +37.4 % from the full pair
        assert abs(est.memory_peak_bytes / run["memory_peak_bytes"] - 1) < 0.04
        assert any("at recompute selective" in c for c in est.caveats)


@pytest.mark.parametrize("prov", [
    {"device": "cuda", "date": "2026-12-01T18:30:54+00:00",     # fp8h20b: after the change
     "compiled_selective": "core checkpointed in the block's graph"},
    {"device": "cpu", "date": "2026-11-29T06:47:37+00:00"},    # a CPU profile's own rows
])
def test_rows_are_kept_where_the_profile_is_marked_or_of_the_cpu(prov):
    rows = [SEL_C, *OTHERS]
    with warnings.catch_warnings():
        warnings.simplefilter("error", MeshplanWarning)
        assert without_stale_rows(prov, rows, "p.toml") == rows


def test_every_committed_gpu_profile_is_marked_exactly_when_timed_after_the_change():
    """The mark and the calibration's date agree on every committed GPU profile: those timed
    from 2026-12-01 16:40 UTC (commit 4656ba4) have it, those before do not."""
    import tomllib
    from datetime import datetime, timezone
    cut = datetime(2026, 12, 1, 16, 40, 46, tzinfo=timezone.utc)
    seen = 0
    for path in sorted((ROOT / "docs/benchmarks/data/profiles").rglob("*.toml")):
        prov = tomllib.loads(path.read_text()).get("provenance", {})
        if prov.get("device") != "cuda" or "date" not in prov:
            continue
        seen += 1
        timed_after = datetime.fromisoformat(prov["date"]) >= cut
        assert bool(prov.get("compiled_selective")) == timed_after, path.name
    assert seen > 100


PROFILE = ROOT / "docs/benchmarks/data/profiles/profile_h200x1_fp8h1_20261129.toml"
PLAN = ROOT / "benchmarks/plans/fp8h38_bf16_h200x1/mb8-selective-compiled.json"


def test_a_stale_profile_prices_compiled_selective_from_the_pair_at_recompute_none():
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always", MeshplanWarning)
        prof = load_profile(PROFILE)
    assert any("at recompute 'selective'" in str(w.message) for w in got)
    rows = prof.gpu.measured.layers
    assert not [r for r in rows if r.compile and r.recompute == "selective"]
    assert [r for r in rows if not r.compile and r.recompute == "selective"]
    rec = load_plan_file(PLAN)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MeshplanWarning)
        cluster = apply_profile(rec.cluster, PROFILE)
        est = estimate(rec.model, cluster, rec.job, rec.layout)
        plain = estimate(rec.model, cluster, rec.job, replace(rec.layout, recompute="none"))
    assert any("moved by the compiled/eager rows at recompute none" in c for c in est.caveats)
    # the re-run's cost as the later executor's rows show it (fp8h20b-22: +3-5 %), not the
    # stale rows' (fp8h1: +16 %, which priced this layout 8.1 % over recompute none)
    assert 1.0 < est.step_time_s / plain.step_time_s < 1.05


def test_keep_stale_rows_reads_every_row_as_timed():
    """For studies of the rows themselves (calibrate's fp8 block share) and re-pricing runs
    of the executor that timed them (`moe_sync_gpu.py repredict --rows-as-timed`)."""
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always", MeshplanWarning)
        prof = load_profile(PROFILE, keep_stale_rows=True)
    assert not any("at recompute 'selective'" in str(w.message) for w in got)
    assert [r for r in prof.gpu.measured.layers if r.compile and r.recompute == "selective"]
