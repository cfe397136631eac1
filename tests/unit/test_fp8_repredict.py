"""benchmarks/fp8_repredict.py --sustained-from: a post hoc tool that gives rows carrying no
sustained-clock ratio (1: not measured) the ratio a later calibration measured for the same
module, and leaves every measured ratio as it was (docs/benchmarks/fp8_checks.md "fp8h9 post
hoc")."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "docs/benchmarks/data/profiles"


def test_sustained_from_fills_only_the_unmeasured_ratios(load_benchmark):
    load_benchmark("layout_sets")     # the script's sibling import
    fr = load_benchmark("fp8_repredict")
    profile = str(DATA / "profile_h200x2_fp8h9_20261130.toml")
    later = str(DATA / "profile_h200x2_fp8h9_sustained_20261130.toml")
    before = fr.cluster_for(profile, "NVIDIA H200", 2, False).gpu.measured.layers
    after = fr.cluster_for(profile, "NVIDIA H200", 2, False, later).gpu.measured.layers
    assert len(before) == len(after)
    changed = [(a, b) for a, b in zip(before, after) if a.sustained_ratio != b.sustained_ratio]
    # the compiled bf16 tp 1 module (timed at selective and full only: ratio 1 as run) takes
    # the later calibration's 1.117; the eager modules keep their own (1.106, not 1.090)
    assert changed and all(a.compile and a.tp == 1 and a.precision == "bf16"
                           and a.sustained_ratio == 1.0 for a, _ in changed)
    assert {round(b.sustained_ratio, 3) for _, b in changed} == {1.117}
    eager = [r for r in after if not r.compile and r.tp == 1 and r.zero == 0]
    assert {round(r.sustained_ratio, 3) for r in eager} == {1.106}
