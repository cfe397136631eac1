"""FP8 routed experts (meshplan.costmodel.fp8_experts): TransformerEngine's grouped linears run
their GEMMs in fp8 with casts and a weight cache (runtime "megatron"); the executor's run fp8
grouped GEMMs under recipe rowwise, cast in every pass (the weights once a step where the
executor caches them), without the 16-bit weight copies (runtime "torch"), and stay 16-bit under the other recipes; the router stays 16-bit."""

import pytest

import meshplan as mp
from meshplan.costmodel import fp8
from meshplan.costmodel.compute import gemm_s, linear_shapes
from meshplan.costmodel.fp8_experts import fp8_experts, keeps_fc1_cast
from meshplan.costmodel.inputs import table_inputs
from meshplan.costmodel.moe_layer import routed_mlp
from meshplan.costmodel.tables import layer_tables

MODEL = mp.ModelSpec(name="moe", num_layers=4, hidden_size=1024, num_heads=16,
                     vocab_size=32000, max_seq_len=2048, activation="swiglu", norm="rmsnorm",
                     position_embedding="rope", num_experts=16, experts_per_token=2,
                     moe_ffn_hidden_size=512)
CLUSTER = mp.Cluster.preset("dgx-h100", nodes=1)
LAYOUT = mp.Layout(dp=8, ep=4, micro_batch=2, zero=1)


def job(precision="fp8", runtime="megatron", gather=False, recipe=None):
    return mp.Job(global_batch=64, seq_len=2048, precision=precision, runtime=runtime,
                  fp8_param_gather=gather, **({"fp8_recipe": recipe} if recipe else {}))


def routed(j):
    return routed_mlp(MODEL, CLUSTER, j, LAYOUT, table_inputs(MODEL, CLUSTER, j, LAYOUT).links,
                      1.0)


def test_the_executor_keeps_experts_16_bit_outside_rowwise():
    bf, f8 = routed(job("bf16", "torch")), routed(job("fp8", "torch", recipe="tensorwise"))
    assert f8.forward == bf.forward and f8.backward == bf.backward and f8.fp8 is None
    assert f8.kept_bytes == bf.kept_bytes


def test_the_executors_rowwise_experts_cast_every_micro_batch_and_copy_no_weights():
    bf, f8 = routed(job("bf16", "torch")), routed(job("fp8", "torch", recipe="rowwise"))
    e = f8.fp8
    assert e is not None and 0.5 < e.gemm_ratio < 1.0
    assert e.forward_cast_s > 0 and e.backward_cast_s > e.forward_cast_s
    assert e.weight_cast_step_s == 0.0            # no cache: in the micro-batch's casts
    local_params = 16 / 4 * 1024 * (2 * 512 + 512)
    # the autocast copies the 16-bit grouped GEMM makes, not made (ZeRO-1 here)
    assert e.weight_copy_bytes == -2.0 * local_params == -e.saved_copy_bytes
    assert f8.kept_bytes == bf.kept_bytes         # the 16-bit inputs are saved as in bf16
    assert f8.forward.memory_bound_s == pytest.approx(bf.forward.memory_bound_s
                                                      + e.forward_cast_s)
    # under FSDP2 the experts' weights are its bf16 copies either way
    z2 = routed_mlp(MODEL, CLUSTER, job("fp8", "torch", recipe="rowwise"),
                    mp.Layout(dp=8, ep=4, micro_batch=2, zero=2),
                    table_inputs(MODEL, CLUSTER, job("fp8", "torch", recipe="rowwise"),
                                 LAYOUT).links, 1.0).fp8
    assert z2.weight_copy_bytes == 0.0 and z2.backward_cast_s < e.backward_cast_s
    # the casts move all local experts at once: one pass each, not one per expert
    one = fp8_experts(CLUSTER, job("fp8", "torch", recipe="rowwise"), rows_per_expert=512,
                      local_experts=1, hidden=1024, fc1_width=1024, fc2_width=512)
    four = fp8_experts(CLUSTER, job("fp8", "torch", recipe="rowwise"), rows_per_expert=128,
                       local_experts=4, hidden=1024, fc1_width=1024, fc2_width=512)
    rows = fp8.linear_cast_traffic(512, 1024, 1024, "rowwise")
    assert four.forward_cast_s > one.forward_cast_s   # the same rows, four experts' weights
    assert rows.forward_passes + rows.weight_forward_passes > 0


