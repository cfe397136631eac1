"""Layer-level calibration: the grid, the per-row arithmetic, the profile rows, --model JSON,
and a 2-rank gloo run of `meshplan calibrate --model` whose rows the cost model can look up."""

from __future__ import annotations

import argparse
import json
import re
import sys
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

from _gloo import run_gloo_ranks, write_rank_result

from meshplan.calibrate import profile as prof
from meshplan.calibrate.bench_layers import (Config, Sample, end_row, end_values, layer_row,
                                             layer_values, plan_grid)
from meshplan.calibrate.tomlfile import dumps
from meshplan.commands.calibrate import add_arguments, child_argv
from meshplan.commands.common import load_model
from meshplan.costmodel.measured import layer_shape_key, tables_from_rows
from meshplan.spec import ModelSpec
from meshplan.errors import ConfigError
from meshplan.hardware_profiles import builtin_gpu

ROOT = Path(__file__).parents[2]
TINY = ModelSpec(name="tiny-llama", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2,
                 ffn_hidden_size=128, vocab_size=128, max_seq_len=32, activation="swiglu",
                 norm="rmsnorm", position_embedding="rope", tied_embeddings=False, bias=False)
# tp 1, 2, 4 valid (heads 8, kv 4, ffn 256); vocab 102 is divisible by 2, not by 4
GPTISH = ModelSpec(name="gptish", num_layers=4, hidden_size=128, num_heads=8, num_kv_heads=4,
                   ffn_hidden_size=256, vocab_size=102, max_seq_len=64)


# ---- grid ------------------------------------------------------------------------------------
def _count(grid, **kw):
    return sum(all(getattr(c, k) == v for k, v in kw.items()) for c in grid)


def test_grid_on_four_ranks_matches_the_spec():
    model = replace(GPTISH, vocab_size=128)
    grid = plan_grid([model], None, 4, quick=False)
    plain = [c for c in grid if not c.part and c.zero == 0]
    # tp1 (no SP) + tp2 (SP off/on) + tp4 (SP off/on) = 5, × 3 recompute × 3 micro-batches
    assert len(plain) == 5 * 3 * 3
    assert {(c.tp, c.sequence_parallel) for c in plain} == {(1, False), (2, False), (2, True),
                                                            (4, False), (4, True)}
    assert {c.micro_batch for c in plain} == {1, 2, 4}
    fsdp = [c for c in grid if c.zero and c.dp > 1]
    # zero 2/3 × 3 recompute × micro-batch 1/2 × (tp 1 at dp 2 and 4, tp 2 with SP off/on at
    # dp 2: dp·tp must tile the 4 ranks; tp 4 leaves no dp)
    assert len(fsdp) == 2 * 3 * 2 * (2 + 2)
    # FSDP2's compute alone (ZeRO-2 on a 1-rank mesh, for pipelined ZeRO-2 stages): tp 1,
    # every recompute and micro-batch, and no communication in its timed passes
    alone = [c for c in grid if c.zero and c.dp == 1]
    assert {(c.zero, c.tp, c.sequence_parallel) for c in alone} == {(2, 1, False)}
    assert len(alone) == 3 * 3 and not any(c.communicates for c in alone)
    assert all(c.communicates for c in fsdp)
    assert {(c.zero, c.dp, c.tp, c.sequence_parallel) for c in fsdp} == {
        (z, dp, tp, sp) for z in (2, 3) for dp, tp, sp in
        ((2, 1, False), (4, 1, False), (2, 2, False), (2, 2, True))}
    assert "zero2 dp2 tp2 sp" in next(c for c in fsdp if c.tp == 2 and c.sequence_parallel
                                       and c.zero == 2).label()
    # the widest dp first, ZeRO-2 and 3 side by side (a short --time-budget ends in this
    # phase: FSDP2 over the whole node is what one-node plans run)
    order = list(dict.fromkeys((c.tp, c.sequence_parallel, c.dp, c.zero) for c in fsdp))
    assert order[:4] == [(1, False, 4, 2), (1, False, 4, 3), (1, False, 2, 2), (1, False, 2, 3)]
    ends = [c for c in grid if c.part]
    assert len(ends) == 2 * 5 * 3
    assert all(c.seq_len == model.max_seq_len for c in grid)
    # configurations sharing a module are adjacent, so each module is built once
    keys = [c.build_key for c in grid]
    assert len(set(keys)) == sum(1 for i, k in enumerate(keys) if i == 0 or keys[i - 1] != k)


def test_fsdp_rows_cross_their_tp_groups_like_the_executor_mesh():
    from meshplan.calibrate.bench_layers import dp_mesh_shape
    assert dp_mesh_shape(4, 2, 2) == (1, 2, 2)   # dp groups {0, 2}, {1, 3}; tp {0, 1}, {2, 3}
    assert dp_mesh_shape(4, 2, 1) == (2, 2, 1)
    assert dp_mesh_shape(8, 2, 2) == (2, 2, 2)
    with pytest.raises(ConfigError, match="dp 4 × tp 2 does not tile a world of 4"):
        dp_mesh_shape(4, 4, 2)


def test_grid_respects_world_seq_vocab_and_quick():
    grid = plan_grid([GPTISH], 60, 4, quick=True)     # 60 % 8 != 0 but 60 % 4 == 0
    assert {c.micro_batch for c in grid} == {1, 2}
    assert _count(grid, tp=4, sequence_parallel=True, part="") == 3 * 2
    ends = {(c.part, c.tp) for c in grid if c.part}
    assert ends == {("embedding", 1), ("embedding", 2), ("output", 1), ("output", 2)}  # 102 % 4
    grid = plan_grid([GPTISH], 62, 4, quick=True)     # 62 % 4 != 0: no SP at tp 4
    assert _count(grid, tp=4, sequence_parallel=True) == 0
    assert _count(grid, tp=4, sequence_parallel=False, part="") == 3 * 2
    one = plan_grid([GPTISH], None, 1, quick=True)    # one rank: tp 1 only, no FSDP
    assert {c.tp for c in one} == {1} and not any(c.zero for c in one)
    three = plan_grid([GPTISH], None, 3, quick=True)  # tp must divide the world: 1 only
    assert {c.tp for c in three} == {1} and {c.dp for c in three if c.zero} == {1, 3}
    two_models = plan_grid([GPTISH, TINY], None, 2, quick=True)
    assert {c.model.name for c in two_models} == {"gptish", "tiny-llama"}
    assert {c.seq_len for c in two_models if c.model.name == "tiny-llama"} == {32}


