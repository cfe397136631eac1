"""A calibrated attention curve read at other head dims: the base GPU's published ratios,
referred to the head dim the calibration timed (calibrated.with_base_attention_head_dims)."""

from dataclasses import replace

import pytest

from meshplan.hardware_profiles.calibrated import with_base_attention_head_dims
from meshplan.hardware_profiles.curve import Curve
from meshplan.hardware_profiles.loader import builtin_gpu

H200 = "H200-SXM-141GB"
TIMED = Curve(((1e10, 0.10), (1e12, 0.40), (1e13, 0.45)))


def _calibrated(base: str = H200):
    """A profile's GPU as load_profile builds it before the ratios: its own curve, none."""
    return replace(builtin_gpu(base), attention_efficiency=TIMED, attention_head_dim=0,
                   attention_head_dim_ratio=())


@pytest.mark.parametrize("flops", [3e10, 1e11, 1e12, 5e12])
def test_one_timed_head_dim_reads_its_own_curve_and_the_others_by_the_published_ratio(flops):
    ref = builtin_gpu(H200)
    gpu = with_base_attention_head_dims(_calibrated(), H200, [64, 64, 64], curve_timed=True)
    assert gpu.attention_head_dim == 64
    assert gpu.attention_efficiency_at(flops, 64) == pytest.approx(TIMED(flops))
    want = TIMED(flops) * ref.attention_head_dim_factor(flops, 128) / ref.attention_head_dim_factor(
        flops, 64)
    assert gpu.attention_efficiency_at(flops, 128) == pytest.approx(want, rel=0.02)
    assert gpu.attention_efficiency_at(flops, 128) > gpu.attention_efficiency_at(flops, 64)


def test_a_timed_head_dim_between_the_published_ones_is_referred_by_interpolation():
    gpu = with_base_attention_head_dims(_calibrated(), H200, [112], curve_timed=True)
    assert gpu.attention_head_dim == 112
    assert gpu.attention_efficiency_at(1e12, 112) == pytest.approx(TIMED(1e12))
    assert gpu.attention_efficiency_at(1e12, 128) > TIMED(1e12)


def test_pooled_head_dims_keep_one_curve_for_every_head_dim():
    gpu = with_base_attention_head_dims(_calibrated(), H200, [64, 128], curve_timed=True)
    assert gpu.attention_head_dim_ratio == ()
    assert gpu.attention_efficiency_at(1e12, 64) == gpu.attention_efficiency_at(1e12, 128)


def test_an_untimed_curve_is_the_base_curve_with_the_base_ratios():
    ref = builtin_gpu(H200)
    gpu = with_base_attention_head_dims(_calibrated(), H200, [], curve_timed=False)
    assert gpu.attention_head_dim == ref.attention_head_dim
    assert gpu.attention_head_dim_ratio == ref.attention_head_dim_ratio


def test_a_base_without_published_ratios_or_no_base_changes_nothing():
    for base in ("A100-SXM4-80GB", None):
        cal = _calibrated("A100-SXM4-80GB")
        assert with_base_attention_head_dims(cal, base, [64], curve_timed=True) is cal
