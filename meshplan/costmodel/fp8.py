"""FP8 training of the linear layers: which GEMMs run in fp8, what the casts cost, what they keep.

:mod:`meshplan.costmodel.fp8_cost` composes these into an estimate (docs/fp8.md). Pure
functions, no torch: the executor (:mod:`meshplan.executor.fp8`) reads its recipes from
:data:`RECIPES`, so the prediction and the run follow one table.

Formats (Micikevicius et al. 2022, "FP8 Formats for Deep Learning", arXiv 2209.05433, §3 and
Table 1): e4m3 (largest normal 448, 3 mantissa bits: round-to-nearest relative error
≤ 2⁻⁴) for weights and activations; e5m2 (57344, 2 bits: ≤ 2⁻³) for gradients, which need
range more than precision (§4.1). A tensor is scaled before the cast so that its largest
magnitude (amax) lands at the format's maximum: ``q = sat(x · fmax / amax)``, dequantized
as ``q · amax / fmax`` (§3.2, per-tensor scaling).

Recipes (:data:`RECIPES`; the operand blocks say how many elements share one scale, in
the stored orientation of x (tokens × in), W (out × in) and dy (tokens × out); 0 = the
whole dimension):

* ``tensorwise``: one scale per tensor from its current amax (torchao float8 "tensorwise",
  dynamic scaling; torchao docs, torchao/float8/README.md); e4m3 x and W, e5m2 dy (the
  HYBRID format of TransformerEngine's recipes). The backward re-casts x and W with the
  forward's scales (no second amax pass).
* ``delayed``: as tensorwise but the scale comes from the amax history of earlier steps
  (TransformerEngine ``DelayedScaling``, TE docs "Using FP8 with Transformer Engine"), so
  the amax is a by-product of the cast kernel: one read of the tensor instead of two. The
  executor does not run it (TE's fused kernels are what make it pay).
* ``rowwise``: one scale per row of every GEMM operand along the contracted dimension
  (torchao "rowwise", e4m3 throughout); every operand is re-cast along its own axis for
  each of the three GEMMs.
* ``blockwise``: DeepSeek-V3 (arXiv 2412.19437 §3.3.2, Fig. 7): 1×128 tiles (per token per
  128 channels) for activations and gradients, 128×128 blocks for weights; e4m3 throughout.
  The weight's 128×128 scales serve the transposed weight too; x and dy are re-cast as
  128×1 tiles for the weight-gradient GEMM.
* ``mxfp8``: OCP Microscaling v1.0 (2023) §5-6: one power-of-two (e8m0) scale per 32
  elements along the contracted dimension; tensor cores decode the scales on Blackwell
  (sm100) and later only.

GEMMs (:func:`fp8_gemms`): every recipe runs all three GEMMs of a linear in fp8 — forward
y = x·Wᵀ, data gradient dx = dy·W, weight gradient dW = dyᵀ·x (DeepSeek-V3 §3.3.1:
"Fprop, Dgrad and Wgrad are executed in FP8"; TE and torchao likewise). The kernels
(cuBLASLt through ``torch._scaled_mm``) take the first operand row-major and the second
column-major, i.e. both with the contracted dimension contiguous: the forward GEMM needs
no transpose; dgrad needs W with the out dimension contiguous and wgrad needs dy and x with
the token dimension contiguous — three fp8 transposes per linear per backward unless the
cast writes both orientations (TE's fused cast-transpose).

Cast traffic (:func:`linear_cast_traffic`), memory-bound bytes per linear per micro-batch:
each operand cast reads the high-precision tensor once for its amax (skipped where the
scale is reused or comes from history) and once for the cast, and writes 1 byte per
element plus 4 bytes per scale; a transpose reads and writes 1 byte per element.

Tensor parallelism adds no collective: each rank casts its shards with per-shard scales, as
:mod:`meshplan.executor.fp8` runs it — every fp8 GEMM is a product of one rank's shards,
dequantised before the (16-bit) tp reduction, so a scale need not agree across ranks.
Scales must agree only where fp8 data crosses ranks (torchao's fp8 FSDP all-gather
all-reduces the weight amax; TransformerEngine's current scaling all-reduces the amax of the
column-parallel input and row-parallel grad output it all-gathers in fp8 under sequence
parallelism); neither runtime priced here gathers fp8 over tp, so none is priced. A
per-micro-batch amax all-reduce would be more than its latency: each one is a rank
synchronisation point, which waits for the slowest rank's host on a host-bound layout
(issue 41's g02 trace, docs/benchmarks/fp8_checks.md: 239 µs a 4-byte all-reduce on 2 × H200).

Memory (:func:`fp8_weight_copy_bytes`): the executor and torchao re-cast weights per use, so
only the layer running holds an fp8 weight and its transpose (2 bytes per parameter of one
linear); TransformerEngine caches both over the micro-batches of a step (2 bytes per
parameter of every fp8 linear on the GPU — the "FP8 uses more memory" of TE issues 257 and
1429, on top of the 16-bit weights that stay). Activation memory is unchanged: the executor,
like torchao, keeps the 16-bit linear inputs for backward.

FSDP/ZeRO-3 all-gather (:func:`zero3_allgather_bytes`): torchao's
``enable_fsdp_float8_all_gather`` gathers tensorwise fp8 weights (1 byte per parameter plus
one scale per tensor) instead of 16-bit ones; the executor gathers 16-bit weights (FSDP2
``MixedPrecisionPolicy``) and casts after the gather.

GEMM efficiency (:func:`fp8_gemm_time_s`): time = FLOPs / (fp8 peak × efficiency(FLOPs)),
with an fp8 curve of its own: fp8 doubles the tensor-core rate but not the memory, launch
and tile-quantization costs, so small GEMMs gain less than 2× (Megatron-LM issue 396:
"fp8 only brings 35 % speed-up"). The curve comes from the GPU profile
(:mod:`meshplan.calibrate.bench_fp8` measures it); this module takes it as a callable.

Measured error: the cast traffic with the fitted eager rate reproduces the executor's fp8
linear on one H100 within 10 % mean (post hoc); whole training steps against GPU runs and
published runs: :mod:`meshplan.costmodel.fp8_cost`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from meshplan.errors import ConfigError

FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}     # arXiv 2209.05433 Table 1
MANTISSA_BITS = {"e4m3": 3, "e5m2": 2}
SCALE_BYTES = 4                                 # fp32 scales (e8m0 for mxfp8 stored as 1 byte)
GEMMS = ("forward", "dgrad", "wgrad")
#: GPU families whose tensor cores take MX block scales (Blackwell, sm100+)
MX_GPU_FAMILIES = ("B100", "B200", "B300", "GB200", "GB300")


@dataclass(frozen=True, kw_only=True)
class Operand:
    """How one GEMM operand is cast: fp8 format and block (rows, cols) per scale, 0 = whole
    dimension. ``reuse`` names an earlier operand of the same tensor whose scale this cast
    takes (no amax pass); ``same_data``: it takes that operand's fp8 data too (no cast)."""

    fmt: str
    block: tuple[int, int]
    reuse: str | None = None
    same_data: bool = False

