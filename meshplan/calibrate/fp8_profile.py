"""The GPU profile's fp8 keys from :mod:`meshplan.calibrate.bench_fp8`'s rows (pure Python).

Each key is defined so that :mod:`meshplan.costmodel.fp8_cost`, fed the profile, reproduces
the benchmark it came from:

* ``fp8_gemm_efficiency``: a row times the three fp8 GEMMs of a linear (forward, data and
  weight gradient, 2mkn FLOPs each) on pre-cast operands; the cost model charges each
  ``2mkn / (fp8 peak · e(2mkn))``, so ``e(2mkn) = 6mkn / (fp8 peak · t)`` (the bf16
  curve's convention, :func:`meshplan.calibrate.profile.gemm_efficiency`). From the first
  recipe timed (tensorwise), whose scales cost the GEMM least.
* ``fp8_cast_eager_pass_s``, ``fp8_cast_eager_gbps``: the executor's eager fp8 linear
  (forward + backward with its casts) minus its three GEMMs, per row, against the passes
  and bytes :func:`meshplan.costmodel.fp8.linear_cast_traffic` counts for it (fp32 weights,
  as the rows time): the least-squares line ``t = passes · pass_s + bytes / gbps`` through
  the rows of every recipe (:func:`eager_cast_fit`; the datasheet default came from the
  same fit on one H100, data/gpus.toml). A fit with a negative term falls back to the
  bandwidth alone (pass_s = 0).
* ``fp8_cast_eager_gpu_pass_s``, ``fp8_cast_eager_gpu_gbps``, ``fp8_cast_eager_host_pass_s``
  (rows timed on CUDA): the synchronized linear reads max(GPU, CPU) — on the H200 hosts its
  CPU's ~2 ms whatever the shape — so the rows also time it queued: the same line through
  the fp8 linear's GPU-busy time less its GEMMs' (the GPU's part), and the median over rows
  of (fp8 linear's CPU dispatch − bf16 linear's) / passes (the host's), which the cost model
  puts on the CPU's timeline (:func:`eager_cast_split_fit`; costmodel/fp8_cost.py, "Eager
  casts: GPU and host apart").
* ``fp8_cast_compiled_gbps``: Σ bytes / Σ seconds of the compiled cast rows.
* ``fp8_cast_weight_gbps``: the same of the compiled cast of a large stacked fp32 weight to
  its forward and data-gradient layouts (:func:`meshplan.calibrate.bench_fp8.
  bench_fp8_weight_cast`; bytes as ``linear_cast_traffic`` counts a weight's casts), the
  rate :mod:`meshplan.costmodel.fp8_experts` prices fp8 routed experts' weight casts at.
* ``fp8_torch_recipes``: the recipes with at least one timed row (a recipe this torch or
  GPU cannot run leaves one row with its ``error``).
"""

from __future__ import annotations

import statistics
from typing import Any, Iterable, Mapping, Sequence

from meshplan.costmodel.fp8 import linear_cast_traffic

EAGER_WEIGHT_BYTES = 4     # bench_fp8 times the linear on fp32 weights (the executor's ZeRO-0/1)


def fp8_gemm_efficiency_points(rows: Iterable[Mapping[str, Any]], peak_fp8_flops: float,
                               recipe: str = "tensorwise") -> list[tuple[float, float]]:
    """(one GEMM's FLOPs 2mkn, fraction of the fp8 peak) per timed shape of ``recipe``."""
    return sorted((2.0 * r["m"] * r["k"] * r["n"],
                   6.0 * r["m"] * r["k"] * r["n"] / (peak_fp8_flops * r["gemm_seconds"]))
                  for r in rows if r.get("recipe") == recipe and r.get("gemm_seconds"))


