"""``meshplan calibrate``: run the microbenchmarks on this machine and write a profile.

Launched as one process (CPU, or one GPU) or by torchrun across the node's GPUs
(``WORLD_SIZE`` > 1: NCCL on CUDA, gloo on CPU). Every rank runs the compute benchmarks at
the same time — training keeps all GPUs busy, so clocks and power are as in a real step —
then the collectives; rank 0 writes the profile, atomically.
"""

from __future__ import annotations

import os
import platform
import socket
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from meshplan.calibrate.budget import check_time_budget, started_perf_counter
from meshplan.calibrate.layer_run import (CPU_DEEP_LAYERS, CPU_STEADY_LAYERS, STEADY_GAP_S,
                                         STEADY_WINDOWS)
from meshplan.calibrate.sustained import loop_seconds
from meshplan.spec import ModelSpec
from meshplan.errors import ConfigError, require_positive_int

# torch device name fragment -> built-in GPU profile (checked in order)
DEVICE_NAME_TO_GPU = (("H200", "H200-SXM-141GB"), ("H100", "H100-SXM5-80GB"),
                      ("B200", "B200"), ("V100", "V100-SXM3-32GB"))


@dataclass(frozen=True, kw_only=True)
class CalibrateOptions:
    out: Path
    device: str = "auto"           # auto | cuda | cpu
    quick: bool = False
    models: tuple[ModelSpec, ...] = ()   # with models: their GEMM shapes and layer tables
    seq_len: int | None = None
    base_gpu: str | None = None
    max_tp: int = 8
    micro_batches: tuple[int, ...] | None = None   # layer-table sizes (None: the default set)
    # tp > 1 layer rows with sequence parallelism only (--sp-only; layer_grid.plan_grid)
    sp_only: bool = False
    # the expert-parallel degrees an MoE model's rows are timed at (--ep; None: every degree
    # that divides the world and the experts: layer_grid.expert_degrees)
    ep_degrees: tuple[int, ...] | None = None
    split_timing: str = "synchronized"   # zero-bubble's split backward: synchronized | queued
    show_progress: bool = True
    # layer-table rounds at most (None: bench_layers.rounds_for, 3 on GPU)
    layer_rounds: int | None = None
    # wall clock for the whole calibration (None: no limit); a layer round after the first
    # runs only if projected to fit (meshplan.calibrate.budget)
    time_budget_s: float | None = None
    # fp8 GEMMs and casts on GPUs with fp8 tensor cores (meshplan.calibrate.bench_fp8)
    fp8: bool = True
    # recompute modes whose plain layer rows are also timed compiled (--compile-rows; first
    # layer round only); () = none
    compile_rows: tuple[str, ...] = ()
    # an fp8 recipe whose plain layer rows are also timed with the
    # executor's fp8 linears (--fp8-rows; compiled at the compile_rows modes); "" = none
    fp8_rows: str = ""
    # also time the layer tables of the stand-in shapes of meshplan.calibrate.generic_layers
    # (--layer-grid): rows a model that was not timed borrows through the nearest shape
    layer_grid: bool = False
    # seconds each built layer module also runs back to back, in the first layer round, for
    # its rows' sustained_ratio (meshplan.calibrate.sustained); None: 2.5 s on a GPU,
    # 0 (off) on CPU; 0: off
    sustained_s: float | None = None
    # time the compute microbenchmarks GPU-alone, behind a spin kernel, with the executor's
    # LayerNorm and RoPE as its step runs them (--queued-microbench; the profile says
    # microbench_timing = "queued" and the cost model adds the work such curves lack:
    # docs/calibrate.md "Compute microbenchmarks")
    queued_microbench: bool = False

    def __post_init__(self) -> None:
        # checked here as well as by the CLI: torchrun children would fail one by one
        if self.layer_rounds is not None:
            require_positive_int("CalibrateOptions", "layer_rounds", self.layer_rounds)
        if self.time_budget_s is not None:
            check_time_budget("CalibrateOptions.time_budget_s", self.time_budget_s)
        if self.sustained_s is not None and not (0 <= self.sustained_s < float("inf")):
            raise ConfigError(f"CalibrateOptions.sustained_s {self.sustained_s!r}: seconds "
                              f">= 0 (0 switches the sustained-clock ratio off)")
        from meshplan.spec.choices import RECOMPUTE
        bad = [r for r in self.compile_rows if r not in RECOMPUTE]
        if bad:
            raise ConfigError(f"CalibrateOptions.compile_rows {list(self.compile_rows)}: "
                              f"{bad} not a recompute mode; choose from {list(RECOMPUTE)}")
        if self.fp8_rows:
            from meshplan.spec.choices import TORCH_FP8_RECIPES
            runs = list(TORCH_FP8_RECIPES)
            if self.fp8_rows not in runs:
                raise ConfigError(f"CalibrateOptions.fp8_rows {self.fp8_rows!r}: not a recipe "
                                  f"the executor runs; choose from {runs}")


