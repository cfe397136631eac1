"""Calibrated GPU profiles: TOML files written by ``meshplan calibrate``.

A profile is a complete GPU table (the format of ``data/gpus.toml``, read by
:func:`meshplan.hardware_profiles.loader.gpu_from_table`) whose efficiency curves and fixed
overheads were measured on a machine, plus where and how they were measured::

    schema = "meshplan.profile"
    version = 1
    [provenance]            # machine, date, device, gpu_name, torch, cuda, nccl, ...
    [gpu]                   # name, base, peak_tflops, ..., gemm_efficiency, ... (measured)
    measured = [...]        # which [gpu] / [cluster] keys were measured (rest: base profile)
    [cluster]               # optional, if measured: collective_base_latency_us and
                            # intra_step_latency_us (or, older profiles and 2-GPU nodes,
                            # intra_latency_us: half the 2-rank probe), network_efficiency
    [[layers]] / [[ends]]   # measured executor layers (meshplan.costmodel.measured), optional
    [corrections]           # numbers of the cost model's corrections (optional; missing keys:
                            # the built-in defaults, hardware_profiles/data/corrections.toml)
    [[measurements.gemm]]   # the raw points, for inspection; not read by the cost model

:func:`apply_profile` returns a copy of a cluster that uses the profile's GPU (and measured
cluster-level values). A profile measured on another GPU type than the cluster's raises
:class:`~meshplan.errors.ProfileError` unless ``override=True``.
"""

from __future__ import annotations

import re
import statistics
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from meshplan.errors import MeshplanWarning, ProfileError, closest_names
from meshplan.hardware_profiles.cluster import Cluster
from meshplan.hardware_profiles.collective_latency import (all_to_all_curve, broadcast_curve,
                                                           legacy_split,
                                                           nvlink_curve)
from meshplan.hardware_profiles.corrections import corrections_from_table
from meshplan.hardware_profiles.curve import Curve
from meshplan.hardware_profiles.gpu import FP8_CAST_KEYS, HOST_KEYS, GPUSpec
from meshplan.hardware_profiles.loader import (_NUM, builtin_gpu, builtin_gpu_names,
                                               efficiency_curve, get, gpu_from_table,
                                               read_toml)
from meshplan.hardware_profiles.stale_rows import warn_defective_compiled_rows, without_stale_rows

SCHEMA = "meshplan.profile"
# 2: CUDA layer rows count their input once (version 1 counted it twice; read_profile
# corrects them, see _v1_layer_row)
VERSION = 2
READABLE_VERSIONS = (1, 2)
_GPU_KEYS = ("peak_tflops", "memory_bytes", "hbm_gbps", "nvlink_gbps", "gemm_efficiency",
             "attention_efficiency", "hbm_efficiency", "nvlink_efficiency", "provenance",
             "layer_overhead_s", "microbatch_overhead_s", "pipeline_action_s", "optimizer_gbps",
             "overlap_interference", "ddp_overlap_interference", "membound_efficiency",
             "fp8_gemm_efficiency",
             *FP8_CAST_KEYS, "fp8_torch_recipes", "grouped_gemm_efficiency",
             "grouped_gemm_key", "grouped_fp8_gemm_efficiency",
             "moe_permute_efficiency_by_top_k", *HOST_KEYS,
             "nvlink_broadcast_efficiency", "nvlink_all_to_all_efficiency",
             "microbench_timing", "compiled_full_rerun_share")
# [gpu] keys calibrate writes (its base GPU's to_dict) that load_profile does not read: the
# head-dim ratios come from the base GPU, referred to the head dim the calibration timed
# (with_base_attention_head_dims)
_GPU_KEYS_NOT_READ = ("attention_head_dim", "attention_head_dim_ratio",
                      # the datasheet's per-family shares are the base GPU's, and the
                      # profile's own share's family is read off its rows (with_base_fp8,
                      # block_share_family)
                      "fp8_cast_compiled_block_share_family",
                      "fp8_cast_compiled_block_share_by_family",
                      # GPU-alone curves one calibration wrote (2026-12-04, fp8h48 / fp8h49)
                      # while they were priced; their rows stay under [measurements]
                      "gemm_efficiency_alone", "attention_efficiency_alone")


