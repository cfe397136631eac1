"""Predictions for a model the calibration did not time: the nearest timed shape's rows
scaled by the analytical ratio (costmodel/nearest_rows.py), the operator counts that carry
CPU dispatch between families (costmodel/dispatch.py), the executor's activation bytes
(costmodel/torch_activations.py), memory-bound ops at their own efficiency and zero-bubble's
full-recompute weight pass (costmodel/corrections.py)."""

from dataclasses import replace

import pytest

from meshplan.costmodel import corrections as corr, estimate
from meshplan.costmodel.compute import layer_cost
from meshplan.costmodel.data_parallel import group_links
from meshplan.costmodel.dispatch import layer_dispatch_ops, layer_dispatch_ratio
from meshplan.costmodel.measured import (MeasuredEnd, MeasuredLayer, MeasuredTables,
                                         ends_shape_key, layer_shape_key)
from meshplan.costmodel.nearest_rows import NEAREST_SHAPE, STRETCH_MARGIN, family, shape_distance
from meshplan.costmodel.parts import layer_parts
from meshplan.costmodel.tables import layer_tables
from meshplan.costmodel.torch_activations import torch_layer_activations, torch_output_bytes
from meshplan.errors import ProfileError
from meshplan.hardware_profiles import Cluster
from meshplan.hardware_profiles.loader import gpu_from_table
from meshplan.hardware_profiles.measured import model_from_shape_key
from meshplan.spec import Job, Layout, ModelSpec

LLAMA = dict(activation="swiglu", norm="rmsnorm", position_embedding="rope", bias=False,
             tied_embeddings=False)
GPT = dict(activation="gelu", norm="layernorm", position_embedding="learned", bias=True)
SOURCE = ModelSpec(name="timed", num_layers=8, hidden_size=1024, num_heads=16, num_kv_heads=4,
                   ffn_hidden_size=2816, vocab_size=32000, max_seq_len=2048, **LLAMA)
TARGET = replace(SOURCE, name="untimed", hidden_size=4096, num_heads=32, num_kv_heads=8,
                 ffn_hidden_size=11264)
OTHER_FAMILY = ModelSpec(name="gpt", num_layers=8, hidden_size=2048, num_heads=16,
                         vocab_size=32000, max_seq_len=2048, **GPT)
JOB = Job(global_batch=16, seq_len=2048, runtime="torch")
BASE = Cluster.preset("dgx-h100", nodes=1, gpus_per_node=4)


def _rows(model, mbs=(1, 4)):
    """Layer and end rows of ``model`` at tp 1, no recompute, with CPU fields."""
    layers = tuple(MeasuredLayer(
        shape=layer_shape_key(model), seq_len=2048, tp=1, sequence_parallel=False,
        recompute="none", micro_batch=mb, forward_s=1e-3 * mb, backward_s=2e-3 * mb,
        activation_bytes=5e7 * mb, backward_peak_bytes=2e7 * mb, forward_cpu_s=4e-4,
        backward_cpu_s=8e-4) for mb in mbs)
    ends = tuple(MeasuredEnd(
        shape=ends_shape_key(model), part=part, seq_len=2048, tp=1, sequence_parallel=False,
        micro_batch=mb, forward_s=2e-4 * mb, backward_s=3e-4 * mb, activation_bytes=1e8 * mb,
        peak_bytes=1e8 * mb, forward_cpu_s=1e-4, backward_cpu_s=2e-4)
        for part in ("embedding", "output") for mb in mbs)
    return layers, ends


def _cluster(*models):
    layers, ends = (), ()
    for m in models:
        ls, es = _rows(m)
        layers, ends = layers + ls, ends + es
    return BASE.replace(gpu=replace(BASE.gpu, measured=MeasuredTables(layers, ends)))


def _parts(model, cluster, mb=1):
    links = group_links(cluster, Layout(dp=4))
    return layer_parts(model, cluster, JOB, mb, 1, False, "none", links.tp, links.pp)