def test_transformer_engine_experts_run_fp8_gemms_with_casts():
    bf, f8 = routed(job("bf16")), routed(job("fp8"))
    e = f8.fp8
    assert e is not None and 0.5 < e.gemm_ratio < 1.0
    # rows of one expert: ρ = 1 here, k·T·ep / E with T = mb·s
    rows = 2 * 2 * 2048 * 4 / 16
    gpu = CLUSTER.gpu
    want = 0.0
    for k, n in ((1024, 2 * 512), (512, 1024)):
        flops = 2.0 * rows * k * n
        want += fp8.fp8_gemm_time_s(flops, gpu.peak_flops("fp8"), gpu.fp8_gemm_efficiency)
    bf16 = sum(gemm_s(gpu, gpu.peak_flops("bf16"), 2.0 * rows * k * n)
               for k, n in ((1024, 1024), (512, 1024)))
    assert e.gemm_ratio == pytest.approx(want / bf16)
    router = gemm_s(gpu, gpu.peak_flops("bf16"), 2.0 * 2 * 2048 * 1024 * 16)
    assert f8.forward.gemm_s - router == pytest.approx((bf.forward.gemm_s - router)
                                                       * e.gemm_ratio)
    assert f8.forward.memory_bound_s == pytest.approx(bf.forward.memory_bound_s
                                                      + e.forward_cast_s)
    assert f8.backward.memory_bound_s == pytest.approx(bf.backward.memory_bound_s
                                                       + e.backward_cast_s)
    assert e.forward_cast_s > 0 and e.backward_cast_s > e.forward_cast_s
    # the saved fc1 and fc2 inputs in fp8: a byte less per element
    local = 16 / 4
    assert bf.kept_bytes - f8.kept_bytes == pytest.approx(local * rows * (1024 + 512))


def test_weight_cache_and_casts_once_a_step_unless_gathered_in_fp8():
    local_params = 16 / 4 * 1024 * (2 * 512 + 512)
    e = routed(job()).fp8
    assert e.weight_copy_bytes == 2.0 * local_params and e.weight_cast_step_s > 0
    g = routed(job(gather=True)).fp8
    assert g.weight_copy_bytes == 0.0 and g.weight_cast_step_s == 0.0


def test_estimate_counts_the_experts_cache_per_moe_layer():
    lay = mp.Layout(dp=4, pp=2, ep=4, micro_batch=1, zero=1)
    e8, e16 = (mp.estimate(MODEL, CLUSTER, job(p), lay) for p in ("fp8", "bf16"))
    local_params = 16 / 4 * 1024 * (2 * 512 + 512)
    dense = sum(k * n for (_, k, n), _ in linear_shapes(MODEL, job(), 1, 1, 0))
    for r in range(2):      # 2 layers a stage: the dense linears' and the experts' caches
        assert e8.memory[r].weights_bytes - e16.memory[r].weights_bytes == pytest.approx(
            2 * 2.0 * (dense + local_params))
    # the planner's per-layer state counts the experts' cache too
    t8, t16 = (layer_tables(MODEL, CLUSTER, job(p), lay) for p in ("fp8", "bf16"))
    assert t8.layer_state_bytes - t16.layer_state_bytes == pytest.approx(
        2.0 * (dense + local_params))


def test_none_outside_fp8():
    assert fp8_experts(CLUSTER, job("bf16"), rows_per_expert=64, local_experts=4, hidden=64,
                       fc1_width=128, fc2_width=64) is None


