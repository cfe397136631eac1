"""Compiled / eager CPU dispatch per layer, by recompute mode, over committed profiles.

`costmodel/compiled_rows.compiled_from_pair` carries compile's GPU change from one recompute
mode's compiled/eager pair to another mode's eager row, but not its CPU change: this prints
why — the ratio's range at each mode (forward; backward), per layer as the cost model reads a
row (per-layer dispatch + per-call part over the rows' block count), for every plain
(ZeRO-0, dp 1, tp 1, bf16) row timed both ways at the same micro-batch.

    python benchmarks/compiled_cpu_ratios.py
    python benchmarks/compiled_cpu_ratios.py 'docs/benchmarks/data/profiles/profile_h200x1_*.toml'
"""

from __future__ import annotations

import argparse
import glob
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from meshplan.errors import MeshplanWarning  # noqa: E402
from meshplan.hardware_profiles.calibrated import LAYER_ROW_BLOCKS, load_profile  # noqa: E402

DEFAULT = str(ROOT / "docs/benchmarks/data/profiles/profile_h200x1_fp8h*_2026*.toml")


def per_layer_cpu(row, per_layer: str, fixed: str) -> float:
    return getattr(row, per_layer) + getattr(row, fixed) / LAYER_ROW_BLOCKS


def timed_cpu(row) -> bool:
    return row.forward_cpu_s > 0 and row.backward_cpu_s > 0


def ratios(path: str) -> dict[str, list[tuple[float, float]]]:
    """recompute mode -> (forward, backward) compiled / eager CPU ratio of each pair."""
    rows = {}
    for r in load_profile(path).gpu.measured.layers:
        if r.precision == "bf16" and not r.zero and r.dp == 1 and r.tp == 1 and r.ep == 1:
            rows[r.shape, r.seq_len, r.recompute, r.compile, r.micro_batch] = r
    out: dict[str, list[tuple[float, float]]] = {}
    for (shape, seq, mode, comp, mb), c in rows.items():
        e = rows.get((shape, seq, mode, False, mb))
        if not comp or e is None or not (timed_cpu(c) and timed_cpu(e)):
            continue
        out.setdefault(mode, []).append(tuple(
            per_layer_cpu(c, *n) / per_layer_cpu(e, *n)
            for n in (("forward_cpu_s", "forward_cpu_fixed_s"),
                      ("backward_cpu_s", "backward_cpu_fixed_s"))))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("profiles", nargs="?", default=DEFAULT, help="glob of profiles")
    args = ap.parse_args(argv)
    paths = sorted(glob.glob(args.profiles))
    if not paths:
        raise SystemExit(f"no profile matches {args.profiles}")
    warnings.simplefilter("ignore", MeshplanWarning)
    every: dict[str, list[tuple[float, float]]] = {}
    for path in paths:
        for mode, pairs in ratios(path).items():
            every.setdefault(mode, []).extend(pairs)
    print("| recompute | pairs | forward compiled / eager | backward |")
    print("|---|---|---|---|")
    for mode in ("none", "selective", "full"):
        pairs = every.get(mode, [])
        if pairs:
            f, b = zip(*pairs)
            print(f"| {mode} | {len(pairs)} | {min(f):.2f}-{max(f):.2f} | "
                  f"{min(b):.2f}-{max(b):.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