def test_shape_keys_read_back():
    for m in (SOURCE, OTHER_FAMILY):
        back = model_from_shape_key(ends_shape_key(m))
        assert layer_shape_key(back) == layer_shape_key(m)
        assert (back.vocab_size, back.tied_embeddings) == (m.vocab_size, m.tied_embeddings)
    assert model_from_shape_key("not-a-key") is None
    assert family(SOURCE) == family(TARGET) != family(OTHER_FAMILY)
    assert shape_distance(TARGET, 2048, SOURCE, 2048) < 2 < shape_distance(
        TARGET, 2048, OTHER_FAMILY, 2048)


def test_an_untimed_shape_reads_the_nearest_rows_scaled_by_the_analytical_ratio():
    c = _cluster(SOURCE)
    p = _parts(TARGET, c, mb=1)
    assert "layer" in p.measured and p.transferred_from.startswith(layer_shape_key(SOURCE))
    links = group_links(c, Layout(dp=4))

    def an(m, mb):
        return layer_cost(m, c, JOB, micro_batch=mb, tp=1, sequence_parallel=False,
                          recompute="none", tp_link=links.tp).forward.total_s

    # the source's micro-batch is the one whose analytical forward matches the target's
    # (one step from the tokens' micro-batch); past the largest timed (4) the source's rows
    # are extended linearly in the micro-batch, as a model's own rows are
    m = an(TARGET, 1) / an(SOURCE, 1)
    assert m > 4
    assert p.layer.forward.total_s == pytest.approx(1e-3 * m * an(TARGET, 1) / an(SOURCE, m))
    kept = [torch_layer_activations(mod, JOB, mb, 1, False).stored("none")
            for mod, mb in ((TARGET, 1), (SOURCE, m))]
    assert p.activation_bytes == pytest.approx(5e7 * m * kept[0] / kept[1])
    # same family: the CPU dispatch is the source's (the same operators)
    assert p.cpu[:2] == pytest.approx((4e-4, 8e-4))
    # the profile's own rows win where it timed the shape
    own = _parts(SOURCE, c)
    assert own.transferred_from == "" and own.layer.forward.total_s == pytest.approx(1e-3)


def test_a_row_past_the_largest_timed_size_is_extended_below_the_smallest_clamped():
    """Past the source's largest timed micro-batch its two largest rows set the marginal
    cost (the curves' further climb, which the ratio from the largest row read, priced
    dense transfers 4.8 % fast on 1 x H200); below its smallest, the smallest row and the
    analytical ratio (extended linearly instead, MoE arms went 5.8 -> 8.9 %)."""
    c = _cluster(SOURCE)
    links = group_links(c, Layout(dp=4))

    def an(m, mb):
        return layer_cost(m, c, JOB, micro_batch=mb, tp=1, sequence_parallel=False,
                          recompute="none", tp_link=links.tp).forward.total_s

    # the rows make a source layer's time exactly linear in the micro-batch (1 ms each):
    # extended, a target 16x the work prices at the equivalent micro-batch's 1 ms each,
    # not at the largest row's 4 ms times the analytical 16x, which the curves' efficiency
    # gain between micro-batch 4 and 16 would have lowered
    p = _parts(TARGET, c, mb=1)
    m = an(TARGET, 1) / an(SOURCE, 1)
    clamped = 4e-3 * an(TARGET, 1) / an(SOURCE, 4)
    assert p.layer.forward.total_s == pytest.approx(1e-3 * m * an(TARGET, 1) / an(SOURCE, m))
    assert p.layer.forward.total_s != pytest.approx(clamped, rel=1e-3)
    small = replace(SOURCE, name="small", hidden_size=256, num_heads=4, num_kv_heads=1,
                    ffn_hidden_size=704)
    q = _parts(small, c, mb=1)
    assert q.layer.forward.total_s == pytest.approx(1e-3 * an(small, 1) / an(SOURCE, 1))


def test_the_estimate_reports_the_transfer_and_switches_it_off_by_name():
    c = _cluster(SOURCE)
    lay = Layout(dp=4, micro_batch=1)
    est = estimate(TARGET, c, JOB, lay)
    assert any("was not timed" in x and layer_shape_key(SOURCE) in x for x in est.caveats)
    (name, dt, dm), = [x for x in est.corrections if x.name == NEAREST_SHAPE]
    off = c.replace(gpu=replace(c.gpu, corrections=c.gpu.corrections.without(NEAREST_SHAPE)))
    base = estimate(TARGET, off, JOB, lay)
    assert dt == pytest.approx(est.step_time_s - base.step_time_s) and dt != 0
    assert not any("was not timed" in x for x in base.caveats)
    assert base.host_dispatch_s == 0 < est.host_dispatch_s   # the CPU's dispatch came along


