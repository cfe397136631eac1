"""The profile's fp8 keys from calibrate's fp8 rows (meshplan.calibrate.fp8_profile), written
and read back, and what a profile without them inherits."""

import tomllib

import pytest

from meshplan.calibrate import profile as prof
from meshplan.calibrate.fp8_profile import (compiled_cast_gbps, eager_cast_fit,
                                            fp8_gemm_efficiency_points, timed_recipes,
                                            weight_cast_gbps)
from meshplan.calibrate.tomlfile import dumps, write_text_atomic
from meshplan.costmodel.fp8 import linear_cast_traffic
from meshplan.hardware_profiles import builtin_gpu
from meshplan.hardware_profiles.calibrated import load_profile

H100 = builtin_gpu("H100-SXM5-80GB")
SHAPES = [(2048, 2048, 2048), (4096, 2048, 8192), (2048, 8192, 2048), (4096, 512, 2048)]


def _rows(pass_s=1e-4, gbps=1000.0, eff=0.5, recipe="tensorwise"):
    out = []
    for m, k, n in SHAPES:
        c = linear_cast_traffic(m, k, n, recipe, act_bytes=2, weight_bytes=4)
        gemm = 6.0 * m * k * n / (H100.peak_flops("fp8") * eff)
        out.append({"recipe": recipe, "label": "x", "m": m, "k": k, "n": n,
                    "flops": 6.0 * m * k * n, "gemm_seconds": gemm,
                    "linear_seconds": gemm + c.kernels * pass_s
                    + c.per_microbatch_bytes / (gbps * 1e9), "bf16_seconds": 2 * gemm})
    return out


def test_eager_fit_recovers_pass_cost_and_bandwidth():
    rows = _rows() + _rows(recipe="rowwise")
    assert eager_cast_fit(rows) == pytest.approx((1e-4, 1000.0), rel=1e-6)
    assert eager_cast_fit([]) is None
    # a fit with a negative term (noise: here more bytes took less time) falls back to the
    # bandwidth alone, Σ bytes / Σ seconds
    rows = _rows()
    small = min(rows, key=lambda r: r["m"] * r["k"] * r["n"])
    noisy = [dict(r, linear_seconds=r["gemm_seconds"] + (1e-3 if r is small else 1e-6))
             for r in rows]
    pass_s, gbps = eager_cast_fit(noisy)
    nbytes = sum(linear_cast_traffic(r["m"], r["k"], r["n"], "tensorwise", act_bytes=2,
                                     weight_bytes=4).per_microbatch_bytes for r in rows)
    assert pass_s == 0.0 and gbps == pytest.approx(nbytes / (1e-3 + 3e-6) / 1e9)


def test_curve_points_recipes_and_compiled_casts():
    rows = _rows() + [{"recipe": "blockwise", "label": "x", "m": 1, "k": 128, "n": 128,
                       "error": "RuntimeError: Invalid scaling configuration."}]
    pts = fp8_gemm_efficiency_points(rows, H100.peak_flops("fp8"))
    assert [x for x, _ in pts] == sorted(2.0 * m * k * n for m, k, n in SHAPES)
    assert all(y == pytest.approx(0.5) for _, y in pts)
    assert timed_recipes(rows) == ["tensorwise"]
    casts = [{"op": "cast tensor", "bytes": 1e9, "seconds": 1.0},
             {"op": "compiled cast tensor", "bytes": 2e9, "seconds": 1e-3},
             {"op": "compiled cast row", "bytes": 2e9, "seconds": 3e-3}]
    assert compiled_cast_gbps(casts) == pytest.approx(4e9 / 4e-3 / 1e9)
    assert compiled_cast_gbps(casts[:1]) is None
    # the stacked weight's cast is its own key, not one of the compiled casts
    weight = {"op": "weight cast compiled", "bytes": 6e9, "seconds": 2e-3}
    assert compiled_cast_gbps(casts + [weight]) == pytest.approx(4e9 / 4e-3 / 1e9)
    assert weight_cast_gbps(casts + [weight]) == pytest.approx(3000.0)
    assert weight_cast_gbps(casts + [dict(weight, seconds=0, error="x")]) is None


