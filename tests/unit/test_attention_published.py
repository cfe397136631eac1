"""Datasheet attention curves derived from published kernel benchmarks
(hardware_profiles/attention_published.py, data/attention_kernels.toml)."""

from __future__ import annotations

import pytest

import meshplan as mp
from meshplan.hardware_profiles import builtin_gpu, builtin_gpu_names
from meshplan.hardware_profiles.attention_published import (published_attention_curve,
                                                            published_points)
from meshplan.hardware_profiles.curve import Curve
from meshplan.hardware_profiles.loader import builtin_table, gpu_from_table

HOPPER = ("H100-SXM5-80GB", "H200-SXM-141GB")
PUBLISHED = (*HOPPER, "B200")
SHAPE = Curve(((1e8, 0.04), (1e9, 0.135), (1e10, 0.285), (1e11, 0.375)))


def kernels():
    return builtin_table("attention_kernels.toml")


def test_hopper_curve_reads_back_the_fa3_papers_cudnn_bars():
    """At 16k tokens (16 heads of 128, batch 1) the paper's cuDNN bars read forward causal
    539, forward 595 and backward 516 TFLOP/s (backward published without the mask):
    eq. (1)-(4) by hand."""
    flops = 2 * 16384 * 16384 * 16 * 128
    fwd = 539 / 989
    bwd = 516 / 989 * 539 / 595
    want = 3.5 / (1 / fwd + 2.5 / bwd)
    for name in HOPPER:
        gpu = builtin_gpu(name)
        assert gpu.attention_efficiency(flops) == pytest.approx(want, abs=1e-4)
        assert gpu.attention_efficiency(flops) == pytest.approx(0.4913, abs=1e-4)
        # beyond the last published length the curve holds it
        assert gpu.attention_efficiency(64 * flops) == gpu.attention_efficiency(flops)


def test_below_the_published_range_the_shape_meets_the_first_point():
    gpu = builtin_gpu("H100-SXM5-80GB")
    x0, y0 = published_points(kernels()["cudnn-h100-fa3"], "t")[0]
    assert x0 == 2 * 16384 * 512 * 16 * 128
    assert gpu.attention_efficiency(x0) == pytest.approx(y0)
    scale = y0 / SHAPE(x0)
    assert gpu.attention_efficiency(1e9) == pytest.approx(SHAPE(1e9) * scale, rel=1e-3)
    assert gpu.attention_efficiency(1e8) == pytest.approx(SHAPE(1e8) * scale, rel=1e-3)


@pytest.mark.parametrize("name", builtin_gpu_names())
def test_every_builtin_attention_curve_is_monotone_and_bounded(name):
    """Rising up to its highest point; past it only published points, as published (B200's
    benchmark falls 0.526 -> 0.498 of peak from 32k to 128k tokens)."""
    pts = builtin_gpu(name).attention_efficiency.points
    ys = [y for _, y in pts]
    assert all(0 < y <= 1 for y in ys)
    top = ys.index(max(ys))
    assert ys[:top + 1] == sorted(ys[:top + 1]), f"{name}: falls below its top: {ys}"
    table = builtin_table("gpus.toml")[name]
    published = (set(published_points(kernels()[table["attention_published"]], name))
                 if "attention_published" in table else set())
    assert set(pts[top + 1:]) <= published, f"{name}: falls where nothing was published: {ys}"


def test_gpus_without_a_published_benchmark_keep_their_points():
    table = builtin_table("gpus.toml")
    for name in builtin_gpu_names():
        if "attention_published" not in table[name]:
            pts = [tuple(p) for p in table[name]["attention_efficiency"]]
            assert builtin_gpu(name).attention_efficiency.points == tuple(pts)
    assert {n for n in builtin_gpu_names() if "attention_published" in table[n]} == set(PUBLISHED)


def test_every_published_benchmark_is_cited_and_used_tables_exist():
    """Cited as a paper's figure or as a repository's file at a commit."""
    for name, t in kernels().items():
        paper = "arXiv" in t["source"] and "Figure" in t["source"]
        repository = "github.com/" in t["source"] and "commit" in t["source"]
        assert paper or repository, name
        assert {"kernel", "gpu", "precision"} <= set(t), name
        published_points(t, name)                      # well-formed
    gpus = builtin_table("gpus.toml")
    for name in builtin_gpu_names():
        if "attention_published" in gpus[name]:
            assert gpus[name]["attention_published"] in kernels()


