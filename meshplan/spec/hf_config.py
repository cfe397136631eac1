"""Translate a Hugging Face ``config.json`` into ModelSpec keyword arguments.

Families and the keys read (a missing key takes the default of the family's Hugging Face
``*Config`` class where that class documents one, else it is an error naming the key):

* GPT-2 (``GPT2Config``): ``n_layer``, ``n_embd``, ``n_head``, ``n_inner`` (None = 4h),
  ``n_positions`` (1024), ``tie_word_embeddings`` (True); dropout when any of
  ``resid_pdrop``, ``embd_pdrop``, ``attn_pdrop`` is above 0 (each defaults to 0.1).
* GPT-NeoX: ``hidden_dropout`` (0.0); ``rotary_pct`` and ``use_parallel_residual`` do not
  change the cost and are ignored.
* Non-gated RoPE decoders: Phi-1 / 1.5 / 2 (``phi``: GELU MLP, LayerNorm, biases, untied;
  its parallel attention/MLP block and partial rotary change no cost; dropout from
  ``resid_pdrop`` / ``embd_pdrop`` / ``attention_dropout``, each 0.0) and StarCoder2
  (``starcoder2``: GELU MLP, LayerNorm, ``use_bias`` (True), grouped-query attention,
  ``sliding_window`` on every layer, tied by PretrainedConfig's default; dropout from
  ``residual_dropout`` / ``embedding_dropout`` / ``attention_dropout``, each 0.0).
* Llama-like dense models (llama, mistral, qwen2, qwen3, gemma, gemma2, gemma3_text, phi3,
  olmo2, yi, internlm2, and with LayerNorm olmo, cohere, stablelm; granite, whose scalar
  multipliers change no cost; any other config with ``intermediate_size`` and no expert or
  latent-attention keys is read the same way with a :class:`MeshplanWarning`, since a
  non-gated MLP would count 1.5 times its parameters). Gemma's gated GELU (GeGLU) is read
  as ``swiglu``: the same three matrices and FLOPs. ``tie_word_embeddings`` defaults per
  family (Gemma's True, the others' False; an unlisted family's PretrainedConfig default
  True, the only value ``save_pretrained`` omits).
* Mixture of experts: Mixtral (``num_local_experts``), Qwen2-MoE / Qwen3-MoE
  (``num_experts``, ``moe_intermediate_size``, ``shared_expert_intermediate_size``,
  ``decoder_sparse_step``, ``mlp_only_layers``), DeepSeek V1/V2/V3 (``n_routed_experts``,
  ``n_shared_experts``, ``first_k_dense_replace``, ``moe_layer_freq``, ``scoring_func``,
  ``num_nextn_predict_layers`` and multi-head latent attention's ``q_lora_rank``,
  ``kv_lora_rank``, ``qk_nope_head_dim``, ``qk_rope_head_dim``, ``v_head_dim``; Kimi K2's
  ``kimi_k2`` is DeepSeek-V3's architecture under its own name), GLM-4.5
  (``glm4_moe``: DeepSeek-V3's experts, a sigmoid router, grouped-query attention), OLMoE
  and gpt-oss. Routing details that change no shape or cost (DeepSeek's group-limited
  routing and ``routed_scaling_factor``, gpt-oss's ``swiglu_limit``) are not read.

Approximations, each below 0.001 % of the parameters: Qwen3's and OLMoE's query/key
RMSNorms, Qwen2-MoE's shared-expert gate and gpt-oss's attention sinks are not counted;
Qwen2's query/key/value biases are read as no bias.

Sliding-window attention (``sliding_window``, ``window_layers``): from ``layer_types`` where a
config lists it, else by the family's rule as transformers applies it — Mistral, Mixtral and
Phi-3 on every layer, Gemma 2 and gpt-oss on the even layers, Gemma 3 on all but every
``sliding_window_pattern``-th, Qwen2/Qwen3 (and MoE) only with ``use_sliding_window`` and from
``max_window_layers`` on. A window in any other family, or a layer type other than sliding or
full attention (linear, chunked), is an error rather than full attention.

A config that declares experts or latent attention in a family not listed raises
:class:`ConfigError` rather than being read as a dense model.
"""

from __future__ import annotations

import warnings
from typing import Any, Mapping

from meshplan.errors import ConfigError, MeshplanWarning

