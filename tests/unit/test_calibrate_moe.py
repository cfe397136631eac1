"""MoE calibration: the benchmarks (CPU, tiny sizes), the profile keys they give, and the cost
model reproducing each benchmark's time from its key."""

from __future__ import annotations

import json
import warnings
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

import meshplan as mp  # noqa: E402
from meshplan.calibrate import bench_moe, moe_only  # noqa: E402
from meshplan.calibrate.moe_profile import PERMUTE_OP, add_moe_keys, moe_keys  # noqa: E402
from meshplan.costmodel.moe_host import routed_ops, torch_syncs  # noqa: E402
from meshplan.costmodel.moe_layer import (expert_gemm_s, permute_efficiency,  # noqa: E402
                                          routed_mlp)
from meshplan.costmodel.tables import layer_tables  # noqa: E402
from meshplan.hardware_profiles.calibrated import apply_profile, load_profile  # noqa: E402
from meshplan.hardware_profiles.curve import Curve  # noqa: E402
from meshplan.hardware_profiles.grouped_gemm import grouped_call_s  # noqa: E402

CPU = torch.device("cpu")
MOE = mp.ModelSpec(name="moe-1.9b", num_layers=12, hidden_size=2048, num_heads=16,
                   num_kv_heads=8, ffn_hidden_size=5632, vocab_size=32000, max_seq_len=2048,
                   activation="swiglu", norm="rmsnorm", position_embedding="rope",
                   tied_embeddings=False, bias=False, num_experts=16, experts_per_token=2,
                   moe_ffn_hidden_size=1408)
TINY = mp.ModelSpec(name="tiny-moe", num_layers=2, hidden_size=32, num_heads=2, vocab_size=64,
                    max_seq_len=32, activation="swiglu", norm="rmsnorm",
                    position_embedding="rope", tied_embeddings=False, bias=False,
                    num_experts=4, experts_per_token=2)
H200 = mp.Cluster.preset("dgx-h200", nodes=1, gpus_per_node=4)
JOB = mp.Job(global_batch=32, seq_len=2048, precision="bf16", runtime="torch")


