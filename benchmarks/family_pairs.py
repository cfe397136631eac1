"""Post hoc: every dense 1-GPU check's arm priced from every other check's profile, grouped by
precision, the source → target layer family and the recompute mode (mean signed and absolute
step error), plus the datasheet's arms.

    python benchmarks/family_pairs.py [--out pairs.json]

About 8 minutes on 2 CPU cores (4,000 pairs; each profile loaded once). Reads the committed
data files ``docs/benchmarks/data/fp8_h200x1_fp8h*_2026*.json``, their plans and the dense
H200 profiles ``profile_h200x?_fp8h*_2026*.toml`` (the first of each check). Used for
docs/benchmarks/fp8_checks.md "The compiled block's re-run under full recomputation".
"""

from __future__ import annotations

import argparse
import collections
import functools
import glob
import json
import statistics
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import meshplan.hardware_profiles.calibrated as calibrated  # noqa: E402
from moe_profile_transfer import check_name, datasheet, runs  # noqa: E402

from meshplan.costmodel import estimate  # noqa: E402
from meshplan.errors import MeshplanError  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="write every pair's error here (JSON)")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    # one parse per profile file, not one per pair
    calibrated.load_profile = functools.lru_cache(maxsize=None)(calibrated.load_profile)
    data = sorted(glob.glob(str(ROOT / "docs/benchmarks/data/fp8_h200x1_fp8h*_2026*.json")))
    profiles: dict[str, str] = {}
    for p in sorted(glob.glob(str(ROOT / "docs/benchmarks/data/profiles/"
                                         "profile_h200x?_fp8h*_2026*.toml"))):
        name = check_name(p)
        if name and name not in profiles:
            profiles[name] = p
    family = {s: json.loads((ROOT / f"benchmarks/sets/{s}/m01.json").read_text())["activation"]
              for s in profiles}
    pairs = []
    plans = str(ROOT / "benchmarks/plans/*h200x1/*.json")
    for name, prec, key, meas, rec, _ in runs(data, plans):
        sources = [("datasheet", None), *((s, p) for s, p in profiles.items() if s != name)]
        for src, path in sources:
            try:
                cluster = (datasheet(rec.cluster) if path is None
                           else calibrated.apply_profile(rec.cluster, path))
                step = estimate(rec.model, cluster, rec.job, rec.layout).step_time_s
            except MeshplanError:
                continue
            group = "datasheet" if path is None else f"{family[src]}->{rec.model.activation}"
            pairs.append(dict(target=name, source=src, precision=prec, run=key,
                              recompute=rec.layout.recompute, group=group,
                              error=step / meas - 1))
    if args.out:
        Path(args.out).write_text(json.dumps(pairs))
    by = collections.defaultdict(list)
    for r in pairs:
        by[r["precision"], r["group"], r["recompute"]].append(r["error"])
    print("| precision | source -> target family | recompute | pairs | mean | mean abs |")
    print("|---|---|---|---|---|---|")
    for (prec, group, mode), v in sorted(by.items()):
        print(f"| {prec} | {group} | {mode} | {len(v)} | {statistics.mean(v) * 100:+.1f} % | "
              f"{statistics.mean(map(abs, v)) * 100:.1f} % |")
    for prec in ("bf16", "fp8"):
        v = [abs(r["error"]) for r in pairs if r["precision"] == prec
             and r["source"] != "datasheet"]
        if v:
            print(f"\n{prec}, every profile pair: {statistics.mean(v) * 100:.2f} % mean, "
                  f"{statistics.median(v) * 100:.2f} % median ({len(v)} pairs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
