"""The grouped-GEMM curve keyed by the whole call (hardware_profiles/grouped_gemm.py), the
profiles that say so, and the rows calibrate times inside the MoE layer."""

from dataclasses import replace

import pytest

import meshplan as mp
from meshplan.costmodel.fp8_experts import fp8_experts
from meshplan.costmodel.moe_layer import expert_gemm_s
from meshplan.errors import ProfileError
from meshplan.hardware_profiles.curve import Curve
from meshplan.hardware_profiles.grouped_gemm import (GROUP_TILE_ROWS, grouped_call_flops,
                                                     grouped_call_s)
from meshplan.hardware_profiles.loader import gpu_from_table

H200 = mp.Cluster.preset("dgx-h200", nodes=1, gpus_per_node=1)
PEAK = H200.gpu.peak_flops("bf16")
RISING = Curve(((1e9, 0.2), (1e12, 0.8)))


def with_curve(key, fp8=None):
    return H200.replace(gpu=replace(H200.gpu, grouped_gemm_efficiency=RISING,
                                    grouped_gemm_key=key, grouped_fp8_gemm_efficiency=fp8))


def test_a_call_is_keyed_by_its_tile_padded_flops():
    # 100 rows a group fill one 256-row tile; 300 fill two
    assert grouped_call_flops(8, 100, 64, 32) == 2.0 * 8 * GROUP_TILE_ROWS * 64 * 32
    assert grouped_call_flops(8, 300, 64, 32) == 2.0 * 8 * 512 * 64 * 32
    assert grouped_call_flops(8, 256, 64, 32) == 2.0 * 8 * 256 * 64 * 32
    assert grouped_call_flops(0, 256, 64, 32) == 0.0
    # one call over 64 groups of 256 rows runs like 16 of 1,024: the same padded work
    cl = with_curve("call")
    assert expert_gemm_s(cl, PEAK, 64, 256, 2048, 1024) == pytest.approx(
        expert_gemm_s(cl, PEAK, 16, 1024, 2048, 1024))


def test_a_profile_without_the_key_is_read_by_one_experts_flops():
    """Profiles and plan files written before the key priced each expert's GEMM on the
    curve at its own FLOPs; they still do."""
    cl = with_curve("expert")
    one = 2.0 * 256 * 2048 * 1024
    assert expert_gemm_s(cl, PEAK, 64, 256, 2048, 1024) == pytest.approx(
        64 * one / (PEAK * RISING(one)))
    # a small expert on a rising curve: slower by its own FLOPs than by the call's
    assert expert_gemm_s(cl, PEAK, 64, 256, 2048, 1024) > expert_gemm_s(
        with_curve("call"), PEAK, 64, 256, 2048, 1024)
    table = {k: v for k, v in with_curve("call").gpu.to_dict().items()
             if k != "grouped_gemm_key"}
    assert gpu_from_table("x", table, "p.toml [gpu]").grouped_gemm_key == "expert"
    back = gpu_from_table("x", with_curve("call").gpu.to_dict(), "p.toml [gpu]")
    assert back.grouped_gemm_key == "call" and back.grouped_gemm_efficiency == RISING


def test_bad_grouped_keys_name_the_value_and_the_choices():
    table = with_curve("call").gpu.to_dict()
    with pytest.raises(ProfileError, match=r"grouped_gemm_key must be one of 'call', "
                                           r"'expert', got 'layer'"):
        gpu_from_table("x", {**table, "grouped_gemm_key": "layer"}, "p.toml [gpu]")
    with pytest.raises(ProfileError, match="grouped_fp8_gemm_efficiency is keyed by the call"):
        gpu_from_table("x", {**table, "grouped_gemm_key": "expert",
                             "grouped_fp8_gemm_efficiency": [[1e9, 0.3], [1e12, 0.6]]},
                       "p.toml [gpu]")


def test_the_executors_fp8_experts_read_the_grouped_fp8_curve():
    """Where calibrate timed the fp8 grouped calls, the experts' fp8 / bf16 ratio is the two
    grouped curves' at the call; else the dense curves' at the call."""
    job = mp.Job(global_batch=8, seq_len=2048, runtime="torch", precision="fp8",
                 fp8_recipe="rowwise")
    kw = dict(rows_per_expert=512, local_experts=16, hidden=2048, fc1_width=2048,
              fc2_width=1024)
    slow8 = Curve(((1e9, 0.1), (1e12, 0.4)))
    cl = with_curve("call", fp8=slow8)
    got = fp8_experts(cl, job, **kw).gemm_ratio
    peak8 = H200.gpu.peak_flops("fp8")
    shapes = ((2048, 2048), (1024, 2048))
    b16 = sum(grouped_call_s(RISING, PEAK, 16, 512, k, n) for k, n in shapes)
    f8 = sum(grouped_call_s(slow8, peak8, 16, 512, k, n) for k, n in shapes)
    assert got == pytest.approx(f8 / b16)
    dense = fp8_experts(with_curve("call"), job, **kw).gemm_ratio
    assert got > dense       # the measured fp8 curve here is the slower
