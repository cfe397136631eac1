"""benchmarks/moe_rows_vs_runs.py: the calibration's ep rows against the runs' own layers,
from the committed MoE sets (docs/moe.md "The ep rows against the runs")."""

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
