"""`meshplan calibrate --rounds / --time-budget`: the round decision, its agreement over
ranks (gloo), tiny CPU calibrations that record the rounds, and the errors for bad values."""

from __future__ import annotations

import argparse
import json
import math
import re
import time
import tomllib
from pathlib import Path

import pytest

from _gloo import run_gloo_ranks, write_rank_result

from meshplan.calibrate.budget import (AFTER_LAYERS_ALLOWANCE_S, LAUNCHED_AT_ENV, RoundBudget,
                                      next_round, started_perf_counter)
from meshplan.commands.calibrate import add_arguments, child_argv
from meshplan.errors import ConfigError

from conftest import TINY_LLAMA as TINY


# ---- the decision (pure) ---------------------------------------------------------------------
def test_next_round_runs_only_if_the_projected_end_fits():
    # 4 x H200, two models, micro-batches 2,4,8: ~60 s before the layer tables, ~180 s a round
    second = next_round(elapsed_s=240.0, last_round_s=180.0, budget_s=560.0, allowance_s=15.0)
    assert second.run and second.projected_end_s == pytest.approx(435.0)
    third = next_round(elapsed_s=417.0, last_round_s=180.0, budget_s=560.0, allowance_s=15.0)
    assert not third.run and third.projected_end_s == pytest.approx(612.0)
    # ending exactly at the budget fits
    assert next_round(elapsed_s=300.0, last_round_s=245.0, budget_s=560.0,
                      allowance_s=15.0).run
    # the allowance for what follows the layer tables can tip it: 540 s fits 550 s, 555 s not
    assert next_round(elapsed_s=300.0, last_round_s=240.0, budget_s=550.0, allowance_s=0.0).run
    assert not next_round(elapsed_s=300.0, last_round_s=240.0, budget_s=550.0,
                          allowance_s=15.0).run
    # the default allowance is the named one
    d = next_round(elapsed_s=10.0, last_round_s=5.0, budget_s=1000.0)
    assert d.projected_end_s == pytest.approx(15.0 + AFTER_LAYERS_ALLOWANCE_S)


@pytest.mark.parametrize("bad", [0, 0.0, -5.0, math.inf, math.nan, True, "540"])
def test_time_budget_must_be_a_finite_positive_number(bad):
    from meshplan.calibrate.run import CalibrateOptions
    message = (r"CalibrateOptions\.time_budget_s must be a finite number of seconds > 0, got "
               + re.escape(repr(bad)))
    with pytest.raises(ConfigError, match=message):
        CalibrateOptions(out=Path("p.toml"), time_budget_s=bad)
    with pytest.raises(ConfigError, match=r"RoundBudget\.budget_s must be"):
        RoundBudget(budget_s=bad, started_s=0.0)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_rounds_must_be_a_positive_integer(bad):
    from meshplan.calibrate.run import CalibrateOptions
    with pytest.raises(ConfigError, match=r"CalibrateOptions\.layer_rounds must be a positive "
                                          r"integer, got " + re.escape(repr(bad))):
        CalibrateOptions(out=Path("p.toml"), layer_rounds=bad)


def test_good_rounds_and_budget_are_kept():
    from meshplan.calibrate.run import CalibrateOptions
    ok = CalibrateOptions(out=Path("p.toml"), layer_rounds=2, time_budget_s=540)
    assert ok.layer_rounds == 2 and ok.time_budget_s == 540
    assert CalibrateOptions(out=Path("p.toml")).time_budget_s is None   # default: no limit


# ---- the CLI ---------------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p


@pytest.mark.parametrize("argv, message", [
    (["--rounds", "0"], "argument --rounds: '0' must be >= 1"),
    (["--rounds", "2.5"], "argument --rounds: '2.5' is not an integer"),
    (["--time-budget", "0"], "argument --time-budget: '0' must be > 0"),
    (["--time-budget", "-60"], "argument --time-budget: '-60' must be > 0"),
    (["--time-budget", "soon"], "argument --time-budget: 'soon' is not a number"),
])
def test_cli_rejects_bad_rounds_and_budgets(argv, message, capsys):
    with pytest.raises(SystemExit):
        _parser().parse_args(argv)
    assert message in capsys.readouterr().err


def test_cli_infinite_budget_is_a_config_error_before_anything_runs(tmp_path, capsys):
    from meshplan.cli import main as cli_main
    # --nproc: the error must come before torchrun starts its children
    rc = cli_main(["calibrate", "--device", "cpu", "--nproc", "2", "--time-budget", "inf",
                   "--out", str(tmp_path / "p.toml")])
    assert rc == 2
    assert "time_budget_s must be a finite number of seconds > 0, got inf" \
        in capsys.readouterr().err
    assert not (tmp_path / "p.toml").exists()


