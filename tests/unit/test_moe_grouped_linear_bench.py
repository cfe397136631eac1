"""benchmarks/moe_grouped_linear_gpu.py without a GPU: its per-expert GEMMs compute what the
grouped GEMM and autograd compute (small shapes on CPU, one stream), and the price-only
run writes every case."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import moe_grouped_linear_gpu as bench  # noqa: E402


def test_loop_gemms_match_the_grouped_path():
    torch.manual_seed(0)
    case = bench.Case(torch, experts=3, rows=16, h=32, f=16, device="cpu")
    case.grouped()
    x_grad, act_grad, w1_grad, w2_grad = (leaf.grad.float() for leaf in case.leaves)
    case.looped(1, acc=torch.bfloat16)          # weight gradients accumulate from zero
    tol = dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(case.dx.float(), x_grad, **tol)
    torch.testing.assert_close(case.dact.float(), act_grad, **tol)
    torch.testing.assert_close(case.g1[torch.bfloat16].float(), w1_grad, **tol)
    torch.testing.assert_close(case.g2[torch.bfloat16].float(), w2_grad, **tol)
    # accumulation: a second pass doubles the bf16 main gradient (beta = 1)
    case.looped(1, acc=torch.bfloat16)
    torch.testing.assert_close(case.g2[torch.bfloat16].float(), 2 * w2_grad, **tol)


def test_estimate_writes_every_case_with_its_flops(tmp_path):
    assert bench.main(["--estimate", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "moe_grouped_linear.json").read_text())
    assert [c["case"] for c in data["cases"]] == [c[0] for c in bench.CASES]
    fsdp = next(c for c in data["cases"] if c["case"].endswith("fsdp"))
    assert (fsdp["experts"], fsdp["rows_per_expert"]) == (16, 8 * 8192 * 8 // 128)
    # fc1 gated (h -> 2f) and fc2 (f -> h), forward + 2 backward GEMMs each
    assert fsdp["flops"] == 3 * 16 * (2.0 * 4096 * 4096 * 3072 + 2.0 * 4096 * 1536 * 4096)
    # Qwen3-30B-A3B at micro-batch 4: 8 · 4 · 4096 · 8 / 128 rows an expert, 16 a rank
    mb4 = data["cases"][-1]
    assert (mb4["experts"], mb4["rows_per_expert"]) == (16, 8 * 4 * 4096 * 8 // 128)
    assert mb4["flops"] == 3 * 16 * (2.0 * 8192 * 2048 * 1536 + 2.0 * 8192 * 768 * 2048)
    assert all("gpu_s" not in json.dumps(c) for c in data["cases"])
