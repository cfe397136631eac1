"""Measured MoE layer rows: their key, where the cost model reads them, and what expert
parallelism adds on top (meshplan.costmodel.moe_rows)."""

import json
from dataclasses import replace

import pytest

from meshplan.calibrate.layer_build import _layer_spec
from meshplan.calibrate.layer_grid import plan_grid
from meshplan.costmodel import estimate
from meshplan.costmodel.data_parallel import group_links
from meshplan.costmodel.inputs import MEASURED_ROWS_CAVEAT
from meshplan.costmodel.measured import (MeasuredLayer, MeasuredTables, ends_shape_key,
                                         layer_shape_key)
from meshplan.costmodel.moe_layer import routed_mlp
from meshplan.costmodel.moe_rows import MOE_ROWS_CAVEAT, measured_moe_parts
from meshplan.costmodel.moe_tables import expert_links, expert_terms
from meshplan.costmodel.tables import layer_tables
from meshplan.hardware_profiles import Cluster
from meshplan.spec import Job, Layout, ModelSpec

MOE = ModelSpec(name="moe", num_layers=8, hidden_size=1024, num_heads=16, num_kv_heads=8,
                ffn_hidden_size=2816, vocab_size=32000, max_seq_len=1024, activation="swiglu",
                norm="rmsnorm", position_embedding="rope", tied_embeddings=False, bias=False,
                num_experts=8, experts_per_token=2, moe_ffn_hidden_size=704)
DENSE = ModelSpec(name="dense", num_layers=8, hidden_size=1024, num_heads=16, num_kv_heads=8,
                  ffn_hidden_size=2816, vocab_size=32000, max_seq_len=1024,
                  activation="swiglu", norm="rmsnorm", position_embedding="rope",
                  tied_embeddings=False, bias=False)
JOB = Job(global_batch=16, seq_len=1024, runtime="torch")


def _row(model=MOE, fwd=2e-3, bwd=4e-3, **kw):
    return MeasuredLayer(**{**dict(
        shape=layer_shape_key(model), seq_len=1024, tp=1, sequence_parallel=False,
        recompute="none", micro_batch=1, forward_s=fwd, backward_s=bwd,
        activation_bytes=1e8, backward_peak_bytes=1e7), **kw})


def _cluster(*rows, gpus=4):
    c = Cluster.preset("dgx-h100", nodes=1, gpus_per_node=gpus)
    return replace(c, gpu=replace(c.gpu, measured=MeasuredTables(tuple(rows), ())))


def test_an_moe_layers_key_names_its_experts_and_a_dense_key_is_unchanged():
    trunk = "h1024-f2816-q16-kv8-d64-swiglu-rmsnorm-rope-nobias-drop0"
    assert layer_shape_key(DENSE) == trunk
    assert layer_shape_key(MOE) == trunk + "-moe8k2f704"
    shared = replace(MOE, num_shared_experts=2, shared_expert_ffn_hidden_size=512,
                     router="sigmoid", capacity_factor=1.25)
    assert layer_shape_key(shared) == trunk + "-moe8k2f704s2x512-sigmoid-cf1.25"
    # the embedding and output layer hold no experts: one key for both
    assert ends_shape_key(MOE) == ends_shape_key(DENSE) == trunk + "-v32000-untied"


def test_an_ep1_layout_takes_its_layer_from_the_row():
    lay = Layout(dp=4, micro_batch=1)
    a = estimate(MOE, _cluster(_row(fwd=2e-3)), JOB, lay)
    b = estimate(MOE, _cluster(_row(fwd=3e-3)), JOB, lay)
    # 8 layers × 4 micro-batches per rank, each forward 1 ms longer
    assert b.step_time_s - a.step_time_s == pytest.approx(8 * 4 * 1e-3, rel=1e-6)
    assert MOE_ROWS_CAVEAT in a.caveats and MEASURED_ROWS_CAVEAT not in a.caveats
    # the row's kept bytes: 1e8 more per layer kept → 8 layers × 1 micro-batch in flight more
    c = estimate(MOE, _cluster(_row(activation_bytes=2e8)), JOB, lay)
    assert (c.memory[0].activations_bytes - a.memory[0].activations_bytes
            == pytest.approx(8 * 1e8, rel=1e-6))


def test_a_dense_model_of_the_same_trunk_does_not_read_moe_rows():
    lay = Layout(dp=4, micro_batch=1)
    a = estimate(DENSE, _cluster(_row(fwd=2e-3)), JOB, lay)
    b = estimate(DENSE, _cluster(_row(fwd=9e-3)), JOB, lay)
    assert a.step_time_s == b.step_time_s
    # and an MoE model does not read a dense model's rows
    c = estimate(MOE, _cluster(_row(DENSE)), JOB, lay)
    assert MEASURED_ROWS_CAVEAT in c.caveats and MOE_ROWS_CAVEAT not in c.caveats


def test_ep2_adds_the_priced_all_to_alls_and_syncs_to_the_row():
    cl = _cluster(_row())
    lay = Layout(dp=4, ep=2, micro_batch=1)
    links = replace(group_links(cl, lay), **expert_links(cl, lay))
    ep1 = measured_moe_parts(MOE, cl, JOB, replace(lay, ep=1), links)
    ep2 = measured_moe_parts(MOE, cl, JOB, lay, links)
    routed = routed_mlp(MOE, cl, JOB, lay, links, cl.gpu.corrections.moe_load_imbalance)
    assert ep1.layer.forward.ep_comm_s == 0
    assert routed.forward.ep_comm_s > 0
    assert ep2.layer.forward.ep_comm_s == pytest.approx(routed.forward.ep_comm_s, rel=1e-9)
    assert ep2.layer.backward.ep_comm_s == pytest.approx(routed.backward.ep_comm_s, rel=1e-9)
    # one host sync (the split exchange) and its all-to-all's call: forward overhead only
    assert ep2.layer.forward.overhead_s > ep1.layer.forward.overhead_s
    assert ep2.layer.backward.overhead_s == pytest.approx(ep1.layer.backward.overhead_s)
    # the expert GEMMs and regrouping move by what the formulas give between the layout
    # (ρ > 1 on the busiest rank, E/2 larger experts' GEMMs) and the row's ep 1, ρ = 1
    timed = routed_mlp(MOE, cl, JOB, replace(lay, ep=1), links, 1.0)
    for kind in ("gemm_s", "memory_bound_s"):
        assert (getattr(ep2.layer.forward, kind) - getattr(ep1.layer.forward, kind)
                == pytest.approx(getattr(routed.forward, kind) - getattr(timed.forward, kind),
                                 rel=1e-9, abs=1e-12))
    assert routed.forward.memory_bound_s > timed.forward.memory_bound_s   # regrouping


def test_ep2_from_the_ep1_row_dispatches_the_counted_ep_operators_on_the_cpu():
    """A row with CPU dispatch: ep 2 adds the operators moe_host counts for ep > 1 (33
    forward, 8 backward) at host_op_dispatch_s and its one sync's wait to the CPU timeline
    (moeh4, post hoc: the tp 2 · ep 2 layouts' CPU ran ~1 ms a layer above the ep = 1 row);
    full recomputation dispatches the forward's again in backward."""
    from meshplan.costmodel.moe_host import ROUTED_OPS_EP
    from meshplan.hardware_profiles.measured_rows import MeasuredEnd
    row = _row(forward_cpu_s=3e-3, backward_cpu_s=2e-3)
    ends = tuple(MeasuredEnd(shape=ends_shape_key(MOE), part=part, seq_len=1024, tp=1,
                             sequence_parallel=False, micro_batch=1, forward_s=1e-4,
                             backward_s=2e-4, activation_bytes=1e6, peak_bytes=1e6,
                             forward_cpu_s=1e-4, backward_cpu_s=1e-4)
                 for part in ("embedding", "output"))

    def with_ends(r):
        c = _cluster(r)
        return replace(c, gpu=replace(c.gpu, measured=MeasuredTables((r,), ends)))
    cl = with_ends(row)
    gpu = cl.gpu
    t_op, t_sync = gpu.host_op_dispatch_s, gpu.host_sync_s
    assert t_op > 0 and t_sync > 0
    for rc, again in (("none", 0), ("full", 1)):
        lay = Layout(dp=4, ep=2, micro_batch=1, recompute=rc)
        links = replace(group_links(cl, lay), **expert_links(cl, lay))
        at1 = measured_moe_parts(MOE, with_ends(replace(row, recompute=rc)), JOB,
                                 replace(lay, ep=1), links)
        at2 = measured_moe_parts(MOE, with_ends(replace(row, recompute=rc)), JOB, lay, links)
        fwd = ROUTED_OPS_EP[0] * t_op + (t_sync + t_op)
        assert at2.cpu[0] - at1.cpu[0] == pytest.approx(fwd, rel=1e-9)
        assert at2.cpu[1] - at1.cpu[1] == pytest.approx(ROUTED_OPS_EP[1] * t_op + again * fwd,
                                                        rel=1e-9)
        assert at2.cpu[2:] == at1.cpu[2:]


