"""FP8 microbenchmarks: the fp8 GEMM efficiency by shape, and the casts' bandwidth.

Rows for a GPU profile (``meshplan calibrate`` runs them on GPUs of compute capability
>= 8.9; :mod:`meshplan.calibrate.fp8_profile` turns them into the profile's fp8 keys):

* ``fp8_gemm``: per GEMM shape (the calibration's own :class:`GemmShape` grid) and recipe,
  the three GEMMs of a linear (forward, dgrad, wgrad) on operands cast beforehand — the
  pure fp8 GEMM time, whose ``3·2·m·k·n / (fp8 peak · seconds)`` is the fp8 efficiency
  curve (:func:`fp8_gemm_efficiency_points`); the whole fp8 linear, forward and backward
  with its casts, as the executor runs it (:func:`meshplan.executor.fp8.fp8_linear`); and
  the bf16 ``F.linear`` of the same shape, so each row carries the measured speed-up; on
  CUDA also the three queued (:func:`~meshplan.calibrate.timing.time_queued_split`): the
  GEMMs' and the fp8 linear's GPU-busy seconds and the fp8 and bf16 linears' CPU dispatch,
  which split the eager casts into their GPU and host parts.
* ``fp8_cast``: per block kind, one cast of a bf16 tensor (amax, scale and cast, as
  :func:`meshplan.executor.fp8_quant.quantize` does it) and one fp8 transpose, with the
  bytes :mod:`meshplan.costmodel.fp8` counts for them, so ``bytes / seconds`` is the
  achieved bandwidth the cast-traffic formula divides by; on CUDA also the same casts
  compiled (``compiled cast KIND``), the bandwidth of the executor's compiled casts.

GPU: the fp8 kernel (``torch._scaled_mm``). CPU: the emulation (rows only check the
wiring; a CPU has no fp8 units to calibrate).
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import torch
import torch.nn.functional as F

from meshplan.calibrate.shapes import GemmShape
from meshplan.calibrate.timing import time_fn, time_queued_split
from meshplan.costmodel.fp8 import SCALE_BYTES, linear_cast_traffic, scale_count
from meshplan.executor.fp8 import Fp8Plan, check_recipe_runnable, fp8_linear, recipe
from meshplan.executor.fp8_grouped import Fp8ExpertWeights
from meshplan.executor.fp8_quant import quantize

#: the block kinds of the recipes the executor runs, by the cast they time
CAST_BLOCKS = {"tensor": (0, 0), "row": (1, 0), "1x128": (1, 128), "128x128": (128, 128)}
RUNNABLE_RECIPES = ("tensorwise", "rowwise", "blockwise")


def _dtype(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def linear_calls(m: int, k: int, n: int, recipe_name: str, device: torch.device):
    """(gemms, fp8, bf16): callables running one ``m × k`` by ``k × n`` linear's three fp8
    GEMMs on operands cast beforehand, the executor's fp8 linear forward + backward with its
    casts (fp32 weight, as ZeRO-0/1 runs it), and the bf16 ``F.linear`` forward + backward."""
    r = check_recipe_runnable(recipe_name, device)
    plan = Fp8Plan(recipe=r, emulate=device.type != "cuda")
    dt = _dtype(device)
    x = torch.randn(m, k, device=device, dtype=dt, requires_grad=True)
    w = torch.randn(n, k, device=device, dtype=torch.float32, requires_grad=True)
    w16 = w.detach().to(dt).requires_grad_()
    dy = torch.randn(m, n, device=device, dtype=dt)

    xq = plan.cast(x.detach(), "x_fwd")
    wq = plan.cast(w.detach(), "w_fwd")
    dyq = plan.cast(dy, "dy_dgrad")
    wq_d = plan.cast(w.detach(), "w_dgrad").contiguous_t().t()
    dyq_w = plan.cast(dy, "dy_wgrad").contiguous_t()
    xq_w = plan.cast(x.detach(), "x_wgrad").contiguous_t().t()

    def gemms():
        plan.gemm(xq, wq.t(), dt, "forward")
        plan.gemm(dyq, wq_d, dt, "dgrad")
        plan.gemm(dyq_w, xq_w, dt, "wgrad")

    def linear_fp8():
        fp8_linear(x, w, None, plan).backward(dy)
        x.grad = w.grad = None

    def linear_bf16():
        F.linear(x, w16).backward(dy)
        x.grad = w16.grad = None

    return gemms, linear_fp8, linear_bf16


def bench_fp8_gemm(shape: GemmShape, recipe_name: str, device: torch.device) -> dict[str, Any]:
    """One row: pure fp8 GEMMs, the fp8 linear with casts, and bf16, for ``shape``."""
    m, k, n = shape.m, shape.k, shape.n
    gemms, linear_fp8, linear_bf16 = linear_calls(m, k, n, recipe_name, device)
    t_gemm = time_fn(gemms, device=device)
    t_fp8 = time_fn(linear_fp8, device=device)
    t_bf16 = time_fn(linear_bf16, device=device)
    row = {"label": shape.label, "m": m, "k": k, "n": n, "recipe": recipe_name,
           "flops": 6.0 * m * k * n, "gemm_seconds": t_gemm.median_s,
           "linear_seconds": t_fp8.median_s, "bf16_seconds": t_bf16.median_s,
           "speedup": t_bf16.median_s / t_fp8.median_s, "iters": t_fp8.iters}
    if device.type == "cuda" and hasattr(torch.cuda, "_sleep"):
        # the same three queued: the GPU's busy time and the host's dispatch apart (a
        # synchronized eager fp8 linear reads its CPU's time: fp8_profile.eager_cast_split_fit)
        row["gemm_gpu_seconds"], _ = time_queued_split(gemms, device=device)
        row["linear_gpu_seconds"], row["linear_cpu_seconds"] = time_queued_split(
            linear_fp8, device=device)
        _, row["bf16_cpu_seconds"] = time_queued_split(linear_bf16, device=device)
    return row


def cast_bytes(rows: int, cols: int, block: tuple[int, int], hp_bytes: int) -> float:
    """What :func:`meshplan.costmodel.fp8.linear_cast_traffic` charges one dynamic cast:
    two reads of the 16-bit tensor (amax, cast), one fp8 write, the scales."""
    return rows * cols * (2 * hp_bytes + 1) + scale_count(rows, cols, block) * SCALE_BYTES


def bench_fp8_casts(rows: int, cols: int, device: torch.device) -> list[dict[str, Any]]:
    """One row per block kind: a bf16 (CPU: fp32) tensor cast to e4m3, and an fp8
    transpose copy (read and write 1 byte per element)."""
    dt = _dtype(device)
    hp = torch.finfo(dt).bits // 8
    x = torch.randn(rows, cols, device=device, dtype=dt)
    out = []
    for kind, block in CAST_BLOCKS.items():
        t = time_fn(lambda b=block: quantize(x, b, "e4m3"), device=device)
        out.append({"op": f"cast {kind}", "rows": rows, "cols": cols,
                    "bytes": cast_bytes(rows, cols, block, hp), "seconds": t.median_s,
                    "iters": t.iters})
    q = quantize(x, (0, 0), "e4m3").data
    t = time_fn(lambda: q.t().contiguous(), device=device)
    out.append({"op": "transpose fp8", "rows": rows, "cols": cols, "bytes": 2.0 * rows * cols,
                "seconds": t.median_s, "iters": t.iters})
    return out


#: the block kinds whose compiled cast calibrate times (the recipes torch runs on Hopper)
COMPILED_CAST_BLOCKS = ("tensor", "row")


def bench_fp8_casts_compiled(rows: int, cols: int, device: torch.device,
                             kinds: Sequence[str] = COMPILED_CAST_BLOCKS
                             ) -> list[dict[str, Any]]:
    """The casts of :func:`bench_fp8_casts` under ``torch.compile`` (Inductor fuses each
    into one or two kernels, as in the executor's compiled blocks): one row per block
    kind, ``op`` "compiled cast KIND". The compilation runs in the warm-up, outside the
    timed calls; ``torch._dynamo`` is reset before each so no cache limit falls back to
    eager."""
    dt = _dtype(device)
    hp = torch.finfo(dt).bits // 8
    x = torch.randn(rows, cols, device=device, dtype=dt)
    out = []
    for kind in kinds:
        block = CAST_BLOCKS[kind]
        torch._dynamo.reset()
        fn = torch.compile(lambda t, b=block: quantize(t, b, "e4m3").data, dynamic=False)
        t = time_fn(lambda: fn(x), device=device)
        out.append({"op": f"compiled cast {kind}", "rows": rows, "cols": cols,
                    "bytes": cast_bytes(rows, cols, block, hp), "seconds": t.median_s,
                    "iters": t.iters})
    torch._dynamo.reset()
    return out


#: the stacked weight whose compiled cast calibrate times (experts × out × in, fp32): large
#: enough to stream at HBM speed, as the fp8 routed experts' weights of the checked models
WEIGHT_CAST_SHAPE = (8, 8192, 4096)


def weight_cast_bytes(experts: int, out_features: int, in_features: int) -> float:
    """What :func:`meshplan.costmodel.fp8.linear_cast_traffic` charges the casts of a stacked
    fp32 weight to its forward and data-gradient fp8 layouts (recipe rowwise)."""
    c = linear_cast_traffic(1, in_features, out_features, "rowwise", act_bytes=2,
                            weight_bytes=4)
    return experts * c.weight_bytes


def bench_fp8_weight_cast(device: torch.device, shape: tuple[int, int, int] = WEIGHT_CAST_SHAPE
                          ) -> dict[str, Any]:
    """The compiled cast of a stacked fp32 weight to both fp8 layouts, as the executor's
    fp8 routed experts cast theirs once a step
    (:class:`meshplan.executor.fp8_grouped.Fp8ExpertWeights`): ``op`` "weight cast
    compiled", or its ``error``."""
    e, o, i = shape
    row: dict[str, Any] = {"op": "weight cast compiled", "experts": e, "rows": o, "cols": i,
                           "bytes": weight_cast_bytes(e, o, i)}
    try:
        w = torch.nn.Parameter(torch.randn(e, o, i, device=device) * 0.02)
        plan = Fp8Plan(recipe=recipe("rowwise"), emulate=device.type != "cuda")
        casts = Fp8ExpertWeights(w, plan, backend="inductor")
        torch._dynamo.reset()
        t = time_fn(casts.refresh, device=device)
        row.update(seconds=t.median_s, iters=t.iters)
    except Exception as exc:   # noqa: BLE001 (a device that cannot cast to fp8 says so)
        row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    torch._dynamo.reset()
    return row


def fp8_rows(shapes: Iterable[GemmShape], device: torch.device, *,
             recipes: Sequence[str] = RUNNABLE_RECIPES,
             cast_shape: tuple[int, int] = (8192, 4096), compiled_casts: bool = False,
             recipe_shapes: int | None = None) -> dict[str, list[dict[str, Any]]]:
    """Every benchmark of this module: {"fp8_gemm": rows, "fp8_cast": rows}. A recipe the
    device or this torch cannot run gives one row with its ``error`` instead of timings.
    ``compiled_casts``: also the compiled casts (CUDA). ``recipe_shapes``: recipes after the
    first are timed on that many of the largest shapes only (the first recipe's rows make
    the efficiency curve; the others say whether and how fast the recipe runs)."""
    shapes = list(shapes)
    gemm_rows: list[dict[str, Any]] = []
    for i, name in enumerate(recipes):
        cut = shapes if i == 0 or recipe_shapes is None else sorted(
            shapes, key=lambda g: g.m * g.k * g.n)[-recipe_shapes:]
        for s in cut:
            if name == "blockwise" and device.type == "cuda" and (s.k % 128 or s.n % 128):
                continue
            try:
                gemm_rows.append(bench_fp8_gemm(s, name, device))
            except Exception as exc:   # noqa: BLE001 (a kernel's refusal is a measurement)
                gemm_rows.append({"recipe": name, "label": s.label, "m": s.m, "k": s.k,
                                  "n": s.n, "error": f"{type(exc).__name__}: "
                                                     f"{str(exc).splitlines()[0]}"})
                break
    casts = bench_fp8_casts(*cast_shape, device)
    if compiled_casts:
        casts += bench_fp8_casts_compiled(*cast_shape, device)
        casts.append(bench_fp8_weight_cast(device))
    return {"fp8_gemm": gemm_rows, "fp8_cast": casts}


def cast_gbps(rows: Iterable[dict[str, Any]]) -> dict[str, float]:
    """Achieved bandwidth per cast kind, GB/s."""
    return {r["op"]: r["bytes"] / r["seconds"] / 1e9 for r in rows}


__all__ = ["linear_calls", "bench_fp8_gemm", "bench_fp8_casts", "bench_fp8_casts_compiled",
           "bench_fp8_weight_cast", "weight_cast_bytes", "WEIGHT_CAST_SHAPE",
           "fp8_rows", "cast_gbps", "cast_bytes", "CAST_BLOCKS", "COMPILED_CAST_BLOCKS",
           "RUNNABLE_RECIPES"]
