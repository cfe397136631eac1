"""What is trained: :class:`ModelSpec`, a decoder-only transformer's shape.

A frozen, keyword-only dataclass that validates itself on construction and raises
:class:`meshplan.errors.ConfigError` naming the bad value.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Mapping

from meshplan.errors import ConfigError, require_choice, require_positive_int, unknown_name_error
from meshplan.spec._dicts import from_dict
from meshplan.spec.choices import ACTIVATIONS, NORMS, POSITIONS


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A decoder-only transformer's shape.

    GPT-style: ``activation="gelu", norm="layernorm", tied_embeddings=True,
    position_embedding="learned", bias=True``; Llama-style: ``"swiglu", "rmsnorm", False,
    "rope", False`` with ``num_kv_heads < num_heads`` for grouped-query attention.

    >>> m = ModelSpec.preset("llama3-8b")
    >>> round(m.num_params() / 1e9, 2)
    8.03
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

    def __post_init__(self) -> None:
        for f in ("num_layers", "hidden_size", "num_heads", "vocab_size", "max_seq_len"):
            require_positive_int("ModelSpec", f, getattr(self, f))
        for f in ("num_kv_heads", "ffn_hidden_size", "head_dim"):
            if getattr(self, f) is not None:
                require_positive_int("ModelSpec", f, getattr(self, f))
        require_choice("ModelSpec", "activation", self.activation, ACTIVATIONS)
        require_choice("ModelSpec", "norm", self.norm, NORMS)
        require_choice("ModelSpec", "position_embedding", self.position_embedding, POSITIONS)
        if self.num_kv_heads is None:
            object.__setattr__(self, "num_kv_heads", self.num_heads)
        if self.ffn_hidden_size is None:
            object.__setattr__(self, "ffn_hidden_size", 4 * self.hidden_size)
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
    def ffn_matrices(self) -> int:
        """Weight matrices of width ffn_hidden_size entering the MLP (2 for SwiGLU: gate, up)."""
        return 2 if self.activation == "swiglu" else 1

    def layer_matmul_params(self) -> int:
        """Weights of one layer's matrix multiplies (no biases, no norms)."""
        h, f = self.hidden_size, self.ffn_hidden_size
        attn = h * (self.q_dim + 2 * self.kv_dim) + self.q_dim * h
        mlp = (self.ffn_matrices + 1) * h * f
        return attn + mlp

    def layer_params(self) -> int:
        """All parameters of one transformer layer.

        GPT (Narayanan et al. 2021, arXiv 2104.04473, eq. 2): 12h² + 13h per layer —
        the 12h² matmul weights, 9h of biases (3h QKV, h out, 4h fc1, h fc2) and 4h of
        the two LayerNorms. Llama: no biases, two RMSNorm weight vectors.
        """
        h, f = self.hidden_size, self.ffn_hidden_size
        n = self.layer_matmul_params()
        if self.bias:
            n += self.q_dim + 2 * self.kv_dim + h + self.ffn_matrices * f + h
        n += 2 * h * (2 if self.norm == "layernorm" else 1)
        return n

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
        return self.hidden_size * (2 if self.norm == "layernorm" else 1)

    def num_params(self) -> int:
        """Total parameters.

        For GPT this is Narayanan et al. 2021 eq. 2,
        P = 12·l·h²·(1 + 13/(12h) + (V + s)/(12·l·h)), plus the final LayerNorm (2h).
        """
        return (self.num_layers * self.layer_params() + self.embedding_params()
                + self.head_params() + self.final_norm_params())

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
        return asdict(self)

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
