"""``meshplan run plan.json``: run a plan on this node's GPUs (or CPU) via torchrun.

    meshplan run plan.json --steps 30 --warmup 5 --out results.json
    meshplan run plan.json --device cpu --steps 3 --warmup 1     # CPU + gloo, fp32
    meshplan run plan.json --checkpoint-dir ckpt --checkpoint-every 100 [--resume]
    meshplan run plan.json --launch-dir launch --launcher slurm  # scripts for several nodes

The plan is checked against this machine first (one node's GPUs, visible, of the plan's
type); a multi-node plan is refused with a pointer to ``--launch-dir``. Prints predicted |
measured | error for step time, tokens/s, MFU and peak memory, and writes ``results.json``
(never over an existing one unless ``--force``).
"""

from __future__ import annotations

from meshplan.commands.common import positive_float, positive_int
from meshplan.executor.affinity import AFFINITY_MODES
from meshplan.executor.gc_control import GC_MODES
from meshplan.spec.choices import FP8_RECIPES


def add_arguments(p) -> None:
    p.add_argument("plan", help="plan file written by `meshplan plan -o` or Plan.to_json")
    p.add_argument("--steps", type=positive_int, default=30, help="measured steps")
    p.add_argument("--warmup", type=positive_int, default=5, help="steps before measuring")
    p.add_argument("--out", default="results.json", help="results file (JSON)")
    p.add_argument("--force", action="store_true", help="replace an existing results file")
    p.add_argument("--nproc", type=positive_int, default=None,
                   help="processes to start (default: the plan's GPUs, dp·pp·tp·cp)")
    p.add_argument("--device", choices=["cuda", "cpu"], default=None,
                   help="default: cuda when available")
    p.add_argument("--allow-gpu-mismatch", action="store_true",
                   help="run even if this node's GPUs are not the plan's type")
    p.add_argument("--data", default=None, help="flat uint16/uint32 token file (memmap)")
    p.add_argument("--data-dtype", choices=["uint16", "uint32"], default=None,
                   help="token type of --data (uint32 for vocabularies over 65,536) [uint16]")
    p.add_argument("--seed", type=int, default=None, help="seed of weights and data [0]")
    p.add_argument("--lr", type=positive_float, default=None, help="AdamW learning rate [3e-4]")
    p.add_argument("--precision", choices=["bf16", "fp32", "fp8"], default=None,
                   help="run in this precision instead of the plan's (docs/fp8.md)")
    p.add_argument("--fp8-recipe", choices=list(FP8_RECIPES), default=None,
                   help="with fp8: how fp8 operands are scaled [the plan's, else tensorwise]")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile each block (also on where the plan's layout says so)")
    p.add_argument("--candidate", type=int, default=None, metavar="I",
                   help="run the plan file's candidates[I] instead of its best layout")
    p.add_argument("--cpu-affinity", choices=AFFINITY_MODES, default="none",
                   help="split: pin each rank to its own block of physical CPU cores "
                        "(meant for layouts whose CPU dispatch sets the pace; it did not "
                        "steady them on a 4 x H100 host, docs/benchmarks/accuracy.md "
                        "round 10) [none]")
    p.add_argument("--gc", choices=GC_MODES, default="manual",
                   help="manual: Python's garbage collector off during the timed steps, a "
                        "collection every 50 steps (as torchtitan); auto: CPython's own "
                        "[manual]")
    p.add_argument("--timeout-s", type=positive_float, default=None,
                   help="seconds a collective waits for a dead or hung rank [600]")
    g = p.add_argument_group("checkpoints")
    g.add_argument("--checkpoint-dir", default=None, metavar="DIR")
    g.add_argument("--checkpoint-every", type=positive_int, default=None, metavar="N",
                   help="save after every N steps (and the last) [with --resume: the "
                        "interval the checkpoint was saved with]")
    g.add_argument("--checkpoint-keep", type=positive_int, default=None, metavar="K",
                   help="keep the K newest checkpoints [all]")
    g.add_argument("--resume", action="store_true",
                   help="continue from the newest checkpoint in --checkpoint-dir")
    g = p.add_argument_group("several nodes")
    g.add_argument("--launch-dir", default=None, metavar="DIR",
                   help="do not run: write the plan and a launch script for every node "
                        "into DIR")
    g.add_argument("--launcher", choices=["torchrun", "slurm"], default="torchrun")


def main(args) -> int:
    if args.launch_dir:
        from meshplan.planner.launch import write_launch_script
        from meshplan.executor.run_results import warn_if_too_big
        from meshplan.planner.planfile import load_plan_file
        script = write_launch_script(args.plan, args.launch_dir, args.launcher,
                                     overwrite=args.force)
        warn_if_too_big(load_plan_file(args.plan))
        print(f"wrote {script} and {script.parent / 'plan.json'}")
        return 0
    try:
        from meshplan.executor.launch import run_local
    except ImportError as exc:  # torch missing
        from meshplan.errors import ExecutorError
        raise ExecutorError(f"meshplan run needs PyTorch: pip install 'meshplan[executor]' "
                            f"({exc})") from None
    extra: list[str] = []
    for flag, value in (("--data", args.data), ("--data-dtype", args.data_dtype),
                        ("--seed", args.seed), ("--lr", args.lr),
                        ("--precision", args.precision), ("--fp8-recipe", args.fp8_recipe),
                        ("--candidate", args.candidate),
                        ("--timeout-s", args.timeout_s), ("--checkpoint-dir", args.checkpoint_dir),
                        ("--checkpoint-every", args.checkpoint_every),
                        ("--checkpoint-keep", args.checkpoint_keep)):
        if value is not None:
            extra += [flag, str(value)]
    for flag, on in (("--compile", args.compile), ("--resume", args.resume)):
        if on:
            extra.append(flag)
    if args.cpu_affinity != "none":
        extra += ["--cpu-affinity", args.cpu_affinity]
    if args.gc != "manual":
        extra += ["--gc", args.gc]
    return run_local(args.plan, nproc=args.nproc, steps=args.steps, warmup=args.warmup,
                     out=args.out, force=args.force, device=args.device,
                     allow_gpu_mismatch=args.allow_gpu_mismatch, extra_args=extra)
