"""What a layout's tables are built from: the cluster, job and layout the tables see, the
process groups' links and the per-layer parts — and, for MoE models, how the built fields
are completed.

* dense, cp = 1: the given ones (:func:`meshplan.costmodel.data_parallel.group_links`,
  :func:`meshplan.costmodel.parts.layer_parts`);
* cp > 1: the per-rank equivalent with the ring's or the all-to-all's attention
  (:mod:`meshplan.costmodel.context_tables`);
* MoE: the MoE layer (shared experts as the MLP, routed experts added:
  :mod:`meshplan.costmodel.moe_layer`), the expert groups' links, and
  :func:`meshplan.costmodel.moe_tables.moe_fields` to add the experts' states, the dense
  layers and multi-token prediction to the built fields.

A calibrated profile's measured rows are for dense layers at cp = 1, and for an MoE model's
MoE layer (:mod:`meshplan.costmodel.moe_rows`: cp = 1, ZeRO-0/1, no dense layers) where the
calibration timed that model or another MoE model, whose rows are carried to this one's shape
(:mod:`meshplan.costmodel.nearest_rows`); elsewhere with cp > 1 or an MoE model the layout is
priced from the profile's curves (a caveat says so).

No formula of its own (the modules named hold them, with their sources and measured errors).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, NamedTuple

from meshplan.costmodel.context_tables import (CP_ANALYTICAL_CAVEAT, CP_UNCHECKED_CAVEAT,
                                               cp_equivalent, cp_group_links,
                                               with_cp_attention)
from meshplan.costmodel.cp_host import comm_assumed_caveat
from meshplan.costmodel.data_parallel import Groups, group_links
from meshplan.costmodel.moe_rows import (MOE_EP_FSDP_ROWS_CAVEAT, MOE_EP_ROWS_CAVEAT,
                                         MOE_ROWS_CAVEAT, fsdp_row_at_ep, measured_moe_parts,
                                         rows_apply)
from meshplan.costmodel.moe_tables import (MOE_CAVEAT, MOE_DATASHEET_CAVEAT, expert_links,
                                           expert_terms, moe_fields, moe_mlp_width, moe_parts)
from meshplan.costmodel.compiled_block_memory import (compiled_dense_applies,
                                                      with_compiled_dense_memory)
from meshplan.costmodel.moe_torch_memory import (compiled_block_applies,
                                                 with_compiled_block_memory)
from meshplan.costmodel.parts import LayerParts, layer_parts
from meshplan.hardware_profiles import Cluster
from meshplan.spec import Job, Layout, ModelSpec

MEASURED_ROWS_CAVEAT = (
    "priced from the profile's curves: its measured layer rows are for dense layers at "
    "cp = 1")
#: a calibrated profile with no grouped curve, its GEMM curve timed one synchronised GEMM at
#: a time (not "queued"): each routed expert's small GEMM pays that curve's per-call floor
MOE_SYNC_CURVE_CAVEAT = (
    "the routed experts' GEMMs are priced one by one on this profile's dense GEMM curve, "
    "which calibrate timed with a synchronisation per GEMM: its small-GEMM points hold the "
    "call's launch and sync (tens of µs), which the experts' back-to-back GEMMs do not pay "
    "apiece. On one H100 a dense 4-GPU calibration priced a never-run 64-expert model 97-269 "
    "% slow in bf16 where the datasheet read 5-7 % (moeh63h100, docs/benchmarks/"
    "moe_checks.md); `meshplan calibrate --model` with this model writes the experts' "
    "grouped curve")


class TableInputs(NamedTuple):
    """What :func:`meshplan.costmodel.build.build_fields` prices (module docstring), the
    caveats this pricing adds, and what completes the built fields (None: nothing)."""

    cluster: Cluster
    job: Job
    layout: Layout
    links: Groups
    parts: LayerParts
    caveats: tuple[str, ...] = ()
    finish: Callable[[dict], dict] | None = None


def table_inputs(model: ModelSpec, cluster: Cluster, job: Job, layout: Layout) -> TableInputs:
    """The inputs of ``layout``'s tables (module docstring)."""
    cp, is_moe = layout.cp, model.is_moe
    # fp8 casts read FSDP2's bf16 weights where ZeRO-2/3 shards over the gradient group
    fsdp = job.precision == "fp8" and layout.zero >= 2 and layout.dp * cp > 1
    if cp == 1 and not is_moe:
        links = group_links(cluster, layout)
        parts = layer_parts(model, cluster, job, layout.micro_batch, layout.tp,
                            layout.sequence_parallel, layout.recompute, links.tp, links.pp,
                            layout.compile, fsdp)
        if compiled_dense_applies(model, job, layout, cluster.gpu.corrections) \
                and "layer" not in parts.measured:
            # one compiled graph without a measured row: what Inductor's block keeps
            parts = with_compiled_dense_memory(parts, model, job, layout)
        return TableInputs(cluster, job, layout, links, parts)
    if rows_apply(model, cluster, layout, job):
        measured = _measured_moe_inputs(model, cluster, job, layout)
        if measured is not None:
            return measured
    caveats = ((CP_UNCHECKED_CAVEAT,) if cp > 1 else ()) + \
        ((MOE_CAVEAT,) if is_moe else ()) + \
        ((MOE_DATASHEET_CAVEAT,) if is_moe and not cluster.gpu.measured else ())
    if is_moe and cluster.gpu.measured and cluster.gpu.grouped_gemm_efficiency is None \
            and cluster.gpu.microbench_timing != "queued":
        caveats += (MOE_SYNC_CURVE_CAVEAT,)
    if cluster.gpu.measured:
        caveats += (CP_ANALYTICAL_CAVEAT if not is_moe else MEASURED_ROWS_CAVEAT,)
        cluster = cluster.replace(gpu=replace(cluster.gpu, measured=None))
    if cp > 1:
        local_job, local_layout = cp_equivalent(job, layout)
        links = cp_group_links(cluster, layout)
    else:
        local_job, local_layout, links = job, layout, group_links(cluster, layout)
    if is_moe:
        links = replace(links, **expert_links(cluster, layout))

    def parts_at(width: int | None) -> LayerParts:
        p = layer_parts(model, cluster, local_job, layout.micro_batch, layout.tp,
                        layout.sequence_parallel, layout.recompute, links.tp, links.pp,
                        layout.compile, fsdp, mlp_width=width)
        return with_cp_attention(p, model, cluster, job, layout, links.cp) if cp > 1 else p

    parts = parts_at(moe_mlp_width(model))
    if cp > 1:
        caveats += comm_assumed_caveat(model, job, layout, cluster.gpu,
                                       parts.layer.forward.total_s)
    if not is_moe:
        return TableInputs(cluster, local_job, local_layout, links, parts, caveats)
    parts = moe_parts(model, cluster, local_job, layout, links, parts)
    if compiled_block_applies(model, local_job, layout, cluster.gpu.corrections):
        # one compiled graph: what Inductor's block keeps (named correction)
        parts = with_compiled_block_memory(parts, model, local_job, layout)
    dense = parts_at(None) if model.dense_layers else None
    terms = expert_terms(model, cluster, local_job, local_layout, links, parts.layer,
                         copies_in_rows=parts.kept_weight_copies)
    return TableInputs(cluster, local_job, local_layout, links, parts, caveats,
                       lambda f: moe_fields(model, cluster, local_job, local_layout, f, dense,
                                            terms))


def _measured_moe_inputs(model: ModelSpec, cluster: Cluster, job: Job,
                         layout: Layout) -> TableInputs | None:
    """An MoE layout whose layer the profile measured (:mod:`meshplan.costmodel.moe_rows`);
    None where it has no row for it."""
    links = replace(group_links(cluster, layout), **expert_links(cluster, layout))
    parts = measured_moe_parts(model, cluster, job, layout, links)
    if parts is None:
        return None
    fsdp_at_ep = fsdp_row_at_ep(model, cluster, job, layout)
    terms = expert_terms(model, cluster, job, layout, links, parts.layer, copies_in_rows=True,
                         fsdp_measured=fsdp_at_ep)
    caveat = (MOE_EP_FSDP_ROWS_CAVEAT if fsdp_at_ep else
              MOE_EP_ROWS_CAVEAT if "ep" in parts.measured else MOE_ROWS_CAVEAT)
    return TableInputs(cluster, job, layout, links, parts, (caveat,),
                       lambda f: moe_fields(model, cluster, job, layout, f, None, terms))


__all__ = ["MEASURED_ROWS_CAVEAT", "TableInputs", "table_inputs"]
