"""ZB-H1 (zero-bubble) in closed form: 1F1B's longest paths with deferred weight gradients.

The model of a step is :mod:`meshplan.costmodel.pipeline`'s; the backward splits into B
(input gradient, on the critical chain) and W (weight gradient, rank-local). Uniform stages
(all ``f``, ``b``, ``w`` equal) reduce to the published form:

* ZB-H1: ``m(f + b) + (p - 1)(f + b - 2w)`` (Qi et al. 2023, arXiv 2401.10241, §3.1:
  bubble ``(p-1)(T_F + T_B - T_W)`` with ``T_B = b - w`` the input-gradient part),
  which holds while ``w <= f`` and ``w <= b - w``; the general uniform answer is
  ``m(f + b) + (p - 1)·max(f + b - 2w, f, b - w)``.

Non-uniform stages (uneven layers, embedding on the first stage, logits on the last);
errors below are (closed form - simulation) / simulation over 1000 seeded random cuts
per schedule (the generator of tests/unit/test_pipeline.py):

* ``zero-bubble``: the same path families plus ZB-H1's deferred weight gradients:
  exact with even layers, -1.0 % worst for m >= pp, -6.7 % worst for m < pp (a home
  left early for a shallow rank's deferred W passes is not counted); never high.
"""

from __future__ import annotations

from meshplan.costmodel.pipeline_1f1b import (_NEG, _detours, _prefix, _running_max,
                                              _suffix_max)


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