def test_child_argv_passes_rounds_and_budget_on():
    p = _parser()
    args = p.parse_args(["--rounds", "2", "--time-budget", "540.5", "--nproc", "4"])
    argv = child_argv(args)
    again = p.parse_args(argv[1:])
    assert again.rounds == 2 and again.time_budget == 540.5
    plain = child_argv(p.parse_args([]))
    assert "--rounds" not in plain and "--time-budget" not in plain   # defaults not repeated
    assert "--sp-only" not in plain
    assert p.parse_args(child_argv(p.parse_args(["--sp-only"]))[1:]).sp_only


# ---- tiny CPU calibrations -------------------------------------------------------------------
def _calibrate(tmp_path: Path, *extra: str) -> dict:
    pytest.importorskip("torch")
    from meshplan.cli import main as cli_main
    spec = tmp_path / "tiny.json"
    spec.write_text(json.dumps(TINY))
    out = tmp_path / "p.toml"
    rc = cli_main(["calibrate", "--device", "cpu", "--quick", "--model", str(spec),
                   "--micro-batches", "1", "--out", str(out), *extra])
    assert rc == 0
    return tomllib.loads(out.read_text())


def test_rounds_2_measures_the_layer_tables_twice(tmp_path, capsys):
    doc = _calibrate(tmp_path, "--rounds", "2")
    err = capsys.readouterr().err
    assert doc["provenance"]["layer_rounds"] == 2
    assert "time_budget_s" not in doc["provenance"]              # none given
    # the host's dispatch speed at the start and the end (executor.measure)
    probe = doc["provenance"]["host_probe_us"]
    assert len(probe) == 2 and all(0 < v < 10_000 for v in probe)
    # what measured the rows, for a later reader to tell profiles of older code apart
    assert doc["provenance"]["compiled_selective"] == "core checkpointed in the block's graph"
    assert doc["provenance"]["cpu_deep"].startswith("steady on up to 16 blocks")
    assert "round 2: layer tiny-llama" in err and "round 3:" not in err
    assert "from 2 of 2 rounds" in err
    assert doc["layers"] and all(r["forward_s"] > 0 for r in doc["layers"])
    assert {"layers", "ends"} <= set(doc["measured"])


def test_a_tiny_budget_writes_a_profile_without_layer_rows(tmp_path, capsys):
    # 1 ms: spent before the layer tables even start, so no row fits (not even round 1's:
    # round 36's first round ran 40 s past its budget and was killed, writing nothing)
    doc = _calibrate(tmp_path, "--rounds", "3", "--time-budget", "0.001")
    err = capsys.readouterr().err
    prov = doc["provenance"]
    assert prov["layer_rounds"] == 0 and prov["time_budget_s"] == 0.001
    assert "no layer row fits" in err
    assert "round 1: layer tiny-llama" in err and "and the rows after it skipped" in err
    assert "fwd " not in err                      # no row was timed
    assert "from 0 of 3 rounds" in err
    # a profile all the same, with the rest of its measurements
    assert not doc.get("layers") and not doc.get("ends")
    assert "gemm_efficiency" in doc["gpu"]
    assert not list(tmp_path.glob(".*.tmp"))


def test_the_budget_stops_the_first_round_between_rows(tmp_path, monkeypatch, capsys):
    """A budget that round 1 cannot finish: it stops between two rows, keeps the rows it
    measured and writes the profile (a fake clock: each row takes 1 s, the budget ends
    after about three of them)."""
    from meshplan.calibrate import bench_layers
    clock = {"t": 0.0}
    monkeypatch.setattr(bench_layers.time, "perf_counter", lambda: clock["t"])
    real_run = bench_layers._run_layer

    def slow_run(*args, **kwargs):
        clock["t"] += 1.0
        return real_run(*args, **kwargs)
    monkeypatch.setattr(bench_layers, "_run_layer", slow_run)
    budget = bench_layers.RoundBudget(budget_s=3.5, started_s=0.0, allowance_s=0.0)
    pytest.importorskip("torch")
    import torch
    from meshplan.spec import ModelSpec
    tables = bench_layers.bench_layer_rows([ModelSpec(**TINY)], None, torch.device("cpu"), 1, 0,
                                           quick=True, micro_batches=(1,), rounds=2,
                                           budget=budget)
    assert tables.rounds == 1
    assert len(tables.layers) == 3            # rows at t = 0-1, 1-2, 2-3; the 4th would end at 4
    assert {r["recompute"] for r in tables.layers} == {"none", "selective", "full"}
    assert not tables.ends
    # what the budget left untimed, by kind (the calibration prints it and the profile's
    # provenance keeps it)
    assert tables.untimed == {"end": 2}


