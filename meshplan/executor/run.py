"""``python -m meshplan.executor.run --plan plan.json --out results.json``: run a plan and measure it.

Launched by torchrun (one process per GPU; the planner's launch scripts, or
``meshplan run``), or directly as one process for a 1-GPU plan. Rank 0 writes
``results.json`` (atomically; an existing file is kept unless ``--force``) holding the
plan's model, cluster, job, layout and prediction, the measurement, the errors in % and
the environment, and prints predicted | measured | error. With ``--checkpoint-dir DIR
--checkpoint-every N`` it saves the training state every N steps
(:mod:`meshplan.executor.checkpoint`); ``--resume`` continues from the newest one, in
this or any other layout.

Exit codes: 0 done; 2 bad plan or arguments (nothing allocated); 3 out of memory;
4 another failure during the run (:mod:`meshplan.executor.failures`).
"""

from __future__ import annotations

import os
import signal
import socket
import statistics
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

from meshplan.errors import MeshplanError
from meshplan.executor.affinity import pin_local_rank
from meshplan.executor.child_env import allocator_setting
from meshplan.executor.failures import (collect_rank_errors, diagnose, error_file,  # noqa: F401
                                        exit_when_orphaned, install_term_handler,
                                        maybe_inject_failure, write_error)
from meshplan.executor.gc_control import GcPolicy, gc_across_ranks
from meshplan.executor.moe_routing import RoutedRows, imbalance
from meshplan.executor.moe_routing import attach as attach_routing
from meshplan.executor.run_args import (FIRST_STEP_SETTLE_S, build_parser,  # noqa: F401
                                        effective_plan, gpu_family, preflight)
from meshplan.executor.run_extras import (checkpoint_summary, setup_checkpoints, start_profiler,
                                          stop_profiler)
from meshplan.executor.run_results import (RESULTS_SCHEMA, prediction_of,  # noqa: F401
                                           results_document, stage_prediction_bytes)
from meshplan.executor.run_results import log as _log
from meshplan.planner.planfile import PlanRecord, load_plan_file, write_json_atomic

EXIT_BAD_INPUT, EXIT_OOM, EXIT_FAILED = 2, 3, 4


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


def _dist_env() -> tuple[int, int, int, int]:
    """(rank, world size, local rank, local world size) from torchrun's environment."""
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    return rank, world, local, local_world








def main(argv: list[str] | None = None, *, hard_exit: bool = False) -> int:
    """Run the plan; returns the exit code. ``hard_exit`` (the ``python -m`` entry point)
    ends the process once the work is written, skipping the process group's and the model's
    destruction (:func:`flush_and_exit`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    rank, world, local_rank, local_world = _dist_env()
    if "TORCHELASTIC_RUN_ID" in os.environ:   # started by torchrun: end with it
        from meshplan.executor.failures import die_with_parent
        die_with_parent()
    try:
        plan = effective_plan(load_plan_file(args.plan), args)
        # before anything imports torch: threads inherit the affinity of the thread that
        # starts them, and CUDA / NCCL start theirs at initialization
        args.pinned_cpus = pin_local_rank(args.cpu_affinity, local_rank, local_world)
        if args.device != "cpu":   # torch reads it when CUDA starts, in preflight
            allocator_setting(os.environ)
        device_type = preflight(plan, args, world, local_world)
    except MeshplanError as exc:
        if rank == 0:
            _log(f"error: {exc}")
        return EXIT_BAD_INPUT
    return _run(plan, args, argv, rank, world, local_rank, device_type, hard_exit)


def _init_process_group(device_type: str, local_rank: int, world: int, timeout_s: float):
    import torch
    import torch.distributed as dist
    kwargs: dict[str, Any] = {"timeout": timedelta(seconds=timeout_s)}
    if device_type == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        kwargs["device_id"] = device
    else:
        device = torch.device("cpu")
    if world == 1 and "MASTER_ADDR" not in os.environ:   # plain `python -m`, no torchrun
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        kwargs.update(init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    dist.init_process_group("nccl" if device_type == "cuda" else "gloo", **kwargs)
    return device


def _rank_groups(groups) -> dict[str, list[int]]:
    """Global ranks of this rank's dp, pp and tp groups (what the mesh built)."""
    import torch.distributed as dist
    return {name: list(dist.get_process_group_ranks(getattr(groups, f"{name}_group")))
            for name in ("dp", "pp", "tp")}




