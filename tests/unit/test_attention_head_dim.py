"""Attention priced at the model's head dim: the FlashAttention-3 paper's head-dim-64 cuDNN
bars as a ratio to the head-dim-128 curve by forward FLOPs (hardware_profiles/
attention_published.py eq. (5), GPUSpec.attention_efficiency_at), read by the layer and both
context-parallel cores."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

import meshplan as mp
from meshplan.costmodel import context
from meshplan.costmodel.tables import layer_tables
from meshplan.hardware_profiles import builtin_gpu
from meshplan.hardware_profiles.curve import Curve
from meshplan.hardware_profiles.loader import builtin_table, gpu_from_table

H100 = "H100-SXM5-80GB"
H200 = "H200-SXM-141GB"
BASE = replace(mp.ModelSpec.preset("llama3-8b"), max_seq_len=131072)
# the same widths (q 4096, kv 1024) and FLOPs, cut into heads of 128 or of 64
HD128 = replace(BASE, num_heads=32, num_kv_heads=8, head_dim=128)
HD64 = replace(BASE, num_heads=64, num_kv_heads=16, head_dim=64)
JOB = mp.Job(global_batch=8, seq_len=32768, runtime="megatron")


def _eff(fwd_causal: float, fwd: float, bwd: float) -> float:
    """Eq. (1)-(4) by hand: forward + backward of a causal call, masked backward assumed to
    lose what the masked forward loses."""
    f, b = fwd_causal / 989, bwd / 989 * fwd_causal / fwd
    return 3.5 / (1 / f + 2.5 / b)


def _cluster(gpu):
    c = mp.Cluster.preset("dgx-h200", nodes=1, gpus_per_node=8)
    return c.replace(gpu=gpu)


def test_head_dim_64_ratio_reads_back_the_papers_bars():
    """16k tokens: head dim 64 forward causal 388, forward 413, backward 516 → 433; head dim
    128 539, 595, 516 (Shah et al. 2024 Fig. 5-6, cuDNN). H100: the H200 adds measured head
    dims 80 and 96 (tests/unit/test_head_dim_measured.py) to the same published ratio."""
    gpu = builtin_gpu(H100)
    assert gpu.attention_head_dim == 128
    [(dim, ratio)] = gpu.attention_head_dim_ratio
    flops = 2 * 16384 * 16384 * 2048           # E at 16k: 32 heads of 64 = 16 of 128
    want = _eff(388, 413, 433) / _eff(539, 595, 516)
    assert dim == 64 and ratio(flops) == pytest.approx(want, abs=2e-4)
    assert 0.82 < want < 0.83
    assert gpu.attention_efficiency_at(flops, 64) == pytest.approx(_eff(388, 413, 433),
                                                                  abs=2e-4)
    # 512 tokens: the head-dim-64 kernel loses less where both are launch-bound
    small = 2 * 16384 * 512 * 2048
    assert ratio(small) == pytest.approx(_eff(225, 335, 266) / _eff(315, 497, 305), abs=2e-4)


def test_head_dims_between_and_outside_the_published_ones():
    gpu = builtin_gpu(H100)        # published ratios only (the H200's adds measured ones)
    e = 3e11
    curve, r64 = gpu.attention_efficiency(e), gpu.attention_head_dim_ratio[0][1](e)
    assert gpu.attention_efficiency_at(e, 128) == curve
    assert gpu.attention_efficiency_at(e, None) == curve
    assert gpu.attention_efficiency_at(e, 256) == curve          # clamped to 128
    assert gpu.attention_efficiency_at(e, 32) == pytest.approx(curve * r64)   # to 64
    w = math.log2(96 / 64)                                       # linear in log2(head dim)
    assert gpu.attention_efficiency_at(e, 96) == pytest.approx(curve * ((1 - w) * r64 + w))


def test_a_refitted_reference_curve_keeps_the_head_dim_ratio():
    """A ratio, not a second curve: a reference curve re-fitted on measured head-dim-128
    points (cp_gpu_posthoc --attention-points) still prices head dim 64 lower by r."""
    gpu = builtin_gpu(H200)
    flat = replace(gpu, attention_efficiency=Curve(((1.0, 0.6), (1e18, 0.6))))
    r = gpu.attention_head_dim_ratio[0][1](1e12)
    assert flat.attention_efficiency_at(1e12, 64) == pytest.approx(0.6 * r)
    assert flat.attention_efficiency_at(1e12, 128) == 0.6


def test_the_layer_prices_head_dim_64_by_the_ratio_and_without_it_alike():
    gpu = builtin_gpu(H200)
    lay = mp.Layout(tp=2)
    a64 = layer_tables(HD64, _cluster(gpu), JOB, lay).parts.layer
    a128 = layer_tables(HD128, _cluster(gpu), JOB, lay).parts.layer
    executed = 4.0 * 32768 ** 2 * 4096 / 2 / 2                  # causal, heads / tp
    r = gpu.attention_head_dim_ratio[0][1](executed)
    assert a64.forward.attention_s == pytest.approx(a128.forward.attention_s / r, rel=1e-9)
    assert a64.backward.attention_s == pytest.approx(a128.backward.attention_s / r, rel=1e-9)
    assert a64.forward.gemm_s == a128.forward.gemm_s
    one = _cluster(replace(gpu, attention_head_dim_ratio=()))     # as a calibrated profile
    b64 = layer_tables(HD64, one, JOB, lay).parts.layer
    assert b64.forward.attention_s == pytest.approx(a128.forward.attention_s, rel=1e-9)


@pytest.mark.parametrize("style", ["ring", "all-to-all"])
def test_both_cp_cores_price_their_kernels_at_the_head_dim(style):
    gpu = builtin_gpu(H200)
    lay = mp.Layout(cp=4, cp_style=style)
    f64 = layer_tables(HD64, _cluster(gpu), JOB, lay).parts.layer.forward.attention_s
    f128 = layer_tables(HD128, _cluster(gpu), JOB, lay).parts.layer.forward.attention_s
    s, cp = JOB.seq_len, 4
    kernel = (context.ring_step_pairs(s, cp) * 4.0 * 4096 if style == "ring"
              else s * s / 2 * 4.0 * 4096 / cp)
    r = gpu.attention_head_dim_ratio[0][1](kernel)
    assert f64 == pytest.approx(f128 / r, rel=1e-9)


def test_the_ratio_travels_in_a_plan_file_and_bad_tables_are_refused():
    gpu = builtin_gpu(H200)
    back = gpu_from_table(gpu.name, gpu.to_dict(), "plan")
    assert back.attention_head_dim_ratio == gpu.attention_head_dim_ratio
    assert back.attention_efficiency_at(5e11, 64) == gpu.attention_efficiency_at(5e11, 64)
    table = dict(builtin_table("gpus.toml")[H200])
    table["attention_published_head_dims"] = ["cudnn-h100-fa3-hd32"]
    with pytest.raises(mp.ProfileError, match=r"\['cudnn-h100-fa3-hd32'\].*known:"):
        gpu_from_table("X", table, "my.toml [X]")
    table["attention_published_head_dims"] = ["cudnn-h100-fa3-hd64", "flash2-h100-fa3"]
    with pytest.raises(mp.ProfileError, match="'flash2-h100-fa3' repeats head dim 128"):
        gpu_from_table("X", table, "my.toml [X]")
    del table["attention_published"]
    with pytest.raises(mp.ProfileError, match="needs attention_published"):
        gpu_from_table("X", table, "my.toml [X]")


def test_the_gpu_check_pairs_head_dims_at_equal_width_and_flops(load_benchmark):
    ah = load_benchmark("attention_head_dim_gpu")
    rows = [{"batch": s.batch, "seq": s.seq, "heads": s.heads, "head_dim": s.head_dim,
             "efficiency": 0.5 if s.head_dim == 128 else 0.4} for s in ah.shapes()]
    # 7 (width, seq) groups of heads of 64 and 128, 3 of heads of 64, 80, 96 and 128, 2 of
    # 80, 96 and 128 (batch 1 at 16k and 32k)
    assert len(rows) == 7 * 2 + 3 * 4 + 2 * 3
    groups = {}
    for r in rows:
        groups.setdefault((r["batch"], r["seq"], r["heads"] * r["head_dim"]), []).append(r)
    assert sorted(len(g) for g in groups.values()) == [2] * 7 + [3] * 2 + [4] * 3
    assert all(len({ah.flops_forward(r) for r in g}) == 1 for g in groups.values())
    lines = ah.compare({"rows": rows, "kernels": {"64": ["k64"], "80": []}}).splitlines()[1:]
    assert lines[-2:] == ["head dim 64: k64", "head dim 80: no attention kernel named"]
    lines = lines[:-2]
    assert len(lines) == 7 + 3 * 3 + 2 * 2
    gpu = builtin_gpu(H200)
    for ln in lines:       # measured 0.8 against the sheet's ratio at that E and head dim
        d, e, ratio = int(ln.split()[3]), float(ln.split()[4]), ln.split()[-1]
        assert ratio.startswith("0.800/")
        sheet = gpu.attention_efficiency_at(e, d) / gpu.attention_efficiency_at(e, 128)
        assert float(ratio.split("/")[1]) == pytest.approx(sheet, abs=1.5e-3)
        if d == 64:
            assert sheet == pytest.approx(gpu.attention_head_dim_ratio[0][1](e), abs=1.5e-3)


def test_a_calibrated_profile_carries_no_ratio():
    """calibrate times attention at the model's head dim: its one curve is the model's."""
    from pathlib import Path

    from meshplan.hardware_profiles.calibrated import load_profile
    path = (Path(__file__).resolve().parents[2] / "docs" / "benchmarks" / "data" / "profiles"
            / "profile_h200x4_round26.toml")
    gpu = load_profile(path).gpu
    assert gpu.attention_head_dim_ratio == ()
    assert gpu.attention_efficiency_at(1e12, 64) == gpu.attention_efficiency(1e12)
