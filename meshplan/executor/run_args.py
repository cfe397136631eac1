"""The runner's arguments and every check that needs no allocation (no torch at import)."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

from meshplan.errors import ExecutorError
from meshplan.executor.affinity import AFFINITY_MODES
from meshplan.executor.gc_control import DEFAULT_GC_PERIOD_STEPS, GC_MODES
from meshplan.planner.planfile import PlanRecord
from meshplan.spec.choices import FP8_RECIPES

FIRST_STEP_SETTLE_S = 0.25
#: collectives wait this long for a peer before the run fails (NCCL's own default is 600 s;
#: the first step, with torch.compile, can take minutes on large models)
DEFAULT_TIMEOUT_S = 600.0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m meshplan.executor.run",
                                description="Run a meshplan plan and measure it against its "
                                            "prediction (launch with torchrun).")
    p.add_argument("--plan", required=True, help="plan file (meshplan plan ... -o plan.json)")
    p.add_argument("--out", default="results.json", help="results file written by rank 0")
    p.add_argument("--steps", type=int, default=30, help="measured optimizer steps [30]")
    p.add_argument("--warmup", type=int, default=5, help="steps run before measuring [5]")
    p.add_argument("--data", default=None,
                   help="flat token file (uint16/uint32) read with memmap; synthetic if absent")
    p.add_argument("--data-dtype", default="uint16", choices=("uint16", "uint32"))
    p.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--force", action="store_true", help="replace an existing results file")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile each transformer block; also on when the plan's "
                        "layout has compile = true (off by default)")
    p.add_argument("--candidate", type=int, default=None, metavar="I",
                   help="run the plan file's candidates[I] (its ranked alternatives) instead "
                        "of its best layout")
    p.add_argument("--allow-gpu-mismatch", action="store_true",
                   help="run even if the GPUs are not the plan's GPU type")
    p.add_argument("--profile", default=None, metavar="DIR",
                   help="record a torch.profiler trace of 3 steps after warm-up into DIR")
    p.add_argument("--cpu-affinity", default="none", choices=AFFINITY_MODES,
                   help="split: pin each local rank to its own block of physical cores "
                        "(meshplan/executor/affinity.py) [none]")
    p.add_argument("--gc", default="manual", choices=GC_MODES,
                   help="manual: after warm-up, freeze the survivors and collect Python "
                        "garbage only every --gc-period steps, inside the timed step, as "
                        "torchtitan does; auto: CPython's own collector. Either way "
                        "results.json counts the collections in the timed steps "
                        "(meshplan/executor/gc_control.py) [manual]")
    p.add_argument("--gc-period", type=int, default=DEFAULT_GC_PERIOD_STEPS,
                   help=f"steps between collections with --gc manual [{DEFAULT_GC_PERIOD_STEPS}]")
    p.add_argument("--first-step-settle-s", type=float, default=FIRST_STEP_SETTLE_S,
                   help="after the first step, wait for the GPU and then this long, so that "
                        "DDP's first-step bucket is freed on every rank when the second step "
                        "rebuilds the buckets (see settle_after_first_step); 0 turns it off "
                        f"[{FIRST_STEP_SETTLE_S}]")
    p.add_argument("--precision", default=None, choices=("bf16", "fp32", "fp8"),
                   help="run in this precision instead of the plan's Job.precision; the plan's "
                        "prediction (for its own precision) is then left out of the results "
                        "(fp8: docs/fp8.md)")
    p.add_argument("--fp8-recipe", default=None, choices=FP8_RECIPES,
                   help="with fp8: how fp8 operands are scaled [the plan's, else tensorwise]")
    p.add_argument("--block-marks", action="store_true",
                   help="diagnostic: also time each transformer block's forward and backward "
                        "on the device (results' phase_median_ms gains 'block i forward' / "
                        "'block i backward'; pp = 1 layouts only; "
                        "meshplan/executor/block_marks.py)")
    p.add_argument("--phase-memory", action="store_true",
                   help="diagnostic (GPU): also the allocator's peak in each timed phase — "
                        "results' phase_median_ms entries gain peak_allocated_bytes, which "
                        "shows where the step's peak memory falls (forward, backward, "
                        "optimizer; each block with --block-marks)")
    g = p.add_argument_group("checkpoints (meshplan/executor/checkpoint.py)")
    g.add_argument("--checkpoint-dir", default=None, metavar="DIR",
                   help="directory of the checkpoints (on a file system every node sees)")
    g.add_argument("--checkpoint-every", type=int, default=0, metavar="N",
                   help="save after every N optimizer steps and after the last one; 0: never "
                        "[0; with --resume, the interval the checkpoint was saved with]")
    g.add_argument("--checkpoint-keep", type=int, default=0, metavar="K",
                   help="keep the K newest checkpoints, delete older ones; 0: keep all [0; "
                        "with --resume, the checkpoint's own]")
    g.add_argument("--resume", action="store_true",
                   help="continue from the newest committed checkpoint in --checkpoint-dir "
                        "(any layout: the state is resharded on load)")
    p.add_argument("--timeout-s", type=float, default=DEFAULT_TIMEOUT_S,
                   help="how long a collective waits for a rank that died or hangs before the "
                        f"run fails (meshplan/executor/failures.py) [{DEFAULT_TIMEOUT_S:g}]")
    return p


def gpu_family(name: str) -> str | None:
    """'H100' from 'H100-SXM5-80GB' or 'NVIDIA H100 80GB HBM3' (letter + 2-3 digits)."""
    m = re.search(r"\b([A-Z]{1,2}\d{2,3})", name.upper())
    return m.group(1) if m else None


def effective_plan(plan: PlanRecord, args) -> PlanRecord:
    """The plan as run: ``--candidate I`` picks an alternative, ``--compile`` sets
    ``Layout.compile``, ``--precision`` / ``--fp8-recipe`` set the job's (the results file
    then records what ran)."""
    from meshplan.spec import Layout
    if args.candidate is not None:
        n = len(plan.candidates)
        if not 0 <= args.candidate < n:
            raise ExecutorError(f"--candidate {args.candidate}: the plan file has {n} "
                                f"candidate{'s' if n != 1 else ''} (valid: 0..{n - 1})"
                                if n else f"--candidate {args.candidate}: the plan file lists "
                                          f"no candidates")
        c = plan.candidates[args.candidate]
        try:
            layout = Layout.from_dict(c["layout"])
        except Exception as exc:
            raise ExecutorError(f"candidates[{args.candidate}].layout is invalid: {exc}") \
                from None
        plan = dataclasses.replace(plan, layout=layout, prediction=dict(c.get("prediction")
                                                                        or {}))
    if args.compile and not plan.layout.compile:
        plan = dataclasses.replace(plan, layout=plan.layout.replace(compile=True))
    return override_precision(plan, args.precision, args.fp8_recipe)


def override_precision(plan: PlanRecord, precision: str | None,
                       fp8_recipe: str | None) -> PlanRecord:
    """The plan with ``--precision`` / ``--fp8-recipe`` applied; a prediction made for
    another precision or recipe is dropped rather than compared with this run."""
    job = plan.job
    precision = precision or job.precision
    if fp8_recipe is not None and precision != "fp8":
        raise ExecutorError(f"--fp8-recipe {fp8_recipe} needs --precision fp8 (the plan's "
                            f"precision is {job.precision!r})")
    new = job.with_precision(precision, fp8_recipe)
    if new == job:
        return plan
    return dataclasses.replace(plan, job=new, prediction={})


def check_checkpoint_args(plan: PlanRecord, args) -> None:
    if args.checkpoint_every < 0 or args.checkpoint_keep < 0:
        raise ExecutorError(f"--checkpoint-every and --checkpoint-keep must be >= 0, got "
                            f"{args.checkpoint_every}, {args.checkpoint_keep}")
    if (args.checkpoint_every or args.resume) and not args.checkpoint_dir:
        raise ExecutorError("--checkpoint-every and --resume need --checkpoint-dir DIR")
    if args.checkpoint_dir and not (args.checkpoint_every or args.resume):
        raise ExecutorError("--checkpoint-dir without --checkpoint-every N or --resume does "
                            "nothing; add --checkpoint-every N")
    d = Path(args.checkpoint_dir) if args.checkpoint_dir else None
    if d is not None:
        from meshplan.executor.checkpoint import require_support
        require_support()
    if d is not None and d.exists() and not d.is_dir():
        raise ExecutorError(f"--checkpoint-dir {str(d)!r} exists and is not a directory")
    if not args.resume:
        return
    from meshplan.executor.checkpoint import check_resumable, latest_checkpoint, read_marker
    found = latest_checkpoint(d)
    if found is None:
        raise ExecutorError(f"--resume: no committed checkpoint in {str(d)!r} (a committed "
                            f"one is a step-NNNNNNNN directory holding meshplan.json)")
    marker = read_marker(found)
    check_resumable(marker, plan.model, plan.job, args.seed)
    # a resumed run keeps saving as the run it continues did, unless told otherwise
    saved = marker.get("checkpoint") or {}
    if not args.checkpoint_every and isinstance(saved.get("every"), int):
        args.checkpoint_every = saved["every"]
    if not args.checkpoint_keep and isinstance(saved.get("keep"), int):
        args.checkpoint_keep = saved["keep"]
    total = args.warmup + args.steps
    if marker.get("step", 0) >= total:
        raise ExecutorError(f"--resume: {found.name} has {marker.get('step')} steps done and "
                            f"this run ends after --warmup + --steps = {total}; raise --steps")
    args.resume_path = str(found)


def preflight(plan: PlanRecord, args, world: int, local_world: int) -> str:
    """Every check that needs no allocation; returns the device type. Raises ExecutorError."""
    import torch

    from meshplan.executor.parallelize import check_layout_runnable
    layout = plan.layout
    if world != layout.num_gpus:
        raise ExecutorError(
            f"the plan's layout {layout.short()} needs dp·pp·tp = {layout.num_gpus} processes, "
            f"but WORLD_SIZE is {world}; launch with torchrun --nproc-per-node/--nnodes giving "
            f"{layout.num_gpus} processes in total")
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        if not torch.cuda.is_available():
            raise ExecutorError("--device cuda was asked for, but torch sees no CUDA device "
                                "(use --device cpu for a functional run)")
        if local_world > torch.cuda.device_count():
            raise ExecutorError(f"{local_world} processes on this node but only "
                                f"{torch.cuda.device_count()} GPUs are visible")
        have = torch.cuda.get_device_name(0)
        want = plan.cluster.gpu.name
        if (gpu_family(have) != gpu_family(want)) and not args.allow_gpu_mismatch:
            raise ExecutorError(f"the plan is for {want!r} GPUs but this node has {have!r}; "
                                f"re-plan for this GPU or pass --allow-gpu-mismatch")
    if args.steps < 1 or args.warmup < 0:
        raise ExecutorError(f"--steps must be >= 1 and --warmup >= 0, got {args.steps}, "
                            f"{args.warmup}")
    if args.gc_period < 1:
        raise ExecutorError(f"--gc-period must be >= 1 step, got {args.gc_period}")
    if args.timeout_s <= 0:
        raise ExecutorError(f"--timeout-s must be > 0 seconds, got {args.timeout_s}")
    if args.block_marks:
        from meshplan.executor.block_marks import check_block_marks
        check_block_marks(layout)
    if not 0 <= args.first_step_settle_s <= 60:
        raise ExecutorError(f"--first-step-settle-s must be between 0 and 60 s, got "
                            f"{args.first_step_settle_s}")
    check_layout_runnable(plan.model, plan.job, layout)
    check_checkpoint_args(plan, args)
    out = Path(args.out)
    if out.exists() and not args.force:
        raise ExecutorError(f"results file {str(out)!r} exists; refusing to overwrite it "
                            f"(pass --force to replace it)")
    return device


__all__ = ["build_parser", "preflight", "effective_plan", "override_precision", "gpu_family",
           "FIRST_STEP_SETTLE_S", "DEFAULT_TIMEOUT_S"]