def test_expert_shapes_follow_balanced_routing():
    shapes = bench_moe.expert_gemm_shapes(MOE, 2048, 4)
    # rows per expert = k·T·ep/E, T = mb·s/tp; fc1 h -> 2f (SwiGLU), fc2 f -> h
    want = set()
    for tp in (1, 2):
        for mb in (1, 2):
            for ep in (1, 2, 4):
                rows = 2 * (mb * 2048 // tp) * ep // 16
                want |= {bench_moe.GroupedGemmShape(16 // ep, rows, 2048, 2816),
                         bench_moe.GroupedGemmShape(16 // ep, rows, 1408, 2048)}
    assert set(shapes) == want
    assert bench_moe.expert_gemm_shapes(mp.ModelSpec.preset("gpt-1.7b"), 2048, 4) == []
    # ep must divide the experts and the world: 6 experts on 4 ranks -> ep 1, 2
    six = replace(MOE, num_experts=6)
    assert {s.groups for s in bench_moe.expert_gemm_shapes(six, 2048, 4)} == {6, 3}


def test_moe_rows_are_timed_at_the_layouts_micro_batches(monkeypatch):
    """The grouped GEMMs and the permutation are timed at micro-batches 1, 2 and the layer
    tables' (the sizes the layouts run: the permutation's efficiency grows with its size),
    quick at 1 alone."""
    assert bench_moe.moe_micro_batches(False, None) == (1, 2)
    assert bench_moe.moe_micro_batches(False, (4, 16)) == (1, 2, 4, 16)
    assert bench_moe.moe_micro_batches(True, (4, 16)) == (1,)
    timed = {"gemm": [], "perm": []}
    monkeypatch.setattr(bench_moe, "bench_grouped_gemm",
                        lambda shape, dev: timed["gemm"].append(shape) or {})
    monkeypatch.setattr(bench_moe, "bench_permute",
                        lambda *a: timed["perm"].append(a[:4]) or {})
    monkeypatch.setattr(bench_moe, "bench_host_sync", lambda dev, iters: [])
    monkeypatch.setattr(bench_moe, "bench_host_dispatch", lambda *a, **k: {})
    bench_moe.moe_rows((TINY,), 16, CPU, 1, micro_batches=(4,))
    assert sorted(t for t, *_ in timed["perm"]) == [16, 32, 64]
    assert set(timed["gemm"]) == set(bench_moe.expert_gemm_shapes(TINY, 16, 1,
                                                                  micro_batches=(1, 2, 4)))
    # the 4-sequence rows are among them
    assert max(s.rows for s in timed["gemm"]) == 2 * 64 // 4


def test_benchmarks_run_on_cpu_and_record_what_they_timed():
    r = bench_moe.bench_grouped_gemm(bench_moe.GroupedGemmShape(4, 8, 32, 48), CPU)
    assert r["backend"] == "loop" and r["seconds"] > 0 and (r["groups"], r["rows"]) == (4, 8)
    p = bench_moe.bench_permute(64, 2, 4, 32, CPU)
    assert p["model_bytes"] == 3 * bench_moe.permute_bytes(64, 2, 32, 4) and p["seconds"] > 0
    syncs = bench_moe.bench_host_sync(CPU, iters=3)
    assert {(s["read"], s["stream"]) for s in syncs} == {("item", "idle"), ("tolist", "idle")}
    d = bench_moe.bench_host_dispatch(TINY, CPU, 0.0, iters=2)
    assert d["ops"] == sum(routed_ops(bench_moe.tiny_moe_spec(TINY), mp.Layout(),
                                      autocast=False))
    assert d["syncs"] == 0 and d["seconds"] > 0


def test_permute_bytes_are_the_cost_models():
    """A profile whose permutation efficiency is X moves the routed forward's memory-bound
    time by exactly permute_bytes · (1/X − 1/eff) / hbm, eff the rate it replaces (the
    datasheet's at the model's top-k where it has one; ep 1, tokens T = mb·s)."""
    lay = mp.Layout(dp=4, micro_batch=2, zero=1)
    links = layer_tables(MOE, H200, JOB, lay).links
    gpu = H200.gpu
    slow = H200.replace(gpu=replace(gpu, membound_efficiency={PERMUTE_OP: 0.1}))
    a = routed_mlp(MOE, H200, JOB, lay, links, 1.0).forward.memory_bound_s
    b = routed_mlp(MOE, slow, JOB, lay, links, 1.0).forward.memory_bound_s
    nbytes = bench_moe.permute_bytes(2 * 2048, 2, 2048, 2)
    assert b - a == pytest.approx(nbytes / (gpu.hbm_gbps * 1e9)
                                  * (1 / 0.1 - 1 / permute_efficiency(gpu, MOE.experts_per_token)),
                                  rel=1e-9)


def test_keys_reproduce_the_benchmarks():
    """Fed the keys, the cost model prices each benchmark at its measured time: the grouped
    calls by the call (bf16 and fp8 rowwise rows apart), the permutation by its bytes."""
    gpu = H200.gpu
    peak, peak8 = gpu.peak_flops("bf16"), gpu.peak_flops("fp8")
    gg = [{"groups": 8, "rows": 1024, "k": 2048, "n": 2816, "seconds": 2.0e-3},
          {"groups": 16, "rows": 128, "k": 1408, "n": 2048, "seconds": 0.9e-3}]
    g8 = [{**r, "seconds": 0.7 * r["seconds"], "precision": "rowwise"} for r in gg]
    perm = [{"model_bytes": 3 * bench_moe.permute_bytes(4096, 2, 2048, 2), "seconds": 1.5e-3,
             "stream": "queued"}]
    keys = moe_keys({"grouped_gemm": gg + g8, "moe_permute": perm}, peak_flops=peak,
                    hbm_gbps=gpu.hbm_gbps, base=gpu, device="cuda", peak_fp8_flops=peak8)
    assert set(keys) == {"grouped_gemm_efficiency", "grouped_gemm_key",
                         "grouped_fp8_gemm_efficiency", "membound_efficiency"}
    assert keys["grouped_gemm_key"] == "call"
    fitted = replace(gpu, grouped_gemm_efficiency=Curve(keys["grouped_gemm_efficiency"]),
                     grouped_gemm_key="call",
                     grouped_fp8_gemm_efficiency=Curve(keys["grouped_fp8_gemm_efficiency"]),
                     membound_efficiency=keys["membound_efficiency"])
    cl = H200.replace(gpu=fitted)
    for r, r8 in zip(gg, g8):
        args = (r["groups"], r["rows"], r["k"], r["n"])
        # forward + backward (2×) of the one grouped call
        assert 3 * expert_gemm_s(cl, peak, *args) == pytest.approx(r["seconds"], rel=1e-3)
        assert 3 * grouped_call_s(fitted.grouped_fp8_gemm_efficiency, peak8, *args) == \
            pytest.approx(r8["seconds"], rel=1e-3)
    eff = keys["membound_efficiency"][PERMUTE_OP]
    assert perm[0]["model_bytes"] / (gpu.hbm_gbps * 1e9 * eff) == pytest.approx(1.5e-3)


def test_host_keys_only_from_a_gpu_queue():
    rows = {"host_sync": [{"read": "item", "stream": "idle", "seconds": 30e-6},
                          {"read": "item", "stream": "queued", "seconds": 12e-6},
                          {"read": "tolist", "stream": "queued", "seconds": 16e-6}],
            "host_dispatch": [{"seconds": 2.0e-3, "ops": 150, "syncs": 5, "sync_s": 14e-6}]}
    kw = dict(peak_flops=1e15, hbm_gbps=4800.0, base=None)
    assert moe_keys(rows, device="cpu", **kw) == {}
    keys = moe_keys(rows, device="cuda", **kw)
    assert keys["host_sync_s"] == pytest.approx(14e-6)
    assert keys["host_op_dispatch_s"] == pytest.approx((2.0e-3 - 5 * 14e-6) / 150)


def test_the_host_keys_move_the_moe_host_term():
    lay = mp.Layout(dp=4, ep=4, micro_batch=2, zero=1)
    gpu = H200.gpu
    base = mp.estimate(MOE, H200, JOB, lay).step_time_s
    slow = H200.replace(gpu=replace(gpu, host_sync_s=gpu.host_sync_s + 100e-6))
    # 1 sync per MoE layer forward at ep > 1, 12 layers, 4 micro-batches (32 / dp 4 / mb 2)
    micro = 32 // 4 // 2
    extra = 1 * 12 * micro * 100e-6
    assert torch_syncs(MOE, lay) == 1
    assert mp.estimate(MOE, slow, JOB, lay).step_time_s - base == pytest.approx(extra, rel=0.01)


def test_add_moe_keys_keeps_the_dense_ops(tmp_path):
    doc = {"gpu": {"peak_tflops": {"bf16": 989.0}, "hbm_gbps": 4800.0,
                   "membound_efficiency": {"rmsnorm": 0.06}},
           "measured": ["membound_efficiency"],
           "measurements": {"moe_permute": [{"model_bytes": 4.8e9, "seconds": 2e-3,
                                             "stream": "queued"}]}}
    names = add_moe_keys(doc, None, "cuda")
    assert names == [f"membound_efficiency.{PERMUTE_OP}"]
    assert doc["gpu"]["membound_efficiency"] == {"rmsnorm": 0.06, PERMUTE_OP: 0.5}


def test_a_permutation_timed_with_the_host_in_the_loop_makes_no_key(tmp_path):
    """On a GPU only rows timed queued (its GPU time) make the permutation's efficiency; a
    profile written from rows timed in step with the host (before 2026-12-02: 1.2-2.0 ms
    on 1 x H200 whatever their bytes) loads without it, with a warning."""
    kw = dict(peak_flops=1e15, hbm_gbps=4800.0, base=None)
    synced = [{"model_bytes": 4.8e9, "seconds": 2e-3}]
    assert moe_keys({"moe_permute": synced}, device="cuda", **kw) == {}
    assert PERMUTE_OP in moe_keys({"moe_permute": [{**synced[0], "stream": "cpu"}]},
                                  device="cpu", **kw)["membound_efficiency"]
    from meshplan.calibrate.profile import build_profile
    from meshplan.calibrate.tomlfile import dumps
    from meshplan.errors import MeshplanWarning
    doc = build_profile(measurements={}, base=mp.Cluster.preset("dgx-h200").gpu,
                        device="cuda", provenance={"machine": "test"})
    doc["gpu"]["membound_efficiency"] = {"rmsnorm": 0.06, PERMUTE_OP: 0.02}
    doc["provenance"]["device"] = "cuda"
    for rows, kept in ((synced, False), ([{**synced[0], "stream": "queued"}], True)):
        doc["measurements"] = {"moe_permute": rows}
        path = tmp_path / f"p{kept}.toml"
        path.write_text(dumps(doc))
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            eff = load_profile(path).gpu.membound_efficiency
        assert (PERMUTE_OP in eff) is kept and eff["rmsnorm"] == 0.06
        assert any(issubclass(w.category, MeshplanWarning) and "moe-permute" in str(w.message)
                   for w in seen) is not kept


def test_moe_only_extends_a_profile_and_the_cost_model_reads_it(tmp_path):
    from meshplan.calibrate.profile import build_profile
    from meshplan.calibrate.tomlfile import dumps
    base = build_profile(measurements={}, base=mp.Cluster.preset("dgx-h200").gpu,
                         device="cuda", provenance={"machine": "test"})
    path = tmp_path / "base.toml"
    path.write_text(dumps(base))
    model_file = tmp_path / "tiny.json"
    model_file.write_text(json.dumps(TINY.to_dict()))
    out = tmp_path / "moe.toml"
    assert moe_only.main(["--model", str(model_file), "--world", "2", "--quick",
                          "--device", "cpu", "--base-profile", str(path),
                          "--out", str(out)]) == 0
    with pytest.raises(SystemExit):
        moe_only.main(["--model", str(model_file), "--micro-batches", "0,2", "--device", "cpu",
                       "--base-profile", str(path), "--out", str(tmp_path / "bad.toml")])
    assert not (tmp_path / "bad.toml").exists()
    prof = load_profile(out)
    assert prof.gpu.grouped_gemm_efficiency is not None
    assert PERMUTE_OP in prof.gpu.membound_efficiency
    assert prof.provenance["moe_calibration"]["keys"][:1] == ["grouped_gemm_efficiency"]
    assert prof.gpu.host_sync_s == H200.gpu.host_sync_s    # CPU: host keys left as they were
    cl = apply_profile(mp.Cluster.preset("dgx-h200", nodes=1, gpus_per_node=2), out)
    assert cl.gpu.grouped_gemm_efficiency == prof.gpu.grouped_gemm_efficiency
    with pytest.raises(mp.errors.ConfigError, match="routed experts"):
        moe_only.run([mp.ModelSpec.preset("gpt-1.7b")], seq_len=None, world=1, out=out,
                     base_profile=str(path), device_kind="cpu")


def test_grouped_rows_in_the_layer_from_its_kernels():
    """Six grouped kernels a pass (forward fc1, fc2; backward fc2's two, fc1's two) give one
    row per weight; any other count gives none (kernels not told apart)."""
    from meshplan.calibrate.bench_grouped_layer import layer_for, rows_from_kernels
    spec, tokens = layer_for(MOE, 4, 256)
    assert (spec.num_experts, spec.experts_per_token, spec.num_layers) == (4, 2, 1)
    assert tokens * spec.experts_per_token == 4 * 256 and spec.max_seq_len == tokens
    assert layer_for(MOE, 1, 256)[0].experts_per_token == 1     # top-k no more than experts
    times = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0] * 2
    fc1, fc2 = rows_from_kernels(MOE, 4, 256, times, 2, "rowwise")
    assert (fc1["k"], fc1["n"], fc1["seconds"]) == (2048, 2 * 1408, 1.0 + 5.0 + 6.0)
    assert (fc2["k"], fc2["n"], fc2["seconds"]) == (1408, 2048, 2.0 + 3.0 + 4.0)
    assert fc1["timing"] == "in_layer" and fc1["precision"] == "rowwise"
    assert rows_from_kernels(MOE, 4, 256, times[:-1], 2, "bf16") == []


def test_grouped_rows_off_cuda_are_timed_alone(monkeypatch):
    """Off CUDA (or without torch's grouped kernel) each call is timed alone, as before."""
    alone = []
    monkeypatch.setattr(bench_moe, "bench_grouped_gemm",
                        lambda shape, dev: alone.append(shape) or {"seconds": 1.0})
    shapes = bench_moe.expert_gemm_shapes(TINY, 16, 1)
    rows = bench_moe.grouped_gemm_rows((TINY,), set(shapes), CPU)
    assert sorted(alone) == sorted(shapes) and len(rows) == len(shapes)
    assert not bench_moe.fp8_grouped_runnable(CPU)


def test_the_layer_also_times_smaller_calls_than_the_models_own():
    """Keyed by the call, a profile prices other models' calls: in the layer it also times
    128-512 rows an expert below each group count's smallest, and nothing else extra."""
    got = bench_moe.in_layer_shapes({(8, 1024), (8, 2048), (4, 300)})
    assert got == [(4, 128), (4, 256), (4, 300), (8, 128), (8, 256), (8, 512), (8, 1024),
                   (8, 2048)]
    assert bench_moe.in_layer_shapes({(16, 64)}) == [(16, 64)]
