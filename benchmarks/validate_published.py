"""Predicted vs published: Narayanan et al. 2021 Table 1 and Shoeybi et al. 2019 scaling.

    python benchmarks/validate_published.py [--out docs/benchmarks/published.md]

Prints the tables and, with --out, writes them as Markdown with the date and command.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "validation"))

from meshplan.costmodel import estimate  # noqa: E402
from published_runs import SHOEYBI_BASELINE_TFLOPS, narayanan2021, shoeybi2019  # noqa: E402


def narayanan_table() -> tuple[list[str], float, float]:
    lines = ["| model | GPUs | t·p·d | mb | v | published s | predicted s | error | "
             "pred. TFLOP/s/GPU | published | peak mem GiB | bubble s | TP comm s | DP comm s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    errs = []
    for r in narayanan2021():
        e = estimate(r.model, r.cluster, r.job, r.layout)
        err = (e.step_time_s - r.published) / r.published * 100
        errs.append(abs(err))
        lay = r.layout
        lines.append(
            f"| {r.model.name} | {lay.num_gpus} | {lay.tp}·{lay.pp}·{lay.dp} | {lay.micro_batch} | "
            f"{lay.vpp} | {r.published:.2f} | {e.step_time_s:.2f} | {err:+.1f}% | "
            f"{e.hardware_tflops_per_gpu:.0f} | {r.row['tflops_per_gpu']} | "
            f"{e.memory_peak_bytes / 2**30:.1f} | {e.time.bubble_s:.2f} | {e.time.tp_comm_s:.2f} | "
            f"{e.time.dp_comm_exposed_s:.2f} |")
    return lines, sum(errs) / len(errs), max(errs)


def shoeybi_table() -> tuple[list[str], dict]:
    runs = shoeybi2019()
    base_run = next(r for r in runs if r.layout.num_gpus == 1)
    base = estimate(base_run.model, base_run.cluster, base_run.job, base_run.layout)
    lines = [f"Baseline (1.2B, 1 V100): predicted {base.hardware_tflops_per_gpu:.1f} TFLOP/s, "
             f"published {SHOEYBI_BASELINE_TFLOPS:.0f} TFLOP/s "
             f"({(base.hardware_tflops_per_gpu / SHOEYBI_BASELINE_TFLOPS - 1) * 100:+.1f}%).", "",
             "| model | GPUs | tp | dp | published efficiency | predicted | difference (points) |",
             "|---|---|---|---|---|---|---|"]
    diffs = {}
    for r in runs:
        e = estimate(r.model, r.cluster, r.job, r.layout)
        eff = 100 * e.hardware_tflops_per_gpu / base.hardware_tflops_per_gpu
        diffs[(r.model.name, r.layout.num_gpus)] = eff - r.published
        lines.append(f"| {r.model.name} | {r.layout.num_gpus} | {r.layout.tp} | {r.layout.dp} | "
                     f"{r.published:.0f}% | {eff:.1f}% | {eff - r.published:+.1f} |")
    return lines, diffs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    nar, mean, worst = narayanan_table()
    sho, _ = shoeybi_table()
    summary = f"Narayanan 2021 Table 1: mean absolute error {mean:.1f}%, max {worst:.1f}%"
    print("\n".join(nar))
    print(summary)
    print()
    print("\n".join(sho))
    if args.out:
        text = "\n".join([
            "# Cost model vs published training runs", "",
            f"- date: {datetime.date.today().isoformat()}",
            f"- machine: {platform.machine()}, Python {platform.python_version()} (the cost model "
            f"is deterministic; the machine does not matter)",
            f"- command: `python benchmarks/validate_published.py --out {args.out}`",
            "- data: `tests/validation/data/` (copies of the papers' tables, sources in the files)",
            "",
            "## Narayanan et al. 2021, Table 1 (A100-80GB, Megatron-LM 2021)", "",
            "Step time = the paper's TFLOP/s turned back into seconds (F / (TFLOP/s · GPUs)). "
            "Modelled as that Megatron-LM ran: fp16, unfused attention, full recomputation, "
            "gradient all-reduce after backward, interleaved schedule where the run used it.", "",
            *nar, "", f"**{summary}** (goal: each within ±10%, mean ≤ 5%).", "",
            "## Shoeybi et al. 2019, weak scaling (DGX-2H V100)", "",
            "Scaling efficiency = predicted TFLOP/s per GPU (recompute included) over the "
            "predicted single-GPU baseline. Goal: baseline ≈ 39 TFLOP/s, 8.3B at 8 and 512 "
            "GPUs within 5 points.", "",
            *sho, "",
            "## What limits the accuracy", "",
            "- GEMM efficiency is one curve per GPU (by GEMM FLOPs), set once: the A100 curve tops "
            "out at 0.72 of peak, which is what these end-to-end runs sustain; it does not know "
            "about shape effects (tile quantization, skinny GEMMs), so runs of very different "
            "shapes share one efficiency.",
            "- The pipelined runs (76B and up) come out 4-7% fast: the model has no per-micro-batch "
            "CPU/launch overhead for datasheet profiles (it does for calibrated ones) and prices "
            "point-to-point transfers only where they sit on the schedule's critical path.",
            "- The V100 curve is set by the 2019 baseline alone (39 TFLOP/s); the 2.5B data-parallel "
            "row (83%) is not reproduced (we predict ~95%): with the all-reduce overlapped behind "
            "backward, the model has no mechanism for that drop, while the 8.3B row (74%) needs the "
            "overlap — the two published rows are hard to reconcile with one network model.",
            "",
        ])
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
