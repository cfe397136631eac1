"""Multi-head latent attention (DeepSeek-V2, arXiv 2405.04434 §2.1, eqs. 9-19): what
:mod:`meshplan.costmodel.mla` prices and Megatron-Core's ``MLASelfAttention`` computes.

Notation as there: h hidden, n_h heads, d_n / d_r the non-rotary / rotary query-key head
dims, d_v the value head dim, r_q / r_kv the query / key-value latent ranks.

* queries: ``q_up(q_norm(q_down(x)))`` (h → r_q → n_h(d_n + d_r)), or one ``q`` linear
  (h → n_h(d_n + d_r)) without ``q_lora_rank``; per head [q_nope (d_n) | q_rope (d_r)];
* keys and values: ``kv_down(x)`` → [c_kv (r_kv) | k_rope (d_r)];
  ``kv_up(kv_norm(c_kv))`` (r_kv → n_h(d_n + d_v)), per head [k_nope (d_n) | v (d_v)];
* RoPE (the executor's rotate-half pairs, :func:`~meshplan.executor.attention_core.
  apply_rope` with tables of d_r) on q_rope and on the one k_rope every head shares;
  q = [q_nope | q_rope], k = [k_nope | k_rope broadcast to the heads];
* the causal core over d_n + d_r with softmax scale 1/√(d_n + d_r) (SDPA's default for
  q's last dim) and values of d_v; ``proj`` (n_h·d_v → h).

The up-projections' rows are grouped by head ([q_nope | q_rope] and [k_nope | v] head after
head, as Megatron-Core's views read them), so a contiguous 1/tp of their rows is 1/tp of
the heads: tensor parallelism cuts them as one section (no ``ShardSpec.sections``), and
checkpoints reshard them like any column-parallel weight. The down-projections and the
latent norms are replicated over tp (Megatron-Core's ``parallel_mode="duplicated"``); the
shared rotary key then enters the head-split region through ``shared_key_to_tp``
(identity here; ``f`` — all-reduce of its gradient, or with sequence parallelism the
all-gather — under :func:`meshplan.executor.tensor_parallel.parallelize_mla`), as the
latents enter it through the up-projections' own ``f``.

No biases: ``ModelSpec`` refuses ``bias = True`` with MLA (spec/_model_checks.py). The
latent norms are RMSNorms (DeepSeek's ``q_a_layernorm`` / ``kv_a_layernorm``). RoPE follows
``ModelSpec.position_embedding`` as :class:`~meshplan.executor.model.Attention` does:
with learned positions the rotary parts stay unrotated (and the cost model prices no
RoPE). DeepSeek-V3's YaRN scaling of the softmax is not applied (the cost model does not
see it either).
"""

from __future__ import annotations

import os

import torch
import torch.nn as nn

from meshplan.errors import ExecutorError
from meshplan.executor.attention_core import (FORCED_FLASH, RING_KERNEL_ENV, AttentionCore,
                                              RMSNorm, apply_rope, recomputed_core,
                                              uneven_ring_refusal)
from meshplan.spec import Job, Layout, ModelSpec


