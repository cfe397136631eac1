"""Tiny multi-head latent attention models the executor's MLA tests share (unit and gloo)."""

from dataclasses import replace

from meshplan.spec import ModelSpec

# DeepSeek-V2 style, tiny: query latent 24, key-value latent 16, head dims d_n 8, d_r 4 and
# d_v 6 (v narrower than q/k, as the core must allow)
MLA = ModelSpec(name="tiny-mla", num_layers=2, hidden_size=32, num_heads=4, vocab_size=64,
                ffn_hidden_size=64, max_seq_len=16, activation="swiglu", norm="rmsnorm",
                position_embedding="rope", tied_embeddings=False, bias=False,
                q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4,
                v_head_dim=6)
# DeepSeek-V2-Lite style: no query latent, v wider than q/k
MLA_NOQ = replace(MLA, name="tiny-mla-noq", q_lora_rank=None, qk_nope_head_dim=4,
                  qk_rope_head_dim=4, v_head_dim=10, head_dim=None)
# the first layer dense, then 4 routed experts top-2 and one shared expert
MLA_MOE = replace(MLA, name="tiny-mla-moe", num_experts=4, experts_per_token=2,
                  moe_ffn_hidden_size=24, num_shared_experts=1,
                  shared_expert_ffn_hidden_size=16, dense_layers=(0,), head_dim=None)
