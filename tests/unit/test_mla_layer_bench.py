"""benchmarks/mla_layer_gpu.py without a GPU: the price-only run writes every case with the
cost model's own prices (pieces that add up to layer_cost's attention part, the tp split of
mla.py), a calibrated profile loads, and the measuring path runs on CPU at tiny shapes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from meshplan.costmodel import compute, mla
from meshplan.hardware_profiles import Cluster
from meshplan.spec import Job

PROFILES = Path(__file__).resolve().parents[2] / "docs" / "benchmarks" / "data" / "profiles"


@pytest.fixture(scope="module")
def bench(load_benchmark):
    return load_benchmark("mla_layer_gpu")


@pytest.fixture(scope="module")
def estimate(bench, tmp_path_factory):
    out = tmp_path_factory.mktemp("mla_est")
    assert bench.main(["--estimate", "--out", str(out)]) == 0
    return json.loads((out / "mla_layer.json").read_text())


def by_case(data: dict) -> dict:
    return {c["case"]: c for c in data["cases"]}


def pieces(case: dict) -> dict:
    return {p["piece"]: p for p in case["pieces"]}


def test_estimate_has_every_case_and_no_measurement(bench, estimate):
    assert [c["case"] for c in estimate["cases"]] == [c[0] for c in bench.CASES]
    assert (estimate["estimate"], estimate["gpu"]) == (True, "H200-SXM-141GB")
    assert {c["tp"] for c in estimate["cases"] if c["model"] == "deepseek-v3"} == {1, 2, 4, 8}
    assert {c["seq"] for c in estimate["cases"]} == {4096, 8192}
    for c in estimate["cases"]:
        for rec in c["pieces"] + [c["attention"]]:
            assert rec["measured_fwd_s"] is None and rec["measured_fwd_bwd_s"] is None
            assert rec["error_fwd"] is None and rec["error_fwd_bwd"] is None


def test_prices_are_positive_finite_and_backward_costs_more(estimate):
    for c in estimate["cases"]:
        for rec in c["pieces"] + [c["attention"]]:
            f, fb = rec["predicted_fwd_s"], rec["predicted_fwd_bwd_s"]
            assert 0 < f < fb and math.isfinite(fb), (c["case"], rec)


def test_pieces_add_up_to_the_layer_as_the_cost_model_prices_it(bench, estimate):
    for c in estimate["cases"]:
        model = bench.model_of(c["model"])
        cluster = Cluster.preset("dgx-h200")
        job = Job(global_batch=1, seq_len=c["seq"])
        layer = compute.layer_cost(model, cluster, job, micro_batch=1, tp=c["tp"],
                                   sequence_parallel=False, recompute="none",
                                   tp_link=cluster.group_link(c["tp"], 1), mlp_width=0)
        p, att = pieces(c), c["attention"]
        gemms = [p[name] for name, _ in bench.gemm_names(model)]
        assert sum(g["predicted_fwd_s"] for g in gemms) == pytest.approx(layer.forward.gemm_s)
        assert sum(g["predicted_fwd_bwd_s"] for g in gemms) == pytest.approx(
            layer.forward.gemm_s + layer.backward.gemm_s)
        assert p["core"]["predicted_fwd_s"] == pytest.approx(layer.forward.attention_s)
        assert p["core"]["predicted_fwd_bwd_s"] == pytest.approx(
            layer.forward.attention_s + layer.backward.attention_s)
        # RoPE and the key / value split: compute.py's term for MLA, in bf16
        rope = compute.hbm_s(cluster.gpu, c["tokens"] * mla.rope_elements(model, c["tp"]) * 2)
        assert p["rope"]["predicted_fwd_s"] == pytest.approx(rope)
        assert p["rope"]["predicted_fwd_bwd_s"] == pytest.approx(3 * rope)
        in_layer = [r for r in c["pieces"] if r["in_layer_price"]]
        assert {r["piece"] for r in in_layer} == {g["piece"] for g in gemms} | {"core", "rope"}
        for mode in ("fwd", "fwd_bwd"):
            total = sum(r[f"predicted_{mode}_s"] for r in in_layer)
            assert att[f"predicted_{mode}_s"] == pytest.approx(total, rel=1e-12)
            assert att[f"predicted_with_latent_norms_{mode}_s"] == pytest.approx(
                total + p["latent_norms"][f"predicted_{mode}_s"], rel=1e-12)


def test_gemm_shapes_are_mla_pys_per_rank_split(estimate):
    c = by_case(estimate)["deepseek-v3 tp2 s4096"]
    shapes = {name: tuple(r["shape"]) for name, r in pieces(c).items() if "shape" in r}
    assert shapes == {"q_up": (4096, 1536, 64 * 192), "q_down": (4096, 7168, 1536),
                      "kv_down": (4096, 7168, 512 + 64), "kv_up": (4096, 512, 64 * 256),
                      "out": (4096, 64 * 128, 7168)}
    lite = by_case(estimate)["deepseek-v2-lite tp1 s4096"]
    assert [r["piece"] for r in lite["pieces"][:4]] == ["q", "kv_down", "kv_up", "out"]
    assert tuple(pieces(lite)["q"]["shape"]) == (4096, 2048, 16 * 192)


def test_tp2_halves_the_split_gemms_and_keeps_the_replicated_ones(estimate):
    one = pieces(by_case(estimate)["deepseek-v3 tp1 s4096"])
    two = pieces(by_case(estimate)["deepseek-v3 tp2 s4096"])
    for name in ("q_down", "kv_down"):
        assert one[name]["parallel"] == "replicated"
        assert two[name]["predicted_fwd_s"] == one[name]["predicted_fwd_s"]
        assert two[name]["predicted_fwd_bwd_s"] == one[name]["predicted_fwd_bwd_s"]
    for name in ("q_up", "kv_up", "out", "core"):
        assert two[name]["flops_fwd_bwd"] == pytest.approx(one[name]["flops_fwd_bwd"] / 2)
        ratio = two[name]["predicted_fwd_bwd_s"] / one[name]["predicted_fwd_bwd_s"]
        # half the FLOPs, at the efficiency curve's value for the smaller GEMM
        assert 0.5 <= ratio < 0.56, (name, ratio)
    # q's rotary part in place (2·n·d_r), kv in (n(d_n + d_v) + d_r), key and value out
    # (n(d_n + d_r) + n·d_v), n = 128 / tp heads
    def elements(n):
        return 2 * n * 64 + n * 256 + 64 + n * 192 + n * 128
    assert two["rope"]["predicted_fwd_s"] / one["rope"]["predicted_fwd_s"] == pytest.approx(
        elements(64) / elements(128))


def test_a_calibrated_profile_prices_the_same_pieces(bench):
    path = PROFILES / "profile_h200x1_moeh3_20261129.toml"
    datasheet = bench.case_record(bench.cluster_of("dgx-h200", None), "c", "deepseek-v3", 1,
                                  4096)
    calibrated = bench.case_record(bench.cluster_of("dgx-h200", str(path)), "c",
                                   "deepseek-v3", 1, 4096)
    assert [p["piece"] for p in calibrated["pieces"]] == [p["piece"] for p in datasheet["pieces"]]
    assert calibrated["attention"]["predicted_fwd_bwd_s"] > 0
    # the calibrated GEMM curve prices the projections otherwise
    cal, dat = ({p["piece"]: p["predicted_fwd_bwd_s"] for p in r["pieces"]}
                for r in (calibrated, datasheet))
    assert any(cal[k] != pytest.approx(dat[k], rel=0.01) for k in ("q_up", "q_down", "out"))


def test_padded_v_core_computes_the_unpadded_one(bench):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    rank = bench.MLARank(torch, bench.model_of("tiny-mla"), 1, 32, "cpu")
    q, k = (torch.randn(32, 4, 24, dtype=torch.bfloat16) for _ in range(2))
    v = torch.randn(32, 4, 16, dtype=torch.bfloat16)
    native = rank.core(q, k, v, "math", pad=False)
    padded = rank.core(q, k, v, "math", pad=True)
    assert native.shape == (32, 4 * 16)
    torch.testing.assert_close(padded, native, rtol=2e-2, atol=2e-2)
    # RoPE rotates pairs: the rotary part's norm is kept
    x = torch.randn(32, 4, 8, dtype=torch.bfloat16)
    torch.testing.assert_close(rank.rope(x).float().norm(dim=-1), x.float().norm(dim=-1),
                               rtol=2e-2, atol=2e-2)
    assert rank.forward(torch.randn(32, 64, dtype=torch.bfloat16), "math", False).shape == (32, 64)


def test_the_measuring_path_runs_on_cpu_at_tiny_shapes(bench, tmp_path):
    pytest.importorskip("torch")
    assert bench.main(["--device", "cpu", "--tiny", "--iters", "1", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "mla_layer.json").read_text())
    assert [c["case"] for c in data["cases"]] == [c[0] for c in bench.TINY_CASES]
    for c in data["cases"]:
        for rec in c["pieces"] + [c["attention"]]:
            assert rec["measured_fwd_s"] > 0 and rec["measured_fwd_bwd_s"] > 0, rec
            assert math.isfinite(rec["error_fwd_bwd"])
        p = pieces(c)
        assert p["core"]["backend"] in p["core"]["backends"]
        assert c["attention"]["core_variant"]