def test_a_row_timed_at_the_layouts_ep_prices_it_as_timed():
    """A row timed with the experts over ep = 2 (its all-to-alls and host syncs inside) is the
    layer at ep 2: nothing priced on top at ρ = 1, only the busiest rank's extra rows at ρ > 1;
    ep 4, or an ep group across nodes, fall back to the ep = 1 row plus the formulas."""
    from meshplan.costmodel.moe_rows import MOE_EP_ROWS_CAVEAT
    lay = Layout(dp=4, ep=2, micro_batch=1)
    balanced = replace(JOB)
    cl = _cluster(_row(), _row(fwd=3e-3, ep=2))
    cl = replace(cl, gpu=replace(cl.gpu, corrections=replace(cl.gpu.corrections,
                                                             moe_load_imbalance=1.0)))
    links = replace(group_links(cl, lay), **expert_links(cl, lay))
    at_ep = measured_moe_parts(MOE, cl, balanced, lay, links)
    assert at_ep.layer.forward.total_s == pytest.approx(3e-3, rel=1e-9)
    assert at_ep.layer.forward.ep_comm_s == 0          # the row's time holds them
    e = estimate(MOE, cl, balanced, lay)
    assert MOE_EP_ROWS_CAVEAT in e.caveats and MOE_ROWS_CAVEAT not in e.caveats
    slower = _cluster(_row(), _row(fwd=4e-3, ep=2))
    slower = replace(slower, gpu=replace(slower.gpu, corrections=cl.gpu.corrections))
    # 8 layers × 4 micro-batches per rank, each forward 1 ms longer
    assert (estimate(MOE, slower, balanced, lay).step_time_s - e.step_time_s
            == pytest.approx(8 * 4 * 1e-3, rel=1e-6))
    # ρ > 1: the busiest rank's extra rows on top of the row
    skewed = _cluster(_row(), _row(fwd=3e-3, ep=2))
    sk = measured_moe_parts(MOE, skewed, JOB, lay, links)
    assert skewed.gpu.corrections.moe_load_imbalance > 1
    rho = skewed.gpu.corrections.moe_load_imbalance
    extra = (routed_mlp(MOE, skewed, JOB, lay, links, rho).forward.ep_comm_s
             - routed_mlp(MOE, skewed, JOB, lay, links, 1.0).forward.ep_comm_s)
    assert sk.layer.forward.total_s > 3e-3
    assert sk.layer.forward.ep_comm_s == pytest.approx(extra, rel=1e-9)   # extra rows only
    # no row at ep 4: the ep = 1 row plus the priced all-to-alls
    lay4 = Layout(dp=4, ep=4, micro_batch=1)
    e4 = estimate(MOE, cl, balanced, lay4)
    assert MOE_ROWS_CAVEAT in e4.caveats and MOE_EP_ROWS_CAVEAT not in e4.caveats
    # an ep group across two nodes: the row's NVLink all-to-all does not stand for it
    two = Cluster.preset("dgx-h100", nodes=2, gpus_per_node=1)
    two = replace(two, gpu=replace(two.gpu, measured=cl.gpu.measured,
                                   corrections=cl.gpu.corrections))
    lay2 = Layout(dp=2, ep=2, micro_batch=1)
    assert MOE_ROWS_CAVEAT in estimate(MOE, two, balanced, lay2).caveats


def test_calibration_times_moe_rows_at_every_ep_dividing_ranks_and_experts():
    from meshplan.calibrate.layer_grid import expert_degrees
    assert expert_degrees(MOE, 4) == (2, 4) and expert_degrees(MOE, 1) == ()
    assert expert_degrees(replace(MOE, num_experts=6), 4) == (2,)
    assert expert_degrees(DENSE, 4) == ()
    grid = plan_grid([MOE, DENSE], 1024, 2, quick=False, micro_batches=(1, 2),
                     compile_rows=("none",))
    ep_rows = [c for c in grid if c.ep > 1]
    assert ep_rows and all(c.model is MOE and c.ep == 2 and c.communicates for c in ep_rows)
    # tp 1 and tp 2 + SP, every recompute mode eager, and compiled at the asked modes
    assert {(c.tp, c.sequence_parallel, c.recompute, c.compile) for c in ep_rows} == {
        (tp, sp, rc, False) for tp, sp in ((1, False), (2, True))
        for rc in ("none", "selective", "full")} | {
        (tp, sp, "none", True) for tp, sp in ((1, False), (2, True))}
    # after the plain and compiled rows of ep 1
    first_ep = grid.index(ep_rows[0])
    assert all(c.ep == 1 for c in grid[:first_ep])
    assert any(c.compile for c in grid[:first_ep])
    assert "ep2" in ep_rows[0].label()


def test_rows_hold_the_experts_16bit_copies_so_they_are_not_added_again():
    cl = _cluster(_row())
    lay = Layout(dp=4, micro_batch=1)
    links = replace(group_links(cl, lay), **expert_links(cl, lay))
    layer = measured_moe_parts(MOE, cl, JOB, lay, links).layer
    rows = expert_terms(MOE, cl, JOB, lay, links, layer, copies_in_rows=True)
    curves = expert_terms(MOE, cl, JOB, lay, links, layer)
    assert rows.copy_bytes(1e6, JOB, 1) == 0 and curves.copy_bytes(1e6, JOB, 1) == 2e6
    assert rows.copy_bytes(1e6, JOB, 2) == 2e6    # FSDP2's ZeRO-2 bf16 parameters


@pytest.mark.parametrize("layout, model", [
    (Layout(dp=4, micro_batch=1, zero=2), MOE),                 # FSDP2
    (Layout(dp=2, cp=2, micro_batch=1), MOE),                   # context parallel
    (Layout(dp=4, micro_batch=1), replace(MOE, dense_layers=(0,))),
    (Layout(dp=2, tp=2, micro_batch=1), MOE),                   # no row at tp 2
])
def test_where_rows_do_not_apply_the_layer_is_priced_from_the_curves(layout, model):
    cl = _cluster(_row(model if not model.dense_layers else MOE), _row(DENSE))
    e = estimate(model, cl, JOB, layout)
    assert MEASURED_ROWS_CAVEAT in e.caveats and MOE_ROWS_CAVEAT not in e.caveats


def test_calibration_times_moe_layers_and_their_fsdp_rows_at_ep1():
    deep = replace(MOE, dense_layers=(0, 1), mtp_layers=1)
    spec = _layer_spec(deep, 2, 1)
    assert spec.dense_layers == () and spec.mtp_layers == 0 and spec.num_layers == 2
    assert layer_shape_key(spec) == layer_shape_key(MOE)
    grid = plan_grid([MOE, DENSE], 1024, 2, quick=False, micro_batches=(1, 2))
    moe_fsdp = [c for c in grid if c.model is MOE and c.zero and c.ep == 1]
    assert moe_fsdp
    assert ({(c.zero, c.dp) for c in moe_fsdp}
            == {(c.zero, c.dp) for c in grid if c.model is DENSE and c.zero})