@dataclass(frozen=True, kw_only=True)
class CalibratedProfile:
    """A profile file, parsed. ``base_gpu`` is the built-in GPU it extends (None for CPU)."""

    path: str
    gpu: GPUSpec
    base_gpu: str | None
    provenance: Mapping[str, Any] = field(default_factory=dict)
    measured: tuple[str, ...] = ()
    intra_latency_us: float | None = None            # old key: half the 2-rank probe
    collective_base_latency_us: float | None = None
    intra_step_latency_us: float | None = None
    network_efficiency: Curve | None = None
    # the stored collective rows (op, group_size, nbytes, seconds), for re-reading the
    # NVLink curve of a profile with the old latency key (apply_profile)
    collective_rows: tuple[Mapping[str, Any], ...] = ()

    @property
    def device_name(self) -> str:
        return str(self.provenance.get("gpu_name") or self.provenance.get("device") or "?")


LAYER_ROW_BLOCKS = 2   # the blocks a CUDA layer row was timed on (bench_layers.LAYERS_CUDA)


def _v1_layer_row(row: Any) -> Any:
    """A version-1 CUDA layer row with its activation bytes as version 2 measures them.

    Version 1 read ``activation_bytes`` of ZeRO-0 rows from a second forward of a *fresh*
    input (``layer_timing._kept_bytes``), which already holds that input, and then added the
    input once more: every such row counted ``input / L`` bytes too many per layer (half an
    input at L = 2 blocks; a third of a full-recompute row, whose real cost is the input).
    Rows of other ZeRO stages were read around a persistent input and are right, and so
    were all rows of calibrations older than that second-forward reading, which came in
    together with the queued CPU timing: a row without ``forward_cpu_s`` is left alone (a
    version-1 calibration on a torch without ``torch.cuda._sleep`` is the one case this
    misses)."""
    if not isinstance(row, dict) or row.get("zero", 0) != 0:
        return row
    cpu = row.get("forward_cpu_s", 0.0)
    if not isinstance(cpu, (int, float)) or cpu <= 0:
        return row
    m = re.match(r"h(\d+)-", str(row.get("shape", "")))
    needed = ("micro_batch", "seq_len", "tp", "activation_bytes")
    if m is None or not all(isinstance(row.get(k), (int, float)) for k in needed):
        return row             # malformed: tables_from_rows reports it
    tp = int(row["tp"]) or 1
    seq = row["seq_len"] // tp if row.get("sequence_parallel") else row["seq_len"]
    input_bytes = row["micro_batch"] * seq * int(m[1]) * 2          # bf16 on CUDA
    blocks = row.get("split_layers") or LAYER_ROW_BLOCKS
    return {**row, "activation_bytes": max(0.0, row["activation_bytes"] - input_bytes / blocks)}


def pool_cpu_fixed(rows: list, blocks: int = LAYER_ROW_BLOCKS) -> list:
    """Layer rows with one per-call CPU part per layer shape: the median of the rows' own.

    Calibration splits each setting's CPU dispatch of a ``blocks``-block call, per layer
    ``p``, into a per-call part ``F`` and a per-layer rest ``p − F/blocks``, fitted from that
    setting's 2- and 4-block timings alone (``bench_layers.cpu_fixed``). Each fit is a
    difference of two noisy CPU timings, read once per calibration round: on 4 × H100
    (round 8) the per-call parts of one model's settings range over 0-3.1 ms, while the
    call's work they stand for (the block-stack wrapper, the autograd engine's entry, the
    checkpoint and SP/tp module hooks of the call) varies far less between settings. A
    24-layer stage multiplies the per-layer rest's error by 24, so the per-call part is taken
    as the median over all rows of the same shape (and compiled or not), and each row's
    per-layer rest re-derived so that the ``blocks``-block call it was timed on costs what
    was measured (``p`` unchanged). Post hoc on five measured sets (two machine types),
    step-time mean error 1.70→1.42, 3.86→2.55, 3.38→3.24, 11.03→10.74 and 6.92→4.50 %
    (docs/benchmarks/accuracy.md, round 8). Rows without a CPU dispatch time are left alone.

    Where the pooled part exceeds a row's whole ``blocks``-block call it cannot be that
    row's per-call cost, and the row keeps its own split. Capping the part at the call
    instead would leave such a row no per-layer CPU, and its host bound would stop growing
    with the stage's depth: moeh67h100's compiled recompute-none rows, whose backward part
    (2.9 ms) was pooled with full recomputation's (10.6 ms), priced 20 % fast so. Over the
    committed profiles 3 of 900 compiled rows and no eager one are such rows (2026-12-05);
    the post hoc effect is in docs/benchmarks/moe_checks.md, "A row whose per-layer CPU
    pooled to 0 ...".
    """
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        cpu = r.get("forward_cpu_s", 0.0) if isinstance(r, dict) else 0.0
        # malformed rows stay as written, so that tables_from_rows names the user's value
        if isinstance(cpu, (int, float)) and cpu > 0 and all(
                isinstance(r.get(k, 0.0), (int, float)) and r.get(k, 0.0) >= 0
                for k in ("backward_cpu_s", "forward_cpu_fixed_s", "backward_cpu_fixed_s")):
            # compiled rows dispatch other code (fused kernels): pooled apart from eager ones
            # (and fp8 rows, their casts, apart from bf16 ones)
            groups.setdefault((str(r.get("shape", "")), r.get("compile") is True,
                               str(r.get("precision", "bf16"))), []).append(r)
    pooled: dict[int, dict] = {}
    for members in groups.values():
        for per_layer, fixed in (("forward_cpu_s", "forward_cpu_fixed_s"),
                                 ("backward_cpu_s", "backward_cpu_fixed_s")):
            f = statistics.median(r.get(fixed, 0.0) for r in members)
            for r in members:
                p = r.get(per_layer, 0.0) + r.get(fixed, 0.0) / blocks
                out = pooled.setdefault(id(r), dict(r))
                if f > blocks * p:
                    # the shape's pooled part exceeds this row's whole timed call, so it is
                    # not this row's per-call cost: the row keeps its own split
                    continue
                out[per_layer], out[fixed] = p - f / blocks, f
    return [pooled.get(id(r), r) for r in rows]


