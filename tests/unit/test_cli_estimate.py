"""`meshplan estimate` and `meshplan profiles` as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys

from meshplan.cli import main


def test_estimate_prints_memory_and_time_breakdown(capsys):
    rc = main(["estimate", "--model", "gpt3-175b", "--cluster", "dgx-a100-80gb", "--nodes", "128",
               "--dp", "8", "--pp", "16", "--tp", "8", "--micro-batch", "1",
               "--global-batch", "1536", "--seq-len", "2048", "--schedule", "interleaved-1f1b",
               "--vpp", "2", "--recompute", "full"])
    out = capsys.readouterr().out
    assert rc == 0
    for text in ("step time", "memory per GPU by pipeline stage", "pipeline bubble",
                 "TP/SP communication", "fits", "on network"):
        assert text in out, text


def test_estimate_json(capsys):
    rc = main(["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--tp", "8",
               "--global-batch", "8", "--seq-len", "8192", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert rc == 0 and data["num_gpus"] == 8 and data["fits"] is True


def test_estimate_bad_layout_is_a_clear_error(capsys):
    rc = main(["estimate", "--model", "gpt3-175b", "--cluster", "dgx-a100-80gb", "--tp", "7",
               "--global-batch", "8", "--seq-len", "2048"])
    err = capsys.readouterr().err
    assert rc == 2 and "tp = 7 must divide the attention heads (96)" in err
    assert "Traceback" not in err


def test_unknown_model_suggests(capsys):
    rc = main(["estimate", "--model", "gpt3-175", "--cluster", "dgx-h100", "--global-batch", "8",
               "--seq-len", "2048"])
    assert rc == 2 and "gpt3-175b" in capsys.readouterr().err


def test_profiles_lists_presets(capsys):
    assert main(["profiles"]) == 0
    out = capsys.readouterr().out
    for name in ("llama3-405b", "gpt-1t", "H200-SXM-141GB", "dgx2h-v100", "B200"):
        assert name in out


def test_console_script_runs_without_torch_import():
    code = ("import sys, meshplan.cli as c; c.main(['profiles', 'gpus']); "
            "import meshplan; meshplan.estimate; assert 'torch' not in sys.modules; "
            "assert 'ortools' not in sys.modules")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_cuda_graphs_flag_takes_megatrons_moe_host_work_off_the_step(capsys):
    """An eager micro-batch-1 Mixtral layer at 1,024 tokens is host-bound under runtime
    megatron (docs/costmodel.md, "Megatron's host work per MoE layer"); --cuda-graphs prices
    the GPU's work alone."""
    args = ["estimate", "--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--nodes", "2",
            "--dp", "16", "--ep", "8", "--global-batch", "32", "--seq-len", "1024", "--json"]
    steps = []
    for extra in ([], ["--cuda-graphs"]):
        assert main(args + extra) == 0
        steps.append(json.loads(capsys.readouterr().out)["step_time_s"])
    assert steps[1] < steps[0]


def test_estimate_lists_the_corrections_that_moved_it(capsys):
    """A host-bound eager MoE layout under runtime megatron: the printout names the
    correction with its share of the step and what to do about it."""
    rc = main(["estimate", "--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--nodes", "2",
               "--dp", "16", "--ep", "8", "--global-batch", "32", "--seq-len", "1024"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "named corrections that moved this estimate" in out
    line = next(ln for ln in out.splitlines() if ln.startswith("megatron_moe_host"))
    assert float(line.split()[1]) > 0
    assert "note: Megatron's host work per MoE layer sets" in out and "--cuda-graphs" in out
