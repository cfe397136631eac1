"""fp8 in the cost model (meshplan.costmodel.fp8_cost): each term against its formula."""

from dataclasses import replace

import pytest

from meshplan.costmodel import estimate, fp8
from meshplan.costmodel.compute import gemm_s, linear_shapes
from meshplan.costmodel.fp8_cost import (cast_rate, fp8_layer, te_activation_delta_bytes,
                                         torch_memory)
from meshplan.costmodel.measured import (MeasuredEnd, MeasuredLayer, MeasuredTables,
                                         ends_shape_key, layer_shape_key)
from meshplan.costmodel.parts import layer_parts
from meshplan.costmodel.tables import layer_tables
from meshplan.costmodel.data_parallel import group_links
from meshplan.hardware_profiles import Cluster
from meshplan.spec import Job, Layout, ModelSpec

MODEL = ModelSpec(name="m", num_layers=8, hidden_size=1024, num_heads=16, vocab_size=32000,
                  max_seq_len=1024)
# the H100 datasheet without the compiled casts' block share it carries since 2026-12-05 (the
# H200's): the tests below price the casts alone, then with a share they set themselves
_H100 = Cluster.preset("dgx-h100", nodes=1, gpus_per_node=4)
CLUSTER = _H100.replace(gpu=replace(_H100.gpu, fp8_cast_compiled_block_share=0.0,
                                    fp8_cast_compiled_block_share_by_family=()))
GPU = CLUSTER.gpu


def job(precision="fp8", runtime="torch", recipe="tensorwise", batch=16):
    return Job(global_batch=batch, seq_len=1024, precision=precision, runtime=runtime,
               **({"fp8_recipe": recipe} if precision == "fp8" else {}))


def parts(j, layout=Layout(dp=4, micro_batch=1), cluster=CLUSTER):
    links = group_links(cluster, layout)
    return layer_parts(MODEL, cluster, j, layout.micro_batch, layout.tp,
                       layout.sequence_parallel, layout.recompute, links.tp, links.pp,
                       layout.compile, j.precision == "fp8" and layout.zero >= 2
                       and layout.dp > 1)


def test_linears_run_at_the_fp8_peak_and_curve_the_rest_stays_bf16():
    b, f = parts(job("bf16")), parts(job())
    want = sum(fp8.fp8_gemm_time_s(2 * m * k * n, GPU.peak_flops("fp8"),
                                   GPU.fp8_gemm_efficiency)
               for (m, k, n), _ in linear_shapes(MODEL, job(), 1, 1))
    bf16 = sum(gemm_s(GPU, GPU.peak_flops("bf16"), 2 * m * k * n)
               for (m, k, n), _ in linear_shapes(MODEL, job(), 1, 1))
    assert b.layer.forward.gemm_s == pytest.approx(bf16)
    assert f.layer.forward.gemm_s == pytest.approx(want)
    assert f.layer.backward.gemm_s == pytest.approx(2 * want)       # dgrad + wgrad
    assert f.fp8.gemm_ratio == pytest.approx(want / bf16) and want < bf16
    assert f.layer.forward.attention_s == b.layer.forward.attention_s
    assert f.logits[0].gemm_s == b.logits[0].gemm_s                 # the head stays bf16
    assert f.activation_bytes == b.activation_bytes                 # 16-bit inputs saved


def _traffic(j, wbytes, fused=False, tp=1):
    return [fp8.linear_cast_traffic(int(m), int(k), int(n), j.fp8_recipe, act_bytes=2,
                                    weight_bytes=wbytes, fused_cast_transpose=fused)
            for (m, k, n), _ in linear_shapes(MODEL, j, 1, tp)]


