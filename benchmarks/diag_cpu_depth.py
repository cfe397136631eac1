"""Diagnostic (issue 5, round 5): is a layer row's CPU dispatch time per layer independent of
the stack it was timed on? Times the queued forward/backward CPU dispatch of the executor's
own block on 2, 4 and 6 blocks and fits total = fixed + per_layer * blocks per configuration.

    torchrun --nproc-per-node=2 benchmarks/diag_cpu_depth.py --out $OUT/cpu_depth.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    import torch
    import torch.distributed as dist

    from meshplan.calibrate import bench_layers as bl
    from validate_device import GPT_05B, LLAMA_16B, TINY_GPT, TINY_LLAMA
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--blocks", default="2,4,6")
    p.add_argument("--cpu", action="store_true", help="check the script: tiny models, gloo, "
                   "synchronized (no CPU fields)")
    args = p.parse_args(argv)
    cuda = not args.cpu
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
        queue = bl._Queue(device, lambda v: bl._reduce(v, range(len(v)), device, world))
    else:
        device, queue = torch.device("cpu"), None
    gpt, llama = (GPT_05B, LLAMA_16B) if cuda else (TINY_GPT, TINY_LLAMA)
    seq = 2048 if cuda else 32
    groups = bl._Groups(world, rank, device.type)
    cfgs = [bl.Config(model=gpt, seq_len=seq, tp=1, sequence_parallel=False,
                      micro_batch=4, recompute="none"),
            bl.Config(model=gpt, seq_len=seq, tp=2, sequence_parallel=False,
                      micro_batch=4, recompute="selective"),
            bl.Config(model=gpt, seq_len=seq, tp=1, sequence_parallel=False,
                      micro_batch=4, recompute="selective", zero=3, dp=2),
            bl.Config(model=llama, seq_len=seq, tp=1, sequence_parallel=False,
                      micro_batch=2, recompute="full"),
            bl.Config(model=llama, seq_len=seq, tp=1, sequence_parallel=False,
                      micro_batch=4, recompute="none")]
    rows = []
    for cfg in cfgs:
        for n in (int(b) for b in args.blocks.split(",")):
            m, _ = bl._build(cfg, n, device, groups)
            _, _, reset, forward, backward = bl._layer_step(cfg, m, device)
            with bl._layer_amp(cfg, device):
                samples, _ = bl._measure(forward, backward, reset, device=device,
                                         warmup=bl.WARMUP, iters=bl.ITERS,
                                         barrier=dist.barrier, queue=queue)
            if not cuda:   # synchronized: report the wall times in the CPU fields
                samples = [bl.Sample(s.forward_s, s.backward_s, forward_cpu_s=s.forward_s,
                                     backward_cpu_s=s.backward_s) for s in samples]
            vals = [*bl.cpu_values(samples), statistics.median(s.forward_s for s in samples),
                    statistics.median(s.backward_s for s in samples), bl._bad(samples)]
            vals = bl._reduce(vals, [4], device, world)
            row = {"config": cfg.label(), "blocks": n, "forward_cpu_s": vals[0],
                   "backward_cpu_s": vals[1], "forward_gpu_s": vals[2],
                   "backward_gpu_s": vals[3], "not_queued": vals[4]}
            rows.append(row)
            if rank == 0:
                print(json.dumps(row), flush=True)
            del m, reset, forward, backward
            bl._free(device)
    if rank == 0:
        fits = {}
        for label in dict.fromkeys(r["config"] for r in rows):
            rs = [r for r in rows if r["config"] == label]
            xs = [r["blocks"] for r in rs]
            fit = {}
            for k in ("forward_cpu_s", "backward_cpu_s"):
                ys = [r[k] for r in rs]
                mx, my = statistics.fmean(xs), statistics.fmean(ys)
                slope = (sum((a - mx) * (b - my) for a, b in zip(xs, ys))
                         / sum((a - mx) ** 2 for a in xs))
                fit[k] = {"per_layer_s": slope, "fixed_s": my - slope * mx,
                          "per_layer_on_2_s": rs[0][k] / rs[0]["blocks"]}
            fits[label] = fit
            print(label, json.dumps(fit), flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"rows": rows, "fits": fits,
                                        "torch": torch.__version__,
                                        "gpu": torch.cuda.get_device_name(0) if cuda
                                        else "cpu"}, indent=1))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
