"""Bad input a user meets on the command line (and its Python twins): each error is one
``meshplan CMD: error: ...`` line naming the value at fault and what would be valid, found
before any long work, and no user file is replaced without being asked."""

from pathlib import Path

import pytest

import meshplan as mp
from meshplan.cli import main
from meshplan.planner import Constraints

PLAN = ["plan", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb", "--nodes", "1",
        "--global-batch", "64", "--seq-len", "2048", "--top-k", "3", "--quiet"]
H100_PROFILE = (Path(__file__).resolve().parents[2]
                / "docs/benchmarks/data/profiles/profile_h100x2_round12.toml")


def _error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    # warnings about the inputs (a stored profile's) may come first, each on its own line
    lines = err.splitlines(keepends=True)
    while lines and lines[0].startswith(f"meshplan {argv[0]}: warning: "):
        lines.pop(0)
    err = "".join(lines)
    assert err.startswith(f"meshplan {argv[0]}: error: "), err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize("option", [["--ep-options", "2"], ["--fix", "ep=2"],
                                    ["--fix", "etp=2"]])
def test_expert_parallel_options_on_a_dense_model(capsys, option):
    err = _error(capsys, PLAN + option)
    assert "dense" in err and "gpt-1.7b" in err and "internal planner error" not in err


def test_ep_options_none_of_which_divides_the_experts():
    model = mp.ModelSpec.preset("mixtral-8x7b")
    with pytest.raises(mp.ConfigError, match=r"none divides the 8 routed experts.*\[1, 2, 4, 8\]"):
        mp.plan(model, mp.Cluster.preset("dgx-h100", nodes=2),
                mp.Job(global_batch=64, seq_len=4096), constraints=Constraints(ep=(3,)))


def test_cp_options_the_sequence_cannot_be_cut_into(capsys):
    err = _error(capsys, PLAN + ["--cp-options", "3"])
    assert "seq_len = 2048" in err and "2·cp" in err and "[1, 2, 4, 8" in err
    assert "global_batch" not in err      # not the empty space's batch explanation


def test_fix_stage_layers_not_integers(capsys):
    err = _error(capsys, PLAN + ["--fix", "stage_layers=12,x"])
    assert "'stage_layers=12,x'" in err and "comma-separated integers" in err


def test_report_applies_profile_override(tmp_path, monkeypatch, capsys):
    """--profile-override was parsed and dropped: a profile of another GPU was refused."""
    import meshplan.report.build as build
    seen = {}

    def fake_build_report(model, cluster, job, **kw):
        seen["gpu"] = cluster.gpu
        raise mp.ConfigError("stop here")
    monkeypatch.setattr(build, "build_report", fake_build_report)
    argv = ["report", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb", "--gpus", "8",
            "--global-batch", "64", "--seq-len", "2048", "--profile", str(H100_PROFILE),
            "-o", str(tmp_path / "r")]
    err = _error(capsys, argv)
    assert "measured on 'H100-SXM5-80GB'" in err and "--profile-override" in err
    err = _error(capsys, argv + ["--profile-override"])
    assert "stop here" in err and "H100" in seen["gpu"].provenance


@pytest.mark.parametrize("cluster, kw", [
    ("dgx-a100-80gb", {"compare_precision": "bf16,fp8"}),
    ("dgx-h100", {"compare_gpus": "h100,a100", "job": mp.Job(global_batch=64, seq_len=2048,
                                                              precision="fp8")}),
    ("dgx-a100-80gb", {"job": mp.Job(global_batch=64, seq_len=2048, precision="fp8")})])
def test_report_fp8_on_a_gpu_without_it_fails_before_planning(cluster, kw):
    said = []
    kw = {"global_batch": 64, "seq_len": 2048, **kw}
    with pytest.raises(mp.ConfigError, match="A100-SXM4-80GB' has no fp8 peak"):
        mp.report("gpt-1.7b", cluster, gpus=[8, 16], progress=said.append, **kw)
    assert said == []                       # not one plan made before the error


def test_calibrate_refuses_an_existing_profile_before_measuring(tmp_path, capsys):
    out = tmp_path / "profile.toml"
    out.write_text("# a profile that took an hour of GPU time\n")
    err = _error(capsys, ["calibrate", "--device", "cpu", "--quick", "--nproc", "2",
                          "--out", str(out)])
    assert "exists; refusing to overwrite it" in err and "--force" in err
    assert out.read_text() == "# a profile that took an hour of GPU time\n"
    err = _error(capsys, ["calibrate", "--device", "cpu", "--out", str(tmp_path)])
    assert "is a directory" in err


def test_calibrate_passes_force_on_to_its_ranks():
    import argparse

    from meshplan.commands.calibrate import add_arguments, child_argv
    p = argparse.ArgumentParser()
    add_arguments(p)
    assert "--force" in child_argv(p.parse_args(["--force", "--nproc", "2"]))
    assert "--force" not in child_argv(p.parse_args(["--nproc", "2"]))


