"""Step-time errors of the one-GPU sets at several ``sustained_clock_share`` values.

Re-predicts every record of each set on its own profile (the rows carry the calibration's
``sustained_ratio``) with the correction ``sustained_clock`` at each share (0 = the rows
as timed, in bursts; 1 = the full ratio), and prints the errors (predicted / measured − 1)
per layout and the mean / max absolute over the sets. How the built-in share was chosen and
tested: docs/benchmarks/transfer.md, "Sustained clock" (0.6), and docs/benchmarks/
fp8_checks.md, "fp8h52 / fp8h53" (0.8 since 2026-12-04).

    python benchmarks/sustained_share.py                       # fit sets, then held-out sets
    python benchmarks/sustained_share.py --sets rc50 rc52 --shares 0 0.6
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import transfer_round  # noqa: E402

DATA = ROOT / "docs" / "benchmarks" / "data"
# set -> its profile with sustained ratios (rc47's: a second calibration, after its run)
PROFILES = {"rc47": "rc47/profile_sustained.toml", "rc48": "rc48/profile.toml",
            "rc49": "rc49/profile.toml", "rc50": "rc50/profile.toml", "rc51": "rc51/profile.toml",
            "rc52": "rc52/profile.toml"}
FIT, HELD_OUT = ("rc47", "rc49"), ("rc50", "rc52", "rc51")


def errors(set_name: str, share: float, offset: float | None = None
           ) -> list[tuple[str, float]]:
    """(layout, step error %) of every ok record of ``set_name`` at ``share``; ``offset``
    (post hoc alternative, not in the cost model): every row's ratio r replaced by
    1 + max(0, r − 1 − offset), at share 1."""
    def with_share(cluster):
        gpu = cluster.gpu
        if offset is not None:
            def moved(rows):
                return tuple(replace(r, sustained_ratio=1.0 + max(
                    0.0, r.sustained_ratio - 1.0 - offset)) for r in rows)
            gpu = replace(gpu, measured=replace(gpu.measured, layers=moved(gpu.measured.layers),
                                                ends=moved(gpu.measured.ends)))
        return replace(cluster, gpu=replace(gpu, corrections=replace(
            gpu.corrections, sustained_clock_share=1.0 if offset is not None else share)))
    doc = json.loads((DATA / f"{set_name}_accuracy.json").read_text())
    recs = transfer_round.repredict(doc, str(DATA / "profiles" / PROFILES[set_name]),
                                    doc.get("gpu_name") or "H200", adjust=with_share)
    return [(r["name"], r["step_time_error_pct"]) for r in recs if r.get("status") == "ok"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", nargs="+", default=None, choices=sorted(PROFILES),
                    help=f"default: {' '.join(FIT)} (fit), then {' '.join(HELD_OUT)} (held out)")
    ap.add_argument("--shares", nargs="+", type=float, default=[0.0, 0.4, 0.5, 0.6, 0.7, 1.0])
    ap.add_argument("--offsets", nargs="*", type=float, default=[],
                    help="also each ratio less an offset (post hoc alternative; share 1)")
    args = ap.parse_args(argv)
    groups = [("chosen sets", args.sets)] if args.sets else [("fit (post hoc)", FIT),
                                                              ("held out (as run)", HELD_OUT)]
    for title, sets in groups:
        print(f"## {title}: {', '.join(sets)}")
        for label, share, offset in ([(f"share {v:.2f}", v, None) for v in args.shares]
                                     + [(f"offset {v:.3f}", 1.0, v) for v in args.offsets]):
            parts, pooled = [], []
            for s in sets:
                errs = errors(s, share, offset)
                pooled += [abs(e) for _, e in errs]
                parts.append(f"{s} " + " ".join(f"{e:+.1f}" for _, e in errs))
            print(f"{label}: {'; '.join(parts)} | mean {statistics.mean(pooled):.2f} "
                  f"max {max(pooled):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
