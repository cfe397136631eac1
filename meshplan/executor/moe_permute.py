"""The executor's MoE token movement: the routed copies sorted by expert, gathered into
expert order, padded per expert group for the grouped GEMM, regrouped across the
expert-parallel group, and summed back per token — every direction a gather, none an
atomic add (used by :class:`meshplan.executor.moe.MoELayer`; timed by ``meshplan
calibrate``'s permutation bench, :mod:`meshplan.calibrate.bench_moe`).

Token movement without atomics: the routed copies are gathered into expert order with
``index_select``, whose autograd backward is an ``index_add`` — bf16 atomics, 0.69 ms a call
at 65,536 rows of 1,280 on an H200 (docs/benchmarks/moe_checks.md, "The compiled forward gap"), as
was the combine's ``index_add``. Here each direction is a gather: the dispatch's backward and the
combine's forward sum each token's k copies with ``embedding_bag`` (mode "sum", the gates as
per-sample weights: one read of the k rows, fp32 accumulation), the combine's backward and
the padding copy's backward read rows back by index. The per-expert counts are int32:
``torch.compile`` lowers an int32 ``index_add`` to atomic adds, but an int64 one (Triton has
no 64-bit atomic add: ``needs_fallback_due_to_atomic_add_limitations`` in
``torch/_inductor/lowering.py``) to ATen's sort-based ``index_put_`` accumulate, whose time
grows with the largest count: 0.15 ms a call on balanced routing, 0.44 ms at the skew of
the executor's initialised moeh1 model (up to 3.8 × the mean).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F

GROUP_ALIGN_ROWS = 8    # 16-byte alignment of bf16 token groups for grouped_mm's backward


def group_padding(counts: torch.Tensor, rows: int, align: int = GROUP_ALIGN_ROWS):
    """Where ``rows`` rows grouped by expert (``counts`` each) go when every group is padded
    to ``align`` rows: (dest [rows], padded sizes [experts], total rows). The total is
    sized on the host from what the host knows (rows + the most padding any group can take)
    and its slack goes to the last group as zero rows: reading the padded total back
    (``int(padded.sum())``) would be a device-to-host synchronisation a layer
    (costmodel/moe_host.py)."""
    a = align
    total = -(-(rows + counts.numel() * (a - 1)) // a) * a
    padded = (counts + a - 1) // a * a
    starts = torch.cumsum(padded, 0) - padded
    padded = torch.cat([padded[:-1], (total - starts[-1:])])
    within = torch.arange(rows, device=counts.device) - torch.repeat_interleave(
        torch.cumsum(counts, 0) - counts, counts, output_size=rows)
    return torch.repeat_interleave(starts, counts, output_size=rows) + within, padded, total


# The permutation's pieces are torch.library custom operators with registered autograd
# formulas rather than autograd Functions: under torch.compile a Function's outputs inside
# a checkpointed (fully recomputed) block are saved for backward instead of recomputed
# (two [k·T, h] tensors a layer, measured: benchmarks/moe_recompute_memory_gpu.py), while a
# custom operator is one node of the graph that activation checkpointing recomputes.

@torch.library.custom_op("meshplan::moe_sum_copies", mutates_args=())
def _sum_copies(rows: torch.Tensor, slot: torch.Tensor, weights: Optional[torch.Tensor],
                padded: bool) -> torch.Tensor:
    """[N, h]: for each token the (weighted) sum of its k rows ``rows[slot[t]]``; with
    ``padded`` a zero row follows the last (where dropped copies point: a rank's tp slice
    can keep none)."""
    if padded:
        rows = torch.cat([rows, rows.new_zeros((1,) + tuple(rows.shape[1:]))])
    return F.embedding_bag(slot, rows, mode="sum", per_sample_weights=weights)


@_sum_copies.register_fake
def _(rows, slot, weights, padded):
    return rows.new_empty((slot.shape[0],) + tuple(rows.shape[1:]))


@torch.library.custom_op("meshplan::moe_pad_rows", mutates_args=())
def pad_rows(x: torch.Tensor, dest: torch.Tensor, total: int) -> torch.Tensor:
    """``total`` rows, zero but rows ``dest`` = x (each named once); backward reads the
    gradient's rows ``dest`` back — without keeping x, which autograd's ``index_copy``
    keeps (its formula names its source)."""
    return x.new_zeros((total,) + tuple(x.shape[1:])).index_copy(0, dest, x)


@pad_rows.register_fake
def _(x, dest, total):
    return x.new_empty((total,) + tuple(x.shape[1:]))


def pad_rows_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[1])


def pad_rows_backward(ctx, grad):
    (dest,) = ctx.saved_tensors
    return grad.index_select(0, dest), None, None


pad_rows.register_autograd(pad_rows_backward, setup_context=pad_rows_setup)


@torch.library.custom_op("meshplan::moe_unpad_rows", mutates_args=())
def unpad_rows(y: torch.Tensor, dest: torch.Tensor) -> torch.Tensor:
    """``y.index_select(0, dest)`` for a ``dest`` naming each row of y at most once: the
    backward writes each gradient row back (``index_copy``) instead of accumulating it
    (``index_add``'s atomics)."""
    return y.index_select(0, dest)


@unpad_rows.register_fake
def _(y, dest):
    return y.new_empty((dest.shape[0],) + tuple(y.shape[1:]))


def unpad_rows_setup(ctx, inputs, output):
    y, dest = inputs
    ctx.save_for_backward(dest)
    ctx.rows = y.shape[0]


def unpad_rows_backward(ctx, grad):
    (dest,) = ctx.saved_tensors
    return grad.new_zeros((ctx.rows,) + tuple(grad.shape[1:])).index_copy(0, dest, grad), None


unpad_rows.register_autograd(unpad_rows_backward, setup_context=unpad_rows_setup)


@torch.library.custom_op("meshplan::moe_dispatch_rows", mutates_args=())
def _dispatch_rows(x: torch.Tensor, token: torch.Tensor, slot: torch.Tensor,
                   padded: bool) -> torch.Tensor:
    """The routed copies' rows in expert order, ``x.index_select(0, token)``; backward sums
    each token's copies (``slot`` [N, k]: the row of copy (t, i), or with ``padded`` a zero
    row after the last for a dropped copy) with ``embedding_bag``."""
    return x.index_select(0, token)


@_dispatch_rows.register_fake
def _(x, token, slot, padded):
    return x.new_empty((token.shape[0],) + tuple(x.shape[1:]))


def _dispatch_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[2])
    ctx.padded = inputs[3]


