"""The GPU layout sets and their models, read from the data files in ``benchmarks/sets/``.

``sets/models.toml`` holds the models (ModelSpec fields by name); ``sets/layout_sets.toml``
the jobs and, per set, its job, its rank count and its layouts (name, model, the Layout
fields that differ from the defaults), with the set's design in the comments above it.
The scripts that run or re-predict the sets (``validate_device.py``, ``draw_holdout.py``,
``repredict_sets.py``, ``memory_walk.py``) read them through this module::

    import layout_sets as ls
    ls.SETS["holdout25"]                       # [(name, ModelSpec, Layout), ...]
    ls.SET_JOBS["holdout25"], ls.SET_NPROC["holdout25"]

Nothing is run here; loading checks that every layout names a known model and that the
Layout fields are valid (``Layout``'s own checks), and says which set and layout if not.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from meshplan.errors import ConfigError, MeshplanError  # noqa: E402
from meshplan.hardware_profiles import Cluster  # noqa: E402
from meshplan.spec import Job, Layout, ModelSpec  # noqa: E402

SETS_DIR = Path(__file__).resolve().parent / "sets"
MODELS_FILE = SETS_DIR / "models.toml"
SETS_FILE = SETS_DIR / "layout_sets.toml"


def _read(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: {exc}") from exc


def gpu_cluster(gpu_name: str, nproc: int) -> Cluster:
    """The one-node cluster preset of the lent GPUs (H200 or H100) with ``nproc`` GPUs: what
    a set runs on, and what a profile calibrated there applies to."""
    preset = "dgx-h200" if "H200" in gpu_name else "dgx-h100"
    return Cluster.preset(preset, nodes=1, gpus_per_node=nproc)


def load_models(path: Path = MODELS_FILE) -> dict[str, ModelSpec]:
    """Every model of ``path`` by name."""
    out = {}
    for name, fields in _read(path).items():
        try:
            out[name] = ModelSpec(name=name, **fields)
        except (TypeError, MeshplanError) as exc:
            raise ConfigError(f"{path} [{name}]: {exc}") from exc
    return out


def load_sets(path: Path = SETS_FILE, models: dict[str, ModelSpec] | None = None):
    """``(sets, set_jobs, set_nproc, jobs)`` of ``path``: each set's ``[(name, ModelSpec,
    Layout), ...]``, its Job and rank count, and the named jobs. An alias (``[aliases]``) is
    the union of the sets it lists, in order."""
    models = load_models() if models is None else models
    doc = _read(path)
    jobs = {}
    for name, fields in doc.get("jobs", {}).items():
        try:
            jobs[name] = Job(**fields)
        except (TypeError, MeshplanError) as exc:
            raise ConfigError(f"{path} [jobs.{name}]: {exc}") from exc
    sets, set_jobs, set_nproc = {}, {}, {}
    for set_name, s in doc.get("sets", {}).items():
        where = f"{path} [sets.{set_name}]"
        if s.get("job") not in jobs:
            raise ConfigError(f"{where}: job {s.get('job')!r} is not one of {sorted(jobs)}")
        entries = []
        for raw in s.get("layouts", []):
            fields = dict(raw)
            name, model = fields.pop("name", None), fields.pop("model", None)
            if model not in models:
                raise ConfigError(f"{where} layout {name!r}: model {model!r} is not one of "
                                  f"{sorted(models)} ({MODELS_FILE.name})")
            if "stage_layers" in fields:
                fields["stage_layers"] = tuple(fields["stage_layers"])
            try:
                entries.append((name, models[model], Layout(**fields)))
            except (TypeError, MeshplanError) as exc:
                raise ConfigError(f"{where} layout {name!r}: {exc}") from exc
        sets[set_name] = entries
        set_jobs[set_name] = jobs[s["job"]]
        set_nproc[set_name] = int(s.get("nproc", 4))
    for alias, members in doc.get("aliases", {}).items():
        unknown = [m for m in members if m not in sets]
        if unknown:
            raise ConfigError(f"{path} [aliases] {alias}: unknown sets {unknown}")
        sets[alias] = [e for m in members for e in sets[m]]
        set_jobs[alias], set_nproc[alias] = set_jobs[members[0]], set_nproc[members[0]]
    return sets, set_jobs, set_nproc, jobs


MODELS = load_models()
SETS, SET_JOBS, SET_NPROC, JOBS = load_sets(models=MODELS)
GPT_05B, LLAMA_16B = MODELS["gpt-0.54b"], MODELS["llama-1.64b"]
TINY_GPT, TINY_LLAMA = MODELS["tiny-gpt"], MODELS["tiny-llama"]
# the sets' two jobs: global batch 32 (rounds 1-3 and the 2-GPU sets) and 64 (4-GPU sets since
# round 4); --device cpu runs the "cpu" set on its own tiny job
JOB, JOB4, CPU_JOB = JOBS["gb32"], JOBS["gb64"], JOBS["cpu"]
CPU_LAYOUTS = SETS["cpu"]