def test_calibration_times_the_moe_layer_under_fsdp2_at_each_ep():
    """FSDP2 rows at ep > 1: the whole stage (dp = world / tp), ZeRO-2 and 3, every recompute
    mode, eager, the first two micro-batches, right after the ep rows; on 4 ranks ep 2 and 4
    at tp 1 (dp 4) and at tp 2 + SP (dp 2), where the ep rows are timed too."""
    from meshplan.calibrate.layer_grid import row_kind
    grid = plan_grid([MOE, DENSE], 1024, 2, quick=False, micro_batches=(1, 2, 4),
                     compile_rows=("none",))
    rows = [c for c in grid if c.zero and c.ep > 1]
    assert {(c.tp, c.dp, c.ep, c.zero, c.recompute, c.micro_batch, c.compile)
            for c in rows} == {(1, 2, 2, z, rc, mb, False) for z in (2, 3)
                               for rc in ("none", "selective", "full") for mb in (1, 2)}
    assert all(c.model is MOE and c.communicates and c.syncs_on_host for c in rows)
    assert {row_kind(c) for c in rows} == {"expert-parallel FSDP2"}
    assert "zero2 dp2 tp1 ep2" in rows[0].label()
    last_ep_row = max(i for i, c in enumerate(grid) if c.ep > 1 and not c.zero)
    assert grid.index(rows[0]) == last_ep_row + 1
    four = plan_grid([MOE], 1024, 4, quick=False, micro_batches=(1,), max_tp=2,
                     compile_rows=("none",))
    assert {(c.tp, c.dp, c.ep) for c in four if c.zero and c.ep > 1} == {
        (1, 4, 2), (1, 4, 4), (2, 2, 2), (2, 2, 4)}


def test_sp_only_drops_the_tensor_parallel_rows_without_sp():
    """--sp-only: every tp > 1 row (plain, compiled, ep, FSDP2) with sequence parallelism
    where the sequence splits over tp; tp 1 rows as before; a sequence that does not split
    keeps its tp > 1 rows without SP."""
    kw = dict(quick=False, micro_batches=(1,), compile_rows=("none",))
    full = plan_grid([MOE], 1024, 2, **kw)
    sp = plan_grid([MOE], 1024, 2, sp_only=True, **kw)
    assert {c for c in full if c.tp == 1 or c.sequence_parallel} == set(sp)
    assert any(c.tp == 2 and not c.sequence_parallel for c in full)
    odd = plan_grid([MOE], 1023, 2, sp_only=True, **kw)
    assert any(c.tp == 2 and not c.sequence_parallel for c in odd)
    assert not any(c.sequence_parallel for c in odd)


def test_a_zero2_moe_layout_reads_its_fsdp_row_where_the_profile_has_one():
    """ZeRO-2 at ep 1 with an FSDP2 row of the layer at the layout's dp: priced from the rows
    (the FSDP2 row's time); without it, or at ep 2, or pipelined, from the curves."""
    lay = Layout(dp=4, micro_batch=1, zero=2)
    fsdp = _row(fwd=2.5e-3, bwd=5e-3, zero=2, dp=4)
    with_row = estimate(MOE, _cluster(_row(), fsdp), JOB, lay)
    assert MOE_ROWS_CAVEAT in with_row.caveats and MEASURED_ROWS_CAVEAT not in with_row.caveats
    slower = estimate(MOE, _cluster(_row(), replace(fsdp, forward_s=3.5e-3)), JOB, lay)
    # 8 layers × 4 micro-batches per rank, each forward 1 ms longer
    assert slower.step_time_s - with_row.step_time_s == pytest.approx(8 * 4 * 1e-3, rel=1e-6)
    for other in (Layout(dp=4, micro_batch=1, zero=3), Layout(dp=4, ep=2, micro_batch=1, zero=2),
                  Layout(dp=2, pp=2, micro_batch=1, zero=2, schedule="1f1b")):
        e = estimate(MOE, _cluster(_row(), fsdp), JOB, other)
        assert MEASURED_ROWS_CAVEAT in e.caveats and MOE_ROWS_CAVEAT not in e.caveats


def test_a_compiled_moe_row_prices_a_compiled_layout_without_the_eager_caveat():
    from meshplan.costmodel.caveats import COMPILE_AS_EAGER_CAVEAT, COMPILE_MOE_CAVEAT
    cl = _cluster(_row(), _row(fwd=1e-3, bwd=2e-3, compile=True))
    lay = Layout(dp=4, micro_batch=1)
    eager = estimate(MOE, cl, JOB, lay)
    comp = estimate(MOE, cl, JOB, replace(lay, compile=True))
    assert comp.step_time_s < eager.step_time_s
    assert COMPILE_MOE_CAVEAT not in comp.caveats and COMPILE_AS_EAGER_CAVEAT not in comp.caveats
    # without a compiled row both caveats say the compiled layout is priced as eager
    only_eager = estimate(MOE, _cluster(_row()), JOB, replace(lay, compile=True))
    assert COMPILE_MOE_CAVEAT in only_eager.caveats


@pytest.mark.usefixtures("no_grad_accumulation")
def test_an_fp8_job_takes_the_moe_layers_own_fp8_row_at_ep1_and_adds_ep_on_top():
    # moeh23 (1 x H200): `calibrate --fp8-rows` timed the MoE block in fp8, and the plans
    # composed fp8 on the bf16 row anyway; the fp8 row is the layer as the executor runs it
    fp8_job = replace(JOB, precision="fp8", fp8_recipe="rowwise")
    bf16 = [_row(fwd=2e-3, bwd=4e-3, micro_batch=mb) for mb in (1, 2)]
    fp8 = [_row(fwd=1.5e-3, bwd=3.5e-3, micro_batch=mb, precision="fp8", fp8_recipe="rowwise",
                activation_bytes=0.9e8, fp8_experts=True) for mb in (1, 2)]
    lay = Layout(dp=4, micro_batch=1)
    t = layer_tables(MOE, _cluster(*bf16, *fp8), fp8_job, lay)
    composed = layer_tables(MOE, _cluster(*bf16), fp8_job, lay)
    # 4 micro-batches a step: the executor casts the experts' weights once a step, which
    # the row (timed a pass at a time) cast in each pass
    wf, wb = _weight_casts(_cluster(*bf16, *fp8), fp8_job, lay)
    assert t.layer_forward_s == pytest.approx(1.5e-3 - wf + (wf + wb) / 4)
    assert t.layer_backward_s == pytest.approx(3.5e-3 - wb)
    assert t.layer_activation_bytes == pytest.approx(0.9e8)
    assert composed.layer_forward_s != pytest.approx(t.layer_forward_s)
    assert any("measured fp8 row (rowwise" in c for c in t.caveats)
    assert not any("measured fp8 row" in c for c in composed.caveats)
    # ep 2 without a row at ep 2: the fp8 row plus what ep adds, as the bf16 row gets it,
    # the routed part's ep difference priced for each job (fp8 experts' GEMMs and casts)
    from meshplan.costmodel.moe_rows import _ep_delta
    ep2 = replace(lay, ep=2)
    d16 = (layer_tables(MOE, _cluster(*bf16), JOB, ep2).layer_forward_s
           - layer_tables(MOE, _cluster(*bf16), JOB, lay).layer_forward_s)
    d8 = (layer_tables(MOE, _cluster(*bf16, *fp8), fp8_job, ep2).layer_forward_s
          - t.layer_forward_s)
    cl = _cluster(*bf16, *fp8)
    links = replace(group_links(cl, ep2), **expert_links(cl, ep2))
    routed = [_ep_delta(MOE, cl, j, ep2, lay, links).forward.total_s for j in (fp8_job, JOB)]
    # and the once-a-step weight casts of ep 2's 4 local experts, not ep 1's 8
    wf2, wb2 = _weight_casts(cl, fp8_job, ep2)
    cached = (-wf2 + (wf2 + wb2) / 4) - (-wf + (wf + wb) / 4)
    assert d8 - d16 == pytest.approx(routed[0] - routed[1] + cached, rel=1e-6) and d8 > 0
    # the fp8 rows a calibration timed with 16-bit experts (before the executor ran them
    # in fp8) price nothing now: composed from the bf16 row
    stale = [replace(r, fp8_experts=False) for r in fp8]
    assert layer_tables(MOE, _cluster(*bf16, *stale), fp8_job, lay).layer_forward_s == \
        pytest.approx(composed.layer_forward_s)
    # a missing mode: the bf16 row there plus the fp8 − bf16 difference timed at none
    full = [_row(fwd=2e-3, bwd=6e-3, micro_batch=mb, recompute="full") for mb in (1, 2)]
    t = layer_tables(MOE, _cluster(*bf16, *fp8, *full), fp8_job,
                     replace(lay, recompute="full"))
    assert t.layer_forward_s == pytest.approx(1.5e-3 - wf + (wf + wb) / 4)
    # full recompute's second forward casts no weights either
    assert t.layer_backward_s == pytest.approx(6e-3 - 0.5e-3 - 0.5e-3 - wb - wf)


