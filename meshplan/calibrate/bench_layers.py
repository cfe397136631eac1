"""Layer-level benchmarks: the executor's own transformer blocks and ends, timed per layer.

For every model, sequence length and parallel setting that the cost model looks up
(:mod:`meshplan.costmodel.measured`), the executor's modules are built exactly as
:class:`meshplan.executor.parallelize.ParallelTrainer` builds them — ``Transformer`` on the
meta device, :meth:`~meshplan.executor.model.Transformer.keep_part`, ``init_weights``,
:func:`~meshplan.executor.tensor_parallel.apply_tensor_parallel`, the recomputation flags
and, for ZeRO-2/3, :func:`~meshplan.executor.data_parallel.wrap_data_parallel` (FSDP2) — and
one micro-batch's forward and backward is timed. Every unfused element-wise kernel, every
tensor-parallel collective issued from Python and FSDP2's per-block hooks are in the time;
that is what the isolated GEMM/attention curves miss.

Row semantics (one GPU, one micro-batch; every rank runs the same configuration at the
same time; times are the mean over ranks of each rank's median, memory the largest over
ranks; the whole grid is measured :data:`ROUNDS_CUDA` times (``--rounds``; fewer where
``--time-budget`` stops them, :mod:`meshplan.calibrate.budget`, the rows timed synchronized
then re-timed alone in the rounds left where they fit: :func:`bench_layer_rows`), spread over
the run, and each time is the median over rounds):

* layers (``L`` = :data:`LAYERS_CUDA` blocks on GPU, :data:`LAYERS_CPU` on CPU):
  ``forward_s`` / ``backward_s`` = GPU-busy time of the L-block forward / backward over L,
  timed *queued*: a spin kernel holds the stream while the CPU dispatches the whole
  forward and backward, so the CUDA events see the GPU alone (checked per iteration; see
  :class:`_Queue`). Backward includes recomputation and, for FSDP rows, the gradient
  reduce-scatter and ZeRO-3 re-gathers. ``forward_cpu_s`` / ``backward_cpu_s`` = the CPU's
  dispatch time of the same calls over L (pooled over the micro-batch sizes of a setting,
  :func:`pooled_cpu`). A step costs about max(Σ CPU, Σ GPU) because the CPU runs ahead of
  the GPU; the cost model takes both (:mod:`meshplan.costmodel.estimate`).
  ``activation_bytes`` = (what a *second* forward of a fresh input keeps alive, that input
  included, − its output) / L: what one more micro-batch in flight costs, *including the
  layer's own input once* (the last block's output is nobody's saved tensor — a pipeline
  stage keeps it apart, ``costmodel.estimate.pipeline_kept_outputs``; this matches the
  per-layer convention of Korthikanti et al. 2022, arXiv 2205.05198, Table 2, whose
  2sbh-per-layer "full recompute" term is the layer's input). Profile version 1 added the
  input a second time (``hardware_profiles.calibrated._v1_layer_row`` corrects it). The
  first forward of a step also fills one-time caches (autocast's 16-bit weight copies),
  which the cost model counts once per step; FSDP rows keep the timed iterations'
  allocator difference, with ZeRO-2's unsharded bf16 parameters subtracted (held once per
  stage, not per micro-batch in flight).
  ``backward_peak_bytes`` = peak allocated during forward + backward − allocated after
  forward (not divided by L: the working memory of the one layer whose backward is
  running — recomputed activations, gradients in flight, FSDP2 unsharded gradients).
  ``backward_input_s`` / ``backward_weight_s`` (ZeRO-0 rows and FSDP2's 1-rank rows, whose
  timed passes do not communicate; 0 = not measured): the
  zero-bubble schedule's split backward of the same L blocks over L, run by
  torch.distributed.pipelining's own functions (:mod:`meshplan.calibrate.bench_split`),
  synchronized timings (``--split-timing queued``: GPU-busy, with their CPU dispatch in
  ``backward_input_cpu_s`` / ``backward_weight_cpu_s``; run on 2 and 4 × H200 in rounds 5-7).
  ``split_layers`` = that L, and ``backward_input_depth_s`` / ``backward_weight_depth_s`` =
  how much B and W per layer grow per extra layer in the stack, from the split timed
  synchronized on L (the row itself, or again right before when the row was queued) and on
  :data:`SPLIT_DEEP_LAYERS` blocks (first round only, so that it is there however many
  rounds run). W grows because ``stage_backward_weight`` makes one ``torch.autograd.grad``
  call per parameter group, and each call's engine walks the whole graph reachable from
  its roots — the rest of the stage — first (``compute_dependencies``): the CPU cost of a
  stage's W is quadratic in its layers (tiny Llama blocks on one CPU thread, torch 2.13:
  W per layer 0.47 ms on 2 blocks, 0.70 on 6, 1.03 on 12 — linear in the depth).
* ends: ``embedding`` = the token embedding (+ learned positions) of the first stage;
  ``output`` = final norm, logits and the loss (vocabulary-parallel cross-entropy for
  tp > 1, as ``ParallelTrainer.loss_fn``) of the last stage. ``activation_bytes`` = allocated
  after forward − before − the output (embedding: the hidden state, which the first layer
  counts; output: the loss scalar) + the input for the output part (its input is the last
  layer's output, which no layer counts), from a second forward as for layers.
  ``peak_bytes`` = peak − allocated after forward. Times and CPU fields as for layers.

On CPU (tests, gloo) the times are synchronized wall-clock medians, one round, and the
memory and CPU fields are 0.

This module runs the rounds over the grid; the parts live beside it: which rows
(:mod:`~meshplan.calibrate.layer_grid`), building a row's module
(:mod:`~meshplan.calibrate.layer_build`), timing (:mod:`~meshplan.calibrate.layer_timing`),
one row (:mod:`~meshplan.calibrate.layer_run`), the split backward
(:mod:`~meshplan.calibrate.layer_split`), the rows' arithmetic
(:mod:`~meshplan.calibrate.layer_rows`), the budget (:mod:`~meshplan.calibrate.layer_budget`)
and the ranks (:mod:`~meshplan.calibrate.layer_ranks`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from meshplan.calibrate.budget import RoundBudget
from meshplan.calibrate.layer_budget import _budget_stops, _reread_fits, _row_budget_stops
from meshplan.calibrate.layer_build import (_allocated_note, _build, _free, _oom_types,
                                            allocatable_bytes)
from meshplan.calibrate.layer_grid import (MISSING_ROWS, Config, micro_batch_sizes, plan_grid,
                                          untimed_summary)
from meshplan.calibrate.layer_ranks import _Groups, _reduce, dp_mesh_shape
from meshplan.calibrate.layer_rows import (MEMORY_FIELDS, NO_SPLIT_MEMORY, Sample, _cpu_fields,
                                           combine_rounds, cpu_deep_reading, cpu_fixed,
                                           cpu_values, end_row, end_values, layer_row,
                                           layer_values, pooled_cpu,
                                           reading_spread, row_need_bytes, smaller_timed_rows,
                                           split_depth, split_memory_stage, suspect_splits)
from meshplan.calibrate.layer_run import (CPU_DEEP_LAYERS, _cpu_deep, _run_end, _run_layer,
                                          _run_sustained, _sync_deep, steady_cpu_layers)
from meshplan.calibrate.layer_split import SPLIT_DEEP_LAYERS, _deep_split
from meshplan.calibrate.layer_timing import _Queue
from meshplan.calibrate.progress import _note, _step
from meshplan.calibrate.sustained import ratio_rows
from meshplan.spec import ModelSpec
from meshplan.errors import require_positive_int

LAYERS_CUDA = 2       # queued behind one spin kernel: few enough for the launch queue
LAYERS_CPU = 2
ITERS, ITERS_QUICK = 4, 3
ROUNDS_CUDA = 3       # the grid is measured this many times, spread over the calibration


def rounds_for(device, quick: bool) -> int:
    """How many times the whole grid is measured by default (rows are the median over
    rounds); ``--rounds`` sets it, ``--time-budget`` may stop earlier."""
    return ROUNDS_CUDA if device.type == "cuda" and not quick else 1


@dataclass(frozen=True, kw_only=True)
class LayerTables:
    """What :func:`bench_layer_rows` measured: rows with exactly the fields of
    ``MeasuredLayer`` / ``MeasuredEnd``, and how many rounds each row's median is over."""

    layers: list[dict[str, Any]]
    ends: list[dict[str, Any]]
    rounds: int          # rounds measured (fewer than asked for where the budget stopped them)
    # rounds after those that re-timed only the rows timed synchronized (Config.syncs_on_host),
    # where a whole round did not fit the budget (:func:`bench_layer_rows`)
    reread_rounds: int = 0
    # rows of each kind the budget left untimed in the first round (layer_grid.row_kind)
    untimed: dict[str, int] = field(default_factory=dict)
    # each row skipped as out of memory (or failed): its label -> why, e.g. "out of
    # memory", "not run: needs about 96.0 GiB, 80.1 allocatable", "a smaller micro-batch
    # did not fit"; the profile's provenance keeps it beside the log
    skipped: dict[str, str] = field(default_factory=dict)
    # each row timed synchronized and read more than once: its label -> [forward_s,
    # backward_s] per layer of every reading, in order (the row keeps each phase's median)
    synced_readings: dict[str, list[list[float]]] = field(default_factory=dict)


