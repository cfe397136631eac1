"""Does cuDNN's attention run slower per FLOP at head dim 64 than at 128 on this GPU, by the
ratio the datasheet now takes from the FlashAttention-3 paper's bars? And at head dims 80
and 96, which the datasheet interpolates (log2 head dim) between the published 64 and 128?
One GPU, ~1 min.

    python benchmarks/attention_head_dim_gpu.py --out $OUT/attention_head_dim.json
    python benchmarks/attention_head_dim_gpu.py --compare RESULTS.json        # no GPU

Times calibrate's own attention step (meshplan.calibrate.bench_compute.bench_attention:
SDPA causal forward + backward on ``(b, h, s, d)`` views of a ``(b, s, 3, h, d)``
projection, calibrate's timer, bf16) in pairs of the same width and FLOPs, heads of 64
against heads of 128: the paper's setup (2048 = 32·64 = 16·128, batch × seq = 16k tokens,
seq 4k-16k) and the cp40 model's (2176 = 34·64 = 17·128, batch 1, seq 8k-64k: the lengths
its all-to-all cores and rings ran), and width 1920 = 30·64 = 24·80 = 20·96 = 15·128 (16k
tokens, seq 2k-8k, and batch 1 at 16k and 32k: the drawn GPT models' head dims 80 and 96,
e.g. transfer45's t45m03 and t45m07, transfer47's t47m03 and t47m05, cp42's model). The GPU run also records the kernels one call of
each head dim launched (``torch.profiler``: which SDPA backend, which tile), since the
padding of a head dim the kernel does not instantiate (FlashAttention-2 runs 80 in its
96-wide kernel) depends on it. Efficiency as calibrate counts it,
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

# (width, tokens per call or None for batch 1, seqs, head dims): each head dim of each width
SETUPS = ((2048, 16384, (4096, 8192, 16384), (64, 128)),
          (2176, None, (8192, 16384, 32768, 65536), (64, 128)),
          (1920, 16384, (2048, 4096, 8192), (64, 80, 96, 128)),
          (1920, None, (16384, 32768), (80, 96, 128)))


def shapes():
    from meshplan.calibrate.shapes import AttentionShape
    for width, tokens, seqs, dims in SETUPS:
        for s in seqs:
            b = tokens // s if tokens else 1
            for d in dims:
                yield AttentionShape(batch=b, seq=s, heads=width // d, head_dim=d)


def kernels(shape, dev) -> list[str]:
    """The GPU kernels one forward + backward of ``shape`` launched (names, sorted, those
    of the attention call: SDPA's backends name theirs sdpa / flash / fmha / attention)."""
    import torch
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile
    b, s, h, d = shape.batch, shape.seq, shape.heads, shape.head_dim
    qkv = torch.randn(b, s, 3, h, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()   # warm
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
        F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
        torch.cuda.synchronize()
    keys = ("sdpa", "flash", "fmha", "attention", "attn")
    return sorted({e.key for e in prof.key_averages()
                   if any(x in e.key.lower() for x in keys)})


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
    first = {}
    for shape in shapes():
        first.setdefault(shape.head_dim, shape)
    launched = {str(d): kernels(shape, dev) for d, shape in sorted(first.items())}
    print(json.dumps({"kernels": launched}, indent=1), flush=True)
    return {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "cudnn": torch.backends.cudnn.version(), "peak_tflops": peak_tflops, "rows": rows,
            "kernels": launched}


def compare(doc: dict, gpu_name: str = "H200-SXM-141GB") -> str:
    from meshplan.hardware_profiles import builtin_gpu
    gpu = builtin_gpu(gpu_name)
    by = {(r["batch"], r["seq"], r["heads"] * r["head_dim"], r["head_dim"]): r
          for r in doc["rows"]}
    lines = [f"{'b':>3s} {'seq':>6s} {'width':>5s} {'d':>3s} {'E':>9s} {'eff d meas/sheet':>17s} "
             f"{'eff 128 meas/sheet':>19s} {'ratio meas/sheet':>17s}"]
    for (b, s, w, d), r in sorted(by.items()):
        if d == 128 or (b, s, w, 128) not in by:
            continue
        r128, e = by[(b, s, w, 128)], flops_forward(r)
        sd, s128 = gpu.attention_efficiency_at(e, d), gpu.attention_efficiency_at(e, 128)
        lines.append(f"{b:3d} {s:6d} {w:5d} {d:3d} {e:9.2e} {r['efficiency']:8.3f}/{sd:.3f}  "
                     f"{r128['efficiency']:9.3f}/{s128:.3f}  "
                     f"{r['efficiency'] / r128['efficiency']:8.3f}/{sd / s128:.3f}")
    for d, names in sorted((doc.get("kernels") or {}).items(), key=lambda kv: int(kv[0])):
        lines.append(f"head dim {d}: " + ("; ".join(names) or "no attention kernel named"))
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
