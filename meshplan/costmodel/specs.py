"""What is trained (ModelSpec), how much of it (Job) and how it is cut (Layout).

All three are frozen, keyword-only dataclasses that validate themselves on construction
and raise :class:`meshplan.errors.ConfigError` naming the bad value. Checks that need
more than one spec (tp divides heads, dp·pp·tp = GPUs) live in
:func:`meshplan.costmodel.validate.check_layout`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Mapping

from meshplan.errors import (ConfigError, require_choice, require_positive_int,
                             unknown_name_error)

ACTIVATIONS = ("gelu", "swiglu")
NORMS = ("layernorm", "rmsnorm")
POSITIONS = ("learned", "rope")
SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zero-bubble")
RECOMPUTE = ("none", "selective", "full")
PRECISIONS = ("bf16", "fp16", "fp32")
OPTIMIZERS = ("adam", "sgd")
RUNTIMES = ("megatron", "torch")


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
        from meshplan.costmodel.model_presets import MODEL_PRESETS
        if name not in MODEL_PRESETS:
            raise unknown_name_error("model preset", name, MODEL_PRESETS)
        return cls(name=name, **MODEL_PRESETS[name])

    @classmethod
    def preset_names(cls) -> list[str]:
        from meshplan.costmodel.model_presets import MODEL_PRESETS
        return list(MODEL_PRESETS)

    @classmethod
    def from_hf_config(cls, config: str | Path | Mapping[str, Any], *,
                       name: str | None = None) -> "ModelSpec":
        """Read a Hugging Face ``config.json`` (path or dict).

        Understands the keys of Llama, Mistral, Qwen2 (``num_hidden_layers``,
        ``hidden_size``, ``num_attention_heads``, ``num_key_value_heads``,
        ``intermediate_size``, ``max_position_embeddings``, ``tie_word_embeddings``),
        GPT-2 (``n_layer``, ``n_embd``, ``n_head``, ``n_inner``, ``n_positions``) and
        GPT-NeoX (``rotary_pct``, ``use_parallel_residual`` are ignored for cost purposes).
        """
        from meshplan.costmodel.hf_config import spec_kwargs_from_hf
        source = "<dict>"
        if not isinstance(config, Mapping):
            path = Path(config)
            source = str(path)
            try:
                config = json.loads(path.read_text())
            except FileNotFoundError:
                raise ConfigError(f"Hugging Face config {source!r} does not exist") from None
            except json.JSONDecodeError as exc:
                raise ConfigError(f"Hugging Face config {source!r} is not valid JSON: {exc}") from None
        kwargs = spec_kwargs_from_hf(config, source)
        return cls(name=name or str(config.get("_name_or_path") or config.get("model_type", "hf-model")),
                   **kwargs)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ModelSpec":
        return _from_dict(cls, data)


@dataclass(frozen=True, kw_only=True)
class Job:
    """One training step's work, and how the framework runs it.

    ``global_batch`` is in sequences per optimizer step; ``tokens`` (optional) is the
    training run's total, used for time-to-train and cost.

    The last three fields describe the implementation rather than the model:
    ``flash_attention`` (fused attention keeps no s² activations and skips masked
    blocks); ``overlap_dp_comm`` (gradient reduction overlapped with the last
    micro-batch's backward, as PyTorch DDP/FSDP and Megatron-Core do; Megatron-LM of
    2021 reduced after the backward pass); ``overlap_tp_comm`` (not by default).

    ``runtime`` says whose conventions the step follows (see docs/costmodel.md):

    * ``"megatron"`` (default): 16-bit weights and gradients, fp32 master weights inside the
      optimizer (ZeRO's 2 + 2 + 12 bytes per parameter); ZeRO-1/2 reduce-scatter gradients
      and all-gather 16-bit weights once per step; ZeRO-3 gathers per layer.
    * ``"torch"``: plain PyTorch as meshplan's executor runs it — fp32 parameters and
      gradients with bf16 compute (``torch.autocast`` for ZeRO-0/1, whose weight casts are
      cached for the step; FSDP2 ``MixedPrecisionPolicy`` for ZeRO-2/3), 4 + 4 + 8 bytes per
      parameter; fp32 gradient reduction (DDP buckets; after the schedule when pipelined);
      ZeRO-1 = DDP all-reduce + ``ZeroRedundancyOptimizer`` broadcasts of the updated fp32
      shards; ZeRO-2/3 = FSDP2, which gathers and reduce-scatters every micro-batch.
    """

    global_batch: int
    seq_len: int
    precision: str = "bf16"
    optimizer: str = "adam"
    tokens: float | None = None
    flash_attention: bool = True
    overlap_dp_comm: bool = True
    overlap_tp_comm: bool = False
    runtime: str = "megatron"

    def __post_init__(self) -> None:
        require_positive_int("Job", "global_batch", self.global_batch)
        require_choice("Job", "runtime", self.runtime, RUNTIMES)
        require_positive_int("Job", "seq_len", self.seq_len)
        require_choice("Job", "precision", self.precision, PRECISIONS)
        require_choice("Job", "optimizer", self.optimizer, OPTIMIZERS)
        if self.tokens is not None and not (isinstance(self.tokens, (int, float))
                                            and self.tokens > 0):
            raise ConfigError(f"Job.tokens must be a positive number, got {self.tokens!r}")

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Job":
        return _from_dict(cls, data)


@dataclass(frozen=True, kw_only=True)
class Layout:
    """How one step is cut over GPUs.

    ``dp·pp·tp`` GPUs are used; ``global_batch / (dp · micro_batch)`` micro-batches run
    through the pipeline per step. ``vpp`` is the number of model chunks per pipeline
    rank (interleaved 1F1B only). ``stage_layers`` gives the transformer layers of each
    pipeline stage (length pp, or pp·vpp for interleaved: chunk c lives on rank c % pp);
    None = as even as possible.
    """

    dp: int = 1
    pp: int = 1
    tp: int = 1
    micro_batch: int = 1
    schedule: str = "1f1b"
    vpp: int = 1
    recompute: str = "none"
    zero: int = 0
    sequence_parallel: bool = False
    stage_layers: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        for f in ("dp", "pp", "tp", "micro_batch", "vpp"):
            require_positive_int("Layout", f, getattr(self, f))
        require_choice("Layout", "schedule", self.schedule, SCHEDULES)
        require_choice("Layout", "recompute", self.recompute, RECOMPUTE)
        require_choice("Layout", "zero", self.zero, (0, 1, 2, 3))
        if self.vpp > 1 and self.schedule != "interleaved-1f1b":
            raise ConfigError(
                f"Layout.vpp = {self.vpp} needs schedule='interleaved-1f1b', "
                f"got schedule={self.schedule!r}")
        if self.sequence_parallel and self.tp == 1:
            raise ConfigError("Layout.sequence_parallel=True needs tp > 1 (got tp=1)")
        if self.stage_layers is not None:
            sl = tuple(self.stage_layers)
            object.__setattr__(self, "stage_layers", sl)
            if len(sl) != self.pp * self.vpp:
                raise ConfigError(
                    f"Layout.stage_layers has {len(sl)} entries; pp·vpp = "
                    f"{self.pp}·{self.vpp} = {self.pp * self.vpp} are needed")
            for i, n in enumerate(sl):
                if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                    raise ConfigError(
                        f"Layout.stage_layers[{i}] = {n!r} must be a non-negative integer")

    @property
    def num_gpus(self) -> int:
        return self.dp * self.pp * self.tp

    def num_microbatches(self, global_batch: int) -> int:
        return global_batch // (self.dp * self.micro_batch)

    def replace(self, **changes: Any) -> "Layout":
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["stage_layers"] = list(self.stage_layers) if self.stage_layers is not None else None
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Layout":
        data = dict(data)
        if data.get("stage_layers") is not None:
            data["stage_layers"] = tuple(data["stage_layers"])
        return _from_dict(cls, data)

    def short(self) -> str:
        """A compact one-line description, e.g. ``dp8·pp16·tp8 mb1 interleaved-1f1b v2 rc=full
        z1``; an explicit partition is appended as ``layers 5/7/7/5`` (two layouts that differ
        only in it must not read alike)."""
        s = f"dp{self.dp}·pp{self.pp}·tp{self.tp} mb{self.micro_batch} {self.schedule}"
        if self.vpp > 1:
            s += f" v{self.vpp}"
        s += f" rc={self.recompute} z{self.zero}"
        if self.sequence_parallel:
            s += " sp"
        if self.stage_layers is not None:
            s += " layers " + "/".join(str(n) for n in self.stage_layers)
        return s


def _from_dict(cls, data: Mapping[str, Any]):
    """Build a spec dataclass from a dict, naming unknown or missing keys."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{cls.__name__} needs a mapping, got {type(data).__name__}")
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"{cls.__name__} has no field(s) {', '.join(unknown)}; "
                          f"valid fields: {', '.join(sorted(known))}")
    try:
        return cls(**data)
    except TypeError as exc:
        raise ConfigError(f"{cls.__name__}: {exc}") from None


def default_stage_layers(num_layers: int, stages: int) -> tuple[int, ...]:
    """Layers per stage, as even as possible, extra layers on the middle stages.

    The first and last stages also carry the embedding and the logits, so when the
    split is uneven the remainder goes to the stages in between first.
    """
    base, extra = divmod(num_layers, stages)
    counts = [base] * stages
    order = list(range(1, stages - 1)) + [0, stages - 1] if stages > 2 else list(range(stages))
    for i in order[:extra]:
        counts[i] += 1
    return tuple(counts)


__all__ = ["ModelSpec", "Job", "Layout", "default_stage_layers", "SCHEDULES", "RECOMPUTE",
           "ACTIVATIONS", "NORMS", "POSITIONS", "PRECISIONS"]
