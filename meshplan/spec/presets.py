"""Named models. Shapes from the papers and model cards cited beside each group."""

from __future__ import annotations

_GPT = dict(activation="gelu", norm="layernorm", position_embedding="learned",
            tied_embeddings=True, bias=True, dropout=True)
_LLAMA = dict(activation="swiglu", norm="rmsnorm", position_embedding="rope",
              tied_embeddings=False, bias=False, dropout=False)


def _gpt(layers: int, hidden: int, heads: int, seq: int = 2048, vocab: int = 51200) -> dict:
    return dict(num_layers=layers, hidden_size=hidden, num_heads=heads, vocab_size=vocab,
                max_seq_len=seq, **_GPT)


def _llama(layers: int, hidden: int, heads: int, kv: int, ffn: int, vocab: int, seq: int) -> dict:
    return dict(num_layers=layers, hidden_size=hidden, num_heads=heads, num_kv_heads=kv,
                ffn_hidden_size=ffn, vocab_size=vocab, max_seq_len=seq, **_LLAMA)


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
}
