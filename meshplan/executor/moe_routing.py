"""The routed rows each expert-parallel rank computed, as run: the load imbalance ρ.

The cost model prices an ep > 1 layer at the busiest expert rank's rows, ρ times the mean
(``corrections.load_imbalance``; the profile's ``moe_load_imbalance``, 1.25 built in, after
the Switch Transformer's capacity factor, Fedus et al. 2021 §2.2): every all-to-all waits
for the busiest rank. A run records what ρ was, so a check can tell the routing's share of
a step-time miss from the rest (moeh6, 2 × H200: with ρ = 1 instead of 1.25 its two
tp 2 · ep 2 misses of +11.5 and +22.7 % become +4.3 and +13.8 %, and the runs did not say
which ρ they ran at).

Per MoE call at ep > 1 the executor reads the rows it receives from each ep rank on the host
(the split sizes of ``all_to_all_single``; :meth:`meshplan.executor.moe.MoELayer._run_experts`),
so recording their sum costs no synchronisation. Every rank of an ep group runs the same
calls in the same order (the group lies inside one pipeline stage), so the i-th record of
each rank is the same call: per call ρ_i = max over the group's ranks / mean over them;
:func:`imbalance` reports the mean of ρ_i over the calls (what the step pays on average) and
the largest. Eager only: a compiled block records nothing (its host read is a graph break,
and a side effect inside a compiled region would be another)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

#: records kept per rank (a long run's first calls; the timed steps of a check are fewer)
MAX_CALLS = 20000


@dataclass
class RoutedRows:
    """This rank's routed rows per MoE call, recorded while ``on``."""

    on: bool = False
    rows: list[int] = field(default_factory=list)

    def add(self, rows: int) -> None:
        if self.on and len(self.rows) < MAX_CALLS:
            self.rows.append(int(rows))


def ep_layers(module) -> list:
    """The MoE layers of ``module`` running at ep > 1 (those that read their splits)."""
    from meshplan.executor.expert_parallel import moe_layers
    return [m for m in moe_layers(module) if m.ep_group is not None]


def attach(module, recorder: RoutedRows) -> bool:
    """Give every MoE layer of ``module`` running at ep > 1 the recorder; whether any does."""
    layers = ep_layers(module)
    for layer in layers:
        layer.routing = recorder
    return bool(layers)


def imbalance(records: Sequence[tuple[Sequence[int], Sequence[int]]]) -> dict | None:
    """ρ as run from every rank's (ep group's ranks, routed rows per call); None where no
    rank recorded a call.

    >>> imbalance([((0, 1), [30, 10]), ((0, 1), [10, 10])])
    {'calls': 2, 'ep': 2, 'groups': 1, 'busiest_over_mean': 1.25, 'max': 1.5}
    """
    groups: dict[tuple, list[Sequence[int]]] = {}
    for ranks, rows in records:
        if rows:
            groups.setdefault(tuple(ranks), []).append(rows)
    ratios: list[float] = []
    calls = 0
    for members in groups.values():
        paired = list(zip(*members))         # the i-th call of every rank of the group
        calls = max(calls, len(paired))
        ratios += [max(c) / (sum(c) / len(c)) for c in paired if sum(c) > 0]
    if not ratios:
        return None
    return {"calls": calls, "ep": max(len(m) for m in groups.values()),
            "groups": len(groups), "busiest_over_mean": round(sum(ratios) / len(ratios), 4),
            "max": round(max(ratios), 4)}


__all__ = ["MAX_CALLS", "RoutedRows", "attach", "ep_layers", "imbalance"]
