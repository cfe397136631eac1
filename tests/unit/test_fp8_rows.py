"""Measured fp8 layer rows: the profile's lookup prefers them for fp8 jobs of the same recipe,
the cost model takes the layer from them instead of composing fp8 on the bf16 row
(meshplan.costmodel.fp8_rows), and `meshplan calibrate --fp8-rows` writes them on CPU."""

from dataclasses import asdict, replace

import pytest

from meshplan.costmodel.measured import (MeasuredEnd, MeasuredLayer, MeasuredTables,
                                         ends_shape_key, layer_shape_key, tables_from_rows)
from meshplan.costmodel.tables import layer_tables
from meshplan.errors import ProfileError
from meshplan.hardware_profiles import Cluster
from meshplan.spec import Job, Layout, ModelSpec

MODEL = ModelSpec(name="m", num_layers=8, hidden_size=1024, num_heads=16, vocab_size=32000,
                  max_seq_len=1024)
CLUSTER = Cluster.preset("dgx-h100", nodes=1, gpus_per_node=4)
KW = dict(seq_len=1024, tp=1, sequence_parallel=False, recompute="none")


def _row(fwd, bwd, mb=1, **kw):
    return MeasuredLayer(**{**dict(
        shape=layer_shape_key(MODEL), micro_batch=mb, forward_s=fwd, backward_s=bwd,
        activation_bytes=3e8 * mb, backward_peak_bytes=1e7, forward_cpu_s=4e-3,
        backward_cpu_s=5e-3), **KW, **kw})


def _end(part):
    return MeasuredEnd(shape=ends_shape_key(MODEL), part=part, seq_len=1024, tp=1,
                       sequence_parallel=False, micro_batch=1, forward_s=1e-4, backward_s=2e-4,
                       activation_bytes=1e6, peak_bytes=1e6, forward_cpu_s=3e-4,
                       backward_cpu_s=3e-4)


def _fp8(fwd, bwd, recipe="tensorwise", **kw):
    return _row(fwd, bwd, precision="fp8", fp8_recipe=recipe, **kw)


def _job(precision="fp8", recipe="tensorwise", runtime="torch"):
    return Job(global_batch=16, seq_len=1024, precision=precision, runtime=runtime,
               **({"fp8_recipe": recipe} if precision == "fp8" else {}))


def test_lookup_prefers_the_fp8_row_of_the_same_recipe_and_bf16_lookups_ignore_fp8_rows():
    t = MeasuredTables((_row(2e-3, 4e-3), _fp8(1.5e-3, 3e-3),
                        _fp8(1.7e-3, 3.3e-3, recipe="rowwise"),
                        _fp8(1.0e-3, 2e-3, compile=True)))
    assert t.layer(MODEL, micro_batch=1, **KW).forward_s == pytest.approx(2e-3)
    assert t.fp8_layer(MODEL, recipe="tensorwise", micro_batch=1, **KW).forward_s == \
        pytest.approx(1.5e-3)
    assert t.fp8_layer(MODEL, recipe="rowwise", micro_batch=1, **KW).forward_s == \
        pytest.approx(1.7e-3)
    assert t.fp8_layer(MODEL, recipe="tensorwise", micro_batch=1, compile=True,
                       **KW).forward_s == pytest.approx(1.0e-3)
    assert t.fp8_layer(MODEL, recipe="blockwise", micro_batch=1, **KW) is None
    assert t.layer(MODEL, micro_batch=1, compile=True, **KW) is None   # no bf16 compiled row


def test_rows_without_precision_load_as_bf16_and_bad_precision_is_named():
    raw = {k: v for k, v in asdict(_row(2e-3, 4e-3)).items()
           if k not in ("precision", "fp8_recipe")}
    t = tables_from_rows([raw], [], "p.toml")
    assert t.layers[0].precision == "bf16" and not t.has_fp8
    with pytest.raises(ProfileError, match="fp8_recipe"):
        tables_from_rows([{**raw, "precision": "fp8"}], [], "p.toml")
    with pytest.raises(ProfileError, match="precision must be"):
        tables_from_rows([{**raw, "precision": "fp16"}], [], "p.toml")
    with pytest.raises(ProfileError, match="applies only"):
        tables_from_rows([{**raw, "fp8_recipe": "tensorwise"}], [], "p.toml")


