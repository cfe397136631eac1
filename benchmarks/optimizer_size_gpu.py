"""The fused AdamW step's rate against its size, on one GPU: the calibration's
``optimizer_gbps`` row at the sizes a user's model has.

Why: every 1-GPU check from moeh1 to moeh26 timed the executor's optimizer phase at
3,820-3,995 GB/s (the cost model's 32 B a parameter over the phase's device time, 0.24-2.99 B
parameters), while the profiles' ``optimizer_gbps``, timed on 33.5 M elements (0.3-0.4 ms),
read 2,410-3,410 GB/s: the optimizer priced 20-55 % slow, 2-13 ms a step. This times the
same row (``calibrate.bench_compute.bench_optimizer``) from 2^24 to 2^29 elements, three
times each, so the calibration can time it where the rate no longer moves with size.

    python benchmarks/optimizer_size_gpu.py --out $OUT               # 1 GPU, ~1 minute
    python benchmarks/optimizer_size_gpu.py --out DIR --device cpu   # wiring
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    import torch
    from meshplan.calibrate.bench_compute import bench_optimizer
    device = torch.device(args.device)
    exps = range(24, 30) if device.type == "cuda" else range(14, 18)
    rows = []
    for e in exps:
        for rep in range(args.repeats):
            r = bench_optimizer(1 << e, device)
            r["repeat"] = rep
            r["gbps"] = r["model_bytes"] / r["seconds"] / 1e9
            rows.append(r)
            print(f"2^{e} elements, repeat {rep}: {r['seconds'] * 1e3:.3f} ms, "
                  f"{r['gbps']:.0f} GB/s", flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"device": (torch.cuda.get_device_name(device) if device.type == "cuda"
                       else "cpu"),
            "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"), "rows": rows}
    (out / "optimizer_size.json").write_text(json.dumps(meta, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
