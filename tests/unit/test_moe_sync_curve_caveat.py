"""An MoE estimate on a calibrated profile whose GEMM curve was timed one synchronised GEMM at
a time, with no grouped curve, says that its experts' small GEMMs pay that curve's per-call
floor (moeh63h100: a dense H100 calibration 97-269 % slow, the datasheet 5-7 %)."""

from __future__ import annotations

import warnings
from pathlib import Path

from meshplan.costmodel import estimate
from meshplan.costmodel.inputs import MOE_SYNC_CURVE_CAVEAT
from meshplan.hardware_profiles.calibrated import apply_profile
from meshplan.hardware_profiles.loader import builtin_gpu
from meshplan.planner.planfile import load_plan_file

ROOT = Path(__file__).resolve().parents[2]
PROFILES = ROOT / "docs/benchmarks/data/profiles"


def test_the_caveat_names_a_synchronised_dense_curve_only():
    rec = load_plan_file(ROOT / "benchmarks/plans/moeh63h100_bf16_h200x1/mb2-compiled.json")
    h100 = rec.cluster.replace(gpu=builtin_gpu("H100-SXM5-80GB"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dense = apply_profile(h100, PROFILES / "profile_h100x4_transfer36_part1.toml")
        moe = apply_profile(rec.cluster, PROFILES / "profile_h200x1_moeh40_20261203.toml")
    assert dense.gpu.grouped_gemm_efficiency is None and not dense.gpu.microbench_timing
    assert MOE_SYNC_CURVE_CAVEAT in estimate(rec.model, dense, rec.job, rec.layout).caveats
    # the datasheet (no calibration) and a profile with the experts' grouped curve: no
    assert MOE_SYNC_CURVE_CAVEAT not in estimate(rec.model, h100, rec.job, rec.layout).caveats
    assert moe.gpu.grouped_gemm_efficiency is not None
    assert MOE_SYNC_CURVE_CAVEAT not in estimate(rec.model, moe, rec.job, rec.layout).caveats


def test_the_caveats_figures_are_the_checks():
    text = (ROOT / "benchmarks/sets/moeh63h100/README.md").read_text()
    for figure in ("+269.3 %", "+96.7 %", "+7.0 %", "+4.5 %"):   # its 97-269 % and 5-7 %
        assert figure in text
    assert "97-269" in MOE_SYNC_CURVE_CAVEAT and "5-7 %" in MOE_SYNC_CURVE_CAVEAT