def _cluster(*rows):
    return replace(CLUSTER, gpu=replace(CLUSTER.gpu, fp8_cast_compiled_gbps=700.0,
                                        measured=MeasuredTables(
                                            tuple(rows), (_end("embedding"), _end("output")))))


@pytest.mark.parametrize("compile", [False, True])
@pytest.mark.usefixtures("no_grad_accumulation")
def test_an_fp8_row_replaces_the_composed_layer_time_bytes_and_dispatch(compile):
    bf16 = [_row(2e-3, 4e-3, mb, compile=c) for mb in (1, 2) for c in (False, True)]
    fp8 = [_fp8(1.2e-3 * mb, 2.5e-3 * mb, mb=mb, compile=compile, forward_cpu_s=6e-3,
                backward_cpu_s=7e-3, activation_bytes=2.2e8 * mb, backward_peak_bytes=3e7)
           for mb in (1, 2)]
    lay = Layout(dp=4, micro_batch=2, compile=compile)
    composed = layer_tables(MODEL, _cluster(*bf16), _job(), lay)
    t = layer_tables(MODEL, _cluster(*bf16, *fp8), _job(), lay)
    assert t.layer_forward_s == pytest.approx(2.4e-3)
    assert t.layer_backward_s == pytest.approx(5.0e-3)
    assert composed.layer_forward_s != pytest.approx(t.layer_forward_s)
    # kept bytes are the row's: neither the recomputed inputs nor the rows' weight copies
    # are taken off again
    assert t.layer_activation_bytes == pytest.approx(4.4e8)
    # the transient fp8 operands are in the row's backward peak, not added on top
    b16 = layer_tables(MODEL, _cluster(*bf16), _job("bf16"), lay)
    assert t.buffer_bytes == pytest.approx(b16.buffer_bytes - 1e7 + 3e7)
    assert t.cpu_layer_s == pytest.approx(13e-3)
    assert any("measured fp8 row (tensorwise, " + ("compiled" if compile else "eager") in c
               for c in t.caveats)
    assert not any("measured fp8 row (" in c for c in composed.caveats)
    # the eager step-long autocast weight copies stay the composition's (not in any row)
    assert t.layer_state_bytes == pytest.approx(composed.layer_state_bytes)


def test_fp8_rows_price_only_their_recipe_runtime_and_recompute_mode():
    bf16 = [_row(2e-3, 4e-3, mb) for mb in (1, 2)]
    fp8 = [_fp8(1.2e-3 * mb, 2.5e-3 * mb, mb=mb) for mb in (1, 2)]
    cl, lay = _cluster(*bf16, *fp8), Layout(dp=4, micro_batch=1)
    for j, l in ((_job(recipe="rowwise"), lay), (_job(runtime="megatron"), lay),
                 (_job(), replace(lay, recompute="selective"))):
        t = layer_tables(MODEL, cl, j, l)
        assert t.layer_forward_s != pytest.approx(1.2e-3)
        assert not any("measured fp8 row (" in c for c in t.caveats)
    # a compiled layout does not read the eager fp8 row (eager casts are far slower)
    t = layer_tables(MODEL, cl, _job(), replace(lay, compile=True))
    assert not any("measured fp8 row (" in c for c in t.caveats)


