"""Interleaved 1F1B in closed form: Megatron's order, home-rank paths over relaxed lattices.

The model of a step is :mod:`meshplan.costmodel.pipeline`'s, with ``v`` chunks per rank.
Uniform stages (all ``f``, ``b`` equal) reduce to the published form:

* interleaved 1F1B: ``(m + (p-1)/v)·v·(f + b)`` with per-chunk ``f, b``
  (Narayanan et al. 2021 §2.2.2, bubble ``(p-1)/(v·m)``).

With ``p2p_s = c > 0`` Megatron's interleaved warm-up (two extra chunks per hop) hides the
steady state's round trips, giving ``+ 2(p·v - 1)c``, as long as ``c <= min(f, b)`` of a
chunk (found with the simulator). The formula reproduces the simulator exactly for uniform
stages within that bound (tests); a p2p latency above a chunk's forward or backward exposes
round trips the closed form does not count, e.g. -8 % at ``c = 2 min(f, b)``, -23 % at
``5 min(f, b)``.

Non-uniform stages (uneven layers, embedding on the first stage, logits on the last);
errors below are (closed form - simulation) / simulation over 1000 seeded random cuts
per schedule (the generator of tests/unit/test_pipeline.py):

* ``interleaved-1f1b``: home-rank paths with the warm-up / cool-down lattices relaxed
  (heaviest stage per chunk): exact for uniform chunks, within +1.2 % when only the
  first/last chunk differ (Megatron's cut: equal layers per chunk plus embedding and
  logits). With uneven layers per chunk Megatron's order has steady-state dependency
  bubbles (a chain alternating between two ranks' heavy chunks) that this form does
  not see: median 0, but from -16 % to +11 %. Use
  :func:`meshplan.costmodel.pipeline_sim.simulate` for such layouts.
"""

from __future__ import annotations

from meshplan.costmodel.pipeline_1f1b import _NEG


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
