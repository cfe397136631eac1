"""Diagnostic: time every transformer block's forward and backward inside a real step.

The step's phases (:class:`~meshplan.executor.measure.StepTimer`) time each micro-batch's
forward and backward as a whole. Round 21 (docs/benchmarks/accuracy.md) found GPT's
FSDP2-over-data-parallel steps 6-13 % slower in both passes than the calibration's per-layer
rows, with no idle GPU time; whether every block runs slower than its row, or the first
blocks of a step do (the all-gathers starting up), needs each block timed on the device.

:func:`add_block_marks` puts a mark before and after each block's forward and backward
(module hooks; CUDA events on GPU, like the phases), so the step's phases gain
``block i forward`` / ``block i backward`` (the block itself) and ``before block i
forward`` / ``before block i backward`` (what ran between the previous mark and the
block: the embedding, the output layer and loss, FSDP2's waits). With the marks on, a
micro-batch's ``forward j`` / ``backward j`` phase is only what follows its last block.

Layouts without a pipeline only (pp = 1): under ``torch.distributed.pipelining`` the
zero-bubble schedule splits a stage's backward into two autograd calls, which full backward
hooks do not follow. With compiled blocks the marks run outside the compiled code
(``torch.compiler.disable``), so they time the compiled block from its edges. The hooks add four CUDA event records per block and micro-batch; the
step times of a run with marks are for this diagnostic, not for accuracy.

    torchrun --nproc-per-node 4 -m meshplan.executor.run --plan plan.json --block-marks
"""

from __future__ import annotations

from typing import Callable

from meshplan.errors import ExecutorError


def check_block_marks(layout) -> None:
    """Refuse a layout the marks cannot time (a pipeline): ExecutorError naming it."""
    if layout.pp != 1:
        raise ExecutorError(f"--block-marks times the blocks of a layout without a pipeline; "
                            f"{layout.short()} has pp = {layout.pp} (use a pp = 1 layout)")


def add_block_marks(trainer, mark: Callable[[str], None]) -> list:
    """Register the marks on every block of ``trainer``'s parts; returns the hook handles
    (``handle.remove()`` takes them off). ``mark(name)`` ends phase ``name`` of the running
    step (:meth:`StepTimer.mark`, a no-op outside a timed step)."""
    check_block_marks(trainer.layout)
    import torch
    # kept out of compiled blocks: traced by Dynamo, a hook's CUDA event is the trace's
    # object and is never recorded at run time (2 x H200, compiled tp 2 + SP: "Both events
    # must be recorded before calculating elapsed time" at the report); eager, it costs a
    # graph break at the block's edges, where the compiled region ends anyway
    mark = torch.compiler.disable(mark)
    handles = []
    for part in trainer.parts:
        for key, block in part.module.layers.items():
            i = int(key)
            handles += [
                block.register_forward_pre_hook(
                    lambda _m, _args, i=i: mark(f"before block {i} forward")),
                block.register_forward_hook(
                    lambda _m, _args, _out, i=i: mark(f"block {i} forward")),
                block.register_full_backward_pre_hook(
                    lambda _m, _grad_out, i=i: mark(f"before block {i} backward")),
                block.register_full_backward_hook(
                    lambda _m, _grad_in, _grad_out, i=i: mark(f"block {i} backward")),
            ]
    return handles
