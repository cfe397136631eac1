"""Estimates per second on one core, over a realistic mix of layouts (goal: 20,000/s).

    python benchmarks/costmodel_speed.py [--repeats 3] [--out record.md]

Prints the median and best rate over the passes; ``--out`` also writes them as a Markdown
record with the date, machine and command. Results: docs/benchmarks/planner.md.

The mix: gpt3-175b on 1024 A100s, every (tp, pp, micro-batch, schedule, vpp, recompute,
ZeRO, sequence-parallel) combination the planner would consider. Caches are cleared
before each timed pass, so the figure includes the per-(tp, micro-batch, ...) layer work,
as a fresh planner run pays it.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import meshplan as mp  # noqa: E402
from meshplan.costmodel import estimate  # noqa: E402
from meshplan.costmodel.estimate import (_layer_tables, _pipeline_time, layer_parts,  # noqa: E402
                                         rank_state)
from meshplan.costmodel.flops import hardware_flops_per_step, model_flops_per_step  # noqa: E402
from meshplan.hardware_profiles.cluster import _group_link_cached  # noqa: E402


def layouts(model, cluster, job):
    out = []
    for tp in (1, 2, 4, 8):
        for pp in (1, 2, 4, 8, 16, 32):
            dp = cluster.num_gpus // (tp * pp)
            for mb in (1, 2, 4):
                if job.global_batch % (dp * mb):
                    continue
                m = job.global_batch // (dp * mb)
                scheds = [("1f1b", 1), ("gpipe", 1), ("zero-bubble", 1)]
                if pp > 1 and m % pp == 0:
                    scheds += [("interleaved-1f1b", v) for v in (2, 3, 4)
                               if model.num_layers % (pp * v) == 0]
                for sched, v in scheds:
                    for rc in ("none", "selective", "full"):
                        for z in (0, 1, 2, 3):
                            for sp in ((False, True) if tp > 1 else (False,)):
                                out.append(mp.Layout(dp=dp, pp=pp, tp=tp, micro_batch=mb,
                                                     schedule=sched, vpp=v, recompute=rc,
                                                     zero=z, sequence_parallel=sp))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="write a Markdown record here")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    model = mp.ModelSpec.preset("gpt3-175b")
    cluster = mp.Cluster.preset("dgx-a100-80gb", nodes=128)
    job = mp.Job(global_batch=1536, seq_len=2048)
    lays = layouts(model, cluster, job)
    rates = []
    for _ in range(args.repeats):
        for cached in (layer_parts, _layer_tables, _pipeline_time, rank_state,
                       model_flops_per_step, hardware_flops_per_step):
            cached.cache_clear()
        _group_link_cached.cache_clear()
        t0 = time.perf_counter()
        for lay in lays:
            estimate(model, cluster, job, lay)
        rates.append(len(lays) / (time.perf_counter() - t0))
    best, median = max(rates), sorted(rates)[len(rates) // 2]
    line = (f"{len(lays)} layouts; estimates/s: median {median:,.0f}, best {best:,.0f} "
            f"(goal >= 20,000)")
    print(line)
    if args.out:
        cpu = platform.processor() or platform.machine()
        text = (f"# Cost-model speed\n\n"
                f"- date: {datetime.date.today().isoformat()}\n"
                f"- machine: {os.cpu_count()} cores ({cpu}), Python {platform.python_version()}\n"
                f"- command: `python benchmarks/costmodel_speed.py --out {args.out}`\n\n"
                f"gpt3-175b on 128× dgx-a100-80gb, every layout the planner considers "
                f"({len(lays)} layouts), single process, caches cleared before each pass.\n\n"
                f"| passes | median estimates/s | best estimates/s | goal |\n|---|---|---|---|\n"
                f"| {args.repeats} | {median:,.0f} | {best:,.0f} | ≥ 20,000 |\n")
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
