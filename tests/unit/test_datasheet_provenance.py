"""The H200 datasheet's numbers that come from committed calibrations are what
``benchmarks/datasheet_from_profiles.py`` derives from them (data/gpus.toml names the script
as their provenance), and the grouped curves price the executor's fp8 experts below the dense
curves' 1.72x."""

import glob
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import datasheet_from_profiles as dfp  # noqa: E402

from meshplan.costmodel.fp8_experts import _gemm_pair_s  # noqa: E402
from meshplan.hardware_profiles.loader import builtin_gpu  # noqa: E402

H200 = "H200-SXM-141GB"
PATHS = sorted(glob.glob(dfp.DEFAULT_PROFILES))
pytestmark = pytest.mark.skipif(not PATHS, reason="committed profiles not in this checkout")


@pytest.mark.parametrize("precision", sorted(dfp.GROUPED_KEYS))
def test_grouped_curves_are_the_scripts(precision):
    key, medians, n, profiles, curve = dfp.grouped_datasheet(PATHS, H200, precision)
    assert n >= 100 and profiles >= 5
    derived = [(dfp.sig(x, 3), dfp.sig(y, 3)) for x, y in curve.points]
    entry = getattr(builtin_gpu(H200), key)
    flat = [v for point in entry.points for v in point]
    assert flat == pytest.approx([v for point in derived for v in point], rel=1e-6)


def test_permutation_rate_is_the_median_of_queued_calibrations():
    vals = dfp.measured_values(PATHS, dfp.PERMUTE_KEY, H200)
    assert len(vals) >= 5
    median = dfp.summary(list(vals))["median"]
    assert builtin_gpu(H200).membound_efficiency["moe-permute"] == pytest.approx(median)


def test_nested_reads_dotted_keys():
    table = {"membound_efficiency": {"moe-permute": 0.3}, "hbm_gbps": 4800.0}
    assert dfp.nested(table, "membound_efficiency.moe-permute") == 0.3
    assert dfp.nested(table, "hbm_gbps") == 4800.0
    assert dfp.nested(table, "membound_efficiency.swiglu") is None
    assert dfp.nested(table, "membound_efficiency") is None   # a table, not a number


@pytest.mark.parametrize("rows", [256, 1024, 4096])
def test_h200_fp8_experts_gain_less_than_the_dense_ratio(rows):
    gpu = builtin_gpu(H200)
    peak16, peak8 = gpu.peak_tflops["bf16"] * 1e12, gpu.peak_tflops["fp8"] * 1e12
    t16, t8 = _gemm_pair_s(gpu, False, peak16, peak8, 16, rows, 2048, 2816)
    assert 0.9 < t16 / t8 < 1.6    # measured in the layer: 0.95-1.58x by call size
