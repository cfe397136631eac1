"""Where f01's fp8 step lost 31 %: one f01-like step on one GPU, blocks compiled whole or
split the way DDP splits them, in bf16 and fp8 (issue 41; docs/benchmarks/fp8_checks.md, "f01").

f01 (4 × H200, 2026-11-28: Llama-1.64B, dp 4, ZeRO-1, micro-batch 2, 4 micro-batches a
step, compiled) ran fp8 at 0.76× bf16, while the compiled fp8 layer timed alone is 1.08×
faster and f05 (dp 2 × pp 2, same layer, same micro-batches per GPU) ran 1.105×. What f01's
blocks meet that the rows and f05 do not is DDP (a pipeline's ZeRO-0/1 reduces gradients
after the schedule instead): inside DDP's forward, Dynamo's DDPOptimizer splits every
compiled block at DDP bucket boundaries, and under ``ZeroRedundancyOptimizer(
parameters_as_bucket_view=True)`` each parameter's storage is its rank's whole flat bucket,
so the split is per parameter (6 pieces per Llama block; ``meshplan.costmodel.
fp8_ddp_split``).

The step is the executor's own (``ParallelTrainer``: fp8 linears, compiled blocks and loss,
autocast, its ``wrap_data_parallel`` and ``build_optimizer``), on a one-rank group that
stands in for f01's dp group (the replica groups say dp 2 so that the executor takes its
DDP + ZeroRedundancyOptimizer path; a one-rank all-reduce moves nothing, so the arms differ
only in how the blocks are compiled). Arms, ``<precision>-<mode>``:

* ``split``: DDPOptimizer on, as f01 ran;
* ``whole``: the same under DDP with ``torch._dynamo.config.optimize_ddp = False``, blocks
  compiled whole (what the calibration's compiled rows time; also what f01 would run with
  that setting in the executor);
* ``plain``: no DDP or ZeRO (the rows' and f05's setting).

Per arm: step time on the device (CUDA events) and on the host (dispatch), per micro-batch
forward / backward device and host ms, the process CPU time of a micro-batch that does not
synchronize gradients (``host_cpu_ms_per_mb``: the dispatch work; on a GPU-bound step it
also counts the driver spinning while CUDA's launch queue is full — read it with the busy
fraction),
the optimizer's ms, peak memory, pieces per block,
Python GC collections in the timed steps, and from ``torch.profiler`` over one step the
kernel count, the GPU's busy fraction and the top kernels. ``verdict`` compares the arms:
the fp8/bf16 speed-up split and whole, what the split costs per layer and micro-batch on
the device and on the host, and whether the step is host-bound (host ≥ 95 % of device).
-> ``$OUT/<--name>.json`` (default fp8_probe; written after every arm).

    # 1 × H200 (torch 2.11, nothing to carry: the executor's fp8 needs no torchao); each
    # arm compiles one block graph (~30-45 s cold), so two calls of <= 120 s (Inductor's
    # on-disk cache carries the loss's compile to the second call on a warm machine)
    PYTHONUNBUFFERED=1 python benchmarks/fp8_probe.py --out $OUT --arms fp8-split,fp8-whole \
        --name probe_fp8
    PYTHONUNBUFFERED=1 python benchmarks/fp8_probe.py --out $OUT --arms bf16-split,bf16-whole \
        --name probe_bf16
    python benchmarks/fp8_probe.py --merge probe_fp8.json probe_bf16.json  # both verdicts
    # CPU: the split's dispatch cost (tiny Llama, gloo, emulated fp8; a tiny model's ZeRO
    # bucket is under DDP's caps, so --per-parameter cuts it as a 1B model's views do)
    python benchmarks/fp8_probe.py --device cpu --hidden 64 --layers 6 --micro-batch 1 \
        --micro-batches 8 --seq-len 32 --steps 6 --per-parameter --out /tmp/probe
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

from meshplan.spec import Job, Layout, ModelSpec  # noqa: E402

ARMS = ("fp8-split", "fp8-whole", "bf16-split", "bf16-whole", "fp8-plain", "bf16-plain")
DEFAULT_ARMS = "fp8-split,fp8-whole,bf16-split,bf16-whole"
TINY = ModelSpec(name="tiny-llama-512", num_layers=2, hidden_size=512, num_heads=4,
                 num_kv_heads=2, ffn_hidden_size=1024, vocab_size=256, max_seq_len=64,
                 activation="swiglu", norm="rmsnorm", position_embedding="rope",
                 tied_embeddings=False, bias=False)
FIRST_ARM_GUESS_S = 35.0      # compile of one Llama-1.64B block and the loss, torch 2.11
HOST_BOUND_SHARE = 0.95


def _model(args) -> ModelSpec:
    if args.device == "cpu":
        h = args.hidden or TINY.hidden_size
        return dataclasses.replace(TINY, num_layers=args.layers or TINY.num_layers,
                                   hidden_size=h, ffn_hidden_size=2 * h)
    from layout_sets import LLAMA_16B
    return dataclasses.replace(LLAMA_16B, num_layers=args.layers or 8)


class _Pieces:
    """Counts DDPOptimizer's buckets (one compiled piece each) per graph it splits."""

    def __init__(self):
        from torch._dynamo.backends.distributed import DDPOptimizer
        self.counts: list[int] = []
        self._cls, self._orig = DDPOptimizer, DDPOptimizer.compile_fn
        probe = self

        def compile_fn(opt, gm, example_inputs, **kw):
            out = probe._orig(opt, gm, example_inputs, **kw)
            probe.counts.append(len(getattr(opt, "buckets", ()) or (1,)))
            return out
        DDPOptimizer.compile_fn = compile_fn

    def close(self) -> None:
        self._cls.compile_fn = self._orig


