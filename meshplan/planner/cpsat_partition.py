"""One configuration's CP-SAT model: the layers of every stage, its pipeline time and tails.

Per surviving configuration of :mod:`meshplan.planner.search` whose partition is free
(``_config_model``):

* ``n_c`` (int): transformer layers of virtual stage ``c`` (``Σ_c n_c = L``, each ≥ the
  minimum, the first and last ≥ one fewer: a stage of only the embedding or only the loss
  with the minimum 1, Megatron's account-for-embedding/loss split) — the uneven partition
  is the solver's choice;
* ``N_r = Σ_{c≡r} n_c``: layers of pipeline rank ``r``, with ``N_r ≤ cap_r``, the most
  layers rank ``r`` holds within usable memory × (1 − headroom) (the per-rank memory is
  linear in ``N``; ``LayerTables.max_rank_layers`` computes the cap with the cost model's
  own floating-point formula so it agrees with ``estimate``'s comparison exactly);
* the pipeline time: the closed form of
  :func:`meshplan.costmodel.pipeline.closed_form_step_time` written with max-variables
  (:func:`pipeline_units`); the per-rank exposed data-parallel + optimizer tail as a table
  over the rank's layer count (``AddElement`` on ``LayerTables.rank_tail_s``).

Costs are integers in units of 0.1 ns (:data:`UNITS_PER_S`). The functions here add to a
model they are given; they import no ortools.
"""

from __future__ import annotations

from meshplan.errors import MeshplanError
from meshplan.planner.constraints import stage_min_layers
from meshplan.planner.search import Survivor

UNITS_PER_S = 10**10  # 0.1 ns: rounding stays ~1e-9 of a step


def _u(seconds: float) -> int:
    return int(round(seconds * UNITS_PER_S))


def _config_model(M, s: Survivor, tag: str, lo: int):
    """One configuration's variables: layer counts per virtual stage, per-rank layers within
    the memory caps, the pipeline time and the per-rank tail (both from the cost model's
    tables). Returns (x, step, n): ``step ≥ pipeline + max tail`` when ``x``."""
    t = s.tables
    cfg = t.config
    L = t.num_layers
    S, pp = cfg.stages, cfg.pp
    x = M.NewBoolVar(f"x{tag}")
    n = [M.NewIntVar(0, L, f"n{tag}_{c}") for c in range(S)]
    M.Add(sum(n) == L * x)
    forced = s.forced
    mins = stage_min_layers(S, lo)
    for c in range(S):
        if forced is not None:
            M.Add(n[c] == forced[c] * x)
        else:
            M.Add(n[c] >= mins[c] * x)
    N = []
    for r in range(pp):
        Nr = M.NewIntVar(0, s.rank_capacity[r], f"N{tag}_{r}")
        M.Add(Nr == sum(n[r::pp]))
        N.append(Nr)
    # ---- pipeline time: the cost model's own number when the partition is fixed,
    # else its closed form written with max-variables (see pipeline_units)
    big = _u(1e4)
    if forced is not None:
        pipe = _u(max(t.pipeline_s(forced), t.host_bound_s(forced))) * x
    else:
        pipe = pipeline_units(M, t, n, tag)
        if t.cpu_known:
            pipe = _host_bound_units(M, t, n, N, x, pipe, tag)
    # ---- data-parallel + optimizer tail per rank (tables over the rank's layers)
    tm = M.NewIntVar(0, big, f"tail{tag}")
    cache: dict[tuple, list[int]] = {}
    for r in range(pp):
        rlo = sum((mins if forced is None else forced)[r::pp])
        cap = s.rank_capacity[r]
        key = (r == 0, r == t.last_rank, rlo)
        if key not in cache:
            hi = max(s.rank_capacity[q] for q in range(pp)
                     if (q == 0, q == t.last_rank) == key[:2])
            cache[key] = [_u(t.rank_tail_s(r, nn)) for nn in range(rlo, hi + 1)]
        table = cache[key][: cap - rlo + 1]
        idx = M.NewIntVar(0, cap - rlo, f"i{tag}_{r}")
        M.Add(idx == N[r] - rlo * x)
        tr = M.NewIntVar(min(table), max(table), f"t{tag}_{r}")
        M.AddElement(idx, table, tr)
        M.Add(tm >= tr)
    step = M.NewIntVar(0, big, f"step{tag}")
    M.Add(step >= pipe + tm).OnlyEnforceIf(x)
    return x, step, n


def _stage_units(t, n) -> tuple[list, list]:
    """Per-micro-batch forward and backward time of each stage as CP-SAT expressions of its
    layer count (``LayerTables.stage_times`` in integer units)."""
    S = t.config.stages
    # stage i scaled by its rank's p2p slowdown, as LayerTables.stage_times does
    k = t.slowdown or (1.0,) * S

    def stage(i: int, layer_s: float, first_s: float, last_s: float):
        return (_u(k[i] * layer_s) * n[i] + _u(k[i] * t.overhead_s)
                + (_u(k[i] * first_s) if i == 0 else 0) + (_u(k[i] * last_s) if i == S - 1 else 0))
    return ([stage(i, t.layer_forward_s, t.first_forward_s, t.last_forward_s) for i in range(S)],
            [stage(i, t.layer_backward_s, t.first_backward_s, t.last_backward_s)
             for i in range(S)])


