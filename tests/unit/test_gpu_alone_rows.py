"""GPU-alone GEMM and attention rows: calibrate records them under [measurements] with their
efficiencies and writes no [gpu] key for them (priced, they made held-out steps worse:
fp8h48 / fp8h49); benchmarks/compiled_composition.py composes compiled layers from them;
benchmarks/split_profile.py splits a two-model profile; the fp8h48 / fp8h49 draw."""

import json
import random
import sys
import tomllib
import warnings
from pathlib import Path

import pytest

from meshplan.calibrate.profile import build_profile
from meshplan.hardware_profiles.calibrated import load_profile
from meshplan.hardware_profiles.loader import builtin_gpu
from meshplan.spec import ModelSpec

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import compiled_composition as cc  # noqa: E402
import draw_models as dm  # noqa: E402
import split_profile as sp  # noqa: E402

H200 = builtin_gpu("H200-SXM-141GB")
PROFILES = ROOT / "docs" / "benchmarks" / "data" / "profiles"
BOTH = PROFILES / "profile_h200x1_fp8h48_fp8h49_20261204.toml"


def test_build_profile_keeps_the_alone_rows_efficiencies_and_writes_no_gpu_key():
    gemm = {"label": "x", "m": 2048, "k": 2048, "n": 8192, "iters": 5}
    attn = {"batch": 2, "seq": 2048, "heads": 16, "head_dim": 128, "iters": 5}
    doc = build_profile(
        measurements={"gemm": [{**gemm, "seconds": 1e-3}],
                      "gemm_alone": [{**gemm, "seconds": 5e-4}],
                      "attention": [{**attn, "seconds": 4e-3}],
                      "attention_alone": [{**attn, "seconds": 2e-3}]},
        base=H200, device="cuda", provenance={})
    meas = doc["measurements"]
    assert meas["gemm_alone"][0]["efficiency"] == pytest.approx(
        2 * meas["gemm"][0]["efficiency"])                        # half the time
    assert meas["attention_alone"][0]["efficiency"] == pytest.approx(
        2 * meas["attention"][0]["efficiency"])
    assert not any("alone" in k for k in doc["gpu"]) and not any(
        "alone" in k for k in doc["measured"])


def test_the_two_model_profile_loads_without_warnings_and_composes_its_rows():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_profile(BOTH)       # its [gpu] alone keys are known and not read
    recs = cc.rows_errors(str(BOTH))
    assert len(recs) == 12 and all("alone" in r for r in recs)
    # as docs/benchmarks/fp8_checks.md records it: 16.2 % slow at the synchronized curves,
    # 3.3 % composed from the GPU-alone ones
    assert sum(abs(r["sync"]) for r in recs) / 12 == pytest.approx(0.162, abs=0.001)
    assert sum(abs(r["alone"]) for r in recs) / 12 == pytest.approx(0.033, abs=0.001)


def test_a_profile_without_alone_rows_composes_at_the_synchronized_curves_only():
    recs = cc.rows_errors(str(PROFILES / "profile_h200x1_fp8h20_20261201.toml"))
    assert recs and not any("alone" in r for r in recs)


def test_split_profile_keeps_one_models_rows_and_refuses_what_it_cannot(tmp_path, capsys):
    gpt, llama = tmp_path / "g.toml", tmp_path / "l.toml"
    assert sp.main([str(BOTH), f"m01-gpt-mqa-1.62b={gpt}", f"m03-llama-gqa-3.08b={llama}"]) == 0
    g = tomllib.loads(gpt.read_text())
    assert {r["model"] for r in g["layers"] + g["ends"]} == {"m01-gpt-mqa-1.62b"}
    assert g["provenance"]["rows_of"] == "m01-gpt-mqa-1.62b"
    assert g["gpu"] == tomllib.loads(BOTH.read_text())["gpu"]
    with pytest.raises(SystemExit):
        sp.main([str(BOTH), f"nope={tmp_path / 'x.toml'}"])
    assert "its models: m01-gpt-mqa-1.62b, m03-llama-gqa-3.08b" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        sp.main([str(BOTH), f"m01-gpt-mqa-1.62b={gpt}"])          # exists: not overwritten


