"""FP8 linear layers: the forward and both backward GEMMs of each transformer linear in fp8.

The executor's own Float8 linear over ``torch._scaled_mm`` rather than torchao's
``convert_to_float8_training``, because:

* the tensor-parallel layers (:mod:`meshplan.executor.tensor_parallel`) are plain tensors
  with explicit collectives; torchao swaps ``nn.Linear`` modules and shards through DTensor
  (its ``Float8ColwiseParallel``), so it would not reach them without its private
  autograd function;
* under tp each rank casts its own shards with their own scales (below), with no
  collective of its own;
* FSDP2 composes unchanged (the function receives the gathered weight); torch.compile
  traces the autograd.Function; there is no wheel to carry and no torchao/torch version
  pairing to keep (torch 2.11 on the GPUs, 2.13 here).

What it gives up: torchao's fp8 FSDP all-gather (weights are gathered in bf16 and cast
after the gather) and its Triton-fused casts in eager mode (with ``--compile`` Inductor
fuses the amax, scale and cast ops here too).

Per linear y = x·Wᵀ (x: tokens × in, W: out × in), as the recipe table says: forward
casts x and W; backward casts dy and re-casts the saved 16-bit x and W (with the forward's
scale where the block is the same), then dgrad = dy·W and wgrad = dyᵀ·x. Like torchao, the
16-bit input is what is saved for backward, so activation memory is bf16's. On CPU (no fp8
GEMM kernel is assumed) the GEMMs are emulated: the same fp8 data and scales, dequantized
and multiplied in fp32.

Tensor parallelism: per-shard (local) scales, no amax all-reduce. Every GEMM here is a
product of one rank's shards, and ``torch._scaled_mm`` (or the emulation) returns it
dequantised, in 16 bits, before any tp collective: the row-parallel partial sums are
all-reduced / reduce-scattered and the column-parallel dgrad partial sums likewise, all in
bf16, and the sequence-parallel all-gathers move bf16 inputs and gradients that are cast
after the gather. A scale only has to agree across ranks where fp8 data itself crosses
ranks — torchao all-reduces the amax for its fp8 FSDP all-gather
(``WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather``, ``reduce_amax=True``) and
TransformerEngine's current scaling sets ``amax_reduction_group = tp_group`` only on the
column-parallel input and the row-parallel grad output under sequence parallelism, the two
tensors it all-gathers in fp8 (transformer_engine/pytorch/module/linear.py,
``_customize_quantizers_float8_current_scaling``); weights and the other operands keep
per-rank scales there too. A shard's amax is at most the tensor's, so its scale is the same
or larger: each element's rounding error is bounded as before (≤ 2⁻⁴ relative in e4m3 for
normals) and fewer small values fall into the subnormals. What it gives up is that tp 2
casts bit-for-bit as tp 1 (tests/distributed/test_fp8_world2.py states the tolerance).
The all-reduce it replaces was a rank synchronisation point, 8 per layer per micro-batch:
on 2 × H200 (g02, docs/benchmarks/fp8_checks.md) each 4-byte all-reduce took 239 µs on the GPU,
waiting for the other rank's host.

Not run: ``delayed`` (TransformerEngine's amax history: its gain is TE's fused kernels,
and recomputation would update the history twice) and ``mxfp8`` on GPUs (needs Blackwell's
block-scaled tensor cores and swizzled scales; emulated on CPU only).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from meshplan.costmodel.fp8 import OPERAND_SOURCE, TP_SHARDED_DIM, Fp8Recipe, recipe
from meshplan.errors import ExecutorError
from meshplan.executor.fp8_quant import Fp8Tensor, quantize

# torchao's defaults (Float8LinearConfig): fast accumulation for the forward GEMM only
FAST_ACCUM = {"forward": True, "dgrad": False, "wgrad": False}


@dataclass(frozen=True)
class Fp8Plan:
    """How one linear casts and multiplies: the recipe, emulated or on the fp8 kernel.
    The same under tp (local scales: module docstring)."""

    recipe: Fp8Recipe
    emulate: bool

    def cast(self, x: torch.Tensor, key: str,
             scale: torch.Tensor | None = None) -> Fp8Tensor:
        op = getattr(self.recipe, key)
        return quantize(x, op.block, op.fmt, scale=scale,
                        power_of_two=self.recipe.power_of_two_scales)

    def gemm(self, a: Fp8Tensor, b: Fp8Tensor, out_dtype: torch.dtype, which: str
             ) -> torch.Tensor:
        """a (m × k, row-major) · b (k × n, column-major) in ``out_dtype``."""
        if self.emulate:
            return (a.dequantize() @ b.dequantize()).to(out_dtype)
        return torch._scaled_mm(a.data, b.data, scale_a=_kernel_scale(a, first=True),
                                scale_b=_kernel_scale(b, first=False),
                                out_dtype=out_dtype, use_fast_accum=FAST_ACCUM[which])


def _kernel_scale(t: Fp8Tensor, *, first: bool) -> torch.Tensor:
    """Scales laid out as ``torch._scaled_mm`` reads them: a scalar per tensor, contiguous
    per row / column, blocks with the contracted dimension outermost."""
    s = t.scale_inv
    if s.numel() == 1:
        return s.reshape(())
    rows, cols = t.data.shape
    if s.shape in ((rows, 1), (1, cols)):
        return s.reshape(-1).reshape(s.shape)      # unit strides, also for a transposed view
    return s.t().contiguous().t() if first else s.contiguous()


class _Fp8Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, plan: Fp8Plan):
        out_dtype = _compute_dtype(x)
        with torch.autocast(x.device.type, enabled=False):
            x2 = x.reshape(-1, x.shape[-1]).contiguous()   # the kernel's row-major operand
            xq = plan.cast(x2, "x_fwd")
            wq = plan.cast(weight, "w_fwd")
            y = plan.gemm(xq, wq.t(), out_dtype, "forward")
        ctx.plan = plan
        ctx.save_for_backward(x, weight, xq.scale, wq.scale)
        # not a view: the row-parallel all-reduce writes this output in place, and under
        # torch.compile an autograd Function's output that is a view may not be modified
        # in place (issue 41: compiled tp 2 failed at step 0); aten.matmul returns 3-d
        # products the same way
        return torch.ops.aten._unsafe_view(y, (*x.shape[:-1], weight.shape[0]))

    @staticmethod
    def backward(ctx, dy):
        x, weight, sx, sw = ctx.saved_tensors
        plan, r = ctx.plan, ctx.plan.recipe
        fwd_scale = {"x_fwd": sx, "w_fwd": sw}
        dy2 = dy.reshape(-1, dy.shape[-1]).contiguous()
        gemm_dtype = dy.dtype
        dx = dw = None
        with torch.autocast(dy.device.type, enabled=False):
            dyq = plan.cast(dy2, "dy_dgrad")
            if ctx.needs_input_grad[0]:
                wq = plan.cast(weight, "w_dgrad", _reused(r.w_dgrad, fwd_scale))
                dx = plan.gemm(dyq, wq.contiguous_t().t(), gemm_dtype, "dgrad")
                dx = dx.reshape(*x.shape[:-1], weight.shape[1]).to(x.dtype)
            if ctx.needs_input_grad[1]:
                x2 = x.reshape(-1, x.shape[-1]).contiguous()
                dyw = dyq if r.dy_wgrad.same_data else plan.cast(dy2, "dy_wgrad")
                xq = plan.cast(x2, "x_wgrad", _reused(r.x_wgrad, fwd_scale))
                dw = plan.gemm(dyw.contiguous_t(), xq.contiguous_t().t(), gemm_dtype, "wgrad")
                dw = dw.to(weight.dtype)
        return dx, dw, None


def _reused(op, fwd_scale: dict) -> torch.Tensor | None:
    """The forward scale an operand reuses (None: it takes its own amax)."""
    return fwd_scale.get(op.reuse)


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    dev = x.device.type
    if torch.is_autocast_enabled(dev):
        return torch.get_autocast_dtype(dev)
    return x.dtype


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
               plan: Fp8Plan) -> torch.Tensor:
    """``F.linear`` with fp8 GEMMs; the bias is added in the output's dtype."""
    y = _Fp8Linear.apply(x, weight, plan)
    return y + bias.to(y.dtype) if bias is not None else y


