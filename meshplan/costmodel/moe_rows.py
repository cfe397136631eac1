"""An MoE layer from the profile's measured MoE rows: the executor's whole MoE block timed at
ep = 1, with what expert parallelism adds priced on top.

``meshplan calibrate --model M`` with an MoE model times its MoE layer as the executor builds
it (router, permutation, grouped expert GEMMs, shared experts, attention; eager, and compiled
with ``--compile-rows``), keyed by the layer's shape *and* its experts
(:func:`meshplan.hardware_profiles.measured_rows.moe_key_suffix`). Where such a row exists
for the layout's tp, sequence parallelism, recompute mode and micro-batch, it replaces the
analytical layer (:func:`meshplan.costmodel.parts.layer_parts`: the layer's GPU seconds, CPU
dispatch, kept bytes and backward working memory), the same mechanism as a dense model's
rows; for an MoE model the calibration did not time, the nearest timed MoE shape's rows
scaled by the analytical ratio (:mod:`meshplan.costmodel.nearest_rows`). The analytical MoE
host terms (:mod:`meshplan.costmodel.moe_host`) are not added: the row's own CPU dispatch is
in it.

**ep > 1 from the ep = 1 row.** The row plus the difference the routed part's formulas give
between the layout and the timed layer (:func:`meshplan.costmodel.moe_layer.routed_mlp` at
the layout's ep, etp and load imbalance ρ minus the same at ep = etp = 1, ρ = 1): the
dispatch and combine all-to-alls, the busiest rank's extra rows (ρ − 1), the received rows'
regrouping, the larger per-expert GEMMs, the dispatch buffers; the host synchronisations
ep > 1 adds (:func:`meshplan.costmodel.moe_host.torch_syncs`, at the profile's
``host_sync_s`` + ``host_op_dispatch_s``, plus the count exchange's call latency) on the
GPU's timeline, and on the CPU's the operators :mod:`meshplan.costmodel.moe_host` counts for
ep > 1 (33 forward, 8 backward) with each sync's wait. Under balanced routing a rank at ep
computes E/ep experts on ep times the rows each: the same FLOPs as the row. A compiled
layout reads the compiled row at ep = 1 only: with ep > 1 the all-to-all's splits are read
on the host, which breaks the graph, so it is priced from the eager row with the
compile-as-eager caveats (moeh4: compiled at ep 2 ran within 1 % of eager).

**Rows timed at the layout's ep** (calibrations on more than one GPU time the layer over each
ep that divides the ranks and the experts, eager and compiled:
:func:`meshplan.calibrate.layer_grid.expert_degrees`) replace all of that where the profile
has them and the ep group stays inside one node, as the calibration's did: the row holds the
all-to-alls, the host syncs and the regrouping as the executor ran them; only the busiest
rank's extra rows beyond the ρ the row's own routing had (``MeasuredLayer.routed_imbalance``)
are priced on top. Such rows are synchronized timings — the host read of the split lists
drains the queue (``Config.syncs_on_host``) — so they carry max(CPU, GPU) per layer and no
CPU fields, and the layout's step is their sum, without a separate host bound. Across nodes
the ep = 1 row plus the formulas stands (the row's all-to-all crossed NVLink).

**Where it applies** (:func:`rows_apply`): cp = 1, no dense layers (DeepSeek's first k: their
difference to the MoE layer is not measured), and ZeRO-0/1 — or ZeRO-2/3 without a pipeline
where the profile timed the layer under FSDP2 at the layout's dp (the experts sharded over
edp as the executor shards them) and ep: at ep 1 the build's FSDP2 lookup takes that row's
time, CPU and kept bytes as for a dense layer; at ep > 1 the FSDP2 row timed at that ep
(:func:`fsdp_row_at_ep`) is read the same way. Older profiles' FSDP2 rows are ep 1's (the
experts gathered over edp, no all-to-all: not the layer of an ep > 1 layout), so there the
ep row stands with FSDP2's gathers priced analytically, its hooks' CPU not at all (the
caveat says so), and its kept bytes as FSDP2 keeps them (:func:`fsdp_kept_bytes`). The
ep = 1 row plus the formulas does not stand for ZeRO-2/3 at ep > 1 (that row holds per-call
expert casts FSDP2 does not make); without a row the layer is priced from the curves with a
caveat (:mod:`meshplan.costmodel.inputs`).

**fp8.** An fp8 job reads the layer's own fp8 row where the profile has one at ep 1
(``calibrate --fp8-rows``; since 2026-12-02 rows say whether their routed experts ran fp8,
``MeasuredLayer.fp8_experts``, and only rows that ran them as the executor now does count).
From a bf16 row, the dense part moves to fp8 as a dense layer's (:mod:`meshplan.costmodel.parts`)
and, where the executor runs the routed experts in fp8 (recipe ``rowwise``), the routed part's
fp8 terms go on top (:func:`fp8_experts_on_bf16_row`). moeh23 (1 × H200): from its own fp8 rows
(16-bit experts) speed-up within 0.5 % mean as run; its fp8-experts arm from the bf16 rows
+21.7 % post hoc (−1.8 % with the block share re-fitted on the MoE rows).

Measured error (as run on never-run models unless said; docs/benchmarks/moe_checks.md, per set in
docs/benchmarks/gpu_checks.md):

- ep 1 rows, 1 × H200 (moe-1.9b, 7 layouts): 11.8 % mean, 28.2 % max, the GPU-bound layouts
  within 4 % (the misses host-bound eager layouts whose dispatch varied ±20 % run to run);
  memory within 5 % on 7 of 7.
- ep 2 from the ep = 1 rows plus the formulas (moeh4, 2 × H200): four host-bound tp 2 · ep 2
  layouts 7-19 % slower than predicted; with the ep operators on the CPU's timeline
  −5.7..+9.1 % (post hoc: why those terms exist).
- Rows timed at ep 2 (2 × H200, moeh6-moeh15, eight layouts a set): set means 3.6-16.0 %.
  ZeRO-2/3 from FSDP2 rows at ep: eleven runs −6.9..+21.4 % (from the curves, moeh7: +20 to
  +43 %). What limits it is the rows' reading: over 23 eager ZeRO-0/1 layouts the rows read
  0.85-1.29 of the runs' own layers (median 1.00, σ 11 %; ``benchmarks/moe_rows_vs_runs.py``),
  partly following the run's routing (correlation −0.56 with ρ as run; the busiest-rank term
  prices a third of that slope), the compiled rows 0.91-1.48; fine-grained experts' tp 2 +
  SP rows read high even where their readings agree (moeh15: 1.20-1.25, readings 3 % apart).
  So ``meshplan calibrate`` re-times them in the rounds a budget leaves
  (``calibrate.bench_layers``), each the median of its readings:
  moeh14, the first check calibrated so, ran at 5.4 % mean, 15.6 % max, where its rows' first
  readings alone give 11.5 / 37.5 %; moeh15 (two readings each) 7.0 / 23.2 %. A layout run
  twice in fresh processes moved 3-13 % (moeh14, moeh15).
"""

