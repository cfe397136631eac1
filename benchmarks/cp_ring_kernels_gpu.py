"""The ring's block kernels on one GPU: which kernel SDPA picks, whether the cuDNN and flash
block kernels of meshplan/executor/context_parallel.py give SDPA's output and gradients
when two key blocks are merged as the ring merges them, and how fast each runs the block
shapes of benchmarks/context_parallel_gpu.py's ring layouts (fwd + bwd, CUDA events).

    python benchmarks/cp_ring_kernels_gpu.py --out $OUT     # ~1 min on one H100/H200

Writes $OUT/cp_ring_kernels.json and prints a table. Numerics: bf16, errors against SDPA's
own forward and backward (whatever backend it picks) on the same inputs.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from meshplan.executor.context_parallel import KERNELS, block_kernel

HEADS, HEAD_DIM = 16, 128          # benchmarks/executor_gpu.MODEL (GQA repeated to 16)
# (name, tokens per rank, heads per rank, cp): the ring layouts of context_parallel_gpu.py
SHAPES = [("cp4-64k / cp2-32k (16k local, 16 heads)", 16384, 16, 4),
          ("cp2-tp2-64k (32k local, 8 heads)", 32768, 8, 2)]


def merged_two_blocks(kernel, q, k, v, dout):
    """Causal attention of q over k, v as two key blocks (the first causal-free half seen
    by the second half of the queries), merged and differentiated as the ring does."""
    n = q.shape[2] // 2
    o1, l1 = kernel.forward(q, k, v, True)                  # whole block, causal
    # the second query half over the first key half, non-causal (a ring step's shape)
    o2, l2 = kernel.forward(q[:, :, n:].contiguous(), k[:, :, :n].contiguous(),
                            v[:, :, :n].contiguous(), False)
    out, lse = o1.float().clone(), l1.float().clone()
    m = torch.logaddexp(lse[:, :, n:], l2.float())
    out[:, :, n:] = (out[:, :, n:] * torch.exp(lse[:, :, n:] - m).unsqueeze(-1)
                     + o2.float() * torch.exp(l2.float() - m).unsqueeze(-1))
    lse[:, :, n:] = m
    out = out.to(q.dtype)
    g1 = kernel.backward(dout, q, k, v, out, lse, True)
    g2 = kernel.backward(dout[:, :, n:].contiguous(), q[:, :, n:].contiguous(),
                         k[:, :, :n].contiguous(), v[:, :, :n].contiguous(),
                         out[:, :, n:].contiguous(), lse[:, :, n:].contiguous(), False)
    dq = g1[0].float()
    dq[:, :, n:] += g2[0].float()
    dk, dv = g1[1].float(), g1[2].float()
    dk[:, :, :n] += g2[1].float()
    dv[:, :, :n] += g2[2].float()
    return out, (dq, dk, dv)


def numerics(device) -> dict:
    g = torch.Generator(device=device).manual_seed(0)
    q, k, v, dout = (torch.randn(1, 4, 1024, HEAD_DIM, device=device, dtype=torch.bfloat16,
                                 generator=g) for _ in range(4))
    # reference: SDPA over keys [first key half; all keys], the extra block visible to the
    # second query half only and the rest causal: what the two merged blocks compute
    ref_in = [t.clone().requires_grad_() for t in (q, k, v)]
    n = q.shape[2] // 2
    kk = torch.cat((ref_in[1][:, :, :n], ref_in[1]), 2)
    vv = torch.cat((ref_in[2][:, :, :n], ref_in[2]), 2)
    mask = torch.zeros(q.shape[2], 3 * n, dtype=torch.bool, device=device)
    mask[n:, :n] = True                                  # the extra block: second half only
    mask[:, n:] = torch.ones(2 * n, 2 * n, dtype=torch.bool, device=device).tril()
    ref = F.scaled_dot_product_attention(ref_in[0].float(), kk.float(), vv.float(),
                                         attn_mask=mask)
    ref.backward(dout.float())
    res = {}
    for name in ("flash", "cudnn"):
        try:
            out, grads = merged_two_blocks(KERNELS[name](), q, k, v, dout)
            errs = {"out": (out.float() - ref).abs().max().item()}
            for label, got, t in zip("qkv", grads, ref_in):
                errs[f"d{label}"] = (got - t.grad).abs().max().item()
            res[name] = errs
        except Exception as exc:      # noqa: BLE001 — reported, the other kernel still runs
            res[name] = {"error": f"{type(exc).__name__}: {exc}"[:400]}
    return res


def time_ring_blocks(kernel_name, local, heads, cp, device, reps=5) -> float:
    """Seconds of one rank's cp block kernels, forward and backward (merges not included)."""
    kernel = KERNELS[kernel_name]()
    c = local // 2
    mk = lambda n: torch.randn(1, heads, n, HEAD_DIM, device=device, dtype=torch.bfloat16)  # noqa
    blocks = [(mk(local), mk(local), True)] + [(mk(c), mk(local), False)] * (cp - 1)
    outs = [kernel.forward(q, kv, kv, causal) for q, kv, causal in blocks]

    def once():
        for (q, kv, causal), (o, l) in zip(blocks, outs):
            kernel.forward(q, kv, kv, causal)
            kernel.backward(o, q, kv, kv, o, l, causal)
    once()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        once()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / reps


def time_sdpa(seq, heads, device, reps=5) -> float:
    """Seconds of SDPA's causal forward + backward over ``seq`` tokens (what all-to-all runs)."""
    q, k, v = (torch.randn(1, heads, seq, HEAD_DIM, device=device, dtype=torch.bfloat16,
                           requires_grad=True) for _ in range(3))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    y.backward(torch.ones_like(y))
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y.backward(torch.ones_like(y))
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    device = torch.device("cuda")
    q = torch.empty(1, HEADS, 16384, HEAD_DIM, device=device, dtype=torch.bfloat16)
    doc = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "cudnn": torch.backends.cudnn.version(),
           "sdpa_choice": int(torch._fused_sdp_choice(q, q, q, is_causal=True)),
           "ring_kernel": type(block_kernel(q)).__name__, "numerics": numerics(device),
           "timings": []}
    print(json.dumps({k: doc[k] for k in ("gpu", "torch", "cudnn", "sdpa_choice",
                                          "ring_kernel", "numerics")}, indent=1))
    for name, local, heads, cp in SHAPES:
        row = {"shape": name, "local": local, "heads": heads, "cp": cp,
               "sdpa_whole_heads_over_cp_s": time_sdpa(local * cp, heads // cp, device)}
        for kernel in ("flash", "cudnn"):
            try:
                row[f"{kernel}_s"] = time_ring_blocks(kernel, local, heads, cp, device)
            except Exception as exc:      # noqa: BLE001
                row[f"{kernel}_s"] = None
                row[f"{kernel}_error"] = f"{type(exc).__name__}: {exc}"[:300]
        doc["timings"].append(row)
        print(row)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cp_ring_kernels.json").write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
