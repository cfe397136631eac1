"""Planner wall time on three large cases -> docs/benchmarks/planner.md (prints Markdown rows).

    python benchmarks/planner_speed.py                  # the dense cases
    python benchmarks/planner_speed.py --long-context   # 128k tokens: cp searched (issue 39)
    python benchmarks/planner_speed.py --moe            # MoE models: ep/etp searched (issue 38)
    python benchmarks/planner_speed.py --runtime torch  # any of them for meshplan's executor
"""

import os
import platform
import sys
import time
import warnings
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import meshplan as mp  # noqa: E402

CASES = [("gpt3-175b", "dgx-a100-80gb", 128, 1536, 2048, 2.0),
         ("gpt-1t", "dgx-a100-80gb", 384, 3072, 2048, 5.0),
         ("llama3-405b", "dgx-h100", 2048, 2048, 8192, 10.0)]


# (model, cluster, nodes, global batch, seq_len, goal s)
LONG_CASES = [("llama3-8b", "dgx-h100", n, 64, 131072, 10.0) for n in (2, 4, 8)] + \
    [("llama3-70b", "dgx-h100", n, 64, 131072, 10.0) for n in (4, 8, 16)]
MOE_CASES = [("mixtral-8x7b", "dgx-h100", 8, 1024, 4096, 10.0),
             ("deepseek-v3", "dgx-h100", 256, 4096, 4096, 30.0)]


def main() -> None:
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, date {date.today()}, load average "
          f"{os.getloadavg()[0]:.2f} before")
    cases = LONG_CASES if "--long-context" in sys.argv else \
        MOE_CASES if "--moe" in sys.argv else CASES
    runtime = "megatron"
    if "--runtime" in sys.argv:
        at = sys.argv.index("--runtime") + 1
        if at == len(sys.argv) or sys.argv[at] not in ("megatron", "torch"):
            sys.exit(f"--runtime {' '.join(sys.argv[at:at + 1]) or '(missing)'}: "
                     "'megatron' or 'torch'")
        runtime = sys.argv[at]
    print(f"runtime {runtime}")
    print("| case | GPUs | goal s | wall s | configurations | layouts (with partitions) | "
          "tables built | CP-SAT candidates | partition models | all optimal | best | "
          "tokens/s | MFU |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, cl, nodes, batch, seq, goal in cases:
        model, cluster = mp.ModelSpec.preset(name), mp.Cluster.preset(cl, nodes=nodes)
        job = mp.Job(global_batch=batch, seq_len=seq, runtime=runtime)
        t = time.perf_counter()
        with warnings.catch_warnings():     # seq_len past a RoPE model's maximum
            warnings.simplefilter("ignore", mp.MeshplanWarning)
            p = mp.plan(model, cluster, job, top_k=10)
        wall = time.perf_counter() - t
        s = p.stats
        print(f"| {name} b{batch} s{seq} | {cluster.num_gpus} | {goal} | {wall:.2f} | "
              f"{s['configurations']:,} | {s['space_layouts']:.3g} | {s['tables_built']:,} | "
              f"{s['survivors']} | {s.get('cpsat_partition_models', 0)} | "
              f"{s.get('all_optimal', True)} | {p.best.layout.replace(stage_layers=None).short()} | "
              f"{p.best.estimate.tokens_per_s:,.0f} | {p.best.estimate.mfu:.1%} |")
    print(f"load average {os.getloadavg()[0]:.2f} after")


if __name__ == "__main__":
    main()