@pytest.mark.parametrize("value", ["-4", "0", "nan"])
def test_run_timeout_checked_before_torchrun(tmp_path, capsys, value):
    """Was checked only by each torchrun rank: a wall of torchrun tracebacks and a failed
    results file."""
    with pytest.raises(SystemExit) as exc:
        main(["run", str(tmp_path / "plan.json"), "--timeout-s", value])
    assert exc.value.code == 2
    assert "--timeout-s" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("typo, hint", [(["--dpp", "2"], "did you mean --pp or --dp?"),
                                        (["--sequence-paralel"], "--sequence-parallel"),
                                        (["--zerro=1"], "did you mean --zero?")])
def test_misspelt_option_named_by_the_subcommand_with_the_closest(capsys, typo, hint):
    argv = ["estimate", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb",
            "--global-batch", "64", "--seq-len", "2048", *typo]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "usage: meshplan estimate" in err        # the subcommand's usage, not meshplan's
    assert f"meshplan estimate: error: unrecognized arguments: {' '.join(typo)}" in err
    assert hint in err


def test_estimate_larger_than_the_default_node_says_pass_nodes(capsys):
    argv = ["estimate", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb",
            "--global-batch", "64", "--seq-len", "2048", "--dp", "16"]
    err = _error(capsys, argv)
    assert "16 GPUs" in err and "--nodes not given" in err and "pass --nodes 2" in err
    assert main(argv + ["--nodes", "2"]) == 0


def test_plan_best_line_without_the_long_stage_list(capsys):
    assert main(PLAN) == 0
    best = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("best: "))
    assert "stage_layers=[" not in best and " layers " in best     # short()'s partition


def test_in_flight_micro_batches_rounded():
    import dataclasses

    from meshplan.commands.format import format_estimate
    est = mp.estimate(mp.ModelSpec.preset("gpt-1.7b"), mp.Cluster.preset("dgx-a100-80gb"),
                      mp.Job(global_batch=64, seq_len=2048), mp.Layout(dp=8))
    stage = dataclasses.replace(est.memory[0], inflight_microbatches=8 + 7 / 12)
    text = format_estimate(dataclasses.replace(est, memory=(stage,)))
    assert " 8.58 " in text and "8.583" not in text


@pytest.mark.parametrize("fixed, phase", [
    ({"pp": 2, "schedule": "interleaved-1f1b"}, "bounding: exact time bounds of "),
    ({"pp": 2, "schedule": "1f1b"}, "CP-SAT partitions: 1/")])
def test_planner_phases_report_progress_from_their_first_step(monkeypatch, fixed, phase):
    """DeepSeek-V3 on 2048 H100s: 2.8 s without a line while the pipelined configurations'
    exact bounds were computed, and CP-SAT's first line only after 26 infeasible models."""
    import meshplan.planner.bounds as bounds
    monkeypatch.setattr(bounds, "PROGRESS_EVERY_S", 0.0)     # every tick shown
    said = []
    mp.plan(mp.ModelSpec.preset("gpt-1.7b"), mp.Cluster.preset("dgx-a100-80gb"),
            mp.Job(global_batch=64, seq_len=2048), top_k=2,
            constraints=Constraints(fixed=fixed), progress=said.append)
    first = next((m for m in said if m.startswith(phase[:len("CP-SAT partitions")])), "")
    assert first.startswith(phase), said
    if phase.startswith("CP-SAT"):
        assert first.endswith(" 0 partition models")    # said before the first solve


