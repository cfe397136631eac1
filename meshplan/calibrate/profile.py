"""Turn raw microbenchmark timings into a calibrated profile (pure Python, no torch).

Every efficiency is defined so that the cost model, fed the profile, reproduces the
measured time of the benchmark it came from (meshplan/costmodel/compute.py and comm.py):

* GEMM (x[m,k] · W[n,k]ᵀ, forward + data-gradient + weight-gradient): the cost model
  charges ``F / (peak · eff(F))`` forward and twice that backward, F = 2mkn (Narayanan et
  al. 2021, arXiv 2104.04473 §5.1), so ``eff(F) = 3F / (peak · t_fwd+bwd)``.
* Causal flash attention: executed forward FLOPs ``E = 4·b·s²·d·heads / 2`` (masked half
  skipped, Dao 2022, arXiv 2205.14135) and backward = 2.5 × forward, so
  ``eff(E) = 3.5·E / (peak · t_fwd+bwd)``.
* Memory-bound ops: bytes counted as the cost model counts them (norm 2 elements per
  element, residual add 3, activation in+out, optimizer 32 B/param), forward + backward
  (backward moves twice the forward bytes); ``hbm_efficiency = Σbytes / (Σt · hbm_gbps)``.
* fp8 (GPUs with an fp8 peak): the curve, the cast rates and the recipes that ran, from
  :mod:`meshplan.calibrate.bench_fp8`'s rows (:func:`fp8_keys`, definitions in
  :mod:`meshplan.calibrate.fp8_profile`).
* Collectives (ring; Patarasuk & Yuan 2009; NCCL's bus-bandwidth convention,
  nccl-tests/doc/PERFORMANCE.md): all-reduce moves 2(n-1)/n of the buffer in 2(n-1) steps,
  reduce-scatter / all-gather (n-1)/n in n-1 steps, broadcast the whole buffer in n-1
  steps (its own curve, ``nvlink_broadcast_efficiency``; the NVLink curve is read from the
  other three). Latency (alpha-beta with NCCL's split,
  :mod:`meshplan.hardware_profiles.collective_latency`): a 256-byte all-reduce on 2 ranks
  and on the whole node gives ``t(n) = α_base + 2(n-1)·α_step`` (``[cluster]
  collective_base_latency_us``, ``intra_step_latency_us``); a node of 2 GPUs has one group
  size and keeps the old key ``intra_latency_us`` = t(2) / 2 (read as in older profiles).
  ``eff(S) = bus_bytes / ((t - α_base - steps · α_step) · nvlink_gbps)``.

Outside the measured range a curve falls back to the base (datasheet) profile's shape,
scaled to meet the nearest measured point, so there is no jump at the edge.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from meshplan.calibrate import fp8_profile as fp8p
from meshplan.costmodel.compute import FLASH_BACKWARD_FACTOR
from meshplan.errors import ProfileError
from meshplan.hardware_profiles.calibrated import membound_op_efficiency
from meshplan.hardware_profiles.calibrated import SCHEMA, VERSION
from meshplan.hardware_profiles.corrections import builtin_corrections
from meshplan.calibrate.bench_host_comm import host_all_to_all_s, host_comm_op_s
from meshplan.hardware_profiles import collective_latency as lat_model
from meshplan.hardware_profiles.curve_fit import (MAX_EFFICIENCY, extend_with_base,
                                                  merge_points, sig)
from meshplan.hardware_profiles.gpu import GPUSpec

# built-in keys a calibration does not inherit from its base GPU (build_profile)
DATASHEET_ONLY_KEYS = ("grouped_gemm_efficiency", "grouped_gemm_key",
                       "grouped_fp8_gemm_efficiency")


def gemm_efficiency(m: int, k: int, n: int, seconds: float, peak_flops: float) -> float:
    return 3.0 * (2.0 * m * k * n) / (peak_flops * seconds)


def attention_executed_flops(batch: int, seq: int, heads: int, head_dim: int) -> float:
    return 4.0 * batch * seq * seq * head_dim * heads / 2


def attention_efficiency(batch: int, seq: int, heads: int, head_dim: int, seconds: float,
                         peak_flops: float) -> float:
    e = attention_executed_flops(batch, seq, heads, head_dim)
    return (1.0 + FLASH_BACKWARD_FACTOR) * e / (peak_flops * seconds)


def collective_bus_bytes(op: str, group_size: int, nbytes: float) -> tuple[float, int]:
    """(bytes each rank moves, ring steps) of one collective of an ``nbytes`` buffer."""
    return (lat_model.bus_bytes(op, group_size, nbytes),
            lat_model.ring_steps(op, group_size)[0])


def collective_efficiency(op: str, group_size: int, nbytes: float, seconds: float,
                          link_gbps: float, base_latency_s: float, step_latency_s: float
                          ) -> float:
    return lat_model.row_efficiency(op, group_size, nbytes, seconds, link_gbps,
                                    base_latency_s, step_latency_s)


def _median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])



def build_profile(*, measurements: Mapping[str, list[dict[str, Any]]],
                  base: GPUSpec | None, device: str, provenance: Mapping[str, Any],
                  cpu_peak_tflops: float | None = None, cpu_memory_gbps: float | None = None,
                  memory_bytes: int | None = None, precision: str = "bf16",
                  layers: Iterable[Mapping[str, Any]] = (),
                  ends: Iterable[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """The profile document (a dict for :func:`meshplan.calibrate.tomlfile.dumps`).

    ``measurements`` holds the raw rows of each benchmark: ``gemm`` (m, k, n, seconds),
    ``attention`` (batch, seq, heads, head_dim, seconds), ``membound`` (op, model_bytes,
    seconds), ``collectives`` (op, group_size, nbytes, seconds), ``latency`` (group_size,
    seconds), ``overheads`` (kind, seconds), ``pipeline`` (kind "pipeline_action_s", seconds).
    ``layers`` / ``ends``: rows of :class:`meshplan.costmodel.measured.MeasuredLayer` /
    ``MeasuredEnd`` (layer-level benchmarks), written as top-level ``[[layers]]`` /
    ``[[ends]]``. The ``[gpu]`` table also gets ``pipeline_action_s`` (the pipeline row) and
    ``optimizer_gbps`` (bytes the cost model counts for the "adamw" membound row over its
    seconds) when they were measured. On CPU there is no datasheet: ``base`` is None
    and the peak (``cpu_peak_tflops``, a measured matmul peak) and memory bandwidth
    (``cpu_memory_gbps``, a measured copy) stand in for it.
    """
    measured: list[str] = []
    rows = {k: list(v) for k, v in measurements.items()}
    if base is None:
        if not (cpu_peak_tflops and cpu_memory_gbps and memory_bytes):
            raise ProfileError("a profile without a base GPU needs the measured peak, memory "
                               "bandwidth and memory size")
        peak_tflops = {"bf16": cpu_peak_tflops, "fp16": cpu_peak_tflops, "fp32": cpu_peak_tflops}
        hbm_gbps, link_gbps = float(cpu_memory_gbps), None
        measured += ["peak_tflops", "hbm_gbps", "memory_bytes"]
    else:
        peak_tflops = dict(base.peak_tflops)
        hbm_gbps, link_gbps = base.hbm_gbps, base.nvlink_gbps
    peak = float(peak_tflops[precision if precision in peak_tflops else "bf16"]) * 1e12
    if base is not None:
        peak = base.peak_flops(precision)

    gpu: dict[str, Any] = {}
    # the GPU-alone rows (queued behind a spin kernel) are kept with their efficiencies under
    # [measurements], with no [gpu] key: priced, they made held-out steps worse
    # (docs/benchmarks/fp8_checks.md, fp8h48), and so did reading them in the ratio that
    # carries another shape's rows (moe_checks.md, moeh70h100); benchmarks read them
    for r in rows.get("gemm", []) + rows.get("gemm_alone", []):
        r["flops"] = 2.0 * r["m"] * r["k"] * r["n"]
        r["efficiency"] = gemm_efficiency(r["m"], r["k"], r["n"], r["seconds"], peak)
    if rows.get("gemm"):
        pts = merge_points((r["flops"], r["efficiency"]) for r in rows["gemm"])
        gpu["gemm_efficiency"] = extend_with_base(pts, base and base.gemm_efficiency).to_list()
        measured.append("gemm_efficiency")
    for r in rows.get("attention", []) + rows.get("attention_alone", []):
        r["executed_flops"] = attention_executed_flops(r["batch"], r["seq"], r["heads"],
                                                       r["head_dim"])
        r["efficiency"] = attention_efficiency(r["batch"], r["seq"], r["heads"], r["head_dim"],
                                               r["seconds"], peak)
    if rows.get("attention"):
        pts = merge_points((r["executed_flops"], r["efficiency"]) for r in rows["attention"])
        gpu["attention_efficiency"] = extend_with_base(
            pts, base and base.attention_efficiency).to_list()
        measured.append("attention_efficiency")
    mb = rows.get("membound", [])
    for r in mb:
        r["achieved_gbps"] = r["model_bytes"] / r["seconds"] / 1e9
        r["efficiency"] = r["achieved_gbps"] / hbm_gbps
    if mb:
        eff = sum(r["model_bytes"] for r in mb) / sum(r["seconds"] for r in mb) / 1e9 / hbm_gbps
        gpu["hbm_efficiency"] = min(MAX_EFFICIENCY, eff)
        measured.append("hbm_efficiency")
        ops = membound_op_efficiency(mb, MAX_EFFICIENCY)
        if ops:
            gpu["membound_efficiency"] = ops
            measured.append("membound_efficiency")

    cluster: dict[str, Any] = {}
    base_s, step_s = latency_keys(rows.get("latency", []), cluster, measured)
    coll = [r for r in rows.get("collectives", []) if r["op"] in lat_model.CURVE_OPS]
    if coll:
        if link_gbps is None:  # CPU/gloo: the best bus bandwidth seen stands in for the link
            link_gbps = max(collective_bus_bytes(r["op"], r["group_size"], r["nbytes"])[0]
                            / r["seconds"] / 1e9 for r in coll)
            measured.append("nvlink_gbps")
        for r in rows.get("collectives", []):
            r["busbw_gbps"] = (collective_bus_bytes(r["op"], r["group_size"], r["nbytes"])[0]
                               / r["seconds"] / 1e9)
            r["efficiency"] = collective_efficiency(r["op"], r["group_size"], r["nbytes"],
                                                    r["seconds"], link_gbps, base_s, step_s)
        # p2p is kept out: the cost model has one NVLink curve for collectives and p2p,
        # and pipeline p2p reaches a different fraction of the link (see docs/calibrate.md).
        curve = lat_model.nvlink_curve(coll, link_gbps, base_s, step_s,
                                       base and base.nvlink_efficiency)
        if curve is not None:
            gpu["nvlink_efficiency"] = curve.to_list()
            measured.append("nvlink_efficiency")
        # broadcasts get their own curve: a ring broadcast reaches more of the link than
        # the all-reduce/all-gather rows do (torch's ZeRO-1 parameter sync is broadcasts)
        bcast = lat_model.broadcast_curve(rows.get("collectives", []), link_gbps, base_s,
                                          step_s, base and base.nvlink_efficiency)
        if bcast is not None:
            gpu["nvlink_broadcast_efficiency"] = bcast.to_list()
            measured.append("nvlink_broadcast_efficiency")
        # and all-to-alls theirs: every pair at once through NVSwitch, not a ring
        a2a = lat_model.all_to_all_curve(rows.get("collectives", []), link_gbps, base_s,
                                         step_s, base and base.nvlink_efficiency)
        if a2a is not None:
            gpu["nvlink_all_to_all_efficiency"] = a2a.to_list()
            measured.append("nvlink_all_to_all_efficiency")
    for key, per_call in (("host_comm_op_s", host_comm_op_s),
                          ("host_all_to_all_s", host_all_to_all_s)):
        value = per_call(rows.get("host_comm", []))
        if value is not None:
            gpu[key] = value
            measured.append(key)
    for kind in ("layer_overhead_s", "microbatch_overhead_s"):
        vals = [r["seconds"] for r in rows.get("overheads", []) if r["kind"] == kind]
        if vals:
            gpu[kind] = max(0.0, _median(vals))
            measured.append(kind)
    pipe = [r["seconds"] for r in rows.get("pipeline", []) if r["kind"] == "pipeline_action_s"]
    if pipe:
        gpu["pipeline_action_s"] = max(0.0, _median(pipe))
        measured.append("pipeline_action_s")
    lap = [r["value"] for r in rows.get("overlap", []) if r["kind"] == "overlap_interference"]
    if lap:
        gpu["overlap_interference"] = min(2.0, max(0.0, _median(lap)))
        measured.append("overlap_interference")
    ddp = [r["value"] for r in rows.get("overlap", []) if r["kind"] == "ddp_overlap_interference"]
    if ddp:
        gpu["ddp_overlap_interference"] = min(2.0, max(0.0, _median(ddp)))
        measured.append("ddp_overlap_interference")
    adamw = [r for r in mb if r["op"] == "adamw" and r["seconds"] > 0]
    if adamw:
        gpu["optimizer_gbps"] = _median([r["model_bytes"] / r["seconds"] / 1e9 for r in adamw])
        measured.append("optimizer_gbps")
    if base is not None and base.peak_tflops.get("fp8"):
        gpu.update(fp8_keys(rows, base, measured))

    if base is not None:
        full = base.to_dict()
        # a datasheet's grouped curves are derated like its dense ones (data/gpus.toml); a
        # calibration's own GEMM curves are not, so its profile keeps only the grouped
        # curves it timed (in ``gpu``), else it prices the experts as before they existed
        for key in DATASHEET_ONLY_KEYS:
            full.pop(key, None)
        name, base_name = base.name, base.name
    else:
        name, base_name = "cpu", ""
        full = {"peak_tflops": peak_tflops, "memory_bytes": int(memory_bytes),
                "hbm_gbps": hbm_gbps,
                # no NVLink on a CPU: placeholders, marked unmeasured unless gloo was timed
                "nvlink_gbps": link_gbps or hbm_gbps,
                "gemm_efficiency": [[1e9, 0.5]], "attention_efficiency": [[1e9, 0.5]],
                "hbm_efficiency": 0.5, "nvlink_efficiency": [[1e6, 0.5]],
                "layer_overhead_s": 0.0, "microbatch_overhead_s": 0.0}
    full.update(gpu)
    if link_gbps is not None:
        full["nvlink_gbps"] = link_gbps
    full["peak_tflops"] = peak_tflops
    prov = dict(provenance)
    full["provenance"] = (f"calibrated on {prov.get('machine', '?')} ({prov.get('gpu_name', device)})"
                          f" {prov.get('date', '')}, torch {prov.get('torch', '?')}")
    full.pop("name", None)
    gpu_table = {"name": name, "base": base_name, **full}
    doc: dict[str, Any] = {"schema": SCHEMA, "version": VERSION, "measured": measured,
                           "provenance": prov, "gpu": gpu_table}
    if cluster:
        doc["cluster"] = cluster
    doc["corrections"] = correction_table(base)
    doc["measurements"] = {k: v for k, v in rows.items() if v}
    layer_rows, end_rows = [dict(r) for r in layers], [dict(r) for r in ends]
    if layer_rows:
        doc["layers"] = layer_rows
        measured.append("layers")
    if end_rows:
        doc["ends"] = end_rows
        measured.append("ends")
    return doc


def latency_keys(lat_rows: list[dict[str, Any]], cluster: dict[str, Any],
                 measured: list[str]) -> tuple[float, float]:
    """The ``[cluster]`` latency keys of the small all-reduce probes (``group_size``,
    ``seconds``), added to ``cluster`` and ``measured``; returns (α_base s, α_step s) for
    reading the collective rows. Two or more group sizes split the two terms
    (:func:`~meshplan.hardware_profiles.collective_latency.split_latency`); one group size
    (a node of 2 GPUs) cannot, and keeps the old key, half the 2-rank probe, which
    ``apply_profile`` reads with the cluster's datasheet step (docs/calibrate.md)."""
    if not lat_rows:
        return 0.0, 0.0
    split = lat_model.split_latency((r["group_size"], r["seconds"]) for r in lat_rows)
    if split is not None:
        base_s, step_s = split
        cluster["collective_base_latency_us"] = sig(base_s * 1e6)
        cluster["intra_step_latency_us"] = sig(step_s * 1e6)
        measured += ["collective_base_latency_us", "intra_step_latency_us"]
        return split
    # one group size: its whole time is charged as α_base when reading the rows (on 2
    # ranks α_base + 2 α_step is exactly what was timed)
    probe_s = _median([r["seconds"] for r in lat_rows])
    n = int(lat_rows[0]["group_size"])
    cluster["intra_latency_us"] = sig(probe_s / lat_model.ring_steps("all_reduce", n)[0] * 1e6)
    measured.append("intra_latency_us")
    return probe_s, 0.0


