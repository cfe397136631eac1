"""Per-layer costs of one micro-batch: the analytical terms, or the profile's measured rows.

:func:`layer_parts` is the first step of every estimate: one transformer layer, the
embedding and the output layer (time per pass, :mod:`meshplan.costmodel.compute`; kept
activations and working memory, :mod:`meshplan.costmodel.memory`), and the activation sent
between pipeline stages (Narayanan et al. 2021 §4.1: scattered over tp). Where the GPU
profile has measured rows (``meshplan calibrate --model``, :mod:`meshplan.costmodel.
measured`) they replace the analytical time and bytes; the measured time is split over the
analytical categories in their proportions, so breakdowns stay readable. A shape the profile
did not time reads the nearest timed shape's rows, scaled (:mod:`meshplan.costmodel.
nearest_rows`). Under runtime "torch" the analytical bytes are the executor's own tensors
(:mod:`meshplan.costmodel.torch_activations`), Megatron's Table 2 otherwise.

Measured error: on their own profiles the measured sets re-predict at 2.23 % mean absolute
step-time error over the 267 layouts with CPU below GPU (benchmarks/repredict_sets.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from meshplan.costmodel import comm
from meshplan.costmodel.compiled_rows import compiled_from_pair, row_weight_copies
from meshplan.costmodel.compute import (LayerCost, PassCost, embedding_cost, layer_cost,
                                        logits_cost)
from meshplan.costmodel.fp8_cost import Fp8Layer, fp8_layer
from meshplan.costmodel.fp8_rows import fp8_row, row_label, sibling_delta
from meshplan.costmodel.measured import Interpolated
from meshplan.costmodel.memory import (activation_bytes_per_element, layer_activations,
                                       logits_bytes)
from meshplan.costmodel.nearest_rows import TransferredTables, tables_for
from meshplan.costmodel.runtime import fsdp_accumulates_unsharded
from meshplan.costmodel.torch_activations import (torch_backward_work, torch_layer_activations,
                                                  torch_output_bytes)
from meshplan.hardware_profiles import Cluster
from meshplan.spec import Job, Layout, ModelSpec


@dataclass(frozen=True)
class LayerParts:
    """Per-micro-batch pieces shared by every layout with the same (tp, micro-batch, sp,
    recompute) and process-group links: one layer, embedding, logits, activations, p2p."""

    layer: LayerCost
    embedding: tuple       # (forward PassCost, backward PassCost)
    logits: tuple          # (forward PassCost, backward PassCost, wgrad seconds)
    activation_bytes: float     # kept by one layer for one micro-batch (this recompute mode)
    backward_buf_bytes: float   # working memory of one layer's backward beyond that
    embedding_act_bytes: float  # kept per micro-batch by the embedding (first stage)
    logits_bytes: float         # kept per micro-batch by the output layer (last stage)
    output_peak_bytes: float    # working memory of the output layer beyond that
    p2p_bytes: float       # activation sent between pipeline stages
    p2p_s: float
    measured: tuple[str, ...] = ()   # parts taken from the profile's measured tables
    split_backward: tuple[float, float] | None = None  # measured zero-bubble B, W of a layer
    # measured CPU dispatch seconds (layer f, b, embedding f, b, output f, b); None: unknown
    cpu: tuple[float, ...] | None = None
    full_act_bytes: float = 0.0
    # the measured tables this layout reads (the profile's, or its rows of the nearest timed
    # shape scaled to this one: nearest_rows.TransferredTables) and, where the layer's row
    # was so transferred, the shape it came from
    tables: object = None
    transferred_from: str = ""   # one layer's activations without recomputation
    # a transferred row read beyond the micro-batches its source timed
    # (nearest_rows.Stretch); None inside them, or not transferred
    transferred_stretch: object = None
    split_depth: tuple[float, float, float] | None = None  # split_backward's growth with depth
    split_cpu: tuple[float, float] | None = None  # its B, W CPU dispatch (then B, W: GPU-busy)
    # CPU dispatch of one forward / backward call not growing with its layers (cpu's layer
    # values are then the per-layer rest)
    cpu_fixed: tuple[float, float] = (0.0, 0.0)
    # zero-bubble with full recomputation: the measured row holding the (pending,
    # W transient) bytes per layer (measured.wgrad_bytes_at gives them at a stage's depth)
    wgrad_measured: Interpolated | None = None
    # Layout.compile asked for: whether the layer came from a compiled measured row (False:
    # priced as eager, which the estimate's caveats say)
    compiled: bool = False
    # a compiled layer priced from its eager row moved by another recompute mode's
    # compiled/eager pair (compiled_rows.compiled_from_pair): the sentence naming it; ""
    # where the compiled row was timed, or not compiled
    compiled_from_mode: str = ""
    # precision "fp8": what the linears' fp8 GEMMs and casts changed in ``layer`` (already
    # applied) and the per-step and memory terms the layout adds (meshplan.costmodel.fp8_cost)
    fp8: Fp8Layer | None = None
    # the fp8 change of a layer's (forward, backward, weight-gradient) seconds, for rows that
    # replace ``layer`` later (FSDP2 rows, a pipelined ZeRO-2 stage's): (0, 0, 0) without fp8
    fp8_delta_s: tuple[float, float, float] = (0.0, 0.0, 0.0)
    # the fp8 change of a layer's kept bytes for rows that replace it (FSDP2 rows, timed in
    # bf16 without autocast): the measured fp8 row's less the bf16 row's it replaced, plus
    # the autocast weight copies only the bf16 compiled row keeps; composed without a row
    fp8_delta_kept_bytes: float = 0.0
    # the host dispatch an eager fp8 layer's casts add to its measured bf16 row's (forward,
    # backward) per micro-batch (Fp8Layer.cast_cpu_s; build.host_dispatch adds it); (0, 0)
    # without fp8, from a measured fp8 row, or without the CPU's dispatch
    fp8_cpu_s: tuple[float, float] = (0.0, 0.0)
    # the micro-batches the layer's measured row was extended from, where this layout's lies
    # outside those timed (measured.Interpolated.extended_from); () inside or analytical
    extended_from: tuple[int, ...] = ()
    # the layer's measured row carries no sustained-clock ratio in a profile that measured
    # them (measured.Interpolated.clock_unmeasured)
    clock_unmeasured: bool = False
    # precision "fp8": the layer's (forward, backward) seconds as composed on its bf16 row,
    # before a measured fp8 row replaced them (grown_fp8_row reads them at another
    # micro-batch); (0, 0) without fp8
    fp8_composed_s: tuple[float, float] = (0.0, 0.0)
    # the layer's kept bytes (or, under full recomputation, its backward's working memory)
    # hold its 16-bit weight copies, so the weights count none: a compiled MoE block priced
    # without a row (moe_torch_memory.with_compiled_block_memory); compiled rows say so by
    # ``compiled``
    kept_weight_copies: bool = False


@lru_cache(maxsize=8192)
def layer_parts(model: ModelSpec, cluster: Cluster, job: Job, micro_batch: int, tp: int,
                sequence_parallel: bool, recompute: str, tp_link, pp_link,
                compile: bool = False, fsdp: bool = False,
                mlp_width: int | None = None, ep: int = 1) -> LayerParts:
    """Analytical pieces (compute.py, memory.py), replaced by the profile's measured layer
    and ends where it has them (:mod:`meshplan.costmodel.measured`): the measured time is
    split over the analytical categories in their proportions, so breakdowns stay readable.

    ``compile`` (Layout.compile): the profile's compiled layer rows where it has them (the
    executor compiles the blocks, not the ends), else the eager ones. ``fsdp``: ZeRO-2/3 over
    dp > 1 (fp8 casts read FSDP2's bf16 weights). An fp8 job's layer is priced as bf16,
    then moved to fp8 (:mod:`meshplan.costmodel.fp8_cost`), or taken from the profile's
    measured fp8 row where it has one (:mod:`meshplan.costmodel.fp8_rows`). ``mlp_width``: the layer's
    dense MLP width (:func:`layer_cost`; MoE layers). ``ep`` > 1: the MoE layer's rows timed
    with its experts over ``ep`` ranks (:mod:`meshplan.costmodel.moe_rows`)."""
    mb, sp = micro_batch, sequence_parallel
    layer = analytical = layer_cost(model, cluster, job, micro_batch=mb, tp=tp,
                                    sequence_parallel=sp, recompute=recompute,
                                    tp_link=tp_link, mlp_width=mlp_width)
    emb = embedding_cost(model, cluster, job, micro_batch=mb, tp=tp, sequence_parallel=sp,
                         tp_link=tp_link)
    logit = logits_cost(model, cluster, job, micro_batch=mb, tp=tp, sequence_parallel=sp,
                        tp_link=tp_link)
    e = activation_bytes_per_element(job)
    if job.runtime == "torch":
        # meshplan's executor, tensor by tensor (torch_activations); Megatron's fused layer
        # (Korthikanti et al. 2022 Table 2) otherwise
        acts = torch_layer_activations(model, job, mb, tp, sp, mlp_width=mlp_width)
        bwd_buf = torch_backward_work(model, job, mb, tp, sp, recompute, mlp_width=mlp_width)
        logit_b, out_peak = torch_output_bytes(model, job, mb, tp,
                                               compiled=compile)
    else:
        acts = layer_activations(model, job, mb, tp, sp, mlp_width)
        bwd_buf = acts.full_bytes if recompute != "none" else 0.0
        logit_b, out_peak = logits_bytes(model, job, mb, tp), 0.0
    act_b = acts.stored(recompute)
    emb_act = job.seq_len * mb * model.hidden_size * e / (tp if sp else 1)
    measured: list[str] = []
    split = split_depth = split_cpu = wgrad = None
    cpu, cpu_fixed = None, (0.0, 0.0)
    full_act = acts.full_bytes
    tables = tables_for(model, cluster, job, tp_link)
    transferred, stretch = "", None
    compiled = False
    compiled_from_mode = ""
    extended: tuple[int, ...] = ()
    clock_unmeasured = False
    if tables:
        kw = dict(seq_len=job.seq_len, tp=tp, sequence_parallel=sp, micro_batch=mb)
        ml = (tables.layer(model, recompute=recompute, compile=True, ep=ep, **kw) if compile
              else None)
        compiled = ml is not None
        if ml is None:
            ml = tables.layer(model, recompute=recompute, ep=ep, **kw)
            if compile and ml is not None:
                # no compiled row at this recompute mode: compile's change carried from the
                # compiled/eager pair at another mode (compiled_rows.compiled_from_pair)
                got = compiled_from_pair(tables, model, ml, recompute=recompute, ep=ep, **kw)
                if got is not None:
                    (ml, compiled_from_mode), compiled = got, True
        if ml is not None:
            layer = _scaled_layer(layer, ml.forward_s, ml.backward_s)
            act_b, bwd_buf = ml.activation_bytes, ml.peak_bytes
            extended = ml.extended_from
            clock_unmeasured = ml.clock_unmeasured
            split, split_depth, split_cpu = ml.split_backward, ml.split_depth, ml.split_cpu
            if recompute == "full" and ml.wgrad_transient_bytes > 0:
                wgrad = ml
            measured.append("layer")
            if isinstance(tables, TransferredTables):
                timed_compiled = compiled and not compiled_from_mode
                transferred = tables.source_for(tp=tp, sequence_parallel=sp,
                                                recompute=recompute,
                                                compile=timed_compiled).label
                stretch = tables.stretch_for(tp=tp, sequence_parallel=sp, recompute=recompute,
                                             micro_batch=mb, compile=timed_compiled)
        me = tables.end(model, "embedding", **kw)
        if me is not None:
            emb = (_scaled(emb[0], me.forward_s), _scaled(emb[1], me.backward_s))
            emb_act = me.activation_bytes
            measured.append("embedding")
        # Layout.compile compiles the loss at tp = 1 (executor.parallelize.
        # compiled_cross_entropy): no fp32 logit-sized tensor kept, fewer passes
        mo = tables.end(model, "output", compile=compile and tp == 1, **kw)
        if mo is not None:
            kb = ratio(mo.backward_s, logit[1].total_s)
            logit = (_scaled(logit[0], mo.forward_s), logit[1].scaled(kb), logit[2] * kb)
            logit_b, out_peak = mo.activation_bytes, mo.peak_bytes
            if compile and tp == 1 and job.runtime == "torch" and not mo.compiled_loss:
                # no output row timed with the compiled loss (calibrations before it had
                # one): the eager row's bytes at the compiled loss's share of them
                # (fp8h36: +17..+56 % peak memory from fp8h1's eager row)
                k_c = torch_output_bytes(model, job, mb, tp, compiled=True)
                k_e = torch_output_bytes(model, job, mb, tp)
                logit_b *= ratio(k_c[0], k_e[0])
                out_peak *= ratio(k_c[1], k_e[1])
            measured.append("output")
        plain = ml if recompute == "none" else (
            compiled and tables.layer(model, recompute="none", compile=True, ep=ep, **kw)
            or tables.layer(model, recompute="none", ep=ep, **kw))
        if plain is not None:
            full_act = plain.activation_bytes
        if ml is not None and me is not None and mo is not None and all(
                r.cpu_measured for r in (ml, me, mo)):
            cpu = (ml.forward_cpu_s, ml.backward_cpu_s, me.forward_cpu_s, me.backward_cpu_s,
                   mo.forward_cpu_s, mo.backward_cpu_s)
            cpu_fixed = (ml.forward_cpu_fixed_s, ml.backward_cpu_fixed_s)
    if compile and "layer" not in measured:
        # no row to time the compiled block: the analytical layer at the fused count
        layer = analytical = layer_cost(model, cluster, job, micro_batch=mb, tp=tp,
                                        sequence_parallel=sp, recompute=recompute,
                                        tp_link=tp_link, mlp_width=mlp_width, compiled=True)
    f8, delta, kept_delta, f8_cpu = None, (0.0, 0.0, 0.0), 0.0, (0.0, 0.0)
    if job.precision == "fp8":
        at = dict(micro_batch=mb, tp=tp, sequence_parallel=sp, recompute=recompute,
                  compile=compile)
        # an MoE layer's fp8 rows are its measured block at ep = 1 as the executor runs it
        # (MeasuredLayer.fp8_experts: its routed experts too under rowwise), read as a
        # dense layer's; its other widths (DeepSeek's dense first layers) have none
        rows_fp8 = mlp_width is None or (model.is_moe and ep == 1 and "layer" in measured)
        row = fp8_row(tables, model, job, **at) if rows_fp8 else None
        f8 = fp8_layer(model, cluster, job, micro_batch=mb, tp=tp, sequence_parallel=sp,
                       recompute=recompute, compile=compile, fsdp=fsdp,
                       mlp_width=mlp_width, compiled_row=compile if row else compiled,
                       # FSDP2 layouts take their CPU from FSDP2 rows, where there are any
                       # (build.host_dispatch): their casts stay priced on the GPU's timeline
                       host_measured=cpu is not None and not fsdp)
        kept_delta = f8.activation_delta_bytes
        if "layer" in measured and model.is_moe and mlp_width is not None:
            # a measured MoE row holds the routed experts (16-bit in a bf16 row): fp8 moves
            # the analytical dense part (attention, shared experts) here, added to the row,
            # not scaling all of it; the experts' own fp8 terms come on top where the
            # executor runs them in fp8 (moe_rows.fp8_experts_on_bf16_row)
            moved = _plus_delta(layer, f8.apply(analytical, recompute), analytical)
        else:
            moved = f8.apply(layer, recompute)
        composed = totals(moved)

        def parts_at(micro_batch: int, mode: str = recompute) -> LayerParts:
            return layer_parts(model, cluster, job, micro_batch, tp, sp, mode, tp_link,
                               pp_link, compile, fsdp, mlp_width, ep)
        if row is not None:
            # the measured fp8 layer (meshplan.costmodel.fp8_rows): its casts and kept bytes
            # are in the row; the composition gives only the breakdown's proportions
            moved = _scaled_layer(moved, *grown_fp8_row(row, mb, composed, parts_at))
            if "layer" in measured and compiled == compile:
                # the measured difference, compiled full recomputation's kept GEMM outputs
                # included (docs/benchmarks/fp8_checks.md "fp8h9")
                kept_delta = (row.activation_bytes - act_b
                              + (row_weight_copies(model, tp, recompute) if compile else 0.0))
            act_b, bwd_buf = row.activation_bytes, row.peak_bytes
            full_act = row.activation_bytes if recompute == "none" else full_act
            split = split_depth = split_cpu = wgrad = None
            if cpu is not None:
                cpu = ((row.forward_cpu_s, row.backward_cpu_s, *cpu[2:])
                       if row.cpu_measured else None)
                cpu_fixed = ((row.forward_cpu_fixed_s, row.backward_cpu_fixed_s) if cpu
                             else (0.0, 0.0))
            compiled = compile
            extended = row.extended_from
            measured = measured if "layer" in measured else ["layer", *measured]
            f8 = replace(f8, working_bytes=0.0, row=row_label(job, **at, timed_at=extended),
                         row_expert_weights_cached=row.fp8_weights_cached)
        elif "layer" in measured and rows_fp8 and compiled == compile:
            # (the difference was timed compiled or eager as the bf16 row it goes on)
            sib = sibling_delta(tables, model, job, **at, priced=lambda mode: totals(
                parts_at(mb, mode).layer))
            if sib is not None:
                d_f, d_b, mode, cached = sib
                moved = _scaled_layer(moved, max(0.0, layer.forward.total_s + d_f),
                                      max(0.0, layer.backward.total_s + d_b))
                f8 = replace(f8, sibling=(row_label(job, **at), mode),
                             row_expert_weights_cached=cached)
        delta = (moved.forward.total_s - layer.forward.total_s,
                 moved.backward.total_s - layer.backward.total_s, moved.wgrad_s - layer.wgrad_s)
        layer = moved
        if row is None:
            act_b = max(0.0, act_b + f8.activation_delta_bytes + f8.row_weight_copy_bytes)
            f8_cpu = f8.cast_cpu_s(recompute)
    # Activation sent between stages; scatter/gather over tp (Narayanan et al. 2021 §4.1).
    msg = job.seq_len * mb * model.hidden_size * e / tp
    return LayerParts(layer, emb, logit, act_b, bwd_buf, emb_act, logit_b, out_peak, msg,
                      comm.p2p_s(pp_link, msg), tuple(measured), split, cpu, full_act,
                      split_depth=split_depth, split_cpu=split_cpu, cpu_fixed=cpu_fixed,
                      wgrad_measured=wgrad, compiled=compiled, fp8=f8, fp8_delta_s=delta,
                      fp8_delta_kept_bytes=kept_delta, fp8_cpu_s=f8_cpu,
                      tables=tables, transferred_from=transferred,
                      transferred_stretch=stretch, extended_from=extended,
                      clock_unmeasured=clock_unmeasured,
                      compiled_from_mode=compiled_from_mode,
                      fp8_composed_s=composed if job.precision == "fp8" else (0.0, 0.0))


def grown_fp8_row(row: Interpolated, micro_batch: int, composed: tuple[float, float],
                  parts_at) -> tuple[float, float]:
    """(forward, backward) seconds of an fp8 layer whose measured fp8 row was timed at one
    other micro-batch only (a calibration budget cut the rest): that row grown as the fp8
    layer composed on the bf16 rows grows between the two micro-batches, ``composed`` here
    over :attr:`LayerParts.fp8_composed_s` there (``parts_at(timed)``); the row as the
    tables extend it (its bf16 twin's growth) where the timed micro-batch has no composed
    layer to read.

    The composition knows what the bf16 twin does not: the fp8 GEMMs gain more from a larger
    micro-batch than the 16-bit ones (the fp8 curve climbs later), and a cast costs a fixed
    part a pass. Over the stored profiles' compiled fp8 rows (166 ordered pairs of rows of
    one setting at two micro-batches, the 12 fp8hN calibrations, 1-2 × H200), a row priced
    from the other this way is within 5.4 % mean, 16.0 % max of the row timed there; grown
    as its bf16 twin grew, 10.4 % / 32.4 %, growing up +15.7 % on average
    (`python benchmarks/fp8_row_growth.py --cost-model`; docs/fp8.md "Rows timed at other
    micro-batches")."""
    if len(row.extended_from) != 1 or row.extended_from[0] == micro_batch:
        return row.forward_s, row.backward_s
    at = parts_at(row.extended_from[0])
    (cf, cb), timed = at.fp8_composed_s, at.layer
    if at.fp8 is None or not at.fp8.row or cf <= 0 or cb <= 0:
        return row.forward_s, row.backward_s
    return (timed.forward.total_s * composed[0] / cf,
            timed.backward.total_s * composed[1] / cb)


def totals(layer: LayerCost) -> tuple[float, float]:
    return layer.forward.total_s, layer.backward.total_s


def ratio(measured_s: float, analytical_s: float) -> float:
    return measured_s / analytical_s if analytical_s > 0 else 0.0


def _scaled(p: PassCost, measured_s: float) -> PassCost:
    """``p`` rescaled to total ``measured_s`` (all of it overhead if ``p`` is empty)."""
    if p.total_s <= 0:
        return PassCost(overhead_s=measured_s)
    return p.scaled(measured_s / p.total_s)


def _plus_delta(layer: LayerCost, new: LayerCost, old: LayerCost) -> LayerCost:
    """``layer`` plus what ``old`` → ``new`` changes, pass by pass."""
    return replace(layer, forward=layer.forward + (new.forward - old.forward),
                   backward=layer.backward + (new.backward - old.backward),
                   recompute=layer.recompute + (new.recompute - old.recompute),
                   wgrad_s=layer.wgrad_s + new.wgrad_s - old.wgrad_s)


def _scaled_layer(an: LayerCost, forward_s: float, backward_s: float) -> LayerCost:
    kb = ratio(backward_s, an.backward.total_s)
    return LayerCost(_scaled(an.forward, forward_s), _scaled(an.backward, backward_s),
                     an.recompute.scaled(kb), an.wgrad_s * kb, an.tp_wire_bytes,
                     an.wgrad_gather_s * kb, an.wgrad_gather_wire_bytes)


def pipelined_zero2_row(tables, model: ModelSpec, job: Job, layout: Layout):
    """The measured layer a pipeline's FSDP2 ZeRO-2 stage runs at, or None.

    Under torch.distributed.pipelining FSDP2's ZeRO-2 gathers once per step and reduces
    once (:func:`fsdp_per_microbatch`), so a micro-batch's layers cost FSDP2's compute
    alone: bf16 parameters without autocast, which the plain rows (autocast) do not time —
    GPT-0.54B's FSDP2 rows ran 6-12 % faster than its plain ones even with their
    communication, and round 18's two pipelined ZeRO-2 GPT layouts came out +7 % and
    +10..+17 % (docs/benchmarks/accuracy.md) — nor the FSDP rows, whose per-micro-batch
    gather and reduce-scatter a pipeline does not pay. The profile's 1-rank FSDP2 row
    (:meth:`~meshplan.costmodel.measured.MeasuredTables.fsdp_compute_layer`) times exactly
    that; profiles without it keep the plain row."""
    if not tables or not (fsdp_accumulates_unsharded(job, layout.zero, layout.dp, layout.pp)
                          and layout.zero == 2):
        return None
    return tables.fsdp_compute_layer(
        model, seq_len=job.seq_len, tp=layout.tp, sequence_parallel=layout.sequence_parallel,
        recompute=layout.recompute, micro_batch=layout.micro_batch)


def stage_split(row, split, depth, split_cpu, k: float):
    """Zero-bubble's (B and W, their depth growth, their CPU) for a pipelined ZeRO-2 stage:
    ``row``'s own split where it was timed (FSDP2 held unsharded, as the stage holds it;
    the growth with depth, the CPU's graph walk, stays the plain row's), else the plain
    ``split`` scaled by the two backwards' ratio ``k``."""
    if row.split_backward is not None:
        grow = (depth[0], depth[1], row.split_layers) if depth is not None else None
        return row.split_backward, grow, row.split_cpu
    if split is None:
        return split, depth, split_cpu
    return (split[0] * k, split[1] * k), depth, split_cpu




__all__ = ["LayerParts", "layer_parts", "ratio", "pipelined_zero2_row", "stage_split"]
