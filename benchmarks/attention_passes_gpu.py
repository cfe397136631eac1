"""SDPA's attention forward and backward, with and without the causal mask, on one GPU, in the
FlashAttention-3 paper's setup: the check of the published numbers the Hopper datasheet
attention curve is derived from (data/attention_kernels.toml [cudnn-h100-fa3]).

    python benchmarks/attention_passes_gpu.py --out $OUT/attention_passes.json   # 1 GPU, ~1 min
    python benchmarks/attention_passes_gpu.py --compare RESULTS.json             # no GPU

The paper's sweep (arXiv 2407.08608 §4.1): 16 heads of 128, batch × seqlen = 16k tokens,
seqlen 512-16k, bf16, TFLOP/s per pass with forward = 4·b·s²·h·d (halved with the causal
mask) and backward = 2.5 × forward; here with torch SDPA (the kernel it picks: cuDNN's on
Hopper with torch 2.11's cuDNN 9) on ``(b, h, s, d)`` views of a ``(b, s, 3, h, d)``
projection, as calibrate and the executor call it. Backward is timed on its own (the graph
kept, ``retain_graph``), so the masked backward the paper does not publish is measured too:
``--compare`` prints, per length, measured against published TFLOP/s and the curve point
derived from each (hardware_profiles/attention_published.py, eq. 1-4), with the masked
backward measured and as eq. (3) assumes it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PASSES = ("forward_causal", "forward", "backward_causal", "backward")
TOKENS, HEADS, HEAD_DIM = 16384, 16, 128
SEQS = (512, 1024, 2048, 4096, 8192, 16384)


def pass_flops(seq: int, causal: bool, backward: bool) -> float:
    f = 4.0 * (TOKENS // seq) * seq * seq * HEADS * HEAD_DIM / (2 if causal else 1)
    return 2.5 * f if backward else f


def time_passes(seq: int) -> dict[str, float]:
    """Seconds of each pass at one length (median of calibrate's timer)."""
    import torch
    import torch.nn.functional as F

    from meshplan.calibrate.timing import time_fn
    dev = torch.device("cuda")
    b = TOKENS // seq
    qkv = torch.randn(b, seq, 3, HEADS, HEAD_DIM, device=dev, dtype=torch.bfloat16,
                      requires_grad=True)
    g = torch.randn(b, HEADS, seq, HEAD_DIM, device=dev, dtype=torch.bfloat16)
    out: dict[str, float] = {}
    for causal in (True, False):
        def forward():
            q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        y = forward()

        def backward():
            y.backward(g, retain_graph=True)
            qkv.grad = None

        tag = "_causal" if causal else ""
        out["forward" + tag] = time_fn(forward, device=dev).median_s
        out["backward" + tag] = time_fn(backward, device=dev).median_s
        del y
    return out


def measure(peak_tflops: float) -> dict:
    import torch
    rows = []
    for seq in SEQS:
        t = time_passes(seq)
        row = {"seq": seq, "batch": TOKENS // seq, "seconds": t,
               "tflops": {p: pass_flops(seq, p.endswith("causal"), p.startswith("backward"))
                          / t[p] / 1e12 for p in PASSES}}
        rows.append(row)
        print(json.dumps(row), flush=True)
    return {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "cudnn": torch.backends.cudnn.version(), "peak_tflops": peak_tflops,
            "tokens": TOKENS, "heads": HEADS, "head_dim": HEAD_DIM, "rows": rows}


def compare(doc: dict) -> str:
    """Measured against the published table, pass by pass, and the curve points derived from
    the published bars, from the measured ones with eq. (3)'s masked backward, and from the
    measured ones with the masked backward as measured."""
    from meshplan.hardware_profiles.attention_published import published_points
    from meshplan.hardware_profiles.loader import builtin_table
    pub = builtin_table("attention_kernels.toml")["cudnn-h100-fa3"]
    rows = {r["seq"]: r for r in doc["rows"]}
    at = [i for i, s in enumerate(pub["seq"]) if s in rows]
    seqs = [pub["seq"][i] for i in at]
    published = {p: [pub[p + "_tflops"][i] for i in at] for p in PASSES
                 if p + "_tflops" in pub}
    measured = {p: [rows[s]["tflops"][p] for s in seqs] for p in PASSES}
    setup = {k: pub[k] for k in ("source", "tokens", "heads", "head_dim")} | {"seq": seqs}

    def points(tflops: dict, peak: float, passes) -> list:
        return published_points(setup | {"peak_tflops": peak} |
                                {p + "_tflops": tflops[p] for p in passes}, "compare")

    unmasked_bwd = ("forward_causal", "forward", "backward")
    curves = (points(published, pub["peak_tflops"], unmasked_bwd),
              points(measured, doc["peak_tflops"], unmasked_bwd),
              points(measured, doc["peak_tflops"], ("forward_causal", "backward_causal")))
    lines = [f"{doc['gpu']}, torch {doc['torch']}, cuDNN {doc['cudnn']}: TFLOP/s measured / "
             f"published (H100 SXM5, the FlashAttention-3 paper's cuDNN bars)",
             f"{'seq':>6s}" + "".join(f"{p:>18s}" for p in PASSES)
             + "   curve: published, measured (eq. 3), measured"]
    for n, s in enumerate(seqs):
        cells = "".join(f"{measured[p][n]:9.0f} / {published[p][n]:4.0f}" if p in published
                        else f"{measured[p][n]:9.0f} /    -" for p in PASSES)
        lines.append(f"{s:6d}{cells}   " + "  ".join(f"{c[n][1]:.3f}" for c in curves))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="results JSON (runs the GPU benchmark)")
    p.add_argument("--compare", metavar="RESULTS", help="compare a results JSON with the paper")
    p.add_argument("--peak-tflops", type=float, default=989.0)
    args = p.parse_args(argv)
    if args.compare:
        print(compare(json.loads(Path(args.compare).read_text())))
        return 0
    if not args.out:
        p.error("--out or --compare is required")
    doc = measure(args.peak_tflops)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1))
    print(compare(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