#: fp8 recipes after the first are timed on this many of the largest GEMM shapes
FP8_RECIPE_SHAPES = 4


def has_fp8_tensor_cores(device) -> bool:
    """CUDA compute capability 8.9 (Ada) or later: the GPUs with fp8 tensor cores."""
    import torch
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


def fp8_rows_hint(layer_rows: bool, fp8_rows: str) -> str | None:
    """What a calibration of a model's layer rows on an fp8 GPU says when it times no fp8
    rows: its fp8 estimates will be composed from the bf16 rows."""
    if not layer_rows or fp8_rows:
        return None
    return ("no fp8 layer rows (--fp8-rows RECIPE times them): fp8 estimates of these models "
            "will be the bf16 rows plus fp8's terms — on H200 within 4.7 % mean of measured "
            "compiled fp8 rows, elsewhere their casts priced as if cast alone, 1-38 % slow on "
            "seven H200 arms (docs/benchmarks/fp8_checks.md \"Compiled fp8 composed from bf16 "
            "rows\"), and without the extra host dispatch of compiled fp8, which host-bound "
            "layouts pay (fp8h17: up to 19 % slower than priced)")


def runnable_fp8_rows(recipe: str, device) -> tuple[str, str]:
    """(``recipe``, "") where this device runs the executor's fp8 linears of ``recipe``
    (emulated on CPU; on a GPU its kernel probe passes), else ("", why not): the fp8 rows
    are then left out rather than failing the calibration at their first row."""
    if not recipe:
        return "", ""
    from meshplan.errors import ExecutorError
    from meshplan.executor.fp8 import check_recipe_runnable, probe_kernel
    try:
        r = check_recipe_runnable(recipe, device)
        if device.type == "cuda":
            probe_kernel(r, device)
    except ExecutorError as exc:
        return "", f"--fp8-rows {recipe}: no fp8 rows on this device ({exc})"
    return recipe, ""


def detect_base_gpu(device_name: str, memory_bytes: int) -> str:
    for frag, name in DEVICE_NAME_TO_GPU:
        if frag in device_name:
            return name
    if "A100" in device_name:
        return "A100-SXM4-80GB" if memory_bytes > 60 * 2**30 else "A100-SXM4-40GB"
    from meshplan.hardware_profiles import builtin_gpu_names
    raise ConfigError(f"cannot tell which built-in GPU profile {device_name!r} extends; pass "
                      f"--base-gpu with one of {', '.join(builtin_gpu_names())}")


