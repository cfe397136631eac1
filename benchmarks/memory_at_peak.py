"""What is alive at a run's memory peak, for any plan file: the executor under torch's memory
history, rank 0's trace replayed by ``memory_peak.peak_live_set``.

    torchrun --standalone --nproc-per-node 2 benchmarks/memory_at_peak.py \
        --summary OUT.md -- --plan plan.json --out results.json --steps 3 --warmup 2 \
        --device cuda --allow-gpu-mismatch

Everything after ``--`` goes to ``meshplan.executor.run``. ``memory_walk.py --snapshot``
does this for the layouts of a named set, step phase by phase; this runs one plan file as
it is (an fp8 check's arm, a variant edited by hand) and writes rank 0's live set at its
peak as a markdown table. A post hoc diagnosis tool (docs/benchmarks/fp8_checks.md "fp8h9"):
recording slows the run, so its step times are not measurements.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from memory_peak import peak_live_set  # noqa: E402


def summary(live: dict, max_allocated_bytes: float) -> str:
    out = [f"max_memory_allocated: {max_allocated_bytes / 2**30:.2f} GiB",
           f"peak of the recorded trace: {live['peak_bytes'] / 2**30:.2f} GiB "
           f"(complete trace: {live['complete']})", "",
           "| GiB | blocks | site |", "|---|---|---|"]
    out += [f"| {s['bytes'] / 2**30:.3f} | {s['blocks']} | `{s['site']}` |"
            for s in live["sites"]]
    return "\n".join(out) + "\n"


def main() -> int:
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--summary", required=True, help="markdown file rank 0 writes")
    p.add_argument("--max-entries", type=int, default=2_000_000)
    args = p.parse_args(argv[:split])
    import torch

    from meshplan.executor import run
    record = os.environ.get("RANK", "0") == "0" and torch.cuda.is_available()
    if record:
        torch.cuda.memory._record_memory_history(max_entries=args.max_entries,
                                                 stacks="python")
    rc = run.main(argv[split + 1:])
    if record:
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        live = peak_live_set(snap["device_traces"][torch.cuda.current_device()])
        Path(args.summary).write_text(summary(live, torch.cuda.max_memory_allocated()))
    return rc


if __name__ == "__main__":
    sys.exit(main())
