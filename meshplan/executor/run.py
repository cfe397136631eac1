"""``python -m meshplan.executor.run --plan plan.json --out results.json``: run a plan and measure it.

Launched by torchrun (one process per GPU; the planner's launch scripts, or
``meshplan run``), or directly as one process for a 1-GPU plan. Rank 0 writes
``results.json`` (atomically; an existing file is kept unless ``--force``) holding the
plan's model, cluster, job, layout and prediction, the measurement, the errors in % and
the environment, and prints predicted | measured | error.

Exit codes: 0 done; 2 bad plan or arguments (nothing allocated); 3 out of memory;
4 another failure during the run.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any

from meshplan.errors import ExecutorError, MeshplanError
from meshplan.executor.affinity import AFFINITY_MODES, pin_local_rank
from meshplan.executor.gc_control import (DEFAULT_GC_PERIOD_STEPS, GC_MODES, GcPolicy,
                                          gc_across_ranks)
from meshplan.planner.planfile import PlanRecord, load_plan_file, write_json_atomic
from meshplan.spec.choices import FP8_RECIPES

RESULTS_SCHEMA = "meshplan.results"
EXIT_BAD_INPUT, EXIT_OOM, EXIT_FAILED = 2, 3, 4


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
                   help="torch.compile each transformer block (off by default)")
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
    return p


FIRST_STEP_SETTLE_S = 0.25


def settle_after_first_step(device, seconds: float) -> None:
    """After the first step, let the GPU finish it and wait ``seconds`` more, once.

    Why: DDP's first step reduces all gradients as one bucket; torch builds the real buckets
    at the second step's first forward (``Reducer::_rebuild_buckets``) and drops the first
    bucket then — one fp32 copy of every gradient, 6.1 GiB for a 1.6B-parameter model. When
    the host has run ahead of the GPU into that step, something still holds the first bucket
    through the step's peak, and a rank's peak memory is one gradient copy higher. Likely
    ProcessGroupNCCL, which keeps an asynchronous collective's tensors until it is waited
    on or its watchdog (every 100 ms) sees it complete (torch PR #148590; DDP waits only on
    the collective's future); Python reference cycles are ruled out (round 13: the garbage
    collected after the first step held no tensor).

    Measured (round 13, 2 × H100, GPT-0.54B and Llama-1.64B at dp 2, ZeRO-1, three
    warm-up steps): without the wait 5 of 8 ranks held the copy at the second step, only
    there; with it 0 of 8. Rounds 1-8: 42 of 52 ranks of the DDP layouts over tp = 1. The
    wait is in the warm-up, outside every timed step."""
    import torch
    if seconds <= 0 or device.type != "cuda":
        return
    torch.cuda.synchronize(device)
    time.sleep(seconds)


def _log(msg: str) -> None:
    print(f"[meshplan.executor] {msg}", file=sys.stderr, flush=True)


def _dist_env() -> tuple[int, int, int, int]:
    """(rank, world size, local rank, local world size) from torchrun's environment."""
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    return rank, world, local, local_world


def gpu_family(name: str) -> str | None:
    """'H100' from 'H100-SXM5-80GB' or 'NVIDIA H100 80GB HBM3' (letter + 2-3 digits)."""
    import re
    m = re.search(r"\b([A-Z]{1,2}\d{2,3})", name.upper())
    return m.group(1) if m else None


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
    if args.block_marks:
        from meshplan.executor.block_marks import check_block_marks
        check_block_marks(layout)
    if not 0 <= args.first_step_settle_s <= 60:
        raise ExecutorError(f"--first-step-settle-s must be between 0 and 60 s, got "
                            f"{args.first_step_settle_s}")
    check_layout_runnable(plan.model, plan.job, layout)
    out = Path(args.out)
    if out.exists() and not args.force:
        raise ExecutorError(f"results file {str(out)!r} exists; refusing to overwrite it "
                            f"(pass --force to replace it)")
    return device


def override_precision(plan: PlanRecord, precision: str | None,
                       fp8_recipe: str | None) -> PlanRecord:
    """The plan with ``--precision`` / ``--fp8-recipe`` applied; a prediction made for
    another precision or recipe is dropped rather than compared with this run."""
    job = plan.job
    precision = precision or job.precision
    if fp8_recipe is not None and precision != "fp8":
        raise ExecutorError(f"--fp8-recipe {fp8_recipe} needs --precision fp8 (the plan's "
                            f"precision is {job.precision!r})")
    recipe = fp8_recipe or (job.fp8_recipe if precision == "fp8" else FP8_RECIPES[0])
    new = replace(job, precision=precision, fp8_recipe=recipe)
    if new == job:
        return plan
    _log(f"running in {precision}{f' ({recipe})' if precision == 'fp8' else ''} instead of "
         f"the plan's {job.precision}: its prediction is left out")
    return replace(plan, job=new, prediction={})


