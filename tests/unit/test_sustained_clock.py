"""Rows at the sustained clock: the calibration's ratio (meshplan.calibrate.sustained), the
rows' field, and the named correction ``sustained_clock`` that applies it."""

from __future__ import annotations

import json
import tomllib
from dataclasses import replace

import pytest

from meshplan.calibrate.layer_grid import Config
from meshplan.calibrate.sustained import ratio_rows
from meshplan.costmodel import estimate
from meshplan.costmodel.clock import SUSTAINED_CLOCK
from meshplan.costmodel.measured import (MeasuredEnd, MeasuredLayer, MeasuredTables,
                                         ends_shape_key, layer_shape_key, tables_from_rows)
from meshplan.errors import ProfileError
from meshplan.hardware_profiles import Cluster
from meshplan.spec import Job, Layout, ModelSpec

from conftest import TINY_LLAMA as TINY_DICT

TINY_LLAMA = ModelSpec(**TINY_DICT)

MODEL = ModelSpec(name="m", num_layers=8, hidden_size=1024, num_heads=16, vocab_size=32000,
                  max_seq_len=1024)
JOB = Job(global_batch=16, seq_len=1024, runtime="torch")


def _tables(ratio: float) -> MeasuredTables:
    layers = tuple(MeasuredLayer(
        shape=layer_shape_key(MODEL), seq_len=1024, tp=1, sequence_parallel=False,
        recompute="none", micro_batch=mb, forward_s=1e-3 * mb, backward_s=2e-3 * mb,
        activation_bytes=1e8 * mb, backward_peak_bytes=5e7, forward_cpu_s=1e-4,
        backward_cpu_s=2e-4, sustained_ratio=ratio) for mb in (1, 2))
    ends = tuple(MeasuredEnd(
        shape=ends_shape_key(MODEL), part=part, seq_len=1024, tp=1, sequence_parallel=False,
        micro_batch=1, forward_s=1e-4, backward_s=2e-4, activation_bytes=1e6, peak_bytes=0.0,
        forward_cpu_s=1e-5, backward_cpu_s=2e-5, sustained_ratio=ratio)
        for part in ("embedding", "output"))
    return MeasuredTables(layers, ends)


def _cluster(tables):
    c = Cluster.preset("dgx-h100", nodes=1, gpus_per_node=1)
    return replace(c, gpu=replace(c.gpu, measured=tables))


def test_lookups_scale_gpu_seconds_not_cpu_seconds_or_bytes():
    t = _tables(1.1)
    kw = dict(seq_len=1024, tp=1, sequence_parallel=False, recompute="none")
    at, burst = t.layer(MODEL, micro_batch=2, **kw), t.at_share(0.0).layer(MODEL, micro_batch=2,
                                                                           **kw)
    assert burst.forward_s == pytest.approx(2e-3) and at.forward_s == pytest.approx(2.2e-3)
    assert at.backward_s == pytest.approx(4.4e-3)
    assert at.forward_cpu_s == burst.forward_cpu_s and at.activation_bytes == burst.activation_bytes
    # interpolated between micro-batches too, and the ends
    assert t.layer(MODEL, micro_batch=3, **kw).forward_s == pytest.approx(1.1 * 3e-3)
    out = t.end(MODEL, "output", seq_len=1024, tp=1, sequence_parallel=False, micro_batch=1)
    assert out.backward_s == pytest.approx(2.2e-4) and out.backward_cpu_s == pytest.approx(2e-5)
    assert t.has_sustained and not _tables(1.0).has_sustained
    assert t.without_shape("x").sustained == 1.0
    assert t.at_share(0.0).without_shape("x").sustained == 0.0
    # below 1 (a loop's warm caches, not a clock): the rows as timed
    assert _tables(0.93).layer(MODEL, micro_batch=2, **kw).forward_s == pytest.approx(2e-3)
    # a share of the excess: 1 + 0.5 x 0.1
    assert t.at_share(0.5).layer(MODEL, micro_batch=2, **kw).forward_s == pytest.approx(2.1e-3)


def _with_share(cluster, share):
    gpu = cluster.gpu
    return replace(cluster, gpu=replace(gpu, corrections=replace(
        gpu.corrections, sustained_clock_share=share)))


