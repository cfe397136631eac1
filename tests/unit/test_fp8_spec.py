"""Job(precision="fp8") and its recipe: accepted, named when wrong, refused by the cost model."""

from __future__ import annotations

import pytest

import meshplan as mp
from meshplan.spec import FP8_RECIPES
from meshplan.spec.validate import check_layout, check_modelled


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


def test_cost_model_refuses_fp8_until_it_prices_it():
    job = mp.Job(global_batch=8, seq_len=512, precision="fp8", fp8_recipe="blockwise")
    with pytest.raises(mp.ConfigError, match=r"precision = 'fp8' \(fp8_recipe 'blockwise'\) "
                                             r"is not priced"):
        check_modelled(mp.Layout(), job=job)
    model, cluster = mp.ModelSpec.preset("gpt-1.7b"), mp.Cluster.preset("dgx-h100", nodes=1)
    with pytest.raises(mp.ConfigError, match="not priced"):
        check_layout(model, cluster, job, mp.Layout(dp=8, micro_batch=1))
    check_modelled(mp.Layout(), job=mp.Job(global_batch=8, seq_len=512))   # bf16: accepted


def test_planner_refuses_fp8_with_a_config_error():
    from meshplan.planner.plan import plan
    model = mp.ModelSpec.preset("llama3-8b")
    cluster = mp.Cluster.preset("dgx-h100", nodes=1)
    with pytest.raises(mp.ConfigError, match="not priced by the cost model"):
        plan(model, cluster, mp.Job(global_batch=64, seq_len=4096, precision="fp8"))
