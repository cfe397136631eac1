"""Measured rows at the clock a training step runs at: the named corrections
``sustained_clock`` and ``sustained_clock_duty``.

A calibration times each row in short bursts, at the GPU's highest clock; a step that keeps
the GPU busy back to back draws more than the board's power limit and runs at a lower one.

* ``sustained_clock`` (:func:`sustained_clock`): a row's GPU seconds × (1 + share ·
  (max(1, r) − 1)), r the row's ``sustained_ratio`` (its module back to back over its
  burst, :mod:`meshplan.calibrate.sustained`), share the profile's
  ``sustained_clock_share`` (0.8 since 2026-12-04, held out on fp8h52 / fp8h53: own-profile
  steps 4.3 → 2.4 % mean; 0.6 before, fitted post hoc on rc47 / rc49, 1 × H200).
* ``sustained_clock_duty`` (:func:`duty_scale`, :func:`step_duty`): a step that idles its
  GPU a share 1 − u of the time keeps a higher clock — the power limiter's average, with
  P ∝ f^k: r is read as r · (u / (1 − (1 − u) p_idle))^(1/k); k and p_idle from
  ``benchmarks/duty_cycle_clock_gpu.py`` (1 × H200). Post hoc on round 43 (2 × H200, 24
  layouts): 3.87 → 2.22 % mean, 13.83 → 8.02 % max (docs/benchmarks/transfer.md "Duty cycle
  and the power limiter").

:mod:`meshplan.costmodel.corrections` registers both; ``estimate`` composes a step once
more at its duty (:func:`at_duty`), the planner's tables at each configuration's and its
lower bounds at u = 0 (every row at its burst clock).
"""

from __future__ import annotations

from dataclasses import replace

from meshplan.hardware_profiles.corrections import CorrectionNumbers

SUSTAINED_CLOCK = "sustained_clock"
SUSTAINED_DUTY = "sustained_clock_duty"


def sustained_clock(numbers: CorrectionNumbers, tables):
    """Runtime "torch", measured rows: a row's GPU seconds times 1 + share × (max(1, r) − 1),
    where r is the row's ``sustained_ratio`` — its module's pass run back to back over the
    pass as the row was timed (queued behind a spin kernel, the GPU busy under half the time) — and
    share the profile's ``sustained_clock_share``. In a step the GPU is busy back to back;
    where the blocks' work draws more than the board's power limit at the maximum SM clock,
    the clock drops (software power cap) and compute-bound kernels slow down.
    ``meshplan calibrate`` measures r per built module (:mod:`meshplan.calibrate.
    sustained`); rows without it carry 1. Measured on 1 × H200 (2026-11-29,
    docs/benchmarks/transfer.md "Sustained clock"): r = 1.09-1.13 for three GPT models'
    blocks (SM clock 1,980 → 1,575-1,700 MHz), 1.02-1.04 for three Llama models'. Timed
    block by block inside a training step in the same call, a GPT's layers ran at the loop's
    per-layer time (within 0.5 %); but the loop's r moved by ± 1.5 % between calls (1.065 to
    1.094 for one module), and one calibration's r overstated its validation's steps, so the
    share is below 1: 0.6 from 2026-11-29 (fitted post hoc on the step errors of rc47 and
    rc49, 0.5-0.6 best then; held out as run on rc50-rc52, 1.69 % mean, 3.23 % without), 0.8
    from 2026-12-04 — with the cost model as it had become, 0.8 read nearer on rc47-rc52
    (fit 1.79 → 1.26 %, held out 1.46 → 0.89 %) and on the dense 1-GPU checks' compiled arms,
    and held it out on fp8h52 / fp8h53 (own-profile steps 4.3 → 2.4 %, 6 of 6 nearer; the
    other-family arms, whose layers carry no ratio, 4.3 → 4.2 %;
    docs/benchmarks/fp8_checks.md). Unchanged where switched off."""
    if not tables:
        return tables
    on = numbers.enabled(SUSTAINED_CLOCK)
    return tables.at_share(numbers.sustained_clock_share if on else 0.0, duty_scale(numbers))