def _host_bound_units(M, t, n, N, x, pipe, tag: str):
    """max(GPU pipeline, :meth:`LayerTables.host_bound_s`) for free 1F1B/GPipe partitions:
    rank r's CPU total (linear in its layers N_r) plus the backward path of the stages
    before it (linear in their layers); a variable bounded below by each, and by ``pipe``,
    equals their max at the optimum (it enters the minimised step with weight 1)."""
    cfg = t.config
    pp, m = cfg.pp, t.num_microbatches
    c = _u(t.p2p_s) if pp > 1 else 0
    _, b = _stage_units(t, n)
    per_layer = _u(m * t.cpu_layer_s)
    top = M.NewIntVar(0, _u(1e4), f"host{tag}")
    M.Add(top >= pipe).OnlyEnforceIf(x)
    path = 0
    for r in range(pp):
        const = t.rank_cpu_s(r, 0)
        M.Add(top >= per_layer * N[r] + _u(const) + path).OnlyEnforceIf(x)
        path = path + b[r] + c
    return top


def pipeline_units(M, t, n, tag: str):
    """The pipeline time of :func:`meshplan.costmodel.pipeline.closed_form_step_time` as a
    CP-SAT expression of the layer counts ``n`` (integer units of 0.1 ns).

    Only the schedules whose closed form is a max-plus expression of the stage times with
    non-negative weights on every max are encoded here (``gpipe``, ``1f1b``); the planner
    fixes the partition of the others (see ``space.EVEN_PARTITION_SCHEDULES``) and takes
    their time from the cost model as a constant. Each ``max`` becomes a variable bounded
    below by its arguments; since every such variable enters the minimised step time with
    a non-negative weight, at the optimum it equals the max, so the solver's minimum is the
    closed form's minimum over partitions. The 1F1B form follows
    ``pipeline_1f1b._one_f_one_b`` (Narayanan et al. 2021 §2.2.1, longest path through a
    home rank with first/last round trips and p2p detours); the GPipe form
    ``pipeline_1f1b._gpipe`` (Huang et al. 2019). ``tests/unit/test_planner_cpsat.py``
    checks this expression against ``LayerTables.pipeline_s`` on fixed partitions, so a
    change of the closed form in the cost model cannot silently diverge from the solver.
    """
    cfg = t.config
    S, p, m = cfg.stages, cfg.pp, t.num_microbatches
    if cfg.vpp != 1 or cfg.schedule not in ("gpipe", "1f1b"):
        raise MeshplanError(f"schedule {cfg.schedule!r} with vpp={cfg.vpp}: the CP-SAT model "
                            f"encodes free partitions for gpipe and 1f1b only")
    c = _u(t.p2p_s) if p > 1 else 0
    f, b = _stage_units(t, n)
    big = _u(1e4)

    def var(name):
        return M.NewIntVar(0, big, f"{name}{tag}")

    if cfg.schedule == "gpipe":
        mf, mb = var("gmf"), var("gmb")
        for i in range(S):
            M.Add(mf >= f[i])
            M.Add(mb >= b[i])
        return sum(f) + sum(b) + (m - 1) * (mf + mb) + 2 * (p - 1) * c

    # prefix sums (linear) and prefix maxima (variables)
    fp, bp, mf, mb = [], [], [], []
    for e in range(p):
        fp.append(f[e] + (fp[-1] if e else 0))
        bp.append(b[e] + (bp[-1] if e else 0))
        xf, xb = var(f"mf{e}_"), var(f"mb{e}_")
        M.Add(xf >= f[e])
        M.Add(xb >= b[e])
        if e:
            M.Add(xf >= mf[-1])
            M.Add(xb >= mb[-1])
        mf.append(xf)
        mb.append(xb)
    # suffix maxima of the first / last round trips
    sphi: list = [None] * p
    spsi: list = [None] * p
    for e in range(p - 1, -1, -1):
        x_e = min(p - 1 - e, m - 1)
        base = fp[e] + bp[e] + 2 * c * e
        a, z = var(f"sphi{e}_"), var(f"spsi{e}_")
        M.Add(a >= base + x_e * mf[e])
        M.Add(z >= base + x_e * mb[e])
        if e < p - 1:
            M.Add(a >= sphi[e + 1])
            M.Add(z >= spsi[e + 1])
        sphi[e], spsi[e] = a, z
    pipe = var("pipe")
    for k in range(p):
        nf = m - 1 - min(p - 1 - k, m)
        if nf >= 1:
            g = f[k] + b[k]
            expr = sphi[k] + spsi[k] - fp[k] - bp[k] - 2 * c * k + nf * g
            if c > 0 and nf >= 3 and k < p - 1:
                expr += _detour_units(M, fp, bp, g, c, nf - 1, k, p - 1 - k, var)
            M.Add(pipe >= expr)
        else:
            M.Add(pipe >= sphi[k] + (m - 1) * mb[k])
            M.Add(pipe >= spsi[k] + (m - 1) * mf[k])
    return pipe


def _detour_units(M, fp, bp, g_home, c, slots, k, depth, var):
    """``pipeline_1f1b._detours`` (home rank ``k``, no deferred weight gradients) as a variable:
    max over detour depths of repeated positive gains, each gain a max with 0."""
    best = var(f"det{k}_")
    for d in (depth, 1) if depth > 1 else (1,):
        reps, rest = divmod(slots, d + 1)
        gain = fp[k + d] - fp[k] + bp[k + d] - bp[k] + 2 * d * c - d * g_home
        tot = 0
        if reps:
            gp = var(f"gain{k}_{d}_")
            M.Add(gp >= gain)
            tot += reps * gp
        if rest >= 2 and d == depth:
            r = rest - 1
            pg = var(f"part{k}_{d}_")
            M.Add(pg >= fp[k + r] - fp[k] + bp[k + r] - bp[k] + 2 * r * c - r * g_home)
            tot += pg
        M.Add(best >= tot)
    return best


__all__ = ["UNITS_PER_S", "pipeline_units"]
