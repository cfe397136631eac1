"""The compiled fp8 casts' block share per layer family (fp8_cost.compiled_block_share): a
profile's own share stands for the family its rows measured it on, the datasheet's
per-family share for another; the profiles and plan files keep both."""

from dataclasses import replace
from pathlib import Path
import warnings

import pytest

from meshplan.costmodel.fp8_cost import cast_rate, compiled_block_share
from meshplan.errors import ProfileError
from meshplan.hardware_profiles import Cluster
from meshplan.hardware_profiles.calibrated import load_profile
from meshplan.hardware_profiles.loader import builtin_gpu, gpu_from_table
from meshplan.hardware_profiles.measured_rows import cast_family
from meshplan.spec import Job, ModelSpec

ROOT = Path(__file__).resolve().parents[2]
PROFILES = ROOT / "docs/benchmarks/data/profiles"
LLAMA = ModelSpec(name="l", num_layers=4, hidden_size=1024, num_heads=8, vocab_size=32000,
                  ffn_hidden_size=2816, activation="swiglu", norm="rmsnorm",
                  position_embedding="rope", bias=False)
GPT = ModelSpec(name="g", num_layers=4, hidden_size=1024, num_heads=8, vocab_size=32000,
                ffn_hidden_size=4096, activation="gelu", norm="layernorm",
                position_embedding="learned", bias=True)
ODD = replace(GPT, norm="rmsnorm")      # a family the datasheet has no share for
H200 = builtin_gpu("H200-SXM-141GB")


def test_family_keys():
    assert cast_family(LLAMA) == "swiglu-rmsnorm-nobias"
    assert cast_family(GPT) == "gelu-layernorm-bias"
    moe = replace(LLAMA, num_experts=8, experts_per_token=2, moe_ffn_hidden_size=512)
    assert cast_family(moe) == "swiglu-rmsnorm-nobias-moe"


def test_datasheet_share_by_family_else_pooled():
    # the GPT share (0.419) was dropped after fp8h44 ran (docs/benchmarks/fp8_checks.md)
    assert dict(H200.fp8_cast_compiled_block_share_by_family) == {
        "swiglu-rmsnorm-nobias": 0.142}
    assert compiled_block_share(H200, LLAMA)[0] == 0.142
    assert compiled_block_share(H200, GPT)[0] == 0.332
    assert compiled_block_share(H200, ODD)[0] == H200.fp8_cast_compiled_block_share == 0.332
    assert compiled_block_share(H200, None)[0] == 0.332


def test_a_profiles_own_share_stands_for_its_family_only():
    gpu = replace(H200, fp8_cast_compiled_block_share=0.57,
                  fp8_cast_compiled_block_share_family="gelu-layernorm-bias")
    share, source = compiled_block_share(gpu, GPT)
    assert share == 0.57 and "measured on gelu-layernorm-bias" in source
    assert compiled_block_share(gpu, LLAMA)[0] == 0.142
    assert compiled_block_share(gpu, ODD)[0] == 0.57      # no datasheet share: its own
    # the share prices the compiled casts: a smaller share, a faster cast
    job = Job(global_batch=8, seq_len=1024, precision="fp8", runtime="torch")
    llama, gpt = cast_rate(gpu, job, True, model=LLAMA), cast_rate(gpu, job, True, model=GPT)
    assert llama.block_share == 0.142 and gpt.block_share == 0.57
    assert llama.gbps == pytest.approx(gpt.gbps * 0.57 / 0.142)
    assert "fp8_cast_compiled_block_share_by_family[swiglu-rmsnorm-nobias]" in llama.how


def test_profiles_read_the_family_off_the_rows_their_share_was_measured_on():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rows = load_profile(PROFILES / "profile_h200x1_fp8h17_fp8rows_20261201.toml").gpu
        gpt = load_profile(PROFILES / "profile_h200x1_fp8h20_20261201.toml").gpu
        unmeasured = load_profile(PROFILES / "profile_h200x1_fp8h17_20261201.toml").gpu
    assert rows.fp8_cast_compiled_block_share_family == "swiglu-rmsnorm-nobias"
    assert gpt.fp8_cast_compiled_block_share_family == "gelu-layernorm-bias"
    # a share not measured (the base GPU's) is no family's
    assert unmeasured.fp8_cast_compiled_block_share_family == ""
    for g in (rows, gpt, unmeasured):       # the datasheet's table from the base GPU
        assert g.fp8_cast_compiled_block_share_by_family == (
            H200.fp8_cast_compiled_block_share_by_family)
    assert compiled_block_share(rows, LLAMA)[0] == pytest.approx(0.1402, abs=1e-4)
    assert compiled_block_share(gpt, LLAMA)[0] == 0.142
    assert compiled_block_share(unmeasured, LLAMA)[0] == 0.142
    assert compiled_block_share(unmeasured, GPT)[0] == 0.332


def test_plan_files_keep_both_keys():
    gpu = replace(H200, fp8_cast_compiled_block_share_family="gelu-layernorm-bias")
    back = gpu_from_table(gpu.name, gpu.to_dict(), "test")
    assert back.fp8_cast_compiled_block_share_family == "gelu-layernorm-bias"
    assert back.fp8_cast_compiled_block_share_by_family == (
        gpu.fp8_cast_compiled_block_share_by_family)
    cl = Cluster.preset("dgx-h200", nodes=1, gpus_per_node=1)
    assert cl.gpu.fp8_cast_compiled_block_share_by_family


@pytest.mark.parametrize("bad", [[["gelu-layernorm-bias", 1.5]], [["x"]], "0.4",
                                 [[1, 0.4]], [["x", True]]])
def test_a_bad_table_names_the_key(bad):
    t = replace(H200).to_dict()
    t["fp8_cast_compiled_block_share_by_family"] = bad
    with pytest.raises(ProfileError, match="fp8_cast_compiled_block_share_by_family"):
        gpu_from_table(H200.name, t, "test")


def test_a_bad_family_names_the_key():
    t = H200.to_dict()
    t["fp8_cast_compiled_block_share_family"] = 3
    with pytest.raises(ProfileError, match="fp8_cast_compiled_block_share_family"):
        gpu_from_table(H200.name, t, "test")
