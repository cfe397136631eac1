"""Published MoE rows with the all-to-all's call latency at its lower bound.

The cost model prices one all-to-all's call latency as n − 1 sequential ring steps (of them
n − n/k between nodes; ``hardware_profiles/collective_latency.ring_steps``), an upper
bound: NCCL posts an all-to-all's sends to every peer at once. This script regenerates
docs/benchmarks/published.md with the latency at its lower bound — one step, crossing
nodes once where the group spans nodes — and prints each MoE summary line beside the
committed one, so the bound's weight in the published figures can be read. It changes
nothing in the tree: the regenerated page goes to ``--out`` (default a temporary file).

    PYTHONPATH=benchmarks:. python benchmarks/a2a_latency_bounds.py

Reading of 2026-12-06: docs/benchmarks/moe_checks.md, "The all-to-all's call latency at
its lower bound".
"""
from __future__ import annotations

import argparse
import contextlib
import io
import re
import runpy
import sys
import tempfile
from pathlib import Path

import meshplan.costmodel.comm as comm
from meshplan.hardware_profiles import collective_latency

ROOT = Path(__file__).resolve().parent.parent
SUMMARY = re.compile(r"^(?:- |\*\*)(MoE[^:]*): (mean absolute error [0-9.]+%, max [0-9.]+%)")


def one_step_all_to_all(ring_steps):
    """``ring_steps`` with an all-to-all's latency at one step (one crossing between nodes)."""
    def steps(op: str, n: int, nodes: int = 1) -> tuple[int, int]:
        if op == "all_to_all" and n > 1:
            return 1, 1 if nodes > 1 else 0
        return ring_steps(op, n, nodes)
    return steps


def summaries(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        m = SUMMARY.match(line)
        if m:
            out.setdefault(m.group(1), m.group(2))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None,
                    help="where the regenerated page goes (default: a temporary file)")
    args = ap.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="a2a_bounds_")) / "published.md"
    comm.ring_steps = one_step_all_to_all(collective_latency.ring_steps)
    sys.argv = ["validate_published.py", "--out", str(out)]
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            runpy.run_path(str(ROOT / "benchmarks" / "validate_published.py"),
                           run_name="__main__")
        except SystemExit as stop:
            if stop.code not in (0, None):
                raise
    committed = summaries((ROOT / "docs" / "benchmarks" / "published.md").read_text())
    lower = summaries(out.read_text())
    print(f"regenerated page: {out}")
    print("MoE figure: committed (n − 1 ring steps) → one step")
    for name, figure in committed.items():
        print(f"- {name}: {figure} → {lower.get(name, '—')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
