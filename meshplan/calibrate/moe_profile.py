"""The MoE profile keys from :mod:`meshplan.calibrate.bench_moe`'s rows (pure Python).

Each key is defined so that the MoE cost model, fed it, reproduces the benchmark's time
(``costmodel/moe_layer.py``, ``costmodel/moe_host.py``):

* ``grouped_gemm_efficiency`` (curve by the whole grouped call's FLOPs, each group's rows
  padded to the grouped kernel's tile: x = 2·G·⌈r/256⌉·256·k·n,
  :mod:`meshplan.hardware_profiles.grouped_gemm`): the cost model charges a call
  x / (peak·eff(x)) forward and twice that backward, so ``eff = 3·x / (peak · t_fwd+bwd)``.
  Outside the measured FLOPs the base profile's dense GEMM curve continues, scaled to meet
  the nearest point. Written with ``grouped_gemm_key = "call"`` (profiles without it were
  keyed by one expert's FLOPs, and are read so).
* ``grouped_fp8_gemm_efficiency``: the same from the fp8 rowwise rows (``precision``), at
  the fp8 peak, continued by the base's dense fp8 curve.
* ``membound_efficiency["moe-permute"]``: the permutation's bytes as the cost model counts
  them (``bench_moe.permute_bytes``, forward; backward twice) over its GPU time (rows timed
  queued behind a spin, ``stream = "queued"``) and the HBM bandwidth:
  ``Σ bytes / (Σ t · hbm_gbps)``, at most ``MAX_EFFICIENCY``. Rows timed in step with the
  host (calibrations before 2026-12-02) read its dispatch, not the bytes: not used.
* ``host_sync_s``: the median of the queued rows (``.item()`` and ``.tolist()`` behind a
  spin: the gap from the end of the queued work to the host's return, launch of the next
  kernel included).
* ``host_op_dispatch_s``: (the tiny MoE layer's CPU wall − its syncs × ``host_sync_s``) over
  the operators ``moe_host.routed_ops`` counts for it; the median over models.

On CPU (no queue: every op runs as it is dispatched) the host keys are not written: the
CPU's wall times are its compute, which the GEMM and memory-bound keys already price.
"""

from __future__ import annotations

import statistics
from typing import Any, Mapping

from meshplan.hardware_profiles.curve_fit import MAX_EFFICIENCY
from meshplan.hardware_profiles.grouped_gemm import grouped_curve, grouped_points
from meshplan.hardware_profiles.gpu import GPUSpec

from meshplan.costmodel.moe_layer import PERMUTE_OP
MOE_ROW_KINDS = ("grouped_gemm", "moe_permute", "host_sync", "host_dispatch")


def moe_keys(rows: Mapping[str, list[dict[str, Any]]], *, peak_flops: float, hbm_gbps: float,
             base: GPUSpec | None, device: str, peak_fp8_flops: float = 0.0
             ) -> dict[str, Any]:
    """The ``[gpu]`` keys the MoE rows measure (module docstring); keys without rows absent."""
    out: dict[str, Any] = {}
    gg = rows.get("grouped_gemm", [])
    g16 = [r for r in gg if r.get("precision", "bf16") == "bf16"]
    g8 = [r for r in gg if r.get("precision") == "rowwise"]
    for part, peak in ((g16, peak_flops), (g8, peak_fp8_flops)):
        for r, (x, eff) in zip((r for r in part if r.get("seconds", 0) > 0),
                               grouped_points(part, peak)):
            r["flops"], r["efficiency"] = x, eff
    grouped = grouped_curve(g16, peak_flops, None if base is None else base.gemm_efficiency)
    if grouped is not None:
        out["grouped_gemm_efficiency"] = grouped.to_list()
        out["grouped_gemm_key"] = "call"
        grouped8 = (grouped_curve(g8, peak_fp8_flops, base.fp8_gemm_efficiency)
                    if base is not None and peak_fp8_flops > 0 else None)
        if grouped8 is not None:
            out["grouped_fp8_gemm_efficiency"] = grouped8.to_list()
    perm = [r for r in rows.get("moe_permute", []) if r.get("seconds", 0) > 0
            and r.get("stream") == ("queued" if device == "cuda" else "cpu")]
    if perm:
        for r in perm:
            r["efficiency"] = r["model_bytes"] / r["seconds"] / 1e9 / hbm_gbps
        eff = sum(r["model_bytes"] for r in perm) / sum(r["seconds"] for r in perm) / 1e9
        out["membound_efficiency"] = {PERMUTE_OP: min(MAX_EFFICIENCY, eff / hbm_gbps)}
    if device != "cuda":
        return out
    queued = [r["seconds"] for r in rows.get("host_sync", []) if r["stream"] == "queued"]
    if queued:
        out["host_sync_s"] = max(0.0, statistics.median(queued))
    per_op = [(r["seconds"] - r["syncs"] * r["sync_s"]) / r["ops"]
              for r in rows.get("host_dispatch", []) if r.get("ops", 0) > 0]
    per_op = [v for v in per_op if v > 0]
    if per_op:
        out["host_op_dispatch_s"] = statistics.median(per_op)
    return out


def add_moe_keys(doc: dict[str, Any], base: GPUSpec | None, device: str) -> list[str]:
    """Write the MoE keys of ``doc["measurements"]``'s MoE rows into a profile document
    (``calibrate.profile.build_profile``'s) and its ``measured`` list; returns the keys.
    ``membound_efficiency`` gains the permutation's entry beside the dense ops'."""
    gpu = doc["gpu"]
    peak = (base.peak_flops("bf16") if base is not None
            else float(gpu["peak_tflops"]["bf16"]) * 1e12)
    peak8 = base.peak_flops("fp8") if base is not None and base.fp8_gemm_efficiency else 0.0
    keys = moe_keys(doc.get("measurements", {}), peak_flops=peak,
                    hbm_gbps=float(gpu["hbm_gbps"]), base=base, device=device,
                    peak_fp8_flops=peak8)
    if "membound_efficiency" in keys:
        keys["membound_efficiency"] = {**gpu.get("membound_efficiency", {}),
                                       **keys["membound_efficiency"]}
    if "grouped_gemm_efficiency" in keys and "grouped_fp8_gemm_efficiency" not in keys:
        gpu.pop("grouped_fp8_gemm_efficiency", None)    # a base profile's, of other rows
    gpu.update(keys)
    # the key says how to read the curve: not a measurement
    names = [k if k != "membound_efficiency" else f"membound_efficiency.{PERMUTE_OP}"
             for k in keys if k != "grouped_gemm_key"]
    doc["measured"] = list(doc.get("measured", [])) + [n for n in names
                                                        if n not in doc.get("measured", [])]
    return names


__all__ = ["moe_keys", "add_moe_keys", "PERMUTE_OP", "MOE_ROW_KINDS"]
