"""GPU-alone GEMM and attention curves (GPUSpec.gemm_efficiency_alone /
attention_efficiency_alone): calibrate writes them beside its synchronized curves, the loader
reads them, and the analytical compiled bf16 layer prices its GEMMs and attention at them and
counts its weights' gradient work; eager and fp8 layers, and GPUs without them, price as
before."""

from dataclasses import replace

import pytest

from meshplan.calibrate.profile import build_profile
from meshplan.costmodel import torch_membound
from meshplan.costmodel.compute import hbm_s, layer_cost
from meshplan.errors import ProfileError
from meshplan.hardware_profiles import Cluster
from meshplan.hardware_profiles.curve import Curve
from meshplan.hardware_profiles.loader import builtin_gpu, gpu_from_table
from meshplan.spec import Job, ModelSpec

H200 = builtin_gpu("H200-SXM-141GB")
GPT = ModelSpec(name="g", num_layers=4, hidden_size=2048, num_heads=16, vocab_size=32000,
                ffn_hidden_size=8192)
# 1.5 times the datasheet's curves everywhere
FAST = H200.gemm_efficiency.scaled(1.5)
FAST_ATTN = H200.attention_efficiency.scaled(1.5)
ALONE = replace(H200, gemm_efficiency_alone=FAST, attention_efficiency_alone=FAST_ATTN)


def _cost(gpu, *, compiled=True, precision="bf16", mode="none"):
    job = Job(global_batch=8, seq_len=2048, precision=precision, runtime="torch",
              **({"fp8_recipe": "tensorwise"} if precision == "fp8" else {}))
    cluster = Cluster.preset("dgx-h100", nodes=1, gpus_per_node=1)
    return layer_cost(GPT, replace(cluster, gpu=gpu), job, micro_batch=2, tp=1,
                      sequence_parallel=False, recompute=mode, tp_link=None, compiled=compiled)


def test_gpu_alone_is_the_gpu_with_those_curves_only_where_both_were_timed():
    assert H200.gpu_alone() is None                            # the datasheet: none
    assert replace(H200, gemm_efficiency_alone=FAST).gpu_alone() is None
    g = ALONE.gpu_alone()
    assert g.gemm_efficiency is FAST and g.attention_efficiency is FAST_ATTN
    assert g.microbench_timing == "queued"
    queued = replace(H200, microbench_timing="queued")         # main curves already alone
    assert queued.gpu_alone() is queued


def test_a_compiled_bf16_layer_runs_its_gemms_and_attention_at_the_alone_curves():
    sync, alone = _cost(H200), _cost(ALONE)
    assert alone.forward.gemm_s == pytest.approx(sync.forward.gemm_s / 1.5)
    assert alone.forward.attention_s == pytest.approx(sync.forward.attention_s / 1.5)
    # the weights' gradient work, at the residual add's rate, joins the backward
    wg = hbm_s(H200, torch_membound.weight_grad_bytes(GPT, tokens=2 * 2048, tp=1,
                                                      mlp_width=8192, e=2), "residual-add")
    assert wg > 0
    assert alone.backward.memory_bound_s == pytest.approx(sync.backward.memory_bound_s + wg)
    assert alone.forward.memory_bound_s == pytest.approx(sync.forward.memory_bound_s)


def test_eager_fp8_and_gpus_without_alone_curves_price_as_before():
    for kw in ({"compiled": False}, {"precision": "fp8"}):
        a, b = _cost(ALONE, **kw), _cost(H200, **kw)
        assert a.forward.total_s == b.forward.total_s
        assert a.backward.total_s == b.backward.total_s


def test_the_table_keys_round_trip_and_are_checked():
    table = ALONE.to_dict()
    assert table["gemm_efficiency_alone"] == FAST.to_list()
    back = gpu_from_table("x", table, "t")
    assert back.gemm_efficiency_alone == FAST and back.attention_efficiency_alone == FAST_ATTN
    assert "gemm_efficiency_alone" not in H200.to_dict()
    with pytest.raises(ProfileError, match="increasing"):
        gpu_from_table("x", {**table, "gemm_efficiency_alone": [[1e9, 0.5], [1e8, 0.4]]}, "t")


def test_build_profile_turns_the_alone_rows_into_curves():
    gemm = {"label": "x", "m": 2048, "k": 2048, "n": 8192, "iters": 5}
    attn = {"batch": 2, "seq": 2048, "heads": 16, "head_dim": 128, "iters": 5}
    doc = build_profile(
        measurements={"gemm": [{**gemm, "seconds": 1e-3}],
                      "gemm_alone": [{**gemm, "seconds": 5e-4}],
                      "attention": [{**attn, "seconds": 4e-3}],
                      "attention_alone": [{**attn, "seconds": 2e-3}]},
        base=H200, device="cuda", provenance={})
    g = doc["gpu"]
    assert "gemm_efficiency_alone" in doc["measured"]
    assert "attention_efficiency_alone" in doc["measured"]
    def at(key, x):
        return Curve(tuple(map(tuple, g[key])))(x)
    x = 2.0 * 2048 * 2048 * 8192
    assert at("gemm_efficiency_alone", x) == pytest.approx(2 * at("gemm_efficiency", x),
                                                          rel=1e-3)      # half the time
    xa = doc["measurements"]["attention"][0]["executed_flops"]
    assert at("attention_efficiency_alone", xa) == pytest.approx(
        2 * at("attention_efficiency", xa), rel=1e-3)
