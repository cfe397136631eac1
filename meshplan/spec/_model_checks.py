"""Checks of ModelSpec's mixture-of-experts and latent-attention fields.

Each function reads a half-built spec and returns the normalised values to store (None
counts become 0, defaults are filled in, lists become tuples); it raises
:class:`ConfigError` naming the offending field and what would be valid.
"""

from __future__ import annotations

from typing import Any

from meshplan.errors import ConfigError, require_bool, require_choice, require_positive_int
from meshplan.spec.choices import ROUTERS


def _count(name: str, value: object) -> int:
    """A non-negative integer count; None means 0."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"ModelSpec.{name} must be a non-negative integer, got {value!r}")
    return value


def _layer_indices(name: str, value: object, num_layers: int) -> tuple[int, ...]:
    """A list of distinct layer indices, sorted."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise ConfigError(f"ModelSpec.{name} must be a list of layer indices, got {value!r}")
    layers = tuple(value)
    for i in layers:
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < num_layers:
            raise ConfigError(f"ModelSpec.{name} contains {i!r}; layer indices run "
                              f"0 .. {num_layers - 1}")
    if len(set(layers)) != len(layers):
        raise ConfigError(f"ModelSpec.{name} {list(layers)} lists a layer twice")
    return tuple(sorted(layers))


def _number(name: str, value: object, *, positive: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 \
            or (positive and value == 0):
        bound = "> 0" if positive else ">= 0"
        raise ConfigError(f"ModelSpec.{name} must be a number {bound}, got {value!r}")
    return float(value)


def check_moe_fields(spec) -> dict[str, Any]:
    """Validate the MoE fields; a dense spec (num_experts 0) must leave the others unset."""
    out: dict[str, Any] = {"num_experts": _count("num_experts", spec.num_experts),
                           "experts_per_token": _count("experts_per_token", spec.experts_per_token),
                           "num_shared_experts": _count("num_shared_experts",
                                                        spec.num_shared_experts),
                           "mtp_layers": _count("mtp_layers", spec.mtp_layers)}
    require_choice("ModelSpec", "router", spec.router, ROUTERS)
    require_bool("ModelSpec", "router_norm_topk", spec.router_norm_topk)
    out["router_aux_loss_coeff"] = _number("router_aux_loss_coeff", spec.router_aux_loss_coeff,
                                           positive=False)
    dense = _layer_indices("dense_layers", spec.dense_layers, spec.num_layers)
    out["dense_layers"] = dense
    for f in ("moe_ffn_hidden_size", "shared_expert_ffn_hidden_size"):
        if getattr(spec, f) is not None:
            require_positive_int("ModelSpec", f, getattr(spec, f))
    if spec.capacity_factor is not None:
        out["capacity_factor"] = _number("capacity_factor", spec.capacity_factor, positive=True)
    if out["num_experts"] == 0:
        stray = {f: getattr(spec, f) for f in ("experts_per_token", "num_shared_experts",
                                               "moe_ffn_hidden_size", "capacity_factor",
                                               "shared_expert_ffn_hidden_size")
                 if getattr(spec, f) not in (None, 0)}
        if dense:
            stray["dense_layers"] = list(dense)
        if stray:
            given = ", ".join(f"{k} = {v!r}" for k, v in stray.items())
            raise ConfigError(f"ModelSpec: {given} describe a mixture-of-experts model but "
                              f"num_experts = 0 (dense); set num_experts > 0 or drop them")
        return out
    k, e = out["experts_per_token"], out["num_experts"]
    if not 1 <= k <= e:
        raise ConfigError(f"ModelSpec.experts_per_token = {k} must be between 1 and "
                          f"num_experts = {e}")
    if len(dense) == spec.num_layers:
        raise ConfigError(f"ModelSpec.dense_layers lists all {spec.num_layers} layers; an MoE "
                          f"model needs at least one MoE layer (or set num_experts = 0)")
    moe_ffn = spec.moe_ffn_hidden_size or spec.ffn_hidden_size
    out["moe_ffn_hidden_size"] = moe_ffn
    out["shared_expert_ffn_hidden_size"] = (spec.shared_expert_ffn_hidden_size or moe_ffn
                                            if out["num_shared_experts"] else None)
    return out


_MLA_DIMS = ("q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


def check_mla_fields(spec) -> dict[str, Any]:
    """Validate multi-head latent attention's dimensions; sets head_dim = d_nope + d_rope."""
    for f in _MLA_DIMS + ("kv_lora_rank",):
        if getattr(spec, f) is not None:
            require_positive_int("ModelSpec", f, getattr(spec, f))
    if spec.kv_lora_rank is None:
        given = [f for f in _MLA_DIMS if getattr(spec, f) is not None]
        if given:
            raise ConfigError(f"ModelSpec: {', '.join(given)} are multi-head latent attention "
                              f"dimensions; they need kv_lora_rank (DeepSeek-V2 §2.1)")
        return {}
    missing = [f for f in _MLA_DIMS[1:] if getattr(spec, f) is None]
    if missing:
        raise ConfigError(f"ModelSpec.kv_lora_rank = {spec.kv_lora_rank} (multi-head latent "
                          f"attention) needs {', '.join(missing)}")
    kv = spec.num_kv_heads if spec.num_kv_heads is not None else spec.num_heads
    if kv != spec.num_heads:
        raise ConfigError(f"ModelSpec.num_kv_heads = {kv}: multi-head latent attention gives "
                          f"every one of the {spec.num_heads} heads its own key and value")
    if spec.bias:
        raise ConfigError("ModelSpec.bias = True with multi-head latent attention is not "
                          "supported (no released MLA model has projection biases)")
    qk = spec.qk_nope_head_dim + spec.qk_rope_head_dim
    if spec.head_dim is not None and spec.head_dim != qk:
        raise ConfigError(f"ModelSpec.head_dim = {spec.head_dim} must equal qk_nope_head_dim + "
                          f"qk_rope_head_dim = {qk} with multi-head latent attention")
    return {"num_kv_heads": spec.num_heads, "head_dim": qk}


def check_window_fields(spec) -> dict[str, Any]:
    """Validate sliding-window attention: ``sliding_window`` a positive number of keys (or
    None: every layer attends to all earlier tokens), ``window_layers`` the layers that use
    it (None: every layer, Mistral 7B's layout; a list: gpt-oss's alternate layers)."""
    if spec.sliding_window is None:
        if spec.window_layers is not None:
            raise ConfigError(f"ModelSpec.window_layers = {spec.window_layers!r} needs "
                              f"sliding_window (the window's length in tokens)")
        return {}
    require_positive_int("ModelSpec", "sliding_window", spec.sliding_window)
    if spec.window_layers is None:
        return {}
    return {"window_layers": _layer_indices("window_layers", spec.window_layers,
                                            spec.num_layers)}
