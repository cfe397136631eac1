"""A datasheet key from the committed calibrations of one GPU type: the median of the values
`meshplan calibrate` measured, one per distinct measurement.

A built-in GPU entry (meshplan/hardware_profiles/data/gpus.toml) takes a number another GPU
measured until its own GPU has been measured; once committed calibrations of that GPU carry
the key in their ``measured`` list, this prints what the entry should read and how spread
the calibrations are. Profiles derived from one calibration (a re-timed subset, a copy with
a key changed) repeat its value, so equal values count once.

    python benchmarks/datasheet_from_profiles.py fp8_cast_compiled_gbps fp8_cast_weight_gbps
    python benchmarks/datasheet_from_profiles.py fp8_cast_compiled_gbps \\
        --profiles 'docs/benchmarks/data/profiles/profile_h200x*_*.toml' --gpu H200-SXM-141GB
"""

from __future__ import annotations

import argparse
import glob
import statistics
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from meshplan.hardware_profiles.loader import builtin_gpu  # noqa: E402

DEFAULT_PROFILES = str(ROOT / "docs/benchmarks/data/profiles/profile_h200x*_*.toml")


def measured_values(paths: list[str], key: str, gpu: str | None = None) -> dict[float, list[str]]:
    """Distinct measured values of ``key`` -> the profiles holding each (``gpu``: only
    profiles of that GPU name; a profile that inherited the key is not counted)."""
    out: dict[float, list[str]] = {}
    for path in paths:
        doc = tomllib.loads(Path(path).read_text())
        g = doc.get("gpu", {})
        if key not in doc.get("measured", []) or key not in g:
            continue
        if gpu and g.get("name", gpu) != gpu:
            continue
        out.setdefault(round(float(g[key]), 3), []).append(Path(path).name)
    return out


def summary(values: list[float]) -> dict[str, float]:
    """Median, quartiles and range of ``values`` (at least one)."""
    v = sorted(values)
    q = statistics.quantiles(v, n=4) if len(v) > 1 else [v[0], v[0], v[0]]
    return dict(median=statistics.median(v), q1=q[0], q3=q[2], min=v[0], max=v[-1], n=len(v))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("keys", nargs="+", help="GPU profile keys (e.g. fp8_cast_compiled_gbps)")
    ap.add_argument("--profiles", default=DEFAULT_PROFILES, help="glob of calibrated profiles")
    ap.add_argument("--gpu", default="H200-SXM-141GB",
                    help="built-in GPU entry to compare with (and profiles of that name)")
    args = ap.parse_args(argv)
    paths = sorted(glob.glob(args.profiles))
    if not paths:
        raise SystemExit(f"no profile matches {args.profiles}")
    sheet = builtin_gpu(args.gpu)
    print(f"| key | datasheet {args.gpu} | median of calibrations | quartiles | range | "
          f"calibrations (profiles) |")
    print("|---|---|---|---|---|---|")
    for key in args.keys:
        vals = measured_values(paths, key, args.gpu)
        if not vals:
            print(f"| `{key}` | {getattr(sheet, key, '—')} | none measured | | | 0 |")
            continue
        s = summary(list(vals))
        print(f"| `{key}` | {getattr(sheet, key, '—'):.4g} | {s['median']:.4g} | "
              f"{s['q1']:.4g}-{s['q3']:.4g} | {s['min']:.4g}-{s['max']:.4g} | "
              f"{s['n']} ({sum(map(len, vals.values()))}) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