def _records_routing(cfg: Config, rnd: int) -> bool:
    """An eager plain ep > 1 row in the first round records the routing it is timed at (a
    compiled block records nothing: moe_routing; its eager twin routes alike, and so do
    the FSDP2 rows at that ep, which read the plain row's record by the same key)."""
    return cfg.ep > 1 and not cfg.part and not cfg.compile and cfg.zero < 2 and rnd == 0


def _routing_key(cfg: Config) -> tuple:
    return (cfg.model.name, cfg.seq_len, cfg.tp, cfg.sequence_parallel, cfg.micro_batch,
            cfg.ep)


def _routing_recorder(module):
    """A recorder on ``module``'s ep > 1 MoE layers, recording (None: it has none)."""
    from meshplan.executor.moe_routing import RoutedRows, attach
    rec = RoutedRows(on=True)
    return rec if attach(module, rec) else None


def _gathered_imbalance(module, recorder, world: int) -> float:
    """ρ of the calls ``recorder`` saw, over the ranks of each ep group (every rank calls
    this; a rank whose row failed sends nothing): the busiest rank's routed rows over the
    mean, so that the cost model prices only the imbalance beyond it (moe_rows); 0 where
    nothing was recorded."""
    import torch.distributed as dist

    from meshplan.executor.moe_routing import ep_layers, imbalance
    layers = ep_layers(module) if module else []
    for layer in layers:
        layer.routing = None            # the next rows of this module record afresh
    mine = ((tuple(dist.get_process_group_ranks(layers[0].ep_group)), recorder.rows)
            if layers and recorder is not None else ((), []))
    every = [None] * world
    dist.all_gather_object(every, mine)
    got = imbalance([r for r in every if r and r[0]])
    return float(got["busiest_over_mean"]) if got else 0.0