def test_rows_read_beyond_the_sources_micro_batches_say_so():
    """A target whose micro-batch does more work than the source's largest timed one reads
    the source's rows extended past it, one doing less than its smallest reads the smallest
    (moeh42: 6-7 % fast): the estimate names the source's micro-batches and how far;
    inside them, no such caveat."""
    c = _cluster(SOURCE)                       # rows at micro-batch 1 and 4
    lay = Layout(dp=4, micro_batch=1)
    tables = _parts(TARGET, c).tables
    far = tables.stretch_for(tp=1, sequence_parallel=False, recompute="none", micro_batch=1)
    assert far.source.startswith(layer_shape_key(SOURCE)) and far.timed == (1, 4)
    assert far.equivalent_mb > 4 * STRETCH_MARGIN       # 16 x the FLOPs a token
    est = estimate(TARGET, c, JOB, lay)
    (cav,) = [x for x in est.caveats if "does the work of micro-batch" in x]
    assert "timed at micro-batch 1, 4" in cav and f"{far.equivalent_mb:.1f}" in cav
    near = replace(SOURCE, name="near", num_kv_heads=8)    # about the source's work
    for mb in (1, 2, 4):
        assert _parts(near, c, mb=mb).transferred_stretch is None
        assert not any("does the work of micro-batch" in x
                       for x in estimate(near, c, JOB, Layout(dp=4, micro_batch=mb)).caveats)
    # and below the smallest (moeh42: 6-7 % fast): the caveat names the row at 1
    small = replace(SOURCE, name="small", hidden_size=256, num_heads=4, num_kv_heads=1,
                    ffn_hidden_size=704)
    low = _parts(small, c).tables.stretch_for(tp=1, sequence_parallel=False,
                                              recompute="none", micro_batch=1)
    assert low.timed == (1, 4) and low.equivalent_mb < 1 / STRETCH_MARGIN
    (cav,) = [x for x in estimate(small, c, JOB, lay).caveats
              if "does the work of micro-batch" in x]
    assert "the row at 1 is carried" in cav
    (cav,) = [x for x in est.caveats if "does the work of micro-batch" in x]
    assert "extended linearly from micro-batch 1, 4" in cav and "2.7 %" in cav
    # the profile's own shape is not transferred: nothing to stretch
    assert _parts(SOURCE, c).transferred_stretch is None


def test_a_transferred_shape_prices_zero2_and_3_layouts():
    """The transferred tables answer the build's FSDP2 lookup as the profile's own do (its
    signature included: an ep keyword since FSDP2 rows are timed at ep > 1), here with no
    FSDP2 row to lend: ZeRO-2/3 from the transferred plain row."""
    c = _cluster(SOURCE)
    for zero in (2, 3):
        est = estimate(TARGET, c, JOB, Layout(dp=4, micro_batch=1, zero=zero))
        assert est.step_time_s > 0
        assert any("was not timed" in x for x in est.caveats)


def test_another_family_lends_its_cpu_dispatch_only():
    c = _cluster(SOURCE)
    p = _parts(OTHER_FAMILY, c)
    analytic = _parts(OTHER_FAMILY, BASE)
    assert p.transferred_from
    assert p.layer.forward.total_s == pytest.approx(analytic.layer.forward.total_s)
    assert p.activation_bytes == pytest.approx(analytic.activation_bytes)
    f, b = layer_dispatch_ratio(OTHER_FAMILY, SOURCE, tp=1, sequence_parallel=False,
                                recompute="none")
    assert p.cpu[:2] == pytest.approx((4e-4 * f, 8e-4 * b))
    assert f < 1 and b < 1      # a GPT layer dispatches fewer operators than a Llama one


