"""Compute microbenchmarks: GEMMs, causal attention, memory-bound ops, and the CPU's own
matmul peak and copy bandwidth (CPU has no datasheet to measure against).

Each op runs forward and backward through autograd, as in the executor: ``F.linear``,
``F.scaled_dot_product_attention(is_causal=True)`` on ``(b, heads, s, d)`` views of a
``(b, s, heads, d)`` projection, the executor's own RMSNorm, fused AdamW on CUDA.
bf16 on GPU, fp32 on CPU (the executor's precisions).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F

from meshplan.calibrate.shapes import AttentionShape, GemmShape
from meshplan.calibrate.timing import time_fn


def compute_dtype(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def bench_gemm(shape: GemmShape, device: torch.device, *, queued: bool = False
               ) -> dict[str, Any]:
    dt = compute_dtype(device)
    x = torch.randn(shape.m, shape.k, device=device, dtype=dt, requires_grad=True)
    w = torch.randn(shape.n, shape.k, device=device, dtype=dt, requires_grad=True)
    g = torch.randn(shape.m, shape.n, device=device, dtype=dt)

    def step():
        y = F.linear(x, w)                         # (m, n)
        y.backward(g)
        x.grad = w.grad = None

    t = time_fn(step, device=device, queued=queued)
    return {"label": shape.label, "m": shape.m, "k": shape.k, "n": shape.n,
            "seconds": t.median_s, "iters": t.iters}


def bench_attention(shape: AttentionShape, device: torch.device, *, queued: bool = False
                    ) -> dict[str, Any]:
    dt = compute_dtype(device)
    b, s, nh, hd = shape.batch, shape.seq, shape.heads, shape.head_dim
    qkv = torch.randn(b, s, 3, nh, hd, device=device, dtype=dt, requires_grad=True)
    g = torch.randn(b, nh, s, hd, device=device, dtype=dt)

    def step():
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))   # (b, nh, s, hd)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y.backward(g)
        qkv.grad = None

    t = time_fn(step, device=device, queued=queued)
    return {"batch": b, "seq": s, "heads": nh, "head_dim": hd, "seconds": t.median_s,
            "iters": t.iters}


def _membound_ops(n: int, hidden: int, device: torch.device, *, as_run: bool = False
                  ) -> list[tuple[str, float, Callable]]:
    """(name, bytes as the cost model counts them for forward + backward, step).
    ``as_run``: the executor's LayerNorm as its step runs it (fp32 parameters under
    autocast) in place of a bf16 one, and its RoPE ("rope"; docs/calibrate.md "Compute
    microbenchmarks"), as ``--queued-microbench`` calibrations time them."""
    dt = compute_dtype(device)
    e = torch.finfo(dt).bits // 8
    tokens = n // hidden
    x = torch.randn(tokens, hidden, device=device, dtype=dt, requires_grad=True)
    y = torch.randn(tokens, hidden, device=device, dtype=dt, requires_grad=True)
    g = torch.randn(tokens, hidden, device=device, dtype=dt)
    ln_w = torch.ones(hidden, device=device, requires_grad=True)
    ln_b = torch.zeros(hidden, device=device, requires_grad=True)
    two = torch.randn(tokens, 2 * hidden, device=device, dtype=dt, requires_grad=True)
    ops: list[tuple[str, float, Callable]] = []

    def run(fn, *inputs):
        def step():
            fn().backward(g)
            for t in inputs:
                t.grad = None
        return step

    # forward bytes per element: norm 2 (read, write), add 3, gelu 2, swiglu 3 (two in, one out);
    # backward moves twice the forward bytes (meshplan/costmodel/compute.py).
    if not as_run:
        ops.append(("layernorm", 3 * 2 * n * e,
                    run(lambda: F.layer_norm(x, (hidden,), ln_w.to(dt), ln_b.to(dt)),
                        x, ln_w, ln_b)))
    try:
        from meshplan.executor.model import RMSNorm
        rms = RMSNorm(hidden).to(device)
        ops.append(("rmsnorm", 3 * 2 * n * e, run(lambda: rms(x), x, *rms.parameters())))
    except ImportError:  # executor absent: LayerNorm alone stands for the norms
        pass
    ops.append(("residual-add", 3 * 3 * n * e, run(lambda: x + y, x, y)))
    if as_run:
        ops.extend(_as_run_ops(x, ln_w, ln_b, n, hidden, tokens, e, dt, device, run))
    ops.append(("gelu", 3 * 2 * n * e, run(lambda: F.gelu(x, approximate="tanh"), x)))
    ops.append(("swiglu", 3 * 3 * n * e,
                run(lambda: (lambda a, b: F.silu(a) * b)(*two.chunk(2, dim=-1)), two)))
    return ops


def _as_run_ops(x, ln_w, ln_b, n: int, hidden: int, tokens: int, e: int, dt, device, run
                ) -> list[tuple[str, float, Callable]]:
    """The executor's LayerNorm (fp32 parameters under the step's autocast, which runs
    layer_norm in fp32; the next linear casts its output down) and its RoPE on q and k as
    ``Attention.forward`` runs them (strided (b, nh, s, hd) views of the fused projection);
    bytes: the fused count (RoPE: read and write q and k once each way)."""
    from meshplan.executor.model import apply_rope, rope_tables

    def layer_norm():
        if device.type != "cuda":
            return F.layer_norm(x, (hidden,), ln_w, ln_b)
        with torch.autocast("cuda", dtype=dt):
            return F.layer_norm(x, (hidden,), ln_w, ln_b).to(dt)
    hd = 128 if hidden >= 128 else hidden
    heads = max(1, hidden // hd)
    qkv = torch.randn(1, tokens, 3 * heads * hd, device=device, dtype=dt, requires_grad=True)
    cos, sin = rope_tables(tokens, hd, device=device)
    g = torch.randn(1, 2 * heads, tokens, hd, device=device, dtype=dt)

    def rope_step():
        q, k, _ = qkv.split((heads * hd,) * 3, dim=-1)
        q = q.view(1, tokens, heads, hd).transpose(1, 2)
        k = k.view(1, tokens, heads, hd).transpose(1, 2)
        torch.cat((apply_rope(q, cos, sin), apply_rope(k, cos, sin)), dim=1).backward(g)
        qkv.grad = None
    return [("layernorm", 3 * 2 * n * e, run(layer_norm, x, ln_w, ln_b)),
            ("rope", 3 * 2 * 2 * n * e, rope_step)]


def bench_optimizer(numel: int, device: torch.device, *, queued: bool = False
                    ) -> dict[str, Any]:
    """AdamW step on fp32 parameters (fused on CUDA, foreach on CPU), 32 B/param as the
    cost model counts it (read+write master, m, v; read grad; write weight)."""
    from meshplan.costmodel.estimate import OPTIMIZER_BYTES_PER_PARAM
    chunks = [torch.zeros(numel // 8, device=device, requires_grad=True) for _ in range(8)]
    for p in chunks:
        p.grad = torch.randn_like(p)
    kw = {"fused": True} if device.type == "cuda" else {"foreach": True}
    opt = torch.optim.AdamW(chunks, lr=1e-4, **kw)
    t = time_fn(opt.step, device=device, queued=queued)
    total = sum(p.numel() for p in chunks)
    return {"op": "adamw", "elements": total, "model_bytes": OPTIMIZER_BYTES_PER_PARAM * total,
            "seconds": t.median_s, "iters": t.iters}


def bench_membound(numel: int, device: torch.device, *, queued: bool = False,
                   as_run: bool = False, optimizer_numel: int | None = None
                   ) -> list[dict[str, Any]]:
    """The memory-bound ops on ``numel`` elements, then the AdamW step on
    ``optimizer_numel`` (default ``numel``; ``shapes.optimizer_elements``)."""
    hidden = 4096 if device.type == "cuda" else 512
    rows = []
    for name, nbytes, step in _membound_ops(numel, hidden, device, as_run=as_run):
        t = time_fn(step, device=device, queued=queued)
        rows.append({"op": name, "elements": numel, "model_bytes": float(nbytes),
                     "seconds": t.median_s, "iters": t.iters})
    rows.append(bench_optimizer(optimizer_numel or numel, device, queued=queued))
    return rows


def cpu_matmul_peak_tflops(quick: bool) -> tuple[float, list[dict[str, Any]]]:
    """The best fp32 square-matmul rate: the CPU's "peak" that efficiencies are relative to."""
    rows, best = [], 0.0
    for n in ((128, 256, 512) if quick else (256, 512, 1024)):
        a, b = torch.randn(n, n), torch.randn(n, n)
        t = time_fn(lambda: a @ b, device="cpu", budget_s=0.05)
        tflops = 2 * n ** 3 / t.min_s / 1e12
        best = max(best, tflops)
        rows.append({"n": n, "seconds": t.min_s, "tflops": tflops})
    return best, rows


def cpu_copy_gbps(numel: int) -> float:
    """Read+write bandwidth of a large copy, the CPU stand-in for a datasheet HBM figure."""
    src = torch.randn(numel)
    dst = torch.empty_like(src)
    t = time_fn(lambda: dst.copy_(src), device="cpu", budget_s=0.05)
    return 2 * numel * 4 / t.min_s / 1e9
