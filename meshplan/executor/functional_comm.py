"""Collectives that return their result, for the executor's autograd functions.

Every collective inside a ``torch.autograd.Function`` of the executor (tensor and sequence
parallelism's conjugate operators, Ulysses' and the experts' all-to-alls, the
vocabulary-parallel cross-entropy) goes through these: each returns a new tensor computed
from its input (a functional collective, ``torch.distributed._functional_collectives``)
instead of filling a buffer in place (``dist.all_to_all_single(out, x)``).

Why: torch 2.11's Dynamo, tracing such a function inside a compiled region, differentiates
the forward it traced when the function returns a fresh buffer a c10d collective filled in
place; that output then depends on nothing, its gradient is zero and the hand-written
backward never runs. The forward is right and nothing warns. Measured on 2 gloo ranks
(``tests/distributed/test_compiled_collective_grads.py`` run under torch 2.11): the compiled
gradient through the sequence-parallel reduce-scatter, Ulysses' all-to-all and the experts'
all-to-all was exactly 0 (eager's nonzero); through the in-place all-gather and all-reduce
it was right; torch 2.13 got every one right. (The same test found a fourth: ``scatter_to_sp``
returning a view of its input at batch 1, now a copy: ``tp_collectives._split_seq``.) On 2 x H200 (torch 2.11) the same defect left
the experts of a compiled ep 2 MoE layer without gradients (``benchmarks/moe_saved_copies.py``,
2026-11-30: gap 1.0) and made compiled tp 2 + SP layer rows time a backward shorter than
their forward (docs/calibrate.md). DeepSpeed met it in its Ulysses all-to-all
(deepspeedai/DeepSpeed#8491). A functional collective is an op Dynamo models as producing
its output from its input, so the function's own backward is kept, in 2.11 and 2.13 alike.

In eager mode a functional collective returns an ``AsyncCollectiveTensor``; these wait for it
and return the plain tensor, as the blocking c10d call did.
"""

from __future__ import annotations

import torch
import torch.distributed._functional_collectives as funcol


def _done(t: torch.Tensor) -> torch.Tensor:
    return t.wait() if isinstance(t, funcol.AsyncCollectiveTensor) else t


def all_reduce(x: torch.Tensor, group, op: str = "sum") -> torch.Tensor:
    """``op`` ("sum", "max", ...) of ``x`` over ``group``; ``x`` itself is left as it was."""
    return _done(funcol.all_reduce(x.contiguous(), op, group))


def all_gather_dim0(x: torch.Tensor, group) -> torch.Tensor:
    """The ranks' ``x`` concatenated along dim 0, in group-rank order."""
    return _done(funcol.all_gather_tensor(x.contiguous(), 0, group))


def reduce_scatter_dim0(x: torch.Tensor, group) -> torch.Tensor:
    """Sum of ``x`` over ``group``, this rank's 1/n slice of dim 0."""
    return _done(funcol.reduce_scatter_tensor(x.contiguous(), "sum", 0, group))


def all_to_all(x: torch.Tensor, group, out_splits: list[int] | None = None,
               in_splits: list[int] | None = None) -> torch.Tensor:
    """Rows of ``x`` (dim 0) exchanged: ``in_splits[j]`` rows to rank j, ``out_splits[j]``
    rows from it (equal parts where both are None)."""
    return _done(funcol.all_to_all_single(x.contiguous(), out_splits, in_splits, group))