def timed_recipes(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """The recipes with at least one timed row, in the order first seen."""
    out: list[str] = []
    for r in rows:
        if "gemm_seconds" in r and r["recipe"] not in out:
            out.append(r["recipe"])
    return out


def _traffic(r: Mapping[str, Any]):
    return linear_cast_traffic(r["m"], r["k"], r["n"], r["recipe"], act_bytes=2,
                               weight_bytes=EAGER_WEIGHT_BYTES)


def eager_cast_fit(rows: Iterable[Mapping[str, Any]], linear: str = "linear_seconds",
                   gemm: str = "gemm_seconds") -> tuple[float, float] | None:
    """(seconds per pass, GB/s) of the eager casts (module docstring), or None without a
    usable row. ``linear``, ``gemm``: the row fields fitted (synchronized by default; the
    queued GPU-busy pair for :func:`eager_cast_split_fit`)."""
    pts = []
    for r in rows:
        if not (r.get(linear) and r.get(gemm)):
            continue
        c = _traffic(r)
        pts.append((float(c.kernels), c.per_microbatch_bytes, max(0.0, r[linear] - r[gemm])))
    if not pts or sum(p[2] for p in pts) <= 0:
        return None
    pass_s, s_per_byte = _least_squares(pts)
    if pass_s < 0 or s_per_byte <= 0:
        bandwidth = sum(p[1] for p in pts) / sum(p[2] for p in pts)
        return 0.0, bandwidth / 1e9
    return pass_s, 1.0 / s_per_byte / 1e9


def eager_cast_split_fit(rows: Iterable[Mapping[str, Any]]
                         ) -> tuple[float, float, float] | None:
    """(GPU seconds per pass, GPU GB/s, host seconds per pass) of the eager casts from the
    rows' queued timings (module docstring), or None without them."""
    rows = [r for r in rows if r.get("linear_gpu_seconds") and r.get("gemm_gpu_seconds")
            and r.get("linear_cpu_seconds") and r.get("bf16_cpu_seconds")]
    gpu = eager_cast_fit(rows, "linear_gpu_seconds", "gemm_gpu_seconds")
    if gpu is None:
        return None
    host = statistics.median(max(0.0, r["linear_cpu_seconds"] - r["bf16_cpu_seconds"])
                             / _traffic(r).kernels for r in rows)
    return gpu[0], gpu[1], host


def _least_squares(pts: Sequence[tuple[float, float, float]]) -> tuple[float, float]:
    """(a, b) minimizing Σ (a·x + b·y − t)² over the points (x, y, t); (−1, 0) if singular."""
    sxx = sum(x * x for x, _, _ in pts)
    syy = sum(y * y for _, y, _ in pts)
    sxy = sum(x * y for x, y, _ in pts)
    sxt = sum(x * t for x, _, t in pts)
    syt = sum(y * t for _, y, t in pts)
    det = sxx * syy - sxy * sxy
    if det <= 1e-12 * sxx * syy:
        return -1.0, 0.0
    return (sxt * syy - syt * sxy) / det, (syt * sxx - sxt * sxy) / det


def weight_cast_gbps(rows: Iterable[Mapping[str, Any]]) -> float | None:
    """Σ bytes / Σ seconds of the stacked weights' compiled cast rows ("weight cast
    compiled"), GB/s (None: none timed)."""
    done = [r for r in rows
            if r.get("op") == "weight cast compiled" and r.get("seconds", 0) > 0]
    if not done:
        return None
    return sum(r["bytes"] for r in done) / sum(r["seconds"] for r in done) / 1e9


def compiled_cast_gbps(rows: Iterable[Mapping[str, Any]]) -> float | None:
    """Σ bytes / Σ seconds of the compiled cast rows, GB/s (None: none timed)."""
    done = [r for r in rows if str(r.get("op", "")).startswith("compiled cast")
            and r.get("seconds", 0) > 0]
    if not done:
        return None
    return sum(r["bytes"] for r in done) / sum(r["seconds"] for r in done) / 1e9


__all__ = ["fp8_gemm_efficiency_points", "timed_recipes", "eager_cast_fit",
           "eager_cast_split_fit",
           "compiled_cast_gbps", "weight_cast_gbps", "EAGER_WEIGHT_BYTES"]