_LLAMA_LIKE = {"llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3",
               "olmo2", "yi", "internlm2", "olmo", "granite", "cohere", "stablelm"}
# gated-MLP families whose blocks normalise with LayerNorm (OLMo's non-parametric, Cohere's
# without bias: counted as LayerNorm, under 0.001 % of the parameters apart)
_LAYERNORM_FAMILIES = {"olmo", "cohere", "stablelm"}
# tie_word_embeddings where a config omits it: the family's *Config default; any other family
# PretrainedConfig's True (save_pretrained leaves the key out only when it equals that default
# and the class's own, so an omitted key in a saved config of an unlisted family means True)
_TIE_DEFAULT = {"llama": False, "mistral": False, "qwen2": False, "qwen3": False, "gemma": True,
                "gemma2": True, "gemma3_text": True, "phi3": False, "olmo2": False, "yi": False,
                "internlm2": False, "olmo": False, "granite": False, "cohere": True,
                "stablelm": False, "mixtral": False, "qwen2_moe": False, "qwen3_moe": False,
                "olmoe": False, "gpt_oss": False, "deepseek": False, "deepseek_v2": False,
                "deepseek_v3": False, "kimi_k2": False, "glm4_moe": False}
_MAX_POSITIONS_DEFAULT = {"llama": 2048, "mistral": 131072, "qwen2": 32768, "qwen3": 32768,
                          "gemma": 8192, "gemma2": 8192, "gemma3_text": 131072, "phi3": 4096,
                          "olmo": 2048, "granite": 2048, "cohere": 8192, "stablelm": 4096,
                          "phi": 2048, "starcoder2": 4096}


def _qwen_slides(i: int, cfg: Mapping[str, Any]) -> bool:
    """Qwen2/Qwen3 (and their MoE): from ``max_window_layers`` on, and only with
    ``use_sliding_window``."""
    return bool(cfg.get("use_sliding_window", False)) and i >= (
        cfg.get("max_window_layers") if cfg.get("max_window_layers") is not None else 28)


# Sliding-window attention where a config has no ``layer_types``: the family's
# ``sliding_window`` default and which layers use it (transformers' *Config / modeling code:
# Mistral, Mixtral and Phi-3 every layer; Gemma 2 the even layers; Gemma 3 all but every
# ``sliding_window_pattern``-th (6); gpt-oss the even layers; Qwen as _qwen_slides)
_WINDOW_RULES = {
    "mistral": (4096, lambda i, cfg: True),
    "mixtral": (None, lambda i, cfg: True),
    "phi3": (None, lambda i, cfg: True),
    "qwen2": (4096, _qwen_slides), "qwen3": (4096, _qwen_slides),
    "qwen2_moe": (4096, _qwen_slides), "qwen3_moe": (4096, _qwen_slides),
    "gemma2": (4096, lambda i, cfg: i % 2 == 0),
    "gemma3_text": (4096, lambda i, cfg: (i + 1) % (cfg.get("sliding_window_pattern") or 6) != 0),
    "gpt_oss": (128, lambda i, cfg: i % 2 == 0),
    "starcoder2": (None, lambda i, cfg: True),
}
_GPT2_LIKE = {"gpt2"}
_NEOX_LIKE = {"gpt_neox"}
# non-gated MLPs with RoPE (read by _rope_gelu): PhiConfig, Starcoder2Config
_ROPE_GELU = {"phi": dict(tied=False, bias_key=None, drops=("resid_pdrop", "embd_pdrop",
                                                             "attention_dropout")),
              "starcoder2": dict(tied=True, bias_key="use_bias",
                                 drops=("residual_dropout", "embedding_dropout",
                                        "attention_dropout"))}
_MOE_FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek", "deepseek_v2", "deepseek_v3",
                 "kimi_k2", "glm4_moe", "olmoe", "gpt_oss")
# keys that declare experts or latent attention: their presence in a config we would read as
# dense means we would read it wrong
_MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts",
             "num_experts_per_tok", "moe_intermediate_size", "kv_lora_rank")
