"""DDP's overlap interference: the probe's arithmetic and sizing, the profile key, and the cost
model using it for DDP's gradient all-reduce (meshplan/calibrate/bench_ddp_overlap.py)."""

from dataclasses import replace

import pytest

from meshplan.calibrate.bench_ddp_overlap import (MAX_LAYERS, interference_from, probe_layers,
                                                  probe_micro_batch)
from meshplan.calibrate.bench_overlap import BUCKET_BYTES
from meshplan.costmodel import estimate
from meshplan.hardware_profiles import Cluster
from meshplan.spec import Job, Layout, ModelSpec

MODEL = ModelSpec.preset("gpt-1.7b")
JOB = Job(global_batch=16, seq_len=2048)


def test_interference_inverts_the_cost_models_exposed_formula():
    from meshplan.costmodel.comm import exposed
    # backward 10 ms, all-reduce 4 ms alone, together 12 ms: 2 of the 4 ms still cost
    assert interference_from(0.010, 0.012, 0.004) == pytest.approx(0.5)
    assert exposed(0.004, 0.010, interference_from(0.010, 0.012, 0.004)) == pytest.approx(0.002)
    # all-reduce longer than the backward: its excess is exposed before any interference
    k = interference_from(0.004, 0.0125, 0.010)
    assert k == pytest.approx((0.0085 - 0.006) / 0.004)
    assert exposed(0.010, 0.004, k) == pytest.approx(0.0085)
    assert interference_from(0.010, 0.009, 0.004) == 0.0      # noise: never below 0
    assert interference_from(0.010, 0.100, 0.004) == 2.0      # nor above 2
    assert interference_from(0.0, 0.001, 0.0) == 0.0


def test_probe_stacks_enough_blocks_for_eight_buckets_within_the_model():
    assert probe_layers(150_000_000, 12) == 1                  # 600 MB a block: one is enough
    per_block = 8 * BUCKET_BYTES // 4 // 3 + 1                 # a third of 8 buckets a block
    assert probe_layers(per_block, 12) == 3
    assert probe_layers(1000, 4) == 4                          # never more than the model
    assert probe_layers(1000, 64) == MAX_LAYERS


def test_probe_micro_batch_is_the_middle_of_the_calibrated_sizes():
    assert probe_micro_batch((2, 4, 8, 16)) == 8
    assert probe_micro_batch((16, 1, 4)) == 4
    assert probe_micro_batch(None) == 4


def _with(c: Cluster, **kw) -> Cluster:
    return replace(c, gpu=replace(c.gpu, **kw))


def test_ddp_allreduce_is_priced_with_the_ddp_probe_where_the_profile_has_it():
    c = Cluster.preset("dgx-h100", nodes=1, gpus_per_node=4)
    lay = Layout(dp=4, micro_batch=1)
    gemm_only = estimate(MODEL, _with(c, overlap_interference=1.0), JOB, lay)
    both = estimate(MODEL, _with(c, overlap_interference=1.0, ddp_overlap_interference=0.0),
                    JOB, lay)
    ddp_only = estimate(MODEL, _with(c, overlap_interference=0.0, ddp_overlap_interference=0.0),
                        JOB, lay)
    assert gemm_only.time.dp_comm_exposed_s == pytest.approx(gemm_only.time.dp_comm_total_s)
    # the DDP probe's value replaces the GEMM probe's for the gradient all-reduce ...
    assert both.time.dp_comm_exposed_s == pytest.approx(ddp_only.time.dp_comm_exposed_s)
    assert both.time.dp_comm_exposed_s < gemm_only.time.dp_comm_exposed_s
    assert both.step_time_s < gemm_only.step_time_s
    # ... and only there: without it the GEMM probe's value still applies
    assert c.gpu.ddp_overlap_interference is None
    assert c.gpu.dp_overlap_interference == c.gpu.overlap_interference


def test_fsdp2_layer_collectives_are_priced_with_the_blocks_probe_too():
    """FSDP2's per-layer gathers and reduce-scatters overlap the same blocks as DDP's
    all-reduce: without FSDP2 rows they take the blocks' share, not the GEMM probe's."""
    c = Cluster.preset("dgx-h100", nodes=1, gpus_per_node=4)
    job = Job(global_batch=16, seq_len=2048, runtime="torch")
    for zero in (2, 3):
        lay = Layout(dp=4, micro_batch=2, zero=zero)
        gemm = estimate(MODEL, _with(c, overlap_interference=1.0), job, lay)
        blocks = estimate(MODEL, _with(c, overlap_interference=1.0,
                                       ddp_overlap_interference=0.0), job, lay)
        same = estimate(MODEL, _with(c, overlap_interference=0.0,
                                     ddp_overlap_interference=0.0), job, lay)
        assert blocks.time.zero3_gather_s < gemm.time.zero3_gather_s
        assert blocks.step_time_s < gemm.step_time_s
        # the GEMM probe's share no longer reaches them where the blocks' is measured
        assert blocks.time.zero3_gather_s == pytest.approx(same.time.zero3_gather_s)


def test_profile_reads_and_checks_ddp_overlap_interference(tmp_path):
    from meshplan.calibrate.profile import build_profile
    from meshplan.calibrate.tomlfile import dumps
    from meshplan.errors import ProfileError
    from meshplan.hardware_profiles import builtin_gpu
    from meshplan.hardware_profiles.calibrated import load_profile
    rows = {"overlap": [{"kind": "overlap_interference", "value": 1.2},
                        {"kind": "ddp_overlap_interference", "value": 0.3},
                        {"kind": "ddp_overlap_interference", "value": 0.5}]}
    doc = build_profile(measurements=rows, base=builtin_gpu("H100-SXM5-80GB"), device="cuda",
                        provenance={"device": "cuda"})
    assert doc["gpu"]["ddp_overlap_interference"] == pytest.approx(0.4)   # the median
    p = tmp_path / "p.toml"
    p.write_text(dumps(doc))
    gpu = load_profile(str(p)).gpu
    assert (gpu.overlap_interference, gpu.dp_overlap_interference) == pytest.approx((1.2, 0.4))
    doc["gpu"]["ddp_overlap_interference"] = -0.1
    p.write_text(dumps(doc))
    with pytest.raises(ProfileError, match="ddp_overlap_interference must be >= 0, got -0.1"):
        load_profile(str(p))