SPLIT_DEPTH_FIELDS = ("backward_input_depth_s", "backward_weight_depth_s")


def drop_split_depth(row: Any) -> Any:
    """A GPU layer row without its zero-bubble split backward's growth with stage depth.

    Calibration times B and W on a 2- and a deeper stack and stores each setting's growth
    per extra layer (``bench_layers.split_depth``), which the cost model would extend to
    the stage's depth (:func:`meshplan.costmodel.measured.split_backward_at`, up to 22
    extra layers). On one CPU thread the growth is real (tiny Llama blocks, W per layer
    0.47 ms on 2 blocks, 1.03 ms on 12; docs/benchmarks/calibration_checks.md). On the GPUs it is a
    difference of two noisy timings: over the six calibrations of rounds 4-9 single rows range from
    −2.2 to +1.0 ms per layer, around per-model medians of −0.06 to −0.02 ms (B) and −0.01
    to +0.16 ms (W), and the held-out zero-bubble layouts came out better without it in
    rounds 4, 5 and 9 — post hoc on the eight measured sets, the twelve zero-bubble layouts'
    mean absolute step-time error went 12.2 → 7.2 % (round 9's s07: −42 → −10 %), and the
    per-model median growth (clamped at 0) instead of none was worse on five of the eight
    sets (docs/benchmarks/accuracy.md, round 9). So CUDA rows load with no growth; the
    fields stay in the file."""
    if not isinstance(row, dict) or not any(
            isinstance(row.get(k), (int, float)) and row.get(k) != 0 for k in SPLIT_DEPTH_FIELDS):
        return row
    return {**row, **{k: 0.0 for k in SPLIT_DEPTH_FIELDS if k in row}}


SPLIT_CPU_OVER_SYNC_MAX = 3.0   # bound_split_cpu: beyond this, a timing is not a dispatch


def bound_split_cpu(row: Any) -> Any:
    """A layer row whose split-backward CPU times are not far above their synchronized ones.

    Where zero-bubble's split backward was timed queued (``--split-timing queued``), the row
    keeps B's and W's synchronized timing on the same stack (``backward_*_sync_s``). That
    timing ends after the call's last kernel ran, so it should bound the CPU's dispatch of
    the call. In practice the queued CPU time exceeds it by up to 1.6 × (tp = 1) and 2.5 ×
    (tp = 4) in rounds 5-8, timing spread that the measured layouts bear out (round 8: capping
    those at the bound moved holdout5's h07 from +15 to −3 % but holdout7's p07 from −1 to
    −10 %), so those are kept. Far beyond it the timing measured something else: Llama-1.64B
    at tp 2-4 with sequence parallelism and full recomputation timed W's dispatch at
    0.58-0.63 s per layer against 14-34 ms synchronized (25-45 ×), in both 4-GPU
    calibrations (rounds 7 and 8), which priced those zero-bubble layouts at 115-122 s a
    step. A field more than :data:`SPLIT_CPU_OVER_SYNC_MAX` times its synchronized timing is
    lowered to it; rows without synchronized timings are left alone."""
    if not isinstance(row, dict):
        return row
    out = row
    for cpu, sync in (("backward_input_cpu_s", "backward_input_sync_s"),
                      ("backward_weight_cpu_s", "backward_weight_sync_s")):
        c, b = row.get(cpu, 0.0), row.get(sync, 0.0)
        if isinstance(c, (int, float)) and isinstance(b, (int, float)) \
                and 0 < b * SPLIT_CPU_OVER_SYNC_MAX < c:
            out = {**out, cpu: b}
    return out