@contextlib.contextmanager
def _gc_counter(out: list[int]):
    def cb(phase, info):
        if phase == "start":
            out[info["generation"]] += 1
    gc.callbacks.append(cb)
    try:
        yield
    finally:
        gc.callbacks.remove(cb)


def _profile_summary(prof, device, top: int) -> dict:
    """Kernel count, busy fraction (union of kernel intervals over their span) and the top
    kernels of one profiled step; on CPU the top operators by self CPU time."""
    import torch
    if device.type != "cuda":
        ops = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:top]
        return {"top_cpu_ops": [{"name": e.key, "self_cpu_ms": e.self_cpu_time_total / 1e3,
                                 "count": e.count} for e in ops]}
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    if not kernels:
        return {"kernels": 0}
    spans = sorted((e.time_range.start, e.time_range.end) for e in kernels)
    busy, (cur_s, cur_e) = 0.0, spans[0]
    for s, e in spans[1:]:
        if s > cur_e:
            busy, cur_s, cur_e = busy + cur_e - cur_s, s, e
        else:
            cur_e = max(cur_e, e)
    busy += cur_e - cur_s
    span = spans[-1][1] - spans[0][0]
    by_name: dict[str, list[float]] = {}
    for e in kernels:
        by_name.setdefault(e.name, []).append(e.time_range.end - e.time_range.start)
    ranked = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:top]
    return {"kernels": len(kernels), "gpu_busy_ms": busy / 1e3, "span_ms": span / 1e3,
            "gpu_busy_fraction": busy / span if span > 0 else None,
            "top_kernels": [{"name": n[:120], "ms": sum(d) / 1e3, "count": len(d)}
                            for n, d in ranked]}


