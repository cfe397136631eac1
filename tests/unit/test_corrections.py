"""Named corrections (meshplan.costmodel.corrections): each one's predicate and effect, their
numbers read from the GPU profile, Estimate.corrections; and the tensor-parallel collectives
as Megatron and meshplan's executor run them (meshplan.costmodel.compute)."""

from dataclasses import replace

import pytest

from meshplan.costmodel import comm, corrections as corr, estimate
from meshplan.costmodel.compute import layer_cost, embedding_cost, logits_cost
from meshplan.costmodel.data_parallel import group_links
from meshplan.costmodel.tables import layer_tables
from meshplan.errors import ProfileError
from meshplan.hardware_profiles import Cluster
from meshplan.hardware_profiles.calibrated import load_profile
from meshplan.hardware_profiles.corrections import (NUMBER_KEYS, builtin_corrections,
                                                    builtin_provenance,
                                                    corrections_from_table)
from meshplan.spec import Job, Layout, ModelSpec

MODEL = ModelSpec(name="m", num_layers=8, hidden_size=1024, num_heads=16, vocab_size=32000,
                  max_seq_len=1024)
TORCH = Job(global_batch=16, seq_len=1024, runtime="torch")
MEGATRON = Job(global_batch=16, seq_len=1024)
NUMBERS = builtin_corrections()
CLUSTER = Cluster.preset("dgx-h100", nodes=1, gpus_per_node=4)


def _with(cluster: Cluster, **numbers) -> Cluster:
    gpu = cluster.gpu
    return cluster.replace(gpu=replace(gpu, corrections=replace(gpu.corrections, **numbers)))


def _off(cluster: Cluster, name: str) -> Cluster:
    gpu = cluster.gpu
    return cluster.replace(gpu=replace(gpu, corrections=gpu.corrections.without(name)))


# ---- the numbers: data file, profile, no constant in Python ------------------------------
def test_builtin_numbers_come_from_the_data_file_with_machine_and_date():
    prov = builtin_provenance()
    keys = {k.strip() for t in prov.values() for k in t["keys"].split(",")}
    assert set(NUMBER_KEYS) <= keys
    for name, table in prov.items():
        assert table["machine"] and table["date"].startswith("20"), name
    assert CLUSTER.gpu.corrections == NUMBERS and NUMBERS.torch_p2p_slowdown_per_op > 0


def test_profile_corrections_table_replaces_keys_and_errors_name_the_key(tmp_path):
    base = {"schema": "meshplan.profile", "version": 2,
            "gpu": {"name": "H100-SXM5-80GB", "base": "H100-SXM5-80GB",
                    **{k: v for k, v in CLUSTER.gpu.to_dict().items() if k != "name"}}}
    from meshplan.calibrate.tomlfile import dumps
    good = tmp_path / "p.toml"
    good.write_text(dumps({**base, "corrections": {"fsdp2_dp_only_step_s": 0.031,
                                                    "source": "measured here"}}))
    numbers = load_profile(good).gpu.corrections
    assert numbers.fsdp2_dp_only_step_s == 0.031 and numbers.source == "measured here"
    assert numbers.zb_full_pending_sets == NUMBERS.zb_full_pending_sets  # the rest: defaults
    bad = tmp_path / "bad.toml"
    bad.write_text(dumps({**base, "corrections": {"fsdp2_step": 0.02}}))
    with pytest.raises(ProfileError, match="unknown correction key 'fsdp2_step'"):
        load_profile(bad)
    with pytest.raises(ProfileError, match="non-negative"):
        corrections_from_table({"host_near_load": -1}, "x")
    with pytest.raises(ProfileError, match=r"'sustained_idle_power_share' must be in \[0, 1\)"):
        corrections_from_table({"sustained_idle_power_share": 1.2}, "x")
    assert corrections_from_table({"sustained_idle_power_share": 0.2},
                                  "x").sustained_idle_power_share == 0.2