def prediction_of(plan: PlanRecord) -> dict[str, Any]:
    """The plan's prediction, or the cost model's when the plan file carries none."""
    if plan.prediction:
        return dict(plan.prediction)
    try:
        from meshplan.costmodel import estimate
        return estimate(plan.model, plan.cluster, plan.job, plan.layout).to_dict()
    except Exception as exc:  # no prediction is not a reason to refuse a measurement
        _log(f"no prediction in the plan and the cost model failed: {exc}")
        return {}


def stage_prediction_bytes(prediction: dict[str, Any], pp_rank: int) -> float | None:
    mem = prediction.get("memory")
    if isinstance(mem, list) and pp_rank < len(mem) and isinstance(mem[pp_rank], dict):
        v = mem[pp_rank].get("total_bytes")
        return float(v) if isinstance(v, (int, float)) else None
    return None


def error_file(out: Path, rank: int) -> Path:
    return out.with_name(f"{out.name}.rank{rank}.error.json")


def results_document(plan: PlanRecord, prediction, measured, environment, *, status: str,
                     error: dict | None, argv: list[str]) -> dict[str, Any]:
    from meshplan.executor.measure import comparison
    return {
        "schema": RESULTS_SCHEMA, "version": 1, "status": status,
        "command": " ".join(argv),
        "model": plan.model.to_dict(), "cluster": plan.cluster.to_dict(),
        "job": plan.job.to_dict(), "layout": plan.layout.to_dict(),
        "prediction": prediction, "measured": measured,
        "errors_pct": comparison(measured, prediction) if measured else {},
        "environment": environment, "error": error,
    }


def collect_rank_errors(out: Path, world: int) -> list[dict]:
    errs = []
    for r in range(world):
        p = error_file(out, r)
        if p.exists():
            try:
                errs.append(json.loads(p.read_text()))
            except (OSError, json.JSONDecodeError):
                errs.append({"rank": r, "message": f"unreadable error file {p}"})
    # the root cause first: an out-of-memory or a rank's own failure, before the ranks that
    # merely lost their peer (gloo "Connection closed", NCCL "remote process exited")
    def secondary(e: dict) -> bool:
        m = str(e.get("message", ""))
        return "Connection closed" in m or "remote" in m.lower() or e.get("kind") == "terminated"
    errs.sort(key=lambda e: (e.get("kind") != "out_of_memory", secondary(e), e.get("rank", 0)))
    return errs


