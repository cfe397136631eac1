"""Zero-bubble's first stage runs one fused backward in its W action under torch
(:func:`meshplan.costmodel.runtime.zb_first_stage_fused`)."""
from dataclasses import replace

import pytest

from meshplan.costmodel.runtime import zb_first_stage_fused
from meshplan.costmodel.tables import layer_tables
from meshplan.hardware_profiles import Cluster
from meshplan.spec import Job, Layout, ModelSpec

MODEL = ModelSpec(name="m", num_layers=8, hidden_size=1024, num_heads=16, vocab_size=32000,
                  max_seq_len=1024)
CLUSTER = Cluster.preset("dgx-h100", nodes=1, gpus_per_node=2)
JOB = Job(global_batch=16, seq_len=1024, runtime="torch")
ZB = Layout(pp=2, micro_batch=4, schedule="zero-bubble", recompute="selective")


def test_predicate():
    assert zb_first_stage_fused(JOB, ZB)
    assert not zb_first_stage_fused(JOB, ZB.replace(schedule="1f1b"))
    assert not zb_first_stage_fused(Job(global_batch=16, seq_len=1024, runtime="megatron"), ZB)


def test_first_stage_backward_is_all_weight_pass_and_fused():
    t = layer_tables(MODEL, CLUSTER, JOB, ZB)
    assert zb_first_stage_fused(t.job, t.layout)
    # a measured split that costs 2 ms a layer more than the fused backward
    split = replace(t, layer_backward_s=t.layer_backward_s + 2e-3, zb_split_excess_s=2e-3)
    f, b, w = split.stage_times([4, 4])
    f0, b0, w0 = t.stage_times([4, 4])
    assert b[0] == pytest.approx(b0[0])            # stage 0: the fused backward
    assert w[0] == b[0]                            # ... all in its W, its I empty
    k = t.slowdown or (1.0, 1.0)                     # the p2p kernels' slowdown per stage
    assert b[1] == pytest.approx(b0[1] + 4 * 2e-3 * k[1])  # the others: split B + W
    assert w[1] == pytest.approx(w0[1])
    # the same tables where the rule does not apply (runtime megatron: a split I + W)
    off = replace(split, job=replace(JOB, runtime="megatron"))
    assert not zb_first_stage_fused(off.job, off.layout)
    assert off.stage_times([4, 4])[1][0] == pytest.approx(b0[0] + 4 * 2e-3 * k[0])
    assert off.stage_times([4, 4])[2][0] < b0[0]
