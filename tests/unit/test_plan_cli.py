"""`meshplan plan`: table and breakdown on stdout, progress on stderr, plan file with -o."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import meshplan as mp
from meshplan.cli import main

ARGS = ["plan", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb", "--nodes", "1",
        "--global-batch", "64", "--seq-len", "2048", "--top-k", "3"]


def test_prints_table_breakdown_and_writes_file(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(ARGS + ["-o", str(out)]) == 0
    cap = capsys.readouterr()
    lines = cap.out.splitlines()
    header = next(ln for ln in lines if "schedule" in ln and "tokens_per_s" in ln)
    for col in ("dp", "pp", "tp", "mb", "recompute", "zero", "step_time_s", "mfu", "peak GiB"):
        assert col in header
    assert "best: " in cap.out
    assert "memory per GPU by pipeline stage" in cap.out
    assert "step time on the busiest pipeline rank" in cap.out
    assert f"plan written to {out}" in cap.out
    # progress goes to stderr, not into the table
    assert "bounding:" in cap.err and "done:" in cap.err
    assert "bounding:" not in cap.out
    p = mp.Plan.from_json(out)
    assert len(p.candidates) == 3
    assert p.best.layout.short() in cap.out


def test_refuses_overwrite_without_force(tmp_path, capsys):
    out = tmp_path / "plan.json"
    out.write_text("keep me")
    assert main(ARGS + ["-o", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "refusing to overwrite" in err and "--force" in err
    assert out.read_text() == "keep me"
    assert main(ARGS + ["-o", str(out), "--force", "--quiet"]) == 0
    assert json.loads(out.read_text())["schema"] == "meshplan.plan"


def test_no_file_without_output(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(ARGS + ["--quiet"]) == 0
    cap = capsys.readouterr()
    assert "no plan file written" in cap.out and cap.err == ""
    assert list(tmp_path.iterdir()) == []


def test_hugging_face_config(tmp_path, capsys):
    cfg = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 256,
           "num_attention_heads": 8, "num_key_value_heads": 2, "intermediate_size": 688,
           "vocab_size": 8000, "max_position_embeddings": 4096, "tie_word_embeddings": False}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    out = tmp_path / "plan.json"
    rc = main(["plan", "--model", str(path), "--cluster", "dgx-h100", "--nodes", "1",
               "--global-batch", "32", "--seq-len", "1024", "--top-k", "2", "-o", str(out),
               "--quiet"])
    assert rc == 0
    p = mp.Plan.from_json(out)
    assert p.model.num_layers == 4 and p.model.num_kv_heads == 2
    assert p.best.layout.num_gpus == 8


@pytest.mark.parametrize("extra,words", [
    (["--gpus", "0-4"], ["--gpus", "'0-4'"]),
    (["--gpus", "16"], ["16 GPUs", "has 8"]),
    (["--fix", "pp"], ["FIELD=VALUE"]),
    (["--fix", "pp=two"], ["pp needs an integer"]),
    (["--fix", "schedule=gpipe", "--schedules", "1f1b"], ["contradictory"]),
    (["--zero-options", "1,x"], ["not a comma list"]),
    (["--memory-headroom", "1.5"], ["memory_headroom", "1.5"]),
])
def test_bad_arguments_are_one_line_errors(extra, words, capsys):
    assert main(ARGS + ["--quiet"] + extra) == 2
    err = capsys.readouterr().err
    assert err.startswith("meshplan plan: error:") and "Traceback" not in err
    for w in words:
        assert w in err


def test_no_feasible_plan_is_reported(capsys):
    rc = main(["plan", "--model", "gpt3-175b", "--cluster", "dgx-a100-80gb", "--nodes", "1",
               "--global-batch", "64", "--seq-len", "2048", "--quiet", "--max-micro-batch",
               "1", "--fix", "pp=8"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "fits in memory" in err and "GiB" in err and "Ways out" in err


def test_entry_point_runs_in_a_fresh_interpreter(tmp_path):
    """`python -m meshplan.cli plan` (what the `meshplan` script runs), as a user would."""
    root = str(Path(mp.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [root, *filter(None, [os.environ.get("PYTHONPATH")])])}
    r = subprocess.run([sys.executable, "-m", "meshplan.cli", *ARGS], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "tokens_per_s" in r.stdout and "done:" in r.stderr