_GPT2_DROPOUT_DEFAULT = 0.1       # GPT2Config: resid_pdrop = embd_pdrop = attn_pdrop = 0.1


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
        return _gpt2(cfg, source)
    if mtype in _NEOX_LIKE:
        return _neox(cfg, source)
    if mtype in _ROPE_GELU:
        return _rope_gelu(cfg, source, mtype)
    if mtype in _MOE_FAMILIES:
        return _MOE_READERS[mtype](cfg, source)
    declared = [k for k in _MOE_KEYS if cfg.get(k)]
    if declared:
        raise ConfigError(
            f"Hugging Face config {source!r}: model_type {cfg.get('model_type')!r} declares "
            f"{', '.join(declared)} (mixture of experts or latent attention), which meshplan "
            f"cannot read for this family; supported MoE families: {', '.join(_MOE_FAMILIES)}. "
            f"Describe the model with ModelSpec(num_experts=..., ...) instead")
    if mtype in _LLAMA_LIKE:
        return _llama(cfg, source)
    if "intermediate_size" in cfg:
        warnings.warn(
            f"Hugging Face config {source!r}: model_type {cfg.get('model_type')!r} is not a "
            f"family meshplan knows; read as a Llama-like decoder (gated MLP of "
            f"intermediate_size, RMSNorm, RoPE). If its MLP is not gated (Falcon, StableLM-style) "
            f"its MLP parameters and FLOPs come out 1.5 times too high: describe it with "
            f"ModelSpec(..., activation='gelu') instead", MeshplanWarning, stacklevel=3)
        return _llama(cfg, source)
    hint = (" (a multimodal config: pass its 'text_config' dict)" if "text_config" in cfg
            else "")
    raise ConfigError(
        f"Hugging Face config {source!r}: model_type {cfg.get('model_type')!r} is not "
        f"understood{hint}; supported: "
        f"{', '.join(sorted(_LLAMA_LIKE | _GPT2_LIKE | _NEOX_LIKE | set(_ROPE_GELU)))}, "
        f"{', '.join(_MOE_FAMILIES)} (or a config with hidden_size / num_hidden_layers / "
        f"num_attention_heads / intermediate_size)")


def _gpt2(cfg, source):
    hidden = _get(cfg, source, "n_embd", "hidden_size")
    drops = [float(cfg.get(k) if cfg.get(k) is not None else _GPT2_DROPOUT_DEFAULT)
             for k in ("resid_pdrop", "embd_pdrop", "attn_pdrop")]
    return dict(
        num_layers=_get(cfg, source, "n_layer", "num_hidden_layers"),
        hidden_size=hidden,
        num_heads=_get(cfg, source, "n_head", "num_attention_heads"),
        ffn_hidden_size=_get(cfg, source, "n_inner", default=None) or 4 * hidden,
        vocab_size=_get(cfg, source, "vocab_size"),
        max_seq_len=_get(cfg, source, "n_positions", "n_ctx", default=1024),
        activation="gelu", norm="layernorm", position_embedding="learned",
        tied_embeddings=bool(cfg.get("tie_word_embeddings", True)), bias=True,
        dropout=max(drops) > 0)


def _neox(cfg, source):
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


def _llama(cfg, source, *, bias_default: bool = False):
    """Llama-like decoders (gated MLP: SwiGLU, or Gemma's GeGLU with the same three matrices
    and FLOPs), with the family's defaults and sliding-window layers."""
    family = str(cfg.get("model_type", "")).lower()
    head_dim = cfg.get("head_dim")
    shape = _decoder_shape(cfg, source, family)
    return dict(
        **shape,
        head_dim=head_dim if head_dim else None,
        activation="swiglu", position_embedding="rope",
        norm="layernorm" if family in _LAYERNORM_FAMILIES else "rmsnorm",
        tied_embeddings=bool(_get(cfg, source, "tie_word_embeddings",
                                  default=_TIE_DEFAULT.get(family, True))),
        bias=bool(cfg.get("attention_bias", bias_default)), dropout=False,
        **_windows(cfg, source, family, shape["num_layers"]))


def _decoder_shape(cfg, source, family: str) -> dict:
    """The keys every decoder family here names alike: layers, widths, heads, vocabulary,
    context (``num_key_value_heads`` defaults to the heads: multi-head attention; a missing
    ``max_position_embeddings`` the family's Hugging Face default)."""
    heads = _get(cfg, source, "num_attention_heads")
    return dict(
        num_layers=_get(cfg, source, "num_hidden_layers"),
        hidden_size=_get(cfg, source, "hidden_size"),
        num_heads=heads,
        num_kv_heads=_get(cfg, source, "num_key_value_heads", default=heads),
        ffn_hidden_size=_get(cfg, source, "intermediate_size"),
        vocab_size=_get(cfg, source, "vocab_size"),
        max_seq_len=_get(cfg, source, "max_position_embeddings",
                         default=_MAX_POSITIONS_DEFAULT.get(family, 4096)))


