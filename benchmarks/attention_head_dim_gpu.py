"""Does cuDNN's attention run slower per FLOP at head dim 64 than at 128 on this GPU, by the
ratio the datasheet now takes from the FlashAttention-3 paper's bars? One GPU, ~1 min.

    python benchmarks/attention_head_dim_gpu.py --out $OUT/attention_head_dim.json
    python benchmarks/attention_head_dim_gpu.py --compare RESULTS.json        # no GPU

Times calibrate's own attention step (meshplan.calibrate.bench_compute.bench_attention:
SDPA causal forward + backward on ``(b, h, s, d)`` views of a ``(b, s, 3, h, d)``
projection, calibrate's timer, bf16) in pairs of the same width and FLOPs, heads of 64
against heads of 128: the paper's setup (2048 = 32·64 = 16·128, batch × seq = 16k tokens,
seq 4k-16k) and the cp40 model's (2176 = 34·64 = 17·128, batch 1, seq 8k-64k: the lengths
its all-to-all cores and rings ran). Efficiency as calibrate counts it,
``3.5·E / (peak · t)`` with ``E = 2·b·s²·h·d`` (hardware_profiles/attention_published.py);
``--compare`` prints per pair the measured ratio (head dim 64 over 128) beside the
datasheet's (attention_published.py eq. (5)) and each efficiency beside the datasheet
curve's at that head dim.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# (width, tokens per call or None for batch 1, seqs): heads of 64 and 128 of each width
SETUPS = ((2048, 16384, (4096, 8192, 16384)),
          (2176, None, (8192, 16384, 32768, 65536)))


def shapes():
    from meshplan.calibrate.shapes import AttentionShape
    for width, tokens, seqs in SETUPS:
        for s in seqs:
            b = tokens // s if tokens else 1
            for d in (64, 128):
                yield AttentionShape(batch=b, seq=s, heads=width // d, head_dim=d)


def flops_forward(row: dict) -> float:
    return 2.0 * row["batch"] * row["seq"] ** 2 * row["heads"] * row["head_dim"]


def measure(peak_tflops: float) -> dict:
    import torch

    from meshplan.calibrate.bench_compute import bench_attention
    dev = torch.device("cuda")
    rows = []
    for shape in shapes():
        row = bench_attention(shape, dev)
        row["efficiency"] = 3.5 * flops_forward(row) / (peak_tflops * 1e12 * row["seconds"])
        rows.append(row)
        print(json.dumps(row), flush=True)
    return {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "cudnn": torch.backends.cudnn.version(), "peak_tflops": peak_tflops, "rows": rows}


def compare(doc: dict, gpu_name: str = "H200-SXM-141GB") -> str:
    from meshplan.hardware_profiles import builtin_gpu
    gpu = builtin_gpu(gpu_name)
    by = {(r["batch"], r["seq"], r["heads"] * r["head_dim"], r["head_dim"]): r
          for r in doc["rows"]}
    lines = [f"{'b':>3s} {'seq':>6s} {'width':>5s} {'E':>9s} {'eff 64 meas/sheet':>18s} "
             f"{'eff 128 meas/sheet':>19s} {'ratio meas/sheet':>17s}"]
    for (b, s, w, d), r64 in sorted(by.items()):
        if d != 64 or (b, s, w, 128) not in by:
            continue
        r128, e = by[(b, s, w, 128)], flops_forward(r64)
        s64, s128 = gpu.attention_efficiency_at(e, 64), gpu.attention_efficiency_at(e, 128)
        lines.append(f"{b:3d} {s:6d} {w:5d} {e:9.2e} {r64['efficiency']:8.3f}/{s64:.3f}  "
                     f"{r128['efficiency']:9.3f}/{s128:.3f}  "
                     f"{r64['efficiency'] / r128['efficiency']:8.3f}/{s64 / s128:.3f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="results JSON (runs the GPU benchmark)")
    p.add_argument("--compare", metavar="RESULTS", help="compare a results JSON with the sheet")
    p.add_argument("--peak-tflops", type=float, default=989.0)
    args = p.parse_args(argv)
    if not (args.out or args.compare):
        p.error("give --out (on a GPU) or --compare RESULTS")
    if args.out:
        doc = measure(args.peak_tflops)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(doc, indent=1))
        print(compare(doc))
    if args.compare:
        print(compare(json.loads(Path(args.compare).read_text())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
