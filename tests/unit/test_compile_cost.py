"""Layout.compile in the cost model, the planner and calibrate's compiled rows."""

import argparse
from dataclasses import replace

import pytest

from meshplan.calibrate.bench_layers import layer_row, plan_grid
from meshplan.commands.calibrate import add_arguments, child_argv
from meshplan.costmodel.autocast_cast import layer_cast_s
from meshplan.costmodel import estimate
from meshplan.costmodel.caveats import COMPILE_ANALYTICAL_CAVEAT, COMPILE_AS_EAGER_CAVEAT
from meshplan.costmodel.compiled_rows import ROW_COPY_BYTES, derive_compiled, row_weight_copies
from meshplan.costmodel.memory import stage_params
from meshplan.costmodel.measured import (Interpolated, MeasuredLayer, MeasuredTables,
                                         layer_shape_key, tables_from_rows)
from meshplan.errors import ProfileError
from meshplan.hardware_profiles import Cluster
from meshplan.hardware_profiles.calibrated import pool_cpu_fixed
from meshplan.planner.space import compile_options
from meshplan.spec import Job, Layout, ModelSpec

MODEL = ModelSpec(name="m", num_layers=8, hidden_size=1024, num_heads=16, vocab_size=32000,
                  max_seq_len=1024)
JOB = Job(global_batch=16, seq_len=1024, runtime="torch")


def _row(compile, fwd, bwd, **kw):
    return MeasuredLayer(**{**dict(
        shape=layer_shape_key(MODEL), seq_len=1024, tp=1, sequence_parallel=False,
        recompute="none", micro_batch=1, forward_s=fwd, backward_s=bwd,
        activation_bytes=1e8, backward_peak_bytes=1e7, compile=compile), **kw})


def _cluster(*rows):
    c = Cluster.preset("dgx-h100", nodes=1, gpus_per_node=4)
    return replace(c, gpu=replace(c.gpu, measured=MeasuredTables(tuple(rows), ())))


def test_compiled_rows_price_compiled_layouts_eager_rows_the_rest():
    cl = _cluster(_row(False, 2e-3, 4e-3), _row(True, 1.5e-3, 3e-3, activation_bytes=9e7))
    eager = estimate(MODEL, cl, JOB, Layout(dp=4, micro_batch=1))
    comp = estimate(MODEL, cl, JOB, Layout(dp=4, micro_batch=1, compile=True))
    m = 16 // 4
    # 8 layers × 4 micro-batches × (fwd + bwd) saved, and the eager layers' once-per-step
    # autocast weight casts, which the compiled rows hold per call (costmodel.autocast_cast)
    cast = 8 * layer_cast_s(MODEL, cl.gpu, JOB, Layout(dp=4, micro_batch=1))
    assert cast > 0
    assert eager.step_time_s - comp.step_time_s == pytest.approx(8 * m * 1.5e-3 + cast,
                                                                 rel=1e-6)
    assert COMPILE_AS_EAGER_CAVEAT not in comp.caveats
    assert comp.memory[0].activations_bytes < eager.memory[0].activations_bytes   # the row's own bytes


def test_without_a_compiled_row_compile_is_priced_as_eager_and_says_so():
    cl = _cluster(_row(False, 2e-3, 4e-3))
    eager = estimate(MODEL, cl, JOB, Layout(dp=4, micro_batch=1))
    comp = estimate(MODEL, cl, JOB, Layout(dp=4, micro_batch=1, compile=True))
    assert comp.step_time_s == eager.step_time_s and COMPILE_AS_EAGER_CAVEAT in comp.caveats
    # an FSDP2 layer whose recompute mode has no plain compiled row stays eager
    fsdp = _cluster(_row(False, 2e-3, 4e-3), _row(True, 1e-3, 2e-3),
                    _row(False, 2.5e-3, 5e-3, zero=3, dp=4, recompute="full"))
    assert COMPILE_AS_EAGER_CAVEAT in estimate(MODEL, fsdp, JOB, Layout(
        dp=4, micro_batch=1, zero=3, recompute="full", compile=True)).caveats


