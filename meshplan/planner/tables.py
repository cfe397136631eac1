"""Per-configuration cost tables for the search: the cost model's own ``LayerTables``.

:func:`meshplan.costmodel.estimate.layer_tables` arranges the pieces ``estimate`` is built
from as linear-in-layers terms (per-layer time and bytes, first/last-stage extras,
in-flight micro-batches, the per-rank data-parallel tail), so the planner prices any stage
partition without calling ``estimate`` and without re-deriving a formula.
``tests/unit/test_planner_tables.py`` checks that step time and memory from these tables
equal ``estimate``'s on random partitions; the planner re-runs ``estimate`` on every layout
it returns.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from meshplan.costmodel.estimate import LayerTables, layer_tables
from meshplan.spec import Job, ModelSpec
from meshplan.hardware_profiles import Cluster
from meshplan.planner.space import Config


@dataclass(frozen=True, eq=False)
class ConfigTables(LayerTables):
    """:class:`LayerTables` of one point of the search space, with that point attached."""

    config: Config | None = None


def build_tables(model: ModelSpec, cluster: Cluster, job: Job, cfg: Config) -> ConfigTables:
    t = layer_tables(model, cluster, job, cfg.layout(), checked=True)
    return ConfigTables(**{f.name: getattr(t, f.name) for f in fields(LayerTables)}, config=cfg)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


__all__ = ["ConfigTables", "build_tables", "ceil_div"]