MEMBOUND_OPS = ("layernorm", "rmsnorm", "residual-add", "gelu", "swiglu", "rope")


def membound_op_efficiency(rows: Iterable[Mapping[str, Any]], cap: float = 1.0
                           ) -> dict[str, float]:
    """Each executor memory-bound op's own efficiency from its benchmark row (bytes as the
    cost model counts them over its time and the datasheet bandwidth, at most ``cap``): the
    cost model prices a layer's norms, residual adds and activation each at its own
    (:meth:`meshplan.hardware_profiles.gpu.GPUSpec.op_hbm_efficiency`). The pooled
    ``hbm_efficiency`` averages them: on 4 × H200 (round 26) it was 0.26 where LayerNorm ran
    at 0.35, GELU 0.69 and the residual add 0.87 but the executor's fp32 RMSNorm at 0.058 and
    SwiGLU at 0.24, so it over-priced GPT-style layers and under-priced Llama-style ones.
    Profiles written before the table existed carry the rows only in
    ``[[measurements.membound]]``: :func:`load_profile` derives it from them."""
    out = {}
    for r in rows:
        if r.get("op") in MEMBOUND_OPS and r.get("seconds", 0) > 0 and "efficiency" in r:
            out[str(r["op"])] = min(cap, float(r["efficiency"]))
    return out


def with_base_fp8(gpu: GPUSpec, base: str | None) -> GPUSpec:
    """``gpu`` with the fp8 keys its profile lacks taken from the built-in base GPU.

    Profiles from calibrations without fp8 rows (GPUs of compute capability < 8.9, or
    written before calibrate timed fp8) carry no fp8 curve or cast keys; the base GPU's
    datasheet defaults (data/gpus.toml, each with its source) then stand, as they do for
    every other key a calibration does not measure."""
    if not base or base not in builtin_gpu_names():
        return gpu
    ref = builtin_gpu(base)
    changes: dict[str, Any] = {}
    if gpu.fp8_gemm_efficiency is None and ref.fp8_gemm_efficiency is not None:
        changes["fp8_gemm_efficiency"] = ref.fp8_gemm_efficiency
    # the host keys likewise (profiles written before calibrate measured them)
    for k in FP8_CAST_KEYS + HOST_KEYS:
        if getattr(gpu, k) <= 0 < getattr(ref, k):
            changes[k] = getattr(ref, k)
    if not gpu.fp8_torch_recipes and ref.fp8_torch_recipes:
        changes["fp8_torch_recipes"] = ref.fp8_torch_recipes
    if ref.fp8_cast_compiled_block_share_by_family:
        changes["fp8_cast_compiled_block_share_by_family"] = (
            ref.fp8_cast_compiled_block_share_by_family)
    return replace(gpu, **changes) if changes else gpu


def block_share_family(gpu: GPUSpec, layers: Iterable[Mapping[str, Any]],
                       measured: Sequence[str]) -> GPUSpec:
    """``gpu`` with ``fp8_cast_compiled_block_share_family`` set to the family
    (:func:`~meshplan.hardware_profiles.measured_rows.cast_family`) of the compiled fp8
    layer rows its measured share was fitted on (``meshplan calibrate --fp8-rows``:
    :mod:`meshplan.calibrate.fp8_block_share`), where they are all of one family; unchanged
    where the share was not measured (the base GPU's) or its rows span several families."""
    if "fp8_cast_compiled_block_share" not in measured:
        return gpu
    from meshplan.hardware_profiles.measured_rows import cast_family, model_from_shape_key
    fams = set()
    for r in layers:
        if r.get("compile") is True and r.get("precision") == "fp8":
            m = model_from_shape_key(str(r.get("shape", "")))
            if m is not None:
                fams.add(cast_family(m))
    return replace(gpu, fp8_cast_compiled_block_share_family=fams.pop()) if len(
        fams) == 1 else gpu


