"""Discrete-event simulation of one pipeline-parallel training step.

Each pipeline rank runs its operations in the fixed per-rank order of the schedule; an
operation starts when its rank is free *and* its input has arrived:

* ``F`` of virtual stage ``c`` needs ``F`` of stage ``c-1`` (same micro-batch) + ``p2p_s``;
* ``B`` of stage ``c`` needs ``B`` of stage ``c+1`` + ``p2p_s``; the loss stage's ``B``
  follows its own ``F``;
* ``W`` (weight gradient, zero-bubble only) needs its own ``B``.

``p2p_s`` is charged whenever the two stages live on different ranks (every boundary
when pp ≥ 2). With fixed orders and as-soon-as-possible starts, every start time is the
longest path to it in the dependency graph, so the step time is that graph's critical
path; :mod:`meshplan.costmodel.pipeline` evaluates the same quantity in closed form.

Per-rank orders (micro-batches 0-indexed, virtual stage ``c`` on rank ``c % pp``,
Megatron's interleaving, Narayanan et al. 2021, arXiv 2104.04473, §2.2):

* ``gpipe`` (Huang et al. 2019, arXiv 1811.06965): all ``F`` then all ``B``, both in
  micro-batch order (as torch.distributed.pipelining's ``ScheduleGPipe`` runs them).
* ``1f1b`` (PipeDream-Flush, Narayanan et al. 2021 §2.2.1, Fig. 4 top): rank ``i`` runs
  ``min(pp-i-1, m)`` warm-up forwards, then alternates one ``F`` and one ``B``, then
  drains the remaining ``B``.
* ``interleaved-1f1b`` (Narayanan et al. 2021 §2.2.2, Fig. 4 bottom; Megatron-LM
  ``forward_backward_pipelining_with_interleaving``; torch ``ScheduleInterleaved1F1B``):
  the k-th forward on a rank is chunk ``(k mod pp·v) // pp`` of micro-batch
  ``(k // (pp·v))·pp + k mod pp``; the k-th backward walks the chunks in reverse
  (``v-1-(k mod pp·v)//pp``); warm-up is ``min(2(pp-i-1) + (v-1)·pp, m·v)`` chunk
  forwards, then 1F1B, then cool-down. Needs ``m % pp == 0``. Older Megatron versions ran
  all forwards first when ``m == pp``; current Megatron and torch do not, nor does this.
* ``zero-bubble`` = ZB-H1 (Qi et al. 2023, arXiv 2401.10241, §3.1, Fig. 3 top):
  the backward is split into ``B`` (input gradient, ``backward - wgrad``) and ``W``
  (weight gradient, ``wgrad``). Rank ``i`` runs the 1F1B order with ``B`` in place of
  the full backward, and from its ``i``-th backward on (0-indexed) follows every ``B``
  with the oldest pending ``W``; the ``i`` deferred ``W`` run at the end, filling the
  drain bubble. This is torch's ``ScheduleInterleavedZeroBubble`` with one stage per
  rank (``num_1f1b_microbatches = rank``, warm-up ``pp - 1 - rank``). Every rank then
  holds up to ``pp`` micro-batches until their ``W`` (the first rank's 1F1B peak).

Measured error: none of its own — it is the reference the closed forms are tested against
(tests/unit/test_pipeline.py, including that the interleaved order is Megatron's and that
zero-bubble defers each rank's W passes as ZB-H1 does); it assumes fixed per-operation
times, so what torch's p2p order adds is :mod:`meshplan.costmodel.torch_p2p`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import gt as _gt
from typing import Sequence

from meshplan.spec import SCHEDULES
from meshplan.errors import ConfigError

KINDS = ("F", "B", "W")
_INF = float("inf")
_F, _B, _W = 0, 1, 2


@dataclass(frozen=True, kw_only=True)
class PipelineEvent:
    """One operation of the simulated step on one pipeline rank.

    ``chunk`` is the rank's local model chunk (0..vpp-1); the virtual stage in model
    order is ``chunk * pp + rank``. ``kind``: "F" forward, "B" backward (input
    gradient only for zero-bubble, full backward otherwise), "W" weight gradient.
    """

    rank: int
    chunk: int
    microbatch: int
    kind: str
    start_s: float
    end_s: float

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True, kw_only=True)
class Simulation:
    """The simulated timeline of one step (first forward at t = 0)."""

    step_time_s: float
    events: tuple[PipelineEvent, ...]
    busy_s: tuple[float, ...]      # per rank: sum of its operations' durations

    def idle_s(self, rank: int) -> float:
        """Time rank ``rank`` waits during the step (its share of the bubble)."""
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < len(self.busy_s):
            raise ConfigError(f"rank must be an integer in [0, {len(self.busy_s) - 1}], got {rank!r}")
        return self.step_time_s - self.busy_s[rank]

    @property
    def bubble_s(self) -> float:
        """Step time minus the busiest rank's busy time."""
        return self.step_time_s - max(self.busy_s)

    def peak_inflight(self, rank: int) -> int:
        """Peak number of chunk-activation sets rank ``rank`` holds, read off the timeline.

        An ``F`` adds one when it starts; the operation that frees it (``W`` when the
        timeline has weight-gradient events, else ``B``) removes one when it ends.
        """
        has_w = any(e.kind == "W" for e in self.events)
        free_kind = "W" if has_w else "B"
        deltas = []
        for e in self.events:
            if e.rank != rank:
                continue
            if e.kind == "F":
                deltas.append((e.start_s, 1))
            elif e.kind == free_kind:
                deltas.append((e.end_s, -1))
        # at equal times free before allocate: a rank runs one op at a time, so an op
        # ending at t and the next starting at t are sequential, not overlapping
        deltas.sort()
        live = peak = 0
        for _, d in deltas:
            live += d
            peak = max(peak, live)
        return peak


