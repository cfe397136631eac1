"""The compiled fp8 MoE block's memory mechanism on CPU (benchmarks/fp8_moe_saved_bytes.py,
docs/benchmarks/moe_checks.md "Compiled fp8 MoE blocks keep less"): what an executor MoE
block compiled by Inductor saves for its backward in fp8 (rowwise) less than in bf16 is the
cost model's difference for that block, byte for byte a token."""

import argparse

import pytest


@pytest.mark.slow
def test_compiled_fp8_moe_block_keeps_what_the_cost_model_says_less(load_benchmark):
    """Top-4 without shared experts at h 128, 8 experts of 64: -1,280 B a token, the QKV
    input (2·h), fc1's input at 1 B instead of 2 (k·h) and fc2's not kept (2·k·f_e). The
    cost model read -1,024 before 2026-12-05: two norm outputs credited (4·h) where the
    layer has one to drop, fc1's input counted at 2 B."""
    import torch
    b = load_benchmark("fp8_moe_saved_bytes")
    a = argparse.Namespace(hidden=128, ffn=64, shared_ffn=96, experts=8, tokens=(256, 512))
    spec = b.model_spec(a, top_k=4, shared=0)
    cpu = torch.device("cpu")
    with b.cpu_scaled_grouped_mm():
        got = {p: b.per_token(spec, p, a.tokens, cpu) for p in ("bf16", "fp8")}
    want = (b.predicted_per_token(spec, "fp8", a.tokens)
            - b.predicted_per_token(spec, "bf16", a.tokens))
    assert got["fp8"] - got["bf16"] == pytest.approx(want, abs=1.0)
    assert want == pytest.approx(-1280.0, abs=1.0)