def test_the_correction_moves_the_step_by_the_rows_gpu_share():
    lay = Layout(micro_batch=2)
    on = estimate(MODEL, _with_share(_cluster(_tables(1.1)), 1.0), JOB, lay)
    plain = estimate(MODEL, _cluster(_tables(1.0)), JOB, lay)
    # the built-in share (hardware_profiles/data/corrections.toml) applies part of the excess
    part = estimate(MODEL, _cluster(_tables(1.1)), JOB, lay)
    assert plain.step_time_s < part.step_time_s < on.step_time_s
    # no share, no correction
    none = estimate(MODEL, _with_share(_cluster(_tables(1.1)), 0.0), JOB, lay)
    assert none.step_time_s == plain.step_time_s
    assert SUSTAINED_CLOCK not in [c.name for c in none.corrections]
    assert SUSTAINED_CLOCK in [c.name for c in on.corrections]
    assert SUSTAINED_CLOCK not in [c.name for c in plain.corrections]
    moved = next(c for c in on.corrections if c.name == SUSTAINED_CLOCK)
    assert on.step_time_s > plain.step_time_s
    assert moved.step_time_delta_s == pytest.approx(on.step_time_s - plain.step_time_s,
                                                    rel=1e-6)
    # only the rows' GPU seconds grow (by 10 %): the optimizer and the rest do not
    assert on.step_time_s < 1.1 * plain.step_time_s
    assert moved.memory_delta_bytes == 0.0 and on.memory_peak_bytes == plain.memory_peak_bytes


def test_profile_rows_read_and_check_the_ratio():
    t = _tables(1.05)
    back = tables_from_rows(**t.to_rows(), where="p.toml")
    assert back.layers[0].sustained_ratio == 1.05
    compact = t.to_rows(compact=True)
    assert "sustained_ratio" not in _tables(1.0).to_rows(compact=True)["layers"][0]
    assert compact["layers"][0]["sustained_ratio"] == 1.05
    rows = t.to_rows()
    rows["layers"][0]["sustained_ratio"] = 0.0
    with pytest.raises(ProfileError, match=r"\[\[layers\]\] #1: sustained_ratio must be a number "
                                           r"> 0, got 0.0"):
        tables_from_rows(**rows, where="p.toml")


def test_the_ratio_row_of_each_module_is_its_largest_micro_batch_without_recompute():
    def cfg(mb, rc="none", part="", tp=1):
        return Config(model=TINY_LLAMA, seq_len=64, tp=tp, sequence_parallel=False,
                      micro_batch=mb, recompute=rc, part=part)
    grid = [cfg(1), cfg(4, "full"), cfg(2), cfg(1, tp=2), cfg(1, part="output"),
            cfg(2, part="output"), cfg(2, part="embedding")]
    at = ratio_rows(grid)
    assert sorted(at.values()) == [2, 3, 5]      # the embedding (memory-bound) is left out
    # a module timed only with recomputation (compiled rows at selective,full): its
    # selective row, the largest micro-batch, rather than no ratio at all
    only_rc = [cfg(1, "full"), cfg(4, "full"), cfg(2, "selective"), cfg(1, "selective")]
    assert list(ratio_rows(only_rc).values()) == [2]
    assert list(ratio_rows(only_rc[:2]).values()) == [1]


def _tiny_calibration(tmp_path, capsys, name: str = "p") -> tuple[dict, str]:
    """(profile, stderr) of a quick CPU calibration of the tiny Llama at micro-batches 1
    and 2 with a 0.05 s sustained loop per module."""
    from meshplan.cli import main as cli_main
    spec = tmp_path / "tiny.json"
    spec.write_text(json.dumps(TINY_DICT))
    out = tmp_path / f"{name}.toml"
    assert cli_main(["calibrate", "--device", "cpu", "--quick", "--model", str(spec),
                     "--micro-batches", "1,2", "--sustained-s", "0.05", "--out",
                     str(out)]) == 0
    return tomllib.loads(out.read_text()), capsys.readouterr().err


