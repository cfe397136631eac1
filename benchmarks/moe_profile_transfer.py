"""Post hoc: the 1-GPU checks priced from profiles that never timed their model (the MoE
checks moehN; the dense fp8hN checks alike).

Every MoE check moeh18-moeh28 (1 × H200, bf16 and fp8) was predicted from a calibration of its
own model (``meshplan calibrate --model``), as a user with that model would. A user planning a
model they have not calibrated gets the profile of another: its layer rows carried to the new
shape by the analytical ratio (:mod:`meshplan.costmodel.nearest_rows`), its GEMM, grouped-GEMM
and memory-bound curves read at the new sizes. This takes each run of the named data files,
finds the committed plan that priced it (the plan whose stored step time is the run's
prediction, as ``optimizer_rate_posthoc.py`` does), and prices it again with each *other*
check's profile (same machine type), nothing fitted: the error of that transfer beside the
error with the profile its plans were made on (its own calibration; moeh29's plans were made
on moeh28's) and with the datasheet profile, in today's tree. Peak memory likewise.

    python benchmarks/moe_profile_transfer.py docs/benchmarks/data/moe_fp8_h200x1_moeh2[3-8]_*.json
    python benchmarks/moe_profile_transfer.py docs/benchmarks/data/fp8_h200x1_fp8h*_2026*.json \
        --profiles 'docs/benchmarks/data/profiles/profile_h200x1_fp8h*_2026*.toml'
"""

from __future__ import annotations

import argparse
import glob
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from optimizer_rate_posthoc import matched_runs  # noqa: E402

from meshplan.costmodel import estimate  # noqa: E402
from meshplan.errors import MeshplanError  # noqa: E402
from meshplan.hardware_profiles.calibrated import apply_profile  # noqa: E402
from meshplan.hardware_profiles.loader import builtin_gpu  # noqa: E402
from meshplan.planner.planfile import load_plan_file  # noqa: E402

_CHECK = re.compile(r"_((?:moeh|fp8h)\d+(?:h100)?)_\d{8}\.(json|toml)$")
_TAG = re.compile(r"(?:moeh|fp8h)\d+")


def check_name(path: str) -> str | None:
    """The check a data or profile file belongs to; None where it names none or several (a
    two-model calibration, e.g. ``profile_h200x1_fp8h48_fp8h49_*.toml``: priced as one
    check's profile it would carry the other check's own rows)."""
    name = Path(path).name
    m = _CHECK.search(name)
    return m.group(1) if m and len(_TAG.findall(name)) == 1 else None


def datasheet(cluster):
    """The cluster's GPU as its built-in datasheet profile (no calibration)."""
    return cluster.replace(gpu=builtin_gpu(cluster.gpu.name))


def runs(data: list[str], plans_glob: str):
    """(check, arm precision, run key, measured s, plan record, measured peak bytes) of every
    run whose committed plan is found."""
    for path, key, run, meas, _, plan in matched_runs(data, plans_glob):
        rec = load_plan_file(plan)
        yield check_name(path), rec.job.precision, key, meas, rec, run.get("memory_peak_bytes")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data", nargs="+", help="check data files (docs/benchmarks/data/*.json)")
    ap.add_argument("--plans", default=str(ROOT / "benchmarks/plans/*h200x1/*.json"))
    ap.add_argument("--profiles", default=str(
        ROOT / "docs/benchmarks/data/profiles/profile_h200x1_moeh*_2026*.toml"))
    args = ap.parse_args(argv)
    profiles = {check_name(p): p for p in sorted(glob.glob(args.profiles)) if check_name(p)}
    if not profiles:
        raise SystemExit(f"no check's profile matches {args.profiles}")
    table = ["| check | run | precision | meas. s | own profile (error) | datasheet | "
             "other checks' profiles: mean / worst error | worst from |",
             "|---|---|---|---|---|---|---|---|"]
    own_e: dict[str, list[float]] = {"bf16": [], "fp8": []}
    other_e: dict[str, list[float]] = {"bf16": [], "fp8": []}
    sheet_e: dict[str, list[float]] = {"bf16": [], "fp8": []}
    refused: dict[str, int] = {}
    mem_e: dict[str, list[float]] = {"own": [], "others": []}
    for name, prec, key, meas, rec, peak in runs(args.data, args.plans):
        est = estimate(rec.model, rec.cluster, rec.job, rec.layout)
        own = est.step_time_s / meas - 1
        sheet = estimate(rec.model, datasheet(rec.cluster), rec.job,
                         rec.layout).step_time_s / meas - 1
        errs = {}
        for other, path in profiles.items():
            if other == name:
                continue
            try:
                cl = apply_profile(rec.cluster, path)
                e = estimate(rec.model, cl, rec.job, rec.layout)
                errs[other] = e.step_time_s / meas - 1
                if peak:
                    mem_e["others"].append(abs(e.memory_peak_bytes / peak - 1))
            except MeshplanError as exc:
                refused[type(exc).__name__] = refused.get(type(exc).__name__, 0) + 1
        if not errs:
            continue
        worst = max(errs, key=lambda k: abs(errs[k]))
        own_e[prec].append(abs(own))
        if peak:
            mem_e["own"].append(abs(est.memory_peak_bytes / peak - 1))
        sheet_e[prec].append(abs(sheet))
        other_e[prec].extend(abs(e) for e in errs.values())
        table.append(f"| {name} | `{key}` | {prec} | {meas:.3f} | {own * 100:+.1f} % | "
                     f"{sheet * 100:+.1f} % | "
                     f"{statistics.mean(abs(e) for e in errs.values()) * 100:.1f} % / "
                     f"{errs[worst] * 100:+.1f} % | {worst} |")
    print("\n".join(table))
    print()
    for prec in ("bf16", "fp8"):
        if own_e[prec]:
            print(f"{prec}: own profile {statistics.mean(own_e[prec]) * 100:.1f} % mean, "
                  f"{max(own_e[prec]) * 100:.1f} % max ({len(own_e[prec])} runs); datasheet "
                  f"{statistics.mean(sheet_e[prec]) * 100:.1f} % mean, "
                  f"{max(sheet_e[prec]) * 100:.1f} % max; another "
                  f"check's profile {statistics.mean(other_e[prec]) * 100:.1f} % mean, "
                  f"{statistics.median(other_e[prec]) * 100:.1f} % median, "
                  f"{max(other_e[prec]) * 100:.1f} % max ({len(other_e[prec])} pairs)")
    for k, v in mem_e.items():
        if v:
            print(f"peak memory, {k}: {statistics.mean(v) * 100:.1f} % mean, "
                  f"{max(v) * 100:.1f} % max, within 5 % on {sum(x <= 0.05 for x in v)} of "
                  f"{len(v)}")
    if refused:
        print(f"refused (profile did not apply): {refused}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
