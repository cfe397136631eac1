"""``--time-budget`` inside the layer tables: whether the next row or round still fits.

:func:`~meshplan.calibrate.budget.next_round` projects the calibration's end; here every
rank decides from the largest elapsed and last times over the ranks, so that all take the
same decision (ranks that disagreed would deadlock in the next round's collectives).
"""

from __future__ import annotations

from meshplan.calibrate.budget import RoundBudget, next_round
from meshplan.calibrate.layer_ranks import _reduce
from meshplan.calibrate.progress import _note


def _agreed(budget: RoundBudget, last_s: float, device, world: int):
    """(the budget's decision on one more piece taking ``last_s``, elapsed, last) from the
    largest elapsed and last times over ranks, so that every rank decides alike."""
    elapsed_s, last_s = _reduce([budget.elapsed_s(), last_s], [0, 1], device, world)
    return (next_round(elapsed_s=elapsed_s, last_round_s=last_s, budget_s=budget.budget_s,
                       allowance_s=budget.allowance_s), elapsed_s, last_s)


def _row_budget_stops(budget: RoundBudget, row_s: float, device, world: int, progress,
                      tag: str) -> bool:
    """Before the next row of a round: whether it, taking as long as the longest row of
    the round so far (``row_s``, with what that row measured beside it: a row that builds
    a new module and times its splits takes several times one that reuses it), would end
    past ``budget`` with what still follows the layer tables. Then the round stops there,
    the first one too: its rows so far are kept and the profile is written within the
    budget (round 36's calibration of two 2.3-2.7 B models ran its first round 40 s past
    ``--time-budget 463`` and was killed, writing nothing; docs/benchmarks/transfer.md).
    Collective, like :func:`_budget_stops`: all ranks decide from the largest elapsed and
    row times."""
    decision, _, last_s = _agreed(budget, row_s, device, world)
    if decision.run:
        return False
    _note(progress, f"{tag} and the rows after it skipped: projected "
                    f"{decision.projected_end_s:.0f} s > --time-budget {budget.budget_s:g} s "
                    f"(the longest row took {last_s:.1f} s, ~{budget.allowance_s:.0f} s to come "
                    f"after the layer tables); the rows measured so far are kept")
    return True


def _budget_stops(done: int, rounds: int, budget: RoundBudget, round_s: float, device,
                  world: int, progress, outcome: str | None = None) -> bool:
    """After ``done`` of at most ``rounds`` layer rounds, the last of which took ``round_s``
    (without what only the first round measures): whether ``budget`` stops them here.
    Collective: every rank must call it; all decide from the largest elapsed and round
    times over ranks, so they agree (ranks that disagreed would deadlock in the next
    round's collectives). ``outcome``: what the note says the layer tables end with (by
    default, whole rounds: ``done`` of ``rounds``)."""
    decision, elapsed_s, last_s = _agreed(budget, round_s, device, world)
    if done == 1 and elapsed_s + budget.allowance_s > budget.budget_s:
        _note(progress, f"round 1 ended {elapsed_s:.0f} s into the calibration: with "
                        f"~{budget.allowance_s:.0f} s still to come it overruns --time-budget "
                        f"{budget.budget_s:g} s (kept: a profile from one round is better "
                        f"than none)")
    if done >= rounds or decision.run:
        return False
    _note(progress, f"round {done + 1} skipped: projected {decision.projected_end_s:.0f} s > "
                    f"--time-budget {budget.budget_s:g} s (round {done} took {last_s:.0f} s,"
                    f" ~{budget.allowance_s:.0f} s to come after the layer tables): "
                    + (outcome or f"layer tables from {done} of {rounds} rounds"))
    return True


def _reread_fits(done: int, rounds: int, budget: RoundBudget, rows_s: float, n_rows: int,
                 device, world: int, progress) -> bool:
    """After ``done`` whole rounds that ``budget`` stops: whether a round of only the
    ``n_rows`` rows timed synchronized, taking ``rows_s`` (their first-round time), still
    fits (:func:`~meshplan.calibrate.bench_layers.bench_layer_rows` says why those rows).
    Collective, like :func:`_budget_stops`."""
    decision, _, last_s = _agreed(budget, rows_s, device, world)
    if decision.run:
        _note(progress, f"instead, the rounds left (up to {rounds - done}) re-time only the "
                        f"{n_rows} rows timed synchronized (MoE layers at ep > 1 or with a "
                        f"capacity factor: a single reading spreads), {last_s:.0f} s a round")
    return decision.run
