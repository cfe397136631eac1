"""Gradient accumulation across a step's micro-batches (runtime "torch").

Where the executor keeps a rank's gradients whole through the step (ZeRO-0/1: plain
``.grad`` or DDP's ``no_sync`` micro-batches), autograd's ``AccumulateGrad`` node steals the
first micro-batch's weight gradient into ``.grad`` (no copy: ``optimizer.zero_grad(
set_to_none=True)`` left it undefined) and adds every later one in place: read ``.grad``,
read the new gradient, write ``.grad`` (PyTorch ``torch/csrc/autograd/functions/
accumulate_grad.h``, ``accumulateGrad``; ``executor/parallelize.py`` zeroes with
``set_to_none=True``). With fp32 gradients (autocast: the weight's cast-back is part of the
gradient's own pass) that is 3 × 4 bytes a parameter, m − 1 times a step:

    t_acc = (m − 1) · 12 · P_rank / (HBM · η_add)

P_rank the parameters whose gradients the rank holds (the stage's layers at 1/tp, its
routed experts at 1/(ep·etp), its embedding and output layer), η_add the profile's
element-wise rate (``residual-add``: the in-place add is that kernel).

What the per-micro-batch prices already hold, so that only the difference is added:

* a measured row (``meshplan calibrate``'s layers and ends, ``calibrate/layer_run.py``) is
  timed with its parameters' gradients never cleared: one accumulation in every
  micro-batch, m a step — one too many;
* the analytical eager layer counts its weights' gradient traffic in every micro-batch
  (:func:`meshplan.costmodel.torch_membound.weight_grad_bytes`) — one too many;
* the analytical compiled layer (Inductor's fused count), the routed experts priced
  analytically (:mod:`meshplan.costmodel.moe_layer`) and the analytical ends count none —
  m − 1 too few.

Each per-micro-batch price moves by (m − 1 − priced) / m of one accumulation, so a step's
m micro-batches add the difference once. Runtime "megatron" accumulates in the
weight-gradient GEMM's epilogue (gradient-accumulation fusion into ``main_grad``): nothing
here. Not priced: FSDP2 (ZeRO-2/3), whose reduce per micro-batch accumulates sharded
gradients, and whose pipelined form upcasts unsharded ones
(:func:`meshplan.costmodel.runtime.fsdp_accumulates_unsharded`).

Measured error (POST HOC, docs/benchmarks/moe_checks.md "Gradient accumulation across
micro-batches"): over the 176 runs of moeh18-moeh49 (1 × H200, the H200 datasheet profile)
the step's mean absolute error 7.5 → 5.9 % (micro-batch 4: −7.6 → −0.6 % signed; 16, one
micro-batch, unchanged); over the dense fp8h checks' 101 runs 11.3 → 12.1 % (the dense
datasheet reads slow at every micro-batch but 1; this moves its small micro-batches the
right way and the rest further slow). Held out as run on moeh50 (a never-run MoE model, 1 ×
H200, rule fixed before the run): the datasheet's arms with 4 and 8 micro-batches a step
7.9 → 1.6 % mean, all six 6.5 → 2.4 %; moeh40's calibration 12.5 → 10.5 %. On the dense
fp8h31 (docs/benchmarks/fp8_checks.md) its rule, on how the step grows with micro-batches,
was not met: 7.8 % with the term, 7.2 % without (bf16 at eight micro-batches +0.9 → +4.8 %).
The adds themselves, measured as each step's later backwards over its first (CUDA events,
``benchmarks/grad_accumulation_phases.py``): 0.92× the priced time over 119 MoE runs, 1.03×
over 83 dense ones (medians). On moeh51's GPU-bound arms (held out, rule not met) the
datasheet read 3.2 % with the term, 2.6 % without. moeh52 (MoE, 2 and 8 micro-batches):
rule met, 5.9 % with, 7.3 % without; fp8h32 (a dense GPT at 2-16 micro-batches): rule met,
the step's growth 1.1 % with, 2.4 % without. Over the 16 held-out MoE arms (moeh50-52) 3.6 %
with, 5.2 % without; the adds 0.96× the priced time over those two checks' 10 runs.
"""

from __future__ import annotations

from typing import NamedTuple

from meshplan.costmodel.compute import hbm_s
from meshplan.costmodel.memory import dense_layer_extra_params, stage_params
from meshplan.costmodel.moe import moe_params_per_rank
from meshplan.hardware_profiles import Cluster
from meshplan.spec import Job, Layout, ModelSpec

#: bytes an in-place fp32 gradient accumulation moves per parameter: read .grad, read the
#: new gradient, write .grad
ACCUMULATE_BYTES_PER_PARAM = 12.0


class AccumulationTerms(NamedTuple):
    """Seconds added to one micro-batch's backward: per layer, the embedding, the output."""

    layer_s: float = 0.0
    embedding_s: float = 0.0
    output_s: float = 0.0


def accumulates_whole(job: Job, layout: Layout) -> bool:
    """The executor keeps the rank's gradients whole through the step (module docstring)."""
    return job.runtime == "torch" and layout.zero < 2


def accumulation_terms(model: ModelSpec, cluster: Cluster, job: Job, layout: Layout,
                       microbatches: int, measured: tuple[str, ...]) -> AccumulationTerms:
    """What each micro-batch's backward gains or loses so that a step holds m − 1
    accumulations (module docstring); ``measured``: the parts the profile's rows priced
    (``LayerParts.measured``)."""
    m = microbatches
    if not accumulates_whole(job, layout) or m < 1:
        return AccumulationTerms()
    gpu = cluster.gpu

    def per_microbatch(params: float, priced: int, adds: int = m - 1) -> float:
        return (adds - priced) / m * hbm_s(gpu, params * ACCUMULATE_BYTES_PER_PARAM,
                                           "residual-add")

    tp = layout.tp
    row = "layer" in measured
    # per layer of the stage, on average: MoE models' dense layers and routed experts
    dense = stage_params(model, 1, tp, first=False, last=False, pp=layout.pp)
    experts = 0.0
    if model.is_moe:
        dense += dense_layer_extra_params(model, tp) * len(model.dense_layers) / model.num_layers
        experts = (moe_params_per_rank(model, layout).experts * model.num_moe_layers
                   / model.num_layers)
    # the dense part is priced per micro-batch by a row, or by the analytical eager layer
    dense_priced = m if row or not layout.compile else 0
    layer_s = per_microbatch(dense, dense_priced) + per_microbatch(experts, m if row else 0)
    # the embedding (vocabulary shard, learned positions) and the output layer (its own
    # vocabulary shard, the final norm), each counted whole
    emb_params = stage_params(model, 0, tp, first=True, last=False, pp=layout.pp)
    out_params = stage_params(model, 0, tp, first=False, last=True, pp=layout.pp)
    # a tied weight on one stage: the output layer's gradient comes first in backward and
    # the embedding's adds to it in every micro-batch
    shared = model.tied_embeddings and layout.pp == 1
    emb_s = per_microbatch(emb_params, m if "embedding" in measured else 0,
                           adds=m if shared else m - 1)
    out_s = per_microbatch(out_params, m if "output" in measured else 0)
    return AccumulationTerms(layer_s, emb_s, out_s)


__all__ = ["ACCUMULATE_BYTES_PER_PARAM", "AccumulationTerms", "accumulates_whole",
           "accumulation_terms"]