def _moeh3():
    """moeh3's never-run MoE model and its 1 x H200 calibration (measured MoE rows, bf16)."""
    import json
    from pathlib import Path
    from meshplan.hardware_profiles.calibrated import apply_profile
    root = Path(__file__).resolve().parents[2]
    model = mp.ModelSpec.from_dict(json.loads((root / "benchmarks/sets/moeh3/m01.json")
                                              .read_text()))
    cluster = apply_profile(mp.Cluster.preset("dgx-h200", nodes=1), root / "docs/benchmarks/data"
                            / "profiles/profile_h200x1_moeh3_20261129.toml")
    return model, cluster


def test_a_measured_moe_row_moves_only_its_dense_part_to_fp8():
    """The executor's measured MoE layer (routed experts inside, bf16) plus the analytical
    dense part's fp8 change — not the whole row scaled by the dense linears' fp8 ratio."""
    from meshplan.costmodel.compute import layer_cost
    from meshplan.costmodel.fp8_cost import fp8_layer
    model, cluster = _moeh3()
    lay = mp.Layout(micro_batch=8, recompute="none")
    b16, f8j = (mp.Job(global_batch=16, seq_len=2048, precision=p, runtime="torch")
                for p in ("bf16", "fp8"))
    p16, p8 = (table_inputs(model, cluster, j, lay).parts for j in (b16, f8j))
    assert "layer" in p16.measured and "layer" in p8.measured
    link = table_inputs(model, cluster, b16, lay).links.tp
    kw = dict(micro_batch=8, tp=1, sequence_parallel=False, recompute="none", tp_link=link,
              mlp_width=0)
    dense = layer_cost(model, cluster, f8j, **kw)
    moved = fp8_layer(model, cluster, f8j, micro_batch=8, tp=1, sequence_parallel=False,
                      recompute="none", compile=False, fsdp=False, mlp_width=0,
                      host_measured=True).apply(dense, "none")
    assert p8.layer.forward.total_s - p16.layer.forward.total_s == pytest.approx(
        moved.forward.total_s - dense.forward.total_s, rel=1e-9)
    assert p8.layer.backward.total_s - p16.layer.backward.total_s == pytest.approx(
        moved.backward.total_s - dense.backward.total_s, rel=1e-9)


def test_a_bf16_moe_row_priced_for_rowwise_fp8_gets_the_experts_fp8_terms(monkeypatch):
    """The executor's measured MoE layer (16-bit experts inside) for a rowwise fp8 job: the
    dense part's fp8 change, plus the routed experts' (their GEMMs and casts), and the
    16-bit expert copies the row keeps per micro-batch taken off its kept bytes."""
    from meshplan.costmodel import moe_rows
    from meshplan.costmodel.moe import moe_params_per_rank
    model, cluster = _moeh3()
    lay = mp.Layout(micro_batch=8, recompute="none")
    rw = mp.Job(global_batch=16, seq_len=2048, precision="fp8", runtime="torch",
                fp8_recipe="rowwise")
    t_in = table_inputs(model, cluster, rw, lay)
    p_rw = t_in.parts
    assert "layer" in p_rw.measured and not p_rw.fp8.row
    with monkeypatch.context() as m:     # the same layer with the experts left 16-bit
        m.setattr(moe_rows, "torch_experts_fp8", lambda *_: False)
        dense_only = table_inputs(model, cluster, rw, lay).parts
    copies = 2.0 * moe_params_per_rank(model, lay).experts
    assert dense_only.activation_bytes - p_rw.activation_bytes == pytest.approx(copies)
    f8 = routed_mlp(model, cluster, rw, lay, t_in.links, 1.0)
    b16 = routed_mlp(model, cluster, rw.with_precision("bf16"), lay, t_in.links, 1.0)
    for got, was, want in ((p_rw.layer.forward, dense_only.layer.forward,
                            f8.forward.total_s - b16.forward.total_s),
                           (p_rw.layer.backward, dense_only.layer.backward,
                            f8.backward.total_s - b16.backward.total_s)):
        assert got.total_s - was.total_s == pytest.approx(want, rel=1e-9)
    assert f8.forward.total_s != pytest.approx(b16.forward.total_s)
    # what FSDP2 rows replacing the layer later are given: the experts' change too
    assert p_rw.fp8_delta_s[0] - dense_only.fp8_delta_s[0] == pytest.approx(
        f8.forward.total_s - b16.forward.total_s, rel=1e-9)


