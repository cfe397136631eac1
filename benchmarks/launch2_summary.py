"""Summary of ``benchmarks/launch2_device.sh``: the two-node run's ranks, groups and
checkpoints (measured beside predicted), and the resume into tp 2.

    python benchmarks/launch2_summary.py /tmp/launch2 > summary.md
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

GB = 1e9


def _doc(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def ranks_table(doc: dict) -> list[str]:
    rows = ["| rank | node | local rank | host | dp group | tp group | pp group |",
            "|---|---|---|---|---|---|---|"]
    for r in sorted(doc["measured"].get("memory_per_rank", []), key=lambda r: r["rank"]):
        g = r.get("groups", {})
        rows.append(f"| {r['rank']} | {r.get('node_rank')} | {r.get('local_rank')} | "
                    f"{r.get('host')} | {g.get('dp')} | {g.get('tp')} | {g.get('pp')} |")
    return rows


def checkpoint_lines(doc: dict) -> list[str]:
    ck = doc["measured"].get("checkpoints") or {}
    pred = ck.get("prediction", {})
    out = [f"predicted: {json.dumps(pred)}"]
    for s in ck.get("saves", []):
        out.append(f"- step {s['step']}: {s['bytes'] / GB:.3f} GB committed, "
                   f"largest rank {s['rank_bytes_max'] / GB:.3f} GB, staging pause "
                   f"{s['stage_s_max']:.2f} s, background write {s['write_s']:.1f} s "
                   f"({s['bytes'] / GB / s['write_s']:.2f} GB/s)" if s.get("write_s") else
                   f"- step {s['step']}: {s}")
    return out


def run_lines(name: str, doc: dict | None) -> list[str]:
    if doc is None:
        return [f"## {name}: no results file", ""]
    m = doc.get("measured") or {}
    lines = [f"## {name}: status {doc.get('status')}", "",
             f"layout `{doc.get('layout', {})}`", ""]
    if doc.get("error"):
        lines += [f"error: {doc['error']}", ""]
    if m:
        lines += [f"step {m.get('step_time_s')} s, first step {m.get('first_step')}, "
                  f"resumed from {m.get('resumed_from')}",
                  f"losses: {[round(x, 4) for x in m.get('loss_per_step', [])]}", ""]
        lines += ranks_table(doc) + [""] + checkpoint_lines(doc) + [""]
    return lines


def main(argv=None) -> int:
    w = Path((argv or sys.argv[1:])[0])
    lines = ["# launch2_device.sh", ""]
    lines += run_lines("two torchrun nodes × 1 GPU, dp 2, checkpoint every 5",
                       _doc(w / "nodes" / "results.json"))
    lines += run_lines("resumed into tp 2 on one node of 2 GPUs", _doc(w / "tp2" / "results.json"))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
