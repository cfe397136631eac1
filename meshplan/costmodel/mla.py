"""Multi-head latent attention (DeepSeek-V2, arXiv 2405.04434 §2.1, eqs. 9-19; DeepSeek-V3,
arXiv 2412.19437 §2.1.1): the attention projections' GEMM shapes, the attention core's FLOPs
per query-key pair and the activations one layer keeps, on one tensor-parallel rank.

Notation: h hidden, n_h heads, d_n / d_r the non-rotary / rotary query-key head dims, d_v the
value head dim, r_q / r_kv the query / key-value latent ranks, T tokens, t = tp.

* GEMMs (Megatron-Core's ``MLASelfAttention``): the down-projections W_DQ (h × r_q) and
  W_DKV with the shared rotary key W_KR (h × (r_kv + d_r)) are replicated on every tp rank
  (``parallel_mode="duplicated"``), the up-projections W_UQ (r_q × n_h(d_n + d_r)) and
  W_UKV (r_kv × n_h(d_n + d_v)) column-parallel, W_O (n_h·d_v × h) row-parallel. Without
  ``q_lora_rank`` the queries are one column-parallel h × n_h(d_n + d_r) GEMM.
* Core: scores over d_n + d_r per head, the weighted sum over d_v: 2·(d_n + d_r + d_v) FLOPs
  per pair and head (the 2mkn convention of :mod:`meshplan.costmodel.flops`).
* Activations kept (Korthikanti et al. 2022 §4.1 bookkeeping): the latents c_Q, c_KV and the
  rotary key (replicated), q and k at n_h(d_n + d_r), v and the output at n_h·d_v (split
  over tp); the up-projections' inputs are the latents already counted.
* RoPE and the key / value split (memory-bound; Megatron-Core's fused kernels,
  ``megatron/core/fusions/fused_mla_yarn_rope_apply.py``): the query's RoPE in place on its
  rotary part (n_h·d_r read and written), the key-value up-projection's output
  (n_h(d_n + d_v)) and the shared rotary key (d_r) read once and written as the key
  (n_h(d_n + d_r): the rotary key broadcast to every head) and the value (n_h·d_v)
  (:func:`rope_elements`).
* The latents' RMSNorms (memory-bound): c_Q (r_q) and c_KV (r_kv) read and written, on
  every tp rank (:func:`latent_norm_elements`).
* Selective recomputation of the up-projections (Megatron-Core ``--recompute-modules
  mla_up_proj``, ``MLASelfAttention.get_query_key_value_tensors``: the query up-projection
  — the whole query projection without ``q_lora_rank`` —, the key-value up-projection and
  RoPE run under ``CheckpointWithoutOutput``, their outputs freed once the core has run and
  re-made before its backward): q, k (n_h(d_n + d_r) each) and v (n_h·d_v) are not kept
  (:func:`up_proj_output_elements`); backward re-runs those two GEMMs
  (:func:`up_proj_shapes`) and RoPE's forward.

Measured error: one tp rank's attention part timed in plain torch on one H200
(``benchmarks/mla_layer_gpu.py``, datasheet H200 profile, 2026-12-01, before the key / value
split and the latent norms were priced): forward + backward 8-23 % slower than priced over
DeepSeek-V3 at tp 1-8 and seq 4k-8k, V2 and V2-Lite, 5-20 % with them (post hoc) — the
GEMMs 12-39 % faster than the datasheet curve, cuDNN's core at head dims 192 / 128 within
−18 to 0 %, the eager RoPE and concatenations (unfused: about 10× the fused price) the gap
(docs/benchmarks/moe_checks.md "MLA on one H200, and TE's expert sequence at micro-batch
4"). Checked against the spec's parameter counts (``ModelSpec.attention_matmul_params``) in
tests/unit/test_costmodel_moe_wiring.py.
"""

from __future__ import annotations

from meshplan.spec import ModelSpec


def gemm_shapes(model: ModelSpec, tokens: float, tp: int) -> tuple[tuple[float, float, float], ...]:
    """(m, k, n) of the attention projections on one tp rank; the column-parallel query
    up-projection first, the row-parallel output last."""
    h, nh, t = model.hidden_size, model.num_heads, tp
    dn, dr, dv = model.qk_nope_head_dim, model.qk_rope_head_dim, model.v_head_dim
    q_out = nh * (dn + dr) / t
    if model.q_lora_rank is None:
        q = ((tokens, h, q_out),)
    else:
        q = ((tokens, model.q_lora_rank, q_out), (tokens, h, model.q_lora_rank))
    kv = ((tokens, h, model.kv_lora_rank + dr),
          (tokens, model.kv_lora_rank, nh * (dn + dv) / t))
    return q + kv + ((tokens, nh * dv / t, h),)


def up_proj_shapes(model: ModelSpec, tokens: float, tp: int
                   ) -> tuple[tuple[float, float, float], ...]:
    """(m, k, n) of the GEMMs ``mla_up_proj`` recomputation re-runs on one tp rank: the
    query's (its up-projection, or the whole projection without ``q_lora_rank``) and the
    key-value up-projection — :func:`gemm_shapes`' first and fourth (third without
    ``q_lora_rank``)."""
    shapes = gemm_shapes(model, tokens, tp)
    return shapes[0], shapes[-2]


def up_proj_output_elements(model: ModelSpec, tp: int) -> float:
    """Elements per token of what ``mla_up_proj`` recomputation does not keep on a tp rank:
    q and k at n_h(d_n + d_r), v at n_h·d_v (the core's inputs)."""
    nh = model.num_heads
    return (2 * nh * (model.qk_nope_head_dim + model.qk_rope_head_dim)
            + nh * model.v_head_dim) / tp


def pair_flops(model: ModelSpec, tp: int) -> float:
    """Forward FLOPs of one query-key pair over a tp rank's heads."""
    return 2.0 * (model.qk_nope_head_dim + model.qk_rope_head_dim + model.v_head_dim) \
        * model.num_heads / tp


def kept_elements(model: ModelSpec, tp: int) -> tuple[float, float]:
    """(replicated, tp-split) activation elements one token keeps in the attention part."""
    nh, dn, dr, dv = (model.num_heads, model.qk_nope_head_dim, model.qk_rope_head_dim,
                      model.v_head_dim)
    replicated = (model.q_lora_rank or 0) + model.kv_lora_rank + dr
    split = (2 * nh * (dn + dr) + 2 * nh * dv) / tp
    return replicated, split


def rope_elements(model: ModelSpec, tp: int) -> float:
    """Elements per token RoPE and the key / value split read and write on a tp rank
    (module docstring): q's rotary part in place, the key-value up-projection's output and
    the shared rotary key in, the key and the value out."""
    nh, dn, dr, dv = (model.num_heads, model.qk_nope_head_dim, model.qk_rope_head_dim,
                      model.v_head_dim)
    q_rope = 2 * nh * dr / tp
    kv_split = nh * (dn + dv) / tp + dr + nh * (dn + dr) / tp + nh * dv / tp
    return q_rope + kv_split


def latent_norm_elements(model: ModelSpec) -> float:
    """Elements per token the latents' RMSNorms read and write (replicated over tp)."""
    return 2 * ((model.q_lora_rank or 0) + model.kv_lora_rank)


__all__ = ["gemm_shapes", "pair_flops", "kept_elements", "rope_elements", "up_proj_shapes",
           "up_proj_output_elements", "latent_norm_elements"]