def _windows(cfg, source, family: str, layers: int) -> dict:
    """``sliding_window`` / ``window_layers`` from ``layer_types`` where the config lists them,
    else from the family's rule (:data:`_WINDOW_RULES`); a window in a family whose rule is
    not known, or a layer type other than sliding or full attention, is an error."""
    default, rule = _WINDOW_RULES.get(family, (None, None))
    window = cfg["sliding_window"] if "sliding_window" in cfg else default
    types = cfg.get("layer_types")
    if types is not None:
        if (isinstance(types, (str, bytes)) or len(types) != layers
                or any(t not in ("sliding_attention", "full_attention") for t in types)):
            raise ConfigError(f"Hugging Face config {source!r}: layer_types must list "
                              f"'sliding_attention' or 'full_attention' for each of the "
                              f"{layers} layers (other attention kinds are not modelled), got "
                              f"{types!r}")
        slide = [i for i, t in enumerate(types) if t == "sliding_attention"]
    elif window is None:
        return {}
    elif rule is None:
        raise ConfigError(f"Hugging Face config {source!r}: sliding_window = {window!r}, but "
                          f"which layers of model_type {cfg.get('model_type')!r} use it is not "
                          f"known; add layer_types, or describe the model with "
                          f"ModelSpec(sliding_window=..., window_layers=...)")
    else:
        slide = [i for i in range(layers) if rule(i, cfg)]
    if not slide or window is None:     # null window: transformers' masks are plain causal
        return {}
    window = _positive(cfg, source, "sliding_window", window)
    return dict(sliding_window=window,
                window_layers=None if len(slide) == layers else tuple(slide))


def _positive(cfg, source, key, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"Hugging Face config {source!r}: {key} = {value!r} must be a "
                          f"positive integer (model_type={cfg.get('model_type')!r})")
    return value


def _experts(cfg, source, experts_key: str, *, aux_key: str = "router_aux_loss_coef",
             aux_default: float = 0.001, norm_default: bool) -> dict:
    """The routed-expert fields most MoE configs share."""
    return dict(
        num_experts=_positive(cfg, source, experts_key, _get(cfg, source, experts_key)),
        experts_per_token=_positive(cfg, source, "num_experts_per_tok",
                                    _get(cfg, source, "num_experts_per_tok", "experts_per_token")),
        router_norm_topk=bool(cfg.get("norm_topk_prob", norm_default)),
        router_aux_loss_coeff=float(_get(cfg, source, aux_key, default=aux_default)))


def _mixtral(cfg, source):
    """Every layer MoE; ``intermediate_size`` is each expert's width (MixtralConfig)."""
    return {**_llama(cfg, source), **_experts(cfg, source, "num_local_experts",
                                              norm_default=True)}


def _olmoe(cfg, source):
    """Every layer MoE; ``intermediate_size`` is each expert's width (OlmoeConfig)."""
    return {**_llama(cfg, source), **_experts(cfg, source, "num_experts", aux_default=0.01,
                                              norm_default=False)}


def _gpt_oss(cfg, source):
    """Every layer MoE with biased experts and router; GptOssConfig's attention_bias is True;
    ``sliding_window`` (128 by default) on the layers ``layer_types`` marks
    "sliding_attention" (by default the even ones: transformers' GptOssConfig)."""
    return {**_llama(cfg, source, bias_default=True),
            **_experts(cfg, source, "num_local_experts", aux_default=0.9, norm_default=True)}


def _qwen_moe(cfg, source):
    """Qwen2-MoE / Qwen3-MoE: layer i is MoE unless listed in ``mlp_only_layers`` or
    (i + 1) is not a multiple of ``decoder_sparse_step`` (Qwen2MoeDecoderLayer)."""
    layers = _get(cfg, source, "num_hidden_layers")
    step = _positive(cfg, source, "decoder_sparse_step", cfg.get("decoder_sparse_step") or 1)
    only_mlp = set(cfg.get("mlp_only_layers") or ())
    dense = tuple(i for i in range(layers) if i in only_mlp or (i + 1) % step)
    shared = cfg.get("shared_expert_intermediate_size") or 0
    return {**_llama(cfg, source),
            **_experts(cfg, source, "num_experts", norm_default=False),
            "moe_ffn_hidden_size": _get(cfg, source, "moe_intermediate_size"),
            "num_shared_experts": 1 if shared else 0,
            "shared_expert_ffn_hidden_size": shared or None, "dense_layers": dense}