def test_compiled_expert_weight_casts_at_the_measured_weight_cast_rate():
    """A profile with fp8_cast_weight_gbps (calibrate's compiled cast of a large stacked
    weight) prices compiled rowwise experts' weight casts at bytes / that rate; eager ones
    and a profile without it as before."""
    import dataclasses
    j = job("fp8", "torch", recipe="rowwise")
    gpu = dataclasses.replace(CLUSTER.gpu, fp8_cast_weight_gbps=3000.0)
    kw = dict(rows_per_expert=512, local_experts=4, hidden=1024, fc1_width=1024,
              fc2_width=512)
    fast = fp8_experts(CLUSTER.with_gpu(gpu), j, compile=True, **kw)
    f_bytes = b_bytes = 0.0
    for k, n in ((1024, 1024), (512, 1024)):
        c = fp8.linear_cast_traffic(4 * 512, k, n, "rowwise", act_bytes=2, weight_bytes=4)
        f_bytes += 4 * c.weight_forward_bytes
        b_bytes += 4 * (c.weight_bytes - c.weight_forward_bytes)
    assert fast.weight_forward_cast_s == pytest.approx(f_bytes / 3e12)
    assert fast.weight_backward_cast_s == pytest.approx(b_bytes / 3e12)
    before = fp8_experts(CLUSTER, j, compile=True, **kw)
    assert before.weight_forward_cast_s != pytest.approx(fast.weight_forward_cast_s)
    # the rows' and gradients' casts are the same either way
    assert (fast.forward_cast_s - fast.weight_forward_cast_s) == pytest.approx(
        before.forward_cast_s - before.weight_forward_cast_s)
    eager = [fp8_experts(c, j, compile=False, **kw)
             for c in (CLUSTER, CLUSTER.with_gpu(gpu))]
    assert eager[0] == eager[1]


def test_compiled_full_recompute_reruns_no_fp8_expert_gemm():
    """A compiled block at ep = 1 keeps its fp8 expert GEMMs' outputs under full
    recomputation: the re-run routed forward holds the router, the permutation and the
    weights' casts, not the expert GEMMs or their rows' casts; eager, with ep > 1, and in
    bf16 it re-runs all of the routed forward."""
    from meshplan.costmodel.moe_layer import routed_added
    j = job("fp8", "torch", recipe="rowwise")
    lay = mp.Layout(micro_batch=2, recompute="full", compile=True)
    links = table_inputs(MODEL, CLUSTER, j, lay).links
    r = routed_mlp(MODEL, CLUSTER, j, lay, links, 1.0)
    e = r.fp8
    rerun = routed_added(r, "full").rerun
    kept_gemm = r.forward.gemm_s - rerun.gemm_s
    assert 0 < kept_gemm < r.forward.gemm_s                 # the router's GEMM is re-run
    assert rerun.memory_bound_s == pytest.approx(
        r.forward.memory_bound_s - (e.forward_cast_s - e.weight_forward_cast_s))
    assert e.weight_forward_cast_s > 0
    for other, jj in ((mp.Layout(micro_batch=2, recompute="full"), j),
                      (mp.Layout(micro_batch=2, recompute="full", compile=True),
                       job("bf16", "torch"))):
        o = routed_mlp(MODEL, CLUSTER, jj, other, links, 1.0)
        assert routed_added(o, "full").rerun == o.forward
    ep2 = mp.Layout(dp=8, ep=4, micro_batch=2, recompute="full", compile=True, zero=1)
    o = routed_mlp(MODEL, CLUSTER, j, ep2, table_inputs(MODEL, CLUSTER, j, ep2).links, 1.0)
    assert routed_added(o, "full").rerun == o.forward
    # what is re-run of the GEMMs is the router's alone, the same as bf16's: the rest, the
    # experts' bf16 GEMMs at the fp8 ratio, is kept
    b16 = routed_mlp(MODEL, CLUSTER, job("bf16", "torch"), lay, links, 1.0)
    router_s = rerun.gemm_s
    assert kept_gemm == pytest.approx((b16.forward.gemm_s - router_s) * e.gemm_ratio)


