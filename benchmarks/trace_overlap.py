"""How a rank's GPU spent a profiled window: compute vs NCCL kernels, their overlap, idle
time, and how much slower compute kernels run while an NCCL kernel is active.

Round 5 of issue 5 left pipelines ≈ 1-2 ms per chunk action slower than predicted, most with
interleaving; one suspect is NCCL p2p kernels, posted early, sharing the SMs with compute.
This reads the Chrome traces the executor writes with ``--profile DIR``
(``trace_rank{r}.json``, torch.profiler) and prints, per rank:

* span of the window, compute-busy time (union of non-NCCL kernels, memcpy/memset
  included), NCCL-busy time, their overlap, and compute-idle time;
* the slowdown of compute kernels that overlap an NCCL kernel: for each kernel name seen both
  with and without an overlapping NCCL kernel, the ratio of mean durations, weighted by the
  overlapping kernels' time.

    torchrun --nproc-per-node=2 -m meshplan.executor.run --plan plan.json --steps 8 \\
        --profile $OUT/trace
    python benchmarks/trace_overlap.py $OUT/trace/trace_rank*.json --steps 3
"""

from __future__ import annotations

import argparse
import bisect
import json
import sys
from collections import defaultdict
from pathlib import Path

_GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def load_kernels(path: str | Path) -> list[tuple[float, float, str, bool]]:
    """(start µs, end µs, name, is_nccl) of every GPU kernel / copy in a Chrome trace."""
    doc = json.loads(Path(path).read_text())
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    out = []
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in _GPU_CATS:
            continue
        name = str(e.get("name", ""))
        start = float(e["ts"])
        out.append((start, start + float(e.get("dur", 0.0)), name, "nccl" in name.lower()))
    return sorted(out)


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted, merged intervals."""
    merged: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def length(intervals: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in intervals)


def intersect(xs: list[tuple[float, float]], ys: list[tuple[float, float]]
              ) -> list[tuple[float, float]]:
    """Intersection of two merged interval lists."""
    out, i, j = [], 0, 0
    while i < len(xs) and j < len(ys):
        a, b = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        if a < b:
            out.append((a, b))
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return out


def _overlaps(merged: list[tuple[float, float]], a: float, b: float) -> bool:
    k = bisect.bisect_right(merged, (a, float("inf"))) - 1
    return (k >= 0 and merged[k][1] > a) or (k + 1 < len(merged) and merged[k + 1][0] < b)


def summarize(kernels: list[tuple[float, float, str, bool]], steps: int = 1) -> dict:
    """Per-step seconds of the window's span, compute-busy, NCCL-busy, their overlap and
    compute-idle time, and the NCCL-overlap slowdown of compute kernels (see module doc)."""
    if not kernels:
        raise ValueError("no GPU kernels in this trace (was it recorded with CUDA activity?)")
    compute = union([(a, b) for a, b, _, nccl in kernels if not nccl])
    comm = union([(a, b) for a, b, _, nccl in kernels if nccl])
    span = max(b for _, b, _, _ in kernels) - min(a for a, _, _, _ in kernels)
    both = length(intersect(compute, comm))
    with_nccl: dict[str, list[float]] = defaultdict(list)
    alone: dict[str, list[float]] = defaultdict(list)
    for a, b, name, nccl in kernels:
        if not nccl:
            (with_nccl if _overlaps(comm, a, b) else alone)[name].append(b - a)
    weighted = weight = 0.0
    for name, durs in with_nccl.items():
        if alone.get(name):
            base = sum(alone[name]) / len(alone[name])
            if base > 0:
                weighted += sum(durs) * (sum(durs) / len(durs) / base)
                weight += sum(durs)
    us = 1e-6 / steps
    return {"span_s": span * us, "compute_busy_s": length(compute) * us,
            "nccl_busy_s": length(comm) * us, "overlap_s": both * us,
            "compute_idle_s": (span - length(compute)) * us,
            "slowdown_with_nccl": weighted / weight if weight else None,
            "compared_kernel_s": weight * us}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("traces", nargs="+", type=Path)
    p.add_argument("--steps", type=int, default=3, help="steps in the profiled window [3]")
    p.add_argument("--json", type=Path, default=None, help="also write the summaries here")
    a = p.parse_args(argv)
    out = {}
    for t in a.traces:
        try:
            s = summarize(load_kernels(t), a.steps)
        except (OSError, ValueError, KeyError) as exc:
            print(f"{t}: {exc}", file=sys.stderr)
            return 2
        out[str(t)] = s
        slow = s["slowdown_with_nccl"]
        print(f"{t.name}: per step span {s['span_s'] * 1e3:.1f} ms, compute busy "
              f"{s['compute_busy_s'] * 1e3:.1f} ms, NCCL busy {s['nccl_busy_s'] * 1e3:.1f} ms "
              f"(overlapping compute {s['overlap_s'] * 1e3:.1f} ms), compute idle "
              f"{s['compute_idle_s'] * 1e3:.1f} ms; compute kernels under NCCL "
              + (f"{(slow - 1) * 100:+.1f} % slower" if slow else "not comparable"))
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
