"""Job(precision="fp8") and its recipe: accepted, named when wrong, priced by the cost model
where the GPU and runtime can run it, refused with the reason where not."""

from __future__ import annotations

import pytest

import meshplan as mp
from meshplan.spec import FP8_RECIPES
from meshplan.spec.validate import check_layout


@pytest.mark.parametrize("recipe", FP8_RECIPES)
def test_fp8_job_accepts_every_recipe_and_round_trips(recipe):
    job = mp.Job(global_batch=8, seq_len=16, precision="fp8", fp8_recipe=recipe)
    assert mp.Job.from_dict(job.to_dict()) == job


def test_default_recipe_is_tensorwise_and_old_job_dicts_load():
    assert mp.Job(global_batch=8, seq_len=16, precision="fp8").fp8_recipe == "tensorwise"
    old = mp.Job(global_batch=8, seq_len=16).to_dict()
    del old["fp8_recipe"]                       # a plan file written before the field existed
    assert mp.Job.from_dict(old).fp8_recipe == "tensorwise"


def test_unknown_recipe_is_named_with_the_valid_ones():
    with pytest.raises(mp.ConfigError, match=r"fp8_recipe = 'mx'.*'tensorwise'.*'mxfp8'"):
        mp.Job(global_batch=8, seq_len=16, precision="fp8", fp8_recipe="mx")


def test_recipe_without_fp8_precision_is_refused_not_ignored():
    with pytest.raises(mp.ConfigError, match=r"fp8_recipe = 'rowwise' applies only with "
                                             r"precision = 'fp8', got precision = 'bf16'"):
        mp.Job(global_batch=8, seq_len=16, fp8_recipe="rowwise")


def test_cost_model_prices_fp8_and_refuses_what_the_gpu_or_runtime_cannot_run():
    model, h100 = mp.ModelSpec.preset("gpt-1.7b"), mp.Cluster.preset("dgx-h100", nodes=1)
    lay = mp.Layout(dp=8, micro_batch=1)

    def job(recipe, runtime="megatron"):
        return mp.Job(global_batch=8, seq_len=512, precision="fp8", fp8_recipe=recipe,
                      runtime=runtime)
    check_layout(model, h100, job("blockwise"), lay)          # accepted: priced now
    assert mp.estimate(model, h100, job("blockwise"), lay).step_time_s > 0
    with pytest.raises(mp.ConfigError, match=r"'mxfp8' needs MX block-scaled tensor cores"):
        mp.estimate(model, h100, job("mxfp8"), lay)
    with pytest.raises(mp.ConfigError, match=r"'blockwise' does not run under runtime "
                                             r"'torch'.*'tensorwise', 'rowwise'"):
        mp.estimate(model, h100, job("blockwise", "torch"), lay)
    with pytest.raises(mp.ConfigError, match=r"'delayed' does not run under runtime 'torch'"):
        mp.estimate(model, h100, job("delayed", "torch"), lay)
    a100 = mp.Cluster.preset("dgx-a100-80gb", nodes=1)
    with pytest.raises(mp.ConfigError, match=r"A100-SXM4-80GB' has no fp8 peak"):
        mp.estimate(model, a100, job("tensorwise"), lay)
    b200 = mp.Cluster.preset("dgx-b200", nodes=1)
    assert mp.estimate(model, b200, job("mxfp8"), lay).step_time_s > 0


def test_planner_plans_fp8_and_refuses_an_unrunnable_recipe_before_searching():
    from meshplan.planner.plan import plan
    model = mp.ModelSpec.preset("llama3-8b")
    cluster = mp.Cluster.preset("dgx-h100", nodes=1)
    p = plan(model, cluster, mp.Job(global_batch=64, seq_len=4096, precision="fp8"))
    assert p.best.estimate.step_time_s > 0 and p.job.precision == "fp8"
    with pytest.raises(mp.ConfigError, match="needs MX block-scaled tensor cores"):
        plan(model, cluster, mp.Job(global_batch=64, seq_len=4096, precision="fp8",
                                    fp8_recipe="mxfp8"))


def test_cli_estimate_takes_precision_fp8_and_a_recipe(capsys):
    from meshplan.cli import main as cli_main
    base = ["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--nodes", "1",
            "--dp", "8", "--global-batch", "64", "--seq-len", "4096"]
    assert cli_main(base + ["--precision", "fp8", "--fp8-recipe", "rowwise", "--compile"]) == 0
    out = capsys.readouterr().out
    assert "step time" in out and "fp8 casts priced as" in out
    assert cli_main(base + ["--fp8-recipe", "rowwise"]) != 0
    assert "applies only with precision = 'fp8'" in capsys.readouterr().err
