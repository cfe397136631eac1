"""Gradients that a pipeline rank has not allocated yet at its activation peak.

Under runtime "torch" the executor sets gradients to None at each step's start
(``zero_grad(set_to_none=True)``) and, pipelined, averages them after the schedule, with no
persistent DDP buckets. A chunk's gradients therefore appear during that chunk's first
backward of the step, layer by layer, while the backward frees the micro-batch's
activations. A rank whose forwards all run before the first backward of some chunk reaches
a lower peak than "all activations in flight + all gradients": the cost model's
``LayerTables.first_backward_relief_bytes`` subtracts the difference, computed here by
walking the rank's operations in the schedule's order (:func:`pipeline_sim.rank_order`).

Worked example, interleaved 1F1B, pp 4, vpp 2, m 4 (holdout13's v09, rank 0; round 15):
the rank runs all eight chunk forwards first (warm-up ``2·3 + 4 = 10 ≥ 8``), then the four
backwards of chunk 1, then those of chunk 0. With per-chunk activations ``A`` and
gradients ``G0``, ``G1``: the other terms count ``8A + G0 + G1``; the walk peaks at the
first backward, ``8A + max(0, G1 − A)``, because chunk 0's gradients appear only after four
backwards freed ``4A`` (while ``G0 ≤ 4A``). For Llama-1.64B at micro-batch 16, ``A`` =
0.375 GiB (3 layers' inputs), ``G1`` = 0.70 GiB and ``G0`` = 0.95 GiB (3 layers and the
embedding, fp32): ``G0 + A`` = 1.33 GiB less, where the measured rank 0 held 1.57 GiB less
than predicted.

GPipe and 1F1B (one chunk) reduce to the earlier rule: relief ``min(G, A)`` on a rank that
runs all m forwards before its first backward, none elsewhere. Without a pipeline (pp 1,
one rank running F, B per micro-batch) that is one micro-batch per step, where FSDP2's
gradient shards (or dp 1's plain gradients) are not in DDP buckets (round 17).

Zero-bubble (torch's ``ScheduleInterleavedZeroBubble``, one stage per rank) is walked in
its own order (:func:`zero_bubble_order`): there the weight passes (W), not the
input-gradient passes (I), allocate the gradients. A rank r > 0 peaks at the end of an I
(:func:`meshplan.costmodel.runtime.split_backward_rule`), holding its in-flight
micro-batches' activations A and the kept output gradients K of those whose W is pending;
rank 0's I has nothing to do (token ids) and its W is the whole backward. When the rank's
largest state comes before its first W and never recurs after it — a step of few
micro-batches: m ≤ r + 1, or m ≤ pp on rank 0 — none of its gradients exists at the
peak (:func:`zero_bubble_relief`). Worked example, pp 2, m 1: both ranks run F0 I0 W0;
rank 1 peaks at the end of I0 with A + K and no gradient, then W0 frees A + K while it
allocates G: the peak is A + K + max(0, G − A − K), ``min(G, A + K)`` under "A + K + G".
Round 41 (2 × H200, post hoc): x11, x12, x17 (pp 2 zero-bubble, m 1-2) were over-predicted
by 4.1-4.6 GiB on every rank, their gradients 4.2-4.4 GiB (+8.5..+15.9 % → −0.6..+1.3 %).
"""
from __future__ import annotations

from functools import lru_cache
from typing import Sequence

from meshplan.costmodel.pipeline_sim import rank_order

#: schedules whose backward allocates the gradients (zero-bubble's W pass does)
WALKED_SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b")


def backward_events(schedule: str, pp: int, vpp: int, m: int, rank: int
                    ) -> tuple[tuple[tuple[int, ...], tuple[tuple[int, ...], tuple[bool, ...],
                                                             int, bool], ...], ...]:
    """The distinct memory states of ``rank``'s step, for :func:`relief_bytes`.

    Returns ``(forward_counts, backward_events)``: every distinct vector of in-flight
    micro-batches per local chunk right after a forward, and every distinct
    ``(counts, allocated, chunk, first)`` right before a backward — the in-flight counts,
    which chunks' gradients exist, the backward's chunk and whether it is that chunk's
    first (so allocates its gradients). Steady-state repeats collapse, so the result stays
    small however many micro-batches the step has. Schedule arguments are those of
    :func:`pipeline_sim.rank_order` (checked by the caller).
    """
    v = vpp if schedule == "interleaved-1f1b" else 1
    counts = [0] * v
    allocated = [False] * v
    fwd: dict[tuple[int, ...], None] = {}
    bwd: dict[tuple, None] = {}
    for kind, chunk, _mb in rank_order(schedule, pp, v, m, rank):
        if kind == 0:
            counts[chunk] += 1
            fwd[tuple(counts)] = None
        elif kind == 1:
            first = not allocated[chunk]
            bwd[(tuple(counts), tuple(allocated), chunk, first)] = None
            counts[chunk] -= 1
            allocated[chunk] = True
    return tuple(fwd), tuple(bwd)


