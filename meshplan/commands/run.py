"""``meshplan run plan.json``: run a plan on this node's GPUs (or CPU) via torchrun.

    meshplan run plan.json --steps 30 --warmup 5 --out results.json
    meshplan run plan.json --device cpu --steps 3 --warmup 1     # CPU + gloo, fp32

Multi-node runs use the launch scripts the planner writes (``Plan.write_launch_script``).
Prints predicted | measured | error for step time, tokens/s, MFU and peak memory, and writes
``results.json`` (never over an existing one unless ``--force``).
"""

from __future__ import annotations

from meshplan.commands.common import positive_int
from meshplan.executor.affinity import AFFINITY_MODES
from meshplan.executor.gc_control import GC_MODES


def add_arguments(p) -> None:
    p.add_argument("plan", help="plan file written by `meshplan plan -o` or Plan.to_json")
    p.add_argument("--steps", type=positive_int, default=30, help="measured steps")
    p.add_argument("--warmup", type=positive_int, default=5, help="steps before measuring")
    p.add_argument("--out", default="results.json", help="results file (JSON)")
    p.add_argument("--force", action="store_true", help="replace an existing results file")
    p.add_argument("--nproc", type=positive_int, default=None,
                   help="processes to start (default: the plan's dp·pp·tp)")
    p.add_argument("--device", choices=["cuda", "cpu"], default=None,
                   help="default: cuda when available")
    p.add_argument("--data", default=None, help="flat uint16/uint32 token file (memmap)")
    p.add_argument("--compile", action="store_true", help="torch.compile each block")
    p.add_argument("--cpu-affinity", choices=AFFINITY_MODES, default="none",
                   help="split: pin each rank to its own block of physical CPU cores "
                        "(meant for layouts whose CPU dispatch sets the pace; it did not "
                        "steady them on a 4 x H100 host, docs/benchmarks/accuracy.md "
                        "round 10) [none]")
    p.add_argument("--gc", choices=GC_MODES, default="manual",
                   help="manual: Python's garbage collector off during the timed steps, a "
                        "collection every 50 steps (as torchtitan); auto: CPython's own "
                        "[manual]")


def main(args) -> int:
    try:
        from meshplan.executor.launch import run_local
    except ImportError as exc:  # torch missing
        from meshplan.errors import ExecutorError
        raise ExecutorError(f"meshplan run needs PyTorch: pip install 'meshplan[executor]' "
                            f"({exc})") from None
    extra: list[str] = []
    if args.device:
        extra += ["--device", args.device]
    if args.data:
        extra += ["--data", args.data]
    if args.compile:
        extra.append("--compile")
    if args.cpu_affinity != "none":
        extra += ["--cpu-affinity", args.cpu_affinity]
    if args.gc != "manual":
        extra += ["--gc", args.gc]
    return run_local(args.plan, nproc=args.nproc, steps=args.steps, warmup=args.warmup,
                     out=args.out, force=args.force, extra_args=extra)
