"""An fp8 layer priced from the profile's measured fp8 row, where it has one.

``meshplan calibrate --fp8-rows RECIPE`` times the executor's own block with its fp8 linears
(:mod:`meshplan.executor.fp8`, built as ``ParallelTrainer`` builds it for
``Job(precision="fp8")``) on the plain (ZeRO-0) rows at recompute none, compiled with
``--compile-rows``. Where a layout's layer has such a row (same shape, sequence length, tp,
sequence parallelism, recompute mode, compile, recipe; micro-batch interpolated as every
lookup), the layer's forward / backward GPU seconds, CPU dispatch and kept / working bytes
are the row's, instead of the bf16 row with its GEMM shares × the fp8/bf16 ratio plus the
casts priced at the profile's cast rate (:mod:`meshplan.costmodel.fp8_cost`).

What the row already holds, and is therefore not added again:

* every cast the executor makes inside a micro-batch's forward and backward — of x, dy and
  the per-micro-batch re-casts of W from its fp32 parameter (runtime "torch" has no
  per-step weight cache: ``Fp8Layer.weight_cast_step_s`` is 0 there);
* the fp8 GEMMs at this GPU's own rate (and, in rows measured before the executor took
  per-shard scales under tp, its amax all-reduces on the tp group);
* the kept bytes: the fp32 weight saved instead of autocast's 16-bit copy in a compiled
  block (``Fp8Layer.row_weight_copy_bytes``), the inputs the compiled partitioner
  recomputes (``activation_delta_bytes``), and the transient fp8 operands in the
  backward's peak (``working_bytes``).

What stays from the composition: the per-step weight term outside the rows
(``weight_copy_bytes``: eager autocast's step-long weight copies, which a row's "second
forward" never sees), and the breakdown's categories (the composed fp8 layer's proportions,
rescaled to the row's totals, as :func:`~meshplan.costmodel.parts.layer_parts` does for bf16
rows). Rows that replace the plain layer later (FSDP2 rows, a pipelined ZeRO-2 stage's) get
the measured fp8 − bf16 difference of the plain rows (``LayerParts.fp8_delta_s``).

Only runtime "torch": the rows are the executor's fp8 linears, not TransformerEngine's.
fp8 rows are not transferred to other shapes (:mod:`meshplan.costmodel.nearest_rows`).

Measured error: unknown when written — no profile with fp8 rows had been measured
(``benchmarks/fp8_rows_repredict.py`` re-predicts the 2026-11-28 4 × H200 fp8 arms once
one is).
"""

from __future__ import annotations

from meshplan.costmodel.measured import Interpolated
from meshplan.spec import Job, ModelSpec


def fp8_row(tables, model: ModelSpec, job: Job, *, micro_batch: int, tp: int,
            sequence_parallel: bool, recompute: str, compile: bool) -> Interpolated | None:
    """The profile's fp8 row of the job's recipe at these settings, or None (then fp8 is
    composed on the bf16 row)."""
    if job.precision != "fp8" or job.runtime != "torch" or not tables:
        return None
    lookup = getattr(tables, "fp8_layer", None)
    if lookup is None:
        return None
    return lookup(model, recipe=job.fp8_recipe, seq_len=job.seq_len, tp=tp,
                  sequence_parallel=sequence_parallel, recompute=recompute,
                  micro_batch=micro_batch, compile=compile)


def row_label(job: Job, *, micro_batch: int, tp: int, sequence_parallel: bool,
              recompute: str, compile: bool) -> str:
    """Which row priced the layer (for the estimate's caveat)."""
    sp = " with SP" if sequence_parallel and tp > 1 else ""
    return (f"{job.fp8_recipe}, {'compiled' if compile else 'eager'}, tp {tp}{sp}, recompute "
            f"{recompute}, seq {job.seq_len}, micro-batch {micro_batch}")


def row_caveat(label: str) -> str:
    return (f"fp8 layer priced from the profile's measured fp8 row ({label}): its casts "
            "(weight re-casts per micro-batch included) and fp8 GEMMs as "
            "timed, not composed from the bf16 row (meshplan/costmodel/fp8_rows.py)")


__all__ = ["fp8_row", "row_label", "row_caveat"]