def with_rerun_share(gpu: GPUSpec, layers: Iterable[Mapping[str, Any]],
                     base: str | None) -> GPUSpec:
    """``gpu`` with ``compiled_full_rerun_share`` read off its compiled bf16 rows: for each
    dense layer timed compiled at recompute none and full (same shape, sequence, micro-batch
    and ZeRO stage; tp 1, no ZeRO-2/3), (backward at full − backward at none) / forward at
    none — what the full-recompute block's backward re-runs — and their median. Without such
    a pair, the value its table holds, else the built-in base GPU's (data/gpus.toml).

    Why a measurement: the executor's compiled block is checkpointed whole, and Inductor's
    min-cut partitioner (Ansel et al. 2024, "PyTorch 2", ASPLOS, §4) saves some forward
    outputs rather than recompute them, so the backward re-runs less than the forward. The
    15 dense H200 profiles of fp8h1-fp8h22 read 0.67-0.85 (median 0.74; eager rows 0.78-1.0);
    MoE blocks 0.73-0.94 (not read here: their routed part is priced apart)."""
    from meshplan.hardware_profiles.measured_rows import model_from_shape_key
    idx: dict[tuple, Mapping[str, Any]] = {}
    for r in layers:
        if (r.get("compile") is True and r.get("precision", "bf16") == "bf16"
                and r.get("ep", 1) == 1 and r.get("tp") == 1 and r.get("zero", 0) < 2):
            m = model_from_shape_key(str(r.get("shape", "")))
            if m is not None and not m.is_moe:
                idx[(r.get("shape"), r.get("seq_len"), r.get("micro_batch"), r.get("zero", 0),
                     r.get("recompute"))] = r
    shares = []
    for (shape, seq, mb, zero, mode), r in idx.items():
        none = idx.get((shape, seq, mb, zero, "none"))
        if mode == "full" and none is not None and none.get("forward_s", 0) > 0:
            shares.append((r.get("backward_s", 0.0) - none.get("backward_s", 0.0))
                          / none["forward_s"])
    if shares:
        share = min(1.0, max(0.0, statistics.median(shares)))
        return replace(gpu, compiled_full_rerun_share=share)
    if gpu.compiled_full_rerun_share <= 0 and base and base in builtin_gpu_names():
        return replace(gpu, compiled_full_rerun_share=builtin_gpu(base).compiled_full_rerun_share)
    return gpu


def with_base_attention_head_dims(gpu: GPUSpec, base: str | None,
                                  timed_head_dims: Iterable[int], curve_timed: bool) -> GPUSpec:
    """``gpu`` with its base GPU's published head-dim ratios of attention efficiency
    (:meth:`GPUSpec.attention_efficiency_at`), referred to the head dim its curve describes.

    A calibration times attention at its models' head dims (``[[measurements.attention]]``);
    a model of another head dim runs the same kernel at another efficiency (cuDNN at head
    dim 64 reaches 0.82 of head dim 128's at 16k tokens on H100: Shah et al. 2024, Figures
    5-6, ``attention_kernels.toml``). One timed head dim M: ratio(d) / ratio(M) at every
    point of the base's ratio curves, so M reads its own curve and d its published share of
    it. No attention timed (``curve_timed`` False): the curve is the base's, and so are its
    ratios. Several head dims pooled in one curve: no ratio (one curve for every head dim,
    as before 2026-12-03).

    Measured: the H200 profiles' own timings at 1e12 forward FLOPs put head dims 64 / 80 /
    96 at 0.79 / 0.68 / 0.77 of 128's (the published ratios 0.83 / 0.71 / 0.81). POST HOC
    over 44 1-GPU checks the planning profiles' mean step error 5.70 → 5.73 % (better on 4,
    worse on 3); held out on fp8h35 (a head-dim-128 model from a head-dim-64 calibration,
    rule fixed before the run): 13.3 → 9.7 % (docs/benchmarks/fp8_checks.md)."""
    if not base or base not in builtin_gpu_names():
        return gpu
    ref = builtin_gpu(base)
    if not ref.attention_head_dim_ratio:
        return gpu
    if not curve_timed:
        return replace(gpu, attention_head_dim=ref.attention_head_dim,
                       attention_head_dim_ratio=ref.attention_head_dim_ratio)
    dims = set(timed_head_dims)
    if len(dims) != 1:
        return gpu
    (m,) = dims
    xs = sorted({x for _, c in ref.attention_head_dim_ratio for x, _ in c.points})
    published = {ref.attention_head_dim, *(d for d, _ in ref.attention_head_dim_ratio)}
    ratios = tuple((d, Curve(tuple((x, ref.attention_head_dim_factor(x, d)
                                    / ref.attention_head_dim_factor(x, m)) for x in xs)))
                   for d in sorted(published - {m}))
    return replace(gpu, attention_head_dim=m, attention_head_dim_ratio=ratios)