def main(argv: list[str] | None = None, *, hard_exit: bool = False) -> int:
    """Run the plan; returns the exit code. ``hard_exit`` (the ``python -m`` entry point)
    skips destroying the process group: gloo with FSDP2 aborts in its teardown ("terminate
    called without an active exception", torch 2.13 CPU), and the process ends anyway."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    rank, world, local_rank, local_world = _dist_env()
    try:
        plan = load_plan_file(args.plan)
        plan = override_precision(plan, args.precision, args.fp8_recipe)
        # before anything imports torch: threads inherit the affinity of the thread that
        # starts them, and CUDA / NCCL start theirs at initialization
        args.pinned_cpus = pin_local_rank(args.cpu_affinity, local_rank, local_world)
        device_type = preflight(plan, args, world, local_world)
    except MeshplanError as exc:
        if rank == 0:
            _log(f"error: {exc}")
        return EXIT_BAD_INPUT
    return _run(plan, args, argv, rank, world, local_rank, device_type, hard_exit)


def _run(plan: PlanRecord, args, argv, rank, world, local_rank, device_type,
         hard_exit: bool) -> int:
    import torch
    import torch.distributed as dist

    from meshplan.executor.data import SyntheticTokens, TokenFile, local_share, to_device
    from meshplan.executor.data_parallel import OptimizerConfig
    from meshplan.executor.measure import (StepTimer, environment, format_table,
                                           host_dispatch_probe_us, peak_memory, summarize,
                                           throughput)
    from meshplan.executor.mesh import build_mesh
    from meshplan.executor.parallelize import ParallelTrainer

    out = Path(args.out)
    model, job, layout = plan.model, plan.job, plan.layout
    if device_type == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    else:
        device = torch.device("cpu")
    kwargs: dict[str, Any] = {"device_id": device} if device_type == "cuda" else {}
    if world == 1 and "MASTER_ADDR" not in os.environ:   # plain `python -m`, no torchrun
        import socket
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        kwargs.update(init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    dist.init_process_group("nccl" if device_type == "cuda" else "gloo", **kwargs)
    prediction = prediction_of(plan)
    env = environment(device, world)
    pinned = getattr(args, "pinned_cpus", None)
    env["cpu_affinity"] = (f"{args.cpu_affinity}: {len(pinned)} CPUs per rank" if pinned
                           else "none")
    state: dict[str, Any] = {"step": -1, "phase": "setup", "groups": None}
    steps_total = args.warmup + args.steps

    def where() -> str:
        g = state["groups"]
        if g is None:
            return f"rank {rank}"
        stages = state.get("stages", [g.pp_rank])
        return (f"rank {rank} (pipeline stage{'s' if len(stages) > 1 else ''} "
                f"{','.join(map(str, stages))}, dp {g.dp_rank}, tp {g.tp_rank})")

    def fail(kind: str, message: str, extra: dict | None = None) -> dict:
        err = {"rank": rank, "kind": kind, "phase": state["phase"], "step": state["step"],
               "where": where(), "message": message, **(extra or {})}
        _log(f"{where()} failed at {state['phase']} step {state['step']}: {message}")
        try:
            write_json_atomic(error_file(out, rank), err)
        except OSError:
            pass
        return err

    def write_partial(error: dict | None) -> None:
        errs = collect_rank_errors(out, world)
        if error is not None and error not in errs:
            errs.append(error)
        doc = results_document(plan, prediction, state.get("measured") or {}, env,
                               status="failed", error={"ranks": errs}, argv=sys.argv[:1] + argv)
        write_json_atomic(out, doc, overwrite=True)

    if rank == 0:
        def on_term(signum, frame):   # torchrun stops the survivors when a rank fails
            write_partial({"rank": 0, "kind": "terminated", "step": state["step"],
                           "message": f"rank 0 received signal {signum} (another rank failed?)"})
            os._exit(EXIT_FAILED)
        signal.signal(signal.SIGTERM, on_term)

    try:
        groups = build_mesh(layout, device_type, rank_order=plan.cluster.rank_order,
                            tied_embeddings=model.tied_embeddings)
        state["groups"] = groups
        trainer = ParallelTrainer(model, job, layout, groups, device, seed=args.seed,
                                  optimizer=OptimizerConfig(lr=args.lr), compile=args.compile)
        state["stages"] = trainer.stage_indices()
        if rank == 0:
            _log(f"{layout.short()} on {world} × {env.get('gpu_name') or 'cpu'}: "
                 f"{trainer.num_microbatches} micro-batches per step, {steps_total} steps")
        data = (TokenFile(args.data, model.vocab_size, job.seq_len, dtype=args.data_dtype,
                          seed=args.seed) if args.data
                else SyntheticTokens(model.vocab_size, job.seq_len, seed=args.seed))
        if device_type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(device)
        timer = StepTimer(device)
        if args.block_marks:
            from meshplan.executor.block_marks import add_block_marks
            add_block_marks(trainer, timer.mark)
        gc_policy = GcPolicy(args.gc, args.gc_period)
        losses = []
        peak_after_step: list[float] = []   # running peak: shows which step set it
        host_probe_us = None                # the host's dispatch speed after the warm-up
        prof = None
        for step in range(steps_total):
            state["step"], state["phase"] = step, ("warm-up" if step < args.warmup else "measure")
            batch = to_device(local_share(data.global_batch(step, job.global_batch),
                                          layout.dp, groups.dp_rank), device)
            if args.profile and step == args.warmup:
                prof = _start_profiler(device_type)
            if step == args.warmup:
                host_probe_us = host_dispatch_probe_us(device)
                gc_policy.begin_measure()
            if step >= args.warmup:
                timer.start()
                gc_policy.in_step()
            _maybe_inject_failure(rank, step)
            loss = trainer.step(batch, mark=timer.mark)
            if step >= args.warmup:
                timer.stop()
            if prof is not None:
                prof.step()
                if step == args.warmup + 2:
                    _stop_profiler(prof, args.profile, rank)
                    prof = None
            if step == 0:
                settle_after_first_step(device, args.first_step_settle_s)
            losses.append(loss)
            if device_type == "cuda":
                peak_after_step.append(float(torch.cuda.max_memory_allocated(device)))
            if rank == 0 and step > 0:   # one step behind: no sync on the step just queued
                _log(f"step {step - 1}: loss {float(losses[-2]):.4f}")
        gc_policy.end()
        state["phase"] = "report"
        times = timer.durations_s()
        loss_values = [float(l) for l in losses]
        mem = peak_memory(device)
        mine = {"rank": rank, "dp": groups.dp_rank, "pp": groups.pp_rank, "tp": groups.tp_rank,
                "stages": trainer.stage_indices(), **mem, "peak_after_step": peak_after_step,
                "host_probe_us": host_probe_us,
                "gc": gc_policy.summary(),
                # this rank's own median step and host dispatch time per step (rank 0's
                # steps are the measurement; these show which rank's CPU kept up)
                "step_median_s": statistics.median(times) if times else None,
                "host_step_median_s": (statistics.median(timer.host_durations_s())
                                       if times else None),
                # where the step goes after the passes (FSDP2's tail: round 19)
                "phase_median_ms": timer.phase_medians_ms() if times else None,
                "predicted_bytes": stage_prediction_bytes(prediction, groups.pp_rank)}
        per_rank = [None] * world
        dist.all_gather_object(per_rank, mine)
    except torch.cuda.OutOfMemoryError as exc:
        g = state["groups"]
        pred = stage_prediction_bytes(prediction, g.pp_rank) if g else None
        actual = float(torch.cuda.max_memory_allocated(device)) if device_type == "cuda" else None
        cap = (float(torch.cuda.get_device_properties(device).total_memory)
               if device_type == "cuda" else None)
        msg = (f"out of memory: predicted peak {_gib(pred)} for this pipeline stage, actual "
               f"allocated peak {_gib(actual)} of {_gib(cap)} when it failed. Hint: "
               f"recompute='selective' or 'full', a higher ZeRO stage, a smaller micro_batch, "
               f"or more pp/tp. ({str(exc).splitlines()[0]})")
        err = fail("out_of_memory", msg, {"predicted_bytes": pred, "actual_peak_bytes": actual,
                                          "capacity_bytes": cap})
        if rank == 0:
            write_partial(err)
        _flush_and_exit(EXIT_OOM)
    except Exception as exc:
        err = fail("error", f"{type(exc).__name__}: {exc}",
                   {"traceback": traceback.format_exc()})
        if rank == 0:
            write_partial(err)
        _flush_and_exit(EXIT_FAILED)

    if rank == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)   # the results below are the real ones
        summary = summarize(times)
        step_s = summary["median"] if summary else None
        # MFU against the 16-bit peak for fp8 too (as torchtitan reports it): only the
        # linears run fp8, and one yardstick keeps bf16 and fp8 runs comparable
        mfu_precision = "bf16" if job.precision == "fp8" else job.precision
        peak_flops = (plan.cluster.gpu.peak_flops(mfu_precision) if device_type == "cuda"
                      else None)
        alloc = [r["allocated_bytes"] for r in per_rank if r["allocated_bytes"] is not None]
        reserved = [r["reserved_bytes"] for r in per_rank if r["reserved_bytes"] is not None]
        measured = {
            "step_time_s": step_s, "step_time": summary, "step_times_s": times,
            **throughput(model, job, layout, step_s, peak_flops),
            "memory_peak_bytes": max(alloc) if alloc else (max(reserved) if reserved else None),
            "memory_peak_reserved_bytes": max(reserved) if reserved else None,
            "memory_peak_kind": "cuda_max_allocated" if alloc else "process_max_rss",
            "memory_per_rank": per_rank,
            "loss_per_step": loss_values, "steps": args.steps, "warmup": args.warmup,
            "num_microbatches": trainer.num_microbatches,
            "gc": gc_across_ranks([r["gc"] for r in per_rank]),
            "mfu_note": None if device_type == "cuda" else "MFU needs a GPU peak; CPU run",
        }
        doc = results_document(plan, prediction, measured, env, status="ok", error=None,
                               argv=sys.argv[:1] + argv)
        write_json_atomic(out, doc, overwrite=True)
        print(format_table(measured, prediction, doc["errors_pct"]), flush=True)
        _log(f"wrote {out}")
    dist.barrier()
    if not hard_exit:
        dist.destroy_process_group()
    return 0


def _maybe_inject_failure(rank: int, step: int) -> None:
    """Test hook: MESHPLAN_EXECUTOR_INJECT="RANK:STEP:oom|error" fails that rank at that step."""
    spec = os.environ.get("MESHPLAN_EXECUTOR_INJECT")
    if not spec:
        return
    r, s, kind = spec.split(":")
    if int(r) == rank and int(s) == step:
        import torch
        if kind == "oom":
            raise torch.cuda.OutOfMemoryError("injected out-of-memory (test hook)")
        raise RuntimeError("injected failure (test hook)")


def _gib(v: float | None) -> str:
    return "unknown" if v is None else f"{v / 2**30:.2f} GiB"


def _flush_and_exit(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    # skip interpreter teardown: other ranks may be blocked in collectives this rank left
    os._exit(code)


def _start_profiler(device_type: str):
    import torch
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device_type == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    prof = torch.profiler.profile(activities=acts, record_shapes=False)
    prof.__enter__()
    return prof


def _stop_profiler(prof, directory: str, rank: int) -> None:
    prof.__exit__(None, None, None)
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(d / f"trace_rank{rank}.json"))
    sort = "cuda_time_total" if any(e.device_type.name == "CUDA" for e in prof.events()) \
        else "cpu_time_total"
    (d / f"top_ops_rank{rank}.txt").write_text(prof.key_averages().table(sort_by=sort,
                                                                          row_limit=40))


if __name__ == "__main__":
    _flush_and_exit(main(hard_exit=True))
