"""What is trained: :class:`ModelSpec`, a decoder-only transformer's shape.

A frozen, keyword-only dataclass that validates itself on construction and raises
:class:`meshplan.errors.ConfigError` naming the bad value.

Mixture-of-experts layers (``num_experts > 0``) replace a layer's MLP by ``num_experts``
routed experts of width ``moe_ffn_hidden_size``, of which each token uses
``experts_per_token`` (Shazeer et al. 2017, arXiv 1701.06538; GShard, Lepikhin et al. 2020,
arXiv 2006.16668; Switch, Fedus et al. 2021, arXiv 2101.03961), plus ``num_shared_experts``
experts every token uses (DeepSeekMoE, Dai et al. 2024, arXiv 2401.06066 §3.2). Multi-head
latent attention (``kv_lora_rank`` set) is DeepSeek-V2's (arXiv 2405.04434 §2.1); the
multi-token-prediction modules (``mtp_layers``) are DeepSeek-V3's (arXiv 2412.19437 §2.2).
Field checks live in :mod:`meshplan.spec._model_checks`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Mapping

from meshplan.errors import (ConfigError, require_bool, require_choice, require_positive_int,
                             unknown_name_error)
from meshplan.spec._dicts import from_dict
from meshplan.spec._model_checks import check_mla_fields, check_moe_fields, check_window_fields
from meshplan.spec.choices import ACTIVATIONS, NORMS, POSITIONS


_MOE_MLA_FIELDS = frozenset((
    "num_experts", "experts_per_token", "moe_ffn_hidden_size", "num_shared_experts",
    "shared_expert_ffn_hidden_size", "dense_layers", "router", "router_norm_topk",
    "capacity_factor", "router_aux_loss_coeff", "mtp_layers", "q_lora_rank", "kv_lora_rank",
    "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "sliding_window", "window_layers"))


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A decoder-only transformer's shape.

    GPT-style: ``activation="gelu", norm="layernorm", tied_embeddings=True,
    position_embedding="learned", bias=True``; Llama-style: ``"swiglu", "rmsnorm", False,
    "rope", False`` with ``num_kv_heads < num_heads`` for grouped-query attention.

    >>> m = ModelSpec.preset("llama3-8b")
    >>> round(m.num_params() / 1e9, 2)
    8.03
    >>> moe = ModelSpec.preset("mixtral-8x7b")
    >>> round(moe.num_params() / 1e9, 1), round(moe.num_active_params() / 1e9, 1)
    (46.7, 12.9)

    ``num_experts = 0`` (the default) is a dense model; then every MoE field keeps its
    default. ``dense_layers`` lists the layers of an MoE model that keep a dense MLP of
    width ``ffn_hidden_size`` (DeepSeek-V3's first three). ``capacity_factor = None`` is
    dropless routing; otherwise each expert takes at most
    ``ceil(capacity_factor · tokens · experts_per_token / num_experts)`` tokens of a sequence
    (GShard §2.2, Switch eq. 3 with the sequence as the group).
    """

    name: str = "custom"
    num_layers: int
    hidden_size: int
    num_heads: int
    vocab_size: int
    num_kv_heads: int | None = None      # None = num_heads (multi-head attention)
    ffn_hidden_size: int | None = None   # None = 4 * hidden_size
    head_dim: int | None = None          # None = hidden_size // num_heads
    max_seq_len: int = 2048
    activation: str = "gelu"
    norm: str = "layernorm"
    position_embedding: str = "learned"
    tied_embeddings: bool = True
    bias: bool = True
    dropout: bool = False                # dropout masks cost activation memory (Korthikanti 2022)
    # ---- mixture of experts ------------------------------------------------------------
    num_experts: int = 0                 # routed experts per MoE layer; 0 (or None) = dense
    experts_per_token: int = 0           # top-k routed experts per token
    moe_ffn_hidden_size: int | None = None            # per routed expert; None = ffn_hidden_size
    num_shared_experts: int = 0          # experts every token passes through
    shared_expert_ffn_hidden_size: int | None = None  # per shared expert; None = moe_ffn_hidden_size
    dense_layers: tuple[int, ...] = ()   # indices of the layers that keep a dense MLP
    router: str = "softmax"              # "softmax" (Switch, Mixtral) or "sigmoid" (DeepSeek-V3)
    router_norm_topk: bool = True        # rescale the k gate values to sum to 1
    capacity_factor: float | None = None  # None = dropless
    router_aux_loss_coeff: float = 0.01  # load-balancing loss weight α (Switch eq. 4)
    mtp_layers: int = 0                  # multi-token-prediction modules (DeepSeek-V3)
    # ---- multi-head latent attention (DeepSeek-V2); kv_lora_rank None = standard attention
    q_lora_rank: int | None = None       # None = queries not compressed (DeepSeek-V2-Lite)
    kv_lora_rank: int | None = None
    qk_nope_head_dim: int | None = None
    qk_rope_head_dim: int | None = None
    v_head_dim: int | None = None
    # sliding-window attention (Mistral 7B, arXiv 2310.06825 §2; gpt-oss: 128 tokens on
    # alternate layers): each query of a windowed layer attends to itself and the
    # sliding_window - 1 tokens before it; window_layers None = every layer
    sliding_window: int | None = None
    window_layers: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        for f in ("num_layers", "hidden_size", "num_heads", "vocab_size", "max_seq_len"):
            require_positive_int("ModelSpec", f, getattr(self, f))
        for f in ("num_kv_heads", "ffn_hidden_size", "head_dim"):
            if getattr(self, f) is not None:
                require_positive_int("ModelSpec", f, getattr(self, f))
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"ModelSpec.name must be a non-empty string, got {self.name!r}")
        for f in ("tied_embeddings", "bias", "dropout"):
            require_bool("ModelSpec", f, getattr(self, f))
        require_choice("ModelSpec", "activation", self.activation, ACTIVATIONS)
        require_choice("ModelSpec", "norm", self.norm, NORMS)
        require_choice("ModelSpec", "position_embedding", self.position_embedding, POSITIONS)
        if self.num_kv_heads is None:
            object.__setattr__(self, "num_kv_heads", self.num_heads)
        if self.ffn_hidden_size is None:
            object.__setattr__(self, "ffn_hidden_size", 4 * self.hidden_size)
        for name, value in check_moe_fields(self).items():
            object.__setattr__(self, name, value)
        for name, value in check_mla_fields(self).items():
            object.__setattr__(self, name, value)
        for name, value in check_window_fields(self).items():
            object.__setattr__(self, name, value)
        if self.head_dim is None:
            if self.hidden_size % self.num_heads:
                raise ConfigError(
                    f"ModelSpec.hidden_size = {self.hidden_size} is not divisible by "
                    f"num_heads = {self.num_heads}; give head_dim explicitly")
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"ModelSpec.num_heads = {self.num_heads} is not a multiple of "
                f"num_kv_heads = {self.num_kv_heads}")

    def __hash__(self) -> int:  # cached: specs key the cost model's caches
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash(tuple(getattr(self, f.name) for f in fields(self)))
            object.__setattr__(self, "_hash", h)
        return h

    # ---- derived sizes -------------------------------------------------------------
    @property
    def q_dim(self) -> int:
        """Width of the query projection (= hidden_size for standard models)."""
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of each of the key and value projections (smaller than q_dim with GQA)."""
        return self.num_kv_heads * self.head_dim

    @property
    def value_head_dim(self) -> int:
        """A head's value (and attention output) width: ``head_dim``, or MLA's d_v."""
        return self.v_head_dim if self.is_mla else self.head_dim

    @property
    def v_dim(self) -> int:
        """Width of the values the attention core reads: ``kv_dim``, or MLA's n_h·d_v (its
        keys, ``kv_dim``, are d_n + d_r wide a head)."""
        return self.num_kv_heads * self.value_head_dim

    @property
    def attn_out_dim(self) -> int:
        """Width of the attention core's output: ``q_dim``, or MLA's n_h·d_v."""
        return self.num_heads * self.value_head_dim

    @property
    def ffn_matrices(self) -> int:
        """Weight matrices of width ffn_hidden_size entering the MLP (2 for SwiGLU: gate, up)."""
        return 2 if self.activation == "swiglu" else 1

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        """Multi-head latent attention (DeepSeek-V2 §2.1)."""
        return self.kv_lora_rank is not None

    def is_moe_layer(self, layer: int) -> bool:
        return self.is_moe and layer not in self.dense_layers

    def attention_window(self, layer: int) -> int | None:
        """The keys a query of layer ``layer`` may attend to (None: all earlier tokens)."""
        if self.sliding_window is None:
            return None
        if self.window_layers is None or layer in self.window_layers:
            return self.sliding_window
        return None

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - len(self.dense_layers) if self.is_moe else 0

    def attention_matmul_params(self) -> int:
        """Weights of one layer's attention projections.

        Standard / grouped-query: W_Q, W_K, W_V, W_O. Multi-head latent attention
        (DeepSeek-V2, arXiv 2405.04434, eqs. 9-19): queries W_DQ (h × r_q) then W_UQ
        (r_q × n_h·(d_nope + d_rope)), or one h × n_h·(d_nope + d_rope) matrix without
        ``q_lora_rank``; keys and values W_DKV with the shared rope key W_KR
        (h × (r_kv + d_rope)) then W_UK, W_UV (r_kv × n_h·(d_nope + d_v)); W_O (n_h·d_v × h).
        """
        h = self.hidden_size
        if not self.is_mla:
            return h * (self.q_dim + 2 * self.kv_dim) + self.q_dim * h
        nh, dr, dv = self.num_heads, self.qk_rope_head_dim, self.v_head_dim
        q_out = nh * (self.qk_nope_head_dim + dr)
        q = h * q_out if self.q_lora_rank is None else (h + q_out) * self.q_lora_rank
        kv = h * (self.kv_lora_rank + dr) + self.kv_lora_rank * nh * (self.qk_nope_head_dim + dv)
        return q + kv + nh * dv * h

    def attention_params(self) -> int:
        """One layer's attention: projections, their biases, MLA's two latent RMSNorms."""
        n = self.attention_matmul_params()
        if self.bias:
            n += self.q_dim + 2 * self.kv_dim + self.hidden_size
        if self.is_mla:
            n += self.kv_lora_rank + (self.q_lora_rank or 0)
        return n

    def mlp_params(self, ffn_hidden_size: int) -> int:
        """One MLP (or expert) of width ``ffn_hidden_size``, biases included."""
        h, f = self.hidden_size, ffn_hidden_size
        n = (self.ffn_matrices + 1) * h * f
        return n + (self.ffn_matrices * f + h if self.bias else 0)

    def router_params(self) -> int:
        """The router's h × E gate (and bias): Switch (arXiv 2101.03961) eq. 1."""
        return self.num_experts * (self.hidden_size + (1 if self.bias else 0))

    def moe_mlp_params(self, *, active: bool = False) -> int:
        """An MoE layer's MLP part: router, routed experts (all, or the ``experts_per_token``
        a token uses when ``active``) and shared experts."""
        routed = self.experts_per_token if active else self.num_experts
        n = self.router_params() + routed * self.mlp_params(self.moe_ffn_hidden_size)
        if self.num_shared_experts:
            n += self.num_shared_experts * self.mlp_params(self.shared_expert_ffn_hidden_size)
        return n

    def _norm_vector_params(self) -> int:
        return self.hidden_size * (2 if self.norm == "layernorm" else 1)

    def _require_dense(self, what: str) -> None:
        if self.is_moe:
            raise ConfigError(f"ModelSpec.{what}() describes the layer of a dense model; "
                              f"{self.name!r} has {self.num_experts} experts: use "
                              f"layer_params(layer) or num_params()")

    def layer_matmul_params(self) -> int:
        """Weights of one (dense) layer's matrix multiplies (no biases, no norms)."""
        self._require_dense("layer_matmul_params")
        return (self.attention_matmul_params()
                + (self.ffn_matrices + 1) * self.hidden_size * self.ffn_hidden_size)

    def layer_params(self, layer: int | None = None, *, active: bool = False) -> int:
        """All parameters of transformer layer ``layer`` (of any layer of a dense model).

        GPT (Narayanan et al. 2021, arXiv 2104.04473, eq. 2): 12h² + 13h per layer —
        the 12h² matmul weights, 9h of biases (3h QKV, h out, 4h fc1, h fc2) and 4h of
        the two LayerNorms. Llama: no biases, two RMSNorm weight vectors. An MoE layer's
        MLP is :meth:`moe_mlp_params` (``active``: the parameters one token uses).
        """
        if layer is None:
            self._require_dense("layer_params")
        elif isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < self.num_layers:
            raise ConfigError(f"layer = {layer!r} is not a layer of {self.name!r} "
                              f"(0 .. {self.num_layers - 1})")
        n = self.attention_params() + 2 * self._norm_vector_params()
        if layer is not None and self.is_moe_layer(layer):
            return n + self.moe_mlp_params(active=active)
        return n + self.mlp_params(self.ffn_hidden_size)

    def mtp_module_params(self, *, active: bool = False) -> int:
        """One multi-token-prediction module (DeepSeek-V3, arXiv 2412.19437 §2.2, eq. 21-22):
        RMSNorms of the hidden state and of the next token's embedding, the 2h → h projection
        M_k, one transformer layer like the model's last, and the norm before the output
        head; the embedding and output head themselves are the main model's."""
        h = self.hidden_size
        return (3 * self._norm_vector_params() + 2 * h * h
                + self.layer_params(self.num_layers - 1, active=active))

    def embedding_params(self) -> int:
        """Input token embedding plus learned position embedding (if any)."""
        n = self.vocab_size * self.hidden_size
        if self.position_embedding == "learned":
            n += self.max_seq_len * self.hidden_size
        return n

    def head_params(self) -> int:
        """Output projection to the vocabulary (0 when tied to the input embedding)."""
        return 0 if self.tied_embeddings else self.vocab_size * self.hidden_size

    def final_norm_params(self) -> int:
        return self._norm_vector_params()

    def _layers_params(self, *, active: bool) -> int:
        n_moe = self.num_moe_layers
        n = (self.num_layers - n_moe) * (self.attention_params() + 2 * self._norm_vector_params()
                                        + self.mlp_params(self.ffn_hidden_size))
        if n_moe:
            first_moe = next(i for i in range(self.num_layers) if self.is_moe_layer(i))
            n += n_moe * self.layer_params(first_moe, active=active)
        return n

    def num_params(self, *, mtp: bool = True) -> int:
        """Total parameters (with ``mtp``, those of the multi-token-prediction modules too).

        For GPT this is Narayanan et al. 2021 eq. 2,
        P = 12·l·h²·(1 + 13/(12h) + (V + s)/(12·l·h)), plus the final LayerNorm (2h).
        """
        n = (self._layers_params(active=False) + self.embedding_params() + self.head_params()
             + self.final_norm_params())
        return n + (self.mtp_layers * self.mtp_module_params() if mtp else 0)

    def num_active_params(self, *, input_embedding: bool = True, mtp: bool = True) -> int:
        """Parameters one token's forward pass uses: everything but the routed experts it
        is not sent to (equals :meth:`num_params` for a dense model).

        Publishers differ on the embedding: Mistral (Mixtral's 12.9B of 46.7B) and Qwen
        count the input embedding matrix; OpenAI's gpt-oss model card counts the output
        head but not the input embedding (``input_embedding=False``, whose lookup does no
        arithmetic), which is also what makes DeepSeek's rounded 21B and 37B come out.
        """
        n = self._layers_params(active=True) + self.head_params() + self.final_norm_params()
        if input_embedding:
            n += self.embedding_params()
        elif self.tied_embeddings:
            n += self.vocab_size * self.hidden_size    # the tied matrix is the output head
        return n + (self.mtp_layers * self.mtp_module_params(active=True) if mtp else 0)

    # ---- construction --------------------------------------------------------------
    @classmethod
    def preset(cls, name: str) -> "ModelSpec":
        """A named model; ``meshplan profiles`` lists them."""
        from meshplan.spec.presets import MODEL_PRESETS
        if name not in MODEL_PRESETS:
            raise unknown_name_error("model preset", name, MODEL_PRESETS)
        return cls(name=name, **MODEL_PRESETS[name])

    @classmethod
    def preset_names(cls) -> list[str]:
        from meshplan.spec.presets import MODEL_PRESETS
        return list(MODEL_PRESETS)

    @classmethod
    def from_hf_config(cls, config: str | Path | Mapping[str, Any], *,
                       name: str | None = None) -> "ModelSpec":
        """Read a Hugging Face ``config.json`` (a path, a model directory holding one, or a
        dict).

        Understands the keys of Llama, Mistral, Qwen2 (``num_hidden_layers``,
        ``hidden_size``, ``num_attention_heads``, ``num_key_value_heads``,
        ``intermediate_size``, ``max_position_embeddings``, ``tie_word_embeddings``),
        GPT-2 (``n_layer``, ``n_embd``, ``n_head``, ``n_inner``, ``n_positions``) and
        GPT-NeoX (``rotary_pct``, ``use_parallel_residual`` are ignored for cost purposes).
        """
        from meshplan.spec.hf_config import spec_kwargs_from_hf
        source = "<dict>"
        if not isinstance(config, Mapping):
            config, source = _read_hf_config(config)
        kwargs = spec_kwargs_from_hf(config, source)
        return cls(name=name or str(config.get("_name_or_path") or config.get("model_type", "hf-model")),
                   **kwargs)

    def to_dict(self) -> dict[str, Any]:
        """The fields as plain data; the mixture-of-experts and latent-attention fields only
        where they differ from their defaults, so a dense model's dict (plan files,
        checkpoints, committed sets) is what it was before they existed."""
        d = asdict(self)
        for f in fields(self):
            if f.name in _MOE_MLA_FIELDS and d[f.name] == f.default:
                del d[f.name]
        for name in ("dense_layers", "window_layers"):
            if d.get(name) is not None:
                d[name] = list(d[name])
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ModelSpec":
        return from_dict(cls, data)


def _read_hf_config(config: object) -> tuple[Mapping[str, Any], str]:
    """The JSON object of a ``config.json`` path (or of a directory's ``config.json``)."""
    if not isinstance(config, (str, Path)):
        raise ConfigError(f"a Hugging Face config is a path to config.json, a model directory "
                          f"or a dict, got {type(config).__name__}")
    path = Path(config)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ConfigError(f"model directory {str(path)!r} has no config.json")
        path = path / "config.json"
    source = str(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"Hugging Face config {source!r} does not exist") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"Hugging Face config {source!r} is not UTF-8 text (offset "
                          f"{exc.start}); config.json files are UTF-8 JSON") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"Hugging Face config {source!r} is not valid JSON: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read Hugging Face config {source!r}: "
                          f"{exc.strerror or exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"Hugging Face config {source!r} must hold a JSON object (keys such "
                          f"as model_type, hidden_size, num_hidden_layers), got a JSON "
                          f"{_json_kind(data)}")
    return data, source


def _json_kind(value: object) -> str:
    return {list: "list", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number")
