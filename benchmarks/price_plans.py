"""Price a check's committed plans with several GPU profiles before it runs (or after).

A held-out check commits its predictions before any run. When the question is how a
prediction depends on the profile it is read from (the model's nearest profile of its own
family, another family's, the datasheet), one table per check says so, written before the
run from the committed plan files and profiles; after the run the same command with
``--results`` adds the measured step times and each column's error.

    python benchmarks/price_plans.py benchmarks/plans/fp8h24_*_h200x1 \\
        --profile own=docs/benchmarks/data/profiles/profile_h200x1_fp8h3_20261129.toml \\
        --profile other=docs/benchmarks/data/profiles/profile_h200x1_fp8h20_20261201.toml
    python benchmarks/price_plans.py ... --results docs/benchmarks/data/fp8_h200x1_fp8h24_*.json
    python benchmarks/price_plans.py ... --memory     # peak GiB a rank, not step seconds
    python benchmarks/price_plans.py ... --host-load  # each profile's host load beside its price

Columns: each ``--profile`` NAME=PATH (a profile applied to the plan's cluster), the
built-in datasheet of the plan's GPU, and the mean over every profile matching ``--all``
(each check's profile of the same machine type), nothing fitted.
"""

from __future__ import annotations

import argparse
import glob
import json
import statistics
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from moe_profile_transfer import datasheet  # noqa: E402

from meshplan.costmodel import estimate  # noqa: E402
from meshplan.errors import MeshplanError, MeshplanWarning  # noqa: E402
from meshplan.hardware_profiles.calibrated import apply_profile  # noqa: E402
from meshplan.hardware_profiles.loader import builtin_gpu  # noqa: E402
from meshplan.planner.planfile import load_plan_file  # noqa: E402


def plan_files(dirs: list[str]) -> list[Path]:
    """The plan files of each directory (its predictions.json left out), in name order."""
    out = []
    for d in dirs:
        out += sorted(p for p in Path(d).glob("*.json") if p.name != "predictions.json")
    if not out:
        raise SystemExit(f"no plan files in {' '.join(dirs)}")
    return out


def measured(paths: list[str], key: str = "step_time_s",
             scale: float = 1.0) -> dict[tuple[str, str], float | str]:
    """(precision, layout) -> the data files' runs' ``key`` (step seconds, or peak bytes)
    times ``scale``, or the status of a run that did not finish ("failed"). A data file
    holds, per precision, one
    ``moe_sync.json`` of every layout (``{"runs": ...}``) or one per layout, by name (the
    checks run an arm per call since fp8h31)."""
    out: dict[tuple[str, str], float | str] = {}
    for path in paths:
        doc = json.loads(Path(path).read_text())
        for prec in ("bf16", "fp8"):
            part = doc.get(prec) or {}
            syncs = [part] if "runs" in part else [v for v in part.values()
                                                    if isinstance(v, dict)]
            for sync in syncs:
                for name, run in (sync.get("runs") or {}).items():
                    value = run.get(key)
                    status = run.get("status", "failed")
                    # a finished run without the value (e.g. read from a log): not measured
                    out[prec, name.split("/")[0]] = (value * scale if value else
                                                      "not recorded" if status == "ok"
                                                      else status)
    return out


def measured_values(paths: list[str], memory: bool = False
                    ) -> dict[tuple[str, str], float | str]:
    """:func:`measured` of the step seconds, or with ``memory`` the peak GiB."""
    return measured(paths, "memory_peak_bytes", 2.0**-30) if memory else measured(paths)


def named_profiles(items: list[str]) -> list[tuple[str, str]]:
    """``--profile NAME=PATH`` arguments as (name, path), each path an existing file."""
    named = []
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not Path(path).is_file():
            raise SystemExit(f"--profile {item!r}: use NAME=PATH of an existing profile")
        named.append((name, path))
    return named


def priced_cluster(rec, profile: str | None, gpu: str | None = None):
    """The plan's cluster with ``profile`` applied (None: the datasheet); ``gpu``: on that
    built-in GPU instead of the plan's own."""
    base = rec.cluster.replace(gpu=builtin_gpu(gpu)) if gpu else rec.cluster
    return datasheet(base) if profile is None else apply_profile(base, profile)


def _estimate(rec, profile: str | None, gpu: str | None):
    try:
        return estimate(rec.model, priced_cluster(rec, profile, gpu), rec.job, rec.layout)
    except MeshplanError:
        return None


def _value(est, memory: bool) -> float | None:
    if est is None:
        return None
    return est.memory_peak_bytes / 2**30 if memory else est.step_time_s