def load_profile(path: str | Path, *, keep_stale_rows: bool = False) -> CalibratedProfile:
    """Read and check a calibrated profile; errors name the file and the offending key.

    Layer rows that time an executor since changed are left out (with a warning:
    :mod:`meshplan.hardware_profiles.stale_rows`) unless ``keep_stale_rows``: every row as
    timed, for studies of the rows themselves and for re-pricing runs of the executor that
    timed them."""
    path = Path(path)
    doc = read_toml(path)
    where = str(path)
    if doc.get("schema") != SCHEMA:
        raise ProfileError(f"{where}: key 'schema' is {doc.get('schema')!r}, expected {SCHEMA!r} "
                           f"(not a profile written by `meshplan calibrate`)")
    version = doc.get("version")
    if version not in READABLE_VERSIONS:
        raise ProfileError(f"{where}: key 'version' is {version!r}; this meshplan reads "
                           f"profile versions {', '.join(map(str, READABLE_VERSIONS))}")
    g = get(doc, "gpu", dict, where)
    gwhere = f"{where} [gpu]"
    name = get(g, "name", str, gwhere)
    base = get(g, "base", str, gwhere, "") or None
    _warn_unknown_gpu_keys(g, gwhere)
    table = {k: g[k] for k in _GPU_KEYS if k in g}
    membound = doc.get("measurements", {}).get("membound", [])
    if "membound_efficiency" not in table:
        ops = membound_op_efficiency(r for r in membound if isinstance(r, dict))
        if ops:
            table["membound_efficiency"] = ops
    gpu = with_base_fp8(gpu_from_table(name, table, gwhere), base)
    measured = get(doc, "measured", list, where, [])
    attention = doc.get("measurements", {}).get("attention", [])
    gpu = with_base_attention_head_dims(
        gpu, base, (r["head_dim"] for r in attention
                    if isinstance(r, dict) and isinstance(r.get("head_dim"), int)),
        curve_timed="attention_efficiency" in measured)
    for k in ("layer_overhead_s", "microbatch_overhead_s", "pipeline_action_s", "optimizer_gbps",
              "overlap_interference", "ddp_overlap_interference"):
        v = getattr(gpu, k)
        if v is not None and v < 0:      # ddp_overlap_interference None: not measured
            raise ProfileError(f"{gwhere}: {k} must be >= 0, got {v!r}")
    prov = get(doc, "provenance", dict, where, {})
    layers = get(doc, "layers", list, where, [])
    ends = get(doc, "ends", list, where, [])
    if prov.get("device") == "cuda":
        if version == 1:
            layers = [_v1_layer_row(r) for r in layers]
        if not keep_stale_rows:     # before the pooling: a row not read lends no CPU part
            layers = without_stale_rows(prov, layers, where)
        layers = pool_cpu_fixed([drop_split_depth(bound_split_cpu(r)) for r in layers])
    gpu = block_share_family(gpu, layers, measured)
    gpu = with_rerun_share(gpu, layers, base)
    if layers or ends:
        from meshplan.hardware_profiles.measured import tables_from_rows
        gpu = replace(gpu, measured=tables_from_rows(layers, ends, where))
        warn_defective_compiled_rows(prov, layers, where)     # the rows' fields checked now
    _warn_small_optimizer_row(prov, membound, where)
    gpu = _without_host_timed_permute(gpu, prov, doc.get("measurements", {}), where)
    corr = get(doc, "corrections", dict, where, None)
    if corr is not None:
        gpu = replace(gpu, corrections=corrections_from_table(
            corr, f"{where} [corrections]", source=str(corr.get("source") or where)))
    c = get(doc, "cluster", dict, where, {})
    cwhere = f"{where} [cluster]"
    lats = {}
    for key in ("intra_latency_us", "collective_base_latency_us", "intra_step_latency_us"):
        v = get(c, key, _NUM, cwhere, None)
        if v is not None and v < 0:
            raise ProfileError(f"{cwhere}: {key} must be >= 0, got {v!r}")
        lats[key] = None if v is None else float(v)
    net = efficiency_curve(c, "network_efficiency", cwhere) if "network_efficiency" in c else None
    rows = get(doc.get("measurements", {}), "collectives", list, f"{where} [measurements]", [])
    coll = tuple(r for r in rows if isinstance(r, dict) and r.get("op") != "p2p"
                 and all(isinstance(r.get(k), (int, float)) for k in
                         ("group_size", "nbytes", "seconds")))
    return CalibratedProfile(path=where, gpu=gpu, base_gpu=base, provenance=dict(prov),
                             measured=tuple(str(m) for m in measured), **lats,
                             network_efficiency=net, collective_rows=coll)