@pytest.mark.parametrize("recompute", ["selective", "full"])
@pytest.mark.usefixtures("no_grad_accumulation")
def test_a_missing_fp8_row_is_its_bf16_row_plus_the_difference_timed_at_another_mode(
        recompute):
    bf16 = [_row(2e-3, b, mb, recompute=rc) for mb in (1, 2)
            for rc, b in (("none", 4e-3), ("selective", 4.5e-3), ("full", 6e-3))]
    fp8 = [_fp8(1.5e-3, 3e-3, mb=mb) for mb in (1, 2)]        # at recompute none only
    lay = Layout(dp=4, micro_batch=1, recompute=recompute)
    t = layer_tables(MODEL, _cluster(*bf16, *fp8), _job(), lay)
    own = {"selective": 4.5e-3, "full": 6e-3}[recompute]
    # forward −0.5 ms, backward −1 ms; full recomputation runs the forward again: −0.5 more
    assert t.layer_forward_s == pytest.approx(1.5e-3)
    assert t.layer_backward_s == pytest.approx(own - 1e-3 - (0.5e-3 if recompute == "full"
                                                                 else 0.0))
    assert any("priced as the bf16 row plus the fp8 − bf16 difference the profile timed at "
               "recompute none" in c for c in t.caveats)
    # from a full-recompute pair to a mode without: the forward's difference comes off
    fp8_full = [_fp8(1.5e-3, 4.5e-3, mb=mb, recompute="full") for mb in (1, 2)]
    t = layer_tables(MODEL, _cluster(*bf16, *fp8_full), _job(), Layout(dp=4, micro_batch=1))
    assert t.layer_backward_s == pytest.approx(4e-3 - 1e-3)
    # no bf16 row at the layout's mode: composed, as before
    none = [r for r in bf16 if r.recompute == "none"]
    t = layer_tables(MODEL, _cluster(*none, *fp8), _job(), lay)
    assert not any("difference the profile timed" in c for c in t.caveats)


torch = pytest.importorskip("torch")


def test_cpu_calibrate_quick_writes_fp8_rows_that_price_an_fp8_estimate(tmp_path):
    import json

    from meshplan.cli import main as cli_main
    from meshplan.hardware_profiles.calibrated import apply_profile, load_profile
    tiny = dict(name="tiny-llama", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2,
                ffn_hidden_size=128, vocab_size=128, max_seq_len=64, activation="swiglu",
                norm="rmsnorm", position_embedding="rope", tied_embeddings=False, bias=False)
    (tmp_path / "tiny.json").write_text(json.dumps(tiny))
    out = tmp_path / "cpu.toml"
    assert cli_main(["calibrate", "--device", "cpu", "--quick", "--model",
                     str(tmp_path / "tiny.json"), "--fp8-rows", "tensorwise", "--out",
                     str(out), "--no-progress"]) == 0
    p = load_profile(out)
    assert p.provenance["fp8_rows"] == "tensorwise"
    cl = apply_profile(Cluster.preset("dgx-h100", nodes=1, gpus_per_node=1), out,
                       override=True)
    rows = [r for r in cl.gpu.measured.layers if r.precision == "fp8"]
    # quick: micro-batches 1, 2 at tp 1 (one process), eager, recompute none
    assert sorted(r.micro_batch for r in rows) == [1, 2]
    assert all(r.fp8_recipe == "tensorwise" and r.recompute == "none" and not r.compile
               and r.forward_s > 0 and r.backward_s > 0 for r in rows)
    assert any(r.precision == "bf16" for r in cl.gpu.measured.layers)
    # a CPU profile has no fp8 peak, which the composition's proportions need: its rows
    # beside the H100 datasheet's fp8 keys
    h100 = Cluster.preset("dgx-h100", nodes=1, gpus_per_node=1)
    cl = replace(h100, gpu=replace(h100.gpu, measured=cl.gpu.measured))
    model = ModelSpec(**tiny)
    j = Job(global_batch=4, seq_len=64, precision="fp8", runtime="torch")
    t = layer_tables(model, cl, j, Layout(micro_batch=2))
    row = cl.gpu.measured.fp8_layer(model, recipe="tensorwise", micro_batch=2, **{
        **KW, "seq_len": 64})
    assert t.layer_forward_s == pytest.approx(row.forward_s)
    assert any("measured fp8 row" in c for c in t.caveats)


