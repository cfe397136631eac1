"""Simulate a plan's pipeline step for the timeline figure.

The per-virtual-stage forward/backward times come from the Estimate
(``stage_forward_s``/``stage_backward_s``); the stage-to-stage send time and the
weight-gradient split (zero-bubble only) come from the cost model's
:func:`meshplan.costmodel.estimate.layer_tables`, composed the way its docstring states. The
schedule itself is the discrete-event simulator of :mod:`meshplan.costmodel.pipeline_sim`.
"""

from __future__ import annotations

from meshplan.costmodel.result import Estimate
from meshplan.spec import Job, Layout, ModelSpec
from meshplan.hardware_profiles import Cluster


def pipeline_seconds(est: Estimate) -> float:
    """The cost model's pipeline time (what the simulator reproduces).

    Step time = max(pipeline, CPU dispatch bound) + exposed DP communication + optimizer
    step (:mod:`meshplan.costmodel.estimate`), so the pipeline part is the step time less
    those and less the time the GPUs wait for the CPU.
    """
    t = est.time
    return est.step_time_s - t.tail_s - t.host_wait_s


def simulate_plan(model: ModelSpec, cluster: Cluster, job: Job, layout: Layout,
                  est: Estimate):
    """Run the schedule simulator on the plan's stage times; returns a ``Simulation``."""
    from meshplan.costmodel.estimate import layer_tables
    from meshplan.costmodel.pipeline import simulate
    from meshplan.spec.validate import check_layout
    wgrad = None
    p2p = 0.0
    if layout.pp > 1 or layout.schedule == "zero-bubble":
        lt = layer_tables(model, cluster, job, layout)
        p2p = lt.p2p_s
        if layout.schedule == "zero-bubble":
            stage_layers = check_layout(model, cluster, job, layout)
            last = len(stage_layers) - 1
            wgrad = tuple(n * lt.layer_wgrad_s + (lt.last_wgrad_s if c == last else 0.0)
                          for c, n in enumerate(stage_layers))
            # the split can only be a part of the backward it belongs to
            wgrad = tuple(min(w, b) for w, b in zip(wgrad, est.stage_backward_s))
    return simulate(layout.schedule, est.stage_forward_s, est.stage_backward_s,
                    est.num_microbatches, pp=layout.pp, vpp=layout.vpp, wgrad_s=wgrad,
                    p2p_s=p2p)