# ----------------------------------------------------------------------------- checks

def _check_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")


def check_schedule_args(schedule: str, pp: int, vpp: int, num_microbatches: int) -> None:
    """Validate the scalar arguments shared by every pipeline function."""
    if schedule not in SCHEDULES:
        raise ConfigError(
            f"unknown pipeline schedule {schedule!r}; choose one of "
            f"{', '.join(repr(s) for s in SCHEDULES)}")
    _check_int("pp", pp)
    _check_int("vpp", vpp)
    _check_int("num_microbatches", num_microbatches)
    if vpp > 1 and schedule != "interleaved-1f1b":
        raise ConfigError(
            f"vpp = {vpp} needs schedule='interleaved-1f1b' (got {schedule!r}); "
            f"use vpp=1 for {schedule!r}")
    if vpp > 1 and num_microbatches % pp != 0:
        raise ConfigError(
            f"interleaved-1f1b needs the number of micro-batches to be a multiple of pp: "
            f"m = {num_microbatches} is not divisible by pp = {pp} "
            f"(valid m: {pp}, {2 * pp}, {3 * pp}, ...)")


def check_times(name: str, values: Sequence[float], expected_len: int, pp: int,
                vpp: int) -> Sequence[float]:
    """``values`` (a list or tuple of numbers is returned as is, anything else as a tuple
    of floats), or ConfigError if the length or a value is wrong."""
    try:
        n = len(values)
        lo = min(values)
        total = sum(values)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a sequence of {expected_len} times in seconds, "
                          f"got {values!r}") from None
    if n != expected_len:
        raise ConfigError(
            f"{name} has {n} entries; pp·vpp = {pp}·{vpp} = {expected_len} are needed "
            f"(one per virtual stage, in model order)")
    # the sum is NaN or inf if any entry is; min catches negatives
    if not (lo >= 0.0 and total < _INF):
        for i, v in enumerate(values):
            if not 0.0 <= v < _INF:
                raise ConfigError(
                    f"{name}[{i}] = {values[i]!r}; times must be finite and >= 0 s")
        raise ConfigError(f"{name} sums to more than the largest float; times must be finite")
    if type(values) in (list, tuple) and type(total) in (float, int):
        return values          # the hot path: no copy
    return tuple(map(float, values))


