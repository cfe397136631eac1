"""What one executor trace holds, counted: GPU span and busy time, kernels and host calls by
name, so that two arms of one layout (bf16 and fp8, eager and compiled) can be compared by
how many operations each step dispatches and how long the GPU waited for them.

Reads the Chrome traces the executor writes with ``--profile DIR`` (``trace_rank{r}.json``)
and prints, per trace: the window's span (first to last GPU kernel), the union of kernel
time (busy) and its complement (idle), the number of kernels, and the top host operations
(``cpu_op``) and CUDA runtime calls by count with their total duration.

    python benchmarks/trace_ops.py run/trace/trace_rank0.json --top 25
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from moe_trace_summary import union_us


def summarize(path: Path) -> dict:
    events = [e for e in json.loads(path.read_text()).get("traceEvents", [])
              if e.get("ph") == "X" and "dur" in e]
    kernels = [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "kernel"]
    by_cat: dict[str, dict[str, list[float]]] = {"cpu_op": defaultdict(lambda: [0, 0.0]),
                                                 "cuda_runtime": defaultdict(lambda: [0, 0.0]),
                                                 "kernel": defaultdict(lambda: [0, 0.0])}
    for e in events:
        table = by_cat.get(e.get("cat"))
        if table is not None:
            row = table[e["name"][:90]]
            row[0] += 1
            row[1] += e["dur"]
    out = {"trace": str(path), "kernels": len(kernels)}
    if kernels:
        span = max(b for _, b in kernels) - min(a for a, _ in kernels)
        busy = union_us(kernels)
        out.update(span_ms=span / 1e3, busy_ms=busy / 1e3, idle_ms=(span - busy) / 1e3)
    out["top"] = {cat: sorted(((n, c, d / 1e3) for n, (c, d) in t.items()),
                              key=lambda r: -r[1]) for cat, t in by_cat.items()}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="+", type=Path)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    for path in args.traces:
        s = summarize(path)
        print(f"{s['trace']}: {s['kernels']} kernels", end="")
        if "span_ms" in s:
            print(f", span {s['span_ms']:.1f} ms, busy {s['busy_ms']:.1f} ms, "
                  f"idle {s['idle_ms']:.1f} ms")
        else:
            print()
        for cat, rows in s["top"].items():
            print(f"  {cat} by count (count, total ms):")
            for name, count, ms in rows[:args.top]:
                print(f"    {count:7d} {ms:10.2f}  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