def _run(plan: PlanRecord, args, argv, rank, world, local_rank, device_type,
         hard_exit: bool) -> int:
    import torch
    import torch.distributed as dist

    from meshplan.executor.data import SyntheticTokens, TokenFile, local_share, to_device
    from meshplan.executor.data_parallel import OptimizerConfig
    from meshplan.executor.failures import classify, oom_message, set_group_timeouts
    from meshplan.executor.measure import (StepTimer, environment, format_table,
                                           host_dispatch_probe_us, peak_memory, summarize,
                                           throughput)
    from meshplan.executor.mesh import build_mesh
    from meshplan.executor.parallelize import ParallelTrainer

    out = Path(args.out)
    model, job, layout = plan.model, plan.job, plan.layout
    device = _init_process_group(device_type, local_rank, world, args.timeout_s)
    prediction = prediction_of(plan)
    env = environment(device, world)
    pinned = getattr(args, "pinned_cpus", None)
    env["cpu_affinity"] = (f"{args.cpu_affinity}: {len(pinned)} CPUs per rank" if pinned
                           else "none")
    state: dict[str, Any] = {"step": -1, "phase": "setup", "groups": None, "failed": False,
                             "marks": 0}
    steps_total = args.warmup + args.steps
    saver = None

    def where() -> str:
        g = state["groups"]
        if g is None:
            return f"rank {rank}"
        stages = state.get("stages", [g.pp_rank])
        return (f"rank {rank} (pipeline stage{'s' if len(stages) > 1 else ''} "
                f"{','.join(map(str, stages))}, dp {g.dp_rank}, tp {g.tp_rank})")

    def fail(kind: str, message: str, extra: dict | None = None) -> dict:
        state["failed"] = True
        err = {"rank": rank, "kind": kind, "phase": state["phase"], "step": state["step"],
               "progress": [state["step"], state.get("marks", 0)],
               "where": where(), "message": message, **(extra or {})}
        _log(f"{where()} failed at {state['phase']} step {state['step']}: {message}")
        write_error(out, rank, err)
        return err

    def write_partial(error: dict | None) -> None:
        errs = collect_rank_errors(out, world)
        if error is not None and error not in errs:
            errs.append(error)
        doc = results_document(plan, prediction, state.get("measured") or {}, env,
                               status="failed",
                               error={"summary": diagnose(errs, world, args.timeout_s),
                                      "ranks": errs},
                               argv=sys.argv[:1] + argv)
        write_json_atomic(out, doc, overwrite=True)

    def on_term(err: dict | None) -> None:   # torchrun stops the survivors when a rank fails
        if rank == 0:
            write_partial(err)
        flush_and_exit(EXIT_FAILED)

    install_term_handler(rank, out, state, on_term)
    if "TORCHELASTIC_RUN_ID" in os.environ:   # a rank blocked in C++ must still end with it
        exit_when_orphaned(rank, out, state, os.getppid())

    try:
        groups = build_mesh(layout, device_type, rank_order=plan.cluster.rank_order,
                            tied_embeddings=model.tied_embeddings)
        set_group_timeouts(groups, args.timeout_s)
        state["groups"] = groups
        trainer = ParallelTrainer(model, job, layout, groups, device, seed=args.seed,
                                  optimizer=OptimizerConfig(lr=args.lr),
                                  compile=layout.compile)
        state["stages"] = trainer.stage_indices()
        if trainer.expert_groups is not None:
            set_group_timeouts(groups, args.timeout_s, extra=(trainer.expert_groups.ep_group,
                                                              trainer.expert_groups.edp_group))
        saver, start, resumed = setup_checkpoints(args, plan, trainer, groups, rank, world,
                                                   device, _log)
        # the first step after a restart pays for allocation and compilation: never timed
        first_timed = max(args.warmup, start + 1) if start else args.warmup
        if rank == 0:
            _log(f"{layout.short()} on {world} × {env.get('gpu_name') or 'cpu'}: "
                 f"{trainer.num_microbatches} micro-batches per step, steps {start}.."
                 f"{steps_total - 1}")
        data = (TokenFile(args.data, model.vocab_size, job.seq_len, dtype=args.data_dtype,
                          seed=args.seed) if args.data
                else SyntheticTokens(model.vocab_size, job.seq_len, seed=args.seed))
        if device_type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(device)
        timer = StepTimer(device, phase_memory=args.phase_memory)
        if args.block_marks:
            from meshplan.executor.block_marks import add_block_marks
            add_block_marks(trainer, timer.mark)
        gc_policy = GcPolicy(args.gc, args.gc_period)
        routed = RoutedRows()
        routed_ranks = (dist.get_process_group_ranks(trainer.expert_groups.ep_group)
                        if any([attach_routing(p.module, routed) for p in trainer.parts])
                        else None)
        losses = []
        peak_after_step: list[float] = []   # running peak: shows which step set it
        host_probe_us = None                # the host's dispatch speed after the warm-up
        prof = None
        def mark(name: str) -> None:   # progress for the hang diagnosis, then the timer
            state["marks"] += 1
            timer.mark(name)

        for step in range(start, steps_total):
            state["step"], state["phase"] = step, ("warm-up" if step < first_timed
                                                   else "measure")
            state["marks"] = 0
            batch = to_device(local_share(data.global_batch(step, job.global_batch),
                                          layout.dp, groups.dp_rank), device)
            if args.profile and step == first_timed:
                prof = start_profiler(device_type)
            if step == first_timed:
                host_probe_us = host_dispatch_probe_us(device)
                gc_policy.begin_measure()
            if step >= first_timed:
                timer.start()
                gc_policy.in_step()
                routed.on = True
            maybe_inject_failure(rank, step)
            loss = trainer.step(batch, mark=mark)
            if step >= first_timed:
                timer.stop()
            if prof is not None:
                prof.step()
                if step == first_timed + 2:
                    stop_profiler(prof, args.profile, rank)
                    prof = None
            if step == start:
                settle_after_first_step(device, args.first_step_settle_s)
            losses.append(loss)
            if device_type == "cuda":
                peak_after_step.append(timer.running_peak_bytes())
            if rank == 0 and step > start:   # one step behind: no sync on the step just queued
                _log(f"step {step - 1}: loss {float(losses[-2]):.4f}")
            if saver is not None and saver.due(step + 1, last=step + 1 == steps_total):
                state["phase"] = "checkpoint"
                rec = saver.save(trainer, step + 1, device)
                if rank == 0:
                    _log(f"checkpoint of step {step + 1}: {rec.rank_bytes / 2**20:.1f} MiB "
                         f"staged in {rec.stage_s * 1e3:.0f} ms, writing in the background")
        gc_policy.end()
        state["phase"] = "checkpoint" if saver is not None else "report"
        if saver is not None:
            saver.wait()
        state["phase"] = "report"
        times = timer.durations_s()
        loss_values = [float(l) for l in losses]
        mem = peak_memory(device)
        if timer.memory:     # the phase readings reset torch's peak: the run's is theirs
            mem["allocated_bytes"] = timer.running_peak_bytes()
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
                "predicted_bytes": stage_prediction_bytes(prediction, groups.pp_rank),
                # where the rank ran and whom it talks to (multi-node launches are checked
                # against the plan's mesh with these)
                "groups": _rank_groups(groups), "host": socket.gethostname(),
                "node_rank": int(os.environ.get("GROUP_RANK", "0")),
                "local_rank": local_rank,
                "checkpoints": saver.summary() if saver is not None else [],
                # the MoE rows this rank computed per call at ep > 1 (moe_routing)
                "routed": (routed_ranks, routed.rows) if routed_ranks else None}
        per_rank = [None] * world
        dist.all_gather_object(per_rank, mine)
        routed_per_rank = [r.pop("routed") for r in per_rank]
        routing = imbalance([r for r in routed_per_rank if r])
    except torch.cuda.OutOfMemoryError as exc:
        g = state["groups"]
        pred = stage_prediction_bytes(prediction, g.pp_rank) if g else None
        actual = float(torch.cuda.max_memory_allocated(device)) if device_type == "cuda" else None
        cap = (float(torch.cuda.get_device_properties(device).total_memory)
               if device_type == "cuda" else None)
        msg = oom_message(plan, prediction, pred, actual, cap, exc)
        err = fail("out_of_memory", msg, {"predicted_bytes": pred, "actual_peak_bytes": actual,
                                          "capacity_bytes": cap})
        if rank == 0:
            write_partial(err)
        flush_and_exit(EXIT_OOM)
    except Exception as exc:
        msg = f"{type(exc).__name__}: {exc}"
        err = fail(classify(msg), msg, {"traceback": traceback.format_exc()})
        if rank == 0:
            write_partial(err)
        flush_and_exit(EXIT_FAILED)

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
            "loss_per_step": loss_values, "first_step": start, "steps": args.steps,
            "warmup": args.warmup,
            "num_microbatches": trainer.num_microbatches,
            "gc": gc_across_ranks([r["gc"] for r in per_rank]),
            # ρ as run: the busiest ep rank's routed rows over the mean, per MoE call of the
            # timed steps (eager ep > 1 only; the cost model assumes moe_load_imbalance)
            "moe_routing": routing,
            "mfu_note": None if device_type == "cuda" else "MFU needs a GPU peak; CPU run",
        }
        if saver is not None:
            measured["checkpoints"] = checkpoint_summary(per_rank, plan, world)
        if resumed is not None:
            measured["resumed_from"] = resumed
        doc = results_document(plan, prediction, measured, env, status="ok", error=None,
                               argv=sys.argv[:1] + argv)
        write_json_atomic(out, doc, overwrite=True)
        print(format_table(measured, prediction, doc["errors_pct"]), flush=True)
        _log(f"wrote {out}")
    dist.barrier()
    if hard_exit:   # before _run's locals go (flush_and_exit)
        flush_and_exit(0)
    dist.destroy_process_group()
    return 0


def flush_and_exit(code: int) -> None:
    """Flush and end the process at once, without interpreter teardown or destructors: other
    ranks may be blocked in collectives this rank left; gloo with FSDP2 aborted in teardown
    ("terminate called without an active exception"), and a DDP model's and its gloo
    group's destructors hung about one run in ten under CPU contention
    (benchmarks/baseline_ddp.py). Also the benchmarks' way out."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    flush_and_exit(main(hard_exit=True))