def provenance(device, options: CalibrateOptions, world: int, *, layer_rounds: int = 0,
               host_probe_us: tuple[float, ...] = (),
               rows_untimed: dict[str, int] | None = None,
               reread_rounds: int = 0,
               synced_readings: dict[str, list[list[float]]] | None = None,
               rows_skipped: dict[str, str] | None = None
               ) -> dict[str, Any]:
    """Where and how the profile was measured. ``layer_rounds``: the rounds the layer tables
    were measured in (0: no layer tables); ``time_budget_s`` only where one was given;
    ``host_probe_us``: rank 0's host dispatch probe (``executor.measure.
    host_dispatch_probe_us``) at the start and the end of the calibration, the host speed
    its CPU dispatch times were taken at; ``rows_untimed``: the rows of each kind a
    ``--time-budget`` left untimed (``layer_grid.row_kind``), only where it left some;
    ``layer_reread_rounds``: the rounds after those that re-timed only the rows timed
    synchronized (``bench_layers.LayerTables.reread_rounds``), only where there were any;
    ``synced_readings``: every reading of each row timed synchronized and read more than
    once (its label -> [forward_s, backward_s] per layer, in order; the row keeps each
    phase's median), so that what one reading would have given stays answerable;
    ``rows_skipped``: each layer row skipped as out of memory or failed, and why
    (``bench_layers.LayerTables.skipped``), only where there were any."""
    import torch

    from meshplan.calibrate.bench_layers import micro_batch_sizes
    from meshplan.calibrate.generic_layers import layer_grid_models
    from meshplan._version import __version__, source_commit
    cuda = device.type == "cuda"
    nccl = ""
    if cuda:
        try:
            v = torch.cuda.nccl.version()
            nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except Exception:  # NCCL missing from this build: leave it empty
            nccl = ""
    return {
        "machine": socket.gethostname(), "date": datetime.now(timezone.utc).isoformat(
            timespec="seconds"),
        "device": device.type,
        "gpu_name": torch.cuda.get_device_name(device) if cuda else
        (platform.processor() or platform.machine() or "cpu"),
        "gpu_count": torch.cuda.device_count() if cuda else 0,
        "world_size": world, "torch": torch.__version__,
        "cuda": torch.version.cuda or "" if cuda else "", "nccl": nccl,
        "cpu_threads": torch.get_num_threads(),
        "python": platform.python_version(), "meshplan": __version__,
        # the checkout's commit, where calibrate ran from one ("" otherwise: not written)
        **({"meshplan_commit": c} if (c := source_commit()) else {}),
        # the executor's compiled collectives keep their backward (docs/benchmarks/
        # compiled_grads.md); profiles without this mark may hold defective compiled rows
        "compiled_collectives": "functional when traced",
        # what measured the rows, where the executor or the reading changed (2026-12-01):
        # compiled blocks' selective recompute in their one graph (4656ba4; before, the
        # core outside it read 1.1-2.4x the host time), and the per-call CPU part fitted
        # from a steady deep stack where host-bound, over several windows (docs/benchmarks/
        # host.md, sections 6 and 7)
        "compiled_selective": "core checkpointed in the block's graph",
        "cpu_deep": f"steady on up to {CPU_STEADY_LAYERS} blocks where host-bound "
                    f"({STEADY_WINDOWS} windows {STEADY_GAP_S:g} s apart, averaged), else "
                    f"queued on {CPU_DEEP_LAYERS}",
        "quick": options.quick, "model": ", ".join(m.name for m in options.models),
        **({"layer_grid": ", ".join(m.name for m in layer_grid_models(device.type))}
           if options.layer_grid else {}),
        "micro_batches": ", ".join(map(str, micro_batch_sizes(
            options.quick, options.micro_batches))),
        "split_timing": options.split_timing,
        "compile_rows": ", ".join(options.compile_rows),
        "sp_only": options.sp_only,
        **({"ep_degrees": ", ".join(map(str, options.ep_degrees))}
           if options.ep_degrees is not None else {}),
        "fp8_rows": options.fp8_rows,
        "sustained_s": round(sum(loop_seconds(options.sustained_s, device.type)), 3),
        "fp8": bool(options.fp8 and has_fp8_tensor_cores(device)),
        "python_gc": "off while timing",
        "layer_rounds": layer_rounds,
        **({"host_probe_us": [round(v, 3) for v in host_probe_us]} if host_probe_us else {}),
        **({"time_budget_s": float(options.time_budget_s)}
           if options.time_budget_s is not None else {}),
        **({"rows_untimed": dict(rows_untimed)} if rows_untimed else {}),
        **({"layer_reread_rounds": reread_rounds} if reread_rounds else {}),
        **({"synced_readings": dict(synced_readings)} if synced_readings else {}),
        **({"rows_skipped": dict(rows_skipped)} if rows_skipped else {}),
        "command": " ".join(sys.argv),
    }