def test_grid_rejects_a_sequence_longer_than_the_model():
    with pytest.raises(ConfigError, match="--seq-len 128 exceeds tiny-llama"):
        plan_grid([TINY], 128, 2, quick=True)


# ---- per-row arithmetic ----------------------------------------------------------------------
def test_layer_values_per_layer_time_and_memory():
    s = [Sample(0.004, 0.010, 100.0, 1100.0, 1500.0), Sample(0.008, 0.014, 100.0, 1100.0, 1450.0),
         Sample(0.006, 0.012, 100.0, 1060.0, 1400.0)]
    fwd, bwd, act, peak = layer_values(s, layers=4, input_bytes=40.0, output_bytes=60.0)
    assert fwd == pytest.approx(0.006 / 4) and bwd == pytest.approx(0.012 / 4)
    # the largest kept (1000) − output (60) + input (40), over 4 layers
    assert act == pytest.approx(980.0 / 4)
    assert peak == pytest.approx(400.0)              # max(peak − after forward)
    _, _, act_held, _ = layer_values(s, layers=4, input_bytes=40.0, output_bytes=60.0,
                                     held_bytes=180.0)
    assert act_held == pytest.approx(800.0 / 4)
    assert layer_values(s, layers=4, input_bytes=40.0, output_bytes=60.0,
                        memory=False)[2:] == (0.0, 0.0)
    low = [Sample(0.001, 0.002, 100.0, 50.0, 40.0)]  # allocator readings below: clamp at 0
    assert layer_values(low, layers=2, input_bytes=0.0, output_bytes=10.0)[2:] == (0.0, 0.0)


def test_end_values_count_the_input_of_the_output_part_only():
    s = [Sample(0.002, 0.003, 1000.0, 1800.0, 2600.0)]
    emb = end_values(s, input_bytes=0.0, output_bytes=300.0)
    assert emb == pytest.approx((0.002, 0.003, 500.0, 800.0))
    out = end_values(s, input_bytes=300.0, output_bytes=4.0)
    assert out == pytest.approx((0.002, 0.003, 1096.0, 800.0))


def test_rows_parse_and_look_up_with_interpolation():
    rows = [layer_row(Config(model=TINY, seq_len=32, tp=2, sequence_parallel=True,
                             recompute="full", micro_batch=mb), (mb * 1e-3, mb * 2e-3, mb * 1e6, 5e5))
            for mb in (1, 2)]
    rows.append(layer_row(Config(model=TINY, seq_len=32, tp=1, sequence_parallel=False,
                                 recompute="none", micro_batch=1, zero=3, dp=2),
                          (1e-3, 3e-3, 2e6, 1e6)))
    ends = [end_row(Config(model=TINY, seq_len=32, tp=2, sequence_parallel=False, micro_batch=1,
                           part="output"), (1e-4, 2e-4, 3e5, 4e5))]
    assert rows[0]["shape"] == layer_shape_key(TINY) and rows[0]["model"] == "tiny-llama"
    assert rows[0]["backward_input_s"] == 0.0              # four values: split not measured
    split = layer_row(Config(model=TINY, seq_len=32, tp=1, sequence_parallel=False,
                             micro_batch=1), (1e-3, 2e-3, 0.0, 0.0, 1.5e-3, 1e-3))
    assert (split["backward_input_s"], split["backward_weight_s"]) == (1.5e-3, 1e-3)
    t = tables_from_rows(rows, ends, "test")
    r = t.layer(TINY, seq_len=32, tp=2, sequence_parallel=True, recompute="full", micro_batch=4)
    assert r.forward_s == pytest.approx(4e-3) and r.activation_bytes == pytest.approx(4e6)
    z = t.layer(TINY, seq_len=32, tp=1, sequence_parallel=False, recompute="none",
                micro_batch=1, zero=3, dp=2)
    assert z.backward_s == pytest.approx(3e-3) and z.peak_bytes == pytest.approx(1e6)
    e = t.end(TINY, "output", seq_len=32, tp=2, sequence_parallel=False, micro_batch=1)
    assert e.peak_bytes == pytest.approx(4e5)


# ---- profile ---------------------------------------------------------------------------------
def test_profile_writes_layers_ends_pipeline_and_optimizer():
    h100 = builtin_gpu("H100-SXM5-80GB")
    layers = [layer_row(Config(model=TINY, seq_len=32, tp=1, sequence_parallel=False,
                               micro_batch=1), (1e-3, 2e-3, 1e6, 2e6))]
    ends = [end_row(Config(model=TINY, seq_len=32, tp=1, sequence_parallel=False, micro_batch=1,
                           part="embedding"), (1e-4, 2e-4, 0.0, 1e5))]
    rows = {"membound": [{"op": "adamw", "elements": 1000, "model_bytes": 32e9, "seconds": 0.02}],
            "pipeline": [{"kind": "pipeline_action_s", "seconds": 2.5e-4, "step_seconds": 0.01,
                          "pp": 4, "microbatches": 8}]}
    doc = prof.build_profile(measurements=rows, base=h100, device="cuda",
                             provenance={"machine": "m"}, layers=layers, ends=ends)
    back = tomllib.loads(dumps(doc))
    assert back["gpu"]["pipeline_action_s"] == pytest.approx(2.5e-4)
    assert back["gpu"]["optimizer_gbps"] == pytest.approx(32e9 / 0.02 / 1e9)
    assert {"pipeline_action_s", "optimizer_gbps", "layers", "ends"} <= set(back["measured"])
    assert back["layers"] == layers and back["ends"] == ends
    plain = prof.build_profile(measurements={}, base=h100, device="cuda", provenance={})
    assert "layers" not in plain and "pipeline_action_s" not in plain["measured"]


def test_pipeline_action_arithmetic():
    pytest.importorskip("torch")
    from meshplan.calibrate.bench_pipeline import action_seconds, extrapolate_action
    # 2 and 4 layers per stage, 8 micro-batches, pp 4: 22 actions on the critical path;
    # 0.1 ms per action + 1 ms per layer per action
    assert extrapolate_action(22 * 2.1e-3, 22 * 4.1e-3, 8, 4) == pytest.approx((1e-4, 1e-3))
    assert extrapolate_action(22 * 4e-3, 22 * 3e-3, 8, 4)[1] == 0.0   # noise: clamped
    # 1F1B, pp 2, 4 micro-batches: 5 slots of forward + backward on the critical path
    assert action_seconds(1.0, 4, 2) == pytest.approx(0.1)


