"""Measured layer tables and runtime="torch" in the cost model (meshplan.costmodel.measured)."""

from dataclasses import replace

import pytest

from meshplan.costmodel import estimate
from meshplan.costmodel.autocast_cast import head_cast_s, layer_cast_s
from meshplan.costmodel.estimate import (FSDP_DP_ONLY_CAVEAT, FSDP_OVER_TP_CAVEAT,
                                         ZB_FSDP2_CAVEAT)
from meshplan.costmodel.measured import (MeasuredEnd, MeasuredLayer, MeasuredTables,
                                         ends_shape_key, layer_shape_key, tables_from_rows)
from meshplan.costmodel.memory import model_state_bytes, stage_params
from meshplan.spec import Job, Layout, ModelSpec
from meshplan.errors import ConfigError, ProfileError
from meshplan.hardware_profiles import Cluster
from meshplan.hardware_profiles.corrections import builtin_corrections

# the built-in correction numbers (hardware_profiles/data/corrections.toml)
NUMBERS = builtin_corrections()
TORCH_P2P_SLOWDOWN_PER_OP = NUMBERS.torch_p2p_slowdown_per_op
TORCH_P2P_SLOWDOWN_MAX = NUMBERS.torch_p2p_slowdown_max
ZB_FULL_PENDING_SETS = NUMBERS.zb_full_pending_sets
ZB_FULL_W_TRANSIENT_SETS = NUMBERS.zb_full_w_transient_sets
# the per-step term of a profile of the executor before its FSDP2 forward prefetch (the
# built-in default is 0 since round 38: costmodel.corrections.fsdp2_step_s)
FSDP2_DP_ONLY_STEP_S = 0.020

MODEL = ModelSpec(name="m", num_layers=8, hidden_size=1024, num_heads=16, vocab_size=32000,
                  max_seq_len=1024)
JOB = Job(global_batch=16, seq_len=1024, runtime="torch")


def _layer(mb, fwd, bwd, act, peak, **kw):
    base = dict(shape=layer_shape_key(MODEL), seq_len=1024, tp=1, sequence_parallel=False,
                recompute="none", micro_batch=mb, forward_s=fwd, backward_s=bwd,
                activation_bytes=act, backward_peak_bytes=peak)
    return MeasuredLayer(**{**base, **kw})


def _end(part, mb, fwd, bwd, act, peak):
    return MeasuredEnd(shape=ends_shape_key(MODEL), part=part, seq_len=1024, tp=1,
                       sequence_parallel=False, micro_batch=mb, forward_s=fwd, backward_s=bwd,
                       activation_bytes=act, peak_bytes=peak)


def _cluster(tables):
    c = Cluster.preset("dgx-h100", nodes=1, gpus_per_node=4)
    return replace(c, gpu=replace(c.gpu, measured=tables))


def _cast(c, layout, layers=8, head=True):
    """Autocast's weight casts of a stage's forward per micro-batch: once per step, spread
    over the step's micro-batches (costmodel.autocast_cast; the rows time them cached)."""
    m = layout.num_microbatches(JOB.global_batch)
    return (layers * layer_cast_s(MODEL, c.gpu, JOB, layout)
            + (head_cast_s(MODEL, c.gpu, JOB, layout) if head else 0.0)) / m


TABLES = MeasuredTables(
    (_layer(1, 1e-3, 2e-3, 100e6, 50e6), _layer(2, 1.8e-3, 3.8e-3, 200e6, 90e6),
     _layer(1, 1.5e-3, 3.5e-3, 0.0, 0.0, zero=2, dp=2)),
    (_end("embedding", 1, 1e-4, 2e-4, 1e6, 0.0), _end("output", 1, 5e-4, 9e-4, 400e6, 300e6)))


def test_runtime_is_checked():
    with pytest.raises(ConfigError, match="runtime"):
        Job(global_batch=8, seq_len=128, runtime="jax")


def test_torch_runtime_state_bytes_and_fsdp_sharding():
    # fp32 weights + fp32 grads + Adam m, v = 16 B/param; FSDP2's ZeRO-2 shards the weights too
    assert model_state_bytes(1000, JOB, 0, 4) == (4000, 4000, 8000)
    assert model_state_bytes(1000, JOB, 2, 4) == (1000, 1000, 2000)
    mega = Job(global_batch=16, seq_len=1024)
    assert model_state_bytes(1000, mega, 2, 4) == (2000, 500, 3000)


@pytest.mark.usefixtures("no_grad_accumulation")
def test_measured_layer_and_ends_replace_the_analytical_ones():
    c = _cluster(TABLES)
    est = estimate(MODEL, c, JOB, Layout(dp=1, micro_batch=1))
    # one stage: 8 measured layers + measured embedding + measured output, no extra overhead
    # but autocast's weight casts, which the rows time cached (_cast)
    cast = _cast(c, Layout(dp=1, micro_batch=1))
    assert cast > 0
    assert est.stage_forward_s[0] == pytest.approx(8 * 1e-3 + 1e-4 + 5e-4 + cast)
    assert est.stage_backward_s[0] == pytest.approx(8 * 2e-3 + 2e-4 + 9e-4)
    mem = est.memory[0]
    params = stage_params(MODEL, 8, 1, first=True, last=True, pp=1)
    assert mem.activations_bytes == pytest.approx(8 * 100e6 + 1e6)
    # weights + grads + Adam, plus the bf16 cast of every layer and the output weight
    copy = 2 * (stage_params(MODEL, 8, 1, first=False, last=False, pp=1)
                + MODEL.vocab_size * MODEL.hidden_size)
    # logits 400e6, then the larger of the output's working memory (300e6) and a layer
    # backward's (50e6): the rank runs one of them at a time
    assert mem.total_bytes == pytest.approx(16 * params + copy + 8 * 100e6 + 1e6
                                            + 400e6 + max(300e6, 50e6))


def test_micro_batch_interpolation_and_analytical_fallback():
    c = _cluster(TABLES)
    est2 = estimate(MODEL, c, JOB, Layout(micro_batch=2))
    est4 = estimate(MODEL, c, JOB, Layout(micro_batch=4))
    assert est2.stage_forward_s[0] == pytest.approx(8 * 1.8e-3 + 2 * 1e-4 + 2 * 5e-4
                                                    + _cast(c, Layout(micro_batch=2)))
    # mb 4 extrapolates the layer linearly through (1, 1.0 ms) and (2, 1.8 ms): 3.4 ms
    assert est4.stage_forward_s[0] == pytest.approx(8 * 3.4e-3 + 4 * 1e-4 + 4 * 5e-4
                                                    + _cast(c, Layout(micro_batch=4)))
    # recompute="full" has no row: the analytical layer is used, not a measured one
    from meshplan.costmodel.estimate import layer_tables
    datasheet = Cluster.preset("dgx-h100", nodes=1, gpus_per_node=4)
    lay = Layout(micro_batch=1, recompute="full")
    assert layer_tables(MODEL, c, JOB, lay).layer_forward_s == pytest.approx(
        layer_tables(MODEL, datasheet, JOB, lay).layer_forward_s)
    assert layer_tables(MODEL, c, JOB, lay).layer_forward_s != pytest.approx(1e-3)


def test_fsdp_rows_are_used_for_torch_zero2():
    c = _cluster(TABLES)
    est = estimate(MODEL, c, JOB, Layout(dp=2, micro_batch=1, zero=2))
    # the FSDP2 row's layer times, plus the root unit's gather / reduce-scatter
    assert est.stage_forward_s[0] > 8 * 1.5e-3 + 1e-4 + 5e-4
    assert est.stage_forward_s[0] < 8 * 1.5e-3 + 1e-4 + 5e-4 + 5e-3
    assert est.stage_backward_s[0] > 8 * 3.5e-3 + 2e-4 + 9e-4
    # dp 4 has no FSDP row: analytical gathers on top of the plain measured layer
    est4 = estimate(MODEL, c, JOB, Layout(dp=4, micro_batch=1, zero=2))
    assert est4.time.zero3_gather_s > 0


def test_rows_are_checked_and_name_the_row():
    with pytest.raises(ProfileError, match=r"\[\[layers\]\] #1: missing key"):
        tables_from_rows([{"shape": "x", "seq_len": 8}], [], "p.toml")
    good = {k: getattr(_end("output", 1, 1, 1, 1, 1), k) for k in (
        "shape", "part", "seq_len", "tp", "sequence_parallel", "micro_batch", "forward_s",
        "backward_s", "activation_bytes", "peak_bytes")}
    with pytest.raises(ProfileError, match="part 'head'"):
        tables_from_rows([], [{**good, "part": "head"}], "p.toml")
    with pytest.raises(ProfileError, match="forward_s must be a number >= 0"):
        tables_from_rows([], [{**good, "forward_s": -1.0}], "p.toml")
    with pytest.raises(ProfileError, match=r"#1: backward_cpu_s must be a number >= 0"):
        tables_from_rows([], [{**good, "backward_cpu_s": "fast"}], "p.toml")