def test_calibrate_writes_the_corrections_table_it_does_not_measure():
    from meshplan.calibrate.profile import correction_table
    table = correction_table(CLUSTER.gpu)
    assert {k: table[k] for k in NUMBER_KEYS} == {k: getattr(NUMBERS, k) for k in NUMBER_KEYS}
    assert "not measured" in table["source"]
    again = corrections_from_table(table, "written")
    assert again.fsdp2_dp_only_step_s == NUMBERS.fsdp2_dp_only_step_s


# ---- each correction: predicate and effect ----------------------------------------------
def test_p2p_slowdown_applies_to_torch_pipelines_and_scales_with_its_number():
    lay = Layout(pp=2, dp=2, micro_batch=1)
    assert corr.stage_slowdown(NUMBERS, TORCH, lay) == pytest.approx(
        (1 + 2 * NUMBERS.torch_p2p_slowdown_per_op,) * 2)
    assert corr.stage_slowdown(NUMBERS, MEGATRON, lay) == ()            # Megatron: none
    assert corr.stage_slowdown(NUMBERS, TORCH, lay.replace(pp=1, dp=4)) == ()
    doubled = corr.stage_slowdown(replace(NUMBERS, torch_p2p_slowdown_per_op=0.024), TORCH, lay)
    assert doubled == pytest.approx((1.048, 1.048))
    est = estimate(MODEL, CLUSTER, TORCH, lay)
    off = estimate(MODEL, _off(CLUSTER, corr.P2P_SLOWDOWN), TORCH, lay)
    (name, dt, dm), = [c for c in est.corrections if c.name == corr.P2P_SLOWDOWN]
    assert dt == pytest.approx(est.step_time_s - off.step_time_s) and dt > 0 and dm == 0


def test_p2p_order_window_is_the_profile_number():
    lay = Layout(pp=4, vpp=2, micro_batch=1, schedule="interleaved-1f1b")
    assert corr.p2p_order_applies(NUMBERS, TORCH, lay, 16)                # m = 4 pp
    assert not corr.p2p_order_applies(NUMBERS, TORCH, lay, 32)
    assert corr.p2p_order_applies(
        replace(NUMBERS, torch_p2p_order_max_microbatches_per_rank=8), TORCH, lay, 32)
    assert not corr.p2p_order_applies(NUMBERS, MEGATRON, lay, 16)
    assert not corr.p2p_order_applies(NUMBERS.without(corr.P2P_ORDER), TORCH, lay, 16)
    t = layer_tables(MODEL, CLUSTER, TORCH, lay)
    assert t.p2p_order and corr.P2P_ORDER in t.corrections
    f, b, _ = t.stage_times((1,) * 8)
    assert t.p2p_order_s(f, b) > 0
    t_off = layer_tables(MODEL, _off(CLUSTER, corr.P2P_ORDER), TORCH, lay)
    assert t_off.p2p_order_s(f, b) == 0.0


def test_fsdp2_step_applies_to_dp_only_fsdp2_and_is_the_profile_number():
    lay = Layout(dp=4, micro_batch=1, zero=2)
    assert corr.fsdp_dp_only(TORCH, lay)
    for other, job in ((lay.replace(zero=1), TORCH), (lay, MEGATRON),
                       (lay.replace(dp=2, pp=2), TORCH), (lay.replace(dp=2, tp=2), TORCH)):
        assert corr.fsdp2_step_s(NUMBERS, job, other) == 0.0
    c = _with(CLUSTER, fsdp2_dp_only_step_s=0.05)
    est = estimate(MODEL, c, TORCH, lay)
    assert est.time.fsdp_step_s == 0.05
    (name, dt, dm), = [x for x in est.corrections if x.name == corr.FSDP2_STEP]
    assert dt == pytest.approx(0.05) and dm == 0