@pytest.mark.parametrize("compile", [False, True])
def test_executor_casts_per_micro_batch_eager_or_compiled(compile):
    j = job()
    f = parts(j, Layout(dp=4, micro_batch=1, compile=compile))
    rate = cast_rate(GPU, j, compile)
    tr = _traffic(j, 4)      # ZeRO-0/1: the casts read the fp32 parameters
    fwd = sum((c.forward_passes + c.weight_forward_passes) * rate.pass_s
              + (c.forward_bytes + c.weight_forward_bytes) / (rate.gbps * 1e9) for c in tr)
    assert f.fp8.forward_cast_s == pytest.approx(fwd)
    if compile:   # the H100 data carries the H200's compiled casts scaled by HBM bandwidth
        assert rate.pass_s == 0 and not rate.assumed
        assert rate.gbps == GPU.fp8_cast_compiled_gbps == 1045.0   # gpus.toml: H200's, scaled
        unmeasured = replace(GPU, fp8_cast_compiled_gbps=0.0)    # a profile without the key
        fallback = cast_rate(unmeasured, j, compile)
        assert fallback.pass_s == 0 and fallback.assumed
        assert fallback.gbps == pytest.approx(GPU.hbm_gbps * GPU.hbm_efficiency)
    else:
        assert (rate.pass_s, rate.gbps) == (GPU.fp8_cast_eager_pass_s, GPU.fp8_cast_eager_gbps)
    b = parts(job("bf16"), Layout(dp=4, micro_batch=1, compile=compile))
    assert f.layer.forward.memory_bound_s == pytest.approx(
        b.layer.forward.memory_bound_s + fwd)
    assert f.fp8.weight_cast_step_s == 0


def test_fsdp_casts_read_bf16_weights():
    eager = parts(job(), Layout(dp=4, micro_batch=1, zero=3))
    ddp = parts(job(), Layout(dp=4, micro_batch=1, zero=1))
    gap = sum(c.weight_forward_bytes for c in _traffic(job(), 4)) \
        - sum(c.weight_forward_bytes for c in _traffic(job(), 2))
    assert ddp.fp8.forward_cast_s - eager.fp8.forward_cast_s == pytest.approx(
        gap / (GPU.fp8_cast_eager_gbps * 1e9))


def test_transformer_engine_fuses_casts_and_casts_weights_once_a_step():
    j = job(runtime="megatron")
    f = parts(j)
    hbm = GPU.hbm_gbps * GPU.hbm_efficiency * 1e9
    tr = _traffic(j, 2, fused=True)
    assert f.fp8.forward_cast_s == pytest.approx(sum(c.forward_bytes for c in tr) / hbm)
    assert f.fp8.weight_cast_step_s == pytest.approx(sum(c.weight_bytes for c in tr) / hbm)
    one, four = (layer_tables(MODEL, CLUSTER, job(runtime="megatron", batch=b),
                              Layout(dp=4, micro_batch=1)) for b in (4, 16))
    # the per-step weight casts spread over the step's micro-batches (1 vs 4)
    assert one.layer_forward_s - four.layer_forward_s == pytest.approx(
        f.fp8.weight_cast_step_s * (1 - 1 / 4))


def test_fp8_adds_no_tp_communication():
    """Per-shard scales under tp (the executor's): no amax all-reduce to price."""
    for lay in (Layout(dp=2, tp=2, micro_batch=1),
                Layout(tp=2, sequence_parallel=True, micro_batch=1)):
        t, b = parts(job(), lay), parts(job("bf16"), lay)
        assert b.layer.forward.tp_comm_s > 0
        assert t.layer.forward.tp_comm_s == pytest.approx(b.layer.forward.tp_comm_s)
        assert t.layer.backward.tp_comm_s == pytest.approx(b.layer.backward.tp_comm_s)


def test_full_recompute_pays_the_forwards_fp8_changes_again():
    lay = dict(dp=4, micro_batch=1)
    for rc in ("none", "full"):
        f, b = parts(job(), Layout(recompute=rc, **lay)), parts(job("bf16"), Layout(recompute=rc,
                                                                                    **lay))
        d_f = f.layer.forward.total_s - b.layer.forward.total_s
        d_b = f.layer.backward.total_s - b.layer.backward.total_s
        none = parts(job(), Layout(**lay)).layer.backward.total_s - \
            parts(job("bf16"), Layout(**lay)).layer.backward.total_s
        assert d_b == pytest.approx(none + (d_f if rc == "full" else 0.0))
        assert f.fp8_delta_s[:2] == pytest.approx((d_f, d_b))


