"""Pipeline schedules in closed form: step time, bubble and in-flight micro-batches.

The cost model calls these for every layout the planner evaluates, so they are plain
O(pp·vpp) arithmetic (no per-micro-batch loop). :mod:`meshplan.costmodel.pipeline_sim`
simulates the same schedules event by event; the tests check one against the other.

Model (shared with the simulator): virtual stage ``c`` (model order, ``pp·vpp`` of them)
lives on rank ``c % pp``; a micro-batch's forward on stage ``c`` takes ``forward_s[c]``,
its backward ``backward_s[c]`` (including the weight gradient ``wgrad_s[c]``); each rank
runs its operations in the schedule's fixed order and an operation starts when its rank
is free and its input has arrived (``p2p_s`` after the neighbouring stage finished).
The step time is then the longest path through the dependency graph of one step, and
every formula below is the length of a family of such paths, maximised in O(pp·vpp).

Each schedule's closed form, its published form for uniform stages, its source and its
error against the simulator live together: GPipe and 1F1B in
:mod:`meshplan.costmodel.pipeline_1f1b`, ZB-H1 in :mod:`meshplan.costmodel.pipeline_zb`,
interleaved 1F1B in :mod:`meshplan.costmodel.pipeline_interleaved`. This module checks the
inputs and picks the schedule's form, and gives the in-flight micro-batches (formulas and
sources: :func:`inflight_microbatches`).
"""

from __future__ import annotations

from typing import Sequence

from meshplan.costmodel.pipeline_1f1b import _gpipe, _one_f_one_b
from meshplan.costmodel.pipeline_interleaved import _interleaved
from meshplan.costmodel.pipeline_sim import (PipelineEvent, Simulation, check_p2p,
                                             check_schedule_args, check_times,
                                             interleaved_warmup, resolve_wgrad, simulate)
from meshplan.costmodel.pipeline_zb import _zero_bubble
from meshplan.spec import SCHEDULES
from meshplan.errors import ConfigError


def inflight_microbatches(schedule: str, pp: int, vpp: int, num_microbatches: int,
                          rank: int) -> float:
    """Peak number of micro-batch activation sets pipeline rank ``rank`` holds.

    Counted in units of "one micro-batch through all layers of that rank" (for the
    interleaved schedule: chunk activations divided by ``vpp``). An activation set is
    held from its forward until the pass that frees it: the backward, or for
    zero-bubble the weight-gradient pass (it still needs the layer inputs).

    * gpipe: ``m`` (all forwards before any backward; Huang et al. 2019).
    * 1f1b: ``min(pp - rank, m)`` (Narayanan et al. 2021 §2.2.1; Korthikanti et al.
      2022, arXiv 2205.05198, §4.2.3).
    * interleaved-1f1b: Megatron's warm-up ``2(pp-rank-1) + (vpp-1)·pp`` chunks plus one
      in the steady state, capped at ``m·vpp``, divided by ``vpp``; on rank 0 that is
      ``pp·(1 + (pp-1)/(pp·vpp))`` micro-batches (Korthikanti et al. 2022 §4.2.3).
      ``vpp = 1`` is plain 1F1B.
    * zero-bubble (ZB-H1): ``min(pp, m)`` on every rank. Qi et al. 2023 (§3.1) keep
      the *peak over ranks* equal to 1F1B's (rank 0 holds ``pp``); the later ranks defer
      ``rank`` weight-gradient passes and so hold ``pp`` too, not 1F1B's ``pp - rank``.
      (Between its B and W pass a micro-batch holds less than a full activation set,
      Qi et al. Table 1; counting it as a full set errs on the safe side.)
    """
    check_schedule_args(schedule, pp, vpp, num_microbatches)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < pp:
        raise ConfigError(f"rank must be an integer in [0, {pp - 1}] for pp = {pp}, "
                          f"got {rank!r}")
    m = num_microbatches
    if schedule == "gpipe":
        return float(m)
    if schedule == "zero-bubble":
        return float(min(pp, m))
    if schedule == "1f1b" or vpp == 1:
        return float(min(pp - rank, m))
    return min(interleaved_warmup(pp, vpp, m, rank) + 1, m * vpp) / vpp


def closed_form_step_time(schedule: str, forward_s: Sequence[float],
                          backward_s: Sequence[float], num_microbatches: int, *, pp: int,
                          vpp: int = 1, wgrad_s: Sequence[float] | None = None,
                          p2p_s: float = 0.0) -> float:
    """Time from the first forward to the last backward of one step (seconds).

    No optimizer step, no data-parallel communication. ``forward_s`` / ``backward_s``:
    per-micro-batch time of each *virtual* stage, length ``pp·vpp``, model order,
    virtual stage ``c`` on rank ``c % pp`` (Megatron interleaving). ``backward_s``
    includes the weight-gradient part; ``wgrad_s`` is that part alone (zero-bubble
    splits it off; default half of the backward). ``p2p_s``: one activation or gradient
    send between consecutive stages on different ranks. See the module docstring for
    the formulas, their sources and how close each is to :func:`simulate`.
    """
    check_schedule_args(schedule, pp, vpp, num_microbatches)
    n = pp * vpp
    f = check_times("forward_s", forward_s, n, pp, vpp)
    b = check_times("backward_s", backward_s, n, pp, vpp)
    w = resolve_wgrad(b, wgrad_s, pp, vpp, needed=schedule == "zero-bubble")
    c = check_p2p(p2p_s) if pp > 1 else 0.0
    return closed_form_unchecked(schedule, f, b, w, num_microbatches, pp, vpp, c)


def closed_form_unchecked(schedule: str, f: tuple, b: tuple, w: tuple, m: int, pp: int,
                          vpp: int, p2p_s: float) -> float:
    """:func:`closed_form_step_time` without its input checks, for callers that build the
    stage times themselves (the cost model's hot path): tuples of length pp·vpp, w ≤ b."""
    c = p2p_s if pp > 1 else 0.0
    if schedule == "gpipe":
        return _gpipe(f, b, m, pp, c)
    if schedule == "zero-bubble":
        return _zero_bubble(f, b, w, m, pp, c)
    if schedule == "1f1b" or vpp == 1:
        return _one_f_one_b(f, b, m, pp, c)
    return _interleaved(f, b, m, pp, vpp, c)


def bubble_time(schedule: str, forward_s: Sequence[float], backward_s: Sequence[float],
                num_microbatches: int, *, pp: int, vpp: int = 1,
                wgrad_s: Sequence[float] | None = None, p2p_s: float = 0.0) -> float:
    """Closed-form step time minus the busy time of the busiest rank (seconds).

    The busy time of rank ``r`` is ``m·Σ_{chunks on r}(forward + backward)``; what is
    left is the pipeline bubble plus exposed p2p latency on the critical path.
    """
    total = closed_form_step_time(schedule, forward_s, backward_s, num_microbatches,
                                  pp=pp, vpp=vpp, wgrad_s=wgrad_s, p2p_s=p2p_s)
    busy = max(num_microbatches * sum(float(forward_s[k * pp + r]) + float(backward_s[k * pp + r])
                                      for k in range(vpp))
               for r in range(pp))
    return total - busy


__all__ = ["SCHEDULES", "inflight_microbatches", "closed_form_step_time", "bubble_time",
           "simulate", "Simulation", "PipelineEvent"]