def test_the_committed_models_are_the_first_gpt_and_the_first_llama_of_the_draw():
    """``draw_models.py --seed 4152 --min-params 1.2e9 --max-params 4.0e9``: GPT, GPT,
    Llama, ... in draw order."""
    rng = random.Random(4152)
    models = [dm.draw_model(rng, f"m{k + 1:02d}", min_params=1.2e9, max_params=4.0e9)
              for k in range(3)]
    assert [m.activation for m in models] == ["gelu", "gelu", "swiglu"]
    for check, model in (("fp8h48", models[0]), ("fp8h49", models[2])):
        path = ROOT / "benchmarks" / "sets" / check / "m01.json"
        assert ModelSpec(**json.loads(path.read_text())) == model


@pytest.mark.parametrize("seed, gpt, llama, first_layouts", [
    (4153, ("fp8h50", 1), ("fp8h51", 0),
     ["mb8-compiled", "mb4-full-compiled", "mb1-full-compiled", "mb8-selective-compiled"]),
    (4154, ("fp8h52", 0), ("fp8h53", 1),
     ["mb8-selective-compiled", "mb16-full-compiled", "mb1-selective-compiled"])])
def test_the_later_pairs_are_the_first_gpt_and_the_first_llama_of_their_seed(
        seed, gpt, llama, first_layouts):
    """fp8h50 / fp8h51 (seed 4153: Llama, GPT, ... in draw order) and fp8h52 / fp8h53 (seed
    4154: GPT, Llama, ...): ``draw_models.py --seed N --min-params 1.2e9 --max-params 4.0e9``,
    at the compiled layouts drawn from the same seed."""
    import moe_sync_gpu as ms
    rng = random.Random(seed)
    models = [dm.draw_model(rng, f"m{k + 1:02d}", min_params=1.2e9, max_params=4.0e9)
              for k in range(2)]
    for (check, k), activation in ((gpt, "gelu"), (llama, "swiglu")):
        assert models[k].activation == activation
        path = ROOT / "benchmarks" / "sets" / check / "m01.json"
        assert ModelSpec(**json.loads(path.read_text())) == models[k]
    drawn = [n for n, _ in ms.SETS[f"drawn-{seed}c"]]
    assert drawn[:len(first_layouts)] == first_layouts


def test_the_alone_rows_load_as_curves_that_only_the_carrying_ratio_reads():
    """A profile with GPU-alone rows loads their curves beside (not instead of) the
    synchronized ones; ``gpu_alone`` swaps them in for nearest_rows' ratio only."""
    from meshplan import Cluster, Job
    from meshplan.costmodel.nearest_rows import TransferredTables
    from meshplan.hardware_profiles.calibrated import apply_profile
    h100 = PROFILES / "profile_h100x1_moeh64h100_20261205.toml"
    gpu = load_profile(h100).gpu
    gemm, attention = gpu.alone_curves
    doc = tomllib.loads(h100.read_text())
    r = doc["measurements"]["gemm_alone"][0]
    assert gemm(r["flops"]) == pytest.approx(r["efficiency"], rel=0.05)
    alone = gpu.gpu_alone()
    assert alone.gemm_efficiency is gemm and alone.attention_efficiency is attention
    assert alone.microbench_timing == "queued" and alone.alone_curves is None
    assert gpu.gemm_efficiency is not gemm and gpu.microbench_timing == ""
    cluster = apply_profile(Cluster.preset("dgx-h100", nodes=1, gpus_per_node=1), h100)
    model = ModelSpec(name="x", num_layers=2, hidden_size=1024, num_heads=8,
                      ffn_hidden_size=4096, vocab_size=32000)
    t = TransferredTables(cluster.gpu.measured, model, cluster,
                          Job(global_batch=1, seq_len=2048), None)
    assert t.cluster.gpu.gemm_efficiency == gpu.gemm_efficiency != gemm
    assert t.ratio_cluster.gpu.gemm_efficiency == gemm


def test_a_profile_without_alone_rows_carries_rows_at_its_synchronized_curves():
    gpu = load_profile(PROFILES / "profile_h200x1_fp8h20_20261201.toml").gpu
    assert gpu.alone_curves is None and gpu.gpu_alone() is gpu