def test_the_weight_cast_row_times_the_experts_once_a_step_cast(tmp_path):
    """calibrate's row (on CPU here, a small stack): bytes as the cost model counts a
    weight's casts; written to the profile as fp8_cast_weight_gbps, which prices compiled
    fp8 experts' weight casts at bytes / rate."""
    torch = pytest.importorskip("torch")
    from meshplan.calibrate.bench_fp8 import bench_fp8_weight_cast, weight_cast_bytes
    row = bench_fp8_weight_cast(torch.device("cpu"), shape=(2, 64, 32))
    assert "error" not in row and row["seconds"] > 0
    c = linear_cast_traffic(1, 32, 64, "rowwise", act_bytes=2, weight_bytes=4)
    assert row["bytes"] == weight_cast_bytes(2, 64, 32) == 2 * c.weight_bytes
    assert c.weight_bytes > 2 * 64 * 32 * (2 * 4 + 1)      # both layouts, each read twice
    doc = prof.build_profile(measurements={"fp8_cast": [dict(row, seconds=1e-3)]}, base=H100,
                             device="cuda", provenance={"machine": "t"})
    assert "fp8_cast_weight_gbps" in doc["measured"]
    gpu = load_profile(write_text_atomic(tmp_path / "p.toml", dumps(doc))).gpu
    assert gpu.fp8_cast_weight_gbps == pytest.approx(row["bytes"] / 1e-3 / 1e9)


def test_profile_writes_the_fp8_keys_and_a_profile_without_them_inherits_the_base(tmp_path):
    rows = {"fp8_gemm": _rows(eff=0.45),
            "fp8_cast": [{"op": "compiled cast tensor", "bytes": 2e9, "seconds": 1e-3}]}
    doc = prof.build_profile(measurements=rows, base=H100, device="cuda",
                             provenance={"machine": "t", "gpu_name": "NVIDIA H100"})
    assert {"fp8_gemm_efficiency", "fp8_torch_recipes", "fp8_cast_eager_pass_s",
            "fp8_cast_eager_gbps", "fp8_cast_compiled_gbps"} <= set(doc["measured"])
    gpu = load_profile(write_text_atomic(tmp_path / "p.toml", dumps(doc))).gpu
    assert gpu.fp8_gemm_efficiency(2.0 * 2048**3) == pytest.approx(0.45, rel=1e-4)
    assert gpu.fp8_cast_eager_pass_s == pytest.approx(1e-4)
    assert gpu.fp8_cast_compiled_gbps == pytest.approx(2000.0)
    assert gpu.fp8_torch_recipes == ("tensorwise",)
    # an older profile (no fp8 keys): the base GPU's datasheet defaults stand
    old = tomllib.loads(dumps(prof.build_profile(measurements={}, base=H100, device="cuda",
                                                 provenance={})))
    for k in ("fp8_gemm_efficiency", "fp8_cast_eager_pass_s", "fp8_cast_eager_gbps",
              "fp8_torch_recipes"):
        old["gpu"].pop(k, None)
    inherited = load_profile(write_text_atomic(tmp_path / "old.toml", dumps(old))).gpu
    assert inherited.fp8_gemm_efficiency == H100.fp8_gemm_efficiency
    assert inherited.fp8_torch_recipes == H100.fp8_torch_recipes
    assert inherited.fp8_cast_eager_gbps == H100.fp8_cast_eager_gbps
    # the H200's measured rate scaled by HBM bandwidth (data/gpus.toml, 2026-12-05)
    assert inherited.fp8_cast_compiled_gbps == H100.fp8_cast_compiled_gbps == 1045.0


def test_datasheet_eager_keys_reproduce_the_h100_fit():
    """data/gpus.toml's H100 eager cast keys are the fit over the committed 2026-11-28 rows."""
    import json
    from pathlib import Path
    data = Path(__file__).resolve().parents[2] / "docs/benchmarks/data/fp8_micro_h100.json"
    pass_s, gbps = eager_cast_fit(json.loads(data.read_text())["fp8_gemm"])
    assert pass_s == pytest.approx(H100.fp8_cast_eager_pass_s, rel=0.01)
    assert gbps == pytest.approx(H100.fp8_cast_eager_gbps, rel=0.01)


