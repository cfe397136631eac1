"""Collectives that return their result, for the executor's autograd functions.

Every collective inside a ``torch.autograd.Function`` of the executor (tensor and sequence
parallelism's conjugate operators, Ulysses' and the experts' all-to-alls, the
vocabulary-parallel cross-entropy) goes through these: while traced, each returns a new
tensor computed from its input (a functional collective,
``torch.distributed._functional_collectives``) instead of filling a buffer in place
(``dist.all_to_all_single(out, x)``).

Why: torch 2.11's Dynamo, tracing such a function inside a compiled region, differentiates
the forward it traced when the function returns a fresh buffer a c10d collective filled in
place; that output then depends on nothing, its gradient is zero and the hand-written
backward never runs. The forward is right and nothing warns. Measured on 2 gloo ranks
(``tests/distributed/test_compiled_collective_grads.py`` run under torch 2.11): the compiled
gradient through the sequence-parallel reduce-scatter, Ulysses' all-to-all and the experts'
all-to-all was exactly 0 (eager's nonzero); through the in-place all-gather and all-reduce
it was right; torch 2.13 got every one right. (The same test found a fourth:
``scatter_to_sp`` returning a view of its input at batch 1, now a copy:
``tp_collectives._split_seq``.) On 2 x H200 (torch 2.11) the same defect left the experts of
a compiled ep 2 MoE layer without gradients (``benchmarks/moe_saved_copies.py``,
2026-11-30: gap 1.0) and made compiled tp 2 + SP layer rows time a backward shorter than
their forward (docs/benchmarks/calibration_checks.md). DeepSpeed met it in its Ulysses all-to-all
(deepspeedai/DeepSpeed#8491). A functional collective is an op Dynamo models as producing
its output from its input, so the function's own backward is kept, in 2.11 and 2.13 alike.

Only the traced path changes: while Dynamo traces (``torch.compiler.is_compiling()``) these
issue the functional collective; in eager mode the same blocking c10d call as before, so
eager steps, the calibration's memory accounting (a functional collective's eager result is
an ``AsyncCollectiveTensor`` subclass) and the cost model's counts of the ops a layer
dispatches are unchanged. ``group=None`` is the default group, as for c10d.
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol


def silence_collective_rename_notice() -> None:
    """torch >= 2.12 renamed the ``*_tensor`` collectives (c10d's and the functional ones);
    the old names exist in every version we support (2.11 lacks the new ones), so they stay
    and the notice is silenced.
    Called at import here and by ``meshplan.calibrate.bench_comm``."""
    warnings.filterwarnings("ignore", category=FutureWarning, message=r".*(reduce_scatter_tensor"
                            r"|all_gather_into_tensor|all_gather_tensor).* is deprecated")


silence_collective_rename_notice()


def _traced() -> bool:
    return torch.compiler.is_compiling()


def _group(group):
    return dist.group.WORLD if group is None else group


def all_reduce(x: torch.Tensor, group, op: str = "sum") -> torch.Tensor:
    """``op`` ("sum" or "max") of ``x`` over ``group``; ``x`` itself is left as it was when
    traced, and reduced in place (and returned) in eager mode where it is contiguous."""
    if _traced():
        return funcol.all_reduce(x.contiguous(), op, _group(group))
    x = x.contiguous()
    dist.all_reduce(x, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM,
                    group=group)
    return x


def all_gather_dim0(x: torch.Tensor, group) -> torch.Tensor:
    """The ranks' ``x`` concatenated along dim 0, in group-rank order."""
    x = x.contiguous()
    if _traced():
        return funcol.all_gather_tensor(x, 0, _group(group))
    n = dist.get_world_size(group)
    out = x.new_empty((n * x.shape[0],) + tuple(x.shape[1:]))
    dist.all_gather_into_tensor(out, x, group=group)
    return out


def reduce_scatter_dim0(x: torch.Tensor, group) -> torch.Tensor:
    """Sum of ``x`` over ``group``, this rank's 1/n slice of dim 0."""
    x = x.contiguous()
    if _traced():
        return funcol.reduce_scatter_tensor(x, "sum", 0, _group(group))
    n = dist.get_world_size(group)
    out = x.new_empty((x.shape[0] // n,) + tuple(x.shape[1:]))
    dist.reduce_scatter_tensor(out, x, group=group)
    return out


def all_to_all(x: torch.Tensor, group, out_splits: list[int] | None = None,
               in_splits: list[int] | None = None) -> torch.Tensor:
    """Rows of ``x`` (dim 0) exchanged: ``in_splits[j]`` rows to rank j, ``out_splits[j]``
    rows from it (equal parts where both are None)."""
    x = x.contiguous()
    if _traced():
        return funcol.all_to_all_single(x, out_splits, in_splits, _group(group))
    rows = x.shape[0] if out_splits is None else sum(out_splits)
    out = x.new_empty((rows,) + tuple(x.shape[1:]))
    dist.all_to_all_single(out, x, out_splits, in_splits, group=group)
    return out
