"""Diagnostic: why do isolated layer benchmarks (meshplan calibrate's layer tables) run
slower than the same layers inside a training step? (issue 5 notes, 2026-11-26)

For a few configurations, one transformer-layer stack of the executor is timed five ways:
the calibrate measurement with 4 and with 24 layers; 24 layers streamed back to back
(no synchronization between iterations, as in a step); the CPU's dispatch time alone; the
GPU's busy time alone (the stream preloaded with a long GEMM so the CPU is never the limit).

    torchrun --standalone --nproc-per-node 4 benchmarks/layer_insitu.py --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def start():
    """``--out DIR`` and an NCCL process group over the torchrun world, as the layer
    benchmarks expect: returns (args, device, world, rank, bench_layers' process groups)."""
    import torch
    import torch.distributed as dist

    from meshplan.calibrate import bench_layers as bl
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, type=Path)
    args = p.parse_args()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    world, rank = dist.get_world_size(), dist.get_rank()
    return args, device, world, rank, bl._Groups(world, rank, "cuda")


def main() -> int:
    import torch.distributed as dist

    from meshplan.calibrate import bench_layers as bl
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from validate_device import GPT_05B, LLAMA_16B

    args, device, world, rank, groups = start()
    configs = [(LLAMA_16B, 1, False, "none", 1), (LLAMA_16B, 1, False, "none", 4),
               (GPT_05B, 1, False, "none", 2), (LLAMA_16B, 4, True, "full", 2),
               (GPT_05B, 2, True, "none", 4), (LLAMA_16B, 2, True, "selective", 2)]
    results = []
    for model, tp, sp, rc, mb in configs:
        cfg = bl.Config(model=model, seq_len=2048, tp=tp, sequence_parallel=sp, micro_batch=mb,
                        recompute=rc)
        row = {"config": cfg.label()}
        for n in (4, 24):
            m, _ = bl._build(cfg, n, device, groups)
            vals = bl._run_layer(cfg, m, n, device, iters=5, barrier=dist.barrier)
            row[f"bench_L{n}_ms"] = (vals[0] * 1e3, vals[1] * 1e3)
            if n == 24:
                row.update(_modes(m, cfg, n, device, dist))
            del m
            bl._free(device)
        dist.barrier()
        if rank == 0:
            print(json.dumps(row), flush=True)
        results.append(row)
    if rank == 0:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "layer_insitu.json").write_text(json.dumps(results, indent=1))
    dist.barrier()
    dist.destroy_process_group()
    return 0


def warm_layer(m, cfg, device):
    """One untimed forward + backward of ``m`` as ``cfg`` (call under the autocast the
    timing uses); returns its input (mb, s or s/tp, h) and output gradient for the timed
    iterations."""
    import torch

    from meshplan.calibrate import bench_layers as bl
    x = bl._layer_input(cfg, device)
    bl._set_recompute(m, cfg.recompute)
    y = m(x)
    g = torch.randn_like(y)
    y.backward(g)
    return x, g


def _modes(m, cfg, n, device, dist) -> dict:
    import torch
    out = {}
    with torch.autocast("cuda", dtype=torch.bfloat16):
        x, g = warm_layer(m, cfg, device)
        # streamed: 6 iterations back to back, one sync at the end
        dist.barrier()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(6):
            m(x).backward(g)
        torch.cuda.synchronize()
        out["streamed_fwd_bwd_ms"] = (time.perf_counter() - t0) / 6 / n * 1e3
        # CPU dispatch alone
        fw, bw = [], []
        for _ in range(5):
            dist.barrier()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            y = m(x)
            t1 = time.perf_counter()
            y.backward(g)
            t2 = time.perf_counter()
            torch.cuda.synchronize()
            fw.append(t1 - t0)
            bw.append(t2 - t1)
        out["cpu_dispatch_ms"] = (statistics.median(fw) / n * 1e3, statistics.median(bw) / n * 1e3)
        # GPU busy alone: preload so that the CPU has queued everything before the GPU starts
        big = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
        gf, gb = [], []
        for _ in range(5):
            dist.barrier()
            torch.cuda.synchronize()
            for _ in range(int((max(fw) + max(bw)) * 1000 * 1.2) + 4):   # >= 1 ms per GEMM
                big @ big
            e0, e1, e2 = (torch.cuda.Event(enable_timing=True) for _ in range(3))
            e0.record()
            y = m(x)
            e1.record()
            y.backward(g)
            e2.record()
            e2.synchronize()
            gf.append(e0.elapsed_time(e1))
            gb.append(e1.elapsed_time(e2))
        out["gpu_busy_ms"] = (statistics.median(gf) / n, statistics.median(gb) / n)
    return out


if __name__ == "__main__":
    sys.exit(main())
