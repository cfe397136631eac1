"""Timing of a callable: warm-up, then the median of repeated runs.

CUDA events on GPU (the kernel time on the stream, not the Python that queued it) and
``time.perf_counter`` on CPU, where every op is synchronous.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True, kw_only=True)
class Timing:
    median_s: float
    min_s: float
    max_s: float
    iters: int


def time_fn(fn: Callable[[], object], *, device, warmup: int = 3, iters: int | None = None,
            budget_s: float = 0.05, max_iters: int = 50, before: Callable[[], object] | None = None
            ) -> Timing:
    """Median time of ``fn()``. ``iters`` None: as many as fit in ``budget_s`` (3..max_iters).

    ``before`` runs before each timed call, outside the timed region (e.g. a barrier).
    """
    import torch
    cuda = torch.device(device).type == "cuda"
    for _ in range(warmup):
        if before:
            before()
        fn()
    if cuda:
        torch.cuda.synchronize()
    samples: list[float] = []
    n = iters or max_iters
    spent = 0.0
    for i in range(n):
        if before:
            before()
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            dt = start.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            fn()
            dt = time.perf_counter() - t0
        samples.append(dt)
        spent += dt
        if iters is None and i >= 2 and spent > budget_s:
            break
    return Timing(median_s=statistics.median(samples), min_s=min(samples), max_s=max(samples),
                  iters=len(samples))
