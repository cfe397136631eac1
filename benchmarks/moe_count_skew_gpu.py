"""Diagnostic (issue 38): the MoE layer's routing kernels on balanced against skewed expert
choices (moeh1's blocks at initialisation route up to 3.8x the mean to one expert).

Times, queued on one GPU, the executor's token counting (``executor/moe._count``: an
``index_add_`` of ones, i.e. atomics on one counter per expert), the stable argsort by
expert, and one MoE layer's routed part (``MoELayer._routed``'s kernels from the sorted
order on) for micro-batch 2 × 4096 tokens, top-8 of 32 experts, hidden 1280 — once with
uniformly drawn experts and once with experts drawn from a skewed distribution.

    python benchmarks/moe_count_skew_gpu.py --out $OUT/moe_count_skew.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    import torch

    from meshplan.executor.moe import GROUP_ALIGN_ROWS, _count, _grouped_mm_fn
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--experts", type=int, default=32)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--hidden", type=int, default=1280)
    p.add_argument("--width", type=int, default=1024, help="one expert's ffn width")
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    dev = torch.device("cuda", 0)
    g = torch.Generator(device=dev).manual_seed(0)
    n = a.tokens * a.top_k

    def timed(fn) -> float:
        for _ in range(5):
            fn()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        e0.record()
        for _ in range(a.reps):
            fn()
        e1.record()
        torch.cuda.synchronize()
        return e0.elapsed_time(e1) / a.reps

    out = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "args": vars(a),
           "cases": {}}
    for name, skew in (("uniform", 0.0), ("skewed", 0.6), ("more_skewed", 1.0), ("very_skewed", 2.0)):
        w = torch.exp(skew * torch.randn(a.experts, device=dev, generator=g))
        ids = torch.multinomial(w / w.sum(), n, replacement=True, generator=g)
        c = torch.bincount(ids, minlength=a.experts).float()
        token = torch.arange(a.tokens, device=dev).repeat_interleave(a.top_k)
        order = torch.argsort(ids, stable=True)
        tok = token[order]
        rows = torch.randn(n, a.hidden, device=dev, dtype=torch.bfloat16)
        y = torch.zeros(a.tokens, a.hidden, device=dev, dtype=torch.bfloat16)
        case = {"max_over_mean": float(c.max() / c.mean()),
                "count_ms": timed(lambda: _count(ids, a.experts)),
                "argsort_ms": timed(lambda: torch.argsort(ids, stable=True)),
                "combine_index_add_ms": timed(lambda: y.zero_().index_add_(0, tok, rows)),
                "gather_index_select_ms": timed(lambda: rows.index_select(0, order))}
        # the experts' up projection (SwiGLU: 2 x width) as the executor's grouped GEMM runs
        # it, groups padded to GROUP_ALIGN_ROWS, forward and the two backward products
        al = GROUP_ALIGN_ROWS
        padded = (c.long() + al - 1) // al * al
        offs = torch.cumsum(padded, 0).to(torch.int32)
        total = int(offs[-1])
        mm = _grouped_mm_fn()
        xp = torch.randn(total, a.hidden, device=dev, dtype=torch.bfloat16)
        w = torch.randn(a.experts, 2 * a.width, a.hidden, device=dev, dtype=torch.bfloat16)
        gy = torch.randn(total, 2 * a.width, device=dev, dtype=torch.bfloat16)
        case["grouped_fwd_ms"] = timed(lambda: mm(xp, w.transpose(-2, -1), offs=offs))
        case["grouped_dgrad_ms"] = timed(lambda: mm(gy, w, offs=offs))
        case["grouped_wgrad_ms"] = timed(lambda: mm(gy.t(), xp, offs=offs))
        out["cases"][name] = case
        print(name, json.dumps({k: round(v, 4) for k, v in case.items()}), flush=True)
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
