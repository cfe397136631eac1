"""Re-predict every measured 4-GPU set with the current cost model, each on its own profile.

    python benchmarks/repredict_sets.py                      # summary by shape
    python benchmarks/repredict_sets.py --only "pp1.*z[23]"  # and those layouts one by one

Every ``docs/benchmarks/accuracy_<set>.json`` of ``SETS`` (the sets whose runs had their own
calibration; holdout7 on) is re-scored with :func:`meshplan.calibrate.validate.rescore`
against the profile its run used: the ``profile_*.toml`` whose provenance date the record's
``gpu_profile`` names. The summary groups layouts by model and shape (FSDP2 over dp alone,
pipelined FSDP2, zero-bubble, interleaved, other) and by CPU load (the model's
``host_load``: below 80 % of the GPU's time, or not), and prints mean absolute, mean signed
and maximum step-time error for each, then for all layouts with the CPU below the GPU. This
is how model changes are checked against every measured layout before they are made
(docs/benchmarks/accuracy.md, rounds 16-25): a change fitted on these layouts is post hoc
until a new held-out set has run.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from meshplan.calibrate.validate import rescore  # noqa: E402
from meshplan.spec import Job  # noqa: E402
from meshplan.hardware_profiles.calibrated import apply_profile  # noqa: E402
from validate_device import GPT_05B, LLAMA_16B, _gpu_cluster  # noqa: E402

BENCH = ROOT / "docs" / "benchmarks"
SETS = tuple(f"holdout{i}" for i in (7, 8, 9, 10, 11, 12, 13, *range(16, 26))) \
    + ("pair12", "pair14", "pair16")
NEAR_HOST_LOAD = 0.8


def profiles_by_date(bench: Path = BENCH) -> dict[str, Path]:
    """Each committed profile by its provenance date (how a run's record names it)."""
    out = {}
    for f in sorted(bench.glob("profile_*.toml")):
        with open(f, "rb") as fh:
            date = tomllib.load(fh).get("provenance", {}).get("date")
        if date:
            out[date] = f
    return out


def set_context(name: str, profiles: dict[str, Path], bench: Path = BENCH):
    """A measured set's (accuracy document, cluster on the profile its run used, job), or
    None where no profile in ``profiles`` (:func:`profiles_by_date`) has the date its
    ``gpu_profile`` names."""
    doc = json.loads((bench / f"accuracy_{name}.json").read_text())
    found = re.search(r"(\d{4}-\d\d-\d\dT[\d:]+\+00:00)", str(doc.get("gpu_profile")))
    profile = profiles.get(found.group(1)) if found else None
    if profile is None:
        return None
    cluster = apply_profile(_gpu_cluster(doc["gpu_name"], int(doc.get("nproc") or 4)), profile)
    return doc, cluster, Job.from_dict(doc["job"])


def measured_records(sets, bench: Path = BENCH):
    """(set, cluster, job, record) for every layout that ran in ``sets``, the cluster on the
    profile its run used; a set without a committed profile is skipped with a message."""
    profiles = profiles_by_date(bench)
    for name in sets:
        context = set_context(name, profiles, bench)
        if context is None:
            print(f"{name}: no committed profile for its run, skipped", file=sys.stderr)
            continue
        doc, cluster, job = context
        for rec in doc["records"]:
            if rec.get("status") == "ok":
                yield name, cluster, job, rec


def repredict(sets=SETS, bench: Path = BENCH) -> list[tuple[str, dict]]:
    """(set, re-scored record) for every layout that ran, on its own profile."""
    models = {m.name: m for m in (GPT_05B, LLAMA_16B)}
    return [(name, rescore(rec, models[rec["model"]], cluster, job))
            for name, cluster, job, rec in measured_records(sets, bench)]


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
    args = ap.parse_args(argv)
    try:
        pattern = re.compile(args.only) if args.only else None
    except re.error as exc:
        ap.error(f"--only {args.only!r} is not a regular expression: {exc}")
    rows = repredict()
    if pattern:
        for name, x in rows:
            if pattern.search(f"{x['model']} {x['short']}"):
                mem = " ".join(f"{e:+.1f}" for e in x["memory_error_pct_per_rank"])
                print(f"{name:<10} {x['name']} {x['model']:<12} {x['short']:<50} "
                      f"CPU {x['predicted'].get('host_load', 0):.2f} "
                      f"step {x['step_time_error_pct']:+6.1f} %  memory {mem}")
        print()
    groups: dict[tuple, list[float]] = {}
    for _, x in rows:
        load = x["predicted"].get("host_load", 0.0)
        key = (x["model"], shape(x["layout"]),
               "CPU < 80 %" if load < NEAR_HOST_LOAD else "CPU >= 80 %")
        groups.setdefault(key, []).append(x["step_time_error_pct"])
    for key in sorted(groups):
        print(summary_line(" · ".join(key), groups[key]))
    print()
    below = [x["step_time_error_pct"] for _, x in rows
             if x["predicted"].get("host_load", 0.0) < 1.0]
    print(summary_line("all layouts with CPU below GPU", below))
    print(summary_line("all layouts", [x["step_time_error_pct"] for _, x in rows]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
