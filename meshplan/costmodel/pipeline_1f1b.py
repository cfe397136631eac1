"""GPipe and 1F1B in closed form: the longest path through one step's dependency graph.

The model of a step (virtual stages, ranks, p2p) is :mod:`meshplan.costmodel.pipeline`'s.
Uniform stages (all ``f``, ``b`` equal) reduce to the published form:

* GPipe / 1F1B: ``(m + p - 1)(f + b)`` (Huang et al. 2019, arXiv 1811.06965;
  Narayanan et al. 2021, arXiv 2104.04473, §2.2.1, bubble ``(p-1)/m``).

With ``p2p_s = c > 0`` the simulator's answer is not just ``+ 2(p-1)c``: in 1F1B each
steady-state micro-batch waits for a round trip to the last stage, so uniform 1F1B takes
``(m+p-1)(f+b) + 2c·((p-1) + floor((m-1)(p-1)/p))`` (found with the simulator). The
formulas reproduce the simulator exactly for uniform stages (tests), also with ``c > 0``.

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

The prefix / suffix maxima and the p2p detours serve ZB-H1 too
(:mod:`meshplan.costmodel.pipeline_zb`).
"""

from __future__ import annotations

from itertools import accumulate

_NEG = float("-inf")


def _gpipe(f, b, m, p, c):
    """Longest path of GPipe's graph: a flow shop of identical jobs for the forwards,
    then one for the backwards (Huang et al. 2019); the extra m-1 micro-batches of each
    sweep are paid at its slowest stage."""
    return sum(f) + sum(b) + (m - 1) * (max(f) + max(b)) + 2 * (p - 1) * c


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
