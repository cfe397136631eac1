"""Re-price every committed one-GPU MoE / FP8 pair with today's cost model, each arm on the
profile its committed plan was priced from: the regression check of the 1-GPU checks
(docs/benchmarks/moe_checks.md, moeh18 on; the dense fp8h16 on), as :mod:`repredict_sets` is for
the dense sets.

    python benchmarks/repredict_moe1gpu.py                   # summary
    python benchmarks/repredict_moe1gpu.py --arms            # and every arm
    python benchmarks/repredict_moe1gpu.py --only moeh3      # checks whose name starts so

Reads the checks' data (``docs/benchmarks/data/*_h200x1_*.json`` with ``bf16`` / ``fp8``
arms: each arm's measured step and peak memory) and their plans
(``benchmarks/plans/CHECK_{bf16,fp8}_h200x1/LAYOUT.json`` with ``predictions.json``, whose
``profile`` priced them). Prints, for step time, peak memory and the fp8/bf16 speed-up, the
mean absolute, mean signed and maximum error, overall, by precision and by micro-batches a
step (one, where the gradients appear inside the only backward, or more).

Read with care: the executor changed under the early checks (fp8 routed experts from moeh24,
their weights cast once a step from moeh25, ...), and today's model prices each plan as
today's executor would run it; a check's own section gives the numbers as run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from meshplan.costmodel import estimate  # noqa: E402
from meshplan.hardware_profiles.calibrated import apply_profile  # noqa: E402
from meshplan.planner.planfile import load_plan_file  # noqa: E402

DATA = ROOT / "docs" / "benchmarks" / "data"
PLANS = ROOT / "benchmarks" / "plans"


def _layout_runs(arms_of) -> list[tuple[str, dict]]:
    """(layout, run) of one precision's measured arms: a record per layout (the checks
    since fp8h31 and moeh18), or one record whose runs are keyed ``LAYOUT/current`` (the
    dense checks before, fp8h16-fp8h30)."""
    if not isinstance(arms_of, dict):
        return []
    runs = arms_of.get("runs")
    if "predictions" in arms_of and isinstance(runs, dict):
        return [(k.split("/")[0], r) for k, r in runs.items()
                if k.endswith("/current") and isinstance(r, dict)]
    out = []
    for layout, rec in arms_of.items():
        got = list(rec.get("runs", {}).values()) if isinstance(rec, dict) else []
        if got:
            out.append((layout, got[0]))
    return out


def arms(only: str | None = None) -> list[dict]:
    """One record per measured arm that has a committed plan: check, precision, layout,
    micro-batches a step, measured and re-priced step seconds and peak bytes."""
    out = []
    clusters: dict = {}    # (plan's cluster, profile) → the profiled cluster: each read once
    for path in sorted(DATA.glob("*_h200x1_*.json")):
        try:
            doc = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
        check = doc.get("check") if isinstance(doc, dict) else None
        if not check or "bf16" not in doc or (only and not check.startswith(only)):
            continue
        for prec in ("bf16", "fp8"):
            pdir = PLANS / f"{check}_{prec}_h200x1"
            if not (pdir / "predictions.json").exists():
                continue
            profile = json.loads((pdir / "predictions.json").read_text())["profile"]
            for layout, run in _layout_runs(doc.get(prec)):
                if not (pdir / f"{layout}.json").exists():
                    continue
                plan = load_plan_file(pdir / f"{layout}.json")
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    key = (plan.cluster, profile)
                    if key not in clusters:
                        clusters[key] = apply_profile(plan.cluster, str(ROOT / profile))
                    e = estimate(plan.model, clusters[key], plan.job, plan.layout)
                lay = plan.layout
                out.append(dict(check=check, precision=prec, layout=layout,
                                microbatches=plan.job.global_batch // (lay.micro_batch * lay.dp),
                                step_s=run.get("step_time_s"), priced_s=e.step_time_s,
                                peak_bytes=run.get("memory_peak_bytes"),
                                priced_bytes=e.memory_peak_bytes))
    return out


def _stats(errors: list[float]) -> str:
    if not errors:
        return "—"
    return (f"{100 * statistics.mean(map(abs, errors)):.1f} % mean, "
            f"{100 * statistics.mean(errors):+.1f} % signed, "
            f"{100 * max(map(abs, errors)):.1f} % max ({len(errors)})")


def summary(rows: list[dict]) -> list[str]:
    def err(r, a, b):
        return r[b] / r[a] - 1 if r.get(a) and r.get(b) else None

    lines = []
    groups = {"all": rows,
              "bf16": [r for r in rows if r["precision"] == "bf16"],
              "fp8": [r for r in rows if r["precision"] == "fp8"],
              "one micro-batch a step": [r for r in rows if r["microbatches"] == 1],
              "more": [r for r in rows if r["microbatches"] > 1]}
    for name, sel in groups.items():
        step = [e for e in (err(r, "step_s", "priced_s") for r in sel) if e is not None]
        mem = [e for e in (err(r, "peak_bytes", "priced_bytes") for r in sel) if e is not None]
        within = sum(abs(e) <= 0.05 for e in mem)
        lines.append(f"{name}: step {_stats(step)}; memory {_stats(mem)}, "
                     f"{within} of {len(mem)} within 5 %")
    pairs = {}
    for r in rows:
        pairs.setdefault((r["check"], r["layout"]), {})[r["precision"]] = r
    speed = [(p["bf16"]["priced_s"] / p["fp8"]["priced_s"])
             / (p["bf16"]["step_s"] / p["fp8"]["step_s"]) - 1
             for p in pairs.values() if "bf16" in p and "fp8" in p
             and p["bf16"]["step_s"] and p["fp8"]["step_s"]]
    lines.append(f"fp8/bf16 speed-up: {_stats(speed)}")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=None, metavar="PREFIX",
                    help="the checks whose name starts with PREFIX (e.g. moeh3)")
    ap.add_argument("--arms", action="store_true", help="print every arm too")
    args = ap.parse_args(argv)
    rows = arms(args.only)
    if not rows:
        print(f"no measured arm with a committed plan{f' for {args.only!r}' if args.only else ''}",
              file=sys.stderr)
        return 1
    if args.arms:
        for r in rows:
            step = r["priced_s"] / r["step_s"] - 1 if r["step_s"] else float("nan")
            mem = (r["priced_bytes"] / r["peak_bytes"] - 1 if r["peak_bytes"]
                   else float("nan"))
            print(f"{r['check']:8s} {r['precision']:4s} {r['layout']:24s} m {r['microbatches']:2d}"
                  f"  step {100 * step:+6.1f} %  memory {100 * mem:+6.1f} %")
    print("\n".join(summary(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
