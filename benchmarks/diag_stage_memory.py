"""Diagnostic (issue 5, round 6): GPU memory after every pipeline action and step phase.

Round 5's largest memory error was a zero-bubble layout with full recomputation whose last
stage peaked at 70.7 GiB against 33.9 GiB predicted (holdout6 j15); round 6 found why with
this (a deferred weight pass re-runs the checkpointed forwards). It runs a validation
layout with the executor and records ``torch.cuda.memory_allocated`` after each forward
(F), input-gradient (I, or full backward B) and weight-gradient (W) action of each stage,
and after each of the step's phases (FB: a pp = 1 step's forwards and backwards, G:
gradient averaging, O: the optimizer step), with the peak inside
each (printed as allocated/peak GiB), and per rank where the step's peak was.

    python benchmarks/diag_stage_memory.py --set holdout6 --only j15,j07 --out $OUT/stage_mem

(spawns ``torchrun`` per layout; CUDA only; ``--cpu`` checks the script on gloo, where the
allocator numbers are all zero). ``--snapshot`` also records every allocation with its Python
stack and writes, per rank, what was alive at the peak grouped by allocation site
(``benchmarks/memory_peak.py``; the tensors a memory prediction missed).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

_ACTIONS = {"forward_one_chunk": "F", "backward_one_chunk": "B",
            "backward_weight_one_chunk": "W"}


def _record(log: list, device, fn, tag: str, stage: int = -1, mb: int = -1):
    """Call ``fn`` and log allocated memory after it and the peak inside it."""
    import torch
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    out = fn()
    log.append({"stage": stage, "action": tag, "mb": mb,
                "allocated": float(torch.cuda.memory_allocated(device)) if cuda else 0.0,
                "peak": float(torch.cuda.max_memory_allocated(device)) if cuda else 0.0})
    return out


def _patch_stage(log: list, device) -> None:
    """Wrap the stage's F / B (I: input gradient only) / W calls."""
    from torch.distributed.pipelining import stage as st

    def wrap(name, kind):
        orig = getattr(st._PipelineStageBase, name)

        def inner(self, chunk_id, *args, **kwargs):
            full = kwargs.get("full_backward", True)
            tag = kind if kind != "B" or full else "I"
            return _record(log, device, lambda: orig(self, chunk_id, *args, **kwargs), tag,
                           self.stage_index, int(chunk_id))
        setattr(st._PipelineStageBase, name, inner)

    for name, kind in _ACTIONS.items():
        wrap(name, kind)


def _patch_trainer(log: list, device) -> None:
    """Wrap the executor's step phases: FB (a pp = 1 step's forwards and backwards), G
    (gradient averaging after them or the schedule) and O (the optimizer step)."""
    from meshplan.executor import parallelize as par

    def wrap(name, tag):
        orig = getattr(par.ParallelTrainer, name)

        def inner(self, *args, **kwargs):
            return _record(log, device, lambda: orig(self, *args, **kwargs), tag)
        setattr(par.ParallelTrainer, name, inner)

    # (not the pipeline schedule as a whole: its actions reset the peak counter inside it)
    for name, tag in (("_step_local", "FB"), ("_finish_grads", "G")):
        wrap(name, tag)
    build = par.build_optimizer

    def build_logged(*args, **kwargs):
        opt = build(*args, **kwargs)
        step = opt.step
        opt.step = lambda *a, **k: _record(log, device, lambda: step(*a, **k), "O")
        return opt
    par.build_optimizer = build_logged


def worker(args) -> int:
    """One rank: run the executor on the plan with the stage patched, then dump the log."""
    import torch

    from meshplan.executor import run as executor_run
    rank = int(os.environ.get("RANK", 0))
    local = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local) if not args.cpu else torch.device("cpu")
    log: list = []
    _patch_stage(log, device)
    _patch_trainer(log, device)
    snapshot = args.snapshot and device.type == "cuda"
    if snapshot:   # before the model exists, so that every block's allocation is traced
        torch.cuda.memory._record_memory_history(context="alloc", stacks="python",
                                                 max_entries=4_000_000, device=device)
    rc = executor_run.main(["--plan", str(args.plan), "--out", str(args.out / "results.json"),
                            "--steps", "1", "--warmup", "1",
                            "--device", "cpu" if args.cpu else "cuda"])
    (args.out / f"mem_rank{rank}.json").write_text(json.dumps(log))
    if snapshot:
        from memory_peak import peak_live_set
        traces = torch.cuda.memory._snapshot(device)["device_traces"]
        peak = peak_live_set(traces[device.index] if len(traces) > device.index else [])
        (args.out / f"peak_rank{rank}.json").write_text(json.dumps(peak, indent=1))
        torch.cuda.memory._record_memory_history(enabled=None)
    return rc