def test_compiled_full_recompute_keeps_the_fp8_expert_gemm_outputs():
    """What it does not re-run it keeps: fc1's output (R × m·f_e) and fc2's (R × h), 16-bit,
    where every other full recomputation keeps no routed activation (moeh33's compiled fp8
    block at 64 k tokens kept [131,200 × 10,240] and [131,200 × 2,048] bf16 beside its
    input; benchmarks/moe_recompute_memory_gpu.py --fp8 rowwise)."""
    from meshplan.costmodel.moe_layer import routed_added
    j = job("fp8", "torch", recipe="rowwise")
    lay = mp.Layout(micro_batch=2, recompute="full", compile=True)
    links = table_inputs(MODEL, CLUSTER, j, lay).links
    r = routed_mlp(MODEL, CLUSTER, j, lay, links, 1.0)
    rows = 2 * 2048 * MODEL.experts_per_token       # ep 1, balanced: k copies of b·s tokens
    want = rows * (MODEL.ffn_matrices * MODEL.moe_ffn_hidden_size + MODEL.hidden_size) * 2
    assert r.rows == pytest.approx(rows)
    assert routed_added(r, "full").kept_bytes == pytest.approx(want)
    # the recomputed layer rebuilds the rest as working memory, not the kept outputs again
    assert routed_added(r, "full").work_bytes == pytest.approx(
        r.work_bytes + r.kept_bytes - want)
    for other, jj in ((mp.Layout(micro_batch=2, recompute="full"), j),
                      (lay, job("bf16", "torch"))):
        o = routed_mlp(MODEL, CLUSTER, jj, other, links, 1.0)
        assert routed_added(o, "full").kept_bytes == 0
    # without recomputation the layer keeps its routed activations, as before
    none = mp.Layout(micro_batch=2, compile=True)
    o = routed_mlp(MODEL, CLUSTER, j, none, links, 1.0)
    assert routed_added(o, "none").kept_bytes == o.kept_bytes


def test_a_compiled_block_keeps_fc1s_input_as_its_one_byte_cast():
    """Compiled as one graph with its activations kept (ep = etp = 1, no full recompute),
    the executor's fp8 experts keep fc1's input as its 1-byte weight-gradient cast and not
    fc2's input at all: R·h + 2·R·f_e bytes a layer less than bf16 (moe_checks.md
    "Compiled fp8 MoE blocks keep less"); eager, with ep > 1 and under full recompute fc1's
    input stays 16-bit."""
    j, b = job("fp8", "torch", recipe="rowwise"), job("bf16", "torch")
    lay = mp.Layout(micro_batch=2, compile=True)
    assert keeps_fc1_cast(lay)
    links = table_inputs(MODEL, CLUSTER, j, lay).links
    f8, bf = (routed_mlp(MODEL, CLUSTER, x, lay, links, 1.0) for x in (j, b))
    rows, h, f = f8.rows, 1024, 512
    assert rows == 2 * 2 * 2048                  # k · micro-batch · seq at ρ = 1
    assert f8.fp8.fc1_input_delta_bytes == -rows * h
    assert bf.kept_bytes - f8.kept_bytes == pytest.approx(rows * h + 2.0 * rows * f)
    for other in (mp.Layout(micro_batch=2), mp.Layout(micro_batch=2, compile=True,
                                                        recompute="full"),
                  mp.Layout(dp=8, ep=4, micro_batch=2, compile=True, zero=1)):
        assert not keeps_fc1_cast(other)
        o = routed_mlp(MODEL, CLUSTER, j, other,
                       table_inputs(MODEL, CLUSTER, j, other).links, 1.0)
        assert o.fp8.fc1_input_delta_bytes == 0.0
