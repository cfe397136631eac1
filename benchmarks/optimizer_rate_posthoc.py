"""Post hoc: the 1-GPU checks' committed plans priced again with ``optimizer_gbps`` timed
at a model-sized step, beside their predictions as run.

Until 2026-12-02 ``meshplan calibrate`` timed the fused AdamW step on 2^25 elements, where
one H200 reads 2,600 GB/s against the 3,860 it reaches at 2^29 and the 3,820-3,995 the
executor's optimizer phase ran at on every 1-GPU check (docs/benchmarks/optimizer_rate.md).
This takes each run of the named data files, finds the plan file that priced it (the
committed plan whose stored step time is the run's prediction), and prices it again with
the profile's ``optimizer_gbps`` replaced by ``--gbps``; nothing else changes. It also
reports the optimizer phase's own error, measured device time against the estimate's
``optimizer_s``, before and after.

    python benchmarks/optimizer_rate_posthoc.py --gbps 3873 \\
        docs/benchmarks/data/moe_fp8_h200x1_moeh2[3-6]_*.json
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from meshplan.costmodel import estimate  # noqa: E402
from meshplan.planner.planfile import load_plan_file  # noqa: E402


def checks(doc: dict):
    """Every ``{"predictions": …, "runs": …}`` block of a data file."""
    if isinstance(doc, dict):
        if "runs" in doc and "predictions" in doc:
            yield doc
            return
        for v in doc.values():
            yield from checks(v)


def plan_index(plans_glob: str) -> dict[tuple[float, str], Path]:
    """Committed plan files by their stored step time (rounded to the nanosecond) and
    precision: a bf16 arm and its fp8 twin can store the same time (host-bound arms)."""
    out = {}
    for p in glob.glob(plans_glob):
        doc = json.loads(Path(p).read_text())
        step = (doc.get("prediction") or {}).get("step_time_s")
        if step:
            out[plan_key(step, (doc.get("job") or {}).get("precision", "bf16"))] = Path(p)
    return out


def plan_key(step_s: float, precision: str) -> tuple[float, str]:
    """The :func:`plan_index` key of a prediction of ``step_s`` at ``precision``."""
    return round(step_s, 9), precision


def matched_runs(data: list[str], plans_glob: str):
    """(data file, run key, run record, measured s, predicted s, plan file) of every run of the
    check data files whose committed plan is found (by stored step time and precision), each
    plan and run once."""
    index = plan_index(plans_glob)
    seen = set()
    for path in data:
        for chk in checks(json.loads(Path(path).read_text())):
            layouts = chk["predictions"]["layouts"]
            prec = chk["predictions"].get("job", {}).get("precision", "bf16")
            for key, run in chk["runs"].items():
                meas = run.get("step_time_s")
                pred = (layouts.get(key.split("/")[0]) or {}).get("calibrated_s")
                plan = index.get(plan_key(pred, prec)) if pred else None
                if not meas or plan is None or (plan, key) in seen:
                    continue
                seen.add((plan, key))
                yield path, key, run, meas, pred, plan


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data", nargs="+", help="check data files (docs/benchmarks/data/*.json)")
    ap.add_argument("--gbps", type=float, required=True,
                    help="optimizer_gbps timed at a model-sized step")
    ap.add_argument("--plans", default=str(ROOT / "benchmarks/plans/*h200x1/*.json"))
    args = ap.parse_args(argv)
    rows = []
    for _, key, run, meas, pred, plan in matched_runs(args.data, args.plans):
        rec = load_plan_file(plan)
        before = estimate(rec.model, rec.cluster, rec.job, rec.layout)
        gpu = dataclasses.replace(rec.cluster.gpu, optimizer_gbps=args.gbps)
        after = estimate(rec.model, rec.cluster.replace(gpu=gpu), rec.job, rec.layout)
        opt_ms = (run.get("phases") or {}).get("optimizer", {}).get("device_ms")
        rows.append((plan.parent.name, key, meas, pred, before, after, opt_ms))
    if not rows:
        raise SystemExit("no run matched a committed plan")
    print(f"| plans | run | meas. s | as run s (error) | this tree s (error) | this tree, "
          f"optimizer at {args.gbps:.0f} GB/s, s (error) | optimizer ms meas. / this tree / "
          f"at {args.gbps:.0f} GB/s |")
    print("|---|---|---|---|---|---|---|")
    errs: dict[str, list[float]] = {"as run": [], "this tree": [], "rate": []}
    for plans, key, meas, pred, b, a, opt_ms in rows:
        ep, eb, ea = pred / meas - 1, b.step_time_s / meas - 1, a.step_time_s / meas - 1
        for k, e in (("as run", ep), ("this tree", eb), ("rate", ea)):
            errs[k].append(abs(e))
        opt = (f"{opt_ms:.1f} / {b.time.optimizer_s * 1e3:.1f} / "
               f"{a.time.optimizer_s * 1e3:.1f}" if opt_ms else "—")
        print(f"| {plans} | `{key}` | {meas:.3f} | {pred:.3f} ({ep * 100:+.1f} %) | "
              f"{b.step_time_s:.3f} ({eb * 100:+.1f} %) | {a.step_time_s:.3f} "
              f"({ea * 100:+.1f} %) | {opt} |")
    # runs this tree still prices as it did when they ran: the optimizer's rate alone moves
    same = [i for i, (*_, pred, b, _a, _o) in enumerate(rows)
            if abs(b.step_time_s / pred - 1) < 1e-3]
    print()
    for k, v in errs.items():
        kept = [v[i] for i in same]
        print(f"{k}: mean {statistics.mean(v) * 100:.1f} %, max {max(v) * 100:.1f} % "
              f"({len(v)} runs); on the {len(kept)} runs this tree prices as they were "
              f"priced: mean {statistics.mean(kept) * 100:.2f} %, median "
              f"{statistics.median(kept) * 100:.2f} %")
    opt = [(o, b.time.optimizer_s * 1e3, a.time.optimizer_s * 1e3)
           for *_, b, a, o in rows if o]
    for label, j in (("this tree", 1), (f"at {args.gbps:.0f} GB/s", 2)):
        e = [abs(r[j] / r[0] - 1) for r in opt]
        print(f"optimizer phase, {label}: mean {statistics.mean(e) * 100:.1f} %, max "
              f"{max(e) * 100:.1f} % ({len(e)} runs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