def fp8_keys(rows: Mapping[str, list[dict[str, Any]]], base: GPUSpec,
             measured: list[str]) -> dict[str, Any]:
    """The ``[gpu]`` fp8 keys the ``fp8_gemm`` / ``fp8_cast`` rows measure (definitions:
    :mod:`meshplan.calibrate.fp8_profile`), each appended to ``measured``; keys without rows
    stay the base profile's."""
    gemm, casts = rows.get("fp8_gemm", []), rows.get("fp8_cast", [])
    out: dict[str, Any] = {}
    recipes = fp8p.timed_recipes(gemm)
    if recipes:
        pts = merge_points(fp8p.fp8_gemm_efficiency_points(gemm, base.peak_flops("fp8"),
                                                           recipes[0]))
        out["fp8_gemm_efficiency"] = extend_with_base(pts, base.fp8_gemm_efficiency).to_list()
        out["fp8_torch_recipes"] = recipes
    fit = fp8p.eager_cast_fit(gemm)
    if fit is not None:
        out["fp8_cast_eager_pass_s"], out["fp8_cast_eager_gbps"] = fit
    split = fp8p.eager_cast_split_fit(gemm)
    if split is not None:
        (out["fp8_cast_eager_gpu_pass_s"], out["fp8_cast_eager_gpu_gbps"],
         out["fp8_cast_eager_host_pass_s"]) = split
    compiled = fp8p.compiled_cast_gbps(casts)
    if compiled is not None:
        out["fp8_cast_compiled_gbps"] = compiled
    weights = fp8p.weight_cast_gbps(casts)
    if weights is not None:
        out["fp8_cast_weight_gbps"] = weights
    measured += list(out)
    return out


def correction_table(base: GPUSpec | None) -> dict[str, Any]:
    """The profile's ``[corrections]`` table: the numbers of the cost model's named
    corrections (:mod:`meshplan.costmodel.corrections`). No benchmark of this calibration
    measures them yet, so they are the base profile's (the built-in defaults, with the
    machine and date of each in ``hardware_profiles/data/corrections.toml``), marked as
    such; the zero-bubble full-recompute sets are measured per model shape instead, as the
    layer rows' ``wgrad_*_bytes`` (``--model``), which the cost model prefers. docs/calibrate.md
    says which key comes from where."""
    numbers = base.corrections if base is not None else builtin_corrections()
    table = numbers.to_table()
    table["source"] = (f"not measured by this calibration: {numbers.source or 'built-in defaults'}"
                       if "not measured" not in numbers.source else numbers.source)
    return table


__all__ = ["build_profile", "correction_table", "fp8_keys", "latency_keys", "merge_points", "extend_with_base", "gemm_efficiency",
           "attention_efficiency", "collective_efficiency", "collective_bus_bytes",
           "attention_executed_flops"]