@dataclass(frozen=True, kw_only=True)
class Fp8Recipe:
    name: str
    x_fwd: Operand        # x (tokens × in), forward
    w_fwd: Operand        # W (out × in), forward
    dy_dgrad: Operand     # dy (tokens × out), data gradient
    w_dgrad: Operand      # W, data gradient (contracted over out)
    dy_wgrad: Operand     # dy, weight gradient (contracted over tokens)
    x_wgrad: Operand      # x, weight gradient (contracted over tokens)
    power_of_two_scales: bool = False
    amax_from_history: bool = False
    needs_mx_hardware: bool = False

    def operands(self) -> dict[str, Operand]:
        return {k: getattr(self, k) for k in OPERANDS}


OPERANDS = ("x_fwd", "w_fwd", "dy_dgrad", "w_dgrad", "dy_wgrad", "x_wgrad")
_E4, _E5 = "e4m3", "e5m2"
_T = (0, 0)


def _tensorwise(name: str, history: bool) -> Fp8Recipe:
    return Fp8Recipe(name=name, x_fwd=Operand(fmt=_E4, block=_T),
                     w_fwd=Operand(fmt=_E4, block=_T),
                     dy_dgrad=Operand(fmt=_E5, block=_T),
                     w_dgrad=Operand(fmt=_E4, block=_T, reuse="w_fwd"),
                     dy_wgrad=Operand(fmt=_E5, block=_T, reuse="dy_dgrad", same_data=True),
                     x_wgrad=Operand(fmt=_E4, block=_T, reuse="x_fwd"),
                     amax_from_history=history)


RECIPES: dict[str, Fp8Recipe] = {
    "tensorwise": _tensorwise("tensorwise", False),
    "delayed": _tensorwise("delayed", True),
    "rowwise": Fp8Recipe(
        name="rowwise", x_fwd=Operand(fmt=_E4, block=(1, 0)), w_fwd=Operand(fmt=_E4, block=(1, 0)),
        dy_dgrad=Operand(fmt=_E4, block=(1, 0)), w_dgrad=Operand(fmt=_E4, block=(0, 1)),
        dy_wgrad=Operand(fmt=_E4, block=(0, 1)), x_wgrad=Operand(fmt=_E4, block=(0, 1))),
    "blockwise": Fp8Recipe(
        name="blockwise", x_fwd=Operand(fmt=_E4, block=(1, 128)),
        w_fwd=Operand(fmt=_E4, block=(128, 128)), dy_dgrad=Operand(fmt=_E4, block=(1, 128)),
        w_dgrad=Operand(fmt=_E4, block=(128, 128), reuse="w_fwd"),
        dy_wgrad=Operand(fmt=_E4, block=(128, 1)), x_wgrad=Operand(fmt=_E4, block=(128, 1))),
    "mxfp8": Fp8Recipe(
        name="mxfp8", x_fwd=Operand(fmt=_E4, block=(1, 32)), w_fwd=Operand(fmt=_E4, block=(1, 32)),
        dy_dgrad=Operand(fmt=_E4, block=(1, 32)), w_dgrad=Operand(fmt=_E4, block=(32, 1)),
        dy_wgrad=Operand(fmt=_E4, block=(32, 1)), x_wgrad=Operand(fmt=_E4, block=(32, 1)),
        power_of_two_scales=True, needs_mx_hardware=True),
}

