"""CPU smoke tests: `meshplan calibrate --device cpu --quick` writes a profile that loads and
changes the estimate; `meshplan validate` runs layouts, reports an OOM and carries on."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from meshplan.calibrate.validate import ValidateOptions, run_layouts, write_accuracy
from meshplan.cli import main as cli_main
from meshplan.costmodel import estimate
from meshplan.spec import Job, Layout, ModelSpec
from meshplan.errors import ConfigError
from meshplan.hardware_profiles import Cluster
from meshplan.hardware_profiles.calibrated import apply_profile, load_profile

ROOT = Path(__file__).parents[2]
TINY = ModelSpec(name="tiny-llama", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2,
                 ffn_hidden_size=128, vocab_size=128, max_seq_len=64, activation="swiglu",
                 norm="rmsnorm", position_embedding="rope", tied_embeddings=False, bias=False)


@pytest.fixture(scope="module")
def cpu_profile(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cal") / "cpu.toml"
    assert cli_main(["calibrate", "--device", "cpu", "--quick", "--out", str(out),
                     "--no-progress"]) == 0
    return out


def test_cpu_calibrate_writes_a_valid_profile(cpu_profile):
    p = load_profile(cpu_profile)
    assert p.gpu.name == "cpu" and p.base_gpu is None
    assert p.provenance["device"] == "cpu" and p.provenance["torch"] == torch.__version__
    assert p.provenance["python_gc"] == "off while timing"
    for key in ("gemm_efficiency", "attention_efficiency", "hbm_efficiency",
                "layer_overhead_s", "microbatch_overhead_s"):
        assert key in p.measured
    assert all(0 < y <= 1 for _, y in p.gpu.gemm_efficiency.points)
    assert 0 < p.gpu.hbm_efficiency <= 1
    assert p.gpu.peak_flops("bf16") > 0 and p.gpu.layer_overhead_s > 0
    assert not list(cpu_profile.parent.glob(".*.tmp"))   # no temporary file left behind


def test_cpu_profile_changes_the_estimate_only_with_override(cpu_profile):
    cluster = Cluster.preset("dgx-h100", nodes=1)
    job, lay = Job(global_batch=4, seq_len=64), Layout(dp=2)
    with pytest.raises(Exception, match="override"):
        apply_profile(cluster, cpu_profile)
    cpu = apply_profile(cluster, cpu_profile, override=True)
    before, after = estimate(TINY, cluster, job, lay), estimate(TINY, cpu, job, lay)
    # a CPU at ~0.1 TFLOP/s is far slower than an H100: the estimate must move a lot
    assert after.step_time_s > 10 * before.step_time_s


STAND_IN = '''
"""Stand-in executor for the validate plumbing test: reads the plan, writes results."""
import argparse, json, os, sys
p = argparse.ArgumentParser()
for a in ("--plan", "--out", "--steps", "--warmup", "--device", "--timeout-s"):
    p.add_argument(a)
a = p.parse_args()
plan = json.load(open(a.plan))
if plan["layout"]["dp"] == 2 and os.environ.get("RANK") == "0":
    sys.exit("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
if os.environ.get("RANK") == "0":
    pred = plan["prediction"]
    mem = [st["total_bytes"] * 1.02 for st in pred["memory"]]
    json.dump({"measured": {"step_time_s": pred["step_time_s"] * 1.05,
                            "memory_per_rank": [{"rank": 0, "allocated_bytes": mem[0]}]}},
              open(a.out, "w"))
'''


def test_validate_reports_oom_and_continues(tmp_path):
    (tmp_path / "standin_executor.py").write_text(STAND_IN)
    cluster = Cluster.preset("dgx-h100", nodes=1)
    job = Job(global_batch=4, seq_len=64)
    layouts = [Layout(dp=1), Layout(dp=2), Layout(dp=1, micro_batch=2)]
    import os
    env_path = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{ROOT}{os.pathsep}{env_path}"
    try:
        opts = ValidateOptions(out_dir=tmp_path / "out", nproc=2, device="cpu", steps=2,
                               warmup=1, timeout_s=60, runner_module="standin_executor",
                               log=lambda m: None)
        records = run_layouts(TINY, cluster, job, layouts, opts)
    finally:
        os.environ["PYTHONPATH"] = env_path
    assert [r["status"] for r in records] == ["ok", "oom", "ok"]
    # a hung collective fails inside the run, before the layout's 60 s timeout kills it
    assert "--timeout-s 48 " in records[0]["command"] + " "
    assert records[0]["step_time_error_pct"] == pytest.approx(100 * (1 / 1.05 - 1))
    assert records[0]["memory_error_pct_per_rank"][0] == pytest.approx(100 * (1 / 1.02 - 1))
    paths = write_accuracy(tmp_path / "out", records, {"device": "cpu"})
    doc = json.loads(paths["json"].read_text())
    assert doc["summary"]["ok"] == 2 and doc["summary"]["not_ok"]["oom"] == 1
    assert "oom" in paths["md"].read_text() and paths["png"].stat().st_size > 1000


def test_validate_repeats_run_in_rounds_and_measure_by_the_median(tmp_path):
    """--repeats 2: every layout once, then again (run2/NAME), the OOM one not again; each
    record keeps both runs and is scored on their median."""
    (tmp_path / "standin_executor.py").write_text(STAND_IN)
    cluster = Cluster.preset("dgx-h100", nodes=1)
    job = Job(global_batch=4, seq_len=64)
    layouts = [Layout(dp=1), Layout(dp=2)]
    import os
    env_path = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{ROOT}{os.pathsep}{env_path}"
    lines: list[str] = []
    try:
        opts = ValidateOptions(out_dir=tmp_path / "out", nproc=2, device="cpu", steps=2,
                               warmup=1, timeout_s=60, runner_module="standin_executor",
                               log=lines.append, repeats=2)
        records = run_layouts([TINY, TINY], cluster, job, layouts, opts, names=["a", "b"])
    finally:
        os.environ["PYTHONPATH"] = env_path
    assert [r["status"] for r in records] == ["ok", "oom"]
    heads = [line.split(":")[0] for line in lines]
    assert [(h.split()[1], h.split()[-1]) for h in heads] == [("a", "1/2"), ("b", "1/2"),
                                                              ("a", "2/2")]
    assert (tmp_path / "out" / "run2" / "a" / "results.json").exists()
    assert not (tmp_path / "out" / "run2" / "b").exists()
    a = records[0]
    assert [r["status"] for r in a["runs"]] == ["ok", "ok"]
    assert a["run_to_run_spread_pct"] == pytest.approx(0.0)
    assert a["step_time_error_pct"] == pytest.approx(100 * (1 / 1.05 - 1))
    assert "runs" not in records[1]
    with pytest.raises(ConfigError, match="repeats"):
        run_layouts(TINY, cluster, job, layouts, ValidateOptions(
            out_dir=tmp_path / "x", nproc=2, device="cpu", repeats=0, log=lambda m: None))
    # one model per layout (validate_device.py's sets mix two) must match the layouts
    with pytest.raises(ConfigError, match="1 models for 2 layouts"):
        run_layouts([TINY], cluster, job, layouts, ValidateOptions(
            out_dir=tmp_path / "y", nproc=2, device="cpu", log=lambda m: None))


@pytest.mark.skipif(importlib.util.find_spec("meshplan.executor.run") is None,
                    reason="meshplan.executor.run (the executor's runner) is not in this checkout "
                           "yet; the validate plumbing is covered by the stand-in test above")
@pytest.mark.distributed
@pytest.mark.slow
def test_validate_cpu_end_to_end_with_the_executor(tmp_path, cpu_profile):
    cfg = tmp_path / "tiny.json"
    cfg.write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
                               "num_attention_heads": 4, "num_key_value_heads": 2,
                               "intermediate_size": 128, "vocab_size": 128,
                               "max_position_embeddings": 64}))
    layouts = tmp_path / "layouts.json"
    layouts.write_text(json.dumps([{"name": "dp2", "dp": 2}, {"name": "tp2", "tp": 2}]))
    rc = cli_main(["validate", "--model", str(cfg), "--cluster", "dgx-h100", "--nodes", "1",
                   "--profile", str(cpu_profile), "--profile-override", "--device", "cpu",
                   "--nproc", "2", "--global-batch", "4", "--seq-len", "32", "--steps", "3",
                   "--warmup", "1", "--timeout", "90", "--layout-list", str(layouts),
                   "--out", str(tmp_path / "val")])
    doc = json.loads((tmp_path / "val" / "accuracy.json").read_text())
    statuses = {r["name"]: (r["status"], r.get("error")) for r in doc["records"]}
    assert rc == 0, statuses
    assert all(s == "ok" for s, _ in statuses.values()), statuses
    assert (tmp_path / "val" / "accuracy.md").exists() and (tmp_path / "val" / "accuracy.png").exists()
