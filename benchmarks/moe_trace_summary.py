"""Summarise torch.profiler chrome traces (the executor's ``--profile DIR``) as text: where a
step's time goes on the GPU and on the host.

    python benchmarks/moe_trace_summary.py OUT/profiles/dp4-ep1-zero1 [DIR ...] --out x.txt

Per trace (each ``trace_rank*.json`` of each DIR; ``--ranks 0,3`` to choose):

* the profiled steps (``ProfilerStep#N``): wall time each, and the GPU's busy time inside
  them (the union of kernel, memcpy and memset intervals) — idle = wall − busy;
* GPU kernels by self time (a kernel has no children), top N, with a category (GEMM, grouped
  GEMM, NCCL, attention, index/scatter, elementwise/reduce, copy) and the categories' totals;
* host operators (``cpu_op``) by self CPU time (each op's time less its child ops' on the
  same thread) and by total, top N;
* CUDA runtime calls by total (``cudaStreamSynchronize`` / ``cudaMemcpyAsync`` show the
  device-to-host syncs' waits, ``cudaLaunchKernel`` the launches).
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path

CATEGORIES = (("nccl", re.compile(r"nccl", re.I)),
              ("grouped GEMM", re.compile(r"grouped|group_gemm|GroupedGemm", re.I)),
              ("attention", re.compile(r"flash|fmha|attention|sdpa|cudnn", re.I)),
              ("GEMM", re.compile(r"gemm|nvjet|cutlass|sm90_xmma|sm80_xmma|wgmma|matmul", re.I)),
              ("index/scatter", re.compile(r"index|scatter|gather|sort|bincount|cumsum|"
                                           r"repeat_interleave|nonzero|topk", re.I)),
              ("copy", re.compile(r"copy|memcpy|memset|cat|fill", re.I)),
              ("elementwise/reduce", re.compile(r"elementwise|reduce|vectorized|norm|softmax|"
                                                r"silu|gelu|mul|add|adam", re.I)))


def category(name: str) -> str:
    for cat, rx in CATEGORIES:
        if rx.search(name):
            return cat
    return "other"


def union_us(intervals: list[tuple[float, float]]) -> float:
    """Total length (µs) of the union of [start, end) intervals."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def self_times(events: list[dict]) -> dict[int, float]:
    """Self time of each ``cpu_op`` event (index -> µs): its duration less its direct
    children's, children being ops nested inside it on the same thread."""
    by_thread = defaultdict(list)
    for i, e in enumerate(events):
        by_thread[(e.get("pid"), e.get("tid"))].append(i)
    out = {}
    for idx in by_thread.values():
        idx.sort(key=lambda i: (events[i]["ts"], -events[i].get("dur", 0)))
        stack: list[int] = []
        for i in idx:
            e = events[i]
            out[i] = float(e.get("dur", 0))
            while stack and events[stack[-1]]["ts"] + events[stack[-1]].get("dur", 0) <= e["ts"]:
                stack.pop()
            if stack:
                out[stack[-1]] -= float(e.get("dur", 0))
            stack.append(i)
    return out


def _table(title: str, rows: list[tuple[str, float, int]], total: float, top: int) -> list[str]:
    lines = [title, f"{'ms':>10} {'%':>6} {'calls':>7}  name"]
    for name, us, n in sorted(rows, key=lambda r: -r[1])[:top]:
        lines.append(f"{us / 1e3:10.3f} {100 * us / total if total else 0:6.1f} {n:7d}  "
                     f"{name[:110]}")
    return lines + [""]


def _aggregate(pairs) -> list[tuple[str, float, int]]:
    acc: dict[str, list] = defaultdict(lambda: [0.0, 0])
    for name, us in pairs:
        acc[name][0] += us
        acc[name][1] += 1
    return [(k, v[0], v[1]) for k, v in acc.items()]


def summarise(path: Path, top: int = 30) -> str:
    doc = json.loads(path.read_text())
    ev = [e for e in (doc["traceEvents"] if isinstance(doc, dict) else doc)
          if e.get("ph") == "X" and "ts" in e]
    steps = sorted((e for e in ev if str(e.get("name", "")).startswith("ProfilerStep#")),
                   key=lambda e: e["ts"])
    gpu = [e for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    lines = [f"== {path}", ""]
    if not steps:      # no ProfilerStep marks (a profiler without a schedule): the window
        cpu = [e for e in ev if e.get("cat") == "cpu_op"] or ev
        a = min(e["ts"] for e in cpu + gpu)
        b = max(e["ts"] + e.get("dur", 0) for e in cpu + gpu)
        steps = [{"name": "profiled window (the executor profiles 3 steps)", "ts": a,
                  "dur": b - a}]
    for s in steps:
        a, b = s["ts"], s["ts"] + s["dur"]
        busy = union_us([(max(a, g["ts"]), min(b, g["ts"] + g["dur"])) for g in gpu
                          if g["ts"] < b and g["ts"] + g["dur"] > a])
        lines.append(f"{s['name']}: wall {s['dur'] / 1e3:.1f} ms, GPU busy {busy / 1e3:.1f} ms "
                     f"({100 * busy / s['dur']:.0f} %), idle {(s['dur'] - busy) / 1e3:.1f} ms")
    kern = [(str(e["name"]), float(e["dur"])) for e in gpu]
    ktotal = sum(us for _, us in kern)
    lines += ["", f"GPU time in kernels/copies: {ktotal / 1e3:.1f} ms", ""]
    cats = _aggregate((category(n), us) for n, us in kern)
    lines += _table("GPU by category (self CUDA time)", cats, ktotal, top)
    lines += _table(f"GPU kernels by self CUDA time (top {top})", _aggregate(kern), ktotal, top)
    ops = [e for e in ev if e.get("cat") == "cpu_op"]
    selfs = self_times(ops)
    cpu_self = _aggregate((str(ops[i]["name"]), us) for i, us in selfs.items())
    ctotal = sum(us for _, us, _ in cpu_self)
    lines += _table(f"host operators by self CPU time (top {top}; total {ctotal / 1e3:.1f} ms)",
                    cpu_self, ctotal, top)
    lines += _table(f"host operators by total CPU time (top {top})",
                    _aggregate((str(e["name"]), float(e["dur"])) for e in ops), ctotal, top)
    rt = [(str(e["name"]), float(e["dur"])) for e in ev if e.get("cat") == "cuda_runtime"]
    lines += _table(f"CUDA runtime calls by total time (top {top})", _aggregate(rt),
                    sum(us for _, us in rt), top)
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--ranks", default="0", help="comma-separated ranks, or 'all'")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    parts = []
    for d in map(Path, a.dirs):
        files = sorted(d.glob("trace_rank*.json"))
        if a.ranks != "all":
            want = {f"trace_rank{r}.json" for r in a.ranks.split(",")}
            files = [f for f in files if f.name in want]
        if not files:
            parts.append(f"== {d}: no trace_rank*.json\n")
        parts += [summarise(f, a.top) for f in files]
    text = "\n".join(parts)
    if a.out:
        Path(a.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
