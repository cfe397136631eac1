"""Compiled blocks under DDP (docs/benchmarks/fp8_checks.md, "f01"): on CPU the mechanism — a
block compiled through Dynamo's DDPOptimizer is cut per parameter and keeps more for its
backward, and the probe's split arm (benchmarks/fp8_probe.py, the executor's own DDP + ZeRO-1)
is split where its whole arm is not — and the executor's DDP compiling blocks whole since."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from meshplan.spec import ModelSpec

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_a_block_compiled_per_parameter_keeps_more_in_fp8(load_benchmark):
    """The mechanism's memory: the same Llama block compiled whole and through DDPOptimizer
    cut at every parameter (CPU, torch._scaled_mm): 6 pieces, and the fp8 block keeps its
    linears' inputs that the whole graph recomputes — 27.1 → 36.1 B per token·h here
    (bf16 69.1 → 71.1), measured with this script on 2026-11-28."""
    import torch
    fsb = load_benchmark("fp8_saved_bytes")
    spec = ModelSpec(name="block", num_layers=1, hidden_size=256, num_heads=4,
                     num_kv_heads=2, ffn_hidden_size=1024, vocab_size=128, max_seq_len=256,
                     activation="swiglu", norm="rmsnorm", position_embedding="rope",
                     tied_embeddings=False, bias=False)
    cpu = torch.device("cpu")
    whole = fsb.saved_bytes(spec, 256, "fp8", True, cpu)
    split = fsb.saved_bytes(spec, 256, "fp8", True, cpu, split=True)
    assert (whole["pieces"], split["pieces"]) == (1, 6)
    assert split["per_token_h"] - whole["per_token_h"] == pytest.approx(9.0, abs=0.05)


@pytest.mark.slow
def test_probe_cpu_split_arm_is_cut_per_parameter_and_whole_arm_is_not(tmp_path):
    cmd = [sys.executable, str(ROOT / "benchmarks/fp8_probe.py"), "--device", "cpu",
           "--out", str(tmp_path), "--arms", "fp8-split,fp8-whole", "--hidden", "64",
           "--warmup", "1", "--steps", "2", "--per-parameter", "--budget", "600"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=900,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stderr[-3000:]
    doc = json.loads((tmp_path / "fp8_probe.json").read_text())
    split, whole = doc["arms"]["fp8-split"], doc["arms"]["fp8-whole"]
    assert (split["pieces_per_block"], whole["pieces_per_block"]) == (6, 1)
    for arm in (split, whole):
        assert arm["micro_batches"] == 4 and len(arm["step_ms_all"]) == 2
        assert arm["step_ms"] > 0 and arm["host_cpu_ms_per_mb"] > 0
        assert arm["profile"]["top_cpu_ops"]
    assert "fp8_split_cost_host_cpu_ms_per_layer_mb" in doc["verdict"]


def test_executor_ddp_compiles_blocks_whole():
    """wrap_data_parallel turns DDPOptimizer off: on 1 x H200 an fp8 step ran 199.6 ms with
    the blocks split per parameter and 126.4 ms whole (bf16 124.9 / 124.2)."""
    code = (
        "import torch, torch.distributed as dist, torch._dynamo\n"
        "from meshplan.executor.data_parallel import wrap_data_parallel\n"
        "from meshplan.executor.mesh import ReplicaGroups\n"
        "dist.init_process_group('gloo', init_method='tcp://127.0.0.1:0', rank=0, "
        "world_size=1)\n"
        "assert torch._dynamo.config.optimize_ddp\n"
        "m = torch.nn.Linear(4, 4)\n"
        "g = ReplicaGroups(dp=2, dp_group=dist.group.WORLD, dp_mesh=None)\n"
        "w = wrap_data_parallel(m, zero=0, groups=g, device=torch.device('cpu'), bf16=False, "
        "pipelined=False)\n"
        "assert type(w).__name__ == 'DistributedDataParallel'\n"
        "assert torch._dynamo.config.optimize_ddp is False\n"
        "dist.destroy_process_group()\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stderr[-3000:]
