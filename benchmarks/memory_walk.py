"""A memory walk of a few layouts of a set: GPU memory after every pipeline action and step
phase, per rank, beside the prediction — where a memory prediction misses, and by what.

Runs each layout (``--set``, ``--only``: sets of ``benchmarks/sets/layout_sets.toml``) with
the executor and records ``torch.cuda.memory_allocated`` after each forward (F),
input-gradient (I, or full backward B) and weight-gradient (W) action of each stage, and
after each of the step's phases (FB: a pp = 1 step's forwards and backwards, G: gradient
averaging, O: the optimizer step), with the peak inside each (printed as allocated/peak
GiB), and per rank where the step's peak was. Writes ``--out/NAME/`` (plan, log,
``mem_rank*.json``) and ``--out/summary.json``; ``--profile`` prices the predictions on a
calibrated profile::

    python benchmarks/memory_walk.py --set holdout25 --only m07,m12 --out $OUT/memory \
        --profile docs/benchmarks/data/profiles/profile_h200x4_round26.toml

(spawns ``torchrun`` per layout; CUDA only; ``--cpu`` checks the script on gloo with a tiny
model, where the allocator numbers are all zero; on the GPU machine ``ONLY=m07 SET=holdout25
bash benchmarks/device_accuracy.sh memory``). ``--snapshot`` also records every allocation
with its Python stack and writes, per rank, what was alive at the peak grouped by allocation
site (``benchmarks/memory_peak.py``; the tensors a memory prediction missed), and the life
of every block of ``--block-mib`` or more as ``step:phase..step:phase`` (allocated before
that phase ended .. free requested before that one ended; S = the step's start, L = a
micro-batch's loss). ``--steps N`` runs N measured steps after the warm-up and reports the
peak of each; ``--settle-s`` pauses after every step (what a pause frees). Round 6 found
zero-bubble's deferred weight pass re-running the checkpointed forwards with it; rounds
12-25 each memory rule the model gained since (docs/benchmarks/accuracy.md).
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


class Recorder:
    """The rank's log: allocated memory after each wrapped call and the peak inside it, and
    a plain entry at each step's start (action ``S``, ``mb`` = step index). With
    ``trace_marks`` every entry is also followed by a marker allocation
    (:func:`_mark_trace`), so that ``memory_peak.block_lifetimes`` can place the trace's
    large blocks in these phases."""

    def __init__(self, device, trace_marks: bool = False):
        self.device, self.trace_marks = device, trace_marks
        self.log: list[dict] = []

    def _append(self, action: str, stage: int, mb: int) -> None:
        import torch
        cuda = self.device.type == "cuda"
        self.log.append({"stage": stage, "action": action, "mb": mb,
                         "allocated": float(torch.cuda.memory_allocated(self.device)) if cuda
                         else 0.0,
                         "peak": float(torch.cuda.max_memory_allocated(self.device)) if cuda
                         else 0.0})
        if self.trace_marks:
            _mark_trace(self.device)

    def record(self, fn, tag: str, stage: int = -1, mb: int = -1):
        """Call ``fn`` and log allocated memory after it and the peak inside it."""
        import torch
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        out = fn()
        self._append(tag, stage, mb)
        return out

    def note(self, action: str, mb: int = -1) -> None:
        """Log allocated memory now and the running peak, without resetting it."""
        self._append(action, -1, mb)


def _mark_trace(device) -> None:
    """One tiny allocation whose frame name ``memory_peak.MARKER`` finds in the trace."""
    import torch
    mark = torch.empty(512, dtype=torch.uint8, device=device)
    del mark


def _patch_stage(rec: Recorder) -> None:
    """Wrap the stage's F / B (I: input gradient only) / W calls."""
    from torch.distributed.pipelining import stage as st

    def wrap(name, kind):
        orig = getattr(st._PipelineStageBase, name)

        def inner(self, chunk_id, *args, **kwargs):
            full = kwargs.get("full_backward", True)
            tag = kind if kind != "B" or full else "I"
            return rec.record(lambda: orig(self, chunk_id, *args, **kwargs), tag,
                              self.stage_index, int(chunk_id))
        setattr(st._PipelineStageBase, name, inner)

    for name, kind in _ACTIONS.items():
        wrap(name, kind)


def _garbage_report(path: Path) -> None:
    """Collect Python's cyclic garbage, keeping it (``gc.DEBUG_SAVEALL``), and write what
    it held: object counts by type, the tensors in it (shape, dtype, bytes) and the code of
    its frames — what a reference cycle was keeping alive."""
    import gc
    from collections import Counter

    import torch
    flags = gc.get_debug()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        found = gc.collect()
        garbage = list(gc.garbage)
    finally:
        gc.garbage.clear()
        gc.set_debug(flags)
    types = Counter(type(o).__name__ for o in garbage)
    tensors = [o for o in garbage if isinstance(o, torch.Tensor)]
    frames = Counter(f"{o.f_code.co_filename.split('site-packages/')[-1]}:{o.f_code.co_name}"
                     for o in garbage if type(o).__name__ == "frame")
    path.write_text(json.dumps({
        "collected": found, "types": types.most_common(30),
        "tensor_bytes": sum(t.untyped_storage().nbytes() for t in tensors),
        "tensors": sorted(([list(t.shape), str(t.dtype), t.untyped_storage().nbytes(),
                            str(t.device)] for t in tensors), key=lambda r: -r[2])[:40],
        "frames": frames.most_common(40)}, indent=1))
    del garbage, tensors


