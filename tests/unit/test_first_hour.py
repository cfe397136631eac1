"""Issue 37's "raw tracebacks" and "accepted nonsense": each case gets a meshplan error (or
warning) naming the value and what would be valid, before any long work; files written get
the user's umask; CLI and API agree on overwriting."""

import json
import os
import stat
import time
import warnings

import pytest

import meshplan as mp
from meshplan.cli import build_parser, main
from meshplan.errors import ConfigError, MeshplanError, MeshplanWarning, ProfileError

GPT = ["--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb", "--nodes", "1",
       "--global-batch", "64", "--seq-len", "2048"]
LLAMA_JOB = ["--global-batch", "8", "--seq-len", "2048"]


def _no_search(monkeypatch):
    """Output-path checks must come before the search: make any search an error."""
    def refuse(*a, **k):
        raise AssertionError("the planner ran before the output path was checked")
    monkeypatch.setattr("meshplan.planner.plan", refuse)   # the CLI's and the report's


@pytest.fixture(scope="module")
def tiny_plan():
    model = mp.ModelSpec(name="tiny", num_layers=4, hidden_size=64, num_heads=4,
                         vocab_size=512, max_seq_len=256)
    return mp.plan(model, mp.Cluster.preset("dgx-a100-80gb", nodes=1),
                   mp.Job(global_batch=8, seq_len=128), gpus=2, top_k=2)


# ---------------------------------------------------------------- output paths

@pytest.mark.parametrize("force", [[], ["--force"]])
def test_plan_output_that_is_a_directory(tmp_path, capsys, monkeypatch, force):
    _no_search(monkeypatch)
    assert main(["plan", *GPT, "-o", str(tmp_path), *force]) == 2
    err = capsys.readouterr().err
    assert "is a directory" in err and "plan.json" in err and "Traceback" not in err


def test_plan_output_under_a_file(tmp_path, capsys, monkeypatch):
    _no_search(monkeypatch)
    (tmp_path / "f").write_text("x")
    assert main(["plan", *GPT, "-o", str(tmp_path / "f" / "plan.json")]) == 2
    assert "is not a directory" in capsys.readouterr().err


def test_plan_to_json_into_a_directory(tiny_plan, tmp_path):
    with pytest.raises(MeshplanError, match="is a directory; give a file path"):
        tiny_plan.to_json(tmp_path)


def test_plan_to_json_keeps_an_existing_file_unless_told(tiny_plan, tmp_path):
    path = tmp_path / "plan.json"
    path.write_text("keep me")
    with pytest.raises(MeshplanError, match="refusing to overwrite.*overwrite=True"):
        tiny_plan.to_json(path)
    assert path.read_text() == "keep me"
    tiny_plan.to_json(path, overwrite=True)
    assert json.loads(path.read_text())["schema"] == "meshplan.plan"


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_written_files_get_the_umask(tiny_plan, tmp_path, umask, mode):
    from meshplan.calibrate.tomlfile import write_text_atomic
    from meshplan.planner.planfile import write_json_atomic
    old = os.umask(umask)
    try:
        files = [tiny_plan.to_json(tmp_path / "plan.json"),
                 write_json_atomic(tmp_path / "results.json", {"a": 1}),
                 write_text_atomic(tmp_path / "profile.toml", "a = 1\n")]
    finally:
        os.umask(old)
    for f in files:
        assert stat.S_IMODE(f.stat().st_mode) == mode, f
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json", "profile.toml",
                                                          "results.json"]


def test_report_output_that_is_a_file_fails_before_any_work(tmp_path, capsys, monkeypatch):
    _no_search(monkeypatch)
    out = tmp_path / "report.html"
    out.write_text("mine")
    t0 = time.perf_counter()
    rc = main(["report", "--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus",
               "64,128", "--global-batch", "1024", "--seq-len", "8192", "-o", str(out)])
    assert rc == 2 and time.perf_counter() - t0 < 5
    err = capsys.readouterr().err
    assert "exists and is not a directory" in err and "Traceback" not in err
    assert out.read_text() == "mine"


def test_report_api_checks_the_directory_first(tmp_path, monkeypatch):
    _no_search(monkeypatch)
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(MeshplanError, match="not empty.*notes.txt"):
        mp.report("gpt-1.7b", "dgx-a100-80gb", gpus=[8], global_batch=64, seq_len=2048,
                  out_dir=tmp_path, progress=False)


# ---------------------------------------------------------------- input files