LLAMA = ModelSpec(name="l", num_layers=8, hidden_size=1024, num_heads=16, num_kv_heads=4,
                  vocab_size=32000, max_seq_len=1024, activation="swiglu", norm="rmsnorm",
                  position_embedding="rope", tied_embeddings=False, bias=False)


def test_without_any_layer_row_a_compiled_layer_moves_the_fused_count():
    from meshplan.costmodel.compute import hbm_s, layer_cost
    from meshplan.costmodel.torch_membound import gqa_repeat_bytes
    datasheet = Cluster.preset("dgx-h100", nodes=1, gpus_per_node=4)
    kw = dict(micro_batch=2, tp=1, sequence_parallel=False, recompute="none", tp_link=None)
    eager = layer_cost(LLAMA, datasheet, JOB, **kw)
    comp = layer_cost(LLAMA, datasheet, JOB, compiled=True, **kw)
    # Inductor's kernels: two norms (read, write), two residual adds (two reads, a write),
    # SwiGLU (two reads, a write) and RoPE on q and k, one read and one write per element
    n, f = 2 * 1024 * 1024, 2 * 1024 * LLAMA.ffn_hidden_size
    fused = 2 * (4 * n + 6 * n + 3 * f + 2 * (LLAMA.q_dim + LLAMA.kv_dim) * 2048)
    assert comp.forward.memory_bound_s == pytest.approx(hbm_s(datasheet.gpu, fused))
    assert comp.backward.memory_bound_s == pytest.approx(2 * comp.forward.memory_bound_s)
    assert comp.forward.memory_bound_s < eager.forward.memory_bound_s / 3
    # the executor's GQA repeat stays a copy beside the attention kernel, as eager
    no_gqa = layer_cost(replace(LLAMA, num_kv_heads=16), datasheet, JOB, compiled=True, **kw)
    repeat = hbm_s(datasheet.gpu, gqa_repeat_bytes(LLAMA, tokens=2048, tp=1, e=2))
    assert repeat > 0
    assert comp.forward.attention_s == pytest.approx(eager.forward.attention_s)
    assert comp.forward.attention_s - no_gqa.forward.attention_s == pytest.approx(repeat)
    assert comp.forward.gemm_s == eager.forward.gemm_s
    # Megatron's runtime already prices the fused kernels: compiled changes nothing there
    meg = replace(JOB, runtime="megatron")
    assert layer_cost(LLAMA, datasheet, meg, compiled=True, **kw) == layer_cost(
        LLAMA, datasheet, meg, **kw)
    # the estimate: a datasheet profile prices compile at the fused count and says so
    lay = Layout(dp=4, micro_batch=2)
    e_eager = estimate(LLAMA, datasheet, JOB, lay)
    e_comp = estimate(LLAMA, datasheet, JOB, replace(lay, compile=True))
    assert e_comp.step_time_s < e_eager.step_time_s
    assert COMPILE_ANALYTICAL_CAVEAT in e_comp.caveats
    assert COMPILE_AS_EAGER_CAVEAT not in e_comp.caveats
    # memory: the layers alike; the compiled loss keeps the 16-bit logits, no fp32 copy
    from meshplan.costmodel.torch_activations import torch_output_bytes
    kept_e, work_e = torch_output_bytes(LLAMA, JOB, 2, 1)
    kept_c, work_c = torch_output_bytes(LLAMA, JOB, 2, 1, compiled=True)
    assert (kept_c, work_c) == (kept_e / 2, work_e / 4)
    saved = e_eager.memory_peak_bytes - e_comp.memory_peak_bytes
    assert kept_e - kept_c <= saved <= (kept_e - kept_c) + (work_e - work_c)


def test_compile_is_part_of_a_rows_key_and_checked():
    rows = [dict(shape="s", seq_len=8, tp=1, sequence_parallel=False, recompute="none",
                 micro_batch=1, forward_s=1.0, backward_s=2.0, activation_bytes=0.0,
                 backward_peak_bytes=0.0, compile=c) for c in (False, True)]
    t = tables_from_rows(rows, [], "p.toml")
    assert t.has_compiled and len({r.group for r in t.layers}) == 2
    assert not tables_from_rows(rows[:1], [], "p.toml").has_compiled
    with pytest.raises(ProfileError, match="compile must be true or false, got 'yes'"):
        tables_from_rows([{**rows[0], "compile": "yes"}], [], "p.toml")


