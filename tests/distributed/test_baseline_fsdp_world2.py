"""benchmarks/baseline_ddp.py --fsdp trains the model the DDP baseline trains: the same losses
step by step (2 gloo ranks, tiny fp32 model, two micro-batches a step, every block
recomputed). Each configuration runs once for the module: the DDP run serves both
tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.distributed, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


def _run(tmp_path: Path, name: str, *extra: str) -> dict:
    out = tmp_path / f"{name}.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                    "--nproc-per-node=2", str(ROOT / "benchmarks" / "baseline_ddp.py"),
                    "--tiny", "--micro-batch", "2", "--steps", "3", "--warmup", "1",
                    "--out", str(out), *extra],
                   check=True, env=env, cwd=tmp_path, capture_output=True, timeout=300)
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    """``baseline(name, *options)``: the baseline's results, each configuration run once
    for the module (a torchrun start is most of a run on CPU); four steps after one warm-up
    step each, so the DDP run serves both tests."""
    pytest.importorskip("torch")
    tmp = tmp_path_factory.mktemp("baseline")
    done: dict[tuple, dict] = {}

    def run(name: str, *extra: str) -> dict:
        if (name, extra) not in done:
            done[(name, extra)] = _run(tmp, name, *extra)
        return done[(name, extra)]
    return run


def test_fsdp2_baseline_matches_the_ddp_baseline(baseline):
    ddp = baseline("ddp")
    fsdp = baseline("fsdp_full", "--fsdp", "--recompute", "full")
    assert fsdp["name"] == "baseline-fsdp2" and fsdp["fsdp"] and fsdp["num_microbatches"] == 2
    assert len(fsdp["loss_per_step"]) == len(ddp["loss_per_step"]) == 4
    assert fsdp["loss_per_step"] == pytest.approx(ddp["loss_per_step"], rel=1e-5)
    # the optimizer moved the weights: the third loss is not the first
    assert abs(fsdp["loss_per_step"][2] - fsdp["loss_per_step"][0]) > 1e-3


def test_ddp_recompute_full_and_bucket_accumulation_train_the_same(baseline):
    """DDP with every block checkpointed trains as DDP without, and both as FSDP2: four
    steps, so the last loss follows a step whose two micro-batches were accumulated in
    DDP's bucket views under no_sync (the first two steps reduce every micro-batch)."""
    ddp = baseline("ddp")
    full = baseline("ddp_full", "--recompute", "full")
    fsdp = baseline("fsdp", "--fsdp")
    assert full["name"] == "baseline-ddp" and full["recompute"] == "full"
    assert full["grads_accumulate_in_buckets"] and ddp["grads_accumulate_in_buckets"]
    assert not fsdp["grads_accumulate_in_buckets"]
    assert len(full["loss_per_step"]) == len(ddp["loss_per_step"]) == 4
    assert full["loss_per_step"] == pytest.approx(ddp["loss_per_step"], rel=1e-5)
    assert fsdp["loss_per_step"] == pytest.approx(ddp["loss_per_step"], rel=1e-5)
    assert abs(ddp["loss_per_step"][3] - ddp["loss_per_step"][2]) > 1e-4