@pytest.mark.parametrize("cpu_times", [False, True])
@pytest.mark.parametrize("layout", [
    Layout(dp=4, micro_batch=1, zero=1), Layout(dp=2, pp=2, micro_batch=2, zero=1),
    Layout(dp=2, micro_batch=1, zero=2), Layout(dp=4, micro_batch=2, zero=3, recompute="full"),
    Layout(pp=4, micro_batch=1, schedule="gpipe"), Layout(tp=2, pp=2, micro_batch=1,
                                                          schedule="zero-bubble"),
    Layout(micro_batch=1), Layout(pp=2, micro_batch=1),
    Layout(pp=2, micro_batch=1, schedule="interleaved-1f1b", vpp=2),
    Layout(dp=2, pp=2, micro_batch=1, zero=2),
])
def test_planner_tables_agree_with_estimate_under_torch_runtime(layout, cpu_times):
    """The planner prices partitions from LayerTables; estimate must give the same numbers,
    with and without measured CPU times (the host bound)."""
    from meshplan.costmodel.estimate import layer_tables
    c = _cluster(_cpu_tables() if cpu_times else TABLES)
    est = estimate(MODEL, c, JOB, layout)
    t = layer_tables(MODEL, c, JOB, layout)
    stages = [MODEL.num_layers // (layout.pp * layout.vpp)] * (layout.pp * layout.vpp)
    assert t.step_time_s(stages) == pytest.approx(est.step_time_s, rel=1e-9)
    assert t.peak_memory_bytes(stages) == pytest.approx(est.memory_peak_bytes, rel=1e-9)


def test_zero_bubble_uses_the_measured_split_backward():
    """Split timed queued (GPU-busy, its CPU dispatch apart): the GPU's I and W as measured."""
    split = MeasuredTables((_layer(1, 1e-3, 2e-3, 1e6, 0.0, backward_input_s=1.5e-3,
                                   backward_weight_s=4e-3, backward_input_cpu_s=1e-3,
                                   backward_weight_cpu_s=1e-3),), ())
    c = _cluster(split)
    zb = estimate(MODEL, c, JOB, Layout(pp=2, micro_batch=1, schedule="zero-bubble"))
    fb = estimate(MODEL, c, JOB, Layout(pp=2, micro_batch=1, schedule="1f1b"))
    # 4 layers per stage; the ends are analytical here (no end rows), identical in both;
    # stage 0's rank runs 2 p2p operations per micro-batch (TORCH_P2P_SLOWDOWN_PER_OP)
    k = 1 + 2 * TORCH_P2P_SLOWDOWN_PER_OP
    # stage 0 runs one fused backward, all in its W (torch: its I has no input gradient
    # to compute; runtime.zb_first_stage_fused); the last stage runs the measured split
    assert zb.stage_backward_s[0] == pytest.approx(fb.stage_backward_s[0])
    assert zb.stage_wgrad_s[0] == pytest.approx(zb.stage_backward_s[0])
    assert zb.stage_backward_s[1] - fb.stage_backward_s[1] == pytest.approx(
        k * 4 * (5.5e-3 - 2e-3))
    from meshplan.costmodel.estimate import layer_tables
    last_w = layer_tables(MODEL, c, JOB, Layout(pp=2, micro_batch=1,
                                                schedule="zero-bubble")).last_wgrad_s
    assert zb.stage_wgrad_s[1] == pytest.approx(k * (4 * 4e-3 + last_w))
    # the split's extra cost is in the breakdown, which adds up to the step
    assert zb.time.total_s == pytest.approx(zb.step_time_s)


def test_a_synchronized_split_beyond_the_fused_backward_is_cpu_time():
    """Split timed synchronized only (calibrate's default): I + W (5.5 ms) beyond the fused
    backward (2 ms) is the CPU's graph walk; the GPU's split is the fused backward in the
    measured proportion (costmodel.build.synchronized_split_gpu); the CPU keeps 5.5 ms
    (tests/unit/test_zb_synchronized_split.py checks that on a calibrated profile)."""
    split = MeasuredTables((_layer(1, 1e-3, 2e-3, 1e6, 0.0, backward_input_s=1.5e-3,
                                   backward_weight_s=4e-3),), ())
    c = _cluster(split)
    from meshplan.costmodel.estimate import layer_tables
    lay = Layout(pp=2, micro_batch=1, schedule="zero-bubble")
    zb = estimate(MODEL, c, JOB, lay)
    fb = estimate(MODEL, c, JOB, Layout(pp=2, micro_batch=1, schedule="1f1b"))
    k = 1 + 2 * TORCH_P2P_SLOWDOWN_PER_OP
    assert zb.stage_backward_s[1] == pytest.approx(fb.stage_backward_s[1])
    t = layer_tables(MODEL, c, JOB, lay)
    assert t.layer_wgrad_s == pytest.approx(2e-3 * 4 / 5.5)
    assert zb.stage_wgrad_s[1] == pytest.approx(k * (4 * 2e-3 * 4 / 5.5 + t.last_wgrad_s))
    assert t.zb_split_excess_s == pytest.approx(0.0, abs=1e-15)


def test_zero_bubble_split_backward_grows_with_the_stage_depth():
    # timed on 2 blocks; W per layer grows 0.25 ms per extra layer in the stack
    row = dict(backward_input_s=1.5e-3, backward_weight_s=4e-3, split_layers=2,
               backward_weight_depth_s=2.5e-4)
    c = _cluster(MeasuredTables((_layer(1, 1e-3, 2e-3, 1e6, 0.0, **row),), ()))
    from meshplan.costmodel.estimate import layer_tables
    for pp, n in ((2, 4), (4, 2)):
        lay = Layout(pp=pp, micro_batch=1, schedule="zero-bubble")
        zb = estimate(MODEL, c, JOB, lay)
        w = 4e-3 + 2.5e-4 * (n - 2)
        # timed synchronized: I + W beyond the fused 2 ms is the CPU's, the GPU's W its
        # measured share of the fused backward (costmodel.build.synchronized_split_gpu)
        w_gpu = 2e-3 * w / (1.5e-3 + w)
        last_w = layer_tables(MODEL, c, JOB, lay).last_wgrad_s    # the last stage's split
        assert zb.stage_wgrad_s[-1] == pytest.approx(
            (n * w_gpu + last_w) * (1 + 2 * TORCH_P2P_SLOWDOWN_PER_OP))
    # one measured micro-batch: times scale with it, the timed stack and its growth do not
    one = MeasuredTables((_layer(2, 1e-3, 2e-3, 1e6, 0.0, **row),), ())
    r = one.layer(MODEL, seq_len=1024, tp=1, sequence_parallel=False, recompute="none",
                  micro_batch=4)
    assert r.backward_weight_s == pytest.approx(8e-3) and r.split_layers == 2
    assert r.split_depth == pytest.approx((0.0, 2.5e-4, 2))
    from meshplan.costmodel.measured import split_backward_at
    assert split_backward_at((1.0, 2.0), (0.5, -1.0, 2), 6) == (3.0, 0.0)   # never below 0
    assert split_backward_at((1.0, 2.0), None, 6) == (1.0, 2.0)
    with pytest.raises(ProfileError, match="split_layers must be an integer >= 0"):
        tables_from_rows([{**_layer(1, 1e-3, 2e-3, 1e6, 0.0).__dict__, "split_layers": -1}], [],
                         "p.toml")


def test_zero_bubble_with_the_split_timed_queued():
    # GPU-busy B, W on the pipeline's timeline; their CPU dispatch (growing with the stage
    # depth) in the host bound, instead of the synchronized sum
    row = dict(backward_input_s=1.0e-3, backward_weight_s=1.2e-3, backward_input_cpu_s=3e-3,
               backward_weight_cpu_s=4e-3, split_layers=2, backward_weight_depth_s=5e-4,
               forward_cpu_s=1e-3, backward_cpu_s=2e-3)
    ends = tuple(replace(_end(part, 1, 1e-4, 2e-4, 1e6, 0.0), forward_cpu_s=1e-4,
                         backward_cpu_s=2e-4) for part in ("embedding", "output"))
    c = _cluster(MeasuredTables((_layer(1, 1e-3, 2e-3, 1e6, 0.0, **row),), ends))
    lay = Layout(pp=2, micro_batch=1, schedule="zero-bubble")
    zb = estimate(MODEL, c, JOB, lay)
    from meshplan.costmodel.estimate import layer_tables
    t = layer_tables(MODEL, c, JOB, lay)
    assert zb.stage_wgrad_s[-1] == pytest.approx(                   # GPU: no depth growth
        (4 * 1.2e-3 + t.last_wgrad_s) * (1 + 2 * TORCH_P2P_SLOWDOWN_PER_OP))
    # CPU per layer: forward + B + W at depth 4 (W + 2 extra layers x 0.5 ms)
    assert t.cpu_layer_s == pytest.approx(1e-3 + 3e-3 + 4e-3 + 2 * 5e-4)


def test_profile_file_tables_reach_the_cost_model(tmp_path):
    """Regression: load_profile once dropped the [[layers]]/[[ends]] rows of a profile."""
    from meshplan.calibrate.profile import build_profile
    from meshplan.calibrate.tomlfile import dumps
    from meshplan.hardware_profiles import builtin_gpu
    from meshplan.hardware_profiles.calibrated import apply_profile
    rows = MeasuredTables((_layer(1, 1e-3, 2e-3, 100e6, 50e6),),
                          (_end("output", 1, 5e-4, 9e-4, 400e6, 300e6),)).to_rows()
    doc = build_profile(measurements={}, base=builtin_gpu("H100-SXM5-80GB"), device="cuda",
                        provenance={"machine": "t"}, layers=rows["layers"], ends=rows["ends"])
    path = tmp_path / "p.toml"
    path.write_text(dumps(doc))
    c = apply_profile(Cluster.preset("dgx-h100", nodes=1, gpus_per_node=4), path)
    assert c.gpu.measured is not None and len(c.gpu.measured.layers) == 1
    from meshplan.costmodel.estimate import layer_tables
    lay = Layout(micro_batch=1)
    t = layer_tables(MODEL, c, JOB, lay)
    assert t.parts.measured == ("layer", "output")      # the embedding stays analytical
    assert estimate(MODEL, c, JOB, lay).stage_forward_s[0] == pytest.approx(
        8 * 1e-3 + t.first_forward_s + 5e-4 + _cast(c, lay))


# ---- round 3: CPU dispatch (host bound), pipelining's kept outputs, DDP no_sync grads ----------
def _cpu_tables(layer_cpu=(3e-3, 5e-3), end_cpu=(1e-4, 2e-4), fixed=(0.0, 0.0)):
    """GPU-busy rows with CPU dispatch times: the layer's CPU (8 ms) exceeds its GPU (3 ms)."""
    lay = _layer(1, 1e-3, 2e-3, 100e6, 50e6, forward_cpu_s=layer_cpu[0],
                 backward_cpu_s=layer_cpu[1], forward_cpu_fixed_s=fixed[0],
                 backward_cpu_fixed_s=fixed[1])
    ends = tuple(replace(_end(p, 1, 1e-4, 2e-4, 1e6, 0.0), forward_cpu_s=end_cpu[0],
                         backward_cpu_s=end_cpu[1]) for p in ("embedding", "output"))
    return MeasuredTables((lay,), ends)


def test_cpu_fields_interpolate_and_are_optional():
    t = _cpu_tables()
    r = t.layer(MODEL, seq_len=1024, tp=1, sequence_parallel=False, recompute="none",
                micro_batch=1)
    assert r.cpu_measured and (r.forward_cpu_s, r.backward_cpu_s) == (3e-3, 5e-3)
    assert not TABLES.layer(MODEL, seq_len=1024, tp=1, sequence_parallel=False,
                            recompute="none", micro_batch=1).cpu_measured


@pytest.mark.usefixtures("no_grad_accumulation")
def test_host_bound_sets_the_step_when_the_cpu_is_slower():
    c = _cluster(_cpu_tables())
    est = estimate(MODEL, c, JOB, Layout(micro_batch=1))
    m = JOB.global_batch
    cpu = m * (8 * 8e-3 + 3e-4 + 3e-4)           # layers + embedding + output, per micro-batch
    gpu = m * (8 * 3e-3 + 3e-4 + 3e-4 + _cast(c, Layout(micro_batch=1)))
    tail = est.time.optimizer_s + est.time.dp_comm_exposed_s
    assert est.step_time_s == pytest.approx(cpu + tail)
    assert est.time.host_wait_s == pytest.approx(cpu - gpu)
    assert est.time.total_s == pytest.approx(est.step_time_s)
    # a GPU-bound profile: CPU dispatch below the GPU time changes nothing
    fast = _cluster(_cpu_tables(layer_cpu=(1e-4, 1e-4), end_cpu=(1e-5, 1e-5)))
    e2 = estimate(MODEL, fast, JOB, Layout(micro_batch=1))
    assert e2.time.host_wait_s == 0.0
    assert e2.step_time_s == pytest.approx(m * gpu / m + e2.time.optimizer_s)
    # the host-bound estimate says how far it was trusted on GPUs; the GPU-bound one does not
    from meshplan.commands.format import format_estimate
    share = f"{est.time.host_wait_s / est.step_time_s:.0%} of the step"
    assert [c for c in est.caveats if c.startswith("host-bound")] == [
        c for c in est.caveats if share in c]
    assert len([c for c in est.caveats if c.startswith("host-bound")]) == 1
    assert "caution: host-bound: the GPUs wait" in format_estimate(est)
    assert not any(c.startswith("host-bound") for c in e2.caveats)


@pytest.mark.usefixtures("no_grad_accumulation")
def test_near_host_bound_caveat_marks_little_cpu_headroom():
    """GPU-bound with the CPU's dispatch at 80 % or more of the GPU's time: the step is the
    GPU's, but the estimate says the CPU has little headroom (HOST_NEAR_LOAD)."""
    from meshplan.commands.format import format_estimate
    from meshplan.costmodel.estimate import HOST_NEAR_LOAD
    m = JOB.global_batch
    gpu = m * (8 * 3e-3 + 3e-4 + 3e-4 + _cast(_cluster(TABLES), Layout(micro_batch=1)))
    near = estimate(MODEL, _cluster(_cpu_tables(layer_cpu=(1.2e-3, 1.5e-3))), JOB,
                    Layout(micro_batch=1))
    cpu = m * (8 * 2.7e-3 + 3e-4 + 3e-4)          # layers + embedding + output CPU
    assert near.time.host_wait_s == 0.0 and near.pipeline_s == pytest.approx(gpu)
    assert near.host_dispatch_s == pytest.approx(cpu)
    assert near.host_load == pytest.approx(cpu / gpu) and HOST_NEAR_LOAD <= near.host_load < 1
    assert [c for c in near.caveats if c.startswith("near host-bound")] == [
        c for c in near.caveats if f"{cpu / gpu:.0%} of the GPU's time" in c]
    assert len([c for c in near.caveats if c.startswith("near host-bound")]) == 1
    text = format_estimate(near)
    assert f"CPU dispatch: {cpu:.4f} s per step, {cpu / gpu:.0%}" in text
    assert near.to_dict()["host_load"] == pytest.approx(cpu / gpu)
    # plenty of headroom: no caveat; host-bound: the host-bound caveat instead, not both
    far = estimate(MODEL, _cluster(_cpu_tables(layer_cpu=(1e-4, 1e-4))), JOB,
                   Layout(micro_batch=1))
    assert far.host_load < HOST_NEAR_LOAD
    assert not any("host-bound" in c for c in far.caveats)
    bound = estimate(MODEL, _cluster(_cpu_tables()), JOB, Layout(micro_batch=1))
    assert bound.host_load > 1
    assert [c[:10] for c in bound.caveats if "host-bound" in c] == ["host-bound"]
    # no measured CPU times (datasheet profile): no load, no line
    plain = estimate(MODEL, _cluster(TABLES), JOB, Layout(micro_batch=1))
    assert plain.host_dispatch_s == 0.0 and plain.host_load == 0.0
    assert "CPU dispatch:" not in format_estimate(plain)


def test_per_call_cpu_is_paid_once_per_chunk_and_micro_batch():
    """A row's per-call CPU part is charged once per forward/backward call of a stage's
    chunk, not per layer: a deep stage pays it once, interleaving pays it per chunk."""
    from meshplan.costmodel.estimate import layer_tables
    c = _cluster(_cpu_tables(layer_cpu=(2e-3, 4e-3), fixed=(1e-3, 3e-3)))
    m = JOB.global_batch
    est = estimate(MODEL, c, JOB, Layout(micro_batch=1))
    cpu = m * (8 * 6e-3 + 4e-3 + 3e-4 + 3e-4)     # 8 layers + one call + embedding + output
    assert est.step_time_s == pytest.approx(cpu + est.time.optimizer_s
                                            + est.time.dp_comm_exposed_s)
    c = replace(c, gpu=replace(c.gpu, pipeline_action_s=1e-4))
    for v in (1, 2):
        lay = Layout(pp=2, micro_batch=1, vpp=v,
                     schedule="1f1b" if v == 1 else "interleaved-1f1b")
        t = layer_tables(MODEL, c, JOB, lay)
        assert t.rank_cpu_s(0, 4) == pytest.approx(
            m * (4 * 6e-3 + v * 4e-3 + 3e-4 + 2 * v * 1e-4))


def test_host_bound_adds_the_last_backward_path_across_stages():
    from meshplan.costmodel.estimate import layer_tables
    c = replace(_cluster(_cpu_tables()), gpu=replace(_cluster(_cpu_tables()).gpu,
                                                     pipeline_action_s=1e-4))
    lay = Layout(pp=2, micro_batch=1)
    t = layer_tables(MODEL, c, JOB, lay)
    m = JOB.global_batch
    cpu0 = m * (4 * 8e-3 + 3e-4 + 2 * 1e-4)       # rank 0: 4 layers, embedding, 2 actions
    cpu1 = m * (4 * 8e-3 + 3e-4 + 2 * 1e-4)       # rank 1: 4 layers, output, 2 actions
    _, b, _ = t.stage_times((4, 4))
    # rank 1 finishes dispatching, then rank 0 still runs the last micro-batch's backward
    assert t.host_bound_s((4, 4)) == pytest.approx(max(cpu0, cpu1 + b[0] + t.p2p_s))
    assert t.overhead_s == 0.0                     # the action cost is CPU time only
    assert t.step_time_s((4, 4)) == pytest.approx(estimate(MODEL, c, JOB, lay).step_time_s)


def test_zero_bubble_trailing_weight_passes_do_not_lengthen_the_backward_path():
    """Zero-bubble rank r dispatches r + 1 deferred W after its last B; the last
    micro-batch's B chain towards rank 0 runs while it does, and ends with rank 0's W."""
    from meshplan.costmodel.estimate import layer_tables
    base = _cpu_tables()
    split = replace(base.layers[0], backward_input_s=1.5e-3, backward_weight_s=1e-3,
                    backward_input_cpu_s=3e-3, backward_weight_cpu_s=2.5e-3)
    c = _cluster(MeasuredTables((split,), base.ends))
    lay = Layout(pp=2, micro_batch=1, schedule="zero-bubble")
    t = layer_tables(MODEL, c, JOB, lay)
    assert t.cpu_wgrad_layer_s == pytest.approx(2.5e-3)
    _, b, w = t.stage_times((4, 4))
    cpu0, cpu1 = t.rank_cpu_s(0, 4), t.rank_cpu_s(1, 4)
    chain = cpu1 - 2 * 4 * 2.5e-3 + (b[0] - w[0]) + t.p2p_s + w[0]
    assert t.host_bound_s((4, 4)) == pytest.approx(max(cpu0, cpu1, chain))
    # before: the trailing W counted on the path too (larger)
    assert t.host_bound_s((4, 4)) < cpu1 + (b[0] - w[0]) + t.p2p_s
    # 1F1B on the same rows: no split, the whole backward is the path
    one = layer_tables(MODEL, c, JOB, replace(lay, schedule="1f1b"))
    assert one.cpu_wgrad_layer_s == 0.0


def test_pipelined_last_stage_keeps_every_output_runtime_torch():
    from meshplan.costmodel.estimate import layer_tables
    c = _cluster(TABLES)
    lay = Layout(pp=2, micro_batch=1)
    t = layer_tables(MODEL, c, JOB, lay)
    chunk = 1 * JOB.seq_len * MODEL.vocab_size * 2          # bf16 logits of one micro-batch
    assert t.last_chunks_bytes == pytest.approx(JOB.global_batch * chunk)
    assert t.last_merge_bytes == pytest.approx(2 * JOB.global_batch * chunk)
    # the megatron runtime keeps nothing of the kind
    mega = layer_tables(MODEL, c, Job(global_batch=16, seq_len=1024), lay)
    assert mega.last_chunks_bytes == 0.0 == mega.last_merge_bytes
    # the last rank's peak is the larger of mid-step (+ chunks) and the end-of-step merge
    est = estimate(MODEL, c, JOB, lay)
    assert est.memory[1].total_bytes == pytest.approx(t.rank_memory_bytes(1, 4))
    assert t.rank_memory_bytes(1, 4) >= 4 * t.layer_state_bytes + t.last_merge_bytes


def test_end_of_step_merge_holds_receive_buffers_and_no_autocast_copies_under_full_recompute():
    """Round 15 (holdout13 v02/v03/v10/v11): at the merge the last rank still holds its
    receive buffers (kept for the run), and under full recompute no 16-bit weight copies
    (each recompute left autocast and cleared its cache)."""
    from meshplan.costmodel.estimate import (stage_io_bytes, compute_copy_bytes,
                                             layer_tables)
    c = _cluster(TABLES)
    lay = Layout(pp=2, micro_batch=1, recompute="selective")
    sel = layer_tables(MODEL, c, JOB, lay)
    m = sel.num_microbatches
    recv = m * stage_io_bytes(JOB, lay, MODEL.hidden_size)     # last stage: receives only
    assert sel.end_recv_bytes == pytest.approx(recv) and recv > 0
    assert sel.end_of_step_bytes(4) == pytest.approx(sel.last_merge_bytes + recv)
    full = layer_tables(MODEL, c, JOB, lay.replace(recompute="full"))
    kw = dict(job=JOB, zero=0, dp=1, tp=1, pp=2)
    per_layer = compute_copy_bytes(MODEL, layers=1, first=False, last=False, **kw)
    head = compute_copy_bytes(MODEL, layers=0, first=False, last=True, **kw)
    assert per_layer > 0 and head > 0
    assert full.end_of_step_bytes(4) == pytest.approx(
        full.last_merge_bytes + recv - 4 * per_layer - head)
    # the peak is still the larger of mid-step and end of step
    assert full.rank_memory_bytes(1, 4) >= (4 * full.layer_state_bytes
                                            + full.last_states_bytes + full.end_of_step_bytes(4))
    # no merge, no end-of-step term (megatron's runtime)
    mega = layer_tables(MODEL, c, Job(global_batch=16, seq_len=1024), lay)
    assert mega.end_of_step_bytes(4) == 0.0


def test_ddp_micro_batches_hold_a_second_gradient_copy():
    c = _cluster(TABLES)
    fp32 = stage_params(MODEL, 8, 1, first=True, last=True, pp=1) * 4
    one = estimate(MODEL, c, JOB, Layout(dp=4, micro_batch=4))           # m = 1: no no_sync
    many = estimate(MODEL, c, JOB, Layout(dp=4, micro_batch=1))          # m = 4
    assert many.memory[0].grads_bytes == pytest.approx(one.memory[0].grads_bytes + fp32)
    # m = 1: DDP's buckets only (the executor's settle after the first step frees the
    # first-step bucket on every rank: executor.run.settle_after_first_step)
    assert one.memory[0].grads_bytes == pytest.approx(fp32)
    tp2 = estimate(MODEL, c, JOB, Layout(dp=2, tp=2, micro_batch=4))    # m = 2, tp 2
    fp32_tp2 = stage_params(MODEL, 8, 2, first=True, last=True, pp=1) * 4
    assert tp2.memory[0].grads_bytes == pytest.approx(2 * fp32_tp2)
    # FSDP (ZeRO-2) and pipelines reduce differently: one copy
    z2 = estimate(MODEL, c, JOB, Layout(dp=4, micro_batch=1, zero=2))
    params = stage_params(MODEL, 8, 1, first=True, last=True, pp=1)
    assert z2.memory[0].grads_bytes == pytest.approx(params * 4 / 4)


def test_fsdp2_under_a_pipeline_holds_unsharded_fp32_gradients():
    """torch.distributed.pipelining runs every backward with FSDP2's gradient sync off, so
    FSDP2 accumulates unsharded fp32 gradients (params × 4 bytes) until the step's
    reduce-scatter; without a pipeline it reduce-scatters per micro-batch (params × 4 / dp)."""
    from meshplan.costmodel.estimate import fsdp_accumulates_unsharded, layer_tables
    c = _cluster(TABLES)
    for zero in (2, 3):
        assert fsdp_accumulates_unsharded(JOB, zero, 2, 2)
        assert not fsdp_accumulates_unsharded(JOB, zero, 2, 1)    # no pipeline
        assert not fsdp_accumulates_unsharded(JOB, zero, 1, 2)    # no FSDP at dp 1
    assert not fsdp_accumulates_unsharded(JOB, 1, 2, 2)           # DDP's own copies
    assert not fsdp_accumulates_unsharded(Job(global_batch=16, seq_len=1024), 2, 2, 2)
    pipe = estimate(MODEL, c, JOB, Layout(dp=2, pp=2, micro_batch=2, zero=2))
    flat = estimate(MODEL, c, JOB, Layout(dp=2, micro_batch=2, zero=2))
    for st in pipe.memory:
        params = stage_params(MODEL, 4, 1, first=st.stage == 0, last=st.stage == 1, pp=2)
        assert st.grads_bytes == pytest.approx(params * 4)
    params = stage_params(MODEL, 8, 1, first=True, last=True, pp=1)
    assert flat.memory[0].grads_bytes == pytest.approx(params * 4 / 2)
    # the per-layer state the stage-layer search uses carries the same gradients
    t = layer_tables(MODEL, c, JOB, Layout(dp=2, pp=2, micro_batch=2, zero=2))
    layer = stage_params(MODEL, 1, 1, first=False, last=False, pp=2)
    t0 = layer_tables(MODEL, c, JOB, Layout(dp=2, pp=2, micro_batch=2, zero=1))
    # ZeRO-1 holds fp32 grads (4) + weights (4) + 16-bit copy; ZeRO-2 shards the weights
    assert t.layer_state_bytes - t0.layer_state_bytes == pytest.approx(-layer * 4 / 2)


def test_zero2_under_a_pipeline_reduces_once_per_step():
    """torch.distributed.pipelining turns FSDP2's gradient sync off for all but the last
    micro-batch: no per-micro-batch FSDP rows, one gather + one reduce-scatter per step."""
    from meshplan.costmodel.estimate import fsdp_per_microbatch, layer_tables
    assert fsdp_per_microbatch(JOB, 2) and not fsdp_per_microbatch(JOB, 2, pp=2)
    assert fsdp_per_microbatch(JOB, 3, pp=2)
    c = _cluster(TABLES)
    piped = layer_tables(MODEL, c, JOB, Layout(dp=2, pp=2, micro_batch=1, zero=2))
    plain = layer_tables(MODEL, c, JOB, Layout(dp=2, pp=2, micro_batch=1, zero=0))
    # the plain row, no FSDP (nor autocast's weight casts, which ZeRO-0 adds)
    assert piped.layer_forward_s == pytest.approx(
        plain.layer_forward_s - _cast(c, Layout(dp=2, pp=2, micro_batch=1), layers=1,
                                      head=False))
    st = piped.rank_state(0, 4)
    assert st.grad_reduce_s > 0 and st.param_gather_s > 0          # once per step
    one = layer_tables(MODEL, c, JOB, Layout(dp=2, micro_batch=1, zero=2))
    assert one.layer_forward_s == pytest.approx(1.5e-3)            # pp = 1: the FSDP row


def test_pipelined_zero2_runs_at_fsdp2_compute_alone_where_measured():
    """A pipeline's ZeRO-2 stage gathers once per step, so its layers cost FSDP2's compute
    without communication (bf16, no autocast): the profile's 1-rank ZeRO-2 row, with its
    CPU and, zero-bubble, its own split backward (the depth growth stays the plain row's)."""
    from meshplan.costmodel.estimate import layer_tables
    split = dict(backward_input_s=1.5e-3, backward_weight_s=4e-3, split_layers=2,
                 backward_weight_depth_s=2.5e-4, forward_cpu_s=1e-3, backward_cpu_s=2e-3,
                 backward_input_cpu_s=2e-3, backward_weight_cpu_s=3e-3)
    plain = _layer(1, 1e-3, 2e-3, 1e6, 0.0, **split)
    fsdp2 = _layer(1, 1.5e-3, 3.5e-3, 1e6, 0.0, zero=2, dp=2)
    alone = _layer(1, 0.9e-3, 1.8e-3, 1e6, 0.0, zero=2, dp=1, backward_input_s=1.2e-3,
                   backward_weight_s=3e-3, split_layers=2, forward_cpu_s=0.5e-3,
                   backward_cpu_s=1e-3, backward_input_cpu_s=1e-3, backward_weight_cpu_s=2e-3)
    ends = tuple(replace(_end(part, 1, 1e-4, 2e-4, 1e6, 0.0), forward_cpu_s=1e-4,
                         backward_cpu_s=2e-4) for part in ("embedding", "output"))
    c = _cluster(MeasuredTables((plain, fsdp2, alone), ends))
    without = _cluster(MeasuredTables((plain, fsdp2), ends))
    lay = Layout(dp=2, pp=2, micro_batch=1, zero=2)
    t = layer_tables(MODEL, c, JOB, lay)
    assert (t.layer_forward_s, t.layer_backward_s) == pytest.approx((0.9e-3, 1.8e-3))
    assert t.cpu_layer_s == pytest.approx(0.5e-3 + 1e-3)
    old = layer_tables(MODEL, without, JOB, lay)      # older profiles: the plain row
    assert (old.layer_forward_s, old.layer_backward_s) == pytest.approx((1e-3, 2e-3))
    assert estimate(MODEL, c, JOB, lay).step_time_s < estimate(MODEL, without, JOB,
                                                               lay).step_time_s
    # zero-bubble: B and W from the 1-rank row, W growing with the depth as the plain row's
    zb = layer_tables(MODEL, c, JOB, replace(lay, schedule="zero-bubble"))
    assert zb.layer_wgrad_s == pytest.approx(3e-3)            # GPU-busy: no depth growth
    assert zb.layer_backward_s == pytest.approx(1.2e-3 + 3e-3)
    assert zb.cpu_wgrad_layer_s == pytest.approx(2e-3 + 2 * 2.5e-4)   # 4 layers: 2 extra
    # ... and where the 1-rank row has no split: the plain split scaled by the backwards'
    # ratio (1.8 / 2 ms)
    nosplit = replace(alone, backward_input_s=0.0, backward_weight_s=0.0, split_layers=0)
    zb2 = layer_tables(MODEL, _cluster(MeasuredTables((plain, fsdp2, nosplit), ends)), JOB,
                       replace(lay, schedule="zero-bubble"))
    assert zb2.layer_wgrad_s == pytest.approx(4e-3 * 0.9)
    # ZeRO-3 regathers per micro-batch (its FSDP rows), ZeRO-2 without a pipeline too
    for other in (replace(lay, zero=3), replace(lay, pp=1)):
        assert layer_tables(MODEL, c, JOB, other).layer_forward_s != pytest.approx(0.9e-3)


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_cpsat_host_bound_matches_the_cost_model(schedule, solve_fixed_partition):
    """The CP-SAT expression of max(pipeline, host bound) equals LayerTables' on fixed
    partitions (free 1F1B/GPipe partitions are what the solver optimizes)."""
    from meshplan.planner.space import Config
    from meshplan.planner.tables import build_tables
    c = replace(_cluster(_cpu_tables()), gpu=replace(_cluster(_cpu_tables()).gpu,
                                                     pipeline_action_s=2e-4))
    cfg = Config(dp=1, pp=2, tp=1, micro_batch=1, schedule=schedule, vpp=1,
                 recompute="none", zero=0, sequence_parallel=False)
    t = build_tables(MODEL, c, JOB, cfg)
    assert t.cpu_known
    for part in ((4, 4), (2, 6), (7, 1)):
        want = max(t.pipeline_s(part), t.host_bound_s(part))
        assert solve_fixed_partition(t, part, host=True) == pytest.approx(want, rel=1e-6), part


def test_zero_bubble_ranks_hold_activations_until_their_weight_pass():
    from meshplan.costmodel.estimate import layer_tables, zero_bubble_pending_w
    from meshplan.costmodel.memory import split_backward_kept_grad_bytes
    lay = Layout(pp=4, micro_batch=1, schedule="zero-bubble")
    assert zero_bubble_pending_w(JOB, lay, 16) == (0.0, 1.0, 2.0, 3.0)
    assert zero_bubble_pending_w(Job(global_batch=16, seq_len=1024), lay, 16) == ()
    assert zero_bubble_pending_w(JOB, Layout(pp=4, micro_batch=1), 16) == ()
    # full recomputation: a middle rank's peak is in its first W, after r + 1 I passes
    full = lay.replace(recompute="full")
    assert zero_bubble_pending_w(JOB, full, 16) == (0.0, 2.0, 3.0, 3.0)
    assert zero_bubble_pending_w(JOB, full, 2) == (0.0, 2.0, 2.0, 2.0)
    c = _cluster(TABLES)
    t = layer_tables(MODEL, c, JOB, lay)
    one = layer_tables(MODEL, c, JOB, Layout(pp=4, micro_batch=1, schedule="1f1b"))
    # a pending W keeps its output gradients (beside its activations, counted in flight)
    kept = split_backward_kept_grad_bytes(MODEL, JOB, 1, 1, False, fp32_norm_output=True)
    assert 0 < kept < 100e6
    assert t.wgrad_pending_bytes == pytest.approx(kept)
    # rank 3 of 1F1B holds 1 micro-batch; of zero-bubble 4 in flight, 3 awaiting W and,
    # at the end of an I pass, that one's gradients too
    assert one.inflight[3] == 1 and t.inflight[3] == 4
    act, _, _ = t.rank_variable_bytes(3, 2)
    assert act == pytest.approx(2 * (4 * 100e6 + 4 * kept))     # the recompute="none" row
    # rank 0's I has no input gradient to compute: nothing kept beyond its activations
    act0, _, _ = t.rank_variable_bytes(0, 2)
    assert act0 == pytest.approx(2 * 4 * 100e6 + 4 * t.embedding_act_bytes)
    est = estimate(MODEL, c, JOB, lay)
    assert est.memory_peak_bytes == pytest.approx(t.peak_memory_bytes((2, 2, 2, 2)))


def test_zero_bubble_last_rank_peaks_at_the_end_or_the_start_of_an_input_pass():
    """Without full recomputation the last rank's peak is the end of an I pass (every
    layer's kept gradients and the logits' gradient) or, on a shallow stage, its start (the
    output layer's working memory): the larger, and the stage's breakdown adds up to it."""
    from meshplan.costmodel.estimate import layer_tables
    c = _cluster(TABLES)
    lay = Layout(pp=2, micro_batch=1, schedule="zero-bubble")
    t = layer_tables(MODEL, c, JOB, lay)
    kept, grad = t.wgrad_pending_bytes, t.logits_grad_bytes
    assert grad == pytest.approx(1024 * 32000 * 2)         # one micro-batch's 16-bit logits
    working = 300e6 - 50e6                     # output row's peak beyond a layer backward's
    assert t.output_split_extra_bytes(1) == pytest.approx(working - kept - grad)
    assert t.output_split_extra_bytes(8) == 0.0
    # deep enough, each layer adds its states, 2 micro-batches' activations and 2 kept sets
    step = t.rank_memory_bytes(1, 8) - t.rank_memory_bytes(1, 7)
    assert step == pytest.approx(t.layer_state_bytes + 2 * 100e6 + 2 * kept)
    est = estimate(MODEL, c, JOB, lay.replace(stage_layers=(4, 4)))
    assert est.memory[1].total_bytes == pytest.approx(t.rank_memory_bytes(1, 4))
    plain = layer_tables(MODEL, c, JOB, lay.replace(schedule="1f1b"))
    assert plain.logits_grad_bytes == 0.0 and plain.output_split_extra_bytes(1) == 0.0


def test_zero_bubble_with_full_recompute_pays_the_weight_pass_transient():
    """Ranks r > 0 keep 0.4 non-recomputed sets per pending W and 4 more while one runs
    (measured: the profile's zb_full_pending_sets); rank 0 has no deferred W and pays neither."""
    from meshplan.costmodel.estimate import layer_tables
    c = _cluster(TABLES)
    lay = Layout(pp=4, micro_batch=1, schedule="zero-bubble", recompute="full")
    t = layer_tables(MODEL, c, JOB, lay)
    none = layer_tables(MODEL, c, JOB, replace(lay, recompute="none"))
    full_set = none.parts.full_act_bytes                   # one non-recomputed layer set
    assert t.wgrad_pending_bytes == pytest.approx(ZB_FULL_PENDING_SETS * full_set)
    assert t.wgrad_transient_bytes == pytest.approx(ZB_FULL_W_TRANSIENT_SETS * full_set)
    assert none.wgrad_transient_bytes == 0.0
    ckpt = t.layer_activation_bytes
    act0, _, _ = t.rank_variable_bytes(0, 2)
    act3, _, _ = t.rank_variable_bytes(3, 2)
    assert act0 == pytest.approx(2 * t.inflight[0] * ckpt
                                 + t.inflight[0] * t.embedding_act_bytes)
    assert act3 == pytest.approx(2 * (t.inflight[3] * ckpt + 3 * ZB_FULL_PENDING_SETS * full_set
                                      + ZB_FULL_W_TRANSIENT_SETS * full_set))


def test_fsdp_layouts_take_their_activation_bytes_from_fsdp_rows():
    """FSDP2 runs bf16 without autocast, which keeps fp32 copies under ZeRO-0/1: a layout
    with FSDP rows of its (zero, dp) uses their activation bytes, others the plain rows'."""
    from meshplan.costmodel.estimate import layer_tables
    tables = MeasuredTables(
        (_layer(1, 1e-3, 2e-3, 100e6, 50e6), _layer(2, 1.8e-3, 3.8e-3, 200e6, 90e6),
         _layer(1, 1.5e-3, 3.5e-3, 80e6, 60e6, zero=3, dp=2),
         _layer(2, 2.8e-3, 6.5e-3, 160e6, 100e6, zero=3, dp=2)),
        (_end("embedding", 1, 1e-4, 2e-4, 1e6, 0.0), _end("output", 1, 5e-4, 9e-4, 400e6, 300e6)))
    c = _cluster(tables)

    def act(**kw):
        return layer_tables(MODEL, c, JOB, Layout(micro_batch=2, **kw)).layer_activation_bytes
    assert act(dp=2, zero=3) == pytest.approx(160e6)
    assert act(dp=2, zero=1) == pytest.approx(200e6)              # DDP: autocast, plain row
    # no FSDP row of dp 4: the plain row without autocast's fp32 copies of the norms' inputs
    # (torch_memory.fsdp_plain_row_kept_bytes)
    from meshplan.costmodel.torch_activations import torch_layer_activations
    kw = dict(model=MODEL, job=JOB, micro_batch=2, tp=1, sequence_parallel=False)
    norms = (torch_layer_activations(**kw, autocast=False).stored("none")
             - torch_layer_activations(**kw).stored("none"))
    assert norms < 0
    assert act(dp=4, zero=3) == pytest.approx(200e6 + norms)
    mega = Job(global_batch=JOB.global_batch, seq_len=1024)       # runtime megatron
    assert layer_tables(MODEL, c, mega, Layout(micro_batch=2, dp=2, zero=3)
                        ).layer_activation_bytes == pytest.approx(200e6)


def test_fsdp_over_tensor_parallel_layers_is_composed_from_measured_rows():
    """Calibration times FSDP2 on tp = 1 only. FSDP2 over dp of tp = 2 layers (holdout7 p02:
    without it the model had no CPU times and predicted a CPU-bound step 22.8 % too fast)
    takes the plain tp = 2 row plus FSDP2's measured CPU increment at tp = 1, and scales the
    activation bytes by the tp = 1 FSDP / plain ratio."""
    from meshplan.costmodel.estimate import layer_tables
    cpu = dict(forward_cpu_s=1e-3, backward_cpu_s=2e-3, backward_cpu_fixed_s=4e-4)
    tables = MeasuredTables(
        (_layer(1, 1e-3, 2e-3, 100e6, 50e6, **cpu),
         _layer(1, 1.5e-3, 3.5e-3, 80e6, 60e6, zero=2, dp=2, forward_cpu_s=1.8e-3,
                backward_cpu_s=2.5e-3, backward_cpu_fixed_s=6e-4),
         _layer(1, 0.6e-3, 1.2e-3, 60e6, 30e6, tp=2, forward_cpu_s=1.5e-3,
                backward_cpu_s=2.4e-3, backward_cpu_fixed_s=5e-4)),
        tuple(replace(_end(p, 1, 1e-4, 2e-4, 1e6, 0.0), forward_cpu_s=1e-4, backward_cpu_s=2e-4,
                      tp=tp) for p in ("embedding", "output") for tp in (1, 2)))
    kw = dict(seq_len=1024, sequence_parallel=False, recompute="none", micro_batch=1, zero=2,
              dp=2)
    row, composed = tables.fsdp_layer(MODEL, tp=2, **kw)
    assert composed
    assert (row.forward_cpu_s, row.backward_cpu_s) == pytest.approx((2.3e-3, 2.9e-3))
    assert row.backward_cpu_fixed_s == pytest.approx(7e-4)
    assert row.activation_bytes == pytest.approx(60e6 * 0.8)
    assert (row.forward_s, row.backward_s) == (0.6e-3, 1.2e-3)    # the plain tp row's GPU
    direct, composed1 = tables.fsdp_layer(MODEL, tp=1, **kw)
    assert not composed1 and direct.forward_cpu_s == pytest.approx(1.8e-3)
    assert tables.fsdp_layer(MODEL, tp=2, **{**kw, "dp": 4}) == (None, False)  # no tp1 dp4 row
    t = layer_tables(MODEL, _cluster(tables), JOB, Layout(dp=2, tp=2, micro_batch=1, zero=2))
    assert t.cpu_known and t.cpu_layer_s == pytest.approx(5.2e-3)
    assert t.layer_activation_bytes == pytest.approx(48e6)
    # the gather/reduce stays analytical (a composed row has no FSDP2 GPU timing)
    assert t.layer_forward_s > 0.6e-3
    # and the estimate says that it rests on a composition measured to be optimistic
    from meshplan.commands.format import format_estimate
    est = estimate(MODEL, _cluster(tables), JOB, Layout(dp=2, tp=2, micro_batch=1, zero=2))
    assert [c for c in est.caveats if "composed" in c] == [FSDP_OVER_TP_CAVEAT]
    assert est.to_dict()["caveats"] == list(est.caveats)
    assert "caution: ZeRO-2/3 over tensor-parallel layers" in format_estimate(est)
    # (a profile that carries the old executor's per-step term)
    old_exec = _cluster(tables)
    old_exec = replace(old_exec, gpu=replace(old_exec.gpu, corrections=replace(
        old_exec.gpu.corrections, fsdp2_dp_only_step_s=FSDP2_DP_ONLY_STEP_S)))
    dp_only = estimate(MODEL, old_exec, JOB, Layout(dp=2, micro_batch=1, zero=2))
    assert FSDP_OVER_TP_CAVEAT not in dp_only.caveats
    # FSDP2 over dp alone carries the measured under-prediction; over tp, piped or
    # ZeRO-0/1 it does not
    assert FSDP_DP_ONLY_CAVEAT in dp_only.caveats
    assert FSDP_DP_ONLY_CAVEAT not in est.caveats
    for lay in (Layout(dp=2, micro_batch=1, zero=1),
                Layout(dp=2, pp=2, micro_batch=1, zero=2, schedule="1f1b")):
        assert FSDP_DP_ONLY_CAVEAT not in estimate(MODEL, old_exec, JOB, lay).caveats
    # ... and its measured per-step GPU time (FSDP2_DP_ONLY_STEP_S), on a line of its own,
    # in the planner's tables as in the estimate
    from meshplan.costmodel.estimate import layer_tables
    assert dp_only.time.fsdp_step_s == FSDP2_DP_ONLY_STEP_S > 0
    assert dp_only.time.total_s == pytest.approx(dp_only.step_time_s)
    assert dp_only.time.bubble_s == pytest.approx(0.0, abs=1e-12)
    tables1 = layer_tables(MODEL, old_exec, JOB, Layout(dp=2, micro_batch=1, zero=2))
    assert tables1.step_time_s((MODEL.num_layers,)) == pytest.approx(dp_only.step_time_s)
    assert "FSDP2 per-step time" in format_estimate(dp_only)
    for lay in (Layout(dp=2, micro_batch=1, zero=1), Layout(dp=2, tp=2, micro_batch=1, zero=2),
                Layout(dp=2, pp=2, micro_batch=1, zero=2, schedule="1f1b")):
        assert estimate(MODEL, old_exec, JOB, lay).time.fsdp_step_s == 0.0
    # zero-bubble over FSDP2 carries its measured spread; at ZeRO-1, 1F1B or on Megatron not
    zb = estimate(MODEL, _cluster(tables), JOB,
                  Layout(dp=2, pp=2, micro_batch=1, zero=2, schedule="zero-bubble"))
    assert ZB_FSDP2_CAVEAT in zb.caveats
    mega = Job(global_batch=JOB.global_batch, seq_len=JOB.seq_len)
    for job, lay in ((JOB, Layout(dp=2, pp=2, micro_batch=1, zero=1, schedule="zero-bubble")),
                     (JOB, Layout(dp=2, pp=2, micro_batch=1, zero=2, schedule="1f1b")),
                     (mega, Layout(dp=2, pp=2, micro_batch=1, zero=2, schedule="zero-bubble"))):
        assert ZB_FSDP2_CAVEAT not in estimate(MODEL, _cluster(tables), job, lay).caveats


def test_pipeline_stages_keep_their_output_per_micro_batch_in_flight():
    """torch keeps each stage's output until that micro-batch's backward (fwd_cache); the
    last stage's output is the logits, counted apart."""
    from meshplan.costmodel.estimate import layer_tables, pipeline_kept_outputs
    io = 1 * 1024 * MODEL.hidden_size * 2
    assert pipeline_kept_outputs(JOB, Layout(pp=2, micro_batch=1), MODEL.hidden_size,
                                 (2.0, 1.0)) == pytest.approx((2 * io, 0.0))
    v2 = Layout(pp=2, micro_batch=1, schedule="interleaved-1f1b", vpp=2)
    # rank 0 runs stages 0 and 2 (both send on), rank 1 stages 1 and 3 (3 is the last)
    assert pipeline_kept_outputs(JOB, v2, MODEL.hidden_size, (2.5, 1.5)) == \
        pytest.approx((2.5 * 2 * io, 1.5 * 1 * io))
    assert pipeline_kept_outputs(Job(global_batch=16, seq_len=1024), v2, MODEL.hidden_size,
                                 (2.5, 1.5)) == ()                 # runtime megatron
    assert pipeline_kept_outputs(JOB, Layout(micro_batch=1), MODEL.hidden_size, (1.0,)) == ()
    t = layer_tables(MODEL, _cluster(TABLES), JOB, Layout(pp=2, micro_batch=1))
    assert t.recv_buffers[0] == pytest.approx(JOB.global_batch * io + t.inflight[0] * io)


def test_pipeline_stages_keep_a_receive_buffer_per_micro_batch():
    from meshplan.costmodel.estimate import layer_tables, pipeline_recv_buffers
    io = 1 * 1024 * MODEL.hidden_size * 2                    # (mb, s, h) in bf16
    m = JOB.global_batch
    lay = Layout(pp=2, micro_batch=1)
    # rank 0 (first stage) receives gradients only; rank 1 (last) activations only, and
    # the in-flight ones are the first layer's inputs, already counted as activations
    assert pipeline_recv_buffers(JOB, lay, m, MODEL.hidden_size, (2.0, 1.0)) == \
        pytest.approx((m * io, (m - 1) * io))
    v2 = Layout(pp=2, micro_batch=1, schedule="interleaved-1f1b", vpp=2)
    # rank 0 holds stages 0 and 2: 3 buffers per micro-batch, 1 of them receiving
    assert pipeline_recv_buffers(JOB, v2, m, MODEL.hidden_size, (2.5, 1.5))[0] == \
        pytest.approx((3 * m - 2.5) * io)
    assert pipeline_recv_buffers(Job(global_batch=16, seq_len=1024), lay, m,
                                 MODEL.hidden_size, (2.0, 1.0)) == ()
    t = layer_tables(MODEL, _cluster(TABLES), JOB, lay)
    recv = t.const_bytes[1] - t.last_extra_bytes + t.output_overlap_bytes - t.buffer_bytes
    assert recv == pytest.approx((m - t.inflight[1]) * io)


def test_estimate_output_says_when_the_cpu_sets_the_step():
    from meshplan.commands.format import format_estimate
    slow = estimate(MODEL, _cluster(_cpu_tables()), JOB, Layout(micro_batch=1))
    assert "GPUs waiting for CPU dispatch" in format_estimate(slow)
    assert "the CPU's kernel dispatch sets this step" in format_estimate(slow)
    fast = estimate(MODEL, _cluster(TABLES), JOB, Layout(micro_batch=1))
    assert "kernel dispatch sets" not in format_estimate(fast)


def test_overlap_interference_charges_hidden_gradient_reduction():
    """DDP's all-reduce hides behind the last backward; the profile's overlap_interference
    is the part of it that still costs (0: only the last bucket is exposed, 1: all of it)."""
    c = Cluster.preset("dgx-h100", nodes=1, gpus_per_node=4)
    lay = Layout(dp=4, micro_batch=1)
    est = {k: estimate(MODEL, replace(c, gpu=replace(c.gpu, overlap_interference=k)), JOB, lay)
           for k in (0.0, 0.15, 1.0)}
    total = est[1.0].time.dp_comm_total_s
    assert est[1.0].time.dp_comm_exposed_s == pytest.approx(total)
    assert est[0.0].time.dp_comm_exposed_s < est[0.15].time.dp_comm_exposed_s < total
    assert est[1.0].step_time_s - est[0.0].step_time_s == pytest.approx(
        total - est[0.0].time.dp_comm_exposed_s)
    assert c.gpu.overlap_interference == 0.15           # datasheet profiles: the assumption


def test_gpipe_gradients_and_one_micro_batch_of_activations_never_coexist():
    """GPipe (and 1F1B on a rank that runs every forward first) under runtime "torch":
    gradients appear during the first backward, which frees one micro-batch's activations,
    so the peak is min(G, A1) below states + G + A(m)."""
    from meshplan.costmodel.estimate import layer_tables
    c = _cluster(TABLES)
    gp = layer_tables(MODEL, c, JOB, Layout(pp=2, micro_batch=1, schedule="gpipe"))
    g = gp.relief_layer_grad_bytes
    assert g == pytest.approx(model_state_bytes(stage_params(MODEL, 1, 1, first=False,
                                                             last=False, pp=2), JOB, 0, 1)[1])
    one_mb = 4 * gp.layer_activation_bytes + gp.embedding_act_bytes
    grads = 4 * g + gp.relief_first_grad_bytes
    assert gp.first_backward_relief_bytes(0, 4) == pytest.approx(min(grads, one_mb))
    assert min(grads, one_mb) > 0
    act, _, _ = gp.rank_variable_bytes(0, 4)
    assert act == pytest.approx(4 * gp.inflight[0] * gp.layer_activation_bytes
                                + gp.inflight[0] * gp.embedding_act_bytes - min(grads, one_mb))
    # the last rank's first backward also frees its micro-batch's output-layer/loss bytes
    last = gp.last_rank
    per_mb_logits = (gp.logits_bytes - gp.output_peak_bytes) / gp.inflight[last]
    assert per_mb_logits > 0
    last_grads = 4 * g + gp.relief_last_grad_bytes
    assert gp.first_backward_relief_bytes(last, 4) == pytest.approx(
        min(last_grads, 4 * gp.layer_activation_bytes + per_mb_logits))
    # with no layers only the output's share can be freed (before round 8: nothing)
    assert gp.first_backward_relief_bytes(last, 0) == pytest.approx(
        min(gp.relief_last_grad_bytes, per_mb_logits))
    assert gp.first_backward_relief_bytes(last, 0) > 0
    # 1F1B: only on a rank whose warm-up runs every forward first (m <= pp - rank)
    m = JOB.global_batch                                # micro-batch 1, dp 1
    assert m > 2
    assert layer_tables(MODEL, c, JOB, Layout(pp=2, micro_batch=1)
                        ).first_backward_relief_bytes(0, 4) == 0.0
    few = layer_tables(MODEL, c, JOB, Layout(pp=2, micro_batch=m // 2))   # m = 2
    assert few.first_backward_relief_bytes(0, 4) == pytest.approx(
        min(grads, 4 * few.layer_activation_bytes + few.embedding_act_bytes))
    assert few.first_backward_relief_bytes(0, 4) > 0
    assert few.first_backward_relief_bytes(1, 4) == 0.0
    gp_few = layer_tables(MODEL, c, JOB, Layout(pp=2, micro_batch=m // 2, schedule="gpipe"))
    assert gp_few.first_backward_relief_bytes(0, 4) > 0
    assert gp_few.first_backward_relief_bytes(1, 4) > 0
    # FSDP2 under the pipeline allocates its unsharded fp32 accumulators in the first
    # backward too: the same relief, with the unsharded gradient per layer
    z2 = layer_tables(MODEL, c, JOB, Layout(dp=2, micro_batch=1, zero=2, pp=2,
                                            schedule="gpipe"))
    assert z2.relief_layer_grad_bytes == pytest.approx(g)
    assert z2.first_backward_relief_bytes(0, 4) > 0
    mega = Job(global_batch=16, seq_len=1024)           # Megatron runtime: no relief
    assert layer_tables(MODEL, c, mega, Layout(pp=2, micro_batch=1, schedule="gpipe")
                        ).first_backward_relief_bytes(0, 4) == 0.0


def test_fsdp_without_a_pipeline_and_one_micro_batch_holds_no_gradients_at_its_peak():
    """pp 1, FSDP2 (ZeRO-2/3), one micro-batch per step: the sharded gradients appear only
    in the backward, layer by layer, as it frees the activations (round 17: holdout17's a12,
    Llama dp 4 ZeRO-3 mb 16, measured 19.89 GiB against 21.96 predicted with the gradient
    shards counted, 1.53 GiB of them). With more micro-batches the second one's peak has
    them; DDP keeps them in its persistent buckets."""
    from meshplan.costmodel.estimate import layer_tables
    c = _cluster(TABLES)
    one = Layout(dp=2, micro_batch=JOB.global_batch // 2, zero=3)            # m = 1
    t = layer_tables(MODEL, c, JOB, one)
    assert t.num_microbatches == 1
    g = t.relief_layer_grad_bytes
    assert g == pytest.approx(model_state_bytes(stage_params(MODEL, 1, 1, first=False,
                                                             last=False, pp=1), JOB, 3, 2)[1])
    n = MODEL.num_layers
    one_mb = (n * t.layer_activation_bytes + t.embedding_act_bytes
              + t.logits_bytes - t.output_peak_bytes)
    grads = n * g + t.relief_first_grad_bytes
    assert min(grads, one_mb) > 0
    assert t.first_backward_relief_bytes(0, n) == pytest.approx(min(grads, one_mb))
    assert t.rank_memory_bytes(0, n) == pytest.approx(
        replace(t, relief_events=()).rank_memory_bytes(0, n) - min(grads, one_mb))
    for lay in (Layout(dp=2, micro_batch=JOB.global_batch // 4, zero=3),       # m = 2
                Layout(dp=2, micro_batch=JOB.global_batch // 2, zero=0)):      # DDP
        assert layer_tables(MODEL, c, JOB, lay).first_backward_relief_bytes(0, n) == 0.0


def test_pipeline_ranks_compute_slower_per_p2p_operation():
    """Runtime "torch": each send/receive a rank runs per micro-batch slows its compute by
    TORCH_P2P_SLOWDOWN_PER_OP / √vpp (interleaving multiplies the operations and shortens
    the compute each one spins behind); other runtimes are unchanged."""
    from meshplan.costmodel.estimate import layer_tables, p2p_ops_per_microbatch
    assert p2p_ops_per_microbatch(1, 1) == (0,)
    assert p2p_ops_per_microbatch(4, 1) == (2, 4, 4, 2)
    assert p2p_ops_per_microbatch(2, 2) == (6, 6)
    assert p2p_ops_per_microbatch(4, 2) == (6, 8, 8, 6)
    assert p2p_ops_per_microbatch(4, 3) == (10, 12, 12, 10)
    c = _cluster(TABLES)
    lam = TORCH_P2P_SLOWDOWN_PER_OP
    for lay in (Layout(pp=4, micro_batch=1), Layout(pp=2, vpp=2, micro_batch=1,
                                                      schedule="interleaved-1f1b")):
        t = layer_tables(MODEL, c, JOB, lay)
        plain = replace(t, slowdown=())
        ops = p2p_ops_per_microbatch(lay.pp, lay.vpp)
        sl = (MODEL.num_layers // (lay.pp * lay.vpp),) * (lay.pp * lay.vpp)
        for got, base in zip(t.stage_times(sl), plain.stage_times(sl)):
            assert got == pytest.approx([x * (1 + lam * ops[i % lay.pp] / lay.vpp ** 0.5)
                                         for i, x in enumerate(base)])
        assert t.rank_pass_s(1, 2)[0] == pytest.approx(plain.rank_pass_s(1, 2)[0]
                                                       * (1 + lam * ops[1] / lay.vpp ** 0.5))
        est = estimate(MODEL, c, JOB, lay)          # the breakdown still adds up to the step
        assert est.time.total_s == pytest.approx(est.step_time_s)
        # ... with the slowdown on a line of its own: (k - 1) / k of the busiest rank's time
        per_rank = [sum(est.stage_forward_s[r::lay.pp]) + sum(est.stage_backward_s[r::lay.pp])
                    for r in range(lay.pp)]
        br = per_rank.index(max(per_rank))
        k = 1 + lam * ops[br] / lay.vpp ** 0.5
        assert est.time.pp_interference_s == pytest.approx(
            est.num_microbatches * per_rank[br] * (k - 1) / k)
    mega = Job(global_batch=JOB.global_batch, seq_len=1024)
    assert layer_tables(MODEL, c, mega, Layout(pp=4, micro_batch=1)).slowdown == ()
    assert estimate(MODEL, c, mega, Layout(pp=4, micro_batch=1)).time.pp_interference_s == 0
    assert layer_tables(MODEL, c, JOB, Layout(dp=4, micro_batch=1)).slowdown == ()


def test_p2p_slowdown_stops_at_the_largest_the_fit_saw():
    """Past pp 4 vpp 3's 12 operations (1 + 0.012 · 12 / √3) the slowdown stays there: pp 2
    vpp 6 and vpp 12 (22 and 46 operations) both get the cap, vpp 3 keeps its own value."""
    from meshplan.costmodel.estimate import stage_slowdown
    lam = TORCH_P2P_SLOWDOWN_PER_OP
    assert TORCH_P2P_SLOWDOWN_MAX == pytest.approx(lam * 12 / 3 ** 0.5)
    at = stage_slowdown(NUMBERS, JOB, Layout(pp=4, vpp=3, micro_batch=1, schedule="interleaved-1f1b"))
    assert max(at) == pytest.approx(1 + TORCH_P2P_SLOWDOWN_MAX)        # the fit's largest
    three = stage_slowdown(NUMBERS, JOB, Layout(pp=2, vpp=3, micro_batch=1, schedule="interleaved-1f1b"))
    assert three == pytest.approx((1 + lam * 10 / 3 ** 0.5,) * 6)
    for vpp in (6, 12):
        got = stage_slowdown(NUMBERS, JOB, Layout(pp=2, vpp=vpp, micro_batch=1,
                                         schedule="interleaved-1f1b"))
        assert len(got) == 2 * vpp
        assert got == pytest.approx((1 + TORCH_P2P_SLOWDOWN_MAX,) * (2 * vpp))


def test_zero_bubble_full_recompute_takes_measured_split_memory_from_the_profile():
    """A full-recompute row with the calibration's split-memory pair (per layer, scaled
    with the micro-batch) replaces ZB_FULL_PENDING_SETS / ZB_FULL_W_TRANSIENT_SETS."""
    from meshplan.costmodel.estimate import layer_tables
    full = [_layer(1, 1e-3, 3e-3, 5e6, 80e6, recompute="full", wgrad_pending_bytes=30e6,
                   wgrad_transient_bytes=250e6),
            _layer(2, 2e-3, 6e-3, 10e6, 160e6, recompute="full", wgrad_pending_bytes=60e6,
                   wgrad_transient_bytes=500e6)]
    c = _cluster(MeasuredTables((*TABLES.layers, *full), TABLES.ends))
    lay = Layout(pp=4, micro_batch=1, schedule="zero-bubble", recompute="full")
    t = layer_tables(MODEL, c, JOB, lay)
    assert (t.wgrad_pending_bytes, t.wgrad_transient_bytes) == (30e6, 250e6)
    t4 = layer_tables(MODEL, c, Job(global_batch=32, seq_len=1024, runtime="torch"),
                      replace(lay, micro_batch=4))       # extrapolated from mb 1 and 2
    assert t4.wgrad_transient_bytes == pytest.approx(1000e6)
    act3, _, _ = t.rank_variable_bytes(3, 2)
    assert act3 == pytest.approx(2 * (t.inflight[3] * t.layer_activation_bytes + 3 * 30e6
                                      + 250e6))
    # a 1F1B layout has no pending W: nothing added
    one = layer_tables(MODEL, c, JOB, replace(lay, schedule="1f1b"))
    assert one.wgrad_transient_bytes == 0.0


def test_zero_bubble_split_memory_per_layer_follows_the_stage_depth():
    """A row with the stage parts (measured.wgrad_bytes_at): per layer at the mean stage
    depth L is the measured value + c·(1/L − 1/measured-on); without them, the same at
    every depth; never below 0."""
    from meshplan.costmodel.estimate import layer_tables
    from meshplan.costmodel.measured import Interpolated, wgrad_bytes_at
    row = Interpolated(1e-3, 3e-3, 5e6, 80e6, wgrad_pending_bytes=30e6,
                       wgrad_transient_bytes=250e6, wgrad_memory_layers=6,
                       wgrad_pending_stage_bytes=12e6, wgrad_transient_stage_bytes=300e6)
    assert wgrad_bytes_at(row, 6) == (30e6, 250e6)
    assert wgrad_bytes_at(row, 2) == pytest.approx((30e6 + 12e6 / 3, 250e6 + 300e6 / 3))
    assert wgrad_bytes_at(row, 12) == pytest.approx((30e6 - 1e6, 250e6 - 25e6))
    assert wgrad_bytes_at(replace(row, wgrad_memory_layers=0), 2) == (30e6, 250e6)
    assert wgrad_bytes_at(replace(row, wgrad_transient_stage_bytes=-1e12), 2)[1] == 0.0
    base = _layer(1, 1e-3, 3e-3, 5e6, 80e6, recompute="full").__dict__
    for key, bad, words in (("wgrad_memory_layers", -6, "an integer >= 0"),
                            ("wgrad_memory_layers", 6.5, "an integer >= 0"),
                            ("wgrad_transient_stage_bytes", "x", "a number")):
        with pytest.raises(ProfileError, match=f"#1: {key} must be {words}, got"):
            tables_from_rows([{**base, key: bad}], [], "p.toml")
    tables_from_rows([{**base, **dict(wgrad_memory_layers=6, wgrad_pending_stage_bytes=-1e6,
                                      wgrad_transient_stage_bytes=3e8)}], [], "p.toml")
    kw = dict(wgrad_memory_layers=6, wgrad_pending_stage_bytes=12e6,
              wgrad_transient_stage_bytes=300e6)
    full = [_layer(1, 1e-3, 3e-3, 5e6, 80e6, recompute="full", wgrad_pending_bytes=30e6,
                   wgrad_transient_bytes=250e6, **kw),
            _layer(2, 2e-3, 6e-3, 10e6, 160e6, recompute="full", wgrad_pending_bytes=60e6,
                   wgrad_transient_bytes=500e6, **{k: 2 * v if k.endswith("bytes") else v
                                                  for k, v in kw.items()})]
    c = _cluster(MeasuredTables((*TABLES.layers, *full), TABLES.ends))
    for pp in (2, 4):
        t = layer_tables(MODEL, c, JOB, Layout(pp=pp, micro_batch=1, schedule="zero-bubble",
                                               recompute="full"))
        depth = MODEL.num_layers / pp
        assert (t.wgrad_pending_bytes, t.wgrad_transient_bytes) == pytest.approx(
            (30e6 + 12e6 * (1 / depth - 1 / 6), 250e6 + 300e6 * (1 / depth - 1 / 6)))


def test_the_estimate_takes_the_longer_of_the_order_and_the_slowed_closed_form():
    """Interleaved over pp ≥ 3 under torch's runtime (costmodel.torch_p2p): the order's
    waits are paid once per step (warm-up, cool-down), the per-operation slowdown per
    micro-batch, so the order binds at few micro-batches and the slowdown at many."""
    from meshplan.costmodel import torch_p2p
    from meshplan.costmodel.estimate import layer_tables
    from meshplan.spec import default_stage_layers
    c = _cluster(TABLES)
    lay = Layout(pp=4, vpp=2, micro_batch=2, schedule="interleaved-1f1b")
    stages = default_stage_layers(MODEL.num_layers, 8)
    few = Job(global_batch=16, seq_len=1024, runtime="torch")            # 8 micro-batches
    t = layer_tables(MODEL, c, few, lay)
    est = estimate(MODEL, c, few, lay)
    order = t.p2p_order_s(*t.stage_times(stages)[:2])
    assert est.pipeline_s == pytest.approx(order) == pytest.approx(t.pipeline_s(stages))
    # its waits are the bubble, the compute runs unslowed, the breakdown adds up
    assert est.time.pp_interference_s == 0.0 and est.time.bubble_s > 0
    assert est.time.total_s == pytest.approx(est.step_time_s)
    assert any(c.startswith("pipeline bubble: set by the order") for c in est.caveats)
    # at 32 micro-batches (8·pp) the replay would fall below the slowed closed form, and
    # past torch_p2p_order_max_microbatches_per_rank·pp it is not run: the closed form stands alone
    many = Job(global_batch=64, seq_len=1024, runtime="torch")           # 32 micro-batches
    t32 = layer_tables(MODEL, c, many, lay)
    e32 = estimate(MODEL, c, many, lay)
    f32, b32, _ = t32.stage_times(stages)
    k = t32.slowdown
    replay32 = torch_p2p.fifo_step_s(tuple(x / y for x, y in zip(f32, k)),
                                     tuple(x / y for x, y in zip(b32, k)), 32, 4, 2, t32.p2p_s)
    assert 0 < replay32 < e32.pipeline_s
    assert 32 > NUMBERS.torch_p2p_order_max_microbatches_per_rank * 4 and t32.p2p_order_s(f32, b32) == 0.0
    assert e32.time.pp_interference_s > 0
    assert e32.time.total_s == pytest.approx(e32.step_time_s)
    assert not any(c.startswith("pipeline bubble") for c in e32.caveats)
    # megatron's runtime keeps the closed form alone
    mega = layer_tables(MODEL, c, Job(global_batch=16, seq_len=1024), lay)
    assert mega.p2p_order_s(*mega.stage_times(stages)[:2]) == 0.0


def test_zero3_under_a_pipeline_keeps_gathered_weights_from_backward_to_forward():
    """torch's stage turns FSDP2's resharding after backward off: right after a backward a
    rank holds every layer's 16-bit weights and one micro-batch's activations less."""
    from dataclasses import replace

    from meshplan.costmodel.estimate import layer_tables
    c = _cluster(TABLES)
    lay = Layout(dp=2, pp=2, micro_batch=1, zero=3)
    t = layer_tables(MODEL, c, JOB, lay)
    w = stage_params(MODEL, 1, 1, first=False, last=False, pp=2) * 2      # bf16 per layer
    assert t.z3_resident_layer_bytes == pytest.approx(w)
    one_mb = 4 * t.layer_activation_bytes + t.embedding_act_bytes
    assert t.z3_resident_bytes(0, 4) == pytest.approx(max(0.0, 2 * w - one_mb))
    # where the activations are smaller than the weights, the peak gains the difference,
    # in the estimate's rows and in the planner's per-rank memory alike
    # (rank 1 is the last: no output working memory here, see below)
    lean = replace(t, layer_activation_bytes=0.0, embedding_act_bytes=0.0,
                   output_peak_bytes=0.0)
    assert lean.z3_resident_bytes(1, 4) == pytest.approx(2 * w)          # 4 layers − 2 gathered
    # the last rank peaks in its output's backward, before its layers gather their weights:
    # only what the output's working memory does not cover adds (round 15, v13)
    out = replace(lean, output_peak_bytes=w, recompute_buf_bytes=0.0)
    assert out.output_overlap_bytes == 0.0
    assert out.z3_resident_bytes(1, 4) == pytest.approx(w)
    assert out.z3_resident_bytes(0, 4) == pytest.approx(2 * w)           # not the last rank
    base = replace(lean, z3_resident_layer_bytes=0.0)
    assert lean.rank_memory_bytes(1, 4) - base.rank_memory_bytes(1, 4) == pytest.approx(2 * w)
    assert lean.rank_variable_bytes(1, 4)[2] - base.rank_variable_bytes(1, 4)[2] == \
        pytest.approx(2 * w)
    # not for ZeRO-2 (counted with the weights) or without a pipeline
    for other in (Layout(dp=2, pp=2, micro_batch=1, zero=2),
                  Layout(dp=4, micro_batch=1, zero=3)):
        assert layer_tables(MODEL, c, JOB, other).z3_resident_layer_bytes == 0.0


def test_zero3_gpipe_second_backward_holds_the_gathered_weights_and_every_gradient():
    """Round 23 (holdout23 f12): ScheduleGPipe also keeps FSDP2's weights gathered between
    backwards, and its second backward starts with every gradient allocated, so the
    first-backward relief R that lowered the counted peak is added back: W − A1 + R."""
    from meshplan.costmodel.estimate import layer_tables
    c = _cluster(TABLES)
    t = layer_tables(MODEL, c, JOB, Layout(dp=2, pp=2, micro_batch=1, zero=3,
                                           schedule="gpipe"))
    w = stage_params(MODEL, 1, 1, first=False, last=False, pp=2) * 2      # bf16 per layer
    assert t.z3_resident_layer_bytes == pytest.approx(w)
    relief = t.first_backward_relief_bytes(0, 4)
    one_mb = 4 * t.layer_activation_bytes + t.embedding_act_bytes
    assert relief > 0
    assert t.z3_resident_bytes(0, 4) == pytest.approx(max(0.0, 2 * w - one_mb + relief))
    # 1F1B with a steady state (m = 16 > pp) has no relief: W − A1 as before
    s = layer_tables(MODEL, c, JOB, Layout(dp=2, pp=2, micro_batch=1, zero=3))
    assert s.first_backward_relief_bytes(0, 4) == 0.0
    assert s.z3_resident_bytes(0, 4) == pytest.approx(max(0.0, 2 * w - one_mb))


def test_gpipe_full_recompute_peak_drops_the_weight_copies_the_first_backward_clears():
    """Round 21 (holdout21 e11): under autocast the first recompute of a backward clears the
    weight-cast cache; GPipe's peak inside a layer's backward then holds one layer's copies,
    not the stage's. Bounded by the peak before the clear and, on the last rank, by the
    output layer's backward (which runs before any recompute)."""
    from meshplan.costmodel.estimate import compute_copy_bytes, layer_tables
    # a measured full-recompute row: the backward's working memory (300 MB) well above the
    # recomputed activations (the plain row's 100 MB less the 10 MB input it keeps)
    tables = MeasuredTables(TABLES.layers + (
        _layer(1, 1e-3, 3e-3, 10e6, 300e6, recompute="full"),
        _layer(2, 1.8e-3, 5.6e-3, 20e6, 600e6, recompute="full")), TABLES.ends)
    c = _cluster(tables)
    lay = Layout(pp=2, micro_batch=1, schedule="gpipe", recompute="full")
    t = layer_tables(MODEL, c, JOB, lay)
    kw = dict(job=JOB, zero=0, dp=1, tp=1, pp=2)
    c1 = compute_copy_bytes(MODEL, layers=1, first=False, last=False, **kw)
    assert t.cache_layer_copy_bytes == pytest.approx(c1) and c1 > 0
    assert t.cache_last_copy_bytes == pytest.approx(
        compute_copy_bytes(MODEL, layers=0, first=False, last=True, **kw))
    r = t.recomputed_layer_bytes
    assert r == pytest.approx(max(0.0, t.parts.full_act_bytes - t.parts.activation_bytes))
    rb = t.recompute_buf_bytes
    want = max(0.0, min(rb - r, 4 * c1 - 2 * c1))
    assert t.cast_cache_relief_bytes(0, 4) == pytest.approx(want) and want > 0
    assert t.cast_cache_relief_bytes(0, 0) == 0.0
    # the last rank holds m >= 2 micro-batches: its peak is in its second backward, with
    # every gradient allocated and the copies gone, so both bounds rise by the gradients
    # its first backward had not allocated yet (round 24, b14 / d09 / x16)
    # (gradients larger than a micro-batch's activations, as on a Llama stage at mb 4)
    assert t.inflight[1] >= 2
    big = replace(t, relief_layer_grad_bytes=200e6)
    unallocated = (4 * big.relief_layer_grad_bytes + big.relief_last_grad_bytes
                   - big.first_backward_relief_bytes(1, 4))
    assert unallocated > 0
    copies = 4 * c1 + t.cache_last_copy_bytes
    assert big.cast_cache_relief_bytes(1, 4) == pytest.approx(max(0.0, min(
        rb - r + unallocated, copies - 2 * c1,
        max(0.0, rb - t.output_peak_bytes) + unallocated)))
    assert big.cast_cache_relief_bytes(1, 4) > t.cast_cache_relief_bytes(1, 4)
    # with one micro-batch there is no second backward: the output layer's backward, with
    # every copy alive, bounds the relief as before
    one = replace(big, inflight=(1.0, 1.0))
    assert one.cast_cache_relief_bytes(1, 4) <= max(0.0, rb - t.output_peak_bytes) + 1e-6
    # a step of one micro-batch: every rank's only backward is its first, so at the first
    # recompute (the "before" bound) none of the rank's gradients exists yet — the bound
    # rises by them on the first rank too (round 41's x18 rank 0 +8.1 -> +3.2 %, post hoc)
    single = replace(big, microbatches=1.0, inflight=(1.0, 1.0))
    first_unallocated = (4 * big.relief_layer_grad_bytes + big.relief_first_grad_bytes
                         - single.first_backward_relief_bytes(0, 4))
    assert first_unallocated > 0
    assert single.cast_cache_relief_bytes(0, 4) == pytest.approx(max(0.0, min(
        rb - r + first_unallocated, 4 * c1 - 2 * c1)))
    # where the copies do not bind, the raised bound relieves more than with m >= 2
    wide = dict(cache_layer_copy_bytes=50 * c1)
    assert replace(single, **wide).cast_cache_relief_bytes(0, 4) == pytest.approx(
        max(0.0, min(rb - r + first_unallocated, 4 * 50 * c1 - 2 * 50 * c1)))
    assert replace(single, **wide).cast_cache_relief_bytes(0, 4) \
        > replace(big, **wide).cast_cache_relief_bytes(0, 4)
    # the rank's peak and its breakdown both lose exactly the relief
    without = replace(t, cache_layer_copy_bytes=0.0)
    assert t.rank_memory_bytes(0, 4) == pytest.approx(without.rank_memory_bytes(0, 4) - want)
    assert t.rank_variable_bytes(0, 4)[2] == pytest.approx(
        without.rank_variable_bytes(0, 4)[2] - want)
    # a 1F1B rank that runs every forward first (warm-up ≥ m: F0 F1 B0 B1) gets the same
    # relief; one with a forward after a backward (which casts again) does not (round 23, f13)
    few = lay.replace(schedule="1f1b", micro_batch=JOB.global_batch // 2)     # m = 2
    t2 = layer_tables(MODEL, c, JOB, few)
    assert t2.cache_cleared_ranks == (True, False)
    assert t2.cast_cache_relief_bytes(0, 4) > 0 and t2.cast_cache_relief_bytes(1, 4) == 0.0
    # not where nothing clears the cache at that peak, or where there is no autocast copy
    for other, job in ((lay.replace(schedule="1f1b"), JOB),
                       (lay.replace(schedule="interleaved-1f1b", vpp=2), JOB),
                       (lay.replace(recompute="selective"), JOB),
                       (lay.replace(dp=2, pp=2, zero=2), JOB),
                       (lay, Job(global_batch=16, seq_len=1024))):
        assert layer_tables(MODEL, c, job, other).cache_layer_copy_bytes == 0.0


def test_pipelined_last_stage_with_tp_counts_its_kept_logits_once():
    """Round 21 (holdout21 e07): with tp > 1 the output row's peak is in its forward, with
    the 16-bit logits alive; a pipelined last stage keeps those logits as its output chunk
    (counted apart), so the output's working memory there is one logits chunk less."""
    from meshplan.costmodel.estimate import layer_tables, pipelined_output_peak_bytes
    tp2 = Layout(pp=2, tp=2, micro_batch=1, schedule="1f1b")
    chunk = 1 * JOB.seq_len * MODEL.vocab_size / 2 * 2        # bf16 logits shard
    assert pipelined_output_peak_bytes(JOB, tp2, MODEL, 3 * chunk) == pytest.approx(2 * chunk)
    assert pipelined_output_peak_bytes(JOB, tp2, MODEL, 0.5 * chunk) == 0.0
    # tp 1 (the row's peak is in the backward), no pipeline, megatron's runtime or
    # zero-bubble (its last stages peak elsewhere; round 22): as is
    for lay, job in ((tp2.replace(tp=1), JOB), (tp2.replace(pp=1, dp=2), JOB),
                     (tp2, Job(global_batch=16, seq_len=1024)),
                     (tp2.replace(schedule="zero-bubble"), JOB)):
        assert pipelined_output_peak_bytes(job, lay, MODEL, 3 * chunk) == 3 * chunk
    c = _cluster(TABLES)
    t = layer_tables(MODEL, c, JOB, tp2)
    assert t.output_peak_bytes == pytest.approx(
        pipelined_output_peak_bytes(JOB, tp2, MODEL, t.parts.output_peak_bytes))


def test_last_rank_output_kept_bytes_do_not_coexist_with_a_layers_backward():
    """Round 24 (holdout24 g15): a micro-batch's output backward frees what its loss kept
    before its layers' backward runs, so the last rank holds max(kept + output working
    memory, layer backward working memory), not kept on top of the larger."""
    from dataclasses import replace

    from meshplan.costmodel.estimate import layer_tables
    c = _cluster(TABLES)
    # without the first-backward relief and the end-of-step merge, which have rules of their own
    t = replace(layer_tables(MODEL, c, JOB, Layout(pp=2, micro_batch=1)), relief_events=(),
                last_merge_bytes=0.0)
    gib = 2.0 ** 30
    kept, out_peak = 2.0 * gib, 1.0 * gib

    states = t.last_extra_bytes - t.logits_bytes        # the output layer's own states

    def last_rank(rb: float) -> float:
        """The last rank's memory from the output's kept and working bytes and a layer's
        backward working memory, over that rank without any of them."""
        x = replace(t, logits_bytes=kept + out_peak, output_peak_bytes=out_peak,
                    last_extra_bytes=states + kept + out_peak, recompute_buf_bytes=rb,
                    buffer_bytes=rb)
        bare = replace(t, logits_bytes=0.0, output_peak_bytes=0.0, last_extra_bytes=states,
                       recompute_buf_bytes=0.0, buffer_bytes=0.0)
        return x.rank_memory_bytes(1, 4) - bare.rank_memory_bytes(1, 4)

    # the layer backward needs more than the loss: the larger of the two is held
    assert last_rank(4.0 * gib) == pytest.approx(4.0 * gib)
    # between the two: the loss forward (kept + working memory) sets the peak
    assert last_rank(2.5 * gib) == pytest.approx(3.0 * gib)
    # the output needs more: unchanged from before (kept + working memory)
    assert last_rank(0.5 * gib) == pytest.approx(3.0 * gib)
    # GPipe keeps every micro-batch's output until its backward: only one of them is freed
    g = layer_tables(MODEL, c, JOB, Layout(pp=2, micro_batch=1, schedule="gpipe"))
    m = g.inflight[1]
    x = replace(g, logits_bytes=m * kept + out_peak, output_peak_bytes=out_peak,
                recompute_buf_bytes=4.0 * gib)
    assert x.output_kept_bytes == pytest.approx(kept)
    assert x.output_kept_overlap_bytes == pytest.approx(2.0 * gib)


def test_zero3_without_fsdp_rows_says_so():
    """A profile with plain rows but none measured under FSDP2 at the layout's dp prices
    ZeRO-2/3 analytically (fp8h4's k02 ran 29-37 % slower than that): the estimate says so;
    with an FSDP2 row of that setting, or at ZeRO-1, or with no rows at all, it does not."""
    from meshplan.costmodel.caveats import FSDP_UNMEASURED_CAVEAT
    plain = MeasuredTables(
        (_layer(1, 1e-3, 2e-3, 100e6, 50e6),),
        (_end("embedding", 1, 1e-4, 2e-4, 1e6, 0.0), _end("output", 1, 5e-4, 9e-4, 400e6, 300e6)))
    with_fsdp = MeasuredTables(
        plain.layers + (_layer(1, 1.5e-3, 3.5e-3, 80e6, 60e6, zero=3, dp=2),), plain.ends)
    z3 = Layout(dp=2, micro_batch=1, zero=3)
    assert FSDP_UNMEASURED_CAVEAT in estimate(MODEL, _cluster(plain), JOB, z3).caveats
    assert FSDP_UNMEASURED_CAVEAT not in estimate(MODEL, _cluster(with_fsdp), JOB, z3).caveats
    assert FSDP_UNMEASURED_CAVEAT not in estimate(
        MODEL, _cluster(plain), JOB, Layout(dp=2, micro_batch=1, zero=1)).caveats
    from meshplan.hardware_profiles import Cluster
    datasheet = Cluster.preset("dgx-h100", nodes=1, gpus_per_node=2)
    assert FSDP_UNMEASURED_CAVEAT not in estimate(MODEL, datasheet, JOB, z3).caveats


@pytest.mark.parametrize("compiled", [False, True])
def test_zero3_from_a_plain_row_keeps_fsdp2s_bytes_not_autocasts(compiled):
    """FSDP2 runs the block in bf16 without autocast: a plain row's kept bytes lose the
    LayerNorms' fp32 input copies and, timed compiled, the 16-bit weight copies the graph
    saves per call (none of either under full recomputation); an FSDP2 row is used as it
    is, and ZeRO-1 keeps the row's bytes."""
    from meshplan.costmodel.tables import layer_tables
    from meshplan.costmodel.torch_activations import torch_layer_activations
    act = 300e6
    rows = tuple(_layer(1, 1e-3, 2e-3, act, 50e6, recompute=rc, compile=compiled)
                 for rc in ("selective", "full"))
    plain = MeasuredTables(rows, (_end("embedding", 1, 1e-4, 2e-4, 1e6, 0.0),
                                  _end("output", 1, 5e-4, 9e-4, 400e6, 300e6)))
    c = _cluster(plain)
    kw = dict(model=MODEL, job=JOB, micro_batch=1, tp=1, sequence_parallel=False)
    norms = (torch_layer_activations(**kw, autocast=False).stored("selective")
             - torch_layer_activations(**kw).stored("selective"))
    assert norms < 0
    copies = 2 * stage_params(MODEL, 1, 1, first=False, last=False, pp=1) if compiled else 0
    for zero in (2, 3):
        z = Layout(dp=2, micro_batch=1, zero=zero, recompute="selective", compile=compiled)
        assert layer_tables(MODEL, c, JOB, z).layer_activation_bytes == \
            pytest.approx(act + norms - copies)
    z1 = Layout(dp=2, micro_batch=1, zero=1, recompute="selective", compile=compiled)
    assert layer_tables(MODEL, c, JOB, z1).layer_activation_bytes == pytest.approx(act)
    full = Layout(dp=2, micro_batch=1, zero=3, recompute="full", compile=compiled)
    assert layer_tables(MODEL, c, JOB, full).layer_activation_bytes == pytest.approx(act)
    fsdp = MeasuredTables(rows + (_layer(1, 1.5e-3, 3.5e-3, 80e6, 60e6, zero=3, dp=2,
                                         recompute="selective"),), plain.ends)
    z3 = Layout(dp=2, micro_batch=1, zero=3, recompute="selective")
    assert layer_tables(MODEL, _cluster(fsdp), JOB, z3).layer_activation_bytes == \
        pytest.approx(80e6)


def test_one_timed_micro_batch_extends_gpu_time_but_holds_cpu_dispatch():
    """A setting timed at one micro-batch only: its GPU seconds scale with the micro-batch,
    its CPU dispatch (pooled over micro-batches by the calibration) does not."""
    t = _cpu_tables()
    r = t.layer(MODEL, seq_len=1024, tp=1, sequence_parallel=False, recompute="none",
                micro_batch=4)
    assert (r.forward_s, r.backward_s) == pytest.approx((4e-3, 8e-3))
    assert (r.forward_cpu_s, r.backward_cpu_s) == (3e-3, 5e-3)
    assert r.extended_from == (1,)


def test_an_fp8_row_timed_at_one_micro_batch_grows_as_its_bf16_twin():
    """fp8 row at micro-batch 4 only, its bf16 twin at 4 and 8: at 8 the fp8 GPU seconds
    grow by the twin's ratios (not 2×); CPU held; without a twin spanning 8, proportional."""
    bf16 = (_layer(4, 2e-3, 4e-3, 1e8, 1e7, compile=True),
            _layer(8, 3e-3, 7e-3, 2e8, 2e7, compile=True))
    fp8 = _layer(4, 1.5e-3, 3e-3, 1e8, 1e7, compile=True, precision="fp8",
                 fp8_recipe="tensorwise", forward_cpu_s=1e-3, backward_cpu_s=2e-3)
    kw = dict(recipe="tensorwise", seq_len=1024, tp=1, sequence_parallel=False,
              recompute="none", compile=True)
    t = MeasuredTables((*bf16, fp8), ())
    r = t.fp8_layer(MODEL, micro_batch=8, **kw)
    assert (r.forward_s, r.backward_s) == pytest.approx((1.5e-3 * 1.5, 3e-3 * 1.75))
    assert (r.forward_cpu_s, r.backward_cpu_s) == (1e-3, 2e-3)
    assert t.fp8_layer(MODEL, micro_batch=4, **kw).forward_s == pytest.approx(1.5e-3)
    alone = MeasuredTables((bf16[0], fp8), ()).fp8_layer(MODEL, micro_batch=8, **kw)
    assert (alone.forward_s, alone.backward_s) == pytest.approx((3e-3, 6e-3))


@pytest.mark.parametrize("field, bad, message", [
    ("ep", 0, "ep must be an integer >= 1"), ("ep", "2", "ep must be an integer >= 1"),
    ("routed_imbalance", "even", "routed_imbalance must be a number >= 0"),
    ("routed_imbalance", -1.0, "routed_imbalance must be a number >= 0")])
def test_a_layer_rows_ep_and_routing_are_checked(field, bad, message):
    from dataclasses import asdict
    row = asdict(_layer(1, 1e-3, 2e-3, 1e6, 1e6, ep=2, routed_imbalance=1.05))
    tables_from_rows([row], [], "p.toml")                  # the good row loads
    with pytest.raises(ProfileError, match=rf"#1: {message}"):
        tables_from_rows([{**row, field: bad}], [], "p.toml")


@pytest.mark.usefixtures("no_grad_accumulation")
def test_a_row_with_all_its_cpu_in_the_per_call_part_is_cpu_measured():
    """A row whose per-layer CPU is 0 and whose per-call part holds its call's dispatch is
    still CPU-measured (its host dispatch priced, not dropped), and the profile's pooling
    no longer makes such rows: a compiled recompute-none row pooled with a full-recompute
    row of a far larger per-call part keeps its own split (moeh67h100, the H100 MoE
    profile's bf16 none rows), so its host bound grows with the stage's layers."""
    from meshplan.hardware_profiles.calibrated import pool_cpu_fixed
    ms = 1e-3
    base = {"shape": "s", "compile": True, "precision": "bf16", "forward_cpu_s": 2.3 * ms,
            "forward_cpu_fixed_s": 2.0 * ms}
    none = {**base, "recompute": "none", "backward_cpu_s": 1.1 * ms,
            "backward_cpu_fixed_s": 2.9 * ms}
    full = {**base, "recompute": "full", "backward_cpu_s": 0.3 * ms,
            "backward_cpu_fixed_s": 10.6 * ms}
    pooled = pool_cpu_fixed([none, none, full, full])
    assert (pooled[0]["backward_cpu_s"], pooled[0]["backward_cpu_fixed_s"]) == (1.1 * ms,
                                                                                2.9 * ms)
    assert pooled[2]["backward_cpu_fixed_s"] == pytest.approx((2.9 + 10.6) / 2 * ms)
    fixed = (2.0 * ms, 5.0 * ms)                # all the backward's call in its per-call part
    t = _cpu_tables(layer_cpu=(2.3 * ms, 0.0), fixed=fixed)
    r = t.layer(MODEL, seq_len=1024, tp=1, sequence_parallel=False, recompute="none",
                micro_batch=1)
    assert r.backward_cpu_s == 0.0 and r.cpu_measured
    est = estimate(MODEL, _cluster(t), JOB, Layout(micro_batch=1))
    m = JOB.global_batch
    cpu = m * (8 * 2.3 * ms + sum(fixed) + 3e-4 + 3e-4)
    assert est.host_load > 0 and est.host_dispatch_s == pytest.approx(cpu)
    # a row that timed no CPU at all is still not measured
    assert not _cpu_tables(layer_cpu=(0.0, 0.0)).layer(
        MODEL, seq_len=1024, tp=1, sequence_parallel=False, recompute="none",
        micro_batch=1).cpu_measured