def _warn_unknown_gpu_keys(g: Mapping[str, Any], where: str) -> None:
    """Warn for each ``[gpu]`` key the loader neither reads nor knows calibrate to write (a
    misspelt optional key, ``layer_overhed_s``, was dropped and its default used)."""
    known = ("name", "base", *_GPU_KEYS)
    unknown = [k for k in g if k not in known and k not in _GPU_KEYS_NOT_READ]
    if not unknown:
        return
    for k in unknown:
        close = closest_names(k, known)
        hint = (f"did you mean {' or '.join(repr(c) for c in close)}?" if close
                else f"the keys read are {', '.join(sorted(known))}")
        warnings.warn(MeshplanWarning(
            f"{where}: unknown key {k!r} is ignored (its value is not used); {hint}"),
            stacklevel=3)


#: below this many elements a GPU's fused AdamW row reads its rate low (one H200: 3,300-3,670
#: GB/s at 2^27, 2,600 at 2^25, against 3,860 at 2^29: docs/benchmarks/optimizer_rate.md)
SMALL_OPTIMIZER_ROW_ELEMENTS = 1 << 27


def _warn_small_optimizer_row(prov: dict, membound: Any, where: str) -> None:
    """Warn where a GPU profile's ``optimizer_gbps`` comes from an AdamW row on fewer than
    :data:`SMALL_OPTIMIZER_ROW_ELEMENTS` elements (calibrations before 2026-12-02 timed it on
    2^25): the optimizer step is then priced slow, 20-55 % on the H200 checks."""
    if prov.get("device") != "cuda" or not isinstance(membound, list):
        return
    sizes = [r.get("elements") for r in membound if isinstance(r, dict)
             and r.get("op") == "adamw" and isinstance(r.get("elements"), int)]
    if sizes and max(sizes) < SMALL_OPTIMIZER_ROW_ELEMENTS:
        warnings.warn(MeshplanWarning(
            f"{where}: optimizer_gbps was timed on a {max(sizes):,}-element AdamW step, too "
            "small to reach the GPU's bandwidth: the optimizer step is priced slow (20-55 % "
            "on H200 checks; docs/benchmarks/optimizer_rate.md). Recalibrate with this "
            "meshplan (`meshplan calibrate`), which times it on up to 2^29 elements."),
            stacklevel=3)


def queued_permute_rows(measurements: Any) -> list[dict]:
    """A profile's MoE permutation rows timed queued behind a spin (calibrate since
    2026-12-02), the only ones that read the GPU's bytes (:func:`_without_host_timed_permute`)."""
    rows = measurements.get("moe_permute", []) if isinstance(measurements, dict) else []
    return [r for r in rows if isinstance(r, dict) and r.get("stream") == "queued"]