def run_arm(arm: str, args, model: ModelSpec, device) -> dict:
    import torch
    import torch._dynamo

    from meshplan.executor.data import SyntheticTokens, local_share, to_device
    from meshplan.executor.data_parallel import (OptimizerConfig, build_optimizer,
                                                 wrap_data_parallel)
    from meshplan.executor.measure import StepTimer
    from meshplan.executor.mesh import ReplicaGroups, build_mesh
    from meshplan.executor.parallelize import ParallelTrainer
    precision, mode = arm.split("-")
    torch._dynamo.reset()
    layout = Layout(micro_batch=args.micro_batch, compile=True)
    job = Job(global_batch=args.micro_batch * args.micro_batches, seq_len=args.seq_len,
              precision=precision, runtime="torch",
              **({"fp8_recipe": "tensorwise"} if precision == "fp8" else {}))
    t0 = time.perf_counter()
    groups = build_mesh(layout, device.type, tied_embeddings=model.tied_embeddings)
    trainer = ParallelTrainer(model, job, layout, groups, device, compile=True)
    part = None
    if mode != "plain":      # the executor's dp > 1 ZeRO-1 path on this one-rank group
        part = trainer.parts[0]
        stand_in = ReplicaGroups(dp=2, dp_group=groups.dp_group, dp_mesh=None)
        part.wrapped = wrap_data_parallel(part.module, zero=1, groups=stand_in,
                                          device=device, bf16=trainer.bf16, pipelined=False)
        trainer.optimizer = build_optimizer(list(part.module.parameters()), zero=1,
                                            groups=stand_in, device=device,
                                            config=OptimizerConfig())
        if args.per_parameter:
            # a tiny model's ZeRO bucket is under DDP's caps: cut at every parameter, as a
            # 1B model's 25 MB-plus bucket views make DDPOptimizer do
            torch.distributed._DEFAULT_FIRST_BUCKET_BYTES = 1
            part.wrapped.bucket_bytes_cap = 1
    # after the wrap, which turns DDPOptimizer off for the executor since this probe ran
    # (blocks compile lazily, at their first forward)
    torch._dynamo.config.optimize_ddp = mode == "split"
    pieces = _Pieces()
    data = SyntheticTokens(model.vocab_size, job.seq_len, seed=0)
    timer = StepTimer(device)
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    gcs = [0, 0, 0]
    first_step_s = None
    cpu_mb: list[float] = []      # process CPU time of the micro-batches that do not sync
    try:
        for step in range(args.warmup + args.steps):
            batch = to_device(local_share(data.global_batch(step, job.global_batch), 1, 0),
                              device)
            if step == args.warmup:
                sync()
                if cuda:
                    torch.cuda.reset_peak_memory_stats(device)
            timed = step >= args.warmup
            if timed:
                timer.start()
            cpu_marks: list[tuple[str, float]] = []

            def mark(name: str) -> None:
                cpu_marks.append((name, time.process_time()))
                timer.mark(name)
            with _gc_counter(gcs) if timed else contextlib.nullcontext():
                trainer.step(batch, mark=mark)
            if timed:
                timer.stop()
                ends = [t for name, t in cpu_marks if name.startswith("backward")]
                cpu_mb += [b - a for a, b in zip(ends[:-2], ends[1:-1])]
            if step == 0:
                sync()
                first_step_s = time.perf_counter() - t0
        steps = timer.durations_s()
        host = timer.host_durations_s()
        phases = timer.phase_medians_ms()
        peak = float(torch.cuda.max_memory_allocated(device)) if cuda else None
        from torch.profiler import ProfilerActivity, profile
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        batch = to_device(local_share(data.global_batch(999, job.global_batch), 1, 0), device)
        try:
            with profile(activities=acts) as prof:
                trainer.step(batch)
                sync()
            prof_summary = _profile_summary(prof, device, args.top)
        except Exception as exc:  # noqa: BLE001 — the timings stand without it
            prof_summary = {"error": f"{type(exc).__name__}: {exc}"[:500]}
    finally:
        pieces.close()
    n = trainer.num_microbatches

    def per_mb(prefix: str, key: str) -> float | None:
        vals = [v[key] for name, v in phases.items() if name.split(" #")[0].startswith(prefix)]
        return statistics.median(vals) if vals else None
    out = {"arm": arm, "precision": precision, "mode": mode, "layers": model.num_layers,
           "micro_batches": n, "pieces_per_block": max(pieces.counts, default=1),
           "ddp_graphs_split": pieces.counts, "first_step_s": first_step_s,
           "step_ms": statistics.median(steps) * 1e3, "step_ms_all": [s * 1e3 for s in steps],
           "host_step_ms": statistics.median(host) * 1e3,
           "host_cpu_ms_per_mb": statistics.median(cpu_mb) * 1e3 if cpu_mb else None,
           "forward_device_ms": per_mb("forward", "device_ms"),
           "forward_host_ms": per_mb("forward", "host_ms"),
           "backward_device_ms": per_mb("backward", "device_ms"),
           "backward_host_ms": per_mb("backward", "host_ms"),
           "optimizer_device_ms": (phases.get("optimizer") or {}).get("device_ms"),
           "optimizer_host_ms": (phases.get("optimizer") or {}).get("host_ms"),
           "peak_gib": peak / 2**30 if peak is not None else None,
           "gc_collections_timed": gcs, "profile": prof_summary,
           "wall_s": time.perf_counter() - t0}
    del trainer, batch, part
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return out