# ---- command line ----------------------------------------------------------------------------
def test_load_model_reads_modelspec_json_and_hf_config(tmp_path):
    spec_file = tmp_path / "tiny.json"
    spec_file.write_text(json.dumps(TINY.to_dict()))
    assert load_model(str(spec_file)) == TINY
    hf = tmp_path / "config.json"
    hf.write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
                              "num_attention_heads": 4, "num_key_value_heads": 2,
                              "intermediate_size": 128, "vocab_size": 128,
                              "max_position_embeddings": 64}))
    m = load_model(str(hf))
    assert m.num_kv_heads == 2 and m.activation == "swiglu"


def test_load_model_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**TINY.to_dict(), "num_heads": 3}))   # 64 % 3 != 0
    with pytest.raises(ConfigError, match="bad.json.*num_heads"):
        load_model(str(bad))
    unknown = tmp_path / "unknown.json"
    unknown.write_text(json.dumps({**TINY.to_dict(), "hiden": 1}))
    with pytest.raises(ConfigError, match="unknown.json.*hiden"):
        load_model(str(unknown))
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ConfigError, match="broken.json.*not valid JSON"):
        load_model(str(broken))
    with pytest.raises(ConfigError, match="missing.json.*does not exist"):
        load_model(str(tmp_path / "missing.json"))
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="list.json.*JSON object"):
        load_model(str(listed))


def test_child_argv_keeps_every_model_and_drops_nproc():
    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(["--model", "a.json", "--model", "llama3-8b", "--nproc", "4", "--quick",
                         "--out", "x.toml", "--seq-len", "1024", "--no-progress"])
    argv = child_argv(args)
    assert "--nproc" not in argv and argv[0] == "calibrate"
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--model"] == ["a.json", "llama3-8b"]
    again = p.parse_args(argv[1:])
    for k in ("model", "quick", "out", "seq_len", "no_progress", "device", "max_tp"):
        assert getattr(again, k) == getattr(args, k)


def test_micro_batch_sizes_option_sets_the_grid():
    from meshplan.calibrate.bench_layers import micro_batch_sizes
    assert micro_batch_sizes(False) == (1, 2, 4) and micro_batch_sizes(True) == (1, 2)
    assert micro_batch_sizes(False, (8, 2, 4, 2)) == (2, 4, 8)
    with pytest.raises(ConfigError, match=r"integers >= 1, got \[2, 0\]"):
        micro_batch_sizes(False, (2, 0))
    grid = plan_grid([TINY], 32, 4, quick=False, micro_batches=(2, 4, 8))
    assert {c.micro_batch for c in grid if not c.zero} == {2, 4, 8}
    assert {c.micro_batch for c in grid if c.communicates} == {2, 4}  # FSDP: the two smallest
    # ... FSDP2's compute alone at every size: pipelined stages run any of them
    assert {c.micro_batch for c in grid if c.zero and not c.communicates} == {2, 4, 8}
    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(["--micro-batches", "2,4, 8", "--out", "x.toml"])
    assert args.micro_batches == (2, 4, 8)
    assert child_argv(args)[child_argv(args).index("--micro-batches") + 1] == "2,4,8"
    assert "--split-timing" not in child_argv(args)         # the default is not repeated
    queued = p.parse_args(["--split-timing", "queued", "--out", "x.toml"])
    assert child_argv(queued)[child_argv(queued).index("--split-timing") + 1] == "queued"
    for bad in ("2,x", "0", ","):
        with pytest.raises(SystemExit):
            p.parse_args(["--micro-batches", bad])


def test_split_depth_is_the_growth_per_extra_layer():
    from meshplan.calibrate.bench_layers import split_depth
    # per layer: W 1.0 ms on 2 blocks, 1.4 ms on 6 → +0.1 ms per extra layer; B unchanged
    assert split_depth((0.5e-3, 1.0e-3), (0.5e-3, 1.4e-3), 2, 6) == pytest.approx((0.0, 1e-4))
    assert split_depth((0.0, 1.0e-3), (0.5e-3, 1.4e-3), 2, 6)[0] == 0.0   # not measured
    with pytest.raises(ValueError, match="must exceed"):
        split_depth((1, 1), (1, 1), 6, 2)


# ---- end to end: two gloo ranks (conftest's two_rank_profile: one calibration, two tests) -----
@pytest.mark.distributed
@pytest.mark.slow
def test_two_rank_calibration_runs_the_rounds_the_budget_allows(two_rank_profile):
    """The real loop on two gloo ranks (torchrun): the agreed decision lets round 2 run, and
    its collectives line up on both ranks (a disagreement would hang here, not pass)."""
    doc = two_rank_profile
    assert doc["provenance"]["world_size"] == 2
    assert doc["provenance"]["layer_rounds"] == 2
    assert doc["provenance"]["time_budget_s"] == 100000.0
    assert {(r["tp"], r["zero"]) for r in doc["layers"]} >= {(1, 0), (2, 0), (1, 2), (1, 3)}
    # the collective benchmark timed broadcasts at the all-gathers' sizes, and they were kept
    coll = doc["measurements"]["collectives"]
    gathers = sorted((r["group_size"], r["nbytes"]) for r in coll if r["op"] == "all_gather")
    bcasts = sorted((r["group_size"], r["nbytes"]) for r in coll if r["op"] == "broadcast")
    assert bcasts == gathers and gathers
    assert all(r["seconds"] > 0 for r in coll if r["op"] == "broadcast")
    if "nvlink_broadcast_efficiency" in doc["measured"]:
        assert all(0 < y <= 1 for _, y in doc["gpu"]["nvlink_broadcast_efficiency"])


