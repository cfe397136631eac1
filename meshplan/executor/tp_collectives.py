"""The conjugate operators of Megatron-style tensor parallelism, as autograd functions.

Shoeybi et al. 2019 (arXiv 1909.08053) §3, Fig. 3: ``f`` is identity forward, all-reduce
backward (:func:`copy_to_tp`); ``g`` is all-reduce forward, identity backward
(:func:`reduce_from_tp`). With sequence parallelism (Korthikanti et al. 2022, arXiv
2205.05198 §4.2.2, Fig. 5) ``f`` becomes an all-gather along the sequence, reduce-scatter
backward (:func:`gather_from_sp`), and ``g`` a reduce-scatter, all-gather backward
(:func:`reduce_scatter_to_sp`). The layers built on them:
:mod:`meshplan.executor.tensor_parallel`.

Activations are ``[batch, seq, hidden]``; the sequence dimension is 1. The collectives go
through :mod:`meshplan.executor.functional_comm` (functional while traced: compiled under
torch 2.11, in-place ones lost the backward of the reduce-scatter).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from meshplan.errors import ExecutorError
from meshplan.executor.functional_comm import all_gather_dim0, all_reduce, reduce_scatter_dim0

SEQ_DIM = 1


# ---- collectives along the sequence dimension ------------------------------------------
def _all_gather_seq(x: torch.Tensor, group) -> torch.Tensor:
    n = dist.get_world_size(group)
    out = all_gather_dim0(x, group).view((n,) + x.shape)               # (tp, b, s/tp, h)
    return out.transpose(0, 1).flatten(1, 2)                           # (b, s, h)


def _reduce_scatter_seq(x: torch.Tensor, group) -> torch.Tensor:
    n = dist.get_world_size(group)
    b, s = x.shape[0], x.shape[1]
    if s % n:
        raise ExecutorError(f"sequence parallel needs seq_len divisible by tp; got seq_len "
                            f"{s}, tp {n}")
    chunks = x.reshape(b, n, s // n, *x.shape[2:]).transpose(0, 1)    # (tp, b, s/tp, h)
    return reduce_scatter_dim0(chunks.flatten(0, 1), group)             # (b, s/tp, h)


def _split_seq(x: torch.Tensor, group) -> torch.Tensor:
    n, r = dist.get_world_size(group), dist.get_rank(group)
    # a copy even where the slice is contiguous (batch 1): compiled under torch 2.11, a
    # function returning a view of its input lost its backward (functional_comm's test)
    return x.chunk(n, dim=SEQ_DIM)[r].clone(memory_format=torch.contiguous_format)


class _CopyToTP(torch.autograd.Function):
    """f: identity forward, all-reduce backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        return all_reduce(grad, ctx.group), None


class _ReduceFromTP(torch.autograd.Function):
    """g: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        return all_reduce(x, group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _GatherFromSP(torch.autograd.Function):
    """f with sequence parallelism: all-gather forward, reduce-scatter backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _all_gather_seq(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter_seq(grad, ctx.group), None


class _ReduceScatterToSP(torch.autograd.Function):
    """g with sequence parallelism: reduce-scatter forward, all-gather backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _reduce_scatter_seq(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather_seq(grad, ctx.group), None


class _ScatterToSP(torch.autograd.Function):
    """Keep this rank's sequence slice forward, all-gather backward (full -> SP region)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _split_seq(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather_seq(grad, ctx.group), None


class _GatherFromSlices(_GatherFromSP):
    """All-gather the sequence slices forward (as :class:`_GatherFromSP`), keep this rank's
    slice of the (replicated) gradient backward: the conjugate of :class:`_ScatterToSP`,
    leaving a region whose ranks each worked on one slice of a replicated activation (an
    MoE layer's routed tokens)."""

    @staticmethod
    def backward(ctx, grad):
        return _split_seq(grad, ctx.group), None


def to_compute_dtype(x: torch.Tensor) -> torch.Tensor:
    """``x`` in autocast's dtype where autocast is on for its device and ``x`` is fp32.

    Under autocast LayerNorm returns fp32, and the column-parallel linear that follows it
    would cast to 16 bits only after ``f``: its collective (the backward all-reduce, or
    with sequence parallelism the forward all-gather and backward reduce-scatter) then moved
    fp32, twice the bytes of Megatron's 16-bit activations and gradients (a profiler trace
    of GPT tp 2 on 4 × H200 showed half of its tp all-reduces in fp32,
    docs/benchmarks/accuracy.md round 16). Casting first is the cast autocast would do
    anyway, one step earlier; RMSNorm already returns the input's dtype."""
    dev = x.device.type
    if x.dtype == torch.float32 and torch.is_autocast_enabled(dev):
        return x.to(torch.get_autocast_dtype(dev))
    return x


def copy_to_tp(x, group):
    return _CopyToTP.apply(x, group)


def reduce_from_tp(x, group):
    return _ReduceFromTP.apply(x, group)


def gather_from_sp(x, group):
    return _GatherFromSP.apply(x, group)


def reduce_scatter_to_sp(x, group):
    return _ReduceScatterToSP.apply(x, group)


def scatter_to_sp(x, group):
    return _ScatterToSP.apply(x, group)


def gather_from_slices(x, group):
    return _GatherFromSlices.apply(x, group)


__all__ = ["SEQ_DIM", "to_compute_dtype", "copy_to_tp", "reduce_from_tp", "gather_from_sp",
           "reduce_scatter_to_sp", "scatter_to_sp", "gather_from_slices"]