from __future__ import annotations

from dataclasses import replace

from meshplan.costmodel.compute import PassCost
from meshplan.costmodel.corrections import load_imbalance
from meshplan.costmodel.fp8_experts import torch_experts_fp8
from meshplan.costmodel.moe import moe_params_per_rank
from meshplan.costmodel.moe_host import count_exchange_s, routed_ops, torch_syncs
from meshplan.costmodel.moe_layer import (RoutedMlp, routed_mlp, shared_width,
                                          with_cached_expert_weights, with_routed_mlp)
from meshplan.costmodel.parts import LayerParts, layer_parts
from meshplan.costmodel.torch_memory import fsdp_plain_row_kept_bytes
from meshplan.hardware_profiles import Cluster
from meshplan.spec import Job, Layout, ModelSpec

MOE_ROWS_CAVEAT = (
    "mixture of experts from the profile's measured MoE layer rows (timed at ep = 1); "
    "expert parallelism's all-to-alls, load imbalance and host syncs are priced on top")
MOE_EP_FSDP_ROWS_CAVEAT = (
    "mixture of experts from the profile's MoE layer rows timed at this ep, plain and under "
    "FSDP2 (their all-to-alls, host syncs, FSDP2's gathers, hooks and expert copies as timed "
    "on the calibrating node, synchronized; only the busiest rank's extra rows beyond the "
    "load imbalance the rows were routed at priced on top); ZeRO-2/3 at ep > 1 from such "
    "rows measured against eleven runs so far (2 x H200: moeh10's dp2-ep2-z2-mb8-full +1.8 %, "
    "moeh11's dp2-ep2-z3-mb8-full +0.3 %, moeh12's compiled ZeRO-3 -5.4 %, moeh13's ZeRO-2 "
    "+2.6 % and its two recompute-full ZeRO-3 +18.8 / +21.4 %, from rows whose one "
    "calibration reading ran 15-20 % above two later ones; moeh14's, from rows each the "
    "median of three readings, ZeRO-3 +2.5 / -6.9 %, compiled ZeRO-2 -1.8 %; moeh15's "
    "ZeRO-3 +2.2 %, compiled ZeRO-3 +0.0 %; "
    "priced without them, moeh6-moeh9: 10.5 % mean error over 13 layouts; "
    "docs/benchmarks/moe_checks.md)")
