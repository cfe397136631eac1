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
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from meshplan.costmodel import registry
from meshplan.costmodel.build import build_fields
from meshplan.costmodel.data_parallel import group_links
from meshplan.costmodel.host import HostDispatch
from meshplan.costmodel.parts import layer_parts
from meshplan.costmodel.rank_memory import RankMemory
from meshplan.costmodel.stage_tables import StageTimes
from meshplan.hardware_profiles import Cluster
from meshplan.spec import Job, Layout, ModelSpec
from meshplan.spec.validate import check_layout


@dataclass(frozen=True, eq=False, kw_only=True)
class LayerTables(StageTimes, HostDispatch, RankMemory):
    """A layout's time, host-dispatch and memory tables (see the module docstring)."""

    def step_time_s(self, stage_layers) -> float:
        return max(self.pipeline_s(stage_layers), self.host_bound_s(stage_layers)) + max(
            self.rank_tail_s(r, n) for r, n in enumerate(self.rank_layers(stage_layers)))


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
    links = group_links(cluster, layout)
    parts = layer_parts(model, cluster, job, layout.micro_batch, layout.tp,
                        layout.sequence_parallel, layout.recompute, links.tp, links.pp,
                        layout.compile,
                        job.precision == "fp8" and layout.zero >= 2 and layout.dp > 1)
    t = LayerTables(**build_fields(model, cluster, job, layout, links, parts))
    applied = registry.applied(t)
    if applied:
        object.__setattr__(t, "corrections", applied)
    return t


__all__ = ["LayerTables", "layer_tables"]
