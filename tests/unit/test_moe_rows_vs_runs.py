"""benchmarks/moe_rows_vs_runs.py: the calibration's ep rows against the runs' own layers,
from the committed MoE sets (docs/benchmarks/moe_checks.md "The ep rows against the runs")."""

import pytest


def test_rows_against_the_runs_layers(load_benchmark):
    m = load_benchmark("moe_rows_vs_runs")
    rows = m.rows_vs_runs(["moeh11"])
    by = {r["layout"]: r for r in rows}
    # moeh11's five ZeRO-0/1 ep 2 layouts; the dense and pipelined ones are not ep rows
    assert set(by) == {"tp2-ep2-mb8-full", "dp2-ep2-z1-mb8-selective",
                       "tp2-ep2-mb8-selective-compiled", "tp2-ep2-mb8-selective",
                       "dp2-ep2-z1-mb8-selective-compiled"}
    sel = by["tp2-ep2-mb8-selective"]
    # the row as the profile holds it (calibrate log: fwd 6.782, bwd 6.829 ms a layer)
    assert sel["row_f"] * 1e3 == pytest.approx(6.782, abs=1e-3)
    assert sel["row_b"] * 1e3 == pytest.approx(6.829, abs=1e-3)
    # the run's layer: median forward phase 50.9 ms over 8 layers, less the tp 2 ends
    assert 5.5 < sel["run_f"] * 1e3 < 6.4
    assert sel["ratio"] == pytest.approx((sel["row_f"] + sel["row_b"])
                                         / (sel["run_f"] + sel["run_b"]))
    assert sel["rho_run"] == pytest.approx(1.1532)


def test_unknown_set_is_a_usage_error(load_benchmark, capsys):
    m = load_benchmark("moe_rows_vs_runs")
    with pytest.raises(SystemExit) as e:
        m.main(["--sets", "moeh99"])
    assert e.value.code == 2 and "moeh99" in capsys.readouterr().err


def test_rho_trend(load_benchmark):
    m = load_benchmark("moe_rows_vs_runs")
    assert m.rho_trend([{"rho_run": 1.1, "ratio": 1.0}, {"rho_run": 1.2, "ratio": 0.9}]) is None
    assert m.rho_trend([{"rho_run": 1.1, "ratio": 1.0}] * 3) is None      # no spread in ρ
    n, corr, slope = m.rho_trend([{"rho_run": 1.0, "ratio": 1.1}, {"rho_run": 1.1, "ratio": 1.0},
                                  {"rho_run": 1.3, "ratio": 0.8}, {"rho_run": None, "ratio": 5}])
    assert n == 3 and corr == pytest.approx(-1.0) and slope == pytest.approx(-1.0)


def test_moeh12_eager_rows_ran_uneven(load_benchmark):
    m = load_benchmark("moe_rows_vs_runs")
    rows = {r["layout"]: r for r in m.rows_vs_runs(["moeh12"])}
    # the three eager ep 2 layouts: runs routed at ρ 1.29 against the rows' 1.005, and
    # their layers 11-16 % longer than the rows (docs/benchmarks/moe_checks.md "moeh12")
    for name in ("dp2-ep2-z1-mb2-full", "tp2-ep2-mb2", "tp2-ep2-mb2-full"):
        assert rows[name]["rho_run"] == pytest.approx(1.29, abs=0.01)
        assert 0.84 < rows[name]["ratio"] < 0.89


def test_second_runs_are_kept_apart(load_benchmark):
    m = load_benchmark("moe_rows_vs_runs")
    first = {r["layout"]: r for r in m.rows_vs_runs(["moeh15"])}
    both = {r["layout"]: r for r in m.rows_vs_runs(["moeh15"], second_runs=True)}
    # moeh15 ran each layout twice (--second-pass); by default only the first runs count
    assert not any("(2nd)" in name for name in first)
    assert set(both) == set(first) | {f"{name} (2nd)" for name in first}
    # the same row priced both runs; tp2-ep2-mb4's second run was faster still (calibrate
    # row forward 7.51 ms against the runs' 5.37 and 4.79 ms a layer)
    one, two = both["tp2-ep2-mb4"], both["tp2-ep2-mb4 (2nd)"]
    assert one["row_f"] == two["row_f"]
    assert two["run_f"] < one["run_f"] < one["row_f"]


def test_the_runs_host_time_beside_the_gpus(load_benchmark):
    m = load_benchmark("moe_rows_vs_runs")
    rows = {r["layout"]: r for r in m.rows_vs_runs(["moeh15"])}
    none = rows["tp2-ep2-mb4"]
    # the run's forward host-paced (8.05 ms a layer on the CPU's clock, 5.37 on the GPU's),
    # its backward the other way (docs/benchmarks/moe_checks.md "moeh15")
    assert none["host_f"] * 1e3 == pytest.approx(8.05, abs=0.01)
    assert none["run_f"] * 1e3 == pytest.approx(5.37, abs=0.01)
    assert none["host_b"] < none["run_b"]
    table = m.markdown([none], host=True).splitlines()
    assert "run's host fwd + bwd ms" in table[0] and table[1].count("|") == 8
    assert "| 8.05 + 3.66 |" in table[2]
    assert "host" not in m.markdown([none]).splitlines()[0]