def _split_rows(gpu_pass_s=1e-5, gpu_gbps=600.0, host_pass_s=1.3e-4, recipe="rowwise"):
    """Rows as calibrate times them on CUDA: synchronized (the host's ~2 ms) and queued."""
    out = []
    for r in _rows(recipe=recipe):
        c = linear_cast_traffic(r["m"], r["k"], r["n"], recipe, act_bytes=2, weight_bytes=4)
        gemm = r["gemm_seconds"]
        out.append(dict(r, linear_seconds=2e-3, gemm_gpu_seconds=gemm,
                        linear_gpu_seconds=gemm + c.kernels * gpu_pass_s
                        + c.per_microbatch_bytes / (gpu_gbps * 1e9),
                        bf16_cpu_seconds=4e-4,
                        linear_cpu_seconds=4e-4 + c.kernels * host_pass_s))
    return out


def test_split_fit_recovers_the_gpu_and_host_parts_and_the_profile_writes_them(tmp_path):
    """The queued timings give the casts' GPU part (the line through the fp8 linear's
    GPU-busy time less its GEMMs') and the host's extra dispatch per pass; rows timed only
    synchronized (CPU, older calibrations) give no split."""
    from meshplan.calibrate.fp8_profile import eager_cast_split_fit
    rows = _split_rows() + _split_rows(recipe="tensorwise")
    assert eager_cast_split_fit(rows) == pytest.approx((1e-5, 600.0, 1.3e-4), rel=1e-6)
    assert eager_cast_split_fit(_rows()) is None
    doc = prof.build_profile(measurements={"fp8_gemm": rows}, base=H100, device="cuda",
                             provenance={"machine": "t", "gpu_name": "NVIDIA H100"})
    keys = {"fp8_cast_eager_gpu_pass_s", "fp8_cast_eager_gpu_gbps",
            "fp8_cast_eager_host_pass_s"}
    assert keys <= set(doc["measured"])
    gpu = load_profile(write_text_atomic(tmp_path / "p.toml", dumps(doc))).gpu
    assert (gpu.fp8_cast_eager_gpu_pass_s, gpu.fp8_cast_eager_gpu_gbps,
            gpu.fp8_cast_eager_host_pass_s) == pytest.approx((1e-5, 600.0, 1.3e-4), rel=1e-6)
    doc = prof.build_profile(measurements={"fp8_gemm": _rows()}, base=H100, device="cuda",
                             provenance={})
    assert not keys & set(doc["measured"])


def test_datasheet_h200_split_keys_reproduce_the_h200_probe():
    """data/gpus.toml's H200 split keys are the fit over the committed 2026-12-01 probe
    (benchmarks/fp8_eager_cast_gpu.py, both recipes)."""
    import json
    from pathlib import Path
    from meshplan.calibrate.fp8_profile import eager_cast_split_fit
    h200 = builtin_gpu("H200-SXM-141GB")
    data = Path(__file__).resolve().parents[2] / \
        "docs/benchmarks/data/fp8_eager_cast_h200x1_20261201.json"
    rows = [dict(r, linear_gpu_seconds=r["fp8_gpu_s"], gemm_gpu_seconds=r["gemms_gpu_s"],
                 linear_cpu_seconds=r["fp8_cpu_s"], bf16_cpu_seconds=r["bf16_cpu_s"])
            for r in json.loads(data.read_text())["rows"]]
    g, gbps, host = eager_cast_split_fit(rows)
    assert g == pytest.approx(h200.fp8_cast_eager_gpu_pass_s, rel=0.01)
    assert gbps == pytest.approx(h200.fp8_cast_eager_gpu_gbps, rel=0.01)
    assert host == pytest.approx(h200.fp8_cast_eager_host_pass_s, rel=0.01)


