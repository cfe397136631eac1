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
"""

from __future__ import annotations

import math

from meshplan.costmodel.memory import activation_bytes_per_element
from meshplan.costmodel.moe import MoEActivations
from meshplan.spec import Job, Layout, ModelSpec

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


__all__ = ["routed_activations", "padded_rows"]