def _without_host_timed_permute(gpu: GPUSpec, prov: dict, measurements: Any,
                                where: str) -> GPUSpec:
    """``gpu`` without ``membound_efficiency["moe-permute"]`` where the profile's permutation
    rows were timed in step with the host (calibrations before 2026-12-02): on 1 × H200 they
    read 1.2-2.0 ms whatever their bytes (0.1-5.7 GB), the CPU's dispatch of the
    permutation's operators, which :mod:`meshplan.costmodel.moe_host` prices apart. Read as
    an HBM efficiency (0.018-0.35) it priced another model's permutation up to 20× its GPU
    time (docs/moe.md, "Profiles of other models"); the pooled ``hbm_efficiency`` stands."""
    if "moe-permute" not in gpu.membound_efficiency or prov.get("device") != "cuda":
        return gpu
    if queued_permute_rows(measurements):
        return gpu
    warnings.warn(MeshplanWarning(
        f"{where}: membound_efficiency 'moe-permute' was timed with the host in the loop (it "
        "reads the CPU's dispatch, not the GPU's bytes) and is not read; the MoE "
        "permutation is priced at the pooled hbm_efficiency. Recalibrate with this "
        "meshplan (`meshplan calibrate --model ...`), which times it queued."), stacklevel=3)
    ops = {k: v for k, v in gpu.membound_efficiency.items() if k != "moe-permute"}
    return replace(gpu, membound_efficiency=ops)


def profile_latency(prof: CalibratedProfile, cluster: Cluster) -> dict[str, Any]:
    """The cluster fields a profile's latency keys set (see
    :mod:`meshplan.hardware_profiles.collective_latency`), and for a profile with only the
    old ``intra_latency_us`` its NVLink (and broadcast) curves re-read from its stored
    collective rows.

    New keys replace the cluster's values one by one. The old key alone (profiles written
    before the split, and calibrations of 2-GPU nodes) is half the 2-rank probe: α_base is
    the probe less two of the cluster's datasheet steps, α_step the datasheet's; the curve
    that was read from the rows with the old latency (2(n-1) × the key, which had counted
    the per-call time once per step) is read again with this one."""
    out: dict[str, Any] = {}
    if prof.collective_base_latency_us is not None:
        out["collective_base_latency_us"] = prof.collective_base_latency_us
    if prof.intra_step_latency_us is not None:
        out["intra_latency_us"] = prof.intra_step_latency_us
    if out or prof.intra_latency_us is None:
        return out
    base_us, step_us = legacy_split(prof.intra_latency_us, cluster.intra_latency_us)
    out["collective_base_latency_us"] = base_us
    ref = builtin_gpu(prof.base_gpu) if prof.base_gpu in builtin_gpu_names() else None
    changes = {}
    for key, read in (("nvlink_efficiency", nvlink_curve),
                      ("nvlink_broadcast_efficiency", broadcast_curve),
                      ("nvlink_all_to_all_efficiency", all_to_all_curve)):
        if prof.collective_rows and key in prof.measured:
            curve_ = read(prof.collective_rows, prof.gpu.nvlink_gbps, base_us * 1e-6,
                          step_us * 1e-6, ref.nvlink_efficiency if ref else None)
            if curve_ is not None:
                changes[key] = curve_
    if changes:
        out["gpu"] = replace(prof.gpu, **changes)
    return out


def apply_profile(cluster: Cluster, path: str | Path, *, override: bool = False,
                  keep_stale_rows: bool = False) -> Cluster:
    """``cluster`` with the profile's GPU spec (and measured collective latency and network
    efficiency, where the profile has them: :func:`profile_latency`).

    The profile must come from the cluster's GPU type: its ``base`` (or its name) must equal
    ``cluster.gpu.name``. ``override=True`` applies it anyway (e.g. to predict a CPU run
    with a CPU profile on a GPU cluster's shape); the cluster then takes the profile's GPU
    whole, memory size included. ``keep_stale_rows``: as :func:`load_profile`.
    """
    prof = load_profile(path, keep_stale_rows=keep_stale_rows)
    profile_gpu = prof.base_gpu or prof.gpu.name
    if profile_gpu != cluster.gpu.name and not override:
        raise ProfileError(
            f"profile {prof.path!r} was measured on {profile_gpu!r} (device "
            f"{prof.device_name!r}), but cluster {cluster.name!r} has {cluster.gpu.name!r} "
            f"GPUs; use a cluster with {profile_gpu!r} GPUs, or apply it anyway with "
            f"override=True (`--profile-override` on the command line)")
    changes: dict[str, Any] = {"gpu": prof.gpu, **profile_latency(prof, cluster)}
    if prof.network_efficiency is not None:
        changes["network"] = replace(cluster.network, efficiency=prof.network_efficiency)
    return replace(cluster, **changes)


__all__ = ["CalibratedProfile", "load_profile", "apply_profile", "membound_op_efficiency",
           "profile_latency", "queued_permute_rows",
           "SCHEMA", "VERSION", "READABLE_VERSIONS"]