def test_a_calibration_of_layer_rows_without_fp8_rows_says_what_fp8_estimates_will_be():
    from meshplan.calibrate.run import fp8_rows_hint
    hint = fp8_rows_hint(True, "")
    assert "--fp8-rows" in hint and "bf16 rows plus fp8's terms" in hint
    assert fp8_rows_hint(True, "tensorwise") is None      # fp8 rows asked for
    assert fp8_rows_hint(False, "") is None               # no model, no layer rows


def test_a_profile_with_compiled_fp8_rows_measures_its_block_share():
    """calibrate --fp8-rows on a GPU reads fp8_cast_compiled_block_share off the profile it
    wrote: the fit of its own compiled fp8 rows against their bf16 twins composed (here
    fp8h3's committed calibration, whose measured share is far below the datasheet's pooled
    0.332: the share is the model's, which is why calibrate measures it); a profile without
    fp8 rows measures none."""
    import json
    from pathlib import Path
    from meshplan.calibrate.fp8_block_share import (composed_rows, fit_share,
                                                    measure_from_profile)
    from meshplan.hardware_profiles import Cluster
    from meshplan.hardware_profiles.calibrated import apply_profile
    from meshplan.spec import ModelSpec
    root = Path(__file__).resolve().parents[2]
    model = ModelSpec.from_dict(json.loads((root / "benchmarks/sets/fp8h3/m01.json").read_text()))
    prof = root / "docs/benchmarks/data/profiles/profile_h200x1_fp8h3_20261129.toml"
    share = measure_from_profile(prof, [model], 1)
    assert 0 < share < 0.332
    # every row as timed (measure_from_profile's way: fp8 and bf16 twins of one executor)
    cluster = apply_profile(Cluster.preset("dgx-h200", nodes=1, gpus_per_node=1), prof,
                            keep_stale_rows=True)
    rows = composed_rows(model, cluster)
    assert len(rows) == 6 and fit_share(rows) == pytest.approx(share)
    at_share = composed_rows(model, cluster, share)
    alone = [abs(r["composed_s"] / r["measured_s"] - 1) for r in rows]
    fitted = [abs(r["composed_s"] / r["measured_s"] - 1) for r in at_share]
    assert sum(fitted) < sum(alone)
    plain = root / "docs/benchmarks/data/profiles/profile_h200x1_moeh20_20261201.toml"
    assert measure_from_profile(plain, [model], 1) is None


def test_block_share_reads_rowwise_rows(tmp_path):
    """A calibration's rowwise fp8 rows are composed from their bf16 twins like tensorwise
    ones (their bf16 twin's job drops the recipe: a rowwise recipe under bf16 is refused)."""
    import json
    from pathlib import Path
    from meshplan.calibrate.fp8_block_share import composed_rows
    from meshplan.hardware_profiles import Cluster
    from meshplan.hardware_profiles.calibrated import apply_profile
    from meshplan.spec import ModelSpec
    root = Path(__file__).resolve().parents[2]
    model = ModelSpec.from_dict(json.loads((root / "benchmarks/sets/fp8h3/m01.json").read_text()))
    text = (root / "docs/benchmarks/data/profiles/profile_h200x1_fp8h3_20261129.toml").read_text()
    assert 'fp8_recipe = "tensorwise"' in text
    prof = tmp_path / "rowwise.toml"
    prof.write_text(text.replace('fp8_recipe = "tensorwise"', 'fp8_recipe = "rowwise"'))
    cluster = apply_profile(Cluster.preset("dgx-h200", nodes=1, gpus_per_node=1), prof,
                            keep_stale_rows=True)
    rows = composed_rows(model, cluster)
    assert len(rows) == 6 and all(r["casts_alone_s"] > 0 for r in rows)


def test_queued_split_keeps_the_samples_that_queued():
    from meshplan.calibrate.timing import split_medians
    assert split_medians([(1e-3, 2e-3, True), (1e-3, 0.7, False), (3e-3, 4e-3, True)]) == \
        pytest.approx((2e-3, 3e-3))
    assert split_medians([(1e-3, 0.5, False), (2e-3, 0.7, False), (3e-3, 0.9, False)]) == \
        pytest.approx((2e-3, 0.7))