def test_fsdp2_step_is_zero_by_default_for_the_prefetching_executor():
    # predicate: FSDP2 over dp alone; effect: the profile's number a step, 0 built in since
    # the executor prefetches the next block's gather (round 38: passes = rows, no residual)
    assert NUMBERS.fsdp2_dp_only_step_s == 0.0
    lay = Layout(dp=4, micro_batch=1, zero=3)
    assert corr.fsdp_dp_only(TORCH, lay)
    est = estimate(MODEL, CLUSTER, TORCH, lay)
    assert est.time.fsdp_step_s == 0.0
    assert not any(c.startswith("FSDP2 over data parallelism alone") for c in est.caveats)
    old = estimate(MODEL, _with(CLUSTER, fsdp2_dp_only_step_s=0.020), TORCH, lay)
    assert old.step_time_s == pytest.approx(est.step_time_s + 0.020)
    assert any(c.startswith("FSDP2 over data parallelism alone") for c in old.caveats)


def test_zero_bubble_full_recompute_sets_apply_without_a_measured_row():
    lay = Layout(pp=4, micro_batch=1, schedule="zero-bubble", recompute="full")
    t = layer_tables(MODEL, CLUSTER, TORCH, lay)
    full_set = t.parts.full_act_bytes
    assert corr.ZB_FULL_SETS in t.corrections
    assert t.wgrad_pending_bytes == pytest.approx(NUMBERS.zb_full_pending_sets * full_set)
    t2 = layer_tables(MODEL, _with(CLUSTER, zb_full_pending_sets=1.0,
                                   zb_full_w_transient_sets=2.0), TORCH, lay)
    assert t2.wgrad_pending_bytes == pytest.approx(full_set)
    assert t2.wgrad_transient_bytes == pytest.approx(2 * full_set)
    none = layer_tables(MODEL, CLUSTER, TORCH, lay.replace(recompute="selective"))
    assert corr.ZB_FULL_SETS not in none.corrections
    est = estimate(MODEL, CLUSTER, TORCH, lay)
    off = estimate(MODEL, _off(CLUSTER, corr.ZB_FULL_SETS), TORCH, lay)
    assert est.memory[1].total_bytes > off.memory[1].total_bytes           # ranks r > 0
    assert est.memory[0].total_bytes == off.memory[0].total_bytes          # no deferred W
    (name, dt, dm), = [x for x in est.corrections if x.name == corr.ZB_FULL_SETS]
    assert dm == est.memory_peak_bytes - off.memory_peak_bytes and dt == 0.0


def test_cast_cache_relief_applies_to_ranks_that_run_every_forward_first():
    lay = Layout(pp=2, micro_batch=1, schedule="gpipe", recompute="full")
    ranks = corr.cast_cache_ranks(NUMBERS, TORCH, lay, 16, cleared=True)
    assert ranks == (True, True)
    assert corr.cast_cache_ranks(NUMBERS, TORCH, lay, 16, cleared=False) == ()
    assert corr.cast_cache_ranks(NUMBERS, MEGATRON, lay, 16, cleared=True) == ()
    inter = lay.replace(schedule="interleaved-1f1b", vpp=2)
    assert corr.cast_cache_ranks(NUMBERS, TORCH, inter, 16, cleared=True) == ()
    assert corr.cast_cache_ranks(NUMBERS.without(corr.CAST_CACHE), TORCH, lay, 16, True) == ()
    t, t_off = (layer_tables(MODEL, c, TORCH, lay)
                for c in (CLUSTER, _off(CLUSTER, corr.CAST_CACHE)))
    assert corr.CAST_CACHE in t.corrections and corr.CAST_CACHE not in t_off.corrections
    assert t.cast_cache_relief_bytes(0, 4) > 0 == t_off.cast_cache_relief_bytes(0, 4)


