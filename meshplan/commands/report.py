"""``meshplan report``: a capacity-planning report (HTML, Markdown, PNGs, CSVs).

    meshplan report --model llama3-70b --cluster dgx-h100 --gpus 64,128,256,512,1024 \\
        --global-batch 1024 --seq-len 8192 --tokens 2e12 --price-per-gpu-hour 2.5 \\
        --compare-gpus a100-80gb,h100,h200 --compare-precision bf16,fp8 -o report/
"""

from __future__ import annotations

import argparse

from meshplan.commands.common import (add_job_args, add_model_cluster_args, job_from_args,
                                      load_cluster, load_model, positive_int)


def int_list(what: str):
    """An argparse type for comma-separated positive integers, e.g. ``"64,128,256"``."""
    def parse(text: str) -> list[int]:
        out = []
        for item in text.split(","):
            item = item.strip()
            try:
                n = int(item)
            except ValueError:
                raise argparse.ArgumentTypeError(
                    f"{what} {item!r} is not an integer; give a comma-separated list like "
                    f"64,128,256") from None
            if n < 1:
                raise argparse.ArgumentTypeError(f"{what} {n} must be >= 1")
            out.append(n)
        return out
    return parse


def nonnegative_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not v >= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 0")
    return v


def add_arguments(p) -> None:
    add_model_cluster_args(p)
    add_job_args(p)
    g = p.add_argument_group("report")
    g.add_argument("--gpus", type=int_list("GPU count"), required=True,
                   help="comma-separated GPU counts to plan, e.g. 64,128,256,512,1024")
    g.add_argument("--objective", default="throughput",
                   choices=["throughput", "cost", "time_to_train"],
                   help="what the recommendation optimizes (default throughput)")
    g.add_argument("--top-k", type=positive_int, default=10, help="plans in the top-k table")
    g.add_argument("--main-gpus", type=positive_int, default=None,
                   help="GPU count drawn in detail (default: the recommended one)")
    g.add_argument("--price-per-gpu-hour", type=nonnegative_float, default=None,
                   help="USD per GPU-hour (default: the cluster preset's price)")
    g.add_argument("--compare-gpus", default=None,
                   help="GPU types to compare at the main count, e.g. a100-80gb,h100,h200")
    g.add_argument("--compare-precision", default=None, metavar="P1,P2",
                   help="precisions to compare at the main count, e.g. bf16,fp8 (fp8:rowwise, "
                        "or --fp8-recipe rowwise, for another recipe): time, memory and cost "
                        "of each")
    g.add_argument("--measurements", nargs="+", default=[], metavar="RESULTS_JSON",
                   help="executor results.json files for the measured-vs-predicted section")
    g.add_argument("--no-sensitivity", action="store_true",
                   help="skip the global-batch and sequence-length what-ifs (faster)")
    g.add_argument("--what-if-global-batch", type=int_list("global batch"), default=None,
                   metavar="B1,B2",
                   help="global batches for the sensitivity section (default ×¼, ×½, ×2, ×4)")
    g.add_argument("--what-if-seq-len", type=int_list("sequence length"), default=None,
                   metavar="S1,S2",
                   help="sequence lengths for the sensitivity section (default ×½, ×2)")
    g.add_argument("-o", "--out", required=True, help="output directory")
    g.add_argument("--force", action="store_true",
                   help="write into a non-empty directory (replaces a previous report's files; "
                        "never deletes other files)")


def _fp8_recipe_to_compared(args) -> None:
    """``--fp8-recipe R`` beside ``--compare-precision`` with a job that is not fp8 itself:
    R is the compared fp8's recipe (``fp8`` → ``fp8:R``), not the bf16 job's, which would
    refuse it."""
    recipe = getattr(args, "fp8_recipe", None)
    if not (recipe and args.compare_precision and args.precision != "fp8"):
        return
    args.compare_precision = ",".join(f"fp8:{recipe}" if p.strip() == "fp8" else p.strip()
                                      for p in args.compare_precision.split(","))
    args.fp8_recipe = None


def main(args) -> int:
    from meshplan.report.build import build_report
    model = load_model(args.model)
    cluster = load_cluster(args.cluster, args.nodes, args.profile, args.profile_override)
    _fp8_recipe_to_compared(args)
    r = build_report(model, cluster, job_from_args(args), gpus=args.gpus, out_dir=args.out,
                     objective=args.objective, top_k=args.top_k, main_gpus=args.main_gpus,
                     price_per_gpu_hour=args.price_per_gpu_hour,
                     compare_gpus=args.compare_gpus, measurements=args.measurements,
                     sensitivity=not args.no_sensitivity,
                     what_if_global_batch=args.what_if_global_batch,
                     what_if_seq_len=args.what_if_seq_len, force=args.force, progress=True,
                     compare_precision=args.compare_precision)
    print(r.recommendation)
    print(f"report: {r.paths['report.html']}")
    return 0