@pytest.mark.distributed
@pytest.mark.slow
def test_two_rank_calibrate_writes_layer_tables(two_rank_profile):
    doc = two_rank_profile
    t = tables_from_rows(doc["layers"], doc["ends"], "profile")
    r = t.layer(TINY, seq_len=32, tp=2, sequence_parallel=True, recompute="full", micro_batch=1)
    assert r is not None and r.forward_s > 0 and r.backward_s > 0
    # every plain configuration of the grid (micro-batch 1) on two ranks is there
    plain = {(x["tp"], x["sequence_parallel"], x["recompute"], x["micro_batch"])
             for x in doc["layers"] if x["zero"] == 0}
    assert len(plain) == 3 * 3 * 1
    fsdp = {(x["zero"], x["dp"]) for x in doc["layers"] if x["zero"]}
    assert fsdp == {(2, 2), (3, 2), (2, 1)}
    # the sustained-clock loop ran on every module, FSDP2 over dp 2 and tp 2 included (both
    # ranks the same iterations): one measured ratio per module, on each of its rows
    per_module: dict = {}
    for x in doc["layers"]:
        key = (x["tp"], x["sequence_parallel"], x["zero"], x["dp"])
        per_module.setdefault(key, set()).add(x["sustained_ratio"])
    assert len(per_module) == 6 and all(len(v) == 1 for v in per_module.values())
    assert all(v > 0 for vs in per_module.values() for v in vs)
    assert all(e["sustained_ratio"] > 0 for e in doc["ends"])
    assert doc["provenance"]["sustained_s"] == 0.02
    # FSDP2's compute alone (1-rank mesh), which pipelined ZeRO-2 stages run at: its own
    # lookup, not the plain row's
    alone = t.fsdp_compute_layer(TINY, seq_len=32, tp=1, sequence_parallel=False,
                                 recompute="full", micro_batch=1)
    plain1 = t.layer(TINY, seq_len=32, tp=1, sequence_parallel=False, recompute="full",
                     micro_batch=1, zero=2, dp=1)
    assert alone is not None and alone.forward_s > 0 and alone.backward_s > 0
    assert plain1 is not None and plain1 != alone
    for zero in (2, 3):
        z = t.layer(TINY, seq_len=32, tp=1, sequence_parallel=False, recompute="selective",
                    micro_batch=1, zero=zero, dp=2)
        assert z is not None and z.forward_s > 0 and z.backward_s > 0
    for part in ("embedding", "output"):
        for tp, sp in ((1, False), (2, False), (2, True)):
            e = t.end(TINY, part, seq_len=32, tp=tp, sequence_parallel=sp, micro_batch=1)
            assert e is not None and e.forward_s > 0 and e.backward_s > 0
    # zero-bubble's split backward: measured for the plain rows where torch has it
    import importlib.util
    if importlib.util.find_spec("torch.distributed.pipelining._backward") is not None:
        assert all(x["backward_input_s"] > 0 and x["backward_weight_s"] > 0
                   for x in doc["layers"] if x["zero"] == 0)
        assert r.split_backward is not None
        # ... and for FSDP2 held unsharded as a stage holds it (a list of parameters taken
        # before the forward names the sharded ones: W then fails and is not measured)
        assert all(x["backward_input_s"] > 0 and x["backward_weight_s"] > 0
                   for x in doc["layers"] if x["zero"] == 2 and x["dp"] == 1)
        assert alone.split_backward is not None
        # ... and its growth with the stack, from the same split on SPLIT_DEEP_LAYERS blocks
        from meshplan.calibrate.bench_layers import LAYERS_CPU
        assert all(x["split_layers"] == LAYERS_CPU for x in doc["layers"] if x["zero"] == 0)
        assert r.split_depth is not None and r.split_depth[2] == LAYERS_CPU
        # ... and with full recomputation its memory, on the 2-rank tp rows too (CPU:
        # through the dispatch-mode tracker)
        for x in doc["layers"]:
            if x["zero"] == 0:
                assert (x["wgrad_transient_bytes"] > 0) == (x["recompute"] == "full"), x
        assert r.wgrad_transient_bytes > 0 and r.wgrad_pending_bytes >= 0
    assert all(x["backward_input_s"] == 0 == x["backward_weight_s"]
               for x in doc["layers"] if x["zero"] and x["dp"] > 1)
    # CPU: no allocator statistics, so no memory figures
    assert all(x["activation_bytes"] == 0.0 for x in doc["layers"])
    # the schedule's own cost per action, extrapolated to 0 layers: >= 0 (0 when it is
    # lost in the tiny layers' CPU noise, as on a loaded 2-core machine)
    assert doc["gpu"]["pipeline_action_s"] >= 0 and doc["gpu"]["optimizer_gbps"] > 0
    assert 0 <= doc["gpu"]["overlap_interference"] <= 2
    assert "overlap_interference" in doc["measured"]
    pipe = doc["measurements"]["pipeline"][0]
    assert pipe["pp"] == 2 and pipe["microbatches"] == 4
    assert pipe["seconds"] >= 0 and pipe["per_layer_s"] >= 0 and pipe["step_seconds"] > 0
    assert {"layers", "ends", "pipeline_action_s"} <= set(doc["measured"])
    assert doc["provenance"]["model"] == "tiny-llama"
    assert doc["provenance"]["micro_batches"] == "1"


# ---- out of memory: skipped, larger micro-batches of the same setting not tried ---------------
class _FakeOOM(Exception):
    pass


class _Recorder:
    def __init__(self):
        self.messages: list[str] = []

    def step(self, message: str) -> None:
        self.messages.append(message)

    def note(self, message: str) -> None:
        # a calibration's notes (e.g. a compiled row whose backward timed shorter than its
        # forward, which CPU timing noise can produce on a tiny model)
        self.messages.append(message)


def test_out_of_memory_skips_the_row_and_larger_micro_batches(monkeypatch):
    torch = pytest.importorskip("torch")
    from meshplan.calibrate import bench_layers
    real = bench_layers._run_layer
    tried: list[tuple[str, int]] = []

    def run_layer(cfg, *a, **kw):
        tried.append((cfg.recompute, cfg.micro_batch))
        if cfg.recompute == "none" and cfg.micro_batch >= 2:
            raise _FakeOOM("CUDA out of memory")
        return real(cfg, *a, **kw)

    monkeypatch.setattr(bench_layers, "_oom_types", lambda: (_FakeOOM,))
    monkeypatch.setattr(bench_layers, "_run_layer", run_layer)
    prog = _Recorder()
    tables = bench_layers.bench_layer_rows([TINY], None, torch.device("cpu"), 1, 0,
                                           quick=False, progress=prog)
    layers, ends = tables.layers, tables.ends
    got = {(r["recompute"], r["micro_batch"]) for r in layers}
    assert got == {("none", 1)} | {(rc, mb) for rc in ("selective", "full") for mb in (1, 2, 4)}
    assert ("none", 4) not in tried                     # known to fail after mb 2 did
    assert len(prog.messages) == len(plan_grid([TINY], None, 1, quick=False))
    assert sum("out of memory on some rank" in m for m in prog.messages) == 1
    assert sum("smaller micro-batch" in m for m in prog.messages) == 1
    assert sum("skipped" in m for m in prog.messages) == 2
    assert {(e["part"], e["micro_batch"]) for e in ends} == {(p, mb) for p in ("embedding", "output")
                                                            for mb in (1, 2, 4)}
    assert all(r["forward_s"] > 0 and r["backward_s"] > 0 for r in layers + ends)