def _patch_trainer(rec: Recorder, settle_s: float = 0.0,
                   garbage_report: Path | None = None) -> None:
    """Wrap the executor's step phases: FB (a pp = 1 step's forwards and backwards), G
    (gradient averaging after them or the schedule) and O (the optimizer step); log each
    step's start (S) and each loss computed (L, numbered through the run), and with
    ``settle_s`` > 0 let the GPU finish and the host wait that long after every step (an
    experiment: what a pause between steps frees)."""
    import time

    import torch

    from meshplan.executor import parallelize as par

    def wrap(name, tag):
        orig = getattr(par.ParallelTrainer, name)

        def inner(self, *args, **kwargs):
            return rec.record(lambda: orig(self, *args, **kwargs), tag)
        setattr(par.ParallelTrainer, name, inner)

    # (not the pipeline schedule as a whole: its actions reset the peak counter inside it)
    for name, tag in (("_step_local", "FB"), ("_finish_grads", "G")):
        wrap(name, tag)
    step = par.ParallelTrainer.step
    loss_fn = par.ParallelTrainer.loss_fn
    count = [0]
    losses = [0]

    def loss_logged(self, *args, **kwargs):   # L: a micro-batch's forward ended
        out = loss_fn(self, *args, **kwargs)
        rec.note("L", losses[0])
        losses[0] += 1
        return out
    par.ParallelTrainer.loss_fn = loss_logged

    def step_logged(self, *args, **kwargs):
        rec.note("S", count[0])
        count[0] += 1
        out = step(self, *args, **kwargs)
        if garbage_report is not None and count[0] == 1:
            _garbage_report(garbage_report)
        if settle_s > 0:
            if rec.device.type == "cuda":
                torch.cuda.synchronize(rec.device)
            time.sleep(settle_s)
        return out
    par.ParallelTrainer.step = step_logged
    build = par.build_optimizer

    def build_logged(*args, **kwargs):
        opt = build(*args, **kwargs)
        opt_step = opt.step
        opt.step = lambda *a, **k: rec.record(lambda: opt_step(*a, **k), "O")
        return opt
    par.build_optimizer = build_logged


def worker(args) -> int:
    """One rank: run the executor on the plan with the stage patched, then dump the log."""
    import torch

    from meshplan.executor import run as executor_run
    rank = int(os.environ.get("RANK", 0))
    local = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local) if not args.cpu else torch.device("cpu")
    snapshot = args.snapshot and device.type == "cuda"
    rec = Recorder(device, trace_marks=snapshot)
    _patch_stage(rec)
    _patch_trainer(rec, args.settle_s,
                   args.out / f"garbage_rank{rank}.json" if args.garbage_report else None)
    if snapshot:   # before the model exists, so that every block's allocation is traced
        torch.cuda.memory._record_memory_history(context="alloc", stacks="python",
                                                 max_entries=4_000_000, device=device)
    rc = executor_run.main(["--plan", str(args.plan), "--out", str(args.out / "results.json"),
                            "--steps", str(args.steps), "--warmup", str(args.warmup),
                            "--device", "cpu" if args.cpu else "cuda",
                            *args.executor_arg])
    (args.out / f"mem_rank{rank}.json").write_text(json.dumps(rec.log))
    if snapshot:
        from memory_peak import block_lifetimes, peak_live_set
        traces = torch.cuda.memory._snapshot(device)["device_traces"]
        events = traces[device.index] if len(traces) > device.index else []
        peak = peak_live_set(events)
        peak["blocks"] = block_lifetimes(events, args.block_mib << 20)
        (args.out / f"peak_rank{rank}.json").write_text(json.dumps(peak, indent=1))
        torch.cuda.memory._record_memory_history(enabled=None)
    return rc


def _tag(entry: dict) -> str:
    """An action with its micro-batch (F3, I0, W2) or a step phase alone (FB, G, O)."""
    return entry["action"] + (str(entry["mb"]) if entry["mb"] >= 0 else "")


