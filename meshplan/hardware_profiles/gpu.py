"""A GPU's datasheet figures and efficiency curves."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from meshplan.errors import ConfigError
from meshplan.hardware_profiles.corrections import (CorrectionNumbers, builtin_corrections,
                                                    builtin_number)
from meshplan.hardware_profiles.curve import Curve


# Communication hidden behind compute is not free: NCCL kernels take SMs and memory
# bandwidth from the GEMMs they overlap (Rashidi et al. 2021, "Enabling Compute-Communication
# Overlap in Distributed Deep Learning Training Platforms", ISCA, §3). The cost model charges
# this fraction of the hidden time; the default for datasheet profiles is an assumption
# (data/corrections.toml [datasheet_overlap]), consistent with Shoeybi et al. 2019's 74% at
# 512 GPUs (docs/benchmarks/published.md); `meshplan calibrate` measures it
# (meshplan.calibrate.bench_overlap).
DEFAULT_OVERLAP_INTERFERENCE = float(builtin_number("overlap_interference"))


HOST_KEYS = ("host_op_dispatch_s", "host_sync_s", "host_comm_op_s", "host_all_to_all_s")
FP8_CAST_KEYS = ("fp8_cast_eager_pass_s", "fp8_cast_eager_gbps", "fp8_cast_compiled_gbps",
                 "fp8_cast_eager_gpu_pass_s", "fp8_cast_eager_gpu_gbps",
                 "fp8_cast_eager_host_pass_s", "fp8_cast_compiled_block_share",
                 "fp8_cast_weight_gbps")


@dataclass(frozen=True, kw_only=True)
class GPUSpec:
    """One GPU model. Bandwidths in GB/s (1e9 B/s) per direction, peaks in TFLOP/s (dense)."""

    name: str
    peak_tflops: Mapping[str, float]
    memory_bytes: int
    hbm_gbps: float
    nvlink_gbps: float
    gemm_efficiency: Curve
    attention_efficiency: Curve
    hbm_efficiency: float
    nvlink_efficiency: Curve
    provenance: str = "datasheet"
    # Fixed costs measured by calibration (0 for datasheet profiles).
    layer_overhead_s: float = 0.0
    microbatch_overhead_s: float = 0.0
    # Measured by ``meshplan calibrate`` with the executor's own code (absent: analytical).
    pipeline_action_s: float = 0.0      # fixed cost of one pipeline-stage forward or backward
    optimizer_gbps: float = 0.0         # achieved bytes/s of the fused AdamW step (0: HBM model)
    # fraction of communication hidden behind compute that still costs time (see
    # DEFAULT_OVERLAP_INTERFERENCE)
    overlap_interference: float = DEFAULT_OVERLAP_INTERFERENCE
    # the same for DDP's gradient buckets beside the backward, measured on the executor's
    # blocks (meshplan.calibrate.bench_ddp_overlap); None: overlap_interference
    ddp_overlap_interference: float | None = None
    # measured HBM efficiency of each memory-bound op of the executor ("layernorm",
    # "rmsnorm", "residual-add", "gelu", "swiglu"; bytes as the cost model counts them):
    # an op missing here runs at hbm_efficiency (all of them on a datasheet profile)
    membound_efficiency: Mapping[str, float] = field(default_factory=dict)
    measured: Any = None                # meshplan.costmodel.measured.MeasuredTables or None
    # efficiency of a grouped GEMM (MoE experts), by ``grouped_gemm_key``: "call", the whole
    # call's tile-padded FLOPs (meshplan.hardware_profiles.grouped_gemm; what calibrate writes
    # since 2026-12-03), or "expert", one expert's GEMM FLOPs (profiles and plan files written
    # before, which carry no key); None: the dense GEMM curve at the per-expert shape
    grouped_gemm_efficiency: Curve | None = None
    grouped_gemm_key: str = "expert"
    # the executor's fp8 (rowwise) grouped GEMM, fraction of the fp8 peak, keyed by the call;
    # None: the bf16 grouped time times the dense fp8 / bf16 ratio (costmodel.fp8_experts)
    grouped_fp8_gemm_efficiency: Curve | None = None
    # HBM efficiency of the executor's MoE permutation by the model's top-k (interpolated in
    # log k, clamped): datasheet entries; a profile's measured membound_efficiency
    # ["moe-permute"] (timed at its own model's top-k) comes first (costmodel.moe_layer)
    moe_permute_efficiency_by_top_k: Curve | None = None
    # NVLink efficiency of a broadcast (bus bytes = the buffer), by message size, where
    # ``meshplan calibrate`` timed broadcasts; None: nvlink_efficiency (meshplan.costmodel.comm)
    nvlink_broadcast_efficiency: Curve | None = None
    # all-to-alls inside a node (MoE dispatch/combine), measured by meshplan calibrate;
    # None: nvlink_efficiency
    nvlink_all_to_all_efficiency: Curve | None = None
    # the numbers of the cost model's empirical corrections (meshplan.costmodel.corrections)
    corrections: CorrectionNumbers = field(default_factory=builtin_corrections)
    # fp8 (meshplan.costmodel.fp8_cost): the fp8 GEMM efficiency curve (fraction of the fp8
    # peak by one GEMM's FLOPs; None: the GPU has no fp8 tensor cores in its profile), and
    # the casts of the executor's fp8 linears — eager: a fixed cost per cast pass plus
    # bytes at a bandwidth; compiled (Inductor-fused): bytes at a bandwidth (0: not measured,
    # the cost model assumes HBM × hbm_efficiency and says so)
    fp8_gemm_efficiency: Curve | None = None
    fp8_cast_eager_pass_s: float = 0.0
    fp8_cast_eager_gbps: float = 0.0
    fp8_cast_compiled_gbps: float = 0.0
    # the eager casts split (timed queued): the GPU's busy time per pass and bandwidth, and
    # the host's extra dispatch per pass over a bf16 linear's (0: not measured; the
    # synchronized pair above then prices them on the GPU's timeline)
    fp8_cast_eager_gpu_pass_s: float = 0.0
    fp8_cast_eager_gpu_gbps: float = 0.0
    fp8_cast_eager_host_pass_s: float = 0.0
    # compiled casts inside a compiled block cost this share of the same bytes cast alone at
    # fp8_cast_compiled_gbps (Inductor fuses them with the kernels around them); 0: not known,
    # priced as cast alone
    fp8_cast_compiled_block_share: float = 0.0
    # the layer family (measured_rows.cast_family) whose compiled fp8 rows measured that share
    # ("": not one family's measurement: a datasheet fit, or several families' rows), and
    # the datasheet's share per family (a calibrated profile takes its base GPU's:
    # calibrated.with_base_fp8); fp8_cost.compiled_block_share reads the three
    fp8_cast_compiled_block_share_family: str = ""
    fp8_cast_compiled_block_share_by_family: tuple[tuple[str, float], ...] = ()
    # under full recomputation a compiled bf16 block's backward re-runs this share of its
    # forward's time (Inductor's partitioner saves some of what the forward made); 0: not
    # known, the whole forward. Read off a profile's compiled rows at load
    # (calibrated.with_rerun_share); costmodel.compute.layer_cost reads it
    compiled_full_rerun_share: float = 0.0
    # the compiled cast of a large stacked fp32 weight to both of its fp8 layouts (forward,
    # data gradient), as fp8 routed experts cast theirs: bytes at this bandwidth (0: not
    # measured, priced as the other compiled casts)
    fp8_cast_weight_gbps: float = 0.0
    # the fp8 recipes whose torch._scaled_mm kernel ran on this GPU with the executor (runtime
    # "torch"; empty: not known, nothing refused)
    fp8_torch_recipes: tuple[str, ...] = ()
    # the host's eager PyTorch: CPU seconds to dispatch one aten operator with its autograd
    # bookkeeping (the layer's CPU dispatch over its operator count), and one device-to-host
    # synchronisation on a drained queue (``.item()``: the copy's launch, the copy, the
    # wake-up); 0: not known (meshplan.costmodel.moe_host prices no host term then)
    host_op_dispatch_s: float = 0.0
    host_sync_s: float = 0.0
    host_comm_op_s: float = 0.0         # CPU cost of one c10d call (costmodel/cp_host.py)
    host_all_to_all_s: float = 0.0      # ... of one all_to_all_single (0: host_comm_op_s)
    # head-dim dependence of attention (hardware_profiles/attention_published.py eq. (5)):
    # the head dim attention_efficiency describes, and per other published head dim the
    # ratio of its efficiency to attention_efficiency's by forward FLOPs (empty: one curve
    # for every head dim; a calibrated profile takes its base GPU's ratios referred to the
    # head dim it timed: calibrated.with_base_attention_head_dims)
    attention_head_dim: int = 0
    attention_head_dim_ratio: tuple[tuple[int, Curve], ...] = ()
    # how the compute curves were timed: "queued" = the GPU alone (``meshplan calibrate
    # --queued-microbench``); "" = synchronized calibrations, whose cheap ops read the host's
    # launch time, and datasheet curves fitted to end-to-end runs. The eager layer's
    # gradient work and RoPE's strided products (costmodel.torch_membound) are added to
    # GPU-alone curves only: the others hold that time already (docs/calibrate.md)
    microbench_timing: str = ""

    def __hash__(self) -> int:  # Mapping fields are not hashable; the name identifies a profile
        return hash((self.name, self.provenance, self.memory_bytes))

    def __eq__(self, other: object) -> bool:
        # identity of the measured tables, not their rows: profiles are compared in every
        # cost-model cache lookup
        if not isinstance(other, GPUSpec):
            return NotImplemented
        return (self.to_dict() == other.to_dict() and self.measured is other.measured
                and self.corrections == other.corrections)

    def attention_efficiency_at(self, flops: float, head_dim: int | None) -> float:
        """Efficiency of one causal attention call of ``flops`` forward FLOPs whose heads are
        ``head_dim`` wide: :attr:`attention_efficiency` times the published head-dim ratio,
        interpolated linearly in log2(head dim), clamped outside the published head dims
        (attention_published.py eq. (5)); no ratio known or ``head_dim`` None: the curve."""
        eff = self.attention_efficiency(flops)
        if not self.attention_head_dim_ratio or head_dim is None:
            return eff
        return min(1.0, eff * self.attention_head_dim_factor(flops, head_dim))

    def attention_head_dim_factor(self, flops: float, head_dim: int) -> float:
        """The published ratio of ``head_dim``'s attention efficiency to
        :attr:`attention_head_dim`'s at ``flops`` forward FLOPs (1 without ratios)."""
        if not self.attention_head_dim_ratio:
            return 1.0
        pts = sorted([(self.attention_head_dim, 1.0),
                      *((d, c(flops)) for d, c in self.attention_head_dim_ratio)])
        d = min(max(head_dim, pts[0][0]), pts[-1][0])        # clamped outside
        i = next(k for k in range(1, len(pts)) if d <= pts[k][0])
        (d_lo, r_lo), (d_hi, r_hi) = pts[i - 1], pts[i]
        w = (math.log2(d) - math.log2(d_lo)) / (math.log2(d_hi) - math.log2(d_lo))
        return (1 - w) * r_lo + w * r_hi

    @property
    def dp_overlap_interference(self) -> float:
        """The interference data parallelism's collectives pay beside the executor's blocks
        (DDP's gradient all-reduce; FSDP2's per-layer gathers and reduce-scatters): the probe
        on the executor's blocks where calibrate ran it, else :attr:`overlap_interference`."""
        if self.ddp_overlap_interference is None:
            return self.overlap_interference
        return self.ddp_overlap_interference

    def op_hbm_efficiency(self, op: str) -> float:
        """The HBM efficiency of memory-bound op ``op`` (:attr:`membound_efficiency`, else
        the pooled :attr:`hbm_efficiency`)."""
        return float(self.membound_efficiency.get(op, self.hbm_efficiency))

    def peak_flops(self, precision: str) -> float:
        """Dense peak FLOP/s for a training precision (mixed precision uses 16-bit GEMMs;
        ``"fp8"``: the fp8 tensor-core peak, which only the fp8 GEMMs run at)."""
        peak = _peak_tflops(self.peak_tflops, precision)
        if peak <= 0:
            raise ConfigError(f"GPU {self.name!r} has no {precision} peak in its profile; "
                              f"{_precision_hint(self.peak_tflops, precision)}")
        return peak * 1e12

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "peak_tflops": dict(self.peak_tflops),
            "memory_bytes": self.memory_bytes, "hbm_gbps": self.hbm_gbps,
            "nvlink_gbps": self.nvlink_gbps,
            "gemm_efficiency": self.gemm_efficiency.to_list(),
            "attention_efficiency": self.attention_efficiency.to_list(),
            "hbm_efficiency": self.hbm_efficiency,
            "nvlink_efficiency": self.nvlink_efficiency.to_list(),
            "provenance": self.provenance,
            "layer_overhead_s": self.layer_overhead_s,
            "microbatch_overhead_s": self.microbatch_overhead_s,
            "pipeline_action_s": self.pipeline_action_s,
            "optimizer_gbps": self.optimizer_gbps,
            "overlap_interference": self.overlap_interference,
            **({"ddp_overlap_interference": self.ddp_overlap_interference}
               if self.ddp_overlap_interference is not None else {}),
            **({"membound_efficiency": dict(self.membound_efficiency)}
               if self.membound_efficiency else {}),
            # fp8 keys only where the GPU has them (older plan files and GPUs without fp8)
            **({"fp8_gemm_efficiency": self.fp8_gemm_efficiency.to_list()}
               if self.fp8_gemm_efficiency is not None else {}),
            **{k: getattr(self, k) for k in FP8_CAST_KEYS if getattr(self, k) > 0},
            **({"fp8_cast_compiled_block_share_family":
                self.fp8_cast_compiled_block_share_family}
               if self.fp8_cast_compiled_block_share_family else {}),
            **({"fp8_cast_compiled_block_share_by_family":
                [[f, v] for f, v in self.fp8_cast_compiled_block_share_by_family]}
               if self.fp8_cast_compiled_block_share_by_family else {}),
            **({"compiled_full_rerun_share": self.compiled_full_rerun_share}
               if self.compiled_full_rerun_share > 0 else {}),
            **({"fp8_torch_recipes": list(self.fp8_torch_recipes)}
               if self.fp8_torch_recipes else {}),
            **({"grouped_gemm_efficiency": self.grouped_gemm_efficiency.to_list(),
                "grouped_gemm_key": self.grouped_gemm_key}
               if self.grouped_gemm_efficiency is not None else {}),
            **({"grouped_fp8_gemm_efficiency": self.grouped_fp8_gemm_efficiency.to_list()}
               if self.grouped_fp8_gemm_efficiency is not None else {}),
            **({"moe_permute_efficiency_by_top_k":
                self.moe_permute_efficiency_by_top_k.to_list()}
               if self.moe_permute_efficiency_by_top_k is not None else {}),
            **({"nvlink_broadcast_efficiency": self.nvlink_broadcast_efficiency.to_list()}
               if self.nvlink_broadcast_efficiency is not None else {}),
            **({"nvlink_all_to_all_efficiency": self.nvlink_all_to_all_efficiency.to_list()}
               if self.nvlink_all_to_all_efficiency is not None else {}),
            **{k: getattr(self, k) for k in HOST_KEYS if getattr(self, k) > 0},
            **({"attention_head_dim": self.attention_head_dim,
                "attention_head_dim_ratio": [[d, c.to_list()]
                                             for d, c in self.attention_head_dim_ratio]}
               if self.attention_head_dim_ratio else {}),
            **({"microbench_timing": self.microbench_timing} if self.microbench_timing else {}),
        }


