"""Diagnostic (issue 5, round 3): which CPU-dispatch measurement matches a training step?

The round-3 held-out run over-predicted CPU-bound GPT layouts by 10-48% while Llama ones
were within 3%: the calibrated CPU dispatch per GPT layer looked higher than what the
step itself needs. For a few layer settings this times the CPU's dispatch of the
executor's own blocks five ways (per layer, forward + backward, median over ranks):

  queued_L2   the calibration's method: 2 blocks queued behind a spin kernel
  sync_L2     2 blocks, GPU idle at the start, no spin (the GPU runs alongside)
  queued_L6 / sync_L6   the same with 6 blocks
  stream_L6   6 blocks, 4 iterations back to back with no synchronization (as in a step)

    torchrun --standalone --nproc-per-node 4 benchmarks/cpu_dispatch_diag.py --out DIR
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    import torch.distributed as dist

    from meshplan.calibrate import bench_layers as bl
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from layer_insitu import start
    from validate_device import GPT_05B, LLAMA_16B

    args, device, world, _, groups = start()
    queue = bl._Queue(device, lambda v: bl._reduce(v, range(len(v)), device, world))
    configs = [(GPT_05B, 1, False, "none", 1), (GPT_05B, 4, True, "none", 2),
               (GPT_05B, 1, False, "full", 1), (GPT_05B, 2, True, "selective", 2),
               (LLAMA_16B, 1, False, "none", 1), (LLAMA_16B, 4, True, "none", 2)]
    rows = []
    for model, tp, sp, rc, mb in configs:
        cfg = bl.Config(model=model, seq_len=2048, tp=tp, sequence_parallel=sp,
                        micro_batch=mb, recompute=rc)
        row = {"config": cfg.label()}
        for n in (2, 6):
            m, _ = bl._build(cfg, n, device, groups)
            vals = bl._run_layer(cfg, m, n, device, iters=4, barrier=dist.barrier, queue=queue)
            row[f"queued_L{n}_gpu_ms"] = (vals[0] + vals[1]) * 1e3
            row[f"queued_L{n}_cpu_ms"] = (vals[6] + vals[7]) * 1e3
            row.update(_plain(m, cfg, n, device, dist))
            del m
            bl._free(device)
        out = {k: (v if isinstance(v, str) else bl._reduce([v], [], device, world)[0])
               for k, v in row.items()}
        if dist.get_rank() == 0:
            print(json.dumps(out), flush=True)
        rows.append(out)
    if dist.get_rank() == 0:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "cpu_dispatch_diag.json").write_text(json.dumps(rows, indent=1))
    dist.barrier()
    dist.destroy_process_group()
    return 0


def _plain(m, cfg, n, device, dist) -> dict:
    import torch

    from layer_insitu import warm_layer
    out = {}
    with torch.autocast("cuda", dtype=torch.bfloat16):
        x, g = warm_layer(m, cfg, device)
        cpu = []
        for _ in range(5):
            dist.barrier()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            m(x).backward(g)
            cpu.append(time.perf_counter() - t0)
            torch.cuda.synchronize()
        out[f"sync_L{n}_cpu_ms"] = statistics.median(cpu) / n * 1e3
        if n == 6:
            dist.barrier()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(4):
                m(x).backward(g)
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            out["stream_L6_cpu_ms"] = (t1 - t0) / 4 / n * 1e3
            out["stream_L6_wall_ms"] = (t2 - t0) / 4 / n * 1e3
    return out


if __name__ == "__main__":
    sys.exit(main())