def test_grid_adds_fp8_copies_of_the_plain_rows_compiled_at_the_compile_modes():
    from meshplan.calibrate.layer_grid import plan_grid
    small = ModelSpec(name="s", num_layers=2, hidden_size=64, num_heads=4, vocab_size=128,
                      max_seq_len=64)
    eager = [c for c in plan_grid([small], 64, 2, quick=True, fp8_rows="rowwise")
             if c.precision == "fp8"]
    # tp 1, tp 2, tp 2 + SP; micro-batches 1, 2; recompute none; eager
    assert len(eager) == 6 and {c.recompute for c in eager} == {"none"}
    assert all(c.fp8_recipe == "rowwise" and not c.compile and c.zero == 0 for c in eager)
    grid = plan_grid([small], 64, 1, quick=True, fp8_rows="tensorwise",
                     compile_rows=("none", "selective"))
    fp8 = [c for c in grid if c.precision == "fp8"]
    assert {(c.recompute, c.micro_batch) for c in fp8} == {
        (r, m) for r in ("none", "selective") for m in (1, 2)}
    assert all(c.compile for c in fp8)
    # after the bf16 compiled rows, one build key per (tp, SP, compile, recipe)
    assert grid.index(fp8[0]) > max(i for i, c in enumerate(grid)
                                    if c.compile and c.precision == "bf16")
    assert len({c.build_key for c in fp8}) == 1 and fp8[0].build_key != grid[0].build_key


def test_fp8_rows_option_reaches_torchrun_children_and_bad_recipes_are_refused(tmp_path):
    import argparse

    from meshplan.calibrate.run import CalibrateOptions
    from meshplan.commands.calibrate import add_arguments, child_argv
    from meshplan.errors import ConfigError
    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(["--out", "p.toml", "--fp8-rows", "--nproc", "2"])
    assert args.fp8_rows == "tensorwise"
    assert p.parse_args(child_argv(args)[1:]).fp8_rows == "tensorwise"
    assert "--fp8-rows" not in child_argv(p.parse_args(["--out", "p.toml"]))
    with pytest.raises(ConfigError, match="'delayed': not a recipe the executor runs"):
        CalibrateOptions(out=tmp_path / "p.toml", fp8_rows="delayed")


@pytest.mark.parametrize("recompute", ["selective", "full"])
def test_an_fsdp2_layer_gets_the_measured_fp8_change_of_kept_bytes(recompute):
    """FSDP2 rows are bf16: an fp8 ZeRO-3 layer keeps the derived bf16 FSDP2 row's bytes
    plus what the measured fp8 row keeps beyond the bf16 row it replaced, plus the autocast
    weight copies only the bf16 compiled row holds (none under full recomputation). fp8h9,
    compiled ZeRO-3 at full recomputation: the fp8 row kept 360 MiB a layer against bf16's
    56, the composition assumed no change and the layout peaked 17 % above its prediction."""
    from meshplan.costmodel.compiled_rows import row_weight_copies
    kw = dict(recompute=recompute, micro_batch=1)
    at = {k: v for k, v in KW.items() if k != "recompute"}

    def row(**x):
        return MeasuredLayer(**{**dict(shape=layer_shape_key(MODEL), forward_s=2e-3,
                                       backward_s=4e-3, backward_peak_bytes=1e7), **at, **kw,
                                **x})
    w = row_weight_copies(MODEL, 1, recompute)
    bf16_eager, bf16_comp = row(activation_bytes=1e8), row(activation_bytes=1e8 + w,
                                                           compile=True)
    fsdp = row(activation_bytes=0.9e8, zero=3, dp=4)
    fp8 = row(activation_bytes=4e8, compile=True, precision="fp8", fp8_recipe="tensorwise")
    lay = Layout(dp=4, zero=3, compile=True, **kw)
    t16 = layer_tables(MODEL, _cluster(bf16_eager, bf16_comp, fsdp), _job("bf16"), lay)
    t8 = layer_tables(MODEL, _cluster(bf16_eager, bf16_comp, fsdp, fp8), _job(), lay)
    assert t16.layer_activation_bytes == pytest.approx(0.9e8)
    assert t8.layer_activation_bytes == pytest.approx(0.9e8 + 4e8 - (1e8 + w) + w)
