"""``meshplan calibrate``: measure this machine and write a profile for ``--profile``.

    meshplan calibrate --device cpu --quick --out cpu.toml          # one process, CPU
    meshplan calibrate --nproc 4 --out h100.toml                    # spawns torchrun on 4 GPUs
    meshplan calibrate --nproc 4 --model m.json --time-budget 540 --out h100.toml  # <= 9 min
    meshplan calibrate --nproc 4 --model m.json --compile-rows --out h100.toml  # + compiled rows
    torchrun --nproc-per-node 4 -m meshplan.cli calibrate --out h100.toml   # the same, by hand

See docs/calibrate.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from meshplan.commands.common import (load_model, non_negative_float, positive_float,
                                      positive_int)


DEFAULT_MAX_TP = 8


def add_arguments(p) -> None:
    p.add_argument("--out", default="profile.toml", help="profile TOML to write (atomically)")
    p.add_argument("--force", action="store_true",
                   help="replace an existing --out file (refused by default, before measuring)")
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    p.add_argument("--quick", action="store_true", help="fewer, smaller sizes (smoke test)")
    p.add_argument("--model", action="append", default=None,
                   help="a model (preset, Hugging Face config.json or meshplan ModelSpec JSON);"
                        " repeatable. Times the GEMM/attention shapes of the models instead "
                        "of the representative default set, and enables the layer tables: the"
                        " executor's own transformer layers and embedding/output ends timed "
                        "per tp, sequence parallelism, recompute, ZeRO-2/3 dp and micro-batch")
    p.add_argument("--seq-len", type=positive_int, default=None,
                   help="sequence length for --model shapes and layer tables (default: each "
                        "model's max)")
    p.add_argument("--base-gpu", default=None,
                   help="built-in GPU profile the measurement extends (default: from the "
                        "device name)")
    p.add_argument("--for-plan", action="append", default=None, metavar="PLAN",
                   help="a plan file (`meshplan plan -o plan.json`); repeatable. Times what "
                        "prices it from its own model's rows: its model at its sequence "
                        "length, micro-batches, compiled recompute modes, fp8 recipe, tp and "
                        "ep (each option you also give wins; docs/calibrate.md)")
    p.add_argument("--max-tp", type=positive_int, default=None,
                   help="largest tensor-parallel degree whose shard shapes are timed "
                        "(default 8, or the plans' largest tp with --for-plan)")
    p.add_argument("--sp-only", action="store_true",
                   help="time tensor-parallel layer rows (tp > 1) with sequence parallelism "
                        "only, where the sequence splits over tp: for plans that run tp with "
                        "SP, as Megatron-style training does; layouts with tp but no SP are "
                        "then priced from the curves. Saves about a third of the layer rows "
                        "at --max-tp 2")
    p.add_argument("--ep", type=_sizes, default=None, metavar="N,N,...",
                   help="expert-parallel degrees an MoE model's layer rows are timed at "
                        "(default: every degree > 1 that divides the ranks and the experts); "
                        "name the ones your plans run, e.g. --ep 4,8 on 8 GPUs")
    p.add_argument("--micro-batches", type=_sizes, default=None, metavar="N,N,...",
                   help="micro-batch sizes the layer tables are timed at (default 1,2,4); "
                        "choose them around the micro-batches you will plan with")
    p.add_argument("--split-timing", default="synchronized", choices=["synchronized", "queued"],
                   help="zero-bubble's split backward: synchronized timings (validated, "
                        "default) or queued like the other rows, GPU-busy and CPU dispatch "
                        "apart (experimental, docs/calibrate.md)")
    p.add_argument("--rounds", type=positive_int, default=None, metavar="N",
                   help="measure the layer tables at most N times (rows: the median over "
                        "rounds; compiled rows are timed in the first round only; default 3 "
                        "on GPU, 1 on CPU or with --quick)")
    p.add_argument("--sustained-s", type=non_negative_float, default=None, metavar="SECONDS",
                   help="seconds each built layer module also runs back to back (first round) "
                        "to measure how much slower its passes are at the sustained, "
                        "power-capped clock than in the timed bursts (rows' sustained_ratio; "
                        "default 2.5 on a GPU, 0 = off; docs/calibrate.md)")
    p.add_argument("--time-budget", type=positive_float, default=None, metavar="SECONDS",
                   help="wall-clock budget for the whole calibration, from its launch "
                        "(with --nproc: torchrun's start-up included): layer rows and "
                        "rounds run only while projected to end, with the benchmarks after "
                        "them, within SECONDS "
                        "(for job time limits). Rows run in priority order — plain, ends, "
                        "compiled, expert-parallel, fp8, FSDP2, FSDP2 compiled — and the "
                        "calibration prints "
                        "the kinds a budget left untimed and what estimates do without them "
                        "(docs/calibrate.md)")
    p.add_argument("--compile-rows", nargs="?", const="none", default=None, type=_modes,
                   metavar="MODES",
                   help="also time the plain layer rows with every block torch.compile'd "
                        "(what Layout.compile runs; the cost model prices compiled layouts "
                        "from them and the planner searches compile only with them), and a "
                        "dense model's FSDP2 rows over the widest dp, for these recompute "
                        "modes (comma-separated; default: none, i.e. no recomputation). "
                        "First layer round only; each row compiles once (seconds to tens "
                        "of seconds), so give --time-budget room for it")
    p.add_argument("--fp8-rows", nargs="?", const="tensorwise", default=None, metavar="RECIPE",
                   help="also time the plain layer rows with the executor's fp8 linears of "
                        "RECIPE (default tensorwise): compiled at the --compile-rows modes "
                        "where given, else eager at recompute none. The cost model prices fp8 "
                        "layouts from them instead of composing fp8 on the bf16 rows "
                        "(docs/fp8.md)")
    p.add_argument("--no-fp8", action="store_true",
                   help="skip the fp8 GEMM and cast benchmarks (run by default on GPUs of "
                        "compute capability >= 8.9)")
    p.add_argument("--layer-grid", action="store_true",
                   help="also time the layer tables of four stand-in shapes (GPT and Llama "
                        "blocks, hidden 1792 and 3072): a model planned without being timed "
                        "borrows the nearest one's rows instead of the analytical layer "
                        "(docs/calibrate.md; about a --model's time each)")
    p.add_argument("--queued-microbench", action="store_true",
                   help="time the GEMM, attention and memory-bound benchmarks GPU-alone "
                        "(queued behind a spin kernel) with the executor's LayerNorm and RoPE "
                        "as it runs them; the cost model then adds the eager layer's gradient "
                        "work these curves lack (experimental: docs/calibrate.md)")
    p.add_argument("--nproc", type=positive_int, default=None,
                   help="spawn torchrun with this many local processes (one per GPU)")
    p.add_argument("--no-progress", action="store_true", help="no progress output on stderr")


def main(args) -> int:
    from meshplan.calibrate.run import CalibrateOptions, calibrate
    from meshplan.planner.planfile import check_output_file
    # before minutes of measuring, not when the profile is written (each torchrun rank
    # checks too, before any of them writes)
    check_output_file(args.out, overwrite=args.force, what="profile", flag="--force",
                      example_name="profile.toml")
    models = tuple(load_model(m) for m in args.model or ())
    models += tuple(m for m in _apply_plans(args) if m not in models)
    # bad options fail here, once, before torchrun starts its children
    options = CalibrateOptions(out=Path(args.out), device=args.device, quick=args.quick,
                               models=models, seq_len=args.seq_len, base_gpu=args.base_gpu,
                               max_tp=args.max_tp or DEFAULT_MAX_TP,
                               micro_batches=args.micro_batches,
                               sp_only=args.sp_only, ep_degrees=args.ep,
                               split_timing=args.split_timing,
                               show_progress=not args.no_progress,
                               layer_rounds=args.rounds, time_budget_s=args.time_budget,
                               fp8=not args.no_fp8, compile_rows=args.compile_rows or (),
                               fp8_rows=args.fp8_rows or "", layer_grid=args.layer_grid,
                               sustained_s=args.sustained_s,
                               queued_microbench=args.queued_microbench)
    if args.ep:
        from meshplan.calibrate.layer_grid import check_expert_degrees
        check_expert_degrees(models, int(os.environ.get("WORLD_SIZE", args.nproc or 1)),
                             args.ep)
    if args.nproc and "WORLD_SIZE" not in os.environ:
        return _spawn(args)
    if args.device != "cpu":   # as the executor's ranks; torch reads it when CUDA starts
        from meshplan.executor.child_env import allocator_setting
        allocator_setting(os.environ)
    calibrate(options)
    return 0


def _apply_plans(args) -> tuple:
    """Fill the options ``--for-plan`` derives (:mod:`meshplan.calibrate.for_plan`) where
    the user gave none, say what they are once, and return the plans' models."""
    if not args.for_plan:
        return ()
    from meshplan.calibrate.for_plan import calibration_for_plans, load_plans
    records, names = load_plans(args.for_plan)
    cal = calibration_for_plans(records, names)
    if args.seq_len is None:
        args.seq_len = cal.seq_len
    if args.micro_batches is None:
        args.micro_batches = cal.micro_batches
    if args.compile_rows is None and cal.compile_rows:
        args.compile_rows = cal.compile_rows
    if args.fp8_rows is None and cal.fp8_rows:
        args.fp8_rows = cal.fp8_rows
    if args.max_tp is None:
        args.max_tp = cal.max_tp
    args.sp_only = args.sp_only or cal.sp_only
    if args.ep is None:
        args.ep = cal.ep_degrees
    if os.environ.get("RANK", "0") == "0":
        print(f"meshplan calibrate: for {', '.join(names)}: {cal.options()}", file=sys.stderr)
        for note in cal.notes:
            print(f"meshplan calibrate: note: {note}", file=sys.stderr)
    return cal.models


