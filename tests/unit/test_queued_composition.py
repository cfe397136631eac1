"""GPU-alone compute curves (``GPUSpec.microbench_timing = "queued"``, ``meshplan calibrate
--queued-microbench``): the eager layer's gradient work and RoPE's strided products are
added to them, and to nothing else (docs/calibrate.md "Compute microbenchmarks")."""

from __future__ import annotations

from dataclasses import replace

import pytest

import meshplan as mp
from meshplan.costmodel import torch_membound as tm
from meshplan.costmodel.memory import layer_tp_params
from meshplan.errors import ProfileError
from meshplan.hardware_profiles import Cluster

GPT = mp.ModelSpec(name="g", num_layers=2, hidden_size=256, num_heads=4, num_kv_heads=4,
                   ffn_hidden_size=1024, vocab_size=512, max_seq_len=128, activation="gelu",
                   norm="layernorm", position_embedding="learned", tied_embeddings=True,
                   bias=True)
LLAMA = mp.ModelSpec(name="l", num_layers=2, hidden_size=256, num_heads=4, num_kv_heads=2,
                     ffn_hidden_size=768, vocab_size=512, max_seq_len=128, activation="swiglu",
                     norm="rmsnorm", position_embedding="rope", tied_embeddings=False,
                     bias=False)
GPU = Cluster.preset("dgx-h200", nodes=1, gpus_per_node=1).gpu


def _s(model, gpu, tokens=512):
    return tm.eager_layer_s(model, gpu, tokens=tokens, tp=1, sequence_parallel=False,
                            mlp_width=model.ffn_hidden_size, e=2)


def test_gradient_bytes_by_hand():
    # 18 B a parameter in bf16 (cast 2 + 4, accumulate 4 + 4 + 4), 12 in fp32; biases'
    # gradients read the output gradient once
    p = layer_tp_params(GPT, 1, GPT.ffn_hidden_size)
    biased = 3 * 256 + 1024 + 2 * 256          # qkv, MLP up; attention out, MLP down
    assert tm.weight_grad_bytes(GPT, tokens=512, tp=1, mlp_width=1024, e=2) == \
        pytest.approx(18 * p + 512 * biased * 2)
    q = layer_tp_params(LLAMA, 2, 768)
    assert tm.weight_grad_bytes(LLAMA, tokens=512, tp=2, mlp_width=768, e=4) == \
        pytest.approx(12 * q)


def test_the_count_covers_the_executors_block_parameters():
    torch = pytest.importorskip("torch")
    from meshplan.executor.model import Block
    for spec in (GPT, LLAMA):
        n = sum(p.numel() for p in Block(spec).parameters())
        assert layer_tp_params(spec, 1, spec.ffn_hidden_size) == n
    del torch


def test_added_to_gpu_alone_curves_only():
    copy = GPU.hbm_gbps * 1e9 * GPU.op_hbm_efficiency("residual-add")
    queued = replace(GPU, microbench_timing="queued")
    for model in (GPT, LLAMA):
        f0, b0, *_ = _s(model, GPU)
        f1, b1, *_ = _s(model, queued)
        grads = tm.weight_grad_bytes(model, tokens=512, tp=1, mlp_width=model.ffn_hidden_size,
                                     e=2)
        assert f1 == pytest.approx(f0)
        assert b1 - b0 == pytest.approx(grads / copy)


def test_rope_products_at_the_executors_rope_rate_where_timed():
    eff = dict(GPU.membound_efficiency, rope=0.07)
    queued = replace(GPU, microbench_timing="queued", membound_efficiency=eff)
    plain = replace(GPU, membound_efficiency=eff)
    f0, b0, *_ = _s(LLAMA, plain)                    # synchronized: "rope" not read
    assert (f0, b0) == pytest.approx(_s(LLAMA, GPU)[:2])
    f1, b1, *_ = _s(LLAMA, queued)
    q_k = 512 * (LLAMA.q_dim + LLAMA.kv_dim)
    copy = GPU.hbm_gbps * 1e9 * GPU.op_hbm_efficiency("residual-add")
    rope_f = 2 * 2 * q_k / (GPU.hbm_gbps * 1e9 * 0.07)
    assert f1 - f0 == pytest.approx(rope_f - 10 * 2 * q_k / copy)
    assert f1 > f0                                    # strided products are slower
    # a model without RoPE gets the gradient work only
    assert _s(GPT, replace(queued))[0] == pytest.approx(_s(GPT, GPU)[0])


def test_profile_key_round_trip_and_bad_value(tmp_path):
    from meshplan.hardware_profiles.loader import gpu_from_table
    table = {k: v for k, v in GPU.to_dict().items()}
    assert "microbench_timing" not in table
    q = replace(GPU, microbench_timing="queued").to_dict()
    assert q["microbench_timing"] == "queued"
    assert gpu_from_table(q["name"], q, "p.toml").microbench_timing == "queued"
    with pytest.raises(ProfileError, match="microbench_timing must be .queued. or absent"):
        gpu_from_table(q["name"], dict(q, microbench_timing="sync"), "p.toml")


def test_calibrate_passes_the_flag_to_its_children():
    import argparse

    from meshplan.commands.calibrate import add_arguments, child_argv
    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(["--out", "x.toml", "--queued-microbench"])
    assert args.queued_microbench and "--queued-microbench" in child_argv(args)
    assert "--queued-microbench" not in child_argv(p.parse_args(["--out", "x.toml"]))


def test_queued_repredict_swaps_the_keys_and_sets_the_flag(tmp_path):
    import json
    import sys
    import tomllib
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root / "benchmarks"))
    import queued_repredict as qr
    data = root / "docs" / "benchmarks" / "data"
    qmb = json.loads((data / "queued_microbench_h200_20261129_branch.json").read_text())
    made = qr.queued_profiles(data / "profiles" / "round43", qmb, tmp_path)
    assert set(made) == {"profile_part1of2.toml", "profile_part2of2.toml",
                         "generic_layer_grid.toml"}
    doc = tomllib.loads(made["profile_part1of2.toml"].read_text())
    keys = qmb["modes"]["queued"]["gpu"]
    assert doc["gpu"]["microbench_timing"] == "queued"
    assert doc["gpu"]["membound_efficiency"] == pytest.approx(keys["membound_efficiency"])
    assert "rope" in doc["gpu"]["membound_efficiency"]
    # the rows stay the round's own
    old = tomllib.loads((data / "profiles" / "round43" / "profile_part1of2.toml").read_text())
    assert len(doc["layers"]) == len(old["layers"])
    from meshplan.hardware_profiles.calibrated import load_profile
    assert load_profile(str(made["profile_part1of2.toml"])).gpu.microbench_timing == "queued"
