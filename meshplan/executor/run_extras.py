"""The run's checkpoints and profiler (:mod:`meshplan.executor.run`): ``--checkpoint-dir``
/ ``--resume`` set-up, the measured saves beside their prediction, and ``--profile``'s
trace and top-operator table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from meshplan.planner.planfile import PlanRecord


def setup_checkpoints(args, plan, trainer, groups, rank, world, device, log):
    """(Checkpointer or None, first step, checkpoint record or None): load ``--resume``."""
    if not args.checkpoint_dir:
        return None, 0, None
    import uuid

    import torch.distributed as dist

    from meshplan.executor import checkpoint as ck
    from meshplan.executor.failures import checkpoint_crash_hook
    group = ck.checkpoint_group(world)
    run_id = [uuid.uuid4().hex[:8] if rank == 0 else None]
    dist.broadcast_object_list(run_id, src=0, group=group)
    record = {"schema": ck.SCHEMA, "version": 1, "seed": args.seed,
              "data": {"path": args.data, "dtype": args.data_dtype},
              "model": plan.model.to_dict(), "job": plan.job.to_dict(),
              "layout": plan.layout.to_dict(), "world": world,
              "optimizer": {"name": "AdamW", "lr": args.lr},
              "checkpoint": {"every": args.checkpoint_every, "keep": args.checkpoint_keep}}
    saver = ck.Checkpointer(directory=Path(args.checkpoint_dir), every=args.checkpoint_every,
                            rank=rank, world=world, group=group, run_id=run_id[0],
                            record=record, keep=args.checkpoint_keep,
                            crash_hook=checkpoint_crash_hook(rank))
    start, resumed = 0, None
    if args.resume:
        path = Path(args.resume_path)
        saved_layout = ck.read_marker(path).get("layout")
        resumed = ck.load(trainer, path, group=group, rank=rank, device=device,
                          same_layout=saved_layout == plan.layout.to_dict())
        start = int(resumed["step"])
        resumed = {"path": str(path), "step": start, "layout": saved_layout}
        if rank == 0:
            log(f"resumed from {path} ({start} steps done; saved in layout "
                f"{'the same' if saved_layout == plan.layout.to_dict() else 'a different one'})")
    return saver, start, resumed


def checkpoint_summary(per_rank: list[dict], plan: PlanRecord, world: int) -> dict[str, Any]:
    """Measured saves (rank 0's commit, the slowest rank's pause) and the prediction."""
    from meshplan.costmodel.checkpoint import predict_checkpoint
    saves = []
    for i, rec in enumerate(per_rank[0]["checkpoints"]):
        others = [r["checkpoints"][i] for r in per_rank if len(r["checkpoints"]) > i]
        saves.append({"step": rec["step"], "path": rec["path"], "bytes": rec["bytes"],
                      "write_s": rec["write_s"],
                      "stage_s_max": max(o["stage_s"] for o in others),
                      "rank_bytes_max": max(o["rank_bytes"] for o in others)})
    return {"saves": saves,
            "prediction": predict_checkpoint(plan.model, world=world,
                                            layout=plan.layout).to_dict()}


def start_profiler(device_type: str):
    import torch
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device_type == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    prof = torch.profiler.profile(activities=acts, record_shapes=False)
    prof.__enter__()
    return prof


def stop_profiler(prof, directory: str, rank: int) -> None:
    prof.__exit__(None, None, None)
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(d / f"trace_rank{rank}.json"))
    # by self time: a total time counts a kernel again in every op that wraps it
    sort = ("self_device_time_total" if any(e.device_type.name == "CUDA" for e in prof.events())
            else "self_cpu_time_total")
    (d / f"top_ops_rank{rank}.txt").write_text(prof.key_averages().table(sort_by=sort,
                                                                          row_limit=40))