def test_a_failing_fsdp2_one_rank_row_is_skipped_not_fatal(monkeypatch):
    """FSDP2's 1-rank rows are new on GPUs: any error there skips the row (and its larger
    micro-batches), the calibration goes on; an error in any other row still stops it."""
    torch = pytest.importorskip("torch")
    from meshplan.calibrate import bench_layers
    real_grid, real_build, real_run = (bench_layers.plan_grid, bench_layers._build,
                                       bench_layers._run_layer)

    def grid(models, seq, world, **kw):     # one rank: add the 1-rank rows by hand
        g = real_grid(models, seq, world, **kw)
        plain = [c for c in g if not c.part and c.recompute == "full"]
        return plain + [replace(c, zero=2, dp=1) for c in plain]

    def build(cfg, *a, **kw):
        return (None, None) if cfg.zero else real_build(cfg, *a, **kw)

    def run_layer(cfg, *a, **kw):
        if cfg.zero:
            raise RuntimeError("split backward: no such parameter")
        return real_run(cfg, *a, **kw)

    monkeypatch.setattr(bench_layers, "plan_grid", grid)
    monkeypatch.setattr(bench_layers, "_build", build)
    monkeypatch.setattr(bench_layers, "_run_layer", run_layer)
    prog = _Recorder()
    layers = bench_layers.bench_layer_rows([TINY], None, torch.device("cpu"), 1, 0,
                                           quick=True, progress=prog).layers
    assert {r["zero"] for r in layers} == {0} and len(layers) == 2      # mb 1 and 2
    failed = [m for m in prog.messages if "failed (RuntimeError: split backward" in m]
    assert len(failed) == 1 and "zero2 dp1" in failed[0] and "mb1" in failed[0]
    assert any("zero2 dp1" in m and "smaller micro-batch" in m for m in prog.messages)

    def plain_fails(cfg, *a, **kw):
        raise RuntimeError("boom")
    monkeypatch.setattr(bench_layers, "_run_layer", plain_fails)
    with pytest.raises(RuntimeError, match="boom"):
        bench_layers.bench_layer_rows([TINY], None, torch.device("cpu"), 1, 0, quick=True)


def test_rounds_combine_by_median_and_cpu_pools_over_micro_batches():
    from meshplan.calibrate.bench_layers import combine_rounds, pooled_cpu
    # times: median of the rounds (a slow round does not move it); memory: the largest
    rounds = [[1.0, 2.0, 100.0, 7.0], [1.2, 2.2, 120.0, 5.0], [5.0, 9.0, 110.0, 6.0]]
    assert combine_rounds(rounds, (2, 3)) == [1.2, 2.2, 120.0, 7.0]
    grid = plan_grid([TINY], None, 1, quick=False)
    idx = [i for i, c in enumerate(grid) if not c.part and c.tp == 1
           and c.recompute == "none"]                       # micro-batch 1, 2, 4
    assert len(idx) == 3
    # values: fwd, bwd, act, peak, B, W, fwd cpu, bwd cpu, bad; two rounds each
    measured = {i: [[0, 0, 0, 0, 0, 0, 1e-3 * (k + 1), 2e-3, 0],
                    [0, 0, 0, 0, 0, 0, 3e-3, 4e-3 * (k + 1), 0]] for k, i in enumerate(idx)}
    pooled = pooled_cpu(grid, measured)
    # forward CPU samples 1, 3, 2, 3, 3, 3 ms -> 3 ms; backward 2, 4, 2, 8, 2, 12 -> 3 ms
    assert all(pooled[i] == pytest.approx((3e-3, 3e-3)) for i in idx)
    # not measured (CPU device, zeros): left alone
    assert pooled_cpu(grid, {idx[0]: [[0.0] * 9]}) == {}


def test_cpu_pool_leaves_out_readings_that_never_queued():
    """A reading whose samples all failed the queued check (moeh20's eager full-recompute
    rows: the CPU waited out the spin, 774 ms a layer) is left out of the setting's pool
    where another reading queued; a sample that failed is left out of its reading's median
    where another passed; with nothing queued the readings are all there is."""
    from meshplan.calibrate.bench_layers import pooled_cpu
    from meshplan.calibrate.layer_rows import Sample, cpu_values
    grid = plan_grid([TINY], None, 1, quick=False)
    idx = [i for i, c in enumerate(grid) if not c.part and c.tp == 1
           and c.recompute == "none"]                       # micro-batch 1, 2, 4
    # values: fwd, bwd, act, peak, B, W, fwd cpu, bwd cpu, failed samples (of 4)
    ok = {idx[0]: [[0, 0, 0, 0, 0, 0, 6e-3, 10e-3, 0]],
          idx[1]: [[0, 0, 0, 0, 0, 0, 7e-3, 12e-3, 1]]}
    never = {idx[2]: [[0, 0, 0, 0, 0, 0, 6e-3, 0.774, 4]]}
    pooled = pooled_cpu(grid, {**ok, **never}, iters=4)
    assert all(pooled[i] == pytest.approx((6.5e-3, 11e-3)) for i in idx)
    assert pooled_cpu(grid, never, iters=4)[idx[2]] == pytest.approx((6e-3, 0.774))
    good, bad = Sample(1.0, 2.0, forward_cpu_s=5e-3, backward_cpu_s=9e-3), \
        Sample(1.0, 2.0, forward_cpu_s=0.3, backward_cpu_s=0.8, queued_ok=False)
    assert cpu_values([good, bad, bad]) == pytest.approx((5e-3, 9e-3))
    assert cpu_values([bad, bad], layers=2) == pytest.approx((0.15, 0.4))


