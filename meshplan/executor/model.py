"""A GPT- or Llama-style decoder built from a :class:`~meshplan.spec.ModelSpec`.

The model knows nothing about parallelism. Two hooks let the executor cut it up without
changing parameter names:

* :meth:`Transformer.keep_part` keeps a contiguous slice of layers and drops the input
  embedding / final norm and head where a pipeline stage does not need them;
* :meth:`Transformer.init_weights` draws every parameter from its own generator seeded by
  ``(seed, parameter name)``, so any subset of the model, on any rank, gets bit-identical
  values to the same parameter of a full single-process model (tensor parallelism then
  slices those full tensors).

Layout of activations: ``[batch, seq, hidden]``. Attention is
``F.scaled_dot_product_attention(is_causal=True)`` (flash / memory-efficient kernels on GPU).
Architectures: GPT-2 (Radford et al. 2019: learned positions, LayerNorm, GELU MLP, biases,
tied embeddings) and Llama (Touvron et al. 2023, arXiv 2302.13971: RMSNorm, SwiGLU,
RoPE of Su et al. 2021, arXiv 2104.09864; GQA of Ainslie et al. 2023, arXiv 2305.13245),
with DeepSeek's multi-head latent attention (:mod:`meshplan.executor.mla`) where the spec
has ``kv_lora_rank``. The norms, RoPE and the attention core both attentions share are in
:mod:`meshplan.executor.attention_core`.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from meshplan.errors import ExecutorError
from meshplan.executor.attention_core import (AttentionCore, RMSNorm,  # noqa: F401
                                              _RecomputedCore, apply_rope, recomputed_core,
                                              rope_tables)
from meshplan.executor.mla import MLAttention
from meshplan.executor.mlp import MLP, seeded_normal  # noqa: F401  (re-exported)
from meshplan.executor.moe import MoELayer
from meshplan.spec import ModelSpec

INIT_STD = 0.02


def make_norm(spec: ModelSpec) -> nn.Module:
    if spec.norm == "rmsnorm":
        return RMSNorm(spec.hidden_size)
    return nn.LayerNorm(spec.hidden_size, eps=1e-5, bias=spec.bias)


class Attention(nn.Module):
    """Multi-head / grouped-query self-attention with a fused QKV projection.

    ``qkv`` holds the rows [q (num_heads·hd) | k (kv·hd) | v (kv·hd)]; tensor parallelism
    slices each section by heads and then updates ``num_heads`` / ``num_kv_heads`` to the
    local counts.
    """

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.num_heads = spec.num_heads
        self.num_kv_heads = spec.num_kv_heads
        self.head_dim = spec.head_dim
        self.qkv = nn.Linear(spec.hidden_size, spec.q_dim + 2 * spec.kv_dim, bias=spec.bias)
        self.proj = nn.Linear(spec.q_dim, spec.hidden_size, bias=spec.bias)
        self.core = AttentionCore()
        self.recompute_core = False

    def forward(self, x, rope):
        qkv = self.qkv(x)                          # (b, s, (nh + 2·nkv)·hd)
        b, s, _ = qkv.shape                        # full sequence (x may be an SP slice)
        nq, nkv, hd = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim, self.head_dim
        q, k, v = qkv.split((nq, nkv, nkv), dim=-1)
        q = q.view(b, s, self.num_heads, hd).transpose(1, 2)      # (b, nh, s, hd)
        k = k.view(b, s, self.num_kv_heads, hd).transpose(1, 2)   # (b, nkv, s, hd)
        v = v.view(b, s, self.num_kv_heads, hd).transpose(1, 2)
        if rope is not None:
            cos, sin = rope[0][:s], rope[1][:s]
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.recompute_core:
            y = recomputed_core(self.core, q, k, v)
        else:
            y = self.core(q, k, v)                 # (b, nh, s, hd)
        y = y.transpose(1, 2).reshape(b, s, nq)    # (b, s, nh·hd)
        return self.proj(y)


class Block(nn.Module):
    """Pre-norm transformer layer: x + attn(norm(x)), then x + mlp(norm(x)); the MLP of an
    MoE layer (``spec.is_moe_layer(layer)``) is :class:`meshplan.executor.moe.MoELayer`, the
    attention of an MLA model (``spec.is_mla``) :class:`meshplan.executor.mla.MLAttention`."""

    def __init__(self, spec: ModelSpec, layer: int = 0):
        super().__init__()
        self.attn_norm = make_norm(spec)
        self.attn = MLAttention(spec) if spec.is_mla else Attention(spec)
        self.mlp_norm = make_norm(spec)
        if spec.is_moe_layer(layer):
            self.mlp = MoELayer(spec)
        else:
            self.mlp = MLP(spec)
        self.recompute_block = False

    def _forward(self, x, rope):
        x = x + self.attn(self.attn_norm(x), rope)
        return x + self.mlp(self.mlp_norm(x))

    def forward(self, x, rope):
        if self.recompute_block:
            return checkpoint(self._forward, x, rope, use_reentrant=False)
        return self._forward(x, rope)


class PositionEmbedding(nn.Embedding):
    """Learned absolute positions; returns the rows for the sequence slice that ``h`` holds."""

    def positions_for(self, h: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        if positions is not None:                  # a context-parallel rank's global positions
            return self.weight[positions]          # (s, h)
        return self.weight[: h.shape[1]]           # (s, h)


class Transformer(nn.Module):
    """Decoder-only transformer. ``forward(tokens) -> logits`` on a whole model;
    on a part (see :meth:`keep_part`) the input/output is the hidden state."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        if spec.mtp_layers:
            raise ExecutorError(f"the executor's model has no multi-token prediction yet: "
                                f"{spec.name!r} has mtp_layers = {spec.mtp_layers}; run it "
                                f"with mtp_layers = 0 (the cost model and planner price MTP)")
        self.spec = spec
        h = spec.hidden_size
        self.tok_embeddings = nn.Embedding(spec.vocab_size, h)
        self.pos_embeddings = (PositionEmbedding(spec.max_seq_len, h)
                               if spec.position_embedding == "learned" else None)
        self.layers = nn.ModuleDict({str(i): Block(spec, i) for i in range(spec.num_layers)})
        self.norm = make_norm(spec)
        self.output = None if spec.tied_embeddings else nn.Linear(h, spec.vocab_size, bias=False)
        self.embeds_input = True      # this part starts from token ids
        self.computes_logits = True   # this part ends with the head
        # dtype of the residual stream (bf16 under autocast on GPU); None = embedding's dtype
        self.activation_dtype: torch.dtype | None = None
        # replaces the plain head (tensor parallelism installs a vocab-parallel one)
        self.head_override: nn.Module | None = None
        self._rope: tuple[torch.Tensor, torch.Tensor] | None = None
        # global positions of the tokens this part sees (context parallelism); None = 0..s-1
        self.position_ids: torch.Tensor | None = None

    # ---- structure -------------------------------------------------------------------
    def keep_part(self, first_layer: int, num_layers: int, *, embeds_input: bool,
                  computes_logits: bool) -> "Transformer":
        """Keep layers ``first_layer .. first_layer + num_layers - 1`` (names unchanged).

        The input embedding is dropped unless this part embeds the input or needs the tied
        weight for its head; the final norm and head are dropped unless it computes logits.
        """
        keep = {str(i) for i in range(first_layer, first_layer + num_layers)}
        for name in list(self.layers):
            if name not in keep:
                del self.layers[name]
        self.embeds_input, self.computes_logits = embeds_input, computes_logits
        tied_head = computes_logits and self.output is None
        if not embeds_input:
            self.pos_embeddings = None
            if not tied_head:
                self.tok_embeddings = None
        if not computes_logits:
            self.norm = None
            self.output = None
        return self

    def head_weight(self) -> torch.Tensor:
        return self.tok_embeddings.weight if self.output is None else self.output.weight

    # ---- initialization --------------------------------------------------------------
    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """GPT-2 init: N(0, 0.02) weights, output projections N(0, 0.02/√(2L)), zero biases,
        unit norm gains (Radford et al. 2019, §2.3).

        Each parameter has its own generator seeded from ``seed`` and its name, so the
        values do not depend on which other parameters this rank holds.
        """
        proj_std = INIT_STD / math.sqrt(2 * self.spec.num_layers)
        done = set()
        for mname, mod in self.named_modules():
            if hasattr(mod, "init_expert_weights"):      # stacked experts: one draw per expert
                mod.init_expert_weights(seed, mname, INIT_STD, proj_std)
                done |= {f"{mname}.{n}" for n, _ in mod.named_parameters()}
        for name, p in self.named_parameters():
            if name in done:
                continue
            if name.endswith("bias"):
                p.zero_()
            elif "norm" in name:
                p.fill_(1.0)
            else:
                std = proj_std if name.endswith("proj.weight") else INIT_STD
                p.copy_(seeded_normal(p.shape, std, seed, name, p.device, p.dtype))
        self.reset_buffers()

    def reset_buffers(self) -> None:
        if self.spec.position_embedding == "rope":
            dev = next(self.parameters()).device
            # MLA rotates only its d_r-wide rotary part of each query and the shared key
            dim = self.spec.qk_rope_head_dim if self.spec.is_mla else self.spec.head_dim
            cos, sin = rope_tables(self.spec.max_seq_len, dim, device=dev)
            if self.position_ids is not None:
                pos = self.position_ids.to(dev)
                cos, sin = cos[pos], sin[pos]
            self._rope = (cos, sin)

    def set_positions(self, position_ids: torch.Tensor | None) -> None:
        """Give the model the global positions of the (sharded) sequence it will see, for
        learned positions and RoPE alike (:mod:`meshplan.executor.context_parallel`)."""
        self.position_ids = position_ids
        self.reset_buffers()

    # ---- forward ---------------------------------------------------------------------
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embeds_input:
            h = self.tok_embeddings(x)             # (b, s, h)
            if self.pos_embeddings is not None:
                h = h + self.pos_embeddings.positions_for(h, self.position_ids)
            if self.activation_dtype is not None:
                h = h.to(self.activation_dtype)
        else:
            h = x                                  # (b, s, h) from the previous stage
        if self._rope is None and self.spec.position_embedding == "rope":
            self.reset_buffers()
        for layer in self.layers.values():
            h = layer(h, self._rope)
        if not self.computes_logits:
            return h
        h = self.norm(h)
        return self.lm_head(h)                     # (b, s, V)

    def lm_head(self, h: torch.Tensor) -> torch.Tensor:
        if self.head_override is not None:
            return self.head_override(h)
        return F.linear(h, self.head_weight())


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy in fp32."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


__all__ = ["Transformer", "Block", "Attention", "AttentionCore", "MLAttention", "MLP",
           "RMSNorm", "PositionEmbedding", "cross_entropy", "rope_tables", "seeded_normal"]
