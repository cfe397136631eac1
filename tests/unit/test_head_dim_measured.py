"""Head dims measured on the GPU itself (``attention_head_dim_ratio_measured``): added to
the published ratios, replacing one at the same head dim, and refused when malformed."""

from __future__ import annotations

import pytest

from meshplan.errors import ProfileError
from meshplan.hardware_profiles.loader import (attention_head_dims, builtin_gpu,
                                               builtin_table)


def test_h200_prices_head_dims_80_and_96_at_their_measured_ratio():
    """SDPA runs 80 and 96 in the 128-wide tile (gpus.toml): at 5.15e11 FLOPs and beyond
    they get 0.705 and 0.812 of head dim 128's efficiency; 64 keeps the published ratio."""
    gpu = builtin_gpu("H200-SXM-141GB")
    for flops in (5.15e11, 4e12):
        base = gpu.attention_efficiency_at(flops, 128)
        assert gpu.attention_efficiency_at(flops, 80) / base == pytest.approx(0.705)
        assert gpu.attention_efficiency_at(flops, 96) / base == pytest.approx(0.812)
    h100 = builtin_gpu("H100-SXM5-80GB")           # the same published 64 ratio, no measured
    assert dict(gpu.attention_head_dim_ratio)[64](1e12) == pytest.approx(
        dict(h100.attention_head_dim_ratio)[64](1e12))
    assert 80 not in dict(h100.attention_head_dim_ratio)


def _table(measured):
    t = dict(builtin_table("gpus.toml")["H200-SXM-141GB"])
    t["attention_head_dim_ratio_measured"] = measured
    return t


def test_a_measured_head_dim_replaces_the_published_one():
    dims = attention_head_dims(_table([[64, [[1e11, 0.5], [1e12, 0.5]]]]), "t")
    assert dict(dims["attention_head_dim_ratio"])[64](3e11) == pytest.approx(0.5)


@pytest.mark.parametrize("bad", [[[80.5, [[1e11, 0.7]]]], [80, [[1e11, 0.7]]], ["80"]])
def test_a_malformed_measured_ratio_is_refused_by_name(bad):
    with pytest.raises(ProfileError, match="attention_head_dim_ratio_measured"):
        attention_head_dims(_table(bad), "t")


def test_measured_ratios_need_the_published_reference():
    t = _table([[80, [[1e11, 0.7]]]])
    del t["attention_published_head_dims"]
    with pytest.raises(ProfileError, match="needs attention_published_head_dims"):
        attention_head_dims(t, "t")