@lru_cache(maxsize=4096)
def forwards_first(schedule: str, pp: int, vpp: int, m: int, rank: int) -> bool:
    """Whether ``rank`` runs every forward of the step before its first backward (GPipe;
    1F1B or interleaved on a rank whose warm-up covers all m micro-batches, e.g. rank 0 of
    pp 2 with m = 2: F0 F1 B0 B1). Then nothing runs a forward between two backwards."""
    ops = rank_order(schedule, pp, vpp if schedule == "interleaved-1f1b" else 1, m, rank)
    kinds = [kind for kind, _chunk, _mb in ops if kind in (0, 1)]
    return 1 not in kinds or 0 not in kinds[kinds.index(1):]


def relief_bytes(events, act_bytes: Sequence[float], grad_bytes: Sequence[float]) -> float:
    """Bytes by which the walked peak lies below "most activations + all gradients".

    ``events``: :func:`backward_events`; ``act_bytes[c]`` / ``grad_bytes[c]``: one
    micro-batch's activations and the gradients of local chunk ``c``. A backward holds what
    is in flight and the gradients allocated so far; a chunk's first backward allocates
    its gradients while it frees its micro-batch's activations (both layer by layer), so it
    peaks ``max(0, G − A)`` above its start.

    The general form, per-chunk bytes of any kind; the cost model's tables, whose chunks
    hold equal layers plus the rank's ends, use :func:`relief_bytes_ends`, checked against
    this (tests/unit/test_first_backward.py)."""
    fwd, bwd = events
    if not bwd:
        return 0.0
    most_act = max(sum(n * a for n, a in zip(c, act_bytes)) for c in fwd)
    peak = max(sum(n * a for n, a in zip(counts, act_bytes))
               + sum(g for g, on in zip(grad_bytes, allocated) if on)
               + (max(0.0, grad_bytes[chunk] - act_bytes[chunk]) if first else 0.0)
               for counts, allocated, chunk, first in bwd)
    return max(0.0, most_act + sum(grad_bytes) - peak)


def backward_event_sums(schedule: str, pp: int, vpp: int, m: int, rank: int) -> tuple:
    """:func:`backward_events` reduced to what :func:`relief_bytes_ends` reads, where every
    local chunk holds the same layers and the rank's first and last chunks add its ends:
    per forward state (in flight, of them the first chunk's, the last chunk's); per
    backward state (in flight, first chunk's, last chunk's, chunks with gradients, first
    chunk has them, last chunk has them, first backward of its chunk, chunk is the first,
    chunk is the last). Only the states that can be the peak for some non-negative bytes:
    the planner prices hundreds of layer counts per layout on them (an interleaved rank's
    40-380 states come down to 2-10).

    A GPipe rank's step is every forward, then every backward, whatever its place; a 1F1B
    rank's is fixed by its warm-up, min(pp − rank − 1, m) forwards, as on the first rank of
    a pipeline pp − rank deep: both are computed once per such shape (checked against the
    walk in tests/unit/test_first_backward.py)."""
    if schedule == "gpipe":
        pp, rank = 1, 0
    elif schedule == "1f1b":
        pp, rank = pp - rank, 0
    return _event_sums(schedule, pp, vpp, m, rank)


@lru_cache(maxsize=65536)        # a few hundred bytes each; a 3,072-GPU plan asks ~6,000
def _event_sums(schedule: str, pp: int, vpp: int, m: int, rank: int) -> tuple:
    fwd, bwd = backward_events(schedule, pp, vpp, m, rank)
    last = (vpp if schedule == "interleaved-1f1b" else 1) - 1
    f = _pareto({(sum(c), c[0], c[last]) for c in fwd}, 3)
    b = {(sum(c), c[0], c[last], sum(on), int(on[0]), int(on[last]), int(first),
          int(chunk == 0), int(chunk == last)) for c, on, chunk, first in bwd}
    # a state is never the peak where another has at least its counts and either the same
    # (first, chunk kind) or no first-backward term of its own (that term is ≥ 0)
    kept = _pareto(b, 6)
    kept = [e for e in kept if e[6] or not any(
        o != e and all(x >= y for x, y in zip(o[:6], e[:6]))
        and (o[6] or o[:6] != e[:6] or o < e) for o in kept)]     # of equals, keep one
    return tuple(sorted(f)), tuple(sorted(kept)), last + 1


