"""POST HOC re-prediction of the as-run MoE GPU check (docs/benchmarks/moe_checks.md
"GPU check"): the layouts of a saved ``moe_gpu.json`` priced by today's cost model on the
datasheet profile and on saved calibrations, beside the measurements and the predictions
fixed before the run.

    python benchmarks/moe_posthoc.py                       # the 4 x H200 run of 2026-11-28
    python benchmarks/moe_posthoc.py --data run.json --markdown

Nothing here is fitted to the measurements: the cost model and the profiles as they are.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from meshplan.spec import Job, ModelSpec  # noqa: E402

DATA = ROOT / "docs" / "benchmarks" / "data" / "moe_gpu_h200_20261128.json"
PROFILES = ROOT / "docs" / "benchmarks" / "data" / "profiles"
EXTRA_PROFILES = {"compile 11-28": PROFILES / "profile_h200x4_compile_20261128.toml",
                  # round 26 + the MoE keys measured on 1 x H200 (calibrate.moe_only)
                  "saved + MoE keys": PROFILES / "profile_h200x4_round26_moe_20261128.toml"}


def predictions(model, job, layout, cluster) -> dict:
    """{profile label: (step s, peak bytes)} on the datasheet, the saved profile of
    ``executor_gpu.SAVED_PROFILES`` and :data:`EXTRA_PROFILES`."""
    import executor_gpu as eg
    from meshplan.costmodel import estimate
    from meshplan.hardware_profiles.calibrated import apply_profile
    out = {}
    saved, _ = eg.saved_profile_cluster(cluster)
    clusters = {"datasheet": cluster, "saved": saved,
                **{k: apply_profile(cluster, p, override=True) for k, p in EXTRA_PROFILES.items()}}
    for label, cl in clusters.items():
        if cl is None:
            continue
        est = estimate(model, cl, job, layout)
        out[label] = (est.step_time_s, est.memory_peak_bytes)
    return out


def rows(data: dict) -> list[dict]:
    import moe_gpu_check as gc
    from meshplan.hardware_profiles import Cluster
    model, job = ModelSpec.from_dict(data["model"]), Job.from_dict(data["job"])
    cluster = Cluster.preset("dgx-h200", nodes=1, gpus_per_node=4)
    by_name = dict(gc.layouts(4))
    out = []
    for r in data["layouts"]:
        if not r.get("step_time_s"):
            continue
        pred = r["predicted"]
        out.append({"layout": r["short"], "step": r["step_time_s"],
                    "mem": r["memory_peak_bytes"],
                    "before": {"datasheet": (pred["step_time_s"], pred["memory_peak_bytes"]),
                               "saved": (pred["saved_profile"]["step_time_s"],
                                         pred["saved_profile"]["memory_peak_bytes"])},
                    "after": predictions(model, job, by_name[r["layout"]], cluster)})
    return out


def summary(rs: list[dict], when: str, label: str, i: int) -> tuple[float, float, int] | None:
    key = "step" if i == 0 else "mem"
    errs = [r[when][label][i] / r[key] - 1 for r in rs if label in r[when]]
    if not errs:
        return None
    return (statistics.mean(abs(e) for e in errs), max(abs(e) for e in errs),
            sum(abs(e) <= 0.05 for e in errs))


def markdown(rs: list[dict]) -> str:
    labels = list(rs[0]["after"])
    head = "| layout | step s | " + " | ".join(
        f"{lab} before | {lab} after" for lab in ("datasheet", "saved")) + " | " + " | ".join(
        f"{lab} after" for lab in labels if lab not in ("datasheet", "saved")) + \
        " | peak GiB | predicted GiB before | after |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rs:
        cells = [r["layout"], f"{r['step']:.3f}"]
        for lab in ("datasheet", "saved"):
            for when in ("before", "after"):
                v = r[when].get(lab)
                cells.append(f"{v[0]:.3f} ({v[0] / r['step'] - 1:+.1%})" if v else "–")
        for lab in labels:
            if lab not in ("datasheet", "saved"):
                v = r["after"][lab]
                cells.append(f"{v[0]:.3f} ({v[0] / r['step'] - 1:+.1%})")
        mb, ma = r["before"]["datasheet"][1], r["after"]["datasheet"][1]
        cells += [f"{r['mem'] / 2**30:.2f}", f"{mb / 2**30:.2f} ({mb / r['mem'] - 1:+.1%})",
                  f"{ma / 2**30:.2f} ({ma / r['mem'] - 1:+.1%})"]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for when in ("before", "after"):
        for lab in (["datasheet", "saved"] if when == "before" else labels):
            s, m = summary(rs, when, lab, 0), summary(rs, when, lab, 1)
            if s:
                lines.append(f"- {when}, {lab}: step mean {s[0]:.1%} / max {s[1]:.1%}; memory "
                             f"mean {m[0]:.1%} / max {m[1]:.1%}, {m[2]} of {len(rs)} within 5 %")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    rs = rows(json.loads(Path(args.data).read_text()))
    print(markdown(rs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