def test_non_utf8_cluster_toml(tmp_path, capsys):
    bad = tmp_path / "cluster.toml"
    bad.write_bytes('gpu = "H100-SXM5-80GB"\nname = "caf\xe9"\n'.encode("latin-1"))
    with pytest.raises(ProfileError, match=r"cluster file .* is not UTF-8 text \(byte 0xe9"):
        mp.Cluster.from_toml(bad)
    assert main(["estimate", "--model", "gpt-1.7b", "--cluster", str(bad),
                 *LLAMA_JOB]) == 2
    assert "not UTF-8" in capsys.readouterr().err


def test_non_utf8_profile_toml(tmp_path):
    from meshplan.hardware_profiles.calibrated import apply_profile
    bad = tmp_path / "profile.toml"
    bad.write_bytes(b'schema = "meshplan.gpu_profile"\nnote = "\xff"\n')
    with pytest.raises(ProfileError, match="profile file .* is not UTF-8 text"):
        apply_profile(mp.Cluster.preset("dgx-h100"), bad)


def test_cluster_toml_written_like_the_builtin_sections(tmp_path):
    f = tmp_path / "mine.toml"
    f.write_text('[my-h100]\ngpu = "H100-SXM5-80GB"\ngpus_per_node = 8\nnodes = 4\n'
                 'network = { nics_per_node = 8, nic_gbps = 50.0 }\n')
    c = mp.Cluster.from_toml(f)
    assert (c.name, c.nodes, c.gpu.name) == ("my-h100", 4, "H100-SXM5-80GB")
    f.write_text('[a]\ngpu = "H100-SXM5-80GB"\ngpus_per_node = 8\n'
                 'network = { nics_per_node = 8, nic_gbps = 50.0 }\n[b]\ngpus_per_node = 8\n')
    with pytest.raises(ProfileError, match=r"table\(s\) \['b'\] have no 'gpu' key.*\[NAME\]"):
        mp.Cluster.from_toml(f, name="a")


def _llama_config(tmp_path):
    cfg = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 256,
           "num_attention_heads": 4, "intermediate_size": 512, "vocab_size": 1000,
           "max_position_embeddings": 4096}
    d = tmp_path / "model_dir"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_hf_config_from_a_model_directory(tmp_path, capsys):
    d = _llama_config(tmp_path)
    m = mp.ModelSpec.from_hf_config(str(d) + "/")
    assert (m.num_layers, m.hidden_size, m.activation) == (4, 256, "swiglu")
    assert main(["estimate", "--model", str(d) + "/", "--cluster", "dgx-h100",
                 *LLAMA_JOB]) == 0
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match="model directory .* has no config.json"):
        mp.ModelSpec.from_hf_config(empty)


def test_hf_config_that_is_a_json_list(tmp_path, capsys):
    f = tmp_path / "config.json"
    f.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="must hold a JSON object .* got a JSON list"):
        mp.ModelSpec.from_hf_config(f)
    with pytest.raises(ConfigError, match="path to config.json, a model directory or a dict"):
        mp.ModelSpec.from_hf_config([1, 2])
    assert main(["estimate", "--model", str(f), "--cluster", "dgx-h100", *LLAMA_JOB]) == 2
    assert "JSON object" in capsys.readouterr().err


# ---------------------------------------------------------------- API arguments

def test_a_dict_passed_as_a_layout():
    model, cluster = mp.ModelSpec.preset("gpt-1.7b"), mp.Cluster.preset("dgx-a100-80gb")
    job = mp.Job(global_batch=64, seq_len=2048)
    with pytest.raises(ConfigError, match=r"layout must be a meshplan Layout, got dict .*"
                                          r"Layout.from_dict\(d\)"):
        mp.estimate(model, cluster, job, {"dp": 8})
    with pytest.raises(ConfigError, match="cluster must be a meshplan Cluster, got dict"):
        mp.estimate(model, cluster.to_dict(), job, mp.Layout(dp=8))
    with pytest.raises(ConfigError, match="model must be a meshplan ModelSpec, got str"):
        mp.estimate("gpt-1.7b", cluster, job, mp.Layout(dp=8))


