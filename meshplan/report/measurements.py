"""Read executor ``results.json`` files defensively and pair prediction with measurement.

A results file (written by ``python -m meshplan.executor.run``) holds the plan's model,
cluster, job and layout, the prediction (``Estimate.to_dict()``), the measurement and the
errors in %. Only ``measured`` and either a ``prediction`` or the specs to recompute one are
required; every other key is optional, so an older or newer writer still reads.

When the file carries model, cluster, job and layout, the prediction is recomputed with
:func:`meshplan.costmodel.estimate` (the cost model is the single source of predictions, and
the file's copy may predate a cost-model change); otherwise the file's own prediction is used.
The ``source`` column of the table says which.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from meshplan.spec import ModelSpec
from meshplan.errors import MeshplanError, PlanFileError
from meshplan.hardware_profiles import Cluster

# measured key -> candidate key names (the executor's names first, then tolerated aliases)
_MEASURED_KEYS = {
    "step_time_s": ("step_time_s", "step_time_median_s", "median_step_time_s", "step_time"),
    "tokens_per_s": ("tokens_per_s",),
    "mfu": ("mfu",),
    "memory_peak_bytes": ("memory_peak_bytes", "peak_memory_bytes", "peak_allocated_bytes",
                          "memory_peak_allocated_bytes", "max_memory_allocated_bytes"),
}


@dataclass(frozen=True, kw_only=True)
class Measurement:
    """One results file: what was predicted and what was measured (None where absent)."""

    path: str
    label: str
    layout: str
    gpu: str
    num_gpus: int | None
    predicted: dict[str, float | None]
    measured: dict[str, float | None]
    source: str          # "re-estimated" or "file"


def _load_json(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise PlanFileError(f"measurement file {str(path)!r} does not exist") from None
    except OSError as exc:
        raise PlanFileError(f"cannot read measurement file {str(path)!r}: {exc}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PlanFileError(f"measurement file {str(path)!r} is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise PlanFileError(f"measurement file {str(path)!r} must hold a JSON object, got "
                            f"{type(doc).__name__}")
    return doc


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    v = float(value)
    return v if v == v else None


def _pick(d: Mapping[str, Any], key: str) -> float | None:
    for k in _MEASURED_KEYS[key]:
        if k in d:
            v = d[k]
            if isinstance(v, Mapping):  # e.g. {"median": ..., "spread": ...}
                v = v.get("median", v.get("median_s", v.get("value")))
            n = _number(v)
            if n is not None:
                return n
    return None


def _peak_from_ranks(*docs: Mapping[str, Any]) -> float | None:
    """Worst rank's peak memory when a file lists ranks instead of one peak (a list of
    numbers or of per-rank objects, under any of the keys the executor has used)."""
    for d in docs:
        for key in ("memory_per_rank_bytes", "peak_memory_allocated_bytes", "per_rank",
                    "ranks", "memory_per_rank"):
            ranks = d.get(key)
            if not isinstance(ranks, list):
                continue
            vals = [_number(r) if not isinstance(r, Mapping) else _pick(r, "memory_peak_bytes")
                    for r in ranks]
            vals = [v for v in vals if v is not None]
            if vals:
                return max(vals)
    return None


def _differing_field(kind: str, mine: Mapping[str, Any], theirs: Mapping[str, Any],
                     keys: tuple[str, ...]) -> str | None:
    for k in keys:
        if k in theirs and theirs[k] != mine.get(k):
            return f"{kind}.{k}: report has {mine.get(k)!r}, file has {theirs[k]!r}"
    return None


def check_matches(path: str, doc: Mapping[str, Any], model: ModelSpec, cluster: Cluster) -> None:
    """Raise :class:`MeshplanError` naming the first field where the file's model or GPU differ.

    The model must match in every shape field (a measurement of another model says nothing
    about this one). The cluster must have the same GPU; its size may differ, since
    measurements are usually taken on a few nodes of the cluster being planned.
    """
    m = doc.get("model")
    if isinstance(m, Mapping):
        shape_keys = tuple(k for k in model.to_dict() if k != "name")
        diff = _differing_field("model", model.to_dict(), m, shape_keys)
        if diff:
            raise MeshplanError(
                f"measurement file {path!r} is for another model ({m.get('name', '?')!r}, the "
                f"report is for {model.name!r}): {diff}")
    c = doc.get("cluster")
    if isinstance(c, Mapping):
        g = c.get("gpu")
        gname = g.get("name") if isinstance(g, Mapping) else g
        if gname is not None and gname != cluster.gpu.name:
            raise MeshplanError(
                f"measurement file {path!r} is for another cluster: cluster.gpu.name: report "
                f"has {cluster.gpu.name!r}, file has {gname!r}")


def _reestimate(doc: Mapping[str, Any]) -> dict[str, float] | None:
    """The current cost model's prediction for the file's specs, or None if they are missing."""
    from meshplan.costmodel import estimate
    from meshplan.spec import Job, Layout
    try:
        model = ModelSpec.from_dict(doc["model"])
        cluster = Cluster.from_dict(doc["cluster"])
        job = Job.from_dict(doc["job"])
        layout = Layout.from_dict(doc["layout"])
        est = estimate(model, cluster, job, layout)
    except (KeyError, TypeError, MeshplanError):
        return None
    return {"step_time_s": est.step_time_s, "tokens_per_s": est.tokens_per_s, "mfu": est.mfu,
            "memory_peak_bytes": est.memory_peak_bytes}


def _layout_text(doc: Mapping[str, Any]) -> str:
    from meshplan.report.labels import label_with_split
    from meshplan.spec import Layout
    lay = doc.get("layout")
    if isinstance(lay, Mapping):
        try:
            return label_with_split(Layout.from_dict(lay))
        except MeshplanError:
            return ", ".join(f"{k}={v}" for k, v in lay.items() if v is not None)
    return "?"


def load_measurement(path: str | Path, model: ModelSpec, cluster: Cluster) -> Measurement:
    """Read one results file, check it is for ``model`` on ``cluster``'s GPU, pair the numbers."""
    p = Path(path)
    doc = _load_json(p)
    check_matches(str(p), doc, model, cluster)
    measured_doc = doc.get("measured", doc.get("measurement"))
    if not measured_doc and doc.get("error"):
        raise PlanFileError(f"measurement file {str(p)!r} records a failed run "
                            f"(status {doc.get('status', '?')!r}): {doc['error']}")
    if not isinstance(measured_doc, Mapping):
        raise PlanFileError(
            f"measurement file {str(p)!r} has no 'measured' object (keys: "
            f"{', '.join(sorted(doc)) or 'none'}); is it a results.json from "
            f"`python -m meshplan.executor.run`?")
    measured = {k: _pick(measured_doc, k) for k in _MEASURED_KEYS}
    if measured["memory_peak_bytes"] is None:
        measured["memory_peak_bytes"] = _peak_from_ranks(measured_doc, doc)
    if all(v is None for v in measured.values()):
        raise PlanFileError(
            f"measurement file {str(p)!r}: 'measured' holds none of "
            f"{', '.join(_MEASURED_KEYS)}")
    predicted = _reestimate(doc)
    source = "re-estimated"
    if predicted is None:
        pred_doc = doc.get("prediction", doc.get("predicted"))
        if not isinstance(pred_doc, Mapping):
            raise PlanFileError(
                f"measurement file {str(p)!r} has neither a 'prediction' object nor the "
                f"model/cluster/job/layout needed to recompute one")
        predicted = {k: _pick(pred_doc, k) for k in _MEASURED_KEYS}
        source = "file"
    c = doc.get("cluster") if isinstance(doc.get("cluster"), Mapping) else {}
    env = doc.get("environment") if isinstance(doc.get("environment"), Mapping) else {}
    # where it ran: the executor's device name ("cpu" for CPU test runs, which measure
    # nothing about the GPU the prediction is for), else the file's cluster GPU
    gpu = env.get("gpu_name") or env.get("device") or (
        c.get("gpu", {}).get("name") if isinstance(c.get("gpu"), Mapping) else None
    ) or cluster.gpu.name
    lay = doc.get("layout") if isinstance(doc.get("layout"), Mapping) else {}
    n = None
    if all(isinstance(lay.get(k), int) for k in ("dp", "pp", "tp")):
        n = lay["dp"] * lay["pp"] * lay["tp"]
    return Measurement(path=str(p), label=p.parent.name + "/" + p.name if p.parent.name else p.name,
                       layout=_layout_text(doc), gpu=str(gpu), num_gpus=n,
                       predicted=predicted, measured=measured, source=source)


def measurements_table(items: list[Measurement]):
    """One row per file: predicted, measured and error (%) of step time, tokens/s, MFU, memory."""
    import pandas as pd
    rows = []
    for it in items:
        row: dict[str, Any] = {"file": it.label, "layout": it.layout, "gpu": it.gpu,
                               "gpus": it.num_gpus, "prediction": it.source}
        for key in _MEASURED_KEYS:
            pv, mv = it.predicted.get(key), it.measured.get(key)
            row[f"predicted_{key}"] = pv
            row[f"measured_{key}"] = mv
            row[f"error_pct_{key}"] = (100.0 * (pv - mv) / mv) if (pv is not None and mv) else None
        rows.append(row)
    return pd.DataFrame(rows)