def _pareto(states: set, width: int) -> list:
    """The states no other of the same tail (fields past ``width``) matches or exceeds in
    each of its first ``width`` fields (the coefficients they meet are ≥ 0). In order of
    falling field sums a dominating state comes first, so each is checked against the
    kept ones only (a handful)."""
    out: list = []
    for e in sorted(states, key=lambda t: -sum(t[:width])):
        if not any(o[width:] == e[width:] and all(x >= y for x, y in zip(o[:width], e[:width]))
                   for o in out):
            out.append(e)
    return out


def relief_bytes_ends(sums, act: float, grad: float, first_act: float = 0.0,
                      first_grad: float = 0.0, last_act: float = 0.0,
                      last_grad: float = 0.0) -> float:
    """:func:`relief_bytes` on :func:`backward_event_sums`, for chunks of ``act`` / ``grad``
    bytes each (one micro-batch's activations, the gradients) with ``first_*`` added to the
    rank's first chunk and ``last_*`` to its last (the same chunk when it has one): equal
    to ``relief_bytes(events, [act + ends…], [grad + ends…])``, in time independent of the
    chunk count."""
    fwd, bwd, v = sums
    if not bwd:
        return 0.0
    most_act = max(act * n + first_act * n0 + last_act * nl for n, n0, nl in fwd)
    peak = max(act * n + first_act * n0 + last_act * nl
               + grad * na + first_grad * a0 + last_grad * al
               + (max(0.0, (grad + first_grad * i0 + last_grad * il)
                      - (act + first_act * i0 + last_act * il)) if first else 0.0)
               for n, n0, nl, na, a0, al, first, i0, il in bwd)
    return max(0.0, most_act + v * grad + first_grad + last_grad - peak)


def zero_bubble_order(pp: int, m: int, rank: int) -> tuple[tuple[str, int], ...]:
    """Rank ``rank``'s passes under torch's zero-bubble schedule with one stage per rank
    (ZB1P, Qi et al. 2023, arXiv 2401.10241; ``ScheduleInterleavedZeroBubble`` with
    ``n_local_stages`` = 1, torch 2.11-2.13), as ("F" | "I" | "W", micro-batch):
    ``pp − rank`` forwards of warm-up (at most m), then for each micro-batch t its I, from
    the (rank + 1)-th on the W of micro-batch t − rank, and the next forward while any is
    left; the remaining Ws last. pp 2, m 4: rank 0 ``F0 F1 I0 W0 F2 I1 W1 F3 I2 W2 I3 W3``,
    rank 1 ``F0 I0 F1 I1 W0 F2 I2 W1 F3 I3 W2 W3``. It is the time model's own order
    (:func:`meshplan.costmodel.pipeline_sim.rank_order`, B read as I), so the test against
    torch's action lists (tests/unit/test_zero_bubble_relief.py) checks both."""
    kinds = ("F", "I", "W")
    return tuple((kinds[k], j) for k, _, j in rank_order("zero-bubble", pp, 1, m, rank))


@lru_cache(maxsize=65536)
def zero_bubble_events(pp: int, m: int, rank: int) -> tuple[tuple[int, int, bool, bool], ...]:
    """The memory states of a zero-bubble rank that can be its peak, for
    :func:`zero_bubble_relief`: ``(activation sets, kept-gradient sets, gradients allocated,
    first W)`` after each forward and I, and right before each W (``first W``: it allocates
    the gradients); of the states alike in the last two, those no other matches or exceeds
    in both counts."""
    acts = kept = 0
    allocated = False
    out: dict[tuple[int, int, bool, bool], None] = {}
    for kind, _mb in zero_bubble_order(pp, m, rank):
        if kind == "F":
            acts += 1
        elif kind == "I":
            kept += 1 if rank > 0 else 0
        else:
            out[(acts, kept, allocated, not allocated)] = None
            acts -= 1
            kept -= 1 if rank > 0 else 0
            allocated = True
            continue
        out[(acts, kept, allocated, False)] = None
    return tuple(sorted(_pareto(set(out), 2)))


def zero_bubble_relief(events, act_bytes: float, kept_bytes: float, grad_bytes: float
                       ) -> float:
    """Bytes by which a zero-bubble rank's walked peak lies below "most activations and kept
    gradients + all gradients" (the other terms' count). A W frees its micro-batch's
    activations and kept gradients layer by layer while its first allocates the gradients,
    so the first W peaks ``max(0, G − A − K)`` above its start."""
    if not events:
        return 0.0
    most = max(a * act_bytes + k * kept_bytes for a, k, _on, _first in events)
    peak = max(a * act_bytes + k * kept_bytes + (grad_bytes if on else 0.0)
               + (max(0.0, grad_bytes - act_bytes - kept_bytes) if first else 0.0)
               for a, k, on, first in events)
    return max(0.0, most + grad_bytes - peak)