def test_a_cpu_calibration_writes_each_modules_ratio(tmp_path, capsys):
    pytest.importorskip("torch")
    from meshplan.cli import main as cli_main
    doc, err = _tiny_calibration(tmp_path, capsys)
    assert doc["provenance"]["sustained_s"] == 0.05
    assert "sustained pass x" in err
    ratios = {(r["tp"], r["recompute"], r["micro_batch"]): r["sustained_ratio"]
              for r in doc["layers"]}
    # one ratio per built module: every row of the tp-1 module carries the same measured one
    tp1 = {v for (tp, _, _), v in ratios.items() if tp == 1}
    assert len(tp1) == 1 and next(iter(tp1)) > 0
    assert all(e["sustained_ratio"] > 0 for e in doc["ends"])
    assert all(e["sustained_ratio"] == 1.0 for e in doc["ends"] if e["part"] == "embedding")
    off = tmp_path / "off.toml"
    assert cli_main(["calibrate", "--device", "cpu", "--quick", "--model",
                     str(tmp_path / "tiny.json"), "--micro-batches", "1", "--out",
                     str(off)]) == 0
    doc = tomllib.loads(off.read_text())
    assert doc["provenance"]["sustained_s"] == 0.0          # the CPU default: off
    assert all(r["sustained_ratio"] == 1.0 for r in doc["layers"])


def test_a_loop_out_of_memory_falls_back_to_a_smaller_micro_batch(tmp_path, capsys,
                                                                   monkeypatch):
    """fp8h19 (1 x H200): the module's largest micro-batch row was timed, the loop on it ran
    out of memory, and the calibration died without writing a profile. Now the next smaller
    micro-batch's row measures the module's ratio; where every loop runs out, ratio 1."""
    torch = pytest.importorskip("torch")
    import meshplan.calibrate.layer_run as layer_run
    from meshplan.calibrate.layer_rows import smaller_timed_rows

    def cfg(mb, rc="none", part="", tp=1):
        return Config(model=TINY_LLAMA, seq_len=64, tp=tp, sequence_parallel=False,
                      micro_batch=mb, recompute=rc, part=part)
    grid = [cfg(1), cfg(2), cfg(4), cfg(2, "full"), cfg(2, tp=2), cfg(2, part="output")]
    assert smaller_timed_rows(grid, 2, measured=[0, 1, 2, 3, 4, 5]) == [1, 0]
    assert smaller_timed_rows(grid, 2, measured=[0, 2]) == [0]     # only rows timed already
    assert smaller_timed_rows(grid, 0, measured=[0, 1, 2]) == []
    calls = []

    def loop(forward, backward, reset, *, burst_pass_s, **kw):
        calls.append(burst_pass_s)
        if len(calls) == 1 or fail_all:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (test)")
        return 1.234, {}
    monkeypatch.setattr(layer_run, "sustained_ratio", loop)
    for fail_all, want in ((False, 1.234), (True, 1.0)):
        calls.clear()
        doc, err = _tiny_calibration(tmp_path, capsys, f"p{fail_all}")
        assert "mb2: sustained loop out of memory" in err
        assert {r["sustained_ratio"] for r in doc["layers"] if r["tp"] == 1} == {want}
        if fail_all:
            assert "no sustained-clock ratio for this module" in err
        else:
            assert "x 1.234 of the timed one (on micro-batch 1)" in err


def test_a_ratio_row_out_of_memory_hands_the_ratio_to_a_smaller_micro_batch(tmp_path, capsys,
                                                                          monkeypatch):
    """fp8h19 (1 x H200): the compiled module's largest micro-batch without recomputation
    ran out of memory as a row, and every row of that module carried ratio 1 (its bf16 arms
    then ran 0.8-8.8 % slower than predicted). The next smaller timed row measures it."""
    torch = pytest.importorskip("torch")
    import meshplan.calibrate.bench_layers as bench_layers
    import meshplan.calibrate.layer_run as layer_run
    real_row = bench_layers._run_layer

    def row(cfg, *a, **kw):
        if cfg.micro_batch == 2 and cfg.recompute == "none":
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (test)")
        return real_row(cfg, *a, **kw)

    monkeypatch.setattr(bench_layers, "_run_layer", row)
    monkeypatch.setattr(layer_run, "sustained_ratio", lambda *a, **kw: (1.234, {}))
    doc, err = _tiny_calibration(tmp_path, capsys)
    assert "rc=none mb2: out of memory on some rank, skipped" in err
    assert "x 1.234 of the timed one (on micro-batch 1)" in err
    # the profile says which rows are missing and why, beside the log
    skipped = doc["provenance"]["rows_skipped"]
    assert [why for label, why in skipped.items() if "rc=none mb2" in label] == [
        "out of memory"]
    layers = [r for r in doc["layers"] if r["tp"] == 1]
    assert {(r["recompute"], r["micro_batch"]) for r in layers} >= {("none", 1),
                                                                   ("selective", 2)}
    assert {r["sustained_ratio"] for r in layers} == {1.234}