#: which stored tensor each operand casts, and whether the GEMM needs it transposed in memory
OPERAND_SOURCE = {"x_fwd": ("x", False), "w_fwd": ("w", False), "dy_dgrad": ("dy", False),
           "w_dgrad": ("w", True), "dy_wgrad": ("dy", True), "x_wgrad": ("x", True)}
#: the dimension a tp-sharded tensor is split along: column-parallel splits W's rows (out)
#: and dy's columns; row-parallel splits W's and x's columns (in) (Shoeybi et al. 2019 §3)
TP_SHARDED_DIM = {"column": {"w": 0, "dy": 1}, "row": {"w": 1, "x": 1}}


def recipe(name: str) -> Fp8Recipe:
    if name not in RECIPES:
        raise ConfigError(f"fp8 recipe {name!r} is not known; choose one of "
                          f"{', '.join(repr(r) for r in RECIPES)}")
    return RECIPES[name]


def fp8_gemms(name: str) -> tuple[str, ...]:
    """The GEMMs of a linear layer that run in fp8 under recipe ``name`` (all three for
    every recipe here; torchao's "rowwise_with_gw_hp" would keep wgrad in 16 bits)."""
    recipe(name)
    return GEMMS


def supports_mx(gpu_name: str) -> bool:
    """Whether the GPU's tensor cores decode MX block scales (Blackwell and later)."""
    return any(gpu_name.upper().startswith(f) for f in MX_GPU_FAMILIES)


def check_recipe_supported(name: str, gpu_name: str) -> None:
    """Raise :class:`ConfigError` for a recipe the GPU cannot run (mxfp8 before Blackwell)."""
    r = recipe(name)
    if r.needs_mx_hardware and not supports_mx(gpu_name):
        raise ConfigError(f"fp8_recipe {name!r} needs MX block-scaled tensor cores (Blackwell: "
                          f"{', '.join(MX_GPU_FAMILIES)}); GPU {gpu_name!r} has none. Use "
                          f"'blockwise' (DeepSeek-V3 1×128 / 128×128 scales) or 'tensorwise'")


def scale_count(rows: int, cols: int, block: tuple[int, int]) -> int:
    """Number of scales of a rows × cols operand cast with ``block`` (0 = whole dim)."""
    br, bc = (rows if block[0] == 0 else block[0]), (cols if block[1] == 0 else block[1])
    return math.ceil(rows / br) * math.ceil(cols / bc)


@dataclass(frozen=True)
class CastTraffic:
    """Memory-bound work of the fp8 casts of one linear for one micro-batch. The weight's
    casts are apart: per micro-batch where weights are re-cast per use (executor, torchao),
    once per step with a weight cache (TE)."""

    forward_bytes: float         # x's casts
    backward_bytes: float        # dy's casts, x's re-cast, transposes of x and dy
    weight_bytes: float          # every cast and transpose of W
    kernels: int                 # amax, cast and transpose passes (eager: 1-3 launches each)
    # the passes split as the bytes are (forward + backward + weight = kernels)
    forward_passes: int = 0
    backward_passes: int = 0
    weight_passes: int = 0
    # the part of weight_bytes / weight_passes the forward's cast of W moves (the rest is
    # the backward's re-cast and transpose for the data gradient)
    weight_forward_bytes: float = 0.0
    weight_forward_passes: int = 0

    @property
    def per_microbatch_bytes(self) -> float:
        return self.forward_bytes + self.backward_bytes + self.weight_bytes


