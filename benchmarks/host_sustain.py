"""Diagnostic (issue 5, round 14): does the host's dispatch speed fall under sustained load?

Each of ``--procs`` processes (one per GPU, as the executor's ranks) issues tiny CUDA ops
(``add_`` on a 1-element tensor, as ``executor.measure.host_dispatch_probe_us``) without
pause for ``--seconds`` and prints its µs per op in each ``--window-s`` window, so a host
whose speed drops after minutes of load (what round 14's repeats suggest) shows it::

    python benchmarks/host_sustain.py --procs 2 --seconds 150 --out $OUT/sustain.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _spawn import spawn_and_collect  # noqa: E402


def _worker(rank: int, seconds: float, window_s: float, queue) -> None:
    import torch
    dev = torch.device("cuda", rank) if torch.cuda.is_available() else torch.device("cpu")
    x = torch.zeros(1, device=dev)
    windows, start = [], time.perf_counter()
    while time.perf_counter() - start < seconds:
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < window_s:
            for _ in range(1000):
                x.add_(1.0)
            n += 1000
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
        windows.append(round((time.perf_counter() - t0) / n * 1e6, 3))
    queue.put((rank, windows))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--seconds", type=float, default=150.0)
    p.add_argument("--window-s", type=float, default=5.0)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    if args.procs < 1:
        p.error(f"--procs must be at least 1, got {args.procs}")
    if not 0 < args.window_s <= args.seconds:
        p.error(f"--window-s must be in (0, --seconds = {args.seconds:g}], got {args.window_s:g}")
    result = spawn_and_collect(_worker, [(r, args.seconds, args.window_s)
                                         for r in range(args.procs)])
    for rank in sorted(result):
        print(f"rank {rank}: us/op per {args.window_s:g} s window: "
              + " ".join(f"{v:.2f}" for v in result[rank]))
    if args.out:
        args.out.write_text(json.dumps({"window_s": args.window_s, "us_per_op": result}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
