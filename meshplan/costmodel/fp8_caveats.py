"""What an estimate says about its fp8 terms: the cautions :mod:`meshplan.costmodel.fp8_cost`
leaves for the caller to read (its casts assumed, eager, or composed from bf16 rows; a composed
compiled block's host dispatch on a layout its CPU paces). Each names the measurement behind
it (docs/benchmarks/fp8_checks.md) and the calibration that replaces it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from meshplan.costmodel.fp8_rows import row_caveat, sibling_caveat
from meshplan.spec import Job

if TYPE_CHECKING:
    from meshplan.costmodel.fp8_cost import Fp8Layer


def fp8_caveats(parts_fp8: Fp8Layer | None, job: Job) -> tuple[str, ...]:
    """The estimate's cautions on its fp8 terms."""
    if parts_fp8 is None:
        return ()
    rate = parts_fp8.rate
    out: list[str] = []
    if parts_fp8.row:
        return (row_caveat(parts_fp8.row),)     # the casts were timed, not priced
    if parts_fp8.sibling:
        return (sibling_caveat(*parts_fp8.sibling),)
    if rate.assumed:
        out.append(f"fp8 casts priced as {rate.how} (assumed, not measured"
                   + ("; meshplan calibrate times the executor's casts, not "
                      "TransformerEngine's)" if rate.fused else
                      ": `meshplan calibrate` on this GPU measures them)"))
    if job.runtime == "torch" and rate.pass_s > 0:
        host = (f" of GPU time, and {rate.host_pass_s * 1e6:.0f} µs a pass of the host's "
                f"dispatch" if rate.host_pass_s > 0 else "")
        out.append("fp8 without compile: the executor's eager casts cost "
                   f"{rate.pass_s * 1e6:.0f} µs a pass plus their bytes at {rate.gbps:.0f} "
                   f"GB/s{host}; on one H100 the eager fp8 linear ran 3-11× slower than bf16 "
                   "(docs/benchmarks/fp8_checks.md) — use Layout(compile=True)")
    if composed_compiled(parts_fp8, job):
        out.append(COMPOSED_COMPILED_SHARE_CAVEAT if rate.block_share
                   else COMPOSED_COMPILED_CAVEAT)
        if rate.share_family:
            out.append(other_family_share_caveat(rate.share_family))
    return tuple(out)


def other_family_share_caveat(measured_on: str) -> str:
    """The caution of compiled fp8 composed with a block share measured on another layer
    family (``CastRate.share_family``, :mod:`meshplan.costmodel.fp8_cost`)."""
    return (f"the compiled fp8 casts' block share was measured on {measured_on} layers, "
            "another family than this layer's, and the datasheet holds none for this one: "
            "on one H100 a share measured on Llama layers (0.36) priced a never-run GPT's "
            "fp8 arms 7-10 % fast, the GPT's own calibration measuring 0.74 "
            "(docs/benchmarks/fp8_checks.md \"Why fp8h55h100's fp8 arms priced fast\"); "
            "`meshplan calibrate --model` with a model of this family and `--fp8-rows` "
            "measures its share and rows")


def composed_compiled(parts_fp8: Fp8Layer | None, job: Job) -> bool:
    """Whether the executor's compiled fp8 layer was composed from bf16 rows: runtime
    "torch", compiled casts, and neither a measured fp8 row nor its sibling difference."""
    return (parts_fp8 is not None and job.runtime == "torch" and parts_fp8.rate.compiled
            and not parts_fp8.row and not parts_fp8.sibling)


#: compiled fp8 priced from the bf16 rows plus fp8's terms (no measured fp8 row), the casts
#: at their price cast alone
COMPOSED_COMPILED_CAVEAT = (
    "compiled fp8 composed from bf16 rows (no measured fp8 layer row), its casts priced as "
    "if cast alone, which Inductor fuses with the kernels around them — on one H200 seven "
    "such arms of four never-run models ran 1-38 % faster than that price "
    "(docs/benchmarks/fp8_checks.md \"fp8h16\"); this GPU's profile has no "
    "fp8_cast_compiled_block_share; `meshplan calibrate --fp8-rows` times the compiled fp8 "
    "layer itself (fp8h11-fp8h14, 2 × H200: speed-up within 1.0-1.9 % mean)")
#: the same with the casts at the profile's fp8_cast_compiled_block_share
COMPOSED_COMPILED_SHARE_CAVEAT = (
    "compiled fp8 composed from bf16 rows (no measured fp8 layer row), its casts at the "
    "profile's fp8_cast_compiled_block_share of their price cast alone: fitted on 54 compiled "
    "fp8 rows of 14 models (H200), 4.7 % mean / 12.9 % max there; seven step arms of four "
    "other never-run models 3.6 % mean (post hoc; docs/benchmarks/fp8_checks.md \"Compiled "
    "fp8 composed from bf16 rows\"); the share varies by layer family (GPT 0.32-0.74, Llama "
    "0.07-0.21 per calibration: a profile's own share is read for its own family, the "
    "datasheet's fp8_cast_compiled_block_share_by_family for another) and by model within "
    "it; `meshplan calibrate --fp8-rows` times the layer itself (fp8h18 so, as run: fp8 / "
    "bf16 speed-up within 1.3 % mean)")


#: compiled fp8 composed from bf16 rows on a layout whose CPU sets, or nearly sets, the step
COMPOSED_COMPILED_HOST_CAVEAT = (
    "compiled fp8 composed from bf16 rows, and this layout's CPU sets or nearly sets its "
    "step: a compiled fp8 block dispatches more than its bf16 twin (the amax, scale and cast "
    "kernels around each fp8 GEMM), which the composition does not price — over the "
    "committed compiled fp8 rows of 14 models on one H200 host, -0.1 to 3.5 ms a layer per "
    "micro-batch (1.3 ms mean, 0.48x the bf16 block's dispatch); fp8h17's host-bound fp8 arms "
    "ran up to 19 % slower than priced (docs/benchmarks/fp8_checks.md \"fp8h17\"). `meshplan "
    "calibrate --fp8-rows` times the compiled fp8 block's dispatch with its GPU time")


def composed_compiled_host_caveats(parts_fp8: Fp8Layer | None, job: Job,
                                   host_caveats: tuple[str, ...]) -> tuple[str, ...]:
    """:data:`COMPOSED_COMPILED_HOST_CAVEAT` where an estimate's compiled fp8 was composed
    from bf16 rows (:func:`composed_compiled`) and it carries a host-bound or near-host-bound
    caution (``host_caveats``, :func:`meshplan.costmodel.caveats.host_caveats`)."""
    return ((COMPOSED_COMPILED_HOST_CAVEAT,) if host_caveats
            and composed_compiled(parts_fp8, job) else ())


__all__ = ["fp8_caveats", "COMPOSED_COMPILED_CAVEAT", "COMPOSED_COMPILED_SHARE_CAVEAT",
           "COMPOSED_COMPILED_HOST_CAVEAT", "composed_compiled", "composed_compiled_host_caveats",
           "other_family_share_caveat"]
