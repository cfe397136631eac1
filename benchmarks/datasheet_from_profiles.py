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

``--grouped`` prints the grouped-GEMM curves instead (``grouped_gemm_efficiency`` and
``grouped_fp8_gemm_efficiency``, keyed by the call: :mod:`meshplan.hardware_profiles.
grouped_gemm`): every distinct grouped GEMM the calibrations timed inside the MoE layer
(``timing = "in_layer"``, what calibrate's curves are built from since 2026-12-03), pooled
over the profiles, the median efficiency of each quarter decade of call FLOPs, continued
below and above by the entry's dense curve (bf16) or fp8 curve, each point times the
datasheet's derating (0.75: the dense curves' factor for sustained runs at scale, the
comment at the top of gpus.toml), so the grouped and dense GEMMs of a layer are priced alike.
``--permute`` prints the executor's MoE permutation rate by top-k
(``moe_permute_efficiency_by_top_k``): each profile's queued permutation rows at one top-k
read as calibrate reads them (bytes over time, ``calibrate/moe_profile.py``), the median of
the distinct values at each top-k. A dotted key reads inside a table
(``membound_efficiency.moe-permute``, a calibration's own rate at its model's top-k).

    python benchmarks/datasheet_from_profiles.py --grouped --permute

``--compiled-cpu`` prints the CPU dispatch of the executor's compiled blocks (the figures of
a datasheet CPU bound for compiled layouts, read post hoc on 2026-12-05 and not adopted:
docs/benchmarks/fp8_checks.md, "The datasheet's CPU dispatch for compiled blocks"): every
compiled layer row at tp 1 (no sequence parallelism, ZeRO 0, dp 1,
ep 1) whose calibration split its CPU into a per-layer and a per-call part (two stack
depths: a per-call part above 0), grouped by block (dense, MoE), precision (bf16, or the
fp8 recipe) and recompute mode; per group the median of each of the four parts over the
distinct measurements (a calibration's rows of one shape at several micro-batches repeat
its values, which count once), and the spread of their sum a micro-batch of a 1-layer
stack; a group with fewer than :data:`MIN_CPU_CALIBRATIONS` is left out (bf16's stands
in). The ends: the embedding rows and the output rows timed with the compiled loss of the
same profiles, medians of their distinct values.

    python benchmarks/datasheet_from_profiles.py --compiled-cpu
    python benchmarks/datasheet_from_profiles.py --compiled-cpu --gpu H100-SXM5-80GB \\
        --profiles 'docs/benchmarks/data/profiles/profile_h100x*_*.toml'
"""

from __future__ import annotations

import argparse
import functools
import glob
import math
import statistics
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from meshplan.hardware_profiles.calibrated import queued_permute_rows  # noqa: E402
from meshplan.hardware_profiles.curve_fit import extend_with_base, sig  # noqa: E402
from meshplan.hardware_profiles.grouped_gemm import grouped_points  # noqa: E402
from meshplan.hardware_profiles.loader import builtin_gpu  # noqa: E402

DEFAULT_PROFILES = str(ROOT / "docs/benchmarks/data/profiles/profile_h200x*_*.toml")
PERMUTE_KEY = "membound_efficiency.moe-permute"
DERATE = 0.75             # the grouped curves' factor: the dense curves' when these were set
                          # (gpus.toml; the dense ones are 0.80 since 2026-12-04)
BIN_DECADES = 0.25
MIN_CPU_CALIBRATIONS = 3   # a compiled CPU group needs this many distinct measurements
GROUPED_KEYS = {"bf16": ("grouped_gemm_efficiency", "bf16", "gemm_efficiency"),
                "rowwise": ("grouped_fp8_gemm_efficiency", "fp8", "fp8_gemm_efficiency")}


@functools.lru_cache(maxsize=None)
def read_doc(path: str) -> dict:
    """A profile's TOML, parsed once whatever the number of keys and tables asked of it."""
    return tomllib.loads(Path(path).read_text())


def profiles_of(paths: list[str], gpu: str | None = None):
    """(path, parsed profile) of each of ``paths`` (``gpu``: only profiles of that GPU name;
    one without a name counts as any)."""
    for path in paths:
        doc = read_doc(path)
        if not gpu or doc.get("gpu", {}).get("name", gpu) == gpu:
            yield path, doc