MOE_EP_ROWS_CAVEAT = (
    "mixture of experts from the profile's MoE layer rows timed at this ep (its all-to-alls "
    "and host syncs as timed on the calibrating node, synchronized; only the busiest rank's "
    "extra rows beyond the load imbalance the row was routed at priced on top); measured "
    "runs at ep 2 on 2 x H200 (moeh6-moeh15; rows timed in one calibration round read "
    "0.85-1.29 of the runs' own layers, lower where the run routed more unevenly than the "
    "row; calibrate re-times them in the rounds a budget leaves, each the median: moeh14 "
    "so, +0.4 to +15.6 %, where its first readings alone gave -14.2 to +7.3 %; moeh15's "
    "fine-grained tp 2 + SP rows, two readings 3 % apart, 1.20-1.25 of the runs' layers, "
    "+16.6 / +23.2 %; a layout run twice moved 3-13 %): eager -14.5 to +26.3 %, compiled "
    "-7.9 to "
    "+47 % (moeh9's calibration read its compiled ep rows 1.6x the same rows timed alone, "
    "moeh10's 1.0-1.2x); compiled ep rows and runs before 2026-11-30 trained the experts "
    "without gradients (docs/benchmarks/compiled_grads.md); 15-27 % above the runs where "
    "the host set the pace "
    "(moeh4, post hoc); "
    "under ZeRO-2/3, FSDP2's gathers and one-rank copies priced analytically and its hooks' "
    "CPU not at all (the profile's FSDP2 rows are ep 1's, not this layer): -16 to +22 % as "
    "run (moeh8, moeh9; docs/benchmarks/moe_checks.md)")


def rows_apply(model: ModelSpec, cluster: Cluster, layout: Layout,
               job: Job | None = None) -> bool:
    """Whether an MoE layout may read measured MoE rows (module docstring): ZeRO-2/3 only
    without a pipeline (``job`` given), where the profile timed this layer under FSDP2 at
    the layout's dp (ep 1) or timed it at the layout's ep (ep > 1)."""
    tables = cluster.gpu.measured
    if not (model.is_moe and tables is not None and layout.cp == 1
            and not model.dense_layers):
        return False
    if layout.zero < 2:
        return True
    if job is None or layout.pp > 1 or layout.dp < 2:
        return False
    if layout.ep * layout.etp > 1:
        return layout.etp == 1 and _ep_row(model, cluster, job, layout) is not None
    row, _ = tables.fsdp_layer(model, seq_len=job.seq_len, tp=layout.tp,
                               sequence_parallel=layout.sequence_parallel,
                               recompute=layout.recompute, micro_batch=layout.micro_batch,
                               zero=layout.zero, dp=layout.dp)
    return row is not None


