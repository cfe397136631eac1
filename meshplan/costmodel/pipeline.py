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

Uniform stages (all ``f``, ``b``, ``w`` equal) reduce to the published forms:

* GPipe / 1F1B: ``(m + p - 1)(f + b)`` (Huang et al. 2019, arXiv 1811.06965;
  Narayanan et al. 2021, arXiv 2104.04473, §2.2.1, bubble ``(p-1)/m``);
* interleaved 1F1B: ``(m + (p-1)/v)·v·(f + b)`` with per-chunk ``f, b``
  (Narayanan et al. 2021 §2.2.2, bubble ``(p-1)/(v·m)``);
* ZB-H1: ``m(f + b) + (p - 1)(f + b - 2w)`` (Qi et al. 2023, arXiv 2401.10241, §3.1:
  bubble ``(p-1)(T_F + T_B - T_W)`` with ``T_B = b - w`` the input-gradient part),
  which holds while ``w <= f`` and ``w <= b - w``; the general uniform answer is
  ``m(f + b) + (p - 1)·max(f + b - 2w, f, b - w)``.

With ``p2p_s = c > 0`` the simulator's answer is not just ``+ 2(p-1)c``: in 1F1B each
steady-state micro-batch waits for a round trip to the last stage, so uniform 1F1B takes
``(m+p-1)(f+b) + 2c·((p-1) + floor((m-1)(p-1)/p))``; Megatron's interleaved warm-up
(two extra chunks per hop) hides it, giving ``+ 2(p·v - 1)c``, as long as
``c <= min(f, b)`` of a chunk (found with the simulator). The formulas reproduce the
simulator exactly for uniform stages (tests), also with ``c > 0`` (interleaved: within
that bound; a p2p latency above a chunk's forward or backward exposes round trips the
closed form does not count, e.g. -8 % at ``c = 2 min(f, b)``, -23 % at ``5 min(f, b)``).

Non-uniform stages (uneven layers, embedding on the first stage, logits on the last);
errors below are (closed form - simulation) / simulation over 1000 seeded random cuts
per schedule (the generator of tests/unit/test_pipeline.py):

* ``gpipe``: exact (the longest path of a flow shop with identical jobs,
  ``Σ(f+b) + (m-1)(max f + max b)``).
* ``1f1b``: exact for ``p2p_s = 0`` (the critical path enters a "home" rank after a
  first round trip, runs that rank's steady state and leaves with a last round trip;
  warm-up forwards and cool-down backwards can be spent on the heaviest earlier stage);
  with ``p2p_s > 0`` the steady state may also detour to deeper stages to collect p2p
  latency; only full-depth and one-hop detours are counted: -0.6 % worst, never high.