def test_top_level_help_without_rst_markup(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "The meshplan command line: meshplan plan | estimate" in out and "``" not in out


def _model_dir(path: Path, layers: int) -> Path:
    import json
    path.mkdir()
    (path / "config.json").write_text(json.dumps(
        {"model_type": "llama", "num_hidden_layers": layers, "hidden_size": 256,
         "num_attention_heads": 4, "intermediate_size": 512, "vocab_size": 1000,
         "max_position_embeddings": 4096}))
    return path


def test_model_directory_named_without_a_slash(tmp_path, monkeypatch, capsys):
    """``--model mymodel`` (a directory here holding config.json) said "unknown model preset
    'mymodel'"; ``mymodel/`` and ``./mymodel`` worked."""
    from meshplan.spec.resolve import load_model
    _model_dir(tmp_path / "mymodel", layers=4)
    monkeypatch.chdir(tmp_path)
    assert load_model("mymodel").num_layers == 4
    assert main(["estimate", "--model", "mymodel", "--cluster", "dgx-h100", "--nodes", "1",
                 "--dp", "8", "--global-batch", "64", "--seq-len", "2048"]) == 0


def test_model_preset_wins_over_a_directory_of_its_name(tmp_path, monkeypatch):
    from meshplan.spec.resolve import load_model
    _model_dir(tmp_path / "gpt-1.7b", layers=3)
    monkeypatch.chdir(tmp_path)
    assert load_model("gpt-1.7b") == mp.ModelSpec.preset("gpt-1.7b")
    assert load_model("./gpt-1.7b").num_layers == 3         # the directory, asked for as one


def test_unknown_model_names_presets_and_paths(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    err = _error(capsys, ["estimate", "--model", "mymodel", "--cluster", "dgx-h100",
                          "--global-batch", "64", "--seq-len", "2048"])
    assert "unknown model preset 'mymodel'" in err and "gpt-1.7b" in err
    assert "directory holding a config.json" in err and "no directory 'mymodel'" in err


def test_precision_without_a_peak_names_gpus_that_have_it_and_what_this_one_has(capsys):
    """Said only "GPU 'A100-SXM4-80GB' has no fp8 peak in its profile; known: {...}"."""
    from meshplan.hardware_profiles.loader import builtin_table
    err = _error(capsys, ["estimate", "--model", "llama3-8b", "--cluster", "dgx-a100-80gb",
                          "--nodes", "1", "--dp", "8", "--global-batch", "64",
                          "--seq-len", "2048", "--precision", "fp8"])
    assert "'A100-SXM4-80GB' has no fp8 peak" in err
    assert "it has bf16, fp16, fp32 (--precision bf16)" in err
    fp8_gpus = [g for g, t in builtin_table("gpus.toml").items()
                if t["peak_tflops"].get("fp8", 0) > 0]
    assert "H100-SXM5-80GB" in fp8_gpus and "A100-SXM4-80GB" not in fp8_gpus
    listed = err.split("built-in GPUs with a peak for fp8: ")[1]
    assert all(g in listed for g in fp8_gpus) and "A100" not in listed
    assert "H100-SXM5-80GB (dgx-h100)" in listed                 # the cluster preset to use


def test_gpu_count_error_says_node_for_one_node(capsys):
    err = _error(capsys, ["estimate", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb",
                          "--nodes", "1", "--dp", "16", "--global-batch", "64",
                          "--seq-len", "2048"])
    assert "16 > 8 GPUs of cluster 'dgx-a100-80gb' (1 node × 8)" in err
    with pytest.raises(mp.ConfigError, match=r"\(2 nodes × 8\)"):
        mp.estimate(mp.ModelSpec.preset("gpt-1.7b"), mp.Cluster.preset("dgx-a100-80gb", nodes=2),
                    mp.Job(global_batch=64, seq_len=2048), mp.Layout(dp=32))


@pytest.mark.parametrize("gb, mb, words", [
    (100, 2, ["dp·micro_batch = 8·2 = 16", "near 100 (multiples of 16): 80, 96, 112, 128",
              "no micro_batch fits at dp = 8, which does not divide 100"]),
    (1000, 3, ["8·3 = 24", "near 1000 (multiples of 24): 960, 984, 1008, 1032",
               "or keep 1000 with micro_batch ∈ {1, 5, 25, 125} at dp = 8"]),
    (4, 1, ["8·1 = 8", "near 4 (multiples of 8): 8, 16;"])])
def test_batch_not_divisible_lists_valid_batches_and_micro_batches(capsys, gb, mb, words):
    err = _error(capsys, ["estimate", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb",
                          "--nodes", "1", "--dp", "8", "--global-batch", str(gb),
                          "--micro-batch", str(mb), "--seq-len", "2048"])
    assert f"global_batch = {gb} is not divisible by dp·micro_batch" in err
    assert all(w in err for w in words), err


@pytest.mark.parametrize("solver", ["cp-sat", "exhaustive"])
def test_long_sequence_warns_once_per_call_at_the_callers_line(solver):
    """The warning pointed at estimate.py:77 / plan.py:183, and docs/context_parallel.md's
    example (one estimate, one plan) printed it three times: plan warned again from the
    estimates of its best layouts."""
    import warnings
    model, cluster = mp.ModelSpec.preset("llama3-8b"), mp.Cluster.preset("dgx-h100", nodes=4)
    job, pp1 = mp.Job(global_batch=32, seq_len=131072), Constraints(fixed={"pp": 1})
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        mp.estimate(model, cluster, job, mp.Layout(dp=2, cp=16, zero=2)); est_line = _line()
        mp.plan(model, cluster, job, top_k=3, solver=solver, constraints=pp1); plan_line = _line()
    long = [w for w in rec if issubclass(w.category, mp.MeshplanWarning)
            and "exceeds the maximum sequence length of 'llama3-8b'" in str(w.message)]
    assert [(w.filename, w.lineno) for w in long] == [(__file__, est_line),
                                                       (__file__, plan_line)]


def _line() -> int:
    import sys
    return sys._getframe(1).f_lineno