def test_another_familys_compiled_row_lends_its_cpu_unscaled_and_the_fused_count():
    # a compiled block dispatches one graph, not the eager operators: GPT and Llama compiled
    # rows timed at 0.7-1.3 ms a forward alike on 1 x H200 (fp8h16-fp8h23 profiles)
    layers, ends = _rows(OTHER_FAMILY)
    comp = tuple(replace(r, compile=True) for r in layers)
    c = BASE.replace(gpu=replace(BASE.gpu, measured=MeasuredTables(layers + comp, ends)))
    links = group_links(c, Layout(dp=4))
    p = layer_parts(SOURCE, c, JOB, 1, 1, False, "none", links.tp, links.pp, compile=True)
    assert p.transferred_from and p.compiled
    assert p.cpu[:2] == pytest.approx((4e-4, 8e-4))
    # the GPU time: the Llama layer's analytical time with its element-wise work fused,
    # well under its eager count (fp32 RMSNorm, RoPE's five kernels, SwiGLU's three)
    fused = layer_cost(SOURCE, c, JOB, micro_batch=1, tp=1, sequence_parallel=False,
                       recompute="none", tp_link=links.tp, compiled=True)
    assert p.layer.forward.total_s == pytest.approx(fused.forward.total_s)
    assert p.layer.forward.total_s < _parts(SOURCE, c).layer.forward.total_s


def test_dispatch_counts_grow_with_the_layer_pieces():
    kw = dict(tp=1, sequence_parallel=False, recompute="none", autocast=False)
    gpt, llama = layer_dispatch_ops(OTHER_FAMILY, **kw), layer_dispatch_ops(SOURCE, **kw)
    assert gpt == (32, 69) and llama == (76, 116)
    mha = layer_dispatch_ops(replace(SOURCE, num_kv_heads=16), **kw)
    assert llama[0] - mha[0] == 8                                   # two repeat_interleave
    full = layer_dispatch_ops(SOURCE, **{**kw, "recompute": "full"})
    assert full == (llama[0], llama[1] + llama[0])                  # the forward again
    tp2 = layer_dispatch_ops(SOURCE, **{**kw, "tp": 2, "sequence_parallel": True})
    assert tp2 == (llama[0] + 4, llama[1] + 4)