* ``zero-bubble``: the same path families plus ZB-H1's deferred weight gradients:
  exact with even layers, -1.0 % worst for m >= pp, -6.7 % worst for m < pp (a home
  left early for a shallow rank's deferred W passes is not counted); never high.
* ``interleaved-1f1b``: home-rank paths with the warm-up / cool-down lattices relaxed
  (heaviest stage per chunk): exact for uniform chunks, within +1.2 % when only the
  first/last chunk differ (Megatron's cut: equal layers per chunk plus embedding and
  logits). With uneven layers per chunk Megatron's order has steady-state dependency
  bubbles (a chain alternating between two ranks' heavy chunks) that this form does
  not see: median 0, but from -16 % to +11 %. Use :func:`simulate` for such layouts.
"""

from __future__ import annotations

from itertools import accumulate
from typing import Sequence

from meshplan.costmodel.pipeline_sim import (PipelineEvent, Simulation, check_p2p,
                                             check_schedule_args, check_times,
                                             interleaved_warmup, resolve_wgrad, simulate)
from meshplan.spec import SCHEDULES
from meshplan.errors import ConfigError

_NEG = float("-inf")


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


# ----------------------------------------------------------------------------- gpipe

def _gpipe(f, b, m, p, c):
    """Longest path of GPipe's graph: a flow shop of identical jobs for the forwards,
    then one for the backwards (Huang et al. 2019); the extra m-1 micro-batches of each
    sweep are paid at its slowest stage."""
    return sum(f) + sum(b) + (m - 1) * (max(f) + max(b)) + 2 * (p - 1) * c


# ----------------------------------------------------------------------------- 1F1B

def _one_f_one_b(f, b, m, p, c):
    """Longest path of PipeDream-Flush 1F1B (Narayanan et al. 2021 §2.2.1).

    Index rank ``k``'s operations by steady-state slot (slot ``t`` holds the forward of
    micro-batch ``t + w_k`` and the backward of ``t``, ``w_k = min(p-1-k, m)``). A
    forward edge moves one rank down and one slot on, a backward edge one rank up in the
    same slot. The critical path picks a home rank ``k`` and is

      first trip: F of micro-batch 0 down to stage ``e1`` (``x(e1)`` warm-up forwards
        spent on the heaviest stage ≤ e1), its B back up to ``k``;
      home: ``nF = m-1-w_k`` more slots on rank ``k`` (``f_k + b_k`` each);
      last trip: the last F down to ``e2``, its B up to rank 0 (``x(e2)`` cool-down
        backwards spent on the heaviest stage ≤ e2);

    with ``x(e) = min(p-1-e, m-1)``. Both trips are maximised independently with
    suffix maxima, so the whole is O(p). It equals the simulation whenever p2p = 0 (a
    tested property). With p2p > 0 a longer home stretch may detour to deeper stages,
    paying ``2c`` per hop: detours of full depth (and the leftover slots as one shorter
    detour) and one-hop detours are added, which is exact for uniform stages.
    """
    fp, bp, mf, mb = _prefix(f, b)
    c2 = 2.0 * c
    m1 = m - 1
    base = [x + y + c2 * e for e, (x, y) in enumerate(zip(fp, bp))]
    xs = [p - 1 - e if p - 1 - e < m1 else m1 for e in range(p)]
    # first trip to depth e spends its x(e) spare warm-up forwards on the heaviest stage
    # <= e; the last trip its spare cool-down backwards likewise; both maximised over
    # depths >= k with suffix maxima
    s_phi = _suffix_max([z + x * y for z, x, y in zip(base, xs, mf)])
    s_psi = _suffix_max([z + x * y for z, x, y in zip(base, xs, mb)])
    best = _NEG
    for k in range(p):
        nf = m1 - (p - 1 - k if p - 1 - k < m else m)
        if nf >= 1:
            g = f[k] + b[k]
            t = s_phi[k] + s_psi[k] - fp[k] - bp[k] - c2 * k + nf * g
            if c > 0.0 and nf >= 3 and k < p - 1:
                t += _detours(fp, bp, g, c, nf - 1, k, p - 1 - k, 0.0)
        else:
            # rank k only warms up and cools down (m small): its forwards and backwards
            # come in two blocks, spent where the prefix is heaviest
            t = s_phi[k] + m1 * mb[k]
            u = s_psi[k] + m1 * mf[k]
            if u > t:
                t = u
        if t > best:
            best = t
    return best


def _detours(fp, bp, g_home, c, slots, k, depth, w_home):
    """Extra length from detours below home rank ``k`` during ``slots`` home slots.

    A detour of depth ``d`` leaves at a forward, visits stages k+1..k+d, and returns
    ``d+1`` slots later; it adds stages k+1..k+d's ``f+b`` and ``2dc`` and skips ``d``
    home slots (``g_home`` each, plus the home's deferred ``w_home`` for zero-bubble).
    Full-depth detours (the leftover slots as one shorter one) and one-hop detours.
    """
    lose = g_home + w_home - 2.0 * c           # per hop: home slot given up minus p2p gained
    f0 = fp[k]
    b0 = bp[k]
    gain1 = fp[k + 1] - f0 + bp[k + 1] - b0 - lose
    best = (slots // 2) * gain1 if gain1 > 0.0 else 0.0
    if depth > 1:
        reps, rest = divmod(slots, depth + 1)
        gain = fp[k + depth] - f0 + bp[k + depth] - b0 - depth * lose
        tot = reps * gain if gain > 0.0 else 0.0
        if rest >= 2:
            r = k + rest - 1
            part = fp[r] - f0 + bp[r] - b0 - (rest - 1) * lose
            if part > 0.0:
                tot += part
        if tot > best:
            best = tot
    return best


def _prefix(f, b):
    """Prefix sums and prefix maxima of f and b."""
    return list(accumulate(f)), list(accumulate(b)), _running_max(f), _running_max(b)


def _running_max(xs):
    # a plain loop: accumulate(xs, max) pays a builtin call per element, ~10x slower
    out = []
    cur = _NEG
    for x in xs:
        if x > cur:
            cur = x
        out.append(cur)
    return out


def _suffix_max(xs):
    out = _running_max(reversed(xs))
    out.reverse()
    return out


# ----------------------------------------------------------------------------- ZB-H1

def _zero_bubble(f, b_full, wg, m, p, c):
    """Longest path of ZB-H1 (Qi et al. 2023 §3.1; torch ``ScheduleInterleavedZeroBubble``
    with one stage per rank).

    As for 1F1B, with the backward split into B (``b - w``, on the critical chain) and
    W (``w``, rank-local). Rank ``k`` runs a W after its B from slot ``k`` on and the
    ``k`` deferred ones at the very end, so a home slot is worth ``f + B (+ W once
    t >= k)`` and the path may end on any rank ``h`` after its last ``min(m, h+1)`` W
    passes. Path families: first trip (optionally lingering on the last stage while the
    home has no W yet), home stretch, last trip down to ``e`` and back up to ``h <= e``
    with the cool-down B/W pairs on ``e`` (or, ending on rank 0, on the heaviest stage
    <= e). Each family is a max of separable terms, kept as prefix/suffix maxima: O(p).
    """
    b = [x - y for x, y in zip(b_full, wg)]      # input-gradient part
    w = wg
    fp, bp, mf, _ = _prefix(f, b)
    m1 = m - 1
    c2 = 2.0 * c
    above = [0.0] + bp[:-1]                      # Σ b over the stages above e
    base = [x + y + c2 * e for e, (x, y) in enumerate(zip(fp, bp))]
    xs = [p - 1 - e if p - 1 - e < m1 else m1 for e in range(p)]
    s_phi = _suffix_max([z + x * y for z, x, y in zip(base, xs, mf)])
    # ending on rank h after its last min(m, h+1) W passes, having climbed from below
    q_best = _running_max([(e + 1 if e < m else m) * w[e] - above[e] - c * e
                           for e in range(p)])
    # x cool-down stays land on micro-batches y+1..m-1 (y = m-1-x); the one landing on t
    # brings the W of slot t-1 along when t-1 >= the rank's deferral
    if m >= p:                                  # y >= e: every stay has its W
        pairs = [x + y for x, y in zip(b, w)]
        w0 = w[0]
        ends = [x * bt + w0 if x * bt + w0 > x * pr + qb else x * pr + qb
                for x, bt, pr, qb in zip(xs, _running_max(pairs), pairs, q_best)]
        ends = [z + e for z, e in zip(base, ends)]
    else:
        ends = []
        for e in range(p):
            x = xs[e]
            y = m1 - x
            stay_e = x * b[e] + max(0, m1 - max(y, e)) * w[e]
            stay_top = max(stay_e, x * b[0] + max(0, m1 - y) * w[0])
            ends.append(max(base[e] + stay_top + w[0], base[e] + stay_e + q_best[e]))
    s_end = _suffix_max(ends)
    best = _NEG
    g_last = f[p - 1] + b[p - 1]
    for k in range(p):
        nf = m1 - (p - 1 - k if p - 1 - k < m else m)
        first = s_phi[k] - above[k] - c * k           # ... through B(k, 0)
        tail = s_end[k] - c * k - fp[k]                # after F(k, m-1) to the end
        if nf >= 1:
            fk = f[k]
            bk = b[k]
            g = fk + bk
            home = nf * fk + (nf - 1) * bk + (nf - k if nf > k else 0) * w[k]
            # linger on the last stage for the home's first W-less slots
            j = k if k < nf - 1 else nf - 1
            extra = j * (g_last - g) if j > 0 and g_last > g else 0.0
            if c > 0.0 and nf >= 3 and k < p - 1:
                det = _detours(fp, bp, g, c, nf - 1, k, p - 1 - k, w[k])
                if det > extra:
                    extra = det
            t = first + extra + home + tail
        else:
            # rank k's forwards form one block: either all of them (on the heaviest
            # stage above) then the last trip, or the first trip and then the remaining
            # B/W passes on k (climbing to h afterwards) or on some h above it, all of
            # whose B and W passes follow its first B
            stays_k = m1 * b[k] + max(0, m1 - k) * w[k]
            climb = max(m1 * b[h] + m * w[h] - above[h] - c * h for h in range(k + 1))
            t = max(fp[k] + m1 * mf[k] + c * k + tail,
                    first + above[k] + c * k + max(stays_k + q_best[k], climb))
        if t > best:
            best = t
    return best


# ----------------------------------------------------------------------------- interleaved

def _interleaved(f, b, m, p, v, c):
    """Interleaved 1F1B (Narayanan et al. 2021 §2.2.2, Megatron's order), O(p·v).

    For each home rank ``h`` the path is: the warm-up forward lattice up to ``h``'s first
    steady-state forward, all of ``h``'s steady state, then the cool-down backward
    lattice down to the last backward of stage 0. ``h``'s own ``W_h`` warm-up forwards
    and ``W_h`` cool-down backwards are replaced by the lattices, whose length is bounded
    by taking, for every chunk-run of ``p`` micro-batches, the heaviest stage of that
    chunk on ranks ``<= h`` (exact when chunks are uniform), plus one stage per rank
    crossed. The cool-down backwards walk the chunks in the mirror order of the warm-up
    forwards, so both use the same per-chunk counts. p2p adds ``2(p·v - 1)c``: the
    doubled warm-up hides it in the steady state while ``c <= min(f, b)`` (a simulation
    property, tested).
    """
    pv = p * v
    mv = m * v
    best = _NEG
    run_f = [_NEG] * v     # per chunk: heaviest forward on ranks <= h
    run_b = [_NEG] * v
    down_f = up_b = 0.0    # one forward entering each rank 1..h, one backward leaving 0..h-1
    f0 = f[0]
    b0 = b[0]
    for h in range(p):
        warm = 2 * (p - 1 - h) + (v - 1) * p
        if warm > mv:
            warm = mv
        q, rr = divmod(warm, pv)
        # chunks already warming up when the lattice enters rank h: all of them, but
        # the last one on the last rank (its first forward is the home's own)
        top = v - 1 if h < p - 1 else v - 2
        t = busy = 0.0
        df = ub = _NEG
        i = h
        for ch in range(v):
            fh = f[i]
            bh = b[i]
            busy += fh + bh
            rf = run_f[ch]
            if fh > rf:
                run_f[ch] = rf = fh
            rb = run_b[ch]
            if bh > rb:
                run_b[ch] = rb = bh
            if ch <= top and fh > df:
                df = fh
            if h and b[i - 1] > ub:
                ub = b[i - 1]
            # units of chunk ch among the first `warm` (chunk of unit u: (u % pv) // p)
            # are spent on the heaviest stage of the chunk, not on h's own
            part = rr - ch * p
            cnt = q * p + (0 if part < 0 else part if part < p else p)
            if cnt:
                t += cnt * (rf - fh + rb - bh)
            i += p
        if h:
            down_f += df
            up_b += ub
        if warm < mv:
            # the lattices start at stage 0's first forward and end at its last backward
            t += m * busy + down_f + up_b - (run_f[0] - f0) - (run_b[0] - b0)
            if t > best:
                best = t
    return best + 2.0 * (pv - 1) * c


__all__ = ["SCHEDULES", "inflight_microbatches", "closed_form_step_time", "bubble_time",
           "simulate", "Simulation", "PipelineEvent"]