def linear_cast_traffic(m: int, k: int, n: int, name: str, *, act_bytes: int = 2,
                        weight_bytes: int = 4,
                        fused_cast_transpose: bool = False) -> CastTraffic:
    """Bytes the casts of one linear move for a micro-batch of ``m`` tokens, ``k`` inputs
    and ``n`` outputs (local, tp-sharded sizes).

    ``act_bytes``: bytes of x and dy (2 for bf16); ``weight_bytes``: of the weight the cast
    reads (4: fp32 master weights under autocast; 2: FSDP2's bf16 gathered weights).
    ``fused_cast_transpose``: the cast writes both orientations (TE) — no transpose pass.
    """
    r = recipe(name)
    shape = {"x": (m, k), "w": (n, k), "dy": (m, n)}
    hp = {"x": act_bytes, "w": weight_bytes, "dy": act_bytes}
    scale_bytes = 1 if r.power_of_two_scales else SCALE_BYTES     # e8m0 scales
    moved_by = {"forward": 0.0, "backward": 0.0, "weight": 0.0}
    passes_by = {"forward": 0, "backward": 0, "weight": 0}
    w_fwd = (0.0, 0)
    for key, op in r.operands().items():
        tensor, transposed = OPERAND_SOURCE[key]
        rows, cols = shape[tensor]
        elems = rows * cols
        moved, launches = 0.0, 0
        if not op.same_data:
            amax_pass = op.reuse is None and not r.amax_from_history
            moved = elems * hp[tensor] * (2 if amax_pass else 1) + elems \
                + scale_count(rows, cols, op.block) * scale_bytes
            launches = 2 if amax_pass else 1
        if transposed:
            if fused_cast_transpose:
                moved += elems                     # the second orientation's write
            else:
                moved, launches = moved + 2 * elems, launches + 1
        part = "weight" if tensor == "w" else "forward" if key == "x_fwd" else "backward"
        moved_by[part] += moved
        passes_by[part] += launches
        if key == "w_fwd":
            w_fwd = (moved, launches)
    return CastTraffic(moved_by["forward"], moved_by["backward"], moved_by["weight"],
                       sum(passes_by.values()), passes_by["forward"],
                       passes_by["backward"], passes_by["weight"], *w_fwd)


def cast_time_s(traffic_bytes: float, hbm_gbps: float, hbm_efficiency: float) -> float:
    """Memory-bound time of the casts (the GPU profile's achieved HBM bandwidth)."""
    return traffic_bytes / (hbm_gbps * 1e9 * hbm_efficiency)


def fp8_gemm_time_s(flops: float, peak_fp8_flops: float,
                    efficiency: Callable[[float], float]) -> float:
    """Seconds of one fp8 GEMM: its FLOPs at the fp8 peak times the fp8 efficiency curve's
    value at that size (a profile's curve: small GEMMs reach a smaller share of the peak)."""
    if flops <= 0:
        return 0.0
    eff = efficiency(flops)
    if not 0 < eff <= 1:
        raise ConfigError(f"fp8 GEMM efficiency at {flops:.3g} FLOPs is {eff}; a profile's "
                          f"curve must give a fraction in (0, 1]")
    return flops / (peak_fp8_flops * eff)


def linear_gemm_flops(m: int, k: int, n: int) -> dict[str, float]:
    """FLOPs of the three GEMMs of one linear (2·m·k·n each)."""
    f = 2.0 * m * k * n
    return {g: f for g in GEMMS}


def fp8_weight_copy_bytes(linear_params: list[int], *, cached: bool) -> float:
    """Extra bytes fp8 weights hold on a GPU: an fp8 weight and its transpose (1 + 1 bytes
    per parameter). ``cached`` (TE): every fp8 linear's copies live through the step;
    otherwise (executor, torchao) only the largest linear's, while it runs."""
    if not linear_params:
        return 0.0
    return 2.0 * (sum(linear_params) if cached else max(linear_params))


def zero3_allgather_bytes(params: int, *, fp8_allgather: bool, tensors: int = 1,
                          hp_bytes: int = 2) -> float:
    """Bytes one ZeRO-3 / FSDP all-gather of ``params`` (unsharded count) moves into each
    rank: 16-bit weights, or fp8 weights plus one fp32 scale per tensor (torchao's
    ``enable_fsdp_float8_all_gather``, tensorwise only)."""
    return params * 1.0 + tensors * SCALE_BYTES if fp8_allgather else params * float(hp_bytes)


def roundtrip_error_bound(fmt: str) -> float:
    """Largest relative error of round-to-nearest into ``fmt`` for normal numbers: half a
    unit in the last place, 2^-(mantissa bits + 1) (arXiv 2209.05433 §3)."""
    return 2.0 ** -(MANTISSA_BITS[fmt] + 1)


__all__ = ["RECIPES", "Fp8Recipe", "Operand", "OPERANDS", "OPERAND_SOURCE", "FP8_MAX", "GEMMS", "TP_SHARDED_DIM",
           "recipe", "fp8_gemms", "supports_mx", "check_recipe_supported", "scale_count",
           "CastTraffic", "linear_cast_traffic", "cast_time_s",
           "fp8_gemm_time_s", "linear_gemm_flops", "fp8_weight_copy_bytes",
           "zero3_allgather_bytes", "roundtrip_error_bound"]
