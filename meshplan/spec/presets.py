"""Named models. Shapes from the papers and model cards cited beside each group."""

from __future__ import annotations

_GPT = dict(activation="gelu", norm="layernorm", position_embedding="learned",
            tied_embeddings=True, bias=True, dropout=True)
_LLAMA = dict(activation="swiglu", norm="rmsnorm", position_embedding="rope",
              tied_embeddings=False, bias=False, dropout=False)


def _gpt(layers: int, hidden: int, heads: int, seq: int = 2048, vocab: int = 51200) -> dict:
    return dict(num_layers=layers, hidden_size=hidden, num_heads=heads, vocab_size=vocab,
                max_seq_len=seq, **_GPT)


def _llama(layers: int, hidden: int, heads: int, kv: int, ffn: int, vocab: int, seq: int,
           **extra) -> dict:
    return {**dict(num_layers=layers, hidden_size=hidden, num_heads=heads, num_kv_heads=kv,
                   ffn_hidden_size=ffn, vocab_size=vocab, max_seq_len=seq, **_LLAMA), **extra}


def _deepseek(layers: int, hidden: int, ffn: int, vocab: int, experts: int, topk: int,
              moe_ffn: int, shared: int, first_dense: int, **extra) -> dict:
    """DeepSeek-V2/V3: 128 heads of multi-head latent attention (q_lora_rank 1536,
    kv_lora_rank 512, 128 + 64 query/key dims, 128 value dims), the first layers dense."""
    return _llama(layers, hidden, 128, 128, ffn, vocab, 163840, num_experts=experts,
                  experts_per_token=topk, moe_ffn_hidden_size=moe_ffn,
                  num_shared_experts=shared, dense_layers=tuple(range(first_dense)),
                  q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
                  qk_rope_head_dim=64, v_head_dim=128, **extra)


MODEL_PRESETS: dict[str, dict] = {
    # Narayanan et al. 2021 (arXiv 2104.04473) Table 1; vocab 51200, seq 2048.
    "gpt-1.7b": _gpt(24, 2304, 24),
    "gpt-3.6b": _gpt(30, 3072, 32),
    "gpt-7.5b": _gpt(36, 4096, 32),
    "gpt-18.4b": _gpt(40, 6144, 48),
    "gpt-39.1b": _gpt(48, 8192, 64),
    "gpt-76.1b": _gpt(60, 10240, 80),
    "gpt-145.6b": _gpt(80, 12288, 96),
    "gpt-310.1b": _gpt(96, 16384, 128),
    "gpt-529.6b": _gpt(105, 20480, 128),
    "gpt-1t": _gpt(128, 25600, 160),
    # Brown et al. 2020 (arXiv 2005.14165) Table 2.1, with Megatron's padded vocab 51200.
    "gpt3-175b": _gpt(96, 12288, 96),
    # Shoeybi et al. 2019 (arXiv 1909.08053) Table 1; seq 1024, head dim 96.
    "megatron-1.2b": _gpt(40, 1536, 16, seq=1024),
    "megatron-2.5b": _gpt(54, 1920, 20, seq=1024),
    "megatron-4.2b": _gpt(64, 2304, 24, seq=1024),
    "megatron-8.3b": _gpt(72, 3072, 32, seq=1024),
    # Touvron et al. 2023 (arXiv 2307.09288) and the released config.json files.
    "llama2-7b": _llama(32, 4096, 32, 32, 11008, 32000, 4096),
    "llama2-13b": _llama(40, 5120, 40, 40, 13824, 32000, 4096),
    "llama2-70b": _llama(80, 8192, 64, 8, 28672, 32000, 4096),
    # Llama 3 herd (arXiv 2407.21783) Table 3 and the released config.json files.
    "llama3-8b": _llama(32, 4096, 32, 8, 14336, 128256, 8192),
    "llama3-70b": _llama(80, 8192, 64, 8, 28672, 128256, 8192),
    "llama3-405b": _llama(126, 16384, 128, 8, 53248, 128256, 8192),
    # ---- mixture of experts: shapes from each model's released config.json ----------------
    # huggingface.co/mistralai/Mixtral-8x7B-v0.1/blob/main/config.json (Jiang et al. 2024,
    # arXiv 2401.04088): 8 experts, top-2, router_aux_loss_coef 0.02.
    "mixtral-8x7b": _llama(32, 4096, 32, 8, 14336, 32000, 32768, num_experts=8,
                           experts_per_token=2, router_aux_loss_coeff=0.02),
    # huggingface.co/mistralai/Mixtral-8x22B-v0.1/blob/main/config.json
    "mixtral-8x22b": _llama(56, 6144, 48, 8, 16384, 32000, 65536, num_experts=8,
                            experts_per_token=2, router_aux_loss_coeff=0.001),
    # huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json (arXiv 2412.19437): 256
    # routed + 1 shared expert, top-8, sigmoid gates, first 3 layers dense, one MTP module;
    # sequence-wise balance loss α = 0.0001 (§4.2).
    "deepseek-v3": _deepseek(61, 7168, 18432, 129280, 256, 8, 2048, 1, 3, router="sigmoid",
                             router_aux_loss_coeff=0.0001, mtp_layers=1),
    # huggingface.co/deepseek-ai/DeepSeek-V2/blob/main/config.json (arXiv 2405.04434): 160
    # routed + 2 shared, top-6, softmax gates not renormalised, first layer dense, α1 = 0.003.
    "deepseek-v2": _deepseek(60, 5120, 12288, 102400, 160, 6, 1536, 2, 1,
                             router_norm_topk=False, router_aux_loss_coeff=0.003),
    # huggingface.co/Qwen/Qwen3-30B-A3B/blob/main/config.json and Qwen3-235B-A22B (Qwen3
    # technical report, arXiv 2505.09388): 128 experts, top-8, head_dim 128, no shared expert.
    "qwen3-30b-a3b": _llama(48, 2048, 32, 4, 6144, 151936, 40960, head_dim=128, num_experts=128,
                            experts_per_token=8, moe_ffn_hidden_size=768,
                            router_aux_loss_coeff=0.001),
    "qwen3-235b-a22b": _llama(94, 4096, 64, 4, 12288, 151936, 40960, head_dim=128,
                              num_experts=128, experts_per_token=8, moe_ffn_hidden_size=1536,
                              router_aux_loss_coeff=0.001),
    # huggingface.co/allenai/OLMoE-1B-7B-0924/blob/main/config.json (arXiv 2409.02060):
    # 64 experts, top-8, gates not renormalised.
    "olmoe-1b-7b": _llama(16, 2048, 16, 16, 1024, 50304, 4096, num_experts=64,
                          experts_per_token=8, router_norm_topk=False),
    # huggingface.co/openai/gpt-oss-120b/blob/main/config.json and gpt-oss-20b (model card,
    # arXiv 2508.10925): biases on attention, router and experts; 128-token sliding-window
    # attention on the even layers ("layer_types": sliding, full, sliding, ...).
    "gpt-oss-120b": _llama(36, 2880, 64, 8, 2880, 201088, 131072, head_dim=64, bias=True,
                           num_experts=128, experts_per_token=4, router_aux_loss_coeff=0.9,
                           sliding_window=128, window_layers=tuple(range(0, 36, 2))),
    "gpt-oss-20b": _llama(24, 2880, 64, 8, 2880, 201088, 131072, head_dim=64, bias=True,
                          num_experts=32, experts_per_token=4, router_aux_loss_coeff=0.9,
                          sliding_window=128, window_layers=tuple(range(0, 24, 2))),
}
