"""Re-predict every measured layout of the GPU sets with the current cost model, each on the
profile its run used: the cost model's regression check against every measured layout.

    python benchmarks/repredict_sets.py                      # summary by shape
    python benchmarks/repredict_sets.py --only "pp1.*z[23]"  # and those layouts one by one
    python benchmarks/repredict_sets.py --datasheet          # on the GPU's datasheet profile

Reads ``docs/benchmarks/data/measured_sets.json`` (the measured layouts of ``SETS``: the sets
whose runs had their own calibration, holdout7 on, as run) and re-scores every layout with
:func:`meshplan.calibrate.validate.rescore` on the cluster of its run with the profile that
run used (``docs/benchmarks/data/profiles/``). The summary groups layouts by model and
shape (FSDP2 over dp alone, pipelined FSDP2, zero-bubble, interleaved, other) and by CPU
load (the model's ``host_load``: below 80 % of the GPU's time, or not), and prints mean
absolute, mean signed and maximum step-time error for each, then for all layouts with the
CPU below the GPU. Model changes are checked against every measured layout with it before
they are made (docs/benchmarks/accuracy.md): a change fitted on these layouts is post hoc
until a new held-out set has run. ``--datasheet`` prices every layout on its GPU's
datasheet profile instead (no calibration: how far an uncalibrated user's prediction was),
grouped the same way by the calibrated estimate's CPU load.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tomllib
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from layout_sets import GPT_05B, LLAMA_16B, gpu_cluster  # noqa: E402
from meshplan.calibrate.validate import rescore  # noqa: E402
from meshplan.hardware_profiles.calibrated import apply_profile  # noqa: E402
from meshplan.spec import Job  # noqa: E402

DATA = ROOT / "docs" / "benchmarks" / "data"
MEASURED = DATA / "measured_sets.json"
#: these sets ran the executor before bc12f8f (FSDP2 without explicit forward prefetch),
#: whose FSDP2-over-dp steps spent 0.020 s beyond the rows (round 22; the built-in default
#: is 0 for the prefetching executor since round 38: hardware_profiles/data/corrections.toml)
OLD_EXECUTOR_FSDP2_STEP_S = 0.020
SETS = tuple(f"holdout{i}" for i in (7, 8, 9, 10, 11, 12, 13, *range(16, 26))) \
    + ("pair12", "pair14", "pair16")
NEAR_HOST_LOAD = 0.8


def load_measured(path: Path = MEASURED) -> dict[str, dict]:
    """Every measured set of ``path`` by name: its run's metadata (``gpu_name``, ``nproc``,
    ``job``, ``gpu_profile``, ``profile``: the profile file relative to ``path``) and its
    ``records``."""
    return json.loads(path.read_text())["sets"]


def set_context(name: str, measured: dict[str, dict], data: Path = DATA,
                datasheet: bool = False):
    """A measured set's (metadata and records, cluster on the profile its run used, job);
    ``datasheet``: the cluster on its GPU's datasheet profile instead."""
    if name not in measured:
        raise SystemExit(f"repredict_sets: no measured set {name!r} in {MEASURED}; known: "
                         f"{', '.join(measured)}")
    doc = measured[name]
    cluster = gpu_cluster(doc["gpu_name"], int(doc["nproc"]))
    if not datasheet:
        cluster = apply_profile(cluster, data / doc["profile"])
    return doc, as_run_executor(cluster, data / doc["profile"]), Job.from_dict(doc["job"])


def as_run_executor(cluster, profile: Path):
    """``cluster`` with the FSDP2 per-step term of the executor these sets ran, where their
    profile does not carry one of its own."""
    own = tomllib.loads(profile.read_text()).get("corrections", {})
    if "fsdp2_dp_only_step_s" in own:
        return cluster
    gpu = cluster.gpu
    return cluster.with_gpu(replace(gpu, corrections=replace(
        gpu.corrections, fsdp2_dp_only_step_s=OLD_EXECUTOR_FSDP2_STEP_S)))


def measured_records(sets, path: Path = MEASURED, datasheet: bool = False):
    """(set, cluster, job, record) for every layout that ran in ``sets``, the cluster on the
    profile its run used (``datasheet``: on its GPU's datasheet profile)."""
    measured = load_measured(path)
    for name in sets:
        doc, cluster, job = set_context(name, measured, path.parent, datasheet)
        for rec in doc["records"]:
            if rec.get("status") == "ok":
                yield name, cluster, job, rec


