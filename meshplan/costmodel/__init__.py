"""Analytical cost model: pure Python (no torch, no ortools).

``estimate(model, cluster, job, layout) -> Estimate`` is the single source of predictions;
the planner, the reports and the executor's comparison all call it. Each module opens with
its formulas, their sources and their measured error; :mod:`meshplan.costmodel.estimate`
sums up the measured error of the whole (docs/benchmarks/published.md, accuracy.md,
transfer.md).
"""

from meshplan.costmodel.estimate import estimate
from meshplan.costmodel.result import Estimate, StageMemory, TimeBreakdown
from meshplan.spec import Job, Layout, ModelSpec

__all__ = ["estimate", "Estimate", "StageMemory", "TimeBreakdown", "ModelSpec", "Job", "Layout"]