def resolve_wgrad(backward: tuple[float, ...], wgrad_s: Sequence[float] | None, pp: int,
                  vpp: int, *, needed: bool = True) -> tuple[float, ...] | None:
    """The weight-gradient part of each backward (default: half of it).

    With ``needed=False`` (schedules that never split the backward) a given ``wgrad_s``
    is only validated and None is returned.
    """
    if wgrad_s is None:
        return tuple(0.5 * b for b in backward) if needed else None
    wgrad = check_times("wgrad_s", wgrad_s, len(backward), pp, vpp)
    if any(map(_gt, wgrad, backward)):
        for i, (w, b) in enumerate(zip(wgrad, backward)):
            if w > b:
                raise ConfigError(
                    f"wgrad_s[{i}] = {w!r} s exceeds backward_s[{i}] = {b!r} s; the weight-"
                    f"gradient part is included in the backward, so 0 <= wgrad_s <= backward_s")
    return wgrad if needed else None


def check_p2p(p2p_s: float) -> float:
    try:
        c = float(p2p_s)
    except (TypeError, ValueError):
        raise ConfigError(f"p2p_s must be a time in seconds, got {p2p_s!r}") from None
    if not 0.0 <= c < _INF:
        raise ConfigError(f"p2p_s = {p2p_s!r}; it must be finite and >= 0 s")
    return c


# ----------------------------------------------------------------------------- orders

def interleaved_warmup(pp: int, vpp: int, num_microbatches: int, rank: int) -> int:
    """Warm-up chunk forwards of rank ``rank`` in Megatron's interleaved 1F1B."""
    return min(2 * (pp - rank - 1) + (vpp - 1) * pp, num_microbatches * vpp)