def _tag(entry: dict) -> str:
    """An action with its micro-batch (F3, I0, W2) or a step phase alone (FB, G, O)."""
    return entry["action"] + (str(entry["mb"]) if entry["mb"] >= 0 else "")


def summarize(out: Path, prediction: dict) -> dict:
    """Per rank: the last step's actions with allocated GiB, and the peak action."""
    ranks = {}
    per_rank_pred = [m["total_bytes"] for m in prediction.get("memory", [])]
    for f in sorted(out.glob("mem_rank*.json")):
        r = int(f.stem.removeprefix("mem_rank"))
        log = json.loads(f.read_text())
        step = log[len(log) // 2:]       # warm-up + 1 measured step: keep the second half
        peak = max(step, key=lambda e: e["peak"], default=None)
        ranks[r] = {"actions": " ".join(f"{_tag(e)}:{e['allocated'] / 2**30:.1f}/"
                                        f"{e['peak'] / 2**30:.1f}" for e in step),
                    "peak_gib": peak["peak"] / 2**30 if peak else None,
                    "peak_at": _tag(peak) if peak else None}
        sites = out / f"peak_rank{r}.json"
        if sites.exists():   # --snapshot: the largest allocation sites alive at the peak
            live = json.loads(sites.read_text())
            ranks[r]["live_at_peak"] = [f"{s['bytes'] / 2**30:.3f} GiB x{s['blocks']} {s['site']}"
                                        for s in live["sites"][:12]]
            ranks[r]["trace_complete"] = live["complete"]
    return {"ranks": ranks, "predicted_gib": [b / 2**30 for b in per_rank_pred]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--set", default="holdout6")
    p.add_argument("--only", default="", help="layout names, comma-separated")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--profile", type=Path, help="calibrated profile for the predictions")
    p.add_argument("--cpu", action="store_true")
    p.add_argument("--snapshot", action="store_true",
                   help="record allocations with their Python stacks (CUDA) and report what "
                        "is alive at each rank's peak, by allocation site")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--plan", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)

    from meshplan.executor.planfiles import write_plan_for_layout
    from meshplan.hardware_profiles.calibrated import apply_profile
    import validate_device as vd
    layouts = dict((n, (m, lay)) for n, m, lay in vd.SETS[args.set])
    nproc = vd.SET_NPROC.get(args.set, 4)
    job = vd.SET_JOBS.get(args.set, vd.JOB)
    if args.cpu:
        gpu_name = ""
    else:   # the lent GPU's cluster preset, so that an H100 profile applies on an H100
        import torch
        gpu_name = torch.cuda.get_device_name(0)
    summary = {}
    for name in args.only.split(","):
        if name not in layouts:
            raise SystemExit(f"unknown layout {name!r} in set {args.set!r}; "
                             f"known: {', '.join(layouts)}")
        model, layout = layouts[name]
        if args.cpu:       # tiny model, 8 micro-batches per dp rank
            model = vd.TINY_LLAMA
            job = vd.Job(global_batch=8 * layout.micro_batch * layout.dp, seq_len=32,
                         runtime="torch")
        cluster = vd._gpu_cluster(gpu_name, nproc)
        if args.profile:
            cluster = apply_profile(cluster, args.profile)
        d = args.out / name
        d.mkdir(parents=True, exist_ok=True)
        plan = write_plan_for_layout(d / "plan.json", model, job, layout, cluster)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={layout.num_gpus}", __file__, "--worker", "--plan", str(plan),
               "--out", str(d), *(["--cpu"] if args.cpu else []),
               *(["--snapshot"] if args.snapshot else [])]
        with (d / "log.txt").open("w") as log:
            subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=300)
        prediction = json.loads(plan.read_text()).get("prediction", {})
        summary[name] = {"layout": layout.short(), **summarize(d, prediction)}
        print(name, json.dumps(summary[name], indent=1), flush=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
