"""``fp8_cast_compiled_block_share``: what the executor's fp8 casts cost inside a compiled block,
as a share of the same casts timed alone (pure Python over a written profile; no torch).

A compiled fp8 layer with no measured fp8 row is composed from its bf16 row
(:mod:`meshplan.costmodel.fp8_cost`): the linears' GEMMs at the fp8 curve, the casts at
``fp8_cast_compiled_gbps`` — the rate of one compiled cast of one tensor. Inside a block
Inductor fuses the casts with the kernels around them, so they cost less. A profile holding
compiled fp8 rows (``meshplan calibrate --fp8-rows``) measures by how much: each fp8 row is
priced as an estimate would without it (the profile's fp8 rows removed), and

    measured − composed without casts = share × casts priced alone

is fitted through the origin over the rows (least squares). Rows with sequence parallelism,
data parallelism or ep > 1 are left out (their compiled collectives, gathers and
all-to-alls are not what the share describes).

Measured: over the 54 such rows of the fp8h1-fp8h15 calibrations (14 models, 1-2 × H200,
2026-11-29/30) the fit is 0.332, bringing the composed rows from 24.1 % to 4.7 % mean error
(12.9 % max), one number for every recompute mode (signed −2.1 / −0.2 / +0.9 % for none /
selective / full); the H200 datasheet carries it (data/gpus.toml). Post hoc, seven held-out
compiled fp8 steps composed this way (moeh18-20, fp8h16) went from 14.5 % to 3.6 % mean
(docs/benchmarks/fp8_checks.md, "Compiled fp8 composed from bf16 rows").
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from meshplan.costmodel.data_parallel import group_links
from meshplan.costmodel.fp8_experts import torch_experts_fp8
from meshplan.costmodel.moe_layer import routed_mlp, shared_width, with_cached_expert_weights
from meshplan.costmodel.moe_rows import fp8_experts_on_bf16_row
from meshplan.costmodel.moe_tables import expert_links
from meshplan.costmodel.parts import layer_parts
from meshplan.hardware_profiles import Cluster
from meshplan.hardware_profiles.measured_rows import cast_family, layer_shape_key
from meshplan.spec import Job, Layout, ModelSpec

#: fewer compiled fp8 rows than this give no share (a fit through one row is its own error)
MIN_ROWS = 2


def _total_s(parts) -> float:
    return parts.layer.forward.total_s + parts.layer.backward.total_s


def composed_rows(model: ModelSpec, cluster: Cluster, share: float = 0.0) -> list[dict]:
    """Per compiled fp8 row of ``model`` in ``cluster``'s profile (no SP, dp 1, ep 1): the
    measured seconds (as the cost model reads the row), the row composed from its bf16 twin
    with the casts at ``share`` (0: cast alone), composed without casts, and the casts'
    price alone. An MoE layer is composed as the cost model composes it
    (:func:`meshplan.costmodel.moe_rows.measured_moe_parts`): the bf16 MoE row, its dense
    part moved to fp8, and its routed experts' fp8 terms where the row ran them in fp8
    (``MeasuredLayer.fp8_experts``; rows timed with 16-bit experts are composed so)."""
    meas = cluster.gpu.measured
    if meas is None:
        return []
    shape = layer_shape_key(model)
    fp8_rows = [r for r in meas.layers if r.precision == "fp8" and r.compile
                and r.shape == shape and not r.sequence_parallel and not r.zero
                and r.dp == 1 and r.ep == 1]
    without = dataclasses.replace(meas, layers=tuple(r for r in meas.layers
                                                     if r.precision != "fp8"))

    def composed(s: float) -> Cluster:
        # the share under test as this model's family's (not the datasheet's by family)
        return cluster.with_gpu(dataclasses.replace(
            cluster.gpu, measured=without, fp8_cast_compiled_block_share=s,
            fp8_cast_compiled_block_share_family=cast_family(model)))
    alone, priced = composed(0.0), composed(share)
    out = []
    for r in fp8_rows:
        job = Job(global_batch=r.micro_batch * 2, seq_len=r.seq_len, runtime="torch",
                  precision="fp8", fp8_recipe=r.fp8_recipe or "tensorwise")
        lay = Layout(tp=r.tp, micro_batch=r.micro_batch, recompute=r.recompute, compile=True)
        if not _layer(model, alone, job.with_precision("bf16"), lay, False).compiled:
            continue        # no compiled bf16 twin to compose from
        # the row as the cost model reads it: labelled as the executor runs its experts now
        now = torch_experts_fp8(model, job)
        read = cluster.with_gpu(dataclasses.replace(cluster.gpu, measured=dataclasses.replace(
            meas, layers=tuple(dataclasses.replace(x, fp8_experts=now) if x is r else x
                               for x in meas.layers))))
        cached = r.fp8_weights_cached
        p_alone = _layer(model, alone, job, lay, r.fp8_experts, cached)
        casts = (p_alone.fp8.forward_cast_s + p_alone.fp8.backward_cast_s
                 + _expert_casts(model, alone, job, lay, r.fp8_experts, cached))
        out.append(dict(model=model.name, tp=r.tp, recompute=r.recompute,
                        micro_batch=r.micro_batch,
                        measured_s=_total_s(_layer(model, read, job, lay, False)),
                        composed_s=_total_s(_layer(model, priced, job, lay, r.fp8_experts,
                                                   cached)),
                        composed_without_casts_s=_total_s(p_alone) - casts,
                        casts_alone_s=casts))
    return out


def _layer(model: ModelSpec, cluster: Cluster, job: Job, lay: Layout, experts: bool,
           cached: bool = False):
    """The layer's parts as an estimate reads them at ``lay`` (ep 1); an MoE layer with the
    shared experts as its MLP, the routed experts' fp8 terms added where ``experts``,
    without their weights' casts where the row was timed with them cast beforehand
    (``cached``)."""
    links = group_links(cluster, lay)
    at = (lay.micro_batch, lay.tp, False, lay.recompute, links.tp, links.pp, True, False)
    if not model.is_moe:
        return layer_parts(model, cluster, job, *at)
    parts = layer_parts(model, cluster, job, *at, mlp_width=shared_width(model))
    if not experts:
        return parts
    parts = fp8_experts_on_bf16_row(parts, model, cluster, job, lay, _moe_links(cluster, lay))
    if not cached:
        return parts
    # lay's step has two micro-batches at ZeRO-0: the casts come off each pass (the
    # once-a-step cast goes to parts.fp8, outside the layer's passes compared here)
    f8 = routed_mlp(model, cluster, job, lay, _moe_links(cluster, lay), 1.0).fp8
    return with_cached_expert_weights(parts, model, job, lay, f8)


def _expert_casts(model: ModelSpec, cluster: Cluster, job: Job, lay: Layout,
                  experts: bool, cached: bool = False) -> float:
    """The routed experts' cast seconds (forward + backward) the block share scales, where
    they ran in fp8: without their weights' casts where the row cast them beforehand
    (``cached``) or the profile prices them at its measured ``fp8_cast_weight_gbps`` (no
    share)."""
    if not (experts and model.is_moe):
        return 0.0
    f8 = routed_mlp(model, cluster, job, lay, _moe_links(cluster, lay), 1.0).fp8
    if f8 is None:
        return 0.0
    weights = (f8.weight_forward_cast_s + f8.weight_backward_cast_s
               if cached or (lay.compile and cluster.gpu.fp8_cast_weight_gbps > 0) else 0.0)
    return f8.forward_cast_s + f8.backward_cast_s - weights


def _moe_links(cluster: Cluster, lay: Layout):
    return dataclasses.replace(group_links(cluster, lay), **expert_links(cluster, lay))


def fit_share(rows: Sequence[dict]) -> float | None:
    """Least squares through the origin: measured − composed-without-casts = share × casts
    priced alone; None with fewer than :data:`MIN_ROWS` rows or no cast time."""
    den = sum(r["casts_alone_s"] ** 2 for r in rows)
    if len(rows) < MIN_ROWS or den <= 0:
        return None
    return sum((r["measured_s"] - r["composed_without_casts_s"]) * r["casts_alone_s"]
               for r in rows) / den


def profile_block_share(cluster: Cluster, models: Sequence[ModelSpec]) -> float | None:
    """The share a calibrated ``cluster`` (its GPU a profile with compiled fp8 rows) measures
    over its models' rows, kept within (0, 1]; None without enough rows."""
    rows = [r for m in models for r in composed_rows(m, cluster)]
    share = fit_share(rows)
    return None if share is None else min(1.0, max(1e-3, share))


def measure_from_profile(path, models: Sequence[ModelSpec], gpus: int) -> float | None:
    """:func:`profile_block_share` of the profile just written at ``path`` (its own GPU on a
    one-node cluster of ``gpus``; the links do not enter the share). Every row as timed: the
    share compares each fp8 row with its bf16 twin of the same executor."""
    import warnings

    from meshplan.hardware_profiles.calibrated import apply_profile
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cluster = apply_profile(Cluster.preset("dgx-h100", nodes=1, gpus_per_node=max(1, gpus)),
                                path, override=True, keep_stale_rows=True)
    return profile_block_share(cluster, models)


__all__ = ["composed_rows", "fit_share", "profile_block_share", "measure_from_profile",
           "MIN_ROWS"]
