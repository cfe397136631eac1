"""Zero-bubble's split backward, timed on a layer stack: input-gradient pass (B) and
weight-gradient pass (W) run by torch.distributed.pipelining's own functions.

The zero-bubble schedule (Qi et al. 2023, arXiv 2401.10241 §2) runs a stage's backward as
two actions: B computes the gradient of the stage input only, W later the weight gradients
from the graph B kept. ``ScheduleInterleavedZeroBubble`` does it with
``stage_backward_input`` / ``stage_backward_weight`` (torch/distributed/pipelining/
_backward.py); in eager PyTorch the two together can cost much more than one fused backward
(with activation checkpointing, each weight group's gradient replays the recomputation), so
the cost model takes B and W from this measurement when it has it.
"""

from __future__ import annotations

import time
from typing import Callable


def split_functions():
    """torch's (stage_backward_input, stage_backward_weight), or None where this torch has
    no split backward (a private API).

    B raises out of memory as ``torch.cuda.OutOfMemoryError``: torch's re-raises every
    failure of its autograd call as a RuntimeError, which the callers' out-of-memory
    handling missed (the split-memory pass of a full-recompute row then stopped the
    calibration). And a B that fails leaves no hook behind (:func:`_drop_hooks`)."""
    try:
        from torch.distributed.pipelining._backward import (stage_backward_input as torch_b,
                                                            stage_backward_weight)
    except ImportError:
        return None
    import torch

    def stage_backward_input(*args, **kwargs):
        try:
            return torch_b(*args, **kwargs)
        except BaseException as exc:
            _drop_hooks(exc)
            if isinstance(exc, RuntimeError) \
                    and isinstance(exc.__cause__, torch.cuda.OutOfMemoryError):
                raise torch.cuda.OutOfMemoryError(str(exc.__cause__)) from exc
            raise
    return stage_backward_input, stage_backward_weight


def _drop_hooks(exc: BaseException) -> None:
    """Remove the hooks a failed ``stage_backward_input`` registered on the stage's graph.

    torch 2.11's removes them only after a B that succeeds; after one that fails (out of
    memory inside its autograd call), each hook's closure keeps its parameter group, whose
    intermediates are the graph's own nodes: a cycle through C++ nodes Python's collector
    cannot break, and the forward's saved activations stay allocated for good (GPT 2.82 B,
    seq 8192, 1 x H200, 2026-12-01: 110 GiB after a 6-block split at micro-batch 16; torch
    2.11 on CPU keeps the stack's tensors alike; later torch removes them in a ``finally``).
    The handles are in its frame, which the exception's traceback still holds."""
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_name == "stage_backward_input":
            for handle in frame.f_locals.get("handles", ()):
                handle.remove()
        tb = tb.tb_next


def split_backward_s(run_forward: Callable[[], tuple], params: list, *, device, iters: int = 3
                     ) -> tuple[float, float] | None:
    """Median (B seconds, W seconds) of ``iters`` split backwards, or None when this torch
    has no split backward (private API) or it fails. Out of memory propagates, so that
    the caller drops the module the pass ran on, frees memory and has every rank agree;
    read as "no split", the module stayed for the next rows (what kept the failed pass's
    graph allocated is :func:`_drop_hooks`'s).

    ``run_forward()`` returns ``(output, grad_output, input)`` of a fresh forward pass whose
    ``input`` requires grad.
    """
    import statistics

    import torch
    fns = split_functions()
    if fns is None:
        return None
    stage_backward_input, stage_backward_weight = fns
    cuda = torch.device(device).type == "cuda"
    bs, ws = [], []
    try:
        for i in range(iters + 1):                     # the first one warms up
            y, g, x = run_forward()
            if cuda:
                torch.cuda.synchronize()
                e0, e1, e2 = (torch.cuda.Event(enable_timing=True) for _ in range(3))
                e0.record()
            t0 = time.perf_counter()
            _, groups = stage_backward_input([y], [g], [x], iter(params))
            if cuda:
                e1.record()
            t1 = time.perf_counter()
            stage_backward_weight(iter(params), groups)
            if cuda:
                e2.record()
                e2.synchronize()
                b, w = e0.elapsed_time(e1) / 1e3, e1.elapsed_time(e2) / 1e3
            else:
                b, w = t1 - t0, time.perf_counter() - t1
            if i:
                bs.append(b)
                ws.append(w)
            del y, g, x, groups
    except torch.cuda.OutOfMemoryError:
        raise
    except Exception:  # private API changed shape between torch versions: no measurement
        return None
    return statistics.median(bs), statistics.median(ws)


__all__ = ["split_backward_s", "split_functions"]
