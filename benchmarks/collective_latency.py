"""How well the cost model prices the collectives every stored calibration timed.

    python benchmarks/collective_latency.py            # per profile and overall
    python benchmarks/collective_latency.py --rows     # and every row

Each profile of ``docs/benchmarks/data/profiles`` holds the all-reduces, reduce-scatters and
all-gathers ``meshplan calibrate`` timed on 2 and 4 ranks of its machine (64 KiB-256 MiB,
``[[measurements.collectives]]``). Every row is predicted on its own profile, applied to the
built-in cluster of its GPU (one node), twice:

- **per-hop latency** (the model before the per-call split): ``2(n-1)`` (all-reduce) or
  ``n-1`` ring steps × the profile's ``intra_latency_us`` (half the 2-rank 256-byte probe),
  plus bus bytes over ``nvlink_gbps`` × the profile's stored ``nvlink_efficiency``;
- **base + steps** (``costmodel/comm.py`` now): the profile as ``apply_profile`` reads it.

The bandwidth curves were read from these same rows, so this checks that the latency and
the curve together reproduce what was timed (in-sample), not a prediction of other runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from meshplan.costmodel import comm  # noqa: E402
from meshplan.hardware_profiles import Cluster, Curve  # noqa: E402
from meshplan.hardware_profiles.calibrated import apply_profile  # noqa: E402
from meshplan.hardware_profiles.collective_latency import bus_bytes, ring_steps  # noqa: E402

PROFILES = ROOT / "docs" / "benchmarks" / "data" / "profiles"
PRICE = {"all_reduce": comm.all_reduce_s, "all_gather": comm.all_gather_s,
         "reduce_scatter": comm.reduce_scatter_s}
SMALL_BYTES = 4 << 20


def per_hop_s(doc: dict, op: str, n: int, nbytes: float) -> float:
    """The model before the split, from the profile's own keys."""
    gpu = doc["gpu"]
    curve = Curve(tuple(tuple(p) for p in gpu["nvlink_efficiency"]))
    hop_s = doc["cluster"]["intra_latency_us"] * 1e-6
    return (ring_steps(op, n)[0] * hop_s
            + bus_bytes(op, n, nbytes) / (gpu["nvlink_gbps"] * 1e9 * curve(nbytes)))


def profile_errors(path: Path) -> list[dict]:
    doc = tomllib.loads(path.read_text())
    cluster = apply_profile(Cluster.preset("dgx-h200" if "h200" in path.name else "dgx-h100",
                                           nodes=1), path)
    out = []
    for r in doc["measurements"]["collectives"]:
        if r["op"] not in PRICE:
            continue
        n, size, t = r["group_size"], r["nbytes"], r["seconds"]
        out.append({"op": r["op"], "n": n, "nbytes": size, "measured_us": t * 1e6,
                    "per_hop_us": per_hop_s(doc, r["op"], n, size) * 1e6,
                    "new_us": PRICE[r["op"]](cluster.group_link(n, 1), size) * 1e6})
    return out


def summary(rows: list[dict], key: str) -> str:
    e = [abs(r[key] / r["measured_us"] - 1) * 100 for r in rows]
    return f"{statistics.fmean(e):6.1f} {max(e):6.1f}" if e else "     -      -"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", action="store_true", help="print every row")
    args = ap.parse_args(argv)
    every: list[dict] = []
    print(f"{'profile':34s} | ≤ 4 MiB per-hop mean max | base+steps mean max | "
          f"all rows per-hop | base+steps | 1 MiB all-reduce n=4 µs: measured per-hop new")
    for path in sorted(PROFILES.glob("*.toml")):
        rows = profile_errors(path)
        every += rows
        small = [r for r in rows if r["nbytes"] <= SMALL_BYTES]
        ar = [r for r in rows if r["op"] == "all_reduce" and r["n"] == 4 and r["nbytes"] == 1 << 20]
        tail = (f"{ar[0]['measured_us']:6.1f} {ar[0]['per_hop_us']:6.1f} {ar[0]['new_us']:6.1f}"
                if ar else "     -")
        print(f"{path.stem[8:]:34s} | {summary(small, 'per_hop_us')} | {summary(small, 'new_us')}"
              f" | {summary(rows, 'per_hop_us')} | {summary(rows, 'new_us')} | {tail}")
        if args.rows:
            for r in rows:
                print(f"    {r['op']:15s} n={r['n']} {r['nbytes']:>10d} B  measured "
                      f"{r['measured_us']:8.1f}  per-hop {r['per_hop_us']:8.1f}  "
                      f"new {r['new_us']:8.1f} µs")
    small = [r for r in every if r["nbytes"] <= SMALL_BYTES]
    print(f"{'all (' + str(len(every)) + ' rows, ' + str(len(small)) + ' ≤ 4 MiB)':34s} | "
          f"{summary(small, 'per_hop_us')} | {summary(small, 'new_us')} | "
          f"{summary(every, 'per_hop_us')} | {summary(every, 'new_us')} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
