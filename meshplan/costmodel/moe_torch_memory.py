"""Activation bytes of the executor's routed MoE part (runtime "torch"), tensor by tensor.

:func:`meshplan.costmodel.moe.moe_activation_bytes` counts what Megatron-Core's MoE layer
keeps. meshplan's executor (:class:`meshplan.executor.moe.MoELayer`) keeps what each
operator's backward needs (read from ``executor/moe.py``), per micro-batch on one rank, with
T the tokens the rank routes, C = k·T its routed copies (fewer under a capacity), R the
rows its local experts compute (:func:`meshplan.costmodel.moe.routed_tokens_per_rank`),
E_l = E/ep its local experts, R' = ⌈(R + 7·E_l)/8⌉·8 the grouped GEMM's padded buffer (the
executor sizes it from that host-known bound: ``group_padding``), e the compute dtype's bytes:

- router, per token: its input's fp32 copy (the router linear keeps it for its weight
  gradient; 4h), the probabilities (softmax's or sigmoid's output, 4E), the top-k indices
  and the slot of each copy (int64, 2·8k), the gate values the combine keeps (4k) and, with
  top-k renormalisation, the top-k values and their sum (4k + 4); sigmoid gates with the
  balance loss also keep the probabilities' sum (4);
- per copy: its token and copy index (int64, 16) and the expert output the combine keeps
  (e·h) — with ep > 1 the rows returned by the combine's all-to-all;
- per padded row: the grouped GEMM's input (e·h), the fc1 output, then SwiGLU's SiLU output
  and product (e·(m·f + 2f)) or GELU's output (e·2f); with biases, the index each bias is
  gathered by (``repeat_interleave``'s, 2·8);
- per row: the padding's destination index (8), and with ep > 1 the regrouping index and
  its inverse (2·8).

The 16-bit copies of the expert weights are counted with the weights
(:meth:`meshplan.costmodel.moe_tables.ExpertTerms.copy_bytes`). Checked on CPU against
torch's ``saved_tensors_hooks`` for SwiGLU and GELU experts, softmax and sigmoid routers,
with and without renormalisation, balance loss, biases and a capacity factor
(tests/unit/test_moe_torch_memory.py). Megatron's count (2h + (m + 1)·f a row, no fp32
router input) is 20 % / 31 % below these on moeh1's / moeh2's shapes (bf16, micro-batch 2 /
4).

A block compiled by ``Layout.compile`` keeps less than this eager count: Inductor's
partitioner re-runs the cheap element-wise ops in the backward. The named memory correction
``compiled_moe_block_kept`` (:func:`with_compiled_block_memory`, its formula in
:func:`compiled_block_kept_bytes`) prices a compiled MoE layer that has no measured row
with what the compiled block keeps, its 16-bit weight copies with it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from meshplan.costmodel.compiled_block_memory import (compiled_kept_rule, dense_part_per_token,
                                                      linear_copy_bytes, one_compiled_graph,
                                                      rope_table_bytes, with_compiled_kept)
from meshplan.costmodel.fp8_experts import torch_experts_fp8
from meshplan.costmodel.memory import activation_bytes_per_element
from meshplan.costmodel.moe import MoEActivations, moe_params_per_rank, shared_width
from meshplan.costmodel.torch_activations import torch_layer_activations
from meshplan.hardware_profiles.corrections import CorrectionNumbers
from meshplan.spec import Job, Layout, ModelSpec

if TYPE_CHECKING:
    from meshplan.costmodel.parts import LayerParts

INDEX_BYTES = 8          # int64 indices
GROUP_ALIGN_ROWS = 8     # executor/moe.py pads each expert's rows to this (a test checks)


def padded_rows(rows: float, local_experts: int) -> float:
    """R': the grouped GEMM's buffer for ``rows`` rows over ``local_experts`` groups."""
    a = GROUP_ALIGN_ROWS
    return math.ceil((rows + local_experts * (a - 1)) / a) * a


def routed_activations(model: ModelSpec, job: Job, layout: Layout, tokens: float,
                       rows: float, copies: float | None = None) -> MoEActivations:
    """Kept bytes of the executor's routed part for one micro-batch on one rank (module
    docstring): ``tokens`` T, ``rows`` R, ``copies`` C (default k·T)."""
    e = activation_bytes_per_element(job)
    h, n_exp, k = model.hidden_size, model.num_experts, model.experts_per_token
    f = model.moe_ffn_hidden_size / layout.etp
    c = k * tokens if copies is None else copies
    fp32_input = 0.0 if (e == 4 and model.num_shared_experts) else 4 * h
    gates = 4 * k + ((4 * k + 4) if model.router_norm_topk else 0)
    sigmoid_sum = 4 if model.router == "sigmoid" and model.router_aux_loss_coeff > 0 else 0
    router = tokens * (fp32_input + 4 * n_exp + 2 * INDEX_BYTES * k + gates + sigmoid_sum)
    act = (model.ffn_matrices * f + 2 * f) if model.activation == "swiglu" else 2 * f
    local = n_exp // layout.ep
    regroup = 2 if layout.ep > 1 else 0
    bias_index = 2 * INDEX_BYTES if model.bias else 0
    expert = (c * (2 * INDEX_BYTES + e * h) + padded_rows(rows, local) * (e * (h + act)
                                                                        + bias_index)
              + rows * INDEX_BYTES * (1 + regroup))
    return MoEActivations(router, expert, 0.0, 2 * rows * h * e)


# ---- compiled MoE blocks (named memory correction) ---------------------------------------
COMPILED_MOE_BLOCK = "compiled_moe_block_kept"


def compiled_block_applies(model: ModelSpec, job: Job, layout: Layout,
                           numbers: CorrectionNumbers) -> bool:
    """Whether :func:`compiled_block_kept_bytes` prices an MoE layer composed without a
    measured row: one compiled graph
    (:func:`~meshplan.costmodel.compiled_block_memory.one_compiled_graph`), recompute none
    or full, and the block family the formula was read on (RMSNorm, rotary, SwiGLU
    experts without biases, a softmax router without capacity, no MLA, no dense layers),
    in bf16 or in fp8 with the executor's fp8 routed experts (rowwise)."""
    return (one_compiled_graph(job, layout) and model.is_moe
            and numbers.enabled(COMPILED_MOE_BLOCK)
            and layout.recompute in ("none", "full")
            and model.norm == "rmsnorm" and model.position_embedding == "rope"
            and model.activation == "swiglu" and not model.bias and not model.is_mla
            and model.router == "softmax" and model.capacity_factor is None
            and not model.dense_layers and not model.mtp_layers
            and (job.precision == "bf16"
                 or (job.precision == "fp8" and torch_experts_fp8(model, job))))


