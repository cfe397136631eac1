"""What a run is compared with and the results document rank 0 writes
(:mod:`meshplan.executor.run`)."""

from __future__ import annotations

import dataclasses
import sys
import warnings
from typing import Any

from meshplan.errors import MeshplanWarning
from meshplan.planner.planfile import PlanRecord

RESULTS_SCHEMA = "meshplan.results"


def log(msg: str) -> None:
    """One line of the runner's progress on stderr."""
    print(f"[meshplan.executor] {msg}", file=sys.stderr, flush=True)


def prediction_of(plan: PlanRecord) -> dict[str, Any]:
    """What this run is compared with: the cost model's estimate under runtime "torch", the
    conventions of this executor (docs/costmodel.md, "Runtimes"). A plan made for another
    runtime (``meshplan plan`` defaults to Megatron's) is re-predicted on the plan's own
    cluster, and the result says so under ``runtime_note``; a plan that already carries a
    torch-runtime prediction is used as it is."""
    runtime = plan.job.runtime
    if plan.prediction and runtime == "torch":
        return dict(plan.prediction)
    try:
        from meshplan.costmodel import estimate
        # the executor keeps 16-bit-cast weights and gathers them so (no fp8 weight gather)
        job = dataclasses.replace(plan.job, runtime="torch", fp8_param_gather=False)
        pred = estimate(plan.model, plan.cluster, job, plan.layout).to_dict()
    except Exception as exc:  # no prediction is not a reason to refuse a measurement
        log(f"the cost model failed to predict this run (runtime 'torch'): {exc}")
        return dict(plan.prediction)
    if runtime != "torch":
        pred["runtime_note"] = (f"re-predicted with runtime 'torch' (this executor's); the plan's "
                                f"own prediction used runtime {runtime!r}")
    return pred


def warn_if_too_big(plan) -> None:
    """A :class:`MeshplanWarning` when the plan, priced as this executor runs it (runtime
    "torch"), does not fit the GPU: ``meshplan plan`` defaults to Megatron's runtime, whose
    model states take less memory than the executor's (docs/executor.md, "Known limits"); the
    CLI prints it as ``meshplan CMD: warning: ...`` and ``--strict`` makes it an error."""
    pred = prediction_of(plan)
    if pred.get("fits", True):
        return
    gib = 2.0 ** 30
    peak, usable = pred.get("memory_peak_bytes"), pred.get("usable_memory_bytes")
    sizes = (f" ({peak / gib:.1f} GiB a GPU at peak, {usable / gib:.1f} GiB usable)"
             if isinstance(peak, (int, float)) and isinstance(usable, (int, float)) else "")
    made = ("" if plan.job.runtime == "torch" else
            f"; the plan was made for runtime {plan.job.runtime!r}: `meshplan plan --runtime "
            f"torch` finds layouts that fit this executor")
    warnings.warn(f"this layout is predicted not to fit under this executor{sizes}{made}",
                  MeshplanWarning, stacklevel=2)


def stage_prediction_bytes(prediction: dict[str, Any], pp_rank: int) -> float | None:
    mem = prediction.get("memory")
    if isinstance(mem, list) and pp_rank < len(mem) and isinstance(mem[pp_rank], dict):
        v = mem[pp_rank].get("total_bytes")
        return float(v) if isinstance(v, (int, float)) else None
    return None


def results_document(plan: PlanRecord, prediction, measured, environment, *, status: str,
                     error: dict | None, argv: list[str]) -> dict[str, Any]:
    from meshplan.executor.measure import comparison
    return {
        "schema": RESULTS_SCHEMA, "version": 1, "status": status,
        "command": " ".join(argv),
        "model": plan.model.to_dict(), "cluster": plan.cluster.to_dict(),
        "job": plan.job.to_dict(), "layout": plan.layout.to_dict(),
        "prediction": prediction, "measured": measured,
        "errors_pct": comparison(measured, prediction) if measured else {},
        "environment": environment, "error": error,
    }