def accuracy_doc(name: str, path: Path = MEASURED) -> dict:
    """A measured set as an ``accuracy.json`` of ``validate_device.py`` (its run's metadata
    and records, the prediction each ran with as ``predicted``): for ``validate_device.py
    --repredict`` and ``--merge``."""
    doc = dict(load_measured(path)[name])
    records = [{**{k: v for k, v in r.items() if k != "predicted_as_run"},
                "predicted": r["predicted_as_run"]} for r in doc.pop("records")]
    return {**doc, "device": "cuda", "profile": str(path.parent / doc["profile"]),
            "records": records}


def repredict(sets=SETS, path: Path = MEASURED, datasheet: bool = False
              ) -> list[tuple[str, dict]]:
    """(set, re-scored record) for every layout that ran, on its own profile; with
    ``datasheet``, on its GPU's datasheet profile, the calibrated estimate's CPU load kept
    as ``calibrated_host_load`` (the datasheet prices no CPU for these layouts)."""
    models = {m.name: m for m in (GPT_05B, LLAMA_16B)}
    out = [(name, rescore(rec, models[rec["model"]], cluster, job))
           for name, cluster, job, rec in measured_records(sets, path)]
    if not datasheet:
        return out
    sheet = [rescore(rec, models[rec["model"]], cluster, job)
             for _, cluster, job, rec in measured_records(sets, path, datasheet=True)]
    return [(name, dict(x, calibrated_host_load=own["predicted"].get("host_load", 0.0)))
            for (name, own), x in zip(out, sheet)]


def shape(layout: dict) -> str:
    """The shape a layout is summarised under (first that applies)."""
    fsdp = layout["zero"] >= 2 and layout["dp"] > 1
    if fsdp and layout["pp"] == 1 and layout["tp"] == 1:
        return "FSDP2 over dp alone"
    if layout["schedule"] == "zero-bubble":
        return "zero-bubble" + (" FSDP2" if fsdp else "")
    if fsdp and layout["pp"] > 1:
        return "pipelined FSDP2"
    if layout["schedule"] == "interleaved-1f1b":
        return "interleaved"
    return "other"


def summary_line(label: str, errors: list[float]) -> str:
    if not errors:
        return f"{label:<48} n=  0"
    return (f"{label:<48} n={len(errors):3d}  mean abs {statistics.mean(map(abs, errors)):5.2f} %"
            f"  signed {statistics.mean(errors):+6.2f} %  max {max(map(abs, errors)):5.1f} %"
            f"  beyond 8 %: {sum(abs(e) > 8 for e in errors)}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default=None,
                    help="regular expression on 'model layout' (e.g. 'pp1.*z[23]'): print "
                         "the matching layouts one by one")
    ap.add_argument("--datasheet", action="store_true",
                    help="price every layout on its GPU's datasheet profile instead of the "
                         "calibrated one its run used (grouped by the calibrated CPU load)")
    args = ap.parse_args(argv)
    try:
        pattern = re.compile(args.only) if args.only else None
    except re.error as exc:
        ap.error(f"--only {args.only!r} is not a regular expression: {exc}")
    rows = repredict(datasheet=args.datasheet)

    def load(x: dict) -> float:
        return x.get("calibrated_host_load", x["predicted"].get("host_load", 0.0))
    if pattern:
        for name, x in rows:
            if pattern.search(f"{x['model']} {x['short']}"):
                mem = " ".join(f"{e:+.1f}" for e in x["memory_error_pct_per_rank"])
                print(f"{name:<10} {x['name']} {x['model']:<12} {x['short']:<50} "
                      f"CPU {load(x):.2f} "
                      f"step {x['step_time_error_pct']:+6.1f} %  memory {mem}")
        print()
    groups: dict[tuple, list[float]] = {}
    for _, x in rows:
        key = (x["model"], shape(x["layout"]),
               "CPU < 80 %" if load(x) < NEAR_HOST_LOAD else "CPU >= 80 %")
        groups.setdefault(key, []).append(x["step_time_error_pct"])
    for key in sorted(groups):
        print(summary_line(" · ".join(key), groups[key]))
    print()
    below = [x["step_time_error_pct"] for _, x in rows if load(x) < 1.0]
    print(summary_line("all layouts with CPU below GPU", below))
    print(summary_line("all layouts", [x["step_time_error_pct"] for _, x in rows]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