def measured_values(paths: list[str], key: str, gpu: str | None = None) -> dict[float, list[str]]:
    """Distinct measured values of ``key`` -> the profiles holding each (``gpu``: only
    profiles of that GPU name; a profile that inherited the key is not counted)."""
    out: dict[float, list[str]] = {}
    for path, doc in profiles_of(paths, gpu):
        value = nested(doc.get("gpu", {}), key)
        if key not in doc.get("measured", []) or value is None:
            continue
        if key == PERMUTE_KEY and not queued_permute_rows(doc.get("measurements", {})):
            continue   # timed with the host in the loop: the loader does not read it either
        out.setdefault(round(float(value), 3), []).append(Path(path).name)
    return out


def nested(table: dict, key: str):
    """``table[key]``, or for a dotted key (``membound_efficiency.moe-permute``, as a
    profile's ``measured`` list names it) the value inside; None where absent."""
    head, _, rest = key.partition(".")
    value = table.get(key, table.get(head) if rest else None)
    if rest and isinstance(value, dict):
        return value.get(rest)
    return None if isinstance(value, dict) else value


def grouped_rows(paths: list[str], precision: str, gpu: str | None = None
                 ) -> dict[tuple, str]:
    """Distinct grouped GEMMs timed in the MoE layer at ``precision`` ("bf16", "rowwise")
    -> the first profile holding each (copies of one calibration repeat its rows; rows
    written before calibrate recorded a precision are bf16)."""
    out: dict[tuple, str] = {}
    for path, doc in profiles_of(paths, gpu):
        for r in doc.get("measurements", {}).get("grouped_gemm", []):
            if r.get("timing") != "in_layer" or r.get("precision", "bf16") != precision:
                continue
            key = (r["groups"], r["rows"], r["k"], r["n"], round(r["seconds"], 9))
            out.setdefault(key, Path(path).name)
    return out


def permute_by_top_k(paths: list[str], gpu: str | None = None) -> dict[int, list[float]]:
    """top-k -> the distinct permutation rates of the profiles' queued rows at that top-k
    (bytes over time per profile, as calibrate fits ``membound_efficiency["moe-permute"]``;
    rows timed in step with the host are not read, as the profile loader does not)."""
    out: dict[int, set[float]] = {}
    for _, doc in profiles_of(paths, gpu):
        g = doc.get("gpu", {})
        rows = [r for r in queued_permute_rows(doc.get("measurements", {}))
                if r.get("seconds", 0) > 0]
        for k in {r["top_k"] for r in rows}:
            at = [r for r in rows if r["top_k"] == k]
            rate = sum(r["model_bytes"] for r in at) / sum(r["seconds"] for r in at)
            out.setdefault(k, set()).add(round(rate / 1e9 / g["hbm_gbps"], 3))
    return {k: sorted(v) for k, v in sorted(out.items())}


def binned_medians(points: list[tuple[float, float]]) -> list[tuple[float, float, int]]:
    """(x, median efficiency, count) of each :data:`BIN_DECADES` bin of log10 x (x: the
    bin's centre)."""
    bins: dict[float, list[float]] = {}
    for x, eff in points:
        bins.setdefault(round(math.log10(x) / BIN_DECADES) * BIN_DECADES, []).append(eff)
    return [(10 ** b, statistics.median(v), len(v)) for b, v in sorted(bins.items())]


def grouped_datasheet(paths: list[str], gpu_name: str, precision: str):
    """(datasheet key, [(x, median, count)], derated curve points) for ``precision``."""
    key, peak_dtype, base_key = GROUPED_KEYS[precision]
    sheet = builtin_gpu(gpu_name)
    rows = grouped_rows(paths, precision, gpu_name)
    peak = sheet.peak_tflops[peak_dtype] * 1e12
    pts = grouped_points([dict(groups=g, rows=r, k=k, n=n, seconds=s)
                          for g, r, k, n, s in rows], peak)
    med = binned_medians(pts)
    curve = extend_with_base([(sig(x), sig(DERATE * e)) for x, e, _ in med],
                             getattr(sheet, base_key))
    return key, med, len(rows), len(set(rows.values())), curve


