"""``meshplan validate``: run layouts with the executor and compare with the predictions.

    meshplan validate --model gpt-1.7b --cluster dgx-h100 --profile h100.toml \\
        --global-batch 16 --seq-len 2048 --layouts 16 --out docs/benchmarks
    meshplan validate ... --layout-list layouts.json --out runs/   # a given list instead

Writes accuracy.json, accuracy.md and accuracy.png in --out (see docs/calibrate.md).
"""

from __future__ import annotations

import platform
import socket
import sys
from datetime import datetime, timezone
from pathlib import Path

from meshplan.commands.common import (add_job_args, add_model_cluster_args, job_from_args,
                                      load_cluster, load_model, positive_float, positive_int)
from meshplan.errors import ConfigError
from meshplan.planner.planfile import check_creatable


def add_arguments(p) -> None:
    add_model_cluster_args(p)
    # the executor runs plain PyTorch: predict its conventions unless told otherwise
    add_job_args(p, global_batch=16, seq_len=2048, runtime="torch")
    g = p.add_argument_group("validation")
    g.add_argument("--out", required=True, help="directory for plans, logs and accuracy.* "
                                                "(new or empty, unless --force)")
    g.add_argument("--force", action="store_true",
                   help="write into a --out that already holds files (an earlier validation's "
                        "are replaced)")
    g.add_argument("--layouts", type=positive_int, default=16,
                   help="how many of the valid layouts to run, spread over the predicted range")
    g.add_argument("--layout-list", default=None,
                   help="JSON list of layouts (Layout fields, optional 'name') to run instead")
    g.add_argument("--nproc", type=positive_int, default=None,
                   help="local GPUs (or CPU ranks) to use (default: all GPUs; 2 on CPU)")
    g.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    g.add_argument("--steps", type=positive_int, default=10)
    g.add_argument("--warmup", type=positive_int, default=3)
    g.add_argument("--timeout", type=positive_float, default=180.0, help="seconds per layout")
    g.add_argument("--budget", type=positive_float, default=None,
                   help="seconds for all layouts; the rest are reported as skipped")
    g.add_argument("--repeats", type=positive_int, default=1,
                   help="runs per layout, in rounds (every layout once, then again); each "
                        "layout is measured by the median of its runs, accuracy.md shows the range "
                        "(host-bound layouts varied up to 37 %% between runs) [1]")


def _device_and_nproc(device: str, nproc: int | None) -> tuple[str, int, str, str]:
    try:
        import torch
    except ImportError:
        raise ConfigError("meshplan validate runs the executor, which needs torch; install "
                          "meshplan[executor]") from None
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("--device cuda: torch sees no CUDA device; use --device cpu")
        count = torch.cuda.device_count()
        if nproc is not None and nproc > count:
            raise ConfigError(f"--nproc {nproc} > {count} visible GPUs")
        return device, nproc or count, torch.cuda.get_device_name(0), torch.__version__
    return device, nproc or 2, platform.machine(), torch.__version__


def main(args) -> int:
    from meshplan.calibrate.validate import (ValidateOptions, enumerate_layouts,
                                             layouts_from_json, pick_spread, run_layouts,
                                             write_accuracy)
    out = Path(args.out)   # checked before minutes of runs, not after them
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {str(out)!r} exists and is not a directory")
    check_creatable(out, f"--out {str(out)!r}")
    if out.is_dir() and any(out.iterdir()) and not args.force:
        raise ConfigError(f"--out {str(out)!r} already holds files; validate writes its plans, "
                          f"logs and accuracy.* there, over any of the same name: give a new or "
                          f"empty directory, or pass --force")
    model = load_model(args.model)
    cluster = load_cluster(args.cluster, args.nodes, args.profile, args.profile_override)
    job = job_from_args(args)
    device, nproc, dev_name, torch_version = _device_and_nproc(args.device, args.nproc)
    if nproc > cluster.num_gpus:
        raise ConfigError(f"--nproc {nproc} exceeds the {cluster.num_gpus} GPUs of cluster "
                          f"{cluster.name!r}; pass --nodes or a smaller --nproc")
    names = None
    if args.layout_list:
        layouts, names = layouts_from_json(Path(args.layout_list))
    else:
        valid = enumerate_layouts(model, cluster, job, nproc)
        if not valid:
            raise ConfigError(f"no layout of {model.name!r} on {nproc} ranks fits and is valid "
                              f"for global batch {job.global_batch} × seq {job.seq_len}")
        layouts = pick_spread(model, cluster, job, valid, args.layouts)
        print(f"meshplan validate: {len(valid)} valid layouts on {nproc} ranks; running "
              f"{len(layouts)}", file=sys.stderr)
    opts = ValidateOptions(out_dir=out, nproc=nproc, device=device, steps=args.steps,
                           warmup=args.warmup, timeout_s=args.timeout, budget_s=args.budget,
                           repeats=args.repeats)
    records = run_layouts(model, cluster, job, layouts, opts, names=names)
    meta = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": socket.gethostname(), "device": device, "gpu_name": dev_name,
            "torch": torch_version, "cluster": cluster.name, "profile": args.profile or "",
            "gpu_profile": cluster.gpu.provenance, "job": job.to_dict(),
            "command": " ".join(["meshplan", *sys.argv[1:]])}
    paths = write_accuracy(out, records, meta)
    from meshplan.calibrate.validate import bound_split_text, summarize
    s = summarize(records)
    split = bound_split_text(s)
    print(f"meshplan validate: {s.get('ok', 0)}/{s['layouts']} layouts ran; step-time mean abs "
          f"error {s.get('step_time_mean_abs_error_pct', float('nan')):.2f}%, max "
          f"{s.get('step_time_max_abs_error_pct', float('nan')):.2f}%"
          f"{f' ({split})' if split else ''}; wrote "
          f"{', '.join(str(p) for p in paths.values())}")
    return 0 if s.get("ok") else 1