def test_queued_split_backward_subtracts_the_rows_forward():
    """The queued path (CUDA) times forward+B and W; B is that minus the row's forward. On
    CPU the same code runs synchronized, which is enough to check the arithmetic."""
    torch = pytest.importorskip("torch")
    from meshplan.calibrate import bench_layers, layer_build, layer_split
    from meshplan.calibrate.bench_split import split_functions
    if split_functions() is None:
        pytest.skip("this torch has no split backward")
    cfg = Config(model=TINY, seq_len=32, tp=1, sequence_parallel=False, recompute="none",
                 micro_batch=1)
    m, _ = bench_layers._build(cfg, 2, torch.device("cpu"), bench_layers._Groups(1, 0, "cpu"))
    x = layer_build._layer_input(cfg, torch.device("cpu"))
    huge = [Sample(1e3, 0.0, forward_cpu_s=1e3)] * 3     # a forward longer than forward+B
    b, w, b_cpu, w_cpu = layer_split._split_per_layer(
        m, x, None, 2, torch.device("cpu"), iters=2, barrier=lambda: None, queue=object(),
        forward=huge)
    assert b == 0.0 and b_cpu == 0.0 and w > 0      # clamped at 0, never negative
    b, w, b_cpu, w_cpu = layer_split._split_per_layer(
        m, x, None, 2, torch.device("cpu"), iters=2, barrier=lambda: None, queue=object(),
        forward=[Sample(0.0, 0.0)] * 3)
    assert b > 0 and w > 0 and b_cpu == 0.0 == w_cpu   # CPU: synchronized, no CPU fields
    # without a queue: the synchronized split of bench_split, no CPU fields
    b, w, b_cpu, w_cpu = layer_split._split_per_layer(
        m, x, None, 2, torch.device("cpu"), iters=2, barrier=lambda: None)
    assert b > 0 and w > 0 and b_cpu == 0.0 == w_cpu


def test_queued_split_rows_keep_the_synchronized_split_beside_it(plain_tables):
    """With ``split_queued`` a row's split comes from the queued path, and the synchronized
    2-block split timed for the depth growth is kept beside it (for comparison); a
    synchronized calibration (the module's plain one) leaves those fields 0. CPU runs both
    paths synchronized."""
    torch = pytest.importorskip("torch")
    from meshplan.calibrate import bench_layers
    from meshplan.costmodel.measured import tables_from_rows
    queued = bench_layers.bench_layer_rows([TINY], None, torch.device("cpu"), 1, 0,
                                           split_queued=True, quick=False,
                                           micro_batches=(1,)).layers
    split_rows = [r for r in queued if r["backward_input_s"] > 0]
    assert split_rows
    assert all(r["backward_input_sync_s"] > 0 and r["backward_weight_sync_s"] > 0
               for r in split_rows)
    plain, ends = plain_tables.layers, plain_tables.ends
    assert all(r["backward_input_sync_s"] == 0 == r["backward_weight_sync_s"] for r in plain)
    tables_from_rows(queued, ends, "test")          # the new fields parse


def test_cpu_fixed_splits_a_call_into_per_call_and_per_layer_parts():
    from meshplan.calibrate.bench_layers import cpu_fixed
    # a call costs 2 ms + 1 ms per layer (forward) and 4 ms + 3 ms per layer (backward):
    # per layer 2 and 5 ms on 2 blocks, 1.5 and 4 ms on 4
    samples = [(2e-3, 5e-3, 1.5e-3, 4e-3)] * 3
    per_layer, per_call = cpu_fixed(samples, (2e-3, 5e-3), 2, 4)
    assert per_layer == pytest.approx((1e-3, 3e-3))
    assert per_call == pytest.approx((2e-3, 4e-3))
    # noise that makes the deep stack dearer per layer: no per-call part, nothing changes
    per_layer, per_call = cpu_fixed([(2e-3, 5e-3, 2.2e-3, 5.5e-3)], (2e-3, 5e-3), 2, 4)
    assert per_call == (0.0, 0.0) and per_layer == pytest.approx((2e-3, 5e-3))
    # never more per call than the whole 2-block call: the per-layer part stays >= 0
    per_layer, per_call = cpu_fixed([(2e-3, 5e-3, 0.1e-3, 0.1e-3)], (2e-3, 5e-3), 2, 4)
    assert per_call == pytest.approx((4e-3, 10e-3)) and per_layer == pytest.approx((0, 0))


def test_rows_timed_with_cpu_fields_get_a_per_call_part(monkeypatch):
    """Where rows carry CPU dispatch times (queued on CUDA; here: the synchronized CPU timings
    copied into the CPU fields), each setting's smallest micro-batch is timed again on
    CPU_DEEP_LAYERS blocks and its rows get a per-call part and a per-layer rest."""
    torch = pytest.importorskip("torch")
    from meshplan.calibrate import bench_layers, layer_run
    real = layer_run._measure

    def measure(*a, **kw):
        samples, out = real(*a, **kw)
        return [replace(s, forward_cpu_s=s.forward_s, backward_cpu_s=s.backward_s)
                for s in samples], out

    monkeypatch.setattr(layer_run, "_measure", measure)
    prog = _Recorder()
    layers = bench_layers.bench_layer_rows([TINY], None, torch.device("cpu"), 1, 0,
                                           quick=False, progress=prog,
                                           micro_batches=(1, 2)).layers
    deep = [m for m in prog.messages if f"cpu on {bench_layers.CPU_DEEP_LAYERS} blocks" in m]
    assert len(deep) == 3 and all("mb1" in m for m in deep)   # one per recompute mode
    # ... which logs the deep stack's GPU-side (here wall) time per layer beside it
    assert all(re.search(r"cpu on \d+ blocks [\d.]+ / [\d.]+ ms, gpu [\d.]+ / [\d.]+ ms", m)
               for m in deep)
    fields = ("forward_cpu_s", "backward_cpu_s", "forward_cpu_fixed_s", "backward_cpu_fixed_s")
    assert all(r[k] >= 0 for r in layers for k in fields)
    assert any(r["forward_cpu_s"] + r["backward_cpu_s"] > 0 for r in layers)
    # per setting: one per-call part, and a 2-block call's total (2 per-layer + per-call)
    # is the setting's pooled CPU time, the same for each of its micro-batches
    for rc in ("none", "selective", "full"):
        rows = [r for r in layers if r["recompute"] == rc and r["tp"] == 1]
        assert len({(r["forward_cpu_fixed_s"], r["backward_cpu_fixed_s"]) for r in rows}) == 1
        totals = {round(2 * r["forward_cpu_s"] + r["forward_cpu_fixed_s"], 12) for r in rows}
        assert len(totals) == 1 and totals.pop() > 0