def test_flash_attention_2_bars_run_slower_than_cudnns():
    """The same figures: FlashAttention-2 (the ring's kernel under MESHPLAN_RING_KERNEL=flash)
    below cuDNN at every length, by 1.5-1.6x."""
    cudnn = published_points(kernels()["cudnn-h100-fa3"], "c")
    fa2 = published_points(kernels()["flash2-h100-fa3"], "f")
    assert [x for x, _ in cudnn] == [x for x, _ in fa2]
    ratios = [c / f for (_, c), (_, f) in zip(cudnn, fa2)]
    assert all(1.45 < r < 1.65 for r in ratios), ratios


def test_a_published_masked_backward_is_used_as_given():
    t = dict(kernels()["cudnn-h100-fa3"])
    for k in ("backward_tflops", "forward_tflops"):
        del t[k]
    t["backward_causal_tflops"] = [300.0] * len(t["seq"])
    _, y = published_points(t, "t")[-1]
    assert y == pytest.approx(3.5 / (989 / 539 + 2.5 * 989 / 300), abs=1e-4)


def test_b200_curve_reads_back_nvidias_cudnn_frontend_sweep():
    """cuDNN frontend's B200 artifact, rows pyt_cudnn, seq 8192 (batch 1, 128 query heads of
    128, causal): forward 1.877 ms at 1171.278 TFLOP/s, backward 5.833 ms at 942.509; eq. (1)
    E = 2·B·s²·h·d, eq. (4) with the B200's 2250 TFLOP/s by hand."""
    flops = 2 * 1 * 8192 ** 2 * 128 * 128
    assert flops / 1.877e-3 / 1e12 == pytest.approx(1171.278, rel=1e-3)   # the CSV's count
    assert 2.5 * flops / 5.833e-3 / 1e12 == pytest.approx(942.509, rel=1e-3)
    fwd, bwd = 1171.278 / 2250, 942.509 / 2250
    want = 3.5 / (1 / fwd + 2.5 / bwd)
    gpu = builtin_gpu("B200")
    # profiles store 4 significant digits (attention_published.py: sig(eff, 4))
    assert gpu.attention_efficiency(flops) == pytest.approx(float(f"{want:.4g}"), rel=1e-6)
    assert gpu.attention_efficiency(flops) == pytest.approx(want, rel=1.2e-4)
    assert gpu.attention_efficiency(flops) == pytest.approx(0.4437, abs=1e-4)
    # no head-dim ratio: no B200 table at another head dim (H100's is not borrowed)
    assert gpu.attention_head_dim_ratio == ()
    assert gpu.attention_efficiency_at(flops, 64) == gpu.attention_efficiency(flops)


def test_a_batch_table_counts_flops_per_length():
    """Key 'batch' (cuDNN frontend's sweeps): E = 4·B·s²·h·d/2 at each length. By hand at
    B = 2, 4 heads of 64, s = 1024: E = 2·2·1024²·4·64 = 1.0737e9; forward 100 and backward
    80 of a 400 TFLOP/s peak: eff = 3.5 / (4 + 2.5·5) = 0.21212, stored as 0.2121."""
    t = {"source": "s", "peak_tflops": 400.0, "batch": 2, "heads": 4, "head_dim": 64,
         "seq": [1024, 2048], "forward_causal_tflops": [100.0, 200.0],
         "backward_causal_tflops": [80.0, 160.0]}
    (x0, y0), (x1, y1) = published_points(t, "t")
    assert x0 == 2 * 2 * 1024 ** 2 * 4 * 64 == pytest.approx(1.0737e9, rel=1e-4)
    assert x1 == 4 * x0                                # batch fixed: E grows as s²
    assert y0 == pytest.approx(3.5 / (400 / 100 + 2.5 * 400 / 80), abs=1e-4)
    assert y0 == 0.2121
    assert y1 == 0.4242                                # 3.5 / (2 + 2.5·2.5), twice as fast
    # the same sweep as tokens = B·s at one length reads the same E
    tok = {k: v for k, v in t.items() if k != "batch"} | {"tokens": 2 * 1024}
    assert published_points(tok, "t")[0] == (x0, y0)