def _ep_delta(model: ModelSpec, cluster: Cluster, job: Job, layout: Layout, timed_layout,
              links) -> RoutedMlp:
    """The routed part at ``layout`` less the routed part as the row timed it."""
    at = routed_mlp(model, cluster, job, layout, links,
                    load_imbalance(cluster.gpu.corrections, layout.ep))
    # the row beneath is eager (with ep > 1 the block is not one graph): it re-ran all
    delta = _routed_minus(at, routed_mlp(model, cluster, job, timed_layout, links, 1.0))
    return replace(delta, not_rerun=at.not_rerun)


def _routed_minus(at: RoutedMlp, timed: RoutedMlp) -> RoutedMlp:
    """``at`` less ``timed`` (``at``'s wire bytes and rows: what the layout sends and
    computes)."""
    return RoutedMlp(at.forward - timed.forward, at.backward - timed.backward,
                     at.wgrad_s - timed.wgrad_s, at.pass_wire_bytes,
                     at.kept_bytes - timed.kept_bytes, at.work_bytes - timed.work_bytes,
                     at.rows, at.act_out_bytes - timed.act_out_bytes, at.act_s - timed.act_s,
                     not_rerun=at.not_rerun - timed.not_rerun,
                     kept_output_bytes=at.kept_output_bytes - timed.kept_output_bytes)


def _measured_at_ep(model: ModelSpec, cluster: Cluster, job: Job, layout: Layout,
                    links) -> LayerParts | None:
    """The layer from a row timed at the layout's ep (etp = 1, the ep group inside one node,
    as the calibration ran it), the busiest rank's extra rows beyond the row's own routing
    (ρ − ρ_row) priced on top; None where the profile has no such row."""
    if layout.etp != 1 or links.ep is None or links.ep.nodes_spanned > 1:
        return None
    parts = layer_parts(model, cluster, job, layout.micro_batch, layout.tp,
                        layout.sequence_parallel, layout.recompute, links.tp, links.pp,
                        layout.compile, False, mlp_width=shared_width(model), ep=layout.ep)
    if "layer" not in parts.measured:
        return None
    parts = replace(parts, measured=(*parts.measured, "ep"))   # says which rows priced it
    rho = load_imbalance(cluster.gpu.corrections, layout.ep)
    timed_rho = _timed_imbalance(model, cluster, job, layout)
    if rho <= timed_rho:
        return parts
    skew = _routed_minus(routed_mlp(model, cluster, job, layout, links, rho),
                         routed_mlp(model, cluster, job, layout, links, timed_rho))
    return with_routed_mlp(parts, skew, layout.recompute, job.selective_modules)


def _ep_row(model: ModelSpec, cluster: Cluster, job: Job, layout: Layout):
    """The profile's row of this MoE layer timed at the layout's ep, or None."""
    return cluster.gpu.measured.layer(
        model, seq_len=job.seq_len, tp=layout.tp, sequence_parallel=layout.sequence_parallel,
        recompute=layout.recompute, micro_batch=layout.micro_batch, compile=layout.compile,
        ep=layout.ep)


def _timed_imbalance(model: ModelSpec, cluster: Cluster, job: Job, layout: Layout) -> float:
    """ρ of the routing the layout's ep row was timed at (its time holds that much of the
    busiest rank's extra rows: moeh6's rows ran at 1.04-1.05); 1 where the row did not
    record it (calibrations before 2026-11-29 night)."""
    row = _ep_row(model, cluster, job, layout)
    return max(1.0, row.routed_imbalance) if row is not None else 1.0


