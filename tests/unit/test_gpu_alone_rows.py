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


def test_the_alone_rows_move_no_price(tmp_path):
    """The GPU-alone rows are recorded, not priced: the carrying ratio that read them was
    switched off by moeh70h100's rule (docs/benchmarks/moe_checks.md), so a profile prices
    a model it did not time (rows carried) exactly as it does without those rows."""
    from meshplan import Cluster, Job, Layout
    from meshplan.costmodel import estimate
    from meshplan.hardware_profiles.calibrated import apply_profile
    h100 = PROFILES / "profile_h100x1_moeh64h100_20261205.toml"
    doc = tomllib.loads(h100.read_text())
    assert doc["measurements"]["gemm_alone"] and doc["measurements"]["attention_alone"]
    sync_only = tmp_path / "sync_only.toml"
    sync_only.write_text(_without_alone_rows(h100.read_text()))
    model = ModelSpec(name="x", num_layers=4, hidden_size=1536, num_heads=12,
                      ffn_hidden_size=6144, vocab_size=32000)
    job = Job(global_batch=8, seq_len=2048)
    lay = Layout(dp=1, pp=1, tp=1, micro_batch=2, compile=True)
    base = Cluster.preset("dgx-h100", nodes=1, gpus_per_node=1)
    with_rows = estimate(model, apply_profile(base, h100), job, lay)
    without = estimate(model, apply_profile(base, sync_only), job, lay)
    datasheet = estimate(model, base, job, lay)
    assert with_rows.step_time_s == without.step_time_s != datasheet.step_time_s


def _without_alone_rows(text: str) -> str:
    out, skip = [], False
    for line in text.splitlines(keepends=True):
        if line.startswith("["):
            skip = line.strip() in ("[[measurements.gemm_alone]]",
                                    "[[measurements.attention_alone]]")
        if not skip:
            out.append(line)
    return "".join(out)
