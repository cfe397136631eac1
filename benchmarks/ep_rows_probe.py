"""Time chosen MoE layer rows with the calibration's own code, on the GPUs of one call: the
rows at expert parallelism (plain, eager and compiled, with the 4-block synchronized
diagnostic) and under FSDP2 at that ep — what a check that ran before those rows existed
(moeh9) can be re-predicted with, post hoc.

    torchrun --nproc-per-node 2 benchmarks/ep_rows_probe.py \\
        --model benchmarks/sets/moeh9/m01.json --seq-len 1024 --micro-batch 8 \\
        --recompute selective --out $OUT/probe.json

Writes the rows (profile ``[[layers]]`` fields) and the calibration's progress lines as
JSON; rank 0 prints the lines. Not a calibration: no GEMM curves, no ends, one round.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="ModelSpec JSON of an MoE model")
    p.add_argument("--seq-len", type=int, required=True)
    p.add_argument("--micro-batch", type=int, required=True)
    p.add_argument("--recompute", default="selective",
                   help="recompute modes, comma-separated, timed in the calibration's order "
                        "(none, selective, full)")
    p.add_argument("--compiled-only", action="store_true",
                   help="only the compiled plain ep rows (one module, its modes in turn, as "
                        "the calibration times them)")
    p.add_argument("--out", required=True, help="JSON file to write (rank 0)")
    args = p.parse_args(argv)
    modes = tuple(m for m in ("none", "selective", "full") if m in args.recompute.split(","))
    if not modes or set(args.recompute.split(",")) - set(modes):
        p.error(f"--recompute {args.recompute!r}: a comma-separated list of none, selective, "
                f"full")

    import torch
    import torch.distributed as dist

    from meshplan.calibrate import bench_layers
    from meshplan.spec import ModelSpec
    model = ModelSpec.from_dict(json.loads(Path(args.model).read_text()))
    if not model.is_moe:
        raise SystemExit(f"--model {args.model}: not a mixture-of-experts model")
    if not torch.cuda.is_available():
        raise SystemExit("ep_rows_probe.py times GPU rows: torch sees no CUDA device")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world < 2:
        raise SystemExit("launch with torchrun across at least 2 GPUs: the rows are at ep > 1")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(f"cuda:{local}")
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    rank = dist.get_rank()
    lines: list[str] = []

    class Log:
        def step(self, message: str) -> None:
            lines.append(message)
            if rank == 0:
                print(message, flush=True)
        note = step

    def wanted(c) -> bool:
        return (not c.part and c.recompute in modes and c.ep > 1
                and (c.zero == 0 or not c.compile)
                and (not args.compiled_only or (c.compile and c.zero == 0)))
    t = bench_layers.bench_layer_rows(
        [model], args.seq_len, device, world, rank, quick=False, progress=Log(), max_tp=2,
        micro_batches=(args.micro_batch,), rounds=1, compile_rows=modes, only=wanted)
    if rank == 0:
        Path(args.out).write_text(json.dumps({"model": model.name, "world": world,
                                              "layers": t.layers, "lines": lines}, indent=1))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
