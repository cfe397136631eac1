"""benchmarks/moe_expert_gemm_gpu.py without a GPU: the cases' shapes and their datasheet
price, by hand for the GPT-OSS-120B H100 case."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import moe_expert_gemm_gpu as bench  # noqa: E402
from meshplan.costmodel.compute import gemm_s  # noqa: E402
from meshplan.hardware_profiles import Cluster  # noqa: E402


def test_gpt_oss_h100_case_by_hand():
    name, experts, rows, h, f = bench.CASES[0]
    assert (experts, rows, h, f) == (16, 1024, 2880, 2880)   # 128 experts / ep 8; 4·4096·8/128
    cl = Cluster.preset("dgx-h100")
    peak = cl.gpu.peak_flops("bf16")
    fwd = 16 * (gemm_s(cl.gpu, peak, 2.0 * 1024 * 2880 * 5760)
                + gemm_s(cl.gpu, peak, 2.0 * 1024 * 2880 * 2880))
    assert bench.predicted_s(cl, experts, rows, h, f) == pytest.approx(3 * fwd, rel=1e-12)


def test_estimate_writes_every_case(tmp_path):
    assert bench.main(["--estimate", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "moe_expert_gemm.json").read_text())
    assert [c["case"] for c in data["cases"]] == [c[0] for c in bench.CASES]
    top = max(y for _, y in Cluster.preset("dgx-h100").gpu.gemm_efficiency.points)
    for c in data["cases"]:
        assert 0 < c["predicted_share_of_peak"] <= top + 1e-9   # the H100 curve's top