class Fp8Matmul:
    """``F.linear``'s signature over :func:`fp8_linear` (the tp layers' ``matmul`` hook)."""

    def __init__(self, plan: Fp8Plan):
        self.plan = plan

    def __call__(self, x, weight, bias=None):
        return fp8_linear(x, weight, bias, self.plan)


class Fp8Linear(nn.Module):
    """An ``nn.Linear`` whose GEMMs run in fp8; keeps the linear's own parameters (same
    names, same tensors)."""

    def __init__(self, linear: nn.Linear, plan: Fp8Plan):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        self.plan = plan

    def forward(self, x):
        return fp8_linear(x, self.weight, self.bias, self.plan)


# ---- which recipes run where ---------------------------------------------------------------
def check_layout_fp8(job, layout) -> None:
    """fp8 checks that need no device (the executor's preflight)."""
    check_recipe_runnable(job.fp8_recipe, torch.device("cpu"))
    if layout.schedule == "zero-bubble" and layout.pp > 1:
        raise ExecutorError("fp8 with schedule 'zero-bubble' is not supported: the fp8 linear "
                            "computes its input and weight gradients in one backward node, "
                            "which zero-bubble's split input/weight passes need apart; use "
                            "1f1b or interleaved-1f1b")


def check_recipe_runnable(name: str, device: torch.device) -> Fp8Recipe:
    """The recipe, or an :class:`ExecutorError` saying why this device cannot run it."""
    r = recipe(name)
    if r.amax_from_history:
        raise ExecutorError(
            f"fp8_recipe {name!r} (TransformerEngine's delayed scaling) is priced by "
            f"meshplan.costmodel.fp8 but not run by the executor: its gain is TE's fused "
            f"amax-and-cast kernels; use 'tensorwise' (current scaling), 'rowwise' or "
            f"'blockwise'")
    if device.type != "cuda":
        return r                                  # emulated: every other recipe runs
    cc = torch.cuda.get_device_capability(device)
    gpu = torch.cuda.get_device_name(device)
    if cc < (8, 9):
        raise ExecutorError(f"fp8 GEMMs need compute capability 8.9 or later (Ada, Hopper, "
                            f"Blackwell); {gpu!r} is sm{cc[0]}{cc[1]}")
    if r.needs_mx_hardware:
        why = (f"needs Blackwell (sm100+) block-scaled tensor cores; {gpu!r} is "
               f"sm{cc[0]}{cc[1]}" if cc < (10, 0) else
               "is not implemented for GPUs yet (its scales need the tensor cores' swizzled "
               "layout); it is emulated on CPU only")
        raise ExecutorError(f"fp8_recipe {name!r} {why}; use 'blockwise' or 'tensorwise'")
    return r


