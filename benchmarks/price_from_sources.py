"""A drawn 1-GPU MoE check's committed plans priced from every stored 1-GPU MoE calibration,
before the run: each stored profile as written (its grouped curve keyed by one expert's FLOPs)
and the same profile rewritten with its model's grouped rows timed in the MoE layer, keyed by
the call (``benchmarks/profiles_with_layer_rows.py``), and the set's own source both ways
(``--primary``). Writes ``benchmarks/sets/CHECK/sources.json``.

    python benchmarks/profiles_with_layer_rows.py --rows ... --rows ... --out /tmp/lr
    python benchmarks/price_from_sources.py --check moeh35 --layer-rows-profiles /tmp/lr \
        --primary moeh31 profile_h200x1_moeh31_20261202_moe_sizes.toml \
        profile_h200x1_moeh31_20261203_layer_rows.toml
"""

import argparse
import glob
import json
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from moe_profile_transfer import check_name  # noqa: E402

from meshplan.costmodel import estimate  # noqa: E402
from meshplan.hardware_profiles.calibrated import apply_profile  # noqa: E402
from meshplan.planner.planfile import load_plan_file  # noqa: E402


PROFILE_DIR = "docs/benchmarks/data/profiles"


def price(rec, profile) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        e = estimate(rec.model, apply_profile(rec.cluster, str(profile)), rec.job, rec.layout)
    return {"s": e.step_time_s, "gib": e.memory_peak_bytes / 2 ** 30}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", required=True)
    ap.add_argument("--layer-rows-profiles", required=True)
    ap.add_argument("--primary", nargs=3, required=True, metavar=("SOURCE", "EXPERT", "CALL"),
                    help="the set's source check and its two profiles (file names under "
                         f"{PROFILE_DIR}): as stored and rewritten")
    a = ap.parse_args()
    here = ROOT / "benchmarks/sets" / a.check
    source, primary = a.primary[0], {"expert": a.primary[1], "call": a.primary[2]}
    out = {}
    for prec in ("bf16", "fp8"):
        for plan in sorted(glob.glob(str(ROOT / f"benchmarks/plans/{a.check}_{prec}_h200x1/mb*.json"))):
            rec = load_plan_file(plan)
            row = out.setdefault(f"{Path(plan).stem}/{prec}", {})
            for path in sorted(glob.glob(str(ROOT / PROFILE_DIR / "profile_h200x1_moeh*.toml"))):
                check = check_name(path)
                if not check:
                    continue
                for key, p in (("expert", path),
                               ("call", Path(a.layer_rows_profiles) / Path(path).name)):
                    if Path(p).exists():
                        row.setdefault(key, {})[check] = price(rec, p)
            row[f"{source} primary"] = {key: price(rec, ROOT / PROFILE_DIR / name)
                                        for key, name in primary.items()}
    (here / "sources.json").write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {here / 'sources.json'}: {len(out)} arms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
