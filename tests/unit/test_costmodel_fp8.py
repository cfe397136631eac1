"""meshplan.costmodel.fp8: the recipe table, cast traffic, copies, all-gathers, GEMM time."""

from __future__ import annotations

import pytest

import meshplan as mp
from meshplan.costmodel import fp8
from meshplan.hardware_profiles.curve import Curve
from meshplan.spec import FP8_RECIPES

M, K, N = 8192, 4096, 4096


def test_the_table_defines_every_recipe_the_spec_accepts():
    assert tuple(fp8.RECIPES) == FP8_RECIPES
    for name in FP8_RECIPES:
        assert fp8.fp8_gemms(name) == ("forward", "dgrad", "wgrad")
    with pytest.raises(mp.ConfigError, match="'mx' is not known.*'mxfp8'"):
        fp8.recipe("mx")


def test_formats_follow_the_recipes():
    t, b = fp8.RECIPES["tensorwise"], fp8.RECIPES["blockwise"]
    assert (t.x_fwd.fmt, t.w_fwd.fmt, t.dy_dgrad.fmt) == ("e4m3", "e4m3", "e5m2")  # HYBRID
    assert {op.fmt for op in b.operands().values()} == {"e4m3"}       # DeepSeek-V3: e4m3 only
    assert b.x_fwd.block == (1, 128) and b.w_fwd.block == (128, 128)


def test_tensorwise_cast_traffic_counts_each_pass():
    """Forward: x read twice (amax, cast) at 2 bytes and written once at 1. Backward: dy
    the same, x re-cast with its saved scale (one read), three fp8 transposes."""
    c = fp8.linear_cast_traffic(M, K, N, "tensorwise", act_bytes=2, weight_bytes=4)
    x, w, dy = M * K, N * K, M * N
    assert c.forward_bytes == 5 * x + 4
    assert c.backward_bytes == (5 * dy + 4) + 2 * dy + (3 * x + 4) + 2 * x
    assert c.weight_bytes == (9 * w + 4) + (5 * w + 4) + 2 * w
    # amax + cast for x, W, dy; re-cast + transpose for W and x; a transpose for dy
    assert c.kernels == 2 + 2 + 2 + (1 + 1) + (1 + 1) + 1


def test_delayed_scaling_skips_the_amax_pass_and_fused_transposes_skip_the_reread():
    dyn = fp8.linear_cast_traffic(M, K, N, "tensorwise")
    delayed = fp8.linear_cast_traffic(M, K, N, "delayed")
    assert dyn.forward_bytes - delayed.forward_bytes == 2 * M * K       # one bf16 read less
    fused = fp8.linear_cast_traffic(M, K, N, "tensorwise", fused_cast_transpose=True)
    assert dyn.backward_bytes - fused.backward_bytes == M * N + M * K   # no re-read of fp8


def test_axiswise_recipes_recast_every_operand():
    """rowwise and blockwise re-cast x and dy along the token axis for wgrad: more bytes
    than tensorwise; blockwise reuses the weight's 128 × 128 scales for the transpose."""
    t, r, b = (fp8.linear_cast_traffic(M, K, N, n) for n in ("tensorwise", "rowwise",
                                                                "blockwise"))
    assert r.backward_bytes > t.backward_bytes and b.backward_bytes > t.backward_bytes
    assert b.weight_bytes < r.weight_bytes


def test_mxfp8_needs_blackwell():
    with pytest.raises(mp.ConfigError, match="'mxfp8' needs MX block-scaled tensor cores.*"
                                             "'H100-SXM5-80GB'"):
        fp8.check_recipe_supported("mxfp8", "H100-SXM5-80GB")
    fp8.check_recipe_supported("mxfp8", "B200")
    fp8.check_recipe_supported("blockwise", "H100-SXM5-80GB")


def test_weight_copies_and_zero3_allgather():
    params = [3 * 4096 * 4096, 4096 * 4096, 2 * 4096 * 14336, 14336 * 4096]
    assert fp8.fp8_weight_copy_bytes(params, cached=True) == 2 * sum(params)
    assert fp8.fp8_weight_copy_bytes(params, cached=False) == 2 * max(params)
    assert fp8.zero3_allgather_bytes(10**9, fp8_allgather=False) == 2e9
    assert fp8.zero3_allgather_bytes(10**9, fp8_allgather=True, tensors=4) == 1e9 + 16


def test_fp8_gemm_time_uses_its_own_curve():
    curve = Curve(((1e9, 0.2), (1e12, 0.6)))
    flops = 2.0 * M * K * N
    t = fp8.fp8_gemm_time_s(flops, 1979e12, curve)
    assert t == pytest.approx(flops / (1979e12 * curve(flops)))
    # small GEMMs gain less: the same curve gives a lower share of the peak
    assert fp8.fp8_gemm_time_s(1e9, 1979e12, curve) * 1979e12 / 1e9 > 1 / 0.6
    with pytest.raises(mp.ConfigError, match="efficiency"):
        fp8.fp8_gemm_time_s(flops, 1979e12, lambda f: 1.5)
    assert fp8.linear_gemm_flops(M, K, N) == {g: flops for g in fp8.GEMMS}


def test_cast_time_and_error_bounds():
    assert fp8.cast_time_s(3350e9 * 0.8, 3350.0, 0.8) == pytest.approx(1.0)   # GB/s
    assert fp8.roundtrip_error_bound("e4m3") == 2 ** -4
    assert fp8.roundtrip_error_bound("e5m2") == 2 ** -3
