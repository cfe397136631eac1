"""Timing of a callable: warm-up, then the median of repeated runs.

CUDA events on GPU and ``time.perf_counter`` on CPU, where every op is synchronous. On GPU
a synchronized iteration (the stream idle when ``fn`` starts) times max(GPU, CPU dispatch):
the events bracket kernels the GPU runs as soon as Python launches them, so an op whose
forward and backward take less GPU time than their launch through autograd (0.2-0.3 ms on
the lent H200 hosts) reads the CPU's time. ``queued=True`` times the GPU alone: a spin
kernel (``torch.cuda._sleep``) holds the stream while the CPU queues ``fn``, as the layer
rows are timed (:mod:`meshplan.calibrate.layer_timing`); a training step keeps its GPU
busy the same way, the CPU's dispatch being priced apart (``host_op_dispatch_s``).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

# A longer spin cannot help: when thousands of kernels are queued, CUDA's launch queue fills
# and the CPU waits for the GPU whatever the spin (seen with zero-bubble's weight pass of a
# fully recomputed 6-block stack queued, 2026-11-26: tripling without a bound ran for minutes)
SPIN_MAX_S = 2.0
# ``budget_s`` counts the timed calls; spins and synchronizations around them may take this
# many times as long before sampling stops (a bound on wall time, not a measured number)
WALL_BUDGET_FACTOR = 20.0


@dataclass(frozen=True, kw_only=True)
class Timing:
    median_s: float
    min_s: float
    max_s: float
    iters: int


def spin_rate(device, cycles: int = 5_000_000) -> float:
    """Cycles per second of ``torch.cuda._sleep`` on ``device`` (one spin of ``cycles``,
    timed)."""
    import torch
    torch.cuda.synchronize(device)
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    torch.cuda._sleep(cycles)
    e1.record()
    e1.synchronize()
    return cycles / max(1e-6, e0.elapsed_time(e1) / 1e3)


def time_fn(fn: Callable[[], object], *, device, warmup: int = 3, iters: int | None = None,
            budget_s: float = 0.05, max_iters: int = 50, before: Callable[[], object] | None = None,
            queued: bool = False) -> Timing:
    """Median time of ``fn()``. ``iters`` None: as many as fit in ``budget_s`` (3..max_iters).

    ``before`` runs before each timed call, outside the timed region (e.g. a barrier).
    ``queued`` (CUDA, where torch has ``torch.cuda._sleep``): each timed call is queued
    behind a spin longer than its dispatch (module docstring); a call the GPU reached before
    the CPU had queued all of it is timed again behind a spin three times as long. The spin
    is sized from the last warm-up call, so a first call's one-time work does not hold every
    sample behind a long spin; sampling also stops once the loop's wall time passes
    ``WALL_BUDGET_FACTOR × budget_s`` (with at least three samples).
    """
    import torch
    cuda = torch.device(device).type == "cuda"
    queued = queued and cuda and hasattr(torch.cuda, "_sleep")
    spin_s = 0.0
    for _ in range(warmup):
        if before:
            before()
        t0 = time.perf_counter()
        fn()
        if queued:
            torch.cuda.synchronize()
            # the last warm-up call sizes the spin: a first call's one-time work (kernel
            # loading, autotuning) ran 60 s once and held every sample behind SPIN_MAX_S
            spin_s = min(SPIN_MAX_S, 1.5 * (time.perf_counter() - t0) + 1e-3)
    if cuda:
        torch.cuda.synchronize()
    rate = spin_rate(device) if queued else 0.0
    samples: list[float] = []
    n = iters or max_iters
    spent = 0.0
    retries = 0
    i = 0
    loop_t0 = time.perf_counter()
    while i < n:
        if before:
            before()
        if cuda:
            if queued:
                start, end, _, ok = _queued_call(fn, spin_s, rate)
                if not ok and retries < 4:
                    # the GPU was idle before the CPU had queued everything: not GPU time alone
                    end.synchronize()
                    spin_s, retries = _longer_spin(spin_s), retries + 1
                    continue
            else:
                start, end = (torch.cuda.Event(enable_timing=True),
                              torch.cuda.Event(enable_timing=True))
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
        i += 1
        wall_s = time.perf_counter() - loop_t0
        if iters is None and i >= 3 and (spent > budget_s
                                         or wall_s > WALL_BUDGET_FACTOR * budget_s):
            break
    return Timing(median_s=statistics.median(samples), min_s=min(samples), max_s=max(samples),
                  iters=len(samples))


def time_queued_split(fn: Callable[[], object], *, device, iters: int = 9) -> tuple[float, float]:
    """(GPU-busy seconds, CPU dispatch seconds) of ``fn``: medians over ``iters`` calls, each
    queued behind a spin kernel three times its synchronized time (a call the GPU reached
    before the CPU had queued it all is timed again behind a spin three times as long, up
    to ``SPIN_MAX_S``). CUDA only: the split a synchronized timing, max(GPU, CPU), hides
    (:func:`time_fn`'s ``queued`` keeps the GPU's part alone)."""
    import torch
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize(device)
    spin_s = min(SPIN_MAX_S, 3 * (time.perf_counter() - t0) + 2e-3)
    rate = spin_rate(device)
    samples: list[tuple[float, float, bool]] = []
    while len(samples) < iters:
        start, end, cpu_s, queued = _queued_call(fn, spin_s, rate)
        if not queued and spin_s < SPIN_MAX_S:
            end.synchronize()
            spin_s = _longer_spin(spin_s)
            continue
        end.synchronize()
        samples.append((start.elapsed_time(end) / 1e3, cpu_s, queued))
    return split_medians(samples)


def _queued_call(fn: Callable[[], object], spin_s: float, rate: float):
    """One call of ``fn`` queued behind a spin kernel of ``spin_s`` (``rate``: the spin's
    cycles a second): its (start, end) CUDA events, the CPU seconds it took to dispatch, and
    whether the CPU had queued all of it before the GPU reached the start event (False: the
    events hold some of the CPU's time, not the GPU's alone)."""
    import torch
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(int(spin_s * rate))
    start.record()
    t0 = time.perf_counter()
    fn()
    cpu_s = time.perf_counter() - t0
    end.record()
    return start, end, cpu_s, not start.query()


def _longer_spin(spin_s: float) -> float:
    """The spin a call the GPU caught up with is timed again behind: three times as long,
    up to :data:`SPIN_MAX_S`."""
    return min(SPIN_MAX_S, 3 * spin_s)


def split_medians(samples: list[tuple[float, float, bool]]) -> tuple[float, float]:
    """(GPU, CPU) medians of (gpu_s, cpu_s, queued) samples over those that queued where
    any did: a call the CPU could not queue behind even the longest spin waited for the GPU
    inside its dispatch, so its CPU seconds are not dispatch (calibrate's layer rows read
    a 774 ms spin as dispatch so, moeh20, 2026-12-01)."""
    kept = [x for x in samples if x[2]] or samples
    return (statistics.median(x[0] for x in kept), statistics.median(x[1] for x in kept))