def _note_synced_spread(progress, grid: Sequence[Config], readings: dict[int, list]) -> None:
    """Say how far apart the rows timed synchronized read, where any was read more than
    once: the spread a single reading of them carries (each row is the median)."""
    spreads = {i: reading_spread(r) for i, r in readings.items() if len(r) > 1}
    if not spreads:
        return
    worst = max(spreads, key=spreads.get)
    ordered = sorted(spreads.values())
    _note(progress, f"{len(spreads)} rows timed synchronized read up to "
                    f"{max(len(readings[i]) for i in spreads)} times: forward + backward "
                    f"readings {ordered[len(ordered) // 2]:.0%} apart at the median row, "
                    f"{spreads[worst]:.0%} at the widest ({grid[worst].label()}); each row "
                    f"is the median of its readings")


def _module_ratio(grid: Sequence[Config], idx: int, candidates: Sequence[int],
                  measured: dict, module, tp_group, layers: int, device, groups, *,
                  world: int, sustained: tuple[float, float], progress, tag: str,
                  ratios: dict):
    """The sustained-clock ratio of the module of row ``idx`` (its :func:`ratio_rows` row) into
    ``ratios`` under the row's build key, the loop run on the first of ``candidates`` (grid
    indices of rows timed this round) that does not run out of memory; returns (module, tp
    group, seconds spent): the module is built again where ``module`` is None (its ratio row ran
    out of memory and dropped it) and returned for the module's next rows. No candidate fitted:
    no ratio, the rows read at the burst clock (ratio 1). A smaller micro-batch runs the same
    kernels at a lower power density: its ratio is closer to the module's than none (fp8h19, GPT
    2.82 B at seq 8192, 1 x H200: the compiled module's micro-batch 16 row ran out of memory,
    its rows carried 1 and its bf16 arms ran 0.8-8.8 % slower than predicted; the loop on
    another module's row ran out and the calibration died without a profile)."""
    t0 = time.perf_counter()
    fc, bc = _cpu_fields(grid[idx])
    for at in candidates:
        values = measured[at][-1]
        if module is None:
            module, tp_group = _build(grid[at], layers, device, groups)
        got = _run_sustained(grid[at], module, tp_group, layers, device,
                             burst_pass_s=values[0] + values[1],
                             burst_cpu_s=values[fc] + values[bc], world=world,
                             heat_s=sustained[0], time_s=sustained[1])
        where = "" if at == idx else f" (on micro-batch {grid[at].micro_batch})"
        if got is None:
            _step(progress, f"{tag}: sustained loop out of memory{where}"
                            + _allocated_note(device))
            continue
        _step(progress, f"{tag}: sustained pass x {got[0]:.3f} of the timed one{where}"
                        + (" (host-paced: 1)" if got[1].get("host_paced") else ""))
        ratios[grid[idx].build_key] = got[0]
        return module, tp_group, time.perf_counter() - t0
    _step(progress, f"{tag}: no sustained-clock ratio for this module (ratio 1: its rows "
                    f"read at the burst clock)")
    return module, tp_group, time.perf_counter() - t0


