"""One validated layout's record: its prediction, its measurement and their errors.

The prediction's fields (:func:`predicted_record`), the executor's results.json read into a
measurement (:func:`read_measurement`), the errors of one against the other (:func:`score`),
several runs of a layout merged into one record (:func:`merge_runs`), and a measured record
predicted again by the current cost model (:func:`rescore`).
"""

from __future__ import annotations

from typing import Any, Sequence

from meshplan.calibrate.stats import pct_error
from meshplan.costmodel import estimate
from meshplan.costmodel.estimate import is_host_bound
from meshplan.spec import Job, Layout, ModelSpec
from meshplan.hardware_profiles import Cluster


def predicted_memory_per_rank(est, layout: Layout, cluster: Cluster) -> list[float]:
    """Predicted peak bytes of every global rank (its pipeline stage's figure)."""
    out = []
    for r in range(layout.num_gpus):
        if cluster.rank_order == "tp-dp-pp":
            pp_rank = r // (layout.tp * layout.dp)
        else:
            pp_rank = (r // layout.tp) % layout.pp
        out.append(est.memory[pp_rank].total_bytes)
    return out


def predicted_record(est, layout: Layout, cluster: Cluster) -> dict[str, Any]:
    return {"step_time_s": est.step_time_s, "memory_peak_bytes": est.memory_peak_bytes,
            "memory_per_rank_bytes": predicted_memory_per_rank(est, layout, cluster),
            "fits": est.fits, "mfu": est.mfu,
            # the model's own call, from the profile and the layout: the CPU sets the step
            "host_wait_s": est.time.host_wait_s,
            "host_bound": is_host_bound(est.time.host_wait_s, est.step_time_s),
            # CPU dispatch over GPU time: 0.8-1 is GPU-bound with little CPU headroom
            "host_load": est.host_load,
            # after the passes: exposed data-parallel communication and the optimizer
            "tail_s": est.time.tail_s}


def score(pred: dict[str, Any], meas: dict[str, Any]) -> dict[str, Any]:
    """Errors of a prediction against a measurement, in % of the measurement."""
    out: dict[str, Any] = {"step_time_error_pct": pct_error(pred["step_time_s"],
                                                            meas["step_time_s"])}
    pm = pred["memory_per_rank_bytes"]
    mm = meas.get("memory_per_rank_bytes") or []
    if len(mm) == len(pm) and all(v > 0 for v in mm):
        out["memory_error_pct_per_rank"] = [pct_error(p, m) for p, m in zip(pm, mm)]
    if meas.get("memory_peak_bytes"):
        out["memory_peak_error_pct"] = pct_error(pred["memory_peak_bytes"],
                                                 meas["memory_peak_bytes"])
    return out


def rescore(record: dict[str, Any], model: ModelSpec, cluster: Cluster, job: Job
            ) -> dict[str, Any]:
    """A measured record with the current cost model's prediction (no run): to see what a
    new profile or model change predicts for layouts measured before."""
    layout = Layout.from_dict(record["layout"])
    out = {k: v for k, v in record.items() if k not in (
        "predicted", "step_time_error_pct", "memory_error_pct_per_rank", "memory_peak_error_pct")}
    out["predicted"] = predicted_record(estimate(model, cluster, job, layout), layout, cluster)
    if record.get("status") == "ok":
        out.update(score(out["predicted"], record["measured"]))
    return out


def merge_runs(runs: Sequence[dict[str, Any]], predicted: dict[str, Any] | None = None
               ) -> dict[str, Any]:
    """One record's result from its runs (in order). A single run as it is. Several: the
    median of the ok runs' step times (the mean of the middle two for an even count), each
    rank's peak memory the largest any ok run reached, the other measured fields from the
    run nearest that median; every run's step time, host probe and status in ``runs``; and
    ``run_to_run_spread_pct``, (max − min) / median over the ok runs. Scored against
    ``predicted`` (the record's prediction) when given."""
    if len(runs) == 1:
        return dict(runs[0])
    ok = [r for r in runs if r.get("status") == "ok"]
    if not ok:
        return dict(runs[0])
    times = sorted(r["measured"]["step_time_s"] for r in ok)
    mid = len(times) // 2
    median = times[mid] if len(times) % 2 else (times[mid - 1] + times[mid]) / 2
    nearest = min(ok, key=lambda r: abs(r["measured"]["step_time_s"] - median))
    out = dict(nearest)
    meas = dict(nearest["measured"], step_time_s=median)
    mems = [r["measured"].get("memory_per_rank_bytes") or [] for r in ok]
    if all(len(m) == len(mems[0]) for m in mems) and mems[0]:
        meas["memory_per_rank_bytes"] = [max(v) for v in zip(*mems)]
    peaks = [r["measured"].get("memory_peak_bytes") for r in ok]
    if all(isinstance(v, (int, float)) for v in peaks):
        meas["memory_peak_bytes"] = max(peaks)
    out["measured"] = meas
    out["runs"] = [{"status": r.get("status"),
                    "step_time_s": (r.get("measured") or {}).get("step_time_s"),
                    "host_probe_us_per_rank": (r.get("measured") or {}).get(
                        "host_probe_us_per_rank"),
                    "error": r.get("error"), "wall_s": r.get("wall_s")} for r in runs]
    out["run_to_run_spread_pct"] = (times[-1] - times[0]) / median * 100
    out["wall_s"] = sum(r.get("wall_s") or 0.0 for r in runs)
    pred = predicted if predicted is not None else out.get("predicted")
    if pred is not None:
        for k in ("memory_error_pct_per_rank", "memory_peak_error_pct"):
            out.pop(k, None)
        out.update(score(pred, meas))
    return out


def _find(doc: Any, *paths: str) -> Any:
    for path in paths:
        cur = doc
        for part in path.split("."):
            if isinstance(cur, dict) and part in cur:
                cur = cur[part]
            else:
                cur = None
                break
        if cur is not None:
            return cur
    return None


def read_measurement(doc: dict[str, Any], nranks: int) -> dict[str, Any]:
    """Median step time and per-rank peak memory from an executor results.json.

    The executor writes ``measured.step_time_s`` (median), ``measured.step_time`` (median,
    spread_pct, ...) and ``measured.memory_per_rank`` (per rank: allocated_bytes on GPU,
    reserved_bytes; allocated is null on CPU, where the process RSS is all there is).
    """
    measured = doc.get("measured")
    if not isinstance(measured, dict):
        raise ValueError(f"results file has no 'measured' object (keys: {sorted(doc)})")
    st = measured.get("step_time_s")
    if not isinstance(st, (int, float)) or st <= 0:
        raise ValueError(f"no positive step time: measured.step_time_s is {st!r}")
    mem: list[float] = []
    ranks = measured.get("memory_per_rank") or []
    for item in ranks:
        v = item.get("allocated_bytes")
        if v is None:
            v = item.get("reserved_bytes")
        mem.append(float(v) if isinstance(v, (int, float)) else 0.0)
    peak = measured.get("memory_peak_bytes")
    if peak is None and mem:
        peak = max(mem)
    spread = (measured.get("step_time") or {}).get("spread_pct")
    return {"step_time_s": float(st), "step_time_spread": spread,
            "step_times_s": measured.get("step_times_s"), "gc": measured.get("gc"),
            # per rank: its own median step and the CPU's wall time per step (diagnostics)
            "step_median_s_per_rank": [r.get("step_median_s") for r in ranks],
            "host_step_median_s_per_rank": [r.get("host_step_median_s") for r in ranks],
            "phase_median_ms_per_rank": [r.get("phase_median_ms") for r in ranks],
            # the host's dispatch speed when the timed steps began (executor.measure)
            "host_probe_us_per_rank": [r.get("host_probe_us") for r in ranks],
            "memory_per_rank_bytes": mem if len(mem) == nranks else [],
            "memory_peak_bytes": float(peak) if isinstance(peak, (int, float)) else None}