def probe_kernel(r: Fp8Recipe, device: torch.device, size: int = 256) -> float:
    """Run one fp8 linear forward and backward on the fp8 kernel and emulated; return the
    largest relative difference of output and gradients. Raises :class:`ExecutorError` if
    the kernel refuses the recipe's scale layout or its results differ from the emulation
    by more than bf16 output rounding allows (a wrong scale layout would)."""
    g = torch.Generator(device="cpu").manual_seed(0)
    x0 = torch.randn(size, size, generator=g).to(device, torch.bfloat16)
    w0 = torch.randn(size, size, generator=g).to(device) * 0.05
    return _kernel_vs_emulation(
        r, lambda x, w, plan: fp8_linear(x, w, None, plan), x0, w0,
        "fp8 kernel for its scales", "the fp8 kernel", "'tensorwise' or 'rowwise'")


def _kernel_vs_emulation(r: Fp8Recipe, fn, x0: torch.Tensor, w0: torch.Tensor, kernel: str,
                         name: str, instead: str) -> float:
    """``fn(x, w, plan)`` forward and backward on the fp8 kernel and emulated, from the same
    inputs; the largest relative difference of output and gradients, or an
    :class:`ExecutorError` (the kernel refused, or differs by :data:`PROBE_RTOL` or more)."""
    outs = []
    for emulate in (False, True):
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        try:
            y = fn(x, w, Fp8Plan(recipe=r, emulate=emulate))
            y.float().square().sum().backward()
        except (RuntimeError, ValueError) as exc:
            raise ExecutorError(f"fp8_recipe {r.name!r}: this torch ({torch.__version__}) has "
                                f"no {kernel} here: {str(exc).splitlines()[0]}; use "
                                f"{instead}") from None
        outs.append([t.detach().float() for t in (y, x.grad, w.grad)])
    worst = max(float((a - b).abs().max() / b.abs().max().clamp(min=1e-30))
                for a, b in zip(*outs))
    if not worst < PROBE_RTOL:
        raise ExecutorError(f"fp8_recipe {r.name!r}: {name} differs from the emulation by "
                            f"{worst:.3g} (relative; tolerance {PROBE_RTOL}); its scale layout "
                            f"is not what this torch expects")
    return worst