def _dispatch_backward(ctx, grad):
    (slot,) = ctx.saved_tensors
    return _sum_copies(grad, slot, None, ctx.padded), None, None, None


_dispatch_rows.register_autograd(_dispatch_backward, setup_context=_dispatch_setup)


@torch.library.custom_op("meshplan::moe_combine", mutates_args=())
def _combine(out: torch.Tensor, gates: torch.Tensor, slot: torch.Tensor, token: torch.Tensor,
             copy: torch.Tensor, padded: bool) -> torch.Tensor:
    """y[t] = Σᵢ gates[t, i] · out[slot[t, i]] (``gates`` [N, k]; ``token`` [R]: the token
    of each row of ``out``, ``copy`` [R]: its copy index t·k + i; ``padded`` as the
    dispatch); backward reads the tokens' gradients back by row."""
    return _sum_copies(out, slot, gates.to(out.dtype), padded)


@_combine.register_fake
def _(out, gates, slot, token, copy, padded):
    return out.new_empty((slot.shape[0],) + tuple(out.shape[1:]))


def _combine_setup(ctx, inputs, output):
    out, gates, _, token, copy, _ = inputs
    ctx.save_for_backward(out, gates, token, copy)


def _combine_backward(ctx, grad):
    out, gates, token, copy = ctx.saved_tensors
    g_rows = grad.index_select(0, token)
    gate_rows = gates.reshape(-1).index_select(0, copy)
    grad_out = g_rows * gate_rows.to(g_rows.dtype).unsqueeze(1)
    grad_gates = gates.new_zeros(gates.numel()).index_copy(
        0, copy, (g_rows * out).sum(-1).to(gates.dtype)).view_as(gates)
    return grad_out, grad_gates, None, None, None, None