def verdict(arms: dict[str, dict]) -> dict:
    """What the arms say (numbers only; docs/benchmarks/fp8_checks.md reads them)."""
    out: dict = {}
    for mode in ("split", "whole", "plain"):
        b, f = arms.get(f"bf16-{mode}"), arms.get(f"fp8-{mode}")
        if b and f:
            out[f"fp8_speedup_{mode}"] = b["step_ms"] / f["step_ms"]
    for prec in ("bf16", "fp8"):
        s, w = arms.get(f"{prec}-split"), arms.get(f"{prec}-whole")
        if s and w:
            lm = s["layers"] * s["micro_batches"]
            out[f"{prec}_split_cost_device_ms_per_layer_mb"] = (s["step_ms"] - w["step_ms"]) / lm
            out[f"{prec}_split_cost_host_ms_per_layer_mb"] = (
                (s["host_step_ms"] - w["host_step_ms"]) / lm)
            if s["host_cpu_ms_per_mb"] is not None and w["host_cpu_ms_per_mb"] is not None:
                out[f"{prec}_split_cost_host_cpu_ms_per_layer_mb"] = (
                    (s["host_cpu_ms_per_mb"] - w["host_cpu_ms_per_mb"]) / s["layers"])
            out[f"{prec}_split_extra_peak_gib"] = ((s["peak_gib"] or 0) - (w["peak_gib"] or 0)
                                                   if s["peak_gib"] is not None else None)
    for name, a in arms.items():
        out[f"{name}_host_bound"] = a["host_step_ms"] >= HOST_BOUND_SHARE * a["step_ms"]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    p.add_argument("--arms", default=DEFAULT_ARMS, help=f"comma-separated of {', '.join(ARMS)}")
    p.add_argument("--layers", type=int, default=0, help="blocks (default 8 on GPU, 2 on CPU)")
    p.add_argument("--hidden", type=int, default=0, help="CPU: the tiny Llama's h (ffn 2h)")
    p.add_argument("--per-parameter", action="store_true",
                   help="split arms: cut at every parameter whatever the bucket size")
    p.add_argument("--micro-batch", type=int, default=2)
    p.add_argument("--micro-batches", type=int, default=4, help="per step (f01: 32 / 4 / 2)")
    p.add_argument("--seq-len", type=int, default=0, help="default 2048 on GPU, 64 on CPU")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--budget", type=float, default=110.0, help="seconds; later arms skipped")
    p.add_argument("--name", default="fp8_probe", help="the JSON's name under --out")
    p.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                   help="no run: the verdict over the arms of these probe files")
    a = p.parse_args(argv)
    if a.merge:
        merged = {k: v for f in a.merge for k, v in json.loads(Path(f).read_text())
                  ["arms"].items() if "error" not in v}
        print(json.dumps(verdict(merged), indent=1))
        return 0
    import torch
    import torch.distributed as dist
    if a.device == "auto":
        a.device = "cuda" if torch.cuda.is_available() else "cpu"
    arms = [x for x in a.arms.split(",") if x]
    bad = [x for x in arms if x not in ARMS]
    if bad:
        p.error(f"unknown arm(s) {', '.join(bad)}; valid: {', '.join(ARMS)}")
    a.seq_len = a.seq_len or (2048 if a.device == "cuda" else 64)
    device = torch.device("cuda", 0) if a.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        # one thread and no subnormal arithmetic: the emulated fp8 GEMMs' dequantized
        # operands otherwise hit the CPU's slow subnormal path and dwarf the dispatch
        torch.set_num_threads(1)
        torch.set_flush_denormal(True)
    model = dataclasses.replace(_model(a), max_seq_len=max(a.seq_len, 1))
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    store = tempfile.mkdtemp(prefix="fp8probe")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                            init_method=f"file://{store}/pg", rank=0, world_size=1)
    doc = {"what": "benchmarks/fp8_probe.py: f01-like step, blocks compiled whole or split",
           "torch": torch.__version__, "device": (torch.cuda.get_device_name(device)
                                                  if device.type == "cuda" else "cpu"),
           "model": dataclasses.asdict(model), "micro_batch": a.micro_batch,
           "micro_batches": a.micro_batches, "seq_len": a.seq_len, "arms": {}, "skipped": {}}
    path = out_dir / f"{a.name}.json"
    start, walls = time.perf_counter(), []
    try:
        for arm in arms:
            left = a.budget - (time.perf_counter() - start)
            longest = max(walls) if walls else (FIRST_ARM_GUESS_S if device.type == "cuda"
                                                else 0.0)
            if left < longest:
                doc["skipped"][arm] = f"budget: {left:.0f} s left, an arm took {longest:.0f} s"
                continue
            try:
                r = run_arm(arm, a, model, device)
                doc["arms"][arm] = r
                walls.append(r["wall_s"])
                print(f"{arm}: step {r['step_ms']:.1f} ms (host {r['host_step_ms']:.1f}), "
                      f"{r['pieces_per_block']} piece(s) per block, peak "
                      f"{r['peak_gib'] or 0:.2f} GiB, {r['wall_s']:.0f} s", flush=True)
            except Exception as exc:  # noqa: BLE001 — one arm's failure is a result
                doc["arms"][arm] = {"arm": arm, "error": f"{type(exc).__name__}: {exc}"[:2000]}
                print(f"{arm}: failed: {exc}", flush=True)
            doc["verdict"] = verdict({k: v for k, v in doc["arms"].items() if "error" not in v})
            path.write_text(json.dumps(doc, indent=1))
    finally:
        dist.destroy_process_group()
    print(json.dumps(doc.get("verdict", {}), indent=1))
    return 0 if any("error" not in v for v in doc["arms"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
