"""Timing one micro-batch's forward and backward: queued behind a spin kernel, or synchronized.

:class:`_Queue` and :func:`_measure` give GPU-busy and CPU-dispatch seconds apart, with the
allocator's readings (why a step needs both: :mod:`meshplan.calibrate.bench_layers`);
:func:`steady_cpu` the CPU's dispatch of passes run back to back, as in a step;
:func:`_kept_bytes` is what one more micro-batch in flight keeps alive.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace
from typing import Any, Callable, Sequence

from meshplan.calibrate.layer_rows import Sample
from meshplan.calibrate.timing import SPIN_MAX_S, spin_rate

WARMUP = 2            # the first iteration allocates the parameter gradients


def _nbytes(t) -> float:
    return float(t.numel() * t.element_size())


class _Queue:
    """GPU-busy timing: a spin kernel (``torch.cuda._sleep``) holds the stream while the CPU
    queues the measured work, so CUDA events time the GPU alone and ``perf_counter`` the
    CPU's dispatch alone. In a training step the CPU runs ahead of the GPU across many
    layers and micro-batches, so a step costs about max(Σ CPU, Σ GPU) rather than the sum of
    synchronized per-layer timings, each of which is max(CPU, GPU) of its own layer; the cost
    model needs the two separately (:mod:`meshplan.costmodel.estimate`)."""

    def __init__(self, device, agree: Callable[[list[float]], list[float]]):
        self.agree = agree     # element-wise max over ranks (every rank must queue alike)
        rate = spin_rate(device, 20_000_000)
        self.cycles_per_s = agree([-rate])[0] * -1.0           # the slowest rank's rate

    def sleep(self, seconds: float) -> None:
        import torch
        torch.cuda._sleep(int(seconds * self.cycles_per_s))


def _measure(forward: Callable[[], Any], backward: Callable[[Any], None],
             reset: Callable[[], None], *, device, warmup: int, iters: int, barrier,
             queue: _Queue | None = None) -> tuple[list[Sample], float]:
    """Warm-up, then ``iters`` timed iterations; returns the samples and the output's bytes.

    With ``queue`` (CUDA) the timed iterations are queued behind a spin kernel longer than
    the CPU's dispatch (checked: the GPU must still be spinning when the CPU has queued the
    whole backward, else the spin is tripled and the iteration repeated), giving GPU-busy
    forward/backward seconds and CPU dispatch seconds; the warm-up iterations are
    synchronized timings, which size the spin. Without it (CPU, or synchronized timing on
    purpose) every iteration is synchronized and the CPU fields are 0.
    """
    import torch
    cuda = device.type == "cuda"
    samples: list[Sample] = []
    out_bytes = 0.0
    spin_s = 0.0
    attempts = 0
    i = 0
    while i < warmup + iters:
        queued = queue is not None and i >= warmup
        reset()
        barrier()
        if cuda:
            torch.cuda.synchronize(device)
            mem0 = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
            e0, e1, e2 = (torch.cuda.Event(enable_timing=True) for _ in range(3))
            if queued:
                queue.sleep(spin_s)
            e0.record()
            t0 = time.perf_counter()
            y = forward()
            t1 = time.perf_counter()
            e1.record()
            mem1 = torch.cuda.memory_allocated(device)   # allocations are made at dispatch
            backward(y)
            t2 = time.perf_counter()
            e2.record()
            # the GPU must not have reached e0 before the CPU queued everything
            valid = not queued or not e0.query()
            e2.synchronize()
            peak = torch.cuda.max_memory_allocated(device)
            s = Sample(e0.elapsed_time(e1) / 1e3, e1.elapsed_time(e2) / 1e3,
                       float(mem0), float(mem1), float(peak),
                       (t1 - t0) if queued else 0.0, (t2 - t1) if queued else 0.0)
        else:
            t0 = time.perf_counter()
            y = forward()
            t1 = time.perf_counter()
            backward(y)
            t2 = time.perf_counter()
            s, valid = Sample(t1 - t0, t2 - t1), True
        out_bytes = _nbytes(y)
        del y
        if queue is not None and cuda:
            # every rank takes the same decisions from agreed values (collectives follow)
            if queued:
                valid = queue.agree([0.0 if valid else 1.0])[0] == 0.0
            if i == warmup - 1 or (queued and not valid):
                # size the spin from the synchronized time (>= the CPU's dispatch); after a
                # failed check, triple it
                base = s.forward_s + s.backward_s if i < warmup else 2 * spin_s
                spin_s = min(SPIN_MAX_S, queue.agree([1.5 * base + 2e-3])[0])
            if queued:
                attempts += 1
                if not valid and attempts < iters + 4:
                    continue
                if not valid:   # gave up: a synchronized-like sample, flagged
                    s = replace(s, queued_ok=False)
        if i >= warmup:
            samples.append(s)
        i += 1
    return samples, out_bytes


def steady_cpu(forward: Callable[[], Any], backward: Callable[[Any], None],
               reset: Callable[[], None], *, device, barrier, micro_batches: int,
               warmup: int = 0, windows: int = 1, gap_s: float = 0.0
               ) -> tuple[float, float, float]:
    """(forward, backward) CPU dispatch seconds of a stack run as a step runs it, and how
    long the GPU took over the same passes relative to the CPU.

    ``warmup`` passes first (they compile and allocate the gradients), then ``windows``
    windows ``gap_s`` apart, each of ``micro_batches`` forward + backward passes back to
    back with nothing holding the GPU; a window's first pass (it starts on an empty queue)
    is dropped and its others' medians kept. Returned: the windows' mean forward and
    backward, and the median of their third values. Several windows because the host's
    speed moves from one second to the next: one 4-pass window (about 0.1 s) of an eager
    8-block stack read its backward anywhere in 2.2-3.6 ms a layer over six windows a second
    apart, where the training step, which spans seconds, dispatched about 3.0-3.3
    (docs/benchmarks/host.md, section 7); a step's host time is a sum over its passes,
    hence the mean.
    The reading is the host's dispatch only where the GPU waited for it: the third value,
    the device's span of the counted passes over the host's, is then about 1 or below; well
    above 1 the CPU ran ahead and may have waited for room in CUDA's launch queue. 0 off
    CUDA. On a deep stack this reads what a step dispatches where the 2- and 4-block queued
    readings, fitted, under-subtract a call's own part (docs/benchmarks/host.md, section 6:
    1 x H200, fp8h20's model, compiled, 16 blocks: backward 7-21 % below the fit, within
    3 % of the step's for its fp8 module)."""
    if micro_batches < 2:
        raise ValueError(f"steady_cpu: micro_batches={micro_batches}, at least 2 (the first "
                         f"is dropped)")
    if windows < 1:
        raise ValueError(f"steady_cpu: windows={windows}, at least 1")
    for _ in range(warmup):
        reset()
        y = forward()
        backward(y)
        del y
    readings = []
    for w in range(windows):
        if w and gap_s > 0:
            time.sleep(gap_s)
        readings.append(_steady_window(forward, backward, reset, device=device,
                                       barrier=barrier, micro_batches=micro_batches))
    return (statistics.fmean(r[0] for r in readings),
            statistics.fmean(r[1] for r in readings),
            statistics.median(r[2] for r in readings))