def test_bad_sustained_seconds_are_refused(tmp_path, capsys):
    from meshplan.calibrate.run import CalibrateOptions
    from meshplan.cli import main as cli_main
    from meshplan.errors import ConfigError
    with pytest.raises(ConfigError, match=r"sustained_s -1.0: seconds >= 0"):
        CalibrateOptions(out=tmp_path / "p.toml", sustained_s=-1.0)
    with pytest.raises(SystemExit):
        cli_main(["calibrate", "--sustained-s", "-2", "--out", str(tmp_path / "x.toml")])
    assert "'-2' must be a number >= 0" in capsys.readouterr().err


def test_the_loop_runs_the_agreed_iterations_and_skips_alike():
    pytest.importorskip("torch")
    from meshplan.calibrate.sustained import sustained_ratio
    calls = []

    def forward():
        calls.append("f")
        return 1.0

    ratio, info = sustained_ratio(forward, lambda y: None, lambda: None, device="cpu",
                                  burst_pass_s=1e-3, heat_s=2e-3, time_s=3e-3)
    # ceil(2 ms / 1 ms) heat + max(3, ceil(3 ms / 1 ms)) timed iterations
    assert len(calls) == 5 and info["iterations"] == 3 and info["heat_iterations"] == 2
    assert ratio > 0 and not info["host_paced"]
    # another rank asked for more: every rank runs the max
    calls.clear()
    sustained_ratio(forward, lambda y: None, lambda: None, device="cpu", burst_pass_s=1e-3,
                    heat_s=2e-3, time_s=3e-3,
                    agree_max=lambda v: [max(v[0], 4.0), max(v[1], 4.0), v[2]])
    assert len(calls) == 8
    # a rank that must skip (no burst time) makes every rank skip: ratio 1, no loop
    calls.clear()
    assert sustained_ratio(forward, lambda y: None, lambda: None, device="cpu",
                           burst_pass_s=0.0)[0] == 1.0
    assert sustained_ratio(forward, lambda y: None, lambda: None, device="cpu",
                           burst_pass_s=1e-3, agree_max=lambda v: [*v[:2], 1.0])[0] == 1.0
    assert calls == []


def test_a_layer_without_a_ratio_in_a_profile_that_measured_others_is_said():
    """fp8h56h100 (1 x H100): every layer module's loop was host-paced at the timed
    micro-batches and skipped (ratio 1) while an end row measured one; the steps ran at the
    power-capped clock. The lookup flags such a row and the estimate says so; the price does
    not move."""
    from meshplan.costmodel.caveats import UNCLOCKED_ROWS_CAVEAT
    kw = dict(seq_len=1024, tp=1, sequence_parallel=False, recompute="none", micro_batch=2)
    t = _tables(1.0)
    skipped = MeasuredTables(t.layers, tuple(replace(e, sustained_ratio=1.05) if
                                            e.part == "output" else e for e in t.ends))
    assert skipped.layer(MODEL, **kw).clock_unmeasured
    assert not t.layer(MODEL, **kw).clock_unmeasured              # no ratio measured at all
    assert not _tables(1.1).layer(MODEL, **kw).clock_unmeasured   # its own ratio
    lay = Layout(micro_batch=2)
    said = estimate(MODEL, _cluster(skipped), JOB, lay)
    assert UNCLOCKED_ROWS_CAVEAT in said.caveats
    assert UNCLOCKED_ROWS_CAVEAT not in estimate(MODEL, _cluster(t), JOB, lay).caveats
    assert UNCLOCKED_ROWS_CAVEAT not in estimate(MODEL, _cluster(_tables(1.1)), JOB,
                                                 lay).caveats
    # the layer rows are priced as before (the end's own ratio moves only the end)
    at_burst = MeasuredTables(t.layers, skipped.ends).at_share(0.0)
    assert skipped.layer(MODEL, **kw).forward_s == at_burst.layer(MODEL, **kw).forward_s
