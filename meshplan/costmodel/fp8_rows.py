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

A layer with no fp8 row at its recompute mode, where the profile timed the fp8 row and its
bf16 twin at another mode of the same tp, sequence parallelism, compile and recipe (a
calibration budget cuts the last fp8 rows first), is the bf16 row at its own mode plus the
fp8 − bf16 difference measured at that other mode (:func:`sibling_delta`): the casts and
the fp8 GEMMs as the GPU ran them, rather than composed. Full recomputation runs the
forward twice, so its backward's difference is the other mode's backward's plus (from full:
minus) the forward's. This sums the forward/backward split of two rows, which compiled
rows with sequence parallelism get wrong (they put most of the backward's GPU time in the
forward: docs/benchmarks/fp8_checks.md "fp8h7"); the totals are right, the full-recompute difference
may be overstated there.

Only runtime "torch": the rows are the executor's fp8 linears, not TransformerEngine's.
fp8 rows are not transferred to other shapes (:mod:`meshplan.costmodel.nearest_rows`).

Measured error (2 × H200, compiled, rows timed at the arms' settings): fp8h6's pipeline and
data-parallel pairs −2.6..−7.1 % (docs/benchmarks/fp8_checks.md "fp8h6"), fp8h7's six arms with a
row or the FSDP2 composition −1.4..−3.2 %; the sibling difference, post hoc on fp8h7's p01 (tp 2 +
SP, recompute full, its fp8 row cut by the budget): composed +84.5 %, from the recompute-none
pair −2.0 % (docs/benchmarks/fp8_checks.md "fp8h7"). An fp8 row timed at one other
micro-batch only enters the difference as the cost model prices it at this one
(``priced``: :func:`meshplan.costmodel.parts.grown_fp8_row`); moeh27's fp8 arm at
micro-batch 4 with full recompute, from its one row at micro-batch 2 without, +8.0 % as
run, +2.1 % so (post hoc; docs/benchmarks/moe_checks.md "moeh27").
"""

from __future__ import annotations

from collections.abc import Callable

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


RECOMPUTE_MODES = ("none", "selective", "full")


def sibling_delta(tables, model: ModelSpec, job: Job, *, micro_batch: int, tp: int,
                  sequence_parallel: bool, recompute: str, compile: bool,
                  priced: Callable[[str], tuple[float, float]] | None = None
                  ) -> tuple[float, float, str, bool] | None:
    """(forward, backward) GPU seconds fp8 adds to the bf16 row at ``recompute``, from the
    fp8 row and its bf16 twin timed at another recompute mode (module docstring), that
    mode, and whether the fp8 row cast its experts' weights beforehand
    (``fp8_weights_cached``); None where the profile has no such pair. A mode on the same
    side of full recomputation is preferred (its backward holds the same passes).
    ``priced(mode)``: the fp8 layer's (forward, backward) seconds at ``mode`` as the cost
    model prices it here, used where that mode's fp8 row was timed at one other
    micro-batch only."""
    if job.precision != "fp8" or job.runtime != "torch" or not tables \
            or getattr(tables, "fp8_layer", None) is None:
        return None
    full = recompute == "full"
    at = dict(micro_batch=micro_batch, tp=tp, sequence_parallel=sequence_parallel,
              compile=compile)
    for mode in sorted((m for m in RECOMPUTE_MODES if m != recompute),
                       key=lambda m: (m == "full") != full):
        f8 = fp8_row(tables, model, job, recompute=mode, **at)
        bf16 = tables.layer(model, seq_len=job.seq_len, recompute=mode, **at) if f8 else None
        if f8 is None or bf16 is None:
            continue
        # an fp8 row timed at another micro-batch only: as the cost model prices it at this
        # one (parts.grown_fp8_row), where the caller can say
        f_s, b_s = (priced(mode) if priced is not None and len(f8.extended_from) == 1
                    else (f8.forward_s, f8.backward_s))
        d_f, d_b = f_s - bf16.forward_s, b_s - bf16.backward_s
        if (mode == "full") != full:
            d_b += d_f if full else -d_f
        return d_f, d_b, mode, f8.fp8_weights_cached
    return None


def sibling_caveat(label: str, mode: str) -> str:
    return (f"fp8 layer: no fp8 row at {label}; priced as the bf16 row plus the fp8 − bf16 "
            f"difference the profile timed at recompute {mode} (meshplan/costmodel/"
            "fp8_rows.py); `meshplan calibrate` with a larger --time-budget times the row")


def row_label(job: Job, *, micro_batch: int, tp: int, sequence_parallel: bool,
              recompute: str, compile: bool, timed_at: tuple[int, ...] = ()) -> str:
    """Which row priced the layer (for the estimate's caveat); `timed_at` names the
    micro-batches a row carried to this one was timed at."""
    sp = " with SP" if sequence_parallel and tp > 1 else ""
    mb = (f"micro-batch {micro_batch}" if not timed_at or timed_at == (micro_batch,) else
          f"timed at micro-batch {', '.join(map(str, timed_at))}, grown to {micro_batch}")
    return (f"{job.fp8_recipe}, {'compiled' if compile else 'eager'}, tp {tp}{sp}, recompute "
            f"{recompute}, seq {job.seq_len}, {mb}")


def row_caveat(label: str) -> str:
    return (f"fp8 layer priced from the profile's measured fp8 row ({label}): its casts "
            "(weight re-casts per micro-batch included) and fp8 GEMMs as "
            "timed, not composed from the bf16 row (meshplan/costmodel/fp8_rows.py)")


__all__ = ["fp8_row", "sibling_delta", "row_label", "row_caveat", "sibling_caveat"]
