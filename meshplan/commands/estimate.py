"""``meshplan estimate``: memory and time breakdown of one layout.

    meshplan estimate --model gpt3-175b --cluster dgx-a100-80gb --nodes 128 --dp 8 --pp 16 \\
        --tp 8 --micro-batch 1 --global-batch 1536 --seq-len 2048 \\
        --schedule interleaved-1f1b --vpp 2 --recompute full
"""

from __future__ import annotations

import json
import warnings

from meshplan.commands.common import (add_job_args, add_layout_args, add_model_cluster_args,
                                      job_from_args, layout_from_args, model_cluster_from_args)
from meshplan.commands.format import format_estimate
from meshplan.errors import ConfigError, MeshplanWarning


def add_arguments(p) -> None:
    add_model_cluster_args(p)
    add_job_args(p)
    add_layout_args(p)
    p.add_argument("--json", action="store_true", help="print the Estimate as JSON")


def main(args) -> int:
    from meshplan.costmodel import estimate
    model, cluster = model_cluster_from_args(args)
    job, layout = job_from_args(args), layout_from_args(args)
    if args.nodes is None and layout.num_gpus > cluster.num_gpus:
        raise ConfigError(f"the layout uses dp·pp·tp·cp = {layout.num_gpus} GPUs; cluster "
                          f"{cluster.name!r} has {cluster.num_gpus} (--nodes not given: "
                          f"{cluster.shape}); pass --nodes "
                          f"{-(-layout.num_gpus // cluster.gpus_per_node)}")
    if job.recompute_modules and layout.recompute != "selective":
        warnings.warn(f"--recompute-modules applies to --recompute selective only; this "
                      f"layout's recompute is {layout.recompute!r}, so it is not used",
                      MeshplanWarning, stacklevel=2)
    if layout.schedule == "interleaved-1f1b" and layout.vpp == 1 and layout.pp > 1:
        warnings.warn("--schedule interleaved-1f1b with --vpp 1 is plain 1F1B (one model chunk "
                      "a pipeline rank); pass --vpp 2 or more to interleave",
                      MeshplanWarning, stacklevel=2)
    est = estimate(model, cluster, job, layout)
    if args.json:
        print(json.dumps(est.to_dict(), indent=2))
        return 0
    print(f"{model.name} ({model.num_params() / 1e9:.2f}B params) on {cluster.name} "
          f"({cluster.nodes}×{cluster.gpus_per_node} {cluster.gpu.name}); "
          f"batch {job.global_batch}×{job.seq_len}; {layout.short()}"
          + (f" (selective re-runs {'+'.join(job.selective_modules)})"
             if layout.recompute == "selective" and job.recompute_modules else ""))
    print(format_estimate(est))
    return 0