def _init_distributed(device_kind: str):
    import torch
    import torch.distributed as dist
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if device_kind == "auto":
        device_kind = "cuda" if torch.cuda.is_available() else "cpu"
    if device_kind == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda was asked for, but torch sees no CUDA device; use "
                          "--device cpu")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(f"cuda:{local}" if device_kind == "cuda" else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if world > 1 and "TORCHELASTIC_RUN_ID" in os.environ:
        # end with torchrun: with no handler of SIGTERM here, its default action ends the
        # rank even blocked in a collective (the executor's ranks, which record where they
        # were, need exit_when_orphaned for that)
        from meshplan.executor.failures import die_with_parent
        die_with_parent()
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                device_id=device if device.type == "cuda" else None)
    return device, world


def calibrate(options: CalibrateOptions) -> Path | None:
    """Run everything; rank 0 returns the written profile's path, other ranks None.

    Python's automatic garbage collection is off throughout (``gc_paused``; the layer
    tables still collect between rows), as in the executor's timed steps with its default
    ``--gc manual``: a collector pause inside a timed iteration would otherwise land in the
    CPU dispatch times the cost model prices host-bound layouts with (on 4 × H100 the
    executor with the collector on ran 29 gen-0 collections per step of GPT pp 4 and one
    161 ms gen-2 pause in 8 steps; docs/benchmarks/accuracy.md, round 10)."""
    from meshplan.executor.gc_control import gc_paused
    with gc_paused():
        return _calibrate(options)


def _ddp_overlap_rows(bench, models, device, world: int, options: CalibrateOptions,
                      prog) -> list[dict[str, Any]]:
    """One DDP-overlap row per model (``None``: the probe's default shape); a probe that
    fails (every rank alike) is skipped with a note, and the profile falls back to the GEMM
    probe's ``overlap_interference`` for data parallelism."""
    import torch.distributed as dist

    from meshplan.calibrate.layer_build import _free as free
    out = []
    for m in models:
        dist.barrier()
        name = m.name if m else "default shape"
        try:
            r = bench(device, world, m, options.seq_len, options.micro_batches)
        except Exception as exc:   # noqa: BLE001 — every rank fails alike; keep the profile
            prog.step(f"DDP overlap on {name} not measured ({type(exc).__name__}: {exc})")
            continue
        finally:
            free(device)              # the probe's blocks and buckets
        out.append(r)
        prog.step(f"DDP overlap on {name} ({r['layers']} blocks, micro-batch "
                  f"{r['micro_batch']}: backward {r['backward_s'] * 1e3:.1f} ms, with its "
                  f"all-reduce {r['sync_s'] * 1e3:.1f} ms, all-reduce alone "
                  f"{r['comm_s'] * 1e3:.1f} ms): {r['value']:.2f}")
    return out