def _weight_casts(cluster, job, layout) -> tuple[float, float]:
    """The experts' weight casts of one forward and one backward, as priced."""
    from meshplan.costmodel.corrections import load_imbalance
    from meshplan.costmodel.moe_layer import routed_mlp
    links = replace(group_links(cluster, layout), **expert_links(cluster, layout))
    f8 = routed_mlp(MOE, cluster, job, layout, links,
                    load_imbalance(cluster.gpu.corrections, layout.ep)).fp8
    assert f8.weight_forward_cast_s > 0 and f8.weight_backward_cast_s > 0
    return f8.weight_forward_cast_s, f8.weight_backward_cast_s


@pytest.mark.usefixtures("no_grad_accumulation")
def test_fp8_experts_cast_their_weights_once_a_step_where_the_executor_does():
    """Several micro-batches (or full recompute) at ZeRO-0/1: the weight casts of every
    pass come off the row and go on once a step, and the two fp8 copies are held; one
    micro-batch without full recompute: the row as timed."""
    from meshplan.costmodel.fp8_experts import expert_weights_cached
    from meshplan.costmodel.moe import moe_params_per_rank
    fp8_job = replace(JOB, precision="fp8", fp8_recipe="rowwise")
    fp8 = [_row(fwd=1.5e-3, bwd=3.5e-3, micro_batch=mb, precision="fp8", fp8_recipe="rowwise",
                fp8_experts=True) for mb in (1, 2, 4)]
    cl = _cluster(*[_row(micro_batch=mb) for mb in (1, 2, 4)], *fp8)
    one = Layout(dp=4, micro_batch=4)                   # 16 sequences: one micro-batch
    assert not expert_weights_cached(one.zero, 1, one.recompute)
    t1 = layer_tables(MOE, cl, fp8_job, one)
    assert (t1.layer_forward_s, t1.layer_backward_s) == pytest.approx((1.5e-3, 3.5e-3))
    four = Layout(dp=4, micro_batch=1)
    wf, wb = _weight_casts(cl, fp8_job, four)
    t4 = layer_tables(MOE, cl, fp8_job, four)
    assert t4.layer_forward_s == pytest.approx(1.5e-3 - wf + (wf + wb) / 4)
    assert t4.layer_backward_s == pytest.approx(3.5e-3 - wb)
    e1, e4 = (estimate(MOE, cl, fp8_job, lay) for lay in (one, four))
    cache = 2.0 * moe_params_per_rank(MOE, four).experts * MOE.num_layers
    assert e4.memory[0].weights_bytes - e1.memory[0].weights_bytes == pytest.approx(cache)


def test_with_ep2_a_compiled_layout_reads_the_eager_row():
    from meshplan.costmodel.caveats import COMPILE_MOE_CAVEAT
    cl = _cluster(_row(), _row(fwd=1e-3, bwd=2e-3, compile=True))
    lay = Layout(dp=4, ep=2, micro_batch=1)
    assert (estimate(MOE, cl, JOB, replace(lay, compile=True)).step_time_s
            == estimate(MOE, cl, JOB, lay).step_time_s)
    assert COMPILE_MOE_CAVEAT in estimate(MOE, cl, JOB, replace(lay, compile=True)).caveats


def test_the_planner_searches_compile_for_moe_where_compiled_rows_of_that_ep_exist():
    from meshplan.planner.constraints import Constraints
    from meshplan.planner.space import enumerate_configs
    cl = _cluster(_row(), _row(fwd=1e-3, bwd=2e-3, compile=True))
    cfgs = list(enumerate_configs(MOE, cl, JOB, [4], Constraints()))
    assert {c.ep for c in cfgs} == {1, 2, 4}
    assert {c.ep for c in cfgs if c.compile} == {1}
    # a compiled row timed at ep 2 (calibrations on several GPUs): compile at ep 2 too
    cl2 = _cluster(_row(), _row(fwd=1e-3, bwd=2e-3, compile=True),
                   _row(fwd=1.2e-3, bwd=2.2e-3, compile=True, ep=2))
    cfgs = list(enumerate_configs(MOE, cl2, JOB, [4], Constraints()))
    assert {c.ep for c in cfgs if c.compile} == {1, 2}


TINY_MOE = ModelSpec(name="tiny-moe", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2,
                     ffn_hidden_size=128, vocab_size=128, max_seq_len=32, activation="swiglu",
                     norm="rmsnorm", position_embedding="rope", tied_embeddings=False,
                     bias=False, num_experts=4, experts_per_token=2, moe_ffn_hidden_size=64,
                     num_shared_experts=1, shared_expert_ffn_hidden_size=64)