def child_argv(args) -> list[str]:
    """The ``calibrate`` arguments each torchrun child gets: the parsed options without
    ``--nproc`` (rebuilt from ``args``, so it works when called as ``cli.main(argv)``)."""
    out = ["calibrate", "--out", str(args.out), "--device", args.device]
    if args.max_tp:
        out += ["--max-tp", str(args.max_tp)]
    for m in args.model or ():
        out += ["--model", m]
    for plan in args.for_plan or ():
        out += ["--for-plan", str(plan)]
    if args.seq_len:
        out += ["--seq-len", str(args.seq_len)]
    if args.base_gpu:
        out += ["--base-gpu", args.base_gpu]
    if args.micro_batches:
        out += ["--micro-batches", ",".join(map(str, args.micro_batches))]
    if args.sp_only:
        out += ["--sp-only"]
    if args.ep:
        out += ["--ep", ",".join(map(str, args.ep))]
    if args.split_timing != "synchronized":
        out += ["--split-timing", args.split_timing]
    if args.rounds:
        out += ["--rounds", str(args.rounds)]
    if args.time_budget:
        out += ["--time-budget", repr(args.time_budget)]
    if args.sustained_s is not None:
        out += ["--sustained-s", repr(args.sustained_s)]
    if args.compile_rows:
        out += ["--compile-rows", ",".join(args.compile_rows)]
    if args.fp8_rows:
        out += ["--fp8-rows", args.fp8_rows]
    if args.no_fp8:
        out.append("--no-fp8")
    if args.layer_grid:
        out.append("--layer-grid")
    if args.queued_microbench:
        out.append("--queued-microbench")
    if args.quick:
        out.append("--quick")
    if args.no_progress:
        out.append("--no-progress")
    if args.force:
        out.append("--force")
    return out