def bench_layer_rows(models: Sequence[ModelSpec], seq_len: int | None, device, world: int,
                     rank: int, *, quick: bool, progress=None, max_tp: int = 8,
                     micro_batches: Sequence[int] | None = None, split_queued: bool = False,
                     rounds: int | None = None, budget: RoundBudget | None = None,
                     compile_rows: Sequence[str] = (), fp8_rows: str = "",
                     sustained: tuple[float, float] = (0.0, 0.0),
                     only=None, sync_deep: bool = False, sp_only: bool = False,
                     ep_degrees: Sequence[int] | None = None) -> LayerTables:
    """Measure every configuration of :func:`plan_grid` in ``rounds`` rounds (default
    :func:`rounds_for`); with ``budget``, a round after the first runs only if
    :func:`~meshplan.calibrate.budget.next_round` projects the calibration to end within it.

    Collective over the world: every rank must call it with the same arguments. A
    configuration that runs out of GPU memory on any rank is skipped on all of them. Times
    are averaged over ranks (replicated ranks are independent samples of the same work;
    tensor-parallel ranks wait for each other anyway), memory is the largest over ranks.
    The budget's decision is taken from the largest elapsed and round times over ranks, so
    every rank takes the same.

    ``sustained`` (heat seconds, timed seconds; (0, 0): off): in the first round each built
    module's largest micro-batch (layers: without recomputation) is also run back to back,
    and every row of that module carries the ratio of its sustained to its timed pass
    (:mod:`meshplan.calibrate.sustained`; ``sustained_ratio`` 1 where it was not measured).

    ``only``: a predicate on :class:`~meshplan.calibrate.layer_grid.Config` keeping part of
    the grid (benchmarks that time a few rows, e.g. ``benchmarks/moe_ep_rows_gpu.py``).

    Rows timed synchronized (:attr:`Config.syncs_on_host`: an MoE layer at ep > 1) are the
    ones whose single reading spreads: the host-paced forward of moeh12's ep 2 row read 4.44,
    5.60 and 6.27 ms in three processes, moeh13's recompute-full ep 2 rows 15-30 % above two
    re-readings, and each set's mean error fell by about half with every row the median of
    three (2 x H200, docs/benchmarks/moe_checks.md "moeh12", "moeh13"), where queued GPU-paced rows
    repeat within 1 %. So where the budget stops a whole round after the first, the rounds left
    re-time those rows alone, if their first-round time fits (a single reading's excess goes;
    a process's level stays: moeh13's rows read three times in one later process spread 2-20 %
    there, the tp 2 + SP row's median 23 % above two other processes'); compiled ones included (the
    reason compiled rows are timed once — their GPU time repeats — does not hold for them).
    """
    import torch.distributed as dist
    grid = plan_grid(models, seq_len, world, quick=quick, max_tp=max_tp,
                     micro_batches=micro_batches, compile_rows=compile_rows,
                     fp8_rows=fp8_rows, sp_only=sp_only, ep_degrees=ep_degrees)
    if only is not None:
        grid = [c for c in grid if only(c)]
    layers = LAYERS_CUDA if device.type == "cuda" and not quick else LAYERS_CPU
    iters = ITERS_QUICK if quick else ITERS
    groups = _Groups(world, rank, device.type)
    barrier = dist.barrier if world > 1 and dist.is_initialized() else (lambda: None)
    queue = None
    if device.type == "cuda":
        import torch
        if hasattr(torch.cuda, "_sleep"):
            queue = _Queue(device, lambda v: _reduce(v, range(len(v)), device, world))
        elif progress is not None:   # private API gone: synchronized timings, no CPU fields
            progress.note("torch.cuda._sleep is missing in this torch: layer rows are "
                          "synchronized timings without CPU dispatch times")
    measured: dict[int, list[list[float]]] = {}
    deep: dict[int, tuple[float, float]] = {}      # split backward on SPLIT_DEEP_LAYERS blocks
    deep_mem: dict[int, tuple] = {}  # its split memory (split_memory_stage)
    # CPU per layer on 2 blocks and on the deeper stack, and its blocks, per setting (its
    # smallest micro-batch)
    cpu_deep: dict[tuple, list[tuple[float, float, float, float, int]]] = {}
    smallest: dict[tuple, int] = {}
    for cfg in grid:
        if not cfg.part:
            k = (cfg.build_key, cfg.recompute)
            smallest[k] = min(smallest.get(k, cfg.micro_batch), cfg.micro_batch)
    cpu_key, cpu_module = None, None
    sync_deep_done: set[tuple] = set()   # build keys whose synchronized deep stack is timed
    skipped: set[int] = set()
    rounds = rounds_for(device, quick) if rounds is None else rounds
    require_positive_int("bench_layer_rows", "rounds", rounds)
    spent_s = budget.elapsed_s() if budget is not None else 0.0
    if budget is not None and spent_s + budget.allowance_s > budget.budget_s:
        # a note only (rank 0's view): nothing is decided from it
        _note(progress, f"--time-budget {budget.budget_s:g} s is spent before the layer "
                        f"tables ({spent_s:.0f} s elapsed): no layer row fits; the profile "
                        f"is written without them")
    deep_key, deep_module = None, None
    ratio_at = ratio_rows(grid) if sum(sustained) > 0 else {}
    ratios: dict[tuple, float] = {}
    routing: dict[tuple, float] = {}   # ρ of the routing an ep > 1 row was timed at
    ran = reread_rounds = 0
    untimed: dict[str, int] = {}
    why: dict[str, str] = {}                   # LayerTables.skipped
    active = list(range(len(grid)))            # the rows this round times
    synced = [i for i, c in enumerate(grid) if c.syncs_on_host]
    first_s: dict[int, float] = {}             # each row's time in the first round
    for rnd in range(rounds):
        t_round = time.perf_counter()
        first_only_s = 0.0   # the deep split, which later rounds do not repeat
        built_key, module, tp_group = None, None, None
        oom_at: set[tuple] = set()   # (build key, recompute) whose smaller micro-batch ran out
        t_row, stopped_at, last_idx = None, None, None
        longest_row_s = 0.0   # the next row may build a module and time its splits anew
        for pos, idx in enumerate(active):
            cfg = grid[idx]
            tag = f"round {rnd + 1}: {cfg.label()}"
            if t_row is not None:
                longest_row_s = max(longest_row_s, time.perf_counter() - t_row)
                first_s.setdefault(last_idx, time.perf_counter() - t_row)
            last_idx = idx
            if budget is not None and _row_budget_stops(budget, longest_row_s, device, world,
                                                        progress, tag):
                stopped_at = pos
                break
            t_row = time.perf_counter()
            if cfg.build_key != built_key:
                # the deep stacks too: the grid is grouped by build key, so they would only
                # be rebuilt, and kept they held their parameters, gradients and whatever a
                # failed pass left on them through every later module's rows
                module = tp_group = None
                deep_key = deep_module = cpu_key = cpu_module = None
                _free(device)
                built_key = cfg.build_key
            if idx in skipped:
                _step(progress, f"{tag}: skipped (out of memory or failed in an earlier round)")
                continue
            if cfg.compile and rnd > 0 and not cfg.syncs_on_host:
                # compiling each row again costs more than the rounds' median gains (GPU
                # times repeat within 1 %, docs/calibrate.md): first round only
                _step(progress, f"{tag}: compiled rows are timed in the first round only")
                continue
            if (cfg.build_key, cfg.recompute) in oom_at:   # every rank agreed on that OOM
                skipped.add(idx)
                why[cfg.label()] = "a smaller micro-batch did not fit"
                _step(progress,
                      f"{tag}: skipped (a smaller micro-batch ran out of memory or failed)")
                continue
            n_values = 7 if cfg.part else 11     # the last: samples failing the queue check
            values, oom, failed, short = [0.0] * n_values, 0.0, "", ""
            recorder = None
            t_row = time.perf_counter()
            need, room = row_need_bytes(grid, idx, measured, layers), allocatable_bytes(device)
            if need is not None and need > room:
                # out of memory inside a backward leaves its graph's tensors allocated
                # (pytorch/pytorch#82218) and later rows short: a row that cannot fit is not
                # run. Every rank decides on its own memory and the ranks agree below
                oom, short = 1.0, (f"needs about {need / 2**30:.1f} GiB by its smaller "
                                   f"micro-batch, {room / 2**30:.1f} GiB allocatable: not run")
            else:
                try:
                    if module is None:
                        module, tp_group = _build(cfg, layers, device, groups)
                    if cfg.part:
                        values = list(_run_end(cfg, module, tp_group, device, iters=iters,
                                               barrier=barrier, queue=queue))
                    else:
                        recorder = _routing_recorder(module) if _records_routing(cfg, rnd) \
                            else None
                        values = list(_run_layer(cfg, module, layers, device, iters=iters,
                                                 barrier=barrier, queue=queue,
                                                 split_queued=split_queued, world=world))
                except _oom_types():
                    oom = 1.0
                except Exception as exc:  # noqa: BLE001 — only the rows below, see there
                    if cfg.part or cfg.zero < 2 or cfg.communicates:
                        raise
                    # FSDP2's 1-rank rows (round 18; not yet run on GPUs when written): a
                    # failure costs the row, not the calibration. Every rank runs the same
                    # 1-rank work and fails alike; the row is then skipped like one that ran
                    # out of memory
                    oom, failed = 1.0, f"{type(exc).__name__}: {exc}"
            if oom:
                module = tp_group = None    # FSDP/autograd state of a failed step: rebuild
                _free(device)
            values = _reduce([*values, oom], [*MEMORY_FIELDS, n_values - 1, n_values], device,
                             world)
            if _records_routing(cfg, rnd):      # every rank, like _reduce
                routing[_routing_key(cfg)] = _gathered_imbalance(module, recorder, world)
            if values.pop():
                oom_at.add((cfg.build_key, cfg.recompute))
                skipped.add(idx)
                why[cfg.label()] = (f"failed: {failed}" if failed else short
                                    or "out of memory")
                measured.pop(idx, None)
                module = None
                _free(device)
                _step(progress, f"{tag}: "
                                + (f"failed ({failed})" if failed else short
                                   or "out of memory on some rank")
                                + ", skipped" + _allocated_note(device))
                if rnd == 0 and ratio_at.get(cfg.build_key) == idx and not failed \
                        and not cfg.syncs_on_host:
                    # the module's ratio row did not fit: a smaller timed one measures it
                    module, tp_group, spent = _module_ratio(
                        grid, idx, smaller_timed_rows(grid, idx, measured), measured, None, None,
                        layers, device, groups, world=world, sustained=sustained,
                        progress=progress, tag=tag, ratios=ratios)
                    first_only_s += spent
                continue
            measured.setdefault(idx, []).append(values)
            if cfg.compile and not cfg.syncs_on_host:
                # first round only: not part of a later round's projection
                first_only_s += time.perf_counter() - t_row
            fc, bc = _cpu_fields(cfg)
            if rnd == 0 and not cfg.part and cfg.zero == 0 and not cfg.communicates \
                    and values[5] > 0:
                # once per row, in the first round: that is the only round sure to run.
                # Synchronized rows already hold the shallow split (combined over rounds
                # below); queued ones need it again, right before the deep one
                t_deep = time.perf_counter()
                deep_key, deep_module, split, wmem = _deep_split(
                    cfg, deep_key, deep_module, module if split_queued else None, layers,
                    device, groups, iters=iters, barrier=barrier, world=world,
                    row_module=module, activation_bytes=values[2])
                first_only_s += time.perf_counter() - t_deep
                if split is not None:
                    deep[idx] = split
                    deep_mem[idx] = wmem
            if rnd == 0 and ratio_at.get(cfg.build_key) == idx and not cfg.syncs_on_host:
                # (a layer that syncs on the host is paced by it, not by the SM clock)
                # once per module, in the first round (compiled modules run only then)
                module, tp_group, spent = _module_ratio(
                    grid, idx, [idx, *smaller_timed_rows(grid, idx, measured)], measured, module,
                    tp_group, layers, device, groups, world=world, sustained=sustained,
                    progress=progress, tag=tag, ratios=ratios)
                first_only_s += spent
            cpu_note = ""
            # CPU fields are > 0 only where the row was timed queued (CUDA). Compiled rows
            # too: their backward carries a per-call part of ~1.4 ms that a 2-block row
            # spreads over its two layers (1 x H200, 2026-11-29: 1.74 ms a layer on 2
            # blocks, 1.14 on 16; docs/benchmarks/host.md)
            if not cfg.part and values[bc] > 0 \
                    and cfg.micro_batch == smallest[(cfg.build_key, cfg.recompute)]:
                t_deep = time.perf_counter()
                steady = steady_cpu_layers(cfg, row_cpu_s=values[fc] + values[bc],
                                           row_gpu_s=values[0] + values[1])
                cpu_key, cpu_module, d = _cpu_deep(cfg, cpu_key, cpu_module, device, groups,
                                                   queue, iters=iters, barrier=barrier,
                                                   world=world, steady_layers=steady,
                                                   activation_bytes=values[2])
                if cfg.compile:   # compiled rows run in the first round only
                    first_only_s += time.perf_counter() - t_deep
                if d is not None:
                    cpu_deep.setdefault((cfg.build_key, cfg.recompute), []).append(
                        (values[fc], values[bc], d[0], d[1], d[4]))
                    cpu_note = (f", cpu steady on {d[4]} blocks {d[0] * 1e3:.3f} / "
                                f"{d[1] * 1e3:.3f} ms" if d[4] != CPU_DEEP_LAYERS else
                                f", cpu on {CPU_DEEP_LAYERS} blocks {d[0] * 1e3:.3f} / "
                                f"{d[1] * 1e3:.3f} ms, gpu {d[2] * 1e3:.3f} / "
                                f"{d[3] * 1e3:.3f} ms")
                    if steady and d[4] == CPU_DEEP_LAYERS:
                        cpu_note += f" (not steady on {steady}: GPU-paced or no room)"
                else:
                    # (moeh6's eager MoE rows, 2 x H200: every one; the per-call part then
                    # stays spread over the row's blocks, its per-layer CPU reads high)
                    cpu_note = (f", cpu on {CPU_DEEP_LAYERS} blocks not timed (out of memory, "
                                f"or the launch queue filled before the spin ended): no "
                                f"per-call part split off")
            if sync_deep and rnd == 0 and not cfg.part and cfg.syncs_on_host \
                    and cfg.zero < 2 and cfg.build_key not in sync_deep_done:
                # once per module, its first row: a diagnostic logged beside the row
                # (benchmarks/moe_ep_rows_gpu.py --sync-deep; a calibration does not spend its
                # budget on it)
                sync_deep_done.add(cfg.build_key)
                t_deep = time.perf_counter()
                cpu_key, cpu_module, d = _sync_deep(cfg, cpu_key, cpu_module, device, groups,
                                                    iters=iters, barrier=barrier, world=world)
                first_only_s += time.perf_counter() - t_deep
                cpu_note = (f", synchronized on {CPU_DEEP_LAYERS} blocks {d[0] * 1e3:.3f} / "
                            f"{d[1] * 1e3:.3f} ms per layer" if d is not None else
                            f", synchronized on {CPU_DEEP_LAYERS} blocks: out of memory")
            _step(progress, f"{tag}: fwd {values[0] * 1e3:.3f} ms, bwd {values[1] * 1e3:.3f}"
                            f" ms{' per layer' if not cfg.part else ''}"
                            + (f", act {values[2] / 2**20:.1f} MiB" if device.type == "cuda"
                               else "")
                            + (f", cpu {values[fc] * 1e3:.3f} / {values[bc] * 1e3:.3f} ms"
                               if values[bc] > 0 else "")
                            + cpu_note
                            + (f", {values[-1]:.0f} samples not queued" if values[-1] else ""))
        if t_row is not None and stopped_at is None:
            first_s.setdefault(last_idx, time.perf_counter() - t_row)
        module = tp_group = deep_module = cpu_module = None
        cpu_key = None
        _free(device)
        whole = len(active) == len(grid)
        if stopped_at != 0:   # a round stopped before its first row does not count
            ran, reread_rounds = (ran + 1, reread_rounds) if whole else (ran, reread_rounds + 1)
        if stopped_at is not None and rnd == 0:
            untimed = untimed_summary([grid[i] for i in active[stopped_at:]])
            _note(progress, "not timed (--time-budget): " + "; ".join(
                f"{n} {k} row{'s' if n > 1 else ''} — {MISSING_ROWS[k]}"
                for k, n in untimed.items()))
        if stopped_at is not None:
            if progress is not None:   # keep [done/total] honest
                progress.drop(len(active) - stopped_at + len(active) * (rounds - rnd - 1))
            break
        if budget is None or not _budget_stops(
                rnd + 1, rounds, budget, time.perf_counter() - t_round - first_only_s, device,
                world, progress, outcome=None if whole else (
                    f"layer tables from {ran} of {rounds} rounds, the rows timed synchronized "
                    f"read {ran + reread_rounds} times")):
            continue
        again = [i for i in synced if i in measured and i not in skipped]
        if whole and again and rnd + 1 < rounds and _reread_fits(
                rnd + 1, rounds, budget, sum(first_s.get(i, 0.0) for i in again), len(again),
                device, world, progress):
            if progress is not None:
                progress.drop((len(grid) - len(again)) * (rounds - rnd - 1))
            active = again
            continue
        if progress is not None:
            progress.drop(len(active) * (rounds - rnd - 1))   # keep [done/total] honest
        break
    reread = {i: measured[i] for i in synced if i in measured and i not in skipped}
    _note_synced_spread(progress, grid, reread)
    cpu = pooled_cpu(grid, {i: v for i, v in measured.items() if i not in skipped}, iters)
    layer_rows: list[dict[str, Any]] = []
    end_rows: list[dict[str, Any]] = []
    for idx, cfg in enumerate(grid):
        if idx in skipped or idx not in measured:
            continue
        values = combine_rounds(measured[idx], MEMORY_FIELDS)
        fixed, deep_cpu = (0.0, 0.0), (0.0, 0.0, 0)
        if idx in cpu:
            f, b = _cpu_fields(cfg)
            values[f], values[b] = cpu[idx]
            samples = cpu_deep.get((cfg.build_key, cfg.recompute))
            if samples and not cfg.part:
                (values[f], values[b]), fixed = cpu_fixed(samples, cpu[idx], layers,
                                                          CPU_DEEP_LAYERS)
                deep_cpu = cpu_deep_reading(samples, CPU_DEEP_LAYERS)
        if cfg.part:
            end_rows.append(end_row(cfg, values))
        elif idx in deep:
            shallow = deep[idx][:2] if split_queued else values[4:6]
            layer_rows.append(layer_row(cfg, values, split_layers=layers, depth=split_depth(
                shallow, deep[idx][2:], layers, SPLIT_DEEP_LAYERS),
                split_sync=shallow if split_queued else (0.0, 0.0), cpu_fixed=fixed,
                cpu_deep=deep_cpu, split_memory=deep_mem.get(idx, NO_SPLIT_MEMORY)))
        else:
            layer_rows.append(layer_row(cfg, values, split_layers=layers, cpu_fixed=fixed,
                                        cpu_deep=deep_cpu))
        (end_rows if cfg.part else layer_rows)[-1]["sustained_ratio"] = float(
            ratios.get(cfg.build_key, 1.0))
        if cfg.ep > 1 and not cfg.part:   # compiled rows route as their eager twin
            layer_rows[-1]["routed_imbalance"] = routing.get(_routing_key(cfg), 0.0)
    suspect = suspect_splits(layer_rows)
    if suspect:
        _note(progress, "compiled rows whose backward timed shorter than their forward (the "
                        "forward/backward split of compiled blocks that communicate inside; "
                        "their totals are used, docs/calibrate.md \"Known defect\"): "
                        + ", ".join(suspect))
    return LayerTables(layers=layer_rows, ends=end_rows, rounds=ran, untimed=untimed,
                       skipped=why, reread_rounds=reread_rounds,
                       synced_readings={grid[i].label(): [[float(v[0]), float(v[1])]
                                                          for v in r]
                                        for i, r in reread.items() if len(r) > 1})


__all__ = ["Config", "Sample", "plan_grid", "micro_batch_sizes", "layer_values", "end_values",
           "cpu_values", "split_depth", "split_memory_stage", "combine_rounds", "pooled_cpu",
           "layer_row", "end_row", "bench_layer_rows", "LayerTables", "rounds_for",
           "LAYERS_CUDA", "LAYERS_CPU", "dp_mesh_shape"]