def price(rec, profile: str | None, memory: bool = False,
          gpu: str | None = None) -> float | None:
    """The plan's step seconds (``memory``: peak GiB a rank) with ``profile`` applied to its
    cluster (None: the datasheet), or None where the profile does not apply or the estimate
    refuses the layout. ``gpu``: the plan's cluster with that built-in GPU instead of its own
    (the same layouts run on another GPU type)."""
    return _value(_estimate(rec, profile, gpu), memory)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("plans", nargs="+", help="directories of committed plan files")
    ap.add_argument("--profile", action="append", default=[], metavar="NAME=PATH",
                    help="a named profile column (repeat)")
    ap.add_argument("--all", default=str(
        ROOT / "docs/benchmarks/data/profiles/profile_h200x1_fp8h*_2026*.toml"),
                    help="glob of the profiles whose mean is the last column")
    ap.add_argument("--results", nargs="*", default=[],
                    help="data files of the run (keys bf16/fp8 → runs → layout/…)")
    ap.add_argument("--memory", action="store_true",
                    help="peak GiB a rank (the runs' memory_peak_bytes), not step seconds")
    ap.add_argument("--host-load", action="store_true",
                    help="after each profile's price, its host load (CPU dispatch over GPU "
                         "time; 0.8 or more: host-loaded)")
    ap.add_argument("--gpu", default=None, metavar="NAME",
                    help="price the plans on this built-in GPU instead of their own (e.g. "
                         "H100-SXM5-80GB: the same layouts run on another GPU type)")
    args = ap.parse_args(argv)
    if args.gpu:
        try:
            builtin_gpu(args.gpu)
        except MeshplanError as exc:    # a GPU the price would refuse on every column
            raise SystemExit(f"--gpu: {exc}")
    named = named_profiles(args.profile)
    every = sorted(glob.glob(args.all))
    meas = measured_values(args.results, args.memory)
    warnings.simplefilter("ignore", MeshplanWarning)
    head = ["layout", "precision", *[n for n, _ in named], "datasheet",
            f"mean of {len(every)} profiles"]
    if meas:
        head.insert(2, "measured GiB" if args.memory else "measured s")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    errs: dict[str, list[float]] = {}
    prices: dict[tuple[str, str, str], float] = {}     # (column, precision, layout) -> s
    for path in plan_files(args.plans):
        rec = load_plan_file(path)
        prec = rec.job.precision
        m = meas.get((prec, path.stem), "not run")
        # one estimate a named profile: its price and, with --host-load, its host load
        ests = [(n, _estimate(rec, p, args.gpu)) for n, p in named]
        cols = [(n, _value(e, args.memory)) for n, e in ests]
        cols.append(("datasheet", price(rec, None, args.memory, args.gpu)))
        all_s = [s for s in (price(rec, p, args.memory, args.gpu) for p in every)
                 if s is not None]
        cols.append(("all", statistics.mean(all_s) if all_s else None))
        ran = isinstance(m, float)
        cells = [f"`{path.stem}`", prec] + ([f"{m:.3f}" if ran else m] if meas else [])
        loads = {n: e.host_load for n, e in ests if e is not None} \
            if args.host_load and not args.memory else {}
        for name, s in cols:
            if s is None:
                cells.append("refused")
                continue
            prices[name, prec, path.stem] = s
            load = f"host {loads[name]:.2f}" if loads.get(name) else ""
            if ran:
                err = f"{(s / m - 1) * 100:+.1f} %"
                cells.append(f"{s:.3f} ({err}; {load})" if load else f"{s:.3f} ({err})")
                errs.setdefault(f"{prec} {name}", []).append(abs(s / m - 1))
            else:
                cells.append(f"{s:.3f} ({load})" if load else f"{s:.3f}")
        print("| " + " | ".join(cells) + " |")
    for key, v in errs.items():
        print(f"\n{key}: {statistics.mean(v) * 100:.1f} % mean, {max(v) * 100:.1f} % max "
              f"({len(v)} runs)", end="")
    print()
    for line in ([] if args.memory else speedup_lines(prices, meas)):
        print(line)
    return 0


def speedup_lines(prices: dict[tuple[str, str, str], float],
                  meas: dict[tuple[str, str], float | str]) -> list[str]:
    """Per column, the error of the predicted fp8/bf16 speed-up (bf16 s / fp8 s) over the
    layouts whose two arms both ran and were both priced."""
    ran = {lay for (prec, lay), m in meas.items() if prec == "bf16" and isinstance(m, float)
           and isinstance(meas.get(("fp8", lay)), float)}
    out = []
    for name in dict.fromkeys(c for c, _, _ in prices):
        e = [prices[name, "bf16", lay] / prices[name, "fp8", lay]
             / (meas["bf16", lay] / meas["fp8", lay]) - 1 for lay in sorted(ran)
             if (name, "bf16", lay) in prices and (name, "fp8", lay) in prices]
        if e:
            out.append(f"fp8/bf16 speed-up {name}: {statistics.mean(map(abs, e)) * 100:.1f} % "
                       f"mean, {max(map(abs, e)) * 100:.1f} % max ({len(e)} pairs; "
                       + ", ".join(f"{x * 100:+.1f} %" for x in e) + ")")
    return out


if __name__ == "__main__":
    raise SystemExit(main())
