"""The share of a compiled block's forward its backward re-runs under full recomputation
(GPUSpec.compiled_full_rerun_share): read off a profile's compiled rows at load, the base
GPU's where it has none, and what the analytical compiled layer charges for it."""

from dataclasses import replace
from pathlib import Path

import pytest

from meshplan.costmodel.compute import layer_cost
from meshplan.errors import ProfileError
from meshplan.hardware_profiles import Cluster
from meshplan.hardware_profiles.calibrated import load_profile, with_rerun_share
from meshplan.hardware_profiles.loader import builtin_gpu, gpu_from_table
from meshplan.spec import Job, ModelSpec

ROOT = Path(__file__).resolve().parents[2]
PROFILES = ROOT / "docs/benchmarks/data/profiles"
H200 = builtin_gpu("H200-SXM-141GB")
LLAMA = ModelSpec(name="l", num_layers=4, hidden_size=2048, num_heads=16, vocab_size=32000,
                  ffn_hidden_size=5632, activation="swiglu", norm="rmsnorm",
                  position_embedding="rope", bias=False)


SHAPE = "h2048-f5632-q16-kv16-d128-swiglu-rmsnorm-rope-nobias-drop0"


def _row(mode, fwd, bwd, mb=2, **kw):
    return {"shape": SHAPE, "seq_len": 2048, "tp": 1, "sequence_parallel": False,
            "zero": 0, "micro_batch": mb, "recompute": mode, "compile": True,
            "precision": "bf16", "forward_s": fwd, "backward_s": bwd, **kw}


def test_the_share_is_the_median_of_the_full_rows_extra_backward_over_the_forward():
    rows = [_row("none", 1.0, 2.0), _row("full", 1.0, 2.7),            # 0.7
            _row("none", 2.0, 4.0, mb=4), _row("full", 2.0, 5.6, mb=4),  # 0.8
            _row("none", 4.0, 8.0, mb=8), _row("full", 4.0, 11.6, mb=8),  # 0.9
            # not read: fp8, a tensor-parallel pair, a full row without its none twin
            _row("none", 1.0, 2.0, precision="fp8"), _row("full", 1.0, 2.1, precision="fp8"),
            _row("none", 1.0, 2.0, tp=2), _row("full", 1.0, 2.0, tp=2),
            _row("full", 1.0, 9.0, mb=16),
            # an MoE layer (its routed part is priced apart), and a ZeRO-1 full row whose
            # none twin is ZeRO-0: not a pair
            _row("none", 1.0, 2.0, shape=SHAPE + "-moe8k2f1024"),
            _row("full", 1.0, 2.1, shape=SHAPE + "-moe8k2f1024"),
            _row("full", 1.0, 9.0, mb=4, zero=1)]
    assert with_rerun_share(H200, rows, None).compiled_full_rerun_share == pytest.approx(0.8)


def test_without_a_pair_the_base_gpus_share_stands():
    bare = replace(H200, compiled_full_rerun_share=0.0)
    assert with_rerun_share(bare, [_row("none", 1.0, 2.0)], "H200-SXM-141GB") \
        .compiled_full_rerun_share == H200.compiled_full_rerun_share == 0.742
    assert with_rerun_share(bare, [], None).compiled_full_rerun_share == 0.0


def test_a_stored_profile_reads_its_own_share():
    prof = load_profile(PROFILES / "profile_h200x1_fp8h20_20261201.toml")
    assert prof.gpu.compiled_full_rerun_share == pytest.approx(0.7055, abs=1e-3)
    # fp8h18 timed no compiled recompute-none row: the datasheet's
    prof = load_profile(PROFILES / "profile_h200x1_fp8h18_20261201.toml")
    assert prof.gpu.compiled_full_rerun_share == 0.742


def test_the_analytical_compiled_layer_re_runs_that_share_of_its_forward():
    job = Job(global_batch=8, seq_len=2048, precision="bf16", runtime="torch")
    cluster = Cluster.preset("dgx-h100", nodes=1, gpus_per_node=1)

    def cost(gpu, compiled, mode="full"):
        return layer_cost(LLAMA, replace(cluster, gpu=gpu), job, micro_batch=2, tp=1,
                          sequence_parallel=False, recompute=mode, tp_link=None,
                          compiled=compiled)
    full = cost(H200, True)
    assert full.recompute.total_s == pytest.approx(0.742 * full.forward.total_s)
    whole = cost(replace(H200, compiled_full_rerun_share=0.0), True)
    assert whole.recompute.total_s == pytest.approx(whole.forward.total_s)
    eager = cost(H200, False)                  # eager re-runs the forward whole
    assert eager.recompute.total_s == pytest.approx(eager.forward.total_s)


def test_the_table_key_round_trips_and_is_checked():
    table = H200.to_dict()
    assert table["compiled_full_rerun_share"] == 0.742
    assert gpu_from_table("x", table, "t").compiled_full_rerun_share == 0.742
    with pytest.raises(ProfileError, match="compiled_full_rerun_share must be in"):
        gpu_from_table("x", {**table, "compiled_full_rerun_share": 1.5}, "t")