def _steps(log: list) -> list[list]:
    """The log split at its step starts (``S`` entries); a log without them (older runs:
    one warm-up and one measured step) is split in half."""
    if not any(e["action"] == "S" for e in log):
        return [log[:len(log) // 2], log[len(log) // 2:]]
    steps: list[list] = []
    for e in log:
        if e["action"] == "S":
            steps.append([])
        elif steps:
            steps[-1].append(e)
    return steps


def _mark_label(log: list, mark: int | None) -> str:
    """Where ``mark`` markers had been made: in (or before) log entry ``mark``, as
    ``step:tag`` (``end``: after the last entry, ``never``: not freed)."""
    if mark is None:
        return "never"
    if mark >= len(log):
        return "end"
    step = sum(1 for e in log[:mark + 1] if e["action"] == "S") - 1
    return f"{step}:{_tag(log[mark])}"


def summarize(out: Path, prediction: dict) -> dict:
    """Per rank: the last step's actions with allocated GiB, and the peak action."""
    ranks = {}
    per_rank_pred = [m["total_bytes"] for m in prediction.get("memory", [])]
    for f in sorted(out.glob("mem_rank*.json")):
        r = int(f.stem.removeprefix("mem_rank"))
        log = json.loads(f.read_text())
        steps = _steps(log)
        step = steps[-1] if steps else []
        peaks = [max((e["peak"] for e in s), default=0.0) / 2**30 for s in steps]
        peak = max(step, key=lambda e: e["peak"], default=None)
        ranks[r] = {"actions": " ".join(f"{_tag(e)}:{e['allocated'] / 2**30:.1f}/"
                                        f"{e['peak'] / 2**30:.1f}" for e in step),
                    "peak_gib": peak["peak"] / 2**30 if peak else None,
                    "peak_at": _tag(peak) if peak else None}
        if len(steps) > 2:
            ranks[r]["peak_gib_by_step"] = [round(p, 3) for p in peaks]
        sites = out / f"peak_rank{r}.json"
        if sites.exists():   # --snapshot: the largest allocation sites alive at the peak
            live = json.loads(sites.read_text())
            ranks[r]["live_at_peak"] = [f"{s['bytes'] / 2**30:.3f} GiB x{s['blocks']} {s['site']}"
                                        for s in live["sites"][:12]]
            ranks[r]["trace_complete"] = live["complete"]
            ranks[r]["large_blocks"] = [
                f"{b['bytes'] / 2**30:.3f} GiB {_mark_label(log, b['alloc_mark'])}"
                f"..{_mark_label(log, b['free_mark'])} {b['site']}"
                + (f" / freed by {b['free_site']}" if b["free_site"] else "")
                for b in live.get("blocks", [])]
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
    p.add_argument("--steps", type=int, default=1,
                   help="measured steps after the warm-up [1]")
    p.add_argument("--warmup", type=int, default=1, help="warm-up steps [1]")
    p.add_argument("--garbage-report", action="store_true",
                   help="after the first step, collect Python's cyclic garbage and report "
                        "what it held (garbage_rank*.json)")
    p.add_argument("--settle-s", type=float, default=0.0,
                   help="experiment: synchronize and sleep this long after every step [0]")
    p.add_argument("--block-mib", type=int, default=256,
                   help="--snapshot: follow blocks of at least this many MiB [256]")
    p.add_argument("--executor-arg", action="append", default=[],
                   help="passed on to the executor (repeat; e.g. "
                        "--executor-arg=--first-step-settle-s=0)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--plan", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)

    from meshplan.executor.planfiles import write_plan_for_layout
    from meshplan.hardware_profiles.calibrated import apply_profile
    from meshplan.spec import Job
    import layout_sets as ls
    if args.set not in ls.SETS:
        raise SystemExit(f"unknown set {args.set!r}; known: {', '.join(ls.SETS)}")
    layouts = dict((n, (m, lay)) for n, m, lay in ls.SETS[args.set])
    nproc = ls.SET_NPROC[args.set]
    job = ls.SET_JOBS[args.set]
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
            model = ls.TINY_LLAMA
            job = Job(global_batch=8 * layout.micro_batch * layout.dp, seq_len=32,
                         runtime="torch")
        cluster = ls.gpu_cluster(gpu_name, nproc)
        if args.profile:
            cluster = apply_profile(cluster, args.profile)
        d = args.out / name
        d.mkdir(parents=True, exist_ok=True)
        plan = write_plan_for_layout(d / "plan.json", model, job, layout, cluster)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={layout.num_gpus}", __file__, "--worker", "--plan", str(plan),
               "--out", str(d), *(["--cpu"] if args.cpu else []),
               *(["--snapshot"] if args.snapshot else []), "--steps", str(args.steps),
               "--settle-s", str(args.settle_s), "--block-mib", str(args.block_mib),
               "--warmup", str(args.warmup),
               *(["--garbage-report"] if args.garbage_report else []),
               *(f"--executor-arg={a}" for a in args.executor_arg)]
        with (d / "log.txt").open("w") as log:
            subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=300)
        prediction = json.loads(plan.read_text()).get("prediction", {})
        summary[name] = {"layout": layout.short(), **summarize(d, prediction)}
        print(name, json.dumps(summary[name], indent=1), flush=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
