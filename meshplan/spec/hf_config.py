"""Translate a Hugging Face ``config.json`` into ModelSpec keyword arguments."""

from __future__ import annotations

from typing import Any, Mapping

from meshplan.errors import ConfigError

_LLAMA_LIKE = {"llama", "mistral", "qwen2", "qwen3", "mixtral", "gemma", "yi", "internlm2"}
_GPT2_LIKE = {"gpt2"}
_NEOX_LIKE = {"gpt_neox"}


def _get(cfg: Mapping[str, Any], source: str, *keys: str, default: Any = ...) -> Any:
    for k in keys:
        if k in cfg and cfg[k] is not None:
            return cfg[k]
    if default is ...:
        raise ConfigError(f"Hugging Face config {source!r} lacks {' / '.join(keys)} "
                          f"(model_type={cfg.get('model_type')!r})")
    return default


def spec_kwargs_from_hf(cfg: Mapping[str, Any], source: str = "<dict>") -> dict[str, Any]:
    """ModelSpec fields from a config dict; raises ConfigError naming a missing key."""
    mtype = str(cfg.get("model_type", "")).lower()
    if mtype in _GPT2_LIKE or "n_embd" in cfg:
        hidden = _get(cfg, source, "n_embd", "hidden_size")
        return dict(
            num_layers=_get(cfg, source, "n_layer", "num_hidden_layers"),
            hidden_size=hidden,
            num_heads=_get(cfg, source, "n_head", "num_attention_heads"),
            ffn_hidden_size=_get(cfg, source, "n_inner", default=None) or 4 * hidden,
            vocab_size=_get(cfg, source, "vocab_size"),
            max_seq_len=_get(cfg, source, "n_positions", "n_ctx", default=1024),
            activation="gelu", norm="layernorm", position_embedding="learned",
            tied_embeddings=bool(cfg.get("tie_word_embeddings", True)), bias=True,
            dropout=float(cfg.get("resid_pdrop", 0.0) or 0.0) > 0)
    if mtype in _NEOX_LIKE:
        hidden = _get(cfg, source, "hidden_size")
        return dict(
            num_layers=_get(cfg, source, "num_hidden_layers"),
            hidden_size=hidden,
            num_heads=_get(cfg, source, "num_attention_heads"),
            ffn_hidden_size=_get(cfg, source, "intermediate_size", default=4 * hidden),
            vocab_size=_get(cfg, source, "vocab_size"),
            max_seq_len=_get(cfg, source, "max_position_embeddings", default=2048),
            activation="gelu", norm="layernorm", position_embedding="rope",
            tied_embeddings=bool(cfg.get("tie_word_embeddings", False)), bias=True,
            dropout=float(cfg.get("hidden_dropout", 0.0) or 0.0) > 0)
    if mtype in _LLAMA_LIKE or "intermediate_size" in cfg:
        heads = _get(cfg, source, "num_attention_heads")
        hidden = _get(cfg, source, "hidden_size")
        head_dim = cfg.get("head_dim")
        return dict(
            num_layers=_get(cfg, source, "num_hidden_layers"),
            hidden_size=hidden,
            num_heads=heads,
            num_kv_heads=_get(cfg, source, "num_key_value_heads", default=heads),
            ffn_hidden_size=_get(cfg, source, "intermediate_size"),
            head_dim=head_dim if head_dim else None,
            vocab_size=_get(cfg, source, "vocab_size"),
            max_seq_len=_get(cfg, source, "max_position_embeddings", default=4096),
            activation="swiglu", norm="rmsnorm", position_embedding="rope",
            tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            bias=bool(cfg.get("attention_bias", False)), dropout=False)
    raise ConfigError(
        f"Hugging Face config {source!r}: model_type {cfg.get('model_type')!r} is not "
        f"understood; supported: llama, mistral, qwen2, gpt2, gpt_neox (or a config with "
        f"hidden_size / num_hidden_layers / num_attention_heads / intermediate_size)")
