"""Where a rank's CPU time goes in an executor trace (``meshplan run --trace``).

For a host-bound step the question is what the dispatching thread does besides launching
kernels: blocking CUDA runtime calls (stream/event/device synchronize, synchronous copies)
show up as long ``cuda_runtime`` events. Prints, per trace, the traced steps' span, the busy
time of the CUDA runtime calls by name, and the longest gaps in which the main thread
launched nothing.

    python benchmarks/trace_cpu.py run/trace/trace_rank*.json --top 12
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def summarize(path: Path, top: int, steps_in_window: int = 3) -> dict:
    events = json.loads(path.read_text()).get("traceEvents", [])
    steps = [e for e in events if e.get("name", "").startswith("ProfilerStep#")]
    runtime: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    launches = []
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "dur" in e:
            r = runtime[e["name"]]
            r[0] += e["dur"] / 1e6
            r[1] += 1
            launches.append((e["ts"], e["ts"] + e["dur"]))
    launches.sort()
    gaps = sorted(((b[0] - a[1]) / 1e6, a[1]) for a, b in zip(launches, launches[1:]))[-top:]
    # torch.profiler marks each prof.step() as ProfilerStep#k; without them, the caller's count
    n = len(steps) or steps_in_window
    span_s = (sum(e["dur"] for e in steps) if steps else
              (launches[-1][1] - launches[0][0] if launches else 0.0)) / 1e6 / n
    return {
        "steps": len(steps),
        "step_span_s": span_s,
        "runtime_per_step": {k: {"s": v[0] / n, "calls": v[1] / n} for k, v in sorted(
            runtime.items(), key=lambda kv: -kv[1][0])[:top]},
        "longest_gaps_s": [g for g, _ in reversed(gaps)],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="+", type=Path)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--steps", type=int, default=3,
                    help="steps in the profiled window where the trace has no step marks [3]")
    ap.add_argument("--json", type=Path, help="also write the summaries here")
    args = ap.parse_args()
    out = {}
    for p in args.traces:
        s = out[p.name] = summarize(p, args.top, args.steps)
        print(f"{p.name}: {s['steps']} steps, {s['step_span_s'] * 1e3:.1f} ms per step")
        for name, v in s["runtime_per_step"].items():
            print(f"  {name:40s} {v['s'] * 1e3:8.2f} ms  {v['calls']:7.1f} calls per step")
        print("  longest launch gaps (ms): "
              + ", ".join(f"{g * 1e3:.1f}" for g in s["longest_gaps_s"]))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
