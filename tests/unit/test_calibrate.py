"""Unit tests of the calibration and validation tooling (no torch needed)."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from meshplan.calibrate import profile as prof
from meshplan.calibrate.stats import pct_error, ranks, spearman
from meshplan.calibrate.tomlfile import dumps, write_text_atomic
from meshplan.calibrate.validate import (enumerate_layouts, predicted_memory_per_rank,
                                         read_measurement, summarize)
from meshplan.costmodel import estimate
from meshplan.spec import Job, Layout, ModelSpec
from meshplan.errors import ConfigError, ProfileError
from meshplan.hardware_profiles import Cluster, Curve, builtin_gpu
from meshplan.hardware_profiles.calibrated import apply_profile, load_profile


# ---- Spearman --------------------------------------------------------------------------------
def test_ranks_average_ties():
    assert ranks([10, 20, 20, 5]) == [2.0, 3.5, 3.5, 1.0]


def test_spearman_known_values():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # textbook example: d = (0, -1, 1, 0, 0) -> rho = 1 - 6·2 / (5·24) = 0.9
    assert spearman([1, 2, 3, 4, 5], [1, 3, 2, 4, 5]) == pytest.approx(0.9)
    # monotone but non-linear: Spearman 1, Pearson would not be
    assert spearman([1, 2, 3, 4], [1, 8, 27, 1000]) == pytest.approx(1.0)


def test_spearman_with_ties_matches_pearson_of_average_ranks():
    # x ranks [1, 2.5, 2.5, 4], y ranks [1, 2, 3, 4]: Sxy = 4.5, Sxx = 4.5, Syy = 5
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(4.5 / (4.5 * 5) ** 0.5)


def test_spearman_rejects_unequal_lengths():
    with pytest.raises(ConfigError, match="equal-length"):
        spearman([1, 2], [1])


def test_pct_error_sign_and_bad_measurement():
    assert pct_error(1.1, 1.0) == pytest.approx(10.0)
    assert pct_error(0.9, 1.0) == pytest.approx(-10.0)
    with pytest.raises(ConfigError, match="positive"):
        pct_error(1.0, 0.0)


# ---- TOML and atomic writes ------------------------------------------------------------------
def test_toml_round_trip():
    doc = {"a": 1, "b": 2.5, "s": 'q"uote', "flag": True, "pts": [[1e9, 0.5], [1e10, 0.7]],
           "inline": {"bf16": 989.0}, "t": {"x": [1, 2], "inf": float("inf")},
           "rows": [{"m": 1, "label": "qkv tp1"}, {"m": 2, "label": "x"}]}
    back = tomllib.loads(dumps(doc))
    assert back == doc


def test_atomic_write_interrupted_leaves_old_file_and_no_temp(tmp_path, monkeypatch):
    target = tmp_path / "profile.toml"
    target.write_text("old\n")

    def boom(fd):
        raise KeyboardInterrupt  # Ctrl-C between writing and renaming

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(KeyboardInterrupt):
        write_text_atomic(target, "new\n")
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["profile.toml"]


def test_atomic_write_interrupted_without_old_file_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "replace", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        write_text_atomic(tmp_path / "p.toml", "x = 1\n")
    assert list(tmp_path.iterdir()) == []


# ---- profile building and applying --------------------------------------------------------
H100 = builtin_gpu("H100-SXM5-80GB")


def _gpu_rows():
    peak = H100.peak_flops("bf16")
    # a GEMM of 2mkn = 2^34 FLOPs taking 3F / (0.6 · peak) s, so its efficiency is 0.6
    f = 2.0 * 2048 * 2048 * 2048
    return {
        "gemm": [{"m": 2048, "k": 2048, "n": 2048, "seconds": 3 * f / (0.6 * peak)}],
        "attention": [{"batch": 1, "seq": 2048, "heads": 16, "head_dim": 128,
                       "seconds": 3.5 * prof.attention_executed_flops(1, 2048, 16, 128) / (0.4 * peak)}],
        "membound": [{"op": "add", "model_bytes": 0.7 * 3350e9, "seconds": 1.0}],
        "collectives": [{"op": "all_reduce", "group_size": 4, "nbytes": 1 << 26,
                         "seconds": 1.5 * (1 << 26) / (450e9 * 0.75)}],
        # 256-byte all-reduces: 30 µs on 2 ranks, 36 µs on 4 -> α_step 1.5 µs, α_base 27 µs
        "latency": [{"group_size": 2, "seconds": 30e-6}, {"group_size": 4, "seconds": 36e-6}],
        "overheads": [{"kind": "layer_overhead_s", "seconds": 4e-5},
                      {"kind": "microbatch_overhead_s", "seconds": -1e-6}],
    }


def _write_gpu_profile(path: Path) -> Path:
    doc = prof.build_profile(measurements=_gpu_rows(), base=H100, device="cuda",
                             provenance={"machine": "test", "gpu_name": "NVIDIA H100 80GB HBM3"})
    return write_text_atomic(path, dumps(doc))


def test_profile_efficiencies_invert_the_cost_model(tmp_path):
    p = load_profile(_write_gpu_profile(tmp_path / "h100.toml"))
    assert p.base_gpu == "H100-SXM5-80GB" and p.gpu.name == "H100-SXM5-80GB"
    assert p.gpu.gemm_efficiency(2.0 * 2048**3) == pytest.approx(0.6, rel=1e-4)
    assert p.gpu.attention_efficiency(prof.attention_executed_flops(1, 2048, 16, 128)) == \
        pytest.approx(0.4, rel=1e-4)
    assert p.gpu.hbm_efficiency == pytest.approx(0.7, rel=1e-9)
    assert p.collective_base_latency_us == pytest.approx(27.0)
    assert p.intra_step_latency_us == pytest.approx(1.5) and p.intra_latency_us is None
    # all-reduce of 64 MiB over 4 ranks: bus bytes / (t - α_base - 6 steps · α_step)
    t = 1.5 * (1 << 26) / (450e9 * 0.75)
    want = 1.5 * (1 << 26) / ((t - 27e-6 - 6 * 1.5e-6) * 450e9)
    assert p.gpu.nvlink_efficiency(1 << 26) == pytest.approx(want, rel=1e-4)
    assert p.gpu.layer_overhead_s == pytest.approx(4e-5)
    assert p.gpu.microbatch_overhead_s == 0.0   # a negative intercept is clamped
    assert "gemm_efficiency" in p.measured and p.provenance["machine"] == "test"


def test_curve_falls_back_to_datasheet_shape_outside_measured_range():
    base = Curve(((1e8, 0.05), (1e9, 0.2), (1e10, 0.5), (1e11, 0.7), (1e12, 0.8)))
    c = prof.extend_with_base([(1e10, 0.4), (1e11, 0.6)], base)
    assert c(1e10) == pytest.approx(0.4) and c(1e11) == pytest.approx(0.6)
    assert c(1e12) == pytest.approx(0.8 * 0.6 / 0.7)      # datasheet shape, scaled to meet
    assert c(1e9) == pytest.approx(0.2 * 0.4 / 0.5)


def test_merge_points_averages_close_sizes():
    pts = prof.merge_points([(1e9, 0.5), (1.05e9, 0.7), (1e10, 0.8)])
    assert len(pts) == 2 and pts[0][1] == pytest.approx(0.6)


def test_apply_profile_changes_estimate(tmp_path):
    path = _write_gpu_profile(tmp_path / "h100.toml")
    cluster = Cluster.preset("dgx-h100", nodes=1)
    cal = apply_profile(cluster, path)
    assert cal.gpu.provenance.startswith("calibrated")
    assert cal.intra_latency_us == 1.5 and cal.collective_base_latency_us == 27.0
    model, job = ModelSpec.preset("gpt-1.7b"), Job(global_batch=16, seq_len=2048)
    lay = Layout(dp=2, tp=4)
    assert estimate(model, cal, job, lay).step_time_s != estimate(model, cluster, job, lay).step_time_s


def test_profile_of_other_gpu_is_refused_unless_override(tmp_path):
    path = _write_gpu_profile(tmp_path / "h100.toml")
    a100 = Cluster.preset("dgx-a100-80gb", nodes=1)
    with pytest.raises(ProfileError, match=r"H100-SXM5-80GB.*A100-SXM4-80GB.*override"):
        apply_profile(a100, path)
    forced = apply_profile(a100, path, override=True)
    assert forced.gpu.name == "H100-SXM5-80GB"


def test_load_profile_rejects_foreign_and_broken_files(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('schema = "something-else"\nversion = 1\n')
    with pytest.raises(ProfileError, match="schema"):
        load_profile(bad)
    bad.write_text("schema = \n")
    with pytest.raises(ProfileError, match="not valid TOML"):
        load_profile(bad)
    with pytest.raises(ProfileError, match="does not exist"):
        load_profile(tmp_path / "missing.toml")
    doc = tomllib.loads(_write_gpu_profile(tmp_path / "ok.toml").read_text())
    doc["gpu"]["hbm_efficiency"] = 1.5
    bad.write_text(dumps(doc))
    with pytest.raises(ProfileError, match="hbm_efficiency"):
        load_profile(bad)
    doc["gpu"]["hbm_efficiency"] = 0.9
    doc["gpu"]["overlap_interference"] = -0.1
    bad.write_text(dumps(doc))
    with pytest.raises(ProfileError, match="overlap_interference must be >= 0"):
        load_profile(bad)


def test_misspelt_gpu_key_warns_with_the_closest_known_keys(tmp_path):
    """``layer_overhed_s`` was dropped without a word and the default 0 used."""
    import warnings

    from meshplan.errors import MeshplanWarning
    path = _write_gpu_profile(tmp_path / "ok.toml")
    doc = tomllib.loads(path.read_text())
    assert {"attention_head_dim", "attention_head_dim_ratio"} <= set(doc["gpu"])   # written
    with warnings.catch_warnings():
        warnings.simplefilter("error", MeshplanWarning)
        load_profile(path)                  # what calibrate writes loads without a warning
    doc["gpu"]["layer_overhed_s"] = doc["gpu"].pop("layer_overhead_s")
    bad = write_text_atomic(tmp_path / "typo.toml", dumps(doc))
    with pytest.warns(MeshplanWarning, match=r"typo.toml \[gpu\]: unknown key "
                      r"'layer_overhed_s' is ignored.*did you mean 'layer_overhead_s'") as rec:
        p = load_profile(bad)
    assert p.gpu.layer_overhead_s == 0.0 and len(rec) == 1
    assert rec[0].filename == __file__                  # points at the caller's line


def test_version_1_cuda_layer_rows_lose_their_second_input(tmp_path):
    """Version 1 counted a ZeRO-0 CUDA layer row's input twice (once in the fresh-input
    reading, once added): loading removes input / L; other rows and version 2 stay."""
    from meshplan.hardware_profiles.calibrated import READABLE_VERSIONS, VERSION
    assert VERSION == 2 and READABLE_VERSIONS == (1, 2)
    doc = tomllib.loads(_write_gpu_profile(tmp_path / "ok.toml").read_text())
    shape = "h1280-f5120-q20-kv20-d64-gelu-layernorm-learned-bias-drop0"
    row = {"shape": shape, "seq_len": 2048, "tp": 1, "sequence_parallel": False,
           "recompute": "full", "micro_batch": 4, "zero": 0, "dp": 1, "forward_s": 1e-3,
           "backward_s": 2e-3, "activation_bytes": 30 * 2**20,
           "backward_peak_bytes": 400 * 2**20, "model": "gpt", "split_layers": 2,
           "forward_cpu_s": 1e-3, "backward_cpu_s": 2e-3}
    fsdp = {**row, "zero": 2, "dp": 2, "split_layers": 0}
    # a row from before the second-forward reading (no CPU timing; tp 2 for its own key)
    older = {k: v for k, v in row.items() if not k.endswith("_cpu_s")} | {"tp": 2}
    doc["layers"] = [row, fsdp, older]
    input_bytes = 4 * 2048 * 1280 * 2                        # 20 MiB

    def loaded(version, device):
        d = {**doc, "version": version, "provenance": {**doc["provenance"], "device": device}}
        path = tmp_path / f"v{version}{device}.toml"
        path.write_text(dumps(d))
        tables = load_profile(path).gpu.measured
        return [r.activation_bytes for r in tables.layers]

    assert loaded(1, "cuda") == pytest.approx([30 * 2**20 - input_bytes / 2] + [30 * 2**20] * 2)
    assert loaded(2, "cuda") == pytest.approx([30 * 2**20] * 3)
    assert loaded(1, "cpu") == pytest.approx([30 * 2**20] * 3)   # CPU rows: no fresh input
    bad = tmp_path / "v3.toml"
    bad.write_text(dumps({**doc, "version": 3}))
    with pytest.raises(ProfileError, match="version.*3.*reads profile versions 1, 2"):
        load_profile(bad)


def test_loading_pools_the_per_call_cpu_part_per_layer_shape(tmp_path):
    """Each setting's per-call CPU part is a noisy two-depth fit; loading replaces it with
    the median over the rows of the same shape and re-derives the per-layer rest so that the
    2-block call it was timed on costs what was measured. Other shapes, rows without CPU
    times and CPU-device profiles stay as written."""
    from meshplan.hardware_profiles.calibrated import pool_cpu_fixed
    doc = tomllib.loads(_write_gpu_profile(tmp_path / "ok.toml").read_text())
    gpt = "h1280-f5120-q20-kv20-d64-gelu-layernorm-learned-bias-drop0"
    base = {"shape": gpt, "seq_len": 2048, "tp": 1, "sequence_parallel": False,
            "recompute": "none", "micro_batch": 4, "zero": 0, "dp": 1, "forward_s": 1e-3,
            "backward_s": 2e-3, "activation_bytes": 30 * 2**20,
            "backward_peak_bytes": 400 * 2**20, "model": "gpt"}
    ms = 1e-3
    # (forward per layer, backward per layer, forward per call, backward per call), ms
    cpu = [(1.0, 2.0, 0.0, 3.0), (1.2, 2.4, 0.4, 1.0), (0.5, 1.0, 2.0, 0.0)]
    rows = [{**base, "tp": tp, "forward_cpu_s": f * ms, "backward_cpu_s": b * ms,
             "forward_cpu_fixed_s": ff * ms, "backward_cpu_fixed_s": bf * ms}
            for tp, (f, b, ff, bf) in zip((1, 2, 4), cpu)]
    other = {**rows[0], "shape": "h2048-other", "forward_cpu_fixed_s": 5 * ms}
    no_cpu = {**base, "tp": 8}
    pooled = pool_cpu_fixed([*rows, other, no_cpu])
    assert [r["forward_cpu_fixed_s"] for r in pooled[:3]] == pytest.approx([0.4 * ms] * 3)
    assert [r["backward_cpu_fixed_s"] for r in pooled[:3]] == pytest.approx([1.0 * ms] * 3)
    for before, after in zip(rows, pooled):      # the 2-block call: per layer + per call / 2
        for layer, call in (("forward_cpu_s", "forward_cpu_fixed_s"),
                            ("backward_cpu_s", "backward_cpu_fixed_s")):
            assert after[layer] + after[call] / 2 == pytest.approx(
                before[layer] + before[call] / 2)
    assert pooled[3] == other and pooled[4] == no_cpu       # alone in its shape; no CPU
    bad = {**rows[0], "backward_cpu_fixed_s": -1e-3}         # left for the row check to name
    assert pool_cpu_fixed([bad, *rows[1:]])[0] == bad
    assert rows[0]["forward_cpu_fixed_s"] == 0.0             # the input is not modified
    # a pooled part larger than a row's whole 2-block call is not that row's per-call cost:
    # the row keeps its own split (capped, it kept no per-layer CPU: moeh67h100)
    tiny = [{**rows[0], "forward_cpu_s": 0.1 * ms, "forward_cpu_fixed_s": 0.0}, *rows[1:]]
    assert pool_cpu_fixed(tiny)[0]["forward_cpu_s"] == pytest.approx(0.1 * ms)
    assert pool_cpu_fixed(tiny)[0]["forward_cpu_fixed_s"] == 0.0
    assert pool_cpu_fixed(tiny)[1]["forward_cpu_fixed_s"] == pytest.approx(0.4 * ms)

    doc["layers"] = rows

    def loaded(device):
        d = {**doc, "provenance": {**doc["provenance"], "device": device}}
        path = tmp_path / f"{device}.toml"
        path.write_text(dumps(d))
        return [r.forward_cpu_fixed_s for r in load_profile(path).gpu.measured.layers]
    assert loaded("cuda") == pytest.approx([0.4 * ms] * 3)
    assert loaded("cpu") == pytest.approx([0.0, 0.4 * ms, 2.0 * ms])


def test_a_row_stores_its_deep_cpu_reading_and_loads_it_unpriced(tmp_path):
    """The CPU per layer read on the deep stack (and its blocks) is stored with each row and
    loaded as written; the estimate does not read it, so the per-layer price is unchanged.
    A negative reading or a depth that is not a whole number is named."""
    from meshplan.hardware_profiles.calibrated import pool_cpu_fixed
    doc = tomllib.loads(_write_gpu_profile(tmp_path / "ok.toml").read_text())
    row = {"shape": "h1280-f5120-q20-kv20-d64-gelu-layernorm-learned-bias-drop0",
           "seq_len": 2048, "tp": 1, "sequence_parallel": False, "recompute": "none",
           "micro_batch": 4, "zero": 0, "dp": 1, "forward_s": 1e-3, "backward_s": 2e-3,
           "activation_bytes": 30 * 2**20, "backward_peak_bytes": 400 * 2**20,
           "model": "gpt", "forward_cpu_s": 1e-3, "backward_cpu_s": 2e-3,
           "forward_cpu_fixed_s": 0.5e-3, "backward_cpu_fixed_s": 1e-3}
    deep = {**row, "forward_cpu_deep_s": 0.4e-3, "backward_cpu_deep_s": 0.9e-3,
            "cpu_deep_layers": 16}
    assert {k: v for k, v in pool_cpu_fixed([deep])[0].items() if k in row} \
        == pool_cpu_fixed([row])[0]
    path = tmp_path / "deep.toml"
    path.write_text(dumps({**doc, "layers": [deep]}))
    got = load_profile(path).gpu.measured.layers[0]
    assert (got.forward_cpu_deep_s, got.backward_cpu_deep_s, got.cpu_deep_layers) \
        == (0.4e-3, 0.9e-3, 16)
    assert got.forward_cpu_s == 1e-3
    for bad, name in (({"forward_cpu_deep_s": -1e-3}, "forward_cpu_deep_s"),
                      ({"cpu_deep_layers": 2.5}, "cpu_deep_layers")):
        path.write_text(dumps({**doc, "layers": [{**deep, **bad}]}))
        with pytest.raises(ProfileError, match=name):
            load_profile(path)


def test_split_backward_cpu_is_bounded_by_its_synchronized_timing():
    """A queued CPU dispatch time far above the synchronized timing of the same call (which
    ends after its last launch) is lowered to it; timing spread below that, and rows without
    a synchronized timing, stay."""
    from meshplan.hardware_profiles.calibrated import bound_split_cpu
    row = {"backward_input_cpu_s": 12e-3, "backward_input_sync_s": 8e-3,
           "backward_weight_cpu_s": 0.58, "backward_weight_sync_s": 23e-3}
    assert bound_split_cpu(row) == {**row, "backward_weight_cpu_s": 23e-3}
    assert row["backward_weight_cpu_s"] == 0.58                 # the input is not modified
    unsynced = {"backward_input_cpu_s": 7e-3, "backward_weight_cpu_s": 0.58}
    assert bound_split_cpu(unsynced) == unsynced


def test_gpu_profiles_load_without_the_split_backward_depth_growth(tmp_path):
    """On CUDA the split backward's growth per extra layer is timing noise (round 9): a GPU
    profile loads with none, so zero-bubble's B and W per layer are the timed ones at every
    stage depth; a CPU profile keeps the growth it measured."""
    from meshplan.costmodel.estimate import layer_tables
    from meshplan.hardware_profiles.calibrated import drop_split_depth
    row = {"backward_input_depth_s": -1e-4, "backward_weight_depth_s": 3e-4, "x": 1}
    assert drop_split_depth(row) == {**row, "backward_input_depth_s": 0.0,
                                     "backward_weight_depth_s": 0.0}
    assert row["backward_weight_depth_s"] == 3e-4                # the input is not modified
    flat = {"backward_weight_depth_s": 0.0, "x": 1}
    assert drop_split_depth(flat) is flat and drop_split_depth("bad") == "bad"

    doc = tomllib.loads(_write_gpu_profile(tmp_path / "ok.toml").read_text())
    gpt = "h1280-f5120-q20-kv20-d64-gelu-layernorm-learned-bias-drop0"
    doc["layers"] = [{"shape": gpt, "seq_len": 2048, "tp": 1, "sequence_parallel": False,
                      "recompute": "none", "micro_batch": 4, "zero": 0, "dp": 1,
                      "forward_s": 1e-3, "backward_s": 2e-3, "activation_bytes": 30 * 2**20,
                      "backward_peak_bytes": 400 * 2**20, "model": "gpt",
                      "backward_input_s": 1.2e-3, "backward_weight_s": 1.0e-3,
                      "split_layers": 2, "backward_input_depth_s": 0.0,
                      "backward_weight_depth_s": 0.5e-3}]

    def wgrad_per_layer(device):
        d = {**doc, "provenance": {**doc["provenance"], "device": device}}
        path = tmp_path / f"{device}.toml"
        path.write_text(dumps(d))
        cluster = apply_profile(Cluster.preset("dgx-h100", nodes=1, gpus_per_node=4), path,
                                override=True)
        lay = Layout(pp=2, micro_batch=4, schedule="zero-bubble")
        gpt_05b = ModelSpec(name="gpt-0.54b", num_layers=24, hidden_size=1280, num_heads=20,
                            vocab_size=51200, max_seq_len=2048, activation="gelu",
                            norm="layernorm", position_embedding="learned",
                            tied_embeddings=True, bias=True)
        return layer_tables(gpt_05b, cluster,
                            Job(global_batch=8, seq_len=2048), lay).layer_wgrad_s
    # 12-layer stages: 10 layers beyond the 2-block stack the split was timed on
    # (timed synchronized: the GPU's W is its share of the fused 2 ms backward,
    # costmodel.build.synchronized_split_gpu)
    assert wgrad_per_layer("cuda") == pytest.approx(2e-3 * 1.0e-3 / 2.2e-3)
    w_cpu = 1.0e-3 + 10 * 0.5e-3
    assert wgrad_per_layer("cpu") == pytest.approx(2e-3 * w_cpu / (1.2e-3 + w_cpu))


def test_two_depth_fit_is_the_line_through_two_stack_depths():
    from meshplan.calibrate.stats import two_depth_fit
    assert two_depth_fit(2, 7.0, 4, 11.0) == pytest.approx((3.0, 2.0))   # 3 + 2 n
    assert two_depth_fit(8, 19.0, 2, 7.0) == pytest.approx((3.0, 2.0))   # either order
    with pytest.raises(ValueError, match="two different depths"):
        two_depth_fit(2, 1.0, 2, 2.0)


def test_overlap_interference_arithmetic():
    from meshplan.calibrate.bench_overlap import interference
    assert interference(3.0, 1.0, 3.0) == 0.0             # hidden entirely
    assert interference(3.0, 1.0, 4.0) == 1.0             # as if one after the other
    assert interference(3.0, 1.0, 3.5) == pytest.approx(0.5)
    assert interference(3.0, 1.0, 2.9) == 0.0             # timing noise: never below 0
    assert interference(3.0, 1.0, 9.0) == 2.0             # nor above 2
    assert interference(0.0, 1.0, 1.0) == 0.0


# ---- validate bookkeeping --------------------------------------------------------------------
def test_read_measurement_accepts_nested_and_per_rank_forms():
    doc = {"measured": {"step_time_s": 0.5, "step_time": {"median": 0.5, "spread_pct": 2.0},
                        "memory_per_rank": [{"rank": 0, "allocated_bytes": 10},
                                            {"rank": 1, "allocated_bytes": 12}]}}
    m = read_measurement(doc, 2)
    assert m["step_time_s"] == 0.5 and m["memory_per_rank_bytes"] == [10.0, 12.0]
    assert m["memory_peak_bytes"] == 12.0
    with pytest.raises(ValueError, match="step time"):
        read_measurement({"measured": {}}, 1)


def test_summarize_best_layout_and_failures():
    def rec(name, p, m, status="ok"):
        r = {"name": name, "model": "x", "status": status, "predicted": {"step_time_s": p}}
        if status == "ok":
            r.update(measured={"step_time_s": m}, step_time_error_pct=pct_error(p, m))
        return r
    records = [rec("a", 1.0, 1.1), rec("b", 2.0, 1.9), rec("c", 0.9, 1.2), rec("d", 3, 0, "oom")]
    s = summarize(records)
    assert s["ok"] == 3 and s["not_ok"]["oom"] == 1
    assert s["predicted_best"] == "c" and s["measured_best"] == "a"
    assert not s["predicted_best_is_measured_best"]
    assert s["predicted_best_gap_pct"] == pytest.approx((1.2 - 1.1) / 1.1 * 100)
    assert s["step_time_max_abs_error_pct"] == pytest.approx(25.0)
    assert s["steady_layouts"] == 0 and "steady_step_time_mean_abs_error_pct" not in s


def test_summary_reports_the_steadily_measured_layouts_apart():
    """Layouts whose timed steps spread by more than 5 % are still in every figure; the
    steady ones are summarized on their own as well, and accuracy.md shows each spread."""
    from meshplan.calibrate.accuracy_report import markdown

    def rec(name, p, m, spread):
        return {"name": name, "model": "x", "status": "ok", "short": name,
                "predicted": {"step_time_s": p},
                "measured": {"step_time_s": m, "step_time_spread": spread},
                "step_time_error_pct": pct_error(p, m)}
    records = [rec("a", 1.0, 1.02, 3.0), rec("b", 1.0, 1.25, 30.0), rec("c", 2.0, 1.96, 5.0),
               rec("d", 1.0, 1.1, None)]
    s = summarize(records)
    assert s["step_time_max_abs_error_pct"] == pytest.approx(20.0)
    assert s["steady_layouts"] == 2
    assert s["steady_step_time_mean_abs_error_pct"] == pytest.approx(
        (100 * 0.02 / 1.02 + 100 * 0.04 / 1.96) / 2)
    assert s["steady_step_time_max_abs_error_pct"] == pytest.approx(100 * 0.04 / 1.96)
    md = markdown(records, s, {"x": s}, {}, "accuracy.png")
    assert "steady (p90 − p10 ≤ 5 % of the median step): 2 of 4" in md
    assert "| b | x | b | ok | 1.0000 | 1.2500 | 30% | -20.0% |" in md


def test_summary_splits_by_the_models_own_host_bound_call():
    """The prediction's ``host_bound`` (the model's caveat, not the measurement) splits the
    step-time errors; records from before the flag existed count in neither part."""
    from meshplan.calibrate.accuracy_report import markdown
    from meshplan.calibrate.validate import bound_split_text

    def rec(name, p, m, host_bound):
        pred = {"step_time_s": p}
        if host_bound is not None:
            pred["host_bound"] = host_bound
        return {"name": name, "model": "x", "status": "ok", "short": name, "predicted": pred,
                "measured": {"step_time_s": m}, "step_time_error_pct": pct_error(p, m)}
    records = [rec("a", 1.0, 1.02, False), rec("b", 1.0, 1.25, True), rec("c", 2.0, 1.96, False),
               rec("d", 1.0, 1.1, None)]
    s = summarize(records)
    assert s["gpu_bound_layouts"] == 2 and s["host_bound_layouts"] == 1
    assert s["gpu_bound_step_time_max_abs_error_pct"] == pytest.approx(100 * 0.04 / 1.96)
    assert s["host_bound_step_time_mean_abs_error_pct"] == pytest.approx(20.0)
    gpu_mean = s["gpu_bound_step_time_mean_abs_error_pct"]
    assert bound_split_text(s) == (f"GPU-bound 2: mean {gpu_mean:.2f}%, max 2.04%; "
                                   f"host-bound 1: mean 20.00%, max 20.00%")
    assert "2 layouts GPU-bound" in markdown(records, s, {"x": s}, {}, "accuracy.png")
    old = summarize([rec("d", 1.0, 1.1, None)])
    assert old["gpu_bound_layouts"] == old["host_bound_layouts"] == 0
    assert bound_split_text(old) == ""


def test_summary_splits_gpu_bound_layouts_by_cpu_headroom():
    """Records with the prediction's ``host_load`` split the GPU-bound layouts once more, at
    HOST_NEAR_LOAD; host-bound ones stay apart whatever their load."""
    from meshplan.calibrate.accuracy_report import markdown
    from meshplan.calibrate.validate import bound_split_text

    def rec(name, p, m, host_bound, load):
        return {"name": name, "model": "x", "status": "ok", "short": name,
                "predicted": {"step_time_s": p, "host_bound": host_bound, "host_load": load},
                "measured": {"step_time_s": m}, "step_time_error_pct": pct_error(p, m)}
    records = [rec("a", 1.0, 1.02, False, 0.3), rec("b", 1.0, 1.1, False, 0.85),
               rec("c", 1.0, 1.25, True, 1.4), rec("d", 1.0, 0.99, False, 0.79)]
    s = summarize(records)
    assert (s["gpu_bound_layouts"], s["headroom_layouts"], s["near_host_bound_layouts"],
            s["host_bound_layouts"]) == (3, 2, 1, 1)
    assert s["headroom_step_time_max_abs_error_pct"] == pytest.approx(100 * 0.02 / 1.02)
    assert s["near_host_bound_step_time_mean_abs_error_pct"] == pytest.approx(100 * 0.1 / 1.1)
    text = bound_split_text(s)
    assert "of them CPU < 80 % 2: mean" in text and "CPU ≥ 80 % 1: mean 9.09%" in text
    assert "1 are near host-bound" in markdown(records, s, {"x": s}, {}, "accuracy.png")
    # one record without host_load (an older run): no headroom split at all
    old = summarize(records + [{**records[0], "name": "e", "predicted": {
        "step_time_s": 1.0, "host_bound": False}}])
    assert "headroom_layouts" not in old and old["gpu_bound_layouts"] == 4


def test_predicted_record_carries_the_host_bound_call():
    from meshplan.calibrate.validate import predicted_record
    from meshplan.costmodel.estimate import HOST_BOUND_CAVEAT_SHARE, is_host_bound
    model = ModelSpec(name="t", num_layers=4, hidden_size=64, num_heads=4, vocab_size=128,
                      max_seq_len=64)
    cluster = Cluster.preset("dgx-h100", nodes=1)
    lay = Layout(dp=4, micro_batch=1)
    est = estimate(model, cluster, Job(global_batch=8, seq_len=64), lay)
    rec = predicted_record(est, lay, cluster)
    assert rec["host_wait_s"] == est.time.host_wait_s
    assert rec["host_bound"] == any(c.startswith("host-bound") for c in est.caveats)
    assert rec["host_load"] == est.host_load
    assert is_host_bound(HOST_BOUND_CAVEAT_SHARE, 1.0) and not is_host_bound(0.0, 1.0)
    assert not is_host_bound(0.9 * HOST_BOUND_CAVEAT_SHARE, 1.0)


def test_merge_runs_takes_the_median_step_and_each_ranks_largest_peak():
    from meshplan.calibrate.validate import merge_runs

    def run(t, mem, status="ok"):
        if status != "ok":
            return {"status": status, "error": "x", "wall_s": 1.0}
        return {"status": "ok", "wall_s": 2.0,
                "measured": {"step_time_s": t, "memory_per_rank_bytes": mem,
                             "memory_peak_bytes": max(mem), "host_probe_us_per_rank": [t]}}
    one = run(1.0, [5.0, 6.0])
    assert merge_runs([one]) == one
    pred = {"step_time_s": 1.2, "memory_per_rank_bytes": [6.0, 6.0], "memory_peak_bytes": 6.0}
    odd = merge_runs([run(1.5, [5.0, 6.0]), run(1.0, [5.5, 6.0]), run(1.2, [5.0, 6.5])], pred)
    assert odd["measured"]["step_time_s"] == 1.2
    assert odd["measured"]["memory_per_rank_bytes"] == [5.5, 6.5]
    assert odd["measured"]["memory_peak_bytes"] == 6.5
    assert odd["measured"]["host_probe_us_per_rank"] == [1.2]      # the nearest run's
    assert odd["step_time_error_pct"] == pytest.approx(0.0)
    assert odd["memory_error_pct_per_rank"] == pytest.approx([100 * (6 / 5.5 - 1),
                                                              100 * (6 / 6.5 - 1)])
    assert odd["run_to_run_spread_pct"] == pytest.approx(50 / 1.2)
    assert [r["step_time_s"] for r in odd["runs"]] == [1.5, 1.0, 1.2]
    even = merge_runs([run(1.0, [1.0]), run(1.4, [1.0]), run(0, [], "timeout")], pred)
    assert even["measured"]["step_time_s"] == pytest.approx(1.2)
    assert [r["status"] for r in even["runs"]] == ["ok", "ok", "timeout"]
    assert even["wall_s"] == pytest.approx(5.0)
    assert merge_runs([run(0, [], "oom"), run(0, [], "oom")])["status"] == "oom"


def test_enumerate_layouts_are_valid_and_fit():
    model = ModelSpec(name="t", num_layers=4, hidden_size=64, num_heads=4, vocab_size=128,
                      max_seq_len=64)
    cluster = Cluster.preset("dgx-h100", nodes=1)
    job = Job(global_batch=8, seq_len=64)
    lays = enumerate_layouts(model, cluster, job, 4)
    assert lays and all(l.num_gpus == 4 for l in lays)
    assert {l.schedule for l in lays if l.pp > 1} >= {"gpipe", "1f1b", "interleaved-1f1b"}
    est = estimate(model, cluster, job, Layout(dp=1, pp=2, tp=2))
    per_rank = predicted_memory_per_rank(est, Layout(dp=1, pp=2, tp=2), cluster)
    assert per_rank == [est.memory[0].total_bytes] * 2 + [est.memory[1].total_bytes] * 2


def test_calibrate_and_validate_paths_never_import_ortools_or_torch_at_import():
    code = ("import sys; sys.modules['ortools'] = None\n"
            "import meshplan.calibrate.validate, meshplan.calibrate.profile, "
            "meshplan.commands.calibrate, meshplan.commands.validate, "
            "meshplan.hardware_profiles.calibrated\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[2])