def test_memory_te_caches_weights_and_saves_fp8_inputs_the_executor_holds_working_copies():
    lay = Layout(dp=4, micro_batch=1)
    te, te16 = (layer_tables(MODEL, CLUSTER, job(p, "megatron"), lay) for p in ("fp8", "bf16"))
    params = sum(k * n for (_, k, n), _ in linear_shapes(MODEL, job(), 1, 1))
    assert te.layer_state_bytes - te16.layer_state_bytes == pytest.approx(2 * params)
    s, h, f, q = 1024, MODEL.hidden_size, MODEL.ffn_hidden_size, MODEL.q_dim
    assert te_activation_delta_bytes(MODEL, job(), 1, 1, False) == -(2 * s * h + s * f) + s * q
    assert te.layer_activation_bytes - te16.layer_activation_bytes == pytest.approx(
        -(2 * s * h + s * f) + s * q)
    ex, ex16 = (layer_tables(MODEL, CLUSTER, job(p, "torch"), lay) for p in ("fp8", "bf16"))
    work = max(2 * m * n + n * k + m * k for (m, k, n), _ in linear_shapes(MODEL, job(), 1, 1))
    assert ex.buffer_bytes - ex16.buffer_bytes == pytest.approx(work)
    # eager ZeRO-1: the fp8 linears take the fp32 parameter, so autocast caches no 16-bit
    # copy of their weights; the saved 16-bit inputs are bf16's
    assert ex.layer_state_bytes - ex16.layer_state_bytes == pytest.approx(-2 * params)
    assert ex.layer_activation_bytes == pytest.approx(ex16.layer_activation_bytes)
    # FSDP2 (ZeRO-3) hands both arms its bf16 weight: no difference in states
    z3 = Layout(dp=4, micro_batch=1, zero=3)
    f3, b3 = (layer_tables(MODEL, CLUSTER, job(p, "torch"), z3) for p in ("fp8", "bf16"))
    assert f3.layer_state_bytes == pytest.approx(b3.layer_state_bytes)


def _crow(compile, fwd, bwd, **kw):
    return MeasuredLayer(**{**dict(
        shape=layer_shape_key(MODEL), seq_len=1024, tp=1, sequence_parallel=False,
        recompute="none", micro_batch=1, forward_s=fwd, backward_s=bwd,
        activation_bytes=3e8, backward_peak_bytes=1e7, forward_cpu_s=4e-3,
        backward_cpu_s=5e-3, compile=compile), **kw})


def _compiled_cluster(*rows, gbps=700.0, ends=()):
    return replace(CLUSTER, gpu=replace(GPU, fp8_cast_compiled_gbps=gbps,
                                        measured=MeasuredTables(tuple(rows), tuple(ends))))


def _end(part):
    return MeasuredEnd(shape=ends_shape_key(MODEL), part=part, seq_len=1024, tp=1,
                       sequence_parallel=False, micro_batch=1, forward_s=1e-4, backward_s=2e-4,
                       activation_bytes=1e6, peak_bytes=1e6, forward_cpu_s=3e-4,
                       backward_cpu_s=3e-4)