def _peak_tflops(peaks: Mapping[str, float], precision: str) -> float:
    """The dense peak (TFLOP/s) a ``precision`` job's GEMMs run at; 0: none in ``peaks``."""
    key = {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32", "fp8": "fp8"}[precision]
    peak = float(peaks.get(key, 0.0))
    if peak <= 0 and key == "bf16":
        # V100 has no bf16 units: a bf16 job there runs fp16 math.
        peak = float(peaks.get("fp16", 0.0))
    return peak


def _precision_hint(peaks: Mapping[str, float], precision: str) -> str:
    """What would run: the precisions this GPU has a peak for, and the built-in GPUs (with
    the cluster presets built of them) that have ``precision``."""
    from meshplan.hardware_profiles.builtin_data import builtin_table
    from meshplan.spec.choices import PRECISIONS
    own = [p for p in PRECISIONS if _peak_tflops(peaks, p) > 0]
    clusters: dict[str, list[str]] = {}
    for cname, ct in builtin_table("clusters.toml").items():
        clusters.setdefault(str(ct.get("gpu")), []).append(cname)
    gpus = [f"{g} ({', '.join(clusters[g])})" if g in clusters else g
            for g, t in builtin_table("gpus.toml").items()
            if _peak_tflops(t.get("peak_tflops", {}), precision) > 0]
    hint = (f"it has {', '.join(own)} (--precision {own[0]})" if own
            else f"it has no peak for any of {', '.join(PRECISIONS)}")
    where = (f"built-in GPUs with a peak for {precision}: {', '.join(gpus)}" if gpus
             else f"no built-in GPU has a peak for {precision}")
    return f"{hint}; {where}"