def test_memory_rules_switch_off_by_name():
    cases = ((corr.FIRST_BACKWARD, Layout(pp=2, micro_batch=1, schedule="gpipe"),
              lambda t: t.first_backward_relief_bytes(0, 4)),
             (corr.Z3_RESIDENT, Layout(pp=2, dp=2, micro_batch=1, zero=3),
              lambda t: t.z3_resident_layer_bytes),
             (corr.END_OF_STEP, Layout(pp=2, micro_batch=1), lambda t: t.last_merge_bytes))
    for name, lay, term in cases:
        on = layer_tables(MODEL, CLUSTER, TORCH, lay)
        off = layer_tables(MODEL, _off(CLUSTER, name), TORCH, lay)
        assert name in on.corrections and term(on) > 0, name
        assert name not in off.corrections and term(off) == 0, name
        assert name not in layer_tables(MODEL, CLUSTER, MEGATRON, lay).corrections, name
    # the output layer's working memory less the logits chunk a pipelined last stage keeps
    from meshplan.costmodel.torch_memory import logits_chunk_bytes, pipelined_output_peak_bytes
    lay = Layout(pp=2, tp=2, micro_batch=1)
    chunk = logits_chunk_bytes(TORCH, lay, MODEL)
    assert pipelined_output_peak_bytes(TORCH, lay, MODEL, 3 * chunk, NUMBERS) == 2 * chunk
    assert pipelined_output_peak_bytes(TORCH, lay, MODEL, 3 * chunk,
                                       NUMBERS.without(corr.OUTPUT_PEAK)) == 3 * chunk
    assert corr.OUTPUT_PEAK in layer_tables(MODEL, CLUSTER, TORCH, lay).corrections
    assert corr.OUTPUT_PEAK not in layer_tables(MODEL, CLUSTER, TORCH,
                                                lay.replace(tp=1, dp=2)).corrections


def test_megatron_layouts_get_no_correction():
    for lay in (Layout(pp=2, dp=2, micro_batch=1), Layout(dp=4, micro_batch=1, zero=2),
                Layout(pp=4, micro_batch=1, schedule="zero-bubble", recompute="full")):
        assert estimate(MODEL, CLUSTER, MEGATRON, lay).corrections == ()


def test_registry_names_each_correction_once_with_its_keys_and_mechanism():
    from meshplan.costmodel.registry import all_corrections
    regs = all_corrections()
    assert len({c.name for c in regs}) == len(regs)
    keys = [k for c in regs for k in c.profile_keys]
    assert sorted(keys) == sorted(k for k in NUMBER_KEYS if not k.startswith("host_"))
    assert all(len(c.mechanism) > 100 for c in regs)


def test_host_thresholds_move_caveats_only():
    from meshplan.costmodel.caveats import host_caveats
    low = replace(NUMBERS, host_near_load=0.5)
    assert host_caveats(0.0, 1.0, 0.6, 1.0, NUMBERS) == ()
    assert "near host-bound" in host_caveats(0.0, 1.0, 0.6, 1.0, low)[0]
    assert "host-bound" in host_caveats(0.06, 1.0, 1.06, 1.0, NUMBERS)[0]
    assert host_caveats(0.06, 1.0, 1.06, 1.0, replace(NUMBERS, host_bound_caveat_share=0.1)
                        )[0].startswith("near")


def test_balanced_host_load_says_it_is_not_priced():
    from meshplan.costmodel.caveats import HOST_BALANCED_LOAD, host_caveats
    below = host_caveats(0.0, 1.0, 0.9, 1.0, NUMBERS)[0]
    at = host_caveats(0.0, 1.0, 1.01, 1.0, NUMBERS)[0]
    assert HOST_BALANCED_LOAD == 0.95
    assert below.startswith("near host-bound") and "about the same time" not in below
    assert at.startswith("near host-bound: the CPU needs 101%")
    assert "about the same time" in at and "8-15 % slower than predicted" in at
    # the threshold is the profile's number, as its two siblings are
    later = host_caveats(0.0, 1.0, 1.01, 1.0, replace(NUMBERS, host_balanced_load=1.05))[0]
    assert later.startswith("near host-bound") and "about the same time" not in later