def _steady_window(forward, backward, reset, *, device, barrier,
                   micro_batches: int) -> tuple[float, float, float]:
    """One window of :func:`steady_cpu`: its passes' median forward and backward CPU
    seconds (the first pass dropped) and the GPU's span over the CPU's (0 off CUDA)."""
    import torch
    cuda = device.type == "cuda"
    forwards: list[float] = []
    backwards: list[float] = []
    barrier()
    if cuda:
        torch.cuda.synchronize(device)
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
    t_start = time.perf_counter()
    for i in range(micro_batches):
        reset()
        if i == 1:
            if cuda:
                start.record()
            t_start = time.perf_counter()
        t0 = time.perf_counter()
        y = forward()
        t1 = time.perf_counter()
        backward(y)
        t2 = time.perf_counter()
        del y
        if i:
            forwards.append(t1 - t0)
            backwards.append(t2 - t1)
    host_s = time.perf_counter() - t_start
    ratio = 0.0
    if cuda:
        end.record()
        end.synchronize()
        ratio = start.elapsed_time(end) / 1e3 / max(host_s, 1e-9)
    return statistics.median(forwards), statistics.median(backwards), ratio


def _bad(samples: Sequence[Sample]) -> float:
    """Samples whose queued timing failed its check (reported, not used to choose)."""
    return float(sum(not s.queued_ok for s in samples))


def _kept_bytes(forward_fresh: Callable[[], Any], device) -> float:
    """Bytes a *second* forward pass keeps alive (its saved tensors and its output): what
    one more micro-batch in flight costs. The first pass of a step also fills one-time
    caches (autocast's 16-bit weight copies), which the cost model counts once per step."""
    import torch
    torch.cuda.synchronize(device)
    y1 = forward_fresh()
    m1 = torch.cuda.memory_allocated(device)
    y2 = forward_fresh()
    m2 = torch.cuda.memory_allocated(device)
    del y1, y2
    return float(m2 - m1)
