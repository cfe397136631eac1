"""The H200 datasheet's numbers that come from committed calibrations are what
``benchmarks/datasheet_from_profiles.py`` derives from them (data/gpus.toml names the script
as their provenance), and the grouped curves price the executor's fp8 experts below the dense
curves' 1.72x."""

import glob
import statistics
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


def test_permutation_rate_by_top_k_is_the_median_of_queued_calibrations():
    rates = dfp.permute_by_top_k(PATHS, H200)
    assert set(rates) >= {2, 8}
    entry = builtin_gpu(H200).moe_permute_efficiency_by_top_k
    assert [k for k, _ in entry.points] == sorted(rates)
    for k, eff in entry.points:
        assert eff == pytest.approx(round(statistics.median(rates[int(k)]), 3))


def test_the_permutation_is_priced_at_the_models_top_k():
    """The datasheet's rate at the model's top-k, interpolated between the timed ones; a
    profile's own measured rate comes first."""
    from dataclasses import replace

    from meshplan.costmodel.moe_layer import PERMUTE_OP, permute_efficiency
    gpu = builtin_gpu(H200)
    at = {k: permute_efficiency(gpu, k) for k in (1, 2, 4, 8, 16)}
    rate = dict(gpu.moe_permute_efficiency_by_top_k.points)   # the script's medians (above)
    assert at[1] == at[2] == pytest.approx(rate[2]) and at[8] == at[16] == pytest.approx(rate[8])
    assert at[2] < at[4] < at[8]
    own = replace(gpu, membound_efficiency={PERMUTE_OP: 0.2})
    assert permute_efficiency(own, 8) == 0.2
    bare = replace(gpu, moe_permute_efficiency_by_top_k=None)
    assert permute_efficiency(bare, 8) == gpu.hbm_efficiency


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


def test_a_calibration_does_not_inherit_the_derated_grouped_curves():
    """The datasheet's grouped curves carry its 0.75 derating; a profile whose GEMM curves
    calibrate measured keeps only grouped curves it timed itself, and keeps the base's
    permutation rates (rates, not derated curves)."""
    from meshplan.calibrate import profile as prof
    doc = prof.build_profile(measurements={}, base=builtin_gpu(H200), device="cuda",
                             provenance={})
    g = doc["gpu"]
    assert not set(prof.DATASHEET_ONLY_KEYS) & set(g)
    base = builtin_gpu(H200).moe_permute_efficiency_by_top_k.points
    assert g["moe_permute_efficiency_by_top_k"] == [[k, eff] for k, eff in base]


@pytest.mark.parametrize("points", [[[2, 1.5]], [[0.5, 0.3]], [[2, 0.0]], "fast"])
def test_a_bad_permutation_rate_names_the_key(points):
    from meshplan.errors import ProfileError
    from meshplan.hardware_profiles.loader import gpu_from_table
    table = {**builtin_gpu(H200).to_dict(), "moe_permute_efficiency_by_top_k": points}
    with pytest.raises(ProfileError, match="moe_permute_efficiency_by_top_k"):
        gpu_from_table("x", table, "p.toml [gpu]")
    table["moe_permute_efficiency_by_top_k"] = [[2, 0.3], [8, 0.4]]
    back = gpu_from_table("x", table, "p.toml [gpu]")
    assert back.to_dict()["moe_permute_efficiency_by_top_k"] == [[2, 0.3], [8, 0.4]]


def test_compiled_cpu_rows_group_split_rows_and_count_repeats_once(tmp_path):
    """``--compiled-cpu`` reads only compiled tp-1 rows whose CPU was split into per-layer
    and per-call parts, groups them by block, precision (the fp8 recipe) and recompute, and
    counts a calibration's repeated values (one shape at several micro-batches) once."""
    row = ('[[layers]]\nshape = "{shape}"\ncompile = {compile}\ntp = {tp}\nrecompute = "none"\n'
           'precision = "{prec}"\nfp8_recipe = "{recipe}"\nmicro_batch = {mb}\n'
           'forward_cpu_s = 0.001\nbackward_cpu_s = 0.002\nforward_cpu_fixed_s = {fix}\n'
           'backward_cpu_fixed_s = {fix}\n')
    rows = [dict(shape="h64-moe8k2f32", compile="true", tp=1, prec="bf16", recipe="", mb=mb,
                 fix=0.0004) for mb in (1, 2)]                              # one value, twice
    rows += [dict(shape="h64", compile="true", tp=1, prec="fp8", recipe="tensorwise", mb=1,
                  fix=0.0004),
             dict(shape="h64", compile="false", tp=1, prec="bf16", recipe="", mb=1,
                  fix=0.0004),                                              # eager: not read
             dict(shape="h64", compile="true", tp=2, prec="bf16", recipe="", mb=1,
                  fix=0.0004),                                              # tp 2: not read
             dict(shape="h64", compile="true", tp=1, prec="bf16", recipe="", mb=1,
                  fix=0.0)]                           # no per-call part: 1 depth, not read
    path = tmp_path / "profile.toml"
    path.write_text('[gpu]\nname = "X"\n' + "".join(row.format(**r) for r in rows))
    got = dfp.compiled_cpu_rows([str(path)])
    assert set(got) == {("moe", "bf16", "none"), ("dense", "tensorwise", "none")}
    assert list(got[("moe", "bf16", "none")]) == [(0.001, 0.002, 0.0004, 0.0004)]
