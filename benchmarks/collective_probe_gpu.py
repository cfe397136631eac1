"""Check the collective latency model on the lent GPUs: the probe's spread, and its fit
against small collectives it was not fitted on.

    torchrun --standalone --nproc-per-node 4 benchmarks/collective_probe_gpu.py --out DIR
    # on CPU ranks (gloo) as a smoke test: add --device cpu

Every rank runs :func:`meshplan.calibrate.bench_comm.bench_collectives` ``--repeats`` times
(default 3): the latency probe (256-byte all-reduce on 2 ranks and the whole node, 50 calls
each) and all-reduce / reduce-scatter / all-gather of 64 KiB-64 MiB on every power-of-two
group of the node. Rank 0 writes ``DIR/collective_probe.json`` (every repeat's rows) and
prints, per repeat:

- the probe's split (α_base, α_step; ``collective_latency.split_latency``) and its spread
  over the repeats;
- **held out**: every row of the *other* repeats at ≤ 1 MiB (latency-bound) predicted with
  this repeat's probe split and the datasheet NVLink curve of the GPU (nothing read from
  rows), mean / max |error|, by group size — beside the same rows predicted the way older
  profiles were priced (2(n−1) × half the 2-rank probe).

No profile is written; nothing in the tree changes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from meshplan.hardware_profiles import builtin_gpu  # noqa: E402
from meshplan.hardware_profiles import collective_latency as cl  # noqa: E402

SIZES = [1 << k for k in range(16, 27, 2)]          # 64 KiB .. 64 MiB
HELD_OUT_MAX_BYTES = 1 << 20
DEVICE_TO_GPU = (("H200", "H200-SXM-141GB"), ("H100", "H100-SXM5-80GB"))


def predict_s(op: str, n: int, nbytes: float, base_s: float, step_s: float, gbps: float,
              curve) -> float:
    return (cl.call_latency_s(op, n, base_s, step_s)
            + cl.bus_bytes(op, n, nbytes) / (gbps * 1e9 * curve(nbytes)))


def report(repeats: list[dict], gpu_name: str) -> list[str]:
    gpu = builtin_gpu(gpu_name)
    out = [f"datasheet curve and link: {gpu_name} ({gpu.nvlink_gbps} GB/s)"]
    splits = []
    for i, rows in enumerate(repeats):
        split = cl.split_latency((r["group_size"], r["seconds"]) for r in rows["latency"])
        probe2 = statistics.median(r["seconds"] for r in rows["latency"] if r["group_size"] == 2)
        splits.append(split)
        base_s, step_s = split if split else (probe2, 0.0)
        others = [r for j, o in enumerate(repeats) if j != i for r in o["collectives"]
                  if r["op"] in cl.CURVE_OPS and r["nbytes"] <= HELD_OUT_MAX_BYTES]
        by_n: dict[int, list[tuple[float, float]]] = {}
        for r in others:
            t = r["seconds"]
            new = predict_s(r["op"], r["group_size"], r["nbytes"], base_s, step_s,
                            gpu.nvlink_gbps, gpu.nvlink_efficiency)
            old = (cl.ring_steps(r["op"], r["group_size"])[0] * probe2 / 2
                   + cl.bus_bytes(r["op"], r["group_size"], r["nbytes"])
                   / (gpu.nvlink_gbps * 1e9 * gpu.nvlink_efficiency(r["nbytes"])))
            by_n.setdefault(r["group_size"], []).append((abs(new / t - 1), abs(old / t - 1)))
        probes = {r["group_size"]: round(r["seconds"] * 1e6, 1) for r in rows["latency"]}
        line = (f"repeat {i}: probe µs {probes} -> α_base {base_s * 1e6:.1f} µs, "
                f"α_step {step_s * 1e6:.2f} µs; held-out rows ≤ 1 MiB |error| new / old:")
        for n, errs in sorted(by_n.items()):
            new_e, old_e = [e[0] for e in errs], [e[1] for e in errs]
            line += (f"  n={n}: {100 * statistics.fmean(new_e):.0f}/{100 * max(new_e):.0f} % vs "
                     f"{100 * statistics.fmean(old_e):.0f}/{100 * max(old_e):.0f} %")
        out.append(line)
    got = [s for s in splits if s]
    if len(got) > 1:
        out.append("split over repeats: α_base µs " + ", ".join(f"{b * 1e6:.1f}" for b, _ in got)
                   + "; α_step µs " + ", ".join(f"{s * 1e6:.2f}" for _, s in got))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args(argv)
    import torch
    import torch.distributed as dist

    from meshplan.calibrate import bench_comm
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(f"cuda:{local}" if args.device == "cuda" else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                            device_id=device if device.type == "cuda" else None)
    repeats = [bench_comm.bench_collectives(SIZES, device, iters=args.iters)
               for _ in range(args.repeats)]
    if dist.get_rank() == 0:
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        gpu_name = next((g for frag, g in DEVICE_TO_GPU if frag in name), "H100-SXM5-80GB")
        args.out.mkdir(parents=True, exist_ok=True)
        meta = {"device": name, "world_size": dist.get_world_size(), "torch": torch.__version__,
                "nccl": ".".join(map(str, torch.cuda.nccl.version())) if device.type == "cuda"
                else None, "repeats": repeats}
        (args.out / "collective_probe.json").write_text(json.dumps(meta, indent=1))
        lines = [f"{name}, {dist.get_world_size()} ranks, torch {torch.__version__}"]
        lines += report(repeats, gpu_name)
        (args.out / "collective_probe.txt").write_text("\n".join(lines) + "\n")
        print("\n".join(lines))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
