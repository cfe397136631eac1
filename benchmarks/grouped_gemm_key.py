"""Post hoc: how well one calibration's grouped-GEMM rows price another model's grouped GEMMs,
by the curve's key (one expert's FLOPs, as the cost model reads ``grouped_gemm_efficiency``;
the whole call's FLOPs; the call's with each group's rows rounded up to 256), and what a
sweep of sizes (``grouped_gemm_sweep_gpu.py``) adds to the calibration's rows.

    python benchmarks/grouped_gemm_key.py \
        --sweep docs/benchmarks/data/grouped_gemm_sweep_h200x1_20261202.json
    python benchmarks/grouped_gemm_key.py --sweep ... --write-profiles /tmp/swept

The sources are the 1 × H200 MoE checks' stored calibrations
(``docs/benchmarks/data/profiles/profile_h200x1_moeh*_2026*.toml``, CUDA, grouped_mm rows);
the targets each check model's sweep rows (timed on one H200, ``grouped_gemm_sweep_gpu.py``),
a source never priced against its own model. Each curve is read as calibrate reads it
(points merged, continued by the datasheet dense curve's shape outside them). The error is
predicted / measured time − 1 of the forward + backward of one grouped call.
Why 256: torch's ``_grouped_mm`` on Hopper is one persistent CUTLASS kernel over all the
groups (``aten/src/ATen/native/cuda/GroupMM.cu``: tile 128 × 256 × 64 with a 2 × 1 × 1
cluster, 64 × 128 × 128 where a group averages ≤ 128 rows), so its tiles from every group
share the SMs and a group's rows are covered in cluster units. ``--write-profiles DIR``
writes each stored profile with its model's sweep rows added to its
``[[measurements.grouped_gemm]]``.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from meshplan.calibrate.tomlfile import dumps  # noqa: E402
from meshplan.hardware_profiles.curve_fit import extend_with_base, merge_points  # noqa: E402
from meshplan.hardware_profiles.loader import builtin_gpu, read_toml  # noqa: E402

GROUP_TILE_ROWS = 256
PROFILES = "docs/benchmarks/data/profiles/profile_h200x1_moeh*_2026*.toml"
_CHECK = re.compile(r"profile_h200x1_(moeh\d+)_\d{8}(_moe_sizes)?\.toml$")


def work(r, tile: int) -> float:
    """The forward FLOPs a key prices: each group's rows rounded up to ``tile`` (0: none)."""
    rows = math.ceil(r["rows"] / tile) * tile if tile else r["rows"]
    return 2.0 * r["groups"] * rows * r["k"] * r["n"]


KEYS = {   # name: row -> (x of the curve, the rows' tile)
    "one expert's FLOPs (the cost model's)": lambda r: (work(r, 0) / r["groups"], 0),
    "the call's FLOPs": lambda r: (work(r, 0), 0),
    f"the call's FLOPs, groups of {GROUP_TILE_ROWS} rows": lambda r: (work(r, GROUP_TILE_ROWS),
                                                                      GROUP_TILE_ROWS),
}


def price(curve, peak: float, key, r) -> float:
    """Forward + backward seconds of row ``r`` on ``curve`` under ``key``."""
    x, tile = key(r)
    calls = 1 if x == work(r, tile) else r["groups"]
    return 3.0 * calls * x / (peak * curve(x))


def fit(rows, peak: float, key, shape):
    pts = []
    for r in rows:
        x, tile = key(r)
        calls = 1 if x == work(r, tile) else r["groups"]
        pts.append((x, 3.0 * calls * x / (peak * r["seconds"])))
    return extend_with_base(merge_points(pts), shape)


def stored_rows() -> dict[str, tuple[str, list[dict]]]:
    """check → (profile path, its grouped_mm rows): the latest profile of each check."""
    out = {}
    for p in sorted(glob.glob(str(ROOT / PROFILES))):
        m = _CHECK.search(p)
        if not m:
            continue
        doc = read_toml(Path(p))
        if doc.get("provenance", {}).get("device") != "cuda":
            continue
        rows = [r for r in doc.get("measurements", {}).get("grouped_gemm", [])
                if r.get("seconds", 0) > 0 and r.get("backend") == "grouped_mm"]
        if rows:
            out[m.group(1)] = (p, rows)
    return out


def summary(errs: list[float]) -> str:
    a = [abs(e) for e in errs]
    return (f"{100 * statistics.mean(a):.1f} % mean, {100 * statistics.median(a):.1f} % median, "
            f"{100 * max(a):.1f} % max ({len(a)})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sweep", required=True, help="grouped_gemm_sweep_gpu.py's output")
    ap.add_argument("--write-profiles", default=None)
    a = ap.parse_args(argv)
    sweep = json.loads(Path(a.sweep).read_text())
    gpu = builtin_gpu("H200-SXM-141GB")
    peak, shape = gpu.peak_flops("bf16"), gpu.gemm_efficiency
    sources = stored_rows()
    targets = {c: rows for c, rows in sweep["grouped_gemm"].items() if rows}
    print(f"sources (stored calibrations): {', '.join(sources)}")
    print(f"targets (swept models, {sweep['device']}, {sweep['date']}): {', '.join(targets)}\n")
    print("| curve from another model's | key | error on the targets' sweep rows |")
    print("|---|---|---|")
    for label, with_sweep in (("calibration rows", False), ("calibration + sweep rows", True)):
        for name, key in KEYS.items():
            errs = []
            for s, (_, rows) in sources.items():
                src = rows + (sweep["grouped_gemm"].get(s, []) if with_sweep else [])
                curve = fit(src, peak, key, shape)
                for t, trows in targets.items():
                    if t != s:
                        errs += [price(curve, peak, key, r) / r["seconds"] - 1 for r in trows]
            print(f"| {label} | {name} | {summary(errs)} |")
    if a.write_profiles:
        out = Path(a.write_profiles)
        out.mkdir(parents=True, exist_ok=True)
        for s, (path, _) in sources.items():
            doc = read_toml(Path(path))
            meas = doc.setdefault("measurements", {})
            meas["grouped_gemm"] = list(meas.get("grouped_gemm", [])) + sweep["grouped_gemm"].get(
                s, [])
            (out / Path(path).name).write_text(dumps(doc))
        print(f"\nwrote {len(sources)} profiles with their sweep rows to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
