"""Plan files built straight from a Layout (tests, benchmarks; no search, no ortools)."""

from __future__ import annotations

from pathlib import Path

from meshplan.spec import Job, Layout, ModelSpec
from meshplan.hardware_profiles import Cluster
from meshplan.planner.planfile import save_plan_file


def write_plan_for_layout(path: str | Path, model: ModelSpec, job: Job, layout: Layout,
                          cluster: Cluster | None = None, *, predict: bool = True) -> Path:
    """Save a plan file for ``layout``; the prediction is the cost model's, if it runs.

    ``cluster`` defaults to one DGX H100 node of 8 GPUs (the cost model then prices the
    layout on it; on a CPU the prediction is only there to exercise the comparison).
    """
    cluster = cluster or Cluster.preset("dgx-h100", nodes=1)
    prediction = {}
    if predict:
        try:
            from meshplan.costmodel import estimate
            prediction = estimate(model, cluster, job, layout).to_dict()
        except Exception:   # e.g. a layout the cost model refuses: run it without one
            prediction = {}
    return save_plan_file(path, model, cluster, job, layout, prediction)


__all__ = ["write_plan_for_layout"]
