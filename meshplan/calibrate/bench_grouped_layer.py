"""Grouped expert GEMMs timed inside the executor's MoE layer, on CUDA.

Why in the layer and not alone: the same grouped calls run at different clocks. Timed back to
back alone, torch's grouped kernel held one H200 at its 700 W cap, 1.37-1.67 GHz, 0.50-0.78
of the bf16 peak; inside the MoE layer, between the router, the permutation and the combine
(memory-bound work), the same calls ran at 1.98 GHz, 0.86-0.88
(docs/benchmarks/moe_checks.md, "Grouped GEMMs keyed by the call";
``benchmarks/grouped_gemm_in_step_gpu.py``). A profile timed alone priced the 1-GPU MoE
checks' steps worse than one timed in the layer (bf16 7.0 against 5.4 % mean error).

How: for G local experts of r rows each, a one-layer :class:`meshplan.executor.moe.MoELayer`
with G experts, top-k' = min(k, G) and T = G·r / k' tokens, eager under bf16 autocast (with
``fp8``: its experts' fp8 grouped GEMMs under that recipe, ``executor/fp8_grouped.py``),
three warm-up passes, then ``iters`` forward + backward passes under ``torch.profiler``. Each
pass runs six grouped kernels: forward fc1, fc2; backward fc2's two, then fc1's two. Their
GPU times give one row per weight (groups, rows, k, n, seconds = its forward and both
backward GEMMs), the row ``meshplan.calibrate.moe_profile`` turns into the grouped curve
(:mod:`meshplan.hardware_profiles.grouped_gemm`). The router routes the random tokens
unevenly, so a group's rows vary around r as a step's would.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from meshplan.spec import ModelSpec

# torch's grouped kernels: bf16's CUTLASS wrapper (aten GroupMM.cu); fp8 rowwise's a plain
# CUTLASS GemmUniversal over a GroupProblemShape (names read on 1 x H200, torch 2.11)
GROUPED_KERNELS = ("enable_3x_kernel_for_sm9x", "GroupProblemShape")
KERNELS_PER_PASS = 6
WARMUP = 3


def layer_for(model: ModelSpec, groups: int, rows: int) -> tuple[ModelSpec, int]:
    """The one-layer MoE spec whose G = ``groups`` experts get ``rows`` rows each under
    balanced routing, and its token count."""
    top_k = min(model.experts_per_token, groups)
    tokens = max(1, groups * rows // top_k)
    spec = replace(model, num_layers=1, max_seq_len=tokens, num_experts=groups,
                   experts_per_token=top_k)
    return spec, tokens


def profiled_layer(model: ModelSpec, groups: int, rows: int, device: torch.device, *,
                   iters: int = 3, fp8: str | None = None):
    """``torch.profiler`` over ``iters`` forward + backward passes of the layer (module
    docstring), after :data:`WARMUP` passes."""
    from meshplan.executor.moe import MoELayer
    spec, tokens = layer_for(model, groups, rows)
    layer = MoELayer(spec).to(device)
    if fp8:
        from meshplan.executor.fp8 import Fp8Plan, check_recipe_runnable
        layer.experts.fp8 = Fp8Plan(recipe=check_recipe_runnable(fp8, device), emulate=False)
    inp = torch.randn(1, tokens, model.hidden_size, device=device, requires_grad=True)

    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16):
            y = layer(inp)
        y.float().sum().backward()
        inp.grad = None
        layer.zero_grad(set_to_none=True)
    for _ in range(WARMUP):
        step()
    torch.cuda.synchronize(device)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            step()
        torch.cuda.synchronize(device)
    return prof


def grouped_kernel_times(prof) -> list[float]:
    """GPU seconds of each grouped kernel the profile saw, in launch order."""
    return [d / 1e6 for _, d in sorted(
        (ev.time_range.start, ev.time_range.end - ev.time_range.start) for ev in prof.events()
        if ev.device_type == torch.autograd.DeviceType.CUDA
        and any(g in ev.name for g in GROUPED_KERNELS))]


def rows_from_kernels(model: ModelSpec, groups: int, rows: int, times: list[float],
                      iters: int, precision: str) -> list[dict[str, Any]]:
    """fc1's and fc2's rows from ``iters`` passes' kernel times (module docstring); none where
    the count is not six a pass (the layer ran other grouped kernels: not told apart)."""
    if len(times) != KERNELS_PER_PASS * iters or iters <= 0:
        return []
    fc1 = fc2 = 0.0
    for i in range(iters):
        d = times[KERNELS_PER_PASS * i: KERNELS_PER_PASS * (i + 1)]
        fc1 += d[0] + d[4] + d[5]
        fc2 += d[1] + d[2] + d[3]
    h, f = model.hidden_size, model.moe_ffn_hidden_size
    return [{"groups": groups, "rows": rows, "k": k, "n": n, "seconds": s / iters,
             "backend": "grouped_mm", "timing": "in_layer", "precision": precision}
            for k, n, s in ((h, model.ffn_matrices * f, fc1), (f, h, fc2))]


def layer_bytes(model: ModelSpec, groups: int, rows: int) -> float:
    """A generous bound on the layer's activation bytes (bf16, forward and backward), to
    skip shapes the device cannot hold."""
    h, f = model.hidden_size, model.moe_ffn_hidden_size
    return 3.0 * groups * rows * (4 * h + 6 * model.ffn_matrices * f + 4 * f)


def grouped_rows_in_layer(model: ModelSpec, groups: int, rows: int, device: torch.device, *,
                          iters: int = 3, fp8: str | None = None) -> list[dict[str, Any]]:
    """fc1's and fc2's grouped rows of ``groups`` experts at ``rows`` rows each, timed in the
    layer (module docstring); none where the device cannot hold the layer or the kernels
    are not told apart."""
    free, _ = torch.cuda.mem_get_info(device)
    if layer_bytes(model, groups, rows) > 0.8 * free:
        return []
    prof = profiled_layer(model, groups, rows, device, iters=iters, fp8=fp8)
    out = rows_from_kernels(model, groups, rows, grouped_kernel_times(prof), iters,
                            fp8 or "bf16")
    del prof
    torch.cuda.empty_cache()
    return out


__all__ = ["GROUPED_KERNELS", "layer_for", "profiled_layer", "grouped_kernel_times",
           "rows_from_kernels", "grouped_rows_in_layer", "layer_bytes"]