def test_planner_searches_compile_only_with_compiled_rows():
    assert compile_options(_cluster(_row(False, 1e-3, 2e-3)), {}) == [False]
    assert compile_options(_cluster(_row(True, 1e-3, 2e-3)), {}) == [False, True]
    assert compile_options(Cluster.preset("dgx-h100", nodes=1), {"compile": True}) == [True]
    # ... of the model's own layer shape and sequence length (compiled rows do not transfer)
    comp = _cluster(_row(True, 1e-3, 2e-3))
    assert compile_options(comp, {}, MODEL, 1024) == [False, True]
    assert compile_options(comp, {}, MODEL, 2048) == [False]
    assert compile_options(comp, {}, replace(MODEL, hidden_size=2048), 1024) == [False]
    from meshplan.planner.constraints import Constraints
    from meshplan.planner.plan import plan
    from meshplan.planner.space import enumerate_configs
    cl = _cluster(_row(False, 2e-3, 4e-3), _row(True, 1e-3, 2e-3))
    p = plan(MODEL, cl, JOB, top_k=3, constraints=Constraints(recompute=("none",), max_tp=1))
    assert p.best.layout.compile                    # the faster rows win where they apply
    # compile is searched only at the (tp, SP, recompute) the compiled rows cover: no
    # compiled layout priced as eager ties with (and shadows) its eager twin
    assert not any(c.layout.compile for c in plan(MODEL, cl, JOB, top_k=5).candidates
                   if c.layout.recompute != "none")
    cfgs = list(enumerate_configs(MODEL, cl, JOB, [4], Constraints()))
    assert {(c.tp, c.sequence_parallel, c.recompute) for c in cfgs if c.compile} == {(1, False, "none")}
    assert any(c.recompute == "full" for c in cfgs)


def test_calibrate_grid_adds_compiled_plain_rows_for_the_chosen_modes():
    tiny = ModelSpec(name="t", num_layers=2, hidden_size=64, num_heads=4, vocab_size=128,
                     max_seq_len=32)
    base = plan_grid([tiny], 32, 2, quick=True)
    grid = plan_grid([tiny], 32, 2, quick=True, compile_rows=("none",))
    extra = [c for c in grid if c.compile and not c.part]
    loss = [c for c in grid if c.compile and c.part]   # the compiled loss (test_compiled_loss_rows)
    assert len(grid) - len(base) == len(extra) + len(loss) and extra
    plain = [c for c in extra if c.zero == 0]
    assert {(c.recompute, c.zero, c.part) for c in plain} == {("none", 0, "")}
    assert {(c.tp, c.sequence_parallel, c.micro_batch) for c in plain} == {
        (c.tp, c.sequence_parallel, c.micro_batch) for c in base
        if not c.part and c.zero == 0 and c.recompute == "none"}
    # FSDP2 over the widest dp compiled, ZeRO-2 and 3 at the chosen modes, after every
    # eager row (a budget stopping before them leaves compile's change derived)
    fsdp = [c for c in extra if c.zero >= 2]
    assert {(c.zero, c.dp, c.tp, c.recompute) for c in fsdp} == {(2, 2, 1, "none"),
                                                                 (3, 2, 1, "none")}
    assert {c.micro_batch for c in fsdp} == {c.micro_batch for c in base if c.zero >= 2}
    assert grid[-len(fsdp):] == fsdp
    moe = replace(tiny, name="tm", num_experts=4, experts_per_token=2, moe_ffn_hidden_size=64)
    assert not [c for c in plan_grid([moe], 32, 2, quick=True, compile_rows=("none",))
                if c.compile and c.zero >= 2]       # MoE layers: derived as before
    cfg = plain[0]
    assert cfg.build_key != replace(cfg, compile=False).build_key and "compiled" in cfg.label()
    assert layer_row(cfg, (1e-3, 2e-3, 1e6, 2e6))["compile"] is True


