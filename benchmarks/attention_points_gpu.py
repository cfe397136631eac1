"""Causal attention efficiency at 2k-64k tokens on one GPU (issue 39: the attention curve
beyond the 2k-token points a calibration used to time).

    python benchmarks/attention_points_gpu.py --out $OUT/attention_points.json   # 1 GPU, ~15 s

Each point is `meshplan calibrate`'s own attention benchmark (`bench_compute.bench_attention`:
causal SDPA forward + backward, the kernel SDPA picks) and its efficiency formula
(`calibrate/profile.attention_efficiency`, against the dense bf16 peak given).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--peak-tflops", type=float, default=989.0)
    args = p.parse_args(argv)
    import torch

    from meshplan.calibrate.bench_compute import bench_attention
    from meshplan.calibrate.profile import attention_efficiency, attention_executed_flops
    from meshplan.calibrate.shapes import AttentionShape
    rows = []
    for seq in (2048, 4096, 8192, 16384, 32768, 65536):
        for heads in (16, 8, 4):
            r = bench_attention(AttentionShape(batch=1, seq=seq, heads=heads, head_dim=128),
                                torch.device("cuda"))
            r["flops_forward"] = attention_executed_flops(1, seq, heads, 128)
            r["efficiency"] = attention_efficiency(1, seq, heads, 128, r["seconds"],
                                                   args.peak_tflops * 1e12)
            rows.append(r)
            print(json.dumps(r), flush=True)
    doc = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "cudnn": torch.backends.cudnn.version(), "peak_tflops": args.peak_tflops,
           "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
