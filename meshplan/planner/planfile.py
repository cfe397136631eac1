"""Plan files: one JSON document that reproduces a plan — model, cluster, job, layout, prediction.

Schema (version 1)::

    {"schema": "meshplan.plan", "version": 1, "created": "...", "meshplan_version": "...",
     "model": {...ModelSpec}, "cluster": {...Cluster}, "job": {...Job},
     "layout": {...Layout}, "prediction": {...Estimate.to_dict()},
     "candidates": [{"layout": {...}, "prediction": {...}}, ...],   # optional, ranked
     "search": {"objective": ..., "constraints": {...}, "stats": {...}},  # optional
     "gpu_profile": {"measured": {"layers": [...], "ends": [...]},         # optional
                     "corrections": {...}}}

``gpu_profile`` holds what a calibrated profile gives the cost model beyond the cluster's
GPU table: its measured layer and end rows (``meshplan calibrate --model``) and its
correction numbers. Without them a plan re-predicted from its file (``meshplan run``'s
comparison, a plan written for another layout of the same cluster) prices every layer with
the analytical curves alone, which is not the estimate the plan was chosen by: a 1.3B GPT's
FSDP2 dp 4 layout on 4 x H200 predicted 229 ms from such a file against 164 ms with the
rows, measured 160 ms (docs/benchmarks/executor_gpu.md, 2026-11-28). A field equal to its
default is left out of a row.

This module imports neither torch nor ortools, so the executor can read plan files on
machines that have only one of them.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from meshplan.spec import Job, Layout, ModelSpec
from meshplan.errors import MeshplanError, PlanFileError
from meshplan.hardware_profiles import Cluster
from meshplan.hardware_profiles.corrections import builtin_corrections, corrections_from_table
from meshplan.hardware_profiles.measured import tables_from_rows

SCHEMA = "meshplan.plan"
VERSION = 1


@dataclass(frozen=True)
class PlanRecord:
    model: ModelSpec
    cluster: Cluster
    job: Job
    layout: Layout
    prediction: dict[str, Any] = field(default_factory=dict)
    candidates: tuple[dict[str, Any], ...] = ()
    search: dict[str, Any] = field(default_factory=dict)   # objective, constraints, stats


def plan_document(model: ModelSpec, cluster: Cluster, job: Job, layout: Layout,
                  prediction: dict[str, Any] | None = None,
                  candidates: list[dict[str, Any]] | None = None,
                  search: dict[str, Any] | None = None) -> dict[str, Any]:
    from meshplan._version import __version__
    doc = {
        "schema": SCHEMA, "version": VERSION,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "meshplan_version": __version__,
        "model": model.to_dict(), "cluster": cluster.to_dict(), "job": job.to_dict(),
        "layout": layout.to_dict(), "prediction": prediction or {},
        "candidates": candidates or [],
    }
    if search:
        doc["search"] = search
    profile = gpu_profile_data(cluster)
    if profile:
        doc["gpu_profile"] = profile
    return doc


def gpu_profile_data(cluster: Cluster) -> dict[str, Any]:
    """The profile's measured rows and non-default correction numbers of ``cluster``'s GPU
    (empty: a datasheet GPU), as a plan file keeps them."""
    gpu, out = cluster.gpu, {}
    if gpu.measured:
        out["measured"] = gpu.measured.to_rows(compact=True)
    if gpu.corrections.to_table() != builtin_corrections().to_table():
        out["corrections"] = gpu.corrections.to_table()
    return out


def with_gpu_profile(cluster: Cluster, data: Any, source: str) -> Cluster:
    """``cluster`` with a plan file's ``gpu_profile`` field put back on its GPU."""
    where = f"{source}: field 'gpu_profile'"
    if not isinstance(data, dict) or set(data) - {"measured", "corrections"}:
        raise PlanFileError(f"{where} must be an object with keys 'measured' and/or "
                            f"'corrections', got {data!r:.80}")
    gpu = cluster.gpu
    try:
        if "measured" in data:
            rows = data["measured"]
            if not isinstance(rows, dict) or not all(
                    isinstance(rows.get(k, []), list) for k in ("layers", "ends")):
                raise PlanFileError(f"{where}: 'measured' must hold lists 'layers' and 'ends'")
            gpu = replace(gpu, measured=tables_from_rows(rows.get("layers", []),
                                                          rows.get("ends", []), where))
        if "corrections" in data:
            if not isinstance(data["corrections"], dict):
                raise PlanFileError(f"{where}: 'corrections' must be an object")
            gpu = replace(gpu, corrections=corrections_from_table(data["corrections"], where))
    except PlanFileError:
        raise
    except MeshplanError as exc:
        raise PlanFileError(str(exc)) from None
    return cluster.with_gpu(gpu)