def compiled_block_copy_bytes(model: ModelSpec, job: Job) -> float:
    """The 16-bit weight copies one compiled MoE block saves per call (ep = tp = 1), in
    bf16: e × its linears' and routed experts' parameters (autocast's casts of the QKV,
    output and shared-expert weights, traced into the graph; the experts' ``w.to(dtype)``)
    — not the router's, which runs in fp32, nor the norms' gains, whose casts the
    partitioner re-runs. None in fp8, whose linears and routed experts read the fp32 weight
    or its fp8 cast."""
    experts = 0.0 if job.precision == "fp8" else moe_params_per_rank(model, Layout()).experts
    return linear_copy_bytes(model, job, shared_width(model)) \
        + activation_bytes_per_element(job) * experts


def compiled_block_kept_bytes(model: ModelSpec, job: Job, tokens: float,
                              rows: float) -> float:
    """What one executor MoE block compiled by Inductor keeps for its backward per
    micro-batch, its 16-bit weight copies apart (:func:`compiled_block_copy_bytes`), its own
    input included (bf16 arm; fp8 moves it by :func:`meshplan.costmodel.fp8_cost.
    torch_memory` and :mod:`meshplan.costmodel.fp8_experts` as for the eager count):
    ``tokens`` T on the rank, ``rows`` R routed rows, e the compute dtype's bytes, q / k
    the query / key-value widths, n heads, E experts, k top-k, f_e an expert's width,
    f_s the shared experts' (0 without), m = 2 (SwiGLU):

        T·[e·h·(3 + [f_s > 0]) + 8 + attn + 4n + (m + 1)·e·f_s
           + 4E + 16k + 4k + 4·[norm top-k] + k·(16 + e·h)]
        + R'·e·(h + m·f_e + f_e) + 2·s·d·e

    attn = 4·e·q with grouped K/V, else e·(q + 2k) + 2·e·q + e·k. Per token: the block's
    input, the QKV input, the residual after attention and (with shared experts) the MLP
    input (e·h each); the two RMSNorms' fp32 rsqrt; the rotated Q, the K and V expanded to
    the query heads and the attention output (grouped; multi-head: the fused QKV output,
    which V views, the rotated Q and K and the output) and the log-sum-exp; the shared
    experts' fc1 output and SwiGLU product; the router's probabilities, top-k indices and
    copy slots (int64), gates and their sum; per routed copy its two int64 indices and the
    expert output the combine keeps. Per padded row R' (:func:`padded_rows`) the grouped
    GEMM's input, fc1's output and the SwiGLU product (fc2's input). Per position the
    rotary cos / sin in 16 bits.

    Source: the saved tensors of one executor block compiled by Inductor on CPU (torch
    2.13, ``saved_tensors_hooks``: ``benchmarks/compiled_moe_saved_bytes.py``), tensor by
    tensor. Eager autograd keeps what :func:`routed_activations` and
    :func:`meshplan.costmodel.torch_activations.torch_layer_activations` count; Inductor's
    min-cut partitioner (``torch/_functorch/partitioners.py``,
    ``min_cut_rematerialization_partition``) re-runs the cheap element-wise ops in the
    backward instead: the fp32 copies of the norms' and the router's inputs (12·h), the
    norms' outputs before the gain, SiLU's output (R'·e·f_e, and e·f_s), one rotary table
    cast, the top-k values and the padding index, and keeps the block's input to re-run
    the first norm from. Checked against the compiled GPU rows (bf16, recompute none, ep 1)
    of the stored 1-GPU MoE profiles (H200, and H100 moeh64h100's): per token within 0.1 %
    on 15 of 17 block shapes — every profile from 2026-12-01 on — where the eager count
    reads 27-49 % above them; the two of 2026-11-29 (moeh1, moeh2: an earlier executor)
    read 16 % and 5 % above the formula (``compiled_moe_saved_bytes.py --rows``)."""
    e = activation_bytes_per_element(job)
    k, fe = model.experts_per_token, model.moe_ffn_hidden_size
    router = (4 * model.num_experts + 2 * INDEX_BYTES * k + 4 * k
              + (4 if model.router_norm_topk else 0))
    per_token = (dense_part_per_token(model, job, shared_width(model)) + router
                 + k * (2 * INDEX_BYTES + e * model.hidden_size))
    padded = padded_rows(rows, model.num_experts) * e * (model.hidden_size
                                                         + model.ffn_matrices * fe + fe)
    return tokens * per_token + padded + rope_table_bytes(model, job)


