"""meshplan.calibrate.bench_fp8 on CPU: the rows a profile would carry, and their arithmetic."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from meshplan.calibrate.bench_fp8 import CAST_BLOCKS, cast_bytes, cast_gbps, fp8_rows  # noqa
from meshplan.calibrate.fp8_profile import fp8_gemm_efficiency_points  # noqa: E402
from meshplan.calibrate.shapes import GemmShape  # noqa: E402
from meshplan.costmodel.fp8 import linear_cast_traffic  # noqa: E402

SHAPES = [GemmShape(m=64, k=128, n=256, label="a"), GemmShape(m=128, k=256, n=128, label="b")]


@pytest.fixture(scope="module")
def rows():
    return fp8_rows(SHAPES, torch.device("cpu"), recipes=("tensorwise", "delayed"),
                    cast_shape=(128, 256))


def test_gemm_rows_time_each_shape_and_recipe(rows):
    ok = [r for r in rows["fp8_gemm"] if r["recipe"] == "tensorwise"]
    assert [(r["m"], r["k"], r["n"]) for r in ok] == [(64, 128, 256), (128, 256, 128)]
    for r in ok:
        assert r["flops"] == 6.0 * r["m"] * r["k"] * r["n"]
        assert min(r["gemm_seconds"], r["linear_seconds"], r["bf16_seconds"]) > 0
        assert r["speedup"] == pytest.approx(r["bf16_seconds"] / r["linear_seconds"])


def test_a_recipe_that_cannot_run_is_a_row_with_its_reason(rows):
    bad = [r for r in rows["fp8_gemm"] if r["recipe"] == "delayed"]
    assert len(bad) == 1 and "not run by the executor" in bad[0]["error"]


def test_efficiency_points_are_flops_over_peak_time(rows):
    pts = fp8_gemm_efficiency_points(rows["fp8_gemm"], 1e12)
    ok = sorted((r for r in rows["fp8_gemm"] if r["recipe"] == "tensorwise"),
                key=lambda r: r["flops"])
    # x: one GEMM's 2mkn FLOPs (how compute.py looks the curve up); y: the three GEMMs'
    assert pts == [(r["flops"] / 3, r["flops"] / (1e12 * r["gemm_seconds"])) for r in ok]
    assert fp8_gemm_efficiency_points(rows["fp8_gemm"], 1e12, recipe="delayed") == []


def test_cast_rows_carry_the_cost_models_bytes(rows):
    casts = rows["fp8_cast"]
    assert [r["op"] for r in casts] == [f"cast {k}" for k in CAST_BLOCKS] + ["transpose fp8"]
    assert all(v > 0 for v in cast_gbps(casts).values())
    # one dynamic tensorwise cast of x is what the cost model charges the forward
    assert cast_bytes(128, 256, (0, 0), 2) == \
        linear_cast_traffic(128, 256, 64, "tensorwise", act_bytes=2).forward_bytes
