"""Autocast's weight casts: the fp32 master weights cast to 16 bits once per step.

Mechanism (runtime "torch", ZeRO-0/1, bf16/fp16): the executor keeps fp32 parameters and
runs each step under one ``torch.autocast`` context (``ParallelTrainer.step``). Autocast
casts a leaf fp32 weight that requires grad once and caches the 16-bit copy
(``cached_cast``, aten/src/ATen/autocast_mode.cpp) until the outermost autocast context
exits (``torch.autocast.__exit__`` → ``torch.clear_autocast_cache``): every step's first
forward of each linear casts its weight again, reading 4 bytes and writing 2 per parameter.
The calibrated layer and end rows are timed under *one* autocast context spanning their
warm-up and timed iterations (``calibrate.layer_build._layer_amp``, ``layer_run._run_end``),
so their timed forwards find every cast cached: the rows hold no weight cast, and the
analytical layer counts none either (:mod:`meshplan.costmodel.torch_membound`). This term
adds it back.

Formula, per pipeline rank and step:

    t_cast = P_cast · (4 + e) / (hbm_gbps · η_copy)

* ``P_cast``: the parameters autocast casts on the rank: its layers' weights as
  :func:`meshplan.costmodel.memory.stage_params` counts them over tp (the same count as the
  cached copies' memory, :func:`meshplan.costmodel.torch_memory.compute_copy_bytes`), and on
  the last stage the output layer's ``vocab · h / tp`` (with tied embeddings the table, used
  as the LM head; the embedding lookup itself indexes the fp32 table and casts nothing);
* ``e`` = 2 bytes of the 16-bit copy;
* ``η_copy``: the profile's efficiency of the residual add (``membound_efficiency``), the
  streaming element-wise kernel the cost model already prices torch's other copies at
  (:func:`meshplan.costmodel.torch_membound.eager_layer_s`); the pooled ``hbm_efficiency``
  where the profile has no such op.

Placement: spread over the step's micro-batches in each layer's (and the output layer's)
forward, as fp8's per-step weight cast is (:func:`meshplan.costmodel.build.layer_times`).
Without a pipeline that is exact (the step runs every forward); with one, the casts of the
stages' first forwards lie on the start-up of the critical path, which the spread
approximates.

Where it does not apply: ZeRO-2/3 (FSDP2 gathers bf16 parameters, no autocast); full
recomputation (each backward's ``torch.utils.checkpoint`` recompute clears the cache, so
the rows' timed forwards re-cast every weight as the executor's forwards do — the cast is
in the rows, :meth:`meshplan.costmodel.memory_reliefs.MemoryReliefs.end_of_step_bytes`);
layers priced from compiled rows (a compiled block casts inside its graph on every call,
which those rows hold; the eager output layer still caches its cast); fp32; fp8 and MoE models (not
examined: fp8 prices its own weight casts, :mod:`meshplan.costmodel.fp8_cost`); runtime
"megatron" (16-bit parameters beside fp32 main parameters, no per-step cast).

Measured (round 38, 2 × H200, docs/benchmarks/transfer.md, round 38's post hoc ``ddpfwd``):
layouts without a pipeline measure their forward above the rows by 3.5-4.9 ms (GPT 1.39B,
dp 2), 5.2-6.2 ms (Llama 2.06B, dp 2) and 0.9-3.0 ms (tp 2); ``t_cast`` is 2.2, 3.1 and
0.55-1.55 ms. The one eager layout with two micro-batches and no pipeline (v21) measures its
first forward 2.3-3.4 ms above its second, against 0.55 ms here. The rest (1-3 ms a step,
also under FSDP2, which has no autocast) is not explained. Step time, calibrated profile:
mean 2.19 → 2.04 % over the 24 layouts (with this term alone).
"""

from __future__ import annotations

from meshplan.costmodel.compute import hbm_s
from meshplan.costmodel.memory import compute_weight_bytes_per_param, stage_params
from meshplan.hardware_profiles import GPUSpec
from meshplan.spec import Job, Layout, ModelSpec

MASTER_BYTES = 4.0     # the fp32 weight autocast reads
COPY_OP = "residual-add"   # the profile's streaming element-wise efficiency


def autocast_casts(model: ModelSpec, job: Job, layout: Layout) -> bool:
    """Whether the executor's step casts fp32 weights under autocast that the rows hold
    cached (module docstring): runtime "torch", 16-bit (not fp8) compute, ZeRO-0/1, no full
    recomputation, a dense model."""
    return (job.runtime == "torch" and job.precision in ("bf16", "fp16")
            and compute_weight_bytes_per_param(job) > 0 and layout.zero < 2
            and layout.recompute != "full" and not model.is_moe)


def _cast_s(gpu: GPUSpec, params: float, copy_b: float) -> float:
    return hbm_s(gpu, params * (MASTER_BYTES + copy_b), COPY_OP)


def layer_cast_s(model: ModelSpec, gpu: GPUSpec, job: Job, layout: Layout, *,
                 compiled: bool = False) -> float:
    """One layer's weight cast per step (0 where :func:`autocast_casts` is false or the
    layers are priced from compiled rows, ``compiled``: those hold a cast per call; a
    ``Layout.compile`` priced from eager rows gets the eager cast)."""
    if not autocast_casts(model, job, layout) or compiled:
        return 0.0
    params = stage_params(model, 1, layout.tp, first=False, last=False, pp=layout.pp)
    return _cast_s(gpu, params, compute_weight_bytes_per_param(job))


def head_cast_s(model: ModelSpec, gpu: GPUSpec, job: Job, layout: Layout) -> float:
    """The output layer's weight cast per step on the last stage (eager also when the
    layers are compiled)."""
    if not autocast_casts(model, job, layout):
        return 0.0
    params = model.vocab_size * model.hidden_size / layout.tp
    return _cast_s(gpu, params, compute_weight_bytes_per_param(job))


__all__ = ["autocast_casts", "layer_cast_s", "head_cast_s"]