def _rope_gelu(cfg, source, family: str):
    """Phi-1/1.5/2 and StarCoder2: a non-gated GELU MLP of ``intermediate_size``, LayerNorm
    and RoPE (module docstring for the keys and defaults)."""
    how = _ROPE_GELU[family]
    drops = [float(cfg.get(k) or 0.0) for k in how["drops"]]
    shape = _decoder_shape(cfg, source, family)
    return dict(
        **shape,
        activation="gelu", norm="layernorm", position_embedding="rope",
        tied_embeddings=bool(_get(cfg, source, "tie_word_embeddings", default=how["tied"])),
        bias=bool(cfg.get(how["bias_key"], True)) if how["bias_key"] else True,
        dropout=max(drops) > 0, **_windows(cfg, source, family, shape["num_layers"]))


def _deepseek_experts(cfg, source, *, router_default: str) -> dict:
    """DeepSeek-style experts: layer i is MoE when i >= ``first_k_dense_replace`` and
    i % ``moe_layer_freq`` == 0 (DeepseekV2DecoderLayer), shared experts, multi-token
    prediction modules."""
    kw = _llama(cfg, source)
    layers = kw["num_layers"]
    first = cfg.get("first_k_dense_replace") or 0
    freq = _positive(cfg, source, "moe_layer_freq", cfg.get("moe_layer_freq") or 1)
    shared = cfg.get("n_shared_experts") or 0
    kw.update(_experts(cfg, source, "n_routed_experts", aux_key="aux_loss_alpha",
                       norm_default=False),
              moe_ffn_hidden_size=_get(cfg, source, "moe_intermediate_size"),
              num_shared_experts=shared,
              dense_layers=tuple(i for i in range(layers) if i < first or i % freq),
              router=_get(cfg, source, "scoring_func", default=router_default),
              mtp_layers=cfg.get("num_nextn_predict_layers") or 0)
    return kw


def _glm4_moe(cfg, source):
    """GLM-4.5 / GLM-4.5-Air (Glm4MoeConfig): DeepSeek-V3's experts (first
    ``first_k_dense_replace`` layers dense, shared experts, sigmoid router with a score
    correction bias, multi-token prediction) with grouped-query attention (``head_dim``,
    q/k/v biases; its q/k norms and partial rotary change no cost)."""
    return _deepseek_experts(cfg, source, router_default="sigmoid")


def _deepseek(cfg, source):
    """DeepSeek V1/V2/V3 (:func:`_deepseek_experts`); V2/V3 attention is latent."""
    kw = _deepseek_experts(cfg, source, router_default="softmax")
    if cfg.get("kv_lora_rank"):
        kw.update(q_lora_rank=cfg.get("q_lora_rank") or None,
                  kv_lora_rank=cfg["kv_lora_rank"],
                  qk_nope_head_dim=_get(cfg, source, "qk_nope_head_dim"),
                  qk_rope_head_dim=_get(cfg, source, "qk_rope_head_dim"),
                  v_head_dim=_get(cfg, source, "v_head_dim"), head_dim=None,
                  num_kv_heads=kw["num_heads"])
    elif str(cfg.get("model_type")) != "deepseek":
        raise ConfigError(f"Hugging Face config {source!r}: model_type "
                          f"{cfg.get('model_type')!r} without kv_lora_rank; DeepSeek-V2/V3 "
                          f"use multi-head latent attention and need its dimensions")
    return kw


_MOE_READERS = {"mixtral": _mixtral, "qwen2_moe": _qwen_moe, "qwen3_moe": _qwen_moe,
                "deepseek": _deepseek, "deepseek_v2": _deepseek, "deepseek_v3": _deepseek,
                "glm4_moe": _glm4_moe, "kimi_k2": _deepseek,
                "olmoe": _olmoe, "gpt_oss": _gpt_oss}