_combine.register_autograd(_combine_backward, setup_context=_combine_setup)


def _expert_major_index(recv: torch.Tensor, total: int) -> torch.Tensor:
    """Row order that turns ``total`` rows received as (source, expert) chunks, sizes
    ``recv`` [sources, experts], into (expert, source) order."""
    sources, experts = recv.shape
    sizes = recv.reshape(-1)
    starts = torch.cumsum(sizes, 0) - sizes
    chunk = torch.arange(sources * experts, device=recv.device).view(sources, experts).t().reshape(-1)
    seg_len = sizes[chunk]
    seg_first = torch.cumsum(seg_len, 0) - seg_len
    within = torch.arange(total, device=recv.device) - torch.repeat_interleave(
        seg_first, seg_len, output_size=total)
    return torch.repeat_interleave(starts[chunk], seg_len, output_size=total) + within


def _count(values: torch.Tensor, size: int) -> torch.Tensor:
    """How often each of 0 .. size − 1 occurs in ``values`` (all in range): ``bincount``
    without its device-to-host reads (on CUDA it reads the input's min and max on the host
    to size its output), in int32 (module docstring: under ``torch.compile`` an int64 count
    is a sort whose time grows with skew)."""
    ones = torch.ones(values.shape, dtype=torch.int32, device=values.device)
    return torch.zeros(size, dtype=torch.int32, device=values.device).index_add_(
        0, values, ones).long()


def _rank_within_key(key: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """For each entry of ``key``, how many earlier entries share its key."""
    order = torch.argsort(key, stable=True)
    first = torch.cumsum(counts, 0) - counts
    rank = torch.empty_like(key)
    rank[order] = torch.arange(key.numel(), device=key.device) - first[key[order]]
    return rank


class SortedCopies(NamedTuple):
    """The routed copies of N tokens (copy t·k + i: token t's i-th expert) in expert order:
    ``copy`` [R] the copy each row holds, ``token`` [R] its token, ``slot`` [N, k] the row
    holding each copy (a dropped copy: R, a zero row the sums append: ``padded``),
    ``counts`` [E] rows per expert."""

    copy: torch.Tensor
    token: torch.Tensor
    slot: torch.Tensor
    counts: torch.Tensor
    padded: bool


def sort_copies(experts: torch.Tensor, keep: torch.Tensor | None, tokens: int, k: int,
                num_experts: int) -> SortedCopies:
    """Sort the copies routed to ``experts`` [N·k] (those ``keep`` keeps) by expert."""
    copy = torch.arange(tokens * k, device=experts.device)
    routed = experts
    if keep is not None:
        copy = keep.nonzero().squeeze(1)
        routed = experts[copy]
    order = torch.argsort(routed, stable=True)
    copy = copy[order]
    rows = torch.arange(copy.numel(), device=experts.device)
    slot = torch.full((tokens * k,), copy.numel() if keep is not None else 0,
                      dtype=torch.long, device=experts.device).index_copy(0, copy, rows)
    return SortedCopies(copy, torch.div(copy, k, rounding_mode="floor"), slot.view(tokens, k),
                        _count(routed, num_experts), keep is not None)


def dispatch(x2d: torch.Tensor, r: SortedCopies) -> torch.Tensor:
    """[R, h]: each kept copy's token row, in expert order."""
    return _dispatch_rows(x2d, r.token, r.slot, r.padded)


def combine(out: torch.Tensor, gates: torch.Tensor, r: SortedCopies) -> torch.Tensor:
    """[N, h]: each token's gate-weighted sum of its copies' expert outputs ``out`` [R, h]
    (``gates`` [N·k] in copy order; a dropped copy adds the zero row and gets no gradient)."""
    return _combine(out, gates.view(r.slot.shape), r.slot, r.token, r.copy, r.padded)


__all__ = ["GROUP_ALIGN_ROWS", "SortedCopies", "combine", "dispatch", "group_padding", "pad_rows",
           "sort_copies", "unpad_rows"]