def _calibrate(options: CalibrateOptions) -> Path | None:
    import torch
    import torch.distributed as dist

    from meshplan.calibrate import (bench_comm, bench_compute, bench_ddp_overlap, bench_layers,
                                    bench_overhead, bench_overlap, bench_pipeline, shapes)
    from meshplan.calibrate.budget import RoundBudget
    from meshplan.calibrate.generic_layers import layer_grid_models
    from meshplan.calibrate.profile import build_profile
    from meshplan.calibrate.progress import Progress
    from meshplan.calibrate.tomlfile import dumps, write_text_atomic
    from meshplan.executor.measure import host_dispatch_probe_us
    from meshplan.hardware_profiles.gpu import DEFAULT_OVERLAP_INTERFERENCE
    from meshplan.hardware_profiles import builtin_gpu

    t_start = started_perf_counter(os.environ, time.perf_counter(), time.time())
    device, world = _init_distributed(options.device)
    rank = dist.get_rank() if dist.is_initialized() else 0
    probe_start_us = host_dispatch_probe_us(device)
    kind = device.type
    base = None
    if kind == "cuda":
        props = torch.cuda.get_device_properties(device)
        base = builtin_gpu(options.base_gpu or detect_base_gpu(props.name, props.total_memory))
    elif options.base_gpu:
        raise ConfigError(f"--base-gpu {options.base_gpu!r} applies to GPU calibration; a CPU "
                          f"profile is measured against the CPU's own matmul peak")
    if kind == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    if options.models:
        gemm_set, attn_set = set(), set()
        for m in options.models:
            seq = options.seq_len or m.max_seq_len
            gemm_set.update(shapes.model_gemm_shapes(m, seq, max_tp=options.max_tp))
            attn_set.update(shapes.model_attention_shapes(m, seq, max_tp=options.max_tp))
            attn_set.update(shapes.long_context_attention_shapes(m, seq, kind, options.quick))
        gemms, attn = sorted(gemm_set), sorted(attn_set)
        if kind == "cpu" and options.quick:
            gemms, attn = gemms[:6], attn[:4]
    else:
        gemms = shapes.default_gemm_shapes(options.quick, kind)
        attn = (shapes.default_attention_shapes(options.quick, kind)
                + shapes.long_context_attention_shapes(None, 4096, kind, options.quick))
    fp8_rows, fp8_rows_note = runnable_fp8_rows(options.fp8_rows, device)
    row_models = options.models + (layer_grid_models(kind) if options.layer_grid else ())
    grid = (bench_layers.plan_grid(row_models, options.seq_len, world, quick=options.quick,
                                   max_tp=options.max_tp, micro_batches=options.micro_batches,
                                   compile_rows=options.compile_rows, fp8_rows=fp8_rows,
                                   sp_only=options.sp_only, ep_degrees=options.ep_degrees)
            if row_models else [])
    sizes = shapes.collective_sizes(options.quick, kind)
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    n_comm = bench_comm.count_steps(world, local_world, len(sizes)) if world > 1 else 0
    rounds = options.layer_rounds or bench_layers.rounds_for(device, options.quick)
    fp8 = options.fp8 and has_fp8_tensor_cores(device)
    # the GEMMs and attention also timed GPU-alone, beside the synchronized main curves:
    # recorded for study, not priced (calibrate/profile.py; docs/calibrate.md)
    alone = (kind == "cuda" and not options.queued_microbench
             and hasattr(torch.cuda, "_sleep"))
    # DDP's overlap is probed on each dense model's blocks (a default shape without one)
    ddp_models = [m for m in row_models if not m.num_experts] or [None]
    total = (len(gemms) + len(attn) + 2 + n_comm + (1 if kind == "cpu" else 0)
             + len(grid) * rounds + (2 + len(ddp_models) if world > 1 else 0)
             + (1 if fp8 else 0) + (1 if alone else 0)
             + (1 if any(m.num_experts for m in options.models) else 0))
    prog = Progress(total, enabled=options.show_progress and rank == 0)
    if fp8_rows_note:
        prog.note(fp8_rows_note)
    prog.note(f"meshplan calibrate: {kind}, world size {world}, "
              f"{len(gemms)} GEMMs, {len(attn)} attention sizes, {len(sizes)} message sizes, "
              f"{len(grid)} layer configurations"
              + (f" in up to {rounds} rounds" if grid else "")
              + (f", time budget {options.time_budget_s:g} s" if options.time_budget_s
                 else "")
              + (f", base profile {base.name}" if base else ""))

    rows: dict[str, list[dict[str, Any]]] = {"gemm": [], "attention": [], "membound": [],
                                             "overheads": [], "collectives": [], "latency": []}
    cpu_peak = cpu_bw = mem = None
    if kind == "cpu":
        cpu_peak, rows["cpu_peak"] = bench_compute.cpu_matmul_peak_tflops(options.quick)
        cpu_bw = bench_compute.cpu_copy_gbps(shapes.membound_elements(options.quick, kind))
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        prog.step(f"cpu peak {cpu_peak:.3f} TFLOP/s, copy {cpu_bw:.1f} GB/s")
    for g in gemms:
        r = bench_compute.bench_gemm(g, device, queued=options.queued_microbench)
        rows["gemm"].append(r)
        prog.step(f"gemm {g.m}x{g.k}x{g.n} {g.label}: "
                  f"{6 * g.m * g.k * g.n / r['seconds'] / 1e12:.2f} TFLOP/s")
    if fp8:
        from meshplan.calibrate.bench_fp8 import fp8_rows as bench_fp8_rows
        t0 = time.perf_counter()
        part = bench_fp8_rows(gemms, device, compiled_casts=True, recipe_shapes=FP8_RECIPE_SHAPES)
        rows.update(part)
        ran = sorted({r["recipe"] for r in part["fp8_gemm"] if "gemm_seconds" in r})
        prog.step(f"fp8: {len(part['fp8_gemm'])} GEMM rows (recipes that ran: "
                  f"{', '.join(ran) or 'none'}), {len(part['fp8_cast'])} casts in "
                  f"{time.perf_counter() - t0:.0f} s")
        hint = fp8_rows_hint(bool(grid), fp8_rows)
        if hint:
            prog.note(hint)
    for a in attn:
        r = bench_compute.bench_attention(a, device, queued=options.queued_microbench)
        rows["attention"].append(r)
        prog.step(f"attention b{a.batch} s{a.seq} h{a.heads} d{a.head_dim}: "
                  f"{r['seconds'] * 1e3:.3f} ms")
    if alone:
        t0 = time.perf_counter()
        rows["gemm_alone"] = [bench_compute.bench_gemm(g, device, queued=True) for g in gemms]
        rows["attention_alone"] = [bench_compute.bench_attention(a, device, queued=True)
                                   for a in attn]
        prog.step(f"GPU-alone: {len(gemms)} GEMMs, {len(attn)} attention sizes in "
                  f"{time.perf_counter() - t0:.0f} s")
    free = torch.cuda.mem_get_info(device)[0] if kind == "cuda" else None
    rows["membound"] = bench_compute.bench_membound(
        shapes.membound_elements(options.quick, kind), device,
        queued=options.queued_microbench, as_run=options.queued_microbench,
        optimizer_numel=shapes.optimizer_elements(options.quick, kind, free))
    if kind == "cuda":
        torch.cuda.empty_cache()    # the optimizer row's 8 GiB back before the layer rows
    prog.step("memory-bound ops: " + ", ".join(
        f"{r['op']} {r['model_bytes'] / r['seconds'] / 1e9:.0f} GB/s" for r in rows["membound"]))
    like = options.models[0] if options.models else None
    if any(m.num_experts for m in options.models):
        from meshplan.calibrate.bench_moe import moe_rows
        from meshplan.calibrate.layer_grid import micro_batch_sizes
        rows.update(moe_rows(options.models, options.seq_len, device, world, quick=options.quick,
                             micro_batches=micro_batch_sizes(options.quick,
                                                             options.micro_batches)))
        prog.step(f"MoE: {len(rows['grouped_gemm'])} grouped GEMMs, permutation, host syncs")
    rows["overheads"] = bench_overhead.bench_overheads(device, like,
                                                       iters=5 if options.quick else 10)
    prog.step("fixed overheads: " + ", ".join(f"{r['kind']} {r['seconds'] * 1e6:.0f} us"
                                                for r in rows["overheads"]))
    if world > 1:
        dist.barrier()
        rows.update(bench_comm.bench_collectives(sizes, device, iters=10 if options.quick else 20,
                                                 progress=prog))
    else:
        prog.note("world size 1: collectives skipped (launch with torchrun across the GPUs "
                  "to measure them)")
    layers: list[dict[str, Any]] = []
    ends: list[dict[str, Any]] = []
    layer_rounds = reread_rounds = 0
    untimed: dict[str, int] = {}
    synced_readings: dict[str, list[list[float]]] = {}
    skipped: dict[str, str] = {}
    if grid:
        t0 = time.perf_counter()
        if world > 1:
            dist.barrier()
        budget = (RoundBudget(budget_s=options.time_budget_s, started_s=t_start)
                  if options.time_budget_s is not None else None)
        tables = bench_layers.bench_layer_rows(
            row_models, options.seq_len, device, world, rank, quick=options.quick,
            progress=prog, max_tp=options.max_tp, micro_batches=options.micro_batches,
            split_queued=options.split_timing == "queued", rounds=rounds, budget=budget,
            compile_rows=options.compile_rows, fp8_rows=fp8_rows, sp_only=options.sp_only,
            ep_degrees=options.ep_degrees,
            sustained=loop_seconds(options.sustained_s, device.type))
        layers, ends, layer_rounds = tables.layers, tables.ends, tables.rounds
        untimed, reread_rounds = tables.untimed, tables.reread_rounds
        synced_readings, skipped = tables.synced_readings, tables.skipped
        prog.note(f"layer tables: {len(layers)} layer and {len(ends)} end rows from "
                  f"{layer_rounds} of {rounds} rounds"
                  + (f" (the rows timed synchronized re-timed in {reread_rounds} more)"
                     if reread_rounds else "")
                  + f" in {time.perf_counter() - t0:.1f} s")
    if world > 1:
        dist.barrier()
        r = bench_pipeline.bench_pipeline_action_s(device, world)
        rows["pipeline"] = [r]
        prog.step(f"pipeline action (1f1b, pp {r['pp']}, {r['microbatches']} micro-batches): "
                  f"{r['seconds'] * 1e6:.0f} us")
        dist.barrier()
        try:
            o = bench_overlap.bench_overlap(device, world)
        except RuntimeError as exc:   # every rank runs the same code: they fail alike
            # a failed optional measurement must not cost the whole profile
            kept = base.overlap_interference if base else DEFAULT_OVERLAP_INTERFERENCE
            prog.step(f"overlap interference not measured ({exc}); the profile keeps {kept}")
        else:
            rows["overlap"] = [o]
            prog.step(f"overlap interference (all-reduce {o['comm_s'] * 1e3:.1f} ms behind "
                      f"{o['gemms']} GEMMs {o['compute_s'] * 1e3:.1f} ms, together "
                      f"{o['both_s'] * 1e3:.1f} ms): {o['value']:.2f}")
        rows.setdefault("overlap", []).extend(
            _ddp_overlap_rows(bench_ddp_overlap.bench_ddp_overlap, ddp_models, device, world,
                              options, prog))
    path = None
    if rank == 0:
        doc = build_profile(measurements=rows, base=base, device=kind,
                            provenance=provenance(
                                device, options, world, layer_rounds=layer_rounds,
                                host_probe_us=(probe_start_us,
                                               host_dispatch_probe_us(device)),
                                rows_untimed=untimed, reread_rounds=reread_rounds,
                                synced_readings=synced_readings, rows_skipped=skipped),
                            cpu_peak_tflops=cpu_peak, cpu_memory_gbps=cpu_bw, memory_bytes=mem,
                            layers=layers, ends=ends)
        from meshplan.calibrate.moe_profile import add_moe_keys
        add_moe_keys(doc, base, kind)
        if options.queued_microbench and kind == "cuda":
            doc["gpu"]["microbench_timing"] = "queued"
        path = write_text_atomic(options.out, dumps(doc))
        if kind == "cuda" and fp8_rows and layers:
            # the compiled fp8 rows also say what casts cost inside a block, for the layouts
            # they do not cover (calibrate/fp8_block_share.py); read off the written profile,
            # which is on disk first so that this optional reading cannot cost it
            from meshplan.calibrate.fp8_block_share import measure_from_profile
            share = measure_from_profile(path, row_models, world)
            if share is not None:
                doc["gpu"]["fp8_cast_compiled_block_share"] = share
                doc["measured"].append("fp8_cast_compiled_block_share")
                path = write_text_atomic(options.out, dumps(doc))
        prog.note(f"wrote {path} (measured: {', '.join(doc['measured'])}) in "
                  f"{time.perf_counter() - t_start:.1f} s")
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    return path
