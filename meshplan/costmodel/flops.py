"""Floating-point operations of a training step: model FLOPs and hardware FLOPs.

Convention (Narayanan et al. 2021, arXiv 2104.04473, eq. 3; Korthikanti et al. 2022,
arXiv 2205.05198, eq. 7-8): a matrix multiply of an (m×k) by a (k×n) matrix costs 2mkn;
the backward pass costs twice the forward; attention scores and the attention-weighted
sum cost 2·s·q_dim each per token *without* halving for the causal mask (as the papers
count it; a sliding-window layer's query counts its window's keys,
:mod:`meshplan.costmodel.window`); biases, norms, softmax and activations are not counted.
For GPT this gives

    model FLOPs    = 72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h))          (Korthikanti eq. 7)
    full recompute = 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h))          (Narayanan eq. 3)
    selective      = 72·B·s·l·h²·(1 + s/(3h) + V/(12·l·h))          (Korthikanti eq. 8)

and the same bookkeeping generalizes to GQA and SwiGLU through the layer's matmul weights.
MoE (and multi-head latent attention) models: :mod:`meshplan.costmodel.moe` counts the
router, the k routed and the shared experts a token uses, in the same conventions.

Measured error: exact against the papers (tests/validation/test_published.py): Narayanan
eq. 2 parameters and eq. 3 FLOPs for every Table 1 model, whose TFLOP/s column they
reproduce within 1 % from the published step times; Korthikanti eq. 7 for GPT-3 175B.
"""

from __future__ import annotations

from functools import lru_cache

from meshplan.costmodel.memory import recomputes_core_attention
from meshplan.costmodel.window import keys_per_query
from meshplan.spec import ModelSpec


def layer_forward_flops_per_token(model: ModelSpec, seq_len: int) -> tuple[float, float]:
    """(matmul FLOPs, attention-core FLOPs) of one layer's forward pass, per token; with
    sliding windows the attention is the mean over the layers (4·keys·q_dim, keys = s or
    the window: :func:`meshplan.costmodel.window.keys_per_query`)."""
    matmul = 2.0 * model.layer_matmul_params()
    if model.sliding_window is None:
        return matmul, 4.0 * seq_len * model.q_dim
    keys = sum(keys_per_query(model, i, seq_len) for i in range(model.num_layers))
    return matmul, 4.0 * keys / model.num_layers * model.q_dim


def logits_forward_flops_per_token(model: ModelSpec) -> float:
    return 2.0 * model.hidden_size * model.vocab_size


@lru_cache(maxsize=4096)
def model_flops_per_step(model: ModelSpec, global_batch: int, seq_len: int) -> float:
    """Model FLOPs of one optimizer step (forward + backward, no recompute); an MoE model's
    count only the experts each token uses (:func:`meshplan.costmodel.moe.
    moe_model_flops_per_step`, which also counts MLA and multi-token prediction)."""
    if model.is_moe or model.is_mla:
        from meshplan.costmodel.moe import moe_model_flops_per_step
        return moe_model_flops_per_step(model, global_batch, seq_len)
    tokens = global_batch * seq_len
    mm, attn = layer_forward_flops_per_token(model, seq_len)
    per_token = model.num_layers * (mm + attn) + logits_forward_flops_per_token(model)
    return 3.0 * tokens * per_token


def recompute_flops_per_step(model: ModelSpec, global_batch: int, seq_len: int,
                             recompute: str) -> float:
    """Extra forward FLOPs that activation recomputation adds in one step."""
    tokens = global_batch * seq_len
    mm, attn = layer_forward_flops_per_token(model, seq_len)
    if recompute == "full":
        return tokens * model.num_layers * (mm + attn)
    if recompute == "selective":
        return tokens * model.num_layers * attn
    return 0.0


def flops_recompute(job, recompute: str) -> str:
    """The recompute mode whose FLOPs a step adds: selective without the attention core
    among ``job.recompute_modules`` re-runs only memory-bound work (norms, activations),
    FLOPs-wise none."""
    if recompute == "selective" and not recomputes_core_attention(job):
        return "none"
    return recompute


@lru_cache(maxsize=4096)
def hardware_flops_per_step(model: ModelSpec, global_batch: int, seq_len: int,
                            recompute: str) -> float:
    """Model FLOPs plus recomputation (what the GPUs actually execute)."""
    if model.is_moe or model.is_mla:
        from meshplan.costmodel.moe import moe_model_flops_per_step
        return moe_model_flops_per_step(model, global_batch, seq_len, recompute=recompute)
    return (model_flops_per_step(model, global_batch, seq_len)
            + recompute_flops_per_step(model, global_batch, seq_len, recompute))