def rank_order(schedule: str, pp: int, vpp: int, m: int, rank: int
               ) -> list[tuple[int, int, int]]:
    """Operations of pipeline rank ``rank`` in execution order: (kind, local chunk, mb).

    kind is 0 = F, 1 = B, 2 = W. Interleaved with vpp = 1 is plain 1F1B (Megatron runs
    its non-interleaved schedule when no virtual pipeline size is set). Zero-bubble is
    torch's ZB1P order (:func:`meshplan.costmodel.first_backward.zero_bubble_order`, tested
    against torch's own action lists): its first steady forward completes torch's
    ``pp − rank`` warm-up forwards.
    """
    if schedule == "gpipe":
        return [(_F, 0, j) for j in range(m)] + [(_B, 0, j) for j in range(m)]
    if schedule == "1f1b" or (schedule == "interleaved-1f1b" and vpp == 1):
        warm = min(pp - rank - 1, m)
        ops = [(_F, 0, j) for j in range(warm)]
        for j in range(m - warm):
            ops.append((_F, 0, warm + j))
            ops.append((_B, 0, j))
        ops.extend((_B, 0, j) for j in range(m - warm, m))
        return ops
    if schedule == "zero-bubble":
        warm = min(pp - rank - 1, m)
        ops = [(_F, 0, j) for j in range(warm)]
        w_next = 0
        for t in range(m):           # t-th backward; the forward it pairs with, if any
            if t < m - warm:
                ops.append((_F, 0, warm + t))
            ops.append((_B, 0, t))
            if t >= rank:
                ops.append((_W, 0, w_next))
                w_next += 1
        ops.extend((_W, 0, j) for j in range(w_next, m))
        return ops
    # interleaved-1f1b, vpp >= 2, m % pp == 0
    group = pp * vpp
    total = m * vpp

    def fwd(k: int) -> tuple[int, int, int]:
        return (_F, (k % group) // pp, (k // group) * pp + k % pp)

    def bwd(k: int) -> tuple[int, int, int]:
        return (_B, vpp - 1 - (k % group) // pp, (k // group) * pp + k % pp)

    warm = interleaved_warmup(pp, vpp, m, rank)
    ops = [fwd(k) for k in range(warm)]
    for k in range(total - warm):
        ops.append(fwd(warm + k))
        ops.append(bwd(k))
    ops.extend(bwd(k) for k in range(total - warm, total))
    return ops


# ----------------------------------------------------------------------------- simulate

def simulate(schedule: str, forward_s: Sequence[float], backward_s: Sequence[float],
             num_microbatches: int, *, pp: int, vpp: int = 1,
             wgrad_s: Sequence[float] | None = None, p2p_s: float = 0.0) -> Simulation:
    """Simulate one step of ``schedule`` and return its timeline.

    ``forward_s`` / ``backward_s``: per-micro-batch time of each virtual stage (length
    pp·vpp, model order, stage c on rank c % pp); ``backward_s`` includes the weight
    gradient; ``wgrad_s`` is that part alone (zero-bubble splits it off; default half of
    the backward). ``p2p_s``: one activation (or gradient) send between stages on
    different ranks. Cost O(pp·vpp·m).
    """
    check_schedule_args(schedule, pp, vpp, num_microbatches)
    nstage = pp * vpp
    fwd = check_times("forward_s", forward_s, nstage, pp, vpp)
    bwd = check_times("backward_s", backward_s, nstage, pp, vpp)
    c = check_p2p(p2p_s)
    m = num_microbatches
    if schedule == "zero-bubble":
        wgr = resolve_wgrad(bwd, wgrad_s, pp, vpp)
        dur = (fwd, tuple(b - w for b, w in zip(bwd, wgr)), wgr)
    else:
        resolve_wgrad(bwd, wgrad_s, pp, vpp, needed=False)   # validate what we were given
        dur = (fwd, bwd, (0.0,) * nstage)

    orders = [rank_order(schedule, pp, vpp, m, r) for r in range(pp)]
    # end[kind][stage][mb]; None = not yet run
    end: list[list[list[float | None]]] = [[[None] * m for _ in range(nstage)] for _ in KINDS]
    pos = [0] * pp
    free = [0.0] * pp
    events: list[PipelineEvent] = []
    last = nstage - 1
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for r in range(pp):
            order = orders[r]
            i = pos[r]
            t_free = free[r]
            while i < len(order):
                kind, chunk, j = order[i]
                s = chunk * pp + r
                # when this op's input is available (None: not produced yet)
                if kind == _F:
                    if s == 0:
                        ready = 0.0
                    else:
                        e = end[_F][s - 1][j]
                        ready = None if e is None else e + (c if pp > 1 else 0.0)
                elif kind == _B:
                    if s == last:
                        ready = end[_F][s][j]
                    else:
                        e = end[_B][s + 1][j]
                        ready = None if e is None else e + (c if pp > 1 else 0.0)
                else:
                    ready = end[_B][s][j]
                if ready is None:
                    break
                start = ready if ready > t_free else t_free
                t_free = start + dur[kind][s]
                end[kind][s][j] = t_free
                events.append(PipelineEvent(rank=r, chunk=chunk, microbatch=j,
                                            kind=KINDS[kind], start_s=start, end_s=t_free))
                i += 1
            if i != pos[r]:
                progressed = True
                remaining -= i - pos[r]
                pos[r] = i
                free[r] = t_free
        if not progressed:   # a schedule bug, not a user error: the orders deadlock
            stuck = {r: orders[r][pos[r]] for r in range(pp) if pos[r] < len(orders[r])}
            raise RuntimeError(f"pipeline schedule {schedule!r} deadlocks at {stuck}")

    busy = tuple(m * sum(fwd[k * pp + r] + bwd[k * pp + r] for k in range(vpp))
                 for r in range(pp))
    events.sort(key=lambda e: (e.start_s, e.rank))
    return Simulation(step_time_s=max(free), events=tuple(events), busy_s=busy)


__all__ = ["PipelineEvent", "Simulation", "simulate", "rank_order", "KINDS"]
