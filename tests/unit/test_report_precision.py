"""`meshplan report --compare-precision bf16,fp8`: the precisions section's numbers are the
cost model's, and bad lists are refused before any planning."""

from __future__ import annotations

import pytest

import meshplan as mp
from meshplan.cli import main as cli_main
from meshplan.errors import ConfigError
from meshplan.report.precision import parse_precisions, precision_job


def test_precision_lists_parse_and_bad_ones_are_named():
    assert parse_precisions("bf16,fp8") == (("bf16", None), ("fp8", None))
    assert parse_precisions(["bf16", "fp8:rowwise"]) == (("bf16", None), ("fp8", "rowwise"))
    for bad, msg in (("bf16,fp4", "'fp4' is not a precision"),
                     ("bf16,bf16:rowwise", "'bf16:rowwise' is not a precision"),
                     ("fp8", "at least two precisions")):
        with pytest.raises(ConfigError, match=msg):
            parse_precisions(bad)
    job = mp.Job(global_batch=8, seq_len=64, precision="fp8", fp8_recipe="rowwise")
    assert precision_job(job, "fp8", None).fp8_recipe == "rowwise"
    assert precision_job(job, "bf16", None).fp8_recipe == "tensorwise"


def test_report_compares_bf16_and_fp8_with_the_cost_models_numbers(tmp_path):
    model, cluster = mp.ModelSpec.preset("llama3-8b"), mp.Cluster.preset("dgx-h100")
    r = mp.report(model, cluster, gpus=[8], global_batch=64, seq_len=4096, top_k=2,
                  sensitivity=False, compare_precision="bf16,fp8", progress=False)
    df = r.tables["precision_comparison"]
    assert list(df["precision"]) == ["bf16", "fp8 (tensorwise)"]
    main = r.outcomes[0]
    fp8_job = mp.Job(global_batch=64, seq_len=4096, precision="fp8")
    same = mp.estimate(model, main.cluster, fp8_job, main.layout)
    assert df["same_layout_step_time_s"].iloc[1] == pytest.approx(same.step_time_s)
    assert df["same_layout_speedup"].iloc[1] == pytest.approx(
        main.estimate.step_time_s / same.step_time_s)
    assert df["speedup"].iloc[0] == 1.0 and df["step_time_s"].iloc[0] == pytest.approx(
        main.estimate.step_time_s)
    assert df["usd_per_million_tokens"].notna().all()
    assert list(df["same_layout_fits"]) == [main.estimate.fits, same.fits]


def test_a_main_layout_that_does_not_fit_in_a_precision_is_marked():
    from meshplan.report.precision import display_precision
    import pandas as pd
    df = pd.DataFrame({"precision": ["bf16", "fp8 (tensorwise)"], "step_time_s": [2.0, 1.6],
                       "speedup": [1.0, 1.25], "same_layout_step_time_s": [2.0, 1.5],
                       "same_layout_memory_peak_gib": [70.0, 84.1],
                       "same_layout_fits": [True, False], "same_layout_speedup": [1.0, 1.33]})
    shown = display_precision(df)
    assert list(shown["main layout: memory"]) == ["70.0 GiB", "84.1 GiB (does not fit)"]
    assert "same_layout_fits" not in shown.columns


def test_cli_refuses_a_bad_precision_list(capsys, tmp_path):
    rc = cli_main(["report", "--model", "gpt-1.7b", "--cluster", "dgx-h100", "--gpus", "8",
                   "--global-batch", "64", "--seq-len", "2048", "--compare-precision", "bf16",
                   "-o", str(tmp_path / "r")])
    assert rc != 0 and "at least two precisions" in capsys.readouterr().err


def test_cli_fp8_recipe_names_the_compared_fp8s_recipe(tmp_path):
    # `--fp8-recipe rowwise --compare-precision bf16,fp8` with a bf16 job: the recipe is the
    # compared fp8's (the bf16 job refused it: "applies only with precision = 'fp8'")
    import pandas as pd
    out = tmp_path / "r"
    rc = cli_main(["report", "--model", "gpt-1.7b", "--cluster", "dgx-h100", "--gpus", "8",
                   "--global-batch", "64", "--seq-len", "2048", "--compare-precision",
                   "bf16,fp8", "--fp8-recipe", "rowwise", "--no-sensitivity", "-o", str(out)])
    assert rc == 0
    df = pd.read_csv(out / "precision_comparison.csv")
    assert list(df["precision"]) == ["bf16", "fp8 (rowwise)"]
