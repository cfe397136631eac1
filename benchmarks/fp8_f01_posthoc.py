"""POST HOC: where f01's fp8 arm lost its time, checked against the 2026-11-28 4 × H200 data
with the measured fp8 rows (docs/benchmarks/fp8_checks.md, "f01").

For every as-run arm (the 4-GPU compile profile with the 1-GPU fp8 rows beside it, as
``fp8_rows_repredict.py``): the predicted GPU critical path, the CPU's dispatch from the rows'
CPU fields, their ratio (≥ 1: host-bound), the prediction and the measurement; then, for
the layouts whose compiled blocks DDP splits (meshplan.costmodel.fp8_ddp_split), the peak
memory with what a split block keeps beyond a whole one — per token·h, measured on CPU by
``fp8_saved_bytes.py --split`` (Llama block: bf16 +2.0, fp8 +9.0) — added per layer for one
micro-batch in flight (tp 1, no pipeline: what f01 is), and the CPU dispatch the split adds
per layer and micro-batch (``--split-host-ms``, from ``fp8_probe.py --device cpu``) added to
the host side.

    python benchmarks/fp8_f01_posthoc.py --fp8-profile \\
        docs/benchmarks/data/profiles/profile_h200x1_fp8rows_20261128.toml
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from fp8_rows_repredict import DATA, PROFILE, fp8_rows, with_rows  # noqa: E402
from layout_sets import gpu_cluster  # noqa: E402
from meshplan.costmodel import estimate  # noqa: E402
from meshplan.hardware_profiles.calibrated import apply_profile  # noqa: E402
from meshplan.spec import Job, Layout, ModelSpec  # noqa: E402


def ddp_splits_compiled_blocks(job: Job, layout: Layout) -> bool:
    """Whether the executor *as run on 2026-11-28* compiled these blocks inside DDP's forward,
    where Dynamo's DDPOptimizer split them (runtime "torch", compile, ZeRO-0/1, dp·cp > 1,
    no pipeline); it has compiled them whole since (executor/data_parallel.py)."""
    return (job.runtime == "torch" and layout.compile and layout.zero <= 1
            and layout.dp * layout.cp > 1 and layout.pp == 1)

GIB = 2 ** 30


def arms(data: dict, profile: str, rows: tuple):
    model = ModelSpec(**data["model"])
    job16 = Job(**data["job"])
    jobs = {"bf16": job16, "fp8": dataclasses.replace(job16, precision="fp8",
                                                      fp8_recipe=data["recipe"])}
    for row in data["layouts"]:
        layout = Layout(**row["layout"])
        cluster = with_rows(apply_profile(gpu_cluster(data["machine"], layout.num_gpus),
                                          profile, override=True), rows)
        for arm, job in jobs.items():
            meas = row[arm].get("measured") if row[arm].get("status") == "ok" else None
            yield row["name"], layout, arm, job, estimate(model, cluster, job, layout), meas


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fp8-profile", required=True)
    p.add_argument("--data", default=str(DATA))
    p.add_argument("--profile", default=str(PROFILE))
    p.add_argument("--split-bytes", default="bf16=2.0,fp8=9.0",
                   help="per token·h a split Llama block keeps beyond a whole one")
    p.add_argument("--split-host-ms", type=float, default=0.5,
                   help="CPU dispatch the split adds per layer and micro-batch")
    a = p.parse_args()
    data = json.loads(Path(a.data).read_text())
    model = ModelSpec(**data["model"])
    rows = fp8_rows(a.fp8_profile, model, data["job"]["seq_len"])
    extra = {k: float(v) for k, v in (kv.split("=") for kv in a.split_bytes.split(","))}
    print("| layout | arm | GPU path s | host s | host/GPU | pred. s | meas. s | split: host s "
          "| host/GPU | pred. s | peak pred. / meas. GiB | split: pred. GiB |")
    print("|---" * 12 + "|")
    for name, layout, arm, job, est, meas in arms(data, a.profile, rows):
        gpu, host = est.pipeline_s, est.host_dispatch_s
        m_s = f"{meas['step_time_s']:.3f}" if meas else "—"
        m_g = f"{meas['memory_peak_bytes'] / GIB:.2f}" if meas else "—"
        cells = ["", "", "", ""]
        if ddp_splits_compiled_blocks(job, layout) and layout.tp == 1:
            n = layout.num_microbatches(job.global_batch)
            h2 = host + a.split_host_ms / 1e3 * model.num_layers * n
            tail = est.step_time_s - max(gpu, host)
            tokens = job.seq_len * layout.micro_batch
            add = extra[arm] * tokens * model.hidden_size * model.num_layers
            cells = [f"{h2:.3f}", f"{h2 / gpu:.2f}", f"{max(gpu, h2) + tail:.3f}",
                     f"{(est.memory_peak_bytes + add) / GIB:.2f}"]
        print(f"| {name} | {arm} | {gpu:.3f} | {host:.3f} | {host / gpu if gpu else 0:.2f} "
              f"| {est.step_time_s:.3f} | {m_s} | {cells[0]} | {cells[1]} | {cells[2]} "
              f"| {est.memory_peak_bytes / GIB:.2f} / {m_g} | {cells[3]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