def test_compiled_rows_get_their_own_per_call_part(monkeypatch):
    """Compiled rows are timed again on CPU_DEEP_LAYERS compiled blocks too (a compiled
    backward's per-call CPU part is large: 1 x H200, docs/benchmarks/host.md), and their
    per-call part is pooled apart from the eager rows' (``pool_cpu_fixed``)."""
    torch = pytest.importorskip("torch")
    from meshplan.calibrate import bench_layers, layer_run
    from meshplan.hardware_profiles.calibrated import pool_cpu_fixed
    real = layer_run._measure

    def measure(*a, **kw):
        samples, out = real(*a, **kw)
        # a call costs 3 ms + 1 ms a layer of CPU (compiled or not): 2 blocks read 2.5 ms a
        # layer, CPU_DEEP_LAYERS blocks 1.75
        deep = sys._getframe(1).f_code.co_name == "_cpu_deep"
        n = bench_layers.CPU_DEEP_LAYERS if deep else 2
        per = 1e-3 + 3e-3 / n
        return [replace(s, forward_cpu_s=n * per, backward_cpu_s=n * per) for s in samples], out

    monkeypatch.setattr(layer_run, "_measure", measure)
    prog = _Recorder()
    layers = bench_layers.bench_layer_rows([TINY], None, torch.device("cpu"), 1, 0,
                                           quick=False, progress=prog, micro_batches=(1,),
                                           max_tp=1, compile_rows=("none",)).layers
    deep = [m for m in prog.messages if f"cpu on {bench_layers.CPU_DEEP_LAYERS} blocks" in m]
    assert any("compiled" in m for m in deep) and any("compiled" not in m for m in deep)
    compiled = [r for r in pool_cpu_fixed(layers) if r["compile"]]
    assert compiled and all(r["backward_cpu_fixed_s"] == pytest.approx(3e-3)
                            and r["backward_cpu_s"] == pytest.approx(1e-3) for r in compiled)
    # every row also stores the per-layer reading on the deep stack as read, and its blocks
    # (not priced: docs/benchmarks/fp8_checks.md, "Pricing the CPU from the deep reading")
    n = bench_layers.CPU_DEEP_LAYERS
    assert all(r["cpu_deep_layers"] == n and r["forward_cpu_deep_s"] == pytest.approx(
        1e-3 + 3e-3 / n) and r["backward_cpu_deep_s"] == pytest.approx(1e-3 + 3e-3 / n)
        for r in layers)