def duty_scale(numbers: CorrectionNumbers) -> float:
    """What a step that keeps its GPU busy a share u < 1 of the time (``step_duty``, from
    :func:`step_duty`: the busiest rank's passes over the step — pipeline bubbles, exposed
    communication and the optimizer count as idle) leaves of a row's sustained ratio: the
    ratio r is read as r × (u / (1 − (1 − u) · p_idle))^(1/k), at least 1 (u = 0: every
    row at its burst clock).

    Mechanism: the power limiter holds the board's average power under its cap. A loop
    busy back to back settles where P(f_s) = cap, r being the clock's drop f_max / f_s; a
    GPU busy a share u and idle (P_idle) otherwise may draw P(f) = (cap − (1 − u) P_idle) / u
    while busy. With P ∝ f^k (dynamic power, f·V² with V rising with f), f / f_s =
    ((1 − (1 − u) p_idle) / u)^(1/k), p_idle = P_idle / cap. Measured on 1 × H200
    (benchmarks/duty_cycle_clock_gpu.py, 2026-11-29, docs/benchmarks/transfer.md "Duty cycle
    and the power limiter"): a bf16 GEMM and a GPT block in 30 ms busy chunks ran 4-13 %
    faster at duty 0.85-0.67 than back to back, k = 2.4-3.0 from those points, and the
    limiter's average reaches at least 30 ms (in 150 ms chunks about half the relief);
    ``sustained_power_exponent`` (k) and ``sustained_idle_power_share`` (p_idle, 81.5 W of
    700 W) are the profile's. Round 43's pipelined layouts (2 × H200, u = 0.6-0.76), priced
    at the back-to-back ratio, ran 4-6 % faster than predicted (post hoc: 3.87 → 2.22 %
    mean). 1 where switched off or u = 1."""
    u = numbers.step_duty
    if u >= 1.0 or not numbers.enabled(SUSTAINED_DUTY) or numbers.sustained_power_exponent <= 0:
        return 1.0
    if u <= 0.0:
        return 0.0
    return (u / (1.0 - (1.0 - u) * numbers.sustained_idle_power_share)) ** (
        1.0 / numbers.sustained_power_exponent)


def sustained_rows(t) -> bool:
    """Measured rows carrying sustained ratios, priced at a share > 0."""
    tables = getattr(t.parts.tables, "tables", t.parts.tables)  # TransferredTables wraps
    return (bool(t.parts.measured) and bool(getattr(tables, "has_sustained", False))
            and t.cluster.gpu.corrections.sustained_clock_share > 0)


def step_duty(forward_s, backward_s, microbatches: int, pp: int, step_s: float) -> float:
    """The GPU's busy share of a step, for :func:`duty_scale`: the busiest pipeline rank's
    passes (``forward_s`` / ``backward_s`` per micro-batch and virtual stage, rank r holding
    stages r, r + pp, ...) times the micro-batches, over the step; 1 at most.

    Example: pp = 2, one stage each, f = (10, 13), b = (23, 27) ms, m = 2, step 118 ms →
    rank 1 busy 2 · 40 = 80 ms, u = 0.68."""
    if step_s <= 0:
        return 1.0
    busy = max(sum(forward_s[c] + backward_s[c] for c in range(r, len(forward_s), pp))
               for r in range(pp))
    return min(1.0, microbatches * busy / step_s)


def at_duty(cluster, duty: float):
    """``cluster`` with its corrections' ``step_duty`` set (0: every row at its burst
    clock, the least any step's duty prices — the planner's lower bounds)."""
    numbers = cluster.gpu.corrections
    if numbers.step_duty == duty:
        return cluster
    return cluster.replace(gpu=replace(cluster.gpu, corrections=replace(numbers,
                                                                          step_duty=duty)))


def sustained_duty_applies(t) -> bool:
    """The sustained clock priced a step that idles part of the time (its second pass)."""
    numbers = t.cluster.gpu.corrections
    return (sustained_rows(t) and numbers.enabled(SUSTAINED_CLOCK)
            and duty_scale(numbers) < 1.0)


__all__ = ["SUSTAINED_CLOCK", "SUSTAINED_DUTY", "at_duty", "duty_scale", "step_duty",
           "sustained_clock", "sustained_duty_applies", "sustained_rows"]