def _moe_rows_worker(rank: int, world: int, init: str, out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    from _gloo import write_rank_result
    from meshplan.calibrate import bench_layers
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    lines: list[str] = []

    class Log:
        def step(self, message):
            lines.append(message)
        note = step
    t = bench_layers.bench_layer_rows([TINY_MOE], 32, torch.device("cpu"), world, rank,
                                      quick=True, max_tp=2, micro_batches=(1,), progress=Log(),
                                      sync_deep=True)
    write_rank_result(out_dir, rank, {"lines": lines,
                                      "layers": [(r["shape"], r["tp"], r["sequence_parallel"],
                                                  r["recompute"], r["zero"], r["ep"],
                                                  r["forward_s"], r["backward_s"],
                                                  r["routed_imbalance"], r["compile"])
                                                 for r in t.layers]})


@pytest.mark.distributed
def test_two_ranks_time_moe_rows_at_tp2_and_ep2_as_the_executor_splits_them(tmp_path):
    """Two gloo ranks: the MoE layer at tp 1, 2 and 2 + SP with its 4 experts on every rank
    (ep 1), at tp 1 and 2 + SP spread over both (ep 2: the all-to-alls in the timed passes),
    and under FSDP2 at ep 1 (the experts sharded over edp as the executor shards them) and
    at ep 2 (the experts over a one-rank edp, the dense part over dp 2)."""
    pytest.importorskip("torch")
    from _gloo import run_gloo_ranks
    out = run_gloo_ranks(_moe_rows_worker, 2, tmp_path)[0]
    got = out["layers"]
    key = layer_shape_key(TINY_MOE)
    # each plain ep 2 module's first row is timed again on 4 blocks, synchronized (logged;
    # asked for: benchmarks/moe_ep_rows_gpu.py --sync-deep)
    deep = [m for m in out["lines"] if "synchronized on 4 blocks" in m]
    assert len(deep) == 2 and all(" ep2 " in m and "zero" not in m for m in deep)
    assert key.endswith("-moe4k2f64s1x64")
    plain = [r for r in got if r[4] == 0]
    assert {(r[1], r[2], r[5]) for r in plain} == {
        (tp, sp, 1) for tp, sp in ((1, False), (2, False), (2, True))} | {
        (1, False, 2), (2, True, 2)}
    # FSDP2 rows at ep 1 (ZeRO-2/3 over dp 2, and the 1-rank compute-alone ZeRO-2 rows)
    # and at ep 2 (tp 1: dp 2 · ep 2)
    assert {(r[4], r[5]) for r in got if r[4]} == {(2, 1), (3, 1), (2, 2), (3, 2)}
    assert {r[1] for r in got if r[4] and r[5] == 2} == {1}
    assert all(r[0] == key for r in got)
    assert all(r[6] > 0 and r[7] > 0 for r in got)
    # the ep 2 rows recorded the routing they were timed at (ρ_row ≥ 1: the busiest rank's
    # rows over the mean, 32 tokens top-2 over 2 ranks), the ep 1 rows none
    # (the FSDP2 rows at ep 2 carry their plain twin's: they route alike)
    assert all(1.0 <= r[8] <= 2.0 for r in got if r[5] == 2)
    assert all(r[8] == 0.0 for r in got if r[5] == 1)


def test_a_datasheet_moe_estimate_says_published_runs_took_longer():
    """Without measured rows an MoE step is priced from the curves, which published Megatron
    MoE runs mostly outran in time (docs/benchmarks/published.md): the estimate says so;
    a profile with the model's MoE row, or any measured rows, does not add it, nor does a
    dense model."""
    from meshplan.costmodel.moe_tables import MOE_DATASHEET_CAVEAT
    lay = Layout(dp=4, micro_batch=1)
    datasheet = Cluster.preset("dgx-h100", nodes=1, gpus_per_node=4)
    assert MOE_DATASHEET_CAVEAT in estimate(MOE, datasheet, JOB, lay).caveats
    assert MOE_DATASHEET_CAVEAT not in estimate(DENSE, datasheet, JOB, lay).caveats
    assert MOE_DATASHEET_CAVEAT not in estimate(MOE, _cluster(_row()), JOB, lay).caveats
    # measured rows of another shape: priced from the curves, with the rows' caveat instead
    other = estimate(MOE, _cluster(_row(model=DENSE)), JOB, lay)
    assert MOE_DATASHEET_CAVEAT not in other.caveats and MEASURED_ROWS_CAVEAT in other.caveats


def test_layers_that_sync_on_the_host_are_timed_synchronized(monkeypatch):
    """A forward that reads device values on the host (ep > 1's split lists, a capacity
    factor's kept copies) would wait out the queued timing's spin kernel: such rows are timed
    synchronized (no queue), the others queued as before."""
    pytest.importorskip("torch")
    import torch

    from meshplan.calibrate import layer_run
    from meshplan.calibrate.layer_grid import Config
    base = dict(seq_len=32, tp=1, sequence_parallel=False, micro_batch=1)
    assert Config(model=TINY_MOE, ep=2, **base).syncs_on_host
    assert Config(model=replace(TINY_MOE, capacity_factor=1.25), **base).syncs_on_host
    assert not Config(model=TINY_MOE, **base).syncs_on_host
    assert not Config(model=DENSE, **base).syncs_on_host
    assert not Config(model=replace(TINY_MOE, capacity_factor=1.25), part="output",
                      **base).syncs_on_host
    seen = []

    class Stop(Exception):
        pass

    def measure(*a, queue=None, **kw):
        seen.append(queue)
        raise Stop
    monkeypatch.setattr(layer_run, "_measure", measure)
    monkeypatch.setattr(layer_run, "_layer_step", lambda cfg, m, device: (None,) * 5)
    sentinel = object()
    for model, expect in ((replace(TINY_MOE, capacity_factor=1.25), None),
                          (TINY_MOE, sentinel)):
        with pytest.raises(Stop):
            layer_run._run_layer(Config(model=model, **base), None, 2, torch.device("cpu"),
                                 iters=1, barrier=lambda: None, queue=sentinel)
        assert seen.pop() is expect


def test_zero3_frees_the_experts_gathered_copies_at_edp_1_too():
    """ZeRO-3 holds no expert 16-bit copy from forward to backward whatever edp is (the
    executor's FSDP2 shards the experts over edp, a one-rank mesh included, and reshards after
    forward), but a two-layer gather buffer; ZeRO-2 keeps the copies."""
    cl = Cluster.preset("dgx-h100", nodes=1, gpus_per_node=2)
    z3, z2 = Layout(dp=2, ep=2, micro_batch=1, zero=3), Layout(dp=2, ep=2, micro_batch=1, zero=2)
    for lay, copy in ((z3, 0.0), (z2, 2e6)):
        links = replace(group_links(cl, lay), **expert_links(cl, lay))
        layer = measured_moe_parts(MOE, cl, JOB, lay, links)
        terms = expert_terms(MOE, cl, JOB, lay, links, layer and layer.layer)
        assert terms.edp == 1 and terms.copy_bytes(1e6, JOB, lay.zero) == copy
    e3, e2 = (estimate(MOE, cl, JOB, lay) for lay in (z3, z2))
    per_layer = expert_terms(MOE, cl, JOB, z3, replace(group_links(cl, z3),
                                                       **expert_links(cl, z3)), None)
    copies = per_layer.params_per_layer * 2          # one layer's experts in bf16
    # every layer's expert copies no longer held (ZeRO-2 holds them, and the dense ones too)
    assert e2.memory[0].weights_bytes - e3.memory[0].weights_bytes >= MOE.num_layers * copies
    # ... but two layers' gathered experts in the buffer (with the dense layers' two)
    assert e3.memory[0].buffers_bytes - e2.memory[0].buffers_bytes >= 2 * copies


def test_fsdp2_over_a_one_rank_expert_group_still_copies_the_experts():
    """At edp = 1 the executor's FSDP2 runs no collective for the experts but casts and
    copies them at each unshard (forward; ZeRO-3 again in backward) and casts their
    gradients into its fp32 reduce input, on the compute stream: memory-bound time per layer
    and micro-batch; none under the megatron runtime or at ZeRO-1."""
    from meshplan.costmodel.compute import hbm_s
    from meshplan.costmodel.moe_tables import (ONE_RANK_REDUCE_COPY_IN_BYTES,
                                               ONE_RANK_UNSHARD_BYTES)
    cl = Cluster.preset("dgx-h100", nodes=1, gpus_per_node=2)

    def terms(lay, job=JOB):
        links = replace(group_links(cl, lay), **expert_links(cl, lay))
        return expert_terms(MOE, cl, job, lay, links, None)
    z3, z2 = Layout(dp=2, ep=2, micro_batch=1, zero=3), Layout(dp=2, ep=2, micro_batch=1, zero=2)
    t3, t2 = terms(z3), terms(z2)
    p = t3.params_per_layer
    assert t3.edp == 1 and p > 0
    unshard = hbm_s(cl.gpu, p * ONE_RANK_UNSHARD_BYTES)
    copy_in = hbm_s(cl.gpu, p * ONE_RANK_REDUCE_COPY_IN_BYTES)
    assert t3.zero3.forward_s == pytest.approx(unshard) and unshard > 0
    assert t3.zero3.backward_s == pytest.approx(unshard + copy_in)
    assert t2.zero3.forward_s == pytest.approx(unshard)
    assert t2.zero3.backward_s == pytest.approx(copy_in)
    assert t3.zero3.wire_bytes == 0.0
    mega = Job(global_batch=16, seq_len=1024)
    assert terms(z3, mega).zero3.total_s == 0.0
    assert terms(Layout(dp=2, ep=2, micro_batch=1, zero=1)).zero3.total_s == 0.0
    # and the step pays it per layer and micro-batch
    m = z3.num_microbatches(JOB.global_batch)
    e3 = estimate(MOE, cl, JOB, z3)
    assert e3.step_time_s > MOE.num_layers * m * (2 * unshard + copy_in)


def test_imbalance_as_run_pairs_each_groups_calls():
    from meshplan.executor.moe_routing import MAX_CALLS, RoutedRows, imbalance
    # two ep groups of two ranks; per call the busiest over the mean
    recs = [((0, 2), [30, 20]), ((0, 2), [10, 20]), ((1, 3), [20, 0]), ((1, 3), [20, 0]),
            ((4,), [])]                               # a rank that recorded nothing
    r = imbalance(recs)
    assert r["calls"] == 2 and r["groups"] == 2 and r["ep"] == 2
    assert r["busiest_over_mean"] == pytest.approx((1.5 + 1.0 + 1.0) / 3, abs=1e-4)
    assert r["max"] == 1.5
    assert imbalance([((0, 1), []), ((0, 1), [])]) is None
    rec = RoutedRows()
    rec.add(5)                    # off: the warm-up
    rec.on = True
    for _ in range(MAX_CALLS + 3):
        rec.add(7)
    assert len(rec.rows) == MAX_CALLS and rec.rows[0] == 7


def test_an_ep_row_holds_the_imbalance_it_was_routed_at():
    """A row that recorded its routing's ρ_row: only ρ beyond it is priced on top; at or
    below it, the row as timed."""
    lay = Layout(dp=4, ep=2, micro_batch=1)
    unknown = _cluster(_row(), _row(fwd=3e-3, ep=2))
    timed = _cluster(_row(), _row(fwd=3e-3, ep=2, routed_imbalance=1.1))
    links = replace(group_links(unknown, lay), **expert_links(unknown, lay))
    rho = unknown.gpu.corrections.moe_load_imbalance
    assert rho > 1.1
    full = measured_moe_parts(MOE, unknown, JOB, lay, links).layer.forward.total_s
    part = measured_moe_parts(MOE, timed, JOB, lay, links).layer.forward.total_s
    assert 3e-3 < part < full
    extra = (routed_mlp(MOE, timed, JOB, lay, links, rho).forward.total_s
             - routed_mlp(MOE, timed, JOB, lay, links, 1.1).forward.total_s)
    assert part == pytest.approx(3e-3 + extra, rel=1e-6)
    balanced = replace(timed, gpu=replace(timed.gpu, corrections=replace(
        timed.gpu.corrections, moe_load_imbalance=1.05)))
    assert measured_moe_parts(MOE, balanced, JOB, lay, links).layer.forward.total_s == \
        pytest.approx(3e-3, rel=1e-9)


def test_zero2_and_3_at_ep2_read_the_ep_row_not_the_ep1_fsdp_row():
    """FSDP2 rows are timed at ep = 1 (the experts gathered over edp, no all-to-alls): at
    ep 2 the layer is the row timed at ep 2, run under FSDP2 — its time as timed (FSDP2's
    gathers priced analytically, a caveat saying its hooks are not), its kept bytes less the
    experts' 16-bit copies the per-call casts keep; without an ep row, the curves."""
    from meshplan.costmodel.caveats import FSDP_UNMEASURED_CAVEAT
    from meshplan.costmodel.moe import moe_params_per_rank
    from meshplan.costmodel.moe_rows import MOE_EP_ROWS_CAVEAT, fsdp_kept_bytes
    ep1_fsdp = _row(fwd=9e-3, bwd=9e-3, zero=2, dp=2)
    for zero in (2, 3):
        lay = Layout(dp=2, ep=2, micro_batch=1, zero=zero)
        a = estimate(MOE, _cluster(_row(), ep1_fsdp, _row(fwd=3e-3, ep=2), gpus=2), JOB, lay)
        b = estimate(MOE, _cluster(_row(), ep1_fsdp, _row(fwd=4e-3, ep=2), gpus=2), JOB, lay)
        # its caveat names the ZeRO-2/3 case; the FSDP2-rows advice (calibrate longer) would
        # not help: the FSDP2 rows a calibration times are ep 1's
        assert MOE_EP_ROWS_CAVEAT in a.caveats and FSDP_UNMEASURED_CAVEAT not in a.caveats
        assert "ZeRO-2/3" in MOE_EP_ROWS_CAVEAT
        assert MEASURED_ROWS_CAVEAT not in a.caveats
        # 8 layers × 8 micro-batches per rank (global 16 over dp 2), each forward 1 ms longer
        assert b.step_time_s - a.step_time_s == pytest.approx(8 * 8 * 1e-3, rel=1e-6)
        # the ep 1 FSDP2 row does not stand in: the same step without it
        alone = estimate(MOE, _cluster(_row(), _row(fwd=3e-3, ep=2), gpus=2), JOB, lay)
        assert alone.step_time_s == a.step_time_s
        none = estimate(MOE, _cluster(_row(), ep1_fsdp, gpus=2), JOB, lay)
        assert MEASURED_ROWS_CAVEAT in none.caveats
    # the copies are the rank's experts (E/ep of them, 2 bytes each): halved from ep 2 to 4,
    # the dense part's bytes the same
    copies = moe_params_per_rank(MOE, lay).experts * 2
    assert copies > 0
    for rc in ("none", "selective"):
        at2, at4 = replace(lay, recompute=rc), replace(lay, recompute=rc, dp=4, ep=4)
        assert (fsdp_kept_bytes(MOE, JOB, at4, 1e8) - fsdp_kept_bytes(MOE, JOB, at2, 1e8)
                == pytest.approx(copies / 2, rel=1e-9))
    full2, full4 = replace(lay, recompute="full"), replace(lay, recompute="full", dp=4, ep=4)
    assert fsdp_kept_bytes(MOE, JOB, full2, 1e8) == fsdp_kept_bytes(MOE, JOB, full4, 1e8)



def test_zero2_and_3_at_ep2_read_the_fsdp2_row_timed_at_that_ep():
    """With the layer timed under FSDP2 at the layout's ep (calibrations since 2026-11-30),
    ZeRO-2/3 at ep 2 reads it as a dense layout reads its FSDP2 row: its time and kept
    bytes, what FSDP2 adds being the row's difference to the ep row — no analytical
    one-rank expert copies on top; the ep 1 FSDP2 row still does not stand in."""
    from meshplan.costmodel.moe_rows import (MOE_EP_FSDP_ROWS_CAVEAT, MOE_EP_ROWS_CAVEAT,
                                             fsdp_row_at_ep)
    plain = _row(fwd=3e-3, bwd=6e-3, ep=2)
    for zero in (2, 3):
        lay = Layout(dp=2, ep=2, micro_batch=1, zero=zero)
        fsdp = _row(fwd=3.5e-3, bwd=6e-3, ep=2, zero=zero, dp=2, activation_bytes=7e7)
        without = estimate(MOE, _cluster(_row(), plain, gpus=2), JOB, lay)
        cl = _cluster(_row(), plain, fsdp, gpus=2)
        assert fsdp_row_at_ep(MOE, cl, JOB, lay)
        assert not fsdp_row_at_ep(MOE, cl, JOB, replace(lay, zero=5 - zero))
        a = estimate(MOE, cl, JOB, lay)
        assert MOE_EP_FSDP_ROWS_CAVEAT in a.caveats and MOE_EP_ROWS_CAVEAT not in a.caveats
        assert MOE_EP_ROWS_CAVEAT in without.caveats
        slower = estimate(MOE, _cluster(_row(), plain, replace(fsdp, forward_s=4.5e-3),
                                        gpus=2), JOB, lay)
        # 8 layers × 8 micro-batches per rank, each forward 1 ms longer
        assert slower.step_time_s - a.step_time_s == pytest.approx(8 * 8 * 1e-3, rel=1e-6)
        # FSDP2 timed at no cost over the ep row: the step is the ep row's with nothing
        # priced on top, below the estimate that adds the analytical gathers and copies
        free = estimate(MOE, _cluster(_row(), plain, replace(fsdp, forward_s=3e-3), gpus=2),
                        JOB, lay)
        assert free.step_time_s < without.step_time_s
        assert (free.step_time_s - estimate(MOE, _cluster(_row(), plain, replace(
            fsdp, forward_s=3e-3, backward_s=7e-3), gpus=2), JOB, lay).step_time_s
                == pytest.approx(-8 * 8 * 1e-3, rel=1e-6))
        # the ep 1 FSDP2 row is not this layer: with it alone, the ep row as before
        ep1 = _row(fwd=9e-3, bwd=9e-3, zero=zero, dp=2)
        assert estimate(MOE, _cluster(_row(), plain, ep1, gpus=2), JOB, lay).step_time_s == \
            without.step_time_s
    # its kept bytes are the row's (ZeRO-2: the activations of 8 layers per micro-batch)
    lay = Layout(dp=2, ep=2, micro_batch=1, zero=2)
    small = estimate(MOE, _cluster(_row(), plain, _row(ep=2, zero=2, dp=2,
                                                        activation_bytes=5e7), gpus=2), JOB, lay)
    big = estimate(MOE, _cluster(_row(), plain, _row(ep=2, zero=2, dp=2,
                                                      activation_bytes=6e7), gpus=2), JOB, lay)
    assert big.memory[0].activations_bytes - small.memory[0].activations_bytes == \
        pytest.approx(8 * 1e7, rel=1e-6)


def test_a_compiled_zero2_layout_at_ep2_derives_from_the_pair_at_that_ep():
    """Compiled ZeRO-2 at ep 2: the eager FSDP2 row at ep 2 moved by the plain compiled /
    eager pair timed at ep 2 (not ep 1's); its kept bytes the eager FSDP2 row's, since the
    compiled MoE row at ep > 1 saves none of its routed rows' activations on the GPU while
    the compiled FSDP2 layouts kept them (moeh14, moeh15; compiled_rows docstring)."""
    from meshplan.costmodel.compiled_rows import compiled_layout_rows
    lay = Layout(dp=2, ep=2, micro_batch=1, zero=2, compile=True)
    eager, comp = _row(fwd=3e-3, bwd=6e-3, ep=2), _row(fwd=2e-3, bwd=4e-3, ep=2, compile=True,
                                                        activation_bytes=9e7)
    fsdp = _row(fwd=3.5e-3, bwd=6e-3, ep=2, zero=2, dp=2, activation_bytes=1e8)
    decoy = (_row(fwd=3e-3, bwd=6e-3), _row(fwd=1e-3, bwd=1e-3, compile=True))   # ep 1 pair
    tables = _cluster(*decoy, eager, comp, fsdp, gpus=2).gpu.measured
    row, _ = tables.fsdp_layer(MOE, seq_len=1024, tp=1, sequence_parallel=False,
                               recompute="none", micro_batch=1, zero=2, dp=2, ep=2)
    got = compiled_layout_rows(tables, MOE, JOB, lay, row, None)
    assert got.fsdp_derived
    # t = eager − min(plain eager, eager) · (1 − compiled / eager), per pass, at ep 2
    assert got.fsdp_row.forward_s == pytest.approx(3.5e-3 - 3e-3 * (1 - 2 / 3))
    assert got.fsdp_row.backward_s == pytest.approx(6e-3 - 6e-3 * (1 - 4 / 6))
    # the eager FSDP2 row's, not the compiled row's less any copies (9e7 - w < 1e8)
    assert got.fsdp_row.activation_bytes == pytest.approx(1e8)
    assert "the eager FSDP2 row's (compiled MoE rows at ep > 1" in got.sources[0]
    # a dense model or an MoE one at ep 1 still reads the compiled row (the next test)


def test_a_compiled_zero2_layout_at_ep1_takes_all_experts_copies_off_the_compiled_row():
    """At ep 1 the compiled row keeps the 16-bit copies of the layer's dense weights and of
    all E experts (moeh2's and moeh3's intercepts): both come off before the bound."""
    from meshplan.costmodel.compiled_rows import (ROW_COPY_BYTES, compiled_layout_rows)
    from meshplan.costmodel.memory import stage_params
    from meshplan.costmodel.moe import moe_params_per_rank
    lay = Layout(dp=2, micro_batch=1, zero=2, compile=True)
    eager, comp = _row(fwd=3e-3, bwd=6e-3), _row(fwd=2e-3, bwd=4e-3, compile=True,
                                                  activation_bytes=9e7)
    fsdp = _row(fwd=3.5e-3, bwd=6e-3, zero=2, dp=2, activation_bytes=8e7)
    tables = _cluster(eager, comp, fsdp, gpus=2).gpu.measured
    row, _ = tables.fsdp_layer(MOE, seq_len=1024, tp=1, sequence_parallel=False,
                               recompute="none", micro_batch=1, zero=2, dp=2, ep=1)
    got = compiled_layout_rows(tables, MOE, JOB, lay, row, None)
    assert got.fsdp_derived
    experts = moe_params_per_rank(MOE, lay).experts
    assert experts == pytest.approx(MOE.num_experts * 3 * 1024 * 704)
    w = ROW_COPY_BYTES * (stage_params(MOE, 1, 1, first=False, last=False, pp=1) + experts)
    assert got.fsdp_row.activation_bytes == pytest.approx(min(8e7, 9e7 - w))


def test_ddp_accumulation_copies_the_dense_gradients_not_the_experts():
    """The executor leaves the experts out of DDP and all-reduces their .grad in place, so
    DDP's second fp32 gradient copy over several micro-batches (runtime.ddp_accumulates)
    is the dense parameters' only."""
    from meshplan.costmodel.memory import stage_params
    from meshplan.costmodel.moe import moe_params_per_rank
    cl = Cluster.preset("dgx-h100", nodes=1, gpus_per_node=2)
    one = Job(global_batch=2, seq_len=1024, runtime="torch")       # 1 micro-batch a rank
    four = Job(global_batch=8, seq_len=1024, runtime="torch")      # 4: DDP accumulates
    lay = Layout(dp=2, micro_batch=1, zero=1)
    extra = (estimate(MOE, cl, four, lay).memory[0].grads_bytes
             - estimate(MOE, cl, one, lay).memory[0].grads_bytes)
    dense = stage_params(MOE, MOE.num_layers, 1, first=True, last=True, pp=1)
    experts = MOE.num_layers * moe_params_per_rank(MOE, lay).experts
    assert experts > dense                       # the copy with the experts: over twice
    assert extra == pytest.approx(4 * dense, rel=0.02)


def test_ep_option_times_only_the_named_expert_degrees():
    """calibrate --ep: the ep rows (plain, compiled, FSDP2) at the named degrees only; the
    rest of the grid as without it; a degree no model can take is a ConfigError naming the
    valid ones, as is --ep with no MoE model."""
    from meshplan.calibrate.layer_grid import check_expert_degrees, expert_degrees
    from meshplan.errors import ConfigError
    kw = dict(quick=False, micro_batches=(1,), max_tp=2, compile_rows=("none",))
    every = plan_grid([MOE], 1024, 4, **kw)
    four = plan_grid([MOE], 1024, 4, ep_degrees=(4,), **kw)
    assert {c.ep for c in every} == {1, 2, 4} and {c.ep for c in four} == {1, 4}
    assert [c for c in every if c.ep != 2] == four
    assert expert_degrees(MOE, 8) == (2, 4, 8) and expert_degrees(MOE, 8, (4, 8)) == (4, 8)
    with pytest.raises(ConfigError, match=r"\[3\] cannot be timed on 4 rank.*valid: \[2, 4\]"):
        check_expert_degrees([MOE], 4, (3,))
    with pytest.raises(ConfigError, match="no MoE --model"):
        check_expert_degrees([DENSE], 4, (2,))


def test_ep_option_reaches_the_torchrun_children_and_fails_before_them(tmp_path):
    import argparse

    from meshplan.cli import main as cli_main
    from meshplan.commands.calibrate import add_arguments, child_argv
    p = argparse.ArgumentParser()
    add_arguments(p)
    argv = child_argv(p.parse_args(["--ep", "4,8", "--nproc", "8"]))
    assert argv[argv.index("--ep") + 1] == "4,8"
    assert "--ep" not in child_argv(p.parse_args(["--nproc", "8"]))
    spec = tmp_path / "moe.json"
    spec.write_text(json.dumps(MOE.to_dict()))
    # 3 divides neither 4 ranks nor the experts: refused before torchrun would start
    assert cli_main(["calibrate", "--model", str(spec), "--nproc", "4", "--ep", "3",
                     "--out", str(tmp_path / "p.toml")]) != 0
    assert not (tmp_path / "p.toml").exists()


def test_a_calibrations_fp8_moe_rows_say_their_experts_ran_fp8():
    # the executor runs the routed experts in fp8 under rowwise only: the rows say so, and
    # only such rows price an fp8 MoE job (the earlier, 16-bit-expert rows do not)
    from meshplan.calibrate.layer_grid import Config
    from meshplan.calibrate.layer_rows import layer_row
    values = (2e-3, 4e-3, 1e8, 1e7)
    kw = dict(seq_len=1024, tp=1, sequence_parallel=False, micro_batch=1)
    rw = layer_row(Config(model=MOE, precision="fp8", fp8_recipe="rowwise", **kw), values)
    tw = layer_row(Config(model=MOE, precision="fp8", fp8_recipe="tensorwise", **kw), values)
    dense = layer_row(Config(model=DENSE, precision="fp8", fp8_recipe="rowwise", **kw), values)
    bf16 = layer_row(Config(model=MOE, **kw), values)
    assert rw["fp8_experts"] and not tw["fp8_experts"]
    assert not dense["fp8_experts"] and not bf16["fp8_experts"]
    from meshplan.costmodel.measured import tables_from_rows
    from meshplan.errors import ProfileError
    assert tables_from_rows([rw], [], "p.toml").layers[0].fp8_experts
    with pytest.raises(ProfileError, match="fp8_experts must be true or false, got 'yes'"):
        tables_from_rows([{**rw, "fp8_experts": "yes"}], [], "p.toml")


@pytest.mark.usefixtures("no_grad_accumulation")
def test_rows_timed_with_the_weights_cast_beforehand_put_the_casts_back_only_where_needed():
    """A calibration times fp8 experts with their weights cast beforehand (as a step of
    several micro-batches runs them): such a row is preferred to one that cast them in
    every pass; a layout that caches takes only the once-a-step cast on top, one that casts
    in every pass (one micro-batch) gets the casts of each pass back."""
    fp8_job = replace(JOB, precision="fp8", fp8_recipe="rowwise")
    f8 = dict(precision="fp8", fp8_recipe="rowwise", fp8_experts=True)
    every = [_row(fwd=1.5e-3, bwd=3.5e-3, micro_batch=mb, **f8) for mb in (1, 2, 4)]
    cached = [_row(fwd=1.4e-3, bwd=3.3e-3, micro_batch=mb, fp8_weights_cached=True, **f8)
              for mb in (1, 2, 4)]
    cl = _cluster(*[_row(micro_batch=mb) for mb in (1, 2, 4)], *every, *cached)
    four, one = Layout(dp=4, micro_batch=1), Layout(dp=4, micro_batch=4)
    wf, wb = _weight_casts(cl, fp8_job, four)
    t4 = layer_tables(MOE, cl, fp8_job, four)
    assert t4.layer_forward_s == pytest.approx(1.4e-3 + (wf + wb) / 4)
    assert t4.layer_backward_s == pytest.approx(3.3e-3)
    wf1, wb1 = _weight_casts(cl, fp8_job, one)
    t1 = layer_tables(MOE, cl, fp8_job, one)
    assert (t1.layer_forward_s, t1.layer_backward_s) == pytest.approx((1.4e-3 + wf1,
                                                                       3.3e-3 + wb1))
    # the held fp8 copies come with caching whichever row priced it
    e = [estimate(MOE, c, fp8_job, four).memory[0].weights_bytes
         for c in (cl, _cluster(*[_row(micro_batch=mb) for mb in (1, 2, 4)], *every))]
    assert e[0] == pytest.approx(e[1])
    # the bf16 row at full recompute plus the difference a cached row timed at none: the
    # sibling is cached, so nothing comes off and the step's cast goes on
    full = [_row(fwd=2e-3, bwd=6e-3, micro_batch=mb, recompute="full") for mb in (1, 2, 4)]
    cl2 = _cluster(*[_row(micro_batch=mb) for mb in (1, 2, 4)], *cached, *full)
    tf = layer_tables(MOE, cl2, fp8_job, replace(four, recompute="full"))
    assert tf.layer_forward_s == pytest.approx(2e-3 - 0.6e-3 + (wf + wb) / 4)
    assert tf.layer_backward_s == pytest.approx(6e-3 - 0.7e-3 - 0.6e-3)


def test_a_calibration_row_says_whether_it_cast_the_experts_weights_beforehand():
    from meshplan.calibrate.layer_grid import Config
    from meshplan.calibrate.layer_rows import layer_row
    from meshplan.costmodel.measured import tables_from_rows
    from meshplan.errors import ProfileError
    values = (2e-3, 4e-3, 1e8, 1e7)
    kw = dict(model=MOE, seq_len=1024, tp=1, sequence_parallel=False, micro_batch=1,
              precision="fp8", fp8_recipe="rowwise")
    plain = layer_row(Config(**kw), values)
    fsdp = layer_row(Config(zero=2, dp=2, **kw), values)
    tensorwise = layer_row(Config(**{**kw, "fp8_recipe": "tensorwise"}), values)
    assert plain["fp8_weights_cached"]
    assert not fsdp["fp8_weights_cached"] and not tensorwise["fp8_weights_cached"]
    assert tables_from_rows([plain], [], "p.toml").layers[0].fp8_weights_cached
    with pytest.raises(ProfileError, match="fp8_weights_cached = true needs fp8_experts"):
        tables_from_rows([{**tensorwise, "fp8_weights_cached": True}], [], "p.toml")


def test_calibration_times_fp8_experts_with_their_weights_cast_once_beforehand(monkeypatch):
    """On CPU (the experts' fp8 emulated): the fp8 MoE rows refresh each stacked weight's
    casts once per build, and the timed passes read them (a stale cast would raise)."""
    torch = pytest.importorskip("torch")
    from meshplan.calibrate import bench_layers
    from meshplan.executor import fp8_grouped
    tiny = ModelSpec(name="tiny-moe", num_layers=2, hidden_size=64, num_heads=4,
                     num_kv_heads=2, ffn_hidden_size=128, vocab_size=128, max_seq_len=32,
                     activation="swiglu", norm="rmsnorm", position_embedding="rope",
                     tied_embeddings=False, bias=False, num_experts=4, experts_per_token=2,
                     moe_ffn_hidden_size=32)
    refreshed, read = [], []
    real_refresh, real_tensors = (fp8_grouped.Fp8ExpertWeights.refresh,
                                  fp8_grouped.Fp8ExpertWeights.tensors)

    def refresh(self):
        refreshed.append(id(self))
        return real_refresh(self)

    def tensors(self):
        read.append(id(self))
        return real_tensors(self)
    monkeypatch.setattr(fp8_grouped.Fp8ExpertWeights, "refresh", refresh)
    monkeypatch.setattr(fp8_grouped.Fp8ExpertWeights, "tensors", tensors)
    tables = bench_layers.bench_layer_rows(
        [tiny], 32, torch.device("cpu"), 1, 0, quick=True, fp8_rows="rowwise",
        only=lambda c: c.precision == "fp8" and not c.part and c.micro_batch == 1
        and c.recompute == "none")
    rows = tables.layers
    assert rows and all(r["fp8_experts"] and r["fp8_weights_cached"] for r in rows)
    assert all(r["forward_s"] > 0 and r["backward_s"] > 0 for r in rows)
    # each stacked weight (w_in, w_out of every layer built) refreshed once, then read
    assert refreshed and len(refreshed) == len(set(refreshed))
    assert set(read) == set(refreshed)
