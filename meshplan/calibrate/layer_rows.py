"""A layer-table row from its timed samples: the per-row arithmetic and the profile's rows.

Pure Python, no torch (unit-tested): a row's per-layer or per-part values from its samples
(their definitions: :mod:`meshplan.calibrate.bench_layers`), the CPU dispatch split into a
per-call and a per-layer part, rows combined over rounds and CPU times pooled over
micro-batch sizes, and the ``MeasuredLayer`` / ``MeasuredEnd`` dicts the profile stores.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Sequence

from meshplan.calibrate.layer_grid import Config
from meshplan.calibrate.stats import two_depth_fit
from meshplan.costmodel.measured import MeasuredEnd, MeasuredLayer, ends_shape_key, layer_shape_key
from meshplan.hardware_profiles.measured_rows import ran_cached_expert_weights, ran_fp8_experts

NO_SPLIT_MEMORY = (0.0, 0.0, 0, 0.0, 0.0)  # split_memory_stage where nothing was measured
MEMORY_FIELDS = (2, 3)  # indices of the byte fields in a row's values (the rest: seconds)


@dataclass(frozen=True)
class Sample:
    """One timed iteration: seconds and allocator readings in bytes (0 on CPU)."""

    forward_s: float
    backward_s: float
    mem_before: float = 0.0
    mem_after_forward: float = 0.0
    mem_peak: float = 0.0
    forward_cpu_s: float = 0.0      # CPU dispatch (queued timing only; 0: not measured)
    backward_cpu_s: float = 0.0
    queued_ok: bool = True          # False: the CPU could not queue it all behind the spin


def layer_values(samples: Sequence[Sample], *, layers: int, input_bytes: float,
                 output_bytes: float, held_bytes: float = 0.0, memory: bool = True,
                 kept_bytes: float | None = None) -> tuple[float, float, float, float]:
    """(forward_s, backward_s, activation_bytes, backward_peak_bytes) per layer of an
    ``layers``-block part; see :mod:`meshplan.calibrate.bench_layers` for the definitions.
    ``held_bytes``: memory kept from forward to backward that is not per micro-batch
    (ZeRO-2's unsharded parameters). ``kept_bytes``: what a second forward keeps
    (:func:`~meshplan.calibrate.layer_timing._kept_bytes`), used instead of the timed
    iterations' allocator difference when given."""
    fwd = statistics.median(s.forward_s for s in samples) / layers
    bwd = statistics.median(s.backward_s for s in samples) / layers
    if not memory:
        return fwd, bwd, 0.0, 0.0
    kept = (kept_bytes if kept_bytes is not None
            else max(s.mem_after_forward - s.mem_before for s in samples))
    act = max(0.0, kept - output_bytes + input_bytes - held_bytes) / layers
    peak = max(0.0, max(s.mem_peak - s.mem_after_forward for s in samples))
    return fwd, bwd, act, peak


def end_values(samples: Sequence[Sample], *, input_bytes: float, output_bytes: float,
               memory: bool = True, kept_bytes: float | None = None
               ) -> tuple[float, float, float, float]:
    """(forward_s, backward_s, activation_bytes, peak_bytes) of an embedding / output part.
    ``input_bytes``: the hidden state entering the output part (0 for the embedding);
    ``kept_bytes`` as in :func:`layer_values`."""
    fwd = statistics.median(s.forward_s for s in samples)
    bwd = statistics.median(s.backward_s for s in samples)
    if not memory:
        return fwd, bwd, 0.0, 0.0
    kept = (kept_bytes if kept_bytes is not None
            else max(s.mem_after_forward - s.mem_before for s in samples))
    act = max(0.0, kept - output_bytes + input_bytes)
    peak = max(0.0, max(s.mem_peak - s.mem_after_forward for s in samples))
    return fwd, bwd, act, peak


def smaller_timed_rows(grid, idx: int, measured) -> list[int]:
    """The rows timed already (``measured``: their grid indices) of row ``idx``'s module,
    part and recompute mode at a smaller micro-batch, largest first: the same kernels on
    fewer tokens."""
    cfg = grid[idx]
    same = [j for j in measured if j != idx and grid[j].build_key == cfg.build_key
            and grid[j].part == cfg.part and grid[j].recompute == cfg.recompute
            and grid[j].micro_batch < cfg.micro_batch]
    return sorted(same, key=lambda j: -grid[j].micro_batch)


def row_need_bytes(grid, idx: int, measured: dict, layers: int) -> float | None:
    """What row ``idx`` should allocate above what is allocated before it, from
    :func:`smaller_timed_rows` (``measured``: grid index -> its values per round,
    :func:`layer_values` / :func:`end_values` first): the blocks' activations (the
    ``layers`` blocks' of a layer row) plus the backward's working memory above them,
    extrapolated to the row's micro-batch on the line through the two largest smaller rows
    (a part that does not grow with the micro-batch, such as the weight gradients in
    flight, is then not scaled up), or in proportion to the micro-batch from the one
    smaller row there is. None: no smaller row timed."""
    cfg = grid[idx]
    smaller = smaller_timed_rows(grid, idx, measured)
    if not smaller:
        return None

    def total(j: int) -> float:
        values = measured[j][-1]
        return values[2] * (1 if cfg.part else layers) + values[3]
    m1, t1 = grid[smaller[0]].micro_batch, total(smaller[0])
    if len(smaller) == 1:
        return t1 * cfg.micro_batch / m1
    m2, t2 = grid[smaller[1]].micro_batch, total(smaller[1])
    slope = max(0.0, (t1 - t2) / (m1 - m2))
    return max(t1 + slope * (cfg.micro_batch - m1), 0.0)


def cpu_values(samples: Sequence[Sample], *, layers: int = 1) -> tuple[float, float]:
    """Median CPU dispatch seconds (forward, backward) per layer; 0 where not measured.

    Over the samples that passed the queued check where any did: a sample that failed it
    waited for the GPU inside its dispatch, so its CPU seconds hold the spin it waited out
    (moeh20's eager full-recompute rows, 1 × H200, 2026-12-01: 774 ms a layer against
    10-12 ms at the micro-batches that queued)."""
    kept = [s for s in samples if s.queued_ok] or list(samples)
    return (statistics.median(s.forward_cpu_s for s in kept) / layers,
            statistics.median(s.backward_cpu_s for s in kept) / layers)


def _depth(sample: Sequence[float], default: int) -> int:
    return int(sample[4]) if len(sample) > 4 else default


def cpu_fixed(samples: Sequence[Sequence[float]], pooled: Sequence[float], shallow_layers: int,
              deep_layers: int) -> tuple[tuple[float, float], tuple[float, float]]:
    """Split a setting's CPU dispatch into a per-layer and a per-call part.

    ``samples``: (forward, backward) CPU per layer timed on ``shallow_layers`` blocks, then
    on ``deep_layers`` blocks (or a fifth element's, where a sample has one: the deeper
    stack's blocks), back to back; ``pooled``: the setting's (forward, backward)
    per layer on ``shallow_layers`` blocks (:func:`pooled_cpu`). If a call costs
    ``fixed + n * per_layer`` on n blocks, per layer it is ``per_layer + fixed / n``, so
    ``fixed = (s - d) * S * D / (D - S)`` for per-layer times s on S blocks and d on D
    (:func:`~meshplan.calibrate.stats.two_depth_fit` of the call totals S·s and D·d);
    the median over samples, kept within [0, S * pooled]. Returns ((forward, backward) per
    layer, (forward, backward) per call). Measured on 2 x H200 (2026-11-26, GPT-0.54B tp2
    selective, on 2, 4 and 8 blocks): 2.8 ms per forward+backward call, then 1.24 / 1.25 ms
    per layer, against 1.62 / 2.40 ms per layer with the call's part spread over 2 blocks."""
    per_layer, per_call = [], []
    for j, p in enumerate(pooled):
        fixed = statistics.median(
            two_depth_fit(shallow_layers, shallow_layers * row[j],
                          _depth(row, deep_layers), _depth(row, deep_layers) * row[2 + j])[0]
            for row in samples)
        fixed = min(max(0.0, fixed), shallow_layers * p)
        per_layer.append(p - fixed / shallow_layers)
        per_call.append(fixed)
    return (per_layer[0], per_layer[1]), (per_call[0], per_call[1])


def cpu_deep_reading(samples: Sequence[Sequence[float]], deep_layers: int
                     ) -> tuple[float, float, int]:
    """The setting's (forward, backward) CPU dispatch per layer on its deeper stack and that
    stack's blocks: the median over the ``samples`` (as :func:`cpu_fixed` takes them) read
    on the deepest stack any was read on."""
    depth = max(_depth(row, deep_layers) for row in samples)
    deep = [row for row in samples if _depth(row, deep_layers) == depth]
    return (statistics.median(row[2] for row in deep),
            statistics.median(row[3] for row in deep), depth)


def combine_rounds(rounds: Sequence[Sequence[float]], memory_fields: Iterable[int]
                   ) -> list[float]:
    """One row from the same configuration measured in several rounds spread over the
    calibration: the median of each time (a round that hit a slow moment does not move
    it), the largest of each memory field."""
    mem = set(memory_fields)
    return [max(col) if j in mem else statistics.median(col)
            for j, col in enumerate(zip(*rounds))]


def reading_spread(rounds: Sequence[Sequence[float]]) -> float:
    """How far a row's readings (``values`` lists, forward and backward seconds first) lie
    apart: the largest forward + backward over the smallest, less 1 (0 for one reading)."""
    totals = [r[0] + r[1] for r in rounds]
    return max(totals) / min(totals) - 1.0 if len(totals) > 1 and min(totals) > 0 else 0.0


def split_depth(shallow: Sequence[float], deep: Sequence[float], shallow_layers: int,
                deep_layers: int) -> tuple[float, float]:
    """(B, W) growth per layer per extra layer in the stack, from the per-layer split
    backward timed on ``shallow_layers`` and ``deep_layers`` blocks (0 where either is 0)."""
    if deep_layers <= shallow_layers:
        raise ValueError(f"deep_layers {deep_layers} must exceed shallow_layers {shallow_layers}")
    return tuple(((d - s) / (deep_layers - shallow_layers) if s > 0 and d > 0 else 0.0)
                 for s, d in zip(shallow, deep))  # type: ignore[return-value]


def split_memory_stage(shallow: Sequence[float], deep: Sequence[float], shallow_layers: int,
                       deep_layers: int) -> tuple[float, float, int, float, float]:
    """(pending, transient) bytes per layer on ``deep_layers`` blocks, ``deep_layers`` and
    the part of a stage's total that does not grow with its layers, c in ``c + d·L``
    (:func:`meshplan.costmodel.measured.wgrad_bytes_at`), from the per-layer values on two
    stacks: c = (x_s − x_d) / (1/s − 1/d). Only the deep values where the shallow stack was
    not measured (c = 0: the per-layer value at every depth); all zeros where the deep one
    was not."""
    if deep[1] <= 0:
        return NO_SPLIT_MEMORY
    if shallow[1] <= 0 or not 0 < shallow_layers < deep_layers:
        return float(deep[0]), float(deep[1]), deep_layers, 0.0, 0.0
    k = 1.0 / shallow_layers - 1.0 / deep_layers
    return (float(deep[0]), float(deep[1]), deep_layers, (shallow[0] - deep[0]) / k,
            (shallow[1] - deep[1]) / k)


def suspect_splits(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Compiled layer rows without recomputation whose backward timed shorter than their
    forward — a layer's backward runs about twice its forward's GEMMs — named for a note:
    the split compiled blocks that communicate inside (tp 2 + SP, ep 2) report, whose totals
    are right and whose split is not (docs/calibrate.md, "Known defect"; the cost model
    leans on the totals)."""
    out = []
    for r in rows:
        if r.get("compile") and r.get("recompute") == "none" \
                and 0 < r.get("backward_s", 0.0) < r.get("forward_s", 0.0):
            sp = " sp" if r.get("sequence_parallel") else ""
            ep = f" ep{r['ep']}" if r.get("ep", 1) > 1 else ""
            fp8 = " fp8" if r.get("precision") == "fp8" else ""
            out.append(f"tp{r['tp']}{sp}{ep}{fp8} mb{r['micro_batch']} "
                       f"({r['forward_s'] * 1e3:.2f} / {r['backward_s'] * 1e3:.2f} ms)")
    return out


def layer_row(cfg: Config, values: Sequence[float], *, split_layers: int = 0,
              depth: tuple[float, float] = (0.0, 0.0),
              split_sync: tuple[float, float] = (0.0, 0.0),
              cpu_fixed: tuple[float, float] = (0.0, 0.0),
              cpu_deep: tuple[float, float, int] = (0.0, 0.0, 0),
              split_memory: Sequence[float] = NO_SPLIT_MEMORY) -> dict[str, Any]:
    """``values``: forward_s, backward_s, activation_bytes, backward_peak_bytes and
    optionally the split backward's input- and weight-gradient seconds, the forward /
    backward CPU dispatch seconds and the split's B / W CPU seconds (0: not measured);
    ``split_layers`` / ``depth``: the stack the split was timed on and :func:`split_depth`
    (of the CPU times where they were measured); ``split_sync``: the split's synchronized
    B / W per layer on that stack where the split itself was timed queued (kept for
    comparison); ``cpu_fixed``: the forward / backward CPU dispatch per call (the CPU fields
    then hold the per-layer rest; :func:`cpu_fixed`); ``cpu_deep``: the forward / backward
    CPU dispatch per layer read on the deeper stack and its blocks (:func:`cpu_deep_reading`);
    ``split_memory``: what a micro-batch waiting for its W keeps and what W needs while it
    runs, bytes per layer (full recomputation; :mod:`meshplan.calibrate.split_memory`), the
    stack measured and their stage parts (:func:`split_memory_stage`)."""
    fwd, bwd, act, peak, b_in, b_w, f_cpu, b_cpu, bi_cpu, bw_cpu = (*values, *(0.0,) * 6)[:10]
    return asdict(MeasuredLayer(
        shape=layer_shape_key(cfg.model), seq_len=cfg.seq_len, tp=cfg.tp,
        sequence_parallel=cfg.sequence_parallel, recompute=cfg.recompute,
        micro_batch=cfg.micro_batch, zero=cfg.zero, dp=cfg.dp, forward_s=float(fwd),
        backward_s=float(bwd), activation_bytes=float(act), backward_peak_bytes=float(peak),
        model=cfg.model.name, backward_input_s=float(b_in), backward_weight_s=float(b_w),
        forward_cpu_s=float(f_cpu), backward_cpu_s=float(b_cpu),
        backward_input_cpu_s=float(bi_cpu), backward_weight_cpu_s=float(bw_cpu),
        split_layers=split_layers if b_in > 0 and b_w > 0 else 0,
        backward_input_depth_s=float(depth[0]), backward_weight_depth_s=float(depth[1]),
        backward_input_sync_s=float(split_sync[0]), backward_weight_sync_s=float(split_sync[1]),
        forward_cpu_fixed_s=float(cpu_fixed[0]), backward_cpu_fixed_s=float(cpu_fixed[1]),
        forward_cpu_deep_s=float(cpu_deep[0]), backward_cpu_deep_s=float(cpu_deep[1]),
        cpu_deep_layers=int(cpu_deep[2]),
        wgrad_pending_bytes=float(split_memory[0]),
        wgrad_transient_bytes=float(split_memory[1]),
        wgrad_memory_layers=int(split_memory[2]),
        wgrad_pending_stage_bytes=float(split_memory[3]),
        wgrad_transient_stage_bytes=float(split_memory[4]), compile=cfg.compile,
        precision=cfg.precision, fp8_recipe=cfg.fp8_recipe, ep=cfg.ep,
        # the executor's fp8 experts (executor.fp8.experts_run_fp8: on Hopper or later)
        fp8_experts=ran_fp8_experts(cfg.model, cfg.precision, cfg.fp8_recipe),
        fp8_weights_cached=ran_cached_expert_weights(cfg.model, cfg.precision, cfg.fp8_recipe,
                                                     cfg.zero)))


def end_row(cfg: Config, values: Sequence[float]) -> dict[str, Any]:
    """``values``: forward_s, backward_s, activation_bytes, peak_bytes and optionally the
    forward / backward CPU dispatch seconds."""
    fwd, bwd, act, peak, f_cpu, b_cpu = (*values, 0.0, 0.0)[:6]
    return asdict(MeasuredEnd(
        shape=ends_shape_key(cfg.model), part=cfg.part, seq_len=cfg.seq_len, tp=cfg.tp,
        sequence_parallel=cfg.sequence_parallel, micro_batch=cfg.micro_batch,
        forward_s=float(fwd), backward_s=float(bwd), activation_bytes=float(act),
        peak_bytes=float(peak), model=cfg.model.name, forward_cpu_s=float(f_cpu),
        backward_cpu_s=float(b_cpu), compile=cfg.compile))


def _cpu_fields(cfg: Config) -> tuple[int, int]:
    """Indices of the forward / backward CPU seconds in a row's values."""
    return (4, 5) if cfg.part else (6, 7)


def pooled_cpu(grid: Sequence[Config], measured: dict[int, list[list[float]]],
               iters: int | None = None) -> dict[int, tuple[float, float]]:
    """CPU dispatch per row, pooled over the micro-batch sizes of the same setting.

    The CPU issues the same kernels whatever the micro-batch, and its timings are far
    noisier than the GPU's (measured on 4 × H200, 2026-11-26: the three rounds of a row
    differ by 13% median in CPU time, 0.8% in GPU time), so the median over every round of
    every micro-batch of a setting is the better estimate for each of them.

    ``iters``: samples a reading holds. A reading none of whose samples passed the queued
    check (its last value, the failed count, equals ``iters``) has no dispatch time in it
    (:func:`cpu_values`) and is left out of the pool where the setting has another; moeh20's
    two such readings of four made the pool's median 393 ms a layer where the two that
    queued read 10-12 ms (1 × H200, 2026-12-01)."""
    groups: dict[tuple, list[int]] = {}
    for idx in measured:
        cfg = grid[idx]
        groups.setdefault((cfg.build_key, cfg.recompute), []).append(idx)
    out: dict[int, tuple[float, float]] = {}
    for members in groups.values():
        f, b = _cpu_fields(grid[members[0]])
        readings = [v for i in members for v in measured[i]]
        queued = [v for v in readings if iters is None or v[-1] < iters]
        fs = [v[f] for v in queued or readings]
        bs = [v[b] for v in queued or readings]
        if min(fs + bs, default=0.0) <= 0:
            continue                      # not measured (CPU device): leave the rows as they are
        pooled = (statistics.median(fs), statistics.median(bs))
        for i in members:
            out[i] = pooled
    return out


__all__ = ["Sample", "layer_values", "end_values", "cpu_values", "cpu_fixed", "cpu_deep_reading",
           "combine_rounds", "reading_spread",
           "split_depth", "split_memory_stage", "layer_row", "end_row", "pooled_cpu",
           "NO_SPLIT_MEMORY", "MEMORY_FIELDS", "suspect_splits"]