def fsdp_row_at_ep(model: ModelSpec, cluster: Cluster, job: Job, layout: Layout) -> bool:
    """Whether the profile timed this ep > 1 layer under FSDP2 at the layout's ZeRO stage
    and dp (``meshplan calibrate`` on ≥ 2 GPUs since 2026-11-30): then the build reads that
    row as for a dense layer, and what FSDP2 adds — the dense gathers, its hooks, its
    copies of the experts over edp in place of autocast's casts — is the row's difference
    to the ep row, not priced (:func:`meshplan.costmodel.moe_tables.expert_terms`)."""
    tables = cluster.gpu.measured
    if tables is None or layout.ep <= 1 or layout.etp != 1 or layout.zero < 2 \
            or layout.dp < 2:
        return False
    row, _ = tables.fsdp_layer(model, seq_len=job.seq_len, tp=layout.tp,
                               sequence_parallel=layout.sequence_parallel,
                               recompute=layout.recompute, micro_batch=layout.micro_batch,
                               zero=layout.zero, dp=layout.dp, ep=layout.ep)
    return row is not None


def fsdp_kept_bytes(model: ModelSpec, job: Job, layout: Layout, row_bytes: float) -> float:
    """The kept bytes of a layer priced from its row timed at the layout's ep (plainly, under
    autocast), as FSDP2 (ZeRO-2/3) runs it in bf16 without autocast
    (:func:`~meshplan.costmodel.torch_memory.fsdp_plain_row_kept_bytes`): less the rank's
    expert weights' 16-bit copies, which the executor's per-call casts save for backward
    (FSDP2's parameters are already 16-bit), the dense part without autocast's fp32 copies.
    moeh7 (2 × H200, post hoc): the FSDP2 row at ep 1 held 505 MiB a layer less than the
    plain one, the 16 experts' copies (504 MiB)."""
    return fsdp_plain_row_kept_bytes(model, job, layout, row_bytes,
                                     copied_params=moe_params_per_rank(model, layout).experts,
                                     mlp_width=shared_width(model))


def measured_moe_parts(model: ModelSpec, cluster: Cluster, job: Job, layout: Layout,
                       links) -> LayerParts | None:
    """The MoE layer's parts from its measured row (module docstring): timed at the
    layout's ep where the profile has that row, else at ep = 1 with ep > 1 priced on top;
    None where the profile has no row of this layer at the layout's tp, sequence
    parallelism and recompute mode. An fp8 job read from a bf16 row gets its routed
    experts' fp8 terms on top (:func:`fp8_experts_on_bf16_row`)."""
    parts = _measured_moe_parts(model, cluster, job, layout, links)
    if parts is None:
        return None
    parts = fp8_experts_on_bf16_row(parts, model, cluster, job, layout, links)
    if parts.fp8 is None:
        return parts
    rho = load_imbalance(cluster.gpu.corrections, layout.ep)
    return with_cached_expert_weights(parts, model, job, layout, routed_mlp(
        model, cluster, job, layout, links, rho).fp8)


def fp8_experts_on_bf16_row(parts: LayerParts, model: ModelSpec, cluster: Cluster, job: Job,
                            layout: Layout, links) -> LayerParts:
    """``parts`` of an fp8 job whose layer came from a bf16 MoE row, with what the
    executor's fp8 routed experts change (:mod:`meshplan.costmodel.fp8_experts`): the
    routed part priced for the job less the same for its bf16 twin — the grouped GEMMs at
    the fp8 / bf16 ratio, the casts — and the 16-bit expert weight copies the row's kept
    bytes hold per micro-batch taken off. Also in the fp8 difference the build gives rows
    that replace the layer later (FSDP2's). Unchanged where the layer came from an fp8 row
    that ran the experts in fp8, or its sibling difference, or the experts stay 16-bit."""
    if parts.fp8 is None or parts.fp8.row or parts.fp8.sibling \
            or not torch_experts_fp8(model, job):
        return parts
    rho = load_imbalance(cluster.gpu.corrections, layout.ep)
    at = routed_mlp(model, cluster, job, layout, links, rho)
    delta = _routed_minus(at, routed_mlp(model, cluster, job.with_precision("bf16"), layout,
                                         links, rho))
    delta = replace(delta, kept_bytes=delta.kept_bytes - at.fp8.saved_copy_bytes)
    out = with_routed_mlp(parts, delta, layout.recompute, job.selective_modules)
    d_f, d_b, d_w = parts.fp8_delta_s
    lay, was = out.layer, parts.layer
    return replace(out, fp8_delta_s=(
        d_f + lay.forward.total_s - was.forward.total_s,
        d_b + lay.backward.total_s - was.backward.total_s, d_w + lay.wgrad_s - was.wgrad_s))


