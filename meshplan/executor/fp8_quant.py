"""Casting tensors to fp8 with scales: per tensor, per row or column, per block.

A 2-D tensor is cut into blocks of ``(rows, cols)`` elements (0 = the whole dimension;
:mod:`meshplan.costmodel.fp8` lists each recipe's blocks); every block gets one scale,
``fmax / amax(block)``, so that its largest magnitude lands at the format's largest value
(Micikevicius et al. 2022, arXiv 2209.05433 §3.2). The scaled values are clamped to
±fmax (saturation: some kernels turn an e4m3 overflow into NaN) and rounded to nearest.
With ``power_of_two`` the scale is the OCP Microscaling shared exponent, 2^-(⌊log2 amax⌋ − 8)
for e4m3 (OCP MX v1.0 §6.3), so the block's amax lands in [256, 512) and saturates above 448.

Tensor parallelism: a rank casts its own shard with its own scales (no amax all-reduce);
:mod:`meshplan.executor.fp8` says why that is sound.

An :class:`Fp8Tensor` keeps ``scale_inv = 1 / scale`` per block, as ``torch._scaled_mm``
takes it; :meth:`Fp8Tensor.dequantize` is the emulation path's GEMM input.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

FP8_DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
AMAX_EPS = 1e-12          # an all-zero block gets a finite scale (torchao uses the same)
MX_ELEM_EMAX = {"e4m3": 8, "e5m2": 15}   # exponent of each format's largest power of two


@dataclass(frozen=True)
class Fp8Tensor:
    """fp8 ``data`` (rows × cols) = value · scale, one ``scale`` per block; ``scale_inv``
    (its reciprocal) is what dequantizes and what ``torch._scaled_mm`` takes."""

    data: torch.Tensor
    scale: torch.Tensor           # (ceil(rows / br), ceil(cols / bc)), fp32
    scale_inv: torch.Tensor
    block: tuple[int, int]        # as given to quantize: 0 = whole dimension

    def t(self) -> "Fp8Tensor":
        """The transpose (a view: data, scales and block swap their dimensions)."""
        return Fp8Tensor(self.data.t(), self.scale.t(), self.scale_inv.t(),
                         (self.block[1], self.block[0]))

    def contiguous_t(self) -> "Fp8Tensor":
        """The transpose laid out row-major (an fp8 copy): the operand order a GEMM that
        contracts over this tensor's rows needs."""
        return Fp8Tensor(self.data.t().contiguous(), self.scale.t(), self.scale_inv.t(),
                         (self.block[1], self.block[0]))

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        rows, cols = self.data.shape
        br, bc = block_dims(self.block, (rows, cols))
        s = self.scale_inv
        full = self.data.to(torch.float32)
        if br == rows and bc == cols:
            return (full * s.reshape(1, 1)).to(dtype)
        s = s.repeat_interleave(br, dim=0)[:rows].repeat_interleave(bc, dim=1)[:, :cols]
        return (full * s).to(dtype)


def block_dims(block: tuple[int, int], shape: tuple[int, int]) -> tuple[int, int]:
    return (shape[0] if block[0] == 0 else block[0], shape[1] if block[1] == 0 else block[1])


def _blocked(x: torch.Tensor, br: int, bc: int) -> torch.Tensor:
    """x as (row blocks, br, col blocks, bc), zero-padded to whole blocks."""
    rows, cols = x.shape
    gr, gc = math.ceil(rows / br), math.ceil(cols / bc)
    if gr * br != rows or gc * bc != cols:
        x = F.pad(x, (0, gc * bc - cols, 0, gr * br - rows))
    return x.reshape(gr, br, gc, bc)


def block_amax(x: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """max |x| per block, fp32, shape (row blocks, col blocks)."""
    br, bc = block_dims(block, tuple(x.shape))
    if (br, bc) == tuple(x.shape):
        return torch.linalg.vector_norm(x, float("inf")).float().reshape(1, 1)
    return torch.linalg.vector_norm(_blocked(x, br, bc), float("inf"), dim=(1, 3)).float()


def scale_from_amax(amax: torch.Tensor, fmt: str, *, power_of_two: bool = False) -> torch.Tensor:
    """fp32 scales that map each amax to the format's largest value (or, for MX, the power
    of two that puts it in the top binade)."""
    fmax = torch.finfo(FP8_DTYPES[fmt]).max
    amax = amax.clamp(min=AMAX_EPS)
    if power_of_two:
        shared_exp = torch.floor(torch.log2(amax)) - MX_ELEM_EMAX[fmt]
        return torch.exp2(-shared_exp.clamp(-127, 127))
    return fmax / amax


def quantize(x: torch.Tensor, block: tuple[int, int], fmt: str, *,
             scale: torch.Tensor | None = None, power_of_two: bool = False) -> Fp8Tensor:
    """Cast a 2-D tensor to fp8 ``fmt`` with one scale per ``block``.

    ``scale``: reuse these scales (the forward's, in backward) instead of taking amaxes.
    """
    dtype = FP8_DTYPES[fmt]
    fmax = torch.finfo(dtype).max
    if scale is None:
        scale = scale_from_amax(block_amax(x, block), fmt, power_of_two=power_of_two)
    rows, cols = x.shape
    br, bc = block_dims(block, (rows, cols))
    if (br, bc) == (rows, cols):
        # a (1, 1) scale, not a 0-dim one: 0-dim tensors do not promote, and a bf16 x
        # would be scaled in bf16 (rounded twice) instead of fp32
        data = torch.mul(x, scale.reshape(1, 1)).clamp_(-fmax, fmax).to(dtype)
    elif (br, bc) in ((1, cols), (rows, 1)):   # one scale per row / column: broadcasting
        data = torch.mul(x, scale).clamp_(-fmax, fmax).to(dtype)
    else:
        data = _blockwise_cast(x, scale, br, bc, fmax, dtype)
    return Fp8Tensor(data, scale, scale.reciprocal(), block)


def _blockwise_cast(x, scale, br, bc, fmax, dtype) -> torch.Tensor:
    rows, cols = x.shape
    xb = _blocked(x, br, bc)
    data = torch.mul(xb, scale[:, None, :, None]).clamp_(-fmax, fmax).to(dtype)
    data = data.reshape(xb.shape[0] * br, xb.shape[2] * bc)
    if data.shape != (rows, cols):
        data = data[:rows, :cols].contiguous()
    return data


__all__ = ["Fp8Tensor", "FP8_DTYPES", "quantize", "block_amax", "block_dims",
           "scale_from_amax"]