def check_output_file(path: str | Path, *, overwrite: bool, what: str = "output file",
                      flag: str = "--force / overwrite=True",
                      example_name: str = "plan.json") -> Path:
    """Refuse, before any work, a path that cannot receive a file: a directory (the message
    suggests ``example_name`` in it), a parent that is a file or not writable, or an existing
    file without ``overwrite``."""
    path = Path(path)
    if path.is_dir():
        raise MeshplanError(f"{what} {str(path)!r} is a directory; give a file path such as "
                            f"{str(path / example_name)!r}")
    if path.exists() and not overwrite:
        raise MeshplanError(f"{what} {str(path)!r} exists; refusing to overwrite it (pass "
                            f"{flag} to replace it)")
    check_creatable(path.parent, f"{what} {str(path)!r}")
    return path


def check_creatable(directory: Path, what: str) -> None:
    """Refuse a directory that can neither be used nor created: its nearest existing
    ancestor must be a writable directory."""
    parent = directory
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise MeshplanError(f"{what}: {str(parent)!r} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise MeshplanError(f"{what}: directory {str(parent)!r} is not writable")


def new_temp_file(path: Path) -> tuple[int, Path]:
    """An exclusive temporary file beside ``path``, created with mode 0666 less the umask
    (``tempfile.mkstemp`` makes 0600 files, which the rename would hand on to ``path``)."""
    for _ in range(100):
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {path}")


def write_json_atomic(path: str | Path, document: Any, *, overwrite: bool = True) -> Path:
    """Write JSON to ``path`` via a temporary file and rename (never a half-written file);
    the file gets the user's umask like any other they create."""
    path = check_output_file(path, overwrite=overwrite)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = new_temp_file(path)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(document, fh, indent=2, default=_json_default)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _json_default(obj: Any) -> Any:
    if isinstance(obj, tuple):
        return list(obj)
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    raise TypeError(f"cannot write {type(obj).__name__} to JSON")


def save_plan_file(path: str | Path, model: ModelSpec, cluster: Cluster, job: Job,
                   layout: Layout, prediction: dict[str, Any] | None = None,
                   candidates: list[dict[str, Any]] | None = None,
                   *, overwrite: bool = True, search: dict[str, Any] | None = None) -> Path:
    return write_json_atomic(path, plan_document(model, cluster, job, layout, prediction,
                                                 candidates, search), overwrite=overwrite)


def load_plan_file(path: str | Path) -> PlanRecord:
    """Read and validate a plan file; errors name the file and the offending field."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PlanFileError(f"plan file {str(path)!r} does not exist") from None
    except IsADirectoryError:
        raise PlanFileError(f"plan file {str(path)!r} is a directory; give the path of a "
                            f"plan .json file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PlanFileError(f"plan file {str(path)!r} is not valid JSON: {exc}") from None
    return parse_plan_document(doc, str(path))


def parse_plan_document(doc: Any, source: str = "<plan>") -> PlanRecord:
    if not isinstance(doc, dict):
        raise PlanFileError(f"{source}: a plan file holds a JSON object, got {type(doc).__name__}")
    if doc.get("schema") != SCHEMA:
        raise PlanFileError(f"{source}: field 'schema' is {doc.get('schema')!r}, expected "
                            f"{SCHEMA!r} (not a meshplan plan file)")
    if doc.get("version") != VERSION:
        raise PlanFileError(f"{source}: field 'version' is {doc.get('version')!r}; this meshplan "
                            f"reads version {VERSION}")
    parts: dict[str, Any] = {}
    for key, loader in (("model", ModelSpec.from_dict), ("cluster", Cluster.from_dict),
                        ("job", Job.from_dict), ("layout", Layout.from_dict)):
        if key not in doc:
            raise PlanFileError(f"{source}: field {key!r} is missing")
        try:
            parts[key] = loader(doc[key])
        except MeshplanError as exc:
            raise PlanFileError(f"{source}: field {key!r} is invalid: {exc}") from None
        except Exception as exc:  # a foreign shape: wrong types inside the field
            raise PlanFileError(f"{source}: field {key!r} is malformed: {exc}") from None
    prediction = doc.get("prediction", {})
    if not isinstance(prediction, dict):
        raise PlanFileError(f"{source}: field 'prediction' must be an object")
    cands = doc.get("candidates", [])
    if not isinstance(cands, list):
        raise PlanFileError(f"{source}: field 'candidates' must be a list")
    search = doc.get("search", {})
    if not isinstance(search, dict):
        raise PlanFileError(f"{source}: field 'search' must be an object")
    cluster = parts["cluster"]
    if "gpu_profile" in doc:
        cluster = with_gpu_profile(cluster, doc["gpu_profile"], source)
    return PlanRecord(parts["model"], cluster, parts["job"], parts["layout"],
                      prediction, tuple(cands), search)
