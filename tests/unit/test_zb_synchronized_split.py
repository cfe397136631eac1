"""Zero-bubble rows timed synchronized (calibrate's default split timing): their I + W beyond
one fused backward is the CPU's graph walk, so the GPU's split is scaled to the fused
backward (``costmodel.build.synchronized_split_gpu``) and the synchronized times stay the
CPU's."""

from __future__ import annotations

import pytest

from meshplan.costmodel.build import synchronized_split_gpu
from meshplan.costmodel.estimate import layer_tables

from test_sustained_duty import _round43


def test_the_split_is_scaled_to_the_fused_backward_in_its_measured_proportion():
    i, w = synchronized_split_gpu((3.66, 2.41), 4.94)
    assert i + w == pytest.approx(4.94) and i / w == pytest.approx(3.66 / 2.41)
    # a split within the fused backward is GPU time as measured
    assert synchronized_split_gpu((2.0, 2.5), 4.94) == (2.0, 2.5)
    assert synchronized_split_gpu((2.0, 2.5), 0.0) == (2.0, 2.5)


def test_round43_zero_bubble_prices_the_gpu_at_the_fused_backward_and_the_cpu_as_timed():
    """y23 (t43m06, pp 2 zero-bubble, its profile's split timed synchronized): the layer's
    GPU backward is the 1F1B layout's (y22's model, same profile) at the same micro-batch,
    and no split excess is left for the first stage to take off; the host bound still sees
    the synchronized split."""
    model, cluster, job, lay = _round43("y23")
    zb = layer_tables(model, cluster, job, lay)
    fused = layer_tables(model, cluster, job, lay.replace(schedule="1f1b"))
    assert zb.layer_backward_s == pytest.approx(fused.layer_backward_s, rel=1e-9)
    assert 0 < zb.layer_wgrad_s < zb.layer_backward_s
    assert zb.zb_split_excess_s == pytest.approx(0.0, abs=1e-12)
    # the CPU keeps the synchronized split (its two autograd passes): more than the fused
    # backward's dispatch, and more than the GPU's split
    assert zb.cpu_known and zb.cpu_layer_s > fused.cpu_layer_s
    assert zb.cpu_layer_s > zb.layer_backward_s