@pytest.mark.parametrize("pp,vpp,words", [
    (2, 7, ["vpp = 7", "32 layers", "14 equal chunks", "[2, 4, 8, 16]"]),
    (4, 3, ["vpp = 3", "12 equal chunks", "8 layers per pipeline rank", "[2, 4, 8]"]),
])
def test_vpp_that_does_not_divide_the_layers_per_stage(pp, vpp, words, capsys):
    model = mp.ModelSpec.preset("llama3-8b")
    job = mp.Job(global_batch=64, seq_len=2048)
    lay = mp.Layout(dp=8 // pp, pp=pp, schedule="interleaved-1f1b", vpp=vpp)
    with pytest.raises(ConfigError) as err:
        mp.estimate(model, mp.Cluster.preset("dgx-h100"), job, lay)
    for w in words:
        assert w in str(err.value)
    # an explicit (uneven) chunk split is still the user's choice
    parts = mp.spec.default_stage_layers(32, pp * vpp)
    assert mp.estimate(model, mp.Cluster.preset("dgx-h100"), job,
                       lay.replace(stage_layers=parts)).step_time_s > 0
    assert main(["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100",
                 "--global-batch", "64", "--seq-len", "2048", "--dp", str(8 // pp), "--pp",
                 str(pp), "--schedule", "interleaved-1f1b", "--vpp", str(vpp)]) == 2
    assert f"vpp = {vpp} does not divide" in capsys.readouterr().err


@pytest.mark.parametrize("argv,words", [
    (["--pp", "1", "--schedule", "interleaved-1f1b", "--vpp", "7"], ["vpp = 7", "pp > 1"]),
    (["--pp", "4", "--dp", "2", "--stage-layers", "16,0,8,8"],
     ["stage_layers[1] = 0", "only the first stage"]),
])
def test_cli_layouts_the_issue_found_accepted(argv, words, capsys):
    assert main(["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100",
                 "--global-batch", "64", "--seq-len", "2048", *argv]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and all(w in err for w in words)


def test_cli_takes_a_first_stage_of_only_the_embedding(capsys):
    assert main(["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100",
                 "--global-batch", "64", "--seq-len", "2048", "--pp", "2", "--dp", "4",
                 "--stage-layers", "0,32"]) == 0
    assert "layers 0/32" in capsys.readouterr().out


# ---------------------------------------------------------------- sequence length

def test_sequence_past_a_rope_models_maximum_warns():
    model = mp.ModelSpec.preset("llama3-8b")
    lay = mp.Layout(dp=2, tp=4, sequence_parallel=True, recompute="full")
    job = mp.Job(global_batch=8, seq_len=100_000)
    with pytest.warns(MeshplanWarning, match=r"seq_len = 100000 exceeds the maximum sequence "
                                             r"length of 'llama3-8b'.*max_seq_len = 8192.*"
                                             r"--strict"):
        mp.estimate(model, mp.Cluster.preset("dgx-h100"), job, lay)
    with warnings.catch_warnings():
        warnings.simplefilter("error", MeshplanWarning)
        with pytest.raises(MeshplanWarning):
            mp.plan(model, mp.Cluster.preset("dgx-h100"), job)


def test_sequence_within_the_maximum_is_quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mp.estimate(mp.ModelSpec.preset("llama3-8b"), mp.Cluster.preset("dgx-h100"),
                    mp.Job(global_batch=8, seq_len=8192), mp.Layout(dp=8))


def test_sequence_past_learned_positions_is_an_error():
    with pytest.raises(ConfigError, match="learned position embeddings.*seq_len <= 2048"):
        mp.estimate(mp.ModelSpec.preset("gpt-1.7b"), mp.Cluster.preset("dgx-h100"),
                    mp.Job(global_batch=8, seq_len=4096), mp.Layout(dp=8))


def test_cli_warns_and_strict_refuses(capsys):
    argv = ["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--global-batch",
            "8", "--seq-len", "100000", "--dp", "2", "--tp", "4", "--sequence-parallel",
            "--recompute", "full"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "meshplan estimate: warning: seq_len = 100000 exceeds" in err
    assert main(argv + ["--strict"]) == 2
    err = capsys.readouterr().err
    assert "meshplan estimate: error (--strict): seq_len = 100000" in err
    assert "Traceback" not in err


# ---------------------------------------------------------------- runtime

def test_validate_predicts_the_executors_runtime():
    p = build_parser()
    common = ["--model", "gpt-1.7b", "--cluster", "dgx-h100"]
    assert p.parse_args(["validate", *common, "--out", "x"]).runtime == "torch"
    assert p.parse_args(["validate", *common, "--out", "x", "--runtime",
                         "megatron"]).runtime == "megatron"
    assert p.parse_args(["estimate", *common, *LLAMA_JOB]).runtime == "megatron"


def test_validate_out_that_is_a_file_fails_before_any_run(tmp_path, capsys, monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("layouts ran before --out was checked")
    monkeypatch.setattr("meshplan.calibrate.validate.run_layouts", refuse)
    f = tmp_path / "accuracy"
    f.write_text("mine")
    assert main(["validate", "--model", "gpt-1.7b", "--cluster", "dgx-h100",
                 "--out", str(f)]) == 2
    assert "exists and is not a directory" in capsys.readouterr().err
    assert f.read_text() == "mine"