def _sizes(text: str) -> tuple[int, ...]:
    """``--micro-batches 2,4,8`` → (2, 4, 8)."""
    parts = [t.strip() for t in text.split(",") if t.strip()]
    if not parts:
        raise argparse.ArgumentTypeError(f"{text!r}: give sizes separated by commas, e.g. 2,4,8")
    return tuple(positive_int(t) for t in parts)


def _modes(text: str) -> tuple[str, ...]:
    """``--compile-rows none,selective`` → ("none", "selective")."""
    from meshplan.spec.choices import RECOMPUTE
    modes = tuple(t.strip() for t in text.split(",") if t.strip())
    bad = [m for m in modes if m not in RECOMPUTE]
    if bad or not modes:
        raise argparse.ArgumentTypeError(f"{text!r}: give recompute modes separated by commas, "
                                         f"from {', '.join(RECOMPUTE)}")
    return modes


def _spawn(args) -> int:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={args.nproc}", "-m", "meshplan.cli", *child_argv(args)]
    from meshplan.executor.child_env import child_env
    env = child_env()
    from meshplan.calibrate.budget import LAUNCHED_AT_ENV
    env[LAUNCHED_AT_ENV] = repr(time.time())   # the budget counts torchrun's start-up
    print("meshplan calibrate: " + " ".join(cmd), file=sys.stderr)
    # as `meshplan run`: signals forwarded to torchrun, which never outlives this process
    from meshplan.executor.launch import supervise
    return supervise(cmd, env)[0]