def test_compiled_rows_pool_their_cpu_part_apart():
    row = dict(shape="s", forward_cpu_s=1e-3, backward_cpu_s=2e-3, forward_cpu_fixed_s=0.0,
               backward_cpu_fixed_s=0.0)
    eager = [{**row, "tp": 1, "forward_cpu_fixed_s": 1e-3}, {**row, "tp": 2,
                                                               "forward_cpu_fixed_s": 1e-3}]
    comp = {**row, "tp": 1, "compile": True}
    pooled = pool_cpu_fixed([*eager, comp])
    assert pooled[2]["forward_cpu_fixed_s"] == 0.0      # not the eager rows' median


def test_calibrate_cli_compile_rows_and_no_fp8_reach_the_children():
    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(["--compile-rows", "--no-fp8", "--nproc", "4"])
    assert args.compile_rows == ("none",)
    again = p.parse_args(child_argv(args)[1:])
    assert again.compile_rows == ("none",) and again.no_fp8
    assert p.parse_args(["--compile-rows", "none,full"]).compile_rows == ("none", "full")
    with pytest.raises(SystemExit):
        p.parse_args(["--compile-rows", "some"])
    assert "--compile-rows" not in child_argv(p.parse_args([]))


def _interp(f, b, fc, bc, fx, bx, act, peak):
    return Interpolated(forward_s=f, backward_s=b, activation_bytes=act, peak_bytes=peak,
                        forward_cpu_s=fc, backward_cpu_s=bc, forward_cpu_fixed_s=fx,
                        backward_cpu_fixed_s=bx, backward_input_s=1.0, backward_weight_s=1.0)


def test_derive_compiled_moves_the_compute_part_by_the_plain_pair():
    # CPU on the 2-block call: eager 1 + 0.8 / 2 = 1.4 ms forward, compiled 0.7: ratio 0.5
    pe = _interp(2e-3, 4e-3, 1e-3, 2e-3, 0.8e-3, 1.0e-3, 100.0, 40.0)
    pc = _interp(1.5e-3, 3e-3, 0.7e-3, 1.25e-3, 0.0, 0.0, 90.0, 20.0)
    fsdp = _interp(2.5e-3, 5e-3, 3e-3, 3e-3, 0.8e-3, 1.0e-3, 85.0, 60.0)
    d = derive_compiled(fsdp, pe, pc, weight_copy_bytes=10.0)
    # GPU: eager FSDP2 row less the plain eager row x (1 - compiled / eager)
    assert d.forward_s == pytest.approx(2.5e-3 - 2e-3 * 0.25)
    assert d.backward_s == pytest.approx(5e-3 - 4e-3 * 0.25)
    # CPU: both parts of the compute's dispatch by the pair's ratio, FSDP2's hooks kept
    assert d.forward_cpu_s == pytest.approx(3e-3 - 1e-3 * 0.5)
    assert d.forward_cpu_fixed_s == pytest.approx(0.8e-3 - 0.8e-3 * 0.5)
    kb = 1.25e-3 / (2e-3 + 0.5e-3)
    assert d.backward_cpu_s == pytest.approx(3e-3 - 2e-3 * (1 - kb))
    # kept bytes: the compiled row less its weight copies, at most the eager FSDP2 row's
    assert d.activation_bytes == pytest.approx(80.0)
    assert derive_compiled(replace(fsdp, activation_bytes=70.0), pe, pc, 10.0
                           ).activation_bytes == pytest.approx(70.0)
    assert d.peak_bytes == pytest.approx(60.0 * 20.0 / 40.0)
    assert d.split_backward is None     # one compiled backward, as compiled rows have
    # an eager row smaller than the plain one: only its own time can be saved
    small = derive_compiled(replace(fsdp, forward_s=1e-3), pe, pc, 10.0)
    assert small.forward_s == pytest.approx(1e-3 * 0.75)


