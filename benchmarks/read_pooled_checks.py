"""Pool several 1-GPU checks' arms, each priced from the same profiles, and read a
pre-registered rule on them: the step-time (or peak-memory) error of every column over every
arm that ran, and, with ``--rule untimed-shape``, the decision
``benchmarks/sets/moe_untimed_shape_rule/README.md`` fixed before its draws ran.

    python benchmarks/read_pooled_checks.py moeh60 moeh61 moeh62 \\
        --profile moeh40=docs/benchmarks/data/profiles/profile_h200x1_moeh40_20261203.toml \\
        --profile moeh58=docs/benchmarks/data/profiles/profile_h200x1_moeh58_20261205.toml \\
        --rule untimed-shape
    python benchmarks/read_pooled_checks.py ... --memory

Each check's plans are ``benchmarks/plans/<check>_{bf16,fp8}_h200x1`` and its run the one
data file ``docs/benchmarks/data/moe_fp8_h200x1_<check>_*.json``; a check without one has not
run, and the rule is not read until every check has. One check at a time, the table is
``price_plans.py``'s (whose layout names repeat across checks, so it does not pool them).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from price_plans import measured_values, named_profiles, plan_files, price  # noqa: E402

from meshplan.errors import MeshplanWarning  # noqa: E402
from meshplan.planner.planfile import load_plan_file  # noqa: E402

DATA = ROOT / "docs" / "benchmarks" / "data"
PLANS = ROOT / "benchmarks" / "plans"


def check_data(check: str) -> Path | None:
    """The check's one run data file, or None where it has not run."""
    found = sorted(DATA.glob(f"moe_fp8_h200x1_{check}_*.json"))
    if len(found) > 1:
        raise SystemExit(f"{check}: {len(found)} data files ({', '.join(p.name for p in found)});"
                         " expected one")
    return found[0] if found else None


def errors(checks: list[str], named: list[tuple[str, str]], memory: bool = False
           ) -> tuple[dict[str, list[float]], list[str]]:
    """(column -> signed errors over every arm that ran, checks not run yet); the columns are
    the named profiles and the datasheet."""
    out: dict[str, list[float]] = {name: [] for name, _ in named}
    out["datasheet"] = []
    pending = []
    for check in checks:
        data = check_data(check)
        dirs = [str(d) for d in sorted(PLANS.glob(f"{check}_*_h200x1"))]
        if not dirs:
            raise SystemExit(f"{check}: no plans under {PLANS}/{check}_*_h200x1")
        if data is None:
            pending.append(check)
            continue
        meas = measured_values([str(data)], memory)
        for path in plan_files(dirs):
            rec = load_plan_file(path)
            m = meas.get((rec.job.precision, path.stem))
            if not isinstance(m, float):
                continue
            for name, profile in [*named, ("datasheet", None)]:
                p = price(rec, profile, memory)
                if p is not None:
                    out[name].append(p / m - 1)
    return out, pending


def untimed_shape_decision(errs: dict[str, list[float]], profiles: list[str]) -> str:
    """The rule's decision (its README): adopt where the datasheet's mean absolute step error
    is below every profile's and its max at most 10 %."""
    mean = {k: statistics.mean(map(abs, v)) for k, v in errs.items() if v}
    if "datasheet" not in mean or any(p not in mean for p in profiles):
        raise SystemExit("every column needs priced arms to read the rule")
    top = max(map(abs, errs["datasheet"]))
    below = all(mean["datasheet"] < mean[p] for p in profiles)
    verdict = "adopt" if below and top <= 0.10 else "keep today's pricing"
    return (f"rule: datasheet {mean['datasheet'] * 100:.1f} % mean, {top * 100:.1f} % max; "
            f"below every profile's mean: {'yes' if below else 'no'}; max <= 10 %: "
            f"{'yes' if top <= 0.10 else 'no'} -> {verdict}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checks", nargs="+", help="check names, e.g. moeh60 moeh61 moeh62")
    ap.add_argument("--profile", action="append", default=[], metavar="NAME=PATH",
                    help="a named profile column (repeat)")
    ap.add_argument("--memory", action="store_true", help="peak GiB a rank, not step seconds")
    ap.add_argument("--rule", choices=["untimed-shape"],
                    help="read this pre-registered rule on the pooled step errors")
    args = ap.parse_args(argv)
    named = named_profiles(args.profile)
    if args.rule and args.memory:
        raise SystemExit("--rule reads step times: leave out --memory")
    warnings.simplefilter("ignore", MeshplanWarning)
    errs, pending = errors(args.checks, named, args.memory)
    what = "peak memory" if args.memory else "step time"
    for name, v in errs.items():
        if v:
            print(f"{what} {name}: {statistics.mean(map(abs, v)) * 100:.1f} % mean, "
                  f"{max(map(abs, v)) * 100:.1f} % max, {statistics.mean(v) * 100:+.1f} % "
                  f"signed ({len(v)} arms); within 5 %: {sum(abs(x) <= 0.05 for x in v)}")
    if pending:
        print(f"not run yet: {' '.join(pending)}")
    if args.rule:
        if pending:
            print("rule: not read — every check must have run first")
            return 1
        print(untimed_shape_decision(errs, [n for n, _ in named]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