@pytest.mark.parametrize("change, match", [
    (lambda t: t.pop("tokens"), r"exactly one of 'tokens' .* or 'batch' .*got neither"),
    (lambda t: t.update(batch=1), r"exactly one of .*got \['tokens', 'batch'\]"),
    (lambda t: t.update(batch=0) or t.pop("tokens"), "'batch' must be a positive number"),
    (lambda t: t.pop("source"), "missing key"),
    (lambda t: t.update(source=" "), "'source' must name"),
    (lambda t: t.update(seq=[1024, 512, 2048, 4096, 8192, 16384]), "strictly increasing"),
    (lambda t: t.update(forward_causal_tflops=[315.0, 410.0]), "list of 6 positive numbers"),
    (lambda t: t.update(backward_tflops=[305.0, 408.0, -1.0, 499.0, 518.0, 516.0]),
     "'backward_tflops' must be a list of 6 positive"),
    (lambda t: t.pop("forward_tflops"), "needs 'backward_causal_tflops'"),
    (lambda t: t.update(heads=0), "'heads' must be a positive number"),
    (lambda t: t.update(peak_tflops=300.0), "exceed peak_tflops 300"),
])
def test_malformed_benchmark_tables_name_the_key(change, match):
    t = dict(kernels()["cudnn-h100-fa3"])
    change(t)
    with pytest.raises(mp.ProfileError, match=match):
        published_attention_curve(t, SHAPE, "my.toml [k]")


def test_a_profile_naming_an_unknown_benchmark_is_refused():
    table = dict(builtin_table("gpus.toml")["H100-SXM5-80GB"])
    table["attention_published"] = "cudnn-h100-fa9"
    with pytest.raises(mp.ProfileError, match=r"'cudnn-h100-fa9'.*known: cudnn-h100-fa3"):
        gpu_from_table("X", table, "my.toml [X]")
    table["attention_published"] = 3
    with pytest.raises(mp.ProfileError, match="attention_published' must be str"):
        gpu_from_table("X", table, "my.toml [X]")


def test_attention_passes_compare_derives_the_three_curves(load_benchmark):
    """benchmarks/attention_passes_gpu.py --compare: fed the paper's own bars (the masked
    backward as eq. (3) assumes) its three curve columns are the datasheet points; a slower
    measured masked backward lowers only the last."""
    ap = load_benchmark("attention_passes_gpu")
    pub = kernels()["cudnn-h100-fa3"]
    rows = []
    for i, s in enumerate(pub["seq"]):
        t = {p: pub[p + "_tflops"][i] for p in ("forward_causal", "forward", "backward")}
        t["backward_causal"] = t["backward"] * t["forward_causal"] / t["forward"]
        rows.append({"seq": s, "tflops": t})
    doc = {"gpu": "G", "torch": "T", "cudnn": 1, "peak_tflops": 989.0, "rows": rows}
    want = [f"{y:.3f}" for _, y in published_points(pub, "p")]
    lines = ap.compare(doc).splitlines()[2:]
    assert [ln.split()[-3:] for ln in lines] == [[w, w, w] for w in want]
    for r in rows:
        r["tflops"]["backward_causal"] *= 0.8
    last = [float(ln.split()[-1]) for ln in ap.compare(doc).splitlines()[2:]]
    assert all(a < float(w) for a, w in zip(last, want))
    assert ap.pass_flops(16384, causal=True, backward=False) == 2 * 16384 * 16384 * 16 * 128


def test_cp_posthoc_rerun_rows_replace_the_first_runs_by_name(load_benchmark, tmp_path):
    ph = load_benchmark("cp_gpu_posthoc")
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    first.write_text('[{"name": "x", "v": 1}, {"name": "y", "v": 2}]')
    second.write_text('[{"name": "y", "v": 3}]')
    assert ph.merged_rows(str(first), str(second)) == [{"name": "x", "v": 1},
                                                        {"name": "y", "v": 3}]
    assert ph.merged_rows(str(first), None)[1]["v"] == 2
    second.write_text('[{"name": "z", "v": 3}]')
    with pytest.raises(SystemExit, match="layouts \\['z'\\]"):
        ph.merged_rows(str(first), str(second))