def print_grouped(paths: list[str], gpu_name: str) -> None:
    for precision in GROUPED_KEYS:
        key, med, n, profiles, curve = grouped_datasheet(paths, gpu_name, precision)
        print(f"{key}: {n} distinct grouped GEMMs timed in the layer ({precision}), "
              f"{profiles} profiles")
        print("| call FLOPs | calls | median efficiency | datasheet (x %.2f) |" % DERATE)
        print("|---|---|---|---|")
        for x, e, c in med:
            print(f"| {x:.3g} | {c} | {e:.3f} | {DERATE * e:.3f} |")
        print(f"{key} = {[[sig(x, 3), sig(y, 3)] for x, y in curve.points]}")
        print()


def summary(values: list[float]) -> dict[str, float]:
    """Median, quartiles and range of ``values`` (at least one)."""
    v = sorted(values)
    q = statistics.quantiles(v, n=4) if len(v) > 1 else [v[0], v[0], v[0]]
    return dict(median=statistics.median(v), q1=q[0], q3=q[2], min=v[0], max=v[-1], n=len(v))


def compiled_cpu_rows(paths: list[str], gpu: str | None = None
                      ) -> dict[tuple[str, str, str], dict[tuple, str]]:
    """(block, precision, recompute) -> distinct (forward, backward per layer, forward,
    backward per call) CPU seconds of the compiled layer rows (module docstring) -> the
    first profile holding each."""
    out: dict[tuple[str, str, str], dict[tuple, str]] = {}
    for path, doc in profiles_of(paths, gpu):
        for r in doc.get("layers", []):
            if not r.get("compile") or r.get("tp", 1) != 1 or r.get("sequence_parallel") \
                    or r.get("zero", 0) or r.get("dp", 1) != 1 or r.get("ep", 1) != 1:
                continue
            parts = tuple(round(float(r.get(k, 0.0)), 7) for k in (
                "forward_cpu_s", "backward_cpu_s", "forward_cpu_fixed_s",
                "backward_cpu_fixed_s"))
            if parts[2] + parts[3] <= 0 or parts[0] + parts[1] <= 0:
                continue   # one stack depth: the per-layer value holds the per-call part
            block = "moe" if "-moe" in r["shape"] else "dense"
            prec = (r.get("fp8_recipe") or "bf16") if r.get("precision") == "fp8" else "bf16"
            out.setdefault((block, prec, r["recompute"]), {}).setdefault(
                parts, Path(path).name)
    return out


def compiled_ends_cpu(paths: list[str], gpu: str | None = None) -> dict[str, list[tuple]]:
    """"embedding" / "output" -> distinct (forward, backward) CPU seconds of the ends rows
    (tp 1) of profiles with compiled layer rows; the output's timed with the compiled loss."""
    out: dict[str, set[tuple]] = {"embedding": set(), "output": set()}
    for _, doc in profiles_of(paths, gpu):
        if not any(r.get("compile") for r in doc.get("layers", [])):
            continue
        for r in doc.get("ends", []):
            if r.get("tp", 1) != 1 or r.get("sequence_parallel"):
                continue
            if r["part"] == "output" and not r.get("compile"):
                continue
            cpu = (round(float(r.get("forward_cpu_s", 0.0)), 7),
                   round(float(r.get("backward_cpu_s", 0.0)), 7))
            if sum(cpu) > 0:
                out[r["part"]].add(cpu)
    return {k: sorted(v) for k, v in out.items()}