def test_the_round_projects_its_longest_row_not_the_last(tmp_path, monkeypatch):
    """A long row (3 s: a new module built, its splits timed) then short ones (1 s): the
    next row is projected at 3 s, so the round stops while a 3 s row would overrun, where
    the last row's 1 s would have let it start (round 39's calibration was killed past its
    budget with no profile)."""
    from meshplan.calibrate import bench_layers
    clock = {"t": 0.0, "n": 0}
    monkeypatch.setattr(bench_layers.time, "perf_counter", lambda: clock["t"])
    real_run = bench_layers._run_layer

    def uneven_run(*args, **kwargs):
        clock["n"] += 1
        clock["t"] += 3.0 if clock["n"] == 1 else 1.0
        return real_run(*args, **kwargs)
    monkeypatch.setattr(bench_layers, "_run_layer", uneven_run)
    # rows end at t = 3 and 4 (the second projected at 3 + 3 = 6); a third row projected at
    # the last row's 1 s would end at 5 (fits 6.5), at the longest row's 3 s at 7 (does not)
    budget = bench_layers.RoundBudget(budget_s=6.5, started_s=0.0, allowance_s=0.0)
    pytest.importorskip("torch")
    import torch
    from meshplan.spec import ModelSpec
    tables = bench_layers.bench_layer_rows([ModelSpec(**TINY)], None, torch.device("cpu"), 1, 0,
                                           quick=True, micro_batches=(1,), rounds=1,
                                           budget=budget)
    assert len(tables.layers) == 2


@pytest.mark.parametrize("rereads", [2, 1])
def test_where_a_whole_round_does_not_fit_the_synchronized_rows_are_timed_again(monkeypatch,
                                                                               rereads):
    """A dense model and an MoE one with a capacity factor (its rows read its kept copies
    on the host, so they are timed synchronized, as ep > 1 rows are): after round 1 a whole
    round does not fit the budget but ``rereads`` rounds of the MoE rows alone do, so the
    rounds after re-time only those, each row the median of its readings; the dense rows
    keep their one. A fake clock: a dense layer row takes 3 s, an MoE one 1 s."""
    pytest.importorskip("torch")
    import torch
    from dataclasses import replace
    from meshplan.calibrate import bench_layers
    from meshplan.spec import ModelSpec
    clock = {"t": 0.0}
    monkeypatch.setattr(bench_layers.time, "perf_counter", lambda: clock["t"])
    real_run = bench_layers._run_layer
    reads: dict[str, int] = {}

    def run(cfg, *args, **kwargs):
        clock["t"] += 1.0 if cfg.syncs_on_host else 3.0
        values = list(real_run(cfg, *args, **kwargs))
        n = reads[cfg.label()] = reads.get(cfg.label(), 0) + 1
        if cfg.syncs_on_host:
            values[0] = (3e-3, 1e-3, 2e-3)[n - 1]     # forward 3, 1, 2 ms: median 2
        return values
    monkeypatch.setattr(bench_layers, "_run_layer", run)
    dense = ModelSpec(**TINY)
    moe = replace(dense, name="tiny-moe", num_experts=4, experts_per_token=2,
                  moe_ffn_hidden_size=32, capacity_factor=1.25)
    lines: list[str] = []
    count = {"steps": 0, "dropped": 0}

    class Log:
        def step(self, message):
            lines.append(message)
            count["steps"] += 1

        def note(self, message):
            lines.append(message)

        def drop(self, steps):
            count["dropped"] += steps
    grid = bench_layers.plan_grid([dense, moe], None, 1, quick=True, micro_batches=(1,))
    n_synced = sum(c.syncs_on_host for c in grid)
    round_s = 3 * sum(not c.part and not c.syncs_on_host for c in grid) + n_synced
    assert n_synced and round_s > 2 * n_synced + 1    # a whole round costs more than two of them
    budget = bench_layers.RoundBudget(budget_s=round_s + rereads * n_synced + 0.5,
                                      started_s=0.0, allowance_s=0.0)
    tables = bench_layers.bench_layer_rows([dense, moe], None, torch.device("cpu"), 1, 0,
                                           quick=True, micro_batches=(1,), rounds=3,
                                           budget=budget, progress=Log())
    assert (tables.rounds, tables.reread_rounds) == (1, rereads)
    synced = {c.label() for c in grid if c.syncs_on_host}
    assert {k for k, n in reads.items() if n == 1 + rereads} == synced
    assert all(n == 1 for k, n in reads.items() if k not in synced)
    moe_rows = [r for r in tables.layers if r["model"] == "tiny-moe"]
    # forward 3, 1 (median 2) or 3, 1, 2 ms (median 2)
    assert len(moe_rows) == n_synced and all(r["forward_s"] == 2e-3 for r in moe_rows)
    # every reading kept, in order, for the profile's provenance
    assert set(tables.synced_readings) == synced
    assert all([f for f, _ in r] == [3e-3, 1e-3, 2e-3][:1 + rereads]
               for r in tables.synced_readings.values())
    assert any("re-time only the" in m and f"{n_synced} rows timed synchronized" in m
               for m in lines)
    assert not any(m.startswith("round 2: layer tiny-llama") for m in lines)
    # the progress total stays honest: every row of the three rounds counted or dropped
    assert count["steps"] + count["dropped"] == 3 * len(grid)
    # and the calibration says how far apart those rows' readings lay
    spread = [m for m in lines if f"rows timed synchronized read up to {1 + rereads} times" in m]
    assert len(spread) == 1 and "at the widest (layer tiny-moe" in spread[0]
    if rereads == 1:   # the note of the round the budget stopped says what the tables hold
        assert any(m.startswith("round 3 skipped") and m.endswith(
            "layer tables from 1 of 3 rounds, the rows timed synchronized read 2 times")
            for m in lines)