def _measured_moe_parts(model: ModelSpec, cluster: Cluster, job: Job, layout: Layout,
                        links) -> LayerParts | None:
    if layout.ep > 1:
        at_ep = _measured_at_ep(model, cluster, job, layout, links)
        if at_ep is not None or layout.zero >= 2:
            return at_ep      # ZeRO-2/3: the ep = 1 row holds the per-call expert casts
    ep1 = layout.ep == 1 and layout.etp == 1
    # a compiled row is the block compiled as one graph, which it is at ep = 1 only (with
    # ep > 1 the all-to-all's host-read splits break it): ep > 1 reads the eager row (and
    # the eager output row, although the executor compiles the loss at tp 1 there too)
    parts = layer_parts(model, cluster, job, layout.micro_batch, layout.tp,
                        layout.sequence_parallel, layout.recompute, links.tp, links.pp,
                        layout.compile and ep1, False, mlp_width=shared_width(model))
    if "layer" not in parts.measured:
        return None
    if ep1:
        return parts
    timed = replace(layout, ep=1, etp=1)
    parts = with_routed_mlp(parts, _ep_delta(model, cluster, job, layout, timed, links),
                            layout.recompute, job.selective_modules)
    gpu = cluster.gpu
    full = layout.recompute == "full"
    syncs = torch_syncs(model, layout) - torch_syncs(model, timed)
    parts = _with_ep_dispatch(parts, model, layout, timed, gpu, syncs, full)
    host_s = (syncs * (gpu.host_sync_s + gpu.host_op_dispatch_s)
              + count_exchange_s(layout, links))
    if host_s <= 0:
        return parts
    lay = parts.layer
    extra = PassCost(overhead_s=host_s)
    lay = replace(lay, forward=lay.forward + extra,
                  backward=lay.backward + extra if full else lay.backward,
                  recompute=lay.recompute + extra if full else lay.recompute)
    return replace(parts, layer=lay)


def _with_ep_dispatch(parts: LayerParts, model: ModelSpec, layout: Layout, timed: Layout, gpu,
                      syncs: int, full: bool) -> LayerParts:
    """The row's CPU dispatch (where it has one) plus what the executor dispatches at the
    layout's ep beyond the ep = 1 row: the operators :mod:`meshplan.costmodel.moe_host`
    counts for ep > 1 (the count exchange, its read-back, the row all-to-alls, the regroup
    index and its inverse) at ``host_op_dispatch_s``, and each sync's wait; full
    recomputation dispatches the forward's again in backward."""
    if parts.cpu is None:
        return parts
    now = routed_ops(model, layout, autocast=False)
    then = routed_ops(model, timed, autocast=False)
    t_op = gpu.host_op_dispatch_s
    cpu_f = (now[0] - then[0]) * t_op + syncs * (gpu.host_sync_s + t_op)
    cpu_b = (now[1] - then[1]) * t_op + (cpu_f if full else 0.0)
    if cpu_f <= 0 and cpu_b <= 0:
        return parts
    return replace(parts, cpu=(parts.cpu[0] + cpu_f, parts.cpu[1] + cpu_b, *parts.cpu[2:]))


__all__ = ["MOE_EP_FSDP_ROWS_CAVEAT", "MOE_EP_ROWS_CAVEAT", "MOE_ROWS_CAVEAT", "fsdp_kept_bytes",
           "fp8_experts_on_bf16_row", "fsdp_row_at_ep", "measured_moe_parts", "rows_apply"]
