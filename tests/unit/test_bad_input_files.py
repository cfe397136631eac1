"""Bad values in files and arguments that used to pass silently or end in a traceback (an
audit of 2026-12-05): each is refused with one line naming the value and what is valid."""

from __future__ import annotations

import json

import pytest

import meshplan as mp
from meshplan.cli import main
from meshplan.errors import ConfigError, UnknownPresetError

CLUSTER_TOML = """gpu = "H100-SXM5-80GB"
gpus_per_node = 8
nodes = 2
intra_node = { fabric = "nvswitch", latency_us = 3.4 }
network = { nics_per_node = 8, nic_gbps = 50.0, latency_us = 14.0, topology = "fat-tree" }
network_efficiency = [[1e4, 0.02], [1e6, 0.50], [1e9, 0.92]]
price_per_gpu_hour = 3.0
"""
EST = ["estimate", "--model", "gpt-1.7b", "--global-batch", "64", "--seq-len", "2048",
       "--dp", "16", "--micro-batch", "1"]


def _cluster_error(tmp_path, capsys, text: str) -> str:
    f = tmp_path / "c.toml"
    f.write_text(text)
    assert main(EST + ["--cluster", str(f)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("meshplan estimate: error: ") and "Traceback" not in err
    return err


def test_a_good_cluster_file_prices(tmp_path, capsys):
    f = tmp_path / "c.toml"
    f.write_text(CLUSTER_TOML)
    assert main(EST + ["--cluster", str(f)]) == 0


def test_a_file_of_several_clusters_names_one_on_the_command_line(tmp_path, capsys):
    body = CLUSTER_TOML.replace("price_per_gpu_hour = 3.0", "")
    f = tmp_path / "two.toml"
    f.write_text("[small]\n" + body + "price_per_gpu_hour = 2.0\n\n[big]\n" + body
                 + "price_per_gpu_hour = 4.0\n")
    assert main(EST + ["--cluster", str(f)]) == 2
    assert f"--cluster {f}:NAME" in capsys.readouterr().err
    assert main(EST + ["--cluster", f"{f}:big"]) == 0
    from meshplan.hardware_profiles.resolve import load_cluster
    assert load_cluster(f"{f}:small", None).price_per_gpu_hour == 2.0
    # a cluster at top level may carry its name and its own GPU tables beside it
    top = tmp_path / "top.toml"
    top.write_text('name = "mine"\n' + CLUSTER_TOML.replace('gpu = "H100-SXM5-80GB"',
                                                           'gpu = "H100-SXM5-80GB"'))
    assert load_cluster(str(top), None).name == "mine"


@pytest.mark.parametrize("value", ["0.0", "-0.5", "1.5"])
def test_an_efficiency_outside_0_1_is_refused(tmp_path, capsys, value):
    text = CLUSTER_TOML.replace("[1e9, 0.92]", f"[1e9, {value}]")
    err = _cluster_error(tmp_path, capsys, text)
    assert "network_efficiency" in err and "(0, 1]" in err and value in err


@pytest.mark.parametrize("old, new, named", [
    ("price_per_gpu_hour", "price_per_gpu_hr",                           # a misspelt key
     "'price_per_gpu_hr' (did you mean 'price_per_gpu_hour'?)"),
    ('fabric = "nvswitch"', 'fabric = "pcie"', "'pcie' is not modelled"),
    ('topology = "fat-tree"', 'topology = "torus"', "'torus' is not modelled"),
    ("latency_us = 14.0", "latncy_us = 14.0", "'latncy_us'"),
])
def test_unknown_keys_and_unmodelled_values_are_refused(tmp_path, capsys, old, new, named):
    err = _cluster_error(tmp_path, capsys, CLUSTER_TOML.replace(old, new))
    assert named in err


def test_a_profile_with_a_zero_gemm_efficiency_is_refused(tmp_path):
    from meshplan.errors import ProfileError
    from meshplan.hardware_profiles.loader import builtin_table, gpu_from_table
    table = dict(builtin_table("gpus.toml")["H100-SXM5-80GB"])
    table["gemm_efficiency"] = [[1e8, 0.0], [1e12, 0.7]]
    with pytest.raises(ProfileError, match=r"gemm_efficiency.*\(0, 1\]; got 0.0"):
        gpu_from_table("H100-SXM5-80GB", table, "test [gpu]")


@pytest.mark.parametrize("kwargs, field", [
    (dict(flash_attention="false"), "flash_attention"),
    (dict(overlap_dp_comm="no"), "overlap_dp_comm"),
    (dict(overlap_tp_comm=1), "overlap_tp_comm"),
])
def test_job_switches_need_true_or_false(kwargs, field):
    with pytest.raises(ConfigError, match=f"Job.{field} must be True or False"):
        mp.Job(global_batch=8, seq_len=64, **kwargs)


def test_model_switches_need_true_or_false_also_from_a_file(tmp_path, capsys):
    d = mp.ModelSpec.preset("llama2-7b").to_dict()
    d["tied_embeddings"] = "false"                     # a string reads as True in Python
    f = tmp_path / "m.json"
    f.write_text(json.dumps(d))
    assert main(["estimate", "--model", str(f), "--cluster", "dgx-h100", "--global-batch", "8",
                 "--seq-len", "2048", "--dp", "8", "--micro-batch", "1"]) == 2
    assert "ModelSpec.tied_embeddings must be True or False, got 'false'" in (
        capsys.readouterr().err)
    base = dict(num_layers=2, hidden_size=64, num_heads=4, vocab_size=100, max_seq_len=64)
    with pytest.raises(ConfigError, match="ModelSpec.dropout must be True or False"):
        mp.ModelSpec(name="x", dropout=0.1, **base)
    with pytest.raises(ConfigError, match="ModelSpec.name must be a non-empty string"):
        mp.ModelSpec(name=5, **base)


def test_fix_reads_switches_strictly_and_sets_compile(capsys):
    plan = ["plan", "--model", "gpt-1.7b", "--cluster", "dgx-h100", "--nodes", "1",
            "--global-batch", "64", "--seq-len", "2048", "--top-k", "1", "--quiet"]
    assert main(plan + ["--fix", "sequence_parallel=maybe"]) == 2
    assert "sequence_parallel needs true or false" in capsys.readouterr().err
    from meshplan.commands.plan import _fixed
    assert _fixed(["compile=true", "sequence_parallel=0"]) == {
        "compile": True, "sequence_parallel": False}


def test_launch_options_that_would_do_nothing_or_collide(tmp_path, capsys):
    plan = ["plan", "--model", "gpt-1.7b", "--cluster", "dgx-h100", "--nodes", "1",
            "--global-batch", "64", "--seq-len", "2048", "--top-k", "1", "--quiet"]
    assert main(plan + ["--launcher", "slurm"]) == 2
    assert "only with --launch-dir" in capsys.readouterr().err
    d = tmp_path / "d"
    assert main(plan + ["-o", str(d / "plan.json"), "--launch-dir", str(d)]) == 2
    assert "is the plan file --launch-dir writes" in capsys.readouterr().err
    assert not d.exists()


def test_preset_names_and_stage_layers_of_the_wrong_type():
    for call in (lambda: mp.ModelSpec.preset(None), lambda: mp.Cluster.preset(7)):
        with pytest.raises(UnknownPresetError, match="named by a string"):
            call()
    for bad in (24, "12,12"):
        with pytest.raises(ConfigError, match="stage_layers must be a list of layer counts"):
            mp.Layout(pp=2, stage_layers=bad)


def test_validate_layout_list_entries_must_be_objects(tmp_path):
    from meshplan.calibrate.validate_layouts import layouts_from_json
    f = tmp_path / "l.json"
    f.write_text("[{\"dp\": 2}, 5]")
    with pytest.raises(ConfigError, match="entry 1 is 5, not a layout object"):
        layouts_from_json(f)


def test_validate_refuses_a_directory_holding_files(tmp_path, capsys):
    out = tmp_path / "v"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    argv = ["validate", "--model", "gpt-1.7b", "--cluster", "dgx-h100", "--nodes", "1",
            "--global-batch", "16", "--seq-len", "2048", "--out", str(out)]
    assert main(argv) == 2
    assert "already holds files" in capsys.readouterr().err
    assert (out / "notes.txt").read_text() == "mine" and len(list(out.iterdir())) == 1


def test_run_refuses_a_directory_as_results_and_a_bad_token_file(tmp_path):
    pytest.importorskip("torch")
    from meshplan.errors import ExecutorError
    from meshplan.executor.launch import run_local
    from meshplan.executor.planfiles import write_plan_for_layout
    tiny = mp.ModelSpec(name="tiny", num_layers=2, hidden_size=32, num_heads=4, vocab_size=64,
                        max_seq_len=16)
    plan = write_plan_for_layout(tmp_path / "plan.json", tiny,
                                 mp.Job(global_batch=4, seq_len=16, precision="fp32"),
                                 mp.Layout(dp=2), predict=False)
    (tmp_path / "d").mkdir()
    with pytest.raises(ExecutorError, match="is a directory.*results.json"):
        run_local(plan, out=tmp_path / "d", device="cpu", force=True)
    empty, odd = tmp_path / "empty.bin", tmp_path / "odd.bin"
    empty.write_bytes(b"")
    odd.write_bytes(b"\0" * 3)
    for data, msg in ((empty, "0 bytes"), (odd, "3 bytes"), (tmp_path / "none.bin", "no such")):
        with pytest.raises(ExecutorError, match=msg):
            run_local(plan, out=tmp_path / "r.json", device="cpu",
                      extra_args=["--data", str(data)])
    assert not (tmp_path / "r.json").exists()


def test_a_fixed_value_no_layout_takes_lists_the_values_that_would_do(capsys):
    plan = ["plan", "--model", "gpt-1.7b", "--cluster", "dgx-h100", "--nodes", "2",
            "--global-batch", "64", "--seq-len", "2048", "--quiet"]
    assert main(plan + ["--fix", "tp=5"]) == 2
    err = capsys.readouterr().err
    assert "{'tp': 5} rule out every layout" in err and "tp: 1, 2, 4, 8" in err
    assert main(plan + ["--fix", "dp=32", "--fix", "pp=3"]) == 2
    assert "dp: 1, 2, 4, 8, 16" in capsys.readouterr().err


def test_recompute_modules_the_model_or_layout_does_not_use(capsys):
    est = ["estimate", "--model", "gpt-1.7b", "--cluster", "dgx-h100", "--global-batch", "64",
           "--seq-len", "2048", "--dp", "8", "--micro-batch", "1"]
    assert main(est + ["--recompute", "selective", "--recompute-modules", "moe_act"]) == 2
    assert "names 'moe_act', but 'gpt-1.7b' has no MoE layers" in capsys.readouterr().err
    assert main(est + ["--recompute", "full", "--recompute-modules", "layernorm"]) == 0
    assert "applies to --recompute selective only" in capsys.readouterr().err


def test_interleaving_without_chunks_is_named(capsys):
    est = ["estimate", "--model", "gpt-1.7b", "--cluster", "dgx-h100", "--global-batch", "64",
           "--seq-len", "2048", "--dp", "4", "--pp", "2", "--micro-batch", "1"]
    assert main(est + ["--schedule", "interleaved-1f1b"]) == 0
    assert "with --vpp 1 is plain 1F1B" in capsys.readouterr().err
    assert main(est + ["--schedule", "interleaved-1f1b", "--vpp", "2"]) == 0
    assert "plain 1F1B" not in capsys.readouterr().err


def test_a_what_if_sequence_no_layout_can_run_fails_before_any_planning(tmp_path, monkeypatch):
    import meshplan.report.build as build

    def no_planning(*a, **k):
        raise AssertionError("planned before the what-if values were checked")
    monkeypatch.setattr(build, "plan_outcome", no_planning)
    with pytest.raises(ConfigError, match="seq_len = 999999 exceeds the learned position"):
        mp.report(mp.ModelSpec.preset("gpt-1.7b"), mp.Cluster.preset("dgx-h100"), gpus=[8],
                  global_batch=64, seq_len=2048, what_if_seq_len=[999999], progress=False,
                  out_dir=tmp_path / "r")
    assert not (tmp_path / "r").exists()