#: kernel against emulation: both multiply the same fp8 values; they differ by the kernel's
#: accumulation order and bf16 output rounding (2^-9) per GEMM, compounded over two
PROBE_RTOL = 2e-2


# ---- applying it to a model -------------------------------------------------------------------
def convert_to_fp8(model, name: str, *, device: torch.device, tp_group=None,
                   tokens: int | None = None) -> int:
    """Make the linears of every transformer block of ``model`` (qkv or MLA's, attention output,
    MLP in and out — an MoE layer's shared-expert MLP; not the embedding or the logits
    head, which stay 16-bit as in torchao's and TransformerEngine's recipes, nor an MoE
    layer's router) run fp8 GEMMs, and an MoE layer's routed experts fp8 grouped GEMMs
    (:mod:`meshplan.executor.fp8_grouped`; recipe ``rowwise``, on CPU or compute capability
    9.0+: otherwise they stay 16-bit, :func:`experts_run_fp8`).
    Tensor-parallel layers keep their collectives and get an fp8 ``matmul``; plain
    ``nn.Linear`` become :class:`Fp8Linear`. ``tokens``: per micro-batch (the
    weight-gradient GEMM contracts over them, so the kernel needs them aligned too). Returns
    the number converted (a layer's routed experts count as their two grouped linears)."""
    from meshplan.executor.moe import MoELayer
    from meshplan.executor.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    r = check_recipe_runnable(name, device)
    emulate = device.type != "cuda"
    if not emulate:
        probe_kernel(r, device)
    plan = Fp8Plan(recipe=r, emulate=emulate)
    experts = experts_run_fp8(r.name, device) and any(
        isinstance(b.mlp, MoELayer) for b in model.layers.values())
    if experts and not emulate:
        probe_grouped_kernel(r, device)
    count = 0
    for block in model.layers.values():
        if experts and isinstance(block.mlp, MoELayer):
            ex = block.mlp.experts
            if not emulate:
                for w in (ex.w_in, ex.w_out):
                    _check_kernel_shape(r, tuple(w.shape[1:]), "the routed experts", None)
            ex.fp8 = plan
            count += 2
        for parent, attr in _fp8_linears(block):
            layer = getattr(parent, attr)
            if isinstance(layer, (ColumnParallelLinear, RowParallelLinear)):
                kind = "column" if isinstance(layer, ColumnParallelLinear) else "row"
                _check_block_alignment(r, layer, kind, tp_group)
                layer.matmul = Fp8Matmul(plan)
            elif isinstance(layer, nn.Linear):
                setattr(parent, attr, Fp8Linear(layer, plan))
            else:
                raise ExecutorError(f"internal: cannot run {type(layer).__name__} in fp8")
            if not emulate:
                _check_kernel_shape(r, tuple(getattr(parent, attr).weight.shape), attr, tokens)
            count += 1
    return count


def experts_run_fp8(name: str, device: torch.device) -> bool:
    """Whether an MoE layer's routed experts run fp8 under recipe ``name`` on ``device``: a
    recipe the grouped kernel takes (:func:`~meshplan.executor.fp8_grouped.grouped_fp8_recipe`)
    and a device that has it (Hopper or later; emulated on CPU)."""
    from meshplan.executor.fp8_grouped import grouped_fp8_recipe
    if not grouped_fp8_recipe(name):
        return False
    return device.type != "cuda" or torch.cuda.get_device_capability(device) >= (9, 0)