def test_a_rows_reading_spread_is_its_largest_total_over_its_smallest():
    from meshplan.calibrate.layer_rows import reading_spread
    assert reading_spread([[3e-3, 1e-3], [1e-3, 1e-3], [2e-3, 1e-3]]) == pytest.approx(1.0)
    assert reading_spread([[3e-3, 1e-3]]) == 0.0          # one reading: no spread to tell


def test_the_budget_counts_from_the_launch():
    """The torchrun children start the budget at the launcher's start (wall clock), not at
    their own: 30 s of start-up is already spent; a missing, unparsable or future value
    starts it now."""
    assert started_perf_counter({LAUNCHED_AT_ENV: "970.0"}, 100.0, 1000.0) == pytest.approx(70.0)
    assert started_perf_counter({}, 100.0, 1000.0) == 100.0
    assert started_perf_counter({LAUNCHED_AT_ENV: "soon"}, 100.0, 1000.0) == 100.0
    assert started_perf_counter({LAUNCHED_AT_ENV: "1010.0"}, 100.0, 1000.0) == 100.0
    assert started_perf_counter({LAUNCHED_AT_ENV: "nan"}, 100.0, 1000.0) == 100.0


def test_the_launcher_passes_its_start_to_the_children(monkeypatch):
    from meshplan.commands import calibrate as cmd
    from meshplan.executor import launch
    seen = {}
    monkeypatch.setattr(launch, "supervise", lambda argv, env: (seen.update(env=env) or 0, ""))
    args = argparse.ArgumentParser()
    add_arguments(args)
    before = time.time()
    assert cmd._spawn(args.parse_args(["--nproc", "2", "--time-budget", "60"])) == 0
    assert before <= float(seen["env"][LAUNCHED_AT_ENV]) <= time.time()


def test_a_large_budget_cuts_nothing(tmp_path, capsys):
    doc = _calibrate(tmp_path, "--rounds", "2", "--time-budget", "100000", "--no-progress")
    assert doc["provenance"]["layer_rounds"] == 2
    assert doc["provenance"]["time_budget_s"] == 100000.0
    assert "skipped" not in capsys.readouterr().err


# ---- every rank takes the same decision (two gloo ranks) -------------------------------------
# (elapsed, round seconds) per rank; budget 560 s, allowance 15 s. Rank 0 alone would run the
# next round in the first two cases, rank 1 alone would not: all must stop.
AGREE_CASES = [((100.0, 50.0), (500.0, 50.0)),    # rank 1 started earlier (torchrun skew)
               ((300.0, 50.0), (300.0, 260.0)),   # rank 1's round was slower
               ((100.0, 50.0), (120.0, 60.0))]    # both fit: both run
AGREE_STOPS = [True, True, False]


def _agree_worker(rank: int, world: int, init: str, out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    from meshplan.calibrate.bench_layers import _budget_stops
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    stops = []
    for case in AGREE_CASES:
        elapsed_s, round_s = case[rank]
        budget = RoundBudget(budget_s=560.0, started_s=time.perf_counter() - elapsed_s,
                             allowance_s=15.0)
        stops.append(_budget_stops(1, 3, budget, round_s, torch.device("cpu"), world, None))
    write_rank_result(out_dir, rank, stops)


@pytest.mark.distributed
def test_ranks_agree_on_the_next_round(tmp_path):
    pytest.importorskip("torch")
    got = run_gloo_ranks(_agree_worker, 2, tmp_path)
    assert got[0] == got[1] == AGREE_STOPS


# The real 2-rank loop under a budget (torchrun, conftest's two_rank_profile) is checked in
# test_calibrate_layers.py::test_two_rank_calibration_runs_the_rounds_the_budget_allows, beside
# the other test of that one calibration, so that a parallel run (pytest-xdist, one file per
# worker) calibrates once.