def test_compiled_fp8_keeps_neither_the_rows_weight_copies_nor_recomputable_inputs():
    """A compiled bf16 row (autocast) keeps 16-bit weight copies per micro-batch; the fp8
    block keeps the fp32 parameter and recomputes the norm outputs and the MLP-down input
    it only re-casts in backward (measured on CPU: benchmarks/fp8_saved_bytes.py)."""
    s, h, f = 1024, MODEL.hidden_size, MODEL.ffn_hidden_size
    params = sum(k * n for (_, k, n), _ in linear_shapes(MODEL, job(), 1, 1))
    rows = [_crow(False, 2e-3, 4e-3), _crow(True, 1.5e-3, 3e-3)]
    for tp, sp in ((1, False), (2, False), (2, True)):
        rows += [_crow(c, 1e-3, 2e-3, tp=tp, sequence_parallel=sp) for c in (False, True)
                 if tp > 1]
    cl = _compiled_cluster(*rows)
    for tp, sp in ((1, False), (2, False), (2, True)):
        lay = Layout(dp=4 // tp, tp=tp, sequence_parallel=sp, micro_batch=1, compile=True)
        t8, t16 = (layer_tables(MODEL, cl, job(p), lay) for p in ("fp8", "bf16"))
        norms = 0 if sp else 2 * s * h
        want = -2 * params / tp - 2 * (norms + s * f / tp)
        assert t8.layer_activation_bytes - t16.layer_activation_bytes == pytest.approx(want)
        # compiled rows hold the copies: nothing of them in the states of either arm
        assert t8.layer_state_bytes == pytest.approx(t16.layer_state_bytes)
    # full recomputation: the bf16 block keeps its input only, the fp8 one also the 16-bit
    # outputs of its GEMMs that feed other operators (QKV, attention projection, MLP up);
    # the composition's term, exact on the rows of seven fp8 profiles (fp8_cost docstring)
    full = [_crow(c, 1e-3, 3e-3, recompute="full", activation_bytes=2e6) for c in (0, 1)]
    up = (2 if MODEL.activation == "swiglu" else 1) * f
    for tp in (1, 2):
        lay = Layout(dp=4 // tp, tp=tp, micro_batch=1, recompute="full", compile=True)
        t8, t16 = (layer_tables(MODEL, _compiled_cluster(*full), job(p), lay)
                   for p in ("fp8", "bf16"))
        outputs = 2 * s * ((MODEL.q_dim + 2 * MODEL.kv_dim + up) / tp + h)
        assert t8.layer_activation_bytes - t16.layer_activation_bytes == pytest.approx(outputs)
    # not priced under sequence parallelism (its compiled rows keep more than this explains)
    lay = Layout(dp=2, tp=2, sequence_parallel=True, micro_batch=1, recompute="full",
                 compile=True)
    t8, t16 = (layer_tables(MODEL, _compiled_cluster(*full), job(p), lay)
               for p in ("fp8", "bf16"))
    assert t8.layer_activation_bytes == pytest.approx(t16.layer_activation_bytes)


def test_compiled_fsdp2_fp8_recomputes_inputs_with_no_weight_copies_to_drop():
    s, h, f = 1024, MODEL.hidden_size, MODEL.ffn_hidden_size
    cl = _compiled_cluster(_crow(False, 2e-3, 4e-3), _crow(True, 1.5e-3, 3e-3),
                           _crow(False, 2.5e-3, 4.5e-3, zero=3, dp=4, activation_bytes=2.5e8))
    lay = Layout(dp=4, micro_batch=1, zero=3, compile=True)
    t8, t16 = (layer_tables(MODEL, cl, job(p), lay) for p in ("fp8", "bf16"))
    assert t8.layer_activation_bytes - t16.layer_activation_bytes == pytest.approx(
        -2 * (2 * s * h + s * f))
    assert t8.layer_state_bytes == pytest.approx(t16.layer_state_bytes)


def test_compiled_row_prices_fp8_from_its_gemm_share_compiled_casts_and_cpu():
    """With a compiled bf16 row: its GEMM share × Σfp8/Σbf16 (the profile's fp8 curve), the
    rest of the row kept, casts at fp8_cast_compiled_gbps, the CPU from the compiled row."""
    cl = _compiled_cluster(_crow(False, 2e-3, 4e-3), _crow(True, 1.5e-3, 3e-3,
                                                          forward_cpu_s=1e-3,
                                                          backward_cpu_s=2e-3),
                           ends=(_end("embedding"), _end("output")))
    lay = Layout(dp=4, micro_batch=1, compile=True)
    b, f = parts(job("bf16"), lay, cl), parts(job(), lay, cl)
    assert b.compiled and f.compiled
    assert b.layer.forward.total_s == pytest.approx(1.5e-3)
    assert b.layer.backward.total_s == pytest.approx(3e-3)
    shapes = linear_shapes(MODEL, job(), 1, 1)
    r = (sum(fp8.fp8_gemm_time_s(2 * m * k * n, GPU.peak_flops("fp8"), GPU.fp8_gemm_efficiency)
             for (m, k, n), _ in shapes)
         / sum(gemm_s(GPU, GPU.peak_flops("bf16"), 2 * m * k * n) for (m, k, n), _ in shapes))
    assert f.fp8.gemm_ratio == pytest.approx(r)
    casts = [fp8.linear_cast_traffic(int(m), int(k), int(n), "tensorwise", weight_bytes=4)
             for (m, k, n), _ in shapes]
    fwd_cast = sum(c.forward_bytes + c.weight_forward_bytes for c in casts) / 700e9
    bwd_cast = sum(c.backward_bytes + c.weight_bytes - c.weight_forward_bytes
                   for c in casts) / 700e9
    assert f.fp8.rate.gbps == 700.0 and f.fp8.rate.pass_s == 0.0
    for name, cast in (("forward", fwd_cast), ("backward", bwd_cast)):
        pb, pf = getattr(b.layer, name), getattr(f.layer, name)
        assert pf.gemm_s == pytest.approx(pb.gemm_s * r)
        assert pf.total_s == pytest.approx(pb.total_s - pb.gemm_s * (1 - r) + cast)
    assert f.cpu == b.cpu and f.cpu[:2] == pytest.approx((1e-3, 2e-3))


def _one_row_cluster(fwd, bwd, act, recompute="none"):
    """CLUSTER with one measured layer row (tp 1, micro-batch 1, seq 1024)."""
    row = MeasuredLayer(shape=layer_shape_key(MODEL), seq_len=1024, tp=1,
                        sequence_parallel=False, recompute=recompute, micro_batch=1,
                        forward_s=fwd, backward_s=bwd, activation_bytes=act,
                        backward_peak_bytes=1e7)
    return replace(CLUSTER, gpu=replace(GPU, measured=MeasuredTables((row,), ())))


def test_full_recompute_moves_the_pass_the_rows_backward_holds_not_its_forward():
    # a compiled row with sequence parallelism can put backward GPU time in its forward
    # (fp8h7: 7.2 / 2.8 ms at recompute full); the recomputed forward fp8 moves is the one
    # the row's backward holds, so the fp8 layer does not pay the inflated forward twice
    cl = _one_row_cluster(6e-3, 2e-3, 1e6, recompute="full")
    lay = Layout(dp=4, micro_batch=1, recompute="full")
    b, f = parts(job("bf16"), lay, cl), parts(job(), lay, cl)
    k = f.fp8.gemm_ratio
    assert f.layer.recompute.gemm_s == pytest.approx(b.layer.recompute.gemm_s * k)
    assert f.layer.recompute.memory_bound_s == pytest.approx(
        b.layer.recompute.memory_bound_s + f.fp8.forward_cast_s)
    assert f.layer.recompute.total_s < 0.5 * f.layer.forward.total_s
    assert f.layer.backward.total_s < b.layer.backward.total_s + f.fp8.forward_cast_s \
        + f.fp8.backward_cast_s


def test_measured_bf16_row_keeps_its_non_gemm_time_and_scales_its_gemm_share():
    cl = _one_row_cluster(2e-3, 4e-3, 1e8)
    b, f = parts(job("bf16"), cluster=cl), parts(job(), cluster=cl)
    assert b.layer.forward.total_s == pytest.approx(2e-3)
    k = f.fp8.gemm_ratio
    assert f.layer.forward.gemm_s == pytest.approx(b.layer.forward.gemm_s * k)
    assert f.layer.forward.attention_s == pytest.approx(b.layer.forward.attention_s)
    assert f.layer.forward.memory_bound_s == pytest.approx(
        b.layer.forward.memory_bound_s + f.fp8.forward_cast_s)


def test_estimate_reports_mfu_against_the_bf16_peak_and_states_assumed_casts():
    lay = Layout(dp=4, micro_batch=1, compile=True)
    e8 = estimate(MODEL, CLUSTER, job(), lay)
    assert e8.mfu == pytest.approx(e8.model_flops_per_step / e8.step_time_s / 4
                                   / GPU.peak_flops("bf16"))
    assert not any("fp8 casts priced as compiled casts at HBM" in c for c in e8.caveats)
    unmeasured = CLUSTER.replace(gpu=replace(GPU, fp8_cast_compiled_gbps=0.0))
    assumed = estimate(MODEL, unmeasured, job(), lay)
    assert any("fp8 casts priced as compiled casts at HBM" in c for c in assumed.caveats)
    eager = estimate(MODEL, CLUSTER, job(), Layout(dp=4, micro_batch=1))
    assert any("eager casts cost" in c for c in eager.caveats)
    assert eager.step_time_s > e8.step_time_s


def test_fp8_layer_needs_a_curve():
    gpu = replace(GPU, fp8_gemm_efficiency=None)
    with pytest.raises(Exception, match="no fp8_gemm_efficiency curve"):
        fp8_layer(MODEL, replace(CLUSTER, gpu=gpu), job(), micro_batch=1, tp=1,
                  sequence_parallel=False, recompute="none", compile=False, fsdp=False)


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_eager_casts_split_gpu_and_host_where_the_cpu_dispatch_is_measured(recompute):
    """With the split keys and a row whose CPU dispatch is measured, the eager casts put
    passes × gpu_pass_s + bytes / gpu_gbps on the GPU's timeline and passes × host_pass_s
    on the CPU's (full recomputation dispatches the forward's again); the step's host
    dispatch grows by exactly that. Without a measured CPU (or without the split keys) the
    synchronized pair prices them on the GPU, as before."""
    split = dict(fp8_cast_eager_gpu_pass_s=9e-6, fp8_cast_eager_gpu_gbps=600.0,
                 fp8_cast_eager_host_pass_s=130e-6)
    rows = (_crow(False, 2e-3, 4e-3, recompute=recompute),)
    ends = (_end("embedding"), _end("output"))
    measured = MeasuredTables(rows, ends)
    with_split = replace(CLUSTER, gpu=replace(GPU, measured=measured, **split))
    lay = Layout(dp=4, micro_batch=1, recompute=recompute)
    f = parts(job(), lay, with_split)
    tr = _traffic(job(), 4)
    fwd_passes = sum(c.forward_passes + c.weight_forward_passes for c in tr)
    all_passes = sum(c.kernels for c in tr)
    fwd_gpu = sum(c.forward_passes + c.weight_forward_passes for c in tr) * 9e-6 + sum(
        c.forward_bytes + c.weight_forward_bytes for c in tr) / 600e9
    assert f.fp8.rate.host_pass_s == 130e-6 and f.fp8.rate.pass_s == 9e-6
    assert f.fp8.forward_cast_s == pytest.approx(fwd_gpu)
    again = fwd_passes if recompute == "full" else 0
    assert f.fp8_cpu_s == pytest.approx((fwd_passes * 130e-6,
                                         (all_passes - fwd_passes + again) * 130e-6))
    b16 = estimate(MODEL, with_split, job("bf16"), lay)
    f8 = estimate(MODEL, with_split, job(), lay)
    n_mb = 16 // 4
    assert f8.host_dispatch_s - b16.host_dispatch_s == pytest.approx(
        n_mb * MODEL.num_layers * sum(f.fp8_cpu_s))
    # no measured CPU: the synchronized pair, on the GPU's timeline
    datasheet = replace(CLUSTER, gpu=replace(GPU, **split))
    d = parts(job(), lay, datasheet)
    assert d.fp8_cpu_s == (0.0, 0.0) and d.fp8.rate.host_pass_s == 0.0
    assert (d.fp8.rate.pass_s, d.fp8.rate.gbps) == (GPU.fp8_cast_eager_pass_s,
                                                    GPU.fp8_cast_eager_gbps)
    # no split keys (H100's data): as before, whatever the CPU
    old = parts(job(), lay, replace(CLUSTER, gpu=replace(GPU, measured=measured)))
    assert old.fp8_cpu_s == (0.0, 0.0) and old.fp8.rate.pass_s == GPU.fp8_cast_eager_pass_s
    # compiled casts have no host part
    comp = parts(job(), replace(lay, compile=True), with_split)
    assert comp.fp8_cpu_s == (0.0, 0.0)


def test_caveats_name_the_eager_host_part_and_composed_compiled_fp8():
    """An eager split says the host's share; compiled fp8 composed from bf16 rows (no fp8
    row) says how far such arms ran from the price and how to measure the row."""
    from meshplan.costmodel.fp8_caveats import COMPOSED_COMPILED_CAVEAT
    split = dict(fp8_cast_eager_gpu_pass_s=9e-6, fp8_cast_eager_gpu_gbps=600.0,
                 fp8_cast_eager_host_pass_s=130e-6)
    rows = (_crow(False, 2e-3, 4e-3), _crow(True, 1.5e-3, 3e-3))
    cl = replace(CLUSTER, gpu=replace(GPU, measured=MeasuredTables(
        rows, (_end("embedding"), _end("output"))), **split))
    eager = estimate(MODEL, cl, job(), Layout(dp=4, micro_batch=1))
    assert any("130 µs a pass of the host's dispatch" in c for c in eager.caveats)
    assert COMPOSED_COMPILED_CAVEAT not in eager.caveats
    compiled = estimate(MODEL, cl, job(), Layout(dp=4, micro_batch=1, compile=True))
    assert COMPOSED_COMPILED_CAVEAT in compiled.caveats        # no block share
    from meshplan.costmodel.fp8_caveats import COMPOSED_COMPILED_SHARE_CAVEAT
    shared = replace(cl, gpu=replace(cl.gpu, fp8_cast_compiled_block_share=0.33))
    assert COMPOSED_COMPILED_SHARE_CAVEAT in estimate(
        MODEL, shared, job(), Layout(dp=4, micro_batch=1, compile=True)).caveats
    assert COMPOSED_COMPILED_CAVEAT not in estimate(
        MODEL, cl, job(runtime="megatron"), Layout(dp=4, micro_batch=1)).caveats


def test_a_block_share_measured_on_another_family_is_named_in_a_caveat():
    """A profile's block share read for a layer of another family, which the datasheet's
    table does not hold (fp8h55h100: a Llama-measured 0.36 priced a GPT's fp8 7-10 % fast),
    says so and which family it was measured on; the layer's own family, or one the table
    holds, does not."""
    from meshplan.costmodel.fp8_caveats import other_family_share_caveat
    from meshplan.hardware_profiles.measured_rows import cast_family
    rows = (_crow(False, 2e-3, 4e-3), _crow(True, 1.5e-3, 3e-3))
    cl = _compiled_cluster(*rows, ends=(_end("embedding"), _end("output")))
    lay = Layout(dp=4, micro_batch=1, compile=True)
    llama = "swiglu-rmsnorm-nobias"
    assert cast_family(MODEL) != llama               # MODEL is a GPT layer
    other = replace(cl, gpu=replace(cl.gpu, fp8_cast_compiled_block_share=0.36,
                                    fp8_cast_compiled_block_share_family=llama))
    est = estimate(MODEL, other, job(), lay)
    assert other_family_share_caveat(llama) in est.caveats
    assert "measured on swiglu-rmsnorm-nobias layers" in other_family_share_caveat(llama)
    own = replace(other, gpu=replace(other.gpu,
                                     fp8_cast_compiled_block_share_family=cast_family(MODEL)))
    tabled = replace(other, gpu=replace(other.gpu, fp8_cast_compiled_block_share_by_family=(
        (cast_family(MODEL), 0.4),)))
    unnamed = replace(other, gpu=replace(other.gpu, fp8_cast_compiled_block_share_family=""))
    for cluster in (own, tabled, unnamed):
        assert not any("another family" in c for c in estimate(MODEL, cluster, job(),
                                                                 lay).caveats)
    assert not any("another family" in c for c in estimate(MODEL, other, job("bf16"),
                                                             lay).caveats)


def test_composed_compiled_fp8_on_a_host_bound_layout_says_its_dispatch_is_not_priced():
    """Compiled fp8 composed from bf16 rows adds no host dispatch (the committed fp8 rows
    dispatch 1.3 ms a layer more, fp8h17's host-bound arms ran up to 19 % slow): a layout
    the CPU sets says so; a GPU-bound one, or one priced from a measured fp8 row, does not."""
    from meshplan.costmodel.fp8_caveats import COMPOSED_COMPILED_HOST_CAVEAT
    ends = (_end("embedding"), _end("output"))
    lay = Layout(dp=4, micro_batch=1, compile=True)
    host_bound = _compiled_cluster(_crow(False, 2e-3, 4e-3), _crow(True, 1.5e-3, 3e-3),
                                   ends=ends)
    est = estimate(MODEL, host_bound, job(), lay)
    assert est.time.host_wait_s > 0
    assert COMPOSED_COMPILED_HOST_CAVEAT in est.caveats
    assert COMPOSED_COMPILED_HOST_CAVEAT not in estimate(MODEL, host_bound, job("bf16"),
                                                         lay).caveats
    quick = dict(forward_cpu_s=1e-4, backward_cpu_s=1e-4)
    gpu_bound = _compiled_cluster(_crow(False, 2e-3, 4e-3, **quick),
                                  _crow(True, 1.5e-3, 3e-3, **quick), ends=ends)
    est = estimate(MODEL, gpu_bound, job(), lay)
    assert est.time.host_wait_s == 0
    assert COMPOSED_COMPILED_HOST_CAVEAT not in est.caveats
    timed = _compiled_cluster(_crow(False, 2e-3, 4e-3), _crow(True, 1.5e-3, 3e-3),
                              _crow(True, 1.2e-3, 2.5e-3, precision="fp8",
                                    fp8_recipe="tensorwise"), ends=ends)
    est = estimate(MODEL, timed, job(), lay)
    assert est.time.host_wait_s > 0
    assert COMPOSED_COMPILED_HOST_CAVEAT not in est.caveats


def test_compiled_full_recompute_fp8_recomputes_no_linear_gemm_nor_cast():
    """The executor's compiled fp8 block under full recomputation keeps its fp8 GEMMs'
    outputs (Inductor's partitioner), so the backward's recomputed forward runs no linear
    GEMM and no cast; eager, and TransformerEngine's layers, recompute them in fp8."""
    rows = (_crow(True, 1.5e-3, 3e-3, recompute="full"),)
    cl = _compiled_cluster(*rows)
    lay = Layout(dp=4, micro_batch=1, recompute="full", compile=True)
    b, f = parts(job("bf16"), lay, cl), parts(job(), lay, cl)
    assert f.fp8.recompute_keeps_gemm_outputs
    assert f.layer.recompute.gemm_s == 0.0
    assert f.layer.recompute.memory_bound_s == pytest.approx(b.layer.recompute.memory_bound_s)
    eager = parts(job(), replace(lay, compile=False), cl)
    assert not eager.fp8.recompute_keeps_gemm_outputs
    assert eager.layer.recompute.gemm_s > 0
    te = parts(job(runtime="megatron"), lay, cl)
    assert not te.fp8.recompute_keeps_gemm_outputs


def test_compiled_casts_inside_a_block_cost_the_profiles_share():
    """fp8_cast_compiled_block_share prices the compiled casts at that share of the same bytes
    cast alone; the H200 datasheet's share is the fit benchmarks/fp8_composed_rows.py makes
    over the committed fp8h1-fp8h15 rows, which it brings within 5 % mean."""
    import sys
    from pathlib import Path
    from meshplan.hardware_profiles import builtin_gpu
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import fp8_composed_rows as fcr
    h200 = builtin_gpu("H200-SXM-141GB")
    rate = cast_rate(h200, job(), True)
    assert rate.gbps == pytest.approx(h200.fp8_cast_compiled_gbps
                                      / h200.fp8_cast_compiled_block_share)
    assert cast_rate(GPU, job(), True).gbps == GPU.fp8_cast_compiled_gbps   # no share
    alone = fcr.rows(0.0)
    assert len(alone) >= 50
    share = fcr.fit_share(alone)
    assert share == pytest.approx(h200.fp8_cast_compiled_block_share, abs=0.002)
    fitted = fcr.rows(share)
    errors = [abs(r["composed_s"] / r["measured_s"] - 1) for r in fitted]
    assert sum(errors) / len(errors) < 0.05


def test_compiled_fp8_drops_one_norm_output_where_the_layer_has_no_dense_mlp():
    """Compiled with its activations kept, the executor's fp8 block keeps neither norm
    output where bf16 keeps both (the QKV and MLP-up inputs); an MoE layer without shared
    experts (mlp_width 0) feeds its second norm's output to the router and the dispatch
    only, which bf16 does not keep either: one norm output comes off, not two."""
    s, h, f = 1024, MODEL.hidden_size, MODEL.ffn_hidden_size
    kw = dict(compile=True, fsdp=False, compiled_row=False)

    def delta(width):
        return torch_memory(MODEL, job(), 1, 1, False, "none", 0.0, mlp_width=width,
                            **kw)["activation_delta_bytes"]
    assert delta(None) == -(2 * s * h + s * f) * 2          # dense: both norms, MLP-down
    assert delta(512) == -(2 * s * h + s * 512) * 2          # MoE with shared experts
    assert delta(0) == -(s * h) * 2                          # MoE without: QKV input only