def probe_grouped_kernel(r: Fp8Recipe, device: torch.device, groups: int = 4,
                         size: int = 256) -> float:
    """:func:`probe_kernel` for the experts' fp8 grouped GEMM: forward and backward of four
    uneven groups on the kernel and emulated; the largest relative difference, or an
    :class:`ExecutorError` naming what the kernel refused or where it differs."""
    from meshplan.executor.fp8_grouped import FP8_GROUP_ALIGN_ROWS, fp8_grouped_linear
    g = torch.Generator(device="cpu").manual_seed(0)
    sizes = [FP8_GROUP_ALIGN_ROWS * (i + 1) for i in range(groups)]
    offs = torch.tensor(sizes, dtype=torch.int32).cumsum(0).to(device, torch.int32)
    x0 = torch.randn(sum(sizes), size, generator=g).to(device, torch.bfloat16)
    w0 = torch.randn(groups, size, size, generator=g).to(device) * 0.05
    return _kernel_vs_emulation(
        r, lambda x, w, plan: fp8_grouped_linear(x, w, offs, plan), x0, w0,
        "fp8 grouped GEMM for the routed experts", "the experts' fp8 grouped GEMM",
        "'rowwise'")


def _fp8_linears(block) -> list[tuple[nn.Module, str]]:
    """(parent module, attribute) of a block's linears that run fp8: attention's two (MLA's
    four or five, the replicated down-projections included), and the dense MLP's two — in
    an MoE layer its shared experts' MLP, if any."""
    from meshplan.executor.moe import MoELayer
    mlp = block.mlp.shared if isinstance(block.mlp, MoELayer) else block.mlp
    attn = getattr(block.attn, "linear_names", ("qkv", "proj"))
    return [(block.attn, name) for name in attn] + (
        [(mlp, "fc"), (mlp, "proj")] if mlp is not None else [])


def _check_block_alignment(r: Fp8Recipe, layer, kind: str, group) -> None:
    """Finite blocks along a tp-split dimension must not straddle the split (nor, for a
    fused q|k|v or gate|up weight, a section boundary), or tp ranks would scale other
    blocks than one GPU does."""
    import torch.distributed as dist
    size = dist.get_world_size(group)
    wdim = TP_SHARDED_DIM[kind]["w"]
    sections = layer.weight_spec.sections or (layer.weight.shape[wdim] * size,)
    for key, op in r.operands().items():
        dim = TP_SHARDED_DIM[kind].get(OPERAND_SOURCE[key][0])
        b = 0 if dim is None else op.block[dim]
        bad = [s for s in sections if b > 1 and (s // size) % b]
        if bad:
            raise ExecutorError(
                f"fp8_recipe {r.name!r} scales {b}-element blocks, but tp = {size} splits a "
                f"{kind}-parallel weight section of {bad[0]} into {bad[0] // size}, not a "
                f"multiple of {b}; use 'tensorwise' or 'rowwise', or a smaller tp")


def _check_kernel_shape(r: Fp8Recipe, shape: tuple[int, int], name: str,
                        tokens: int | None) -> None:
    align = 128 if r.name == "blockwise" else 16
    if shape[0] % align or shape[1] % align:
        raise ExecutorError(f"fp8 GEMMs need the linears' dimensions to be multiples of "
                            f"{align} for recipe {r.name!r}; {name} has a local weight of "
                            f"{shape[0]} × {shape[1]}")
    if tokens is not None and tokens % align:
        raise ExecutorError(f"fp8 GEMMs need micro_batch·seq_len (the weight gradient's "
                            f"contracted dimension) to be a multiple of {align} for recipe "
                            f"{r.name!r}, got {tokens}")


__all__ = ["Fp8Plan", "Fp8Linear", "Fp8Matmul", "fp8_linear", "recipe", "convert_to_fp8",
           "check_layout_fp8", "check_recipe_runnable", "experts_run_fp8", "probe_kernel",
           "probe_grouped_kernel"]