class MLAttention(nn.Module):
    """Multi-head latent attention with the parameter names ``q`` (or ``q_down``,
    ``q_norm``, ``q_up``), ``kv_down``, ``kv_norm``, ``kv_up`` and ``proj``.

    ``num_heads`` is this tp rank's count (tensor parallelism divides it); ``core`` and
    ``recompute_core`` as in :class:`~meshplan.executor.model.Attention`.
    """

    def __init__(self, spec: ModelSpec):
        super().__init__()
        if spec.position_embedding == "rope" and spec.qk_rope_head_dim % 2:
            raise ExecutorError(f"RoPE rotates pairs of dims: qk_rope_head_dim = "
                                f"{spec.qk_rope_head_dim} must be even")
        h, nh = spec.hidden_size, spec.num_heads
        self.num_heads = nh
        self.d_nope, self.d_rope, self.d_v = (spec.qk_nope_head_dim, spec.qk_rope_head_dim,
                                              spec.v_head_dim)
        self.kv_rank = spec.kv_lora_rank
        qk = self.d_nope + self.d_rope
        self.q_lora = spec.q_lora_rank is not None
        if self.q_lora:
            self.q_down = nn.Linear(h, spec.q_lora_rank, bias=False)
            self.q_norm = RMSNorm(spec.q_lora_rank)
            self.q_up = nn.Linear(spec.q_lora_rank, nh * qk, bias=False)
        else:
            self.q = nn.Linear(h, nh * qk, bias=False)
        self.kv_down = nn.Linear(h, self.kv_rank + self.d_rope, bias=False)
        self.kv_norm = RMSNorm(self.kv_rank)
        self.kv_up = nn.Linear(self.kv_rank, nh * (self.d_nope + self.d_v), bias=False)
        self.proj = nn.Linear(nh * self.d_v, h, bias=False)
        self.shared_key_to_tp: nn.Module = nn.Identity()
        self.core = AttentionCore()
        self.recompute_core = False
        # the linears fp8 converts (meshplan.executor.fp8), as qkv and proj of Attention
        self.linear_names = (("q_down", "q_up") if self.q_lora else ("q",)) + (
            "kv_down", "kv_up", "proj")

    def forward(self, x, rope):
        nh, dn, dr, dv = self.num_heads, self.d_nope, self.d_rope, self.d_v
        if self.q_lora:
            q = self.q_up(self.q_norm(self.q_down(x)))
        else:
            q = self.q(x)                          # (b, s, nh·(dn + dr))
        b, s, _ = q.shape                          # full sequence (x may be an SP slice)
        q = q.view(b, s, nh, dn + dr).transpose(1, 2)              # (b, nh, s, dn + dr)
        c_kv, k_rope = self.kv_down(x).split((self.kv_rank, dr), dim=-1)
        kv = self.kv_up(self.kv_norm(c_kv)).view(b, s, nh, dn + dv).transpose(1, 2)
        k_nope, v = kv.split((dn, dv), dim=-1)     # (b, nh, s, dn), (b, nh, s, dv)
        k_rope = self.shared_key_to_tp(k_rope).unsqueeze(1)        # (b, 1, s, dr)
        if rope is not None:
            cos, sin = rope[0][:s], rope[1][:s]
            q_nope, q_rope = q.split((dn, dr), dim=-1)
            q = torch.cat((q_nope, apply_rope(q_rope, cos, sin)), dim=-1)
            k_rope = apply_rope(k_rope, cos, sin)
        k = torch.cat((k_nope, k_rope.expand(b, nh, s, dr)), dim=-1)  # (b, nh, s, dn + dr)
        # v's head dim (dv) differs from q's and k's (dn + dr): not padded, SDPA takes it.
        # On CUDA it picks cuDNN's kernel where it prefers cuDNN (Hopper, cuDNN > 9.15),
        # which ran these dims natively on one H200; flash-attention 2 refuses them, and the
        # memory-efficient fallback's backward ran 6-8x slower there (padding v cost
        # 1.4-1.6x: docs/benchmarks/moe_checks.md "MLA on one H200"). CPU: SDPA's kernels.
        if self.recompute_core:
            y = recomputed_core(self.core, q, k, v)
        else:
            y = self.core(q, k, v)                 # (b, nh, s, dv)
        y = y.transpose(1, 2).reshape(b, s, nh * dv)
        return self.proj(y)


def check_mla_runnable(model: ModelSpec, job: Job, layout: Layout) -> None:
    """What the executor's MLA needs of the layout (no process group needed): under
    context parallelism the ring's block kernel must take a value head dim unlike the
    query-key one, which flash-attention 2 does not (``MESHPLAN_RING_KERNEL=flash``
    forces it; :func:`~meshplan.executor.context_parallel.block_kernel` picks cuDNN's or,
    on CPU, the math kernel); the all-to-all style runs SDPA on whole sequences."""
    if not model.is_mla or layout.cp == 1 or layout.cp_style != "ring":
        return
    dqk, dv = model.qk_nope_head_dim + model.qk_rope_head_dim, model.v_head_dim
    if dqk != dv and os.environ.get(RING_KERNEL_ENV) == "flash":
        raise ExecutorError(f"cp = {layout.cp}: " + uneven_ring_refusal(dqk, dv, FORCED_FLASH))


__all__ = ["MLAttention", "check_mla_runnable"]
