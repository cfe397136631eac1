"""Which allocations are live at a run's peak: the executor under torch's memory history.

    torchrun --standalone --nproc-per-node 2 benchmarks/memory_at_peak.py \
        --summary OUT.md -- --plan plan.json --out results.json --steps 3 --warmup 2 \
        --device cuda --allow-gpu-mismatch

Everything after ``--`` goes to ``meshplan.executor.run``. Rank 0 records its CUDA
allocator's history (``torch.cuda.memory._record_memory_history``, Python stacks), replays
the trace after the run and writes the allocations live at the moment its allocated bytes
peaked, grouped by the innermost frame in meshplan or in Inductor's generated code, largest
groups first. A post hoc diagnosis tool for a memory miss (docs/fp8.md "fp8h9"); it slows
the run, so its step times are not measurements.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict


def _site(frames: list[dict]) -> str:
    """The innermost frame worth naming: meshplan's own code or Inductor's output code."""
    for f in frames:
        name = f.get("filename", "")
        if "/meshplan/" in name or "torchinductor" in name:
            short = name.split("/meshplan/")[-1] if "/meshplan/" in name else name.split("/")[-1]
            return f"{short}:{f.get('line')} {f.get('name')}"
    return "(no meshplan frame) " + (f"{frames[0].get('filename', '')}:{frames[0].get('line')}"
                                     if frames else "")


def live_at_peak(trace: list[dict]) -> tuple[int, dict[int, tuple[int, str]]]:
    """Replay one device's trace: the peak of allocated bytes and the blocks live then."""
    live: dict[int, tuple[int, str]] = {}
    total = peak = 0
    at_peak: dict[int, tuple[int, str]] = {}
    for ev in trace:
        action = ev["action"]
        if action == "alloc":
            live[ev["addr"]] = (ev["size"], _site(ev.get("frames", [])))
            total += ev["size"]
            if total > peak:
                peak, at_peak = total, dict(live)
        elif action == "free_completed" and ev["addr"] in live:
            total -= live.pop(ev["addr"])[0]
    return peak, at_peak


def summary(peak: int, blocks: dict[int, tuple[int, str]], top: int = 25) -> str:
    groups: dict[str, list[int]] = defaultdict(list)
    for size, site in blocks.values():
        groups[site].append(size)
    rows = sorted(groups.items(), key=lambda kv: -sum(kv[1]))[:top]
    out = [f"peak of the recorded trace: {peak / 2**30:.2f} GiB in {len(blocks)} blocks "
           "(allocations made before recording started are not in it)", "",
           "| GiB | blocks | largest MiB | site |", "|---|---|---|---|"]
    for site, sizes in rows:
        out.append(f"| {sum(sizes) / 2**30:.3f} | {len(sizes)} | {max(sizes) / 2**20:.1f} "
                   f"| `{site}` |")
    return "\n".join(out) + "\n"


def main() -> int:
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--summary", required=True, help="markdown file rank 0 writes")
    p.add_argument("--max-entries", type=int, default=2_000_000)
    args = p.parse_args(argv[:split])
    import os

    import torch

    from meshplan.executor import run
    rank0 = os.environ.get("RANK", "0") == "0"
    if rank0 and torch.cuda.is_available():
        torch.cuda.memory._record_memory_history(max_entries=args.max_entries,
                                                 context="alloc", stacks="python")
    rc = run.main(argv[split + 1:])
    if rank0 and torch.cuda.is_available():
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        dev = torch.cuda.current_device()
        peak, blocks = live_at_peak(snap["device_traces"][dev])
        with open(args.summary, "w") as f:
            f.write(f"max_memory_allocated: {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB\n")
            f.write(summary(peak, blocks))
    return rc


if __name__ == "__main__":
    sys.exit(main())
