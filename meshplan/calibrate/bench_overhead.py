"""Fixed per-layer and per-micro-batch costs: a tiny model (hidden 64, 32 tokens), so its
GEMMs, attention and elementwise work are negligible, with 2 and 8 layers; the slope in
layers is the per-layer cost, the intercept the per-micro-batch cost (embedding, head,
loss, autograd bookkeeping).

On GPU two numbers are kept. The *GPU-side* cost — the tiny step's kernels timed with CUDA
events while the CPU has already queued all of them behind a large GEMM — is what a layer
adds when the GPU is the bottleneck (kernel gaps, small-kernel tails); it goes into
``layer_overhead_s`` / ``microbatch_overhead_s``. The *CPU dispatch* time (wall clock of
issuing the step) bounds a layer from below when the GPU is faster than Python; it is
recorded for inspection (``*_cpu_dispatch_s``) because the cost model adds overheads, it
does not take a maximum. On CPU, where ops are synchronous, both are the wall clock.
"""

from __future__ import annotations

import math
import statistics
import time
from contextlib import nullcontext
from typing import Any

import torch

from meshplan.calibrate.stats import two_depth_fit
from meshplan.spec import ModelSpec

LAYER_COUNTS = (2, 8)


def tiny_spec(like: ModelSpec | None, layers: int) -> ModelSpec:
    llama = like is None or like.activation == "swiglu"
    style = (dict(activation="swiglu", norm="rmsnorm", position_embedding="rope",
                  tied_embeddings=False, bias=False) if llama else
             dict(activation="gelu", norm="layernorm", position_embedding="learned",
                  tied_embeddings=True, bias=True))
    return ModelSpec(name=f"tiny-{layers}", num_layers=layers, hidden_size=64, num_heads=2,
                     num_kv_heads=2, ffn_hidden_size=128, vocab_size=128, max_seq_len=64, **style)


def _step_fn(spec: ModelSpec, device: torch.device):
    from meshplan.executor.model import Transformer, cross_entropy
    model = Transformer(spec).to(device)
    model.init_weights(seed=0)
    tokens = torch.randint(0, spec.vocab_size, (1, 32), device=device)
    targets = torch.randint(0, spec.vocab_size, (1, 32), device=device)
    amp = (torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda"
           else nullcontext())

    def step():
        with amp:
            loss = cross_entropy(model(tokens), targets)
        loss.backward()
        for p in model.parameters():
            p.grad = None
    return step


def _dispatch_and_gpu_s(step, device: torch.device, iters: int) -> tuple[float, float]:
    for _ in range(3):
        step()
    if device.type != "cuda":
        # other processes can only add time to a synchronous CPU step: keep the fastest
        ts = []
        for _ in range(iters):
            t0 = time.perf_counter()
            step()
            ts.append(time.perf_counter() - t0)
        return min(ts), min(ts)
    torch.cuda.synchronize()
    dispatch = []
    for _ in range(iters):
        t0 = time.perf_counter()
        step()
        dispatch.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
    cpu_s = statistics.median(dispatch)
    big = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    big @ big
    e1.record()
    e1.synchronize()
    gemm_s = e0.elapsed_time(e1) / 1e3
    preload = max(1, math.ceil(3 * max(dispatch) / max(gemm_s, 1e-6)))
    gpu = []
    for _ in range(iters):
        torch.cuda.synchronize()
        for _ in range(preload):               # keep the GPU busy while the step is queued
            big @ big
        e0.record()
        step()
        e1.record()
        e1.synchronize()
        gpu.append(e0.elapsed_time(e1) / 1e3)
    return cpu_s, statistics.median(gpu)


def bench_overheads(device: torch.device, like: ModelSpec | None, *, iters: int = 10
                    ) -> list[dict[str, Any]]:
    cpu: dict[int, float] = {}
    gpu: dict[int, float] = {}
    steps = {n: _step_fn(tiny_spec(like, n), device) for n in LAYER_COUNTS}
    for _ in range(2):  # alternate the two sizes so drift (clocks, neighbours) hits both
        for n in LAYER_COUNTS:
            c, g = _dispatch_and_gpu_s(steps[n], device, iters)
            cpu[n], gpu[n] = min(cpu.get(n, c), c), min(gpu.get(n, g), g)
    a, b = LAYER_COUNTS
    rows = []
    for label, t in (("", gpu), ("_cpu_dispatch", cpu)):
        per_mb, per_layer = two_depth_fit(a, t[a], b, t[b])
        rows.append({"kind": f"layer{label}_overhead_s" if not label else f"layer{label}_s",
                     "seconds": per_layer, "layers": list(LAYER_COUNTS),
                     "step_seconds": [t[a], t[b]]})
        rows.append({"kind": f"microbatch{label}_overhead_s" if not label else f"microbatch{label}_s",
                     "seconds": per_mb, "layers": list(LAYER_COUNTS),
                     "step_seconds": [t[a], t[b]]})
    return rows