def _drawn_moe_on_its_profile(set_name: str, profile: str):
    """A drawn MoE set's model and the one-H200 cluster of its calibration's profile."""
    import json
    from pathlib import Path
    from meshplan.hardware_profiles import Cluster
    from meshplan.hardware_profiles.calibrated import apply_profile
    from meshplan.spec import ModelSpec
    root = Path(__file__).resolve().parents[2]
    model = ModelSpec.from_dict(json.loads((root / f"benchmarks/sets/{set_name}/m01.json")
                                           .read_text()))
    return model, apply_profile(Cluster.preset("dgx-h200", nodes=1, gpus_per_node=1),
                                root / "docs/benchmarks/data/profiles" / profile, override=True)


def test_an_moe_models_block_share_composes_its_rows_as_the_cost_model_does():
    """moeh23's calibration (1 x H200, 16-bit experts in its fp8 rows) wrote a share of 1.0:
    its MoE rows were composed as a dense layer (the whole measured row scaled by the dense
    linears' fp8 ratio). Composed as an estimate composes an MoE layer (the bf16 row, its
    dense part moved to fp8), the rows fit 0.48, and each row composed at that share is
    closer to its measurement than at 1.0."""
    from meshplan.calibrate.fp8_block_share import composed_rows, fit_share
    model, cluster = _drawn_moe_on_its_profile("moeh23", "profile_h200x1_moeh23_20261201.toml")
    assert cluster.gpu.fp8_cast_compiled_block_share == 1.0       # as the calibration wrote
    rows = composed_rows(model, cluster)
    assert len(rows) == 4
    share = fit_share(rows)
    assert 0.3 < share < 0.7
    for fitted, one in zip(composed_rows(model, cluster, share),
                           composed_rows(model, cluster, 1.0)):
        assert abs(fitted["composed_s"] - fitted["measured_s"]) \
            < abs(one["composed_s"] - one["measured_s"])


def test_the_block_share_leaves_out_the_weight_casts_of_rows_timed_with_them_cast_beforehand():
    """A row timed with the experts' weights cast beforehand holds none of their casts: its
    composition drops them from every pass (full recompute's second forward too) and the
    casts the share scales leave them out. moeh25's rows (cast in every pass), relabelled."""
    import dataclasses
    from meshplan.calibrate.fp8_block_share import _moe_links, composed_rows
    from meshplan.costmodel.moe_layer import routed_mlp
    from meshplan.spec import Job, Layout
    model, cl = _drawn_moe_on_its_profile("moeh25", "profile_h200x1_moeh25_20261202.toml")
    meas = cl.gpu.measured
    relabelled = cl.with_gpu(dataclasses.replace(cl.gpu, measured=dataclasses.replace(
        meas, layers=tuple(dataclasses.replace(r, fp8_weights_cached=True) if r.fp8_experts
                           else r for r in meas.layers))))
    every, cached = composed_rows(model, cl), composed_rows(model, relabelled)
    # the casts as composed_rows prices them: alone, not at the profile's block share
    alone = cl.with_gpu(dataclasses.replace(cl.gpu, fp8_cast_compiled_block_share=0.0))
    assert len(every) == len(cached) == 4
    assert {r["recompute"] for r in every} == {"none", "full"}
    for a, b in zip(every, cached):
        job = Job(global_batch=2 * a["micro_batch"], seq_len=4096, runtime="torch",
                  precision="fp8", fp8_recipe="rowwise")
        lay = Layout(micro_batch=a["micro_batch"], recompute=a["recompute"], compile=True)
        f8 = routed_mlp(model, alone, job, lay, _moe_links(alone, lay), 1.0).fp8
        weights = f8.weight_forward_cast_s + f8.weight_backward_cast_s
        assert weights > 0
        assert b["measured_s"] == a["measured_s"]
        assert b["casts_alone_s"] == pytest.approx(a["casts_alone_s"] - weights)
        rerun = f8.weight_forward_cast_s if a["recompute"] == "full" else 0.0
        assert b["composed_without_casts_s"] == pytest.approx(
            a["composed_without_casts_s"] - rerun)