def test_fsdp2_compiled_layout_priced_from_derived_rows_and_says_which():
    cl = _cluster(_row(False, 2e-3, 4e-3), _row(True, 1.5e-3, 3e-3),
                  _row(False, 2.5e-3, 5e-3, zero=3, dp=4, activation_bytes=8e7))
    eager = estimate(MODEL, cl, JOB, Layout(dp=4, micro_batch=1, zero=3))
    comp = estimate(MODEL, cl, JOB, Layout(dp=4, micro_batch=1, zero=3, compile=True))
    assert COMPILE_AS_EAGER_CAVEAT not in comp.caveats
    said = [c for c in comp.caveats if c.startswith("compile = True priced from")]
    assert len(said) == 1 and "eager FSDP2 row (ZeRO-3, dp 4, tp 1, recompute none, " \
        "micro-batch 1)" in said[0] and "GPU forward x0.75, backward x0.75" in said[0]
    # each layer's passes: 2.5 - 2 x 0.25 and 5 - 4 x 0.25 ms; the gathers as before
    m = 16 // 4
    assert eager.step_time_s - comp.step_time_s == pytest.approx(8 * m * 1.5e-3, rel=1e-6)
    # kept bytes: the plain compiled row's 1e8 less its weight copies, below the FSDP row's
    w = ROW_COPY_BYTES * stage_params(MODEL, 1, 1, first=False, last=False, pp=1)
    assert comp.memory[0].activations_bytes < eager.memory[0].activations_bytes
    assert eager.memory[0].activations_bytes - comp.memory[0].activations_bytes == \
        pytest.approx(8 * (8e7 - (1e8 - w)), rel=1e-6)


def test_compiled_plain_layers_hold_their_weight_copies_in_the_row_not_the_cast_cache():
    cl = _cluster(_row(False, 2e-3, 4e-3), _row(True, 1.5e-3, 3e-3))
    eager = estimate(MODEL, cl, JOB, Layout(dp=4, micro_batch=1))
    comp = estimate(MODEL, cl, JOB, Layout(dp=4, micro_batch=1, compile=True))
    copies = 8 * stage_params(MODEL, 1, 1, first=False, last=False, pp=1) * 2
    assert eager.memory[0].weights_bytes - comp.memory[0].weights_bytes == \
        pytest.approx(copies, rel=1e-9)


def test_full_recompute_rows_hold_no_weight_copies_so_none_are_taken_off():
    """A checkpointed compiled block keeps only its input (every profile's tp 1 compiled
    full row keeps what its eager row keeps): the derived FSDP2 row's kept bytes are the
    smaller of the eager FSDP2 row's and the compiled row's, with no w taken off (fp8h9's
    compiled ZeRO-3 full layout: with w its 56 MiB a layer came out 0)."""
    assert row_weight_copies(MODEL, 1, "full") == 0.0
    assert row_weight_copies(MODEL, 1, "selective") == pytest.approx(
        ROW_COPY_BYTES * stage_params(MODEL, 1, 1, first=False, last=False, pp=1))
    full = dict(recompute="full", activation_bytes=3e6)
    cl = _cluster(_row(False, 2e-3, 6e-3, **full), _row(True, 1.5e-3, 4.5e-3, **full),
                  _row(False, 2.5e-3, 7e-3, zero=3, dp=4, **full))
    lay = Layout(dp=4, micro_batch=1, zero=3, recompute="full")
    eager = estimate(MODEL, cl, JOB, lay)
    comp = estimate(MODEL, cl, JOB, lay.replace(compile=True))
    assert ROW_COPY_BYTES * stage_params(MODEL, 1, 1, first=False, last=False, pp=1) > 3e6
    assert comp.memory[0].activations_bytes == pytest.approx(
        eager.memory[0].activations_bytes) and eager.memory[0].activations_bytes >= 8 * 3e6


