"""How much slower a layer row's blocks run in a sustained step than in the row's timed bursts.

A row is timed queued behind a spin kernel after a synchronize
(:func:`meshplan.calibrate.layer_timing._measure`): the GPU computes well under half of the
time, so its average power stays below the board's limit and the SM clock at its maximum. A
training step keeps the GPU busy back to back; where the blocks' work draws more than the
power limit at that clock, the GPU lowers its clock until it does not (NVIDIA's software
power cap, throttle reason ``0x4``), and every compute-bound kernel runs slower by up to the
clock ratio.

Measured on 1 × H200 (700 W limit, 1,980 MHz maximum; 2026-11-29,
``benchmarks/sustained_clock_gpu.py``, data ``docs/benchmarks/data/sustained_clock_h200_20261129.json``):
the same two built blocks, timed as calibrate times them and then back to back for 10 s —
GPT 1.22 B (h 2880, mb 8 × 2048) 16.18 → 18.20 ms a layer (**× 1.125**, SM clock
1,980 → 1,575 MHz), Llama 1.20 B (h 2048, mb 16 × 1024) × 1.022 (1,860 MHz), Llama 2.76 B
× 1.037 (1,785 MHz); a bare 8192³ bf16 GEMM × 1.18 (1,485 MHz). The clock settles within
about two seconds of sustained load (the power reading within one) and recovers as soon as
the load stops: right after the 10 s loop a burst ran at its first speed again. The
ratio is a property of the work's power density on this board, so it is measured, not
modelled: per built module (one model, tp, SP, ZeRO, compile, precision), on its
largest micro-batch without recomputation, after ``heat_s`` seconds of the same work back
to back, over ``time_s`` more; every row of that module carries it
(``MeasuredLayer.sustained_ratio``; ends likewise) and the cost model multiplies the rows'
GPU seconds by 1 + share × (max(1, ratio) − 1), the named correction ``sustained_clock``
(:mod:`meshplan.costmodel.clock`; read at the step's duty cycle, ``sustained_clock_duty``)
with the profile's ``sustained_clock_share``
(built-in 0.8 since 2026-12-04, 0.6 before: timed block by block inside a training step, a
GPT's layers ran at this loop's speed, but the loop's ratio moved by ± 1.5 % between calls and
one calibration overstated its validation's steps; the share was fitted post hoc on rc47/rc49
and changed to 0.8 after the held-out checks fp8h52 / fp8h53, :mod:`meshplan.costmodel.clock`).
CPU seconds are not scaled: the host's clock is not the GPU's. Measured error, held out as run on two never-run models
(rc50 Llama GQA 2.67 B, rc52 GPT MHA 1.23 B, rc51 Llama MHA 2.19 B; 1 × H200): step 1.69 %
mean / 4.80 % max over fifteen one-GPU layouts, against 3.23 % / 8.40 % for the rows as
timed — better on the GPT models, worse on rc51 (+2.1 % against 0.2 %)
(docs/benchmarks/transfer.md, "Sustained clock").

Where the host paces the work (the row's queued CPU dispatch is at least :data:`HOST_PACED`
of its GPU time), the GPU idles between kernels and is not at its power limit; the same work
in a step is host-bound too, so the ratio is 1 and the loop is not run. (The loop's own
dispatch time cannot tell: CUDA's launch queue fills and blocks the host at the GPU's pace.)
Limitation, measured: a step at a larger micro-batch than the module's largest timed one
need not be host-paced. fp8h56h100 (1 × H100, 2026-12-06; docs/benchmarks/fp8_checks.md)
calibrated at micro-batches 1-4, every module's loop host-paced and skipped, and ran its
plans at 16, GPU-bound: the bf16 arms ran 6.4-6.8 % slower than priced, about what the
ratio measured GPU-bound on other H100 profiles (compiled bf16 1.045-1.105) would add.
Calibrating at the plans' micro-batches (``meshplan calibrate --for-plan``) avoids it for
GPU-bound plans.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any, Callable

HEAT_S = 1.5      # load before timing: the clock settles within ~2 s (H200, 2026-11-29)
TIME_S = 1.0
HOST_PACED = 0.9  # CPU dispatch / GPU time of an iteration above which the loop is host-paced


def sustained_ratio(forward: Callable[[], Any], backward: Callable[[Any], None],
                    reset: Callable[[], None], *, device, burst_pass_s: float,
                    burst_cpu_s: float = 0.0,
                    agree_max: Callable[[list[float]], list[float]] = lambda v: v,
                    heat_s: float = HEAT_S, time_s: float = TIME_S) -> tuple[float, dict]:
    """(sustained / burst pass time on this rank, details) of ``forward`` + ``backward`` run
    back to back.

    ``burst_pass_s`` / ``burst_cpu_s``: the same pass's GPU time and CPU dispatch as the
    row's queued timing measured them (the ratio's denominator, and whether the host paces
    the loop: then the ratio is 1 and the loop is not run). ``agree_max``: the element-wise
    max over ranks, so every rank runs the same number of iterations (the passes may hold
    collectives); the caller averages the ratios over ranks as it does the rows' times. On
    CPU every op is synchronous and the loop is timed with ``perf_counter`` (the ratio then
    tests the wiring, not a clock)."""
    import torch
    cuda = torch.device(device).type == "cuda"
    paced = cuda and burst_cpu_s >= HOST_PACED * burst_pass_s
    skip = paced or burst_pass_s <= 0 or heat_s + time_s <= 0
    n_heat, n_time, skip_any = agree_max(
        [0.0 if skip else float(math.ceil(heat_s / burst_pass_s)),
         0.0 if skip else float(max(3, math.ceil(time_s / burst_pass_s))), float(skip)])
    if skip_any:   # every rank skips alike (the loop may hold collectives)
        return 1.0, {"host_paced": paced, "skipped": True}
    n_heat, n_time = int(n_heat), int(n_time)
    ends: list = []          # one event after each iteration (CUDA)
    times_s: list[float] = []  # the timed iterations: perf_counter on CPU, events on CUDA
    for i in range(n_heat + n_time):
        reset()
        t0 = time.perf_counter()
        y = forward()
        backward(y)
        del y
        if cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            ends.append(e)
            if i >= 4:
                # at most four iterations queued ahead: CUDA's launch queue is finite, and
                # the GPU stays busy as long as four iterations outlast one's dispatch
                ends[i - 4].synchronize()
        elif i >= n_heat:
            times_s.append(time.perf_counter() - t0)
    if cuda:
        torch.cuda.synchronize(device)
        # iteration i's GPU time: from the end of i - 1 to the end of i (back to back)
        times_s = [ends[i - 1].elapsed_time(ends[i]) / 1e3
                   for i in range(max(1, n_heat), n_heat + n_time)]
    pass_s = statistics.median(times_s)
    return pass_s / burst_pass_s, {"sustained_pass_s": pass_s, "burst_pass_s": burst_pass_s,
                                   "burst_cpu_s": burst_cpu_s, "host_paced": False,
                                   "iterations": n_time, "heat_iterations": n_heat}


def loop_seconds(total_s: float | None, device_type: str) -> tuple[float, float]:
    """(heat s, timed s) of the loop for ``meshplan calibrate --sustained-s total_s``: None
    is :data:`HEAT_S` + :data:`TIME_S` on a GPU and 0 (off) on CPU; a total splits in the
    same proportion."""
    default = HEAT_S + TIME_S
    total = (default if device_type == "cuda" else 0.0) if total_s is None else total_s
    return total * HEAT_S / default, total * TIME_S / default


# a module's recompute modes in the order its ratio prefers them: none first (its row's work
# is the module's own passes), then the modes that rerun (part of) the forward
_MODE_ORDER = {"none": 0, "selective": 1, "full": 2}


def ratio_rows(grid) -> dict[tuple, int]:
    """Per build key, the grid index its ratio is measured on: the largest micro-batch
    without recomputation (layers) or the largest micro-batch (the output end) — the row
    whose work draws the most power of what that module runs. A module timed only with
    recomputation (``--compile-rows selective,full``) takes its selective row, else its full
    one: the same kernels at the same power density, the forward's partly twice. Without
    this such a module's rows carried ratio 1: fp8h9's compiled bf16 tp 1 layouts (2 × H200)
    ran 2.9-11.5 % slower than predicted; post hoc at the ratio then measured on the
    selective row (1.117) 1.1-7.2 % (docs/benchmarks/fp8_checks.md "fp8h9 post hoc"). The
    embedding is left out (ratio 1): its gather is memory-bound (its loops read 0.93-1.00 on
    an H200)."""
    best: dict[tuple, int] = {}

    def rank(cfg) -> tuple[int, int]:
        return (0 if cfg.part else _MODE_ORDER.get(cfg.recompute, len(_MODE_ORDER)),
                -cfg.micro_batch)
    for idx, cfg in enumerate(grid):
        if cfg.part == "embedding":
            continue
        cur = best.get(cfg.build_key)
        if cur is None or rank(cfg) < rank(grid[cur]):
            best[cfg.build_key] = idx
    return best


__all__ = ["HEAT_S", "TIME_S", "HOST_PACED", "sustained_ratio", "loop_seconds", "ratio_rows"]
