"""`meshplan run` warns when a plan, priced as the executor runs it (runtime "torch"), does
not fit the GPU: `meshplan plan` defaults to Megatron's runtime, whose model states are
smaller than the executor's (docs/executor.md, "Known limits")."""

from __future__ import annotations

import warnings

import pytest

import meshplan as mp
from meshplan.cli import main as cli_main
from meshplan.errors import MeshplanWarning
from meshplan.executor.planfiles import write_plan_for_layout
from meshplan.executor.run_results import warn_if_too_big
from meshplan.planner.planfile import load_plan_file

CLUSTER = mp.Cluster.preset("dgx-h100", nodes=4)
LAYOUT = mp.Layout(dp=4, pp=1, tp=8, micro_batch=1, zero=1, recompute="full",
                   sequence_parallel=True)


def _plan(tmp_path, runtime: str):
    job = mp.Job(global_batch=64, seq_len=4096, runtime=runtime)
    return write_plan_for_layout(tmp_path / f"{runtime}.json", mp.ModelSpec.preset("llama3-70b"),
                                 job, LAYOUT, CLUSTER)


def test_a_megatron_plan_too_big_for_the_executor_is_named(tmp_path, capsys):
    plan = _plan(tmp_path, "megatron")
    assert load_plan_file(plan).prediction["fits"]          # fits as Megatron runs it
    with pytest.warns(MeshplanWarning) as caught:
        warn_if_too_big(load_plan_file(plan))
    err = "".join(str(w.message) for w in caught)
    assert "predicted not to fit under this executor" in err
    assert "GiB usable" in err and "--runtime torch" in err
    # the launch scripts are written all the same, with the warning, which the CLI prints
    assert cli_main(["run", str(plan), "--launch-dir", str(tmp_path / "l")]) == 0
    assert "meshplan run: warning: this layout is predicted not to fit" in (
        capsys.readouterr().err)
    assert (tmp_path / "l" / "run_torchrun.sh").exists()


def test_plan_warns_when_its_launch_scripts_run_a_layout_too_big_for_the_executor(tmp_path,
                                                                                  capsys):
    argv = ["plan", "--model", "llama3-70b", "--cluster", "dgx-h100", "--nodes", "4",
            "--global-batch", "64", "--seq-len", "4096", "--quiet", "--top-k", "1"]
    assert cli_main(argv + ["--launch-dir", str(tmp_path / "m")]) == 0
    err = capsys.readouterr().err
    assert "meshplan plan: warning: this layout is predicted not to fit" in err
    assert cli_main(argv + ["--runtime", "torch", "--launch-dir", str(tmp_path / "t")]) == 0
    assert "not to fit" not in capsys.readouterr().err


def test_a_plan_that_fits_the_executor_is_quiet(tmp_path, capsys):
    small = mp.ModelSpec.preset("llama3-8b")
    plan = write_plan_for_layout(tmp_path / "p.json", small,
                                 mp.Job(global_batch=64, seq_len=4096, runtime="torch"),
                                 LAYOUT, CLUSTER)
    with warnings.catch_warnings():
        warnings.simplefilter("error", MeshplanWarning)
        warn_if_too_big(load_plan_file(plan))
    assert capsys.readouterr().err == ""
