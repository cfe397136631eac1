"""FP8 routed experts: an MoE layer's grouped expert GEMMs in fp8, forward and both backward
GEMMs, as :mod:`meshplan.executor.fp8` runs a dense linear.

Per expert g, y_g = x_g·W_gᵀ (x_g: the rows routed to g, W_g: out × in), all experts in one
grouped GEMM over rows grouped by expert (``offs``: each group's end row, every group padded
to :data:`FP8_GROUP_ALIGN_ROWS`). The kernel is ``torch._scaled_grouped_mm`` (CUTLASS
fp8 grouped GEMM with one fp32 scale per row of each operand; CUDA compute capability 9.0),
the same three products torchao's ``moe_training`` forms for its fp8 rowwise recipe
(``torchao/prototype/moe_training/scaled_grouped_mm.py``):

* forward, 2-d × 3-d: x (rows × in) scaled per row, W (experts × out × in) per expert and
  output row; y = x·Wᵀ per group;
* data gradient, 2-d × 3-d: dy (rows × out) per row, W per expert and *input* column (the
  contracted dimension is now ``out``); dx = dy·W per group;
* weight gradient, 2-d × 2-d, contracted over each group's rows: dyᵀ (out × rows) and x
  (rows × in) each scaled per group and column, ``scale_a`` laid out group-major
  ([g·out + o], as torchao's ``triton_fp8_per_group_colwise_scales`` writes it);
  dW_g = dy_gᵀ·x_g. The rows of a group are the contracted dimension here, so a group's row
  count must be a multiple of 16 (16-byte fp8 alignment): groups are padded to 16 rows, not
  bf16's 8.

The recipe is ``rowwise`` (e4m3 throughout, one scale per row along the contracted
dimension), the one whose scales the kernel takes as they are.
Like the dense fp8 linear, the 16-bit input and the weight are what is saved for backward;
the weight is cast from its stored dtype (autocast's fp32 master, FSDP2's bf16), so no 16-bit
copy of the experts is made or kept.

Weight casts once a step (:class:`Fp8ExpertWeights`): the weights change only at the
optimizer step, yet a step casts them in every micro-batch's forward (and again in a full
recompute's) and, along the other dimension, in every backward. The trainer
(:class:`meshplan.executor.parallelize.ParallelTrainer`) casts both once per step, before its
first micro-batch, where a step would cast them more than once and the weights are plain
parameters (ZeRO-0/1); the GEMMs then read the cast copies. TransformerEngine does the same
(``is_first_microbatch``: its fp8 weight and transpose cache). Cost: the two fp8 copies, 2
bytes per expert parameter, kept from step to step. Same values as casting in each pass.

Fast accumulation in all three GEMMs, as torchao's grouped recipe has it. On CPU the products
are emulated: the same fp8 values and scales, dequantized and multiplied with ``grouped_mm``
in fp32.

Not run in fp8 (the experts stay 16-bit, :func:`grouped_fp8_recipe`): ``tensorwise`` (the
kernel refused its e5m2 gradient) and ``blockwise`` / ``mxfp8`` (no Hopper grouped kernel for
their scales).

Measured (1 × H200, torch 2.11, 2026-12-02; docs/fp8.md "FP8 routed experts in the
executor"): the kernel agrees with the emulation to 1.6 % (relative, output and both
gradients: :func:`meshplan.executor.fp8.probe_grouped_kernel`); at 8 experts of width 6400 and
65,536 rows the fp8 GEMMs ran 1.77× bf16's and the compiled experts, casts included, 1.03×.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from meshplan.errors import ExecutorError
from meshplan.executor.fp8_quant import FP8_DTYPES, scale_from_amax
from meshplan.spec.choices import TORCH_FP8_EXPERT_RECIPES

FP8_GROUP_ALIGN_ROWS = 16    # the weight gradient contracts over a group's rows: 16 B in fp8


def grouped_fp8_recipe(name: str) -> bool:
    """Whether the executor runs an MoE layer's routed experts in fp8 under this recipe
    (:data:`meshplan.spec.choices.TORCH_FP8_EXPERT_RECIPES`: e4m3 with one scale per row;
    torch 2.11's kernel refused tensorwise's e5m2 gradient on an H200, "Expected mat_a to be
    Float8_e4m3", and has no layout for block scales)."""
    return name in TORCH_FP8_EXPERT_RECIPES


def _cast(t: torch.Tensor, op, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8 data, scale_inv) of ``t`` with one scale per slice along ``dim`` (its amax over
    ``dim``)."""
    dtype = FP8_DTYPES[op.fmt]
    fmax = torch.finfo(dtype).max
    amax = t.abs().amax(dim=dim, keepdim=True).float()
    scale = scale_from_amax(amax, op.fmt)
    data = torch.mul(t, scale).clamp(-fmax, fmax).to(dtype)
    return data, scale.reciprocal().squeeze(dim).contiguous()


def _cast_jagged(t: torch.Tensor, offs: torch.Tensor, op) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8 data, scale_inv [groups·cols]) of ``t`` (rows × cols) with one scale per
    (group, column), the groups' rows ending at ``offs`` (each a multiple of
    :data:`FP8_GROUP_ALIGN_ROWS`). Computed on blocks of that many rows: each block's
    column amax, then the max over a group's blocks (``segment_reduce``), and the scales
    applied a block at a time, so no rows × cols scale tensor and no atomics (an atomic
    max per element, ``scatter_reduce``, ran the moeh23 layer 20 % slower than bf16)."""
    dtype = FP8_DTYPES[op.fmt]
    fmax = torch.finfo(dtype).max
    a = FP8_GROUP_ALIGN_ROWS
    rows, cols = t.shape
    blocks = t.reshape(rows // a, a, cols)
    block_amax = blocks.abs().amax(1).float()
    lengths = torch.diff(offs, prepend=offs.new_zeros(1)) // a
    # unsafe: the lengths are not checked against the rows (a check reads them on the host)
    amax = torch.segment_reduce(block_amax, "max", lengths=lengths, axis=0, initial=0.0,
                                unsafe=True)
    scale = scale_from_amax(amax, op.fmt)
    per_block = scale[group_of_rows(offs // a, rows // a)]
    data = torch.mul(blocks, per_block[:, None, :]).clamp(-fmax, fmax).to(dtype)
    return data.reshape(rows, cols), scale.reciprocal().reshape(-1).contiguous()


def group_of_rows(offs: torch.Tensor, rows: int) -> torch.Tensor:
    """Each row's group, from the groups' end rows ``offs``."""
    return torch.searchsorted(offs, torch.arange(rows, device=offs.device, dtype=offs.dtype),
                              right=True)


def scaled_grouped_mm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor,
                      scale_b: torch.Tensor, offs: torch.Tensor, out_dtype: torch.dtype,
                      emulate: bool) -> torch.Tensor:
    """``torch._scaled_grouped_mm`` (a row-major, b column-major, scales the reciprocals),
    or its emulation: 2-d × 3-d (a: rows × k, b: groups × k × n, scale_a [rows],
    scale_b [groups, n]) or 2-d × 2-d (a: m × rows, b: rows × n, scale_a [groups·m],
    scale_b [groups·n]; out groups × m × n)."""
    if not emulate:
        return torch._scaled_grouped_mm(a, b, scale_a, scale_b, offs=offs, out_dtype=out_dtype,
                                        use_fast_accum=True)
    return _emulated(a, b, scale_a, scale_b, offs, out_dtype)


# eager under torch.compile (as the experts' 16-bit loop): grouped_mm's tracing rule takes
# bf16 operands only, and the emulation multiplies in fp32
@torch.compiler.disable
def _emulated(a, b, scale_a, scale_b, offs, out_dtype):
    mm = getattr(F, "grouped_mm", None) or torch._grouped_mm
    if b.dim() == 3:
        a32 = a.float() * scale_a[:, None]
        b32 = b.float() * scale_b[:, None, :]
    else:
        g = group_of_rows(offs, a.shape[1])
        groups = offs.numel()
        a32 = a.float() * scale_a.reshape(groups, -1)[g].t()
        b32 = b.float() * scale_b.reshape(groups, -1)[g]
    return mm(a32, b32, offs=offs).to(out_dtype)


def _forward_weight(weight: torch.Tensor, op) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward GEMM's W: per expert and output row (contracted over ``in``)."""
    return _cast(weight, op, dim=2)


def _dgrad_weight(weight: torch.Tensor, op) -> tuple[torch.Tensor, torch.Tensor]:
    """The data gradient's W: per expert and input column, column-major (the kernel's second
    operand, contracted over ``out``)."""
    wq, sw = _cast(weight, op, dim=1)
    return wq.transpose(-2, -1).contiguous().transpose(-2, -1), sw


def _weight_casts(weight: torch.Tensor, r) -> tuple[torch.Tensor, ...]:
    return (*_forward_weight(weight, r.w_fwd), *_dgrad_weight(weight, r.w_dgrad))


class Fp8ExpertWeights:
    """One stacked expert weight's two fp8 casts, made by :meth:`refresh` once per optimizer step
    and read by every micro-batch's GEMMs (module docstring). Refreshed in place, so a compiled
    block reads the new values through the same tensors. ``backend``: the casts themselves under
    ``torch.compile`` with that backend, None eager (fused: one read of the weight per amax and
    per cast), as the blocks are — eager, ``abs``, ``amax``, ``mul``, ``clamp`` and ``to`` each
    pass over the fp32 weight: on 1 × H200 that made moeh24's compiled steps 7-19 % slower than
    casting in every pass (docs/fp8.md)."""

    def __init__(self, weight: torch.nn.Parameter, plan, *, backend: str | None = None):
        self.weight, self.plan = weight, plan
        self.forward = self.forward_scale = self.dgrad = self.dgrad_scale = None
        self.version: int | None = None    # the weight's version counter at the last refresh
        self._casts = (_weight_casts if backend is None
                       else torch.compile(_weight_casts, dynamic=False, backend=backend))

    @torch.no_grad()
    def refresh(self) -> None:
        with torch.autocast(self.weight.device.type, enabled=False):
            cast = self._casts(self.weight, self.plan.recipe)
        if self.forward is None:
            self.forward, self.forward_scale, self.dgrad, self.dgrad_scale = cast
        else:
            for mine, new in zip((self.forward, self.forward_scale, self.dgrad,
                                  self.dgrad_scale), cast):
                mine.copy_(new)
        self.version = self.weight._version

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """(forward W, its scales, dgrad W, its scales); an :class:`ExecutorError` if the
        weight changed since the last :meth:`refresh` (checked outside torch.compile)."""
        if self.forward is None or (not torch.compiler.is_compiling()
                                    and self.weight._version != self.version):
            raise ExecutorError("internal: the experts' fp8 weights were not refreshed after "
                                "their weights changed (Fp8ExpertWeights.refresh once a step, "
                                "before the first micro-batch)")
        return self.forward, self.forward_scale, self.dgrad, self.dgrad_scale


class _Fp8GroupedLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, offs, plan, *cached):
        # x: rows × in (the compute dtype), grouped by ``offs``; weight: experts × out × in;
        # cached: () or Fp8ExpertWeights.tensors()
        with torch.autocast(x.device.type, enabled=False):
            r = plan.recipe
            xq, sx = _cast(x, r.x_fwd, dim=1)
            wq, sw = cached[:2] if cached else _forward_weight(weight, r.w_fwd)
            y = scaled_grouped_mm(xq, wq.transpose(-2, -1), sx, sw, offs, x.dtype, plan.emulate)
        ctx.plan = plan
        ctx.save_for_backward(x, weight, offs, *cached[2:])
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, offs, *cached = ctx.saved_tensors
        plan, r = ctx.plan, ctx.plan.recipe
        dy = dy.contiguous()
        dx = dw = None
        with torch.autocast(dy.device.type, enabled=False):
            if ctx.needs_input_grad[0]:
                dyq, sdy = _cast(dy, r.dy_dgrad, dim=1)
                wq, sw = cached if cached else _dgrad_weight(weight, r.w_dgrad)
                dx = scaled_grouped_mm(dyq, wq, sdy, sw, offs, dy.dtype, plan.emulate)
            if ctx.needs_input_grad[1]:
                dyq, sdy = _cast_jagged(dy, offs, r.dy_wgrad)
                xq, sx = _cast_jagged(x, offs, r.x_wgrad)
                dw = scaled_grouped_mm(dyq.t().contiguous(), xq.t().contiguous().t(), sdy, sx,
                                       offs, dy.dtype, plan.emulate).to(weight.dtype)
        return (dx, dw, None, None) + (None,) * (4 if cached else 0)


def fp8_grouped_linear(x: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor,
                       plan, cached: Fp8ExpertWeights | None = None) -> torch.Tensor:
    """Per group g of ``x``'s rows (ending at ``offs[g]``, each a multiple of
    :data:`FP8_GROUP_ALIGN_ROWS` rows), x_g·weight[g]ᵀ with fp8 GEMMs (module docstring);
    ``cached``: ``weight``'s casts made once a step (else cast here)."""
    if cached is None:
        return _Fp8GroupedLinear.apply(x, weight, offs, plan)
    return _Fp8GroupedLinear.apply(x, weight, offs, plan, *cached.tensors())


__all__ = ["FP8_GROUP_ALIGN_ROWS", "Fp8ExpertWeights", "fp8_grouped_linear",
           "grouped_fp8_recipe", "group_of_rows", "scaled_grouped_mm"]
