"""Compiled blocks under DDP: Dynamo's DDPOptimizer splits each block's graph, which the
compiled layer rows do not time — the caution an fp8 estimate carries where it happens.

**Mechanism.** The executor compiles each transformer block on its own (``block.compile()``)
and, for ZeRO-0/1 over dp·cp > 1 ranks without a pipeline, wraps the model in
``DistributedDataParallel`` (:func:`meshplan.executor.data_parallel.wrap_data_parallel`; a
pipeline's ZeRO-0/1 reduces gradients after the schedule, without DDP). A block first runs
inside DDP's forward, so Dynamo compiles it through ``DDPOptimizer``
(``torch._dynamo.config.optimize_ddp``, on by default; torch/_dynamo/backends/distributed.py),
which cuts the graph wherever the parameters met since the last cut reach DDP's bucket cap
(25 MB; 1 MB first), counting each parameter by its *storage*. Under ZeRO-1 the
executor's ``ZeroRedundancyOptimizer(parameters_as_bucket_view=True)`` makes every parameter
a view of its rank's flat bucket, so every parameter counts as that whole bucket and the
block is cut after every operator that takes a parameter: 6 pieces per Llama block (two
norms, four linears), 6 for a GPT block in bf16 and 10 in fp8 (its biases are added apart
from the fp8 GEMM); under ZeRO-0, one cut per 25 MB of fp32 parameters. Each piece is its
own AOTAutograd graph: the partitioner can no longer recompute a tensor of one piece in
another piece's backward, so what crosses a cut is kept, and each piece adds its own
runtime wrapper to the CPU's dispatch and its own kernel boundaries.

The calibration's compiled rows (``meshplan calibrate --compile-rows``, ``--fp8-rows``)
time blocks compiled whole, without DDP: they hold neither effect.

**Measured.** Split per parameter on CPU (torch 2.13, ``benchmarks/fp8_probe.py``'s
mechanism, blocks of ``benchmarks/fp8_saved_bytes.py``), a Llama block (h 256, ffn 1024)
keeps 71.1 B per token·h in bf16 (whole: 69.1) and 36.1 in fp8 (whole: 27.1): its two norm
outputs in 16 bits and the fp8 copies of the linears' inputs, which the whole graph
recomputes; a Llama block at ffn 512: bf16 +2.0, fp8 +7.0; a GPT block (LayerNorm, GELU,
biases): bf16 +0.0, fp8 +7.0 — so how much more depends on the block's operators and on
Inductor's partitioner, and is not priced here. On 4 × H200 (2026-11-28) the one such
layout run, f01 (Llama-1.64B, dp 4, ZeRO-1, micro-batch 2, compiled), peaked 0.43 GiB
(bf16) and 1.74 GiB (fp8) above the prediction from whole-block rows; the CPU-measured
split bytes at its shape (4096 tokens × 2048 × 24 layers) are 0.38 and 1.69 GiB, leaving
0.06 GiB in both arms — the same 0.07 GiB that f05 (no DDP) leaves. Its fp8 arm ran 0.76×
bf16 where the rows predict 1.07× (docs/fp8.md, "f01"); what the split costs in time has
not been measured on a GPU. On this project's CPU (``fp8_probe.py --device cpu
--per-parameter``, tiny Llama, three runs) the split added 0.46-0.52 ms of CPU per layer and
micro-batch in both precisions; at that cost f01's fp8 arm would turn host-bound by 15 ms,
a tenth of its 149 ms loss, and its bf16 arm would stay GPU-bound
(``benchmarks/fp8_f01_posthoc.py``) — ``benchmarks/fp8_probe.py`` measures it on a GPU.
"""

from __future__ import annotations

from meshplan.spec import Job, Layout

DOC = "docs/fp8.md, \"f01\""


def ddp_splits_compiled_blocks(job: Job, layout: Layout) -> bool:
    """Whether the executor runs ``layout``'s compiled blocks inside DDP's forward, where
    DDPOptimizer splits them (module docstring): runtime "torch", ``Layout.compile``,
    ZeRO-0/1, more than one gradient replica (dp·cp), no pipeline."""
    return (job.runtime == "torch" and layout.compile and layout.zero <= 1
            and layout.dp * layout.cp > 1 and layout.pp == 1)


def ddp_split_caveat(job: Job, layout: Layout) -> str | None:
    """The caution for an fp8 estimate whose compiled blocks DDP splits, else None."""
    if job.precision != "fp8" or not ddp_splits_compiled_blocks(job, layout):
        return None
    per = "parameter" if layout.zero == 1 else "25 MB of fp32 parameters"
    return (f"compiled blocks under DDP (ZeRO-{layout.zero}, {layout.dp * layout.cp} gradient "
            f"replicas, no pipeline): Dynamo's DDPOptimizer splits each block into one graph "
            f"per {per}, which the profile's compiled rows (timed whole) do not hold; on "
            f"4 × H200 such a layout kept 1.7 GiB more than predicted in fp8 (0.4 in bf16) "
            f"and ran fp8 at 0.76× bf16 where the rows predicted 1.07× ({DOC}; "
            f"benchmarks/fp8_probe.py measures the split)")


__all__ = ["ddp_splits_compiled_blocks", "ddp_split_caveat"]