def print_compiled_cpu(paths: list[str], gpu_name: str) -> None:
    groups = compiled_cpu_rows(paths, gpu_name)
    print("| block | precision | recompute | measurements (profiles) | forward / backward "
          "us a layer | forward / backward us a call | sum us (1 layer): median, quartiles, "
          "range |")
    print("|---|---|---|---|---|---|---|")
    entries = []
    for (block, prec, mode), vals in sorted(groups.items()):
        med = [statistics.median(v[i] for v in vals) for i in range(4)]
        s = summary([sum(v) for v in vals])
        print(f"| {block} | {prec} | {mode} | {len(vals)} ({len(set(vals.values()))}) | "
              f"{med[0] * 1e6:.0f} / {med[1] * 1e6:.0f} | {med[2] * 1e6:.0f} / "
              f"{med[3] * 1e6:.0f} | {s['median'] * 1e6:.0f}, {s['q1'] * 1e6:.0f}-"
              f"{s['q3'] * 1e6:.0f}, {s['min'] * 1e6:.0f}-{s['max'] * 1e6:.0f} |")
        if len(vals) >= MIN_CPU_CALIBRATIONS:
            entries.append(f'  ["{block}", "{prec}", "{mode}", '
                           + ", ".join(f"{x * 1e6:.0f}e-6" for x in med) + "],")
    ends = compiled_ends_cpu(paths, gpu_name)
    for part, vals in ends.items():
        if not vals:
            continue
        us = [[x * 1e6 for x in col] for col in zip(*vals)]
        print(f"{part}: {len(vals)} distinct, forward {statistics.median(us[0]):.0f} us "
              f"({min(us[0]):.0f}-{max(us[0]):.0f}), backward {statistics.median(us[1]):.0f} "
              f"us ({min(us[1]):.0f}-{max(us[1]):.0f})")
    print("compiled_block_cpu_s = [")
    print("\n".join(entries))
    print("]")
    if all(ends.values()):
        print("compiled_ends_cpu_s = ["
              + ", ".join(f"{statistics.median(v[i] for v in ends[p]) * 1e6:.0f}e-6"
                          for p in ("embedding", "output") for i in (0, 1)) + "]")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("keys", nargs="*", help="GPU profile keys (e.g. fp8_cast_compiled_gbps)")
    ap.add_argument("--grouped", action="store_true",
                    help="print the grouped-GEMM curves (module docstring)")
    ap.add_argument("--permute", action="store_true",
                    help="print the MoE permutation rate by top-k (module docstring)")
    ap.add_argument("--compiled-cpu", action="store_true",
                    help="print the compiled blocks' CPU dispatch (module docstring)")
    ap.add_argument("--profiles", default=DEFAULT_PROFILES, help="glob of calibrated profiles")
    ap.add_argument("--gpu", default="H200-SXM-141GB",
                    help="built-in GPU entry to compare with (and profiles of that name)")
    args = ap.parse_args(argv)
    paths = sorted(glob.glob(args.profiles))
    if not paths:
        raise SystemExit(f"no profile matches {args.profiles}")
    if args.grouped:
        print_grouped(paths, args.gpu)
    if args.compiled_cpu:
        print_compiled_cpu(paths, args.gpu)
    if args.permute:
        rates = permute_by_top_k(paths, args.gpu)
        for k, v in rates.items():
            print(f"top-{k}: {len(v)} distinct rates {v}, median {statistics.median(v):.3f}")
        print("moe_permute_efficiency_by_top_k = "
              f"{[[k, round(statistics.median(v), 3)] for k, v in rates.items()]}")
    if not args.keys:
        return 0 if args.grouped or args.permute or args.compiled_cpu else ap.error(
            "name a key, or give --grouped, --permute or --compiled-cpu")
    sheet = builtin_gpu(args.gpu)
    print(f"| key | datasheet {args.gpu} | median of calibrations | quartiles | range | "
          f"calibrations (profiles) |")
    print("|---|---|---|---|---|---|")
    for key in args.keys:
        vals = measured_values(paths, key, args.gpu)
        if not vals:
            print(f"| `{key}` | — | none measured | | | 0 |")
            continue
        s = summary(list(vals))
        sheet_value = nested(sheet.to_dict(), key)
        if sheet_value is None:
            sheet_value = getattr(sheet, key, None)
        shown = "—" if sheet_value is None else f"{sheet_value:.4g}"
        print(f"| `{key}` | {shown} | {s['median']:.4g} | "
              f"{s['q1']:.4g}-{s['q3']:.4g} | {s['min']:.4g}-{s['max']:.4g} | "
              f"{s['n']} ({sum(map(len, vals.values()))}) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
