"""A layout's costs as functions of the layers each (virtual) stage holds: ``LayerTables``.

The tables are linear in each stage's layer count: stage c holding n_c layers runs
``n_c·layer_forward_s + overhead_s (+ the ends)`` per micro-batch
(:class:`~meshplan.costmodel.stage_tables.StageTimes`), dispatches ``n_c·cpu_layer_s (+ ...)``
on its CPU (:class:`~meshplan.costmodel.host.HostDispatch`), and pipeline rank r holding N_r
layers needs ``N_r·(layer_state_bytes + inflight[r]·layer_activation_bytes) +
const_bytes[r]`` plus named corrections (:class:`~meshplan.costmodel.rank_memory.
RankMemory`). :func:`meshplan.costmodel.estimate.estimate` is built from exactly these
pieces, and the planner's CP-SAT model uses them to choose the stage partition.
:mod:`meshplan.costmodel.build` fills them in, one step at a time.

Measured error: the tables give ``estimate``'s step time and memory exactly on random
partitions (tests/unit/test_planner_tables.py); against runs, see
:mod:`meshplan.costmodel.estimate`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from meshplan.costmodel import registry
from meshplan.costmodel.build import build_fields
from meshplan.costmodel.caveats import moe_untimed_torch_caveats
from meshplan.costmodel.inputs import table_inputs
from meshplan.costmodel.host import HostDispatch
from meshplan.costmodel.moe_overlap import overlap_caveats
from meshplan.costmodel.rank_memory import RankMemory
from meshplan.costmodel.stage_tables import StageTimes
from meshplan.hardware_profiles import Cluster
from meshplan.spec import Job, Layout, ModelSpec
from meshplan.spec.validate import check_layout


@dataclass(frozen=True, eq=False, kw_only=True)
class LayerTables(StageTimes, HostDispatch, RankMemory):
    """A layout's time, host-dispatch and memory tables (see the module docstring)."""

    def step_time_s(self, stage_layers) -> float:
        dense = self.rank_dense_counts(stage_layers)
        return max(self.pipeline_s(stage_layers), self.host_bound_s(stage_layers)) + max(
            self.rank_tail_s(r, n, d) for r, (n, d) in
            enumerate(zip(self.rank_layers(stage_layers), dense)))


def layer_tables(model: ModelSpec, cluster: Cluster, job: Job, layout: Layout, *,
                 checked: bool = False) -> LayerTables:
    """The linear pieces :func:`~meshplan.costmodel.estimate.estimate` is built from
    (``layout.stage_layers`` ignored)."""
    if not checked:
        check_layout(model, cluster, job, layout.replace(stage_layers=None)
                     if model.num_layers >= layout.pp * layout.vpp else layout)
    return _layer_tables(model, cluster, job, layout.replace(stage_layers=None)
                         if layout.stage_layers is not None else layout)


@lru_cache(maxsize=65536)
def _layer_tables(model: ModelSpec, cluster: Cluster, job: Job, layout: Layout) -> LayerTables:
    # cp > 1: the per-rank equivalent layout; MoE: completed fields (costmodel.inputs)
    inp = table_inputs(model, cluster, job, layout)
    fields = build_fields(model, inp.cluster, inp.job, inp.layout, inp.links, inp.parts)
    if inp.finish is not None:
        fields = inp.finish(fields)
    if inp.layout is not layout or inp.caveats:
        fields.update(given_layout=layout, caveats=fields["caveats"] + inp.caveats)
    # the layout as given (cp > 1 reaches build_fields as its per-rank equivalent)
    fields["caveats"] = (fields["caveats"] + moe_untimed_torch_caveats(model, job, layout)
                         + overlap_caveats(model, job, layout))
    t = LayerTables(**fields)
    applied = registry.applied(t)
    if applied:
        object.__setattr__(t, "corrections", applied)
    return t


__all__ = ["LayerTables", "layer_tables"]