def test_a_compiled_fsdp2_row_is_read_as_timed_not_derived():
    """Calibrations since 2026-11-30 time FSDP2 rows compiled too (dense models): a compiled
    ZeRO-3 layout reads that row's time and kept bytes, with no derivation caveat; where the
    profile lacks it the derivation stands."""
    rows = (_row(False, 2e-3, 4e-3), _row(True, 1.5e-3, 3e-3),
            _row(False, 2.5e-3, 5e-3, zero=3, dp=4, activation_bytes=8e7))
    timed = _row(True, 2.3e-3, 4.6e-3, zero=3, dp=4, activation_bytes=7e7)
    lay = Layout(dp=4, micro_batch=1, zero=3, compile=True)
    derived = estimate(MODEL, _cluster(*rows), JOB, lay)
    read = estimate(MODEL, _cluster(*rows, timed), JOB, lay)
    assert any(c.startswith("compile = True priced from") for c in derived.caveats)
    assert not any(c.startswith("compile = True priced from") for c in read.caveats)
    assert COMPILE_AS_EAGER_CAVEAT not in read.caveats
    # each layer's passes: the timed row's 2.3 + 4.6 ms against the derived 2.0 + 4.0
    m = 16 // 4
    assert read.step_time_s - derived.step_time_s == pytest.approx(8 * m * 0.9e-3, rel=1e-6)
    # kept bytes: the timed row's 7e7 a layer, where the derivation took min(8e7, 1e8 − w)
    w = ROW_COPY_BYTES * stage_params(MODEL, 1, 1, first=False, last=False, pp=1)
    assert read.memory[0].activations_bytes - derived.memory[0].activations_bytes == \
        pytest.approx(8 * (7e7 - min(8e7, 1e8 - w)), rel=1e-6)


def _compiled_fsdp_worker(rank: int, world: int, init: str, out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    from _gloo import write_rank_result
    from meshplan.calibrate import bench_layers
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    t = bench_layers.bench_layer_rows([MODEL_TINY], 32, torch.device("cpu"), world, rank,
                                      quick=True, max_tp=1, micro_batches=(1,),
                                      compile_rows=("full",))
    write_rank_result(out_dir, rank, {"layers": [
        (r["zero"], r["dp"], r["recompute"], r["compile"], r["forward_s"], r["backward_s"])
        for r in t.layers]})


MODEL_TINY = ModelSpec(name="tiny-llama", num_layers=2, hidden_size=64, num_heads=4,
                       num_kv_heads=2, ffn_hidden_size=128, vocab_size=128, max_seq_len=32,
                       activation="swiglu", norm="rmsnorm", position_embedding="rope",
                       tied_embeddings=False, bias=False)


@pytest.mark.distributed
def test_two_ranks_time_fsdp2_rows_with_their_blocks_compiled(tmp_path):
    """Two gloo ranks, --compile-rows full: the FSDP2 rows over dp 2 (ZeRO-2 and 3) are
    also timed with the blocks compiled before FSDP2 wraps them, as ParallelTrainer builds
    a compiled ZeRO-2/3 layout."""
    pytest.importorskip("torch")
    from _gloo import run_gloo_ranks
    got = run_gloo_ranks(_compiled_fsdp_worker, 2, tmp_path)[0]["layers"]
    compiled_fsdp = [r for r in got if r[0] >= 2 and r[3]]
    assert {(r[0], r[1], r[2]) for r in compiled_fsdp} == {(2, 2, "full"), (3, 2, "full")}
    assert all(r[4] > 0 and r[5] > 0 for r in compiled_fsdp)


def test_a_datasheet_compiled_fp8_layout_says_its_casts_dispatch_is_not_priced():
    from meshplan.costmodel.caveats import COMPILE_ANALYTICAL_FP8_CAVEAT
    datasheet = Cluster.preset("dgx-h200", nodes=1, gpus_per_node=1)
    fp8 = replace(JOB, global_batch=4, precision="fp8")
    lay = Layout(micro_batch=2, compile=True)
    assert COMPILE_ANALYTICAL_FP8_CAVEAT in estimate(LLAMA, datasheet, fp8, lay).caveats
    # bf16, or fp8 from a profile's rows: not this caution
    assert COMPILE_ANALYTICAL_FP8_CAVEAT not in estimate(
        LLAMA, datasheet, replace(fp8, precision="bf16"), lay).caveats
    assert COMPILE_ANALYTICAL_FP8_CAVEAT not in estimate(
        LLAMA, datasheet, fp8, replace(lay, compile=False)).caveats