def eager_block_kept_bytes(model: ModelSpec, job: Job, layout: Layout, tokens: float,
                           rows: float) -> float:
    """The eager count of the same block (16-bit arm, no recomputation): the layer with its
    shared experts as the MLP (:func:`~meshplan.costmodel.torch_activations.
    torch_layer_activations`) and the routed part (:func:`routed_activations`)."""
    dense = torch_layer_activations(model, job, layout.micro_batch, layout.tp,
                                    layout.sequence_parallel, mlp_width=shared_width(model))
    routed = routed_activations(model, job, layout, tokens, rows)
    return dense.full_bytes + routed.router_bytes + routed.expert_bytes


def with_compiled_block_memory(parts: "LayerParts", model: ModelSpec, job: Job,
                               layout: Layout) -> "LayerParts":
    """Named memory correction ``compiled_moe_block_kept``: an MoE layer that
    ``Layout.compile`` runs as one compiled graph, priced without a measured row, keeps what
    the compiled block keeps (:func:`compiled_block_kept_bytes`), not the eager count, and
    its 16-bit weight copies go with its kept bytes, not with the weights.

    * Kept bytes: the layer's composed bytes (the eager count, with fp8's changes on it)
      move by D = C − E, C the compiled block's (its input included), E the eager count
      (:func:`eager_block_kept_bytes`): without recomputation what it keeps, under full
      recomputation what its recomputed forward rebuilds in the backward (the working
      memory) less the input it already keeps.
    * 16-bit copies (bf16): a compiled block casts its weights inside the graph once per
      call (``w.to(dtype)`` for the experts, autocast's casts traced for the linears) and
      saves the copies for its backward, as the compiled rows' intercept shows
      (:mod:`meshplan.costmodel.compiled_rows`). So they are kept per micro-batch in flight
      without recomputation; under full recomputation the checkpointed forward keeps only
      its input (the CPU block: its input, the rotary tables, no copy) and the copies exist
      for the one layer being recomputed. The weights then count none
      (``LayerParts.kept_weight_copies``; the experts' :class:`~meshplan.costmodel.
      moe_tables.ExpertTerms` ``copies_in_rows``), where before every layer's were held
      all step: (L − 1) layers' copies too many under full recomputation.

    Measured effect, POST HOC (2026-12-05; the checks the overestimate was found on): the
    datasheet's peak memory of the 1-GPU MoE checks moeh28-moeh60 (H200) and moeh61h100,
    moeh63h100, moeh64h100 (H100), 98 bf16 and 99 fp8 compiled arms, mean absolute error
    bf16 9.5 → 0.9 % (within 5 %: 19 → 95 of 98), fp8 5.1 → 0.4 % (67 → 99 of 99): bf16
    full recomputation +9.5..+11.4 % mean by micro-batch → −0.7..+1.1 %, bf16 / fp8
    without recomputation +2.8..+14.0 / +2.5..+17.7 % (growing with the micro-batch) →
    −0.6..−0.1 %. Left: bf16 full recomputation at micro-batch 16, −6.2..+8.7 % on six
    arms, as the calibrated profiles price them (their peak at the output layer and the
    step's first backward, not a layer's). Step times do not move. A profile with the
    model's compiled MoE rows is read as before (the rows hold all this)."""
    tokens = job.seq_len * layout.micro_batch
    rows = moe_rows_at_ep1(model, tokens)
    compiled = compiled_block_kept_bytes(model, job, tokens, rows)
    d = compiled - eager_block_kept_bytes(model, job, layout, tokens, rows)
    inp = tokens * model.hidden_size * activation_bytes_per_element(job)
    return with_compiled_kept(parts, layout.recompute, d, compiled_block_copy_bytes(model, job),
                              inp)


def moe_rows_at_ep1(model: ModelSpec, tokens: float) -> float:
    """R at ep = etp = 1 without a capacity: every routed copy, k·T."""
    return model.experts_per_token * tokens


COMPILED_MOE_BLOCK_CORRECTION = compiled_kept_rule(COMPILED_MOE_BLOCK, compiled_block_applies,
                                                   with_compiled_block_memory)

__all__ = ["routed_activations", "padded_rows", "COMPILED_MOE_BLOCK",
           "COMPILED_MOE_BLOCK_CORRECTION", "compiled_block_applies",
           "compiled_block_copy_bytes", "compiled_block_kept_bytes", "eager_block_kept_bytes",
           "with_compiled_block_memory"]
