"""Per-configuration cost tables for the search: the cost model's own ``LayerTables``.

:func:`meshplan.costmodel.estimate.layer_tables` arranges the pieces ``estimate`` is built
from as linear-in-layers terms (per-layer time and bytes, first/last-stage extras,
in-flight micro-batches, the per-rank data-parallel tail), so the planner prices any stage
partition without calling ``estimate`` and without re-deriving a formula.
``tests/unit/test_planner_tables.py`` checks that step time and memory from these tables
equal ``estimate``'s on random partitions; the planner re-runs ``estimate`` on every layout
it returns.

Where measured rows carry sustained ratios, ``estimate`` prices a step at the clock its duty
cycle allows (the correction ``sustained_clock_duty``); a configuration's tables are priced
at the duty of its even partition, which the partition the search picks moves little
(``estimate`` re-prices at the chosen one). The search's lower bounds read every row at its
burst clock (:func:`bound_cluster`), below any duty's price.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from meshplan.costmodel.clock import SUSTAINED_CLOCK, SUSTAINED_DUTY, at_duty, step_duty
from meshplan.costmodel.estimate import LayerTables, layer_tables
from meshplan.spec import Job, ModelSpec, default_stage_layers
from meshplan.hardware_profiles import Cluster
from meshplan.planner.space import Config


@dataclass(frozen=True, eq=False)
class ConfigTables(LayerTables):
    """:class:`LayerTables` of one point of the search space, with that point attached."""

    config: Config | None = None


def build_tables(model: ModelSpec, cluster: Cluster, job: Job, cfg: Config) -> ConfigTables:
    t = layer_tables(model, cluster, job, cfg.layout(), checked=True)
    if SUSTAINED_CLOCK in t.corrections and cluster.gpu.corrections.enabled(SUSTAINED_DUTY):
        part = default_stage_layers(t.num_layers, cfg.stages)
        f, b, _ = t.stage_times(part)
        duty = step_duty(f, b, t.num_microbatches, cfg.pp, t.step_time_s(part))
        if duty < 1.0:
            t = layer_tables(model, at_duty(cluster, duty), job, cfg.layout(), checked=True)
    return ConfigTables(**{f.name: getattr(t, f.name) for f in fields(LayerTables)}, config=cfg)


def bound_cluster(cluster: Cluster) -> Cluster:
    """``cluster`` with every measured row at its burst clock (the search's lower bounds hold
    for any duty); the cluster itself where no row carries a sustained ratio, so that the
    bounds share its cached tables (``duty_scale`` is 1 where the correction is off)."""
    has_ratios = getattr(cluster.gpu.measured, "has_sustained", False)
    return at_duty(cluster, 0.0) if has_ratios else cluster


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


__all__ = ["ConfigTables", "bound_cluster", "build_tables", "ceil_div"]