def _count_dispatch(model):
    torch = pytest.importorskip("torch")
    from torch.utils._python_dispatch import TorchDispatchMode

    from meshplan.executor.model import Block, rope_tables

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.n += 1
            return func(*args, **(kwargs or {}))
    block = Block(model).to(torch.bfloat16)
    x = torch.randn(2, 16, model.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    rope = rope_tables(16, model.head_dim) if model.position_embedding == "rope" else None
    with Count() as fwd:
        y = block(x, rope)
    g = torch.ones_like(y)
    with Count() as bwd:
        y.backward(g)
    return fwd.n, bwd.n


@pytest.mark.parametrize("model", [
    ModelSpec(name="g", num_layers=1, hidden_size=64, num_heads=4, vocab_size=64, **GPT),
    ModelSpec(name="gn", num_layers=1, hidden_size=64, num_heads=4, vocab_size=64,
              **{**GPT, "bias": False}),
    ModelSpec(name="l", num_layers=1, hidden_size=64, num_heads=4, vocab_size=64, **LLAMA),
    ModelSpec(name="q", num_layers=1, hidden_size=64, num_heads=4, num_kv_heads=2,
              vocab_size=64, **LLAMA),
    ModelSpec(name="m", num_layers=1, hidden_size=64, num_heads=4, num_kv_heads=1,
              vocab_size=64, **LLAMA)], ids=["gpt", "gpt-nobias", "llama", "gqa", "mqa"])
def test_dispatch_counts_match_torch_on_the_executor_block(model):
    """The counts are the aten operators torch dispatches for the executor's block (bf16,
    tp 1), forward and backward."""
    fwd, bwd = _count_dispatch(model)
    expect = layer_dispatch_ops(model, tp=1, sequence_parallel=False, recompute="none",
                                autocast=False)
    assert (fwd, bwd) == expect


def _saved_bytes(model, recompute):
    torch = pytest.importorskip("torch")
    from meshplan.executor.model import Block, rope_tables
    b, s = 2, 64
    block = Block(model).to(torch.bfloat16)
    block.attn.recompute_core = recompute == "selective"
    block.recompute_block = recompute == "full"
    params = {p.untyped_storage().data_ptr() for p in block.parameters()}
    seen = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            seen[st.data_ptr()] = st.nbytes()
        return t
    x = torch.randn(b, s, model.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    rope = rope_tables(s, model.head_dim) if model.position_embedding == "rope" else None
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        block(x, rope)
    return sum(seen.values()), b


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
@pytest.mark.parametrize("model", [
    ModelSpec(name="g", num_layers=1, hidden_size=256, num_heads=4, vocab_size=64, **GPT),
    ModelSpec(name="gq", num_layers=1, hidden_size=256, num_heads=4, num_kv_heads=2,
              vocab_size=64, **GPT),
    ModelSpec(name="l", num_layers=1, hidden_size=256, num_heads=4, vocab_size=64, **LLAMA),
    ModelSpec(name="q", num_layers=1, hidden_size=256, num_heads=4, num_kv_heads=2,
              ffn_hidden_size=640, vocab_size=64, **LLAMA),
    ModelSpec(name="m", num_layers=1, hidden_size=256, num_heads=4, num_kv_heads=1,
              vocab_size=64, **LLAMA)], ids=["gpt", "gpt-gqa", "llama", "gqa", "mqa"])
def test_activation_bytes_match_what_torch_saves_in_the_executor_block(model, recompute):
    """torch's saved tensors of one executor block (bf16, as FSDP2 runs it; CPU, tp 1):
    within 1 % (the model counts a LayerNorm's mean and rstd as 8 B per token, which CUDA
    keeps in fp32; this CPU kernel keeps 4)."""
    saved, mb = _saved_bytes(model, recompute)
    job = Job(global_batch=2, seq_len=64, runtime="torch")
    model_bytes = torch_layer_activations(model, job, mb, 1, False,
                                          autocast=False).stored(recompute)
    if recompute == "full":     # the checkpoint keeps the block input, which the hooks see
        assert saved == pytest.approx(model_bytes)
    else:
        assert saved == pytest.approx(model_bytes, rel=0.01)


def test_memory_bound_ops_run_at_their_own_efficiency():
    gpu = BASE.gpu
    cheap = BASE.replace(gpu=replace(gpu, membound_efficiency={"rmsnorm": 1.0, "swiglu": 1.0}))
    slow = BASE.replace(gpu=replace(gpu, membound_efficiency={"rmsnorm": 0.05}))
    links = group_links(BASE, Layout(dp=4))

    def mb_s(cluster, model):
        return layer_cost(model, cluster, JOB, micro_batch=1, tp=1, sequence_parallel=False,
                          recompute="none", tp_link=links.tp).forward.memory_bound_s
    assert mb_s(cheap, SOURCE) < mb_s(BASE, SOURCE) < mb_s(slow, SOURCE)
    # a GPT layer has no RMSNorm and no SwiGLU: those efficiencies do not move it
    assert mb_s(cheap, OTHER_FAMILY) == mb_s(slow, OTHER_FAMILY) == mb_s(BASE, OTHER_FAMILY)
    assert gpu.op_hbm_efficiency("rmsnorm") == gpu.hbm_efficiency       # datasheet: pooled
    table = {**gpu.to_dict(), "membound_efficiency": {"rmsnorm": 1.5}}
    with pytest.raises(ProfileError, match=r"membound_efficiency\.rmsnorm must be a number "
                                           r"in \(0, 1\], got 1\.5"):
        gpu_from_table("x", table, "p.toml [gpu]")


def test_zero_bubble_full_recompute_weight_pass_reruns_the_forward():
    model = replace(SOURCE, name="zb")
    lay = Layout(pp=4, micro_batch=1, schedule="zero-bubble", recompute="full")
    t = layer_tables(model, BASE, JOB, lay)
    assert t.zb_w_recompute_passes == BASE.gpu.corrections.zb_full_w_forward_passes
    assert corr.ZB_FULL_W in t.corrections
    off = BASE.replace(gpu=replace(BASE.gpu, corrections=BASE.gpu.corrections.without(
        corr.ZB_FULL_W)))
    t0 = layer_tables(model, off, JOB, lay)
    extra = t.zb_w_recompute_passes * t0.layer_forward_s
    assert t.layer_wgrad_s == pytest.approx(t0.layer_wgrad_s + extra)
    assert t.layer_backward_s == pytest.approx(t0.layer_backward_s + extra)
    for other in (lay.replace(recompute="selective"), lay.replace(schedule="1f1b")):
        assert corr.ZB_FULL_W not in layer_tables(model, BASE, JOB, other).corrections
    megatron = Job(global_batch=16, seq_len=2048)
    assert corr.zb_full_w_passes(BASE.gpu.corrections, megatron, lay, False) == 0.0
    assert corr.zb_full_w_passes(BASE.gpu.corrections, JOB, lay, True) == 0.0   # measured


MOE_SOURCE = ModelSpec(name="moe-timed", num_layers=8, hidden_size=1024, num_heads=16,
                       num_kv_heads=4, ffn_hidden_size=2816, vocab_size=32000,
                       max_seq_len=2048, num_experts=8, experts_per_token=2,
                       moe_ffn_hidden_size=2816, **LLAMA)
MOE_TARGET = replace(MOE_SOURCE, name="moe-untimed", hidden_size=2048, num_heads=16,
                     num_experts=32, experts_per_token=8, moe_ffn_hidden_size=1024)


def test_moe_shape_keys_read_back_with_their_experts():
    shared = replace(MOE_SOURCE, num_shared_experts=1, shared_expert_ffn_hidden_size=512,
                     router="sigmoid", capacity_factor=1.25)
    for m in (MOE_SOURCE, MOE_TARGET, shared):
        back = model_from_shape_key(layer_shape_key(m))
        assert back.is_moe and layer_shape_key(back) == layer_shape_key(m)
    # an MoE layer is nearer another MoE layer's experts than a dense layer's MLP says
    assert shape_distance(MOE_TARGET, 2048, MOE_SOURCE, 2048) < 100
    assert family(MOE_SOURCE) != family(SOURCE)
    assert family(replace(MOE_SOURCE, num_shared_experts=1,
                          shared_expert_ffn_hidden_size=512)) == family(MOE_SOURCE)


def test_an_untimed_moe_layer_reads_another_moe_models_rows_scaled():
    """MoE rows stand for another MoE model's layer (the routed part in the analytical ratio,
    row_scaling.moe_analytic), compiled rows for compiled layouts; a dense model never reads
    MoE rows nor an MoE model dense ones."""
    from meshplan.costmodel.row_scaling import analytic
    layers, ends = _rows(MOE_SOURCE)
    compiled = tuple(replace(r, compile=True, forward_s=r.forward_s / 2) for r in layers)
    c = BASE.replace(gpu=replace(BASE.gpu, measured=MeasuredTables(layers + compiled, ends)))
    links = group_links(c, Layout(dp=4))
    def fwd(model, mb):
        return analytic(model, JOB, mb, c, 1, False, "none", links.tp, True).forward_s
    # the source's micro-batch whose analytical forward is the target's (one step)
    m = min(max(fwd(MOE_TARGET, 1) / fwd(MOE_SOURCE, 1), 1), 4)
    p = layer_parts(MOE_TARGET, c, JOB, 1, 1, False, "none", links.tp, links.pp,
                    compile=False, mlp_width=0)
    assert "layer" in p.measured and p.transferred_from.startswith(layer_shape_key(MOE_SOURCE))
    assert p.layer.forward.total_s == pytest.approx(
        1e-3 * m * fwd(MOE_TARGET, 1) / fwd(MOE_SOURCE, m))
    # a compiled row beside its eager twin: the memory-bound work (and fixed costs) of both
    # analytical layers at the share of its eager price the source's compiled row shows,
    # s = (C/E·(g + m) − g) / m within [0, 1], the GEMMs and attention as they are
    p = layer_parts(MOE_TARGET, c, JOB, 1, 1, False, "none", links.tp, links.pp,
                    compile=True, mlp_width=0)
    assert "layer" in p.measured and p.transferred_from.startswith(layer_shape_key(MOE_SOURCE))
    a_s = analytic(MOE_SOURCE, JOB, m, c, 1, False, "none", links.tp, True)
    a_t = analytic(MOE_TARGET, JOB, 1, c, 1, False, "none", links.tp, True)
    g_s, g_t = a_s.forward_s - a_s.forward_mem_s, a_t.forward_s - a_t.forward_mem_s
    share = min(1.0, max(0.0, (0.5 * a_s.forward_s - g_s) / a_s.forward_mem_s))
    assert p.layer.forward.total_s == pytest.approx(
        0.5e-3 * m * (g_t + share * a_t.forward_mem_s) / (g_s + share * a_s.forward_mem_s))
    # backward: compiled as eager here, so its share is 1 and the ratio the plain one
    bwd = [analytic(x, JOB, mb, c, 1, False, "none", links.tp, True).backward_s
           for x, mb in ((MOE_TARGET, 1), (MOE_SOURCE, m))]
    assert p.layer.backward.total_s == pytest.approx(2e-3 * m * bwd[0] / bwd[1])
    # a compiled row's 16-bit weight copies are an intercept: kept out of the scaling
    from meshplan.costmodel.compiled_rows import compiled_row_copies
    lay = Layout(tp=1, recompute="none")
    w_s, w_t = compiled_row_copies(MOE_SOURCE, lay), compiled_row_copies(MOE_TARGET, lay)
    with_w = tuple(replace(r, activation_bytes=r.activation_bytes + w_s) for r in compiled)
    cw = BASE.replace(gpu=replace(BASE.gpu, measured=MeasuredTables(layers + with_w, ends)))
    p = layer_parts(MOE_TARGET, cw, JOB, 1, 1, False, "none", links.tp, links.pp,
                    compile=True, mlp_width=0)

    def kept(model, mb):
        return analytic(model, JOB, mb, cw, 1, False, "none", links.tp, True).kept_bytes
    assert p.activation_bytes == pytest.approx(5e7 * m * kept(MOE_TARGET, 1)
                                               / kept(MOE_SOURCE, m) + w_t)
    # the ratio holds the routed experts: 4x the top-k copies cost more than the trunk says
    dense_only = layer_cost(MOE_TARGET, c, JOB, micro_batch=1, tp=1, sequence_parallel=False,
                            recompute="none", tp_link=links.tp, mlp_width=0)
    assert analytic(MOE_TARGET, JOB, 1, c, 1, False, "none", links.tp,
                    True).forward_s > dense_only.forward.total_s
    assert not _parts(TARGET, c).transferred_from           # dense target, MoE rows only
    dense = _cluster(SOURCE)
    assert not layer_parts(MOE_TARGET, dense, JOB, 1, 1, False, "none", links.tp, links.pp,
                           mlp_width=0).transferred_from


def test_the_estimate_of_an_untimed_moe_model_reads_the_transferred_rows():
    layers, ends = _rows(MOE_SOURCE)
    c = BASE.replace(gpu=replace(BASE.gpu, measured=MeasuredTables(layers, ends)))
    est = estimate(MOE_TARGET, c, JOB, Layout(dp=4, micro_batch=1))
    assert any("was not timed" in x and layer_shape_key(MOE_SOURCE) in x for x in est.caveats)
    assert any(x.name == NEAREST_SHAPE and x.step_time_delta_s != 0 for x in est.corrections)
    # ep > 1 from the transferred ep = 1 row, with ep's terms on top
    ep = estimate(MOE_TARGET, c, JOB, Layout(dp=4, ep=4, micro_batch=1))
    assert ep.time.ep_comm_s > 0 and any("was not timed" in x for x in ep.caveats)


def test_an_moe_layers_dispatch_counts_its_routed_part_and_shared_experts():
    """Two MoE layers' CPU dispatch scales by moe_host's counts: the same routed part and
    trunk dispatch alike at any width; a shared expert adds an MLP's operators."""
    from meshplan.costmodel.moe_host import dense_ops, routed_ops
    from meshplan.costmodel.nearest_rows import dispatch_ratio
    kw = dict(tp=1, sequence_parallel=False, recompute="none")
    assert dispatch_ratio(MOE_TARGET, MOE_SOURCE, **kw) == (1.0, 1.0)
    shared = replace(MOE_TARGET, num_shared_experts=1, shared_expert_ffn_hidden_size=1024)
    f, b = dispatch_ratio(shared, MOE_SOURCE, **kw)
    lay = Layout()
    base = [x + y for x, y in zip(dense_ops(MOE_SOURCE, lay, autocast=True),
                                  routed_ops(MOE_SOURCE, lay, autocast=True))]
    assert (f - 1) * base[0] == pytest.approx(11) and (b - 1) * base[1] == pytest.approx(23)
    full = dispatch_ratio(shared, MOE_SOURCE, tp=1, sequence_parallel=False, recompute="full")
    assert full[0] == pytest.approx(f) and 1 < full[1]


def test_compiled_share_reads_the_fused_memory_bound_work_off_the_rows():
    """s = (C/E·(g + m) − g) / m per pass, within [0, 1]; 1 where a pass has no memory-bound
    work or a row is missing."""
    from meshplan.costmodel.row_scaling import Analytic, compiled_share
    b = Analytic(forward_s=3.0, backward_s=6.0, wgrad_s=2.0, kept_bytes=1.0, work_bytes=1.0,
                 forward_mem_s=1.0, backward_mem_s=2.0)
    # forward: compiled 2.5 of eager 3.0 (g = 2, m = 1): the memory-bound part at 0.5;
    # backward: compiled 6.6 of 6.0 would be more than eager: held at 1
    assert compiled_share(b, (3.0, 6.0), (2.5, 6.6)) == pytest.approx((0.5, 1.0))
    # the compiled row below the GEMMs' own time: held at 0
    assert compiled_share(b, (3.0, 6.0), (1.0, 3.0)) == (0.0, 0.0)
    assert compiled_share(replace(b, forward_mem_s=0.0), (3.0, 6.0), (0.0, 5.0)) == (1.0, 0.5)
    assert b.compiled((0.5, 1.0)) == pytest.approx((2.5, 6.0))


def test_a_compiled_loss_without_its_own_output_row_keeps_the_compiled_share_of_the_eager_row():
    """A profile whose output rows were timed eager only (calibrations before the compiled
    loss had a row) prices a compiled layout's output layer at the eager row's bytes times
    the compiled loss's share: 16-bit logits kept (e / 4 of the eager row's) and their
    16-bit gradient as working memory (e / 8); the eager layout keeps the row as timed."""
    c = _cluster(SOURCE)                 # eager output rows only: 1e8 B kept, 1e8 working
    links = group_links(c, Layout(dp=4))

    def parts(compile):
        return layer_parts(SOURCE, c, JOB, 1, 1, False, "none", links.tp, links.pp,
                           compile=compile)
    eager, comp = parts(False), parts(True)
    assert (eager.logits_bytes, eager.output_peak_bytes) == pytest.approx((1e8, 1e8))
    assert (comp.logits_bytes, comp.output_peak_bytes) == pytest.approx((0.5e8, 0.25e8))
    assert "output" in comp.measured
    # tp > 1 (no row here: analytical): the vocabulary-parallel loss stays eager
    tp2 = layer_parts(SOURCE, c, JOB, 1, 2, False, "none", links.tp, links.pp, compile=True)
    assert "output" not in tp2.measured
    assert (tp2.logits_bytes, tp2.output_peak_bytes) == pytest.approx(
        torch_output_bytes(SOURCE, JOB, 1, 2))


def test_a_source_timed_at_one_size_is_extended_in_proportion_and_says_so():
    """A source timed at one micro-batch only: past it, its row grows in proportion to the
    micro-batch (measured_interp), and the caveat names that, not the analytical ratio."""
    layers, ends = _rows(SOURCE, mbs=(2,))
    c = BASE.replace(gpu=replace(BASE.gpu, measured=MeasuredTables(layers, ends)))
    far = _parts(TARGET, c).tables.stretch_for(tp=1, sequence_parallel=False,
                                               recompute="none", micro_batch=1)
    assert far.timed == (2,) and far.equivalent_mb > 2 * STRETCH_MARGIN
    (cav,) = [x for x in estimate(TARGET, c, JOB, Layout(dp=4, micro_batch=1)).caveats
              if "does the work of micro-batch" in x]
    assert "its row at 2 is extended in proportion to the micro-batch" in cav
    assert f"{far.equivalent_mb / 2:.1f} times past the largest" in cav