# ---- tensor-parallel collectives ---------------------------------------------------------
def _layer(job, sp, recompute="none"):
    links = group_links(CLUSTER, Layout(tp=4, dp=1, micro_batch=1))
    return layer_cost(MODEL, CLUSTER, job, micro_batch=1, tp=4, sequence_parallel=sp,
                      recompute=recompute, tp_link=links.tp)


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_sequence_parallel_tp_wire_bytes_equal_the_all_reduces_plus_the_wgrad_gathers(recompute):
    """RS + AG = AR on the wire: SP's collectives that replace the all-reduces send the same
    bytes; Megatron's backward all-gathers of the column-parallel inputs (QKV, MLP up) for
    their weight gradients are their own term; meshplan's executor keeps the gathered input
    and runs none."""
    act = 1 * 1024 * 1024 * 2
    gather = comm.wire_bytes_gather(4, act)
    plain, sp = _layer(MEGATRON, False, recompute), _layer(MEGATRON, True, recompute)
    assert sp.tp_wire_bytes == pytest.approx(plain.tp_wire_bytes)
    assert plain.wgrad_gather_wire_bytes == 0.0 and plain.wgrad_gather_s == 0.0
    assert sp.wgrad_gather_wire_bytes == pytest.approx(2 * gather)
    torch_sp = _layer(TORCH, True, recompute)
    assert torch_sp.tp_wire_bytes == pytest.approx(plain.tp_wire_bytes)
    assert torch_sp.wgrad_gather_wire_bytes == 0.0 == torch_sp.wgrad_gather_s


def test_sequence_parallel_runs_two_gathers_and_two_scatters_per_pass():
    link = group_links(CLUSTER, Layout(tp=4, dp=1, micro_batch=1)).tp
    act = 1 * 1024 * 1024 * 2
    two_pairs = 2 * (comm.all_gather_s(link, act) + comm.reduce_scatter_s(link, act))
    sp = _layer(TORCH, True)
    assert sp.forward.tp_comm_s == pytest.approx(two_pairs)
    assert sp.backward.tp_comm_s == pytest.approx(two_pairs)
    mega = _layer(MEGATRON, True)
    # the weight-gradient gathers hide behind the input-gradient GEMMs, less interference
    extra = mega.backward.tp_comm_s - two_pairs
    assert extra == pytest.approx(mega.wgrad_gather_s) and extra > 0
    assert extra <= 2 * comm.all_gather_s(link, act)
    plain = _layer(MEGATRON, False)
    assert plain.forward.tp_comm_s == pytest.approx(2 * comm.all_reduce_s(link, act))


def test_embedding_and_logits_collectives_with_and_without_sequence_parallelism():
    link = group_links(CLUSTER, Layout(tp=4, dp=1, micro_batch=1)).tp
    act = 1 * 1024 * 1024 * 2
    kw = dict(micro_batch=1, tp=4, tp_link=link)
    f, b = embedding_cost(MODEL, CLUSTER, MEGATRON, sequence_parallel=True, **kw)
    assert f.tp_comm_s == pytest.approx(comm.reduce_scatter_s(link, act))
    assert b.tp_comm_s == pytest.approx(comm.all_gather_s(link, act))
    f, b = embedding_cost(MODEL, CLUSTER, MEGATRON, sequence_parallel=False, **kw)
    assert f.tp_comm_s == pytest.approx(comm.all_reduce_s(link, act)) and b.tp_comm_s == 0.0
    _, b, _ = logits_cost(MODEL, CLUSTER, MEGATRON, sequence_parallel=False, **kw)
    assert b.tp_comm_s == pytest.approx(comm.all_reduce_s(link, act))
    _, b_torch, _ = logits_cost(MODEL, CLUSTER, TORCH, sequence_parallel=True, **kw)
    _, b_mega, _ = logits_cost(MODEL, CLUSTER, MEGATRON, sequence_parallel=True, **kw)
    assert b_torch.tp_comm_s == pytest.approx(comm.reduce_scatter_s(link, act))
    assert b_mega.tp_comm_s > b_torch.tp_comm_s