# ---- FSDP2 over tensor-parallel layers: the row's module on four gloo ranks ------------------
def _fsdp_tp_worker(rank: int, world: int, init: str, out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    from meshplan.calibrate.bench_layers import _build, _Groups
    from meshplan.calibrate.layer_run import _layer_step
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    model = replace(GPTISH, vocab_size=128)
    out = {}
    for zero, sp in ((3, False), (2, True)):
        cfg = Config(model=model, seq_len=64, tp=2, sequence_parallel=sp, micro_batch=1,
                     recompute="selective", zero=zero, dp=2)
        groups = _Groups(world, rank, "cpu")
        m, tp_group = _build(cfg, 2, torch.device("cpu"), groups)
        x, _, reset, forward, backward = _layer_step(cfg, m, torch.device("cpu"))
        backward(forward())
        dp_ranks = dist.get_process_group_ranks(groups.dp_mesh(2, 2).get_group())
        out[f"z{zero}"] = {"dp": dp_ranks, "tp": dist.get_process_group_ranks(tp_group),
                           "grad_finite": bool(torch.isfinite(x.grad).all()),
                           "x_shape": list(x.shape)}
    write_rank_result(out_dir, rank, out)


@pytest.mark.distributed
def test_fsdp_rows_of_tensor_parallel_layers_build_and_run_on_four_ranks(tmp_path):
    pytest.importorskip("torch")
    for r, got in enumerate(run_gloo_ranks(_fsdp_tp_worker, 4, tmp_path)):
        for z in ("z3", "z2"):
            assert sorted(got[z]["dp"]) == ([0, 2] if r % 2 == 0 else [1, 3])
            assert sorted(got[z]["tp"]) == ([0, 1] if r < 2 else [2, 3])
            assert got[z]["grad_finite"]
        assert got["z2"]["x_shape"] == [1, 32, 128]     # sequence-parallel input: s / tp


@pytest.fixture(scope="module")
def plain_tables():
    """One plain (synchronized, unpatched) single-rank calibration of TINY's full grid at
    micro-batches 1 and 2, shared by the tests that read an unpatched calibration."""
    torch = pytest.importorskip("torch")
    from meshplan.calibrate import bench_layers
    from meshplan.calibrate.bench_split import split_functions
    if split_functions() is None:
        pytest.skip("this torch has no split backward")
    return bench_layers.bench_layer_rows([TINY], None, torch.device("cpu"), 1, 0,
                                         quick=False, micro_batches=(1, 2))


def test_split_memory_rows_for_full_recompute_only(plain_tables):
    """The deep split stack of a full-recompute row measures what a micro-batch keeps
    between B and W and what W needs (on CPU through LiveBytes); other rows leave 0."""
    from meshplan.calibrate import bench_layers
    from meshplan.costmodel.measured import tables_from_rows
    tables = plain_tables
    by_rc = {}
    for r in tables.layers:
        if r["tp"] == 1 and r["backward_weight_s"] > 0:
            by_rc.setdefault(r["recompute"], []).append(r)
    assert {"none", "full"} <= set(by_rc)
    assert all(r["wgrad_pending_bytes"] == 0 == r["wgrad_transient_bytes"]
               for r in by_rc["none"])
    full = by_rc["full"]
    assert all(r["wgrad_transient_bytes"] > 0 and r["wgrad_pending_bytes"] > 0 for r in full)
    # W re-runs each block's forward once per parameter group: more than one layer's
    # no-recompute activations, for every micro-batch measured
    plain = {r["micro_batch"]: r["activation_bytes"] for r in by_rc["none"]}
    assert all(r["wgrad_transient_bytes"] > plain[r["micro_batch"]] for r in full)
    # measured on the deep stack, with the part that does not grow with the layers from
    # the row's own (shallower) stack: W's transient per layer falls with the depth
    assert all(r["wgrad_memory_layers"] == bench_layers.SPLIT_DEEP_LAYERS for r in full)
    assert all(r["wgrad_transient_stage_bytes"] > 0 for r in full)
    assert all(r["wgrad_memory_layers"] == 0 for r in by_rc["none"])
    tables_from_rows(tables.layers, tables.ends, "test")      # the new fields parse


def test_split_memory_stage_separates_the_fixed_part_of_a_stage():
    """Per layer x_L = d + c/L on two stacks gives back c and the deep per-layer value;
    without the shallow stack c = 0, without the deep one nothing."""
    from meshplan.calibrate.bench_layers import split_memory_stage
    c, d = (10.0, 60.0), (2.0, 20.0)          # (pending, transient): stage part, per layer

    def per_layer(n):
        return tuple(di + ci / n for ci, di in zip(c, d))
    got = split_memory_stage(per_layer(2), per_layer(6), 2, 6)
    assert got[:3] == pytest.approx((*per_layer(6), 6))
    assert got[3:] == pytest.approx(c)
    assert split_memory_stage((0.0, 0.0), per_layer(6), 2, 6) == (*per_layer(6), 6, 0.0, 0.0)
    assert split_memory_stage(per_layer(2), (0.0, 0.0), 2, 6) == (0.0, 0.0, 0, 0.0, 0.0)


def test_two_rank_calibration_probes_ddp_overlap_on_the_model(two_rank_profile):
    """calibrate's DDP probe runs on the --model's blocks (gloo, 2 ranks) and its row becomes
    the profile's ddp_overlap_interference (the cost model's k for DDP's all-reduce)."""
    doc = two_rank_profile
    rows = [r for r in doc["measurements"]["overlap"] if r["kind"] == "ddp_overlap_interference"]
    assert len(rows) == 1
    r = rows[0]
    # a tiny model's blocks never fill 8 buckets: all of its 2 layers, its 32 tokens, and
    # on CPU micro-batch 2
    assert (r["model"], r["layers"], r["seq_len"], r["micro_batch"]) == ("tiny-llama", 2, 32, 2)
    assert r["comm_bytes"] > 0 and r["backward_s"] > 0 and r["sync_s"] > 0 and r["comm_s"] > 0
    assert 0.0 <= r["value"] <= 2.0
    assert doc["gpu"]["ddp_overlap_interference"] == pytest.approx(r["value"])
    assert "ddp_overlap_interference" in doc["measured"]


def test_only_keeps_part_of_the_grid():
    """``only`` (benchmarks that re-time a few rows): just the rows it keeps are timed."""
    torch = pytest.importorskip("torch")
    from meshplan.calibrate import bench_layers
    tables = bench_layers.bench_layer_rows(
        [TINY], None, torch.device("cpu"), 1, 0, quick=True,
        only=lambda c: not c.part and c.recompute == "full" and c.micro_batch == 1)
    assert [(r["recompute"], r["micro_batch"]) for r in tables.layers] == [("full", 1)]
    assert tables.ends == []


def test_untimed_rows_are_summarised_by_kind_with_what_their_absence_costs():
    from meshplan.calibrate.layer_grid import MISSING_ROWS, row_kind, untimed_summary
    moe = replace(GPTISH, vocab_size=128, num_experts=4, experts_per_token=2,
                  moe_ffn_hidden_size=64)
    # an MoE model and a dense one (only a dense model's FSDP2 rows are also compiled)
    grid = plan_grid([moe, GPTISH], None, 2, quick=True, compile_rows=("none",),
                     fp8_rows="tensorwise")
    kinds = {row_kind(c) for c in grid}
    assert kinds == {"plain", "end", "compiled", "expert-parallel", "expert-parallel FSDP2",
                     "fp8", "FSDP2", "FSDP2 compute-alone", "compiled FSDP2"} \
        == set(MISSING_ROWS)
    summary = untimed_summary(grid)
    assert sum(summary.values()) == len(grid)
    assert list(summary)[:2] == ["plain", "end"]       # grid order
    # the FSDP2 rows come last: a budget that stops at them leaves these
    tail = untimed_summary([c for c in grid if c.zero and c.ep == 1])
    assert tail == {"FSDP2": summary["FSDP2"],
                    "FSDP2 compute-alone": summary["FSDP2 compute-alone"],
                    "compiled FSDP2": summary["compiled FSDP2"]}
    assert row_kind(grid[-1]) == "compiled FSDP2"


def test_provenance_keeps_the_rows_a_budget_left_untimed():
    pytest.importorskip("torch")
    import torch

    from meshplan.calibrate.run import CalibrateOptions, provenance
    opts = CalibrateOptions(out="x.toml", time_budget_s=100.0)
    doc = provenance(torch.device("cpu"), opts, 1, rows_untimed={"FSDP2": 12})
    assert doc["rows_untimed"] == {"FSDP2": 12} and doc["time_budget_s"] == 100.0
    assert "rows_untimed" not in provenance(torch.device("cpu"), opts, 1)


def test_provenance_keeps_every_reading_of_the_rows_read_again(tmp_path):
    """The readings of the rows timed synchronized and read more than once go into the
    profile's provenance (label -> [forward, backward] per reading), written as TOML that
    reads back; none where no row was read again."""
    pytest.importorskip("torch")
    import tomllib

    import torch

    from meshplan.calibrate.run import CalibrateOptions, provenance
    from meshplan.calibrate.tomlfile import dumps
    opts = CalibrateOptions(out="x.toml")
    label = "layer tiny-moe s64 tp2 sp ep2 rc=none mb1 compiled"
    readings = {label: [[3e-3, 1e-3], [1e-3, 1e-3], [2e-3, 1.5e-3]]}
    doc = provenance(torch.device("cpu"), opts, 2, reread_rounds=2, synced_readings=readings)
    assert doc["synced_readings"] == readings and doc["layer_reread_rounds"] == 2
    back = tomllib.loads(dumps({"provenance": doc}))["provenance"]["synced_readings"]
    assert back == readings
    assert "synced_readings" not in provenance(torch.device("cpu"), opts, 2)


def test_compiled_rows_whose_backward_timed_shorter_than_their_forward_are_named():
    """The calibration names compiled rows without recomputation whose backward timed shorter
    than their forward (compiled blocks that communicate inside: tp 2 + SP, ep 2), not the
    eager ones, recomputing ones or plausible ones."""
    from meshplan.calibrate.layer_rows import suspect_splits
    base = dict(tp=2, sequence_parallel=True, micro_batch=1, ep=1, precision="bf16")
    rows = [dict(base, compile=True, recompute="none", forward_s=7.94e-3, backward_s=0.55e-3),
            dict(base, compile=True, recompute="none", forward_s=3e-3, backward_s=6e-3),
            dict(base, compile=False, recompute="none", forward_s=7e-3, backward_s=1e-3),
            dict(base, compile=True, recompute="full", forward_s=7e-3, backward_s=3e-3),
            dict(base, compile=True, recompute="none", tp=1, sequence_parallel=False, ep=2,
                 precision="fp8", forward_s=9e-3, backward_s=2.8e-3)]
    assert suspect_splits(rows) == ["tp2 sp mb1 (7.94 / 0.55 ms)",
                                    "tp1 ep2 fp8 mb1 (9.00 / 2.80 ms)"]
